//! Module and library statics admitted from the image before the driver takes the memory
//! (issue 17): real nvcc 13.0 images of `hami-image/tests/data/global.cu` (a 1.5 GiB
//! `__device__` array, a 4 KiB initialised one, a 16 KiB constant bank) as ELF cubin, plain
//! fatbin, fatbin wrapper, zstd- and LZ4-compressed fatbins and image files, loaded by the
//! real `cudaprobe` under the preload against the fake driver (which places a real image's
//! statics, rounded to 2 MiB pages: 1538 MiB here). Under a 1 GiB quota the call that would
//! bring them is refused with `CUDA_ERROR_OUT_OF_MEMORY` before the driver is called, the
//! driver's per-process figure (fake NVML) stays within the quota, and the program goes on.
//! Before, the lazy first lookup was charged after the fact (the next allocation refused, the
//! driver holding 1.5 GiB) and a first launch ran.

use hami_abi::layout::UsageKind;
use hami_test_harness::TestEnv;
use std::path::PathBuf;

const MB: u64 = 1 << 20;
const OOM: i32 = 2;
/// What the fake places for the fixture: 1.5 GiB + 4 KiB + 16 KiB + code, in 2 MiB pages.
const PLACED: u64 = 1538 * MB;

fn env(limit: &str) -> TestEnv {
    TestEnv::new()
        .env("FAKE_CUDA_TOTAL_MEM", "16G")
        .env("FAKE_CUDA_CTX_OVERHEAD", "0")
        .env("CUDA_DEVICE_MEMORY_LIMIT", limit)
        .preload(true)
}

fn data(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../hami-image/tests/data")
        .join(name)
}

/// The last fatbin of a `.nv_fatbin` section file (the program's own; the first is the
/// runtime's stub), alone in a file under the sandbox: what the runtime registers.
fn single(env: &TestEnv, name: &str) -> String {
    let b = std::fs::read(data(name)).unwrap();
    let mut at = 0;
    let mut last = 0;
    while at + 16 <= b.len() {
        let hs = u16::from_le_bytes([b[at + 6], b[at + 7]]) as usize;
        let size = u64::from_le_bytes(b[at + 8..at + 16].try_into().unwrap()) as usize;
        last = at;
        at += hs + size;
    }
    let out = env.dir().join(format!("single-{name}"));
    std::fs::write(&out, &b[last..at]).unwrap();
    out.to_string_lossy().into_owned()
}

fn whole(name: &str) -> String {
    data(name).to_string_lossy().into_owned()
}

/// (load op, image path) for every container and entry point.
fn module_images(env: &TestEnv) -> Vec<(&'static str, String)> {
    vec![
        ("modloadimgstatic", single(env, "g_default.fatbin")),
        ("modloadimg", whole("g.cubin")),
        ("modloadimg", single(env, "g_default.fatbin")),
        ("modloadimgex", single(env, "g_comp.fatbin")),
        ("modloadimgfat", single(env, "g_speed_all.fatbin")),
        ("modloadimgwrap", single(env, "g_size.fatbin")),
        ("modloadimgfile", whole("g_default.fatbin")),
        ("modloadimgfile", whole("g_comp.fatbin")),
    ]
}

fn library_images(env: &TestEnv) -> Vec<(&'static str, String)> {
    vec![
        ("libloadimgstatic", single(env, "g_comp.fatbin")),
        ("libloadimg", whole("g.cubin")),
        ("libloadimg", single(env, "g_comp.fatbin")),
        ("libloadimgwrap", single(env, "g_speed_all.fatbin")),
        ("libloadimgfile", whole("g_size.fatbin")),
    ]
}

/// Runs `ops` (after `init ctx`), stopping at a `wait` to read the driver's per-process
/// figure; returns it with the output.
fn run_and_observe(env: &TestEnv, ops: &[&str]) -> (u64, hami_test_harness::ProbeOutput) {
    run_via(env, "direct", ops)
}

/// [`run_and_observe`] with the driver's functions reached through `via` (`direct`,
/// `dlsym`, `procaddr`).
fn run_via(env: &TestEnv, via: &str, ops: &[&str]) -> (u64, hami_test_harness::ProbeOutput) {
    let mut args = vec!["--via", via, "init", "ctx"];
    args.extend_from_slice(ops);
    args.extend_from_slice(&["wait", "exit", "0"]);
    let mut p = env.spawn_probe(&args);
    p.wait_for("wait");
    let held = env.nvml().process_used(0, p.pid);
    p.resume();
    (held, p.finish())
}

/// Lazy loading: a module's first function lookup would bring 1.5 GiB under a 1 GiB quota.
/// Refused (every time) before the driver call; the driver holds nothing of it; a 512 MiB
/// allocation still fits.
#[test]
fn a_lazy_module_s_first_lookup_over_the_quota_is_refused_before_the_driver() {
    let env = env("1G");
    for (op, path) in module_images(&env) {
        let (held, p) = run_and_observe(&env, &[op, &path, "getfunc", "getfunc", "alloc", "512M"]);
        assert_eq!(p.last(op).rc(), Some(0), "{op} {path}: {}", p.dump());
        let g = p.find("getfunc");
        assert_eq!(
            (g[0].rc(), g[1].rc()),
            (Some(OOM), Some(OOM)),
            "{op} {path}: {}",
            p.dump()
        );
        assert_eq!(p.last("alloc").rc(), Some(0), "{op} {path}: {}", p.dump());
        assert!(
            held <= 1024 * MB,
            "{op} {path}: the driver holds {held} bytes: {}",
            p.dump()
        );
    }
}

