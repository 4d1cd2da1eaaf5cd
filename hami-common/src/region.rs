//! Region file operations: create / open / validate, the robust process-shared lock, slot
//! registration, exact admission, and reclaim of dead processes' slots.
//!
//! The protocol and the crash-safety argument are in `docs/shared-region.md`.
//!
//! Hot path ([`Region::try_charge`], [`Region::uncharge`], [`Region::force_charge`]): no
//! system call (an uncontended robust mutex is a user-space compare-and-swap), no allocation,
//! the lock held for a handful of loads and stores.

use core::ptr::{addr_of, addr_of_mut};
use core::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::Arc;

use crate::config::DEFAULT_REGION_MODE;
use crate::layout::{
    self, RegionHeader, UsageKind, INIT_READY, LIMIT_FLAG_INVALID, LOCK_BYTES, MAGIC, MAX_DEVICES,
    MAX_SLOTS, REGION_SIZE, SLOT_ACTIVE, SLOT_FREE, USAGE_KINDS, VERSION,
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
    /// The region lock is unusable (`ENOTRECOVERABLE`, or another pthread error).
    #[error("shared region {}: lock unusable: {source}", path.display())]
    Lock {
        /// The region file.
        path: PathBuf,
        /// The pthread error.
        source: io::Error,
    },
}

/// Identity of a process: pid plus start time, so that a reused pid is a different process.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ProcessId {
    /// Pid in the process's own pid namespace.
    pub pid: u32,
    /// Start time in clock ticks after boot (`/proc/<pid>/stat` field 22); 0 when unknown.
    pub start_time: u64,
}

impl ProcessId {
    /// The calling process (`getpid()` and `/proc/self/stat`). If `/proc` cannot be read the
    /// start time is 0 (pid reuse then cannot be detected for this process).
    pub fn current() -> ProcessId {
        // SAFETY: getpid has no preconditions.
        let pid = unsafe { libc::getpid() } as u32;
        let start_time = read_stat(b"/proc/self/stat\0")
            .map(|s| s.start_time)
            .unwrap_or(0);
        ProcessId { pid, start_time }
    }

    /// The process with this pid now, from `/proc/<pid>/stat`; `None` if there is none (or
    /// `/proc` cannot be read).
    pub fn of(pid: u32) -> Option<ProcessId> {
        let mut path = [0u8; 32];
        let p = proc_stat_path(pid, &mut path);
        read_stat(p).ok().map(|s| ProcessId {
            pid,
            start_time: s.start_time,
        })
    }
}

/// What a [`LivenessProbe`] knows about a process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Liveness {
    /// The process (same pid and start time) exists.
    Alive,
    /// Certainly gone: no such pid, a zombie, or the pid belongs to another process now.
    Dead,
    /// Cannot tell (no `/proc`, another pid namespace). Treated as alive: never reclaimed.
    Unknown,
}

/// How the region learns whether a slot's process is still alive. The default is
/// [`ProcProbe`]; tests, benchmarks and the agent (which sees container pids through another
/// pid namespace) supply their own.
pub trait LivenessProbe: Send + Sync {
    /// Whether `who` (pid and start time) is alive.
    fn liveness(&self, who: ProcessId) -> Liveness;
}

/// Liveness from the caller's `/proc`: correct for processes in the caller's pid namespace.
#[derive(Clone, Copy, Debug, Default)]
pub struct ProcProbe;

impl LivenessProbe for ProcProbe {
    fn liveness(&self, who: ProcessId) -> Liveness {
        if who.pid == 0 {
            return Liveness::Dead;
        }
        let mut path = [0u8; 32];
        let p = proc_stat_path(who.pid, &mut path);
        match read_stat(p) {
            Ok(st) => {
                // A zombie's resources (and its GPU memory) are gone. A zombie leader with live
                // threads still runs: num_threads counts them.
                if (st.state == b'Z' || st.state == b'X') && st.num_threads <= 1 {
                    Liveness::Dead
                } else if who.start_time == 0 || st.start_time == who.start_time {
                    Liveness::Alive
                } else {
                    Liveness::Dead
                }
            }
            Err(libc::ENOENT) | Err(libc::ESRCH) => {
                // SAFETY: kill with signal 0 only checks for existence.
                let r = unsafe { libc::kill(who.pid as libc::pid_t, 0) };
                if r != 0 && io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH) {
                    Liveness::Dead
                } else {
                    // The pid exists but /proc does not show it: another pid namespace.
                    Liveness::Unknown
                }
            }
            Err(_) => Liveness::Unknown,
        }
    }
}

/// Whether `who` may still be alive according to the caller's `/proc` ([`ProcProbe`]):
/// `false` only when it is certainly gone (no such pid, zombie, or pid reused).
pub fn is_alive(who: &ProcessId) -> bool {
    ProcProbe.liveness(*who) != Liveness::Dead
}

struct StatFields {
    state: u8,
    num_threads: u64,
    start_time: u64,
}

