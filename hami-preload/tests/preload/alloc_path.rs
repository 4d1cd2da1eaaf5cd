//! The allocation path's context → device cache: allocations are charged to the device of
//! the context current at the time of each call, across context switches, creations and
//! destructions (cudaprobe, two fake devices).

use crate::support::*;
use hami_test_harness::ProbeOutput;

/// Runs the harness's cudaprobe with the preload; returns (its output for messages, rc of
/// every op line).
fn run(env: &Env, args: &[&str]) -> (String, Vec<i32>) {
    let out = env
        .command(&Artifacts::get().cudaprobe, true)
        .args(args)
        .output()
        .expect("run cudaprobe");
    let p = ProbeOutput::from_output(out);
    (p.dump(), p.rcs())
}

#[test]
fn charges_follow_the_current_context_across_switches_and_destruction() {
    let env = Env::new()
        .set("FAKE_CUDA_DEVICE_COUNT", "2")
        .set("CUDA_DEVICE_MEMORY_LIMIT", "4G")
        .set("HAMI_CONTEXT_OVERHEAD", "0");
    let (text, rcs) = run(
        &env,
        &[
            "init",
            "ctx",
            "alloc",
            "100M", // primary context of device 0
            "device",
            "1",
            "ctxcreate",
            "alloc",
            "200M", // created context on device 1
            "ctxdestroy",
            "alloc",
            "300M", // popped: device 0's primary again
            "ctx",
            "alloc",
            "10M", // primary context of device 1 made current
            "device",
            "0",
            "ctx",
            "alloc",
            "1M", // and back to device 0's
            "device",
            "1",
            "ctxcreate",
            "alloc",
            "50M", // another created context
            "exit",
            "0",
        ],
    );
    assert!(rcs.iter().all(|&r| r == 0), "{text}");
    assert_eq!(rcs.len(), 16, "{text}");
    let r = env.region();
    // The 200M went with the destroyed context.
    assert_eq!((r.used(0), r.used(1)), (401 * MB, 60 * MB), "{text}");
}

#[test]
fn a_failing_device_query_without_context_is_returned() {
    // No current context: cuCtxGetDevice's error comes back (nothing is cached for null).
    let env = Env::new()
        .set("CUDA_DEVICE_MEMORY_LIMIT", "1G")
        .set("HAMI_CONTEXT_OVERHEAD", "0");
    let (text, rcs) = run(
        &env,
        &["init", "alloc", "1M", "ctx", "alloc", "1M", "exit", "0"],
    );
    // CUDA_ERROR_INVALID_CONTEXT (201), then success once a context is current.
    assert_eq!(rcs, vec![0, 201, 0, 0], "{text}");
    assert_eq!(env.region().used(0), MB, "{text}");
}
