//! NVML cross-checks, the settle time and early ticks.

use super::*;

#[test]
fn unhooked_process_listed_by_nvml_is_learned_and_reported_at_once() {
    let w = World::new();
    w.spawn(100, 7, true, "1g");
    w.spawn(101, 8, false, "1g");
    let r = w.region(100, 1 << 30, &[101]);
    register(&r, 100, 7, 0);
    let mut a = w.agent(false);
    // A pid NVML names that is not a CUDA process here (no libcuda mapped): left alone.
    fake_proc(&w.root, 102, 5102, &[102], NS, "0::/\n", &[], &[]);
    // No libcuda event, no baseline scan: only NVML knows it holds 512 MiB.
    a.set_nvml(Some(nvml_sample(&[
        (100, 10 * MIB),
        (101, 512 * MIB),
        (102, 64 * MIB),
    ])));
    assert_eq!(a.process_count(), 2);
    let out = a.tick(Instant::now());
    assert_eq!(
        kinds(&out.raised),
        vec![(FindingKind::Bypass, findings::reason::NO_PRELOAD)]
    );
    assert_eq!(out.raised[0].pid, Some(101));
    assert_eq!(out.raised[0].bytes, 512 * MIB);
    assert_eq!(out.raised[0].container, CID);
    let row = a.process_rows().into_iter().find(|r| r.pid == 101).unwrap();
    assert_eq!(row.nvml, Some(512 * MIB));
    assert_eq!(row.verdict, "bypass");
}

#[test]
fn without_nvml_an_unhooked_pre_existing_process_is_unverified() {
    let w = World::new();
    w.spawn(101, 8, false, "1g");
    let mut a = w.agent(false);
    a.set_nvml(None);
    assert_eq!(a.baseline_scan(), vec![101]);
    assert!(a.tick(Instant::now()).raised.is_empty());
    assert_eq!(a.process_rows()[0].verdict, "unverified");
    // With NVML listing nothing for it, it is known to hold nothing.
    a.set_nvml(Some(nvml_sample(&[])));
    a.tick(Instant::now());
    assert_eq!(a.process_rows()[0].verdict, "ok");
}

#[test]
fn nvml_drift_needs_two_samples_and_clears_when_accounted() {
    let w = World::new();
    w.spawn(100, 7, true, "1g");
    let r = w.region(100, 1 << 30, &[]);
    let s = register(&r, 100, 7, 64 * MIB);
    let mut a = w.agent(false);
    a.on_event(&ev(EventKind::MemAlloc, 100, 64 * MIB, 0x7000, 0));
    // The region accounts 10 MiB context + 64 MiB; NVML says 1.5 GiB more.
    let blind = 74 * MIB + 1536 * MIB;
    a.set_nvml(Some(nvml_sample(&[(100, blind)])));
    let t0 = Instant::now();
    assert!(a.tick(t0).raised.is_empty(), "one sample is not enough");
    assert!(a.tick(t0 + Duration::from_secs(1)).raised.is_empty());
    a.set_nvml(Some(nvml_sample(&[(100, blind)])));
    let out = a.tick(t0 + Duration::from_secs(2));
    assert_eq!(
        kinds(&out.raised),
        vec![
            (FindingKind::OverLimit, findings::reason::NVML_ABOVE_LIMIT),
            (FindingKind::Drift, findings::reason::NVML_ABOVE_ACCOUNTED),
        ]
    );
    let d = out
        .raised
        .iter()
        .find(|f| f.kind == FindingKind::Drift)
        .unwrap();
    assert_eq!(d.bytes, 1536 * MIB);
    assert_eq!(d.accounted, Some(74 * MIB));
    let rows = a.process_rows();
    assert_eq!(rows[0].verdict, "drift,over_limit");
    // The preload learns to charge it (as module memory here): the next sample agrees.
    r.force_charge(s, 0, UsageKind::Module, 1536 * MIB);
    a.set_nvml(Some(nvml_sample(&[(100, blind)])));
    let out = a.tick(t0 + Duration::from_secs(3));
    assert_eq!(
        kinds(&out.cleared),
        vec![(FindingKind::Drift, findings::reason::NVML_ABOVE_ACCOUNTED)]
    );
    // A single sample that disagrees again is not reported.
    a.set_nvml(Some(nvml_sample(&[(100, blind + (1 << 30))])));
    let out = a.tick(t0 + Duration::from_secs(4));
    assert!(
        out.raised.iter().all(|f| f.kind != FindingKind::Drift),
        "{:?}",
        out.raised
    );
}

#[test]
fn racy_findings_wait_for_the_settle_time() {
    let w = World::new();
    w.spawn(100, 7, true, "1g");
    let r = w.region(100, 1 << 30, &[]);
    let s = register(&r, 100, 7, 0);
    let mut a = Agent::new(AgentOptions {
        proc_root: w.root.clone(),
        settle: Duration::from_millis(200),
        ..Default::default()
    });
    // The alloc returned before the preload charged: transiently above accounted.
    a.on_event(&ev(EventKind::MemAlloc, 100, 64 * MIB, 0x7000, 0));
    let t0 = Instant::now();
    assert!(a.tick(t0).raised.is_empty());
    r.try_charge(s, 0, UsageKind::Data, 64 * MIB).unwrap();
    assert!(a.tick(t0 + Duration::from_millis(300)).raised.is_empty());
    // A real one persists.
    a.on_event(&ev(EventKind::MemAlloc, 100, 64 * MIB, 0x8000, 0));
    assert!(a.tick(t0 + Duration::from_millis(400)).raised.is_empty());
    let out = a.tick(t0 + Duration::from_millis(700));
    assert_eq!(
        kinds(&out.raised),
        vec![(
            FindingKind::Bypass,
            findings::reason::OBSERVED_ABOVE_ACCOUNTED
        )]
    );
}

/// A process first seen allocating without the preload asks for an early tick (its bypass
/// is reported at once, not at the next periodic tick); a hooked one does not, nor do later
/// allocations of a process already known; the tick clears the request.
#[test]
fn a_new_unhooked_allocating_process_asks_for_an_early_tick() {
    let w = World::new();
    w.spawn(100, 7, true, "1g");
    w.spawn(200, 8, false, "1g");
    let r = w.region(100, 1 << 30, &[]);
    register(&r, 100, 7, 64 * MIB);
    let mut a = w.agent(false);
    a.on_event(&ev(EventKind::MemAlloc, 100, 64 * MIB, 0x7000, 0));
    assert!(!a.wants_early_tick(), "hooked");
    a.on_event(&ev(EventKind::MemAlloc, 200, 8 * MIB, 0x9000, 0));
    assert!(a.wants_early_tick(), "new and unhooked");
    let out = a.tick(Instant::now());
    assert!(!a.wants_early_tick(), "cleared by the tick");
    assert_eq!(
        kinds(&out.raised),
        vec![(FindingKind::Bypass, findings::reason::NO_PRELOAD)]
    );
    a.on_event(&ev(EventKind::MemAlloc, 200, 8 * MIB, 0xa000, 0));
    assert!(!a.wants_early_tick(), "already known");
}