/// Writes `/proc/<pid>/stat\0` into `buf` (no allocation).
fn proc_stat_path(pid: u32, buf: &mut [u8; 32]) -> &[u8] {
    let mut digits = [0u8; 10];
    let mut n = pid;
    let mut len = 0;
    loop {
        digits[len] = b'0' + (n % 10) as u8;
        len += 1;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    let mut i = 0;
    for &b in b"/proc/" {
        buf[i] = b;
        i += 1;
    }
    for k in (0..len).rev() {
        buf[i] = digits[k];
        i += 1;
    }
    for &b in b"/stat\0" {
        buf[i] = b;
        i += 1;
    }
    &buf[..i]
}

/// Reads and parses a `/proc/.../stat` file (NUL-terminated path) without allocating.
/// Errors are errno values.
fn read_stat(path: &[u8]) -> Result<StatFields, i32> {
    let mut buf = [0u8; 1024];
    // SAFETY: path is NUL-terminated (callers build it so); flags are plain.
    let fd = unsafe { libc::open(path.as_ptr().cast(), libc::O_RDONLY | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(errno());
    }
    let mut len = 0usize;
    loop {
        // SAFETY: fd is open; the destination is within buf.
        let r = unsafe { libc::read(fd, buf[len..].as_mut_ptr().cast(), buf.len() - len) };
        if r < 0 {
            let e = errno();
            if e == libc::EINTR {
                continue;
            }
            // SAFETY: fd is ours.
            unsafe { libc::close(fd) };
            return Err(e);
        }
        if r == 0 || len + r as usize == buf.len() {
            len += r as usize;
            break;
        }
        len += r as usize;
    }
    // SAFETY: fd is ours.
    unsafe { libc::close(fd) };
    parse_stat(&buf[..len]).ok_or(libc::EINVAL)
}

/// Parses the fields we need from a `/proc/<pid>/stat` line. `comm` (field 2) may contain
/// spaces and parentheses, so fields are counted from the LAST `)`.
fn parse_stat(line: &[u8]) -> Option<StatFields> {
    let close = line.iter().rposition(|&b| b == b')')?;
    let rest = &line[close + 1..];
    let mut fields = rest
        .split(|b| b.is_ascii_whitespace())
        .filter(|f| !f.is_empty());
    // Field 3 is the first after ')'.
    let state = *fields.next()?.first()?;
    let mut num_threads = None;
    let mut start_time = None;
    for (i, f) in fields.enumerate() {
        let field_no = i + 4;
        if field_no == 20 {
            num_threads = Some(parse_u64(f)?);
        } else if field_no == 22 {
            start_time = Some(parse_u64(f)?);
            break;
        }
    }
    Some(StatFields {
        state,
        num_threads: num_threads?,
        start_time: start_time?,
    })
}

fn parse_u64(s: &[u8]) -> Option<u64> {
    if s.is_empty() {
        return None;
    }
    let mut v: u64 = 0;
    for &b in s {
        if !b.is_ascii_digit() {
            return None;
        }
        v = v.checked_mul(10)?.checked_add((b - b'0') as u64)?;
    }
    Some(v)
}

fn errno() -> i32 {
    io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
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
}

impl Default for RegionConfig {
    fn default() -> Self {
        RegionConfig {
            limits: [0; MAX_DEVICES],
            limit_flags: [0; MAX_DEVICES],
            device_count: 0,
            mode: DEFAULT_REGION_MODE,
            group: None,
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

/// One active slot in a [`RegionSnapshot`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlotSnapshot {
    /// Slot index.
    pub index: usize,
    /// Pid (in the process's pid namespace).
    pub pid: u32,
    /// Process start time (clock ticks after boot).
    pub start_time: u64,
    /// Usage `[device][UsageKind::index()]` in bytes.
    pub usage: [[u64; USAGE_KINDS]; MAX_DEVICES],
}

impl SlotSnapshot {
    /// The slot's process identity.
    pub fn process(&self) -> ProcessId {
        ProcessId {
            pid: self.pid,
            start_time: self.start_time,
        }
    }

    /// Bytes on `dev`, all kinds.
    pub fn device_total(&self, dev: usize) -> u64 {
        self.usage
            .get(dev)
            .map(|k| k.iter().fold(0u64, |a, &b| a.saturating_add(b)))
            .unwrap_or(0)
    }

    /// Bytes on all devices, all kinds.
    pub fn total(&self) -> u64 {
        (0..MAX_DEVICES).fold(0u64, |a, d| a.saturating_add(self.device_total(d)))
    }
}

/// A plain owned copy of a region, taken without the lock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RegionSnapshot {
    /// Layout version.
    pub version: u32,
    /// Header size recorded by the creator.
    pub header_size: u32,
    /// Total size recorded by the creator.
    pub total_size: u64,
    /// Initialisation state.
    pub init_state: u32,
    /// Devices the creator saw.
    pub device_count: u32,
    /// Creator pid.
    pub creator_pid: u32,
    /// Creation time (Unix seconds).
    pub created_unix: u64,
    /// Boot id of the boot that created the region (zero if unknown).
    pub boot_id: [u8; 16],
    /// Sequence counter at the time of the copy.
    pub generation: u64,
    /// Lock-holder deaths recovered.
    pub owner_died_recoveries: u64,
    /// Slots reclaimed from dead processes.
    pub reclaimed_slots: u64,
    /// Per-device limits (0 = unlimited).
    pub limits: [u64; MAX_DEVICES],
    /// Per-device flags.
    pub limit_flags: [u32; MAX_DEVICES],
    /// Per-device UUIDs (zero = unknown).
    pub uuids: [[u8; 16]; MAX_DEVICES],
    /// Per-device admitted totals (header).
    pub used: [u64; MAX_DEVICES],
    /// Active slots, by index.
    pub slots: Vec<SlotSnapshot>,
    /// Whether the copy is from one instant (no writer was mid-update). When writers are
    /// very busy, a copy after several retries may not be; then `used` and the slots may
    /// disagree by in-flight updates.
    pub consistent: bool,
}

impl RegionSnapshot {
    /// Sum over active slots of their usage on `dev` (all kinds).
    pub fn accounted(&self, dev: usize) -> u64 {
        self.slots
            .iter()
            .fold(0u64, |a, s| a.saturating_add(s.device_total(dev)))
    }

    /// The header's admitted total on `dev`.
    pub fn device_used(&self, dev: usize) -> u64 {
        self.used.get(dev).copied().unwrap_or(0)
    }

    /// Total usage (all devices, all kinds) of the slot at `index`, 0 if not active.
    pub fn slot_total(&self, index: usize) -> u64 {
        self.slot(index).map(|s| s.total()).unwrap_or(0)
    }

    /// The active slot at `index`.
    pub fn slot(&self, index: usize) -> Option<&SlotSnapshot> {
        self.slots.iter().find(|s| s.index == index)
    }

    /// Active slots holding `pid`.
    pub fn slots_of_pid(&self, pid: u32) -> impl Iterator<Item = &SlotSnapshot> {
        self.slots.iter().filter(move |s| s.pid == pid)
    }

    /// The device's limit, `None` when unlimited.
    pub fn limit(&self, dev: usize) -> Option<u64> {
        self.limits.get(dev).copied().filter(|&l| l != 0)
    }

    /// Whether the device's configuration was invalid (fail closed).
    pub fn config_invalid(&self, dev: usize) -> bool {
        self.limit_flags
            .get(dev)
            .map(|f| f & LIMIT_FLAG_INVALID != 0)
            .unwrap_or(false)
    }
}

/// An open, mapped region. `Send + Sync`; unmapped on drop. Usable after `fork` (the mapping
/// is shared and the lock process-shared); a forked child must register its own slot.
pub struct Region {
    map: NonNull<layout::Region>,
    path: PathBuf,
    writable: bool,
    probe: Arc<dyn LivenessProbe>,
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

/// Closes an fd and releases its flock on drop.
struct LockedFd(libc::c_int);

impl Drop for LockedFd {
    fn drop(&mut self) {
        // SAFETY: the fd is owned by this guard. LOCK_UN releases the flock even if a forked
        // child still holds a copy of the descriptor.
        unsafe {
            libc::flock(self.0, libc::LOCK_UN);
            libc::close(self.0);
        }
    }
}

enum FileState {
    /// Size 0, or an abandoned initialisation: the opener initialises it.
    NeedsInit,
    /// A valid, initialised region of the current boot.
    Ready,
    /// A valid region written during another boot.
    OtherBoot,
}

fn io_err(path: &Path, op: &str, e: io::Error) -> RegionError {
    RegionError::Io {
        path: path.to_path_buf(),
        source: io::Error::new(e.kind(), format!("{op}: {e}")),
    }
}

fn cpath(path: &Path) -> Result<CString, RegionError> {
    CString::new(path.as_os_str().as_bytes()).map_err(|_| RegionError::Io {
        path: path.to_path_buf(),
        source: io::Error::new(io::ErrorKind::InvalidInput, "path contains a NUL byte"),
    })
}

/// Applies `cfg`'s mode (and group, if any) to an open file: `fchown` first (it may clear
/// set-id bits), then `fchmod`, so the umask never narrows the mode.
fn set_permissions(fd: libc::c_int, cfg: &RegionConfig) -> io::Result<()> {
    if let Some(gid) = cfg.group {
        // SAFETY: fd is open; uid -1 leaves the owner unchanged.
        if unsafe { libc::fchown(fd, u32::MAX, gid) } != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    // SAFETY: fd is open.
    if unsafe { libc::fchmod(fd, (cfg.mode & 0o666) as libc::mode_t) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// How many times [`open_or_publish`] retries when another process removes or publishes the
/// file between two of its steps.
const PUBLISH_ATTEMPTS: u32 = 16;

/// Opens the region file for writing, creating it if it does not exist. Never opens an
/// existing file with `O_CREAT` (which `fs.protected_regular` refuses in a sticky directory
/// for a file owned by someone else). A new file is made under a private temporary name,
/// given its final mode and group with `fchmod`/`fchown`, then published with `link(2)`,
/// which fails if the name exists: the region never exists under its name with any other
/// permissions, so a process of another uid that opens it right after it appears is never
/// refused by a mode the creator has not set yet. When a file system has no hard links, the
/// file is created with `O_EXCL` and its permissions set right after (a short window in which
/// another uid can be refused; it then fails closed like any unwritable region).
fn open_or_publish(path: &Path, cfg: &RegionConfig) -> Result<libc::c_int, RegionError> {
    let c = cpath(path)?;
    let denied = |what: &str, e: io::Error| -> RegionError {
        if is_write_denied(&e) {
            RegionError::ReadOnly {
                path: path.to_path_buf(),
                reason: format!("{what}: {e}"),
            }
        } else {
            io_err(path, what, e)
        }
    };
    let mut last = io::Error::from_raw_os_error(libc::ENOENT);
    for attempt in 0..PUBLISH_ATTEMPTS {
        // SAFETY: c is a valid C string.
        let fd = unsafe { libc::open(c.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
        if fd >= 0 {
            return Ok(fd);
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::ENOENT) {
            return Err(denied("open for writing", e));
        }
        match publish_new(path, &c, cfg, attempt) {
            Ok(Some(fd)) => return Ok(fd),
            // Someone else published it first (or removed it again): open theirs.
            Ok(None) => last = io::Error::from_raw_os_error(libc::EEXIST),
            Err(e) => return Err(e),
        }
    }
    Err(io_err(
        path,
        "open (the file kept appearing and disappearing)",
        last,
    ))
}

/// One attempt at publishing a new, empty region file at `path` with `cfg`'s permissions.
/// `Ok(None)`: the name exists now (another process won); open it instead.
fn publish_new(
    path: &Path,
    c: &CString,
    cfg: &RegionConfig,
    attempt: u32,
) -> Result<Option<libc::c_int>, RegionError> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.display().to_string(),
        _ => ".".to_string(),
    };
    let create_err = |what: String, e: io::Error| -> RegionError {
        if is_write_denied(&e) {
            RegionError::ReadOnly {
                path: path.to_path_buf(),
                reason: format!("{what}: {e}"),
            }
        } else {
            io_err(path, &what, e)
        }
    };
    // Unique per process (pid) and per call (counter: threads of one process may race).
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let mut tmp_name = path.as_os_str().to_owned();
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() };
    tmp_name.push(format!(".new.{pid}.{n}.{attempt}"));
    let tmp = cpath(Path::new(&tmp_name))?;
    // SAFETY: tmp is a valid C string; the mode is the variadic third argument.
    let tfd = unsafe {
        libc::open(
            tmp.as_ptr(),
            libc::O_RDWR | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            0o600 as libc::c_uint,
        )
    };
    if tfd < 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::EEXIST) {
            // A name left by a dead process with our pid: try the next attempt's name.
            return Ok(None);
        }
        return Err(create_err(format!("create in directory {dir}"), e));
    }
    let unlink_tmp = || {
        // SAFETY: tmp is a valid C string; the name is ours (created with O_EXCL).
        unsafe { libc::unlink(tmp.as_ptr()) };
    };
    let close = |fd: libc::c_int| {
        // SAFETY: fd is open and ours.
        unsafe { libc::close(fd) };
    };
    if let Err(e) = set_permissions(tfd, cfg) {
        unlink_tmp();
        close(tfd);
        let what = match cfg.group {
            Some(g) => format!(
                "set group {g} and mode {:04o} of a new region file",
                cfg.mode
            ),
            None => format!("set mode {:04o} of a new region file", cfg.mode),
        };
        return Err(io_err(path, &what, e));
    }
    // SAFETY: both are valid C strings.
    let linked = unsafe { libc::link(tmp.as_ptr(), c.as_ptr()) };
    let link_err = io::Error::last_os_error();
    unlink_tmp();
    if linked == 0 {
        return Ok(Some(tfd));
    }
    close(tfd);
    match link_err.raw_os_error() {
        Some(libc::EEXIST) => Ok(None),
        // No hard links here (some FUSE and network file systems): exclusive create, then
        // the permissions.
        Some(libc::EPERM) | Some(libc::EOPNOTSUPP) | Some(libc::EXDEV) | Some(libc::EMLINK) => {
            // SAFETY: c is a valid C string; the mode is the variadic third argument.
            let fd = unsafe {
                libc::open(
                    c.as_ptr(),
                    libc::O_RDWR | libc::O_CREAT | libc::O_EXCL | libc::O_CLOEXEC,
                    0o600 as libc::c_uint,
                )
            };
            if fd < 0 {
                let e = io::Error::last_os_error();
                if e.raw_os_error() == Some(libc::EEXIST) {
                    return Ok(None);
                }
                return Err(create_err(format!("create in directory {dir}"), e));
            }
            if let Err(e) = set_permissions(fd, cfg) {
                // Left in place (empty, creator-only): removing it could let a process that
                // opened it meanwhile initialise a second, orphaned quota.
                close(fd);
                return Err(io_err(path, "set the permissions of a new region file", e));
            }
            Ok(Some(fd))
        }
        _ => Err(create_err(format!("publish in directory {dir}"), link_err)),
    }
}

fn is_write_denied(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EACCES) | Some(libc::EPERM) | Some(libc::EROFS) | Some(libc::ETXTBSY)
    )
}

fn flock_retry(fd: libc::c_int, op: libc::c_int) -> io::Result<()> {
    loop {
        // SAFETY: fd is open.
        if unsafe { libc::flock(fd, op) } == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINTR) {
            return Err(e);
        }
    }
}

fn file_size(fd: libc::c_int, path: &Path) -> Result<u64, RegionError> {
    // SAFETY: an all-zero stat is a valid value to be overwritten.
    let mut st: libc::stat = unsafe { core::mem::zeroed() };
    // SAFETY: fd is open; st is a valid out pointer.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return Err(io_err(path, "fstat", io::Error::last_os_error()));
    }
    if st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return Err(RegionError::NotRegularFile {
            path: path.to_path_buf(),
        });
    }
    Ok(st.st_size as u64)
}

