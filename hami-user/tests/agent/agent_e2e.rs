//! End-to-end tests of `hami-agent` against the fake driver: the real binary, real eBPF
//! probes on the fake `libcuda.so.1`, `cudaprobe` with and without `libhami_preload.so`.
//! Needs root (CI runs as root) and an agent built with its eBPF object (bpf-linker on PATH,
//! see `cargo xtask setup`); without them these tests fail and say why.
//!
//! Tests run one at a time (a lock): each starts its own agent, and every agent sees every
//! process that calls the fake libcuda, so assertions always filter by pid or region.

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use hami_test_harness::{
    audit_findings_for as findings_for, audit_process as process, finding_line, inspect_json,
    parse_audit, serial, AgentCommand, AgentProcess, Artifacts, RunningProbe, TestEnv,
};
use serde_json::Value;

use crate::common::AGENT;
mod compute_share;
mod fixtures;
mod nvml;
use fixtures::*;

const MIB: u64 = 1 << 20;

fn hooked_env(limit: &str) -> TestEnv {
    TestEnv::new()
        .preload(true)
        .env("CUDA_DEVICE_MEMORY_LIMIT", limit)
        .env("FAKE_CUDA_DEVICE_COUNT", "1")
}

fn spawn_waiting(env: &TestEnv, ops: &[&str]) -> RunningProbe {
    let mut p = env.spawn_probe(ops);
    p.wait_for("wait");
    p
}

#[test]
fn hooked_process_within_quota_has_no_finding_and_accounted_equals_observed() {
    let _g = serial();
    let env = hooked_env("1g");
    let agent = AgentProcess::audit(AGENT, &env, "2.5", &[]);
    let probe = spawn_waiting(&env, &["init", "ctx", "alloc", "64M", "wait"]);
    let (st, audit, _) = agent.finish_audit();
    let p = process(&audit, probe.pid);
    assert_eq!(p["hooked"], true, "{p:#}");
    assert_eq!(p["observed"], 64 * MIB, "{p:#}");
    assert_eq!(p["accounted"], 64 * MIB, "{p:#}");
    assert_eq!(p["verdict"], "ok", "{audit:#}");
    assert_eq!(p["region"], env.region_path().display().to_string());
    assert!(findings_for(&audit, probe.pid).is_empty(), "{audit:#}");
    // Exit status follows bypass/over-limit findings of any process the agent saw.
    assert_eq!(st.code(), Some(if audit["failed"] == true { 2 } else { 0 }));
    drop(probe);
}

#[test]
fn unhooked_process_is_reported_as_bypass_within_one_second() {
    let _g = serial();
    let env = TestEnv::new().env("FAKE_CUDA_DEVICE_COUNT", "1");
    let mut agent = AgentProcess::run_json(AGENT, &env, &[]);
    let mut probe = env.spawn_probe(&["init", "ctx", "alloc", "64M", "wait"]);
    let alloc = probe.wait_for("alloc");
    let t0 = Instant::now();
    assert!(alloc.ok(), "{alloc:?}");
    let pid = probe.pid;
    let line = agent.wait_line(Duration::from_secs(5), |l| {
        finding_line(l, "bypass", pid).is_some()
    });
    let elapsed = t0.elapsed();
    let f = finding_line(&line, "bypass", pid).expect("finding");
    eprintln!("bypass reported {elapsed:?} after the allocation returned");
    assert!(
        elapsed < Duration::from_secs(1),
        "bypass reported after {elapsed:?}"
    );
    assert_eq!(f["reason"], "no_preload");
    assert_eq!(f["bytes"], 64 * MIB, "{f:#}");
    probe.resume();
    agent.stop();
}

