//! Opening and reading files that tenants name or control, safely (see the threat model in
//! `docs/agent.md`).
//!
//! A tenant chooses the region path (`CUDA_DEVICE_MEMORY_SHARED_CACHE` in its environment),
//! the files its processes map, and what lies at those paths inside its container: a FIFO
//! (an `open` for reading blocks until a writer comes), a device node (opening it runs the
//! driver's `open`), a socket, or a symlink that, followed from the host through
//! `/proc/<pid>/root`, would land on a host file. So every such path is opened here:
//!
//! * resolved **inside the process's root** with `openat2(RESOLVE_IN_ROOT |
//!   RESOLVE_NO_MAGICLINKS)`: absolute symlinks and `..` stay inside the container's root,
//!   `/proc/...` magic links are refused;
//! * first as `O_PATH` (no driver `open`, no FIFO wait), then checked with `fstat`: only a
//!   regular file is reopened for reading, through `/proc/self/fd/N` (the very inode just
//!   checked), `O_NONBLOCK | O_NOCTTY | O_CLOEXEC`;
//! * read with `pread` up to a size bound that the caller knows (a region's size, a
//!   maximum for `maps` and `environ`).
//!
//! [`bounded`] runs a read that could still be slow (a file on a hung network or FUSE file
//! system, a `/proc` file of a process whose memory map is locked) on a thread of tokio's
//! blocking pool and gives up waiting after a deadline, so that one input never stalls the
//! agent.

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

/// Largest `/proc/<pid>/maps` or `environ` the agent reads (bytes); the rest is ignored.
pub const MAX_PROC_FILE: u64 = 16 << 20;

/// Errors opening or reading a tenant-named file. Every message names the path.
#[derive(Debug, thiserror::Error)]
pub enum TenantFsError {
    /// A system call failed (`ELOOP` for a magic link or too many symlinks, `ENOENT`, ...).
    #[error("{}: {op}: {source}", path.display())]
    Io {
        /// The path as given.
        path: PathBuf,
        /// The operation.
        op: &'static str,
        /// The error.
        source: io::Error,
    },
    /// The path names something other than a regular file: refused without opening it for
    /// reading.
    #[error("{}: is a {kind}, not a regular file: refused (not opened for reading)", path.display())]
    NotRegular {
        /// The path as given.
        path: PathBuf,
        /// `FIFO`, `character device`, `block device`, `socket`, `directory`, ...
        kind: &'static str,
    },
    /// The path contains a NUL byte.
    #[error("{}: path contains a NUL byte", path.display())]
    BadPath {
        /// The path as given.
        path: PathBuf,
    },
    /// A read did not finish within its deadline (it goes on in the background).
    #[error("{what}: no answer within {after:?} (slow or hostile file system?): skipped")]
    TimedOut {
        /// What was being read.
        what: String,
        /// The deadline.
        after: Duration,
    },
    /// The previous read of the same input has not returned yet: not started again.
    #[error("{what}: the previous read has not returned yet: skipped")]
    Busy {
        /// What was being read.
        what: String,
    },
    /// [`MAX_OUTSTANDING_READS`] reads are outstanding (stuck on slow inputs): not started.
    #[error("{what}: {limit} reads are outstanding (stuck on slow inputs?): skipped")]
    Saturated {
        /// What was being read.
        what: String,
        /// [`MAX_OUTSTANDING_READS`].
        limit: usize,
    },
}

fn io_err(path: &Path, op: &'static str, source: io::Error) -> TenantFsError {
    TenantFsError::Io {
        path: path.to_path_buf(),
        op,
        source,
    }
}

fn cstr(path: &Path) -> Result<CString, TenantFsError> {
    CString::new(path.as_os_str().as_bytes()).map_err(|_| TenantFsError::BadPath {
        path: path.to_path_buf(),
    })
}

/// Name of a file type (`st_mode & S_IFMT`).
pub fn file_kind(mode: u32) -> &'static str {
    match mode & libc::S_IFMT {
        libc::S_IFREG => "regular file",
        libc::S_IFIFO => "FIFO",
        libc::S_IFCHR => "character device",
        libc::S_IFBLK => "block device",
        libc::S_IFSOCK => "socket",
        libc::S_IFDIR => "directory",
        libc::S_IFLNK => "symlink",
        _ => "file of unknown type",
    }
}

/// `struct open_how` of `openat2(2)` (the libc crate's is non-exhaustive).
#[repr(C)]
struct OpenHow {
    flags: u64,
    mode: u64,
    resolve: u64,
}

