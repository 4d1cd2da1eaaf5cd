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
//! * issue 12 (`cargo xtask torture --long --only agent`): an agent (re)started while the
//!   workload ran missed releases of allocations it had seen, without counting a drop, and
//!   reported false findings: the allocation probes went in before the release probes, and
//!   each entry probe before its return probe.
//! * issue 12 (agent faults, driver upgrade): a libcuda replaced on disk while attached was
//!   never attached again under its path: processes that loaded the new file were seen late
//!   or not at all.
//! * closing note of 2026-12-01: the old file's probes stayed attached for ever after an
//!   upgrade; a libcuda found through a process's maps and rewritten in place was never
//!   attached again (the next process ran under probes placed for the old contents).
//! * issue 29: a container with two GPUs whose processes narrow them with
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

/// Loads `libcuda.so.1` by name, takes the primary context, prints `ready`, then allocates
/// and frees (pitch + free, array + destroy, plain + free) in a paced loop until `argv[1]`
/// exists; prints what it did and holds nothing from then on.
const CHURN_PROGRAM: &str = r#"
#include <dlfcn.h>
#include <stdio.h>
#include <stddef.h>
#include <unistd.h>
typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef void *CUcontext;
typedef struct { size_t Width, Height; unsigned Format, NumChannels; } CUDA_ARRAY_DESCRIPTOR;
int main(int argc, char **argv) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    if (!h) { fprintf(stderr, "dlopen: %s\n", dlerror()); return 2; }
    CUresult (*init)(unsigned) = dlsym(h, "cuInit");
    CUresult (*get)(int *, int) = dlsym(h, "cuDeviceGet");
    CUresult (*retain)(CUcontext *, int) = dlsym(h, "cuDevicePrimaryCtxRetain");
    CUresult (*setcur)(CUcontext) = dlsym(h, "cuCtxSetCurrent");
    CUresult (*alloc)(CUdeviceptr *, size_t) = dlsym(h, "cuMemAlloc_v2");
    CUresult (*pitch)(CUdeviceptr *, size_t *, size_t, size_t, unsigned) = dlsym(h, "cuMemAllocPitch_v2");
    CUresult (*mfree)(CUdeviceptr) = dlsym(h, "cuMemFree_v2");
    CUresult (*acreate)(void **, const CUDA_ARRAY_DESCRIPTOR *) = dlsym(h, "cuArrayCreate_v2");
    CUresult (*adestroy)(void *) = dlsym(h, "cuArrayDestroy");
    int dev = 0; CUcontext c = 0;
    int rc = init(0) | get(&dev, 0) | retain(&c, dev) | setcur(c);
    printf("ready rc=%d\n", rc); fflush(stdout);
    unsigned long n = 0;
    while (access(argv[1], F_OK) != 0) {
        CUdeviceptr p = 0; size_t pp = 0; void *a = 0;
        CUDA_ARRAY_DESCRIPTOR d = { 1024, 256, 0x20, 1 };
        rc |= pitch(&p, &pp, 4096, 256, 4); rc |= mfree(p);
        rc |= acreate(&a, &d); rc |= adestroy(a);
        rc |= alloc(&p, 1 << 20); rc |= mfree(p);
        n++;
        usleep(500);
    }
    printf("stopped n=%lu rc=%d\n", n, rc); fflush(stdout);
    pause();
    return 0;
}
"#;

