//! Device memory that arrives by other paths than plain allocations (docs/fake-driver.md):
//! pools, mipmapped arrays, module globals and real images' statics, context limits and local
//! memory, graph memory.

use super::*;

/// Device memory that arrives by other paths (docs/fake-driver.md): a pool keeps freed
/// memory until trimmed or released at a synchronisation under its threshold, mipmapped
/// arrays take every level, module globals arrive eagerly or at first lookup / launch, and
/// NVML's per-process figure includes all of it.
#[test]
fn pools_mipmaps_and_module_globals_are_held_and_reported() {
    let e = env();
    let mut a = e.spawn_probe(&[
        "init",
        "ctx",
        "threshold",
        "default",
        "max",
        "async",
        "500M",
        "freeasync",
        "last",
        "poolinfo",
        "default",
        "mipmap",
        "4096",
        "4096",
        "3",
        "modload",
        "64M",
        "getfunc",
        "wait",
        "trim",
        "default",
        "0",
        "poolinfo",
        "default",
        "meminfo",
        "wait",
    ]);
    a.wait_for("wait");
    let s = e.nvml();
    // 500 MiB kept in the pool + 168 MiB of mipmap levels + 64 MiB of globals (lazy: at
    // the lookup).
    assert_eq!(s.process_used(0, a.pid), 732 * MIB, "{}", s.raw);
    a.resume();
    // (`wait_for("wait")` would match the first wait's `state=resumed` line.)
    a.wait_for("meminfo");
    assert_eq!(e.nvml().process_used(0, a.pid), 232 * MIB);
    a.resume();
    let out = a.finish();
    let p = out.find("poolinfo");
    assert_eq!(p[0].num("reserved"), Some(500 * MIB), "{}", out.dump());
    assert_eq!(p[0].num("used"), Some(0));
    assert_eq!(p[1].num("reserved"), Some(0));

    // The default threshold (0): released at the stream synchronisation after the free.
    let o = env().run_probe(&[
        "init",
        "ctx",
        "async",
        "500M",
        "freeasync",
        "last",
        "meminfo",
    ]);
    assert_eq!(meminfo_free(o.last("meminfo")), 16 * GIB, "{}", o.dump());
    // Eager loading: the globals arrive at load; a load that does not fit is refused.
    let e = env()
        .env("CUDA_MODULE_LOADING", "EAGER")
        .env("FAKE_CUDA_TOTAL_MEM", "1G");
    let o = e.run_probe(&["init", "ctx", "modload", "256M", "meminfo", "modload", "1G"]);
    assert_eq!(meminfo_free(o.last("meminfo")), 768 * MIB, "{}", o.dump());
    assert_eq!(o.last("modload").rc(), Some(OUT_OF_MEMORY));
    // Lazy at launch: nothing at the lookup, the globals at the first launch.
    let e = env().env("FAKE_CUDA_LAZY_AT_LAUNCH", "1");
    let o = e.run_probe(&[
        "init", "ctx", "modload", "256M", "getfunc", "meminfo", "launch", "meminfo",
    ]);
    let m = o.find("meminfo");
    assert_eq!(meminfo_free(m[0]), 16 * GIB, "{}", o.dump());
    assert_eq!(meminfo_free(m[1]), 16 * GIB - 256 * MIB, "{}", o.dump());
}