/// Boot id of the running kernel (zero if unreadable).
fn current_boot_id() -> [u8; 16] {
    let mut out = [0u8; 16];
    let Ok(s) = std::fs::read_to_string("/proc/sys/kernel/random/boot_id") else {
        return out;
    };
    let hex: Vec<u8> = s.bytes().filter(|b| b.is_ascii_hexdigit()).collect();
    if hex.len() != 32 {
        return out;
    }
    for (i, o) in out.iter_mut().enumerate() {
        let h = (hex[2 * i] as char).to_digit(16).unwrap_or(0);
        let l = (hex[2 * i + 1] as char).to_digit(16).unwrap_or(0);
        *o = (h * 16 + l) as u8;
    }
    out
}

/// Validates the header of an existing, non-empty file (read with `pread`, before mapping).
fn check_existing(
    fd: libc::c_int,
    path: &Path,
    size: u64,
    boot_id: &[u8; 16],
) -> Result<FileState, RegionError> {
    if size == 0 {
        return Ok(FileState::NeedsInit);
    }
    let mut hdr = [0u8; HEADER_SIZE];
    let want = (size as usize).min(HEADER_SIZE);
    let mut got = 0usize;
    while got < want {
        // SAFETY: fd is open; the destination range lies within hdr.
        let r = unsafe {
            libc::pread(
                fd,
                hdr[got..want].as_mut_ptr().cast(),
                want - got,
                got as libc::off_t,
            )
        };
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            return Err(io_err(path, "read header", e));
        }
        if r == 0 {
            break;
        }
        got += r as usize;
    }
    let truncated = || RegionError::Truncated {
        path: path.to_path_buf(),
        found: size,
        expected: REGION_SIZE as u64,
    };
    if got < 8 {
        return Err(truncated());
    }
    let magic: [u8; 8] = hdr[0..8].try_into().unwrap_or([0; 8]);
    if magic != MAGIC {
        // A creator that died after sizing the file but before writing the header leaves
        // zeros: initialise it again.
        if size == REGION_SIZE as u64 && got == HEADER_SIZE && hdr.iter().all(|&b| b == 0) {
            return Ok(FileState::NeedsInit);
        }
        return Err(RegionError::BadMagic {
            path: path.to_path_buf(),
            found: magic,
        });
    }
    if got < 16 {
        return Err(truncated());
    }
    let rd32 = |off: usize| u32::from_le_bytes(hdr[off..off + 4].try_into().unwrap_or([0; 4]));
    let rd64 = |off: usize| u64::from_le_bytes(hdr[off..off + 8].try_into().unwrap_or([0; 8]));
    let version = rd32(core::mem::offset_of!(RegionHeader, version));
    if version != VERSION {
        return Err(RegionError::VersionMismatch {
            path: path.to_path_buf(),
            found: version,
            expected: VERSION,
        });
    }
    if got < HEADER_SIZE {
        return Err(truncated());
    }
    let header_size = rd32(core::mem::offset_of!(RegionHeader, header_size));
    if header_size as usize != HEADER_SIZE {
        return Err(RegionError::SizeMismatch {
            path: path.to_path_buf(),
            what: "header_size field",
            found: header_size as u64,
            expected: HEADER_SIZE as u64,
        });
    }
    let total_size = rd64(core::mem::offset_of!(RegionHeader, total_size));
    if total_size != REGION_SIZE as u64 {
        return Err(RegionError::SizeMismatch {
            path: path.to_path_buf(),
            what: "total_size field",
            found: total_size,
            expected: REGION_SIZE as u64,
        });
    }
    if size < REGION_SIZE as u64 {
        return Err(truncated());
    }
    if size > REGION_SIZE as u64 {
        return Err(RegionError::SizeMismatch {
            path: path.to_path_buf(),
            what: "file size",
            found: size,
            expected: REGION_SIZE as u64,
        });
    }
    if rd32(core::mem::offset_of!(RegionHeader, init_state)) != INIT_READY {
        return Ok(FileState::NeedsInit);
    }
    let off = core::mem::offset_of!(RegionHeader, boot_id);
    let file_boot: [u8; 16] = hdr[off..off + 16].try_into().unwrap_or([0; 16]);
    if *boot_id != [0; 16] && file_boot != [0; 16] && file_boot != *boot_id {
        return Ok(FileState::OtherBoot);
    }
    Ok(FileState::Ready)
}

