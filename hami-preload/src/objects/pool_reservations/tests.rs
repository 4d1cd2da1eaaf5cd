use super::*;
use crate::ffi::cuda::CUDA_ERROR_OUT_OF_MEMORY;
use crate::ledger::accounting::MemLedger;
use std::cell::{Cell, RefCell};

const MB: u64 = 1 << 20;

/// A pool as the driver keeps it: grows by `step`, releases on trim.
struct FakePool {
    reserved: Cell<u64>,
    used: Cell<u64>,
    step: u64,
    live: RefCell<HashMap<u64, u64>>,
    next: Cell<u64>,
}

impl FakePool {
    fn new(step: u64) -> FakePool {
        FakePool {
            reserved: Cell::new(0),
            used: Cell::new(0),
            step,
            live: RefCell::new(HashMap::new()),
            next: Cell::new(0x1000),
        }
    }
    fn read(&self) -> Option<PoolReading> {
        Some(PoolReading {
            reserved: self.reserved.get(),
            used: self.used.get(),
        })
    }
    fn alloc(&self, n: u64) -> Result<u64, CUresult> {
        let free = self.reserved.get() - self.used.get();
        if n > free {
            self.reserved
                .set(self.reserved.get() + (n - free).div_ceil(self.step) * self.step);
        }
        self.used.set(self.used.get() + n);
        let p = self.next.get();
        self.next.set(p + 0x1000);
        self.live.borrow_mut().insert(p, n);
        Ok(p)
    }
    fn free(&self, p: u64) -> CUresult {
        match self.live.borrow_mut().remove(&p) {
            Some(n) => {
                self.used.set(self.used.get() - n);
                CUDA_SUCCESS
            }
            None => 1,
        }
    }
    fn trim(&self, keep: u64) {
        let floor = self.used.get().div_ceil(self.step) * self.step;
        self.reserved.set(self.reserved.get().min(floor.max(keep)));
    }
}

fn done(r: PoolAlloc) -> Result<(), CUresult> {
    match r {
        PoolAlloc::Done(r) => r.map_err(|e| e.code()),
        PoolAlloc::Unsupported => panic!("unsupported"),
    }
}

/// PyTorch's cudaMallocAsync in two processes of one 4 GiB quota: the first one's freed
/// memory stays in its pool, so the second one is refused.
#[test]
fn freed_memory_stays_charged_until_trimmed() {
    let l = MemLedger::with_limit(0, 4096 * MB);
    let t = PoolTable::default();
    let fp = FakePool::new(32 * MB);
    let read = || fp.read();
    let last = Cell::new(0);
    let r = t.alloc(
        &l,
        0xb1,
        0,
        0xc0,
        2500 * MB,
        &read,
        || {
            let p = fp.alloc(2500 * MB)?;
            last.set(p);
            Ok(p)
        },
        |_, _| {},
    );
    assert_eq!(done(r), Ok(()));
    // The pool rounded up to 2528 MiB: charged in full.
    assert_eq!(l.used(0, UsageKind::Pool), 2528 * MB);
    assert_eq!(
        t.free(&l, last.get(), || fp.free(last.get())),
        Some(CUDA_SUCCESS)
    );
    assert_eq!(l.used(0, UsageKind::Pool), 2528 * MB, "kept in the pool");
    // Reuse inside the pool needs no growth: admitted even though 2500 more would not fit.
    let r = t.alloc(
        &l,
        0xb1,
        0,
        0xc0,
        2000 * MB,
        &read,
        || fp.alloc(2000 * MB),
        |_, _| {},
    );
    assert_eq!(done(r), Ok(()));
    assert_eq!(l.used(0, UsageKind::Pool), 2528 * MB);
    // Another process's pool (same ledger = same region): 2500 MiB more does not fit.
    let other = FakePool::new(32 * MB);
    let oread = || other.read();
    let called = Cell::new(false);
    let r = t.alloc(
        &l,
        0xb2,
        0,
        0xc0,
        2500 * MB,
        &oread,
        || {
            called.set(true);
            other.alloc(2500 * MB)
        },
        |_, _| {},
    );
    assert_eq!(done(r), Err(CUDA_ERROR_OUT_OF_MEMORY));
    assert!(!called.get(), "refused before the driver is called");
    // A trim gives the unused part back.
    fp.trim(0);
    t.refresh(&l, 0xb1, &|_| fp.read());
    assert_eq!(l.used(0, UsageKind::Pool), 2016 * MB);
}

