//! Exit watch: one pidfd per tracked process, all in one epoll set, so that a tick learns
//! which processes exited with one `epoll_wait(.., 0)` instead of a `/proc/<pid>/stat` read
//! per process.
//!
//! A pidfd becomes readable when its process has exited (a zombie included, and only once
//! every thread is gone: what [`procinfo::Stat::is_dead`] calls dead). It names one process,
//! never a later one that reuses the pid: the pid is opened first, then `/proc/<pid>/stat` is
//! read once and its start time compared with the one recorded, so a pid reused between the
//! two is refused (the process keeps the stat path). Any failure (`EMFILE`/`ENFILE`, `ESRCH`,
//! `ENOSYS` on kernels before 5.3, no epoll) leaves the process on the stat path. Nothing
//! here waits: `epoll_wait` is called with a zero timeout.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;

use crate::procinfo;

/// Ready events taken per `epoll_wait` (more are taken by calling again).
const BATCH: usize = 256;

/// A tracked process's pidfd, registered in the [`ExitWatch`]; closed (and so unregistered)
/// when dropped.
#[derive(Debug)]
pub(super) struct Pidfd {
    fd: OwnedFd,
    /// The process's start time, read right after the pidfd was opened.
    pub(super) start_time: u64,
}

impl Pidfd {
    /// The descriptor's number (tests, and matching ready events).
    pub(super) fn raw(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

/// `pidfd_open(pid, 0)`: a descriptor naming the process that has `pid` now (close-on-exec).
pub(super) fn pidfd_open(pid: u32) -> io::Result<OwnedFd> {
    let pid = libc::pid_t::try_from(pid).map_err(|_| io::Error::from_raw_os_error(libc::ESRCH))?;
    // SAFETY: pidfd_open takes a pid and flags, no pointers.
    let rc = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a non-negative return is a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(rc as RawFd) })
}

/// The epoll set of every tracked process's pidfd. See the module docs.
#[derive(Debug)]
pub(super) struct ExitWatch {
    epoll: OwnedFd,
    buf: Vec<libc::epoll_event>,
    /// `pidfd_open` answered `ENOSYS`: not tried again.
    unsupported: bool,
    /// Running out of descriptors was logged (once).
    told_exhausted: bool,
    /// Tests: the errno every `pidfd_open` fails with.
    #[cfg(test)]
    pub(super) fail_open: Option<i32>,
}

impl ExitWatch {
    /// A new, empty watch.
    pub(super) fn new() -> io::Result<ExitWatch> {
        // SAFETY: epoll_create1 takes flags only.
        let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(ExitWatch {
            // SAFETY: a new descriptor that nothing else owns.
            epoll: unsafe { OwnedFd::from_raw_fd(fd) },
            buf: vec![libc::epoll_event { events: 0, u64: 0 }; BATCH],
            unsupported: false,
            told_exhausted: false,
            #[cfg(test)]
            fail_open: None,
        })
    }

    fn open(&self, pid: u32) -> io::Result<OwnedFd> {
        #[cfg(test)]
        if let Some(errno) = self.fail_open {
            return Err(io::Error::from_raw_os_error(errno));
        }
        pidfd_open(pid)
    }

    /// Opens a pidfd for `pid`, checks that it names the process that started at `expected`
    /// (`None`: whichever process has the pid, if it is not dead), and registers it. `None`
    /// when any of it fails: the process is then polled through `/proc/<pid>/stat`.
    pub(super) fn watch(
        &mut self,
        proc_root: &Path,
        pid: u32,
        expected: Option<u64>,
    ) -> Option<Pidfd> {
        if self.unsupported {
            return None;
        }
        let fd = match self.open(pid) {
            Ok(fd) => fd,
            Err(e) => {
                match e.raw_os_error() {
                    Some(libc::ENOSYS) => {
                        self.unsupported = true;
                        tracing::debug!("pidfd_open unsupported: processes' liveness read from /proc/<pid>/stat every tick");
                    }
                    Some(libc::EMFILE | libc::ENFILE) if !self.told_exhausted => {
                        self.told_exhausted = true;
                        tracing::warn!(error = %e, "out of file descriptors for pidfds: further processes' liveness read from /proc/<pid>/stat every tick");
                    }
                    _ => tracing::trace!(pid, error = %e, "pidfd_open failed"),
                }
                return None;
            }
        };
        // Read after the open: the start time of the process the pidfd names, unless it
        // exited in between (then the stat shows it dead, or another process, or nothing).
        let st = procinfo::read_stat(proc_root, pid).ok()?;
        if st.is_dead() || expected.is_some_and(|t| t != st.start_time) {
            return None;
        }
        let mut ev = libc::epoll_event {
            events: libc::EPOLLIN as u32,
            u64: token(pid, fd.as_raw_fd()),
        };
        // SAFETY: both descriptors are open; `ev` is a valid epoll_event.
        let rc = unsafe {
            libc::epoll_ctl(
                self.epoll.as_raw_fd(),
                libc::EPOLL_CTL_ADD,
                fd.as_raw_fd(),
                &mut ev,
            )
        };
        if rc < 0 {
            tracing::trace!(pid, error = %io::Error::last_os_error(), "epoll_ctl(ADD) of a pidfd failed");
            return None;
        }
        Some(Pidfd {
            fd,
            start_time: st.start_time,
        })
    }

