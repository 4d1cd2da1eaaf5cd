//! Regressions: each test pins one bug that was fixed (or, among the first tests, a behaviour
//! that could easily break), and its doc comment opens with what it guards: "Guards issue N"
//! with the commit that fixed it, or, for the bugs found before issues were filed (on the
//! H200, in review), the bug by name with its commit ("no issue filed").
//!
//! * issue 12 (bad inputs): zero-sized allocations while failing closed, `cuMemCreate` on a
//!   device beyond the region; its closing note: a context destroyed while a free of its
//!   object or an allocation in it is in flight;
//! * issue 29 ([`issue_29_several_gpus`]): a container's GPUs known by UUID, processes
//!   narrowed with `CUDA_VISIBLE_DEVICES` (limits, charges, the compute share per device);
//! * issue 31 ([`issue_31_graphs_and_green_contexts`]): graph memory nodes and green contexts
//!   admitted and charged;
//! * no issue filed: `dlsym(RTLD_NEXT)` through the preload, null out-pointers, unknown and
//!   double frees, concurrent context creations charged twice (H200), nested hooks and a
//!   driver without a soname (review), a malformed log level, context measurement without
//!   NVML.

use crate::support::*;
use hami_test_harness::{cc, NvmlSnapshot, ProbeOutput, RunningProbe};
use std::process::Command;
mod fixtures;
use fixtures::*;
mod issue_29_several_gpus;
mod issue_31_graphs_and_green_contexts;

/// Guards the bug of an exported `dlsym` that resolves `RTLD_NEXT` from the preload, not from
/// its caller (no issue filed; since the first tests, f62ad76).
/// Our exported `dlsym` must keep glibc's `RTLD_NEXT` semantics for other libraries: a shim
/// preloaded after us that wraps `puts` with `dlsym(RTLD_NEXT, "puts")` must get libc's, not
/// its own (which would recurse).
#[test]
fn rtld_next_resolves_relative_to_the_real_caller() {
    let env = Env::new();
    let shim_c = env.dir().join("shim.c");
    let main_c = env.dir().join("main.c");
    std::fs::write(
        &shim_c,
        r#"#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
int puts(const char *s) {
    int (*next)(const char *) = (int (*)(const char *))dlsym(RTLD_NEXT, "puts");
    if (!next || next == puts) { fprintf(stderr, "RTLD_NEXT broken\n"); return -1; }
    fputs("[shim] ", stdout);
    return next(s);
}
"#,
    )
    .unwrap();
    std::fs::write(
        &main_c,
        r#"#include <stdio.h>
#include <dlfcn.h>
int main(void) {
    puts("hello");
    void *h = dlopen("libm.so.6", RTLD_NOW);
    double (*c)(double) = (double (*)(double))dlsym(h, "cos");
    printf("cos=%g default=%d\n", c(0), dlsym(RTLD_DEFAULT, "printf") != 0);
    return 0;
}
"#,
    )
    .unwrap();
    let shim = env.dir().join("shim.so");
    let main = env.dir().join("main");
    cc(&shim_c, &shim, &["-shared", "-fPIC", "-ldl"]);
    cc(&main_c, &main, &["-ldl"]);
    let preload = format!(
        "{}:{}",
        Artifacts::get().preload_so.display(),
        shim.display()
    );
    let out = Command::new(&main)
        .env("LD_PRELOAD", preload)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "[shim] hello\ncos=1 default=1\n"
    );
}

/// Guards the bug of a hook that writes through a null out-pointer (no issue filed; since the
/// first tests, f62ad76): `cuMemAlloc`, `cuMemGetInfo` and `cuDeviceTotalMem` with a null
/// output are the driver API's `CUDA_ERROR_INVALID_VALUE`, each of the three ways, and charge
/// nothing.
#[test]
fn null_output_pointers_are_invalid_value_not_a_crash() {
    let env = Env::new()
        .set("CUDA_DEVICE_MEMORY_LIMIT", "1G")
        .set("HAMI_CONTEXT_OVERHEAD", "0");
    for via in ["direct", "dlsym", "procaddr"] {
        let p = env.probe(&["--via", via, "nullalloc", "nullinfo", "nulltotal", "info"]);
        assert!(p.ok(), "{}", p.dump());
        assert_eq!(p.rcs(), vec![1, 1, 1, 0], "{via}: {}", p.dump());
        assert_eq!(p.field(3, "free"), GB.to_string(), "nothing was charged");
    }
}

