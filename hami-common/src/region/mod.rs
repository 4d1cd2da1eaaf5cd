//! Region file operations: create / open / validate, the robust process-shared lock, slot
//! registration, exact admission, and reclaim of dead processes' slots.
//!
//! The protocol and the crash-safety argument are in `docs/shared-region.md`.
//!
//! Hot path ([`Region::try_charge`], [`Region::uncharge`], [`Region::force_charge`]): no
//! system call (an uncontended robust mutex is a user-space compare-and-swap), no allocation,
//! the lock held for a handful of loads and stores.

use core::ptr::{addr_of, addr_of_mut};
use core::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::io;
use std::path::PathBuf;
use std::ptr::NonNull;
use std::sync::Arc;
use std::time::Duration;

use crate::config::DEFAULT_REGION_MODE;
use crate::layout::{
    self, RegionHeader, UsageKind, LOCK_BYTES, MAGIC, MAX_DEVICES, MAX_SLOTS, REGION_SIZE,
    USAGE_KINDS,
};

const HEADER_SIZE: usize = core::mem::size_of::<RegionHeader>();
/// `pthread_mutex_trylock` attempts before blocking (a few microseconds in all).
const LOCK_SPINS: u32 = 64;

// The mutex must fit in the bytes the layout reserves for it, at a suitable alignment.
const _: () = assert!(core::mem::size_of::<libc::pthread_mutex_t>() <= LOCK_BYTES);
const _: () = assert!(
    core::mem::offset_of!(RegionHeader, lock) % core::mem::align_of::<libc::pthread_mutex_t>() == 0
);
// UUIDs are read and written as two aligned u64 atomics each.
const _: () = assert!(core::mem::offset_of!(RegionHeader, uuids) % 8 == 0);

mod admission;
mod compute;
mod file;
mod liveness;
mod lock;
mod slots;
mod snapshot;

pub use compute::*;
pub use liveness::*;
pub use snapshot::*;