fn map_fd(
    fd: libc::c_int,
    path: &Path,
    writable: bool,
) -> Result<NonNull<layout::Region>, RegionError> {
    let prot = if writable {
        libc::PROT_READ | libc::PROT_WRITE
    } else {
        libc::PROT_READ
    };
    // SAFETY: fd is a regular file of at least REGION_SIZE bytes (checked by callers).
    let p = unsafe {
        libc::mmap(
            core::ptr::null_mut(),
            REGION_SIZE,
            prot,
            libc::MAP_SHARED,
            fd,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        let e = io::Error::last_os_error();
        if writable && is_write_denied(&e) {
            return Err(RegionError::ReadOnly {
                path: path.to_path_buf(),
                reason: format!("mmap for writing: {e}"),
            });
        }
        return Err(io_err(path, "mmap", e));
    }
    NonNull::new(p.cast()).ok_or_else(|| io_err(path, "mmap", io::Error::other("null mapping")))
}

/// Initialises a freshly sized (or abandoned) region in place. Called under the file's
/// exclusive flock, before anyone may use it.
///
/// # Safety
/// `r` must be a writable REGION_SIZE mapping that no other process uses yet.
unsafe fn init_region(
    r: *mut layout::Region,
    cfg: &RegionConfig,
    boot_id: [u8; 16],
) -> io::Result<()> {
    // SAFETY: (the whole block) r is a valid writable mapping of REGION_SIZE bytes, not yet
    // in use by anyone (init_state != READY and we hold the exclusive flock).
    unsafe {
        core::ptr::write_bytes(r.cast::<u8>(), 0, REGION_SIZE);
        let h = addr_of_mut!((*r).header);
        addr_of_mut!((*h).magic).write(MAGIC);
        addr_of_mut!((*h).version).write(VERSION);
        addr_of_mut!((*h).header_size).write(HEADER_SIZE as u32);
        addr_of_mut!((*h).total_size).write(REGION_SIZE as u64);
        (*addr_of!((*h).device_count)).store(cfg.device_count, Ordering::Relaxed);
        addr_of_mut!((*h).creator_pid).write(libc::getpid() as u32);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        addr_of_mut!((*h).created_unix).write(now);
        addr_of_mut!((*h).boot_id).write(boot_id);
        for d in 0..MAX_DEVICES {
            (*addr_of!((*h).limits[d])).store(cfg.limits[d], Ordering::Relaxed);
            (*addr_of!((*h).limit_flags[d])).store(cfg.limit_flags[d], Ordering::Relaxed);
        }
        let m = addr_of_mut!((*h).lock).cast::<libc::pthread_mutex_t>();
        let mut attr: libc::pthread_mutexattr_t = core::mem::zeroed();
        let rc = libc::pthread_mutexattr_init(&mut attr);
        if rc != 0 {
            return Err(io::Error::from_raw_os_error(rc));
        }
        let mut rc = libc::pthread_mutexattr_setpshared(&mut attr, libc::PTHREAD_PROCESS_SHARED);
        if rc == 0 {
            rc = libc::pthread_mutexattr_setrobust(&mut attr, libc::PTHREAD_MUTEX_ROBUST);
        }
        if rc == 0 {
            rc = libc::pthread_mutex_init(m, &attr);
        }
        libc::pthread_mutexattr_destroy(&mut attr);
        if rc != 0 {
            return Err(io::Error::from_raw_os_error(rc));
        }
        // Publish: everything above happens-before a reader's Acquire load of READY.
        (*addr_of!((*h).init_state)).store(INIT_READY, Ordering::Release);
    }
    Ok(())
}

/// Held region lock. Unlocks on drop.
struct LockGuard<'a> {
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
    fn begin_write(&self) {
        let g = self.region.h_generation();
        let v = g.load(Ordering::Relaxed);
        // If a writer died mid-update the counter is already odd: move to the next odd value
        // so that readers that saw the old one retry.
        g.store(if v & 1 == 0 { v + 1 } else { v + 2 }, Ordering::Relaxed);
        fence(Ordering::Release);
    }

    /// Marks the end of an update (generation becomes even).
    fn end_write(&self) {
        let g = self.region.h_generation();
        let v = g.load(Ordering::Relaxed);
        g.store(v + 1, Ordering::Release);
    }
}