    /// The processes whose pidfd is readable (exited), as `(pid, descriptor)`; never waits.
    /// Each is taken out of the set (its [`Pidfd`] is still open: the caller drops it).
    pub(super) fn exited(&mut self) -> Vec<(u32, RawFd)> {
        let mut out = Vec::new();
        for _ in 0..1_000_000 {
            // SAFETY: `buf` holds `buf.len()` writable epoll_events; a zero timeout never waits.
            let n = unsafe {
                libc::epoll_wait(
                    self.epoll.as_raw_fd(),
                    self.buf.as_mut_ptr(),
                    self.buf.len() as libc::c_int,
                    0,
                )
            };
            if n < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                tracing::warn!(error = %e, "epoll_wait on pidfds failed");
                break;
            }
            let n = n as usize;
            for ev in &self.buf[..n] {
                let (pid, fd) = untoken(ev.u64);
                // Out of the set, so that the next call returns the others; the descriptor
                // stays open (its Pidfd owns it) until the caller drops the process.
                // SAFETY: `fd` is registered, so open; DEL ignores the event pointer.
                unsafe {
                    libc::epoll_ctl(
                        self.epoll.as_raw_fd(),
                        libc::EPOLL_CTL_DEL,
                        fd,
                        std::ptr::null_mut(),
                    )
                };
                out.push((pid, fd));
            }
            if n < self.buf.len() {
                break;
            }
        }
        out
    }
}

/// Whether `proc_root` is a procfs mounted in the agent's own pid namespace (`/proc`, or
/// the host's `/proc` mounted elsewhere by an agent in the host pid namespace): procfs's
/// `self` names the agent by its pid there.
pub(super) fn is_own_procfs(proc_root: &Path) -> bool {
    const PROC_SUPER_MAGIC: libc::c_long = 0x9fa0;
    let Ok(c) = std::ffi::CString::new(proc_root.as_os_str().as_encoded_bytes()) else {
        return false;
    };
    // SAFETY: all-zero is a valid statfs; it is only read after statfs filled it.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: a NUL-terminated path and a valid out pointer.
    if unsafe { libc::statfs(c.as_ptr(), &mut st) } != 0
        || st.f_type as libc::c_long != PROC_SUPER_MAGIC
    {
        return false;
    }
    std::fs::read_link(proc_root.join("self"))
        .is_ok_and(|l| l.as_os_str() == std::process::id().to_string().as_str())
}

fn token(pid: u32, fd: RawFd) -> u64 {
    ((fd as u32 as u64) << 32) | pid as u64
}

fn untoken(t: u64) -> (u32, RawFd) {
    (t as u32, (t >> 32) as u32 as RawFd)
}

/// Raises `RLIMIT_NOFILE`'s soft limit to the hard limit (one pidfd per tracked process and
/// one descriptor per open region); returns `(before, after)`, or `None` if it failed.
pub fn raise_nofile_limit() -> Option<(u64, u64)> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the valid rlimit struct it is given.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return None;
    }
    let before = lim.rlim_cur;
    if lim.rlim_cur < lim.rlim_max {
        lim.rlim_cur = lim.rlim_max;
        // SAFETY: setrlimit reads a valid, initialised rlimit struct.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) } != 0 {
            return None;
        }
    }
    Some((before, lim.rlim_cur))
}
