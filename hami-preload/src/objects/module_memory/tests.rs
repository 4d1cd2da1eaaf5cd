use super::*;
use crate::ffi::cuda::CUDA_ERROR_OUT_OF_MEMORY;
use crate::ledger::accounting::MemLedger;
use std::cell::Cell;

const MB: u64 = 1 << 20;

#[test]
fn eager_load_over_the_limit_is_unloaded() {
    let l = MemLedger::with_limit(0, 1024 * MB);
    let t = ModuleTable::default();
    let unloaded = Cell::new(0);
    let r = t.load(
        &l,
        Some(0),
        0xc0,
        false,
        Estimate::default(),
        || (Ok(0x30), 1536 * MB),
        |h| unloaded.set(h),
        || false,
    );
    assert_eq!(r.map_err(|e| e.code()), Err(CUDA_ERROR_OUT_OF_MEMORY));
    assert_eq!(unloaded.get(), 0x30);
    assert_eq!(l.total(0), 0);
    assert!(t.get(0x30).is_none());
    // One that fits is charged until unloaded.
    t.load(
        &l,
        Some(0),
        0xc0,
        false,
        Estimate::default(),
        || (Ok(0x31), 512 * MB),
        |_| {},
        || false,
    )
    .unwrap();
    assert_eq!(l.used(0, UsageKind::Module), 512 * MB);
    assert_eq!(t.unload(&l, 0x31, || 400), 400, "failed unload keeps it");
    assert_eq!(l.used(0, UsageKind::Module), 512 * MB);
    assert_eq!(t.unload(&l, 0x31, || CUDA_SUCCESS), CUDA_SUCCESS);
    assert_eq!(l.total(0), 0);
    // Driver failure: nothing charged, nothing unloaded.
    let r = t.load(
        &l,
        Some(0),
        0xc0,
        false,
        Estimate::default(),
        || (Err(200), 0),
        |_| panic!(),
        || false,
    );
    assert_eq!(r, Err(AllocError::Driver(200)));
}

#[test]
fn lazy_stages_are_measured_once_each() {
    let l = MemLedger::with_limit(0, 1024 * MB);
    let t = ModuleTable::default();
    t.load(
        &l,
        Some(0),
        0xc0,
        false,
        Estimate::default(),
        || (Ok(0x30), 0),
        |_| {},
        || false,
    )
    .unwrap();
    assert!(t.any_unlaunched());
    t.note_function(0xf1, 0x30);
    t.note_function(0xf2, 0x99); // not ours: ignored
    assert_eq!(t.owner_of(0xf1), Some(0x30));
    assert_eq!(t.owner_of(0xf2), None);
    assert!(t.claim(0x30, Stage::Lookup, 0xc0));
    assert!(!t.claim(0x30, Stage::Lookup, 0xc0));
    // The lookup brought 1.5 GiB: refused, but charged (the driver holds it).
    let r = t.charge_stage(&l, 0x30, Stage::Lookup, 0xc0, 0, 1536 * MB, || false);
    assert!(r.is_err());
    assert_eq!(l.used(0, UsageKind::Module), 1536 * MB);
    // The launch stage: charged regardless, no error.
    assert!(t.claim(0x30, Stage::Launch, 0xc0));
    assert!(!t.any_unlaunched());
    assert_eq!(
        t.charge_stage(&l, 0x30, Stage::Launch, 0xc0, 0, 8 * MB, || false),
        Ok(())
    );
    assert_eq!(l.used(0, UsageKind::Module), 1544 * MB);
    // Context destroyed: the module and its charge are gone.
    t.drop_context(&l, 0xc0);
    assert_eq!(l.total(0), 0);
    assert_eq!(t.owner_of(0xf1), None);
}