/// Lazy loading whose memory arrives at the first launch (the H200's runtime program: a
/// library's kernel launched directly): the launch is refused with
/// `CUDA_ERROR_OUT_OF_MEMORY`, the kernel not launched, and the program goes on.
#[test]
fn a_lazy_library_s_first_launch_over_the_quota_is_refused_before_the_driver() {
    let env = env("1G").env("FAKE_CUDA_LAZY_AT_LAUNCH", "1");
    for (op, path) in library_images(&env) {
        let (held, p) = run_and_observe(
            &env,
            &[op, &path, "getkernel", "launch", "launch", "alloc", "512M"],
        );
        assert_eq!(p.last(op).rc(), Some(0), "{op} {path}: {}", p.dump());
        assert_eq!(p.last("getkernel").rc(), Some(0), "{}", p.dump());
        let l = p.find("launch");
        assert_eq!(
            (l[0].rc(), l[1].rc()),
            (Some(OOM), Some(OOM)),
            "{op} {path}: {}",
            p.dump()
        );
        assert_eq!(p.last("alloc").rc(), Some(0), "{op} {path}: {}", p.dump());
        assert!(
            held <= 1024 * MB,
            "{op} {path}: the driver holds {held} bytes: {}",
            p.dump()
        );
    }
    // A module's function, at its first lookup (before any launch).
    let path = single(&env, "g_comp.fatbin");
    let (held, p) = run_and_observe(&env, &["modloadimg", &path, "getfunc", "alloc", "512M"]);
    assert_eq!(p.last("getfunc").rc(), Some(OOM), "{}", p.dump());
    assert_eq!(p.last("alloc").rc(), Some(0), "{}", p.dump());
    assert!(held <= 1024 * MB, "{held}: {}", p.dump());
}

/// Eager loading: the load itself is refused before the driver is called (the fake never
/// places the statics, not even for a moment), every entry point and container.
#[test]
fn an_eager_load_over_the_quota_is_refused_before_the_driver() {
    let env = env("1G").env("CUDA_MODULE_LOADING", "EAGER");
    let log = env.dir().join("resident.log");
    let env = env.env("FAKE_CUDA_RESIDENT_LOG", &log.to_string_lossy());
    let mut images = module_images(&env);
    images.extend(library_images(&env));
    for (op, path) in images {
        let (held, p) = run_and_observe(&env, &[op, &path, "alloc", "900M"]);
        assert_eq!(p.last(op).rc(), Some(OOM), "{op} {path}: {}", p.dump());
        assert_eq!(p.last("alloc").rc(), Some(0), "{op} {path}: {}", p.dump());
        assert!(held <= 1024 * MB, "{op} {path}: {held}: {}", p.dump());
        let placed = std::fs::read_to_string(&log).unwrap_or_default();
        assert!(
            !placed.lines().any(|l| l != "resident globals=0"),
            "{op} {path}: the driver placed the statics: {placed}"
        );
    }
}

/// Within the quota nothing changes: the statics are charged once, at the figure the driver
/// placed (the measurement after the call raises the estimate to it; never both), eager or
/// lazy, module or library; unloading gives them back.
#[test]
fn statics_within_the_quota_are_charged_once() {
    for (loading, op, first_use) in [
        ("LAZY", "modloadimg", &["getfunc", "launch"][..]),
        ("EAGER", "modloadimgex", &["getfunc", "launch"][..]),
        ("LAZY", "libloadimg", &["getkernel", "launch"][..]),
        ("LAZY", "libloadimgstatic", &["getkernel", "launch"][..]),
        ("EAGER", "modloadimgstatic", &["getfunc", "launch"][..]),
        ("EAGER", "libloadimgfile", &["getkernel", "launch"][..]),
    ] {
        let env = env("4G").env("CUDA_MODULE_LOADING", loading);
        let path = if op.ends_with("file") {
            whole("g_speed_all.fatbin")
        } else {
            single(&env, "g_comp.fatbin")
        };
        let mut ops = vec!["init", "ctx", op, &path];
        ops.extend_from_slice(first_use);
        ops.extend_from_slice(&["meminfo", "wait"]);
        let unload = if op.starts_with("lib") {
            "libunload"
        } else {
            "modunload"
        };
        ops.extend_from_slice(&[unload, "last", "meminfo", "exit", "0"]);
        let mut p = env.spawn_probe(&ops);
        p.wait_for("wait");
        let module = env
            .region()
            .snapshot()
            .slots
            .iter()
            .map(|s| s.usage[0][UsageKind::Module.index()])
            .sum::<u64>();
        assert_eq!(module, PLACED, "{loading} {op}: charged once");
        p.resume();
        let p = p.finish();
        assert!(p.all_ok(), "{loading} {op}: {}", p.dump());
        let m = p.find("meminfo");
        assert_eq!(m[0].num("free"), Some(4096 * MB - PLACED), "{}", p.dump());
        assert_eq!(m[1].num("free"), Some(4096 * MB), "{}", p.dump());
    }
}

