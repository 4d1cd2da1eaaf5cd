//! The fake driver's own tests: error codes, the three ways of reaching it, cuGetProcAddress
//! semantics (checked against the table measured on a real driver), cross-process accounting,
//! NVML agreement and CUDA_VISIBLE_DEVICES; device memory that arrives by other paths in
//! [`other_memory`].

use hami_test_harness::TestEnv;

mod fixtures;
mod other_memory;
use fixtures::*;

#[test]
fn not_initialized_before_cuinit() {
    let e = env();
    let out = e.run_probe(&[
        "alloc", "1M", "meminfo", "count", "free-raw", "0x1234", "ctx", "version",
    ]);
    assert_eq!(
        out.rcs(),
        vec![NOT_INITIALIZED; 5]
            .into_iter()
            .chain([SUCCESS])
            .collect::<Vec<_>>(),
        "{}",
        out.dump()
    );
    assert_eq!(out.last("version").num("version"), Some(13000));
}

#[test]
fn invalid_context_and_invalid_values() {
    let e = env();
    let out = e.run_probe(&[
        "init",
        "alloc",
        "1M",
        "meminfo",
        "ctxsync",
        "ctxdevice",
        "ctxpop",
        "ctx",
        "alloc",
        "0",
        "alloc-null",
        "free-raw",
        "0x1234",
        "free-raw",
        "0",
        "device",
        "7",
        "ctx",
        "device",
        "0",
        "managed",
        "1M",
        "pitch",
        "0",
        "4",
    ]);
    let rcs = out.rcs();
    assert_eq!(
        rcs,
        vec![
            SUCCESS,
            INVALID_CONTEXT,
            INVALID_CONTEXT,
            INVALID_CONTEXT,
            INVALID_CONTEXT,
            INVALID_CONTEXT,
            SUCCESS,
            INVALID_VALUE,
            INVALID_VALUE,
            INVALID_VALUE,
            SUCCESS, // cuMemFree(0) succeeds, as on the real driver
            SUCCESS,
            INVALID_DEVICE,
            SUCCESS,
            SUCCESS,
            INVALID_VALUE, // zero-width pitch allocation
        ],
        "{}",
        out.dump()
    );
}

#[test]
fn double_free_and_unknown_free_are_invalid_value() {
    let e = env();
    let first = e.run_probe(&["init", "ctx", "alloc", "4M"]);
    let ptr = format!("{:#x}", first.last("alloc").ptr().expect("ptr"));
    // A pointer of another (finished) process is unknown here.
    let out = e.run_probe(&[
        "init", "ctx", "free-raw", &ptr, "alloc", "4M", "free", "last", "free", "0",
    ]);
    assert_eq!(rc_of(&out, 2), INVALID_VALUE, "{}", out.dump());
    let again = out.last("alloc").ptr().expect("ptr");
    assert_eq!(rc_of(&out, 4), SUCCESS);
    // `free 0` names the record already freed: the driver sees a double free.
    assert_eq!(rc_of(&out, 5), INVALID_VALUE, "{}", out.dump());
    let out = e.run_probe(&[
        "init",
        "ctx",
        "alloc",
        "2M",
        "free-raw",
        &format!("{again:#x}"),
    ]);
    assert_eq!(rc_of(&out, 3), INVALID_VALUE, "{}", out.dump());
}

#[test]
fn three_ways_allocate_and_free() {
    for via in ["direct", "dlsym", "procaddr"] {
        let e = env();
        let out = e.run_probe(&[
            "--via",
            via,
            "init",
            "ctx",
            "meminfo",
            "alloc",
            "64M",
            "meminfo",
            "async",
            "8M",
            "pool",
            "2M",
            "create",
            "4M",
            "meminfo",
            "free",
            "0",
            "freeasync",
            "1",
            "freeasync",
            "2",
            "release",
            "3",
            "meminfo",
        ]);
        assert!(out.all_ok(), "via {via}: {}", out.dump());
        let m = out.find("meminfo");
        let (before, after_alloc, after_all, after_free) = (
            meminfo_free(m[0]),
            meminfo_free(m[1]),
            meminfo_free(m[2]),
            meminfo_free(m[3]),
        );
        assert_eq!(before - after_alloc, 64 * MIB, "via {via}");
        assert_eq!(before - after_all, 78 * MIB, "via {via}");
        assert_eq!(after_free, before, "via {via}");
        assert_ne!(out.last("alloc").ptr(), Some(0));
    }
}