/// Guards issue 12 (`cargo xtask torture --long --only agent`; 8ef3acf): an agent started while
/// a workload allocates and frees in a loop attached the allocation probes first and the
/// release probes (`cuMemFree_v2`, `cuArrayDestroy`, ...) up to seconds later (each attach
/// is slow, slower still while a killed agent's probes are being detached), and each entry
/// probe before its return probe. Allocations made in that window were seen and their
/// releases were not, with no drop counted: the process kept phantom live bytes, reported
/// as observed above accounted. The release probes now go in first, and each return probe
/// before its entry probe: every allocation seen has its release seen.
#[test]
fn agent_attached_mid_workload_sees_the_release_of_every_allocation_it_saw() {
    use hami_test_harness::TestEnv;
    require_root();
    let _g = serial();
    let env = TestEnv::new()
        .env("FAKE_CUDA_DEVICE_COUNT", "1")
        .env("CUDA_DEVICE_MEMORY_LIMIT", "4g")
        .preload(true);
    let prog = env.dir().join("churn");
    compile_c(CHURN_PROGRAM, &prog, &["-ldl"]);
    let stop = env.dir().join("stop");
    let mut p = env.command(&prog).arg(&stop).spawn().expect("spawn churn");
    let pid = p.id();
    let mut out = BufReader::new(p.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "ready rc=0");
    // The probes go in while it churns ("ready" comes once they are all in).
    let agent = fake_audit(&env, "3").start();
    let pgid = agent.pid();
    // Some fully probed rounds, then it stops holding anything.
    std::thread::sleep(Duration::from_millis(500));
    std::fs::write(&stop, b"").unwrap();
    line.clear();
    out.read_line(&mut line).unwrap();
    assert!(
        line.starts_with("stopped") && line.trim().ends_with("rc=0"),
        "churn: {line}"
    );
    let (st, audit, _) = agent.finish_audit();
    let _ = p.kill();
    let _ = p.wait();
    wait_for_group_gone(pgid);
    // Lost events would excuse missing releases: there must be none for this to mean anything.
    assert_eq!(audit["probes"]["dropped"], 0, "{:#}", audit["probes"]);
    let row = audit_process(&audit, pid);
    assert!(
        row["alloc_events"].as_u64().unwrap() >= 3,
        "the probed rounds were seen: {row:#}"
    );
    assert_eq!(
        row["observed"], 0,
        "it holds nothing: every release of what was seen allocated must have been seen \
         ({} allocations, {} releases seen){row:#}",
        row["alloc_events"], row["free_events"]
    );
    assert_eq!(row["live_allocations"], 0, "{row:#}");
    let mine = audit_findings_for(&audit, pid);
    assert!(mine.is_empty(), "false findings: {mine:#?}");
    // Other processes on the machine may be found: only that it reported is checked.
    assert!(st.code().is_some(), "{st:?}");
}

