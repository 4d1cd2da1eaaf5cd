//! [`Memo`]: what discovery (and the agent) remember about files and processes, bounded.
//!
//! A node where containers come and go sees new files (new inodes of libcuda, of every
//! library a container maps) for ever: a memo that only grows would grow with the node's
//! uptime. A [`Memo`] forgets in two ways:
//!
//! * **expiry**: its owner moves the memo's *epoch* on at every full pass over what it
//!   remembers (a full `/proc` scan: every live process read, so every file still mapped
//!   is looked up, and so touched); [`Memo::expire`] then drops the entries not touched for
//!   more than the given number of epochs: the files nobody maps any more. One that comes
//!   back is examined again, once.
//! * **a hard cap**: at most [`Memo::cap`] entries. An insert into a full memo first drops
//!   the least recently touched eighth (one `O(n)` selection per `cap / 8` inserts, so a
//!   tenant that maps files by the thousand costs amortised constant time per insert, not a
//!   scan of the memo each).
//!
//! Forgetting only ever costs work (a file read again), never correctness: every memo here
//! caches an answer that can be recomputed.

use std::collections::HashMap;
use std::hash::Hash;

/// A bounded, expiring map (see the module docs).
#[derive(Debug, Clone)]
pub struct Memo<K, V> {
    map: HashMap<K, (V, u64)>,
    cap: usize,
    epoch: u64,
}

impl<K: Eq + Hash + Clone, V> Memo<K, V> {
    /// An empty memo holding at most `cap` entries (at least 1).
    pub fn new(cap: usize) -> Memo<K, V> {
        Memo {
            map: HashMap::new(),
            cap: cap.max(1),
            epoch: 0,
        }
    }

    /// The most entries it holds.
    pub fn cap(&self) -> usize {
        self.cap
    }

    /// Entries held now.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether it holds nothing.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// The current epoch (see [`Memo::advance`]).
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// The value remembered for `k`, touching it (it is in use in this epoch).
    pub fn get(&mut self, k: &K) -> Option<&V> {
        let epoch = self.epoch;
        self.map.get_mut(k).map(|(v, last)| {
            *last = epoch;
            &*v
        })
    }

    /// Whether `k` is remembered, touching it.
    pub fn contains(&mut self, k: &K) -> bool {
        self.get(k).is_some()
    }

    /// The value remembered for `k`, without touching it.
    pub fn peek(&self, k: &K) -> Option<&V> {
        self.map.get(k).map(|(v, _)| v)
    }

    /// Remembers `v` for `k` (touched), dropping the least recently touched eighth first if
    /// the memo is full.
    pub fn insert(&mut self, k: K, v: V) {
        if !self.map.contains_key(&k) && self.map.len() >= self.cap {
            self.evict();
        }
        self.map.insert(k, (v, self.epoch));
    }

    /// Forgets `k`.
    pub fn remove(&mut self, k: &K) -> Option<V> {
        self.map.remove(k).map(|(v, _)| v)
    }

    /// Forgets everything.
    pub fn clear(&mut self) {
        self.map.clear();
    }

    /// Starts a new epoch (the owner begins a full pass).
    pub fn advance(&mut self) {
        self.epoch += 1;
    }

    /// Drops the entries last touched more than `keep` epochs before the current one
    /// (`keep = 0`: everything not touched in this epoch); returns how many went.
    pub fn expire(&mut self, keep: u64) -> usize {
        let before = self.map.len();
        let oldest = self.epoch.saturating_sub(keep);
        self.map.retain(|_, (_, last)| *last >= oldest);
        before - self.map.len()
    }

    /// The keys held (any order).
    pub fn keys(&self) -> impl Iterator<Item = &K> {
        self.map.keys()
    }

    /// Drops the least recently touched `cap / 8` entries (at least one).
    fn evict(&mut self) {
        let n = (self.cap / 8).max(1).min(self.map.len());
        if n == 0 {
            return;
        }
        let mut epochs: Vec<u64> = self.map.values().map(|(_, e)| *e).collect();
        let (_, &mut threshold, _) = epochs.select_nth_unstable(n - 1);
        // Everything older than the threshold goes; of those at the threshold, as many as
        // make up `n`.
        let mut at_threshold = n - epochs[..n].iter().filter(|&&e| e < threshold).count();
        self.map.retain(|_, (_, e)| {
            if *e < threshold {
                false
            } else if *e == threshold && at_threshold > 0 {
                at_threshold -= 1;
                false
            } else {
                true
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn never_holds_more_than_its_cap_and_evicts_the_least_recently_touched() {
        let mut m: Memo<u64, ()> = Memo::new(64);
        // A hot key, touched at every epoch, among thousands of one-off ones.
        for i in 0..10_000u64 {
            if i % 16 == 0 {
                m.advance();
                assert!(
                    i == 0 || m.contains(&u64::MAX),
                    "the hot key was evicted at {i}"
                );
            }
            if i == 0 {
                m.insert(u64::MAX, ());
            }
            m.insert(i, ());
            assert!(m.len() <= m.cap(), "{} entries at insert {i}", m.len());
        }
        // The newest entries are there, the oldest long gone.
        assert!(m.peek(&9_999).is_some());
        assert!(m.peek(&0).is_none());
        assert!(m.peek(&u64::MAX).is_some());
    }

    #[test]
    fn entries_not_touched_expire_and_touched_ones_stay() {
        let mut m: Memo<&str, bool> = Memo::new(16);
        m.insert("gone", false);
        m.insert("mapped", true);
        m.advance();
        assert_eq!(m.get(&"mapped"), Some(&true));
        // Kept for one epoch without being touched ...
        assert_eq!(m.expire(1), 0);
        m.advance();
        assert_eq!(m.get(&"mapped"), Some(&true));
        // ... dropped after two.
        assert_eq!(m.expire(1), 1);
        assert_eq!(m.peek(&"gone"), None);
        assert_eq!(m.peek(&"mapped"), Some(&true));
        assert_eq!(m.len(), 1);
        // `peek` does not touch.
        m.advance();
        m.advance();
        assert_eq!(m.peek(&"mapped"), Some(&true));
        assert_eq!(m.expire(1), 1);
        assert!(m.is_empty());
    }

    #[test]
    fn reinserting_a_key_in_a_full_memo_evicts_nothing() {
        let mut m: Memo<u32, u32> = Memo::new(4);
        for i in 0..4 {
            m.insert(i, i);
        }
        m.insert(2, 20);
        assert_eq!(m.len(), 4);
        assert_eq!(m.peek(&2), Some(&20));
        m.insert(9, 9);
        assert_eq!(m.len(), 4, "one evicted (cap / 8, at least one)");
        assert_eq!(m.remove(&9), Some(9));
        assert_eq!(m.len(), 3);
    }
}
