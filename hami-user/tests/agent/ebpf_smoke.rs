//! eBPF smoke tests: load the real probes into the kernel, attach them to a libcuda file,
//! run a process that calls it, and check the events. Needs root (CI runs as root); never
//! skipped: without root these tests fail and say why.
//!
//! `mini_driver_*` use a tiny C `libcuda.so.1` compiled here, whose every function returns a
//! known value, so that each probe's arguments, out-parameters and the "only successful calls"
//! rule are checked exactly.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use hami_common::array::{array_footprint, mipmap_footprint};
use hami_common::event::{Event, EventKind};
use hami_common::intercept::{self, PROBED_NAMES};
use hami_user::probes::{DiscoveryOptions, ProbeError, ProbeOptions, Probes};

use crate::common::{compile_c, require_root};
use hami_test_harness::serial;

/// The CUDA types both the mini driver and the mini program use (prepended to each).
const MINI_TYPES: &str = r#"
#include <stddef.h>
typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef struct CUctx_st *CUcontext;
typedef struct CUarray_st *CUarray;
typedef struct CUmipmappedArray_st *CUmipmappedArray;
typedef int CUdevice;
typedef unsigned long long CUmemGenericAllocationHandle;
typedef struct { size_t Width, Height; unsigned Format, NumChannels; } CUDA_ARRAY_DESCRIPTOR;
typedef struct { size_t Width, Height, Depth; unsigned Format, NumChannels, Flags; } CUDA_ARRAY3D_DESCRIPTOR;
typedef struct { unsigned type, requestedHandleTypes; struct { unsigned type; int id; } location; void *win32; unsigned char flags[8]; } CUmemAllocationProp;
"#;

const MINI_DRIVER: &str = r#"

static unsigned long long next_ptr = 0x7f1000000000ULL;
static unsigned long long next_handle = 0x500;

CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n) {
    if (!p || n == 0) return 1; /* CUDA_ERROR_INVALID_VALUE */
    *p = next_ptr; next_ptr += (n + 0xffff) & ~0xffffULL; return 0;
}
CUresult cuMemAllocManaged(CUdeviceptr *p, size_t n, unsigned flags) {
    if (!p || n == 0) return 1; *p = next_ptr; next_ptr += (n + 0xffff) & ~0xffffULL; return 0;
}
CUresult cuMemAllocAsync(CUdeviceptr *p, size_t n, void *stream) {
    if (!p || n == 0) return 1; *p = next_ptr; next_ptr += (n + 0xffff) & ~0xffffULL; return 0;
}
CUresult cuMemFreeAsync(CUdeviceptr p, void *stream) { return p ? 0 : 1; }
CUresult cuMemFree_v2(CUdeviceptr p) { return p ? 0 : 400; }
CUresult cuMemAllocPitch_v2(CUdeviceptr *p, size_t *pitch, size_t w, size_t h, unsigned e) {
    *pitch = (w + 511) & ~511ULL; *p = next_ptr; next_ptr += *pitch * h; return 0;
}
CUresult cuArrayCreate_v2(CUarray *a, const CUDA_ARRAY_DESCRIPTOR *d) {
    if (!d || d->Width == 0) return 1; *a = (CUarray)(next_handle += 0x10); return 0;
}
CUresult cuArray3DCreate_v2(CUarray *a, const CUDA_ARRAY3D_DESCRIPTOR *d) {
    if (!d || d->Width == 0) return 1; *a = (CUarray)(next_handle += 0x10); return 0;
}
CUresult cuArrayDestroy(CUarray a) { return a ? 0 : 1; }
CUresult cuMipmappedArrayCreate(CUmipmappedArray *m, const CUDA_ARRAY3D_DESCRIPTOR *d, unsigned levels) {
    if (!m || !d || d->Width == 0 || levels == 0) return 1; *m = (CUmipmappedArray)(next_handle += 0x10); return 0;
}
CUresult cuMipmappedArrayDestroy(CUmipmappedArray m) { return m ? 0 : 1; }
CUresult cuMemCreate(CUmemGenericAllocationHandle *h, size_t n, const CUmemAllocationProp *prop, unsigned long long f) {
    if (!h || !prop) return 1; *h = (next_handle += 0x10); return 0;
}
CUresult cuMemRelease(CUmemGenericAllocationHandle h) { return h ? 0 : 1; }
CUresult cuDevicePrimaryCtxRetain(CUcontext *c, CUdevice d) { *c = (CUcontext)(0xc0000ULL + d); return 0; }
CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d) { return d >= 0 ? 0 : 101; }
CUresult cuCtxSetCurrent(CUcontext c) { return 0; }
CUresult cuCtxCreate_v2(CUcontext *c, unsigned flags, CUdevice d) { *c = (CUcontext)(0xd0000ULL + d); return 0; }
CUresult cuCtxDestroy_v2(CUcontext c) { return c ? 0 : 201; }
"#;

