//! Unit tests of the audit rules, and region/process builders other modules' tests use.
#![allow(clippy::cloned_ref_to_slice_refs, clippy::field_reassign_with_default)]
use super::*;
use crate::access::{Creds, FileMeta};
use crate::compute::ComputeView;
use crate::procinfo::{EnvLimit, EnvLimits};
use hami_abi::layout::{UsageKind, USAGE_KINDS};
use hami_common::region::{RegionSnapshot, SlotSnapshot};

const MIB: u64 = 1 << 20;

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

#[test]
fn human_sizes() {
    assert_eq!(human_bytes(12), "12 B");
    assert_eq!(human_bytes(1536), "1.5 KiB");
    assert_eq!(human_bytes(64 * MIB), "64.0 MiB");
}

// ---------------------------------------------------------------- compute shares

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
