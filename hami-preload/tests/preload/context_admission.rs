//! Issue 17, "a context admitted before it is created": a context is admitted with its
//! device's footprint (measured by the container's first context on that device, kept in the
//! region) before the driver creates it, and refused with `CUDA_ERROR_OUT_OF_MEMORY` when it
//! does not fit, as a full GPU refuses it. Each test runs the real `cudaprobe` against the
//! fake driver with the preload; on the H200, before this, a second process of a full
//! container still got its context (the container then held its quota + 518 MiB), and two
//! processes filling one container at the same moment made the driver hold 3532 MiB of 3 GiB.

use hami_abi::layout::UsageKind;
use hami_common::region::Region;
use hami_test_harness::{ProbeOutput, RunningProbe, TestEnv};
use std::time::{Duration, Instant};

const MB: u64 = 1 << 20;
const OOM: i32 = 2;
/// What the fake driver's contexts take in these tests.
const CTX: u64 = 300 * MB;
const QUOTA: u64 = 1024 * MB;

fn env() -> TestEnv {
    TestEnv::new()
        .env("FAKE_CUDA_TOTAL_MEM", "16G")
        .env("FAKE_CUDA_CTX_OVERHEAD", "300M")
        .env("CUDA_DEVICE_MEMORY_LIMIT", "1G")
        .preload(true)
}

fn region(env: &TestEnv) -> Region {
    Region::open_existing(env.region_path(), false).expect("region exists")
}

/// Context memory charged in the region to the slot of `pid` on device 0.
fn context_of(env: &TestEnv, pid: u32) -> u64 {
    region(env)
        .snapshot()
        .slots_of_pid(pid)
        .map(|s| s.usage[0][UsageKind::Context.index()])
        .sum()
}

/// `(via, op)`: a primary retain (`ctx`) and a created context (`ctxcreate`), directly linked,
/// through `dlsym` and through `cuGetProcAddress` (`cuCtxCreate_v3/_v4`).
const CREATIONS: [(&str, &str); 5] = [
    ("direct", "ctx"),
    ("direct", "ctxcreate"),
    ("dlsym", "ctx"),
    ("procaddr", "ctx"),
    ("procaddr", "ctxcreate"),
];

/// The row "the first fills its quota, then the second initialises CUDA": the second
/// process's context is refused before the driver creates it, so it holds nothing on the
/// device (the driver's own per-process figure is 0), and the refusal is logged at the
/// default log level. Once the first process frees its memory, the same call succeeds.
#[test]
fn a_context_that_does_not_fit_a_full_quota_is_refused_and_takes_nothing() {
    for (via, op) in CREATIONS {
        let env = env();
        let mut a = env.spawn_probe(&["init", "ctx", "fill", "64M", "wait", "free", "all", "wait"]);
        a.wait_for("wait");
        let mut b = env.spawn_probe(&[
            "--via", via, "init", op, "wait", op, "alloc", "100M", "exit", "0",
        ]);
        let refused = b.wait_for(op);
        assert_eq!(refused.rc(), Some(OOM), "{via} {op}: {:?}", b.seen);
        b.wait_for("wait");
        assert_eq!(
            env.nvml().process_used(0, b.pid),
            0,
            "{via} {op}: the driver holds nothing for the refused process"
        );
        assert_eq!(context_of(&env, b.pid), 0, "{via} {op}: nothing charged");
        assert!(
            region(&env).used(0) <= QUOTA,
            "{via} {op}: {}",
            region(&env).used(0)
        );
        // The first process frees its data: now the context fits.
        a.resume();
        waiting(&mut a);
        b.resume();
        let b = b.finish();
        let ops = b.find(op);
        assert_eq!(ops[1].rc(), Some(0), "{via} {op}: {}", b.dump());
        assert_eq!(b.last("alloc").rc(), Some(0), "{via} {op}: {}", b.dump());
        assert!(
            b.stderr.contains("does not fit the quota") && b.stderr.contains("WARN"),
            "{via} {op}: the refusal is logged at the default level: {}",
            b.dump()
        );
        a.resume();
        assert!(a.finish().status.success());
    }
}

/// Reads `p`'s lines until it blocks in its next `wait` (`wait_for("wait")` would also match
/// the line a resumed `wait` prints).
fn waiting(p: &mut RunningProbe) {
    while p.wait_for("wait").get("state") != Some("waiting") {}
}

