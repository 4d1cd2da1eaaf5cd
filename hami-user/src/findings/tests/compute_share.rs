//! The compute-share rules: over the limit, bypasses by SM time, a region share differing
//! from the environment.

use super::*;

fn compute_view(limit: Option<u32>, window_share: f64, watched_secs: f64) -> ComputeView {
    ComputeView {
        device: 0,
        limit,
        sm_limit: limit.unwrap_or(0),
        window_share: Some(window_share),
        share: Some(window_share),
        watched_secs,
        by_pid: vec![(10, 25), (11, 20)],
        consumed_ns: 12_000_000_000,
        throttled: 3,
        throttled_ns: 400_000_000,
        ..Default::default()
    }
}

#[test]
fn compute_over_limit_when_the_mean_share_stays_above_limit_plus_tolerance() {
    let opts = ComputeOptions::default();
    let mut r = region(
        snapshot(GIB, vec![slot(0, 10, 110, 300 * MIB, 0)]),
        &[(0, SlotLiveness::Alive { host_pid: 10 })],
    );
    let p = proc_(10, true, 0);
    let run = |r: &RegionView| {
        evaluate_all(
            &[p.clone()],
            &[r.clone()],
            Tolerance::default(),
            Tolerance::NVML_DEFAULT,
            &opts,
        )
    };
    // 45 % on average over 30 s against a 30 % share: more than 10 points above.
    r.compute = vec![compute_view(Some(30), 45.0, 30.0)];
    let f = run(&r);
    assert_eq!(
        kinds(&f),
        vec![(FindingKind::ComputeOverLimit, reason::SHARE_ABOVE_LIMIT)]
    );
    let f = &f[0];
    assert_eq!(f.kind.name(), "compute_over_limit");
    assert!(f.kind.is_failure(), "the share does not hold: audit fails");
    assert_eq!(
        (f.device, f.observed, f.limit, f.bytes, f.pid),
        (Some(0), Some(45), Some(30), 0, None)
    );
    assert_eq!(f.region.as_deref(), Some("/tmp/cudevshr.cache"));
    assert!(
        f.detail.contains("45.0 %") && f.detail.contains("30 %"),
        "{}",
        f.detail
    );
    assert!(f.detail.contains("10: 25 %, 11: 20 %"), "{}", f.detail);
    assert!(!f.needs_settle() && !f.needs_nvml_confirmation());
    // Within the tolerance, not yet a whole window, no limit, or no NVML figure: quiet.
    for quiet in [
        compute_view(Some(30), 40.0, 60.0),
        compute_view(Some(30), 90.0, 25.0),
        compute_view(None, 90.0, 60.0),
        ComputeView {
            window_share: None,
            ..compute_view(Some(30), 90.0, 60.0)
        },
    ] {
        r.compute = vec![quiet.clone()];
        assert!(run(&r).is_empty(), "{quiet:?}");
    }
    // The tolerance is the operator's: 5 points makes 40 % over a 30 % share a finding.
    r.compute = vec![compute_view(Some(30), 40.0, 60.0)];
    let strict = ComputeOptions {
        tolerance_points: 5.0,
        ..opts
    };
    let f = evaluate_all(
        &[p.clone()],
        &[r.clone()],
        Tolerance::default(),
        Tolerance::NVML_DEFAULT,
        &strict,
    );
    assert_eq!(
        kinds(&f),
        vec![(FindingKind::ComputeOverLimit, reason::SHARE_ABOVE_LIMIT)]
    );
}

#[test]
fn unhooked_process_using_sm_time_is_a_bypass_even_without_a_memory_figure() {
    let r = region(snapshot(GIB, vec![]), &[]);
    // NVML gives no used-memory figure for it (not available), but its SM time.
    let mut p = proc_(12, false, 0);
    p.nvml_sm = [(0, 35)].into_iter().collect();
    let f = evaluate(&[p.clone()], &[r.clone()], Tolerance::default());
    assert_eq!(kinds(&f), vec![(FindingKind::Bypass, reason::NO_PRELOAD)]);
    assert_eq!(f[0].pid, Some(12));
    assert!(
        f[0].detail.contains("35 % of a GPU's SM time"),
        "{}",
        f[0].detail
    );
    // Idle on the GPU (0 %) and holding nothing: no finding.
    p.nvml_sm = [(0, 0)].into_iter().collect();
    assert!(evaluate(&[p], &[r], Tolerance::default()).is_empty());
}