/// Errors opening, creating or registering in a region. Every message names the file.
#[derive(Debug, thiserror::Error)]
pub enum RegionError {
    /// A system call on the region file failed.
    #[error("shared region {}: {source}", path.display())]
    Io {
        /// The region file.
        path: PathBuf,
        /// The error (its message names the operation).
        source: io::Error,
    },
    /// The file does not start with [`MAGIC`]: not a region file, or corrupt.
    #[error("shared region {}: bad magic {found:02x?} (expected {:02x?}): not a hami-rs region or corrupt", path.display(), MAGIC)]
    BadMagic {
        /// The region file.
        path: PathBuf,
        /// The first 8 bytes found.
        found: [u8; 8],
    },
    /// The file was written with another layout version.
    #[error("shared region {}: layout version {found}, this build understands version {expected}", path.display())]
    VersionMismatch {
        /// The region file.
        path: PathBuf,
        /// Version in the file.
        found: u32,
        /// [`VERSION`].
        expected: u32,
    },
    /// A size recorded in the header, or the file size, is not what this build expects.
    #[error("shared region {}: {what} is {found} bytes, expected {expected}", path.display())]
    SizeMismatch {
        /// The region file.
        path: PathBuf,
        /// Which size: `"header_size field"`, `"total_size field"` or `"file size"`.
        what: &'static str,
        /// What was found.
        found: u64,
        /// What was expected.
        expected: u64,
    },
    /// The file is shorter than a region.
    #[error("shared region {}: truncated: file is {found} bytes, a region is {expected}", path.display())]
    Truncated {
        /// The region file.
        path: PathBuf,
        /// File size.
        found: u64,
        /// [`REGION_SIZE`].
        expected: u64,
    },
    /// The file exists but was never fully initialised (its creator died), and this opener
    /// may not initialise it (read-only open).
    #[error("shared region {}: not initialised (empty, or its creator died before finishing)", path.display())]
    NotInitialised {
        /// The region file.
        path: PathBuf,
    },
    /// The file is not a regular file.
    #[error("shared region {}: not a regular file", path.display())]
    NotRegularFile {
        /// The region file.
        path: PathBuf,
    },
    /// The region cannot be written (file permissions, read-only file system, immutable file,
    /// or a read-only mapping).
    #[error("shared region {}: not writable: {reason}", path.display())]
    ReadOnly {
        /// The region file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// Every slot belongs to a live process.
    #[error("shared region {}: all {} process slots are held by live processes", path.display(), MAX_SLOTS)]
    Full {
        /// The region file.
        path: PathBuf,
    },
    /// The region lock was not acquired within the lock timeout: its holder is stopped,
    /// starved of CPU, or (with a pid namespace that hides it) gone.
    #[error("shared region {}: lock not acquired within {waited_ms} ms (held by thread {holder_tid}: stopped or starved?)", path.display())]
    LockTimeout {
        /// The region file.
        path: PathBuf,
        /// How long the caller waited.
        waited_ms: u64,
        /// The thread id in the lock word (in its holder's pid namespace).
        holder_tid: u32,
    },
    /// The region lock is unusable (`ENOTRECOVERABLE`, or another pthread error).
    #[error("shared region {}: lock unusable: {source}", path.display())]
    Lock {
        /// The region file.
        path: PathBuf,
        /// The pthread error.
        source: io::Error,
    },
}

/// Configuration of the region creator (from its environment).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RegionConfig {
    /// Per-device limit in bytes; 0 = unlimited.
    pub limits: [u64; MAX_DEVICES],
    /// Per-device flags ([`LIMIT_FLAG_INVALID`]).
    pub limit_flags: [u32; MAX_DEVICES],
    /// Devices the creator saw (informational).
    pub device_count: u32,
    /// Permission bits of a created region (default [`DEFAULT_REGION_MODE`], `0o666`: every
    /// process of the container, whatever its uid); applied with `fchmod` before the file
    /// appears under its name, so the umask does not narrow it.
    pub mode: u32,
    /// Group of a created region (`None`: the creator's group).
    pub group: Option<u32>,
    /// Per-device compute share in percent (1..=100), 0 = none
    /// (`layout::DeviceCompute::sm_limit`).
    pub sm_limits: [u32; MAX_DEVICES],
    /// `COMPUTE_POLICY_*` of every device (`layout::DeviceCompute::policy`).
    pub compute_policy: u32,
    /// The container's `CUDA_TASK_PRIORITY` (`layout::RegionHeader::task_priority`).
    pub task_priority: u32,
}

impl Default for RegionConfig {
    fn default() -> Self {
        RegionConfig {
            limits: [0; MAX_DEVICES],
            limit_flags: [0; MAX_DEVICES],
            device_count: 0,
            mode: DEFAULT_REGION_MODE,
            group: None,
            sm_limits: [0; MAX_DEVICES],
            compute_policy: layout::COMPUTE_POLICY_DEFAULT,
            task_priority: crate::config::DEFAULT_TASK_PRIORITY,
        }
    }
}

/// A device whose limit (or flags) in the caller's configuration differs from the region's.
/// The region's values win; the caller logs a warning.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LimitDifference {
    /// Device ordinal.
    pub dev: usize,
    /// Limit stored in the region (in force).
    pub region_limit: u64,
    /// Flags stored in the region (in force).
    pub region_flags: u32,
    /// Limit the caller asked for.
    pub requested_limit: u64,
    /// Flags the caller asked for.
    pub requested_flags: u32,
}

/// What [`Region::open_or_create`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OpenOutcome {
    /// This call initialised the region from its configuration (a new or empty file, one whose
    /// creator died mid-initialisation, or one left from a previous boot).
    Created,
    /// The region existed; `differs` lists devices whose configured limit differs.
    Existing {
        /// Devices whose requested limit/flags differ from the region's.
        differs: Vec<LimitDifference>,
    },
}

