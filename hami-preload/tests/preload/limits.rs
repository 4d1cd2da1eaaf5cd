//! Context limits and local memory (issue 17, first rows): `cuCtxSetLimit` raises of the
//! malloc heap and the stack, and launches of kernels needing more local memory than the
//! context holds, against the fake driver that takes that memory as the H200 does
//! (docs/fake-driver.md: stack x 132 SMs x 2048 threads at the set, a raised heap at the next
//! launch, local memory grown at launch) and the printf FIFO as the H100 does (1/512 of it,
//! capped at 2 GiB; issue 31). Each test fails without the preload's admission:
//! the raise or the launch went through and the driver's figure exceeded the quota.

use hami_test_harness::{ProbeOutput, TestEnv};

const MB: u64 = 1 << 20;
const OOM: i32 = 2;
/// What a stack of 8 KiB per thread takes beyond the default 1 KiB (measured on the H200).
const STACK_8K: u64 = 1848 * MB;
/// What a kernel with 24 KiB of local memory per thread grows (measured on the H200).
const LOCAL_24K: u64 = 6072 * MB;

fn env(limit: &str) -> TestEnv {
    TestEnv::new()
        .env("FAKE_CUDA_TOTAL_MEM", "16G")
        .env("FAKE_CUDA_CTX_OVERHEAD", "0")
        .env("HAMI_BACKSTOP_INTERVAL_MS", "0")
        .env("HAMI_ADMISSION_RESERVE", "0")
        .env("CUDA_DEVICE_MEMORY_LIMIT", limit)
        .preload(true)
}

/// `free=` of the n-th `meminfo` line.
fn free_at(p: &ProbeOutput, n: usize) -> u64 {
    p.find("meminfo")[n].num("free").expect("free=")
}

/// Runs `ops` (then `wait`), checks that the driver's per-process figure (fake NVML) is
/// within `quota`, and returns the finished output.
fn run_within(env: &TestEnv, quota: u64, ops: &[&str]) -> ProbeOutput {
    let mut args = ops.to_vec();
    args.push("wait");
    let mut p = env.spawn_probe(&args);
    p.wait_for("wait");
    let used = env.nvml().process_used(0, p.pid);
    assert!(
        used <= quota,
        "the driver holds {} MiB for the process, over the {} MiB quota",
        used / MB,
        quota / MB
    );
    p.resume();
    p.finish()
}

#[test]
fn a_heap_raise_over_the_quota_is_refused() {
    for via in ["direct", "dlsym", "procaddr"] {
        let env = env("1G");
        let mut ops = vec!["--via", via];
        ops.extend_from_slice(&[
            "init", "ctx", "setlimit", "heap", "2G", "getlimit", "heap", "modload", "0", "getfunc",
            "launch", "alloc", "900M",
        ]);
        let p = run_within(&env, 1024 * MB, &ops);
        assert_eq!(p.last("setlimit").rc(), Some(OOM), "{via}: {}", p.dump());
        assert_eq!(
            p.last("getlimit").num("value"),
            Some(8 * MB),
            "{via}: {}",
            p.dump()
        );
        // The program goes on with what it has.
        assert_eq!(p.last("launch").rc(), Some(0), "{via}: {}", p.dump());
        assert_eq!(p.last("alloc").rc(), Some(0), "{via}: {}", p.dump());
    }
}

#[test]
fn a_heap_raise_within_the_quota_is_charged_at_the_set() {
    let env = env("1G");
    let p = run_within(
        &env,
        1024 * MB,
        &[
            "init", "ctx", "meminfo", "setlimit", "heap", "520M", "meminfo", "modload", "0",
            "getfunc", "launch", "alloc", "600M", "alloc", "400M",
        ],
    );
    assert_eq!(p.last("setlimit").rc(), Some(0), "{}", p.dump());
    // Its size and a page (H100, driver 580: 1 GiB +1026 MiB), the default's nothing.
    assert_eq!(free_at(&p, 0) - free_at(&p, 1), 522 * MB, "{}", p.dump());
    assert_eq!(p.last("launch").rc(), Some(0), "{}", p.dump());
    let a = p.find("alloc");
    assert_eq!((a[0].rc(), a[1].rc()), (Some(OOM), Some(0)), "{}", p.dump());
}

