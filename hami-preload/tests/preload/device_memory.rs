//! Device memory that arrives by other paths than plain allocations (issue 8, item 1):
//! stream-ordered pools that keep freed memory, mipmapped arrays, module and library globals
//! (eager and lazy), and the backstop for whatever no hook sees. Each test runs the real
//! `cudaprobe` against the fake driver, which models these paths (docs/fake-driver.md), with
//! the preload; each one was granted (or left uncharged) before the fix.

use hami_abi::layout::UsageKind;
use hami_common::region::Region;
use hami_test_harness::{ProbeOutput, TestEnv};

const MB: u64 = 1 << 20;
const OOM: i32 = 2;

fn env(limit: &str) -> TestEnv {
    TestEnv::new()
        .env("FAKE_CUDA_TOTAL_MEM", "16G")
        .env("FAKE_CUDA_CTX_OVERHEAD", "0")
        .env("CUDA_DEVICE_MEMORY_LIMIT", limit)
        .preload(true)
}

fn region(env: &TestEnv) -> Region {
    Region::open_existing(env.region_path(), false).expect("region exists")
}

/// Bytes of `kind` charged on device 0, all slots.
fn charged(env: &TestEnv, kind: UsageKind) -> u64 {
    region(env)
        .snapshot()
        .slots
        .iter()
        .map(|s| s.usage[0][kind.index()])
        .sum()
}

fn rcs(p: &ProbeOutput) -> Vec<i32> {
    p.rcs()
}

/// `free=` of the n-th `meminfo` line.
fn free_at(p: &ProbeOutput, n: usize) -> u64 {
    p.find("meminfo")[n].num("free").expect("free=")
}

/// The measured H200 case: PyTorch's `backend:cudaMallocAsync` sets the release threshold to
/// the maximum, so a process that allocated 2.5 GiB and dropped the tensor still holds it.
/// A second process in the same 4 GiB container must then be refused.
#[test]
fn pool_memory_kept_after_free_async_refuses_the_second_process() {
    let env = env("4G").env("FAKE_CUDA_CTX_OVERHEAD", "518M");
    let mut a = env.spawn_probe(&[
        "init",
        "ctx",
        "threshold",
        "default",
        "max",
        "async",
        "2500M",
        "freeasync",
        "last",
        "meminfo",
        "wait",
    ]);
    a.wait_for("wait");
    assert!(
        charged(&env, UsageKind::Pool) >= 2500 * MB,
        "the pool's reservation is charged after the free"
    );
    let b = env.run_probe(&["init", "ctx", "async", "2500M", "exit", "0"]);
    assert_eq!(b.last("async").rc(), Some(OOM), "{}", b.dump());
    a.resume();
    let a = a.finish();
    assert!(a.all_ok(), "{}", a.dump());
    // The quota view of A already counts what its pool keeps.
    assert!(free_at(&a, 0) <= (4096 - 518 - 2500) * MB, "{}", a.dump());
}

/// With the default threshold (0) the pool gives freed memory back at the next
/// synchronisation: then the second process gets its memory (an application within its
/// quota sees no difference).
#[test]
fn pool_memory_released_at_sync_is_uncharged() {
    let env = env("4G").env("FAKE_CUDA_CTX_OVERHEAD", "518M");
    let mut a = env.spawn_probe(&["init", "ctx", "async", "2500M", "freeasync", "last", "wait"]);
    a.wait_for("wait");
    let b = env.run_probe(&["init", "ctx", "async", "2500M", "exit", "0"]);
    assert_eq!(b.last("async").rc(), Some(0), "{}", b.dump());
    a.resume();
    assert!(a.finish().all_ok());
}

/// Trimming, and release at an event or context synchronisation once the threshold is
/// lowered, give the pool's memory back to the quota.
#[test]
fn trim_and_synchronisations_give_pool_memory_back() {
    let env = env("1G");
    for release in [
        &["trim", "default", "0"][..],
        &["threshold", "default", "0", "eventsync"][..],
        &["threshold", "default", "0", "ctxsync"][..],
        &["threshold", "default", "0", "streamsync"][..],
    ] {
        let mut ops = vec![
            "init",
            "ctx",
            "threshold",
            "default",
            "max",
            "async",
            "600M",
            "freeasync",
            "last",
            "meminfo",
        ];
        ops.extend_from_slice(release);
        ops.extend_from_slice(&["meminfo", "async", "900M", "exit", "0"]);
        let p = env.run_probe(&ops);
        assert!(p.all_ok(), "{release:?}: {}", p.dump());
        assert_eq!(free_at(&p, 0), 424 * MB, "{release:?}: kept: {}", p.dump());
        assert_eq!(
            free_at(&p, 1),
            1024 * MB,
            "{release:?}: released: {}",
            p.dump()
        );
    }
}

