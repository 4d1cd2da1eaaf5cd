//! Regressions: each test pins one bug that was fixed, and its doc comment opens with the
//! issue it guards ("Guards issue N") and the commit that fixed it.
//! The eBPF ones need root (CI runs as root) and never skip.
//!
//! * a driver the agent has never seen (odd directory, another file name behind a
//!   `libcuda.so.1` symlink, exported functions calling each other), loaded by a process
//!   started after the agent, with no `--libcuda`: found by discovery, the process marked
//!   *attached late*, reported as a bypass, and nothing counted twice;
//! * `inspect` on files that are not valid regions: a clear error naming the path, non-zero
//!   exit, no panic;
//! * not root: a clear error, exit 1;
//! * issue 8: `audit` said "ok (baseline)" and exited 0 for an unhooked process that was
//!   holding device memory before the agent started.
//! * `inspect` of a FIFO (found by `cargo xtask torture`'s bad inputs): it waited forever for
//!   a writer; now a clear error.
//! * an audit interrupted while still attaching its probes died of SIGINT without a report
//!   (H200 acceptance, physical group).
//! * issue 12 (`cargo xtask torture --long --only agent`, [`issue_12_agent_faults`]): an
//!   agent (re)started while the workload ran missed releases of allocations it had seen, without counting a drop, and
//!   reported false findings: the allocation probes went in before the release probes, and
//!   each entry probe before its return probe.
//! * issue 12 (agent faults, driver upgrade): a libcuda replaced on disk while attached was
//!   never attached again under its path: processes that loaded the new file were seen late
//!   or not at all.
//! * closing note of 2026-12-01: the old file's probes stayed attached for ever after an
//!   upgrade; a libcuda found through a process's maps and rewritten in place was never
//!   attached again (the next process ran under probes placed for the old contents).
//! * issue 29 ([`issue_29_devices`]): a container with two GPUs whose processes narrow them with
//!   `CUDA_VISIBLE_DEVICES`: the per-container, per-device series were indexed by each
//!   process's own ordinal and the region's UUIDs overwritten by a narrowed process.

use std::collections::HashSet;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use hami_abi::array::array_footprint;
use hami_test_harness::{
    audit_findings_for, audit_process, finding_line, parse_audit, serial, AgentCommand, READY_LINE,
};
use serde_json::Value;

use crate::common::{compile_c, require_root, wait_for_group_gone, AGENT};

mod fixtures;
mod issue_12_agent_faults;
mod issue_29_devices;

