//! Bad inputs at the hook boundary (issue 12): null out-pointers, zero sizes, `SIZE_MAX`,
//! unknown devices, frees of 0, and frees from another thread while the process allocates.
//! Each call returns the code the CUDA driver API documents (or, where the documentation
//! leaves it to the driver, the driver's own code, learnt by running without the preload),
//! never crashes or hangs the program, and leaves the region's accounting exact.
//!
//! Null out-pointers of `cuMemAlloc`, `cuMemGetInfo` (one of two) and `cuDeviceTotalMem`, and
//! unknown and double frees, are in `regressions.rs`.

use crate::support::*;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const VIAS: [&str; 3] = ["direct", "dlsym", "procaddr"];
/// `SIZE_MAX` on this (64-bit) platform, as hprobe's size parser reads it.
const SIZE_MAX: &str = "18446744073709551615";
/// `CUDA_ERROR_INVALID_VALUE`.
const INVALID_VALUE: i64 = 1;

/// Runs `cmd` for at most `limit`; kills it and fails the test if it takes longer (a hook
/// must never hang the program).
fn within(mut cmd: Command, limit: Duration) -> Probe {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn hprobe");
    let start = Instant::now();
    while child.try_wait().expect("try_wait").is_none() {
        if start.elapsed() > limit {
            let _ = child.kill();
            let p = Probe::from(child.wait_with_output().expect("wait"));
            panic!("hung for {limit:?} (killed): {}", p.dump());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Probe::from(child.wait_with_output().expect("wait"))
}

/// hprobe with the preload, `--via via`, then `ops`, bounded in time.
fn probe(env: &Env, via: &str, ops: &[&str]) -> Probe {
    let mut cmd = env.command(hprobe(), true);
    cmd.args(["--via", via]).args(ops);
    within(cmd, Duration::from_secs(20))
}

/// hprobe without the preload (the driver's own answers), then `ops`, bounded in time.
fn native(env: &Env, ops: &[&str]) -> Probe {
    let mut cmd = env.command(hprobe(), false);
    cmd.args(ops);
    within(cmd, Duration::from_secs(20))
}

/// [`probe`] of `ops` followed by `exit 0`.
fn probe_then_exit(env: &Env, via: &str, ops: &[&str]) -> Probe {
    let mut a = ops.to_vec();
    a.extend_from_slice(&["exit", "0"]);
    probe(env, via, &a)
}

fn env_1g() -> Env {
    Env::new()
        .set("CUDA_DEVICE_MEMORY_LIMIT", "1G")
        .set("HAMI_CONTEXT_OVERHEAD", "0")
}

/// Everything every slot of the region holds on device 0.
fn region_used(env: &Env) -> u64 {
    env.region().used(0)
}

#[test]
fn null_out_pointers_zero_sizes_and_size_max_get_the_documented_codes() {
    let env = env_1g();
    for via in VIAS {
        let p = probe(
            &env,
            via,
            &[
                "alloc",
                "100M",      // live, so the region is not empty while the rest is refused
                "nullinfo2", // cuMemGetInfo(NULL, NULL)
                "alloc",
                "0", // "If bytesize is 0, cuMemAlloc() returns CUDA_ERROR_INVALID_VALUE"
                "managed",
                "0", // likewise documented for cuMemAllocManaged
                "alloc",
                SIZE_MAX,
                "managed",
                SIZE_MAX,
                "pitch",
                SIZE_MAX,
                "2",
                "pitch",
                "512",
                SIZE_MAX,
                "async",
                SIZE_MAX,
                "asyncptsz",
                SIZE_MAX,
                "pool",
                SIZE_MAX,
                "create",
                SIZE_MAX,
                "info",
                "exit",
                "0",
            ],
        );
        let oom = vec![OOM; 8];
        let mut want = vec![0, INVALID_VALUE, INVALID_VALUE, INVALID_VALUE];
        want.extend_from_slice(&oom);
        want.push(0);
        assert_eq!(p.rcs(), want, "{via}: {}", p.dump());
        assert_eq!(
            p.field(12, "free"),
            (GB - 100 * MB).to_string(),
            "{via}: only the live 100M is charged; {}",
            p.dump()
        );
        assert_eq!(region_used(&env), 100 * MB, "{via}: {}", p.dump());
    }
}

/// `cuMemFree(0)` and a physical allocation on a device that does not exist are the
/// driver's to answer: the same code comes back through the preload, nothing is charged.
#[test]
fn free_of_zero_and_an_unknown_device_return_the_drivers_code() {
    let env = env_1g();
    let ops = ["freezero", "createdev", "4096", "2M", "info"];
    let plain = native(&env, &ops);
    let (driver_free0, driver_baddev) = (plain.rc(0), plain.rc(1));
    assert_ne!(
        driver_baddev,
        0,
        "the driver rejects device 4096: {}",
        plain.dump()
    );
    for via in VIAS {
        let p = probe_then_exit(&env, via, &ops);
        assert_eq!(
            p.rcs(),
            vec![driver_free0, driver_baddev, 0],
            "{via}: {}",
            p.dump()
        );
        assert_eq!(p.field(2, "free"), GB.to_string(), "{via}: {}", p.dump());
        assert_eq!(region_used(&env), 0, "{via}: {}", p.dump());
    }
}

/// Array descriptors with a dimension no device supports (2^40) get the driver's
/// `CUDA_ERROR_INVALID_VALUE` through the preload too, though their estimated footprint is
/// far over the quota (it used to be `CUDA_ERROR_OUT_OF_MEMORY`); a valid but too large array
/// is still refused with `CUDA_ERROR_OUT_OF_MEMORY`, and nothing is charged.
#[test]
fn arrays_beyond_the_devices_dimensions_get_the_drivers_invalid_value() {
    let env = env_1g();
    const HUGE: &str = "1099511627776";
    let ops = [
        "array", HUGE, HUGE, // 2D, both dimensions beyond any device's
        "array", HUGE, "0", // 1D
        "array3d", "16384", "16384", "16384", // valid, 16 TiB: over the quota
        "array", "200000", "0", // beyond, but within the quota: the driver's answer
        "info",
    ];
    let plain = native(&env, &ops);
    assert_eq!(
        plain.rcs(),
        vec![INVALID_VALUE, INVALID_VALUE, OOM, INVALID_VALUE, 0],
        "the driver's codes: {}",
        plain.dump()
    );
    for via in VIAS {
        let p = probe_then_exit(&env, via, &ops);
        assert_eq!(
            p.rcs(),
            vec![INVALID_VALUE, INVALID_VALUE, OOM, INVALID_VALUE, 0],
            "{via}: {}",
            p.dump()
        );
        assert_eq!(p.field(4, "free"), GB.to_string(), "{via}: {}", p.dump());
        assert_eq!(region_used(&env), 0, "{via}: {}", p.dump());
    }
}

/// One thread allocates 64 MiB blocks under a 1 GiB limit while a second frees each block,
/// frees it again (a double free, or the free of the same address just handed out again)
/// and frees an unknown pointer. Every allocation is freed exactly once by the driver, the
/// unknown frees fail, and the region ends exactly empty.
#[test]
fn frees_from_another_thread_while_allocating_keep_the_region_exact() {
    let env = env_1g();
    for via in VIAS {
        let p = probe(&env, via, &["racefree", "1500", "64M", "info", "exit", "0"]);
        assert_eq!(p.rcs(), vec![0, 0], "{via}: {}", p.dump());
        let n = |k: &str| p.field(0, k).parse::<u64>().unwrap();
        assert!(n("allocated") > 0, "{via}: {}", p.dump());
        assert_eq!(
            n("freed") + n("double_ok"),
            n("allocated"),
            "{via}: each allocation freed exactly once; {}",
            p.dump()
        );
        assert_eq!(n("unknown_ok"), 0, "{via}: {}", p.dump());
        assert_eq!(p.field(1, "free"), GB.to_string(), "{via}: {}", p.dump());
        assert_eq!(region_used(&env), 0, "{via}: {}", p.dump());
    }
}

/// Two threads free the same pointer at the same moment, round after round: the driver
/// frees it once (one of the two gets its error), and the region ends exactly empty.
#[test]
fn the_same_pointer_freed_by_two_threads_at_once_is_uncharged_once() {
    let env = env_1g();
    for via in VIAS {
        let p = probe(
            &env,
            via,
            &["doublefree", "4000", "1M", "info", "exit", "0"],
        );
        assert_eq!(p.rcs(), vec![0, 0], "{via}: {}", p.dump());
        assert_eq!(p.field(0, "freed"), "4000", "{via}: {}", p.dump());
        assert_eq!(p.field(1, "free"), GB.to_string(), "{via}: {}", p.dump());
        assert_eq!(region_used(&env), 0, "{via}: {}", p.dump());
    }
}