/// Takes ownership of a raw fd returned by a successful system call.
fn owned(fd: libc::c_int) -> File {
    // SAFETY: fd was just returned by open/openat2 and is owned by nobody else.
    unsafe { File::from_raw_fd(fd) }
}

/// Checks that the `O_PATH` descriptor `opath` is a regular file and reopens it for reading
/// (or reading and writing) through `/proc/self/fd`.
fn reopen_regular(opath: &File, shown: &Path, write: bool) -> Result<File, TenantFsError> {
    // SAFETY: an all-zero stat is a valid value to be overwritten.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: the fd is open (fstat works on O_PATH descriptors); st is a valid out pointer.
    if unsafe { libc::fstat(opath.as_raw_fd(), &mut st) } != 0 {
        return Err(io_err(shown, "fstat", io::Error::last_os_error()));
    }
    if st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return Err(TenantFsError::NotRegular {
            path: shown.to_path_buf(),
            kind: file_kind(st.st_mode),
        });
    }
    let again = CString::new(format!("/proc/self/fd/{}", opath.as_raw_fd()))
        .expect("no NUL in a formatted fd path");
    let mode = if write { libc::O_RDWR } else { libc::O_RDONLY };
    // SAFETY: valid C string; the magic link names exactly the inode checked above.
    let fd = unsafe {
        libc::open(
            again.as_ptr(),
            mode | libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(io_err(shown, "open", io::Error::last_os_error()));
    }
    Ok(owned(fd))
}

/// Opens `path_in_root` as the process whose root directory is `root` (normally
/// `/proc/<pid>/root`) would, never leaving that root: symlinks (absolute or relative) and
/// `..` are resolved inside it, magic links are refused. Only a regular file is opened for
/// reading (read-write with `write`); anything else is [`TenantFsError::NotRegular`].
/// `shown` names the file in errors.
pub fn open_in_root(
    root: &Path,
    path_in_root: &str,
    shown: &Path,
    write: bool,
) -> Result<File, TenantFsError> {
    let croot = cstr(root)?;
    // The root itself is the process's root directory (`/proc/<pid>/root` is a magic link
    // the kernel resolves to it; following it here is the point).
    // SAFETY: valid C string.
    let rfd = unsafe {
        libc::open(
            croot.as_ptr(),
            libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    };
    if rfd < 0 {
        return Err(io_err(shown, "open root", io::Error::last_os_error()));
    }
    let rootf = owned(rfd);
    let rel = path_in_root.trim_start_matches('/');
    let rel = if rel.is_empty() { "." } else { rel };
    let crel = cstr(Path::new(rel))?;
    let how = OpenHow {
        flags: (libc::O_PATH | libc::O_CLOEXEC) as u64,
        mode: 0,
        resolve: libc::RESOLVE_IN_ROOT | libc::RESOLVE_NO_MAGICLINKS,
    };
    let fd = loop {
        // SAFETY: openat2 with a valid dirfd, C string and open_how of the size passed.
        let r = unsafe {
            libc::syscall(
                libc::SYS_openat2,
                rootf.as_raw_fd(),
                crel.as_ptr(),
                &how as *const OpenHow,
                std::mem::size_of::<OpenHow>(),
            )
        };
        if r >= 0 {
            break r as libc::c_int;
        }
        let e = io::Error::last_os_error();
        // EAGAIN: a concurrent rename in the root; the kernel asks to retry.
        if !matches!(e.raw_os_error(), Some(libc::EAGAIN) | Some(libc::EINTR)) {
            return Err(io_err(shown, "open (inside the process's root)", e));
        }
    };
    reopen_regular(&owned(fd), shown, write)
}

/// Opens a path given by the node's administrator (`hami-agent inspect PATH`, `--region`):
/// symlinks are followed, but only a regular file is opened for reading (a FIFO, device or
/// socket is refused without waiting or running a driver's `open`).
pub fn open_regular(path: &Path, write: bool) -> Result<File, TenantFsError> {
    let c = cstr(path)?;
    // SAFETY: valid C string.
    let fd = unsafe { libc::open(c.as_ptr(), libc::O_PATH | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(io_err(path, "open", io::Error::last_os_error()));
    }
    reopen_regular(&owned(fd), path, write)
}

/// Reads at most `max` bytes from the start of `file` with `pread` (a file that shrinks
/// while read gives what was there).
pub fn read_at_most(file: &File, max: u64, shown: &Path) -> Result<Vec<u8>, TenantFsError> {
    let mut out = Vec::new();
    let mut chunk = vec![0u8; 64 << 10];
    while (out.len() as u64) < max {
        let want = chunk.len().min((max - out.len() as u64) as usize);
        match file.read_at(&mut chunk[..want], out.len() as u64) {
            Ok(0) => break,
            Ok(n) => out.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(io_err(shown, "read", e)),
        }
    }
    Ok(out)
}

/// Reads a `/proc/<pid>/...` file (maps, environ, status), at most [`MAX_PROC_FILE`]
/// bytes. The path is the agent's own (not tenant-named); the file must be a regular file
/// (procfs files are; in a fake tree anything else is refused).
pub fn read_proc_file(path: &Path) -> Result<Vec<u8>, TenantFsError> {
    let f = open_regular(path, false)?;
    read_at_most(&f, MAX_PROC_FILE, path)
}

/// Most bounded reads outstanding at once, those stuck on a tenant's input included: each
/// holds one thread of the readers' pool until its input lets it go (a read stuck in the
/// kernel cannot be cancelled). Beyond it a read is refused at once
/// ([`TenantFsError::Saturated`]) instead of starting one more thread.
pub const MAX_OUTSTANDING_READS: usize = 256;

/// Idle reader threads end after this long (at 1000 regions a tick makes 1000 bounded
/// reads, one after another, which a few threads serve without a thread spawn each).
const READER_KEEP_ALIVE: Duration = Duration::from_secs(10);

/// The runtime whose blocking pool runs the bounded reads ([`tokio::task::spawn_blocking`]
/// on its handle). Not the agent's runtime: a runtime shutting down waits for its blocking
/// tasks, so one read stuck in the kernel would hold the agent's exit; and [`bounded`] is
/// also called where no runtime runs (`inspect`, tests). Built once, never shut down; only
/// its blocking pool is used (nothing drives its scheduler).
fn readers() -> io::Result<&'static tokio::runtime::Runtime> {
    static RT: std::sync::OnceLock<io::Result<tokio::runtime::Runtime>> =
        std::sync::OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .thread_name("hami-read")
            // As many threads as permits: a permitted read never waits in the pool's queue.
            .max_blocking_threads(MAX_OUTSTANDING_READS)
            .thread_keep_alive(READER_KEEP_ALIVE)
            .build()
    })
    .as_ref()
    .map_err(|e| io::Error::new(e.kind(), e.to_string()))
}