/// Real module images (docs/fake-driver.md, "Modules"): the fixtures of
/// `hami-image/tests/data/` (a 1.5 GiB `__device__` array, 4 KiB initialised, 16 KiB of
/// constants) place 1538 MiB at the first lookup, in every container and entry point; a
/// corrupt image is `CUDA_ERROR_INVALID_IMAGE`; global and module lookups load lazily too.
#[test]
fn real_images_place_their_statics() {
    let data = |n: &str| {
        std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../hami-image/tests/data")
            .join(n)
            .to_string_lossy()
            .into_owned()
    };
    let e = env();
    let fb = std::fs::read(data("g_comp.fatbin")).unwrap();
    let second = e.dir().join("second.fatbin");
    std::fs::write(&second, &fb[1248..]).unwrap();
    let second = second.to_string_lossy().into_owned();
    let corrupt = e.dir().join("corrupt.fatbin");
    std::fs::write(&corrupt, &fb[..1000]).unwrap();
    let corrupt = corrupt.to_string_lossy().into_owned();
    for (op, path, then) in [
        ("modloadimg", data("g.cubin"), "getfunc"),
        ("modloadimgwrap", second.clone(), "getfunc"),
        ("modloadimgfile", data("g_speed_all.fatbin"), "getglobal"),
        ("libloadimg", second.clone(), "libgetglobal"),
        ("libloadimgfile", data("g_size.fatbin"), "libgetmodule"),
    ] {
        let o = e.run_probe(&["init", "ctx", op, &path, "meminfo", then, "meminfo"]);
        let m = o.find("meminfo");
        assert_eq!(meminfo_free(m[0]), 16 * GIB, "{op}: {}", o.dump());
        assert_eq!(
            meminfo_free(m[1]),
            16 * GIB - 1538 * MIB,
            "{op}: {}",
            o.dump()
        );
    }
    // (From a file: in memory, a truncated header would send any reader past the bytes.)
    let o = e.run_probe(&["init", "ctx", "modloadimgfile", &corrupt]);
    assert_eq!(o.last("modloadimgfile").rc(), Some(200), "{}", o.dump());
}

/// Context limits take memory as the H200 showed: the stack x 270,336 resident threads at the
/// set (given back when lowered), a raised heap at the next launch (fixed afterwards), local
/// memory grown at a launch (kept); the documented error codes.
#[test]
fn context_limits_and_local_memory_take_what_the_h200_takes() {
    const UNSUPPORTED_LIMIT: i32 = 215;
    let e = env().env("FAKE_CUDA_TOTAL_MEM", "8G");
    let o = e.run_probe(&[
        "init",
        "getlimit",
        "stack",
        "ctx",
        "getlimit",
        "stack",
        "getlimit",
        "printf",
        "getlimit",
        "heap",
        "getlimit",
        "syncdepth",
        "getlimit",
        "pending",
        "getlimit",
        "7",
        "getlimit",
        "99",
        "setlimit",
        "99",
        "1",
        "meminfo",
        "setlimit",
        "stack",
        "8K",
        "meminfo",
        "setlimit",
        "stack",
        "1K",
        "meminfo",
        "setlimit",
        "heap",
        "1G",
        "meminfo",
        "modload",
        "0",
        "local=24K",
        "getfunc",
        "funcattr",
        "3",
        "funcattr",
        "99",
        "launch",
        "meminfo",
        "getlimit",
        "stack",
        "setlimit",
        "heap",
        "8M",
        "setlimit",
        "stack",
        "32K",
    ]);
    let g = o.find("getlimit");
    assert_eq!(g[0].rc(), Some(INVALID_CONTEXT), "{}", o.dump());
    let values: Vec<_> = g[1..6].iter().map(|l| l.num("value")).collect();
    assert_eq!(
        values,
        [
            Some(1024),
            Some(8_650_752),
            Some(8 * MIB),
            Some(0),
            Some(2048)
        ],
        "{}",
        o.dump()
    );
    assert_eq!(g[6].rc(), Some(UNSUPPORTED_LIMIT), "{}", o.dump());
    assert_eq!(g[7].rc(), Some(INVALID_VALUE), "{}", o.dump());
    let s = o.find("setlimit");
    assert_eq!(s[0].rc(), Some(INVALID_VALUE), "{}", o.dump());
    let m: Vec<u64> = o.find("meminfo").into_iter().map(meminfo_free).collect();
    assert_eq!(m[0] - m[1], 1848 * MIB, "stack 8K: {}", o.dump());
    assert_eq!(m[2], m[0], "lowered: {}", o.dump());
    assert_eq!(
        m[3],
        m[0],
        "the heap takes nothing at the set: {}",
        o.dump()
    );
    let f = o.find("funcattr");
    assert_eq!(f[0].num("value"), Some(24 << 10), "{}", o.dump());
    assert_eq!(f[1].rc(), Some(INVALID_VALUE), "{}", o.dump());
    assert_eq!(o.last("launch").rc(), Some(SUCCESS), "{}", o.dump());
    // The launch grew local memory to 24 KiB and put the 1 GiB heap on the device (its size
    // and a page, as the H100 measured).
    assert_eq!(m[0] - m[4], 6072 * MIB + 1026 * MIB, "launch: {}", o.dump());
    assert_eq!(g[8].num("value"), Some(24 << 10), "{}", o.dump());
    assert_eq!(s[4].rc(), Some(INVALID_VALUE), "heap fixed: {}", o.dump());
    // 32 KiB would take another 2112 MiB: more than is left.
    assert_eq!(s[5].rc(), Some(OUT_OF_MEMORY), "{}", o.dump());
}

