//! Findings: hooked, bypass, over limit, leaked slots and reclaim, tamper, baseline.

use super::*;

#[test]
fn hooked_process_within_quota_has_no_finding() {
    let w = World::new();
    w.spawn(100, 7, true, "1g");
    let r = w.region(100, 1 << 30, &[]);
    register(&r, 100, 7, 64 * MIB);
    let mut a = w.agent(false);
    a.on_event(&ev(EventKind::MemAlloc, 100, 64 * MIB, 0x7000, 0));
    let out = a.tick(Instant::now());
    assert!(out.raised.is_empty(), "{:?}", out.raised);
    let rows = a.process_rows();
    assert_eq!(rows.len(), 1);
    let row = &rows[0];
    assert_eq!(row.container, CID);
    assert_eq!(row.nspid, Some(7));
    assert_eq!(row.hooked, Some(true));
    assert_eq!(row.region.as_deref(), Some("/hami/r.cache"));
    assert_eq!(row.accounted, Some(64 * MIB));
    assert_eq!(row.observed, 64 * MIB);
    assert_eq!(row.accounted_total, Some(74 * MIB));
    assert_eq!(row.limit, Some(1 << 30));
    assert_eq!(row.verdict, "ok");
    let u = a.usage();
    assert_eq!(u[0].observed, 64 * MIB);
    assert_eq!(u[0].accounted_data, 64 * MIB);
}

#[test]
fn unhooked_process_is_bypass_and_container_over_limit() {
    let w = World::new();
    w.spawn(100, 7, true, "100m");
    w.spawn(101, 8, false, "100m");
    let r = w.region(100, 100 * MIB, &[101]);
    register(&r, 100, 7, 60 * MIB);
    let mut a = w.agent(false);
    a.on_event(&ev(EventKind::MemAlloc, 100, 60 * MIB, 0x7000, 0));
    a.on_event(&ev(EventKind::MemAlloc, 101, 80 * MIB, 0x9000, 0));
    let out = a.tick(Instant::now());
    assert_eq!(
        kinds(&out.raised),
        vec![
            (FindingKind::Bypass, findings::reason::NO_PRELOAD),
            (
                FindingKind::OverLimit,
                findings::reason::OBSERVED_ABOVE_LIMIT
            ),
        ]
    );
    let b = out
        .raised
        .iter()
        .find(|f| f.kind == FindingKind::Bypass)
        .unwrap();
    assert_eq!(b.pid, Some(101));
    assert_eq!(b.bytes, 80 * MIB);
    assert_eq!(b.container, CID);
    // Standing findings are raised once; freeing clears the bypass's bytes but the
    // process stays a bypass (it allocated without the preload).
    assert!(a.tick(Instant::now()).raised.is_empty());
    a.on_event(&ev(EventKind::MemFree, 101, 0, 0x9000, 0));
    let out = a.tick(Instant::now());
    assert_eq!(
        kinds(&out.cleared),
        vec![(
            FindingKind::OverLimit,
            findings::reason::OBSERVED_ABOVE_LIMIT
        )]
    );
    let rows = a.process_rows();
    let r101 = rows.iter().find(|r| r.pid == 101).unwrap();
    assert_eq!(r101.verdict, "bypass");
    assert_eq!(r101.hooked, Some(false));
    // Exit drops it.
    a.on_event(&ev(EventKind::ProcessExit, 101, 0, 0, 0));
    assert_eq!(a.process_count(), 1);
    let out = a.tick(Instant::now());
    assert_eq!(
        kinds(&out.cleared),
        vec![(FindingKind::Bypass, findings::reason::NO_PRELOAD)]
    );
    assert_eq!(a.history().len(), 2);
}