/// One permit per outstanding read (see [`MAX_OUTSTANDING_READS`]).
static PERMITS: std::sync::LazyLock<Arc<tokio::sync::Semaphore>> =
    std::sync::LazyLock::new(|| Arc::new(tokio::sync::Semaphore::new(MAX_OUTSTANDING_READS)));

/// Runs `f` on a reader thread (tokio's blocking pool, see [`readers`]) and waits at most
/// `deadline` for it. On time-out the thread is left to finish on its own (its result is
/// dropped) and [`TenantFsError::TimedOut`] is returned; `busy`, when given, is set while
/// such a read is outstanding, and a call that finds it set returns [`TenantFsError::Busy`]
/// without starting another (so a stuck input holds one thread, not one per attempt). At
/// most [`MAX_OUTSTANDING_READS`] reads are outstanding ([`TenantFsError::Saturated`]).
///
/// The wait is a plain channel wait, not `tokio::time::timeout`: the callers (the agent's
/// tick, `inspect`) are synchronous code, on a runtime worker or on no runtime at all.
pub fn bounded<T: Send + 'static>(
    what: impl Into<String>,
    deadline: Duration,
    busy: Option<&Arc<AtomicBool>>,
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, TenantFsError> {
    bounded_with(&PERMITS, what.into(), deadline, busy, f)
}

