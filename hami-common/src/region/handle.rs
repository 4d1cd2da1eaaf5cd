//! The [`Region`] handle: the mapping, its raw field accessors and the header's getters and
//! setters (admission, slots, locking and snapshots are in the sibling files).

use core::ptr::{addr_of, addr_of_mut};
use core::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::path::PathBuf;
use std::ptr::NonNull;
use std::sync::Arc;

use super::liveness::*;
use super::types::*;
use hami_abi::layout::{
    self, RegionHeader, UsageKind, LOCK_BYTES, MAX_DEVICES, MAX_SLOTS, REGION_SIZE,
};

/// Bytes of the region's header.
pub(super) const HEADER_SIZE: usize = core::mem::size_of::<RegionHeader>();
/// `pthread_mutex_trylock` attempts before blocking (a few microseconds in all).
pub(super) const LOCK_SPINS: u32 = 64;

// The mutex must fit in the bytes the layout reserves for it, at a suitable alignment.
const _: () = assert!(core::mem::size_of::<libc::pthread_mutex_t>() <= LOCK_BYTES);
const _: () = assert!(
    core::mem::offset_of!(RegionHeader, lock) % core::mem::align_of::<libc::pthread_mutex_t>() == 0
);
// UUIDs are read and written as two aligned u64 atomics each.
const _: () = assert!(core::mem::offset_of!(RegionHeader, uuids) % 8 == 0);

/// An open, mapped region. `Send + Sync`; unmapped on drop. Usable after `fork` (the mapping
/// is shared and the lock process-shared); a forked child must register its own slot.
pub struct Region {
    pub(super) map: NonNull<layout::RegionLayout>,
    pub(super) path: PathBuf,
    pub(super) writable: bool,
    pub(super) probe: Arc<dyn LivenessProbe>,
    pub(super) tuning: Tuning,
    /// Charges forced while the lock could not be taken, per device: in the slot's usage
    /// already, added to its `charged` and the totals at this process's next locking.
    pub(super) pending: [AtomicU64; MAX_DEVICES],
}

// SAFETY: the mapping is shared memory accessed only through atomics, raw-pointer volatile
// reads of fields immutable after initialisation, and the process-shared pthread mutex.
unsafe impl Send for Region {}
// SAFETY: as above; no method hands out references to non-atomic mutable data.
unsafe impl Sync for Region {}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: map is the REGION_SIZE mapping made in map_fd and unmapped only here.
        unsafe { libc::munmap(self.map.as_ptr().cast(), REGION_SIZE) };
    }
}

impl core::fmt::Debug for Region {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Region")
            .field("path", &self.path)
            .field("writable", &self.writable)
            .finish_non_exhaustive()
    }
}

impl Region {
    // ---- field access (raw pointers: no reference to non-atomic shared data is made) ----

    pub(super) fn h_init_state(&self) -> &AtomicU32 {
        // SAFETY: atomic field of the live mapping.
        unsafe { &*addr_of!((*self.map.as_ptr()).header.init_state) }
    }

    pub(super) fn mutex(&self) -> *mut libc::pthread_mutex_t {
        // SAFETY: in-bounds field projection of the live mapping.
        unsafe { addr_of_mut!((*self.map.as_ptr()).header.lock).cast() }
    }

    pub(super) fn h_generation(&self) -> &AtomicU64 {
        // SAFETY: atomic field of the live mapping.
        unsafe { &*addr_of!((*self.map.as_ptr()).header.generation) }
    }

    pub(super) fn h_recoveries(&self) -> &AtomicU64 {
        // SAFETY: atomic field of the live mapping.
        unsafe { &*addr_of!((*self.map.as_ptr()).header.owner_died_recoveries) }
    }

    pub(super) fn h_reclaimed(&self) -> &AtomicU64 {
        // SAFETY: atomic field of the live mapping.
        unsafe { &*addr_of!((*self.map.as_ptr()).header.reclaimed_slots) }
    }

    pub(super) fn h_device_count(&self) -> &AtomicU32 {
        // SAFETY: atomic field of the live mapping.
        unsafe { &*addr_of!((*self.map.as_ptr()).header.device_count) }
    }

    pub(super) fn h_limit(&self, d: usize) -> &AtomicU64 {
        // SAFETY: atomic field of the live mapping; d < MAX_DEVICES (indexing panics
        // otherwise; callers check).
        unsafe { &*addr_of!((*self.map.as_ptr()).header.limits[d]) }
    }

    pub(super) fn h_flags(&self, d: usize) -> &AtomicU32 {
        // SAFETY: as h_limit.
        unsafe { &*addr_of!((*self.map.as_ptr()).header.limit_flags[d]) }
    }

    pub(super) fn h_used(&self, d: usize) -> &AtomicU64 {
        // SAFETY: as h_limit.
        unsafe { &*addr_of!((*self.map.as_ptr()).header.used[d]) }
    }

