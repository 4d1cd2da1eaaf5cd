//! Process identity and liveness: `ProcessId` (pid + start time) and `/proc/<pid>/stat`.

use crate::procfs::{parse_stat, StatFields};
use std::io;

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
        // The main thread's own stat file, whose start time is the process's on every
        // kernel: qemu-user answers `/proc/self/stat` itself, with the *calling thread's*
        // start time (a process registered from a second thread would look like another
        // process, and its slot would be reclaimed), but passes `task/<tid>/stat` through.
        let mut path = [0u8; 48];
        let start_time = read_stat(self_task_stat_path(pid, &mut path))
            .or_else(|_| read_stat(b"/proc/self/stat\0"))
            .map(|s| s.start_time)
            .unwrap_or(0);
        ProcessId { pid, start_time }
    }

    /// The process with this pid now, from `/proc/<pid>/stat`; `None` if there is none (or
    /// `/proc` cannot be read).
    pub fn of(pid: u32) -> Option<ProcessId> {
        let mut path = [0u8; 48];
        read_stat(stat_path_of(pid, &mut path))
            .ok()
            .map(|s| ProcessId {
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
        let mut path = [0u8; 48];
        match read_stat(stat_path_of(who.pid, &mut path)) {
            Ok(st) => {
                // A zombie's resources (and its GPU memory) are gone. A zombie leader with live
                // threads still runs: num_threads counts them.
                if st.is_dead() {
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

/// Writes `/proc/<pid>/stat\0` into `buf` (no allocation).
pub(super) fn proc_stat_path(pid: u32, buf: &mut [u8; 32]) -> &[u8] {
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

/// The stat file that describes process `pid` as a whole: `/proc/<pid>/stat`, or for this
/// very process its main thread's `/proc/self/task/<pid>/stat` (same fields on every kernel;
/// under qemu-user the only one that is not answered by the emulator with the calling
/// thread's start time, see [`ProcessId::current`]).
pub(super) fn stat_path_of(pid: u32, buf: &mut [u8; 48]) -> &[u8] {
    // SAFETY: getpid has no preconditions.
    if pid == unsafe { libc::getpid() } as u32 {
        return self_task_stat_path(pid, buf);
    }
    let mut short = [0u8; 32];
    let len = proc_stat_path(pid, &mut short).len();
    buf[..len].copy_from_slice(&short[..len]);
    &buf[..len]
}

/// Writes `/proc/self/task/<pid>/stat\0` into `buf` (no allocation).
pub(super) fn self_task_stat_path(pid: u32, buf: &mut [u8; 48]) -> &[u8] {
    let mut short = [0u8; 32];
    // `/proc/<pid>/stat\0` -> `/proc/self/task/<pid>/stat\0`.
    let tail = &proc_stat_path(pid, &mut short)[b"/proc/".len()..];
    let head = b"/proc/self/task/";
    buf[..head.len()].copy_from_slice(head);
    buf[head.len()..head.len() + tail.len()].copy_from_slice(tail);
    &buf[..head.len() + tail.len()]
}

/// Reads and parses a `/proc/.../stat` file (NUL-terminated path) without allocating.
/// Errors are errno values.
pub(super) fn read_stat(path: &[u8]) -> Result<StatFields, i32> {
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

pub(super) fn errno() -> i32 {
    io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}
