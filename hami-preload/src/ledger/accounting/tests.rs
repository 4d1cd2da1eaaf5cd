use super::*;
use crate::ffi::cuda::CUDA_ERROR_INVALID_VALUE;
use std::cell::Cell;

const MB: u64 = 1 << 20;

fn ok(key: u64, bytes: u64) -> impl FnOnce() -> Result<Allocated, CUresult> {
    move || Ok(Allocated { key, bytes })
}

/// The log level of a refusal (info for a plain over-limit, error for failing closed)
/// follows the region's typed reason, not the wording of the message.
#[test]
fn over_limit_is_told_by_the_reason_not_the_message() {
    let l = MemLedger::with_limit(1, 100);
    let d = l.try_charge(1, UsageKind::Data, 200).unwrap_err();
    assert_eq!(
        d,
        Deny::Region(Denied {
            reason: DenyReason::OverLimit,
            dev: 1,
            limit: 100,
            used: 0,
            requested: 200,
        })
    );
    assert!(d.is_over_limit());
    assert_eq!(
        d.to_string(),
        "device 1: 200 bytes requested, 0 of 100 bytes in use: over the limit"
    );
    for reason in [
        DenyReason::ConfigInvalid,
        DenyReason::BadDevice,
        DenyReason::SlotLost,
        DenyReason::ReadOnly,
        DenyReason::LockFailed,
    ] {
        let d = Deny::Region(Denied {
            reason,
            dev: 0,
            limit: 1,
            used: 2,
            requested: 3,
        });
        assert!(!d.is_over_limit(), "{reason:?}");
    }
    // Failing closed, whatever the text says.
    assert!(!Deny::NoRegion("quota over the limit").is_over_limit());
    assert!(!Deny::Exiting.is_over_limit());
    assert!(!Deny::LocalConfig(0).is_over_limit());
    let full = Deny::NoSlot {
        why: NoSlot::Full,
        region: Path::new("/tmp/r.cache"),
    };
    assert!(!full.is_over_limit());
    assert_eq!(
        full.to_string(),
        "cannot register in the shared region /tmp/r.cache (all 1024 process slots are \
         held by live processes): allocations refused"
    );
}

#[test]
fn alloc_within_and_over_limit() {
    let l = MemLedger::with_limit(0, 10 * MB);
    let a = Accounts::default();
    assert_eq!(
        a.alloc(
            &l,
            KeySpace::Pointer,
            0,
            1,
            6 * MB,
            ok(0x1000, 6 * MB),
            |_| {}
        ),
        Ok(())
    );
    assert_eq!(l.used(0, UsageKind::Data), 6 * MB);
    let called = Cell::new(false);
    let r = a.alloc(
        &l,
        KeySpace::Pointer,
        0,
        1,
        5 * MB,
        || {
            called.set(true);
            Ok(Allocated {
                key: 0x2000,
                bytes: 5 * MB,
            })
        },
        |_| {},
    );
    assert_eq!(
        r.as_ref().map_err(|e| e.code()),
        Err(CUDA_ERROR_OUT_OF_MEMORY)
    );
    assert!(
        !called.get(),
        "the driver must not be called when the charge is refused"
    );
    assert_eq!(l.used(0, UsageKind::Data), 6 * MB);
    assert_eq!(a.len(), 1);
}

#[test]
fn driver_failure_uncharges() {
    let l = MemLedger::with_limit(0, 10 * MB);
    let a = Accounts::default();
    let r = a.alloc(
        &l,
        KeySpace::Pointer,
        0,
        1,
        4 * MB,
        || Err(CUDA_ERROR_OUT_OF_MEMORY),
        |_| {},
    );
    assert_eq!(r, Err(AllocError::Driver(CUDA_ERROR_OUT_OF_MEMORY)));
    assert_eq!(l.total(0), 0);
    assert!(a.is_empty());
}