/// Regression: a container whose region variable names a FIFO stalled the agent for
/// good (a read-only `open` of a FIFO waits for a writer; with `--reclaim` the writable
/// open failed and the read-only fallback blocked).
#[test]
fn region_path_at_a_fifo_is_an_error_not_a_hang() {
    let w = World::new();
    w.spawn(100, 7, true, "1g");
    let path = w.root.join("100/root/hami/r.cache");
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let c = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: c is a valid C string.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let d = std::sync::Arc::clone(&done);
    std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(20));
        if !d.load(std::sync::atomic::Ordering::SeqCst) {
            eprintln!("the agent's tick hung on a FIFO region path");
            std::process::abort();
        }
    });
    for reclaim in [false, true] {
        let mut a = w.agent(reclaim);
        a.on_event(&ev(EventKind::MemAlloc, 100, 64 * MIB, 0x7000, 0));
        a.tick(Instant::now());
        assert!(a.region_rows().is_empty());
        assert_eq!(a.process_count(), 1);
    }
    done.store(true, std::sync::atomic::Ordering::SeqCst);
}

#[test]
fn killed_process_leaks_its_slot_and_reclaim_frees_it() {
    let w = World::new();
    w.spawn(100, 7, true, "1g");
    let r = w.region(100, 1 << 30, &[]);
    register(&r, 100, 7, 512 * MIB);
    let mut a = w.agent(true);
    a.on_event(&ev(EventKind::MemAlloc, 100, 512 * MIB, 0x7000, 0));
    assert!(a.tick(Instant::now()).raised.is_empty());
    // SIGKILL: no exit handler ran; the slot still holds the memory.
    w.kill(100);
    let out = a.tick(Instant::now());
    assert_eq!(
        kinds(&out.raised),
        vec![(FindingKind::LeakedSlot, findings::reason::PROCESS_DEAD)]
    );
    assert_eq!(out.raised[0].bytes, 522 * MIB);
    assert_eq!(out.raised[0].nspid, Some(7));
    assert_eq!(out.reclaimed.len(), 1);
    assert_eq!(out.reclaimed[0].bytes, 522 * MIB);
    let snap = r.snapshot();
    assert!(snap.slots.is_empty());
    assert_eq!(snap.used[0], 0);
    // A new process can use the whole quota.
    w.spawn(102, 9, true, "1g");
    let s = register(&r, 102, 9, 0);
    r.try_charge(s, 0, UsageKind::Data, (1 << 30) - 10 * MIB)
        .unwrap();
    assert!(a.tick(Instant::now()).raised.is_empty());
    assert_eq!(a.reclaimed().len(), 1);
}

/// Each standing finding carries its workload's names (for `hami_finding`): a process's from
/// its container (the kubelet's log link), a leaked slot's (its process is gone) from its
/// region's; a finding that clears leaves the list.
#[test]
fn standing_findings_carry_their_workloads_names() {
    let w = World::new();
    let logs = w._tmp.path().join("var-log/containers");
    std::fs::create_dir_all(&logs).unwrap();
    std::fs::write(logs.join(format!("trainer-0_ml_main-{CID}.log")), "").unwrap();
    w.spawn(100, 7, true, "1g");
    w.spawn(101, 8, false, "1g");
    let r = w.region(100, 1 << 30, &[101]);
    register(&r, 100, 7, 64 * MIB);
    let mut a = Agent::new(AgentOptions {
        proc_root: w.root.clone(),
        settle: Duration::from_millis(0),
        log_root: w._tmp.path().join("var-log"),
        ..Default::default()
    });
    a.on_event(&ev(EventKind::MemAlloc, 100, 64 * MIB, 0x7000, 0));
    a.on_event(&ev(EventKind::MemAlloc, 101, 16 * MIB, 0x9000, 0));
    a.tick(Instant::now());
    // SIGKILL: the slot leaks; its finding has no live process, only the region.
    w.kill(100);
    let out = a.tick(Instant::now());
    let leak = out
        .raised
        .iter()
        .find(|f| f.kind == FindingKind::LeakedSlot)
        .expect("leaked slot");
    assert_eq!(leak.pid, None);
    let names = |a: &Agent| {
        let mut v: Vec<_> = a
            .finding_series()
            .into_iter()
            .map(|f| {
                let i = f.identity;
                (f.kind, f.reason, i.namespace, i.pod, i.container)
            })
            .collect();
        v.sort();
        v
    };
    let ml = |k, r: &'static str| {
        (
            k,
            r,
            "ml".to_string(),
            "trainer-0".to_string(),
            "main".to_string(),
        )
    };
    assert_eq!(
        names(&a),
        vec![
            ml(FindingKind::Bypass, findings::reason::NO_PRELOAD),
            ml(FindingKind::LeakedSlot, findings::reason::PROCESS_DEAD),
        ]
    );
    // The bypass exits: only the leak stands.
    a.on_event(&ev(EventKind::ProcessExit, 101, 0, 0, 0));
    a.tick(Instant::now());
    assert_eq!(
        names(&a),
        vec![ml(FindingKind::LeakedSlot, findings::reason::PROCESS_DEAD)]
    );
}