const MINI_PROGRAM: &str = r#"
#include <stdio.h>
#include <pthread.h>
CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);
CUresult cuMemAllocManaged(CUdeviceptr *, size_t, unsigned);
CUresult cuMemAllocAsync(CUdeviceptr *, size_t, void *);
CUresult cuMemFreeAsync(CUdeviceptr, void *);
CUresult cuMemFree_v2(CUdeviceptr);
CUresult cuMemAllocPitch_v2(CUdeviceptr *, size_t *, size_t, size_t, unsigned);
CUresult cuArrayCreate_v2(CUarray *, const CUDA_ARRAY_DESCRIPTOR *);
CUresult cuArray3DCreate_v2(CUarray *, const CUDA_ARRAY3D_DESCRIPTOR *);
CUresult cuArrayDestroy(CUarray);
CUresult cuMipmappedArrayCreate(CUmipmappedArray *, const CUDA_ARRAY3D_DESCRIPTOR *, unsigned);
CUresult cuMipmappedArrayDestroy(CUmipmappedArray);
CUresult cuMemCreate(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long);
CUresult cuMemRelease(CUmemGenericAllocationHandle);
CUresult cuDevicePrimaryCtxRetain(CUcontext *, CUdevice);
CUresult cuDevicePrimaryCtxRelease_v2(CUdevice);
CUresult cuCtxSetCurrent(CUcontext);
CUresult cuCtxCreate_v2(CUcontext *, unsigned, CUdevice);
CUresult cuCtxDestroy_v2(CUcontext);

static CUdeviceptr tptr;
static CUcontext tctx;
static void *other_thread(void *arg) {
    /* This thread's current context is its own: device 0's primary context. */
    long rc = 0;
    rc |= cuDevicePrimaryCtxRetain(&tctx, 0);
    rc |= cuCtxSetCurrent(tctx);
    rc |= cuMemAlloc_v2(&tptr, 8192);
    return (void *)rc;
}