#[test]
fn larger_real_size_charged_or_undone() {
    let l = MemLedger::with_limit(0, 10 * MB);
    let a = Accounts::default();
    // Pitch: estimate 4 MB, the driver really took 6 MB.
    assert_eq!(
        a.alloc(
            &l,
            KeySpace::Pointer,
            0,
            1,
            4 * MB,
            ok(0x10, 6 * MB),
            |_| {}
        ),
        Ok(())
    );
    assert_eq!(l.total(0), 6 * MB);
    assert_eq!(
        a.get(KeySpace::Pointer, 0x10).map(|e| e.bytes),
        Some(6 * MB)
    );
    // Estimate 3 MB fits (9 MB), the real 5 MB does not: undone, OOM, nothing charged.
    let undone = Cell::new(0u64);
    let r = a.alloc(&l, KeySpace::Pointer, 0, 1, 3 * MB, ok(0x20, 5 * MB), |k| {
        undone.set(k)
    });
    assert_eq!(r.map_err(|e| e.code()), Err(CUDA_ERROR_OUT_OF_MEMORY));
    assert_eq!(undone.get(), 0x20);
    assert_eq!(l.total(0), 6 * MB);
    assert!(a.get(KeySpace::Pointer, 0x20).is_none());
    // Smaller real size: the difference is given back.
    assert_eq!(
        a.alloc(&l, KeySpace::Array, 0, 1, 4 * MB, ok(0x30, 2 * MB), |_| {}),
        Ok(())
    );
    assert_eq!(l.total(0), 8 * MB);
}

#[test]
fn free_tracked_unknown_and_double() {
    let l = MemLedger::with_limit(0, 10 * MB);
    let a = Accounts::default();
    a.alloc(
        &l,
        KeySpace::Pointer,
        0,
        1,
        2 * MB,
        ok(0x1000, 2 * MB),
        |_| {},
    )
    .unwrap();
    // Unknown pointer: the driver's own error, nothing uncharged.
    assert_eq!(
        a.free(&l, KeySpace::Pointer, 0x9999, || CUDA_ERROR_INVALID_VALUE),
        CUDA_ERROR_INVALID_VALUE
    );
    assert_eq!(l.total(0), 2 * MB);
    // Same value in another namespace is not the pointer.
    assert_eq!(
        a.free(&l, KeySpace::Handle, 0x1000, || CUDA_ERROR_INVALID_VALUE),
        CUDA_ERROR_INVALID_VALUE
    );
    assert_eq!(l.total(0), 2 * MB);
    // Driver refuses the free: still charged and tracked.
    assert_eq!(a.free(&l, KeySpace::Pointer, 0x1000, || 700), 700);
    assert_eq!(l.total(0), 2 * MB);
    assert!(a.get(KeySpace::Pointer, 0x1000).is_some());
    // Real free.
    assert_eq!(
        a.free(&l, KeySpace::Pointer, 0x1000, || CUDA_SUCCESS),
        CUDA_SUCCESS
    );
    assert_eq!(l.total(0), 0);
    // Double free: untracked now, the driver answers.
    assert_eq!(
        a.free(&l, KeySpace::Pointer, 0x1000, || CUDA_ERROR_INVALID_VALUE),
        CUDA_ERROR_INVALID_VALUE
    );
    assert_eq!(l.total(0), 0);
}

#[test]
fn stamps_compare_across_the_wrap() {
    assert!(precedes(1, 2));
    assert!(!precedes(2, 2));
    assert!(!precedes(3, 2));
    assert!(
        precedes(u32::MAX, 1),
        "inserted just before the counter wrapped"
    );
    assert!(!precedes(1, u32::MAX));
}

#[test]
fn a_free_failing_because_another_thread_freed_the_key_meanwhile_uncharges() {
    let l = MemLedger::with_limit(0, 10 * MB);
    let a = Accounts::default();
    a.alloc(
        &l,
        KeySpace::Pointer,
        0,
        1,
        2 * MB,
        ok(0x1000, 2 * MB),
        |_| {},
    )
    .unwrap();
    // Our free took the entry; while its driver call runs, another thread's free of the
    // same key (no entry) succeeds; ours then fails.
    let r = a.free(&l, KeySpace::Pointer, 0x1000, || {
        assert_eq!(
            a.free(&l, KeySpace::Pointer, 0x1000, || CUDA_SUCCESS),
            CUDA_SUCCESS
        );
        CUDA_ERROR_INVALID_VALUE
    });
    assert_eq!(r, CUDA_ERROR_INVALID_VALUE);
    assert_eq!(l.total(0), 0, "uncharged once");
    assert!(a.get(KeySpace::Pointer, 0x1000).is_none());
    // A new allocation at the same address is charged and freed normally.
    a.alloc(&l, KeySpace::Pointer, 0, 1, MB, ok(0x1000, MB), |_| {})
        .unwrap();
    assert_eq!(
        a.free(&l, KeySpace::Pointer, 0x1000, || 700),
        700,
        "a refused free"
    );
    assert_eq!(
        l.total(0),
        MB,
        "still charged: the old record does not match it"
    );
    assert_eq!(
        a.free(&l, KeySpace::Pointer, 0x1000, || CUDA_SUCCESS),
        CUDA_SUCCESS
    );
    assert_eq!(l.total(0), 0);
}

