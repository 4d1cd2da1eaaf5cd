//! The bounded lock, stale lock words, reserves, footprints, compute shares, refusals.

use super::*;

/// Waits until process `pid` is in state `T` (stopped).
fn wait_stopped(pid: libc::pid_t) {
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(10) {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        if stat
            .rsplit(')')
            .next()
            .is_some_and(|r| r.trim_start().starts_with('T'))
        {
            return;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    panic!("process {pid} did not stop");
}

#[test]
fn a_stopped_lock_holder_bounds_the_wait_and_never_blocks_releases() {
    let d = TempDir::new("stopped");
    let p = d.file();
    let limit = 64 * MIB;
    let tuning = Tuning {
        lock_timeout: Duration::from_millis(300),
        reserve: MIB,
        ..Tuning::default()
    };
    let r = create(&p, limit).with_tuning(tuning);
    let s = r.register(fake(700, 1)).unwrap();
    r.try_charge(s, 0, UsageKind::Data, 8 * MIB).unwrap();
    assert_eq!(r.snapshot().slot(s.index()).unwrap().reserve[0], MIB);
    let path = p.clone();
    let holder = fork_child(move || {
        let Ok(r) = Region::open_existing(&path, true) else {
            return 2;
        };
        if r.__test_hold_lock_while_stopped() {
            0
        } else {
            3
        }
    });
    wait_stopped(holder);
    // Within the reserve: admitted without the lock.
    let t = Instant::now();
    r.try_charge(s, 0, UsageKind::Data, MIB / 2).unwrap();
    // Releases never wait for the lock; the bytes stay admitted (in the reserve).
    assert_eq!(r.uncharge(s, 0, UsageKind::Data, 4 * MIB), 4 * MIB);
    assert!(
        t.elapsed() < Duration::from_millis(100),
        "{:?}",
        t.elapsed()
    );
    // Past the reserve: refused after the timeout, not an unbounded wait.
    let t = Instant::now();
    let den = r.try_charge(s, 0, UsageKind::Data, 16 * MIB).unwrap_err();
    let waited = t.elapsed();
    assert_eq!(den.reason, DenyReason::LockTimeout);
    assert!(den.to_string().contains("lock timeout"), "{den}");
    assert!(
        waited >= Duration::from_millis(290) && waited < Duration::from_secs(2),
        "{waited:?}"
    );
    // Context memory the driver already took is recorded now and totalled later; right
    // after a timed-out wait this thread does not wait again (one CUDA call that needs the
    // lock twice is bounded by one timeout).
    let t = Instant::now();
    r.force_charge(s, 0, UsageKind::Context, 32 * MIB);
    assert!(
        t.elapsed() < Duration::from_millis(100),
        "{:?}",
        t.elapsed()
    );
    assert_eq!(r.slot_usage(s, 0, UsageKind::Context), 32 * MIB);
    assert_eq!(
        r.try_charge(s, 0, UsageKind::Data, 16 * MIB)
            .unwrap_err()
            .reason,
        DenyReason::LockTimeout
    );
    assert!(
        t.elapsed() < Duration::from_millis(100),
        "{:?}",
        t.elapsed()
    );
    // Another thread waits its own full timeout.
    let t = Instant::now();
    std::thread::scope(|sc| {
        sc.spawn(|| {
            assert_eq!(
                r.try_charge(s, 0, UsageKind::Data, 16 * MIB)
                    .unwrap_err()
                    .reason,
                DenyReason::LockTimeout
            )
        });
    });
    assert!(
        t.elapsed() >= Duration::from_millis(290),
        "{:?}",
        t.elapsed()
    );
    // SAFETY: continues our own stopped child.
    unsafe { libc::kill(holder, libc::SIGCONT) };
    let st = wait_timeout(holder, Duration::from_secs(10)).expect("holder hung");
    assert_eq!(exit_code(st), 0);
    r.try_charge(s, 0, UsageKind::Data, MIB).unwrap();
    r.settle(s);
    let snap = r.snapshot();
    let data = 8 * MIB + MIB / 2 - 4 * MIB + MIB;
    assert_eq!(snap.accounted(0), data + 32 * MIB);
    assert_eq!(
        snap.used[0],
        data + 32 * MIB,
        "pending charge applied, reserve returned"
    );
    r.unregister(s);
    assert_eq!(r.used(0), 0);
}

#[test]
fn a_stale_lock_word_is_marked_owner_died_and_recovered() {
    let d = TempDir::new("stale");
    let p = d.file();
    // A thread id that no longer exists: a child that has exited and been reaped.
    let gone = fork_child(|| 0);
    wait_timeout(gone, Duration::from_secs(10)).expect("child hung");
    let lock_off = offset_of!(hami_abi::layout::RegionHeader, lock) as u64;
    // Without stale-lock breaking (the agent's setting): a bounded wait, then an error
    // naming the holder.
    let r = create(&p, 64 * MIB).with_tuning(Tuning {
        lock_timeout: Duration::from_millis(200),
        ..Tuning::default()
    });
    // This process's real identity: owner-died recovery must see it alive.
    let s = r.register(ProcessId::current()).unwrap();
    patch(&p, lock_off, &(gone as u32).to_le_bytes());
    let t = Instant::now();
    let den = r.try_charge(s, 0, UsageKind::Data, MIB).unwrap_err();
    assert_eq!(den.reason, DenyReason::LockTimeout);
    assert!(t.elapsed() < Duration::from_secs(2));
    match r.register(fake(801, 1)) {
        Err(e @ RegionError::LockTimeout { holder_tid, .. }) => {
            assert_eq!(holder_tid, gone as u32);
            assert!(e.to_string().contains(&format!("thread {gone}")), "{e}");
        }
        other => panic!("{other:?}"),
    }
    // With it (the preload's setting): recovered after STALE_LOCK_AGE (once this thread's
    // back-off after its timed-out wait has passed).
    std::thread::sleep(Duration::from_millis(250));
    let r = r.with_tuning(Tuning {
        lock_timeout: Duration::from_secs(5),
        break_stale_locks: true,
        ..Tuning::default()
    });
    let t = Instant::now();
    r.try_charge(s, 0, UsageKind::Data, MIB).unwrap();
    let took = t.elapsed();
    assert!(
        took >= STALE_LOCK_AGE && took < Duration::from_secs(3),
        "{took:?}"
    );
    let snap = r.snapshot();
    assert_eq!(snap.stale_lock_breaks, 1);
    assert_eq!(snap.owner_died_recoveries, 1);
    assert_eq!(snap.used[0], MIB);
    // A lock word naming a live thread (this one) is never broken: bounded wait instead.
    // SAFETY: gettid has no preconditions.
    let me = unsafe { libc::syscall(libc::SYS_gettid) } as u32;
    patch(&p, lock_off, &me.to_le_bytes());
    let r = r.with_tuning(Tuning {
        lock_timeout: Duration::from_millis(800),
        break_stale_locks: true,
        ..Tuning::default()
    });
    let den = r.try_charge(s, 0, UsageKind::Data, MIB).unwrap_err();
    assert_eq!(den.reason, DenyReason::LockTimeout);
    assert_eq!(r.snapshot().stale_lock_breaks, 1);
    patch(&p, lock_off, &0u32.to_le_bytes());
    r.unregister(s);
    assert_eq!(r.used(0), 0);
}

#[test]
fn reserves_are_taken_back_when_the_device_is_full() {
    let d = TempDir::new("reclaim-reserve");
    let p = d.file();
    let limit = 64 * MIB;
    let r = create(&p, limit).with_tuning(Tuning {
        reserve: 2 * MIB,
        ..Tuning::default()
    });
    let a = r.register(fake(900, 1)).unwrap();
    let b = r.register(fake(901, 1)).unwrap();
    r.try_charge(a, 0, UsageKind::Data, 10 * MIB).unwrap();
    let snap = r.snapshot();
    assert_eq!(snap.slot(a.index()).unwrap().reserve[0], 2 * MIB);
    assert_eq!(snap.used[0], 12 * MIB);
    assert_eq!(r.used(0), 10 * MIB);
    assert_eq!(r.admitted(0), 12 * MIB);
    // B fills the device exactly: A's unused reserve is taken back for it.
    r.try_charge(b, 0, UsageKind::Data, 54 * MIB).unwrap();
    let snap = r.snapshot();
    assert_eq!(snap.slot(a.index()).unwrap().reserve[0], 0);
    assert_eq!(snap.slot(b.index()).unwrap().reserve[0], 0);
    assert_eq!(snap.used[0], limit);
    assert_eq!(snap.accounted(0), limit);
    assert_eq!(snap.reserve_reclaims, 1);
    assert_eq!(
        r.try_charge(a, 0, UsageKind::Data, 1).unwrap_err().reason,
        DenyReason::OverLimit
    );
    // A release goes to the releaser's reserve: it is still admitted, and anyone can get it.
    assert_eq!(r.uncharge(a, 0, UsageKind::Data, 3 * MIB), 3 * MIB);
    assert_eq!(r.admitted(0), limit);
    assert_eq!(r.used(0), limit - 3 * MIB);
    r.try_charge(b, 0, UsageKind::Data, 3 * MIB).unwrap();
    assert_eq!(r.snapshot().accounted(0), limit);
    // A reserve above twice the quantum is trimmed at release.
    assert_eq!(r.uncharge(b, 0, UsageKind::Data, 20 * MIB), 20 * MIB);
    let snap = r.snapshot();
    assert_eq!(snap.slot(b.index()).unwrap().reserve[0], 2 * MIB);
    assert_eq!(snap.used[0], limit - 18 * MIB);
    r.unregister(a);
    r.unregister(b);
    assert_eq!(r.used(0), 0);
}

/// The per-device context footprint: 0 until a process records a measurement, shared by
/// every mapping of the file (read through another mapping and through `pread`), the latest
/// store wins, a read-only mapping cannot write it, bad ordinals read 0 and are ignored.
#[test]
fn context_footprint_is_shared_per_device_and_written_by_writable_mappings_only() {
    let t = TempDir::new("ctxfoot");
    let p = t.file();
    let a = create(&p, 1 << 30);
    let b = Region::open_existing(&p, true).unwrap();
    let ro = Region::open_existing(&p, false).unwrap();
    assert_eq!(a.context_footprint(0), 0, "not measured yet");
    a.set_context_footprint(0, 518 * MIB);
    assert_eq!(b.context_footprint(0), 518 * MIB);
    assert_eq!(ro.context_footprint(0), 518 * MIB);
    assert_eq!(b.context_footprint(1), 0, "per device");
    b.set_context_footprint(0, 300 * MIB);
    assert_eq!(
        a.context_footprint(0),
        300 * MIB,
        "the latest measurement wins"
    );
    ro.set_context_footprint(0, 1);
    assert_eq!(
        a.context_footprint(0),
        300 * MIB,
        "read-only: nothing written"
    );
    a.set_context_footprint(MAX_DEVICES, 5);
    assert_eq!(a.context_footprint(MAX_DEVICES), 0);
    a.set_context_footprint(MAX_DEVICES - 1, 7 * MIB);
    let snap = ro.snapshot();
    assert_eq!(snap.context_footprint[0], 300 * MIB);
    assert_eq!(snap.context_footprint[MAX_DEVICES - 1], 7 * MIB);
    let f = std::fs::File::open(&p).unwrap();
    let read = read_snapshot(&f, &p).unwrap();
    assert_eq!(read.context_footprint, snap.context_footprint);
    // The figure is not usage: it changes no total.
    assert_eq!(a.used(0), 0);
}

/// The creator's compute share and policy are written at creation and kept by later
/// openers, which are told where their own configuration differs; the gate's atomics are
/// shared by every mapping of the file.
#[test]
fn compute_share_is_set_at_creation_and_differences_are_reported() {
    use hami_abi::layout::{COMPUTE_POLICY_DEFAULT, COMPUTE_POLICY_FORCE};
    let d = TempDir::new("compute");
    let p = d.file();
    let mut c = cfg(0);
    c.sm_limits[0] = 30;
    c.sm_limits[2] = 100;
    c.compute_policy = COMPUTE_POLICY_FORCE;
    let r = create(&p, 0);
    drop(r);
    std::fs::remove_file(&p).unwrap();
    let (r, out) = Region::open_or_create(&p, &c).unwrap();
    assert_eq!(out, OpenOutcome::Created);
    assert_eq!((r.sm_limit(0), r.sm_limit(1), r.sm_limit(2)), (30, 0, 100));
    assert_eq!(r.compute_policy(0), COMPUTE_POLICY_FORCE);
    assert_eq!(r.sm_limit(MAX_DEVICES), 0, "past the table: no limit");
    assert!(r.compute_cells(MAX_DEVICES).is_none());
    assert!(r.compute_differences(&c).is_empty());

    let mut later = c.clone();
    later.sm_limits[0] = 50;
    later.compute_policy = COMPUTE_POLICY_DEFAULT;
    let (r2, _) = Region::open_or_create(&p, &later).unwrap();
    let diffs = r2.compute_differences(&later);
    assert_eq!(
        diffs.len(),
        MAX_DEVICES,
        "the policy differs on every device"
    );
    assert_eq!(
        diffs[0],
        ComputeDifference {
            dev: 0,
            region_sm_limit: 30,
            region_policy: COMPUTE_POLICY_FORCE,
            requested_sm_limit: 50,
            requested_policy: COMPUTE_POLICY_DEFAULT,
        }
    );
    assert_eq!(r2.sm_limit(0), 30, "the region's share applies");
    assert_eq!(compute_policy_name(r2.compute_policy(0)), "force");

    // Both mappings see the same budget.
    let a = r.compute_cells(0).unwrap();
    let b = r2.compute_cells(0).unwrap();
    a.budget_ns.store(-5, Ordering::Relaxed);
    a.consumed_ns.fetch_add(7, Ordering::Relaxed);
    assert_eq!(b.budget_ns.load(Ordering::Relaxed), -5);
    assert_eq!(b.consumed_ns.load(Ordering::Relaxed), 7);
    let other = r2.compute_cells(1).unwrap();
    assert_eq!(other.budget_ns.load(Ordering::Relaxed), 0, "per device");
}

#[test]
fn refusals_count_per_device_lock_free() {
    let d = TempDir::new("refusals");
    let r = create(&d.file(), 1 << 30);
    assert_eq!(r.refusals(1), 0, "a new region has refused nothing");
    r.count_refusal(1);
    r.count_refusal(1);
    r.count_refusal(3);
    r.count_refusal(MAX_DEVICES); // beyond the region: ignored, no panic
    assert_eq!((r.refusals(0), r.refusals(1), r.refusals(3)), (0, 2, 1));
    assert_eq!(r.refusals(MAX_DEVICES), 0);
    let s = r.snapshot();
    assert_eq!((s.compute[1].refusals, s.compute[3].refusals), (2, 1));
}

#[test]
fn a_slot_keeps_its_host_pid_until_it_is_freed() {
    let d = TempDir::new("hostpid");
    let r = create(&d.file(), 0);
    let s = r.register(fake(200, 7)).unwrap();
    assert_eq!(r.host_pid(s.index()), 0, "unknown at registration");
    r.set_host_pid(s, 4242).unwrap();
    assert_eq!(r.host_pid(s.index()), 4242);
    // Another identity naming the same slot (reclaimed and reused) records nothing.
    let stale = SlotId::new(s.index(), fake(201, 7));
    r.set_host_pid(stale, 9).unwrap();
    assert_eq!(r.host_pid(s.index()), 4242);
    r.unregister(s);
    assert_eq!(r.host_pid(s.index()), 0, "cleared when freed");
    let s2 = r.register(fake(202, 8)).unwrap();
    assert_eq!(s2.index(), s.index());
    assert_eq!(r.host_pid(s2.index()), 0, "a new owner starts unknown");
    assert_eq!(r.host_pid(MAX_SLOTS), 0);
    let ro = Region::open_existing(&d.file(), false).unwrap();
    assert!(matches!(
        ro.set_host_pid(s2, 1),
        Err(RegionError::ReadOnly { .. })
    ));
}

/// Regression (issue 22, found under qemu-user): qemu answers `/proc/self/stat` with the
/// calling thread's start time, so a process registering from a second thread got another
/// identity than the one its liveness is checked with, and its slot was reclaimed under it
/// (the torture race granted 20 times the limit). Every thread must see one identity, the
/// one `/proc/<pid>/stat` gives.
#[test]
fn the_current_process_has_one_identity_from_every_thread() {
    let main = ProcessId::current();
    std::thread::sleep(Duration::from_millis(30));
    let from_thread = std::thread::spawn(|| {
        std::thread::sleep(Duration::from_millis(30));
        ProcessId::current()
    })
    .join()
    .unwrap();
    assert_eq!(from_thread, main);
    assert_eq!(ProcessId::of(main.pid), Some(main));
    assert_eq!(ProcProbe.liveness(main), Liveness::Alive);
}