/// A refused first launch leaves the stage to try again: once the program frees room, the
/// next launch is admitted and charged once.
#[test]
fn a_refused_first_launch_is_admitted_once_room_is_made() {
    let env = env("2G").env("FAKE_CUDA_LAZY_AT_LAUNCH", "1");
    let path = single(&env, "g_speed_all.fatbin");
    let mut p = env.spawn_probe(&[
        "init",
        "ctx",
        "alloc",
        "1G",
        "libloadimg",
        &path,
        "getkernel",
        "launch",
        "free",
        "0",
        "launch",
        "launch",
        "meminfo",
        "wait",
        "exit",
        "0",
    ]);
    p.wait_for("wait");
    let held = env.nvml().process_used(0, p.pid);
    p.resume();
    let p = p.finish();
    let l = p.find("launch");
    assert_eq!(
        (l[0].rc(), l[1].rc(), l[2].rc()),
        (Some(OOM), Some(0), Some(0)),
        "{}",
        p.dump()
    );
    assert_eq!(held, PLACED, "{}", p.dump());
    assert_eq!(
        p.last("meminfo").num("free"),
        Some(2048 * MB - PLACED),
        "{}",
        p.dump()
    );
}

/// The other calls that load a lazily loaded module into the current context
/// (`cuModuleGetGlobal_v2`, `cuLibraryGetGlobal`, `cuLibraryGetModule`) are first uses too:
/// refused before the driver over the quota, charged once within it.
#[test]
fn global_and_module_lookups_are_first_uses() {
    for via in ["direct", "dlsym", "procaddr"] {
        let env = env("1G");
        let cubin = whole("g.cubin");
        for (load, op) in [
            ("modloadimg", "getglobal"),
            ("libloadimg", "libgetglobal"),
            ("libloadimg", "libgetmodule"),
        ] {
            let (held, p) = run_via(&env, via, &[load, &cubin, op, op, "alloc", "512M"]);
            let r = p.find(op);
            assert_eq!(
                (r[0].rc(), r[1].rc()),
                (Some(OOM), Some(OOM)),
                "{via} {op}: {}",
                p.dump()
            );
            assert_eq!(p.last("alloc").rc(), Some(0), "{via} {op}: {}", p.dump());
            assert!(held <= 1024 * MB, "{via} {op}: {held}: {}", p.dump());
        }
    }
    let env = env("4G");
    let cubin = whole("g.cubin");
    let mut p = env.spawn_probe(&[
        "init",
        "ctx",
        "libloadimg",
        &cubin,
        "libgetmodule",
        "libgetglobal",
        "getfunc",
        "launch",
        "wait",
        "exit",
        "0",
    ]);
    p.wait_for("wait");
    let held = env.nvml().process_used(0, p.pid);
    let module: u64 = env
        .region()
        .snapshot()
        .slots
        .iter()
        .map(|s| s.usage[0][UsageKind::Module.index()])
        .sum();
    p.resume();
    let p = p.finish();
    assert!(p.all_ok(), "{}", p.dump());
    assert_eq!(held, PLACED, "{}", p.dump());
    assert_eq!(module, PLACED, "charged once: {}", p.dump());
}

/// With lazy loading, an image in a loaded object's static data (what the runtime registers)
/// is read at the module's first use, not at its load: a framework's many libraries that are
/// never used cost no decompression. A heap image (which the application may free after the
/// load) is read at the load.
#[test]
fn a_static_image_is_read_at_the_first_use_and_a_heap_image_at_the_load() {
    let env = env("4G").env("LIBCUDA_LOG_LEVEL", "4");
    let path = single(&env, "g_comp.fatbin");
    // Lazy loading: the data (globals, constant banks); the code comes per kernel.
    let need = format!("the image's statics need {} bytes", 0x6000_0000u64 + 0x5010);
    for (op, reads_at) in [
        ("libloadimgstatic", "cuLaunchKernel"),
        ("libloadimg", "cuLibraryLoadData"),
        ("modloadimgstatic", "cuModuleGetFunction"),
        ("modloadimg", "cuModuleLoadData"),
    ] {
        let first = if op.starts_with("lib") {
            "getkernel"
        } else {
            "getfunc"
        };
        let p = env.run_probe(&["init", "ctx", op, &path, first, "launch", "exit", "0"]);
        assert!(p.all_ok(), "{op}: {}", p.dump());
        let at: Vec<&str> = p.stderr.lines().filter(|l| l.contains(&need)).collect();
        assert_eq!(at.len(), 1, "{op}: read once: {}", p.stderr);
        assert!(
            at[0].contains(&format!("{reads_at}: ")),
            "{op}: read at {reads_at}: {}",
            p.stderr
        );
    }
}