#[test]
fn libraries_survive_their_context_and_are_measured_again() {
    let l = MemLedger::with_limit(1, 1 << 40);
    let t = ModuleTable::default();
    // Loaded without a context: the device is learnt at first use.
    t.load(
        &l,
        None,
        0,
        true,
        Estimate::default(),
        || (Ok(0x31), 0),
        |_| {},
        || false,
    )
    .unwrap();
    assert!(t.claim(0x31, Stage::Lookup, 0xc5));
    t.charge_stage(&l, 0x31, Stage::Lookup, 0xc5, 1, 64 * MB, || false)
        .unwrap();
    assert_eq!(l.used(1, UsageKind::Module), 64 * MB);
    t.drop_context(&l, 0xc5);
    assert_eq!(l.total(1), 0);
    assert!(t.get(0x31).is_some());
    assert!(
        t.claim(0x31, Stage::Lookup, 0xc6),
        "measured again in the next context"
    );
    assert_eq!(t.unload(&l, 0x31, || CUDA_SUCCESS), CUDA_SUCCESS);
    assert!(t.get(0x31).is_none());
}

/// A context destroyed while a load (or a first lookup) in it is in flight: the driver
/// loaded, the context went (with the module's memory) and its sweep ran before the load
/// was recorded. Nothing may stay charged.
#[test]
fn a_context_destroyed_while_a_load_in_it_is_in_flight_leaves_nothing_charged() {
    use crate::ledger::accounting::Accounts;
    let l = MemLedger::with_limit(0, 1 << 40);
    let t = ModuleTable::default();
    let a = Accounts::default();
    let destroy = |ctx| {
        a.drop_context(&l, ctx);
        t.drop_context(&l, ctx);
    };
    let born = a.graveyard.stamp();
    let gone = || a.graveyard.destroyed_since(0xc0, born);
    let measure = || {
        destroy(0xc0);
        (Ok(0x30), 512 * MB)
    };
    t.load(
        &l,
        Some(0),
        0xc0,
        false,
        Estimate::default(),
        measure,
        |_| panic!(),
        gone,
    )
    .unwrap();
    assert_eq!(l.total(0), 0);
    assert!(t.get(0x30).is_none());
    // A library: kept, with nothing charged, measured again at its next use.
    let born = a.graveyard.stamp();
    let gone = || a.graveyard.destroyed_since(0xc1, born);
    let measure = || {
        destroy(0xc1);
        (Ok(0x31), 64 * MB)
    };
    t.load(
        &l,
        Some(0),
        0xc1,
        true,
        Estimate::default(),
        measure,
        |_| panic!(),
        gone,
    )
    .unwrap();
    assert_eq!(t.get(0x31).map(|m| m.charged), Some(0));
    assert_eq!(l.total(0), 0);
    // Its first lookup, in a context destroyed meanwhile: not charged, still to measure.
    assert!(t.claim(0x31, Stage::Lookup, 0xc2));
    let born = a.graveyard.stamp();
    destroy(0xc2);
    let r = t.charge_stage(&l, 0x31, Stage::Lookup, 0xc2, 0, 64 * MB, || {
        a.graveyard.destroyed_since(0xc2, born)
    });
    assert_eq!(r, Ok(()));
    assert_eq!(l.total(0), 0);
    assert!(t.instance(0x31, 0xc2).is_none(), "gone with its context");
    assert!(
        t.claim(0x31, Stage::Lookup, 0xc5),
        "measured in the next one"
    );
    // A load in a live context while another one is destroyed: charged as usual.
    let born = a.graveyard.stamp();
    let measure = || {
        destroy(0xc3);
        (Ok(0x32), 8 * MB)
    };
    t.load(
        &l,
        Some(0),
        0xc4,
        false,
        Estimate::default(),
        measure,
        |_| {},
        || a.graveyard.destroyed_since(0xc4, born),
    )
    .unwrap();
    assert_eq!(l.used(0, UsageKind::Module), 8 * MB);
}