/// Guards the bug of a free the driver refuses uncharging twice or changing its code (no issue
/// filed; since the first tests, f62ad76).
/// The driver's own code for unknown and double frees, learnt by running without the
/// preload, must come back unchanged through it, and nothing may be uncharged twice.
#[test]
fn unknown_and_double_frees_return_the_drivers_error() {
    let env = Env::new()
        .set("CUDA_DEVICE_MEMORY_LIMIT", "1G")
        .set("HAMI_CONTEXT_OVERHEAD", "0");
    let args = [
        "alloc",
        "1M",
        "free",
        "free",
        "freeunknown",
        "alloc",
        "100M",
        "info",
    ];
    let plain = Probe::from(env.command(hprobe(), false).args(args).output().unwrap());
    let driver_double = plain.rc(2);
    let driver_unknown = plain.rc(3);
    assert_ne!(driver_double, 0, "the fake driver rejects a double free");
    assert_ne!(
        driver_unknown, 0,
        "the fake driver rejects an unknown pointer"
    );
    for via in ["direct", "dlsym", "procaddr"] {
        let mut a = vec!["--via", via];
        a.extend_from_slice(&args);
        let p = env.probe(&a);
        assert_eq!(
            p.rcs(),
            vec![0, 0, driver_double, driver_unknown, 0, 0],
            "{via}: {}",
            p.dump()
        );
        // Only the live 100M is charged: the double free did not uncharge it.
        assert_eq!(
            p.field(5, "free"),
            (924 * MB).to_string(),
            "{via}: {}",
            p.dump()
        );
    }
}

/// Guards the H200's context double charge (no issue filed; 236dba2).
/// Found on the H200: two processes sharing a region created their contexts at the same
/// moment; context memory was the NVML device-level delta, so one of them was charged both
/// contexts (1,097,990,144 bytes for 2 x 518 MiB) and both 2.5 GiB allocations in a 4 GiB
/// quota failed. Now each process is charged its own context, read from NVML's per-process
/// list: 3 x (500M context + 800M data) = 3900M fit in 4 GiB; one context charged twice would
/// not.
#[test]
fn concurrent_context_creation_charges_each_process_its_own_context() {
    let env = Env::new()
        .set("CUDA_DEVICE_MEMORY_LIMIT", "4G")
        .set("FAKE_CUDA_CTX_OVERHEAD", "500M")
        .set("FAKE_CUDA_CTX_CREATE_DELAY_MS", "400");
    let outs = concurrent_probes(&env, 3, &["alloc", "800M", "sleep", "3000", "exit", "0"]);
    for p in &outs {
        assert_eq!(p.rcs(), vec![0, 0], "{}", p.dump());
        assert!(
            p.stderr()
                .contains("context charged 524288000 bytes (measured per process"),
            "{}",
            p.dump()
        );
    }
    assert_eq!(context_charges(&env), vec![500 * MB; 3]);
    assert_eq!(env.region().used(0), 3 * 1300 * MB);
}

/// Guards the H200's context double charge, without NVML's per-process list (no issue filed;
/// 236dba2).
/// The fallback when NVML does not list our pid (a container's own pid namespace; simulated
/// with `FAKE_NVML_HIDE_PROCESSES`): the device-level delta, taken under the region-wide
/// context-creation lock, so concurrent creations still charge one context each. Another
/// process's allocation (the first one's 300M, made while the others create their
/// contexts) is subtracted as region data. Each process holds its allocation until all three
/// have allocated, so the later measurements see the earlier processes alive.
#[test]
fn concurrent_context_creation_without_per_process_nvml_is_serialized() {
    let env = Env::new()
        .set("CUDA_DEVICE_MEMORY_LIMIT", "4G")
        .set("FAKE_CUDA_CTX_OVERHEAD", "500M")
        .set("FAKE_CUDA_CTX_CREATE_DELAY_MS", "400")
        .set("FAKE_NVML_HIDE_PROCESSES", "1");
    let t = std::time::Instant::now();
    let outs = concurrent_probes_held(&env, 3, &["alloc", "300M"], &["exit", "0"]);
    for p in &outs {
        assert_eq!(p.rcs(), vec![0, 0, 0], "{}", p.dump());
        assert!(
            p.stderr()
                .contains("context charged 524288000 bytes (measured at device level, serialized"),
            "{}",
            p.dump()
        );
    }
    assert_eq!(context_charges(&env), vec![500 * MB; 3]);
    assert_eq!(env.region().used(0), 3 * 800 * MB);
    // Serialized: three creations of 400 ms each, one after the other (a lower bound, which
    // a slow machine only makes easier to meet).
    assert!(t.elapsed() >= std::time::Duration::from_millis(3 * 400));
}