/// Guards issue 12 (agent faults: driver upgrade; 14f561c): a driver package renames a new
/// `libcuda.so.1` over the attached one. Discovery remembered the path as handled, so the new
/// file was attached only once a process mapped it (up to a discovery period after it had
/// started allocating: its first allocations unseen, the process "attached late"). The
/// discovery now looks again when the file a path names changes, so the new file is attached
/// before processes load it; the old file's probes stay for the processes still running it.
#[test]
fn driver_replaced_on_disk_while_attached_is_attached_again_before_processes_load_it() {
    use hami_test_harness::{Artifacts, RunningProbe, TestEnv};
    require_root();
    let _g = serial();
    let a = Artifacts::get();
    let env = TestEnv::new().env("FAKE_CUDA_DEVICE_COUNT", "1");
    let drv = env.dir().join("drv");
    std::fs::create_dir_all(&drv).unwrap();
    let lib = drv.join("libcuda.so.1");
    std::fs::copy(&a.fake_libcuda, &lib).unwrap();
    let libpath = format!("{}:{}", drv.display(), a.fake_lib_dir.display());
    let spawn = |ops: &[&str]| {
        let mut c = env.cudaprobe_cmd(ops);
        c.env("LD_LIBRARY_PATH", &libpath).stdin(Stdio::piped());
        RunningProbe::start(c)
    };
    let mut before = spawn(&["init", "ctx", "alloc", "16M", "wait", "alloc", "8M", "wait"]);
    before.wait_for("wait");
    let mut agent = fake_audit(&env, "60")
        .libcuda(&lib)
        .ld_library_path(&libpath)
        .start();
    let pgid = agent.pid();
    // The upgrade: a new file renamed over the attached one.
    let new = drv.join("libcuda.so.1.new");
    std::fs::copy(&a.fake_libcuda, &new).unwrap();
    std::fs::rename(&new, &lib).unwrap();
    // Discovery attaches every driver on the node: only this one's line counts.
    let ours = lib.display().to_string();
    if let Err(e) = agent.try_wait_line(Duration::from_secs(20), |l| {
        l.contains("attached libcuda probes") && l.contains(&ours)
    }) {
        before.signal(libc::SIGKILL);
        panic!(
            "the replaced libcuda was not attached again within 20 s ({e}); log:\n{}",
            agent.log().join("\n")
        )
    }
    // A process started on the new file (a moment later: start times count in clock ticks,
    // and one started in the tick the attach ended in is taken to have raced it), and one
    // still running the old file.
    std::thread::sleep(Duration::from_millis(200));
    let mut after = spawn(&["init", "ctx", "alloc", "32M", "wait"]);
    after.wait_for("wait");
    before.resume();
    before.wait_for("wait");
    std::thread::sleep(Duration::from_millis(500));
    let (_, audit, _) = agent.interrupt_audit(REPORT_TIMEOUT);
    for p in [&mut before, &mut after] {
        p.resume();
        p.signal(libc::SIGKILL);
    }
    wait_for_group_gone(pgid);
    let row = |pid: u32| audit_process(&audit, pid);
    let new_row = row(after.pid);
    assert_eq!(new_row["observed"], 32 * MIB, "{new_row:#}");
    assert_eq!(new_row["alloc_events"], 1, "{new_row:#}");
    assert!(
        new_row["baseline"].is_null(),
        "observed from its start: {new_row:#}"
    );
    // The old file's probes stay for the process that still runs it.
    let old_row = row(before.pid);
    assert_eq!(old_row["observed"], 8 * MIB, "{old_row:#}");
    // Only this test's files count: the agent attaches to every driver copy on the host,
    // and another test run's `drv/` copy (another checkout's tests on a shared machine) was
    // seen in the list.
    let attached = audit["probes"]["attached"].as_array().unwrap();
    let own = lib.display().to_string();
    assert!(
        attached
            .iter()
            .filter(|p| p.as_str().is_some_and(|p| p.ends_with(own.as_str())))
            .count()
            == 2,
        "both files attached: {attached:?}"
    );
}