/// A library is loaded into each context it is used in, with its own globals there:
/// used on two devices, it is charged on both; one context's destruction takes only its
/// own instance.
#[test]
fn a_library_used_in_two_contexts_is_charged_in_each() {
    let l = MemLedger::with_limit(0, 1 << 40);
    let t = ModuleTable::default();
    t.context_created(0xa0);
    t.load(
        &l,
        Some(0),
        0xa0,
        true,
        Estimate::default(),
        || (Ok(0x31), 0),
        |_| {},
        || false,
    )
    .unwrap();
    // A context created after the load gets an instance too: two to launch.
    t.context_created(0xb0);
    assert_eq!(t.unlaunched.load(Ordering::Relaxed), 2);
    assert!(t.claim(0x31, Stage::Launch, 0xa0));
    t.charge_stage(&l, 0x31, Stage::Launch, 0xa0, 0, 1536 * MB, || false)
        .unwrap();
    assert!(t.any_unlaunched(), "not yet launched in 0xb0");
    assert!(t.claim(0x31, Stage::Launch, 0xb0));
    assert!(!t.claim(0x31, Stage::Launch, 0xb0));
    t.charge_stage(&l, 0x31, Stage::Launch, 0xb0, 1, 1536 * MB, || false)
        .unwrap();
    assert!(!t.any_unlaunched());
    assert_eq!(l.used(0, UsageKind::Module), 1536 * MB);
    assert_eq!(l.used(1, UsageKind::Module), 1536 * MB);
    assert_eq!(t.get(0x31).map(|m| m.charged), Some(3072 * MB));
    // Device 0's context goes: device 1 still holds its copy.
    t.drop_context(&l, 0xa0);
    assert_eq!(l.total(0), 0);
    assert_eq!(l.used(1, UsageKind::Module), 1536 * MB);
    assert!(!t.any_unlaunched());
    assert_eq!(t.unload(&l, 0x31, || CUDA_SUCCESS), CUDA_SUCCESS);
    assert_eq!(l.total(1), 0);
    assert!(t.instance(0x31, 0xb0).is_none());
}

/// A module lives in one context: measured once, whatever context is current later.
#[test]
fn a_module_is_measured_once_whatever_context_is_current() {
    let l = MemLedger::with_limit(0, 1 << 40);
    let t = ModuleTable::default();
    t.load(
        &l,
        Some(0),
        0xa0,
        false,
        Estimate::default(),
        || (Ok(0x30), 0),
        |_| {},
        || false,
    )
    .unwrap();
    assert!(t.claim(0x30, Stage::Launch, 0xa0));
    assert!(!t.claim(0x30, Stage::Launch, 0xb0));
    assert!(!t.any_unlaunched());
}
const GLOBALS: u64 = 1536 * MB + 24 * 1024;

/// Eager loading: the image's statics are admitted before the driver is called; the
/// measurement raises the charge to what it saw, never adds to the estimate.
#[test]
fn an_eager_load_is_admitted_from_its_image_before_the_driver_call() {
    let l = MemLedger::with_limit(0, 1024 * MB);
    let t = ModuleTable::default();
    let est = Estimate {
        bytes: GLOBALS,
        at_load: true,
        deferred: 0,
    };
    let r = t.load(
        &l,
        Some(0),
        0xc0,
        false,
        est,
        || panic!("the driver must not be called"),
        |_| panic!(),
        || false,
    );
    assert_eq!(r.map_err(|e| e.code()), Err(CUDA_ERROR_OUT_OF_MEMORY));
    assert_eq!(l.total(0), 0);
    let small = Estimate {
        bytes: 100 * MB,
        at_load: true,
        deferred: 0,
    };
    // Measured more: charged what was measured, once.
    t.load(
        &l,
        Some(0),
        0xc0,
        false,
        small,
        || (Ok(0x30), 102 * MB),
        |_| {},
        || false,
    )
    .unwrap();
    assert_eq!(l.used(0, UsageKind::Module), 102 * MB);
    // Measured less (or nothing: the reading failed): the estimate stays.
    t.load(
        &l,
        Some(0),
        0xc0,
        false,
        small,
        || (Ok(0x31), 0),
        |_| {},
        || false,
    )
    .unwrap();
    assert_eq!(l.used(0, UsageKind::Module), 202 * MB);
    // Later stages measured within the estimate add nothing.
    assert!(t.claim(0x31, Stage::Launch, 0xc0));
    t.charge_stage(&l, 0x31, Stage::Launch, 0xc0, 0, 60 * MB, || false)
        .unwrap();
    assert_eq!(l.used(0, UsageKind::Module), 202 * MB);
    // A driver failure gives the admitted estimate back.
    let r = t.load(
        &l,
        Some(0),
        0xc0,
        false,
        small,
        || (Err(218), 0),
        |_| {},
        || false,
    );
    assert_eq!(r, Err(AllocError::Driver(218)));
    assert_eq!(l.used(0, UsageKind::Module), 202 * MB);
    // A measurement over the estimate that does not fit: unloaded, nothing stays.
    let unloaded = Cell::new(0);
    let r = t.load(
        &l,
        Some(0),
        0xc0,
        false,
        small,
        || (Ok(0x32), 900 * MB),
        |h| unloaded.set(h),
        || false,
    );
    assert!(r.is_err());
    assert_eq!(unloaded.get(), 0x32);
    assert_eq!(l.used(0, UsageKind::Module), 202 * MB);
    assert_eq!(t.unload(&l, 0x30, || CUDA_SUCCESS), CUDA_SUCCESS);
    assert_eq!(t.unload(&l, 0x31, || CUDA_SUCCESS), CUDA_SUCCESS);
    assert_eq!(l.total(0), 0);
}