use fixtures::{
    build_nested, discovery_audit, fake_audit, inspect, only_child, stop_audit, uprobe_links_of,
    MIB, NESTED_DRIVER, REPORT_TIMEOUT,
};
/// Guards issue 4's review pass (c8dc5fa): a driver not named `libcuda.so*` (in an odd
/// directory, behind a `libcuda.so.1` symlink) loaded by a process started after the agent
/// was never discovered, and exported functions calling each other were counted twice.
#[test]
fn unseen_driver_loaded_after_the_agent_is_found_and_nested_calls_count_once() {
    require_root();
    let _g = serial();
    let tmp = tempfile::tempdir().unwrap();
    let (drv, prog) = build_nested(tmp.path());
    let go = tmp.path().join("go");
    // A long window, ended by SIGINT once the program is done: on a loaded machine the
    // attach can take longer than any fixed window.
    let mut agent = discovery_audit("60");
    let t_ready = Instant::now();
    let mut p = Command::new(&prog)
        .arg(&go)
        .env("LD_LIBRARY_PATH", &drv)
        .env_remove("LD_PRELOAD")
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn program");
    let pid = p.id();
    let mut out = BufReader::new(p.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "early");
    // The nested allocations start once the agent says the driver's probes are in (waiting a
    // fixed time was flaky on a loaded 2-core machine: the attach came after the allocations).
    if let Err(e) = agent.try_wait_line(Duration::from_secs(45), |l| {
        l.contains("attached libcuda probes") && l.contains("libweird_driver.so")
    }) {
        let _ = p.kill();
        panic!(
            "the agent never attached libweird_driver.so ({e}); log:\n{}",
            agent.log().join("\n")
        )
    }
    std::fs::write(&go, b"").unwrap();
    let mut rest = String::new();
    loop {
        line.clear();
        if out.read_line(&mut line).unwrap() == 0 {
            break;
        }
        rest.push_str(&line);
        if line.starts_with("done") {
            break;
        }
    }
    assert!(rest.contains("done rc=0"), "program: {rest}");
    let pitch: u64 = rest
        .lines()
        .find_map(|l| l.strip_prefix("pitch="))
        .and_then(|v| v.parse().ok())
        .expect("pitch");
    // The program holds nothing now; give the probes' events a moment to be consumed, then
    // end the audit (it reports on SIGINT as at the end of its window).
    std::thread::sleep(Duration::from_millis(500));
    let (st, audit, logs) = agent.interrupt_audit(REPORT_TIMEOUT);
    let _ = p.kill();
    let _ = p.wait();
    assert!(t_ready.elapsed() < Duration::from_secs(90));
    let attached = audit["probes"]["attached"].to_string();
    assert!(
        attached.contains("libweird_driver.so"),
        "driver not discovered by its symbols: {attached}\nlog:\n{}",
        logs.join("\n")
    );
    let row = audit_process(&audit, pid);
    // The 64 MiB allocated before the probes went in is not seen, and the process says so.
    assert!(
        row["baseline"]
            .as_str()
            .is_some_and(|b| b.starts_with("attached late")),
        "{row:#}"
    );
    // Each allocation once: pitch * height, the array's footprint (as the probes estimate
    // it), 32 MiB; the primary-context release through the v1 name (one reference of two)
    // drops nothing.
    let expected = pitch * 1000 + array_footprint(1024, 1024, 0, 0x20, 4) + 32 * MIB;
    assert_eq!(row["observed"], expected, "{row:#}");
    assert_eq!(row["alloc_events"], 3, "{row:#}");
    let bypass = audit_findings_for(&audit, pid)
        .into_iter()
        .find(|f| f["kind"] == "bypass")
        .unwrap_or_else(|| panic!("no bypass for {pid}:\n{audit:#}"));
    assert_eq!(bypass["reason"], "no_preload", "{bypass:#}");
    assert_eq!(st.code(), Some(2), "audit exit status");
}

/// Guards issue 4's review pass (c8dc5fa): a process the agent attached to late (its
/// allocations made before the probes went in) was taken as baseline, not a bypass, when it
/// allocated nothing more.
#[test]
fn late_attached_unhooked_process_is_a_bypass_even_without_further_allocations() {
    require_root();
    let _g = serial();
    let tmp = tempfile::tempdir().unwrap();
    let (drv, prog) = build_nested(tmp.path());
    let mut agent = AgentCommand::run_json(AGENT)
        .without_ld_library_path()
        .own_group()
        .start();
    let mut p = Command::new(&prog)
        .arg(tmp.path().join("never"))
        .env("LD_LIBRARY_PATH", &drv)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = p.id();
    let mut line = String::new();
    BufReader::new(p.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "early");
    let t0 = Instant::now();
    let found = agent
        .try_wait_line(Duration::from_secs(30), |l| {
            finding_line(l, "bypass", pid).is_some()
        })
        .unwrap_or_else(|e| {
            let _ = p.kill();
            panic!(
                "no bypass for {pid} ({e}); log:\n{}",
                agent.log().join("\n")
            )
        });
    let found = finding_line(&found, "bypass", pid).unwrap();
    // Discovery (500 ms) + attach + one tick.
    assert!(t0.elapsed() < Duration::from_secs(3), "{:?}", t0.elapsed());
    assert_eq!(found["reason"], "no_preload");
    let _ = p.kill();
    let _ = p.wait();
    agent.stop();
}

/// Guards issue 12 (found by `cargo xtask torture`'s bad inputs, ef3c3a4): `inspect` of a
/// FIFO waited forever for a writer.
#[test]
fn inspect_of_a_fifo_is_an_error_not_a_hang() {
    let tmp = tempfile::tempdir().unwrap();
    let p = tmp.path().join("fifo");
    let c = std::ffi::CString::new(p.to_str().unwrap()).unwrap();
    // SAFETY: c is a valid C string.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let out = AgentCommand::new(AGENT)
        .args(["inspect", "--json"])
        .arg(&p)
        .output_within(Duration::from_secs(20));
    let (status, err) = (out.status, out.stderr_text());
    assert_eq!(status.code(), Some(1), "{err}");
    assert!(err.contains(p.to_str().unwrap()), "names the file: {err}");
    assert!(err.contains("not a regular file"), "{err}");
}

