//! The rules against NVML's per-process figures: tolerance, bypasses NVML sees, drift and
//! over-limit a blind preload misses, the NVML devices matched through the region.

use super::*;

/// `r` with an NVML pairing: the region as it is, device 0 at NVML index `idx`.
fn with_nvml(mut r: RegionView, idx: u32) -> RegionView {
    let mut device_index = [None; MAX_DEVICES];
    device_index[0] = Some(idx);
    r.nvml = Some(RegionNvml {
        snapshot: r.snapshot.clone(),
        device_index,
    });
    r
}

fn with_nvml_bytes(mut p: ProcView, idx: u32, bytes: u64) -> ProcView {
    p.nvml_bytes = Some(bytes);
    p.nvml_devices = [(idx, bytes)].into_iter().collect();
    p
}

#[test]
fn nvml_tolerance_default_is_64_mib_or_2_percent() {
    let t = Tolerance::NVML_DEFAULT;
    assert_eq!(t.allowance(0, 0), 64 * MIB);
    assert_eq!(t.allowance(10 * GIB, 0), (10 * GIB) / 50);
    assert!(!t.exceeds(600 * MIB, 540 * MIB));
    assert!(t.exceeds(605 * MIB, 540 * MIB));
}

#[test]
fn unhooked_process_holding_memory_per_nvml_is_bypass_whenever_it_started() {
    let r = region(snapshot(GIB, vec![]), &[]);
    // Running before the agent, no allocation seen since: NVML says it holds 1.5 GiB.
    let mut pre = with_nvml_bytes(proc_(12, false, 0), 0, 1536 * MIB);
    pre.pre_existing = true;
    pre.seen_by_events = false;
    let f = evaluate(&[pre.clone()], &[r.clone()], Tolerance::default());
    assert_eq!(kinds(&f), vec![(FindingKind::Bypass, reason::NO_PRELOAD)]);
    assert_eq!(f[0].pid, Some(12));
    assert_eq!(f[0].bytes, 1536 * MIB);
    assert!(f[0].detail.contains("pre-existing"), "{}", f[0].detail);
    assert!(!f[0].needs_settle() && !f[0].needs_nvml_confirmation());
    assert!(f[0].kind.is_failure());
    // Started under the agent, only a context (no allocation event): still a bypass.
    let mut fresh = with_nvml_bytes(proc_(13, false, 0), 0, 300 * MIB);
    fresh.seen_by_events = true;
    let f = evaluate(&[fresh], &[r.clone()], Tolerance::default());
    assert_eq!(kinds(&f), vec![(FindingKind::Bypass, reason::NO_PRELOAD)]);
    assert_eq!(f[0].bytes, 300 * MIB);
    // NVML lists nothing for it: nothing to report.
    let idle = with_nvml_bytes(proc_(14, false, 0), 0, 0);
    assert!(evaluate(&[idle], &[r.clone()], Tolerance::default()).is_empty());
    // No NVML: the probes' rule alone (a pre-existing process that allocates nothing
    // after attach cannot be judged).
    pre.nvml_bytes = None;
    pre.nvml_devices.clear();
    assert!(evaluate(&[pre], &[r], Tolerance::default()).is_empty());
}

#[test]
fn nvml_above_accounted_and_over_limit_catch_a_blind_preload() {
    // The region says 300 MiB context + 256 MiB data; the probes agree on the data; NVML
    // says 1.5 GiB more (memory the preload never saw: a pool's reserve, a module's
    // globals, a mipmapped array).
    let snap = snapshot(GIB, vec![slot(0, 50, 150, 300 * MIB, 256 * MIB)]);
    let r = with_nvml(
        region(snap, &[(0, SlotLiveness::Alive { host_pid: 50 })]),
        0,
    );
    let held = 556 * MIB + 1536 * MIB;
    let mut p = with_nvml_bytes(proc_(50, true, 256 * MIB), 0, held);
    let f = evaluate(&[p.clone()], &[r.clone()], Tolerance::default());
    let mut k = kinds(&f);
    k.sort();
    assert_eq!(
        k,
        vec![
            (FindingKind::OverLimit, reason::NVML_ABOVE_LIMIT),
            (FindingKind::Drift, reason::NVML_ABOVE_ACCOUNTED),
        ]
    );
    let d = f.iter().find(|f| f.kind == FindingKind::Drift).unwrap();
    assert_eq!(
        (d.pid, d.device, d.slot, d.bytes, d.observed, d.accounted),
        (
            Some(50),
            Some(0),
            Some(0),
            1536 * MIB,
            Some(held),
            Some(556 * MIB)
        )
    );
    assert!(d.needs_settle() && d.needs_nvml_confirmation());
    let o = f.iter().find(|f| f.kind == FindingKind::OverLimit).unwrap();
    assert_eq!(
        (o.bytes, o.observed, o.limit),
        (held - GIB, Some(held), Some(GIB))
    );
    assert_eq!(o.accounted, Some(556 * MIB));
    assert!(o.detail.contains("50: 2.0 GiB"), "{}", o.detail);
    // The baseline does not matter: NVML and the region are complete figures.
    p.pre_existing = true;
    assert_eq!(evaluate(&[p], &[r.clone()], Tolerance::default()).len(), 2);
    // Within the tolerance (64 MiB here): nothing.
    let close = with_nvml_bytes(proc_(50, true, 256 * MIB), 0, 556 * MIB + 60 * MIB);
    assert!(evaluate(&[close], &[r], Tolerance::default()).is_empty());
}

