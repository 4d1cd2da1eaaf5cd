//! Crash recovery: processes SIGKILLed while holding the lock or in a loop.

use super::*;

#[test]
fn sigkill_while_holding_the_lock_is_recovered_exactly() {
    let d = TempDir::new("ownerdied");
    let p = d.file();
    let r = create(&p, 100 * MIB);
    // A live process (this one, real identity so that the default /proc probe sees it alive)
    // holds 10 MiB on device 0 and 1 MiB of context on device 1.
    let me = ProcessId::current();
    let mine = r.register(me).unwrap();
    r.try_charge(mine, 0, UsageKind::Data, 10 * MIB).unwrap();
    r.force_charge(mine, 1, UsageKind::Context, MIB);
    let (rd, wr) = pipe();
    let path = p.clone();
    let kid = fork_child(move || {
        let Ok(r) = Region::open_existing(&path, true) else {
            return 2;
        };
        let Ok(s) = r.register(ProcessId::current()) else {
            return 3;
        };
        if r.try_charge(s, 0, UsageKind::Data, 20 * MIB).is_err() {
            return 4;
        }
        write_u64(wr, s.index() as u64);
        // Dies with the lock held, in the middle of an update.
        r.__test_die_holding_lock(s, 0, 5 * MIB)
    });
    close(wr);
    let kid_slot = read_u64(rd).unwrap() as usize;
    close(rd);
    let st = wait_timeout(kid, Duration::from_secs(10)).expect("child hung");
    assert_eq!(exit_code(st), -libc::SIGKILL);
    // The lock is held by a dead thread; the next locker recovers.
    let before = r.__test_recoveries();
    assert!(r.is_registered(mine));
    r.try_charge(mine, 0, UsageKind::Data, MIB).unwrap();
    assert_eq!(r.__test_recoveries(), before + 1);
    let snap = r.snapshot();
    assert!(snap.consistent);
    assert!(
        snap.slot(kid_slot).is_none(),
        "dead holder's slot not reclaimed"
    );
    assert_eq!(snap.used[0], 11 * MIB);
    assert_eq!(snap.used[1], MIB);
    assert_eq!(snap.accounted(0), 11 * MIB);
    assert_eq!(snap.reclaimed_slots, 1);
    assert_eq!(snap.owner_died_recoveries, 1);
    assert_eq!(snap.generation & 1, 0);
    // And the lock works normally afterwards.
    r.unregister(mine);
    assert_eq!(r.used(0), 0);
    assert_eq!(r.used(1), 0);
}

#[test]
fn processes_sigkilled_in_a_loop_never_block_others_and_are_reclaimed() {
    processes_sigkilled_in_a_loop_never_block_others_and_are_reclaimed_with(
        Tuning::default(),
        "killloop",
    );
}

#[test]
fn processes_sigkilled_in_a_loop_never_block_others_and_are_reclaimed_with_reserves() {
    processes_sigkilled_in_a_loop_never_block_others_and_are_reclaimed_with(
        reserves(),
        "killloop-rsv",
    );
}

fn processes_sigkilled_in_a_loop_never_block_others_and_are_reclaimed_with(
    tuning: Tuning,
    dir: &str,
) {
    let d = TempDir::new(dir);
    let p = d.file();
    let limit = 64 * MIB;
    let r = create(&p, limit).with_tuning(tuning);
    let deadline_ms = 3000u64;
    // Two workers charge and release continuously and must finish on time.
    let mut workers = Vec::new();
    for w in 0..2 {
        let path = p.clone();
        workers.push(fork_child(move || {
            let Ok(r) = Region::open_existing(&path, true) else {
                return 2;
            };
            let r = r.with_tuning(tuning);
            let Ok(s) = r.register(ProcessId::current()) else {
                return 3;
            };
            let start = Instant::now();
            let mut held = 0u64;
            let mut i = 0u64;
            while start.elapsed() < Duration::from_millis(deadline_ms) {
                i += 1;
                let sz = ((i * 7919 + w) % 64 + 1) * 4096;
                if i % 3 == 0 {
                    held -= r.uncharge(s, 0, UsageKind::Data, sz);
                } else if r.try_charge(s, 0, UsageKind::Data, sz).is_ok() {
                    held += sz;
                }
                if r.used(0) > limit || r.slot_usage(s, 0, UsageKind::Data) != held {
                    return 5;
                }
                if i % 64 == 0 && r.try_charge(s, 0, UsageKind::Data, limit).is_ok() {
                    // Only possible if everything else is free.
                    held += limit;
                    held -= r.uncharge(s, 0, UsageKind::Data, limit);
                }
            }
            r.unregister(s);
            0
        }));
    }
    // Victims: charge and release in a tight loop, killed at random moments.
    let mut victims = 0;
    let (reg_r, reg_w) = pipe();
    let started = Instant::now();
    let mut seed = 12345u64;
    while started.elapsed() < Duration::from_millis(deadline_ms - 500) {
        let path = p.clone();
        let v = fork_child(move || {
            let Ok(r) = Region::open_existing(&path, true) else {
                return 2;
            };
            let r = r.with_tuning(tuning);
            let Ok(s) = r.register(ProcessId::current()) else {
                return 3;
            };
            write_u64(reg_w, s.index() as u64);
            let mut i = 0u64;
            loop {
                i += 1;
                if i % 2 == 0 {
                    r.uncharge(s, 0, UsageKind::Data, 3 * 4096);
                } else {
                    let _ = r.try_charge(s, 0, UsageKind::Data, 5 * 4096);
                }
                if i % 7 == 0 {
                    r.force_charge(s, 1, UsageKind::Context, 4096);
                }
            }
        });
        read_u64(reg_r).expect("victim failed to register");
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        std::thread::sleep(Duration::from_micros(200 + (seed >> 33) % 3000));
        // SAFETY: kills our own child.
        unsafe { libc::kill(v, libc::SIGKILL) };
        let st = wait_timeout(v, Duration::from_secs(10)).expect("victim did not die");
        assert_eq!(exit_code(st), -libc::SIGKILL);
        victims += 1;
        // This process must never block either.
        let t = Instant::now();
        let _ = r.snapshot();
        let s = r.register(ProcessId::current()).unwrap();
        r.unregister(s);
        assert!(t.elapsed() < Duration::from_secs(5));
    }
    close(reg_r);
    close(reg_w);
    for w in workers {
        let st = wait_timeout(w, Duration::from_secs(30)).expect("worker hung");
        assert_eq!(exit_code(st), 0, "worker saw an inconsistency");
    }
    // Every victim is reaped: whatever recovery did not already free, reclaim frees now.
    let freed = r.reclaim_dead();
    let snap = r.snapshot();
    assert!(snap.slots.is_empty(), "{:?}", snap.slots);
    assert_eq!(snap.used, [0; MAX_DEVICES]);
    assert_eq!(
        snap.reclaimed_slots,
        victims,
        "each victim's slot reclaimed exactly once ({} by the final sweep, {} recoveries)",
        freed.len(),
        snap.owner_died_recoveries
    );
    eprintln!(
        "kill loop: {victims} victims, {} owner-died recoveries, {} slots freed by the final sweep",
        snap.owner_died_recoveries,
        freed.len()
    );
    assert!(victims >= 5);
}