/// A registered slot. Carries the owner's identity: operations on a slot that no longer
/// holds that owner (reclaimed by someone) do nothing / are denied.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SlotId {
    index: u32,
    owner: ProcessId,
}

impl SlotId {
    /// A slot id for `index` expected to hold `owner` (for the agent, from a snapshot).
    #[inline]
    pub fn new(index: usize, owner: ProcessId) -> SlotId {
        SlotId {
            index: index.min(u32::MAX as usize) as u32,
            owner,
        }
    }

    /// Slot index in the region.
    pub fn index(&self) -> usize {
        self.index as usize
    }

    /// The process the slot was registered for.
    pub fn owner(&self) -> ProcessId {
        self.owner
    }
}

/// Why an admission was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DenyReason {
    /// `used + requested > limit`.
    OverLimit,
    /// The device's configuration is invalid ([`LIMIT_FLAG_INVALID`]): fail closed.
    ConfigInvalid,
    /// Device ordinal `>= MAX_DEVICES`.
    BadDevice,
    /// The slot no longer belongs to the caller (reclaimed): re-register.
    SlotLost,
    /// The region is mapped read-only.
    ReadOnly,
    /// The region lock is unusable (`ENOTRECOVERABLE`).
    LockFailed,
    /// The region lock was not acquired within the lock timeout (its holder is stopped or
    /// starved): refused rather than waiting without bound.
    LockTimeout,
}

/// A refused [`Region::try_charge`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Denied {
    /// Why.
    pub reason: DenyReason,
    /// Device ordinal.
    pub dev: usize,
    /// The device's limit (0 = unlimited).
    pub limit: u64,
    /// The device's admitted total at the time of the decision.
    pub used: u64,
    /// Bytes requested.
    pub requested: u64,
}

impl core::fmt::Display for Denied {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self.reason {
            DenyReason::OverLimit => write!(
                f,
                "device {}: {} bytes requested, {} of {} bytes in use: over the limit",
                self.dev, self.requested, self.used, self.limit
            ),
            DenyReason::ConfigInvalid => write!(
                f,
                "device {}: memory limit configuration is invalid: allocations refused",
                self.dev
            ),
            DenyReason::BadDevice => write!(f, "device {}: ordinal out of range", self.dev),
            DenyReason::SlotLost => write!(f, "process slot was reclaimed"),
            DenyReason::ReadOnly => write!(f, "shared region is read-only"),
            DenyReason::LockFailed => write!(f, "shared region lock is unusable"),
            DenyReason::LockTimeout => write!(
                f,
                "device {}: {} bytes requested: shared region lock not acquired within the lock timeout (HAMI_LOCK_TIMEOUT_MS; its holder is stopped or starved)",
                self.dev, self.requested
            ),
        }
    }
}

/// A slot freed by reclaim.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReclaimedSlot {
    /// Slot index.
    pub index: usize,
    /// Pid the slot held.
    pub pid: u32,
    /// Start time the slot held.
    pub start_time: u64,
    /// Usage freed, `[device][kind]`.
    pub usage: [[u64; USAGE_KINDS]; MAX_DEVICES],
}

impl ReclaimedSlot {
    /// Total bytes freed.
    pub fn total(&self) -> u64 {
        self.usage
            .iter()
            .flatten()
            .fold(0u64, |a, &b| a.saturating_add(b))
    }
}
/// An open, mapped region. `Send + Sync`; unmapped on drop. Usable after `fork` (the mapping
/// is shared and the lock process-shared); a forked child must register its own slot.
pub struct Region {
    map: NonNull<layout::Region>,
    path: PathBuf,
    writable: bool,
    probe: Arc<dyn LivenessProbe>,
    tuning: Tuning,
    /// Charges forced while the lock could not be taken, per device: in the slot's usage
    /// already, added to its `charged` and the totals at this process's next locking.
    pending: [AtomicU64; MAX_DEVICES],
}

