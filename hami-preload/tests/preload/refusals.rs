//! Refusals you can see (issue 20): a request the quota refuses is logged as one warning at
//! the default log level (rate-limited per device: 100 refusals in a row make one line) and
//! counted in the region's per-device refusal counter, which the agent exports. Before the
//! fix a refusal logged nothing at the default level and was counted nowhere.

use hami_common::region::Region;
use hami_test_harness::{ProbeOutput, TestEnv};

const OOM: i32 = 2;

fn env() -> TestEnv {
    TestEnv::new()
        .env("FAKE_CUDA_TOTAL_MEM", "16G")
        .env("FAKE_CUDA_CTX_OVERHEAD", "0")
        .env("CUDA_DEVICE_MEMORY_LIMIT", "1G")
        .preload(true)
}

/// Runs the probe at the default log level (the variable removed, whatever the caller's).
fn run_default_level(env: &TestEnv, args: &[&str]) -> ProbeOutput {
    let mut c = env.cudaprobe_cmd(args);
    c.env_remove("LIBCUDA_LOG_LEVEL");
    ProbeOutput::from_output(c.output().expect("spawn cudaprobe"))
}

/// The preload's refusal lines on stderr.
fn refusal_lines(p: &ProbeOutput) -> Vec<String> {
    p.stderr
        .lines()
        .filter(|l| l.contains("CUDA_ERROR_OUT_OF_MEMORY"))
        .map(str::to_string)
        .collect()
}

fn refusals(env: &TestEnv, dev: usize) -> u64 {
    Region::open_existing(env.region_path(), false)
        .expect("region exists")
        .refusals(dev)
}

#[test]
fn an_over_quota_allocation_logs_one_warning_naming_request_and_limit() {
    let env = env();
    let p = run_default_level(&env, &["init", "ctx", "alloc", "2G", "exit", "0"]);
    assert_eq!(p.last("alloc").rc(), Some(OOM), "{}", p.dump());
    let lines = refusal_lines(&p);
    assert_eq!(lines.len(), 1, "one refusal line: {}", p.stderr);
    let l = &lines[0];
    assert!(l.contains("WARN"), "a warning: {l}");
    assert!(l.contains("cuMemAlloc"), "names the hooked function: {l}");
    assert!(
        l.contains(&format!("{} bytes requested", 2u64 << 30)),
        "names the bytes: {l}"
    );
    assert!(
        l.contains(&format!("of {} bytes", 1u64 << 30)),
        "names the limit: {l}"
    );
    assert_eq!(refusals(&env, 0), 1, "the region counts the refusal");
}

#[test]
fn a_hundred_refusals_in_a_row_log_one_line_and_count_a_hundred() {
    let env = env();
    let mut args = vec!["init", "ctx", "alloc", "512M"];
    for _ in 0..100 {
        args.extend(["alloc", "768M"]);
    }
    args.extend(["exit", "0"]);
    let p = run_default_level(&env, &args);
    let allocs = p.find("alloc");
    assert_eq!(allocs[0].rc(), Some(0), "{}", p.dump());
    assert_eq!(allocs.len(), 101);
    assert!(
        allocs[1..].iter().all(|a| a.rc() == Some(OOM)),
        "every later request is over the quota: {}",
        p.dump()
    );
    let lines = refusal_lines(&p);
    assert_eq!(lines.len(), 1, "one line for the burst: {}", p.stderr);
    assert!(
        lines[0].contains("WARN")
            && lines[0].contains(&format!("{} bytes requested", 768u64 << 20)),
        "{}",
        lines[0]
    );
    assert_eq!(refusals(&env, 0), 100, "the region counts every refusal");
}

#[test]
fn refusals_of_processes_add_up_in_the_region() {
    let env = env();
    for _ in 0..3 {
        let p = run_default_level(
            &env,
            &["init", "ctx", "alloc", "2G", "alloc", "3G", "exit", "0"],
        );
        assert_eq!(
            p.rcs().iter().filter(|&&r| r == OOM).count(),
            2,
            "{}",
            p.dump()
        );
        // Each process reports its own first refusal.
        assert_eq!(refusal_lines(&p).len(), 1, "{}", p.stderr);
    }
    assert_eq!(refusals(&env, 0), 6);
    assert_eq!(refusals(&env, 1), 0, "another device refused nothing");
}

#[test]
fn a_context_refused_by_the_quota_is_counted() {
    let env = env()
        .env("FAKE_CUDA_CTX_OVERHEAD", "518M")
        .env("CUDA_DEVICE_MEMORY_LIMIT", "256M");
    let p = run_default_level(&env, &["init", "ctx", "exit", "0"]);
    assert_eq!(p.last("ctx").rc(), Some(OOM), "{}", p.dump());
    assert_eq!(refusal_lines(&p).len(), 1, "{}", p.stderr);
    assert_eq!(
        refusals(&env, 0),
        1,
        "the region counts the refused context"
    );
}