#[test]
fn reclaim_never_touches_a_live_process() {
    let w = World::new();
    w.spawn(100, 7, true, "1g");
    let r = w.region(100, 1 << 30, &[]);
    register(&r, 100, 7, 64 * MIB);
    let mut a = w.agent(true);
    // The agent sees no allocation: a fully observed live process with usage but no
    // allocations is reported, but never reclaimed.
    a.on_event(&ev(EventKind::CtxSetCurrent, 100, 0, 0xc, 0));
    let out = a.tick(Instant::now());
    assert_eq!(
        kinds(&out.raised),
        vec![(
            FindingKind::LeakedSlot,
            findings::reason::USAGE_WITHOUT_ALLOCATIONS
        )]
    );
    assert!(out.reclaimed.is_empty());
    assert_eq!(r.snapshot().slots.len(), 1);
}

#[test]
fn hand_edited_limit_is_tamper() {
    let w = World::new();
    w.spawn(100, 7, true, "1g");
    let r = w.region(100, 1 << 30, &[]);
    register(&r, 100, 7, 0);
    let mut a = w.agent(false);
    a.on_event(&ev(EventKind::CtxSetCurrent, 100, 0, 0xc, 0));
    assert!(a.tick(Instant::now()).raised.is_empty());
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(w.root.join("100/root/hami/r.cache"))
        .unwrap();
    let off = core::mem::offset_of!(RegionHeader, limits) as u64;
    f.write_all_at(&(8u64 << 30).to_le_bytes(), off).unwrap();
    let out = a.tick(Instant::now());
    assert_eq!(
        kinds(&out.raised),
        vec![(
            FindingKind::Tamper,
            findings::reason::LIMIT_DIFFERS_FROM_ENV
        )]
    );
    assert_eq!(out.raised[0].limit, Some(8 << 30));
    assert_eq!(out.raised[0].device, Some(0));
    let _ = MAX_DEVICES;
}

#[test]
fn process_running_before_the_agent_is_baselined_not_bypass() {
    let w = World::new();
    w.spawn(100, 7, true, "1g");
    let r = w.region(100, 1 << 30, &[]);
    register(&r, 100, 7, 500 * MIB);
    let mut a = w.agent(false);
    assert_eq!(a.baseline_scan(), vec![100]);
    // It allocates 10 MiB more after the agent attached, and frees an old buffer.
    a.on_event(&ev(EventKind::MemAlloc, 100, 10 * MIB, 0x7000, 0));
    a.on_event(&ev(EventKind::MemFree, 100, 0, 0x1000, 0));
    let out = a.tick(Instant::now());
    assert!(out.raised.is_empty(), "{:?}", out.raised);
    let row = &a.process_rows()[0];
    assert_eq!(
        row.baseline.as_deref(),
        Some("pre-existing, not observed from start")
    );
    assert_eq!(row.unmatched_frees, 1);
    assert_eq!(row.verdict, "ok");
}