/// Sum of the fake driver's per-process figures on device 0 (all processes).
fn driver_total(env: &TestEnv) -> u64 {
    env.nvml().device(0).processes.iter().map(|p| p.1).sum()
}

/// The row "two processes filling one container at the same moment": their context
/// creations overlap (the fake makes each take 400 ms), then both fill. The container's first
/// context on the device is measured under the context-creation lock; the second creation
/// waits for the figure and admits it before the driver is called, so every fill is refused
/// at the quota: the driver's figures, sampled all along, never sum to more than the quota.
/// Before, the first process filled the quota while the second's context was being created
/// and the container ended 300 MiB over.
#[test]
fn two_processes_creating_and_filling_at_the_same_moment_stay_within_the_quota() {
    same_moment(false);
}

/// The same with NVML's process list not showing the processes' own pids (a container's pid
/// namespace): the context is measured at device level under the lock, stored all the same.
#[test]
fn two_processes_at_the_same_moment_stay_within_the_quota_without_per_process_nvml() {
    same_moment(true);
}

fn same_moment(hide_pids: bool) {
    let mut env = env()
        .env("FAKE_CUDA_CTX_CREATE_DELAY_MS", "400")
        .env("LIBCUDA_LOG_LEVEL", "3");
    if hide_pids {
        env = env.env("FAKE_NVML_HIDE_PROCESSES", "1");
    }
    let start = Instant::now();
    let mut a = env.spawn_probe(&["init", "ctx", "fill", "32M", "wait"]);
    std::thread::sleep(Duration::from_millis(150));
    let mut b = env.spawn_probe(&["init", "ctx", "fill", "32M", "wait"]);
    let mut worst = 0u64;
    let mut samples = 0;
    // Sample the driver's figures while both create and fill (until both wait, at most 20 s).
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    let waiter = std::thread::spawn(move || {
        a.wait_for("wait");
        b.wait_for("wait");
        let _ = done_tx.send(());
        (a, b)
    });
    while done_rx.try_recv().is_err() && start.elapsed() < Duration::from_secs(20) {
        worst = worst.max(driver_total(&env));
        samples += 1;
        std::thread::sleep(Duration::from_millis(10));
    }
    let (mut a, mut b) = waiter.join().expect("both probes reached wait");
    worst = worst.max(driver_total(&env));
    assert!(samples > 0);
    assert!(
        worst <= QUOTA,
        "the driver held {} MiB for a {} MiB quota",
        worst / MB,
        QUOTA / MB
    );
    // What the driver holds for each process is what the region accounts for it.
    let snap = region(&env).snapshot();
    if hide_pids {
        assert_eq!(driver_total(&env), snap.accounted(0));
    } else {
        for pid in [a.pid, b.pid] {
            let accounted: u64 = snap.slots_of_pid(pid).map(|s| s.device_total(0)).sum();
            assert_eq!(env.nvml().process_used(0, pid), accounted, "pid {pid}");
        }
    }
    a.resume();
    b.resume();
    let (a, b) = (a.finish(), b.finish());
    // Only one of them found the footprint unknown (the lock lets one measure first, A
    // unless B started faster); the other admitted the measured figure before creating its
    // context (having waited for it when their creations overlapped), or was refused if the
    // first had filled the quota by then.
    let first = "footprint not measured yet";
    let (a, b) = if a.stderr.contains(first) {
        (a, b)
    } else {
        (b, a)
    };
    assert!(a.stderr.contains(first), "{}", a.dump());
    assert_eq!(a.last("ctx").rc(), Some(0), "{}", a.dump());
    assert!(!b.stderr.contains(first), "{}\n{}", a.dump(), b.dump());
    match b.last("ctx").rc() {
        Some(0) => assert!(
            b.stderr
                .contains(&format!("admitted {CTX} bytes before the creation")),
            "{}",
            b.dump()
        ),
        Some(OOM) => assert!(b.stderr.contains("does not fit the quota"), "{}", b.dump()),
        rc => panic!("ctx rc {rc:?}: {}", b.dump()),
    }
    assert_eq!(region(&env).context_footprint(0), CTX);
}

