//! Admission: charging and releasing usage against the device limits (the hot path).
//!
//! Each slot holds a per-device *reserve*: bytes already admitted (part of the slot's
//! `charged` and of the header's `used`) that no allocation holds yet. An allocation that
//! fits in its process's reserve is charged without the lock (a compare-and-swap on the
//! process's own cache line); a release never takes the lock: the bytes go back to the
//! reserve, and a reserve above twice the quantum is trimmed when the lock is free. Only an
//! allocation that does not fit takes the lock: it returns its reserve to the pool, takes the
//! other slots' reserves back when the device would otherwise be full, and is admitted exactly
//! against the limit with a new reserve. `used <= limit` holds at every instant, and the
//! totals stay exact across crashes because only `charged` (changed under the lock) is ever
//! subtracted from them. See `docs/shared-region.md`.

use core::sync::atomic::Ordering;

use super::handle::*;
use super::lock::LockGuard;
use super::types::*;
use hami_abi::layout::{UsageKind, LIMIT_FLAG_INVALID, MAX_DEVICES, SLOT_ACTIVE};

/// A device's reserve quantum: `reserve` capped at 1/32 of the limit (limit 0: unlimited).
fn quantum(reserve: u64, limit: u64) -> u64 {
    if limit == 0 {
        reserve
    } else {
        reserve.min(limit / 32)
    }
}

impl Region {
    /// Exact admission: charges `bytes` of `kind` on `dev` to `slot` if
    /// `used[dev] + bytes <= limit[dev]` (limit 0 = unlimited), atomically with respect to
    /// every other process and thread. Refuses devices flagged [`LIMIT_FLAG_INVALID`], and
    /// refuses with [`DenyReason::LockTimeout`] rather than waiting past the lock timeout.
    pub fn try_charge(
        &self,
        slot: SlotId,
        dev: usize,
        kind: UsageKind,
        bytes: u64,
    ) -> Result<(), Denied> {
        let deny = |reason, limit, used| Denied {
            reason,
            dev,
            limit,
            used,
            requested: bytes,
        };
        if dev >= MAX_DEVICES {
            return Err(deny(DenyReason::BadDevice, 0, 0));
        }
        if !self.writable {
            return Err(deny(DenyReason::ReadOnly, 0, 0));
        }
        if self.h_flags(dev).load(Ordering::Relaxed) & LIMIT_FLAG_INVALID != 0 {
            let (limit, used) = (self.limit(dev), self.admitted(dev));
            return Err(deny(DenyReason::ConfigInvalid, limit, used));
        }
        if !self.holds(slot) {
            return Err(deny(
                DenyReason::SlotLost,
                self.limit(dev),
                self.admitted(dev),
            ));
        }
        if bytes == 0 {
            return Ok(());
        }
        if self.take_reserve(slot.index(), dev, bytes) {
            self.s_usage(slot.index(), dev, kind.index())
                .fetch_add(bytes, Ordering::Relaxed);
            return Ok(());
        }
        let g = match self.lock() {
            Ok(g) => g,
            Err(RegionError::LockTimeout { .. }) => {
                return Err(deny(
                    DenyReason::LockTimeout,
                    self.limit(dev),
                    self.admitted(dev),
                ))
            }
            Err(_) => return Err(deny(DenyReason::LockFailed, 0, 0)),
        };
        if !self.holds(slot) {
            return Err(deny(
                DenyReason::SlotLost,
                self.limit(dev),
                self.admitted(dev),
            ));
        }
        self.admit_locked(&g, slot.index(), dev, kind, bytes, true)
            .map_err(|used| deny(DenyReason::OverLimit, self.limit(dev), used))
    }