/// Issue 31: a printf FIFO takes about 1/512 of its size (H100, driver 580: 1 GiB +2 MiB,
/// capped at 2 GiB), so a 1 GiB FIFO in a 1 GiB container holding 518 MiB is granted as
/// natively; the preload used to charge its size and refuse it.
#[test]
fn a_1_gib_printf_fifo_is_granted_where_the_driver_serves_it() {
    for via in ["direct", "dlsym", "procaddr"] {
        let env = env("1G");
        let mut ops = vec!["--via", via];
        ops.extend_from_slice(&[
            "init", "ctx", "alloc", "518M", "meminfo", "setlimit", "printf", "1G", "getlimit",
            "printf", "meminfo", "modload", "0", "getfunc", "launch", "alloc", "500M",
        ]);
        let p = run_within(&env, 1024 * MB, &ops);
        assert_eq!(p.last("setlimit").rc(), Some(0), "{via}: {}", p.dump());
        assert_eq!(p.last("getlimit").num("value"), Some(1024 * MB), "{via}");
        assert_eq!(
            free_at(&p, 0) - free_at(&p, 1),
            2 * MB,
            "{via}: {}",
            p.dump()
        );
        assert_eq!(p.last("launch").rc(), Some(0), "{via}: {}", p.dump());
        assert_eq!(p.last("alloc").rc(), Some(0), "{via}: {}", p.dump());
    }
}

/// The driver sets at most 2 GiB of FIFO (a larger request succeeds and reads back 2 GiB):
/// charged for what it set (4 MiB), not for what was asked.
#[test]
fn a_printf_fifo_is_charged_for_what_the_driver_set() {
    let env = env("1G");
    let p = run_within(
        &env,
        1024 * MB,
        &[
            "init", "ctx", "alloc", "518M", "meminfo", "setlimit", "printf", "16G", "getlimit",
            "printf", "meminfo", "modload", "0", "getfunc", "launch", "alloc", "500M",
        ],
    );
    assert_eq!(p.last("setlimit").rc(), Some(0), "{}", p.dump());
    assert_eq!(
        p.last("getlimit").num("value"),
        Some(2048 * MB),
        "{}",
        p.dump()
    );
    assert_eq!(free_at(&p, 0) - free_at(&p, 1), 4 * MB, "{}", p.dump());
    assert_eq!(p.last("alloc").rc(), Some(0), "{}", p.dump());
}

/// A FIFO that really does not fit (4 MiB for 2 GiB, 3 MiB left) is refused before the
/// driver sets it; the program goes on.
#[test]
fn a_printf_fifo_that_does_not_fit_is_refused() {
    let env = env("1G");
    let p = run_within(
        &env,
        1024 * MB,
        &[
            "init", "ctx", "alloc", "1021M", "setlimit", "printf", "2G", "getlimit", "printf",
            "modload", "0", "getfunc", "launch",
        ],
    );
    assert_eq!(p.last("setlimit").rc(), Some(OOM), "{}", p.dump());
    assert_eq!(
        p.last("getlimit").num("value"),
        Some(8_650_752),
        "{}",
        p.dump()
    );
    assert_eq!(p.last("launch").rc(), Some(0), "{}", p.dump());
}

#[test]
fn a_stack_raise_over_the_quota_is_refused() {
    for via in ["direct", "dlsym", "procaddr"] {
        let env = env("1G");
        let mut ops = vec!["--via", via];
        ops.extend_from_slice(&[
            "init", "ctx", "setlimit", "stack", "8K", "getlimit", "stack", "alloc", "1000M",
        ]);
        let p = run_within(&env, 1024 * MB, &ops);
        assert_eq!(p.last("setlimit").rc(), Some(OOM), "{via}: {}", p.dump());
        assert_eq!(p.last("getlimit").num("value"), Some(1024), "{}", p.dump());
        assert_eq!(p.last("alloc").rc(), Some(0), "{via}: {}", p.dump());
    }
}

#[test]
fn a_stack_raise_is_charged_and_lowering_it_gives_it_back() {
    let env = env("4G");
    let p = run_within(
        &env,
        4096 * MB,
        &[
            "init",
            "ctx",
            "meminfo",
            "setlimit",
            "stack",
            "8K",
            "meminfo",
            "alloc",
            "2300M",
            "setlimit",
            "stack",
            "1K",
            "meminfo",
            "alloc",
            "2300M",
            // A created context's stack goes with it.
            "ctxcreate",
            "setlimit",
            "stack",
            "4K",
            "ctxdestroy",
            "ctx",
            "meminfo",
        ],
    );
    let s = p.find("setlimit");
    assert!(s.iter().all(|l| l.rc() == Some(0)), "{}", p.dump());
    assert_eq!(free_at(&p, 0) - free_at(&p, 1), STACK_8K, "{}", p.dump());
    let a = p.find("alloc");
    assert_eq!(a[0].rc(), Some(OOM), "{}", p.dump());
    assert_eq!(free_at(&p, 2), free_at(&p, 0), "{}", p.dump());
    assert_eq!(a[1].rc(), Some(0), "{}", p.dump());
    assert_eq!(free_at(&p, 3), free_at(&p, 0) - 2300 * MB, "{}", p.dump());
}