#[test]
fn sigkilled_process_leaks_its_slot_and_reclaim_frees_it() {
    let _g = serial();
    let env = hooked_env("1g");
    let region = env.region_path().display().to_string();
    let probe = spawn_waiting(&env, &["init", "ctx", "alloc", "512M", "wait"]);
    let pid = probe.pid;
    probe.kill(); // SIGKILL and reap: no exit handler runs.

    // Without --reclaim: reported, left alone.
    let agent = AgentProcess::audit(AGENT, &env, "1", &["--region", &region]);
    let (_, audit, _) = agent.finish_audit();
    let leaked: Vec<&Value> = audit["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["kind"] == "leaked_slot" && f["region"] == region.as_str())
        .collect();
    assert_eq!(leaked.len(), 1, "{audit:#}");
    assert_eq!(leaked[0]["reason"], "process_dead");
    assert_eq!(leaked[0]["nspid"], pid);
    assert!(
        leaked[0]["bytes"].as_u64().unwrap() >= 512 * MIB,
        "{:#}",
        leaked[0]
    );
    let before = inspect(env.region_path());
    assert_eq!(before["slots"].as_array().unwrap().len(), 1, "{before:#}");

    // With --reclaim: freed through the region's protocol.
    let agent = AgentProcess::audit(AGENT, &env, "1", &["--reclaim", "--region", &region]);
    let (_, audit, _) = agent.finish_audit();
    // Other regions of the node (other tests' killed processes) may be reclaimed too.
    let rec: Vec<&Value> = audit["reclaimed"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["region"] == region.as_str())
        .collect();
    assert_eq!(rec.len(), 1, "{audit:#}");
    assert_eq!(rec[0]["pid"], pid);
    let after = inspect(env.region_path());
    assert!(after["slots"].as_array().unwrap().is_empty(), "{after:#}");
    assert_eq!(after["devices"][0]["used"], 0);
    assert_eq!(after["reclaimed_slots"], 1);

    // A new process gets the whole quota (1 GiB minus its own context).
    let out = env.run_probe(&["init", "ctx", "alloc", "512M", "alloc", "200M"]);
    assert!(out.all_ok(), "{}", out.dump());
}

#[test]
fn hand_edited_region_limit_is_tamper() {
    let _g = serial();
    let env = hooked_env("1g");
    let mut probe = spawn_waiting(&env, &["init", "ctx", "alloc", "1M", "wait"]);
    // Raise the limit in the file by hand (limits[0] at its layout offset).
    let off = core::mem::offset_of!(hami_abi::layout::RegionHeader, limits) as u64;
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(env.region_path())
        .expect("open region");
    std::os::unix::fs::FileExt::write_all_at(&f, &(64u64 << 30).to_le_bytes(), off).unwrap();
    let agent = AgentProcess::audit(AGENT, &env, "1", &[]);
    let (_, audit, _) = agent.finish_audit();
    let t: Vec<&Value> = findings_for(&audit, probe.pid)
        .into_iter()
        .filter(|f| f["kind"] == "tamper")
        .collect();
    assert_eq!(t.len(), 1, "{audit:#}");
    assert_eq!(t[0]["limit"], 64u64 << 30);
    assert_eq!(t[0]["device"], 0);
    probe.resume();
}

#[test]
fn agent_started_after_the_workload_reports_no_false_bypass() {
    let _g = serial();
    let env = hooked_env("1g");
    let mut probe = spawn_waiting(
        &env,
        &[
            "init", "ctx", "alloc", "256M", "wait", "alloc", "32M", "wait",
        ],
    );
    let agent = AgentProcess::audit(AGENT, &env, "2", &[]);
    // After the agent attached: a further allocation, which it sees.
    probe.resume();
    probe.wait_for("wait");
    let (st, audit, _) = agent.finish_audit();
    let p = process(&audit, probe.pid);
    assert_eq!(
        p["baseline"], "pre-existing, not observed from start",
        "{p:#}"
    );
    assert_eq!(p["observed"], 32 * MIB, "{p:#}");
    assert_eq!(p["accounted"], 288 * MIB, "{p:#}");
    assert_eq!(p["verdict"], "ok");
    assert!(findings_for(&audit, probe.pid).is_empty(), "{audit:#}");
    assert_eq!(st.code(), Some(if audit["failed"] == true { 2 } else { 0 }));
    probe.resume();
}

#[test]
fn audit_exits_non_zero_on_bypass() {
    let _g = serial();
    let env = TestEnv::new().env("FAKE_CUDA_DEVICE_COUNT", "1");
    let agent = AgentProcess::audit(AGENT, &env, "2", &[]);
    let mut probe = spawn_waiting(&env, &["init", "ctx", "alloc", "16M", "wait"]);
    let (st, audit, _) = agent.finish_audit();
    let f = findings_for(&audit, probe.pid);
    assert!(
        f.iter()
            .any(|f| f["kind"] == "bypass" && f["bytes"] == 16 * MIB),
        "{audit:#}"
    );
    assert_eq!(audit["failed"], true);
    assert_eq!(st.code(), Some(2));
    probe.resume();
}

#[test]
fn agent_exits_promptly_after_sigterm_and_still_reports() {
    let _g = serial();
    let env = TestEnv::new();
    // An empty /proc: the agent has no host process to discover, so the time measured is
    // its shutdown's alone, not a scan of however many processes the host runs.
    let proc_root = tempfile::tempdir().expect("temp proc root");
    let proc_arg = proc_root.path().display().to_string();
    let agent = AgentProcess::audit(AGENT, &env, "60", &["--proc-root", &proc_arg]);
    let t = Instant::now();
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(agent.pid(), libc::SIGTERM) };
    let (st, out, log) = agent.finish();
    let took = t.elapsed();
    // Detaching the 47 probe links in the agent took about 5 s; a keeper process does it now.
    assert!(took < Duration::from_secs(3), "exit took {took:?}");
    assert_eq!(st.code(), Some(0));
    // The final report still comes, and it is of the (empty) tree given.
    let audit = parse_audit(&out, &log);
    assert_eq!(audit["failed"], false, "{audit:#}");
    assert_eq!(
        audit["processes"].as_array().map(Vec::len),
        Some(0),
        "{audit:#}"
    );
}