#[test]
fn hooked_process_using_sm_time_without_a_slot_or_region_is_a_bypass() {
    // Preload mapped, no allocation seen, no slot: its SM time is unmetered.
    let r = region(snapshot(GIB, vec![]), &[]);
    let mut p = proc_(13, true, 0);
    p.nvml_sm = [(0, 50)].into_iter().collect();
    let f = evaluate(&[p.clone()], &[r.clone()], Tolerance::default());
    assert_eq!(kinds(&f), vec![(FindingKind::Bypass, reason::NO_SLOT)]);
    assert!(
        f[0].detail.contains("50 % of a GPU's SM time"),
        "{}",
        f[0].detail
    );
    // No usable region at all.
    let mut lost = p.clone();
    lost.region = None;
    lost.region_error = Some("not found".into());
    let f = evaluate(&[lost], &[r.clone()], Tolerance::default());
    assert_eq!(kinds(&f), vec![(FindingKind::Bypass, reason::NO_REGION)]);
    // With its slot, SM time is the gate's business: no bypass.
    let with_slot = region(
        snapshot(GIB, vec![slot(0, 13, 113, 300 * MIB, 0)]),
        &[(0, SlotLiveness::Alive { host_pid: 13 })],
    );
    assert!(evaluate(&[p.clone()], &[with_slot], Tolerance::default()).is_empty());
    // Without SM time and allocations: nothing (as before).
    p.nvml_sm.clear();
    assert!(evaluate(&[p], &[r], Tolerance::default()).is_empty());
}

/// The compute settings of an environment holding `vars`, read by the contract.
fn compute(vars: &[(&str, &str)]) -> crate::procinfo::EnvCompute {
    crate::procinfo::EnvCompute::from_env(&hami_common::env::HamiEnv::from_lookup(|k| {
        vars.iter()
            .find(|(n, _)| *n == k)
            .map(|(_, v)| v.to_string())
    }))
}

#[test]
fn region_compute_share_differing_from_the_environment_is_tamper() {
    let mut snap = snapshot(GIB, vec![slot(0, 10, 110, 300 * MIB, 0)]);
    snap.compute[0].sm_limit = 90; // a tenant raised its share in the file
    let r = region(snap, &[(0, SlotLiveness::Alive { host_pid: 10 })]);
    let mut p = proc_(10, true, 0);
    p.env_limits.compute = compute(&[("CUDA_DEVICE_SM_LIMIT", "30")]);
    let f = evaluate(&[p.clone()], &[r.clone()], Tolerance::default());
    assert_eq!(
        kinds(&f),
        vec![(FindingKind::Tamper, reason::COMPUTE_LIMIT_DIFFERS_FROM_ENV)]
    );
    assert_eq!(
        (f[0].device, f[0].limit, f[0].pid),
        (Some(0), Some(90), Some(10))
    );
    assert!(
        f[0].detail.contains("90 %") && f[0].detail.contains("sets 30 %"),
        "{}",
        f[0].detail
    );
    assert!(!f[0].needs_settle());
    // The same share: nothing. 100 in the region and no variable: both "no limit".
    let mut same = r.clone();
    same.snapshot.compute[0].sm_limit = 30;
    assert!(evaluate(&[p.clone()], &[same.clone()], Tolerance::default()).is_empty());
    let mut whole = r.clone();
    whole.snapshot.compute[0].sm_limit = 100;
    let unset = proc_(10, true, 0);
    assert!(evaluate(&[unset], &[whole], Tolerance::default()).is_empty());
    // A malformed value or control turned off is not compared; nor is an unhooked process.
    let mut malformed = p.clone();
    malformed.env_limits.compute = compute(&[("CUDA_DEVICE_SM_LIMIT", "30%")]);
    assert!(evaluate(&[malformed], &[r.clone()], Tolerance::default()).is_empty());
    let mut off = p.clone();
    off.env_limits.compute = compute(&[
        ("CUDA_DEVICE_SM_LIMIT", "30"),
        ("CUDA_DISABLE_CONTROL", "true"),
    ]);
    assert!(evaluate(&[off], &[r.clone()], Tolerance::default()).is_empty());
    let mut unhooked = p.clone();
    unhooked.hooked = false;
    assert!(evaluate(&[unhooked], &[r.clone()], Tolerance::default())
        .iter()
        .all(|f| f.kind != FindingKind::Tamper));
    // Policy disable in the environment, a share in the region: tamper too.
    let mut disabled = p;
    disabled.env_limits.compute = compute(&[
        ("CUDA_DEVICE_SM_LIMIT", "30"),
        ("GPU_CORE_UTILIZATION_POLICY", "disable"),
    ]);
    let f = evaluate(&[disabled], &[same], Tolerance::default());
    assert_eq!(
        kinds(&f),
        vec![(FindingKind::Tamper, reason::COMPUTE_LIMIT_DIFFERS_FROM_ENV)]
    );
}