/// Guards the review's nested-hook deadlock and double charge (no issue filed; cc1acda).
/// A driver other than ours (`tests/programs/minifake.c`): linked without `-Bsymbolic`, so
/// its internal calls to its own exported functions land in our hooks (primary retain calls
/// `cuCtxCreate_v2`, primary release calls `cuCtxDestroy_v2`, pitch calls `cuMemAlloc_v2`);
/// its `cuGetProcAddress_v2` is `dlsym(RTLD_DEFAULT, ...)`, so it hands out our own hooks;
/// it has no NVML and no `cuDeviceGetUuid_v2`, and answers an unknown free with 400.
///
/// Found in review: the primary retain deadlocked (the context table's lock was taken again
/// by the nested `cuCtxCreate_v2` hook on the same thread), and a pitched allocation was
/// charged twice (outer estimate + inner `cuMemAlloc_v2`), refusing 200 MiB in a 480 MiB
/// room. A hook entered while the thread is already inside one now passes straight through.
#[test]
fn other_driver_nested_calls_pass_through_once() {
    other_driver(true);
}

/// Guards the review's driver without a soname never found (no issue filed; 0133e8d).
/// Found in review: a driver loaded under another name than `libcuda.so.1` (here a
/// `libcuda.so` without a soname, linked with `-lcuda`) was never found: every hook returned
/// `CUDA_ERROR_NOT_FOUND`. The object defining `cuInit` in the global scope is used now.
#[test]
fn other_driver_without_soname_is_found() {
    other_driver(false);
}

/// Guards the review's silent malformed log level (no issue filed; 006d49a).
/// Found in review: a malformed `LIBCUDA_LOG_LEVEL` silently meant the default. It now says
/// so (once, as a warning, at the first CUDA call), in the usual one-line prefixed format.
#[test]
fn malformed_log_level_is_reported_once_and_defaults() {
    let env = Env::new()
        .set("CUDA_DEVICE_MEMORY_LIMIT", "1G")
        .set("HAMI_CONTEXT_OVERHEAD", "0")
        .set("LIBCUDA_LOG_LEVEL", "verbose");
    let p = env.probe(&["alloc", "1M", "info"]);
    assert!(p.ok(), "{}", p.dump());
    assert_eq!(p.rcs(), vec![0, 0], "{}", p.dump());
    let err = p.stderr();
    let warnings: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("LIBCUDA_LOG_LEVEL"))
        .collect();
    assert_eq!(warnings.len(), 1, "{err}");
    assert!(
        warnings[0].starts_with("[hami-preload pid=")
            && warnings[0].contains("WARN: invalid LIBCUDA_LOG_LEVEL=\"verbose\""),
        "{err}"
    );
    assert!(
        err.lines().all(|l| l.starts_with("[hami-preload pid=")),
        "{err}"
    );
}

/// Guards the context measurement without NVML against serializing what it need not (no issue
/// filed; 74f7433).
/// With `HAMI_CONTEXT_OVERHEAD` set nothing is measured, so context creations take no
/// region-wide lock: three processes creating contexts at once overlap. Shown directly, not
/// by wall time: the fake holds each creation inside the driver (`FAKE_CUDA_CTX_CREATE_GATE`)
/// until all three are in there at once; a lock around the creations would let only one in.
#[test]
fn configured_overhead_context_creations_are_not_serialized() {
    let env = without_nvml(
        Env::new()
            .set("CUDA_DEVICE_MEMORY_LIMIT", "1G")
            .set("HAMI_CONTEXT_OVERHEAD", "100M"),
    );
    // A first process creates the region (so the three below do not race for that).
    let p = env.probe(&["info"]);
    assert_eq!(p.rcs(), vec![0], "{}", p.dump());
    let (outs, at_once) = concurrent_probes_gated(&env, 3, &["info"]);
    assert_eq!(
        at_once,
        3,
        "context creations were serialized: only {at_once} of 3 inside the driver at once\n{}",
        dumps(&outs)
    );
    for p in &outs {
        assert_eq!(p.rcs(), vec![0], "{}", p.dump());
        assert!(
            p.stderr()
                .contains("context charged 104857600 bytes (HAMI_CONTEXT_OVERHEAD)"),
            "{}",
            p.dump()
        );
        assert!(
            !p.stderr().contains("context-creation lock"),
            "{}",
            p.dump()
        );
        assert!(
            !p.stderr().contains("FAKE_CUDA_CTX_CREATE_GATE"),
            "{}",
            p.dump()
        );
    }
}