/// Guards issue 4's review pass (c8dc5fa): `inspect` of a file that is not a valid region
/// (empty, garbage, truncated, another layout version, missing) fails with one clear line,
/// exit 1, no panic.
#[test]
fn inspect_rejects_what_is_not_a_valid_region_clearly() {
    use hami_common::region::{Region, RegionConfig};
    let tmp = tempfile::tempdir().unwrap();
    let good = tmp.path().join("good.cache");
    let mut cfg = RegionConfig::default();
    cfg.limits[0] = 1 << 30;
    cfg.device_count = 1;
    drop(Region::open_or_create(&good, &cfg).unwrap());
    let (code, out, err) = inspect(&good);
    assert_eq!(code, Some(0), "{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["devices"][0]["limit"], 1u64 << 30, "{v:#}");

    let data = std::fs::read(&good).unwrap();
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("empty", Vec::new(), ""),
        ("garbage", vec![0x5a; 4096], "magic"),
        ("truncated", data[..data.len() / 2].to_vec(), ""),
        ("header-only", data[..64].to_vec(), ""),
        (
            "other-version",
            {
                let mut d = data.clone();
                d[8..12].copy_from_slice(&99u32.to_le_bytes());
                d
            },
            "version",
        ),
    ];
    for (name, bytes, word) in cases {
        let p = tmp.path().join(name);
        std::fs::write(&p, &bytes).unwrap();
        let (code, out, err) = inspect(&p);
        assert_eq!(code, Some(1), "{name}: stdout {out} stderr {err}");
        assert!(out.is_empty(), "{name}: {out}");
        assert!(!err.contains("panicked"), "{name}: {err}");
        assert!(
            err.contains(p.to_str().unwrap()),
            "{name}: the error must name the file: {err}"
        );
        assert!(err.contains(word), "{name}: expected '{word}' in: {err}");
        assert_eq!(err.lines().count(), 1, "{name}: one line: {err}");
    }
    let (code, _, err) = inspect(&tmp.path().join("missing"));
    assert_eq!(code, Some(1));
    assert!(err.contains("No such file"), "{err}");
    assert_eq!(err.matches("No such file").count(), 1, "said once: {err}");
}

/// Guards issue 4 ("clear errors for: not root"), review pass (c8dc5fa): without root the
/// agent says it needs root and exits 1, without a panic.
#[test]
fn not_root_is_a_clear_error() {
    require_root();
    // Drop to nobody (no supplementary groups) for the agent only.
    let out = AgentCommand::new(AGENT)
        .args(["audit", "--seconds", "0"])
        .user(65534, 65534)
        .output_within(Duration::from_secs(60));
    let err = out.stderr_text();
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("needs root (running as uid 65534)"),
        "unclear error: {err}"
    );
    assert!(!err.contains("panicked"), "{err}");
}