#[test]
fn inspect_matches_a_region_written_by_the_preload() {
    let _g = serial();
    let env = hooked_env("768m");
    let mut probe = spawn_waiting(
        &env,
        &["init", "ctx", "alloc", "64M", "alloc", "8M", "wait"],
    );
    let v = inspect(env.region_path());
    assert_eq!(v["version"], hami_abi::layout::VERSION);
    assert_eq!(v["initialised"], true);
    assert_eq!(v["devices"][0]["limit"], 768 * MIB);
    let slots = v["slots"].as_array().unwrap();
    let s = slots
        .iter()
        .find(|s| s["pid"] == probe.pid)
        .unwrap_or_else(|| panic!("{v:#}"));
    assert_eq!(s["liveness"], "alive");
    assert_eq!(s["usage"][0]["data"], 72 * MIB, "{v:#}");
    assert!(s["usage"][0]["context"].as_u64().unwrap() > 0, "{v:#}");
    assert_eq!(
        v["devices"][0]["used"], s["total"],
        "header total equals the only slot's total: {v:#}"
    );
    // The human form names the same numbers.
    let out = AgentCommand::new(AGENT)
        .arg("inspect")
        .arg(env.region_path())
        .output_within(Duration::from_secs(30));
    assert!(out.status.success(), "{out:?}");
    let text = out.stdout_text();
    assert!(text.contains(&format!("pid {}", probe.pid)), "{text}");
    assert!(text.contains("limit 768.0 MiB"), "{text}");
    probe.resume();
}

/// Issue 13: a process of the container that cannot write the region (here: the region made
/// root-only on purpose, the process running as uid 65534) keeps failing closed, and the
/// agent reports it as `locked_out` with the region, its pid and uid, and why.
#[test]
fn process_that_cannot_write_its_region_is_reported_locked_out() {
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    let _g = serial();
    let env = hooked_env("1g").shared_with_all_users();
    let region = env.region_path().display().to_string();
    let mut agent = AgentProcess::run_json(AGENT, &env, &[]);
    let mut owner = spawn_waiting(&env, &["init", "ctx", "alloc", "64M", "wait"]);
    std::fs::set_permissions(env.region_path(), std::fs::Permissions::from_mode(0o600))
        .expect("chmod region");
    let mut c = env.cudaprobe_cmd(&["init", "ctx", "alloc", "64M", "wait"]);
    c.uid(65534).gid(65534).stdin(Stdio::piped());
    let mut app = RunningProbe::start(c);
    let alloc = app.wait_for("alloc");
    assert_eq!(alloc.rc(), Some(2), "fails closed: {alloc:?}");
    let pid = app.pid;
    let line = agent.wait_line(Duration::from_secs(5), |l| {
        finding_line(l, "locked_out", pid).is_some()
    });
    let f = finding_line(&line, "locked_out", pid).expect("finding");
    assert_eq!(f["reason"], "region_unwritable", "{f:#}");
    assert_eq!(f["region"], region, "{f:#}");
    assert_eq!(f["uid"], 65534, "{f:#}");
    let detail = f["message"].as_str().unwrap_or_default();
    assert!(
        detail.contains("0600") && detail.contains("uid 65534"),
        "{f:#}"
    );
    // The region's owner (root) is not reported.
    assert!(
        !agent
            .log()
            .iter()
            .any(|l| finding_line(l, "locked_out", owner.pid).is_some()),
        "{}",
        agent.log().join("\n")
    );
    app.resume();
    owner.resume();
    agent.stop();
}