/// Guards issue 12 (its closing note of 2026-12-01, "after a driver upgrade the old file's probes are
/// kept"): when a new libcuda was renamed over an attached one, the old file's probes stayed
/// attached for ever, even once no process ran it any more: kernel uprobes and an `attached`
/// list that grew with every upgrade (or with a tenant replacing its libcuda again and
/// again). They are now detached, in the background, once the old file is unlinked and no
/// live process maps it; the new file's probes stay and keep observing.
#[test]
fn replaced_driver_probes_are_detached_once_no_process_maps_the_old_file() {
    use hami_test_harness::{Artifacts, RunningProbe, TestEnv};
    require_root();
    let _g = serial();
    let a = Artifacts::get();
    let env = TestEnv::new().env("FAKE_CUDA_DEVICE_COUNT", "1");
    let drv = env.dir().join("drv");
    std::fs::create_dir_all(&drv).unwrap();
    let lib = drv.join("libcuda.so.1");
    std::fs::copy(&a.fake_libcuda, &lib).unwrap();
    let libpath = format!("{}:{}", drv.display(), a.fake_lib_dir.display());
    let spawn = |ops: &[&str]| {
        let mut c = env.cudaprobe_cmd(ops);
        c.env("LD_LIBRARY_PATH", &libpath).stdin(Stdio::piped());
        RunningProbe::start(c)
    };
    let mut before = spawn(&["init", "ctx", "alloc", "16M", "wait"]);
    before.wait_for("wait");
    let mut agent = fake_audit(&env, "120")
        .libcuda(&lib)
        .ld_library_path(&libpath)
        .start();
    let agent_pid = agent.pid() as u32;
    let ours = lib.display().to_string();
    // The agent probes every driver on the machine (other tests' and other checkouts' too,
    // which come and go): only the probes on a file in this test's `drv` directory count.
    let drv_dir = drv.display().to_string();
    let links = || -> HashSet<u32> {
        uprobe_links_of(agent_pid)
            .into_iter()
            .filter(|(_, file)| {
                // The agent attaches through a descriptor it holds (`/proc/self/fd/N`).
                let real = match file.strip_prefix("/proc/self/fd/") {
                    Some(n) => std::fs::read_link(format!("/proc/{agent_pid}/fd/{n}"))
                        .map(|p| p.display().to_string())
                        .unwrap_or_default(),
                    None => file.clone(),
                };
                real.starts_with(&drv_dir)
            })
            .map(|(id, _)| id)
            .collect()
    };
    // The old file's probes: those present before the upgrade.
    let before_upgrade = links();
    assert!(
        !before_upgrade.is_empty(),
        "no probe on {ours} before the upgrade: {:?}",
        uprobe_links_of(agent_pid)
            .iter()
            .map(|(_, f)| f)
            .collect::<HashSet<_>>()
    );
    // The upgrade: a new file renamed over the attached one.
    let new = drv.join("libcuda.so.1.new");
    std::fs::copy(&a.fake_libcuda, &new).unwrap();
    std::fs::rename(&new, &lib).unwrap();
    agent.wait_line(Duration::from_secs(30), |l| {
        l.contains("attached libcuda probes") && l.contains(&ours)
    });
    let per_file = links().difference(&before_upgrade).count();
    assert!(per_file >= 2, "the new file's probes: {per_file}");
    // A probe is gone when its link is (whatever the agent's descriptors show).
    let all_links = || -> HashSet<u32> {
        uprobe_links_of(agent_pid)
            .into_iter()
            .map(|(id, _)| id)
            .collect()
    };
    let lost = || before_upgrade.difference(&all_links()).count();
    // The old file's probes stay while a process runs it.
    std::thread::sleep(Duration::from_millis(1500));
    assert!(
        lost() < per_file,
        "{} of the probes there before the upgrade gone while the old file runs",
        lost()
    );
    // Its last process exits: the old file is unlinked and mapped by nobody. A full maps
    // scan (every 5 s) finds it so; detaching takes about 0.1 s per probe.
    let _ = before.kill();
    let t0 = Instant::now();
    while lost() < per_file && t0.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(200));
    }
    let gone = lost();
    if gone < per_file {
        panic!(
            "{gone} of the {} probes present before the upgrade gone {:?} after the old file's \
             last process exited, want at least its {per_file}",
            before_upgrade.len(),
            t0.elapsed()
        );
    }
    eprintln!("old file's probes gone after {:?}", t0.elapsed());
    // The new file is still observed: a process started now is seen from its start.
    std::thread::sleep(Duration::from_millis(200));
    let mut after = spawn(&["init", "ctx", "alloc", "32M", "wait"]);
    after.wait_for("wait");
    std::thread::sleep(Duration::from_millis(500));
    let audit = stop_audit(agent);
    let after_pid = after.pid;
    after.resume();
    let _ = after.kill();
    let row = audit_process(&audit, after_pid);
    assert_eq!(row["observed"], 32 * MIB, "{row:#}");
    assert_eq!(row["alloc_events"], 1, "{row:#}");
    assert!(
        row["baseline"].is_null(),
        "observed from its start: {row:#}"
    );
    let attached: Vec<&str> = audit["probes"]["attached"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .filter(|p| p.contains(&ours))
        .collect();
    assert_eq!(
        attached,
        [ours.as_str()],
        "the old file is no longer listed"
    );
}

/// Loads `libcuda.so.1` by name (LD_LIBRARY_PATH), calls `cuInit`, prints `loaded`, waits.
const LOADER_PROGRAM: &str = r#"
#include <dlfcn.h>
#include <stdio.h>
#include <unistd.h>
int main(void) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    if (!h) { fprintf(stderr, "dlopen: %s\n", dlerror()); return 2; }
    int (*init)(unsigned) = dlsym(h, "cuInit");
    printf("loaded rc=%d\n", init(0)); fflush(stdout);
    pause();
    return 0;
}
"#;

