//! The robust process-shared region lock: bounded acquisition, owner-died recovery, the
//! seqlock writers advance for lock-free readers.

use core::sync::atomic::{fence, Ordering};
use std::io;

use super::*;
use crate::layout::{UsageKind, MAX_DEVICES, MAX_SLOTS, SLOT_ACTIVE, SLOT_FREE, USAGE_KINDS};

/// Held region lock. Unlocks on drop.
pub(super) struct LockGuard<'a> {
    region: &'a Region,
}

impl Drop for LockGuard<'_> {
    fn drop(&mut self) {
        // SAFETY: we hold the mutex (made consistent if it was inherited from a dead owner).
        unsafe { libc::pthread_mutex_unlock(self.region.mutex()) };
    }
}

impl LockGuard<'_> {
    /// Marks the start of an update for lock-free readers (generation becomes odd).
    pub(super) fn begin_write(&self) {
        let g = self.region.h_generation();
        let v = g.load(Ordering::Relaxed);
        // If a writer died mid-update the counter is already odd: move to the next odd value
        // so that readers that saw the old one retry.
        g.store(if v & 1 == 0 { v + 1 } else { v + 2 }, Ordering::Relaxed);
        fence(Ordering::Release);
    }

    /// Marks the end of an update (generation becomes even).
    pub(super) fn end_write(&self) {
        let g = self.region.h_generation();
        let v = g.load(Ordering::Relaxed);
        g.store(v + 1, Ordering::Release);
    }
}

impl Region {
    // ---- lock ----