#[test]
fn procaddr_with_cuda13_versions_uses_new_entry_points() {
    let e = env();
    let out = e.run_probe(&[
        "--via",
        "procaddr",
        "--cuda-version",
        "13000",
        "init",
        "ctx",
        "ctxcreate",
        "ctxdevice",
        "ctxsync",
        "ctxdestroy",
        "ctxdevice",
        "getproc",
        "cuCtxCreate",
        "getproc",
        "cuCtxGetDevice",
        "getproc",
        "cuCtxSynchronize",
    ]);
    assert!(out.all_ok(), "{}", out.dump());
    let g = out.find("getproc");
    assert_eq!(g[0].get("sym"), Some("cuCtxCreate_v4"));
    assert_eq!(g[1].get("sym"), Some("cuCtxGetDevice_v2"));
    assert_eq!(g[2].get("sym"), Some("cuCtxSynchronize_v2"));
}

#[test]
fn get_proc_address_flags_and_errors() {
    let e = env();
    let out = e.run_probe(&[
        "getproc",
        "cuMemAlloc",
        "12000",
        "0", // works before cuInit
        "getproc",
        "cuMemAllocAsync",
        "12000",
        "2",
        "getproc",
        "cuMemFreeAsync",
        "12000",
        "2",
        "getproc",
        "cuMemAllocFromPoolAsync",
        "12000",
        "2",
        "getproc",
        "cuMemAllocAsync",
        "12000",
        "0",
        "getproc",
        "cuMemAlloc_v2",
        "12000",
        "0", // versioned names are not base names
        "getproc",
        "cuNoSuchThing",
        "12000",
        "0",
        "getproc",
        "cuMemAllocAsync",
        "11000",
        "0",
        "getproc",
        "cuMemAlloc",
        "13010",
        "0", // above the driver version
        "getproc1",
        "cuNoSuchThing",
        "12000",
        "0",
        "getproc1",
        "cuMemAllocAsync",
        "11000",
        "0",
        "getproc1",
        "cuMemAlloc",
        "12000",
        "0",
    ]);
    let g = out.find("getproc");
    let sym = |i: usize| g[i].get("sym").unwrap_or("");
    let status = |i: usize| g[i].num("status").unwrap_or(99);
    assert_eq!(
        (sym(0), status(0), g[0].rc()),
        ("cuMemAlloc_v2", 0, Some(SUCCESS)),
        "{}",
        out.dump()
    );
    assert!(
        g[0].get("lib")
            .unwrap_or("")
            .ends_with("fake-driver/libcuda.so.1"),
        "{}",
        g[0].raw
    );
    assert_eq!(sym(1), "cuMemAllocAsync_ptsz");
    assert_eq!(sym(2), "cuMemFreeAsync_ptsz");
    assert_eq!(sym(3), "cuMemAllocFromPoolAsync_ptsz");
    assert_eq!(sym(4), "cuMemAllocAsync");
    assert_eq!((sym(5), status(5), g[5].rc()), ("NULL", 1, Some(SUCCESS)));
    assert_eq!((sym(6), status(6), g[6].rc()), ("NULL", 1, Some(SUCCESS)));
    assert_eq!((sym(7), status(7), g[7].rc()), ("NULL", 2, Some(SUCCESS)));
    assert_eq!(g[8].rc(), Some(INVALID_VALUE));
    let g1 = out.find("getproc1");
    assert_eq!(
        (g1[0].get("sym"), g1[0].rc()),
        (Some("UNTOUCHED"), Some(NOT_FOUND))
    );
    assert_eq!(
        (g1[1].get("sym"), g1[1].rc()),
        (Some("UNTOUCHED"), Some(NOT_FOUND))
    );
    assert_eq!(
        (g1[2].get("sym"), g1[2].rc()),
        (Some("cuMemAlloc_v2"), Some(SUCCESS))
    );
}

/// Every (symbol, version, flags) probed on the real driver 580 resolves to the same function
/// name in the fake, for the functions the fake exports.
#[test]
fn get_proc_address_matches_the_real_driver_table() {
    let (args, expect) = real_procaddr_cases();
    assert!(
        expect.len() > 3000,
        "table not parsed: {} cases",
        expect.len()
    );
    let resolved = expect.iter().filter(|x| x.4 == 0 && x.3 != "NULL").count();
    assert!(resolved > 1500, "only {resolved} resolved cases");
    let e = env();
    let argv: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = e.run_probe(&argv);
    let got = out.find("getproc");
    assert_eq!(got.len(), expect.len(), "{}", out.stderr);
    let mut mismatches = Vec::new();
    for (g, (name, v, flags, sym, rc, status)) in got.iter().zip(&expect) {
        let gsym = g.get("sym").unwrap_or("");
        let gsym = if gsym == "NULL" && g.rc() != Some(0) {
            "UNTOUCHED"
        } else {
            gsym
        };
        let ok = g.rc() == Some(*rc)
            && (*rc != 0 || (gsym == sym && g.num("status") == Some(*status as u64)));
        if !ok {
            mismatches.push(format!(
                "{name} v{v} f{flags}: real {sym}/{rc}/{status}, fake {}",
                g.raw
            ));
        }
    }
    assert!(
        mismatches.is_empty(),
        "{} mismatches:\n{}",
        mismatches.len(),
        mismatches.join("\n")
    );
}