#[test]
fn an_entry_put_back_after_another_threads_successful_free_is_released_by_it() {
    use std::sync::Barrier;
    let l = MemLedger::with_limit(0, 10 * MB);
    let a = Accounts::default();
    a.alloc(
        &l,
        KeySpace::Pointer,
        0,
        1,
        2 * MB,
        ok(0x1000, 2 * MB),
        |_| {},
    )
    .unwrap();
    let (inside, freed, back) = (Barrier::new(2), Barrier::new(2), Barrier::new(2));
    std::thread::scope(|s| {
        s.spawn(|| {
            // Takes the entry, fails after the other free succeeded, puts it back.
            let r = a.free(&l, KeySpace::Pointer, 0x1000, || {
                inside.wait();
                freed.wait();
                CUDA_ERROR_INVALID_VALUE
            });
            assert_eq!(r, CUDA_ERROR_INVALID_VALUE);
            back.wait();
        });
        s.spawn(|| {
            inside.wait();
            // Finds no entry; its driver call succeeds; it looks again only after the
            // entry was put back.
            let r = a.free(&l, KeySpace::Pointer, 0x1000, || {
                freed.wait();
                back.wait();
                CUDA_SUCCESS
            });
            assert_eq!(r, CUDA_SUCCESS);
        });
    });
    assert_eq!(l.total(0), 0, "uncharged once");
    assert!(a.get(KeySpace::Pointer, 0x1000).is_none());
}

#[test]
fn context_teardown_releases_its_objects() {
    let l = MemLedger::with_limit(0, 100 * MB);
    let a = Accounts::default();
    a.alloc(&l, KeySpace::Pointer, 0, 7, MB, ok(1, MB), |_| {})
        .unwrap();
    a.alloc(&l, KeySpace::Array, 0, 7, 2 * MB, ok(2, 2 * MB), |_| {})
        .unwrap();
    a.alloc(&l, KeySpace::Pointer, 0, 8, 4 * MB, ok(3, 4 * MB), |_| {})
        .unwrap();
    assert_eq!(a.drop_context(&l, 7), 2);
    assert_eq!(l.total(0), 4 * MB);
    assert_eq!(a.len(), 1);
    assert_eq!(a.drop_context(&l, 0), 0);
}

/// A context destroyed while a release of one of its objects is in flight: the release
/// holds the entry, the sweep does not see it, the driver then refuses the release (the
/// object went with the context). The entry must not be put back.
#[test]
fn a_free_refused_after_its_context_was_destroyed_meanwhile_uncharges() {
    let l = MemLedger::with_limit(0, 100 * MB);
    let a = Accounts::default();
    a.alloc(
        &l,
        KeySpace::Pointer,
        0,
        7,
        2 * MB,
        ok(0x1000, 2 * MB),
        |_| {},
    )
    .unwrap();
    a.alloc(&l, KeySpace::Array, 0, 8, MB, ok(0x2000, MB), |_| {})
        .unwrap();
    let r = a.free(&l, KeySpace::Pointer, 0x1000, || {
        assert_eq!(a.drop_context(&l, 7), 0, "the free holds the entry");
        CUDA_ERROR_INVALID_VALUE
    });
    assert_eq!(r, CUDA_ERROR_INVALID_VALUE);
    assert_eq!(l.total(0), MB, "uncharged once");
    assert!(a.get(KeySpace::Pointer, 0x1000).is_none());
    // Another context's destruction meanwhile: the refused free puts its entry back.
    let r = a.free(&l, KeySpace::Array, 0x2000, || {
        a.drop_context(&l, 7);
        CUDA_ERROR_INVALID_VALUE
    });
    assert_eq!(r, CUDA_ERROR_INVALID_VALUE);
    assert_eq!(a.get(KeySpace::Array, 0x2000).map(|e| e.bytes), Some(MB));
    assert_eq!(a.drop_context(&l, 8), 1);
    assert_eq!(l.total(0), 0);
}

/// The mirror: the driver made the object, then its context was destroyed (with it)
/// before the allocation recorded it.
#[test]
fn an_object_whose_context_was_destroyed_before_it_was_recorded_is_uncharged() {
    let l = MemLedger::with_limit(0, 100 * MB);
    let a = Accounts::default();
    let r = a.alloc(
        &l,
        KeySpace::Pointer,
        0,
        7,
        4 * MB,
        || {
            assert_eq!(a.drop_context(&l, 7), 0);
            Ok(Allocated {
                key: 0x1000,
                bytes: 4 * MB,
            })
        },
        |_| panic!("not undone: the driver's success is returned"),
    );
    assert_eq!(r, Ok(()));
    assert_eq!(l.total(0), 0);
    assert!(a.is_empty());
    // A new context reusing the handle (made after the destruction was recorded): its
    // objects are recorded, and a refused free of one puts it back.
    a.alloc(&l, KeySpace::Pointer, 0, 7, MB, ok(0x2000, MB), |_| {})
        .unwrap();
    assert_eq!(a.free(&l, KeySpace::Pointer, 0x2000, || 700), 700);
    assert_eq!(a.get(KeySpace::Pointer, 0x2000).map(|e| e.ctx), Some(7));
    assert_eq!(l.total(0), MB);
    assert_eq!(a.drop_context(&l, 7), 1);
    assert_eq!(l.total(0), 0);
}

