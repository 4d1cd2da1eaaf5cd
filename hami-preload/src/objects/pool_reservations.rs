//! Stream-ordered memory pools (`cuMemAllocAsync`, `cuMemAllocFromPoolAsync`): the region is
//! charged what each pool holds reserved on its device, not what the application asked for.
//!
//! A pool keeps the memory of freed allocations until it is trimmed (`cuMemPoolTrimTo`) or,
//! when that memory exceeds its release threshold, until the next stream, event or context
//! synchronisation. PyTorch's `backend:cudaMallocAsync` sets the threshold to the maximum:
//! what a process once allocated stays on the device. So, per pool:
//!
//! * the charge ([`UsageKind::Pool`], on the pool's device) follows the driver's
//!   `CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT`, re-read around every allocation from the pool,
//!   after trims, at synchronisations when the pool holds more than its threshold, and when a
//!   context is destroyed;
//! * admission of an allocation of `n` bytes charges first what the pool may have to grow by,
//!   `n - (reserved - used)` (`CU_MEMPOOL_ATTR_USED_MEM_CURRENT`); after the call the
//!   reservation is read again, and growth beyond what was admitted (the pool's granularity)
//!   must fit too, else the allocation is given back (free, synchronise that stream, trim the
//!   pool to what it held before) and `CUDA_ERROR_OUT_OF_MEMORY` returned;
//! * a free does not change the charge (the memory stays in the pool);
//! * the charge is never below the bytes of this process's live allocations from the pool
//!   (allocations of a destroyed context are dropped): driver figures saying less are not
//!   believed.
//!
//! Plain Rust over a [`Ledger`]; the driver calls and readings are closures.

use crate::ffi::cuda::{CUresult, CUDA_SUCCESS};
use crate::ledger::accounting::{AllocError, Ledger};
use hami_abi::layout::UsageKind;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

/// What the driver says about a pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct PoolReading {
    /// `CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT`.
    pub reserved: u64,
    /// `CU_MEMPOOL_ATTR_USED_MEM_CURRENT`.
    pub used: u64,
}

/// One pool this process allocated from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolEntry {
    /// Device charged.
    pub dev: usize,
    /// Bytes charged ([`UsageKind::Pool`]).
    pub charged: u64,
    /// Release threshold as last set through `cuMemPoolSetAttribute` (0 = the default).
    pub threshold: u64,
    /// Bytes of allocations from it not yet freed.
    pub outstanding: u64,
    /// `cuMemPoolDestroy` succeeded while allocations were outstanding.
    pub destroyed: bool,
}

#[derive(Default)]
struct Inner {
    pools: HashMap<u64, PoolEntry>,
    /// Pool devices learnt from `cuMemPoolCreate` / `cuDeviceGet(Default)MemPool`.
    devices: HashMap<u64, usize>,
    /// Live allocations: pointer -> (pool, bytes, context).
    ptrs: HashMap<u64, (u64, u64, usize)>,
    /// Release thresholds set before the first allocation from a pool.
    thresholds: HashMap<u64, u64>,
}

/// This process's pools.
#[derive(Default)]
pub struct PoolTable {
    inner: Mutex<Inner>,
    /// Number of pools whose charge a synchronisation may lower (charge above threshold):
    /// the synchronisation hooks do nothing else while it is 0.
    releasable: AtomicUsize,
}

/// Result of [`PoolTable::alloc`] when the driver cannot describe the pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PoolAlloc {
    /// Done (or refused / failed: the error).
    Done(Result<(), AllocError>),
    /// The pool's attributes cannot be read (a driver without them): the caller charges the
    /// allocation by itself instead.
    Unsupported,
}

impl PoolTable {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn recount(&self, g: &Inner) {
        let n = g
            .pools
            .values()
            .filter(|e| !e.destroyed && e.charged > e.threshold)
            .count();
        self.releasable.store(n, Ordering::Relaxed);
    }

    /// Whether a synchronisation may lower some pool's charge.
    #[inline]
    pub fn any_releasable(&self) -> bool {
        self.releasable.load(Ordering::Relaxed) != 0
    }

    /// Records the device of `pool` (from the call that produced the handle).
    pub fn note_device(&self, pool: u64, dev: usize) {
        self.lock().devices.insert(pool, dev);
    }

    /// The device of `pool`, if known.
    pub fn device_of(&self, pool: u64) -> Option<usize> {
        let g = self.lock();
        g.pools
            .get(&pool)
            .map(|e| e.dev)
            .or_else(|| g.devices.get(&pool).copied())
    }

    /// The entry of `pool`, if this process allocated from it.
    pub fn get(&self, pool: u64) -> Option<PoolEntry> {
        self.lock().pools.get(&pool).copied()
    }

    /// Whether `ptr` is a live allocation from a pool.
    pub fn owns(&self, ptr: u64) -> bool {
        self.lock().ptrs.contains_key(&ptr)
    }

