//! Unit tests of the audit rules, and region/process builders other modules' tests use.
#![allow(clippy::cloned_ref_to_slice_refs, clippy::field_reassign_with_default)]
use super::*;
use crate::access::{Creds, FileMeta};
use crate::compute::ComputeView;
use crate::procinfo::{EnvLimit, EnvLimits};
use hami_abi::layout::{UsageKind, USAGE_KINDS};
use hami_common::region::{RegionSnapshot, SlotSnapshot};

const MIB: u64 = 1 << 20;

mod compute_share;
mod nvml;

pub(crate) fn snapshot(limit0: u64, slots: Vec<SlotSnapshot>) -> RegionSnapshot {
    let mut limits = [0; MAX_DEVICES];
    limits[0] = limit0;
    let mut used = [0; MAX_DEVICES];
    for s in &slots {
        for (d, u) in used.iter_mut().enumerate() {
            *u += s.device_total(d);
        }
    }
    RegionSnapshot {
        version: 1,
        header_size: 0,
        total_size: 0,
        init_state: 2,
        device_count: 1,
        creator_pid: 1,
        created_unix: 0,
        boot_id: [0; 16],
        generation: 0,
        owner_died_recoveries: 0,
        reclaimed_slots: 0,
        stale_lock_breaks: 0,
        reserve_reclaims: 0,
        context_footprint: [0; MAX_DEVICES],
        limits,
        limit_flags: [0; MAX_DEVICES],
        uuids: [[0; 16]; MAX_DEVICES],
        used,
        slots,
        compute: Default::default(),
        arbiter: Default::default(),
        consistent: true,
    }
}

pub(crate) fn slot(index: usize, pid: u32, start: u64, ctx: u64, data: u64) -> SlotSnapshot {
    let mut usage = [[0u64; USAGE_KINDS]; MAX_DEVICES];
    usage[0][UsageKind::Context.index()] = ctx;
    usage[0][UsageKind::Data.index()] = data;
    let mut charged = [0u64; MAX_DEVICES];
    charged[0] = ctx + data;
    SlotSnapshot {
        index,
        pid,
        start_time: start,
        usage,
        charged,
        reserve: [0; MAX_DEVICES],
    }
}

fn region(snap: RegionSnapshot, live: &[(usize, SlotLiveness)]) -> RegionView {
    RegionView {
        name: "/tmp/cudevshr.cache".into(),
        container: "c1".into(),
        snapshot: snap,
        liveness: live.iter().copied().collect(),
        single_device: true,
        node_devices: None,
        file: None,
        nvml: None,
        compute: Vec::new(),
    }
}

fn proc_(pid: u32, hooked: bool, observed: u64) -> ProcView {
    let mut env = EnvLimits::default();
    env.all = Some(EnvLimit::Bytes(1 << 30));
    ProcView {
        pid,
        start_time: 100 + pid as u64,
        nspid: Some(pid),
        container: "c1".into(),
        hooked,
        region: Some(0),
        observed: [(Some(0), observed)].into_iter().collect(),
        alloc_events: u64::from(observed > 0),
        peak_bytes: observed,
        seen_by_events: true,
        env_limits: env,
        ..Default::default()
    }
}

fn kinds(f: &[Finding]) -> Vec<(FindingKind, &'static str)> {
    f.iter().map(|f| (f.kind, f.reason)).collect()
}

#[test]
fn tolerance_is_max_of_floor_and_ratio() {
    let t = Tolerance::default();
    assert_eq!(t.allowance(0, 0), 2 * MIB);
    assert_eq!(t.allowance(1000 * MIB, 10), 10 * MIB);
    assert!(!t.exceeds(2 * MIB, 0));
    assert!(t.exceeds(2 * MIB + 1, 0));
    assert!(!t.exceeds(0, 5 * MIB));
}

#[test]
fn hooked_within_quota_accounted_equals_observed_no_finding() {
    let r = region(
        snapshot(1 << 30, vec![slot(0, 10, 110, 300 * MIB, 64 * MIB)]),
        &[(0, SlotLiveness::Alive { host_pid: 10 })],
    );
    let p = proc_(10, true, 64 * MIB);
    assert!(evaluate(&[p.clone()], &[r.clone()], Tolerance::default()).is_empty());
    let u = region_usage(&[p], &[r]);
    assert_eq!(u.len(), 1);
    assert_eq!(u[0].observed, 64 * MIB);
    assert_eq!(u[0].accounted_data, 64 * MIB);
    assert_eq!(u[0].accounted, 364 * MIB);
    assert_eq!(u[0].limit, 1 << 30);
}

