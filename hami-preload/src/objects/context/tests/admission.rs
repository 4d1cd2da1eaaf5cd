//! A context admitted before the driver creates it (issue 17): refused when its known
//! footprint does not fit, the measurement correcting what was admitted, an unknown footprint
//! measured under the lock, the configured overhead, a first context admitted late.

use super::*;

/// A meter whose device and per-process figures follow `dev_used` / `own` (NVML
/// available, this process listed after its first context), with the footprint in
/// `fp` and the lock counted in `locks`.
struct Fake {
    dev_used: std::cell::Cell<u64>,
    own: std::cell::Cell<Option<u64>>,
    fp: std::cell::Cell<u64>,
    locks: std::cell::Cell<u32>,
}

impl Fake {
    fn new(fp: u64) -> Fake {
        Fake {
            dev_used: std::cell::Cell::new(0),
            own: std::cell::Cell::new(None),
            fp: std::cell::Cell::new(fp),
            locks: std::cell::Cell::new(0),
        }
    }

    /// The driver's context creation: `bytes` on the device and in this process.
    fn make(&self, bytes: u64) {
        self.dev_used.set(self.dev_used.get() + bytes);
        self.own.set(Some(self.own.get().unwrap_or(0) + bytes));
    }
}

/// Runs `f` with a meter over `fake`.
fn with_meter<R>(
    fake: &Fake,
    configured: Option<u64>,
    f: impl FnOnce(&ContextMeter<'_>) -> R,
) -> R {
    let used_now = |_d: usize| Some(fake.dev_used.get());
    let own_used = |_d: usize| fake.own.get().map_or(OwnUsage::NotListed, OwnUsage::Listed);
    let footprint = |_d: usize| fake.fp.get();
    let set_footprint = |_d: usize, b: u64| fake.fp.set(b);
    let serialize = || -> Option<Held> {
        fake.locks.set(fake.locks.get() + 1);
        Some(Box::new(()))
    };
    let m = ContextMeter {
        configured,
        used_now: &used_now,
        own_used: &own_used,
        serialize: &serialize,
        nvml: true,
        footprint: &footprint,
        set_footprint: &set_footprint,
        ..NO_NVML
    };
    f(&m)
}

/// Issue 17: a second process of a container whose quota is full got its context anyway
/// (the container then held the quota + 518 MiB). The known footprint is admitted before
/// the driver is called; it does not fit, so the driver is never asked.
#[test]
fn a_context_that_does_not_fit_is_refused_before_the_driver_is_called() {
    let l = MemLedger::with_limit(0, 1024 * MB);
    l.try_charge(0, UsageKind::Data, 800 * MB).unwrap();
    let t = ContextTable::default();
    // Listed in NVML: the measurement takes no lock either.
    t.listed.store(true, Ordering::Relaxed);
    let fake = Fake::new(300 * MB);
    let called = std::cell::Cell::new(0);
    with_meter(&fake, None, |m| {
        for create in [false, true] {
            let call = || {
                called.set(called.get() + 1);
                Ok(0xc0)
            };
            let (r, o) = if create {
                t.create(&l, 0, m, call, |_| true)
            } else {
                t.primary_retain(&l, 0, m, call, |_| true)
            };
            assert_eq!(r, CUDA_ERROR_OUT_OF_MEMORY);
            match o {
                Some(ContextOutcome::Refused {
                    footprint,
                    deny,
                    destroyed: false,
                }) => {
                    assert_eq!(footprint, Footprint::Measured(300 * MB));
                    assert!(deny.is_over_limit());
                }
                o => panic!("{o:?}"),
            }
        }
    });
    assert_eq!(called.get(), 0, "the driver was not called");
    assert_eq!(fake.locks.get(), 0, "a known footprint needs no lock");
    assert_eq!(l.used(0, UsageKind::Context), 0);
    assert_eq!(t.primary_ctx(0), 0, "nothing retained");
    // Room again: the same retain goes through.
    l.uncharge(0, UsageKind::Data, 800 * MB);
    let (r, _) = with_meter(&fake, None, |m| {
        t.primary_retain(
            &l,
            0,
            m,
            || {
                fake.make(300 * MB);
                Ok(0xc0)
            },
            |_| true,
        )
    });
    assert_eq!(r, CUDA_SUCCESS);
    assert_eq!(l.used(0, UsageKind::Context), 300 * MB);
}

/// The admitted footprint is replaced by the measurement, up (beyond the quota: the
/// driver already holds it) or down, and the measurement becomes the footprint.
#[test]
fn the_measurement_corrects_the_admitted_footprint_and_is_stored() {
    let l = MemLedger::with_limit(0, 1024 * MB);
    l.try_charge(0, UsageKind::Data, 600 * MB).unwrap();
    let t = ContextTable::default();
    let fake = Fake::new(300 * MB);
    let (r, o) = with_meter(&fake, None, |m| {
        t.primary_retain(
            &l,
            0,
            m,
            || {
                // Fits as 300 MiB; the driver took 518.
                assert_eq!(l.used(0, UsageKind::Context), 300 * MB, "admitted first");
                fake.make(518 * MB);
                Ok(0xc0)
            },
            |_| true,
        )
    });
    assert_eq!(r, CUDA_SUCCESS);
    assert_eq!(l.used(0, UsageKind::Context), 518 * MB);
    assert_eq!(
        l.total(0),
        1118 * MB,
        "beyond the quota by what the driver took"
    );
    assert_eq!(fake.fp.get(), 518 * MB, "stored for the next context");
    match o {
        Some(ContextOutcome::Charged {
            footprint,
            admitted,
            charged,
            waited,
            ..
        }) => {
            assert_eq!(footprint, Footprint::Measured(300 * MB));
            assert!(admitted);
            assert_eq!(charged, 518 * MB);
            assert_eq!(waited, None);
        }
        o => panic!("{o:?}"),
    }
    // Down: a created context in another table (another process) admitted 518, took 200.
    let t2 = ContextTable::default();
    let fake2 = Fake {
        fp: std::cell::Cell::new(518 * MB),
        ..Fake::new(0)
    };
    let l2 = MemLedger::with_limit(0, 1024 * MB);
    with_meter(&fake2, None, |m| {
        t2.create(
            &l2,
            0,
            m,
            || {
                assert_eq!(l2.used(0, UsageKind::Context), 518 * MB);
                fake2.make(200 * MB);
                Ok(0xd0)
            },
            |_| true,
        )
    });
    assert_eq!(l2.used(0, UsageKind::Context), 200 * MB);
    assert_eq!(fake2.fp.get(), 200 * MB);
    // A failed creation gives the admission back; the footprint stays.
    let (r, o) = with_meter(&fake2, None, |m| {
        t2.create(&l2, 0, m, || Err(999), |_| true)
    });
    assert_eq!((r, o), (999, None));
    assert_eq!(l2.used(0, UsageKind::Context), 200 * MB);
    assert_eq!(fake2.fp.get(), 200 * MB);
    // A second context of the process is admitted at the footprint but, costing less,
    // does not replace it.
    with_meter(&fake2, None, |m| {
        t2.create(
            &l2,
            0,
            m,
            || {
                fake2.make(64 * MB);
                Ok(0xd1)
            },
            |_| true,
        )
    });
    assert_eq!(l2.used(0, UsageKind::Context), 264 * MB);
    assert_eq!(fake2.fp.get(), 200 * MB);
}

/// The container's first context on a device: nothing known to admit, so the creator
/// holds the context-creation lock from before the admission until the measurement is
/// stored (a process starting at the same moment waits for it, then admits it).
#[test]
fn an_unknown_footprint_is_measured_under_the_lock_and_stored_before_it_is_released() {
    use std::rc::Rc;
    let l = MemLedger::with_limit(0, 1024 * MB);
    let t = ContextTable::default();
    let fp = Rc::new(std::cell::Cell::new(0u64));
    let stored_at_release = Rc::new(std::cell::Cell::new(None::<u64>));
    struct Guard(Rc<std::cell::Cell<u64>>, Rc<std::cell::Cell<Option<u64>>>);
    impl Drop for Guard {
        fn drop(&mut self) {
            self.1.set(Some(self.0.get()));
        }
    }
    let own = std::cell::Cell::new(None::<u64>);
    let own_used = |_d: usize| own.get().map_or(OwnUsage::NotListed, OwnUsage::Listed);
    let footprint = |_d: usize| fp.get();
    let set_footprint = |_d: usize, b: u64| fp.set(b);
    let serialize =
        || -> Option<Held> { Some(Box::new(Guard(fp.clone(), stored_at_release.clone()))) };
    let m = ContextMeter {
        own_used: &own_used,
        used_now: &|_| Some(0),
        serialize: &serialize,
        nvml: true,
        footprint: &footprint,
        set_footprint: &set_footprint,
        ..NO_NVML
    };
    // The process is already listed: without the unknown footprint no lock is needed.
    t.listed.store(true, Ordering::Relaxed);
    let (r, o) = t.primary_retain(
        &l,
        0,
        &m,
        || {
            assert!(
                stored_at_release.get().is_none(),
                "lock held around the creation"
            );
            own.set(Some(518 * MB));
            Ok(0xc0)
        },
        |_| true,
    );
    assert_eq!(r, CUDA_SUCCESS);
    assert_eq!(
        stored_at_release.get(),
        Some(518 * MB),
        "stored before the release"
    );
    assert_eq!(l.used(0, UsageKind::Context), 518 * MB);
    assert!(matches!(
        o,
        Some(ContextOutcome::Charged {
            footprint: Footprint::Unknown,
            waited: Some(_),
            ..
        })
    ));
    // Another process waiting on the lock meanwhile reads the stored figure after it.
    let t2 = ContextTable::default();
    let l2 = MemLedger::with_limit(0, 1024 * MB);
    l2.try_charge(0, UsageKind::Data, 600 * MB).unwrap();
    let fp_late = std::cell::Cell::new(0u64);
    let serialize2 = || -> Option<Held> {
        // The first process stores its measurement while we wait.
        fp_late.set(518 * MB);
        Some(Box::new(()))
    };
    let footprint2 = |_d: usize| fp_late.get();
    let m2 = ContextMeter {
        serialize: &serialize2,
        footprint: &footprint2,
        ..m
    };
    let (r, o) = t2.primary_retain(&l2, 0, &m2, || panic!("must not be created"), |_| true);
    assert_eq!(r, CUDA_ERROR_OUT_OF_MEMORY);
    assert!(matches!(
        o,
        Some(ContextOutcome::Refused { footprint: Footprint::Measured(b), .. }) if b == 518 * MB
    ));
}

/// `HAMI_CONTEXT_OVERHEAD` is the footprint: admitted (refused when it does not fit),
/// never stored, no lock; a retain of a retained primary context admits nothing.
#[test]
fn the_configured_overhead_is_admitted_and_retains_admit_nothing_more() {
    let l = MemLedger::with_limit(0, 1024 * MB);
    let a = Accounts::default();
    let t = ContextTable::default();
    let fake = Fake::new(0);
    with_meter(&fake, Some(700 * MB), |m| {
        assert_eq!(
            t.primary_retain(&l, 0, m, || Ok(0xc0), |_| true).0,
            CUDA_SUCCESS
        );
        assert_eq!(
            t.primary_retain(&l, 0, m, || Ok(0xc0), |_| true).0,
            CUDA_SUCCESS
        );
        assert_eq!(
            l.used(0, UsageKind::Context),
            700 * MB,
            "the second retain admits nothing"
        );
        let (r, o) = t.create(&l, 0, m, || panic!("must not be created"), |_| true);
        assert_eq!(r, CUDA_ERROR_OUT_OF_MEMORY);
        assert!(matches!(
            o,
            Some(ContextOutcome::Refused { footprint: Footprint::Configured(b), .. }) if b == 700 * MB
        ));
    });
    assert_eq!(fake.locks.get(), 0);
    assert_eq!(fake.fp.get(), 0, "not a measurement: not stored");
    assert_eq!(t.primary_release(&l, &a, 0, || CUDA_SUCCESS), CUDA_SUCCESS);
    assert_eq!(
        l.used(0, UsageKind::Context),
        700 * MB,
        "still retained once"
    );
    assert_eq!(t.primary_release(&l, &a, 0, || CUDA_SUCCESS), CUDA_SUCCESS);
    assert_eq!(
        l.used(0, UsageKind::Context),
        0,
        "the last release uncharges"
    );
}

/// A region that refuses for another reason than the quota (allocations failing closed)
/// does not refuse the context: created and charged after the measurement, as before.
#[test]
fn a_region_failing_closed_does_not_refuse_the_context() {
    struct Closed(MemLedger);
    impl Ledger for Closed {
        fn try_charge(&self, dev: usize, _: UsageKind, _: u64) -> Result<(), Deny> {
            Err(Deny::LocalConfig(dev))
        }
        fn force_charge(&self, dev: usize, kind: UsageKind, bytes: u64) {
            self.0.force_charge(dev, kind, bytes)
        }
        fn uncharge(&self, dev: usize, kind: UsageKind, bytes: u64) {
            self.0.uncharge(dev, kind, bytes)
        }
    }
    let l = Closed(MemLedger::with_limit(0, 1024 * MB));
    let t = ContextTable::default();
    let fake = Fake::new(300 * MB);
    let (r, o) = with_meter(&fake, None, |m| {
        t.primary_retain(
            &l,
            0,
            m,
            || {
                fake.make(300 * MB);
                Ok(0xc0)
            },
            |_| true,
        )
    });
    assert_eq!(r, CUDA_SUCCESS);
    assert_eq!(l.0.used(0, UsageKind::Context), 300 * MB);
    assert!(matches!(
        o,
        Some(ContextOutcome::Charged {
            admitted: false,
            ..
        })
    ));
}

/// The container's first context, admitted after its measurement, meets a region that
/// cannot decide (its lock timed out): not a quota refusal, so the context stays and
/// what the driver took is recorded all the same.
#[test]
fn a_first_context_whose_late_admission_times_out_is_kept_and_recorded() {
    use hami_common::region::{Denied, DenyReason};
    struct Timeouts(MemLedger, std::cell::Cell<u32>);
    impl Ledger for Timeouts {
        fn try_charge(&self, dev: usize, kind: UsageKind, bytes: u64) -> Result<(), Deny> {
            self.1.set(self.1.get() + 1);
            if self.1.get() == 1 {
                return self.0.try_charge(dev, kind, bytes);
            }
            Err(Deny::Region(Denied {
                reason: DenyReason::LockTimeout,
                dev,
                limit: 1024 * MB,
                used: 0,
                requested: bytes,
            }))
        }
        fn force_charge(&self, dev: usize, kind: UsageKind, bytes: u64) {
            self.0.force_charge(dev, kind, bytes)
        }
        fn uncharge(&self, dev: usize, kind: UsageKind, bytes: u64) {
            self.0.uncharge(dev, kind, bytes)
        }
    }
    let l = Timeouts(MemLedger::with_limit(0, 1024 * MB), std::cell::Cell::new(0));
    let t = ContextTable::default();
    let fake = Fake::new(0);
    let (r, _) = with_meter(&fake, None, |m| {
        t.create(
            &l,
            0,
            m,
            || {
                fake.make(300 * MB);
                Ok(0xc0)
            },
            |_| panic!("not a quota refusal: must not be destroyed"),
        )
    });
    assert_eq!(r, CUDA_SUCCESS);
    assert_eq!(
        l.1.get(),
        2,
        "admitted before (nothing) and after (the measurement)"
    );
    assert_eq!(l.0.used(0, UsageKind::Context), 300 * MB);
}

/// The container's first context on a device, with nothing known to admit, turns out
/// not to fit (a quota smaller than a context): it is destroyed again and refused, and
/// its measurement stored, so the next creation is refused before the driver is asked.
#[test]
fn a_first_context_that_turns_out_not_to_fit_is_destroyed_and_refused() {
    let l = MemLedger::with_limit(0, 256 * MB);
    let t = ContextTable::default();
    let fake = Fake::new(0);
    let undone = std::cell::Cell::new(Vec::new());
    for create in [false, true] {
        let (r, o) = with_meter(&fake, None, |m| {
            let call = || {
                fake.make(300 * MB);
                Ok(0xc0 + create as usize)
            };
            let undo = |ctx: usize| {
                let mut v = undone.take();
                v.push(ctx);
                undone.set(v);
                true
            };
            if create {
                t.create(&l, 0, m, call, undo)
            } else {
                t.primary_retain(&l, 0, m, call, undo)
            }
        });
        assert_eq!(r, CUDA_ERROR_OUT_OF_MEMORY);
        assert!(
            matches!(
                o,
                Some(ContextOutcome::Refused { footprint: Footprint::Measured(b), destroyed: true, .. })
                    if b == 300 * MB
            ),
            "{o:?}"
        );
        assert_eq!(l.total(0), 0, "nothing stays charged");
        fake.fp.set(0); // forget it, to take the same path with a created context
        fake.own.set(None);
    }
    assert_eq!(undone.take(), vec![0xc0, 0xc1]);
    assert_eq!(t.primary_ctx(0), 0);
    // Stored: the next one is refused before the driver is called.
    let (r, _) = with_meter(&fake, None, |m| {
        t.primary_retain(
            &l,
            0,
            m,
            || {
                fake.make(300 * MB);
                Ok(0xc2)
            },
            |_| true,
        )
    });
    assert_eq!(r, CUDA_ERROR_OUT_OF_MEMORY);
    assert_eq!(fake.fp.get(), 300 * MB);
    let (r, o) = with_meter(&fake, None, |m| {
        t.primary_retain(&l, 0, m, || panic!("must not be created"), |_| true)
    });
    assert_eq!(r, CUDA_ERROR_OUT_OF_MEMORY);
    assert!(matches!(
        o,
        Some(ContextOutcome::Refused {
            destroyed: false,
            ..
        })
    ));
    // A context the driver does not destroy stays, charged beyond the quota.
    fake.fp.set(0);
    let (r, _) = with_meter(&fake, None, |m| {
        t.create(
            &l,
            0,
            m,
            || {
                fake.make(300 * MB);
                Ok(0xc3)
            },
            |_| false,
        )
    });
    assert_eq!(r, CUDA_SUCCESS);
    assert_eq!(l.used(0, UsageKind::Context), 300 * MB);
}
