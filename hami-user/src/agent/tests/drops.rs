//! Lost events and dropped processes, unreadable or unusual region files.

use super::*;

#[test]
fn lost_events_rebuild_from_the_region_and_count_again_after_a_quiet_moment() {
    let w = World::new();
    w.spawn(100, 7, true, "1g");
    let r = w.region(100, 1 << 30, &[]);
    let s = register(&r, 100, 7, 64 * MIB);
    // The free of 0x8000 was dropped: a phantom 32 MiB in the agent's books.
    let evs = [
        ev(EventKind::MemAlloc, 100, 64 * MIB, 0x7000, 0),
        ev(EventKind::MemAlloc, 100, 32 * MIB, 0x8000, 0),
    ];
    // Control: without the drop count, the phantom is a bypass.
    let mut blind = w.agent(false);
    for e in &evs {
        blind.on_event(e);
    }
    assert_eq!(
        kinds(&blind.tick(Instant::now()).raised),
        vec![(
            FindingKind::Bypass,
            findings::reason::OBSERVED_ABOVE_ACCOUNTED
        )]
    );
    let mut a = w.agent(false);
    for e in &evs {
        a.on_event(e);
    }
    assert!(a.note_dropped(5));
    assert!(!a.note_dropped(5), "same total: nothing new");
    let out = a.tick(Instant::now());
    assert!(out.raised.is_empty(), "{:?}", out.raised);
    let row = &a.process_rows()[0];
    assert_eq!(row.observed, 64 * MIB, "rebuilt from the region");
    assert_eq!(row.accounted, Some(64 * MIB));
    assert!(row
        .events_lost
        .as_deref()
        .is_some_and(|n| n.contains("events lost")));
    // Quiet moment: the process frees everything; the region says 0 data.
    r.uncharge(s, 0, UsageKind::Data, 64 * MIB);
    assert!(a.tick(Instant::now()).raised.is_empty());
    let row = &a.process_rows()[0];
    assert_eq!(row.events_lost, None);
    assert_eq!(row.observed, 0);
    // A stale queued event (stamped before the rebuild) is ignored; new ones count.
    a.on_event(&ev(EventKind::MemAlloc, 100, 8 * MIB, 0x9000, 0));
    assert_eq!(a.process_rows()[0].observed, 0);
    a.on_event(&ev_now(EventKind::MemAlloc, 100, 16 * MIB, 0xa000));
    let out = a.tick(Instant::now());
    assert_eq!(
        kinds(&out.raised),
        vec![(
            FindingKind::Bypass,
            findings::reason::OBSERVED_ABOVE_ACCOUNTED
        )]
    );
}

#[test]
fn process_learned_after_drops_that_started_before_is_marked() {
    let w = World::new();
    w.spawn(100, 7, true, "1g");
    let r = w.region(100, 1 << 30, &[]);
    register(&r, 100, 7, 64 * MIB);
    let mut a = w.agent(false);
    // The fake processes started at tick 5100, long before "now".
    a.note_dropped(1);
    a.on_event(&ev(EventKind::MemAlloc, 100, 96 * MIB, 0x7000, 0));
    assert!(a.tick(Instant::now()).raised.is_empty());
    assert!(a.process_rows()[0].events_lost.is_some());
}

#[test]
fn process_whose_every_event_was_dropped_is_found_after_the_drops() {
    let w = World::new();
    w.spawn(100, 7, false, "1g");
    let mut a = w.agent(false);
    a.started_at = Some(1); // it started after the agent
    assert!(a.tick(Instant::now()).raised.is_empty());
    assert!(a.process_rows().is_empty(), "no event: unknown");
    a.note_dropped(10);
    let out = a.tick(Instant::now());
    assert_eq!(
        kinds(&out.raised),
        vec![(FindingKind::Bypass, findings::reason::NO_PRELOAD)]
    );
    let rows = a.process_rows();
    assert_eq!(rows.len(), 1);
    assert!(rows[0].events_lost.is_some());
    assert!(rows[0]
        .baseline
        .as_deref()
        .is_some_and(|b| b.contains("attached late")));
}

#[test]
fn truncated_region_is_left_out_with_its_reason_and_reads_again_when_restored() {
    let w = World::new();
    w.spawn(100, 7, true, "1g");
    let r = w.region(100, 1 << 30, &[]);
    register(&r, 100, 7, 64 * MIB);
    let mut a = w.agent(false);
    a.on_event(&ev(EventKind::MemAlloc, 100, 64 * MIB, 0x7000, 0));
    assert!(a.tick(Instant::now()).raised.is_empty());
    let path = w.root.join("100/root/hami/r.cache");
    let good = std::fs::read(&path).unwrap();
    drop(r);
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(good.len() as u64 / 2)
        .unwrap();
    let out = a.tick(Instant::now());
    assert_eq!(
        kinds(&out.raised),
        vec![(FindingKind::Bypass, findings::reason::NO_REGION)]
    );
    assert!(
        out.raised[0].detail.contains("truncated"),
        "{}",
        out.raised[0].detail
    );
    let rows = a.region_rows();
    assert!(rows[0]
        .error
        .as_deref()
        .is_some_and(|e| e.contains("truncated")));
    assert!(rows[0].limits.is_empty());
    std::fs::write(&path, &good).unwrap();
    let out = a.tick(Instant::now());
    assert_eq!(out.cleared.len(), 1, "{:?}", out);
    assert_eq!(a.region_rows()[0].error, None);
}

#[test]
fn region_path_that_is_a_fifo_is_refused_without_blocking() {
    let w = World::new();
    w.spawn(100, 7, true, "1g");
    let dir = w.root.join("100/root/hami");
    std::fs::create_dir_all(&dir).unwrap();
    let c = std::ffi::CString::new(dir.join("r.cache").to_str().unwrap()).unwrap();
    // SAFETY: valid C string.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let mut a = w.agent(false);
    a.on_event(&ev(EventKind::MemAlloc, 100, 64 * MIB, 0x7000, 0));
    let out = a.tick(Instant::now());
    assert_eq!(
        kinds(&out.raised),
        vec![(FindingKind::Bypass, findings::reason::NO_REGION)]
    );
    assert!(
        out.raised[0].detail.contains("FIFO"),
        "{}",
        out.raised[0].detail
    );
}
