//! `cuMemCreate` handles whose memory outlives their `cuMemRelease`. The driver gives a
//! physical allocation back only when no reference to its handle is left (`cuMemCreate`'s,
//! plus one per `cuMemRetainAllocationHandle`) **and** it is mapped nowhere (`cuMemRelease`'s
//! documentation). A release while mapped therefore keeps the memory, and here it keeps its
//! charge: the charge goes with the last unmap, or with the last release of a retained
//! handle. Without this, create + map + release in a loop held any amount of memory at a
//! charge of zero.
//!
//! Plain Rust: the hooks report what the driver did after it succeeded; the calls that can
//! end an allocation return the handles whose memory the driver has now given back, which
//! the hook uncharges. Only handles that were mapped are held here; a handle never mapped
//! is released by the ordinary path.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Mutex, MutexGuard};

/// What keeps one mapped handle's memory: references this process holds and live mappings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Hold {
    refs: u32,
    maps: u32,
}

#[derive(Default)]
struct Inner {
    handles: HashMap<u64, Hold>,
    /// Live mappings: start address -> (size, handle).
    ranges: BTreeMap<u64, (u64, u64)>,
}

/// The mapped handles of this process (see the module documentation).
#[derive(Default)]
pub struct Mappings {
    inner: Mutex<Inner>,
}

/// What a successful `cuMemRelease` did to a handle held here.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Released {
    /// Not held here (never mapped): the ordinary release path applies.
    NotHeld,
    /// A reference went, but a mapping or another reference keeps the memory.
    StillHeld,
    /// The last reference went and nothing is mapped: the memory is back.
    Gone,
}

impl Mappings {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding this lock left plain data behind: still usable.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `cuMemMap(ptr, size, _, handle, _)` succeeded for a handle the accounting tracks.
    pub fn mapped(&self, ptr: u64, size: u64, handle: u64) {
        let mut g = self.lock();
        if let Some((_, old)) = g.ranges.insert(ptr, (size, handle)) {
            // The driver refuses a map over a live mapping; if one was missed here (an
            // unmap that failed to be seen), the old mapping is gone now.
            if let Some(h) = g.handles.get_mut(&old) {
                h.maps = h.maps.saturating_sub(1);
            }
        }
        g.handles
            .entry(handle)
            .or_insert(Hold { refs: 1, maps: 0 })
            .maps += 1;
    }

    /// `cuMemUnmap` or `cuMemAddressFree` of `[ptr, ptr + size)` succeeded: the mappings
    /// that start in the range are gone. Returns the handles whose memory went with them.
    pub fn unmapped(&self, ptr: u64, size: u64) -> Vec<u64> {
        let mut g = self.lock();
        let hit: Vec<u64> = g
            .ranges
            .range(ptr..ptr.saturating_add(size.max(1)))
            .map(|(&va, _)| va)
            .collect();
        let mut gone = Vec::new();
        for va in hit {
            let Some((_, handle)) = g.ranges.remove(&va) else {
                continue;
            };
            if let Some(h) = g.handles.get_mut(&handle) {
                h.maps = h.maps.saturating_sub(1);
                if h.maps == 0 && h.refs == 0 {
                    g.handles.remove(&handle);
                    gone.push(handle);
                }
            }
        }
        gone
    }

    /// `cuMemRetainAllocationHandle` returned `handle` (one more reference to release).
    pub fn retained(&self, handle: u64) {
        if let Some(h) = self.lock().handles.get_mut(&handle) {
            h.refs = h.refs.saturating_add(1);
        }
    }

    /// Whether `handle` is held here (mapped, or retained and still referenced).
    pub fn holds(&self, handle: u64) -> bool {
        self.lock().handles.contains_key(&handle)
    }

    /// `cuMemRelease(handle)` succeeded.
    pub fn released(&self, handle: u64) -> Released {
        let mut g = self.lock();
        let Some(h) = g.handles.get_mut(&handle) else {
            return Released::NotHeld;
        };
        h.refs = h.refs.saturating_sub(1);
        if h.refs == 0 && h.maps == 0 {
            g.handles.remove(&handle);
            Released::Gone
        } else {
            Released::StillHeld
        }
    }

    /// Number of handles held (for tests and `inspect`).
    pub fn len(&self) -> usize {
        self.lock().handles.len()
    }

    /// Whether no handle is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_release_while_mapped_keeps_the_memory_until_the_unmap() {
        let m = Mappings::default();
        m.mapped(0x1000, 0x200, 7);
        assert!(m.holds(7));
        assert_eq!(m.released(7), Released::StillHeld);
        assert!(m.holds(7));
        assert_eq!(m.unmapped(0x1000, 0x200), vec![7]);
        assert!(m.is_empty());
    }

    #[test]
    fn an_unmap_before_the_release_leaves_the_ordinary_release() {
        let m = Mappings::default();
        m.mapped(0x1000, 0x200, 7);
        assert!(m.unmapped(0x1000, 0x200).is_empty(), "still referenced");
        assert_eq!(m.released(7), Released::Gone);
        assert_eq!(m.released(7), Released::NotHeld);
    }

    #[test]
    fn two_mappings_of_one_handle_both_keep_it() {
        let m = Mappings::default();
        m.mapped(0x1000, 0x200, 7);
        m.mapped(0x9000, 0x200, 7);
        assert_eq!(m.released(7), Released::StillHeld);
        assert!(m.unmapped(0x1000, 0x200).is_empty());
        assert_eq!(m.unmapped(0x9000, 0x200), vec![7]);
    }

    #[test]
    fn a_retained_handle_needs_both_releases() {
        let m = Mappings::default();
        m.mapped(0x1000, 0x200, 7);
        m.retained(7);
        assert_eq!(m.released(7), Released::StillHeld);
        assert!(
            m.unmapped(0x1000, 0x200).is_empty(),
            "the retain's reference holds it"
        );
        assert_eq!(m.released(7), Released::Gone);
    }

    #[test]
    fn an_address_free_over_several_mappings_ends_each() {
        let m = Mappings::default();
        m.mapped(0x1000, 0x100, 1);
        m.mapped(0x1100, 0x100, 2);
        m.mapped(0x5000, 0x100, 3);
        for h in [1, 2, 3] {
            assert_eq!(m.released(h), Released::StillHeld);
        }
        let mut gone = m.unmapped(0x1000, 0x200);
        gone.sort();
        assert_eq!(gone, vec![1, 2]);
        assert!(m.holds(3));
    }

    #[test]
    fn an_unknown_handle_or_range_changes_nothing() {
        let m = Mappings::default();
        m.retained(9);
        assert_eq!(m.released(9), Released::NotHeld);
        assert!(m.unmapped(0, u64::MAX).is_empty());
        assert!(m.is_empty());
    }
}
