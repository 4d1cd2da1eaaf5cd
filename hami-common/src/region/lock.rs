//! The robust process-shared region lock: bounded acquisition, owner-died recovery, the
//! seqlock writers advance for lock-free readers.

use core::sync::atomic::{fence, AtomicU32, Ordering};
use std::io;
use std::time::{Duration, Instant};

use super::handle::*;
use super::liveness::*;
use super::types::*;
use hami_abi::layout::{UsageKind, MAX_DEVICES, MAX_SLOTS, SLOT_ACTIVE, SLOT_FREE, USAGE_KINDS};

/// Longest single `pthread_mutex_timedlock` wait: between slices, the waiter checks the
/// overall timeout and a stale lock word.
const LOCK_SLICE: Duration = Duration::from_millis(50);
/// Thread-id bits of a robust futex word.
const FUTEX_TID_MASK: u32 = 0x3fff_ffff;
/// A robust futex word's "threads are waiting" bit.
const FUTEX_WAITERS: u32 = 0x8000_0000;
/// A robust futex word's "the owner died" bit.
const FUTEX_OWNER_DIED: u32 = 0x4000_0000;

thread_local! {
    /// Until when this thread does not wait for the lock again (its last wait ran out).
    static LOCK_BACKOFF: core::cell::Cell<Option<Instant>> = const { core::cell::Cell::new(None) };
}

/// `pthread_mutex_timedlock` for at most `slice` (its deadline is on `CLOCK_REALTIME`).
fn timedlock(m: *mut libc::pthread_mutex_t, slice: Duration) -> libc::c_int {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut now) };
    let total = now.tv_nsec as u64 + u64::from(slice.subsec_nanos());
    let abs = libc::timespec {
        tv_sec: now.tv_sec
            + slice.as_secs() as libc::time_t
            + (total / 1_000_000_000) as libc::time_t,
        tv_nsec: (total % 1_000_000_000) as libc::c_long,
    };
    // SAFETY: m is an initialised process-shared robust mutex; abs is a valid timespec.
    unsafe { libc::pthread_mutex_timedlock(m, &abs) }
}