/// Guards issue 12 (its closing note of 2026-12-01, "the in-place rewrite path has no
/// test"; 49d396c): a probed libcuda
/// rewritten in place (same inode, other contents: other symbol offsets) must be attached
/// again before a process loads it, or that process runs under probes placed for the old
/// contents (at offsets that are no longer its functions) and its allocations go unseen.
/// The driver here was found only in a process's maps (no `--libcuda`, not in a driver
/// directory), and that process has exited: discovery remembered its maps identity and
/// never looked at the file again (a new process mapping it has the same identity). The
/// agent now watches each attached file through the descriptor it keeps open.
#[test]
fn driver_rewritten_in_place_is_attached_again_before_a_process_loads_it() {
    use hami_test_harness::{Artifacts, RunningProbe, TestEnv};
    use std::io::Write as _;
    use std::os::unix::fs::MetadataExt;
    require_root();
    let _g = serial();
    let a = Artifacts::get();
    let env = TestEnv::new()
        .env("FAKE_CUDA_DEVICE_COUNT", "1")
        .env("CUDA_DEVICE_MEMORY_LIMIT", "1g")
        .preload(true);
    let drv = env.dir().join("drv");
    std::fs::create_dir_all(&drv).unwrap();
    let lib = drv.join("libcuda.so.1");
    // First contents: another driver (its functions elsewhere in the file).
    compile_c(NESTED_DRIVER, &lib, &["-shared", "-fPIC"]);
    let loader = env.dir().join("loader");
    compile_c(LOADER_PROGRAM, &loader, &["-ldl"]);
    // No `--libcuda`: this driver is found in the loader's maps only.
    let mut agent = fake_audit(&env, "120").no_libcuda().start();
    let ours = lib.display().to_string();
    let mut first = Command::new(&loader)
        .env("LD_LIBRARY_PATH", &drv)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(first.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "loaded rc=0");
    agent.wait_line(Duration::from_secs(30), |l| {
        l.contains("attached libcuda probes") && l.contains(&ours)
    });
    let _ = first.kill();
    let _ = first.wait();
    // Rewritten in place: same inode, the fake driver's contents.
    let ino = std::fs::metadata(&lib).unwrap().ino();
    let bytes = std::fs::read(&a.fake_libcuda).unwrap();
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(&lib)
        .unwrap();
    f.write_all(&bytes).unwrap();
    drop(f);
    assert_eq!(std::fs::metadata(&lib).unwrap().ino(), ino);
    // Attached again (soft wait, seconds normally, long on a loaded machine: what follows
    // says what went wrong if it is not).
    let end = Instant::now() + Duration::from_secs(60);
    let (mut rewritten, mut reattached) = (false, false);
    while !reattached {
        match agent.next_line(end) {
            Ok(l) if l.contains(&ours) && l.contains("libcuda rewritten in place") => {
                rewritten = true
            }
            Ok(l) if rewritten && l.contains(&ours) && l.contains("attached libcuda probes") => {
                reattached = true
            }
            Ok(_) => {}
            Err(_) => break,
        }
    }
    // (Shown if the process below dies under probes placed for the old contents.)
    eprintln!("rewrite noticed: {rewritten}, attached again: {reattached}");
    std::thread::sleep(Duration::from_millis(200));
    let mut c = env.cudaprobe_cmd(&["init", "ctx", "alloc", "32M", "wait"]);
    let libpath = format!("{}:{}", drv.display(), a.fake_lib_dir.display());
    c.env("LD_LIBRARY_PATH", &libpath).stdin(Stdio::piped());
    let mut p = RunningProbe::start(c);
    assert!(p.wait_for("alloc").ok(), "{:?}", p.seen);
    p.wait_for("wait");
    let pid = p.pid;
    std::thread::sleep(Duration::from_millis(800));
    let audit = stop_audit(agent);
    p.resume();
    let _ = p.kill();
    let row = audit_process(&audit, pid);
    let why = format!("rewrite noticed: {rewritten}, attached again: {reattached}; {row:#}");
    assert_eq!(row["observed"], 32 * MIB, "{why}");
    assert_eq!(row["alloc_events"], 1, "{why}");
    assert!(row["baseline"].is_null(), "observed from its start: {why}");
    let mine = audit_findings_for(&audit, pid);
    assert!(mine.is_empty(), "false findings: {mine:#?}");
}