#[test]
fn accounted_above_nvml_is_drift_the_other_way() {
    let snap = snapshot(2 * GIB, vec![slot(0, 51, 151, 300 * MIB, GIB)]);
    let r = with_nvml(
        region(snap, &[(0, SlotLiveness::Alive { host_pid: 51 })]),
        0,
    );
    let mut p = with_nvml_bytes(proc_(51, true, GIB), 0, 300 * MIB);
    p.env_limits.all = Some(EnvLimit::Bytes(2 * GIB));
    let f = evaluate(&[p.clone()], &[r.clone()], Tolerance::default());
    assert_eq!(
        kinds(&f),
        vec![(FindingKind::Drift, reason::ACCOUNTED_ABOVE_NVML)]
    );
    assert_eq!(f[0].bytes, GIB);
    assert!(!f[0].kind.is_failure());
    // Not listed by NVML at all: not compared (NVML may name it by another pid).
    p.nvml_devices.insert(0, 0);
    assert!(evaluate(&[p], &[r], Tolerance::default()).is_empty());
}

#[test]
fn nvml_rules_need_nvml_on_both_sides() {
    let snap = snapshot(GIB, vec![slot(0, 52, 152, 0, 0)]);
    let plain = region(snap, &[(0, SlotLiveness::Alive { host_pid: 52 })]);
    let p = with_nvml_bytes(proc_(52, true, 0), 0, 3 * GIB);
    // The region was opened after the latest NVML sample: compared at the next one.
    assert!(evaluate(&[p.clone()], &[plain.clone()], Tolerance::default()).is_empty());
    // The region's device is not a GPU NVML knows (UUID not found): nothing compared.
    let mut r = with_nvml(plain, 0);
    r.nvml.as_mut().unwrap().device_index[0] = None;
    assert!(evaluate(&[p.clone()], &[r.clone()], Tolerance::default()).is_empty());
    // NVML read the device but has no figure for the process: unknown, not zero.
    r.nvml.as_mut().unwrap().device_index[0] = Some(1);
    let f = evaluate(&[p], &[r], Tolerance::default());
    assert!(f.is_empty(), "{f:?}");
}

#[test]
fn nvml_devices_are_matched_through_the_region_mapping() {
    // Region device 0 is NVML GPU 3 (CUDA_VISIBLE_DEVICES=3). An unhooked process of the
    // container holds 2 GiB there: bypass and, with the hooked one, over the limit.
    let snap = snapshot(GIB, vec![slot(0, 53, 153, 300 * MIB, 0)]);
    let r = with_nvml(
        region(snap, &[(0, SlotLiveness::Alive { host_pid: 53 })]),
        3,
    );
    let hooked = with_nvml_bytes(proc_(53, true, 0), 3, 300 * MIB);
    let rogue = with_nvml_bytes(proc_(54, false, 0), 3, 2 * GIB);
    let mut elsewhere = with_nvml_bytes(proc_(55, true, 0), 0, 8 * GIB);
    elsewhere.region = None;
    elsewhere.region_error = Some("no such file".into());
    let f = evaluate(&[hooked, rogue, elsewhere], &[r], Tolerance::default());
    let mut k: Vec<_> = f.iter().map(|f| (f.kind, f.reason, f.pid)).collect();
    k.sort();
    assert_eq!(
        k,
        vec![
            (FindingKind::Bypass, reason::NO_PRELOAD, Some(54)),
            (FindingKind::OverLimit, reason::NVML_ABOVE_LIMIT, None),
            // Hooked without a usable region: nothing of its 8 GiB is accounted.
            (FindingKind::Drift, reason::NVML_ABOVE_ACCOUNTED, Some(55)),
        ]
    );
    let o = f.iter().find(|f| f.kind == FindingKind::OverLimit).unwrap();
    assert_eq!(o.observed, Some(2 * GIB + 300 * MIB));
    assert!(o.detail.contains("NVML GPU 3"), "{}", o.detail);
}
