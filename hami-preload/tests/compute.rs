//! The compute share (`docs/preload.md`, "Compute share"): the variables, and the launch
//! gate against the fake driver's device clock, with `cudaprobe`.

use hami_common::layout::{COMPUTE_POLICY_DEFAULT, COMPUTE_POLICY_DISABLE, COMPUTE_POLICY_FORCE};
use hami_test_harness::{ProbeOutput, TestEnv, CUDA_ERROR_OUT_OF_MEMORY as OOM};

/// A sandbox with the preload, contexts free of memory.
fn env() -> TestEnv {
    TestEnv::new()
        .preload(true)
        .env("FAKE_CUDA_CTX_OVERHEAD", "0")
        .env("HAMI_CONTEXT_OVERHEAD", "0")
}

fn run(env: &TestEnv, args: &str) -> ProbeOutput {
    env.run_probe(&args.split_ascii_whitespace().collect::<Vec<_>>())
}

/// `CUDA_DISABLE_CONTROL=true`: every call passes through unchanged (an allocation far over
/// the memory limit succeeds) by every path, and no region is created.
#[test]
fn disable_control_passes_everything_through() {
    for via in ["direct", "dlsym", "procaddr"] {
        for value in ["true", "1", "TRUE"] {
            let env = env()
                .env("CUDA_DEVICE_MEMORY_LIMIT", "1M")
                .env("CUDA_DEVICE_SM_LIMIT", "10")
                .env("CUDA_DISABLE_CONTROL", value);
            let out = run(
                &env,
                &format!("--via {via} init ctx alloc 64M meminfo free last"),
            );
            assert!(out.status.success(), "{}", out.dump());
            assert_eq!(
                out.rcs(),
                vec![0, 0, 0, 0, 0],
                "{via} {value}: {}",
                out.dump()
            );
            assert!(
                !env.region_path().exists(),
                "{via}: no region is created: {}",
                out.dump()
            );
        }
    }
    // `false`, and a malformed value (named in an error), keep control on.
    for value in ["false", "yes"] {
        let env = env()
            .env("CUDA_DEVICE_MEMORY_LIMIT", "1M")
            .env("CUDA_DISABLE_CONTROL", value);
        let out = run(&env, "init ctx alloc 64M");
        assert_eq!(out.rcs(), vec![0, 0, OOM as i32], "{value}: {}", out.dump());
        if value == "yes" {
            assert!(
                out.stderr.contains("ERROR") && out.stderr.contains("CUDA_DISABLE_CONTROL=\"yes\""),
                "{}",
                out.dump()
            );
        }
    }
}

/// The creator's share and policy are written into the region; a later process with another
/// configuration is told that the region's apply.
#[test]
fn the_share_and_policy_are_the_regions_and_differences_warn() {
    let env = env()
        .env("CUDA_DEVICE_SM_LIMIT", "30")
        .env("CUDA_DEVICE_SM_LIMIT_1", "50")
        .env("GPU_CORE_UTILIZATION_POLICY", "FORCE");
    let out = run(&env, "init ctx");
    assert!(out.all_ok(), "{}", out.dump());
    let r = env.region();
    assert_eq!((r.sm_limit(0), r.sm_limit(1), r.sm_limit(2)), (30, 50, 30));
    assert_eq!(r.compute_policy(0), COMPUTE_POLICY_FORCE);
    let later = env
        .env("CUDA_DEVICE_SM_LIMIT", "70")
        .env("GPU_CORE_UTILIZATION_POLICY", "default");
    let out = run(&later, "init ctx");
    assert!(out.all_ok(), "{}", out.dump());
    assert!(
        out.stderr.contains("WARN")
            && out
                .stderr
                .contains("compute share (70 %, policy default) differs")
            && out
                .stderr
                .contains("(30 %, policy force); the region's applies"),
        "{}",
        out.dump()
    );
    assert_eq!(later.region().sm_limit(0), 30);
}

/// A malformed share is an error naming the variable; the device gets the smallest share
/// (1 %), never the whole device. A malformed policy is an error too; `default` applies.
#[test]
fn malformed_compute_settings_are_named_and_fall_back_safely() {
    for bad in ["30%", "0.5", "-1", "101", ""] {
        let env = env().env("CUDA_DEVICE_SM_LIMIT", bad);
        let out = run(&env, "init ctx");
        assert!(
            out.all_ok(),
            "{bad:?}: the application runs: {}",
            out.dump()
        );
        assert!(
            out.stderr.contains("ERROR")
                && out
                    .stderr
                    .contains(&format!("CUDA_DEVICE_SM_LIMIT={bad:?}"))
                && out.stderr.contains("compute share is 1 %"),
            "{bad:?}: {}",
            out.dump()
        );
        assert_eq!(env.region().sm_limit(0), 1, "{bad:?}");
    }
    let env = env()
        .env("CUDA_DEVICE_SM_LIMIT", "40")
        .env("GPU_CORE_UTILIZATION_POLICY", "strict");
    let out = run(&env, "init ctx");
    assert!(out.all_ok(), "{}", out.dump());
    assert!(
        out.stderr
            .contains("GPU_CORE_UTILIZATION_POLICY=\"strict\"")
            && out.stderr.contains("the `default` policy applies"),
        "{}",
        out.dump()
    );
    assert_eq!(env.region().compute_policy(0), COMPUTE_POLICY_DEFAULT);
    assert_eq!(env.region().sm_limit(0), 40);
    let env = self::env().env("GPU_CORE_UTILIZATION_POLICY", "disable");
    run(&env, "init ctx");
    assert_eq!(env.region().compute_policy(0), COMPUTE_POLICY_DISABLE);
}

/// `CUDA_TASK_PRIORITY` is ignored, and says so at the default log level.
#[test]
fn task_priority_is_reported_as_ignored() {
    let env = env().env("CUDA_TASK_PRIORITY", "0");
    let out = run(&env, "init ctx");
    assert!(out.all_ok(), "{}", out.dump());
    assert!(
        out.stderr.contains("WARN") && out.stderr.contains("CUDA_TASK_PRIORITY=\"0\" is ignored"),
        "{}",
        out.dump()
    );
    let quiet = run(&self::env(), "init ctx");
    assert!(
        !quiet.stderr.contains("CUDA_TASK_PRIORITY"),
        "{}",
        quiet.dump()
    );
}