/// Issue 12 (agent faults): an agent SIGKILLed mid-workload runs no exit path, so its probes
/// go only when the kernel closes its descriptors. Once a new agent runs, none of the killed
/// agent's programs is left in the kernel (no uprobe or uretprobe still attached to the
/// driver), no trace event of it is left in `uprobe_events`, and the new agent sees the
/// workload's next allocation exactly once with no false finding.
#[test]
fn sigkilled_agent_leaves_no_probe_behind_once_a_new_agent_runs() {
    let _g = serial();
    let env = hooked_env("1g");
    let mut probe = spawn_waiting(
        &env,
        &[
            "init", "ctx", "alloc", "64M", "wait", "alloc", "32M", "wait",
        ],
    );
    let old = AgentProcess::audit(AGENT, &env, "60", &[]);
    let old_pid = old.pid() as u32;
    let old_ids = bpf_prog_ids(old_pid);
    assert!(
        old_ids.len() > 2,
        "the agent holds its programs: {old_ids:?}"
    );
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(old_pid as i32, libc::SIGKILL) };
    drop(old);
    let new = AgentProcess::audit(AGENT, &env, "2", &[]);
    probe.resume();
    probe.wait_for("wait");
    let (_, audit, _) = new.finish_audit();
    let p = process(&audit, probe.pid);
    assert_eq!(p["observed"], 32 * MIB, "{p:#}");
    assert_eq!(p["alloc_events"], 1, "{p:#}");
    assert!(findings_for(&audit, probe.pid).is_empty(), "{audit:#}");
    probe.resume();
    // The kernel frees programs asynchronously once their last link is gone (about 0.1 s per
    // link, one after another): allow it some seconds.
    let end = Instant::now() + Duration::from_secs(20);
    let mut left: Vec<u32> = old_ids.clone();
    while !left.is_empty() && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(100));
        left.retain(|&id| bpf_prog_exists(id));
    }
    assert!(
        left.is_empty(),
        "programs of the killed agent still loaded: {left:?}"
    );
    let tag = format!("aya_{old_pid}_");
    for f in [
        "/sys/kernel/tracing/uprobe_events",
        "/sys/kernel/debug/tracing/uprobe_events",
    ] {
        if let Ok(t) = std::fs::read_to_string(f) {
            assert!(
                !t.lines().any(|l| l.contains(&tag)),
                "{f} keeps the killed agent's probes:\n{t}"
            );
        }
    }
}

/// Issue 19, a node being migrated from HAMi-core: a process that maps a HAMi-core-like
/// `libvgpu.so` (a shared object of that name without `hami_preload_marker`) gets the
/// migration finding, one run with `CUDA_DISABLE_CONTROL=true` (HAMi's opt-out) is
/// `unhooked`; neither is a `bypass`, both stay in the audit; a plain unhooked process still
/// is a bypass.
#[test]
fn hami_core_process_gets_the_migration_reason_and_an_opted_out_one_is_unhooked() {
    let _g = serial();
    let a = Artifacts::get();
    let env = TestEnv::new().env("FAKE_CUDA_DEVICE_COUNT", "1");
    let dir = env.dir().join("usr-local-vgpu");
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join("hami_core_like.c");
    std::fs::write(&src, "int hami_core_like_init(void) { return 19920718; }\n").unwrap();
    let lib = dir.join("libvgpu.so");
    hami_test_harness::cc(&src, &lib, &["-shared", "-fPIC"]);

    let agent = AgentProcess::audit(AGENT, &env, "3", &[]);
    let start = |extra: &[(&str, &std::ffi::OsStr)]| {
        let mut c = env.command(&a.cudaprobe);
        c.args(["init", "ctx", "alloc", "16M", "wait"]);
        for (k, v) in extra {
            c.env(k, v);
        }
        c.stdin(Stdio::piped());
        let mut p = RunningProbe::start(c);
        p.wait_for("wait");
        p
    };
    let mut core = start(&[("LD_PRELOAD", lib.as_os_str())]);
    let mut opted_out = start(&[("CUDA_DISABLE_CONTROL", "true".as_ref())]);
    let mut plain = start(&[]);
    let (_, audit, _) = agent.finish_audit();
    let kinds = |pid: u32| -> Vec<(String, String)> {
        findings_for(&audit, pid)
            .iter()
            .map(|f| {
                (
                    f["kind"].as_str().unwrap_or("").to_string(),
                    f["reason"].as_str().unwrap_or("").to_string(),
                )
            })
            .collect()
    };
    assert_eq!(
        kinds(core.pid),
        vec![("hami_core".to_string(), "hami_core_mapped".to_string())],
        "{audit:#}"
    );
    assert_eq!(
        kinds(opted_out.pid),
        vec![("unhooked".to_string(), "disable_control".to_string())],
        "{audit:#}"
    );
    assert_eq!(
        kinds(plain.pid),
        vec![("bypass".to_string(), "no_preload".to_string())],
        "{audit:#}"
    );
    // All three are in the audit's process table, none hooked, each with its hook.
    for (pid, hook) in [
        (core.pid, "hami_core"),
        (opted_out.pid, "none"),
        (plain.pid, "none"),
    ] {
        assert_eq!(process(&audit, pid)["hooked"], false, "{audit:#}");
        assert_eq!(process(&audit, pid)["hook"], hook, "{audit:#}");
    }
    assert_eq!(process(&audit, core.pid)["verdict"], "hami_core");
    assert_eq!(process(&audit, opted_out.pid)["verdict"], "unhooked");
    core.resume();
    opted_out.resume();
    plain.resume();
}
