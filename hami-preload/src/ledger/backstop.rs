//! The backstop: device memory of this process that no hook accounted for (graph memory
//! nodes, memory the driver takes for itself, a lazily loaded module between measurements,
//! a context whose measurement failed), charged as [`UsageKind::Other`].
//!
//! Per device, at a bounded rate: this process's used memory as the driver reports it (NVML's
//! per-process figure) minus everything else this process has charged there; negative
//! counts as 0. A refresh of a device runs at most once per interval
//! (`HAMI_BACKSTOP_INTERVAL_MS`, default 1000; 0 turns the backstop off), and only when
//! something asks for it: a synchronisation, a `cuMemGetInfo`, a module measurement, or an
//! allocation that leaves the device's quota with little headroom ([`headroom_small`]).
//! Never on every allocation: an allocation with ample headroom pays two atomic loads.
//!
//! Plain Rust: the readings are arguments, the charge goes through a [`Ledger`].

use crate::ledger::accounting::Ledger;
use hami_abi::layout::{UsageKind, MAX_DEVICES};
use std::sync::atomic::{AtomicU64, Ordering};

/// Headroom below which an allocation asks for a refresh: an eighth of the limit, at least
/// 256 MiB.
#[inline]
pub fn headroom_small(limit: u64, used: u64) -> bool {
    limit != 0 && limit.saturating_sub(used) < (limit / 8).max(256 << 20)
}

/// What "other" should be: the driver's figure for the process minus what every other kind
/// accounts for it (never negative).
pub fn other_target(driver_own: u64, accounted_without_other: u64) -> u64 {
    driver_own.saturating_sub(accounted_without_other)
}

/// Per-device refresh clock.
pub struct Backstop {
    /// Milliseconds (monotonic) of the last refresh per device, plus one (0 = never).
    last: [AtomicU64; MAX_DEVICES],
}

impl Default for Backstop {
    fn default() -> Self {
        Backstop {
            last: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }
}

impl Backstop {
    /// Whether a refresh of `dev` is due at `now_ms` with `interval_ms` between refreshes;
    /// if so it is claimed (one caller refreshes).
    pub fn claim(&self, dev: usize, now_ms: u64, interval_ms: u64) -> bool {
        let Some(last) = self.last.get(dev) else {
            return false;
        };
        let prev = last.load(Ordering::Relaxed);
        if prev != 0 && now_ms.saturating_add(1) < prev.saturating_add(interval_ms) {
            return false;
        }
        last.compare_exchange(
            prev,
            now_ms.saturating_add(1),
            Ordering::Relaxed,
            Ordering::Relaxed,
        )
        .is_ok()
    }

    /// Sets "other" on `dev` from `current` to `target` bytes. Returns the change.
    pub fn apply<L: Ledger + ?Sized>(ledger: &L, dev: usize, current: u64, target: u64) -> i128 {
        if target > current {
            ledger.force_charge(dev, UsageKind::Other, target - current);
        } else if target < current {
            ledger.uncharge(dev, UsageKind::Other, current - target);
        }
        i128::from(target) - i128::from(current)
    }
}

/// Monotonic milliseconds (`CLOCK_MONOTONIC_COARSE`: no system call).
pub fn now_ms() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid out pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut ts) };
    (ts.tv_sec as u64).saturating_mul(1000) + ts.tv_nsec as u64 / 1_000_000
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::accounting::MemLedger;

    const MB: u64 = 1 << 20;

    #[test]
    fn target_and_headroom() {
        assert_eq!(other_target(3240 * MB, 3000 * MB), 240 * MB);
        assert_eq!(other_target(100, 200), 0);
        assert!(!headroom_small(0, u64::MAX), "unlimited: never");
        assert!(!headroom_small(4096 * MB, 1000 * MB));
        assert!(headroom_small(4096 * MB, 3900 * MB));
        assert!(headroom_small(1024 * MB, 800 * MB), "256 MiB floor");
        assert!(headroom_small(1024 * MB, 2048 * MB), "over the limit");
    }

    #[test]
    fn claims_are_rate_limited_per_device() {
        let b = Backstop::default();
        assert!(b.claim(0, 5000, 1000));
        assert!(!b.claim(0, 5500, 1000));
        assert!(b.claim(1, 5500, 1000), "devices are independent");
        assert!(b.claim(0, 6000, 1000));
        assert!(!b.claim(0, 6999, 1000));
        assert!(!b.claim(MAX_DEVICES, 0, 1));
        // At boot time (0 ms) a first claim still works.
        let b = Backstop::default();
        assert!(b.claim(3, 0, 1000));
        assert!(!b.claim(3, 10, 1000));
    }

    #[test]
    fn apply_moves_other_both_ways() {
        let l = MemLedger::with_limit(0, 1 << 30);
        assert_eq!(Backstop::apply(&l, 0, 0, 400 * MB), i128::from(400 * MB));
        assert_eq!(l.used(0, UsageKind::Other), 400 * MB);
        assert_eq!(
            Backstop::apply(&l, 0, 400 * MB, 100 * MB),
            -i128::from(300 * MB)
        );
        assert_eq!(l.used(0, UsageKind::Other), 100 * MB);
        assert_eq!(Backstop::apply(&l, 0, 100 * MB, 100 * MB), 0);
        // Beyond the limit too: the driver already holds it.
        Backstop::apply(&l, 0, 100 * MB, 2 << 30);
        assert_eq!(l.used(0, UsageKind::Other), 2 << 30);
    }
}