/// Without a release, memory kept in the pool counts: a plain allocation that would fit
/// beside the freed pointer is refused.
#[test]
fn memory_kept_in_a_pool_counts_against_plain_allocations() {
    let env = env("1G");
    let p = env.run_probe(&[
        "init",
        "ctx",
        "setpool",
        "threshold",
        "own",
        "max",
        "async",
        "700M",
        "freeasync",
        "last",
        "alloc",
        "400M",
        "async",
        "700M",
        "poolinfo",
        "own",
        "exit",
        "0",
    ]);
    assert_eq!(p.last("alloc").rc(), Some(OOM), "{}", p.dump());
    // Reusing the pool's own reservation needs no growth: granted.
    assert_eq!(p.find("async")[1].rc(), Some(0), "{}", p.dump());
    assert_eq!(p.last("poolinfo").num("reserved"), Some(700 * MB));
}

/// A pool grows by its own granularity, beyond the request: growth that takes the
/// container over its quota is given back and refused.
#[test]
fn pool_growth_beyond_the_request_is_admitted_too() {
    let env = env("1000M").env("FAKE_CUDA_POOL_GRANULE", "64M");
    let p = env.run_probe(&[
        "init", "ctx", "async", "990M", "poolinfo", "default", "async", "500M", "exit", "0",
    ]);
    assert_eq!(p.find("async")[0].rc(), Some(OOM), "{}", p.dump());
    assert_eq!(
        p.last("poolinfo").num("reserved"),
        Some(0),
        "the refused growth was trimmed away: {}",
        p.dump()
    );
    assert_eq!(
        p.find("async")[1].rc(),
        Some(0),
        "512 MiB fits: {}",
        p.dump()
    );
}

/// Pools made with `cuMemPoolCreate` are charged the same way, and destroying one gives
/// its memory back.
#[test]
fn created_pools_are_charged_until_destroyed() {
    let env = env("1G");
    let p = env.run_probe(&[
        "init",
        "ctx",
        "threshold",
        "default",
        "max",
        "pool",
        "300M",
        "threshold",
        "own",
        "max",
        "freeasync",
        "last",
        "meminfo",
        "pooldestroy",
        "meminfo",
        "exit",
        "0",
    ]);
    assert!(p.all_ok(), "{}", p.dump());
    assert_eq!(free_at(&p, 0), 724 * MB, "{}", p.dump());
    assert_eq!(free_at(&p, 1), 1024 * MB, "{}", p.dump());
}

/// The H200 row: a 2 GiB mipmapped array in a 1 GiB container is refused; one that fits is
/// charged until destroyed.
#[test]
fn mipmapped_arrays_are_charged() {
    for via in VIAS {
        mipmapped_arrays_via(via);
    }
}

/// The ways programs reach the driver (cudaprobe `--via`).
const VIAS: [&str; 3] = ["direct", "dlsym", "procaddr"];

fn mipmapped_arrays_via(via: &str) {
    let env = env("1G");
    let p = env.run_probe(&[
        "--via",
        via,
        "init",
        "ctx",
        "mipmap",
        "16384",
        "16384",
        "1",
        "mipmap",
        "4096",
        "4096",
        "3",
        "meminfo",
        "mipmapdestroy",
        "last",
        "meminfo",
        "exit",
        "0",
    ]);
    let m = p.find("mipmap");
    assert_eq!(m[0].rc(), Some(OOM), "{}", p.dump());
    assert_eq!(m[1].rc(), Some(0), "{}", p.dump());
    // 4096^2 x 8 bytes = 128 MiB, + 32 + 8 MiB for levels 1 and 2.
    assert_eq!(free_at(&p, 0), (1024 - 168) * MB, "{}", p.dump());
    assert_eq!(free_at(&p, 1), 1024 * MB, "{}", p.dump());
}