/// Growth beyond what was admitted (the pool's granularity) must fit too; otherwise the
/// allocation is undone and refused.
#[test]
fn rounding_growth_over_the_limit_is_undone() {
    let l = MemLedger::with_limit(0, 100 * MB);
    let t = PoolTable::default();
    let fp = FakePool::new(64 * MB);
    let read = || fp.read();
    let undone = Cell::new((0, u64::MAX));
    // 90 MiB admitted, the pool takes 128 MiB: over the 100 MiB limit.
    let r = t.alloc(
        &l,
        0xb1,
        0,
        0xc0,
        90 * MB,
        &read,
        || fp.alloc(90 * MB),
        |p, keep| {
            undone.set((p, keep));
            fp.free(p);
            fp.trim(keep);
        },
    );
    assert_eq!(done(r), Err(CUDA_ERROR_OUT_OF_MEMORY));
    assert_eq!(undone.get(), (0x1000, 0));
    assert_eq!(l.total(0), 0);
    assert!(!t.owns(0x1000));
    // 30 MiB: the pool takes 64 MiB, which fits.
    let r = t.alloc(
        &l,
        0xb1,
        0,
        0xc0,
        30 * MB,
        &read,
        || fp.alloc(30 * MB),
        |_, _| {},
    );
    assert_eq!(done(r), Ok(()));
    assert_eq!(l.used(0, UsageKind::Pool), 64 * MB);
}

#[test]
fn driver_failure_and_unsupported_pools() {
    let l = MemLedger::with_limit(0, 100 * MB);
    let t = PoolTable::default();
    let fp = FakePool::new(MB);
    let read = || fp.read();
    let r = t.alloc(&l, 0xb1, 0, 0xc0, 10 * MB, &read, || Err(2), |_, _| {});
    assert_eq!(done(r), Err(2));
    assert_eq!(l.total(0), 0);
    let r = t.alloc(&l, 0xb1, 0, 0xc0, 10 * MB, &|| None, || Ok(1), |_, _| {});
    assert_eq!(r, PoolAlloc::Unsupported);
    // Not a pool pointer: the caller handles it.
    assert_eq!(t.free(&l, 0x77, || CUDA_SUCCESS), None);
}

/// Synchronisations re-read only pools above their threshold; a threshold at the
/// maximum (PyTorch) makes them free.
#[test]
fn thresholds_decide_which_pools_a_sync_rereads() {
    let l = MemLedger::with_limit(0, 1 << 40);
    let t = PoolTable::default();
    let fp = FakePool::new(MB);
    let read = || fp.read();
    let p = match t.alloc(
        &l,
        0xb1,
        0,
        0xc0,
        8 * MB,
        &read,
        || fp.alloc(8 * MB),
        |_, _| {},
    ) {
        PoolAlloc::Done(Ok(())) => 0x1000,
        r => panic!("{r:?}"),
    };
    t.set_threshold(0xb1, u64::MAX);
    assert!(!t.any_releasable());
    // A threshold set before the first allocation is kept.
    t.set_threshold(0xb7, u64::MAX);
    let r = t.alloc(
        &l,
        0xb7,
        0,
        0xc0,
        MB,
        &|| {
            Some(PoolReading {
                reserved: 0,
                used: 0,
            })
        },
        || Ok(0x99),
        |_, _| {},
    );
    assert!(matches!(r, PoolAlloc::Done(Ok(()))));
    assert_eq!(t.get(0xb7).map(|e| e.threshold), Some(u64::MAX));
    t.free(&l, p, || fp.free(p));
    let reads = Cell::new(0);
    let counted = |_: u64| {
        reads.set(reads.get() + 1);
        fp.read()
    };
    t.refresh_releasable(&l, &counted);
    assert_eq!(reads.get(), 0);
    t.set_threshold(0xb1, 0);
    assert!(t.any_releasable());
    fp.trim(0); // what the driver does at the synchronisation
    t.refresh_releasable(&l, &counted);
    assert_eq!(reads.get(), 1);
    // Only pool 0xb7's live allocation is left.
    assert_eq!(l.total(0), MB);
    assert!(!t.any_releasable());
}

