//! The map inside each shard of the allocation table ([`crate::ledger::accounting`]): tracked
//! object (namespace + key) → what it was charged.
//!
//! Open addressing with linear probing in one array, at most 3/4 full (doubling when it
//! would be fuller), and backward-shift deletion (no tombstones: a lookup stops at the first
//! empty slot, and removing an object moves the following ones of its run back). A lookup
//! hashes the key with one multiplication and usually reads one slot; the general-purpose
//! `HashMap` it replaces cost about 80 instructions per removal on the allocation path.
//!
//! The slot index comes from bits 59 and below of the hash: the shard was chosen by the top
//! four bits of the same product ([`crate::ledger::accounting`]), which are therefore the same for
//! every key of one map.

/// Multiplier of the hash (2^64 / golden ratio).
pub(crate) const MIX: u64 = 0x9E37_79B9_7F4A_7C15;

/// Namespaces of keys (the `KeySpace` of the accounting table), as a small integer.
pub(crate) type Space = u8;

/// A map from `(space, key)` to `V`.
pub(crate) struct KeyMap<V: Copy> {
    /// Power-of-two number of slots (0 before the first insertion).
    slots: Vec<Option<(Space, u64, V)>>,
    len: usize,
}

impl<V: Copy> Default for KeyMap<V> {
    fn default() -> Self {
        KeyMap {
            slots: Vec::new(),
            len: 0,
        }
    }
}

/// The hash of `(space, key)`.
#[inline]
pub(crate) fn hash(space: Space, key: u64) -> u64 {
    (key ^ u64::from(space).rotate_right(3)).wrapping_mul(MIX)
}

impl<V: Copy> KeyMap<V> {
    /// Number of entries.
    pub fn len(&self) -> usize {
        self.len
    }

    #[inline]
    fn mask(&self) -> usize {
        self.slots.len().wrapping_sub(1)
    }

    /// The slot where `(space, key)` would be if nothing else were in the way: the bits of
    /// the hash just below its top four (which chose the shard); the high bits of a product
    /// are the well-mixed ones (the low ones of an aligned address's product are zero).
    #[inline]
    fn home(&self, space: Space, key: u64) -> usize {
        let bits = self.slots.len().trailing_zeros();
        ((hash(space, key) << 4) >> (63 - bits) >> 1) as usize
    }

    /// Index of the slot holding `(space, key)`.
    #[inline]
    fn find(&self, space: Space, key: u64) -> Option<usize> {
        if self.len == 0 {
            return None;
        }
        let mask = self.mask();
        let mut i = self.home(space, key);
        // Terminates: the table is never full, so an empty slot ends every run.
        loop {
            match self.slots[i] {
                None => return None,
                Some((s, k, _)) if s == space && k == key => return Some(i),
                Some(_) => i = (i + 1) & mask,
            }
        }
    }

    /// The value of `(space, key)`.
    #[inline]
    pub fn get(&self, space: Space, key: u64) -> Option<V> {
        self.find(space, key)
            .and_then(|i| self.slots[i].map(|(_, _, v)| v))
    }

    /// Whether `(space, key)` is in the map.
    pub fn contains(&self, space: Space, key: u64) -> bool {
        self.find(space, key).is_some()
    }

    /// Sets `(space, key)` to `v`; returns the value it replaces.
    #[inline]
    pub fn insert(&mut self, space: Space, key: u64, v: V) -> Option<V> {
        if (self.len + 1) * 4 > self.slots.len() * 3 {
            self.grow();
        }
        let mask = self.mask();
        let mut i = self.home(space, key);
        loop {
            match &mut self.slots[i] {
                slot @ None => {
                    *slot = Some((space, key, v));
                    self.len += 1;
                    return None;
                }
                Some((s, k, old)) if *s == space && *k == key => {
                    return Some(std::mem::replace(old, v));
                }
                Some(_) => i = (i + 1) & mask,
            }
        }
    }

    /// Removes `(space, key)`; returns its value.
    #[inline]
    pub fn remove(&mut self, space: Space, key: u64) -> Option<V> {
        let i = self.find(space, key)?;
        let v = self.slots[i].map(|(_, _, v)| v);
        self.close(i);
        self.len -= 1;
        v
    }

    /// Empties slot `hole` and moves back the entries after it that may not stay behind an
    /// empty slot (those whose home is not between the hole and where they are).
    fn close(&mut self, mut hole: usize) {
        let mask = self.mask();
        let mut j = hole;
        loop {
            j = (j + 1) & mask;
            let Some((s, k, _)) = self.slots[j] else {
                break;
            };
            let from_home = j.wrapping_sub(self.home(s, k)) & mask;
            let from_hole = j.wrapping_sub(hole) & mask;
            if from_home >= from_hole {
                self.slots[hole] = self.slots[j];
                hole = j;
            }
        }
        self.slots[hole] = None;
    }

    /// Doubles the number of slots (16 at first) and places every entry again.
    #[cold]
    fn grow(&mut self) {
        let n = (self.slots.len() * 2).max(16);
        let old = std::mem::replace(&mut self.slots, vec![None; n]);
        self.len = 0;
        for (s, k, v) in old.into_iter().flatten() {
            self.insert(s, k, v);
        }
    }