    /// Charges without checking the limit (context memory, which the driver has already
    /// taken). Does nothing on a lost slot, a read-only mapping or a bad device. When the
    /// lock cannot be taken within the timeout, the charge is recorded in the slot's usage
    /// now and added to the totals at this process's next locking.
    pub fn force_charge(&self, slot: SlotId, dev: usize, kind: UsageKind, bytes: u64) {
        if bytes == 0 || dev >= MAX_DEVICES || !self.writable || !self.holds(slot) {
            return;
        }
        let i = slot.index();
        if self.take_reserve(i, dev, bytes) {
            self.s_usage(i, dev, kind.index())
                .fetch_add(bytes, Ordering::Relaxed);
            return;
        }
        match self.lock() {
            Ok(g) => {
                if self.holds(slot) {
                    let _ = self.admit_locked(&g, i, dev, kind, bytes, false);
                }
            }
            Err(RegionError::LockTimeout { .. }) => {
                self.s_usage(i, dev, kind.index())
                    .fetch_add(bytes, Ordering::Relaxed);
                self.pending[dev].fetch_add(bytes, Ordering::Relaxed);
            }
            Err(_) => {}
        }
    }

    /// Releases up to `bytes` of `kind` on `dev` from `slot`, saturating at what the slot
    /// holds (never wraps). Returns the bytes actually subtracted. Never waits for the lock:
    /// the bytes go back to the slot's reserve (still admitted, so never over-granted), and
    /// the reserve is trimmed to the quantum when the lock is free (with no reserve
    /// configured: always, waiting for the lock within the timeout).
    pub fn uncharge(&self, slot: SlotId, dev: usize, kind: UsageKind, bytes: u64) -> u64 {
        if dev >= MAX_DEVICES || !self.writable || !self.holds(slot) {
            return 0;
        }
        let i = slot.index();
        let u = self.s_usage(i, dev, kind.index());
        let mut have = u.load(Ordering::Relaxed);
        let sub = loop {
            let sub = have.min(bytes);
            if sub == 0 {
                return 0;
            }
            match u.compare_exchange_weak(have, have - sub, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => break sub,
                Err(now) => have = now,
            }
        };
        let r = self.s_reserve(i, dev).fetch_add(sub, Ordering::Release) + sub;
        let q = quantum(self.tuning.reserve, self.limit(dev));
        if q == 0 {
            if let Ok(g) = self.lock() {
                self.trim_locked(&g, slot, dev, 0);
            }
        } else if r > 2 * q {
            if let Some(g) = self.try_lock() {
                self.trim_locked(&g, slot, dev, q);
            }
        }
        sub
    }

    /// Spends `bytes` of slot `i`'s reserve on `dev` if it holds that much (lock-free).
    #[inline]
    fn take_reserve(&self, i: usize, dev: usize, bytes: u64) -> bool {
        let r = self.s_reserve(i, dev);
        let mut cur = r.load(Ordering::Relaxed);
        while cur >= bytes {
            match r.compare_exchange_weak(cur, cur - bytes, Ordering::Acquire, Ordering::Relaxed) {
                Ok(_) => return true,
                Err(now) => cur = now,
            }
        }
        false
    }

    /// Under the lock: adds this process's pending forced charges on `dev` to slot `i`.
    fn apply_pending_locked(&self, g: &LockGuard<'_>, i: usize, dev: usize) {
        let p = self.pending[dev].swap(0, Ordering::Relaxed);
        if p != 0 {
            g.begin_write();
            self.s_charged(i, dev).fetch_add(p, Ordering::Relaxed);
            self.h_used(dev).fetch_add(p, Ordering::Relaxed);
            g.end_write();
        }
    }

    /// Under the lock: lowers slot `slot`'s reserve on `dev` to at most `keep`, giving the
    /// rest back to the device.
    fn trim_locked(&self, g: &LockGuard<'_>, slot: SlotId, dev: usize, keep: u64) {
        if !self.holds(slot) {
            return;
        }
        let i = slot.index();
        self.apply_pending_locked(g, i, dev);
        let r = self.s_reserve(i, dev);
        let mut cur = r.load(Ordering::Relaxed);
        while cur > keep {
            match r.compare_exchange_weak(cur, keep, Ordering::AcqRel, Ordering::Relaxed) {
                Ok(_) => {
                    self.release_locked(g, i, dev, cur - keep);
                    return;
                }
                Err(now) => cur = now,
            }
        }
    }

    /// Under the lock: `bytes` taken out of slot `i`'s reserve leave its `charged` and `used`.
    fn release_locked(&self, g: &LockGuard<'_>, i: usize, dev: usize, bytes: u64) {
        g.begin_write();
        let c = self.s_charged(i, dev);
        c.store(
            c.load(Ordering::Relaxed).saturating_sub(bytes),
            Ordering::Relaxed,
        );
        let used = self.h_used(dev);
        used.store(
            used.load(Ordering::Relaxed).saturating_sub(bytes),
            Ordering::Relaxed,
        );
        g.end_write();
    }