#[test]
fn a_launch_needing_local_memory_beyond_the_quota_is_refused() {
    for launch in ["launch", "launchex", "launchcoop"] {
        let env = env("4G");
        let p = run_within(
            &env,
            4096 * MB,
            &[
                "init",
                "ctx",
                "modload",
                "0",
                "local=24K",
                "getfunc",
                launch,
                "getlimit",
                "stack",
                "alloc",
                "3G",
                "modload",
                "0",
                "local=512",
                "getfunc",
                launch,
            ],
        );
        let l = p.find(launch);
        assert_eq!(l[0].rc(), Some(OOM), "{launch}: {}", p.dump());
        assert_eq!(p.last("getlimit").num("value"), Some(1024), "{}", p.dump());
        // The program goes on: it allocates what is left and launches small kernels.
        assert_eq!(p.last("alloc").rc(), Some(0), "{launch}: {}", p.dump());
        assert_eq!(l[1].rc(), Some(0), "{launch}: {}", p.dump());
    }
}

#[test]
fn a_launch_needing_local_memory_within_the_quota_is_charged_once() {
    let env = env("8G");
    let p = run_within(
        &env,
        8192 * MB,
        &[
            "init",
            "ctx",
            "modload",
            "0",
            "local=24K",
            "getfunc",
            "funcattr",
            "3",
            "meminfo",
            "launch",
            "meminfo",
            "launch",
            "launch",
            "meminfo",
            "getlimit",
            "stack",
            "alloc",
            "2200M",
            "alloc",
            "2000M",
        ],
    );
    assert_eq!(
        p.last("funcattr").num("value"),
        Some(24 << 10),
        "{}",
        p.dump()
    );
    assert!(
        p.find("launch").iter().all(|l| l.rc() == Some(0)),
        "{}",
        p.dump()
    );
    assert_eq!(free_at(&p, 0) - free_at(&p, 1), LOCAL_24K, "{}", p.dump());
    assert_eq!(free_at(&p, 2), free_at(&p, 1), "{}", p.dump());
    assert_eq!(
        p.last("getlimit").num("value"),
        Some(24 << 10),
        "{}",
        p.dump()
    );
    let a = p.find("alloc");
    assert_eq!((a[0].rc(), a[1].rc()), (Some(OOM), Some(0)), "{}", p.dump());
}

#[test]
fn limit_errors_are_the_drivers() {
    let env = env("1G");
    let p = env.run_probe(&[
        "init", "setlimit", "stack", "8K", "ctx", "setlimit", "99", "1", "setlimit", "7", "1",
        "setlimit", "pending", "4096", "modload", "0", "getfunc", "launch", "setlimit", "heap",
        "16M", "getlimit", "pending",
    ]);
    let s = p.find("setlimit");
    let rcs: Vec<_> = s.iter().map(|l| l.rc()).collect();
    // No context; an unknown limit; an unsupported one; a device-runtime limit (measured:
    // nothing taken); the heap after a launch.
    assert_eq!(
        rcs,
        [Some(201), Some(1), Some(215), Some(0), Some(1)],
        "{}",
        p.dump()
    );
    assert_eq!(p.last("getlimit").num("value"), Some(4096), "{}", p.dump());
}

/// A library kernel launched directly (a `CUkernel`: its local size comes from
/// `cuKernelGetAttribute` on the current device) is admitted like a function.
#[test]
fn a_library_kernel_needing_local_memory_is_admitted_too() {
    let small = env("4G");
    let p = run_within(
        &small,
        4096 * MB,
        &[
            "init",
            "ctx",
            "libload",
            "0",
            "local=24K",
            "getkernel",
            "launch",
            "alloc",
            "3G",
        ],
    );
    assert_eq!(p.last("launch").rc(), Some(OOM), "{}", p.dump());
    assert_eq!(p.last("alloc").rc(), Some(0), "{}", p.dump());
    let big = env("8G");
    let p = run_within(
        &big,
        8192 * MB,
        &[
            "init",
            "ctx",
            "libload",
            "0",
            "local=24K",
            "getkernel",
            "meminfo",
            "launch",
            "meminfo",
        ],
    );
    assert_eq!(p.last("launch").rc(), Some(0), "{}", p.dump());
    assert_eq!(free_at(&p, 0) - free_at(&p, 1), LOCAL_24K, "{}", p.dump());
}

/// What a primary context's limits and launches took goes with its last release.
#[test]
fn limit_charges_go_with_the_primary_context() {
    let env = env("8G");
    let p = run_within(
        &env,
        8192 * MB,
        &[
            "init",
            "ctx",
            "meminfo",
            "setlimit",
            "heap",
            "100M",
            "modload",
            "0",
            "local=24K",
            "getfunc",
            "launch",
            "meminfo",
            "ctxrelease",
            "ctx",
            "meminfo",
            "getlimit",
            "stack",
        ],
    );
    assert!(p.all_ok(), "{}", p.dump());
    assert_eq!(
        free_at(&p, 0) - free_at(&p, 1),
        LOCAL_24K + 102 * MB,
        "{}",
        p.dump()
    );
    assert_eq!(free_at(&p, 2), free_at(&p, 0), "{}", p.dump());
    assert_eq!(p.last("getlimit").num("value"), Some(1024), "{}", p.dump());
}
