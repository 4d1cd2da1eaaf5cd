//! The region-wide context-creation lock: an exclusive `flock` on the shared region file,
//! held only around measure-before / create / measure-after of a CUDA context, so that a
//! device-level measurement of one process is not disturbed by the concurrent context
//! creation of another process sharing the region.
//!
//! The lock is taken on a separate open file description of the region file (opened
//! read-only), so it is independent of any other descriptor. The kernel releases it if the
//! holder dies, so a crash never blocks the others. A holder stuck in the driver for longer
//! than [`WAIT_LIMIT`] is given up on: the waiter then measures without the lock (and says
//! so in its log).

use std::ffi::CString;
use std::io;
use std::time::{Duration, Instant};

/// How long a process waits for the lock before measuring without it.
pub const WAIT_LIMIT: Duration = Duration::from_secs(30);

/// Why the lock could not be taken.
#[derive(Debug, thiserror::Error)]
pub enum CtxLockError {
    /// The region path has an interior NUL.
    #[error("region path {0:?} contains a NUL byte")]
    BadPath(String),
    /// `open` failed.
    #[error("open {path}: {source}")]
    Open {
        /// The file.
        path: String,
        /// The error.
        source: io::Error,
    },
    /// `flock` failed.
    #[error("flock {path}: {source}")]
    Flock {
        /// The file.
        path: String,
        /// The error.
        source: io::Error,
    },
    /// Another process held the lock longer than [`WAIT_LIMIT`].
    #[error("{path}: still held by another process after {waited:?}")]
    TimedOut {
        /// The file.
        path: String,
        /// How long we waited.
        waited: Duration,
    },
}

/// The held lock; released (and the descriptor closed) on drop.
#[derive(Debug)]
pub struct CtxLock {
    fd: libc::c_int,
}

impl CtxLock {
    /// Takes the exclusive lock on `path` (the region file), waiting at most `limit`.
    pub fn acquire(path: &str, limit: Duration) -> Result<CtxLock, CtxLockError> {
        let c = CString::new(path).map_err(|_| CtxLockError::BadPath(path.to_string()))?;
        // SAFETY: valid C string; plain flags.
        let fd = unsafe { libc::open(c.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
        if fd < 0 {
            return Err(CtxLockError::Open {
                path: path.to_string(),
                source: io::Error::last_os_error(),
            });
        }
        let lock = CtxLock { fd };
        let start = Instant::now();
        let mut pause = Duration::from_millis(1);
        loop {
            // SAFETY: fd is open and ours.
            if unsafe { libc::flock(lock.fd, libc::LOCK_EX | libc::LOCK_NB) } == 0 {
                return Ok(lock);
            }
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EWOULDBLOCK) | Some(libc::EINTR) => {}
                _ => {
                    return Err(CtxLockError::Flock {
                        path: path.to_string(),
                        source: e,
                    })
                }
            }
            let waited = start.elapsed();
            if waited >= limit {
                return Err(CtxLockError::TimedOut {
                    path: path.to_string(),
                    waited,
                });
            }
            std::thread::sleep(pause.min(limit - waited));
            pause = (pause * 2).min(Duration::from_millis(20));
        }
    }
}

impl Drop for CtxLock {
    fn drop(&mut self) {
        // SAFETY: fd is ours; closing the last descriptor of the open file description
        // releases the flock (LOCK_UN first in case a forked child shares the description).
        unsafe {
            libc::flock(self.fd, libc::LOCK_UN);
            libc::close(self.fd);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exclusive_then_released() {
        let dir = std::env::temp_dir().join(format!("hami-ctxlock-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("region");
        std::fs::write(&f, b"x").unwrap();
        let p = f.to_str().unwrap();
        let a = CtxLock::acquire(p, WAIT_LIMIT).unwrap();
        // A second open file description (as another process would have) must wait.
        let t = Instant::now();
        let e = CtxLock::acquire(p, Duration::from_millis(50)).unwrap_err();
        assert!(matches!(e, CtxLockError::TimedOut { .. }), "{e}");
        assert!(t.elapsed() >= Duration::from_millis(50));
        drop(a);
        let b = CtxLock::acquire(p, Duration::from_millis(50)).unwrap();
        drop(b);
        assert!(matches!(
            CtxLock::acquire(dir.join("missing").to_str().unwrap(), WAIT_LIMIT),
            Err(CtxLockError::Open { .. })
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