/// Per-process settings of a [`Region`] handle ([`Region::with_tuning`]). They change how
/// this process waits and batches, never what the region's totals mean.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tuning {
    /// How long one operation waits for the region lock in all before it gives up: an
    /// admission is then refused ([`DenyReason::LockTimeout`]), a forced charge is recorded
    /// and applied later, a release is never delayed (it needs no lock). Default
    /// [`DEFAULT_LOCK_TIMEOUT`].
    pub lock_timeout: Duration,
    /// Bytes of admission reserve per device this process keeps (capped at 1/32 of a
    /// device's limit): allocations up to the reserve and every release are lock-free.
    /// 0 (the default) takes the lock for every admission.
    pub reserve: u64,
    /// Whether a lock word naming a thread that does not exist in this process's pid
    /// namespace, unchanged for [`STALE_LOCK_AGE`], is marked owner-died so that the region
    /// is recovered. Only for processes in the pid namespace of the region's users (the
    /// preload); off by default (the agent, on the host, sees other pid numbers).
    pub break_stale_locks: bool,
}

/// Default [`Tuning::lock_timeout`].
pub const DEFAULT_LOCK_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a lock word must stay unchanged, naming a thread that does not exist, before a
/// waiter with [`Tuning::break_stale_locks`] marks it owner-died.
pub const STALE_LOCK_AGE: Duration = Duration::from_millis(500);

impl Default for Tuning {
    fn default() -> Tuning {
        Tuning {
            lock_timeout: DEFAULT_LOCK_TIMEOUT,
            reserve: 0,
            break_stale_locks: false,
        }
    }
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

    fn h_init_state(&self) -> &AtomicU32 {
        // SAFETY: atomic field of the live mapping.
        unsafe { &*addr_of!((*self.map.as_ptr()).header.init_state) }
    }

    fn mutex(&self) -> *mut libc::pthread_mutex_t {
        // SAFETY: in-bounds field projection of the live mapping.
        unsafe { addr_of_mut!((*self.map.as_ptr()).header.lock).cast() }
    }

    fn h_generation(&self) -> &AtomicU64 {
        // SAFETY: atomic field of the live mapping.
        unsafe { &*addr_of!((*self.map.as_ptr()).header.generation) }
    }

    fn h_recoveries(&self) -> &AtomicU64 {
        // SAFETY: atomic field of the live mapping.
        unsafe { &*addr_of!((*self.map.as_ptr()).header.owner_died_recoveries) }
    }

    fn h_reclaimed(&self) -> &AtomicU64 {
        // SAFETY: atomic field of the live mapping.
        unsafe { &*addr_of!((*self.map.as_ptr()).header.reclaimed_slots) }
    }

    fn h_device_count(&self) -> &AtomicU32 {
        // SAFETY: atomic field of the live mapping.
        unsafe { &*addr_of!((*self.map.as_ptr()).header.device_count) }
    }

    fn h_limit(&self, d: usize) -> &AtomicU64 {
        // SAFETY: atomic field of the live mapping; d < MAX_DEVICES (indexing panics
        // otherwise; callers check).
        unsafe { &*addr_of!((*self.map.as_ptr()).header.limits[d]) }
    }

    fn h_flags(&self, d: usize) -> &AtomicU32 {
        // SAFETY: as h_limit.
        unsafe { &*addr_of!((*self.map.as_ptr()).header.limit_flags[d]) }
    }

    fn h_used(&self, d: usize) -> &AtomicU64 {
        // SAFETY: as h_limit.
        unsafe { &*addr_of!((*self.map.as_ptr()).header.used[d]) }
    }

    fn h_uuid_words(&self, d: usize) -> [&AtomicU64; 2] {
        // SAFETY: uuids[d] is 16 bytes at an 8-aligned offset (asserted at compile time) in
        // the live mapping; it is only ever accessed as two AtomicU64.
        unsafe {
            let p = addr_of_mut!((*self.map.as_ptr()).header.uuids[d]).cast::<u64>();
            [AtomicU64::from_ptr(p), AtomicU64::from_ptr(p.add(1))]
        }
    }