#[test]
fn destroy_keeps_outstanding_until_freed() {
    let l = MemLedger::with_limit(0, 1 << 40);
    let t = PoolTable::default();
    let fp = FakePool::new(4 * MB);
    let read = || fp.read();
    t.note_device(0xb1, 0);
    for _ in 0..2 {
        let r = t.alloc(
            &l,
            0xb1,
            0,
            0xc0,
            3 * MB,
            &read,
            || fp.alloc(3 * MB),
            |_, _| {},
        );
        assert_eq!(done(r), Ok(()));
    }
    assert_eq!(l.used(0, UsageKind::Pool), 8 * MB);
    assert_eq!(
        t.destroy(&l, 0xb1, || 1),
        1,
        "a failed destroy changes nothing"
    );
    assert_eq!(l.used(0, UsageKind::Pool), 8 * MB);
    assert_eq!(t.destroy(&l, 0xb1, || CUDA_SUCCESS), CUDA_SUCCESS);
    assert_eq!(l.used(0, UsageKind::Pool), 6 * MB);
    t.free(&l, 0x1000, || CUDA_SUCCESS);
    assert_eq!(l.used(0, UsageKind::Pool), 3 * MB);
    t.free(&l, 0x2000, || CUDA_SUCCESS);
    assert_eq!(l.total(0), 0);
    assert!(t.get(0xb1).is_none());
}

/// A driver whose pool figures say less than what is allocated from the pool is not
/// believed; allocations that went with their context stop counting.
#[test]
fn charge_never_below_live_allocations_and_contexts_take_theirs() {
    let l = MemLedger::with_limit(0, 100 * MB);
    let t = PoolTable::default();
    let zero = || Some(PoolReading::default());
    let r = t.alloc(&l, 0xb1, 0, 0xc0, 30 * MB, &zero, || Ok(0x10), |_, _| {});
    assert_eq!(done(r), Ok(()));
    let r = t.alloc(&l, 0xb1, 0, 0xc1, 40 * MB, &zero, || Ok(0x20), |_, _| {});
    assert_eq!(done(r), Ok(()));
    assert_eq!(l.used(0, UsageKind::Pool), 70 * MB);
    let r = t.alloc(&l, 0xb1, 0, 0xc0, 40 * MB, &zero, || Ok(0x30), |_, _| {});
    assert_eq!(done(r), Err(CUDA_ERROR_OUT_OF_MEMORY));
    t.refresh(&l, 0xb1, &|_| Some(PoolReading::default()));
    assert_eq!(l.used(0, UsageKind::Pool), 70 * MB);
    t.drop_context(&l, 0xc0, &|_| Some(PoolReading::default()));
    assert_eq!(l.used(0, UsageKind::Pool), 40 * MB);
    assert!(!t.owns(0x10) && t.owns(0x20));
}

#[test]
fn pools_are_charged_to_their_device_and_gone_pools_dropped() {
    let l = MemLedger::with_limit(1, 1 << 40);
    let t = PoolTable::default();
    let fp = FakePool::new(MB);
    let read = || fp.read();
    t.note_device(0xb9, 1);
    assert_eq!(t.device_of(0xb9), Some(1));
    let r = t.alloc(
        &l,
        0xb9,
        0,
        0xc0,
        5 * MB,
        &read,
        || fp.alloc(5 * MB),
        |_, _| {},
    );
    assert_eq!(done(r), Ok(()));
    assert_eq!(l.used(1, UsageKind::Pool), 5 * MB);
    assert_eq!(l.total(0), 0);
    t.refresh_all(&l, &|_| None);
    assert_eq!(l.total(1), 0);
    assert!(!t.owns(0x1000));
}
