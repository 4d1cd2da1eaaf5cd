//! Issue 31: processes that allocate and exit between two ticks are judged from what the
//! agent recorded at their first event.

use super::*;

/// An unhooked process that allocated and exited (its `/proc` gone) before any tick: raised
/// at the next tick as `bypass` / `no_preload` with its pid, comm and bytes, kept in the
/// history; a hooked one that did the same raises nothing.
#[test]
fn a_process_that_exits_before_the_tick_is_judged_from_its_first_event() {
    let w = World::new();
    w.spawn(200, 7, false, "100m");
    w.spawn(201, 8, true, "100m");
    let r = w.region(201, 1024 * MIB, &[200]);
    register(&r, 201, 8, 64 * MIB);
    let mut a = w.agent(false);
    for pid in [200, 201] {
        a.on_event(&ev(EventKind::PrimaryCtxRetain, pid, 0, 0xc0, 0));
        a.on_event(&ev(EventKind::MemAlloc, pid, 64 * MIB, 0x9000, 0));
    }
    // Both gone before the agent evaluates: one by its exit event, one found gone by /proc.
    a.on_event(&ev(EventKind::ProcessExit, 200, 0, 0, 0));
    w.kill(200);
    w.kill(201);
    assert!(a.wants_early_tick());
    let out = a.tick(Instant::now());
    // The hooked process's slot is left behind (killed): that finding names no process.
    let about_processes: Vec<Finding> = out
        .raised
        .iter()
        .filter(|f| f.kind != FindingKind::LeakedSlot)
        .cloned()
        .collect();
    assert_eq!(
        kinds(&about_processes),
        vec![(FindingKind::Bypass, findings::reason::NO_PRELOAD)],
        "{:#?}",
        out.raised
    );
    let b = &about_processes[0];
    assert_eq!(b.pid, Some(200));
    assert_eq!(b.bytes, 64 * MIB);
    assert!(b.detail.contains("(pid 200) exited"), "{}", b.detail);
    assert_eq!(a.process_count(), 0);
    assert!(a.standing().iter().all(|f| f.pid.is_none()));
    let h: Vec<Finding> = a
        .history()
        .into_iter()
        .filter(|f| f.kind != FindingKind::LeakedSlot)
        .collect();
    assert_eq!(h.len(), 1, "{h:#?}");
    assert_eq!(h[0].pid, Some(200));
    // Raised once.
    assert!(a.tick(Instant::now()).raised.is_empty());
}

/// A bypass reported while the process lived is not raised a second time at its exit; a
/// process that freed everything before exiting is reported with what it held at most.
#[test]
fn an_exited_bypass_is_raised_once_with_its_peak() {
    let w = World::new();
    w.spawn(300, 7, false, "100m");
    w.spawn(301, 8, false, "100m");
    let mut a = w.agent(false);
    a.on_event(&ev(EventKind::MemAlloc, 300, 32 * MIB, 0x9000, 0));
    let out = a.tick(Instant::now());
    assert_eq!(out.raised.len(), 1);
    a.on_event(&ev(EventKind::ProcessExit, 300, 0, 0, 0));
    a.on_event(&ev(EventKind::MemAlloc, 301, 48 * MIB, 0xa000, 0));
    a.on_event(&ev(EventKind::MemFree, 301, 0, 0xa000, 0));
    a.on_event(&ev(EventKind::ProcessExit, 301, 0, 0, 0));
    let out = a.tick(Instant::now());
    assert_eq!(out.raised.len(), 1, "{:#?}", out.raised);
    assert_eq!(out.raised[0].pid, Some(301));
    assert_eq!(out.raised[0].bytes, 48 * MIB);
    assert_eq!(kinds(&out.cleared).len(), 1);
    assert_eq!(a.history().len(), 2);
}

/// A process whose `/proc` was already gone when its first event was read cannot be
/// classified: counted, never reported.
#[test]
fn a_process_gone_before_its_first_event_is_counted_unclassified() {
    let w = World::new();
    let mut a = w.agent(false);
    a.on_event(&ev(EventKind::MemAlloc, 400, 64 * MIB, 0x9000, 0));
    a.on_event(&ev(EventKind::ProcessExit, 400, 0, 0, 0));
    assert!(a.tick(Instant::now()).raised.is_empty());
    assert_eq!(a.unclassified_exits(), 1);
}

/// Short-lived HAMi-core processes (`libvgpu.so` without hami-preload's marker) and
/// hami-preload installed under that name: the first raises `hami_core` at its exit, the
/// second nothing.
#[test]
fn a_short_lived_hami_core_process_is_reported_at_its_exit() {
    let w = World::new();
    super::hooks::libvgpu_process(&w, 101, false); // HAMi-core
    super::hooks::libvgpu_process(&w, 102, true); // hami-preload as libvgpu.so
    let maps = w.root.join("102/maps");
    let m = std::fs::read_to_string(&maps).unwrap();
    std::fs::write(&maps, m.replace(" 1234 ", " 5678 ")).unwrap();
    let mut a = w.agent(false);
    for pid in [101, 102] {
        a.on_event(&ev(EventKind::MemAlloc, pid, 16 * MIB, 0x7000, 0));
        a.on_event(&ev(EventKind::ProcessExit, pid, 0, 0, 0));
    }
    let out = a.tick(Instant::now());
    let got: Vec<(Option<u32>, FindingKind, &str)> = out
        .raised
        .iter()
        .map(|f| (f.pid, f.kind, f.reason))
        .collect();
    assert_eq!(
        got,
        vec![(
            Some(101),
            FindingKind::HamiCore,
            findings::reason::HAMI_CORE_MAPPED
        )]
    );
}

/// A bypass raised while the process lived, which then frees, exits and is found gone by
/// both its exit event and `/proc`, is raised once in all (the churn run counted about two
/// raises per unhooked process).
#[test]
fn a_bypass_raised_while_alive_is_not_raised_again_after_its_exit() {
    let w = World::new();
    w.spawn(500, 7, false, "100m");
    let mut a = w.agent(false);
    a.on_event(&ev(EventKind::MemAlloc, 500, 2 * MIB, 0x9000, 0));
    let mut raised = a.tick(Instant::now()).raised.len();
    a.on_event(&ev(EventKind::MemFree, 500, 0, 0x9000, 0));
    raised += a.tick(Instant::now()).raised.len();
    a.on_event(&ev(EventKind::ProcessExit, 500, 0, 0, 0));
    raised += a.tick(Instant::now()).raised.len();
    w.kill(500);
    for _ in 0..3 {
        raised += a.tick(Instant::now()).raised.len();
    }
    assert_eq!(raised, 1);
}

/// The same when the process is found gone by `/proc` first and its last events (the free,
/// the exit) are read after that.
#[test]
fn late_events_of_a_process_found_gone_raise_nothing_again() {
    let w = World::new();
    w.spawn(501, 7, false, "100m");
    let mut a = w.agent(false);
    a.on_event(&ev(EventKind::MemAlloc, 501, 2 * MIB, 0x9000, 0));
    let mut raised = a.tick(Instant::now()).raised.len();
    w.kill(501);
    raised += a.tick(Instant::now()).raised.len();
    a.on_event(&ev(EventKind::MemFree, 501, 0, 0x9000, 0));
    a.on_event(&ev(EventKind::ProcessExit, 501, 0, 0, 0));
    for _ in 0..3 {
        raised += a.tick(Instant::now()).raised.len();
    }
    assert_eq!(raised, 1);
}