    pub(super) fn lock(&self) -> Result<LockGuard<'_>, RegionError> {
        if !self.writable {
            return Err(self.read_only_err());
        }
        let rc = self.acquire();
        match rc {
            0 => Ok(LockGuard { region: self }),
            libc::EOWNERDEAD => {
                let g = LockGuard { region: self };
                self.recover_locked(&g);
                // SAFETY: we own the mutex in the owner-died state; the protected data is
                // consistent again (recover_locked).
                unsafe { libc::pthread_mutex_consistent(self.mutex()) };
                Ok(g)
            }
            e => Err(RegionError::Lock {
                path: self.path.clone(),
                source: io::Error::from_raw_os_error(e),
            }),
        }
    }

    /// Takes the mutex: a short bounded spin on `pthread_mutex_trylock` first, then the
    /// blocking `pthread_mutex_lock`. The lock is held for a few stores, so a holder running
    /// on another CPU releases it within the spin, sparing both sides a futex sleep and wake;
    /// a preempted holder makes the spin run out and the caller sleep as before. Both calls
    /// report a dead owner the same way (`EOWNERDEAD`, with the lock taken), handled by
    /// [`Region::lock`] for both.
    pub(super) fn acquire(&self) -> libc::c_int {
        for i in 0..LOCK_SPINS {
            // SAFETY: the mutex was initialised (process-shared, robust) before INIT_READY.
            let rc = unsafe { libc::pthread_mutex_trylock(self.mutex()) };
            if rc != libc::EBUSY {
                return rc;
            }
            for _ in 0..(1u32 << (i / 16).min(3)) {
                core::hint::spin_loop();
            }
        }
        // SAFETY: as above.
        unsafe { libc::pthread_mutex_lock(self.mutex()) }
    }

    pub(super) fn read_only_err(&self) -> RegionError {
        RegionError::ReadOnly {
            path: self.path.clone(),
            reason: "mapped read-only".into(),
        }
    }

    /// Owner-died recovery, under the lock. Every writer only modifies its own slot, slots of
    /// dead processes, and the header totals; so the slots of live processes are exact.
    /// Reclaim every slot whose process is dead, then recompute `used` from active slots.
    pub(super) fn recover_locked(&self, g: &LockGuard<'_>) {
        g.begin_write();
        let mut reclaimed = 0u64;
        for i in 0..MAX_SLOTS {
            if self.s_status(i).load(Ordering::Relaxed) != SLOT_ACTIVE {
                continue;
            }
            let who = ProcessId {
                pid: self.s_pid(i).load(Ordering::Relaxed),
                start_time: self.s_start(i).load(Ordering::Relaxed),
            };
            if self.probe.liveness(who) == Liveness::Dead {
                self.clear_slot_locked(i, false);
                reclaimed += 1;
            }
        }
        for d in 0..MAX_DEVICES {
            let mut sum = 0u64;
            for i in 0..MAX_SLOTS {
                if self.s_status(i).load(Ordering::Relaxed) == SLOT_ACTIVE {
                    for k in 0..USAGE_KINDS {
                        sum = sum.saturating_add(self.s_usage(i, d, k).load(Ordering::Relaxed));
                    }
                }
            }
            self.h_used(d).store(sum, Ordering::Relaxed);
        }
        self.h_reclaimed().fetch_add(reclaimed, Ordering::Relaxed);
        self.h_recoveries().fetch_add(1, Ordering::Relaxed);
        g.end_write();
    }

    /// Frees slot `i` under the lock (inside a write section). With `subtract`, its usage is
    /// subtracted from `used`. Status becomes FREE last, so a death midway leaves either an
    /// ACTIVE slot of a dead process (reclaimed again) or a FREE one (ignored).
    pub(super) fn clear_slot_locked(
        &self,
        i: usize,
        subtract: bool,
    ) -> [[u64; USAGE_KINDS]; MAX_DEVICES] {
        let mut freed = [[0u64; USAGE_KINDS]; MAX_DEVICES];
        for (d, fd) in freed.iter_mut().enumerate() {
            for (k, fk) in fd.iter_mut().enumerate() {
                let u = self.s_usage(i, d, k).load(Ordering::Relaxed);
                if u != 0 {
                    if subtract {
                        let used = self.h_used(d);
                        used.store(
                            used.load(Ordering::Relaxed).saturating_sub(u),
                            Ordering::Relaxed,
                        );
                    }
                    self.s_usage(i, d, k).store(0, Ordering::Relaxed);
                }
                *fk = u;
            }
        }
        self.s_status(i).store(SLOT_FREE, Ordering::Relaxed);
        self.s_pid(i).store(0, Ordering::Relaxed);
        self.s_start(i).store(0, Ordering::Relaxed);
        freed
    }

    /// Claims free slot `i` for `who` (inside a write section).
    pub(super) fn claim_slot_locked(&self, i: usize, who: ProcessId) {
        for d in 0..MAX_DEVICES {
            for k in 0..USAGE_KINDS {
                // A FREE slot may hold leftovers of a clear that was interrupted by death.
                self.s_usage(i, d, k).store(0, Ordering::Relaxed);
            }
        }
        self.s_pid(i).store(who.pid, Ordering::Relaxed);
        self.s_start(i).store(who.start_time, Ordering::Relaxed);
        self.s_status(i).store(SLOT_ACTIVE, Ordering::Relaxed);
    }

    /// Whether slot `s` still holds its owner (under the lock, or racy without it).
    pub(super) fn holds(&self, s: SlotId) -> bool {
        let i = s.index as usize;
        i < MAX_SLOTS
            && self.s_status(i).load(Ordering::Relaxed) == SLOT_ACTIVE
            && self.s_pid(i).load(Ordering::Relaxed) == s.owner.pid
            && self.s_start(i).load(Ordering::Relaxed) == s.owner.start_time
    }

    pub(super) fn limit_differences(&self, cfg: &RegionConfig) -> Vec<LimitDifference> {
        (0..MAX_DEVICES)
            .filter_map(|d| {
                let region_limit = self.h_limit(d).load(Ordering::Relaxed);
                let region_flags = self.h_flags(d).load(Ordering::Relaxed);
                (region_limit != cfg.limits[d] || region_flags != cfg.limit_flags[d]).then_some(
                    LimitDifference {
                        dev: d,
                        region_limit,
                        region_flags,
                        requested_limit: cfg.limits[d],
                        requested_flags: cfg.limit_flags[d],
                    },
                )
            })
            .collect()
    }

    // ---- test hooks ----

    /// Test hook: takes the lock, starts an update of `slot` (adds `bytes` of data usage on
    /// `dev` to the slot but not yet to the totals), and SIGKILLs the calling process while
    /// still holding the lock. Never returns.
    #[doc(hidden)]
    pub fn __test_die_holding_lock(&self, slot: SlotId, dev: usize, bytes: u64) -> ! {
        if let Ok(g) = self.lock() {
            g.begin_write();
            let u = self.s_usage(slot.index(), dev, UsageKind::Data.index());
            u.store(
                u.load(Ordering::Relaxed).wrapping_add(bytes),
                Ordering::Relaxed,
            );
            core::mem::forget(g);
        }
        // SAFETY: kills ourselves; nothing after it runs.
        unsafe {
            libc::kill(libc::getpid(), libc::SIGKILL);
            libc::_exit(137)
        }
    }

    /// Test hook: the number of owner-died recoveries so far.
    #[doc(hidden)]
    pub fn __test_recoveries(&self) -> u64 {
        self.h_recoveries().load(Ordering::Relaxed)
    }
}