/// Eagerly loaded modules (every load entry point) whose globals do not fit are unloaded
/// and refused; one that fits is charged until unloaded.
#[test]
fn eager_module_loads_over_the_quota_are_refused_and_unloaded() {
    let env = env("1G").env("CUDA_MODULE_LOADING", "EAGER");
    for op in [
        "modload",
        "modloadex",
        "modloadfat",
        "modloadfile",
        "libload",
        "libloadfile",
    ] {
        let p = env.run_probe(&["init", "ctx", op, "1536M", "alloc", "900M", "exit", "0"]);
        assert_eq!(p.last(op).rc(), Some(OOM), "{op}: {}", p.dump());
        assert_eq!(
            p.last("alloc").rc(),
            Some(0),
            "{op}: the refused module was unloaded: {}",
            p.dump()
        );
    }
    let p = env.run_probe(&[
        "init",
        "ctx",
        "modload",
        "256M",
        "meminfo",
        "modunload",
        "last",
        "meminfo",
        "exit",
        "0",
    ]);
    assert!(p.all_ok(), "{}", p.dump());
    assert_eq!(free_at(&p, 0), 768 * MB, "{}", p.dump());
    assert_eq!(free_at(&p, 1), 1024 * MB, "{}", p.dump());
}

/// Lazy loading (the CUDA 12/13 default): a 1.5 GiB global arrives at the first function
/// lookup, which is refused; the memory stays charged (the driver holds it) until unload.
#[test]
fn lazy_module_memory_is_charged_at_first_lookup() {
    for via in VIAS {
        lazy_lookup_via(via);
    }
}

fn lazy_lookup_via(via: &str) {
    let env = env("1G");
    let p = env.run_probe(&[
        "--via",
        via,
        "init",
        "ctx",
        "modload",
        "1536M",
        "getfunc",
        "alloc",
        "1M",
        "modunload",
        "last",
        "alloc",
        "1M",
        "exit",
        "0",
    ]);
    assert_eq!(p.last("modload").rc(), Some(0), "{}", p.dump());
    assert_eq!(p.last("getfunc").rc(), Some(OOM), "{}", p.dump());
    assert_eq!(p.find("alloc")[0].rc(), Some(OOM), "{}", p.dump());
    assert_eq!(p.find("alloc")[1].rc(), Some(0), "{}", p.dump());
}

/// Lazy loading whose memory arrives at the first launch (what the H200 showed for a
/// runtime program): charged then, for a module function and for a library kernel launched
/// directly; the next allocation is refused.
#[test]
fn lazy_memory_arriving_at_first_launch_is_charged() {
    for load in [
        &["modload", "768M", "getfunc"][..],
        &["libload", "768M", "getkernel"][..],
        &["libload", "768M", "getkernel", "kernelfunc"][..],
    ] {
        // A fresh sandbox each time: `exit` leaves the slot to be reclaimed later.
        let env = env("1G").env("FAKE_CUDA_LAZY_AT_LAUNCH", "1");
        let mut ops = vec!["init", "ctx"];
        ops.extend_from_slice(load);
        ops.extend_from_slice(&["meminfo", "launch", "launch", "meminfo", "alloc", "512M"]);
        ops.extend_from_slice(&["exit", "0"]);
        let p = env.run_probe(&ops);
        assert_eq!(free_at(&p, 0), 1024 * MB, "{load:?}: {}", p.dump());
        let l = p.find("launch");
        assert_eq!((l[0].rc(), l[1].rc()), (Some(0), Some(0)), "{}", p.dump());
        assert_eq!(free_at(&p, 1), 256 * MB, "{load:?}: {}", p.dump());
        assert_eq!(p.last("alloc").rc(), Some(OOM), "{load:?}: {}", p.dump());
    }
}

/// A library is loaded into every context it is used in, each copy with its own globals
/// (CUDA's context-independent loading): one library's kernel launched on two devices holds
/// its 768 MiB on both, and both devices' quotas are charged. It used to be charged on the
/// first device only (the second device's copy escaped its quota).
#[test]
fn a_library_launched_on_two_devices_is_charged_on_both() {
    let env = env("4G")
        .env("CUDA_DEVICE_MEMORY_LIMIT_1", "1G")
        .env("FAKE_CUDA_DEVICE_COUNT", "2")
        .env("FAKE_CUDA_LAZY_AT_LAUNCH", "1");
    let p = env.run_probe(&[
        "init",
        "device",
        "0",
        "ctx",
        "libload",
        "768M",
        "getkernel",
        "launch",
        "meminfo",
        "device",
        "1",
        "ctx",
        "meminfo",
        "launch",
        "meminfo",
        "alloc",
        "512M",
        "device",
        "0",
        "ctx",
        "alloc",
        "512M",
        "exit",
        "0",
    ]);
    let l = p.find("launch");
    assert_eq!((l[0].rc(), l[1].rc()), (Some(0), Some(0)), "{}", p.dump());
    assert_eq!(
        free_at(&p, 0),
        4096 * MB - 768 * MB,
        "device 0: {}",
        p.dump()
    );
    assert_eq!(free_at(&p, 1), 1024 * MB, "device 1 before: {}", p.dump());
    assert_eq!(
        free_at(&p, 2),
        256 * MB,
        "device 1 after its launch: {}",
        p.dump()
    );
    let a = p.find("alloc");
    assert_eq!(a[0].rc(), Some(OOM), "device 1 is full: {}", p.dump());
    assert_eq!(a[1].rc(), Some(0), "device 0 is not: {}", p.dump());
}

