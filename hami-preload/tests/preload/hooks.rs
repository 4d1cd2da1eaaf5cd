//! Each hook, reached each of the three ways (direct linking, dlsym, cuGetProcAddress),
//! enforces the quota and accounts in the shared region.

use crate::support::*;

/// Checks of the tests' lists against the intercept table.
mod table;

const VIAS: [&str; 3] = ["direct", "dlsym", "procaddr"];

/// Calls `sym args` (hprobe's `call`, which passes them as the row's shape says) twice under
/// a 1 GiB limit (second one refused), checks the view, releases with `call release`,
/// allocates again and leaves without cleanup (`_exit`) so that the region still shows the
/// live allocation.
fn check(via: &str, sym: &str, args: &[&str], release: &str, charged: u64) {
    let env = Env::new()
        .set("CUDA_DEVICE_MEMORY_LIMIT", "1G")
        .set("HAMI_CONTEXT_OVERHEAD", "0");
    let mut a = vec!["--via", via];
    for _ in 0..2 {
        a.extend_from_slice(&["call", sym]);
        a.extend_from_slice(args);
    }
    a.extend_from_slice(&["info", "call", release, "call", sym]);
    a.extend_from_slice(args);
    a.extend_from_slice(&["exit", "0"]);
    let p = env.probe(&a);
    assert_eq!(p.rcs(), vec![0, OOM, 0, 0, 0], "{via} {sym}: {}", p.dump());
    assert_eq!(p.field(3, "sym"), release, "{}", p.dump());
    assert_eq!(
        p.field(2, "total").parse::<u64>().unwrap(),
        GB,
        "{}",
        p.dump()
    );
    assert_eq!(
        p.field(2, "free").parse::<u64>().unwrap(),
        GB - charged,
        "{via} {sym}: {}",
        p.dump()
    );
    let r = env.region();
    assert_eq!(
        r.used(0),
        charged,
        "{via} {sym}: region usage; {}",
        p.dump()
    );
    let snap = r.snapshot();
    let live: Vec<_> = snap
        .slots
        .iter()
        .filter(|s| s.device_total(0) != 0)
        .collect();
    assert_eq!(live.len(), 1, "{via} {sym}: one slot holds the usage");
}

/// One test per line: `test_name: "symbol" [args] "release symbol" => charged bytes;` runs
/// `call symbol args` and `call release` (hprobe's generic op: a function of an existing
/// shape needs no C) the three ways; [`HOOK_TESTED`] lists the pairs, checked against the
/// table (`table::every_allocating_row_has_a_hook_test`).
macro_rules! hook_tests {
    ($($name:ident: $sym:literal [$($arg:literal),*] $release:literal => $charged:expr;)*) => {
        /// The (allocation, release) pairs `hook_tests!` covers.
        const HOOK_TESTED: &[(&str, &str)] = &[$(($sym, $release)),*];
        $(
            #[test]
            fn $name() {
                for via in VIAS {
                    check(via, $sym, &[$($arg),*], $release, $charged);
                }
            }
        )*
    };
}

// Arguments after the shape's own: cuMemAllocManaged's flags (1 = CU_MEM_ATTACH_GLOBAL), the
// pool of cuMemAllocFromPoolAsync (`@pool`: device 0's default pool); streams are 0.
hook_tests! {
    mem_alloc: "cuMemAlloc_v2" ["600M"] "cuMemFree_v2" => 600 * MB;
    // 1000 bytes wide rows get a 1024-byte pitch: 1024 * 600K rows = 600 MiB.
    mem_alloc_pitch: "cuMemAllocPitch_v2" ["1000", "600K"] "cuMemFree_v2" => 600 * MB;
    mem_alloc_managed: "cuMemAllocManaged" ["600M", "1"] "cuMemFree_v2" => 600 * MB;
    mem_alloc_async: "cuMemAllocAsync" ["600M"] "cuMemFreeAsync" => 600 * MB;
    mem_alloc_async_ptsz: "cuMemAllocAsync_ptsz" ["600M"] "cuMemFreeAsync_ptsz" => 600 * MB;
    mem_alloc_from_pool_async: "cuMemAllocFromPoolAsync" ["600M", "@pool"] "cuMemFreeAsync" => 600 * MB;
    mem_alloc_from_pool_async_ptsz: "cuMemAllocFromPoolAsync_ptsz" ["600M", "@pool"] "cuMemFreeAsync_ptsz" => 600 * MB;
    mem_create: "cuMemCreate" ["600M"] "cuMemRelease" => 600 * MB;
    // float4 (16 bytes) 6400 x 6144 = 600 MiB.
    array_create: "cuArrayCreate_v2" ["6400", "6144"] "cuArrayDestroy" => 600 * MB;
    array3d_create: "cuArray3DCreate_v2" ["6400", "3072", "2"] "cuArrayDestroy" => 600 * MB;
    // Two levels of a 6400 x 6144 float4 2D array (depth 0): 600 + 150 MiB.
    mipmapped_array_create: "cuMipmappedArrayCreate" ["6400", "6144", "0", "2"] "cuMipmappedArrayDestroy" => 750 * MB;
}

