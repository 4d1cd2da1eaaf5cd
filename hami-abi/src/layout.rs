//! Layout of the shared region file (version 4). See `docs/shared-region.md`.
//!
//! Everything is `#[repr(C)]`, little-endian, fixed size, with no pointers, so that the
//! preload (inside containers) and the agent (on the host) map the same bytes.
//! Every field that changes after initialisation is atomic, so that lock-free readers (the
//! agent, which copies the file with `pread`) never see torn values. The header's totals and
//! each slot's `charged` change only under the region lock (`RegionHeader::lock`); a slot's
//! `usage` and `reserve` are changed by its own process without the lock (see `Slot`).

use core::sync::atomic::{AtomicI64, AtomicU32, AtomicU64};

/// First 8 bytes of every region file.
pub const MAGIC: [u8; 8] = *b"HAMIRSv\x01";
/// Layout version; bumped on any incompatible change.
pub const VERSION: u32 = 4;
/// Number of devices a region describes.
pub const MAX_DEVICES: usize = 16;
/// Number of process slots in a region.
pub const MAX_SLOTS: usize = 1024;
/// Bytes reserved for the process-shared robust mutex (`pthread_mutex_t` is 40 bytes on x86_64
/// glibc, 48 on aarch64: both fit, asserted at compile time in `hami_common::region`).
pub const LOCK_BYTES: usize = 64;

/// `RegionHeader::init_state`: file exists but nobody initialised it yet.
pub const INIT_EMPTY: u32 = 0;
/// `RegionHeader::init_state`: fully initialised and usable.
pub const INIT_READY: u32 = 2;

/// `Slot::status`: the slot is free.
pub const SLOT_FREE: u32 = 0;
/// `Slot::status`: the slot belongs to a live (registered) process.
pub const SLOT_ACTIVE: u32 = 1;

/// `RegionHeader::limit_flags[d]` bit: the creator's configuration for this device was
/// invalid; every process fails closed on it.
pub const LIMIT_FLAG_INVALID: u32 = 1;

/// Kinds of memory a slot accounts separately.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum UsageKind {
    /// Context memory (primary or created contexts).
    Context = 0,
    /// Module and library memory (code, `__device__` globals), measured around
    /// `cuModuleLoad*` / `cuLibraryLoad*` and, with lazy loading, the first function lookup
    /// or launch of a module.
    Module = 1,
    /// Data allocations (cuMemAlloc*, cuMemCreate, arrays, ...).
    Data = 2,
    /// Memory reserved by stream-ordered memory pools (`CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT`
    /// summed over this process's pools on the device): in use by `cuMemAllocAsync` pointers or
    /// kept after `cuMemFreeAsync` until the pool is trimmed.
    Pool = 3,
    /// Device memory the driver reports for the process (NVML, per process) beyond what every
    /// other kind accounts for: the backstop for paths no hook sees.
    Other = 4,
}

/// Number of [`UsageKind`] variants.
pub const USAGE_KINDS: usize = 5;

impl UsageKind {
    /// All kinds, in index order.
    pub const ALL: [UsageKind; USAGE_KINDS] = [
        UsageKind::Context,
        UsageKind::Module,
        UsageKind::Data,
        UsageKind::Pool,
        UsageKind::Other,
    ];

    /// Index of this kind in [`Slot::usage`].
    pub const fn index(self) -> usize {
        self as usize
    }

    /// Lower-case name used in output and metrics.
    pub const fn name(self) -> &'static str {
        match self {
            UsageKind::Context => "context",
            UsageKind::Module => "module",
            UsageKind::Data => "data",
            UsageKind::Pool => "pool",
            UsageKind::Other => "other",
        }
    }
}