/// [`bounded`] with the permits taken from `permits`.
fn bounded_with<T: Send + 'static>(
    permits: &Arc<tokio::sync::Semaphore>,
    what: String,
    deadline: Duration,
    busy: Option<&Arc<AtomicBool>>,
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, TenantFsError> {
    if let Some(b) = busy {
        if b.swap(true, Ordering::AcqRel) {
            return Err(TenantFsError::Busy { what });
        }
    }
    /// Clears `busy` and returns the permit when dropped: when the read returns, or
    /// panics, or was never started.
    struct Release(
        Option<Arc<AtomicBool>>,
        Option<tokio::sync::OwnedSemaphorePermit>,
    );
    impl Drop for Release {
        fn drop(&mut self) {
            if let Some(b) = &self.0 {
                b.store(false, Ordering::Release);
            }
        }
    }
    let mut release = Release(busy.cloned(), None);
    match Arc::clone(permits).try_acquire_owned() {
        Ok(p) => release.1 = Some(p),
        Err(_) => {
            return Err(TenantFsError::Saturated {
                what,
                limit: MAX_OUTSTANDING_READS,
            })
        }
    }
    let spawn_err = |source| TenantFsError::Io {
        path: PathBuf::from(&what),
        op: "spawn reader thread",
        source,
    };
    let rt = readers().map_err(spawn_err)?;
    let (tx, rx) = mpsc::sync_channel(1);
    let job = move || {
        let v = f();
        drop(release);
        let _ = tx.send(v);
    };
    // tokio panics when the OS gives no thread and none is running to take the job.
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| rt.spawn_blocking(job)))
        .map_err(|_| spawn_err(io::Error::other("the OS gave no thread")))?;
    rx.recv_timeout(deadline)
        .map_err(|_| TenantFsError::TimedOut {
            what,
            after: deadline,
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn mkfifo(p: &Path) {
        let c = cstr(p).unwrap();
        // SAFETY: valid C string.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    }

    #[test]
    fn regular_file_inside_the_root_is_read() {
        let t = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(t.path().join("tmp")).unwrap();
        std::fs::write(t.path().join("tmp/r"), b"hello").unwrap();
        let f = open_in_root(t.path(), "/tmp/r", Path::new("/tmp/r"), false).unwrap();
        assert_eq!(read_at_most(&f, 100, Path::new("r")).unwrap(), b"hello");
        assert_eq!(read_at_most(&f, 3, Path::new("r")).unwrap(), b"hel");
    }

    #[test]
    fn fifo_is_refused_without_blocking() {
        let t = tempfile::tempdir().unwrap();
        mkfifo(&t.path().join("ff"));
        let e = open_in_root(t.path(), "/ff", Path::new("/ff"), false).unwrap_err();
        assert!(e.to_string().contains("FIFO"), "{e}");
        let e = open_regular(&t.path().join("ff"), false).unwrap_err();
        assert!(e.to_string().contains("FIFO"), "{e}");
    }

    #[test]
    fn device_and_directory_are_refused() {
        let t = tempfile::tempdir().unwrap();
        symlink("/dev/null", t.path().join("dev")).unwrap();
        // Inside the root, /dev/null does not exist: not found, never the host's device.
        let e = open_in_root(t.path(), "/dev", Path::new("/dev"), false).unwrap_err();
        assert!(matches!(e, TenantFsError::Io { .. }), "{e}");
        let e = open_regular(Path::new("/dev/null"), false).unwrap_err();
        assert!(e.to_string().contains("character device"), "{e}");
        let e = open_in_root(t.path(), "/", Path::new("/"), false).unwrap_err();
        assert!(e.to_string().contains("directory"), "{e}");
    }

    #[test]
    fn symlinks_never_leave_the_root() {
        let t = tempfile::tempdir().unwrap();
        let host = tempfile::tempdir().unwrap();
        std::fs::write(host.path().join("secret"), b"host").unwrap();
        std::fs::create_dir_all(t.path().join("tmp")).unwrap();
        // Absolute and relative escapes both resolve inside the root.
        symlink(host.path().join("secret"), t.path().join("tmp/abs")).unwrap();
        symlink(
            "../../../../../../..".to_string() + host.path().join("secret").to_str().unwrap(),
            t.path().join("tmp/rel"),
        )
        .unwrap();
        for p in ["/tmp/abs", "/tmp/rel", "/../../../etc/hostname"] {
            let r = open_in_root(t.path(), p, Path::new(p), false);
            assert!(r.is_err(), "{p} must not open a host file");
        }
        // The same name inside the root is what is opened.
        let inside = t.path().join(host.path().strip_prefix("/").unwrap());
        std::fs::create_dir_all(&inside).unwrap();
        std::fs::write(inside.join("secret"), b"mine").unwrap();
        let f = open_in_root(t.path(), "/tmp/abs", Path::new("abs"), false).unwrap();
        assert_eq!(read_at_most(&f, 10, Path::new("abs")).unwrap(), b"mine");
    }

    #[test]
    fn magic_links_are_refused() {
        let t = tempfile::tempdir().unwrap();
        symlink("/proc/self/root/etc/hostname", t.path().join("m")).unwrap();
        // /proc is not inside this root: not found. With the host root, the magic link
        // itself is refused.
        assert!(open_in_root(t.path(), "/m", Path::new("m"), false).is_err());
        let e = open_in_root(
            Path::new("/"),
            "/proc/self/root/etc/hostname",
            Path::new("m"),
            false,
        )
        .unwrap_err();
        assert!(matches!(e, TenantFsError::Io { .. }), "{e}");
    }

    #[test]
    fn bounded_gives_up_and_refuses_a_second_read_while_stuck() {
        let busy = Arc::new(AtomicBool::new(false));
        let (tx, rx) = mpsc::channel::<()>();
        let e = bounded("slow", Duration::from_millis(50), Some(&busy), move || {
            let _ = rx.recv();
        })
        .unwrap_err();
        assert!(matches!(e, TenantFsError::TimedOut { .. }), "{e}");
        let e = bounded("slow", Duration::from_millis(50), Some(&busy), || ()).unwrap_err();
        assert!(matches!(e, TenantFsError::Busy { .. }), "{e}");
        tx.send(()).unwrap();
        let t0 = std::time::Instant::now();
        while busy.load(Ordering::Acquire) && t0.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(
            bounded("fast", Duration::from_secs(5), Some(&busy), || 7).unwrap(),
            7
        );
    }

    /// Reads one after another are served by reused reader threads, not a spawn each.
    #[test]
    fn bounded_reuses_its_reader_threads() {
        let ids: std::collections::HashSet<_> = (0..50)
            .map(|_| {
                bounded("id", Duration::from_secs(5), None, || {
                    std::thread::current().id()
                })
                .unwrap()
            })
            .collect();
        // Other tests of this binary use readers at the same time: a few threads, not 50.
        assert!(ids.len() <= 12, "{} threads", ids.len());
    }

    /// Reads stuck on their input hold their permits: beyond the limit a read is refused at
    /// once (no thread started), and one is started again once a stuck read returns.
    #[test]
    fn stuck_reads_are_bounded_in_number() {
        let permits = Arc::new(tokio::sync::Semaphore::new(2));
        let stuck: Vec<mpsc::Sender<()>> = (0..2)
            .map(|_| {
                let (tx, rx) = mpsc::channel::<()>();
                let e = bounded_with(
                    &permits,
                    "stuck".into(),
                    Duration::from_millis(20),
                    None,
                    move || {
                        let _ = rx.recv();
                    },
                )
                .unwrap_err();
                assert!(matches!(e, TenantFsError::TimedOut { .. }), "{e}");
                tx
            })
            .collect();
        let busy = Arc::new(AtomicBool::new(false));
        let t0 = std::time::Instant::now();
        let e = bounded_with(
            &permits,
            "third".into(),
            Duration::from_secs(5),
            Some(&busy),
            || 1,
        )
        .unwrap_err();
        assert!(matches!(e, TenantFsError::Saturated { .. }), "{e}");
        assert!(t0.elapsed() < Duration::from_secs(1), "refused at once");
        assert!(
            !busy.load(Ordering::Acquire),
            "a refused read leaves busy clear"
        );
        stuck[0].send(()).unwrap();
        let t0 = std::time::Instant::now();
        loop {
            match bounded_with(&permits, "again".into(), Duration::from_secs(5), None, || 2) {
                Ok(v) => break assert_eq!(v, 2),
                Err(TenantFsError::Saturated { .. }) if t0.elapsed() < Duration::from_secs(5) => {
                    std::thread::sleep(Duration::from_millis(2))
                }
                Err(e) => panic!("{e}"),
            }
        }
        drop(stuck);
    }

    /// A reader stuck on its input does not hold up the next read, and a read whose
    /// function panics clears `busy` (the next read is not refused as busy).
    #[test]
    fn a_stuck_or_panicking_read_does_not_block_the_next() {
        let (tx, rx) = mpsc::channel::<()>();
        let e = bounded("stuck", Duration::from_millis(20), None, move || {
            let _ = rx.recv();
        })
        .unwrap_err();
        assert!(matches!(e, TenantFsError::TimedOut { .. }), "{e}");
        let t0 = std::time::Instant::now();
        assert_eq!(
            bounded("next", Duration::from_secs(5), None, || 3).unwrap(),
            3
        );
        assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
        tx.send(()).unwrap();
        let busy = Arc::new(AtomicBool::new(false));
        let e = bounded("panics", Duration::from_secs(5), Some(&busy), || -> u8 {
            panic!("a hostile input made the parser panic")
        })
        .unwrap_err();
        assert!(matches!(e, TenantFsError::TimedOut { .. }), "{e}");
        assert!(!busy.load(Ordering::Acquire));
        assert_eq!(
            bounded("after", Duration::from_secs(5), Some(&busy), || 9).unwrap(),
            9
        );
    }
}
