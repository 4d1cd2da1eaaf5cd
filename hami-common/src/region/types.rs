//! The values of the region API: errors, configuration, admission outcomes, slot ids and
//! per-process tuning.

use std::io;
use std::path::PathBuf;
use std::time::Duration;

use super::liveness::ProcessId;
use crate::config::DEFAULT_REGION_MODE;
use hami_abi::layout::{self, MAGIC, MAX_DEVICES, MAX_SLOTS, USAGE_KINDS};

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
        /// [`VERSION`](hami_abi::layout::VERSION).
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
        /// [`REGION_SIZE`](hami_abi::layout::REGION_SIZE).
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
    /// Per-device flags ([`LIMIT_FLAG_INVALID`](hami_abi::layout::LIMIT_FLAG_INVALID)).
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

/// What [`Region::open_or_create`](super::Region::open_or_create) did.
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
    pub(super) index: u32,
    pub(super) owner: ProcessId,
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
    /// The device's configuration is invalid ([`LIMIT_FLAG_INVALID`](hami_abi::layout::LIMIT_FLAG_INVALID)): fail closed.
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

/// A refused [`Region::try_charge`](super::Region::try_charge).
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
