//! Admission: charging and releasing usage against the device limits (the hot path).

use core::sync::atomic::Ordering;

use super::*;
use crate::layout::{UsageKind, LIMIT_FLAG_INVALID, MAX_DEVICES};

impl Region {
    // ---- admission (hot path) ----

    /// Exact admission: charges `bytes` of `kind` on `dev` to `slot` if
    /// `used[dev] + bytes <= limit[dev]` (limit 0 = unlimited), atomically with respect to
    /// every other process and thread. Refuses devices flagged [`LIMIT_FLAG_INVALID`].
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
        let Ok(g) = self.lock() else {
            return Err(deny(DenyReason::LockFailed, 0, 0));
        };
        let limit = self.h_limit(dev).load(Ordering::Relaxed);
        let used = self.h_used(dev).load(Ordering::Relaxed);
        if self.h_flags(dev).load(Ordering::Relaxed) & LIMIT_FLAG_INVALID != 0 {
            return Err(deny(DenyReason::ConfigInvalid, limit, used));
        }
        if !self.holds(slot) {
            return Err(deny(DenyReason::SlotLost, limit, used));
        }
        let new_used = match used.checked_add(bytes) {
            Some(n) if limit == 0 || n <= limit => n,
            _ => return Err(deny(DenyReason::OverLimit, limit, used)),
        };
        g.begin_write();
        // Slot first: a death between the two stores can only over-count (see docs).
        let u = self.s_usage(slot.index(), dev, kind.index());
        u.store(
            u.load(Ordering::Relaxed).saturating_add(bytes),
            Ordering::Relaxed,
        );
        self.h_used(dev).store(new_used, Ordering::Relaxed);
        g.end_write();
        Ok(())
    }

    /// Charges without checking the limit (context memory, which the driver has already
    /// taken). Does nothing on a lost slot, a read-only mapping or a bad device.
    pub fn force_charge(&self, slot: SlotId, dev: usize, kind: UsageKind, bytes: u64) {
        if dev >= MAX_DEVICES {
            return;
        }
        let Ok(g) = self.lock() else { return };
        if !self.holds(slot) {
            return;
        }
        g.begin_write();
        let u = self.s_usage(slot.index(), dev, kind.index());
        u.store(
            u.load(Ordering::Relaxed).saturating_add(bytes),
            Ordering::Relaxed,
        );
        let used = self.h_used(dev);
        used.store(
            used.load(Ordering::Relaxed).saturating_add(bytes),
            Ordering::Relaxed,
        );
        g.end_write();
    }

    /// Releases up to `bytes` of `kind` on `dev` from `slot`, saturating at what the slot
    /// holds (never wraps). Returns the bytes actually subtracted.
    pub fn uncharge(&self, slot: SlotId, dev: usize, kind: UsageKind, bytes: u64) -> u64 {
        if dev >= MAX_DEVICES {
            return 0;
        }
        let Ok(g) = self.lock() else { return 0 };
        if !self.holds(slot) {
            return 0;
        }
        let u = self.s_usage(slot.index(), dev, kind.index());
        let have = u.load(Ordering::Relaxed);
        let sub = have.min(bytes);
        if sub == 0 {
            return 0;
        }
        g.begin_write();
        // Totals first, slot last: a death between them can only over-count.
        let used = self.h_used(dev);
        used.store(
            used.load(Ordering::Relaxed).saturating_sub(sub),
            Ordering::Relaxed,
        );
        u.store(have - sub, Ordering::Relaxed);
        g.end_write();
        sub
    }
}