/// The region header.
#[repr(C)]
pub struct RegionHeader {
    /// [`MAGIC`].
    pub magic: [u8; 8],
    /// [`VERSION`].
    pub version: u32,
    /// `size_of::<RegionHeader>()` as written by the creator.
    pub header_size: u32,
    /// `size_of::<RegionLayout>()` as written by the creator (the file size).
    pub total_size: u64,
    /// [`INIT_EMPTY`] or [`INIT_READY`]; written last by the creator (release ordering).
    pub init_state: AtomicU32,
    /// Number of devices the creator saw (informational; limits apply per ordinal).
    pub device_count: AtomicU32,
    /// Pid (in the creator's namespace) of the process that created the region.
    pub creator_pid: u32,
    /// Padding.
    pub _pad0: u32,
    /// Unix time (seconds) of creation.
    pub created_unix: u64,
    /// Process-shared, robust `pthread_mutex_t` storage. Guards every write below.
    pub lock: [u8; LOCK_BYTES],
    /// Sequence counter (seqlock): odd while a writer, holding the lock, is in the middle of
    /// an update; advanced by 2 per completed change (charges, releases, registrations).
    /// Lock-free readers use it to take consistent snapshots.
    pub generation: AtomicU64,
    /// Number of times a lock holder died and the next locker recovered the region.
    pub owner_died_recoveries: AtomicU64,
    /// Number of slots reclaimed from dead processes.
    pub reclaimed_slots: AtomicU64,
    /// Per-device limit in bytes; 0 = unlimited.
    pub limits: [AtomicU64; MAX_DEVICES],
    /// Per-device flags ([`LIMIT_FLAG_INVALID`]).
    pub limit_flags: [AtomicU32; MAX_DEVICES],
    /// Per-device UUID (the 16 raw bytes of `CUuuid`), all zero when unknown.
    pub uuids: [[u8; 16]; MAX_DEVICES],
    /// Per-device admitted total: always equals the sum over active slots of their
    /// `charged[d]` whenever the lock is free; at most `limits[d]` (when not 0) unless memory
    /// the driver had already taken was charged.
    pub used: [AtomicU64; MAX_DEVICES],
    /// `/proc/sys/kernel/random/boot_id` (16 raw bytes) of the boot that initialised the
    /// region, all zero when unknown. A region found from another boot (a persisted file)
    /// holds stale pids and possibly a stale lock word, and is re-initialised.
    pub boot_id: [u8; 16],
    /// One more than the highest slot index ever claimed: scans of the slot table stop here.
    pub slot_high_water: AtomicU32,
    /// Padding.
    pub _pad1: u32,
    /// Number of times a locker found the lock word naming a thread that no longer exists,
    /// without the kernel's owner-died mark, and marked it owner-died itself.
    pub stale_lock_breaks: AtomicU64,
    /// Number of times an admission took back other slots' unused reserves because the
    /// device was otherwise full.
    pub reserve_reclaims: AtomicU64,
    /// Per-device footprint of one CUDA context in bytes, as last measured by a process of
    /// the region on that device; 0 = not measured yet. A context is admitted with this
    /// figure *before* the driver creates it (and refused when it does not fit), then charged
    /// what was measured; the measurement replaces the figure. Written without the lock
    /// (a plain store of the latest measurement).
    pub context_footprint: [AtomicU64; MAX_DEVICES],
    /// The container's `CUDA_TASK_PRIORITY` plus one, recorded by the creator; 0 = not
    /// recorded (an older file): HAMi's default priority
    /// (`hami_common::config::DEFAULT_TASK_PRIORITY`).
    /// Taken from `_reserved` (issue 30).
    pub task_priority: AtomicU32,
    /// Padding.
    pub _pad2: u32,
    /// `CLOCK_MONOTONIC` ns of the node agent's latest arbiter decision for this container
    /// (0 = never): grants older than `arbiter::GRANT_TTL_NS` are ignored. Written by the
    /// agent only (issue 30).
    pub arbiter_at_ns: AtomicU64,
    /// Per device, what the node agent's arbiter lets the container use
    /// (`arbiter::encode_grant`: a self-checking word; 0 = no decision). Written by the agent
    /// only (issue 30).
    pub grants: [AtomicU32; MAX_DEVICES],
    /// Per device, the turn the node agent's arbiter gives the container in every
    /// `arbiter::TURN_PERIOD_NS` while several containers contend for the GPU
    /// (`arbiter::encode_turn`: a self-checking word; 0 = no turn, submit at any time).
    /// Valid with the same `arbiter_at_ns` as the grants. Written by the agent only. Taken
    /// from `_reserved` (issue 30; it pads the header to 1024 bytes, so that slots start on a
    /// cache-line boundary).
    pub turns: [AtomicU32; MAX_DEVICES],
}