/// Guards the context measurement without NVML (no issue filed; 74f7433): before, no NVML
/// meant no measurement.
/// Without NVML, context memory is measured through the driver: the primary context (first
/// context of the process: device used minus the region's usage) and a created context
/// (free before through the primary context minus free after) are each charged exactly the
/// driver's context footprint, and the caller's context stack is left as it was.
#[test]
fn without_nvml_contexts_are_measured_through_the_driver() {
    let env = without_nvml(
        Env::new()
            .set("CUDA_DEVICE_MEMORY_LIMIT", "2G")
            .set("FAKE_CUDA_CTX_OVERHEAD", "300M")
            .set("LIBCUDA_LOG_LEVEL", "3"),
    );
    // hprobe retains the primary context p and sets it current (stack [p]); the creation
    // pushes c (stack [p, c]): popping gives c, then p, then nothing.
    let p = env.probe(&[
        "ctxcur",
        "ctxcreate",
        "ctxcur",
        "ctxpop",
        "ctxpop",
        "ctxpop",
    ]);
    assert_eq!(p.rcs().len(), 6, "{}", p.dump());
    assert_eq!(&p.rcs()[..5], &[0, 0, 0, 0, 0], "{}", p.dump());
    assert_ne!(p.rc(5), 0, "the stack holds only p and c: {}", p.dump());
    let (primary, created) = (p.field(0, "ctx"), p.field(1, "ctx"));
    assert_ne!(primary, created);
    assert_eq!(p.field(2, "ctx"), created, "{}", p.dump());
    assert_eq!(p.field(3, "ctx"), created, "{}", p.dump());
    assert_eq!(p.field(4, "ctx"), primary, "{}", p.dump());
    let err = p.stderr();
    assert_eq!(err.matches(DRIVER_FIRST).count(), 1, "{}", p.dump());
    assert_eq!(err.matches(DRIVER_DELTA).count(), 1, "{}", p.dump());
    assert!(err.contains("context-creation lock held"), "{}", p.dump());

    // The other order: a created context first (current, stack [c]), then the primary
    // context retained (measured through c, then through itself): c stays current and the
    // stack unchanged.
    let p = env.probe(&[
        "--no-ctx",
        "ctxcreate",
        "ctxretain",
        "ctxcur",
        "ctxpop",
        "ctxpop",
    ]);
    assert_eq!(p.rcs().len(), 5, "{}", p.dump());
    assert_eq!(&p.rcs()[..4], &[0, 0, 0, 0], "{}", p.dump());
    assert_ne!(p.rc(4), 0, "the retain pushed nothing: {}", p.dump());
    let created = p.field(0, "ctx");
    assert_ne!(p.field(1, "ctx"), created);
    assert_eq!(p.field(2, "ctx"), created, "{}", p.dump());
    assert_eq!(p.field(3, "ctx"), created, "{}", p.dump());
    let err = p.stderr();
    assert_eq!(err.matches(DRIVER_FIRST).count(), 1, "{}", p.dump());
    assert_eq!(err.matches(DRIVER_DELTA).count(), 1, "{}", p.dump());
}

/// Guards the context measurement without NVML under concurrent creations (no issue filed;
/// 74f7433).
/// Without NVML, three processes creating their first contexts at once are serialized by
/// the region-wide lock, so each is charged exactly its own context. Each process stays until
/// all three have measured, so every measurement is made with the others' contexts alive.
#[test]
fn without_nvml_concurrent_context_creations_are_serialized_and_exact() {
    let env = without_nvml(
        Env::new()
            .set("CUDA_DEVICE_MEMORY_LIMIT", "4G")
            .set("FAKE_CUDA_CTX_OVERHEAD", "300M")
            .set("FAKE_CUDA_CTX_CREATE_DELAY_MS", "400"),
    );
    // A first process creates the region (so the three below do not race for that).
    let p = env.probe(&["info"]);
    assert_eq!(p.rcs(), vec![0], "{}", p.dump());
    let outs = concurrent_probes_held(&env, 3, &["info"], &["exit", "0"]);
    for p in &outs {
        assert_eq!(p.rcs(), vec![0, 0, 0], "{}", p.dump());
        assert_eq!(p.stderr().matches(DRIVER_FIRST).count(), 1, "{}", p.dump());
    }
    let charged: Vec<u64> = context_charges(&env)
        .into_iter()
        .filter(|&b| b != 0)
        .collect();
    assert_eq!(charged, vec![300 * MB; 3]);
}