/// The footprint is stored in the region by the first measurement and the next process
/// admits that figure before its creation (no waiting); a process that no longer fits next
/// to another one's context and data is then refused with the stored figure.
#[test]
fn the_footprint_measured_first_is_stored_and_admitted_by_the_next_process() {
    let env = env().env("LIBCUDA_LOG_LEVEL", "3");
    let first = env.run_probe(&["init", "ctx", "exit", "0"]);
    assert!(first.all_ok(), "{}", first.dump());
    assert_eq!(
        region(&env).context_footprint(0),
        CTX,
        "stored by the first measurement"
    );
    assert_eq!(region(&env).context_footprint(1), 0, "device 1 had none");
    let mut holder = env.spawn_probe(&["init", "ctx", "alloc", "500M", "wait"]);
    holder.wait_for("wait");
    // 300 + 500 held (plus a reserve the admission takes back), 300 more do not fit.
    let next = env.run_probe(&["init", "ctx", "exit", "0"]);
    assert_eq!(next.last("ctx").rc(), Some(OOM), "{}", next.dump());
    assert!(
        next.stderr
            .contains(&format!("a new context takes {CTX} bytes")),
        "{}",
        next.dump()
    );
    holder.resume();
    let holder = holder.finish();
    assert!(holder.all_ok(), "{}", holder.dump());
    assert!(
        holder
            .stderr
            .contains(&format!("admitted {CTX} bytes before the creation")),
        "{}",
        holder.dump()
    );
    assert!(!holder.stderr.contains("waited"), "{}", holder.dump());
}

/// Runs one process that creates a context, allocates `alloc` and exits; returns its output.
fn one(env: &TestEnv, alloc: &str) -> ProbeOutput {
    env.run_probe(&["init", "ctx", "alloc", alloc, "exit", "0"])
}

/// A footprint that is no longer right (the region's figure differs from what the driver now
/// takes, here written into the region as another driver or configuration would have left
/// it) is admitted, then corrected by the measurement, up or down, and the region's figure
/// replaced.
#[test]
fn a_footprint_that_changed_is_corrected_by_the_next_measurement() {
    let env = env().env("LIBCUDA_LOG_LEVEL", "3");
    assert!(one(&env, "1M").all_ok());
    let rw = Region::open_existing(env.region_path(), true).expect("region");
    // Too small: admitted 100 MiB, the driver took 300: charged 300.
    rw.set_context_footprint(0, 100 * MB);
    let mut p = env.spawn_probe(&["init", "ctx", "wait"]);
    p.wait_for("wait");
    assert_eq!(context_of(&env, p.pid), CTX);
    assert_eq!(rw.context_footprint(0), CTX, "corrected");
    p.resume();
    let p = p.finish();
    assert!(
        p.stderr.contains(&format!(
            "admitted {} bytes before the creation (the device's context footprint measured earlier in the container), charged {CTX} after",
            100 * MB
        )),
        "{}",
        p.dump()
    );
    // Too large: admitted 900 MiB (it fits the empty quota), charged 300 after, so that 700
    // MiB of data fit next to it.
    rw.set_context_footprint(0, 900 * MB);
    let p = one(&env, "700M");
    assert!(p.all_ok(), "{}", p.dump());
    assert!(
        p.stderr.contains(&format!("charged {CTX} after")),
        "{}",
        p.dump()
    );
    assert_eq!(rw.context_footprint(0), CTX, "corrected");
}

/// A quota smaller than one context, the container's first context on the device (nothing
/// known to admit before it exists): it is created, measured, found not to fit and destroyed
/// again, so the driver ends holding nothing for the process; the figure is stored, so the
/// retry is refused before the driver is asked.
#[test]
fn a_first_context_larger_than_the_quota_is_destroyed_again_and_refused() {
    for (via, op) in CREATIONS {
        let env = env().env("CUDA_DEVICE_MEMORY_LIMIT", "256M");
        let mut p = env.spawn_probe(&["--via", via, "init", op, op, "wait"]);
        let ops: Vec<_> = (0..2).map(|_| p.wait_for(op)).collect();
        p.wait_for("wait");
        assert_eq!(
            ops.iter().map(|o| o.rc()).collect::<Vec<_>>(),
            vec![Some(OOM); 2],
            "{via} {op}: {:?}",
            p.seen
        );
        assert_eq!(
            env.nvml().process_used(0, p.pid),
            0,
            "{via} {op}: destroyed again"
        );
        assert_eq!(region(&env).used(0), 0, "{via} {op}");
        assert_eq!(region(&env).context_footprint(0), CTX, "{via} {op}");
        p.resume();
        let p = p.finish();
        assert!(
            p.stderr.contains("the context was destroyed again")
                && p.stderr.contains("the context was not created"),
            "{via} {op}: {}",
            p.dump()
        );
    }
}
