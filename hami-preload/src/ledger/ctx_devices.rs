//! A small cache of context → device, so the allocation path asks the driver only for the
//! current context (`cuCtxGetCurrent`) and not also for its device (`cuCtxGetDevice`) on
//! every call.
//!
//! A context's device never changes while it lives; a destroyed context's handle can be
//! reused by a new context on another device. So every destruction the preload sees (the
//! paths that release a context's objects: [`crate::ledger::accounting::Accounts::drop_context`])
//! empties the cache, and a fill is only stored if no destruction (and no other fill) happened
//! since the caller took its [`CtxDevices::token`], taken before it asked the driver.
//!
//! Lock-free for readers: a sequence counter (even = stable, odd = being written) around a few
//! entries of two words. Writers claim the counter with a compare-and-swap; a fill that loses
//! the race is simply not stored.

use std::sync::atomic::{fence, AtomicU64, AtomicUsize, Ordering};

const ENTRIES: usize = 8;

/// The cache (one per process, in `Accounts`).
pub struct CtxDevices {
    seq: AtomicU64,
    ctx: [AtomicUsize; ENTRIES],
    dev: [AtomicUsize; ENTRIES],
    next: AtomicUsize,
}

impl Default for CtxDevices {
    fn default() -> Self {
        CtxDevices {
            seq: AtomicU64::new(0),
            ctx: std::array::from_fn(|_| AtomicUsize::new(0)),
            dev: std::array::from_fn(|_| AtomicUsize::new(0)),
            next: AtomicUsize::new(0),
        }
    }
}

impl CtxDevices {
    /// The state to pass to [`CtxDevices::fill`]; take it before asking the driver.
    #[inline]
    pub fn token(&self) -> u64 {
        self.seq.load(Ordering::Acquire)
    }

    /// The device of context `ctx` if cached and nothing changed since `token`.
    #[inline]
    pub fn lookup(&self, token: u64, ctx: usize) -> Option<usize> {
        if ctx == 0 || token & 1 != 0 {
            return None;
        }
        let i = (0..ENTRIES).find(|&i| self.ctx[i].load(Ordering::Relaxed) == ctx)?;
        let dev = self.dev[i].load(Ordering::Relaxed);
        // Seqlock read: the entry loads happen before the re-check of the counter.
        fence(Ordering::Acquire);
        (self.seq.load(Ordering::Relaxed) == token).then_some(dev)
    }

    /// Records that `ctx` is on `dev`, as the driver said after `token` was taken. Not stored
    /// if anything changed since.
    pub fn fill(&self, token: u64, ctx: usize, dev: usize) {
        if ctx == 0 || token & 1 != 0 {
            return;
        }
        if self
            .seq
            .compare_exchange(token, token + 1, Ordering::Relaxed, Ordering::Relaxed)
            .is_err()
        {
            return;
        }
        // The odd counter is visible before any entry store.
        fence(Ordering::Release);
        let i = match (0..ENTRIES).find(|&i| self.ctx[i].load(Ordering::Relaxed) == ctx) {
            Some(i) => i,
            None => self.next.fetch_add(1, Ordering::Relaxed) % ENTRIES,
        };
        self.ctx[i].store(ctx, Ordering::Relaxed);
        self.dev[i].store(dev, Ordering::Relaxed);
        self.seq.store(token + 2, Ordering::Release);
    }

    /// Forgets everything (a context was destroyed). Fills in flight are not stored.
    pub fn invalidate(&self) {
        let mut v = self.seq.load(Ordering::Relaxed);
        loop {
            if v & 1 != 0 {
                // A fill is storing two words; it never blocks.
                std::hint::spin_loop();
                v = self.seq.load(Ordering::Relaxed);
                continue;
            }
            match self
                .seq
                .compare_exchange_weak(v, v + 1, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => break,
                Err(now) => v = now,
            }
        }
        fence(Ordering::Release);
        for c in &self.ctx {
            c.store(0, Ordering::Relaxed);
        }
        self.seq.store(v + 2, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fill_then_hit() {
        let c = CtxDevices::default();
        let t = c.token();
        assert_eq!(c.lookup(t, 0x10), None);
        c.fill(t, 0x10, 3);
        let t = c.token();
        assert_eq!(c.lookup(t, 0x10), Some(3));
        assert_eq!(c.lookup(t, 0x20), None);
        // Null context is never cached.
        c.fill(t, 0, 1);
        assert_eq!(c.lookup(c.token(), 0), None);
    }

    #[test]
    fn invalidation_forgets_and_rejects_fills_in_flight() {
        let c = CtxDevices::default();
        c.fill(c.token(), 0x10, 0);
        // A fill that asked the driver before a destruction...
        let before = c.token();
        c.invalidate();
        assert_eq!(c.lookup(c.token(), 0x10), None);
        // ...is not stored: the same handle may now be a context on another device.
        c.fill(before, 0x10, 0);
        assert_eq!(c.lookup(c.token(), 0x10), None);
        // A stale token never hits either.
        c.fill(c.token(), 0x10, 1);
        assert_eq!(c.lookup(before, 0x10), None);
        assert_eq!(c.lookup(c.token(), 0x10), Some(1));
    }

    #[test]
    fn many_contexts_evict_but_stay_correct() {
        let c = CtxDevices::default();
        for i in 1..=3 * ENTRIES {
            c.fill(c.token(), i * 16, i % 16);
        }
        let t = c.token();
        let hits: Vec<usize> = (1..=3 * ENTRIES)
            .filter(|&i| {
                let d = c.lookup(t, i * 16);
                assert!(d.is_none() || d == Some(i % 16));
                d.is_some()
            })
            .collect();
        assert_eq!(hits.len(), ENTRIES);
        // Refilling a cached context updates it in place.
        let last = 3 * ENTRIES * 16;
        c.fill(c.token(), last, 7);
        assert_eq!(c.lookup(c.token(), last), Some(7));
    }

    #[test]
    fn concurrent_readers_never_see_a_destroyed_contexts_device() {
        // The writer re-creates context 0x40 on a new "device" every round (destroy =
        // invalidate, then the truth changes, then a fill). A reader that hits must see the
        // device the context had at some moment of its lookup: between the truth it read
        // before and the one it reads after.
        let c = CtxDevices::default();
        let truth = AtomicUsize::new(0);
        std::thread::scope(|s| {
            s.spawn(|| {
                for round in 1..=20_000usize {
                    c.invalidate();
                    truth.store(round, Ordering::SeqCst);
                    let t = c.token();
                    c.fill(t, 0x40, round);
                }
            });
            for _ in 0..2 {
                s.spawn(|| {
                    let mut hits = 0u32;
                    for _ in 0..200_000 {
                        let before = truth.load(Ordering::SeqCst);
                        let t = c.token();
                        if let Some(d) = c.lookup(t, 0x40) {
                            let after = truth.load(Ordering::SeqCst);
                            assert!(before <= d && d <= after, "{before} {d} {after}");
                            hits += 1;
                        }
                    }
                    std::hint::black_box(hits);
                });
            }
        });
    }
}
