//! Unit tests of the region: run with `cargo test -p hami-common`.
//! Several tests fork: children only touch the region and then `_exit`.

// `is_multiple_of` is newer than the workspace's rust-version.
#![allow(clippy::manual_is_multiple_of)]

use super::file::*;
use super::handle::*;
use super::*;
use core::mem::{offset_of, size_of};
use core::sync::atomic::Ordering;
use hami_abi::layout::{Slot, UsageKind, LIMIT_FLAG_INVALID, MAX_DEVICES, MAX_SLOTS, REGION_SIZE};
use std::collections::HashSet;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;
use std::sync::Mutex;
use std::time::{Duration, Instant};

mod admission;
mod crashes;
mod create_open;
mod identity;
mod layout;
mod locking;
mod slots;

const MIB: u64 = 1 << 20;

/// A temporary directory removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> TempDir {
        static N: AtomicUsize = AtomicUsize::new(0);
        let p = std::env::temp_dir().join(format!(
            "hami-region-test-{}-{}-{}",
            std::process::id(),
            name,
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }

    fn file(&self) -> PathBuf {
        self.0.join("region.cache")
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn cfg(limit: u64) -> RegionConfig {
    RegionConfig {
        limits: [limit; MAX_DEVICES],
        device_count: 2,
        ..RegionConfig::default()
    }
}

fn create(path: &Path, limit: u64) -> Region {
    let (r, out) = Region::open_or_create(path, &cfg(limit)).unwrap();
    assert_eq!(out, OpenOutcome::Created);
    r
}

/// Liveness from a set the test controls.
#[derive(Default)]
struct FakeProbe(Mutex<HashSet<ProcessId>>);

impl FakeProbe {
    fn set_alive(&self, who: ProcessId, alive: bool) {
        let mut s = self.0.lock().unwrap();
        if alive {
            s.insert(who);
        } else {
            s.remove(&who);
        }
    }
}

impl LivenessProbe for FakeProbe {
    fn liveness(&self, who: ProcessId) -> Liveness {
        if self.0.lock().unwrap().contains(&who) {
            Liveness::Alive
        } else {
            Liveness::Dead
        }
    }
}

fn fake(pid: u32, start_time: u64) -> ProcessId {
    ProcessId { pid, start_time }
}

/// Forks; the child runs `f` and `_exit`s with its return value (101 on panic).
fn fork_child(f: impl FnOnce() -> i32) -> libc::pid_t {
    // SAFETY: fork; the child only runs `f` (region operations) and then _exit.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        let code = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or(101);
        // SAFETY: ends the child without running the parent's atexit handlers or test harness.
        unsafe { libc::_exit(code) };
    }
    pid
}

/// Waits for `pid` up to `timeout`; returns the raw wait status, or None on timeout (the
/// child is then killed, so that it cannot hold the test's output open).
fn wait_timeout(pid: libc::pid_t, timeout: Duration) -> Option<i32> {
    let deadline = Instant::now() + timeout;
    loop {
        let mut status = 0;
        // SAFETY: waits for our own child.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if r == pid {
            return Some(status);
        }
        assert!(r == 0, "waitpid failed");
        if Instant::now() > deadline {
            // SAFETY: kills and reaps our own child.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, &mut status, 0);
            }
            return None;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

fn exit_code(status: i32) -> i32 {
    if libc::WIFEXITED(status) {
        libc::WEXITSTATUS(status)
    } else {
        -libc::WTERMSIG(status)
    }
}

/// A pipe: (read end, write end).
fn pipe() -> (libc::c_int, libc::c_int) {
    let mut fds = [0; 2];
    // SAFETY: fds is a valid out array.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    (fds[0], fds[1])
}

fn write_u64(fd: libc::c_int, v: u64) {
    let b = v.to_le_bytes();
    // SAFETY: writes 8 bytes from a live buffer.
    let n = unsafe { libc::write(fd, b.as_ptr().cast(), 8) };
    assert_eq!(n, 8);
}

fn read_u64(fd: libc::c_int) -> Option<u64> {
    let mut b = [0u8; 8];
    let mut got = 0;
    while got < 8 {
        // SAFETY: reads into a live buffer.
        let n = unsafe { libc::read(fd, b[got..].as_mut_ptr().cast(), 8 - got) };
        if n <= 0 {
            return None;
        }
        got += n as usize;
    }
    Some(u64::from_le_bytes(b))
}

fn close(fd: libc::c_int) {
    // SAFETY: closes an fd we own.
    unsafe { libc::close(fd) };
}

fn patch(path: &Path, offset: u64, bytes: &[u8]) {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.write_all_at(bytes, offset).unwrap();
}

/// A tuning with a 1 MiB admission reserve (1/32 of the tests' smallest limits or less).
fn reserves() -> Tuning {
    Tuning {
        reserve: MIB,
        ..Tuning::default()
    }
}

fn sum_slots(s: &RegionSnapshot, dev: usize) -> u64 {
    s.accounted(dev)
}