/// Lazy loading: nothing at load; the first lookup or launch admits the estimate before
/// the real call, refused while it does not fit (every try), charged once when it does.
#[test]
fn a_lazy_first_use_is_admitted_from_the_image_and_refused_every_time_it_does_not_fit() {
    let l = MemLedger::with_limit(0, 1024 * MB);
    let t = ModuleTable::default();
    let est = Estimate {
        bytes: GLOBALS,
        at_load: false,
        deferred: 0,
    };
    t.load(
        &l,
        Some(0),
        0xc0,
        false,
        est,
        || (Ok(0x30), 0),
        |_| {},
        || false,
    )
    .unwrap();
    assert_eq!(l.total(0), 0);
    for stage in [Stage::Lookup, Stage::Launch, Stage::Launch] {
        let c = t.claim_admit(&l, 0x30, stage, 0xc0, 0);
        assert!(matches!(c, Claim::Refused(_)), "{c:?}");
        assert_eq!(l.total(0), 0);
    }
    assert!(t.any_unlaunched(), "still to launch");
    // A small allocation still fits.
    l.try_charge(0, UsageKind::Data, 512 * MB).unwrap();
    // Within a larger quota: admitted, then the measurement corrects upwards only.
    let l = MemLedger::with_limit(0, 4096 * MB);
    assert_eq!(
        t.claim_admit(&l, 0x30, Stage::Lookup, 0xc0, 0),
        Claim::Todo { admitted: GLOBALS }
    );
    assert_eq!(l.used(0, UsageKind::Module), GLOBALS);
    // The lookup brought nothing yet: the estimate stays.
    t.charge_stage(&l, 0x30, Stage::Lookup, 0xc0, 0, 0, || false)
        .unwrap();
    assert_eq!(
        t.claim_admit(&l, 0x30, Stage::Launch, 0xc0, 0),
        Claim::Todo { admitted: 0 }
    );
    // The launch brought the globals, page-rounded: charged that, not estimate + it.
    t.charge_stage(&l, 0x30, Stage::Launch, 0xc0, 0, 1538 * MB, || false)
        .unwrap();
    assert_eq!(l.used(0, UsageKind::Module), 1538 * MB);
    assert_eq!(t.claim_admit(&l, 0x30, Stage::Launch, 0xc0, 0), Claim::Done);
    assert!(!t.any_unlaunched());
    assert_eq!(t.unload(&l, 0x30, || CUDA_SUCCESS), CUDA_SUCCESS);
    assert_eq!(l.total(0), 0);
}