    pub(super) fn h_uuid_words(&self, d: usize) -> [&AtomicU64; 2] {
        // SAFETY: uuids[d] is 16 bytes at an 8-aligned offset (asserted at compile time) in
        // the live mapping; it is only ever accessed as two AtomicU64.
        unsafe {
            let p = addr_of_mut!((*self.map.as_ptr()).header.uuids[d]).cast::<u64>();
            [AtomicU64::from_ptr(p), AtomicU64::from_ptr(p.add(1))]
        }
    }

    pub(super) fn s_pid(&self, i: usize) -> &AtomicU32 {
        // SAFETY: atomic field of the live mapping; i < MAX_SLOTS (callers check).
        unsafe { &*addr_of!((*self.map.as_ptr()).slots[i].pid) }
    }

    pub(super) fn s_status(&self, i: usize) -> &AtomicU32 {
        // SAFETY: as s_pid.
        unsafe { &*addr_of!((*self.map.as_ptr()).slots[i].status) }
    }

    pub(super) fn s_start(&self, i: usize) -> &AtomicU64 {
        // SAFETY: as s_pid.
        unsafe { &*addr_of!((*self.map.as_ptr()).slots[i].start_time) }
    }

    pub(super) fn s_charged(&self, i: usize, d: usize) -> &AtomicU64 {
        // SAFETY: as s_pid; d < MAX_DEVICES.
        unsafe { &*addr_of!((*self.map.as_ptr()).slots[i].charged[d]) }
    }

    pub(super) fn s_host_pid(&self, i: usize) -> &AtomicU32 {
        // SAFETY: as s_pid.
        unsafe { &*addr_of!((*self.map.as_ptr()).slots[i].host_pid) }
    }

    pub(super) fn s_reserve(&self, i: usize, d: usize) -> &AtomicU64 {
        // SAFETY: as s_pid; d < MAX_DEVICES.
        unsafe { &*addr_of!((*self.map.as_ptr()).slots[i].reserve[d]) }
    }

    pub(super) fn h_high_water(&self) -> &AtomicU32 {
        // SAFETY: atomic field of the live mapping.
        unsafe { &*addr_of!((*self.map.as_ptr()).header.slot_high_water) }
    }

    pub(super) fn h_stale_breaks(&self) -> &AtomicU64 {
        // SAFETY: atomic field of the live mapping.
        unsafe { &*addr_of!((*self.map.as_ptr()).header.stale_lock_breaks) }
    }

    pub(super) fn h_ctx_footprint(&self, d: usize) -> &AtomicU64 {
        // SAFETY: as h_limit.
        unsafe { &*addr_of!((*self.map.as_ptr()).header.context_footprint[d]) }
    }

    pub(super) fn h_reserve_reclaims(&self) -> &AtomicU64 {
        // SAFETY: atomic field of the live mapping.
        unsafe { &*addr_of!((*self.map.as_ptr()).header.reserve_reclaims) }
    }

    /// Slot indexes worth scanning: up to the high-water mark (every slot if it is corrupt).
    pub(super) fn slot_range(&self) -> core::ops::Range<usize> {
        let hw = self.h_high_water().load(Ordering::Relaxed) as usize;
        0..if hw == 0 || hw > MAX_SLOTS {
            MAX_SLOTS
        } else {
            hw
        }
    }

    /// Builds a handle on a mapping (default probe and tuning).
    pub(super) fn from_map(
        map: NonNull<layout::RegionLayout>,
        path: &std::path::Path,
        writable: bool,
    ) -> Region {
        Region {
            map,
            path: path.to_path_buf(),
            writable,
            probe: Arc::new(ProcProbe),
            tuning: Tuning::default(),
            pending: [const { AtomicU64::new(0) }; MAX_DEVICES],
        }
    }

    #[inline]
    pub(super) fn s_usage(&self, i: usize, d: usize, k: usize) -> &AtomicU64 {
        // SAFETY: as s_pid; d < MAX_DEVICES, k < USAGE_KINDS.
        unsafe { &*addr_of!((*self.map.as_ptr()).slots[i].usage[d][k]) }
    }

    /// Copies the header fields that are immutable after initialisation.
    pub(super) fn header_constants(&self) -> (u32, u32, u64, u32, u64, [u8; 16]) {
        // SAFETY: in-bounds projections of the live mapping; these fields are written only
        // before INIT_READY is published and never after, so volatile reads see stable values.
        unsafe {
            let h = addr_of!((*self.map.as_ptr()).header);
            (
                addr_of!((*h).version).read_volatile(),
                addr_of!((*h).header_size).read_volatile(),
                addr_of!((*h).total_size).read_volatile(),
                addr_of!((*h).creator_pid).read_volatile(),
                addr_of!((*h).created_unix).read_volatile(),
                addr_of!((*h).boot_id).read_volatile(),
            )
        }
    }