/// Graph memory nodes (docs/fake-driver.md, "Graphs"): an allocation node takes an address and
/// no memory; the launch maps it from the device's graph pool (reserved), an allocation not
/// freed in the graph stays live (used) until `cuMemFree`; a second launch while it is live is
/// `CUDA_ERROR_INVALID_VALUE`; the pool keeps freed memory until `cuDeviceGraphMemTrim`; a
/// launch the device cannot back is `CUDA_ERROR_OUT_OF_MEMORY`.
#[test]
fn graph_memory_is_mapped_at_launch_and_kept_by_the_graph_pool_until_trimmed() {
    let e = env().env("FAKE_CUDA_TOTAL_MEM", "2G");
    let out = e.run_probe(&[
        "init",
        "ctx",
        "streamnew",
        "gmem-alloc",
        "512M",
        "gmem-inst",
        "gmem-attr",
        "meminfo",
        "graph-launch",
        "1",
        "streamsync",
        "gmem-attr",
        "meminfo",
        "graph-launch",
        "1",
        "gmem-memfree",
        "gmem-attr",
        "meminfo",
        "gmem-trim",
        "gmem-attr",
        "meminfo",
        "gmem-alloc",
        "3G",
        "gmem-inst",
        "graph-launch",
        "1",
        "gmem-alloc",
        "3G",
        "gmem-inst-upload",
    ]);
    let attrs = out.find("gmem-attr");
    let free: Vec<u64> = out
        .find("meminfo")
        .iter()
        .map(|o| meminfo_free(o))
        .collect();
    let nums = |i: usize| (attrs[i].num("used"), attrs[i].num("reserved"));
    assert_eq!(nums(0), (Some(0), Some(0)), "{}", out.dump());
    assert_eq!(free[0], 2 * GIB, "an allocation node takes no memory");
    assert_eq!(
        nums(1),
        (Some(512 * MIB), Some(512 * MIB)),
        "{}",
        out.dump()
    );
    assert_eq!(free[1], 2 * GIB - 512 * MIB);
    assert_eq!(
        out.find("graph-launch")[1].rc(),
        Some(INVALID_VALUE),
        "{}",
        out.dump()
    );
    assert_eq!(nums(2), (Some(0), Some(512 * MIB)), "freed: in the pool");
    assert_eq!(free[2], 2 * GIB - 512 * MIB);
    assert_eq!(nums(3), (Some(0), Some(0)), "trimmed");
    assert_eq!(free[3], 2 * GIB);
    assert_eq!(out.last("gmem-alloc").rc(), Some(SUCCESS), "{}", out.dump());
    assert_eq!(
        out.last("graph-launch").rc(),
        Some(OUT_OF_MEMORY),
        "{}",
        out.dump()
    );
    assert_eq!(
        out.last("gmem-inst-upload").rc(),
        Some(OUT_OF_MEMORY),
        "{}",
        out.dump()
    );
}