/// The backstop: memory no hook accounted for (here a context whose configured overhead is
/// far below what the driver really took) is charged as "other" from the driver's
/// per-process figure at the next synchronisation, and refuses the next allocation.
#[test]
fn backstop_charges_what_no_hook_saw() {
    let env = env("1G")
        .env("FAKE_CUDA_CTX_OVERHEAD", "500M")
        .env("HAMI_CONTEXT_OVERHEAD", "100M")
        .env("HAMI_BACKSTOP_INTERVAL_MS", "1");
    let mut p = env.spawn_probe(&[
        "init", "ctx", "alloc", "300M", "ctxsync", "alloc", "300M", "wait",
    ]);
    p.wait_for("wait");
    let other = charged(&env, UsageKind::Other);
    assert_eq!(other, 400 * MB, "driver 800 MiB - accounted 400 MiB");
    p.resume();
    let p = p.finish();
    let a = p.find("alloc");
    assert_eq!(a[0].rc(), Some(0), "{}", p.dump());
    assert_eq!(a[1].rc(), Some(OOM), "{}", p.dump());
}

/// Turned off with `HAMI_BACKSTOP_INTERVAL_MS=0`: nothing is charged as other.
#[test]
fn backstop_can_be_turned_off() {
    let env = env("1G")
        .env("FAKE_CUDA_CTX_OVERHEAD", "500M")
        .env("HAMI_CONTEXT_OVERHEAD", "100M")
        .env("HAMI_BACKSTOP_INTERVAL_MS", "0");
    let p = env.run_probe(&[
        "init", "ctx", "alloc", "300M", "ctxsync", "alloc", "300M", "exit", "0",
    ]);
    assert!(rcs(&p).iter().all(|&r| r == 0), "{}", p.dump());
}

/// Transparency: within the quota every new path returns exactly what the driver returns
/// without the preload, whichever way the driver is reached.
#[test]
fn within_the_quota_results_are_the_drivers() {
    let ops = [
        "init",
        "ctx",
        "threshold",
        "default",
        "max",
        "async",
        "64M",
        "freeasync",
        "last",
        "trim",
        "default",
        "0",
        "pool",
        "32M",
        "setpool",
        "async",
        "8M",
        "eventsync",
        "streamsync",
        "ctxsync",
        "mipmap",
        "512",
        "512",
        "4",
        "mipmapdestroy",
        "last",
        "modload",
        "16M",
        "getfunc",
        "launch",
        "launchex",
        "libload",
        "16M",
        "getkernel",
        "launch",
        "kernelfunc",
        "launch",
        "libunload",
        "last",
        "modunload",
        "last",
        "mipmap",
        "0",
        "4",
        "1",
        "pooldestroy",
        "exit",
        "0",
    ];
    for via in ["direct", "dlsym", "procaddr"] {
        let mut args = vec!["--via", via];
        args.extend_from_slice(&ops);
        let plain = env("1G").preload(false).run_probe(&args);
        let hooked = env("1G").run_probe(&args);
        assert_eq!(rcs(&hooked), rcs(&plain), "{via}: {}", hooked.dump());
        assert!(plain.find("launch").len() == 3, "{}", plain.dump());
    }
}