int main(void) {
    CUcontext pctx = 0, ctx2 = 0;
    CUdeviceptr in3 = 0;
    pthread_t th;
    void *trc = 0;
    CUdeviceptr a = 0, bad = 0, pitched = 0, managed = 0, async = 0, in2 = 0;
    size_t pitch = 0;
    CUarray arr = 0, arr3 = 0;
    CUmipmappedArray mip = 0, badmip = 0;
    CUmemGenericAllocationHandle h = 0;
    int rc = 0;
    rc |= cuDevicePrimaryCtxRetain(&pctx, 1);
    rc |= cuCtxSetCurrent(pctx);
    rc |= cuMemAlloc_v2(&a, 1 << 20);
    if (cuMemAlloc_v2(&bad, 0) == 0) return 10;          /* fails: no event */
    if (cuMemFree_v2(0) == 0) return 11;                  /* fails: no event */
    rc |= cuMemAllocPitch_v2(&pitched, &pitch, 1000, 10, 4);
    rc |= cuMemAllocManaged(&managed, 3 << 20, 1);
    rc |= cuMemAllocAsync(&async, 5 << 20, 0);
    CUDA_ARRAY_DESCRIPTOR d2 = { 1024, 1024, 0x20, 4 };
    rc |= cuArrayCreate_v2(&arr, &d2);
    CUDA_ARRAY3D_DESCRIPTOR d3 = { 100, 100, 100, 0x02, 2, 0 };
    rc |= cuArray3DCreate_v2(&arr3, &d3);
    /* 2D float4 256 x 128, 3 levels; then one refused (0 levels): no event. */
    CUDA_ARRAY3D_DESCRIPTOR dm = { 256, 128, 0, 0x20, 4, 0 };
    rc |= cuMipmappedArrayCreate(&mip, &dm, 3);
    if (cuMipmappedArrayCreate(&badmip, &dm, 0) == 0) return 13;
    CUmemAllocationProp prop = { 1, 0, { 1, 1 }, 0, {0} };
    rc |= cuMemCreate(&h, 4 << 20, &prop, 0);
    rc |= cuMemRelease(h);
    rc |= cuArrayDestroy(arr);
    rc |= cuArrayDestroy(arr3);
    rc |= cuMipmappedArrayDestroy(mip);
    rc |= cuMemFreeAsync(async, 0);
    rc |= cuMemFree_v2(managed);
    rc |= cuMemFree_v2(pitched);
    rc |= cuMemFree_v2(a);
    rc |= cuCtxCreate_v2(&ctx2, 0, 0);
    rc |= cuMemAlloc_v2(&in2, 4096);
    if (pthread_create(&th, 0, other_thread, 0) || pthread_join(th, &trc) || trc) return 12;
    rc |= cuMemAlloc_v2(&in3, 16384);   /* still ctx2 on this thread */
    rc |= cuMemFree_v2(in3);
    rc |= cuMemFree_v2(tptr);
    rc |= cuMemFree_v2(in2);
    rc |= cuCtxDestroy_v2(ctx2);
    rc |= cuDevicePrimaryCtxRelease_v2(1);
    printf("pctx=%llu\nctx2=%llu\na=%llu\npitched=%llu\npitch=%zu\nmanaged=%llu\nasync=%llu\n"
           "arr=%llu\narr3=%llu\nmip=%llu\nh=%llu\nin2=%llu\nin3=%llu\ntptr=%llu\ntctx=%llu\n",
           (unsigned long long)pctx, (unsigned long long)ctx2, a, pitched, pitch, managed, async,
           (unsigned long long)arr, (unsigned long long)arr3, (unsigned long long)mip, h, in2, in3, tptr,
           (unsigned long long)tctx);
    return rc;
}
"#;

/// Build the mini driver and program in a fresh directory; return (libcuda, program).
fn build_mini(tmp: &Path) -> (PathBuf, PathBuf) {
    let lib_dir = tmp.join("lib");
    std::fs::create_dir_all(&lib_dir).unwrap();
    let lib = lib_dir.join("libcuda.so.1");
    compile_c(
        &format!("{MINI_TYPES}{MINI_DRIVER}"),
        &lib,
        &["-shared", "-fPIC", "-Wl,-soname,libcuda.so.1"],
    );
    let prog = tmp.join("prog");
    compile_c(
        &format!("{MINI_TYPES}{MINI_PROGRAM}"),
        &prog,
        &[
            lib.to_str().unwrap(),
            &format!("-Wl,-rpath,{}", lib_dir.display()),
            "-pthread",
        ],
    );
    (lib, prog)
}

fn parse_kv(stdout: &str) -> HashMap<String, u64> {
    stdout
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.trim().to_string(), v.trim().parse::<u64>().unwrap()))
        .collect()
}

/// Receive events until the process `pid` exits (its ProcessExit event), or panic after 10 s.
async fn events_of(rx: &mut tokio::sync::mpsc::Receiver<Event>, pid: u32) -> Vec<Event> {
    let mut out = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let ev = tokio::time::timeout_at(deadline, rx.recv())
            .await
            .unwrap_or_else(|_| panic!("no ProcessExit for pid {pid} within 10 s; got {out:#?}"))
            .expect("event channel closed");
        if ev.tgid != pid {
            continue;
        }
        let done = ev.kind == EventKind::ProcessExit;
        out.push(ev);
        if done {
            return out;
        }
    }
}