    fn s_pid(&self, i: usize) -> &AtomicU32 {
        // SAFETY: atomic field of the live mapping; i < MAX_SLOTS (callers check).
        unsafe { &*addr_of!((*self.map.as_ptr()).slots[i].pid) }
    }

    fn s_status(&self, i: usize) -> &AtomicU32 {
        // SAFETY: as s_pid.
        unsafe { &*addr_of!((*self.map.as_ptr()).slots[i].status) }
    }

    fn s_start(&self, i: usize) -> &AtomicU64 {
        // SAFETY: as s_pid.
        unsafe { &*addr_of!((*self.map.as_ptr()).slots[i].start_time) }
    }

    fn s_charged(&self, i: usize, d: usize) -> &AtomicU64 {
        // SAFETY: as s_pid; d < MAX_DEVICES.
        unsafe { &*addr_of!((*self.map.as_ptr()).slots[i].charged[d]) }
    }

    fn s_host_pid(&self, i: usize) -> &AtomicU32 {
        // SAFETY: as s_pid.
        unsafe { &*addr_of!((*self.map.as_ptr()).slots[i].host_pid) }
    }

    fn s_reserve(&self, i: usize, d: usize) -> &AtomicU64 {
        // SAFETY: as s_pid; d < MAX_DEVICES.
        unsafe { &*addr_of!((*self.map.as_ptr()).slots[i].reserve[d]) }
    }

    fn h_high_water(&self) -> &AtomicU32 {
        // SAFETY: atomic field of the live mapping.
        unsafe { &*addr_of!((*self.map.as_ptr()).header.slot_high_water) }
    }

    fn h_stale_breaks(&self) -> &AtomicU64 {
        // SAFETY: atomic field of the live mapping.
        unsafe { &*addr_of!((*self.map.as_ptr()).header.stale_lock_breaks) }
    }

    fn h_ctx_footprint(&self, d: usize) -> &AtomicU64 {
        // SAFETY: as h_limit.
        unsafe { &*addr_of!((*self.map.as_ptr()).header.context_footprint[d]) }
    }

    fn h_reserve_reclaims(&self) -> &AtomicU64 {
        // SAFETY: atomic field of the live mapping.
        unsafe { &*addr_of!((*self.map.as_ptr()).header.reserve_reclaims) }
    }

    /// Slot indexes worth scanning: up to the high-water mark (every slot if it is corrupt).
    fn slot_range(&self) -> core::ops::Range<usize> {
        let hw = self.h_high_water().load(Ordering::Relaxed) as usize;
        0..if hw == 0 || hw > MAX_SLOTS {
            MAX_SLOTS
        } else {
            hw
        }
    }

    /// Builds a handle on a mapping (default probe and tuning).
    fn from_map(map: NonNull<layout::Region>, path: &std::path::Path, writable: bool) -> Region {
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
    fn s_usage(&self, i: usize, d: usize, k: usize) -> &AtomicU64 {
        // SAFETY: as s_pid; d < MAX_DEVICES, k < USAGE_KINDS.
        unsafe { &*addr_of!((*self.map.as_ptr()).slots[i].usage[d][k]) }
    }

    /// Copies the header fields that are immutable after initialisation.
    fn header_constants(&self) -> (u32, u32, u64, u32, u64, [u8; 16]) {
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

fn uuid_words(uuid: &[u8; 16]) -> (u64, u64) {
    let mut a = [0u8; 8];
    let mut b = [0u8; 8];
    a.copy_from_slice(&uuid[..8]);
    b.copy_from_slice(&uuid[8..]);
    (u64::from_le_bytes(a), u64::from_le_bytes(b))
}

#[cfg(test)]
mod tests;