/// During stream capture `cuMemAllocAsync` takes its memory from the graph's pool, not the
/// device's current pool: the allocation itself is charged (refused over the quota, as the
/// H200 showed the application seeing the failed `cudaMallocAsync`) and uncharged at the
/// captured free; the device's pool is not charged for it.
#[test]
fn allocations_during_stream_capture_are_charged_themselves() {
    let env = env("1G");
    let mut p = env.spawn_probe(&[
        "init",
        "ctx",
        "streamnew",
        "capture-begin",
        "async",
        "600M",
        "async",
        "600M",
        "capture-end",
        "wait",
        "freeasync",
        "last",
        "meminfo",
        "exit",
        "0",
    ]);
    p.wait_for("wait");
    assert_eq!(charged(&env, UsageKind::Data), 600 * MB);
    assert_eq!(charged(&env, UsageKind::Pool), 0);
    p.resume();
    let p = p.finish();
    let a = p.find("async");
    assert_eq!((a[0].rc(), a[1].rc()), (Some(0), Some(OOM)), "{}", p.dump());
    assert_eq!(p.last("capture-end").rc(), Some(0), "{}", p.dump());
    assert_eq!(free_at(&p, 0), 1024 * MB, "{}", p.dump());
}

/// The H200 row (`gpu/workloads/legacy_entries.c`, `release_mapped`): `cuMemRelease` of a
/// mapped handle leaves the memory held until it is unmapped (4 x 512 MiB created, mapped and
/// released held 2 GiB natively), so it must keep its charge: before the fix a second
/// 600 MiB in a 1 GiB container was granted with the first still held.
#[test]
fn a_handle_released_while_mapped_keeps_its_charge_until_unmapped() {
    let env = env("1G");
    let p = env.run_probe(&[
        "init",
        "ctx",
        "create",
        "600M",
        "releasemapped",
        "last",
        "create",
        "600M",
        "unmap",
        "last",
        "create",
        "600M",
        "exit",
        "0",
    ]);
    let c = p.find("create");
    assert_eq!(c[0].rc(), Some(0), "{}", p.dump());
    assert_eq!(
        p.find("releasemapped")[0].rc(),
        Some(0),
        "the driver releases the handle: {}",
        p.dump()
    );
    assert_eq!(
        c[1].rc(),
        Some(OOM),
        "still held while mapped: {}",
        p.dump()
    );
    assert_eq!(p.find("unmap")[0].rc(), Some(0), "{}", p.dump());
    assert_eq!(c[2].rc(), Some(0), "gone with the unmap: {}", p.dump());
    assert_eq!(charged(&env, UsageKind::Data), 600 * MB, "{}", p.dump());
}

/// `cuMemRetainAllocationHandle` gives one more reference: unmapped and released once, the
/// memory is still held until the retained reference is released too.
#[test]
fn a_retained_handle_keeps_its_charge_until_every_reference_is_released() {
    let env = env("1G");
    let p = env.run_probe(&[
        "init",
        "ctx",
        "create",
        "600M",
        "retain",
        "last",
        "releasemapped",
        "last",
        "unmap",
        "last",
        "create",
        "600M",
        "exit",
        "0",
    ]);
    let c = p.find("create");
    assert_eq!(c[0].rc(), Some(0), "{}", p.dump());
    assert_eq!(p.find("retain")[0].num("same"), Some(1), "{}", p.dump());
    assert_eq!(
        c[1].rc(),
        Some(OOM),
        "the retained reference holds it: {}",
        p.dump()
    );
    let p = env.run_probe(&[
        "init",
        "ctx",
        "create",
        "600M",
        "retain",
        "last",
        "releasemapped",
        "last",
        "releasemapped",
        "last",
        "unmap",
        "last",
        "create",
        "600M",
        "exit",
        "0",
    ]);
    let c = p.find("create");
    assert_eq!(
        c[1].rc(),
        Some(0),
        "both references released, unmapped: {}",
        p.dump()
    );
}

/// Mapped handles released in a loop: each keeps its charge, so the loop stops at the quota
/// (the hostile form of the case above; the backstop, refreshed only with little headroom or
/// at a synchronisation, did not catch it).
#[test]
fn create_map_release_in_a_loop_stops_at_the_quota() {
    let env = env("1G");
    let mut args = vec!["init", "ctx"];
    for _ in 0..4 {
        args.extend_from_slice(&["create", "300M", "releasemapped", "last"]);
    }
    args.extend_from_slice(&["exit", "0"]);
    let p = env.run_probe(&args);
    let c: Vec<_> = p.find("create").iter().map(|l| l.rc()).collect();
    assert_eq!(
        c,
        vec![Some(0), Some(0), Some(0), Some(OOM)],
        "{}",
        p.dump()
    );
}