impl Region {
    /// Opens the region at `path`, creating and initialising it from `cfg` if it does not
    /// exist (or is empty, or was abandoned by a creator that died, or is from another boot).
    /// Race-free: initialisation happens under an exclusive `flock`, which the kernel drops if
    /// the initialiser dies. An existing region keeps its own limits; devices whose
    /// configuration differs are listed in [`OpenOutcome::Existing`].
    pub fn open_or_create(
        path: &Path,
        cfg: &RegionConfig,
    ) -> Result<(Region, OpenOutcome), RegionError> {
        let fd = LockedFd(open_or_publish(path, cfg)?);
        flock_retry(fd.0, libc::LOCK_EX).map_err(|e| io_err(path, "flock", e))?;
        let boot_id = current_boot_id();
        let size = file_size(fd.0, path)?;
        let state = check_existing(fd.0, path, size, &boot_id)?;
        match state {
            FileState::Ready => {
                let map = map_fd(fd.0, path, true)?;
                let region = Region {
                    map,
                    path: path.to_path_buf(),
                    writable: true,
                    probe: Arc::new(ProcProbe),
                };
                let differs = region.limit_differences(cfg);
                drop(fd);
                Ok((region, OpenOutcome::Existing { differs }))
            }
            FileState::NeedsInit | FileState::OtherBoot => {
                if size != REGION_SIZE as u64 {
                    // SAFETY: fd is open for writing.
                    let rc = unsafe { libc::posix_fallocate(fd.0, 0, REGION_SIZE as libc::off_t) };
                    if rc != 0 {
                        // Leave the file empty so that the next opener retries cleanly.
                        // SAFETY: fd is open for writing.
                        unsafe { libc::ftruncate(fd.0, 0) };
                        return Err(io_err(
                            path,
                            "allocate region file",
                            io::Error::from_raw_os_error(rc),
                        ));
                    }
                }
                // A file left from another boot, or an empty one, gets the configured
                // permissions again. Not fatal when the file is not ours (only its owner may
                // change them): it was published with its creator's permissions.
                let _ = set_permissions(fd.0, cfg);
                let map = map_fd(fd.0, path, true)?;
                let region = Region {
                    map,
                    path: path.to_path_buf(),
                    writable: true,
                    probe: Arc::new(ProcProbe),
                };
                // SAFETY: writable REGION_SIZE mapping; nobody uses a region that is not
                // READY or that is from another boot, and we hold the exclusive flock.
                unsafe { init_region(region.map.as_ptr(), cfg, boot_id) }
                    .map_err(|e| io_err(path, "initialise lock", e))?;
                drop(fd);
                Ok((region, OpenOutcome::Created))
            }
        }
    }

    /// Opens an existing, initialised region. `writable = false` maps it read-only (for
    /// snapshots: every write operation then fails or is refused); `writable = true` is for
    /// reclaim.
    pub fn open_existing(path: &Path, writable: bool) -> Result<Region, RegionError> {
        let c = cpath(path)?;
        let flags = if writable {
            libc::O_RDWR
        } else {
            libc::O_RDONLY
        } | libc::O_CLOEXEC;
        // SAFETY: c is a valid C string.
        let fd = unsafe { libc::open(c.as_ptr(), flags) };
        if fd < 0 {
            let e = io::Error::last_os_error();
            if writable && is_write_denied(&e) {
                return Err(RegionError::ReadOnly {
                    path: path.to_path_buf(),
                    reason: format!("open for writing: {e}"),
                });
            }
            return Err(io_err(path, "open", e));
        }
        let fd = LockedFd(fd);
        // Shared: waits for a creator that is still initialising.
        flock_retry(fd.0, libc::LOCK_SH).map_err(|e| io_err(path, "flock", e))?;
        let size = file_size(fd.0, path)?;
        match check_existing(fd.0, path, size, &[0; 16])? {
            FileState::NeedsInit => {
                return Err(RegionError::NotInitialised {
                    path: path.to_path_buf(),
                })
            }
            FileState::Ready | FileState::OtherBoot => {}
        }
        let map = map_fd(fd.0, path, writable)?;
        drop(fd);
        let region = Region {
            map,
            path: path.to_path_buf(),
            writable,
            probe: Arc::new(ProcProbe),
        };
        if region.h_init_state().load(Ordering::Acquire) != INIT_READY {
            return Err(RegionError::NotInitialised {
                path: path.to_path_buf(),
            });
        }
        Ok(region)
    }