fn kind(ev: &Event) -> EventKind {
    ev.kind
}

/// The functions a C source defines (`CUresult name(` at the start of a line).
fn defined_functions(c: &str) -> Vec<&str> {
    c.lines()
        .filter_map(|l| l.strip_prefix("CUresult "))
        .filter_map(|l| l.split_once('(').map(|(name, _)| name.trim()))
        .collect()
}

#[test]
fn the_mini_driver_defines_probed_functions_only_once() {
    let defined = defined_functions(MINI_DRIVER);
    assert!(defined.len() >= 10, "{defined:?}");
    for (i, f) in defined.iter().enumerate() {
        assert!(
            intercept::find(f).is_some_and(|r| r.is_probed()),
            "{f} is not a probed row of INTERCEPTS"
        );
        assert!(!defined[i + 1..].contains(f), "{f} defined twice");
    }
}

#[tokio::test]
async fn mini_driver_every_probe() {
    require_root();
    let _g = serial();
    let tmp = tempfile::tempdir().unwrap();
    let (lib, prog) = build_mini(tmp.path());

    let mut probes = Probes::load(&ProbeOptions::default()).expect("loading the eBPF programs");
    let outcome = probes
        .attach_libcuda(&lib)
        .expect("attaching to the mini libcuda");
    assert!(!outcome.already_attached);
    // Every probed row of the table the mini driver defines is attached; the others are
    // absent from it: tolerated and listed as missing.
    let defined = defined_functions(MINI_DRIVER);
    for s in PROBED_NAMES {
        if defined.contains(&s) {
            assert!(
                outcome.attached.contains(&s),
                "{s} not attached: {outcome:?}"
            );
        } else {
            assert!(
                outcome.missing.contains(&s),
                "{s} not listed as missing: {outcome:?}"
            );
        }
    }
    assert!(outcome.missing.contains(&"cuCtxCreate_v4"), "{outcome:?}");
    // Same file through another path (a symlink): deduped by device and inode.
    let link = tmp.path().join("libcuda-link.so");
    std::os::unix::fs::symlink(&lib, &link).unwrap();
    let again = probes.attach_libcuda(&link).unwrap();
    assert!(again.already_attached);
    assert_eq!(again.file_id, outcome.file_id);
    assert_eq!(probes.attached().len(), 1);

    let before = probes.counters();
    let (mut rx, handle) = probes
        .spawn(DiscoveryOptions {
            interval: None,
            ..Default::default()
        })
        .expect("starting the event stream");

    let child = Command::new(&prog)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "program failed: {:?} {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let v = parse_kv(&String::from_utf8_lossy(&out.stdout));
    let evs = events_of(&mut rx, pid).await;
    let kinds: Vec<EventKind> = evs.iter().map(kind).collect();
    use EventKind::*;
    assert_eq!(
        kinds,
        vec![
            PrimaryCtxRetain,
            CtxSetCurrent,
            MemAlloc,
            MemAllocPitch,
            MemAllocManaged,
            MemAllocAsync,
            ArrayCreate,
            Array3DCreate,
            MipmappedArrayCreate,
            MemCreate,
            MemRelease,
            ArrayDestroy,
            ArrayDestroy,
            MipmappedArrayDestroy,
            MemFreeAsync,
            MemFree,
            MemFree,
            MemFree,
            CtxCreate,
            MemAlloc,
            PrimaryCtxRetain,
            CtxSetCurrent,
            MemAlloc,
            MemAlloc,
            MemFree,
            MemFree,
            MemFree,
            CtxDestroy,
            PrimaryCtxRelease,
            ProcessExit,
        ],
        "events: {evs:#?}"
    );
    // Every probe of the mini driver's functions sent its row's kind.
    for f in &defined {
        let k = intercept::probe_kind(f);
        assert!(kinds.contains(&k), "no {k:?} event from {f}: {evs:#?}");
    }
    let pctx = v["pctx"];
    let ctx2 = v["ctx2"];
    let e = |i: usize| evs[i];
    // Primary context of device 1, then made current.
    assert_eq!((e(0).addr, e(0).extra), (pctx, 1));
    assert_eq!((e(1).addr, e(1).ctx), (pctx, pctx));
    // cuMemAlloc_v2: size, returned pointer, current context, result 0, this thread.
    assert_eq!(
        (e(2).size, e(2).addr, e(2).ctx, e(2).result),
        (1 << 20, v["a"], pctx, 0)
    );
    assert_eq!(e(2).tid, pid, "single-threaded program: tid == tgid");
    assert!(e(2).ts_ns > 0);
    // Pitch: size = pitch * height, extra = pitch.
    assert_eq!(v["pitch"], 1024);
    assert_eq!(
        (e(3).addr, e(3).size, e(3).extra),
        (v["pitched"], 1024 * 10, 1024)
    );
    assert_eq!((e(4).addr, e(4).size), (v["managed"], 3 << 20));
    assert_eq!((e(5).addr, e(5).size), (v["async"], 5 << 20));
    // Arrays: the shared footprint estimate.
    assert_eq!(
        (e(6).addr, e(6).size),
        (v["arr"], array_footprint(1024, 1024, 0, 0x20, 4))
    );
    assert_eq!(
        (e(7).addr, e(7).size),
        (v["arr3"], array_footprint(100, 100, 100, 0x02, 2))
    );
    // Mipmapped array: the estimate of all its levels, released in its own key space.
    assert_eq!(
        (e(8).addr, e(8).size),
        (v["mip"], mipmap_footprint(256, 128, 0, 0x20, 4, 3, false))
    );
    assert_eq!(e(13).addr, v["mip"]);
    // cuMemCreate: handle, size, device from the allocation properties.
    assert_eq!((e(9).addr, e(9).size, e(9).extra), (v["h"], 4 << 20, 1));
    assert_eq!(e(10).addr, v["h"]);
    assert_eq!((e(11).addr, e(12).addr), (v["arr"], v["arr3"]));
    assert_eq!(e(14).addr, v["async"]);
    assert_eq!(
        (e(15).addr, e(16).addr, e(17).addr),
        (v["managed"], v["pitched"], v["a"])
    );
    // A created context becomes current: the next allocation carries it.
    assert_eq!((e(18).addr, e(18).ctx, e(18).extra), (ctx2, ctx2, 0));
    assert_eq!((e(19).addr, e(19).size, e(19).ctx), (v["in2"], 4096, ctx2));
    // Another thread: its own current context (device 0's primary), its own tid.
    let tctx = v["tctx"];
    assert_eq!((e(20).addr, e(20).extra), (tctx, 0));
    assert_ne!(e(20).tid, pid);
    assert_eq!((e(21).addr, e(21).tid), (tctx, e(20).tid));
    assert_eq!(
        (e(22).addr, e(22).size, e(22).ctx, e(22).tid),
        (v["tptr"], 8192, tctx, e(20).tid)
    );
    // ... while the main thread's current context is still the created one.
    assert_eq!(
        (e(23).addr, e(23).size, e(23).ctx, e(23).tid),
        (v["in3"], 16384, ctx2, pid)
    );
    assert_eq!(
        (e(24).addr, e(25).addr, e(26).addr),
        (v["in3"], v["tptr"], v["in2"])
    );
    assert_eq!(e(27).addr, ctx2);
    assert_eq!(e(28).extra, 1);

    let c = handle.counters();
    assert_eq!(c.dropped, 0, "{c:?}");
    assert_eq!(c.malformed, 0, "{c:?}");
    // 29 libcuda events and the exit; other processes may add exits.
    assert!(c.sent >= before.sent + 30, "{c:?}");
    assert!(c.received >= 30, "{c:?}");
}