    // ---- device info ----

    /// Records the UUID of device `dev` (as the calling process numbers devices).
    pub fn set_uuid(&self, dev: usize, uuid: [u8; 16]) {
        if dev >= MAX_DEVICES {
            return;
        }
        let Ok(g) = self.lock() else { return };
        let [a, b] = self.h_uuid_words(dev);
        let (na, nb) = uuid_words(&uuid);
        if a.load(Ordering::Relaxed) == na && b.load(Ordering::Relaxed) == nb {
            return;
        }
        g.begin_write();
        a.store(na, Ordering::Relaxed);
        b.store(nb, Ordering::Relaxed);
        g.end_write();
    }

    /// The UUID recorded for `dev` (zero when unknown).
    pub fn uuid(&self, dev: usize) -> [u8; 16] {
        if dev >= MAX_DEVICES {
            return [0; 16];
        }
        let [a, b] = self.h_uuid_words(dev);
        let mut out = [0u8; 16];
        out[..8].copy_from_slice(&a.load(Ordering::Relaxed).to_le_bytes());
        out[8..].copy_from_slice(&b.load(Ordering::Relaxed).to_le_bytes());
        out
    }

    /// The limit of `dev` in bytes (0 = unlimited; 0 for a bad ordinal). Lock-free.
    #[inline]
    pub fn limit(&self, dev: usize) -> u64 {
        if dev >= MAX_DEVICES {
            return 0;
        }
        self.h_limit(dev).load(Ordering::Relaxed)
    }

    /// The limit flags of `dev`. Lock-free.
    #[inline]
    pub fn limit_flags(&self, dev: usize) -> u32 {
        if dev >= MAX_DEVICES {
            return 0;
        }
        self.h_flags(dev).load(Ordering::Relaxed)
    }

    /// The admitted total on `dev` (all processes): their usage plus their unused
    /// reserves; what admission compares with the limit. One atomic load.
    #[inline]
    pub fn admitted(&self, dev: usize) -> u64 {
        if dev >= MAX_DEVICES {
            return 0;
        }
        self.h_used(dev).load(Ordering::Relaxed)
    }

    /// Bytes one CUDA context takes on `dev` as last measured by a process of the region
    /// (0 = not measured yet, and for a bad ordinal). A context is admitted with this figure
    /// before the driver creates it. One atomic load, no lock.
    #[inline]
    pub fn context_footprint(&self, dev: usize) -> u64 {
        if dev >= MAX_DEVICES {
            return 0;
        }
        self.h_ctx_footprint(dev).load(Ordering::Acquire)
    }

    /// Records `bytes` as the footprint of one context on `dev` (a measurement; the latest
    /// one wins). A plain store without the lock; nothing on a read-only mapping or a bad
    /// ordinal. `0` forgets the figure (the next context is measured as the first).
    pub fn set_context_footprint(&self, dev: usize, bytes: u64) {
        if dev >= MAX_DEVICES || !self.writable {
            return;
        }
        self.h_ctx_footprint(dev).store(bytes, Ordering::Release);
    }

    /// The usage of `kind` on `dev` recorded in `slot` (0 if lost). Lock-free.
    pub fn slot_usage(&self, slot: SlotId, dev: usize, kind: UsageKind) -> u64 {
        if dev >= MAX_DEVICES || !self.holds(slot) {
            return 0;
        }
        self.s_usage(slot.index(), dev, kind.index())
            .load(Ordering::Relaxed)
    }

    /// Devices the creator saw.
    pub fn device_count(&self) -> u32 {
        self.h_device_count().load(Ordering::Relaxed)
    }

    /// Records the number of devices a registering process really sees
    /// (`cuDeviceGetCount`), keeping the largest count any process reported (processes of one
    /// container may have different `CUDA_VISIBLE_DEVICES`). Ignores 0 and counts above
    /// [`MAX_DEVICES`] (clamped). Takes the lock; not for hot paths.
    pub fn set_device_count(&self, n: u32) {
        let n = n.min(MAX_DEVICES as u32);
        let cur = self.device_count();
        if n == 0 || (cur >= n && cur <= MAX_DEVICES as u32) {
            return;
        }
        let Ok(g) = self.lock() else { return };
        let cur = self.h_device_count().load(Ordering::Relaxed);
        if cur >= n && cur <= MAX_DEVICES as u32 {
            return;
        }
        g.begin_write();
        self.h_device_count().store(n, Ordering::Relaxed);
        g.end_write();
    }
}

pub(super) fn uuid_words(uuid: &[u8; 16]) -> (u64, u64) {
    let mut a = [0u8; 8];
    let mut b = [0u8; 8];
    a.copy_from_slice(&uuid[..8]);
    b.copy_from_slice(&uuid[8..]);
    (u64::from_le_bytes(a), u64::from_le_bytes(b))
}