/// Guards issue 12 (d272326): a zero-sized `cuMemAlloc` / `cuMemAllocManaged` is
/// `CUDA_ERROR_INVALID_VALUE` by the driver API's documentation, whatever the quota says. While
/// allocations fail closed (a malformed limit) the preload answered it with
/// `CUDA_ERROR_OUT_OF_MEMORY`, as if the quota had refused a real request.
#[test]
fn zero_sized_allocations_are_invalid_value_even_while_failing_closed() {
    let env = Env::new().set("CUDA_DEVICE_MEMORY_LIMIT", "lots");
    for via in ["direct", "dlsym", "procaddr"] {
        let p = env.probe(&["--via", via, "alloc", "0", "managed", "0", "alloc", "1M"]);
        assert!(p.ok(), "{}", p.dump());
        assert_eq!(p.rcs(), vec![1, 1, OOM], "{via}: {}", p.dump());
    }
}

/// Guards issue 12 (d272326): `cuMemCreate` located on a device ordinal beyond the region's
/// devices (`MAX_DEVICES`) was refused with `CUDA_ERROR_OUT_OF_MEMORY` before the driver was
/// asked; a device that does not exist is the driver's `CUDA_ERROR_INVALID_DEVICE`.
#[test]
fn mem_create_on_a_device_beyond_the_region_returns_the_drivers_code() {
    let env = Env::new()
        .set("CUDA_DEVICE_MEMORY_LIMIT", "1G")
        .set("HAMI_CONTEXT_OVERHEAD", "0");
    let plain = Probe::from(
        env.command(hprobe(), false)
            .args(["createdev", "16", "2M", "createdev", "4096", "2M"])
            .output()
            .unwrap(),
    );
    assert_ne!(
        plain.rc(0),
        0,
        "the fake has no device 16: {}",
        plain.dump()
    );
    for via in ["direct", "dlsym", "procaddr"] {
        let p = env.probe(&[
            "--via",
            via,
            "createdev",
            "16",
            "2M",
            "createdev",
            "4096",
            "2M",
        ]);
        assert_eq!(
            p.rcs(),
            vec![plain.rc(0), plain.rc(1)],
            "{via}: {}",
            p.dump()
        );
    }
}

/// Guards issue 12 (its closing note of 2026-12-01; 7ebca7e): a context destroyed while a
/// release of one of its objects is in flight leaked that object's charge. The release had
/// taken the object's entry out of the table before calling the driver, so the teardown's sweep
/// of the context's objects did not see it; the driver, which had destroyed the object with its
/// context, then refused the release, and the entry was put back, under a context that no
/// longer exists: charged for ever. The fake driver holds the release before it looks at its
/// argument (`FAKE_CUDA_RELEASE_GATE`) until the probe, having seen it there, has torn the
/// context down (destroy, last primary release, primary reset): the release fails, nothing may
/// stay charged.
#[test]
fn a_context_destroyed_while_a_free_of_its_object_is_in_flight_leaks_nothing() {
    let bad = context_races("free", "FAKE_CUDA_RELEASE_GATE", false);
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

/// Guards issue 12 (its closing note of 2026-12-01; 7ebca7e), the mirror of the test above: a
/// context destroyed while an allocation in it is in flight. The driver made the object, then
/// (held there by `FAKE_CUDA_ALLOC_GATE`) the context was torn down with it before the
/// allocation returned; the preload recorded it afterwards, under the destroyed context, after
/// the teardown's sweep: charged for ever.
#[test]
fn a_context_destroyed_while_an_allocation_in_it_is_in_flight_leaks_nothing() {
    let bad = context_races("alloc", "FAKE_CUDA_ALLOC_GATE", true);
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}