#[tokio::test]
async fn own_tgid_is_ignored() {
    require_root();
    let _g = serial();
    let tmp = tempfile::tempdir().unwrap();
    let (lib, prog) = build_mini(tmp.path());
    // Ignore the program's pid: impossible to know before it starts, so ignore a process
    // that runs it through a shell that execs it (exec keeps the pid).
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(format!("read x; exec {}", prog.display()))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id();
    let mut probes = Probes::load(&ProbeOptions {
        ignore_tgid: Some(pid),
        ..Default::default()
    })
    .unwrap();
    probes.attach_libcuda(&lib).unwrap();
    let (mut rx, handle) = probes
        .spawn(DiscoveryOptions {
            interval: None,
            ..Default::default()
        })
        .unwrap();
    {
        use std::io::Write;
        child.stdin.take().unwrap().write_all(b"go\n").unwrap();
    }
    assert!(child.wait().unwrap().success());
    // Run it once more, not ignored, as a marker that the probes work.
    let marker = Command::new(&prog)
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mpid = marker.id();
    marker.wait_with_output().unwrap();
    let evs = events_of(&mut rx, mpid).await;
    assert!(evs.iter().any(|e| kind(e) == EventKind::MemAlloc));
    // Nothing at all from the ignored pid (not even its exit).
    while let Ok(ev) = rx.try_recv() {
        assert_ne!(ev.tgid, pid, "event from the ignored process: {ev:?}");
    }
    assert_eq!(handle.counters().unpaired, 0);
}