    /// Sets `e`'s charge to `target` (force: the driver already holds it).
    fn set_charge<L: Ledger + ?Sized>(ledger: &L, e: &mut PoolEntry, target: u64) {
        if target > e.charged {
            ledger.force_charge(e.dev, UsageKind::Pool, target - e.charged);
        } else if target < e.charged {
            ledger.uncharge(e.dev, UsageKind::Pool, e.charged - target);
        }
        e.charged = target;
    }

    /// An allocation of `bytes` from `pool` on `dev`, in context `ctx`. `read` reads the
    /// pool's attributes, `call` makes the allocation (returns the pointer), `undo(ptr, keep)`
    /// gives it back and trims the pool to `keep` bytes. See the module documentation.
    ///
    /// The charge never goes below what this process's live allocations from the pool take
    /// (a driver whose figures say less is not believed).
    #[allow(clippy::too_many_arguments)]
    pub fn alloc<L: Ledger + ?Sized>(
        &self,
        ledger: &L,
        pool: u64,
        dev: usize,
        ctx: usize,
        bytes: u64,
        read: &dyn Fn() -> Option<PoolReading>,
        call: impl FnOnce() -> Result<u64, CUresult>,
        undo: impl FnOnce(u64, u64),
    ) -> PoolAlloc {
        let mut g = self.lock();
        let Some(before) = read() else {
            return PoolAlloc::Unsupported;
        };
        let dev = g
            .pools
            .get(&pool)
            .map(|e| e.dev)
            .or_else(|| g.devices.get(&pool).copied())
            .unwrap_or(dev);
        let threshold = g.thresholds.get(&pool).copied().unwrap_or(0);
        let mut e = g.pools.get(&pool).copied().unwrap_or(PoolEntry {
            dev,
            charged: 0,
            threshold,
            outstanding: 0,
            destroyed: false,
        });
        // The driver may have released memory we did not see (a synchronisation of a pool
        // under its threshold); start from its figure.
        let used = before.used.max(e.outstanding);
        let reserved = before.reserved.max(used);
        Self::set_charge(ledger, &mut e, reserved);
        let growth = bytes.saturating_sub(reserved - used);
        let result = (|| {
            ledger
                .try_charge(dev, UsageKind::Pool, growth)
                .map_err(AllocError::Denied)?;
            let admitted = e.charged + growth;
            let ptr = match call() {
                Ok(p) => p,
                Err(code) => {
                    ledger.uncharge(dev, UsageKind::Pool, growth);
                    return Err(AllocError::Driver(code));
                }
            };
            e.charged = admitted;
            let floor = e.outstanding.saturating_add(bytes);
            let after = read().map_or(admitted, |r| r.reserved).max(floor);
            if after > admitted {
                if let Err(d) = ledger.try_charge(dev, UsageKind::Pool, after - admitted) {
                    undo(ptr, before.reserved);
                    let now = read().map_or(admitted, |r| r.reserved).max(e.outstanding);
                    Self::set_charge(ledger, &mut e, now);
                    return Err(AllocError::Denied(d));
                }
                e.charged = after;
            } else {
                Self::set_charge(ledger, &mut e, after);
            }
            if ptr != 0 {
                e.outstanding = e.outstanding.saturating_add(bytes);
                if let Some((old_pool, old_bytes, _)) = g.ptrs.insert(ptr, (pool, bytes, ctx)) {
                    // A pointer we still tracked was freed by a path we did not see.
                    if let Some(o) = g.pools.get_mut(&old_pool) {
                        o.outstanding = o.outstanding.saturating_sub(old_bytes);
                    }
                }
            }
            Ok(())
        })();
        g.pools.insert(pool, e);
        self.recount(&g);
        PoolAlloc::Done(result)
    }

    /// `cuMemFreeAsync` of `ptr`: `None` if it is not a pool allocation this process tracks
    /// (the caller handles it). The charge stays: the memory goes back to the pool, not to
    /// the device; only a pool destroyed meanwhile gives it back.
    pub fn free<L: Ledger + ?Sized>(
        &self,
        ledger: &L,
        ptr: u64,
        call: impl FnOnce() -> CUresult,
    ) -> Option<CUresult> {
        let mut g = self.lock();
        let (pool, bytes, ctx) = g.ptrs.remove(&ptr)?;
        let r = call();
        if r != CUDA_SUCCESS {
            g.ptrs.insert(ptr, (pool, bytes, ctx));
            return Some(r);
        }
        if let Some(e) = g.pools.get_mut(&pool) {
            e.outstanding = e.outstanding.saturating_sub(bytes);
            if e.destroyed {
                let keep = e.outstanding.min(e.charged);
                Self::set_charge(ledger, e, keep);
                if e.outstanding == 0 {
                    g.pools.remove(&pool);
                }
            }
        }
        self.recount(&g);
        Some(r)
    }