/// Issue 13: a hooked process of another uid than the region's owner, with no slot and a
/// region mode that excludes it, is locked out; the finding names the region, the pid,
/// the uid and why.
#[test]
fn process_that_cannot_write_its_region_is_locked_out() {
    let mut r = region(
        snapshot(1 << 30, vec![slot(0, 10, 110, 0, 64 * MIB)]),
        &[(0, SlotLiveness::Alive { host_pid: 10 })],
    );
    r.file = Some(FileMeta {
        mode: 0o600,
        uid: 0,
        gid: 0,
    });
    let nobody = Creds {
        fsuid: 65534,
        fsgid: 65534,
        groups: vec![],
        cap_eff: 0,
    };
    // Its allocations are refused by the preload: the probes see none.
    let mut p = proc_(12, true, 0);
    p.creds = Some(nobody.clone());
    let f = evaluate(&[p.clone()], &[r.clone()], Tolerance::default());
    assert_eq!(
        kinds(&f),
        vec![(FindingKind::LockedOut, reason::REGION_UNWRITABLE)]
    );
    assert_eq!(f[0].pid, Some(12));
    assert_eq!(f[0].uid, Some(65534));
    assert_eq!(f[0].region.as_deref(), Some("/tmp/cudevshr.cache"));
    assert!(f[0].detail.contains("0600") && f[0].detail.contains("uid 65534"));
    assert!(!FindingKind::LockedOut.is_failure());

    // The same process is fine with the default mode, or in the file's group with 0660.
    let mut open = r.clone();
    open.file = Some(FileMeta {
        mode: 0o666,
        uid: 0,
        gid: 0,
    });
    assert!(evaluate(&[p.clone()], &[open], Tolerance::default()).is_empty());
    let mut grp = r.clone();
    grp.file = Some(FileMeta {
        mode: 0o660,
        uid: 0,
        gid: 65534,
    });
    assert!(evaluate(&[p.clone()], &[grp], Tolerance::default()).is_empty());

    // A process that holds a slot got in (e.g. before a chmod): not locked out.
    let mut in_slot = proc_(10, true, 64 * MIB);
    in_slot.creds = Some(nobody);
    assert!(evaluate(&[in_slot], &[r.clone()], Tolerance::default()).is_empty());

    // Root with CAP_DAC_OVERRIDE writes anything; unknown credentials or metadata: no
    // finding.
    let mut root = p.clone();
    root.creds = Some(Creds {
        cap_eff: 1 << 1,
        ..Creds::default()
    });
    assert!(evaluate(&[root], &[r.clone()], Tolerance::default()).is_empty());
    let mut unknown = p.clone();
    unknown.creds = None;
    assert!(evaluate(&[unknown], &[r.clone()], Tolerance::default()).is_empty());
    r.file = None;
    assert!(evaluate(&[p], &[r], Tolerance::default()).is_empty());
}

#[test]
fn bypass_without_preload_with_pid_and_bytes() {
    let r = region(snapshot(1 << 30, vec![]), &[]);
    let p = proc_(11, false, 64 * MIB);
    let f = evaluate(&[p], &[r], Tolerance::default());
    assert_eq!(kinds(&f), vec![(FindingKind::Bypass, reason::NO_PRELOAD)]);
    assert_eq!(f[0].pid, Some(11));
    assert_eq!(f[0].bytes, 64 * MIB);
    assert!(!f[0].needs_settle());
    // Without any allocation seen, an unhooked process is not reported.
    let idle = proc_(12, false, 0);
    assert!(evaluate(&[idle], &[], Tolerance::default()).is_empty());
}