/// Threads allocating and freeing in a context while another destroys it, round after
/// round: whatever the interleaving, nothing stays charged once the context is gone and
/// nothing is uncharged twice (an object of another context stays charged throughout, so
/// a double uncharge shows below it rather than saturating at 0).
#[test]
fn allocations_and_frees_racing_a_context_destruction_stay_exact() {
    use std::sync::atomic::{AtomicBool, AtomicU64};
    let l = MemLedger::with_limit(0, 1 << 40);
    let a = Accounts::default();
    // The "driver": live objects, and the context each belongs to.
    let live = Mutex::new(HashMap::<u64, usize>::new());
    let next = AtomicU64::new(1);
    a.alloc(&l, KeySpace::Array, 0, 1, 64 * MB, ok(0xa, 64 * MB), |_| {})
        .unwrap();
    for round in 0..200usize {
        let ctx = 0x100 + round % 3;
        let alive = AtomicBool::new(true);
        std::thread::scope(|s| {
            for _ in 0..2 {
                s.spawn(|| {
                    for _ in 0..20 {
                        let key = next.fetch_add(1, Ordering::Relaxed) << 8;
                        let _ = a.alloc(
                            &l,
                            KeySpace::Pointer,
                            0,
                            ctx,
                            MB,
                            || {
                                let mut g = live.lock().unwrap();
                                if !alive.load(Ordering::SeqCst) {
                                    return Err(CUDA_ERROR_INVALID_VALUE);
                                }
                                g.insert(key, ctx);
                                drop(g);
                                // Returning from the driver: the window before the
                                // object is recorded.
                                std::thread::yield_now();
                                Ok(Allocated { key, bytes: MB })
                            },
                            |_| {},
                        );
                        std::thread::yield_now();
                        a.free(&l, KeySpace::Pointer, key, || {
                            // Entering the driver: the window after the entry was
                            // taken out.
                            std::thread::yield_now();
                            match live.lock().unwrap().remove(&key) {
                                Some(_) => CUDA_SUCCESS,
                                None => CUDA_ERROR_INVALID_VALUE,
                            }
                        });
                    }
                });
            }
            s.spawn(|| {
                std::thread::yield_now();
                let mut g = live.lock().unwrap();
                alive.store(false, Ordering::SeqCst);
                g.retain(|_, c| *c != ctx);
                drop(g);
                a.drop_context(&l, ctx);
            });
        });
        assert_eq!(a.len(), 1, "round {round}");
        assert_eq!(l.total(0), 64 * MB, "round {round}");
    }
}

#[test]
fn reused_key_releases_stale_entry() {
    let l = MemLedger::with_limit(0, 100 * MB);
    let a = Accounts::default();
    a.alloc(&l, KeySpace::Pointer, 0, 1, MB, ok(1, MB), |_| {})
        .unwrap();
    a.alloc(&l, KeySpace::Pointer, 0, 1, 3 * MB, ok(1, 3 * MB), |_| {})
        .unwrap();
    assert_eq!(l.total(0), 3 * MB);
    assert_eq!(a.len(), 1);
}

#[test]
fn threads_never_exceed_limit() {
    let l = MemLedger::with_limit(0, 64 * MB);
    let a = Accounts::default();
    let granted = std::sync::atomic::AtomicU64::new(0);
    std::thread::scope(|s| {
        for t in 0..8u64 {
            let (l, a, granted) = (&l, &a, &granted);
            s.spawn(move || {
                for i in 0..100u64 {
                    let key = (t << 32) | (i + 1);
                    if a.alloc(l, KeySpace::Pointer, 0, 1, MB, ok(key, MB), |_| {})
                        .is_ok()
                    {
                        granted.fetch_add(MB, std::sync::atomic::Ordering::Relaxed);
                    }
                }
            });
        }
    });
    assert_eq!(granted.into_inner(), 64 * MB);
    assert_eq!(l.total(0), 64 * MB);
}