#[test]
fn host_located_mem_create_is_not_charged() {
    let env = Env::new()
        .set("CUDA_DEVICE_MEMORY_LIMIT", "1G")
        .set("HAMI_CONTEXT_OVERHEAD", "0");
    for via in VIAS {
        let p = env.probe(&[
            "--via",
            via,
            "hostcreate",
            "600M",
            "hostcreate",
            "600M",
            "info",
        ]);
        assert_eq!(p.rc(0), p.rc(1), "{}", p.dump());
        assert_eq!(
            p.field(2, "free").parse::<u64>().unwrap(),
            GB,
            "{}",
            p.dump()
        );
    }
}

#[test]
fn views_report_the_quota() {
    let env = Env::new()
        .set("CUDA_DEVICE_MEMORY_LIMIT", "3G")
        .set("HAMI_CONTEXT_OVERHEAD", "0");
    for via in VIAS {
        let p = env.probe(&["--via", via, "info", "total", "alloc", "1G", "info"]);
        assert_eq!(p.rcs(), vec![0, 0, 0, 0], "{}", p.dump());
        assert_eq!(p.field(0, "total"), (3 * GB).to_string());
        assert_eq!(p.field(0, "free"), (3 * GB).to_string());
        assert_eq!(p.field(1, "total"), (3 * GB).to_string());
        assert_eq!(p.field(3, "free"), (2 * GB).to_string());
    }
    // Unlimited: the physical values (the fake has 16 GiB).
    let env = Env::new();
    let p = env.probe(&["total"]);
    assert_eq!(p.field(0, "total"), (16 * GB).to_string(), "{}", p.dump());
}

#[test]
fn context_memory_is_charged() {
    let env = Env::new()
        .set("CUDA_DEVICE_MEMORY_LIMIT", "1G")
        .set("HAMI_CONTEXT_OVERHEAD", "100M");
    let p = env.probe(&["info", "alloc", "900M", "alloc", "800M", "exit", "0"]);
    // 100M context + 900M data fit in 1 GiB; 800M more do not.
    assert_eq!(p.rcs(), vec![0, 0, OOM], "{}", p.dump());
    assert_eq!(p.field(0, "free"), (924 * MB).to_string(), "{}", p.dump());
    let r = env.region();
    assert_eq!(r.used(0), 1000 * MB);
    let snap = r.snapshot();
    let s = snap.slots.iter().find(|s| s.device_total(0) != 0).unwrap();
    assert_eq!(
        s.usage[0][hami_abi::layout::UsageKind::Context.index()],
        100 * MB
    );
}

#[test]
fn context_memory_is_measured_with_nvml() {
    let env = Env::new()
        .set("CUDA_DEVICE_MEMORY_LIMIT", "1G")
        .set("FAKE_CUDA_CTX_OVERHEAD", "200M");
    let p = env.probe(&["info", "exit", "0"]);
    assert_eq!(p.rcs(), vec![0], "{}", p.dump());
    assert_eq!(p.field(0, "free"), (824 * MB).to_string(), "{}", p.dump());
    let snap = env.region().snapshot();
    let ctx: u64 = snap
        .slots
        .iter()
        .map(|s| s.usage[0][hami_abi::layout::UsageKind::Context.index()])
        .sum();
    assert_eq!(ctx, 200 * MB);
}

#[test]
fn nvml_memory_info_shows_the_quota() {
    let env = Env::new()
        .set("CUDA_DEVICE_MEMORY_LIMIT", "2G")
        .set("HAMI_CONTEXT_OVERHEAD", "0");
    // A CUDA process leaves 512M behind (and records the device UUIDs).
    assert_eq!(env.probe(&["alloc", "512M", "exit", "0"]).rcs(), vec![0]);
    let out = env
        .command(&Artifacts::get().nvmlprobe, true)
        .args(["--index", "0"])
        .output()
        .unwrap();
    let p = Probe::from(out);
    let mem = p
        .lines
        .iter()
        .find(|(op, _)| op == "memory")
        .unwrap_or_else(|| panic!("{}", p.dump()));
    assert_eq!(mem.1["rc"], "0");
    assert_eq!(mem.1["total"], (2 * GB).to_string(), "{}", p.dump());
    assert_eq!(mem.1["used"], (512 * MB).to_string(), "{}", p.dump());
    assert_eq!(mem.1["free"], (1536 * MB).to_string(), "{}", p.dump());
    let v2 = p.lines.iter().find(|(op, _)| op == "memory_v2").unwrap();
    assert_eq!(v2.1["total"], (2 * GB).to_string(), "{}", p.dump());
    assert_eq!(v2.1["free"], (1536 * MB).to_string(), "{}", p.dump());
    // Without the preload: the physical device.
    let out = env
        .command(&Artifacts::get().nvmlprobe, false)
        .args(["--index", "0"])
        .output()
        .unwrap();
    let p = Probe::from(out);
    let mem = p.lines.iter().find(|(op, _)| op == "memory").unwrap();
    assert_eq!(mem.1["total"], (16 * GB).to_string(), "{}", p.dump());
}