/// A first use whose driver call fails gives back what was admitted for it, and is
/// admitted again at the next try.
#[test]
fn a_failed_first_use_gives_its_admission_back() {
    let l = MemLedger::with_limit(0, 4096 * MB);
    let t = ModuleTable::default();
    let est = Estimate {
        bytes: 64 * MB,
        at_load: false,
        deferred: 0,
    };
    t.load(
        &l,
        Some(0),
        0xc0,
        false,
        est,
        || (Ok(0x30), 0),
        |_| {},
        || false,
    )
    .unwrap();
    let Claim::Todo { admitted } = t.claim_admit(&l, 0x30, Stage::Lookup, 0xc0, 0) else {
        panic!()
    };
    assert_eq!(l.used(0, UsageKind::Module), 64 * MB);
    t.stage_failed(&l, 0x30, Stage::Lookup, 0xc0, admitted);
    assert_eq!(l.total(0), 0);
    assert_eq!(
        t.claim_admit(&l, 0x30, Stage::Lookup, 0xc0, 0),
        Claim::Todo { admitted: 64 * MB }
    );
    assert_eq!(l.used(0, UsageKind::Module), 64 * MB);
}

/// A library's estimate is admitted in each context it is used in, on that context's
/// device; refused in one, it stays usable in the others.
#[test]
fn a_library_s_estimate_is_admitted_per_context() {
    let l = MemLedger::with_limit(0, 1024 * MB);
    let t = ModuleTable::default();
    let est = Estimate {
        bytes: 600 * MB,
        at_load: false,
        deferred: 0,
    };
    t.load(&l, None, 0, true, est, || (Ok(0x31), 0), |_| {}, || false)
        .unwrap();
    assert_eq!(
        t.claim_admit(&l, 0x31, Stage::Launch, 0xa0, 0),
        Claim::Todo { admitted: 600 * MB }
    );
    // A second context on the same device: 1200 MiB does not fit in 1 GiB.
    assert!(matches!(
        t.claim_admit(&l, 0x31, Stage::Launch, 0xb0, 0),
        Claim::Refused(_)
    ));
    // On another device it fits.
    assert_eq!(
        t.claim_admit(&l, 0x31, Stage::Launch, 0xb0, 1),
        Claim::Todo { admitted: 600 * MB }
    );
    assert_eq!(l.used(0, UsageKind::Module), 600 * MB);
    assert_eq!(l.used(1, UsageKind::Module), 600 * MB);
    // Its context destroyed while the first use was in flight: the admission goes too.
    assert_eq!(
        t.charge_stage(&l, 0x31, Stage::Launch, 0xb0, 1, 600 * MB, || true),
        Ok(())
    );
    assert_eq!(l.total(1), 0);
    t.drop_context(&l, 0xa0);
    assert_eq!(l.total(0), 0);
}

/// A deferred image is read at its first use only (never for a library that is not
/// used), then admitted like any other.
#[test]
fn a_deferred_image_is_read_at_the_first_use() {
    let l = MemLedger::with_limit(0, 1024 * MB);
    let t = ModuleTable::default();
    let est = Estimate {
        bytes: 0,
        at_load: false,
        deferred: 0x7000,
    };
    t.load(&l, None, 0, true, est, || (Ok(0x31), 0), |_| {}, || false)
        .unwrap();
    assert_eq!(
        t.claim_admit(&l, 0x31, Stage::Launch, 0xa0, 0),
        Claim::Read(0x7000)
    );
    assert!(t.any_unlaunched(), "nothing claimed");
    t.set_estimate(0x31, GLOBALS);
    t.set_estimate(0x31, 1);
    assert!(matches!(
        t.claim_admit(&l, 0x31, Stage::Launch, 0xa0, 0),
        Claim::Refused(_)
    ));
    let l = MemLedger::with_limit(0, 4096 * MB);
    assert_eq!(
        t.claim_admit(&l, 0x31, Stage::Launch, 0xa0, 0),
        Claim::Todo { admitted: GLOBALS }
    );
    // The plain claim (no admission) never asks for a reading.
    assert!(!t.claim(0x31, Stage::Launch, 0xa0));
}