    /// Under the lock: admits `bytes` of `kind` on `dev` to slot `i` (checking the limit
    /// when `check`), with a new reserve. `Err(used)` when over the limit even after taking
    /// every reserve back.
    fn admit_locked(
        &self,
        g: &LockGuard<'_>,
        i: usize,
        dev: usize,
        kind: UsageKind,
        bytes: u64,
        check: bool,
    ) -> Result<(), u64> {
        self.apply_pending_locked(g, i, dev);
        // Our own reserve goes back to the pool first: the grant below replaces it.
        let own = self.s_reserve(i, dev).swap(0, Ordering::AcqRel);
        if own != 0 {
            self.release_locked(g, i, dev, own);
        }
        let limit = self.h_limit(dev).load(Ordering::Relaxed);
        let fits = |used: u64| {
            used.checked_add(bytes)
                .is_some_and(|n| limit == 0 || n <= limit)
        };
        let mut used = self.h_used(dev).load(Ordering::Relaxed);
        if check && !fits(used) {
            used = self.reclaim_reserves_locked(g, dev);
            if !fits(used) {
                return Err(used);
            }
        }
        let q = quantum(self.tuning.reserve, limit);
        let extra = if limit == 0 {
            q
        } else {
            q.min(limit.saturating_sub(used.saturating_add(bytes)))
        };
        let grant = bytes.saturating_add(extra);
        g.begin_write();
        // `charged` first: a death between the stores can only over-count (recovery
        // recomputes `used` from the `charged` of live slots, and this slot is dead then).
        self.s_charged(i, dev).fetch_add(grant, Ordering::Relaxed);
        self.h_used(dev)
            .store(used.saturating_add(grant), Ordering::Relaxed);
        self.s_usage(i, dev, kind.index())
            .fetch_add(bytes, Ordering::Relaxed);
        if extra != 0 {
            self.s_reserve(i, dev).fetch_add(extra, Ordering::Release);
        }
        g.end_write();
        Ok(())
    }

    /// Under the lock: takes every slot's reserve on `dev` back (the device is full without
    /// them). Returns the new `used`.
    fn reclaim_reserves_locked(&self, g: &LockGuard<'_>, dev: usize) -> u64 {
        let mut took = false;
        for j in self.slot_range() {
            if self.s_status(j).load(Ordering::Relaxed) != SLOT_ACTIVE
                || self.s_reserve(j, dev).load(Ordering::Relaxed) == 0
            {
                continue;
            }
            let got = self.s_reserve(j, dev).swap(0, Ordering::AcqRel);
            if got != 0 {
                self.release_locked(g, j, dev, got);
                took = true;
            }
        }
        if took {
            self.h_reserve_reclaims().fetch_add(1, Ordering::Relaxed);
        }
        self.h_used(dev).load(Ordering::Relaxed)
    }

    /// Bytes on `dev` that live allocations hold (all processes): the admitted total minus
    /// every slot's unused reserve; what `cuMemGetInfo` reports as used. Scans the slot
    /// table up to its high-water mark; [`Region::admitted`] is the one-load figure.
    pub fn used(&self, dev: usize) -> u64 {
        if dev >= MAX_DEVICES {
            return 0;
        }
        let reserved = self
            .slot_range()
            .filter(|&i| self.s_status(i).load(Ordering::Relaxed) == SLOT_ACTIVE)
            .fold(0u64, |a, i| {
                a.saturating_add(self.s_reserve(i, dev).load(Ordering::Relaxed))
            });
        self.admitted(dev).saturating_sub(reserved)
    }

    /// Returns this process's reserves on every device to the pool and applies its pending
    /// charges (waiting for the lock within the timeout). For tests and orderly shutdown.
    pub fn settle(&self, slot: SlotId) {
        if let Ok(g) = self.lock() {
            for d in 0..MAX_DEVICES {
                self.trim_locked(&g, slot, d, 0);
            }
        }
    }
}