/// Whether thread `tid` exists in this process's pid namespace (`kill(tid, 0)` accepts
/// thread ids; `EPERM` means it exists but belongs to someone else).
fn thread_exists(tid: u32) -> bool {
    let Ok(t) = libc::pid_t::try_from(tid) else {
        return false;
    };
    // SAFETY: signal 0 only checks existence and permission.
    let rc = unsafe { libc::kill(t, 0) };
    rc == 0 || io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

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

    /// Takes the region lock, waiting at most [`Tuning::lock_timeout`]. A dead holder's lock
    /// is recovered ([`Region::recover_locked`]); a timeout is [`RegionError::LockTimeout`].
    pub(super) fn lock(&self) -> Result<LockGuard<'_>, RegionError> {
        if !self.writable {
            return Err(self.read_only_err());
        }
        self.locked(self.acquire())
    }

    /// Takes the region lock only if it is free right now (a dead holder's lock is recovered
    /// too); `None` when it is busy or unusable.
    pub(super) fn try_lock(&self) -> Option<LockGuard<'_>> {
        if !self.writable {
            return None;
        }
        // SAFETY: the mutex was initialised (process-shared, robust) before INIT_READY.
        let rc = unsafe { libc::pthread_mutex_trylock(self.mutex()) };
        self.locked(rc).ok()
    }

    /// Turns the result of a pthread lock call into a guard.
    fn locked(&self, rc: libc::c_int) -> Result<LockGuard<'_>, RegionError> {
        match rc {
            0 => {
                let g = LockGuard { region: self };
                Ok(g)
            }
            libc::EOWNERDEAD => {
                let g = LockGuard { region: self };
                self.recover_locked(&g);
                // SAFETY: we own the mutex in the owner-died state; the protected data is
                // consistent again (recover_locked).
                unsafe { libc::pthread_mutex_consistent(self.mutex()) };
                Ok(g)
            }
            libc::ETIMEDOUT => Err(RegionError::LockTimeout {
                path: self.path.clone(),
                waited_ms: self.tuning.lock_timeout.as_millis() as u64,
                holder_tid: self.lock_word().load(Ordering::Relaxed) & FUTEX_TID_MASK,
            }),
            e => Err(RegionError::Lock {
                path: self.path.clone(),
                source: io::Error::from_raw_os_error(e),
            }),
        }
    }

    /// Takes the mutex: a short bounded spin on `pthread_mutex_trylock` first (the lock is
    /// held for a few stores, so a holder running on another CPU releases it within the
    /// spin), then `pthread_mutex_timedlock` in slices until [`Tuning::lock_timeout`] has
    /// passed (`ETIMEDOUT`). After a wait that ran out, the same thread only spins (no wait)
    /// for one more timeout, so that a call needing the lock several times is bounded by one
    /// timeout in all. Between slices, a stale lock word is broken when the tuning
    /// allows it ([`Region::break_stale_lock`]). Every call reports a dead owner the same way
    /// (`EOWNERDEAD`, with the lock taken).
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
        let start = Instant::now();
        // A thread whose last wait ran out does not wait again for one more timeout: one CUDA
        // call that needs the lock more than once (a pool allocation: a forced charge, then an
        // admission) is refused after one timeout, not after several.
        if LOCK_BACKOFF.with(|b| b.get().is_some_and(|until| start < until)) {
            return libc::ETIMEDOUT;
        }
        let deadline = start + self.tuning.lock_timeout;
        let mut seen: Option<(u32, Instant)> = None;
        loop {
            let now = Instant::now();
            if now >= deadline {
                LOCK_BACKOFF.with(|b| b.set(Some(now + self.tuning.lock_timeout)));
                return libc::ETIMEDOUT;
            }
            let slice = (deadline - now).min(LOCK_SLICE);
            let rc = timedlock(self.mutex(), slice);
            if rc != libc::ETIMEDOUT {
                LOCK_BACKOFF.with(|b| b.set(None));
                return rc;
            }
            if self.tuning.break_stale_locks {
                let word = self.lock_word().load(Ordering::Acquire);
                match seen {
                    Some((w, since)) if w == word => {
                        if since.elapsed() >= STALE_LOCK_AGE && self.break_stale_lock(word) {
                            seen = None;
                        }
                    }
                    _ => seen = Some((word, Instant::now())),
                }
            }
        }
    }

    /// The mutex's futex word (glibc: `__lock`, the first `int` of `pthread_mutex_t` on
    /// every Linux ABI): the owner's thread id, plus `FUTEX_WAITERS` and `FUTEX_OWNER_DIED`
    /// for robust mutexes.
    pub(super) fn lock_word(&self) -> &AtomicU32 {
        // SAFETY: the lock bytes are 4-aligned (asserted at compile time) inside the live
        // mapping; glibc itself accesses this word atomically.
        unsafe { AtomicU32::from_ptr(self.mutex().cast::<u32>()) }
    }

    /// Marks a stale lock word owner-died, as the kernel does for a thread that dies holding
    /// a robust mutex: when `word` (seen unchanged for [`STALE_LOCK_AGE`]) names a thread
    /// that does not exist and has no owner-died mark. The next locker then gets `EOWNERDEAD`
    /// and recovers the region. This covers a holder whose robust list the kernel could not
    /// walk, or a lock word copied from elsewhere. Returns whether it marked the word.
    pub(super) fn break_stale_lock(&self, word: u32) -> bool {
        let tid = word & FUTEX_TID_MASK;
        if tid == 0 || word & FUTEX_OWNER_DIED != 0 || thread_exists(tid) {
            return false;
        }
        let marked = (word & FUTEX_WAITERS) | FUTEX_OWNER_DIED;
        if self
            .lock_word()
            .compare_exchange(word, marked, Ordering::AcqRel, Ordering::Relaxed)
            .is_err()
        {
            return false;
        }
        self.h_stale_breaks().fetch_add(1, Ordering::Relaxed);
        // SAFETY: FUTEX_WAKE on a valid, aligned, shared futex word; wakes the waiters so
        // that they see the owner-died mark now rather than at the end of their slice.
        unsafe {
            libc::syscall(
                libc::SYS_futex,
                self.mutex().cast::<u32>(),
                libc::FUTEX_WAKE,
                i32::MAX,
            )
        };
        true
    }

    pub(super) fn read_only_err(&self) -> RegionError {
        RegionError::ReadOnly {
            path: self.path.clone(),
            reason: "mapped read-only".into(),
        }
    }

    /// Owner-died recovery, under the lock. A lock holder changes only the header totals,
    /// its own slot, other slots' `charged` and `reserve` (taking reserves back) and slots of
    /// dead processes; it dies with the process, whose slot is reclaimed here. The totals are
    /// then recomputed from the `charged` of the active slots, which only lock holders change.
    /// (A holder that died between taking a reserve and lowering that slot's `charged`
    /// leaves the slot over-counted by that reserve until its process exits: never under.)
    pub(super) fn recover_locked(&self, g: &LockGuard<'_>) {
        g.begin_write();
        let mut reclaimed = 0u64;
        for i in self.slot_range() {
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
            for i in self.slot_range() {
                if self.s_status(i).load(Ordering::Relaxed) == SLOT_ACTIVE {
                    sum = sum.saturating_add(self.s_charged(i, d).load(Ordering::Relaxed));
                }
            }
            self.h_used(d).store(sum, Ordering::Relaxed);
        }
        self.h_reclaimed().fetch_add(reclaimed, Ordering::Relaxed);
        self.h_recoveries().fetch_add(1, Ordering::Relaxed);
        g.end_write();
    }

    /// Frees slot `i` under the lock (inside a write section). With `subtract`, its
    /// `charged` is subtracted from `used`. Returns the usage it held. Status becomes FREE
    /// last, so a death midway leaves either an ACTIVE slot of a dead process (reclaimed
    /// again) or a FREE one (ignored).
    pub(super) fn clear_slot_locked(
        &self,
        i: usize,
        subtract: bool,
    ) -> [[u64; USAGE_KINDS]; MAX_DEVICES] {
        let mut freed = [[0u64; USAGE_KINDS]; MAX_DEVICES];
        for (d, fd) in freed.iter_mut().enumerate() {
            let charged = self.s_charged(i, d).load(Ordering::Relaxed);
            if subtract && charged != 0 {
                let used = self.h_used(d);
                used.store(
                    used.load(Ordering::Relaxed).saturating_sub(charged),
                    Ordering::Relaxed,
                );
            }
            self.s_charged(i, d).store(0, Ordering::Relaxed);
            self.s_reserve(i, d).store(0, Ordering::Relaxed);
            for (k, fk) in fd.iter_mut().enumerate() {
                *fk = self.s_usage(i, d, k).swap(0, Ordering::Relaxed);
            }
        }
        self.s_status(i).store(SLOT_FREE, Ordering::Relaxed);
        self.s_host_pid(i).store(0, Ordering::Relaxed);
        self.s_pid(i).store(0, Ordering::Relaxed);
        self.s_start(i).store(0, Ordering::Relaxed);
        freed
    }

    /// Claims free slot `i` for `who` (inside a write section).
    pub(super) fn claim_slot_locked(&self, i: usize, who: ProcessId) {
        for d in 0..MAX_DEVICES {
            // A FREE slot may hold leftovers of a clear that was interrupted by death.
            self.s_charged(i, d).store(0, Ordering::Relaxed);
            self.s_reserve(i, d).store(0, Ordering::Relaxed);
            for k in 0..USAGE_KINDS {
                self.s_usage(i, d, k).store(0, Ordering::Relaxed);
            }
        }
        for p in &self.pending {
            p.store(0, Ordering::Relaxed);
        }
        self.s_host_pid(i).store(0, Ordering::Relaxed);
        self.s_pid(i).store(who.pid, Ordering::Relaxed);
        self.s_start(i).store(who.start_time, Ordering::Relaxed);
        self.s_status(i).store(SLOT_ACTIVE, Ordering::Relaxed);
        self.h_high_water()
            .fetch_max(i as u32 + 1, Ordering::Relaxed);
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
            let c = self.s_charged(slot.index(), dev);
            c.store(
                c.load(Ordering::Relaxed).wrapping_add(bytes),
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

    /// Test hook: takes the lock, stops the calling process (`SIGSTOP`) while holding it,
    /// and releases it once continued. Returns whether the lock was taken.
    #[doc(hidden)]
    pub fn __test_hold_lock_while_stopped(&self) -> bool {
        let Ok(g) = self.lock() else { return false };
        // SAFETY: stops this process until someone sends SIGCONT.
        unsafe { libc::raise(libc::SIGSTOP) };
        drop(g);
        true
    }

    /// Test hook: the number of owner-died recoveries so far.
    #[doc(hidden)]
    pub fn __test_recoveries(&self) -> u64 {
        self.h_recoveries().load(Ordering::Relaxed)
    }
}