#[tokio::test]
async fn discovery_finds_a_running_process_libcuda() {
    require_root();
    let _g = serial();
    let tmp = tempfile::tempdir().unwrap();
    let (lib, prog) = build_mini(tmp.path());
    // A process that maps the library (through LD_PRELOAD of `sleep`), found in its maps.
    let mut sleeper = Command::new("sleep")
        .arg("30")
        .env("LD_PRELOAD", &lib)
        .spawn()
        .unwrap();
    let want = PathBuf::from(format!("/proc/{}/root{}", sleeper.id(), lib.display()));
    // Poll: the loader maps the library shortly after the spawn.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let found = hami_user::probes::discover_libcuda(Path::new("/proc"));
        if found.contains(&want) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{want:?} not in {found:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }

    let probes = Probes::load(&ProbeOptions::default()).unwrap();
    let (mut rx, handle) = probes
        .spawn(DiscoveryOptions {
            interval: Some(Duration::from_millis(100)),
            ..Default::default()
        })
        .unwrap();
    // The background discovery attaches it.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let meta = std::fs::metadata(&lib).unwrap();
    use std::os::unix::fs::MetadataExt;
    while !handle
        .attached()
        .iter()
        .any(|l| l.file_id == (meta.dev(), meta.ino()))
    {
        assert!(
            std::time::Instant::now() < deadline,
            "not attached: {:?}",
            handle.attached()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _ = sleeper.kill();
    let _ = sleeper.wait();
    let child = Command::new(&prog)
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id();
    child.wait_with_output().unwrap();
    let evs = events_of(&mut rx, pid).await;
    assert_eq!(
        evs.iter()
            .filter(|e| kind(e) == EventKind::MemAlloc)
            .count(),
        4
    );
}

#[test]
fn not_libcuda_is_rejected() {
    require_root();
    let _g = serial();
    let mut probes = Probes::load(&ProbeOptions::default()).unwrap();
    // /bin/sh is an ELF file exporting none of the probed functions.
    let sh = std::fs::canonicalize("/bin/sh").unwrap();
    match probes.attach_libcuda(&sh) {
        Err(ProbeError::NotLibcuda(p)) => assert_eq!(p, sh),
        other => panic!("expected NotLibcuda, got {other:?}"),
    }
    match probes.attach_libcuda(Path::new("/nonexistent/libcuda.so.1")) {
        Err(ProbeError::File { .. }) => {}
        other => panic!("expected File error, got {other:?}"),
    }
}

/// The workspace's fake driver (`testing/fake-cuda`, soname `libcuda.so.1`) driven by
/// `cudaprobe`, through the three ways programs reach the driver: the probes see
/// `cuMemAlloc_v2` with its size and returned pointer, the free, and the context (with its
/// device ordinal) the allocation was made in.
#[tokio::test]
async fn fake_driver_alloc_free_three_ways() {
    use hami_test_harness::{Artifacts, TestEnv};
    require_root();
    let _g = serial();
    let env = TestEnv::new();
    let art = Artifacts::get();
    let mut probes = Probes::load(&ProbeOptions::default()).expect("loading the eBPF programs");
    let outcome = probes
        .attach_libcuda(&art.fake_libcuda)
        .expect("attaching to the fake libcuda.so.1");
    assert!(outcome.attached.contains(&"cuMemAlloc_v2"), "{outcome:?}");
    assert!(outcome.attached.contains(&"cuMemFree_v2"), "{outcome:?}");
    let (mut rx, handle) = probes
        .spawn(DiscoveryOptions {
            interval: None,
            ..Default::default()
        })
        .unwrap();
    for via in ["direct", "dlsym", "procaddr"] {
        let out = env.run_probe(&[
            "--via", via, "--device", "1", "init", "ctx", "alloc", "1M", "free", "last",
        ]);
        assert!(
            out.status.success(),
            "cudaprobe --via {via}: {}",
            out.stdout
        );
        let pid = out.pid.expect("cudaprobe prints its pid");
        let ctx = out.find("ctx")[0].num("ctx").expect("ctx pointer");
        let ptr = out.find("alloc")[0].ptr().expect("allocated pointer");
        let evs = events_of(&mut rx, pid).await;
        let alloc = evs
            .iter()
            .position(|e| kind(e) == EventKind::MemAlloc)
            .unwrap_or_else(|| panic!("--via {via}: no MemAlloc in {evs:#?}"));
        let e = evs[alloc];
        assert_eq!(
            (e.size, e.addr, e.ctx),
            (1 << 20, ptr, ctx),
            "--via {via}: {e:?}"
        );
        assert!(
            evs[alloc..]
                .iter()
                .any(|e| kind(e) == EventKind::MemFree && e.addr == ptr),
            "--via {via}: no MemFree of {ptr:#x} after the alloc: {evs:#?}"
        );
        assert!(
            evs.iter()
                .any(|e| kind(e) == EventKind::PrimaryCtxRetain && e.addr == ctx && e.extra == 1),
            "--via {via}: no primary retain of device 1: {evs:#?}"
        );
    }
    // Created contexts (procaddr resolves cuCtxCreate to its newest version): the device
    // ordinal is read from the right argument, and the allocation carries the new context.
    for via in ["direct", "procaddr"] {
        let out = env.run_probe(&[
            "--via",
            via,
            "--device",
            "1",
            "init",
            "ctxcreate",
            "alloc",
            "64K",
        ]);
        assert!(
            out.status.success(),
            "cudaprobe --via {via}: {}",
            out.stdout
        );
        let pid = out.pid.unwrap();
        let ctx = out.find("ctxcreate")[0].num("ctx").unwrap();
        let ptr = out.find("alloc")[0].ptr().unwrap();
        let evs = events_of(&mut rx, pid).await;
        assert!(
            evs.iter()
                .any(|e| kind(e) == EventKind::CtxCreate && e.addr == ctx && e.extra == 1),
            "--via {via}: no CtxCreate on device 1: {evs:#?}"
        );
        assert!(
            evs.iter().any(|e| kind(e) == EventKind::MemAlloc
                && e.addr == ptr
                && e.size == 64 << 10
                && e.ctx == ctx),
            "--via {via}: allocation not attributed to the created context: {evs:#?}"
        );
    }
    // A failed call sends nothing: an allocation larger than the fake device.
    let out = env.run_probe(&["init", "ctx", "alloc", "100T"]);
    let pid = out.pid.unwrap();
    assert!(!out.find("alloc")[0].ok(), "{}", out.stdout);
    let evs = events_of(&mut rx, pid).await;
    assert!(
        !evs.iter().any(|e| kind(e) == EventKind::MemAlloc),
        "failed allocation reported: {evs:#?}"
    );
    let c = handle.counters();
    assert_eq!((c.dropped, c.malformed), (0, 0), "{c:?}");
}

/// A "container": a process in its own mount namespace loads a libcuda that exists only
/// there (a private tmpfs over a directory that is empty on the host). Background discovery
/// finds it in the process's maps, attaches through `/proc/<pid>/root/...`, and the probes
/// see the process's allocation.
#[tokio::test]
async fn container_libcuda_found_through_proc_root() {
    use hami_test_harness::{Artifacts, RunningProbe, TestEnv};
    require_root();
    let _g = serial();
    let env = TestEnv::new();
    let art = Artifacts::get();
    let nsdir = tempfile::tempdir().unwrap();
    let d = nsdir.path().display().to_string();
    let script = format!(
        "mount -t tmpfs hami-test {d} && cp {lib} {d}/libcuda.so.1 && \
         exec {probe} init ctx wait alloc 2M free last",
        lib = art.fake_libcuda.display(),
        probe = art.cudaprobe.display(),
    );
    let mut cmd = env.command(Path::new("unshare"));
    cmd.args(["--mount", "--propagation", "private", "sh", "-c", &script])
        .env("LD_LIBRARY_PATH", nsdir.path())
        .stdin(std::process::Stdio::piped());
    let mut rp = RunningProbe::start(cmd);
    rp.wait_for("wait");
    let pid = rp.pid;
    assert!(
        !nsdir.path().join("libcuda.so.1").exists(),
        "the library must be visible only inside the namespace"
    );

    let probes = Probes::load(&ProbeOptions::default()).unwrap();
    let (mut rx, handle) = probes
        .spawn(DiscoveryOptions {
            interval: Some(Duration::from_millis(100)),
            ..Default::default()
        })
        .unwrap();
    let want = PathBuf::from(format!("/proc/{pid}/root{d}/libcuda.so.1"));
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !handle.attached().iter().any(|l| l.path == want) {
        assert!(
            std::time::Instant::now() < deadline,
            "{want:?} not attached: {:?}",
            handle.attached()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    rp.resume();
    let out = rp.finish();
    assert!(out.status.success(), "{}", out.dump());
    let ptr = out.find("alloc")[0].ptr().unwrap();
    let evs = events_of(&mut rx, pid).await;
    assert!(
        evs.iter()
            .any(|e| kind(e) == EventKind::MemAlloc && e.addr == ptr && e.size == 2 << 20),
        "{evs:#?}"
    );
    assert!(
        evs.iter()
            .any(|e| kind(e) == EventKind::MemFree && e.addr == ptr),
        "{evs:#?}"
    );
}

/// Runs the mini program once and returns how many events the probes sent meanwhile.
fn sent_by_one_run(probes: &Probes, prog: &Path) -> u64 {
    let before = probes.counters().sent;
    let st = Command::new(prog)
        .stdout(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(st.success());
    probes.counters().sent - before
}

#[test]
fn links_handed_to_a_keeper_process_are_detached_without_waiting() {
    require_root();
    let _g = serial();
    let tmp = tempfile::tempdir().unwrap();
    let (lib, prog) = build_mini(tmp.path());
    let mut probes = Probes::load(&ProbeOptions::default()).unwrap();
    let outcome = probes.attach_libcuda(&lib).unwrap();
    assert!(
        sent_by_one_run(&probes, &prog) > 0,
        "the probes do not fire"
    );
    let links = probes.take_links();
    // Entry and return probe per symbol, plus the process-exit tracepoint.
    assert_eq!(links.len(), 2 * outcome.attached.len() + 1);
    assert!(matches!(
        probes.attach_libcuda(&lib),
        Err(ProbeError::Closed)
    ));
    let t = std::time::Instant::now();
    assert!(links.detach_in_background(), "not handed off");
    // Detaching here takes about 0.1 s per link (4-5 s); handing off takes milliseconds.
    assert!(
        t.elapsed() < Duration::from_secs(1),
        "hand-off took {:?}",
        t.elapsed()
    );
    // The keeper detaches them in the background: the probes stop firing.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while sent_by_one_run(&probes, &prog) > 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "probes still attached 60 s after the hand-off"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}