#[test]
fn out_of_memory_across_two_processes_and_reclaim_after_kill() {
    let e = env().env("FAKE_CUDA_TOTAL_MEM", "1G");
    let mut a = e.spawn_probe(&["init", "ctx", "alloc", "600M", "wait"]);
    assert!(a.wait_for("alloc").ok());
    a.wait_for("wait");
    let b = e.run_probe(&[
        "init", "ctx", "alloc", "600M", "alloc", "300M", "meminfo", "fill", "64M",
    ]);
    assert_eq!(rc_of(&b, 2), OUT_OF_MEMORY, "{}", b.dump());
    assert_eq!(rc_of(&b, 3), SUCCESS);
    assert_eq!(b.last("meminfo").num("free"), Some(GIB - 900 * MIB));
    let fill = b.last("fill");
    assert_eq!(fill.num("count"), Some(1), "{}", fill.raw); // 124 MiB left: one 64 MiB chunk
    assert_eq!(fill.rc(), Some(OUT_OF_MEMORY));
    a.kill();
    // The killed process's 600 MiB are given back.
    let c = e.run_probe(&["init", "ctx", "alloc", "600M", "meminfo"]);
    assert!(c.all_ok(), "{}", c.dump());
    assert_eq!(c.last("meminfo").num("free"), Some(GIB - 600 * MIB));
}

#[test]
fn contexts_charge_their_overhead_and_die_with_their_memory() {
    let e = TestEnv::new()
        .env("FAKE_CUDA_CTX_OVERHEAD", "100M")
        .env("FAKE_CUDA_TOTAL_MEM", "2G");
    let out = e.run_probe(&[
        "init",
        "ctx",
        "meminfo",
        "ctxcreate",
        "alloc",
        "50M",
        "meminfo",
        "ctxdestroy",
        "meminfo",
        "alloc",
        "10M",
        "ctxrelease",
        "ctxsync",
        "alloc",
        "1M",
    ]);
    let m = out.find("meminfo");
    assert_eq!(meminfo_free(m[0]), 2 * GIB - 100 * MIB, "{}", out.dump());
    assert_eq!(meminfo_free(m[1]), 2 * GIB - 250 * MIB);
    // Destroying the created context frees its 50 MiB and its overhead.
    assert_eq!(meminfo_free(m[2]), 2 * GIB - 100 * MIB);
    assert_eq!(out.last("ctxrelease").rc(), Some(SUCCESS));
    // The released primary context is still current but destroyed.
    assert_eq!(out.last("ctxsync").rc(), Some(CONTEXT_IS_DESTROYED));
    assert_eq!(out.last("alloc").rc(), Some(CONTEXT_IS_DESTROYED));
    let out = e.run_probe(&["init", "ctxrelease"]);
    assert_eq!(out.last("ctxrelease").rc(), Some(INVALID_CONTEXT));
}

#[test]
fn footprints_of_pitch_arrays_managed_and_vmm() {
    let e = env();
    let out = e.run_probe(&[
        "init", "ctx", "meminfo", "pitch", "1000", "10", "meminfo", "array", "1000", "1000",
        "meminfo", "array3d", "256", "256", "256", "meminfo", "managed", "1G", "meminfo", "create",
        "6M", "create", "3M", "meminfo", "free", "all", "meminfo",
    ]);
    let m: Vec<u64> = out.find("meminfo").into_iter().map(meminfo_free).collect();
    let p = out.last("pitch");
    assert_eq!(
        (p.num("pitch"), p.rc()),
        (Some(1024), Some(SUCCESS)),
        "{}",
        out.dump()
    );
    assert_eq!(m[0] - m[1], 10240);
    assert_eq!(m[1] - m[2], 4 * MIB); // 4,000,000 bytes rounded up to 2 MiB
    assert_eq!(m[2] - m[3], 64 * MIB);
    assert_eq!(m[3] - m[4], 0); // managed memory is not resident (as on the real driver)
    assert_eq!(m[4] - m[5], 6 * MIB);
    let creates = out.find("create");
    assert_eq!(
        (creates[1].rc(), creates[1].get("stage")),
        (Some(INVALID_VALUE), Some("create"))
    );
    assert_eq!(m[6], m[0], "{}", out.dump());
}