/// Guards issue 4's review pass (733e3fe): a hooked process that is pid 1 of its own pid
/// namespace writes its namespace pid into its slot; the agent must match it through
/// `NSpid`, not report it as unhooked.
#[test]
fn hooked_process_in_its_own_pid_namespace_is_matched_to_its_slot() {
    use hami_test_harness::{Artifacts, RunningProbe, TestEnv};
    require_root();
    let _g = serial();
    let a = Artifacts::get();
    let env = TestEnv::new()
        .preload(true)
        .env("CUDA_DEVICE_MEMORY_LIMIT", "1g")
        .env("FAKE_CUDA_DEVICE_COUNT", "1");
    let agent = fake_audit(&env, "2.5").start();
    // cudaprobe as pid 1 of a new pid namespace: its slot holds pid 1.
    let mut c = env.command(Path::new("unshare"));
    c.args(["--pid", "--fork", "--kill-child"])
        .arg(&a.cudaprobe)
        .args(["init", "ctx", "alloc", "64M", "wait"])
        .stdin(Stdio::piped());
    let mut probe = RunningProbe::start(c);
    let alloc = probe.wait_for("alloc");
    assert!(alloc.ok(), "{alloc:?}");
    probe.wait_for("wait");
    let host_pid = only_child(probe.pid);
    let nspid = std::fs::read_to_string(format!("/proc/{host_pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("NSpid:").map(str::to_string))
        .unwrap();
    assert_eq!(
        nspid.split_whitespace().nth(1),
        Some("1"),
        "not in a child pid namespace: {nspid}"
    );
    let (st, audit, _) = agent.finish_audit();
    let row = audit_process(&audit, host_pid);
    assert_eq!(row["nspid"], 1, "{row:#}");
    assert_eq!(row["hooked"], true, "{row:#}");
    assert_eq!(row["observed"], 64 * MIB, "{row:#}");
    assert_eq!(row["accounted"], 64 * MIB, "{row:#}");
    assert_eq!(row["verdict"], "ok", "{audit:#}");
    assert!(audit_findings_for(&audit, host_pid).is_empty(), "{audit:#}");
    assert_eq!(st.code(), Some(if audit["failed"] == true { 2 } else { 0 }));
    probe.resume();
}

/// Guards issue 8 (9d996fc): the first thing an operator does with `audit` is look at a node where work is
/// already running. An unhooked process that was holding device memory before the agent
/// started (NVML lists it) was "ok (baseline)", exit 0. It is a bypass, whenever it started.
#[test]
fn audit_fails_for_an_unhooked_process_holding_memory_from_before_the_agent() {
    use hami_test_harness::TestEnv;
    require_root();
    let _g = serial();
    let env = TestEnv::new().env("FAKE_CUDA_DEVICE_COUNT", "1");
    let mut probe = env.spawn_probe(&["init", "ctx", "alloc", "1536M", "wait"]);
    probe.wait_for("wait");
    let held = env.nvml().process_used(0, probe.pid);
    assert!(held >= 1536 * MIB, "NVML lists it: {held}");
    let agent = fake_audit(&env, "1").start();
    let (st, audit, _) = agent.finish_audit();
    let row = audit_process(&audit, probe.pid);
    assert_eq!(row["hooked"], false, "{row:#}");
    assert_eq!(
        row["baseline"], "pre-existing, not observed from start",
        "{row:#}"
    );
    assert_eq!(row["nvml"], held, "{row:#}");
    assert_eq!(row["verdict"], "bypass", "{row:#}");
    let f = audit_findings_for(&audit, probe.pid);
    assert_eq!(f.len(), 1, "{audit:#}");
    assert_eq!(f[0]["kind"], "bypass");
    assert_eq!(f[0]["reason"], "no_preload");
    assert_eq!(f[0]["bytes"], held);
    assert!(
        f[0]["detail"].as_str().unwrap().contains("pre-existing"),
        "{:#}",
        f[0]
    );
    assert_eq!(audit["failed"], true);
    assert_eq!(st.code(), Some(2), "audit exit status");
    probe.resume();
}

/// Guards issue 8 (its H200 physical acceptance, run 1; b293df7): an audit stopped with SIGINT while it was
/// still attaching its probes (seconds on a real libcuda) died of the signal's default
/// action and printed no report; the handlers now come before the attach.
#[test]
fn audit_interrupted_while_attaching_still_prints_its_report() {
    use hami_test_harness::TestEnv;
    require_root();
    let _g = serial();
    let env = TestEnv::new().env("FAKE_CUDA_DEVICE_COUNT", "1");
    let mut agent = fake_audit(&env, "60").spawn();
    let pgid = agent.pid();
    // "NVML loaded" is logged at the start of the run, before the probes are attached.
    let first = agent.wait_line(Duration::from_secs(30), |l| {
        l.contains("NVML loaded") || l.contains(READY_LINE)
    });
    assert!(!first.contains(READY_LINE), "ready before NVML: {first}");
    let t0 = Instant::now();
    let (st, out, logs) = agent.interrupt(REPORT_TIMEOUT);
    assert!(
        st.code().is_some(),
        "killed by a signal ({st:?}) instead of reporting; log:\n{}",
        logs.join("\n")
    );
    assert!(t0.elapsed() < Duration::from_secs(30), "{:?}", t0.elapsed());
    let audit = parse_audit(&out, &logs);
    assert!(audit["processes"].is_array(), "{audit:#}");
    wait_for_group_gone(pgid);
}