    /// Every entry.
    pub fn iter(&self) -> impl Iterator<Item = (Space, u64, V)> + '_ {
        self.slots.iter().flatten().copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// A deterministic pseudo-random sequence (xorshift64*).
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
        }
    }

    fn check_against(m: &KeyMap<u64>, model: &HashMap<(Space, u64), u64>) {
        assert_eq!(m.len(), model.len());
        for (&(s, k), &v) in model {
            assert_eq!(m.get(s, k), Some(v), "({s}, {k:#x})");
        }
        let mut listed: Vec<_> = m.iter().collect();
        listed.sort_unstable();
        let mut want: Vec<_> = model.iter().map(|(&(s, k), &v)| (s, k, v)).collect();
        want.sort_unstable();
        assert_eq!(listed, want);
    }

    #[test]
    fn insert_get_replace_remove() {
        let mut m = KeyMap::default();
        assert_eq!(m.get(0, 7), None);
        assert_eq!(m.remove(0, 7), None, "removing from an empty map");
        assert_eq!(m.insert(0, 7, 70u64), None);
        assert_eq!(
            m.insert(1, 7, 71),
            None,
            "same key, other space: another entry"
        );
        assert_eq!(m.len(), 2);
        assert_eq!(m.get(0, 7), Some(70));
        assert_eq!(m.get(1, 7), Some(71));
        assert_eq!(m.insert(0, 7, 72), Some(70), "replaced");
        assert_eq!(m.len(), 2);
        assert!(m.contains(1, 7));
        assert_eq!(m.remove(1, 7), Some(71));
        assert_eq!(m.remove(1, 7), None, "removed twice");
        assert!(!m.contains(1, 7));
        assert_eq!(m.get(0, 7), Some(72));
        assert_eq!(m.len(), 1);
    }

    /// Random insertions, replacements and removals over a small key set (long runs, runs
    /// that wrap around the end of the array, growth from 16 slots), compared after every
    /// step with `HashMap`.
    #[test]
    fn agrees_with_a_hashmap_under_random_operations() {
        for seed in 1..=20u64 {
            let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9));
            let mut m = KeyMap::default();
            let mut model = HashMap::new();
            // Few distinct keys (many collisions and repeats); device-pointer-like
            // alignment in half the seeds.
            let shift = if seed % 2 == 0 { 20 } else { 0 };
            let keys = 8 + seed * 8;
            for step in 0..3000u64 {
                let r = rng.next();
                let (s, k) = ((r % 4) as Space, ((r >> 8) % keys) << shift);
                if r >> 60 < 9 {
                    assert_eq!(m.insert(s, k, step), model.insert((s, k), step));
                } else {
                    assert_eq!(m.remove(s, k), model.remove(&(s, k)));
                }
                if step % 97 == 0 {
                    check_against(&m, &model);
                }
            }
            check_against(&m, &model);
            // Empty it again in random order: everything found, nothing left.
            let mut all: Vec<_> = model.keys().copied().collect();
            all.sort_unstable_by_key(|&(s, k)| hash(s, k) ^ seed);
            for (s, k) in all {
                assert_eq!(m.remove(s, k), model.remove(&(s, k)));
            }
            check_against(&m, &model);
        }
    }

    /// Device-pointer-like keys (1 MiB apart, and 256 bytes apart) spread over the slots like
    /// random ones: an entry sits on average about ½(1/(1−α) − 1) slots past its home at
    /// load α (Knuth, linear probing); within twice that here (a hash of the low bits would
    /// pile them up by the hundreds).
    #[test]
    fn aligned_keys_spread() {
        for step in [1u64 << 20, 256] {
            let mut m = KeyMap::default();
            for i in 0..3000u64 {
                m.insert(0, 0x7f00_0000_0000 + i * step, i);
            }
            let mask = m.mask();
            let total: usize = m
                .slots
                .iter()
                .enumerate()
                .filter_map(|(j, s)| s.map(|(s, k, _)| j.wrapping_sub(m.home(s, k)) & mask))
                .sum();
            let mean = total as f64 / m.len() as f64;
            let load = m.len() as f64 / m.slots.len() as f64;
            let random = 0.5 * (1.0 / (1.0 - load) - 1.0);
            assert!(
                mean < 2.0 * random,
                "step {step}: mean distance {mean}, {random} for random keys at load {load}"
            );
        }
    }

    /// Keys that all start at the same slot, one near the array's end: a run that wraps
    /// around, whose middle and first entries are removed.
    #[test]
    fn a_run_wrapping_around_the_end_survives_removals_in_its_middle() {
        let mut m = KeyMap::default();
        m.insert(0, 0, 0u64); // 16 slots now.
        m.remove(0, 0);
        let last = m.mask();
        let same: Vec<u64> = (1..u64::MAX)
            .filter(|&k| m.home(0, k) == last)
            .take(6)
            .collect();
        // A few of another home in between (the slot after the end), then the run.
        let next: Vec<u64> = (1..u64::MAX)
            .filter(|&k| m.home(0, k) == 0)
            .take(2)
            .collect();
        let mut model = HashMap::new();
        for (i, &k) in next.iter().chain(&same).enumerate() {
            m.insert(0, k, i as u64);
            model.insert((0, k), i as u64);
        }
        assert_eq!(m.slots.len(), 16, "no growth: 8 of 16");
        check_against(&m, &model);
        for k in [same[2], same[0], next[0]] {
            assert_eq!(m.remove(0, k), model.remove(&(0, k)));
            check_against(&m, &model);
        }
    }
}
