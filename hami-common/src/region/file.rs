//! The region file: create or open, validate the header, map, initialise.

use core::ptr::{addr_of, addr_of_mut};
use core::sync::atomic::{AtomicU32, Ordering};
use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::ptr::NonNull;
use std::sync::Arc;

use super::handle::*;
use super::liveness::*;
use super::types::*;
use hami_abi::layout::{self, RegionHeader, INIT_READY, MAGIC, MAX_DEVICES, REGION_SIZE, VERSION};

/// Closes an fd and releases its flock on drop.
pub(super) struct LockedFd(libc::c_int);

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

pub(super) enum FileState {
    /// Size 0, or an abandoned initialisation: the opener initialises it.
    NeedsInit,
    /// A valid, initialised region of the current boot.
    Ready,
    /// A valid region written during another boot.
    OtherBoot,
}

pub(super) fn io_err(path: &Path, op: &str, e: io::Error) -> RegionError {
    RegionError::Io {
        path: path.to_path_buf(),
        source: io::Error::new(e.kind(), format!("{op}: {e}")),
    }
}

pub(super) fn cpath(path: &Path) -> Result<CString, RegionError> {
    CString::new(path.as_os_str().as_bytes()).map_err(|_| RegionError::Io {
        path: path.to_path_buf(),
        source: io::Error::new(io::ErrorKind::InvalidInput, "path contains a NUL byte"),
    })
}

/// Applies `cfg`'s mode (and group, if any) to an open file: `fchown` first (it may clear
/// set-id bits), then `fchmod`, so the umask never narrows the mode.
pub(super) fn set_permissions(fd: libc::c_int, cfg: &RegionConfig) -> io::Result<()> {
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
pub(super) const PUBLISH_ATTEMPTS: u32 = 16;

/// Opens the region file for writing, creating it if it does not exist. Never opens an
/// existing file with `O_CREAT` (which `fs.protected_regular` refuses in a sticky directory
/// for a file owned by someone else). A new file is made under a private temporary name,
/// given its final mode and group with `fchmod`/`fchown`, then published with `link(2)`,
/// which fails if the name exists: the region never exists under its name with any other
/// permissions, so a process of another uid that opens it right after it appears is never
/// refused by a mode the creator has not set yet. When a file system has no hard links, the
/// file is created with `O_EXCL` and its permissions set right after (a short window in which
/// another uid can be refused; it then fails closed like any unwritable region).
pub(super) fn open_or_publish(path: &Path, cfg: &RegionConfig) -> Result<libc::c_int, RegionError> {
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
            Ok(Some(fd)) => return Ok(reopen_by_name(&c, fd)),
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

/// The published file opened again by its own name, when that name still holds the same
/// inode: a mapping made through the private name it was created under would show in
/// `/proc/<pid>/maps` as that (deleted) name, and whatever finds regions by their path there
/// would miss the creator. Otherwise (renamed or replaced meanwhile) the original `fd`.
fn reopen_by_name(c: &CString, fd: libc::c_int) -> libc::c_int {
    let ident = |fd: libc::c_int| -> Option<(u64, u64)> {
        // SAFETY: an all-zero stat is a valid out-buffer.
        let mut st: libc::stat = unsafe { core::mem::zeroed() };
        // SAFETY: fd is open; st is a valid out-pointer.
        (unsafe { libc::fstat(fd, &mut st) } == 0).then_some((st.st_dev, st.st_ino))
    };
    // SAFETY: c is a valid C string.
    let named = unsafe { libc::open(c.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    if named < 0 {
        return fd;
    }
    if ident(named).is_some() && ident(named) == ident(fd) {
        // SAFETY: fd is ours; the same file stays open through `named`.
        unsafe { libc::close(fd) };
        named
    } else {
        // SAFETY: named is ours.
        unsafe { libc::close(named) };
        fd
    }
}

/// One attempt at publishing a new, empty region file at `path` with `cfg`'s permissions.
/// `Ok(None)`: the name exists now (another process won); open it instead.
pub(super) fn publish_new(
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

pub(super) fn is_write_denied(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EACCES) | Some(libc::EPERM) | Some(libc::EROFS) | Some(libc::ETXTBSY)
    )
}

pub(super) fn flock_retry(fd: libc::c_int, op: libc::c_int) -> io::Result<()> {
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

pub(super) fn file_size(fd: libc::c_int, path: &Path) -> Result<u64, RegionError> {
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
pub(super) fn current_boot_id() -> [u8; 16] {
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
pub(super) fn check_existing(
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

pub(super) fn map_fd(
    fd: libc::c_int,
    path: &Path,
    writable: bool,
) -> Result<NonNull<layout::RegionLayout>, RegionError> {
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
pub(super) unsafe fn init_region(
    r: *mut layout::RegionLayout,
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
        (*addr_of!((*h).task_priority)).store(
            cfg.task_priority.min(crate::config::MAX_TASK_PRIORITY) + 1,
            Ordering::Relaxed,
        );
        for d in 0..MAX_DEVICES {
            (*addr_of!((*h).limits[d])).store(cfg.limits[d], Ordering::Relaxed);
            (*addr_of!((*h).limit_flags[d])).store(cfg.limit_flags[d], Ordering::Relaxed);
            let c = addr_of!((*r).compute[d]);
            (*addr_of!((*c).sm_limit)).store(cfg.sm_limits[d], Ordering::Relaxed);
            (*addr_of!((*c).policy)).store(cfg.compute_policy, Ordering::Relaxed);
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
                let region = Region::from_map(map, path, true);
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
                let region = Region::from_map(map, path, true);
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
        let region = Region::from_map(map, path, writable);
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
        let region = Region::from_map(map, path, writable);
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

    /// Replaces this handle's per-process settings (lock timeout, admission reserve, stale
    /// lock breaking); see [`Tuning`].
    pub fn with_tuning(mut self, tuning: Tuning) -> Region {
        self.tuning = tuning;
        self
    }

    /// This handle's per-process settings.
    pub fn tuning(&self) -> Tuning {
        self.tuning
    }

    /// The region file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether the mapping is writable.
    pub fn is_writable(&self) -> bool {
        self.writable
    }
}