    /// Maps a region from a file the caller opened (the agent opens tenant-named paths
    /// itself, safely; see `hami-user`'s `tenantfs`). `writable` needs a read-write `file`.
    /// Unlike [`Region::open_existing`] it never waits: a creator still initialising (holding
    /// the file's exclusive `flock`) gives [`RegionError::NotInitialised`]. `path` names the
    /// file in errors.
    ///
    /// A mapping dies of `SIGBUS` if the file shrinks under it: readers of files that others
    /// control use [`read_snapshot`] instead and map only for short writes (reclaim).
    pub fn open_file(
        file: std::fs::File,
        path: &Path,
        writable: bool,
    ) -> Result<Region, RegionError> {
        use std::os::fd::IntoRawFd;
        let fd = LockedFd(file.into_raw_fd());
        // SAFETY: fd is open.
        if unsafe { libc::flock(fd.0, libc::LOCK_SH | libc::LOCK_NB) } != 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
                return Err(RegionError::NotInitialised {
                    path: path.to_path_buf(),
                });
            }
            return Err(io_err(path, "flock", e));
        }
        let size = file_size(fd.0, path)?;
        match check_existing(fd.0, path, size, &[0; 16])? {
            FileState::NeedsInit => {
                return Err(RegionError::NotInitialised {
                    path: path.to_path_buf(),
                })
            }
            FileState::Ready | FileState::OtherBoot => {}
        }
        let map = map_fd(fd.0, path, writable)?;
        drop(fd);
        let region = Region {
            map,
            path: path.to_path_buf(),
            writable,
            probe: Arc::new(ProcProbe),
        };
        if region.h_init_state().load(Ordering::Acquire) != INIT_READY {
            return Err(RegionError::NotInitialised {
                path: path.to_path_buf(),
            });
        }
        Ok(region)
    }

    /// Replaces the liveness probe used by reclaim and owner-died recovery (default:
    /// [`ProcProbe`]).
    pub fn with_probe(mut self, probe: Arc<dyn LivenessProbe>) -> Region {
        self.probe = probe;
        self
    }

    /// The region file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether the mapping is writable.
    pub fn is_writable(&self) -> bool {
        self.writable
    }

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

    // ---- lock ----

    fn lock(&self) -> Result<LockGuard<'_>, RegionError> {
        if !self.writable {
            return Err(self.read_only_err());
        }
        let rc = self.acquire();
        match rc {
            0 => Ok(LockGuard { region: self }),
            libc::EOWNERDEAD => {
                let g = LockGuard { region: self };
                self.recover_locked(&g);
                // SAFETY: we own the mutex in the owner-died state; the protected data is
                // consistent again (recover_locked).
                unsafe { libc::pthread_mutex_consistent(self.mutex()) };
                Ok(g)
            }
            e => Err(RegionError::Lock {
                path: self.path.clone(),
                source: io::Error::from_raw_os_error(e),
            }),
        }
    }

    /// Takes the mutex: a short bounded spin on `pthread_mutex_trylock` first, then the
    /// blocking `pthread_mutex_lock`. The lock is held for a few stores, so a holder running
    /// on another CPU releases it within the spin, sparing both sides a futex sleep and wake;
    /// a preempted holder makes the spin run out and the caller sleep as before. Both calls
    /// report a dead owner the same way (`EOWNERDEAD`, with the lock taken), handled by
    /// [`Region::lock`] for both.
    fn acquire(&self) -> libc::c_int {
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
        // SAFETY: as above.
        unsafe { libc::pthread_mutex_lock(self.mutex()) }
    }

    fn read_only_err(&self) -> RegionError {
        RegionError::ReadOnly {
            path: self.path.clone(),
            reason: "mapped read-only".into(),
        }
    }

    /// Owner-died recovery, under the lock. Every writer only modifies its own slot, slots of
    /// dead processes, and the header totals; so the slots of live processes are exact.
    /// Reclaim every slot whose process is dead, then recompute `used` from active slots.
    fn recover_locked(&self, g: &LockGuard<'_>) {
        g.begin_write();
        let mut reclaimed = 0u64;
        for i in 0..MAX_SLOTS {
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
            for i in 0..MAX_SLOTS {
                if self.s_status(i).load(Ordering::Relaxed) == SLOT_ACTIVE {
                    for k in 0..USAGE_KINDS {
                        sum = sum.saturating_add(self.s_usage(i, d, k).load(Ordering::Relaxed));
                    }
                }
            }
            self.h_used(d).store(sum, Ordering::Relaxed);
        }
        self.h_reclaimed().fetch_add(reclaimed, Ordering::Relaxed);
        self.h_recoveries().fetch_add(1, Ordering::Relaxed);
        g.end_write();
    }

    /// Frees slot `i` under the lock (inside a write section). With `subtract`, its usage is
    /// subtracted from `used`. Status becomes FREE last, so a death midway leaves either an
    /// ACTIVE slot of a dead process (reclaimed again) or a FREE one (ignored).
    fn clear_slot_locked(&self, i: usize, subtract: bool) -> [[u64; USAGE_KINDS]; MAX_DEVICES] {
        let mut freed = [[0u64; USAGE_KINDS]; MAX_DEVICES];
        for (d, fd) in freed.iter_mut().enumerate() {
            for (k, fk) in fd.iter_mut().enumerate() {
                let u = self.s_usage(i, d, k).load(Ordering::Relaxed);
                if u != 0 {
                    if subtract {
                        let used = self.h_used(d);
                        used.store(
                            used.load(Ordering::Relaxed).saturating_sub(u),
                            Ordering::Relaxed,
                        );
                    }
                    self.s_usage(i, d, k).store(0, Ordering::Relaxed);
                }
                *fk = u;
            }
        }
        self.s_status(i).store(SLOT_FREE, Ordering::Relaxed);
        self.s_pid(i).store(0, Ordering::Relaxed);
        self.s_start(i).store(0, Ordering::Relaxed);
        freed
    }

    /// Claims free slot `i` for `who` (inside a write section).
    fn claim_slot_locked(&self, i: usize, who: ProcessId) {
        for d in 0..MAX_DEVICES {
            for k in 0..USAGE_KINDS {
                // A FREE slot may hold leftovers of a clear that was interrupted by death.
                self.s_usage(i, d, k).store(0, Ordering::Relaxed);
            }
        }
        self.s_pid(i).store(who.pid, Ordering::Relaxed);
        self.s_start(i).store(who.start_time, Ordering::Relaxed);
        self.s_status(i).store(SLOT_ACTIVE, Ordering::Relaxed);
    }

    /// Whether slot `s` still holds its owner (under the lock, or racy without it).
    fn holds(&self, s: SlotId) -> bool {
        let i = s.index as usize;
        i < MAX_SLOTS
            && self.s_status(i).load(Ordering::Relaxed) == SLOT_ACTIVE
            && self.s_pid(i).load(Ordering::Relaxed) == s.owner.pid
            && self.s_start(i).load(Ordering::Relaxed) == s.owner.start_time
    }

    fn limit_differences(&self, cfg: &RegionConfig) -> Vec<LimitDifference> {
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

    // ---- slots ----

    /// Registers `who` (a live process, normally [`ProcessId::current`]) and returns its
    /// slot. Reuses a slot already holding exactly `who`. A slot with the same pid but another
    /// start time belongs to a dead process (pids are unique among live processes of a pid
    /// namespace) and is reclaimed. If no slot is free, dead processes' slots are reclaimed
    /// (liveness probe) and the registration retried; [`RegionError::Full`] if all are live.
    /// Cost: one lock and a scan of the slot table (no `/proc` access unless full).
    pub fn register(&self, who: ProcessId) -> Result<SlotId, RegionError> {
        if let Some(s) = self.try_register(who)? {
            return Ok(s);
        }
        self.reclaim_dead();
        if let Some(s) = self.try_register(who)? {
            return Ok(s);
        }
        Err(RegionError::Full {
            path: self.path.clone(),
        })
    }

    fn try_register(&self, who: ProcessId) -> Result<Option<SlotId>, RegionError> {
        let g = self.lock()?;
        let mut free = None;
        let mut stale = None;
        for i in 0..MAX_SLOTS {
            if self.s_status(i).load(Ordering::Relaxed) == SLOT_ACTIVE {
                if self.s_pid(i).load(Ordering::Relaxed) == who.pid {
                    if self.s_start(i).load(Ordering::Relaxed) == who.start_time {
                        return Ok(Some(SlotId::new(i, who)));
                    }
                    stale = Some(i);
                }
            } else if free.is_none() {
                free = Some(i);
            }
        }
        let chosen = match stale {
            Some(i) => {
                g.begin_write();
                self.clear_slot_locked(i, true);
                self.h_reclaimed().fetch_add(1, Ordering::Relaxed);
                Some(i)
            }
            None => {
                if free.is_some() {
                    g.begin_write();
                }
                free
            }
        };
        Ok(chosen.map(|i| {
            self.claim_slot_locked(i, who);
            g.end_write();
            SlotId::new(i, who)
        }))
    }

    /// Releases the slot at normal exit: its usage is subtracted from the totals and it is
    /// freed. Does nothing if the slot no longer holds its owner.
    pub fn unregister(&self, slot: SlotId) {
        let Ok(g) = self.lock() else { return };
        if self.holds(slot) {
            g.begin_write();
            self.clear_slot_locked(slot.index(), true);
            g.end_write();
        }
    }

    /// Whether `slot` still belongs to its owner (it may have been reclaimed).
    pub fn is_registered(&self, slot: SlotId) -> bool {
        self.holds(slot)
    }

    // ---- admission (hot path) ----

    /// Exact admission: charges `bytes` of `kind` on `dev` to `slot` if
    /// `used[dev] + bytes <= limit[dev]` (limit 0 = unlimited), atomically with respect to
    /// every other process and thread. Refuses devices flagged [`LIMIT_FLAG_INVALID`].
    pub fn try_charge(
        &self,
        slot: SlotId,
        dev: usize,
        kind: UsageKind,
        bytes: u64,
    ) -> Result<(), Denied> {
        let deny = |reason, limit, used| Denied {
            reason,
            dev,
            limit,
            used,
            requested: bytes,
        };
        if dev >= MAX_DEVICES {
            return Err(deny(DenyReason::BadDevice, 0, 0));
        }
        if !self.writable {
            return Err(deny(DenyReason::ReadOnly, 0, 0));
        }
        let Ok(g) = self.lock() else {
            return Err(deny(DenyReason::LockFailed, 0, 0));
        };
        let limit = self.h_limit(dev).load(Ordering::Relaxed);
        let used = self.h_used(dev).load(Ordering::Relaxed);
        if self.h_flags(dev).load(Ordering::Relaxed) & LIMIT_FLAG_INVALID != 0 {
            return Err(deny(DenyReason::ConfigInvalid, limit, used));
        }
        if !self.holds(slot) {
            return Err(deny(DenyReason::SlotLost, limit, used));
        }
        let new_used = match used.checked_add(bytes) {
            Some(n) if limit == 0 || n <= limit => n,
            _ => return Err(deny(DenyReason::OverLimit, limit, used)),
        };
        g.begin_write();
        // Slot first: a death between the two stores can only over-count (see docs).
        let u = self.s_usage(slot.index(), dev, kind.index());
        u.store(
            u.load(Ordering::Relaxed).saturating_add(bytes),
            Ordering::Relaxed,
        );
        self.h_used(dev).store(new_used, Ordering::Relaxed);
        g.end_write();
        Ok(())
    }

    /// Charges without checking the limit (context memory, which the driver has already
    /// taken). Does nothing on a lost slot, a read-only mapping or a bad device.
    pub fn force_charge(&self, slot: SlotId, dev: usize, kind: UsageKind, bytes: u64) {
        if dev >= MAX_DEVICES {
            return;
        }
        let Ok(g) = self.lock() else { return };
        if !self.holds(slot) {
            return;
        }
        g.begin_write();
        let u = self.s_usage(slot.index(), dev, kind.index());
        u.store(
            u.load(Ordering::Relaxed).saturating_add(bytes),
            Ordering::Relaxed,
        );
        let used = self.h_used(dev);
        used.store(
            used.load(Ordering::Relaxed).saturating_add(bytes),
            Ordering::Relaxed,
        );
        g.end_write();
    }

    /// Releases up to `bytes` of `kind` on `dev` from `slot`, saturating at what the slot
    /// holds (never wraps). Returns the bytes actually subtracted.
    pub fn uncharge(&self, slot: SlotId, dev: usize, kind: UsageKind, bytes: u64) -> u64 {
        if dev >= MAX_DEVICES {
            return 0;
        }
        let Ok(g) = self.lock() else { return 0 };
        if !self.holds(slot) {
            return 0;
        }
        let u = self.s_usage(slot.index(), dev, kind.index());
        let have = u.load(Ordering::Relaxed);
        let sub = have.min(bytes);
        if sub == 0 {
            return 0;
        }
        g.begin_write();
        // Totals first, slot last: a death between them can only over-count.
        let used = self.h_used(dev);
        used.store(
            used.load(Ordering::Relaxed).saturating_sub(sub),
            Ordering::Relaxed,
        );
        u.store(have - sub, Ordering::Relaxed);
        g.end_write();
        sub
    }

    // ---- reclaim ----

    /// Frees the slots of dead processes according to the region's liveness probe (default:
    /// the caller's `/proc`, valid for processes in the caller's pid namespace). Liveness is
    /// gathered without the lock; each slot is re-checked under the lock (same pid and start
    /// time, still active) before it is freed. Returns what was freed.
    pub fn reclaim_dead(&self) -> Vec<ReclaimedSlot> {
        let probe = Arc::clone(&self.probe);
        self.reclaim_dead_with(&*probe)
    }

    /// [`Region::reclaim_dead`] with an explicit probe (the agent: container pids).
    pub fn reclaim_dead_with(&self, probe: &dyn LivenessProbe) -> Vec<ReclaimedSlot> {
        if !self.writable {
            return Vec::new();
        }
        let dead: Vec<(usize, ProcessId)> = (0..MAX_SLOTS)
            .filter(|&i| self.s_status(i).load(Ordering::Acquire) == SLOT_ACTIVE)
            .map(|i| {
                (
                    i,
                    ProcessId {
                        pid: self.s_pid(i).load(Ordering::Relaxed),
                        start_time: self.s_start(i).load(Ordering::Relaxed),
                    },
                )
            })
            .filter(|&(_, who)| probe.liveness(who) == Liveness::Dead)
            .collect();
        if dead.is_empty() {
            return Vec::new();
        }
        let Ok(g) = self.lock() else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for (i, who) in dead {
            if self.holds(SlotId::new(i, who)) {
                g.begin_write();
                let usage = self.clear_slot_locked(i, true);
                self.h_reclaimed().fetch_add(1, Ordering::Relaxed);
                g.end_write();
                out.push(ReclaimedSlot {
                    index: i,
                    pid: who.pid,
                    start_time: who.start_time,
                    usage,
                });
            }
        }
        out
    }

    /// Frees `slot` only if it still holds `expected` (the agent's `--reclaim`, after it has
    /// established by its own means that `expected` is dead).
    pub fn reclaim_slot_if(&self, slot: SlotId, expected: ProcessId) -> Option<ReclaimedSlot> {
        let target = SlotId::new(slot.index(), expected);
        let g = self.lock().ok()?;
        if !self.holds(target) {
            return None;
        }
        g.begin_write();
        let usage = self.clear_slot_locked(target.index(), true);
        self.h_reclaimed().fetch_add(1, Ordering::Relaxed);
        g.end_write();
        Some(ReclaimedSlot {
            index: target.index(),
            pid: expected.pid,
            start_time: expected.start_time,
            usage,
        })
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
    pub fn limit_flags(&self, dev: usize) -> u32 {
        if dev >= MAX_DEVICES {
            return 0;
        }
        self.h_flags(dev).load(Ordering::Relaxed)
    }

    /// The admitted total on `dev` (all processes). Lock-free.
    #[inline]
    pub fn used(&self, dev: usize) -> u64 {
        if dev >= MAX_DEVICES {
            return 0;
        }
        self.h_used(dev).load(Ordering::Relaxed)
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

    // ---- snapshot ----

    /// A lock-free, owned copy of the region (works on a read-only mapping). Retries a few
    /// times to get a copy from one instant; see [`RegionSnapshot::consistent`].
    pub fn snapshot(&self) -> RegionSnapshot {
        let mut last = None;
        for _ in 0..16 {
            let gen = self.h_generation();
            let g1 = gen.load(Ordering::Acquire);
            let mut snap = self.copy_once();
            fence(Ordering::Acquire);
            let g2 = gen.load(Ordering::Relaxed);
            snap.generation = g1;
            if g1 & 1 == 0 && g1 == g2 {
                snap.consistent = true;
                return snap;
            }
            last = Some(snap);
            std::thread::yield_now();
        }
        last.unwrap_or_else(|| self.copy_once())
    }

    fn copy_once(&self) -> RegionSnapshot {
        let mut limits = [0u64; MAX_DEVICES];
        let mut limit_flags = [0u32; MAX_DEVICES];
        let mut uuids = [[0u8; 16]; MAX_DEVICES];
        let mut used = [0u64; MAX_DEVICES];
        for d in 0..MAX_DEVICES {
            limits[d] = self.h_limit(d).load(Ordering::Relaxed);
            limit_flags[d] = self.h_flags(d).load(Ordering::Relaxed);
            uuids[d] = self.uuid(d);
            used[d] = self.h_used(d).load(Ordering::Relaxed);
        }
        let mut slots = Vec::new();
        for i in 0..MAX_SLOTS {
            if self.s_status(i).load(Ordering::Relaxed) != SLOT_ACTIVE {
                continue;
            }
            let mut usage = [[0u64; USAGE_KINDS]; MAX_DEVICES];
            for (d, ud) in usage.iter_mut().enumerate() {
                for (k, uk) in ud.iter_mut().enumerate() {
                    *uk = self.s_usage(i, d, k).load(Ordering::Relaxed);
                }
            }
            slots.push(SlotSnapshot {
                index: i,
                pid: self.s_pid(i).load(Ordering::Relaxed),
                start_time: self.s_start(i).load(Ordering::Relaxed),
                usage,
            });
        }
        let (version, header_size, total_size, creator_pid, created_unix, boot_id) =
            self.header_constants();
        RegionSnapshot {
            version,
            header_size,
            total_size,
            init_state: self.h_init_state().load(Ordering::Acquire),
            device_count: self.device_count(),
            creator_pid,
            created_unix,
            boot_id,
            generation: 0,
            owner_died_recoveries: self.h_recoveries().load(Ordering::Relaxed),
            reclaimed_slots: self.h_reclaimed().load(Ordering::Relaxed),
            limits,
            limit_flags,
            uuids,
            used,
            slots,
            consistent: false,
        }
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
            core::mem::forget(g);
        }
        // SAFETY: kills ourselves; nothing after it runs.
        unsafe {
            libc::kill(libc::getpid(), libc::SIGKILL);
            libc::_exit(137)
        }
    }

    /// Test hook: the number of owner-died recoveries so far.
    #[doc(hidden)]
    pub fn __test_recoveries(&self) -> u64 {
        self.h_recoveries().load(Ordering::Relaxed)
    }
}

/// Attempts [`read_snapshot`] makes to get a copy from one instant.
const READ_ATTEMPTS: usize = 16;

/// Reads a region through `file` with `pread` into a private buffer and parses it: the
/// agent's way of reading regions that tenants can truncate, replace or rewrite at any time
/// (a mapping would die of `SIGBUS` when the file shrinks). Never maps, never locks, never
/// blocks on the region lock or a `flock`.
///
/// The file must be a regular file of exactly [`REGION_SIZE`] bytes with a valid,
/// initialised header (the same checks as [`Region::open_existing`]); a file that shrinks
/// while being read gives [`RegionError::Truncated`]. The copy is taken between two reads of
/// the header's `generation` (the seqlock); when writers keep it moving, the last copy is
/// returned with `consistent == false`, as [`Region::snapshot`] does.
pub fn read_snapshot(file: &std::fs::File, path: &Path) -> Result<RegionSnapshot, RegionError> {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::FileExt;
    let fd = file.as_raw_fd();
    let size = file_size(fd, path)?;
    match check_existing(fd, path, size, &[0; 16])? {
        FileState::NeedsInit => {
            return Err(RegionError::NotInitialised {
                path: path.to_path_buf(),
            })
        }
        FileState::Ready | FileState::OtherBoot => {}
    }
    let gen_off = core::mem::offset_of!(RegionHeader, generation) as u64;
    let read_gen = || -> Result<u64, RegionError> {
        let mut g = [0u8; 8];
        file.read_exact_at(&mut g, gen_off)
            .map_err(|e| short_read(file, path, "read generation", e))?;
        Ok(u64::from_le_bytes(g))
    };
    let mut buf = vec![0u8; REGION_SIZE];
    let mut last = None;
    for attempt in 0..READ_ATTEMPTS {
        let g1 = read_gen()?;
        file.read_exact_at(&mut buf, 0)
            .map_err(|e| short_read(file, path, "read", e))?;
        let g2 = read_gen()?;
        let mut snap = parse_snapshot(&buf);
        snap.generation = g1;
        if g1 & 1 == 0 && g1 == g2 {
            snap.consistent = true;
            return Ok(snap);
        }
        last = Some(snap);
        if attempt + 1 < READ_ATTEMPTS {
            std::thread::yield_now();
        }
    }
    Ok(last.expect("at least one attempt"))
}

/// A failed `pread` of a region: [`RegionError::Truncated`] when the file is now shorter
/// than a region (it shrank under the reader), else the I/O error.
fn short_read(file: &std::fs::File, path: &Path, op: &str, e: io::Error) -> RegionError {
    match file.metadata() {
        Ok(m) if m.len() < REGION_SIZE as u64 => RegionError::Truncated {
            path: path.to_path_buf(),
            found: m.len(),
            expected: REGION_SIZE as u64,
        },
        _ => io_err(path, op, e),
    }
}

/// Parses the bytes of a whole region (`buf.len() == REGION_SIZE`, header already checked).
fn parse_snapshot(buf: &[u8]) -> RegionSnapshot {
    use core::mem::{offset_of, size_of};
    use layout::Slot;
    let r32 = |o: usize| u32::from_le_bytes(buf[o..o + 4].try_into().unwrap_or([0; 4]));
    let r64 = |o: usize| u64::from_le_bytes(buf[o..o + 8].try_into().unwrap_or([0; 8]));
    let mut limits = [0u64; MAX_DEVICES];
    let mut limit_flags = [0u32; MAX_DEVICES];
    let mut uuids = [[0u8; 16]; MAX_DEVICES];
    let mut used = [0u64; MAX_DEVICES];
    for d in 0..MAX_DEVICES {
        limits[d] = r64(offset_of!(RegionHeader, limits) + 8 * d);
        limit_flags[d] = r32(offset_of!(RegionHeader, limit_flags) + 4 * d);
        let u = offset_of!(RegionHeader, uuids) + 16 * d;
        uuids[d].copy_from_slice(&buf[u..u + 16]);
        used[d] = r64(offset_of!(RegionHeader, used) + 8 * d);
    }
    let slots_off = offset_of!(layout::Region, slots);
    let mut slots = Vec::new();
    for i in 0..MAX_SLOTS {
        let base = slots_off + i * size_of::<Slot>();
        if r32(base + offset_of!(Slot, status)) != SLOT_ACTIVE {
            continue;
        }
        let mut usage = [[0u64; USAGE_KINDS]; MAX_DEVICES];
        for (d, ud) in usage.iter_mut().enumerate() {
            for (k, uk) in ud.iter_mut().enumerate() {
                *uk = r64(base + offset_of!(Slot, usage) + 8 * (d * USAGE_KINDS + k));
            }
        }
        slots.push(SlotSnapshot {
            index: i,
            pid: r32(base + offset_of!(Slot, pid)),
            start_time: r64(base + offset_of!(Slot, start_time)),
            usage,
        });
    }
    let boot = offset_of!(RegionHeader, boot_id);
    let mut boot_id = [0u8; 16];
    boot_id.copy_from_slice(&buf[boot..boot + 16]);
    RegionSnapshot {
        version: r32(offset_of!(RegionHeader, version)),
        header_size: r32(offset_of!(RegionHeader, header_size)),
        total_size: r64(offset_of!(RegionHeader, total_size)),
        init_state: r32(offset_of!(RegionHeader, init_state)),
        device_count: r32(offset_of!(RegionHeader, device_count)),
        creator_pid: r32(offset_of!(RegionHeader, creator_pid)),
        created_unix: r64(offset_of!(RegionHeader, created_unix)),
        boot_id,
        generation: 0,
        owner_died_recoveries: r64(offset_of!(RegionHeader, owner_died_recoveries)),
        reclaimed_slots: r64(offset_of!(RegionHeader, reclaimed_slots)),
        limits,
        limit_flags,
        uuids,
        used,
        slots,
        consistent: false,
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
