//! Regression tests: behaviours that broke or could easily break.

mod support;
use std::process::Command;
use support::*;

/// Our exported `dlsym` must keep glibc's `RTLD_NEXT` semantics for other libraries: a shim
/// preloaded after us that wraps `puts` with `dlsym(RTLD_NEXT, "puts")` must get libc's, not
/// its own (which would recurse).
#[test]
fn rtld_next_resolves_relative_to_the_real_caller() {
    let env = Env::new("rtldnext");
    let shim_c = env.dir.join("shim.c");
    let main_c = env.dir.join("main.c");
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
    let shim = env.dir.join("shim.so");
    let main = env.dir.join("main");
    assert!(Command::new("cc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(&shim)
        .arg(&shim_c)
        .arg("-ldl")
        .status()
        .unwrap()
        .success());
    assert!(Command::new("cc")
        .arg("-o")
        .arg(&main)
        .arg(&main_c)
        .arg("-ldl")
        .status()
        .unwrap()
        .success());
    let preload = format!("{}:{}", artifacts().preload.display(), shim.display());
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

#[test]
fn null_output_pointers_are_invalid_value_not_a_crash() {
    let env = Env::new("null")
        .set("CUDA_DEVICE_MEMORY_LIMIT", "1G")
        .set("HAMI_CONTEXT_OVERHEAD", "0");
    for via in ["direct", "dlsym", "procaddr"] {
        let p = env.probe(&["--via", via, "nullalloc", "nullinfo", "nulltotal", "info"]);
        assert!(p.ok(), "{}", p.dump());
        assert_eq!(p.rcs(), vec![1, 1, 1, 0], "{via}: {}", p.dump());
        assert_eq!(p.field(3, "free"), GB.to_string(), "nothing was charged");
    }
}

/// The driver's own code for unknown and double frees, learnt by running without the
/// preload, must come back unchanged through it, and nothing may be uncharged twice.
#[test]
fn unknown_and_double_frees_return_the_drivers_error() {
    let env = Env::new("frees")
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
    let plain = Probe::from(
        env.command(&artifacts().probe, false)
            .args(args)
            .output()
            .unwrap(),
    );
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

/// Starts `n` preloaded probes at the same moment (each retains its primary context at
/// start, which the fake makes take `FAKE_CUDA_CTX_CREATE_DELAY_MS`), runs `ops` in each and
/// returns their outputs.
fn concurrent_probes(env: &Env, n: usize, ops: &[&str]) -> Vec<Probe> {
    let children: Vec<_> = (0..n)
        .map(|_| {
            env.command(&artifacts().probe, true)
                .args(ops)
                .env("LIBCUDA_LOG_LEVEL", "2")
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .expect("spawn hprobe")
        })
        .collect();
    children
        .into_iter()
        .map(|c| Probe::from(c.wait_with_output().expect("wait hprobe")))
        .collect()
}

/// Context memory charged to each slot of the region on device 0.
fn context_charges(env: &Env) -> Vec<u64> {
    env.region()
        .snapshot()
        .slots
        .iter()
        .map(|s| s.usage[0][hami_common::layout::UsageKind::Context.index()])
        .collect()
}

/// Found on the H200: two processes sharing a region created their contexts at the same
/// moment; context memory was the NVML device-level delta, so one of them was charged both
/// contexts (1,097,990,144 bytes for 2 x 518 MiB) and both 2.5 GiB allocations in a 4 GiB
/// quota failed. Now each process is charged its own context, read from NVML's per-process
/// list: 3 x (500M context + 800M data) = 3900M fit in 4 GiB; one context charged twice would
/// not.
#[test]
fn concurrent_context_creation_charges_each_process_its_own_context() {
    let env = Env::new("ctx-concurrent")
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

/// The fallback when NVML does not list our pid (a container's own pid namespace; simulated
/// with `FAKE_NVML_HIDE_PROCESSES`): the device-level delta, taken under the region-wide
/// context-creation lock, so concurrent creations still charge one context each. Another
/// process's allocation (the first one's 300M, made while the others create their
/// contexts) is subtracted as region data.
#[test]
fn concurrent_context_creation_without_per_process_nvml_is_serialized() {
    let env = Env::new("ctx-concurrent-hidden")
        .set("CUDA_DEVICE_MEMORY_LIMIT", "4G")
        .set("FAKE_CUDA_CTX_OVERHEAD", "500M")
        .set("FAKE_CUDA_CTX_CREATE_DELAY_MS", "400")
        .set("FAKE_NVML_HIDE_PROCESSES", "1");
    let t = std::time::Instant::now();
    let outs = concurrent_probes(&env, 3, &["alloc", "300M", "sleep", "3000", "exit", "0"]);
    for p in &outs {
        assert_eq!(p.rcs(), vec![0, 0], "{}", p.dump());
        assert!(
            p.stderr()
                .contains("context charged 524288000 bytes (measured at device level, serialized"),
            "{}",
            p.dump()
        );
    }
    assert_eq!(context_charges(&env), vec![500 * MB; 3]);
    assert_eq!(env.region().used(0), 3 * 800 * MB);
    // Serialized: three creations of 400 ms each, one after the other.
    assert!(t.elapsed() >= std::time::Duration::from_millis(3 * 400 + 3000));
}