/// Issue 19: HAMi-core mapped, or unhooked on purpose: the same facts as a bypass give the
/// migration kind or `unhooked`, on every path (events seen, NVML only), with the bytes.
#[test]
fn hami_core_and_unhooked_by_request_take_the_place_of_bypass() {
    type Case = (fn(&mut ProcView), FindingKind, &'static str);
    let cases: [Case; 3] = [
        (
            |p| p.hami_core = true,
            FindingKind::HamiCore,
            reason::HAMI_CORE_MAPPED,
        ),
        (
            |p| p.unhooked_by_request = Some(reason::DISABLE_CONTROL),
            FindingKind::Unhooked,
            reason::DISABLE_CONTROL,
        ),
        (
            |p| p.unhooked_by_request = Some(reason::NAMESPACE_ALLOWLISTED),
            FindingKind::Unhooked,
            reason::NAMESPACE_ALLOWLISTED,
        ),
    ];
    for (set, kind, why) in cases {
        // Allocations seen.
        let mut p = proc_(11, false, 64 * MIB);
        set(&mut p);
        let f = evaluate(&[p], &[], Tolerance::default());
        assert_eq!(kinds(&f), vec![(kind, why)], "{f:?}");
        assert_eq!(f[0].bytes, 64 * MIB);
        assert!(!kind.is_failure());
        // Pre-existing, known from NVML only.
        let mut p = proc_(12, false, 0);
        p.alloc_events = 0;
        p.pre_existing = true;
        p.nvml_bytes = Some(512 * MIB);
        set(&mut p);
        let f = evaluate(&[p], &[], Tolerance::default());
        assert_eq!(kinds(&f), vec![(kind, why)], "{f:?}");
        assert_eq!(f[0].bytes, 512 * MIB);
    }
    // hami-preload mapped but turned off by CUDA_DISABLE_CONTROL (no region, no slot): the
    // same, not a `no_region` / `no_slot` bypass.
    let mut p = proc_(13, true, 64 * MIB);
    p.region = None;
    p.unhooked_by_request = Some(reason::DISABLE_CONTROL);
    let f = evaluate(&[p.clone()], &[], Tolerance::default());
    assert_eq!(
        kinds(&f),
        vec![(FindingKind::Unhooked, reason::DISABLE_CONTROL)],
        "{f:?}"
    );
    // Without the variable that is a bypass.
    p.unhooked_by_request = None;
    let f = evaluate(&[p], &[], Tolerance::default());
    assert_eq!(kinds(&f), vec![(FindingKind::Bypass, reason::NO_REGION)]);
    // A hooked process that holds a slot is judged as before even when it asked to be
    // unhooked (an allowlisted namespace, or a preload that ignores the variable).
    for why in [reason::DISABLE_CONTROL, reason::NAMESPACE_ALLOWLISTED] {
        let s = slot(0, 14, 114, 0, 0);
        let r = region(
            snapshot(1 << 30, vec![s]),
            &[(0, SlotLiveness::Alive { host_pid: 14 })],
        );
        let mut p = proc_(14, true, 64 * MIB);
        p.unhooked_by_request = Some(why);
        let f = evaluate(&[p], &[r], Tolerance::default());
        assert_eq!(
            kinds(&f),
            vec![(FindingKind::Bypass, reason::OBSERVED_ABOVE_ACCOUNTED)],
            "{why}: {f:?}"
        );
    }
}

/// Regression (H200, torch `backend:cudaMallocAsync` under the preload): async
/// allocations are charged to the slot's pool, not its data; the probes' live bytes were
/// compared with data alone and a preloaded process was reported as a bypass.
#[test]
fn async_allocations_charged_to_the_pool_are_no_bypass() {
    let mut s = slot(0, 13, 113, 0, 0);
    s.usage[0][UsageKind::Pool.index()] = 1024 * MIB;
    let r = region(
        snapshot(1 << 30, vec![s]),
        &[(0, SlotLiveness::Alive { host_pid: 13 })],
    );
    // 1 GiB live from the pool: inside data + pool.
    let f = evaluate(
        &[proc_(13, true, 1024 * MIB)],
        &[r.clone()],
        Tolerance::default(),
    );
    assert!(f.is_empty(), "{f:?}");
    // The pool keeps its reserve after the free: the probes see 0 live, no finding either
    // (a reserve above the live allocations is not drift).
    let f = evaluate(&[proc_(13, true, 0)], &[r.clone()], Tolerance::default());
    assert!(f.is_empty(), "{f:?}");
    // Beyond data + pool it is still a bypass.
    let f = evaluate(&[proc_(13, true, 2048 * MIB)], &[r], Tolerance::default());
    let bypass = f
        .iter()
        .find(|f| f.reason == reason::OBSERVED_ABOVE_ACCOUNTED)
        .expect("bypass beyond data + pool");
    assert_eq!(bypass.kind, FindingKind::Bypass);
    assert_eq!(bypass.bytes, 1024 * MIB);
}

#[test]
fn bypass_no_slot_no_region_and_observed_above_accounted() {
    let r = region(
        snapshot(1 << 30, vec![slot(0, 13, 113, 0, 10 * MIB)]),
        &[(0, SlotLiveness::Alive { host_pid: 13 })],
    );
    // Slot exists but accounts 10 MiB while 64 MiB are live.
    let f = evaluate(
        &[proc_(13, true, 64 * MIB)],
        &[r.clone()],
        Tolerance::default(),
    );
    assert_eq!(
        kinds(&f),
        vec![(FindingKind::Bypass, reason::OBSERVED_ABOVE_ACCOUNTED)]
    );
    assert_eq!(f[0].bytes, 54 * MIB);
    assert_eq!(f[0].accounted, Some(10 * MIB));
    assert!(f[0].needs_settle());
    // Hooked but no slot with its pid.
    let f = evaluate(
        &[proc_(14, true, 8 * MIB)],
        &[r.clone()],
        Tolerance::default(),
    );
    assert_eq!(kinds(&f), vec![(FindingKind::Bypass, reason::NO_SLOT)]);
    // A slot with the same pid but another start time is not its slot.
    let mut p = proc_(13, true, 8 * MIB);
    p.start_time = 999;
    let f = evaluate(&[p], &[r], Tolerance::default());
    assert_eq!(kinds(&f), vec![(FindingKind::Bypass, reason::NO_SLOT)]);
    // Hooked without region.
    let mut p = proc_(15, true, 8 * MIB);
    p.region = None;
    p.region_error = Some("permission denied".into());
    let f = evaluate(&[p], &[], Tolerance::default());
    assert_eq!(kinds(&f), vec![(FindingKind::Bypass, reason::NO_REGION)]);
    assert!(f[0].detail.contains("permission denied"));
}

#[test]
fn leaked_slots_dead_reused_and_usage_without_allocations() {
    let r = region(
        snapshot(
            1 << 30,
            vec![
                slot(0, 20, 120, MIB, 32 * MIB),
                slot(1, 21, 121, MIB, 0),
                slot(2, 22, 122, 0, 16 * MIB),
                slot(3, 23, 123, 0, 16 * MIB),
            ],
        ),
        &[
            (0, SlotLiveness::Dead),
            (
                1,
                SlotLiveness::Reused {
                    host_pid: 21,
                    start_time: 5000,
                },
            ),
            (2, SlotLiveness::Alive { host_pid: 22 }),
            (3, SlotLiveness::Unknown),
        ],
    );
    let p22 = proc_(22, true, 0);
    let f = evaluate(&[p22.clone()], &[r.clone()], Tolerance::default());
    let mut k = kinds(&f);
    k.sort();
    assert_eq!(
        k,
        vec![
            (FindingKind::LeakedSlot, reason::PID_REUSED),
            (FindingKind::LeakedSlot, reason::PROCESS_DEAD),
            (FindingKind::LeakedSlot, reason::USAGE_WITHOUT_ALLOCATIONS),
        ]
    );
    let dead = f.iter().find(|f| f.reason == reason::PROCESS_DEAD).unwrap();
    assert_eq!(dead.slot, Some(0));
    assert_eq!(dead.bytes, 33 * MIB);
    assert_eq!(dead.nspid, Some(20));
    // A pre-existing process is never reported for usage the agent could not see.
    let mut pre = p22;
    pre.pre_existing = true;
    let f = evaluate(&[pre], &[r], Tolerance::default());
    assert!(f
        .iter()
        .all(|f| f.reason != reason::USAGE_WITHOUT_ALLOCATIONS));
}

#[test]
fn over_limit_sums_the_container_including_unknown_device_on_single_gpu() {
    let r = region(
        snapshot(100 * MIB, vec![slot(0, 30, 130, 0, 60 * MIB)]),
        &[(0, SlotLiveness::Alive { host_pid: 30 })],
    );
    let mut hooked = proc_(30, true, 60 * MIB);
    hooked.env_limits.all = Some(EnvLimit::Bytes(100 * MIB));
    let mut rogue = proc_(31, false, 0);
    rogue.observed = [(None, 80 * MIB)].into_iter().collect();
    rogue.alloc_events = 1;
    let f = evaluate(&[hooked, rogue], &[r], Tolerance::default());
    let mut k = kinds(&f);
    k.sort();
    assert_eq!(
        k,
        vec![
            (FindingKind::Bypass, reason::NO_PRELOAD),
            (FindingKind::OverLimit, reason::OBSERVED_ABOVE_LIMIT),
        ]
    );
    let o = f.iter().find(|f| f.kind == FindingKind::OverLimit).unwrap();
    assert_eq!(o.observed, Some(140 * MIB));
    assert_eq!(o.limit, Some(100 * MIB));
    assert_eq!(o.bytes, 40 * MIB);
    assert_eq!(o.device, Some(0));
    assert!(o.detail.contains("30,31"));
}

#[test]
fn tamper_when_region_limit_differs_from_env() {
    let mut snap = snapshot(2 << 30, vec![slot(0, 40, 140, 0, 0)]);
    let r = region(snap.clone(), &[(0, SlotLiveness::Alive { host_pid: 40 })]);
    let p = proc_(40, true, 0); // env says 1 GiB
    let f = evaluate(&[p.clone()], &[r], Tolerance::default());
    assert_eq!(
        kinds(&f),
        vec![(FindingKind::Tamper, reason::LIMIT_DIFFERS_FROM_ENV)]
    );
    assert_eq!(f[0].limit, Some(2 << 30));
    assert_eq!(f[0].device, Some(0));
    // Same limit: nothing.
    snap.limits[0] = 1 << 30;
    let r = region(snap.clone(), &[(0, SlotLiveness::Alive { host_pid: 40 })]);
    assert!(evaluate(&[p.clone()], &[r], Tolerance::default()).is_empty());
    // Invalid env but a valid region limit.
    let mut bad = p;
    bad.env_limits.all = Some(EnvLimit::Invalid);
    let r = region(snap, &[(0, SlotLiveness::Alive { host_pid: 40 })]);
    let f = evaluate(&[bad], &[r], Tolerance::default());
    assert_eq!(
        kinds(&f),
        vec![(FindingKind::Tamper, reason::ENV_INVALID_REGION_VALID)]
    );
}

#[test]
fn drift_only_for_fully_observed_processes() {
    let r = region(
        snapshot(1 << 30, vec![slot(0, 50, 150, 0, 100 * MIB)]),
        &[(0, SlotLiveness::Alive { host_pid: 50 })],
    );
    let p = proc_(50, true, 40 * MIB);
    let f = evaluate(&[p.clone()], &[r.clone()], Tolerance::default());
    assert_eq!(
        kinds(&f),
        vec![(FindingKind::Drift, reason::ACCOUNTED_ABOVE_OBSERVED)]
    );
    assert_eq!(f[0].observed, Some(40 * MIB));
    assert_eq!(f[0].accounted, Some(100 * MIB));
    assert_eq!(f[0].bytes, 60 * MIB);
    // Within tolerance: nothing.
    let close = proc_(50, true, 99 * MIB);
    assert!(evaluate(&[close], &[r.clone()], Tolerance::default()).is_empty());
    // Baseline: a process running before the agent is not drift (nor bypass).
    let mut pre = p;
    pre.pre_existing = true;
    assert!(evaluate(&[pre], &[r], Tolerance::default()).is_empty());
}

#[test]
fn pre_existing_hooked_process_started_before_agent_is_not_bypass() {
    // The workload allocated 500 MiB before the agent started, 10 MiB after.
    let r = region(
        snapshot(1 << 30, vec![slot(0, 60, 160, 0, 510 * MIB)]),
        &[(0, SlotLiveness::Alive { host_pid: 60 })],
    );
    let mut p = proc_(60, true, 10 * MIB);
    p.pre_existing = true;
    assert!(evaluate(&[p], &[r], Tolerance::default()).is_empty());
}

#[test]
fn usage_rows_follow_the_node_gpus_not_the_region_device_count() {
    // The preload records 16 configured devices when a global limit is set.
    let mut snap = snapshot(1 << 30, vec![slot(0, 70, 170, 0, 8 * MIB)]);
    snap.device_count = 16;
    for l in snap.limits.iter_mut() {
        *l = 1 << 30;
    }
    let mut r = region(snap, &[(0, SlotLiveness::Alive { host_pid: 70 })]);
    assert_eq!(region_usage(&[], std::slice::from_ref(&r)).len(), 16);
    r.node_devices = Some(1);
    let u = region_usage(&[], &[r]);
    assert_eq!(u.len(), 1);
    assert_eq!(u[0].accounted_data, 8 * MIB);
}

const GIB: u64 = 1 << 30;

#[test]
fn human_sizes() {
    assert_eq!(human_bytes(12), "12 B");
    assert_eq!(human_bytes(1536), "1.5 KiB");
    assert_eq!(human_bytes(64 * MIB), "64.0 MiB");
}