/// Guards issue 29 (hami-preload: the region's devices are the container's, known by UUID;
/// hami-agent: probe-observed bytes keyed by the container's device). One container, two
/// GPUs, limits 1 GiB and 2 GiB: process B sees both and holds 200 MiB on device 0, process
/// A (`CUDA_VISIBLE_DEVICES=1`) holds 600 MiB on its only device, the container's device 1.
/// The agent's per-device series carry each device's own limit, usage and UUID (before:
/// A's 600 MiB were on device 0, observed and accounted, and device 0 carried GPU 1's UUID).
#[test]
fn per_device_series_follow_the_containers_devices_whatever_each_process_sees() {
    let _g = serial();
    let env = hami_test_harness::TestEnv::new()
        .preload(true)
        .env("FAKE_CUDA_DEVICE_COUNT", "2")
        .env("FAKE_CUDA_CTX_OVERHEAD", "0")
        .env("HAMI_CONTEXT_OVERHEAD", "0")
        .env("HAMI_ADMISSION_RESERVE", "0")
        .env("CUDA_DEVICE_MEMORY_LIMIT_0", "1G")
        .env("CUDA_DEVICE_MEMORY_LIMIT_1", "2G");
    let mut agent = hami_test_harness::AgentProcess::run_json(AGENT, &env, &["--interval", "100"]);
    let addr = agent.metrics_addr();
    let spawn = |cvd: Option<&str>, ops: &[&str]| {
        let mut c = env.cudaprobe_cmd(ops);
        match cvd {
            Some(v) => c.env("CUDA_VISIBLE_DEVICES", v),
            None => c.env_remove("CUDA_VISIBLE_DEVICES"),
        };
        c.stdin(Stdio::piped());
        let mut p = hami_test_harness::RunningProbe::start(c);
        p.wait_for("wait");
        p
    };
    let mut b = spawn(None, &["init", "ctx", "alloc", "200M", "wait"]);
    let mut a = spawn(Some("1"), &["init", "ctx", "alloc", "600M", "wait"]);
    let region = env.region_path().display().to_string();
    let want = [
        (
            "0",
            "GPU-facec0da-0000-4000-8000-000000000000",
            1024 * MIB,
            200 * MIB,
        ),
        (
            "1",
            "GPU-facec0da-0000-4000-8000-000000000001",
            2048 * MIB,
            600 * MIB,
        ),
    ];
    // The value of `family`'s series of this region on `device` with `uuid` (None: absent).
    let value = |m: &str, family: &str, device: &str, uuid: &str| -> Option<u64> {
        m.lines()
            .filter(|l| l.starts_with(&format!("{family}{{")))
            .filter(|l| l.contains(&format!("region=\"{region}\"")))
            .filter(|l| l.contains(&format!("cuda_device=\"{device}\"")))
            .find(|l| l.contains(&format!("UUID=\"{uuid}\"")))
            .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .map(|v| v as u64)
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    let metrics = loop {
        let m = hami_test_harness::get_metrics(addr, Duration::from_secs(3)).expect("/metrics");
        let done = want.iter().all(|&(d, u, _, bytes)| {
            value(&m, "hami_container_observed_bytes", d, u) == Some(bytes)
                && value(&m, "hami_container_accounted_data_bytes", d, u) == Some(bytes)
        });
        if done || Instant::now() > deadline {
            break m;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let ours: Vec<&str> = metrics
        .lines()
        .filter(|l| l.contains(&format!("region=\"{region}\"")))
        .collect();
    for (d, u, limit, bytes) in want {
        for (family, v) in [
            ("hami_container_limit_bytes", limit),
            ("hami_container_accounted_data_bytes", bytes),
            ("hami_container_observed_bytes", bytes),
        ] {
            assert_eq!(
                value(&metrics, family, d, u),
                Some(v),
                "{family} of device {d} ({u}):\n{}",
                ours.join("\n")
            );
        }
    }
    a.resume();
    b.resume();
    agent.stop();
}