#[test]
fn nvml_agrees_with_the_driver() {
    let e = TestEnv::new().env("FAKE_CUDA_CTX_OVERHEAD", "100M");
    let mut a = e.spawn_probe(&[
        "init", "ctx", "alloc", "256M", "device", "1", "ctx", "alloc", "1G", "wait",
    ]);
    a.wait_for("wait");
    let s = e.nvml();
    assert_eq!(s.init_rc, 0, "{}", s.raw);
    assert_eq!(s.devices.len(), 2);
    let d0 = s.device(0);
    assert_eq!(d0.total, 16 * GIB);
    assert_eq!(d0.used, 356 * MIB, "{}", s.raw);
    assert_eq!(d0.used_v2, 356 * MIB);
    assert_eq!(d0.free, 16 * GIB - 356 * MIB);
    assert_eq!(s.process_used(0, a.pid), 356 * MIB);
    assert_eq!(s.process_used(1, a.pid), GIB + 100 * MIB);
    assert_eq!(d0.uuid, "GPU-facec0da-0000-4000-8000-000000000000");
    let b = e.run_probe(&["init", "ctx", "meminfo", "uuid", "name"]);
    assert_eq!(
        b.last("meminfo").num("free"),
        Some(16 * GIB - 456 * MIB),
        "{}",
        b.dump()
    );
    assert_eq!(b.last("uuid").get("uuid"), Some(d0.uuid.as_str()));
    assert_eq!(b.last("name").get("device_name"), Some(d0.name.as_str()));
    a.resume();
    let a = a.finish();
    assert!(a.status.success(), "{}", a.dump());
    // The exited process's memory is gone from NVML too.
    let s = e.nvml();
    assert_eq!(s.device(0).used, 0, "{}", s.raw);
    assert!(s.device(0).processes.is_empty());
}

#[test]
fn cuda_visible_devices_remaps_ordinals() {
    let base = || {
        TestEnv::new()
            .env("FAKE_CUDA_DEVICE_COUNT", "3")
            .env("FAKE_CUDA_CTX_OVERHEAD", "0")
    };
    let e = base().env("CUDA_VISIBLE_DEVICES", "2,0");
    let out = e.run_probe(&["init", "count", "uuid", "ctx", "alloc", "5M", "wait"]);
    assert!(out.all_ok(), "{}", out.dump());
    assert_eq!(out.last("count").num("count"), Some(2));
    assert_eq!(
        out.last("uuid").get("uuid"),
        Some("GPU-facec0da-0000-4000-8000-000000000002")
    );
    let e = base().env(
        "CUDA_VISIBLE_DEVICES",
        "GPU-facec0da-0000-4000-8000-000000000001",
    );
    let mut p = e.spawn_probe(&["init", "count", "ctx", "alloc", "5M", "wait"]);
    assert_eq!(p.wait_for("count").num("count"), Some(1));
    p.wait_for("wait");
    let s = e.nvml();
    assert_eq!(s.devices.len(), 3, "NVML indices are physical: {}", s.raw);
    assert_eq!(s.device(1).used, 5 * MIB, "{}", s.raw);
    assert_eq!(s.device(0).used, 0);
    drop(p);
    for (cvd, count) in [
        ("1,7,0", Some(1)),
        ("0,0", Some(1)),
        ("", None),
        ("abc", None),
        ("GPU-facec0da", None),
    ] {
        let e = base().env("CUDA_VISIBLE_DEVICES", cvd);
        let out = e.run_probe(&["init", "count"]);
        match count {
            Some(n) => assert_eq!(
                out.last("count").num("count"),
                Some(n),
                "CVD={cvd:?}: {}",
                out.dump()
            ),
            None => {
                assert_eq!(
                    out.last("init").rc(),
                    Some(NO_DEVICE),
                    "CVD={cvd:?}: {}",
                    out.dump()
                );
                assert_eq!(out.last("count").rc(), Some(NOT_INITIALIZED));
            }
        }
    }
}

#[test]
fn error_strings_are_the_real_ones() {
    let e = env();
    let out = e.run_probe(&["errname", "2", "errname", "709", "errname", "12345"]);
    let l = out.find("errname");
    assert_eq!(l[0].get("error_name"), Some("CUDA_ERROR_OUT_OF_MEMORY"));
    assert_eq!(
        l[1].get("error_name"),
        Some("CUDA_ERROR_CONTEXT_IS_DESTROYED")
    );
    assert_eq!(
        (l[2].get("error_name"), l[2].rc()),
        (Some("NULL"), Some(INVALID_VALUE))
    );
}