/// One process slot.
#[repr(C)]
pub struct Slot {
    /// Pid in the namespace of the process (as returned by `getpid()`); 0 when free.
    pub pid: AtomicU32,
    /// [`SLOT_FREE`] or [`SLOT_ACTIVE`].
    pub status: AtomicU32,
    /// Process start time, in clock ticks since boot (`/proc/<pid>/stat` field 22), so that a
    /// reused pid is never mistaken for the slot's process.
    pub start_time: AtomicU64,
    /// Usage in bytes, `[device][UsageKind::index()]`: what the process's live allocations
    /// hold. Written by the slot's process only (without the lock), and cleared when the slot
    /// is freed.
    pub usage: [[AtomicU64; USAGE_KINDS]; MAX_DEVICES],
    /// Bytes this slot has added to `RegionHeader::used[d]`: its usage plus its reserve,
    /// once every update its process has started is complete. Changed only under the lock;
    /// freeing the slot subtracts exactly this from `used`, so the totals stay exact whatever
    /// moment the process died at.
    pub charged: [AtomicU64; MAX_DEVICES],
    /// Bytes admitted to this slot (part of `charged`) that no allocation holds yet. The
    /// slot's process spends it without the lock (compare-and-swap) and puts freed bytes
    /// back; it is refilled under the lock; when a device is full, the admission that needs
    /// room takes other slots' reserves back (swap to 0, under the lock).
    pub reserve: [AtomicU64; MAX_DEVICES],
    /// The process's pid in the host's (initial) pid namespace, the pid NVML's process lists
    /// report; 0 = not known (yet). Written by the slot's own process under the lock once it
    /// has found it, cleared when the slot is freed or claimed. Taken from `_pad` (issue 20):
    /// older files read 0.
    pub host_pid: AtomicU32,
    /// Padding.
    pub _pad_host: u32,
    /// Padding to 1024 bytes: one slot never shares a cache line with the next.
    pub _pad: [u64; 13],
}

/// [`DeviceCompute::policy`]: HAMi's `GPU_CORE_UTILIZATION_POLICY=default`
/// (`hami_common::config::CorePolicy`, whose discriminants are these values).
pub const COMPUTE_POLICY_DEFAULT: u32 = 0;
/// [`DeviceCompute::policy`]: `force`.
pub const COMPUTE_POLICY_FORCE: u32 = 1;
/// [`DeviceCompute::policy`]: `disable` (no compute limit).
pub const COMPUTE_POLICY_DISABLE: u32 = 2;

/// The compute share of one device, shared by every process of the container: the
/// launch gate's budget of GPU time (a token bucket in nanoseconds of device time).
/// Every field is changed lock-free (atomics); see `docs/shared-region.md`.
#[repr(C)]
pub struct DeviceCompute {
    /// Share of the device in percent, 1..=100; 0 = no compute limit. Set by the creator
    /// (`CUDA_DEVICE_SM_LIMIT(_<i>)`).
    pub sm_limit: AtomicU32,
    /// `COMPUTE_POLICY_*` as the creator configured it.
    pub policy: AtomicU32,
    /// Device time (ns) the container may still use; negative = debt being repaid.
    pub budget_ns: AtomicI64,
    /// `CLOCK_MONOTONIC` time (ns) up to which the budget has been refilled.
    pub refilled_at_ns: AtomicU64,
    /// Device time (ns) the container's metered work has used on this device in total
    /// (only grows): what the agent and `inspect` read as the container's consumption.
    pub consumed_ns: AtomicU64,
    /// Number of times a process of the container waited at the gate (throttled).
    pub throttled: AtomicU64,
    /// Total time (ns) processes of the container spent waiting at the gate.
    pub throttled_ns: AtomicU64,
    /// The gate's advisory submission lock: 0, or the token (thread id + 1) of the thread
    /// recording a submission's events around its launch, so that the container's other
    /// processes do not submit in between. Taken over when held longer than a few
    /// milliseconds (its holder is stopped or dead); see `docs/preload.md`.
    pub submit_lock: AtomicU64,
    /// Number of memory requests the preload refused on this device for the container
    /// (`CUDA_ERROR_OUT_OF_MEMORY` returned without the driver's say: over the quota, or
    /// failing closed); only grows, incremented lock-free at each refusal (issue 20).
    pub refusals: AtomicU64,
}

/// The whole region file, byte for byte: header, slots, compute records. The open handle
/// with its protocol is `hami_common::region::Region`.
#[repr(C)]
pub struct RegionLayout {
    /// Header.
    pub header: RegionHeader,
    /// Process slots.
    pub slots: [Slot; MAX_SLOTS],
    /// Per-device compute share and launch-gate budget.
    pub compute: [DeviceCompute; MAX_DEVICES],
}

/// Size in bytes of a region file.
pub const REGION_SIZE: usize = core::mem::size_of::<RegionLayout>();

// Slots are whole cache lines, at cache-line offsets: one process's lock-free updates of its
// own slot never share a line with another slot or the header.
const _: () = assert!(core::mem::size_of::<RegionHeader>() == 1024);
const _: () = assert!(core::mem::size_of::<Slot>() == 1024);
const _: () = assert!(core::mem::size_of::<DeviceCompute>() == 64);