    /// Re-reads `pool` (`read` returns `None` when the pool is gone: its charge is dropped).
    pub fn refresh<L: Ledger + ?Sized>(
        &self,
        ledger: &L,
        pool: u64,
        read: &dyn Fn(u64) -> Option<PoolReading>,
    ) {
        let mut g = self.lock();
        Self::refresh_locked(ledger, &mut g, pool, read);
        self.recount(&g);
    }

    fn refresh_locked<L: Ledger + ?Sized>(
        ledger: &L,
        g: &mut Inner,
        pool: u64,
        read: &dyn Fn(u64) -> Option<PoolReading>,
    ) {
        let Some(mut e) = g.pools.get(&pool).copied() else {
            return;
        };
        if e.destroyed {
            return;
        }
        match read(pool) {
            Some(r) => {
                let target = r.reserved.max(e.outstanding);
                Self::set_charge(ledger, &mut e, target);
                g.pools.insert(pool, e);
            }
            None => {
                Self::set_charge(ledger, &mut e, 0);
                g.pools.remove(&pool);
                g.ptrs.retain(|_, (p, _, _)| *p != pool);
            }
        }
    }

    /// Re-reads every pool whose charge is above its threshold (after a synchronisation).
    pub fn refresh_releasable<L: Ledger + ?Sized>(
        &self,
        ledger: &L,
        read: &dyn Fn(u64) -> Option<PoolReading>,
    ) {
        if !self.any_releasable() {
            return;
        }
        let mut g = self.lock();
        let due: Vec<u64> = g
            .pools
            .iter()
            .filter(|(_, e)| !e.destroyed && e.charged > e.threshold)
            .map(|(&p, _)| p)
            .collect();
        for p in due {
            Self::refresh_locked(ledger, &mut g, p, read);
        }
        self.recount(&g);
    }

    /// Context `ctx` was destroyed: its allocations are gone (the driver freed them), and
    /// every pool is re-read (the driver may have released their memory).
    pub fn drop_context<L: Ledger + ?Sized>(
        &self,
        ledger: &L,
        ctx: usize,
        read: &dyn Fn(u64) -> Option<PoolReading>,
    ) {
        {
            let mut g = self.lock();
            let gone: Vec<u64> = g
                .ptrs
                .iter()
                .filter(|(_, &(_, _, c))| c == ctx)
                .map(|(&p, _)| p)
                .collect();
            for p in gone {
                if let Some((pool, bytes, _)) = g.ptrs.remove(&p) {
                    if let Some(e) = g.pools.get_mut(&pool) {
                        e.outstanding = e.outstanding.saturating_sub(bytes);
                    }
                }
            }
            // Destroyed pools whose last allocations went with the context are gone.
            let done: Vec<u64> = g
                .pools
                .iter()
                .filter(|(_, e)| e.destroyed && e.outstanding == 0)
                .map(|(&p, _)| p)
                .collect();
            for p in done {
                if let Some(mut e) = g.pools.remove(&p) {
                    Self::set_charge(ledger, &mut e, 0);
                }
            }
        }
        self.refresh_all(ledger, read);
    }

    /// Re-reads every pool.
    pub fn refresh_all<L: Ledger + ?Sized>(
        &self,
        ledger: &L,
        read: &dyn Fn(u64) -> Option<PoolReading>,
    ) {
        let mut g = self.lock();
        let all: Vec<u64> = g.pools.keys().copied().collect();
        for p in all {
            Self::refresh_locked(ledger, &mut g, p, read);
        }
        self.recount(&g);
    }

    /// `cuMemPoolSetAttribute(CU_MEMPOOL_ATTR_RELEASE_THRESHOLD)` succeeded.
    pub fn set_threshold(&self, pool: u64, threshold: u64) {
        let mut g = self.lock();
        g.thresholds.insert(pool, threshold);
        if let Some(e) = g.pools.get_mut(&pool) {
            e.threshold = threshold;
        }
        self.recount(&g);
    }

    /// `cuMemPoolDestroy`: on success the unused memory is gone; what outstanding
    /// allocations hold stays charged until they are freed.
    pub fn destroy<L: Ledger + ?Sized>(
        &self,
        ledger: &L,
        pool: u64,
        call: impl FnOnce() -> CUresult,
    ) -> CUresult {
        let mut g = self.lock();
        let r = call();
        if r != CUDA_SUCCESS {
            return r;
        }
        g.devices.remove(&pool);
        g.thresholds.remove(&pool);
        if let Some(mut e) = g.pools.remove(&pool) {
            let keep = e.outstanding.min(e.charged);
            Self::set_charge(ledger, &mut e, keep);
            if e.outstanding > 0 {
                e.destroyed = true;
                g.pools.insert(pool, e);
            }
        }
        self.recount(&g);
        r
    }
}

#[cfg(test)]
mod tests;
