//! Exit watch: one pidfd per tracked process, each registered with the tokio runtime's
//! reactor ([`AsyncFd`]), so that a tick learns which processes exited from the readiness the
//! reactor recorded (no system call, no wait) instead of a `/proc/<pid>/stat` read per
//! process.
//!
//! A pidfd becomes readable when its process has exited (a zombie included, and only once
//! every thread is gone: what [`procinfo::Stat::is_dead`] calls dead). It names one process,
//! never a later one that reuses the pid: the pid is opened first, then `/proc/<pid>/stat` is
//! read once and its start time compared with the one recorded, so a pid reused between the
//! two is refused (the process keeps the stat path). Any failure (`EMFILE`/`ENFILE`, `ESRCH`,
//! `ENOSYS` on kernels before 5.3, no runtime) leaves the process on the stat path. Nothing
//! here waits: readiness is polled with a no-op waker. The reactor (a worker thread of the
//! runtime, waiting in its own `epoll_wait`) records an exit moments after the kernel
//! signals it; an exit it has not recorded yet is seen at the next tick.

use std::io;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::path::Path;
use std::task::{Context, Poll, Waker};

use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tokio::runtime::Handle;

use crate::procinfo;

/// A tracked process's pidfd, registered with the runtime's reactor; closed (and so
/// unregistered) when dropped.
#[derive(Debug)]
pub(super) struct Pidfd {
    fd: AsyncFd<OwnedFd>,
    /// The process's start time, read right after the pidfd was opened.
    pub(super) start_time: u64,
}

impl Pidfd {
    /// The descriptor's number (tests).
    #[cfg(test)]
    pub(super) fn raw(&self) -> RawFd {
        std::os::fd::AsRawFd::as_raw_fd(&self.fd)
    }

    /// Whether the process has exited, as far as the reactor has seen: `Some(true)` once
    /// its pidfd was readable, `Some(false)` before; `None` when the runtime is gone (ask
    /// `/proc` instead). Never waits, makes no system call.
    pub(super) fn exited(&self) -> Option<bool> {
        let mut cx = Context::from_waker(Waker::noop());
        match self.fd.poll_read_ready(&mut cx) {
            // The readiness is left set (not cleared): the process stays exited.
            Poll::Ready(Ok(_)) => Some(true),
            Poll::Ready(Err(_)) => None,
            Poll::Pending => Some(false),
        }
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

/// Opens the tracked processes' pidfds and registers them with a runtime's reactor. See the
/// module docs.
#[derive(Debug)]
pub(super) struct ExitWatch {
    /// The runtime whose reactor watches the pidfds (it must have I/O enabled).
    rt: Handle,
    /// `pidfd_open` answered `ENOSYS`: not tried again.
    unsupported: bool,
    /// Running out of descriptors was logged (once).
    told_exhausted: bool,
    /// Tests: the errno every `pidfd_open` fails with.
    #[cfg(test)]
    pub(super) fail_open: Option<i32>,
}

impl ExitWatch {
    /// A new watch whose pidfds `rt`'s reactor watches (`rt` must have I/O enabled).
    pub(super) fn new(rt: Handle) -> ExitWatch {
        ExitWatch {
            rt,
            unsupported: false,
            told_exhausted: false,
            #[cfg(test)]
            fail_open: None,
        }
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
        // Registered with the watch's runtime, whichever thread this is.
        let _rt = self.rt.enter();
        // SAFETY: an OwnedFd is an open descriptor that stays open, and is the same one,
        // for as long as it is owned (here: by the AsyncFd, until the Pidfd is dropped).
        let fd = unsafe { AsyncFd::register_with_interest(fd, Interest::READABLE) }
            .inspect_err(|e| tracing::trace!(pid, error = %e, "registering a pidfd failed"))
            .ok()?;
        Some(Pidfd {
            fd,
            start_time: st.start_time,
        })
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
