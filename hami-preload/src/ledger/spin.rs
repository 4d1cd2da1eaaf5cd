//! A lock for the allocation table's shards: one atomic swap to take it and a plain store to
//! give it back (`std::sync::Mutex` pays a second read-modify-write on unlock, to learn
//! whether a waiter must be woken: about 9 ns each on the hosts measured, four per
//! allocation + free pair).
//!
//! Only for critical sections that are short and never block: the holder never calls the
//! driver and waits for nothing but, rarely, another short lock that is never held while one
//! of these is taken (the allocation table's graveyard, [`crate::ledger::accounting`]). A waiter spins
//! briefly, then yields its CPU, then sleeps in growing steps (up to 1 ms): a holder that was
//! descheduled (more runnable threads than CPUs) or runs at a lower real-time priority on the
//! same CPU gets to run and release it; nobody waits forever on a lock that is released. A
//! panic inside the section releases the lock when the guard is dropped (no poisoning: the
//! protected data are kept consistent by their own code, as with the table's former
//! `Mutex`, whose poison was ignored).

use std::cell::UnsafeCell;
use std::marker::PhantomData;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicBool, Ordering};

/// A spin-then-yield lock around a `T` (see the module documentation).
#[derive(Default)]
pub struct SpinLock<T> {
    locked: AtomicBool,
    value: UnsafeCell<T>,
}

// SAFETY: the lock hands out access to the value to one thread at a time (the swap in `lock`
// is the only way to get a guard), so sharing the lock shares `T` only as `Mutex` does.
unsafe impl<T: Send> Sync for SpinLock<T> {}
// SAFETY: as above; moving the lock moves the value.
unsafe impl<T: Send> Send for SpinLock<T> {}

/// Exclusive access to a [`SpinLock`]'s value until dropped. Neither `Send` nor `Sync` (like
/// `MutexGuard`): the value is reached only from the thread that took the lock.
pub struct SpinGuard<'a, T> {
    lock: &'a SpinLock<T>,
    _not_send: PhantomData<*const ()>,
}

impl<T> SpinLock<T> {
    /// A lock around `value`.
    pub const fn new(value: T) -> SpinLock<T> {
        SpinLock {
            locked: AtomicBool::new(false),
            value: UnsafeCell::new(value),
        }
    }

    /// Takes the lock (waiting as the module documentation says).
    #[inline]
    pub fn lock(&self) -> SpinGuard<'_, T> {
        if self.locked.swap(true, Ordering::Acquire) {
            self.lock_contended();
        }
        SpinGuard {
            lock: self,
            _not_send: PhantomData,
        }
    }

    #[cold]
    #[inline(never)]
    fn lock_contended(&self) {
        let mut round = 0u32;
        loop {
            // Wait on plain loads (no cache-line ping-pong), then try again.
            while self.locked.load(Ordering::Relaxed) {
                backoff(round);
                round = round.saturating_add(1);
            }
            if !self.locked.swap(true, Ordering::Acquire) {
                return;
            }
        }
    }
}

/// The wait of the `round`-th look at a held lock: spin, then yield, then sleep (1 µs,
/// doubling, at most 1 ms).
fn backoff(round: u32) {
    const SPINS: u32 = 64;
    const YIELDS: u32 = SPINS + 16;
    if round < SPINS {
        std::hint::spin_loop();
    } else if round < YIELDS {
        std::thread::yield_now();
    } else {
        let us = 1u64 << (round - YIELDS).min(10);
        std::thread::sleep(std::time::Duration::from_micros(us));
    }
}

impl<T> Drop for SpinGuard<'_, T> {
    #[inline]
    fn drop(&mut self) {
        self.lock.locked.store(false, Ordering::Release);
    }
}

impl<T> Deref for SpinGuard<'_, T> {
    type Target = T;
    #[inline]
    fn deref(&self) -> &T {
        // SAFETY: the guard is the only access to the value while it lives.
        unsafe { &*self.lock.value.get() }
    }
}

impl<T> DerefMut for SpinGuard<'_, T> {
    #[inline]
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: as in `deref`, and `&mut self` makes this the only reference.
        unsafe { &mut *self.lock.value.get() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    #[test]
    fn guards_give_exclusive_access_across_threads() {
        // A non-atomic read-modify-write under the lock: any two holders at once would lose
        // increments (and `inside` would see two).
        let l = SpinLock::new(0u64);
        let inside = AtomicUsize::new(0);
        let threads = 8;
        let per = 20_000;
        std::thread::scope(|s| {
            for _ in 0..threads {
                s.spawn(|| {
                    for _ in 0..per {
                        let mut g = l.lock();
                        assert_eq!(inside.fetch_add(1, Ordering::Relaxed), 0);
                        let v = *g;
                        std::hint::black_box(&v);
                        *g = v + 1;
                        inside.fetch_sub(1, Ordering::Relaxed);
                    }
                });
            }
        });
        assert_eq!(*l.lock(), threads * per);
    }

    #[test]
    fn a_holder_that_sleeps_is_waited_for_not_overtaken() {
        // The holder sleeps inside the section (as if descheduled): the waiter goes through
        // spinning, yielding and sleeping, and gets the lock only after the release.
        let l = SpinLock::new(Vec::new());
        std::thread::scope(|s| {
            let g = {
                let mut g = l.lock();
                g.push("holder");
                g
            };
            let waiter = s.spawn(|| l.lock().push("waiter"));
            std::thread::sleep(std::time::Duration::from_millis(30));
            let mut g = g;
            g.push("holder again");
            drop(g);
            waiter.join().unwrap();
        });
        assert_eq!(*l.lock(), ["holder", "holder again", "waiter"]);
    }

    #[test]
    fn a_panic_inside_releases_the_lock() {
        let l = SpinLock::new(1);
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _g = l.lock();
            panic!("inside");
        }));
        assert!(r.is_err());
        *l.lock() += 1;
        assert_eq!(*l.lock(), 2);
    }
}
