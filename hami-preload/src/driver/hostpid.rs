//! This process's pid in the host's pid namespace: the pid NVML's process lists report, which
//! the process-list hooks of the container's other processes (`nvidia-smi`) need to recognise
//! it. Recorded in the process's region slot (`Slot::host_pid`).
//!
//! Found, in this order:
//! 1. the process runs in the initial pid namespace (`/proc/self/ns/pid` is inode
//!    `PROC_PID_INIT_INO`): its `getpid()`;
//! 2. the `/proc` it sees is the initial namespace's (its pid 1 is in the initial
//!    namespace): the first `NSpid` entry of `/proc/self/status`;
//! 3. otherwise (a container with its own pid namespace and `/proc`, where nothing in the
//!    kernel's interfaces tells it): from the driver itself. The compute list of the device
//!    is read just before and just after the process's first context is created there; the
//!    pid that appeared, less those other slots of the container recorded, is this process
//!    ([`crate::driver::proclist::host_pid_candidates`]). When two processes created contexts at that
//!    moment the candidates are kept and narrowed at the next context creation.
//!
//! The state is per process: a forked child (another pid) starts over. The reading of the
//! lists around a creation is the context hooks' (`crate::hooks::context`); this module
//! holds what they learn and records it in the slot.

use crate::driver::proclist::host_pid_candidates;
use hami_common::region::{Region, SlotId};
use std::os::unix::fs::MetadataExt;
use std::sync::{Mutex, PoisonError};

/// `PROC_PID_INIT_INO`: the inode of the initial pid namespace (`include/linux/proc_ns.h`),
/// fixed since Linux 3.8.
const PROC_PID_INIT_INO: u64 = 0xEFFF_FFFC;

#[derive(Default)]
struct Discovery {
    /// The `getpid()` this state is about (a forked child starts over).
    for_pid: u32,
    /// Rules 1 and 2 were evaluated.
    checked: bool,
    /// The host pid, once known.
    host_pid: Option<u32>,
    /// Rule 3: the candidates left by an undecided creation.
    candidates: Option<Vec<u32>>,
}

static STATE: Mutex<Discovery> = Mutex::new(Discovery {
    for_pid: 0,
    checked: false,
    host_pid: None,
    candidates: None,
});

fn own_pid() -> u32 {
    // SAFETY: no preconditions.
    unsafe { libc::getpid() as u32 }
}

/// Whether `path` (a `/proc/<pid>/ns/pid` link) names the initial pid namespace.
fn is_initial_pid_ns(path: &str) -> Option<bool> {
    std::fs::metadata(path)
        .ok()
        .map(|m| m.ino() == PROC_PID_INIT_INO)
}

/// Whether this process runs in the host's (initial) pid namespace: then a slot's pid (in the
/// namespace of the container's processes, which is this one) is a host pid.
pub fn in_host_pid_ns() -> bool {
    is_initial_pid_ns("/proc/self/ns/pid") == Some(true)
}

/// The first `NSpid` entry of a `/proc/<pid>/status` text: the pid in the namespace of that
/// `/proc` mount ([`hami_common::procfs::first_nspid`]).
pub fn first_nspid(status: &str) -> Option<u32> {
    hami_common::procfs::first_nspid(status.as_bytes())
}

/// Rules 1 and 2 (no driver involved).
fn from_kernel() -> Option<u32> {
    if in_host_pid_ns() {
        return Some(own_pid());
    }
    if is_initial_pid_ns("/proc/1/ns/pid") == Some(true) {
        let status = std::fs::read_to_string("/proc/self/status").ok()?;
        return first_nspid(&status);
    }
    None
}

fn with_state<R>(f: impl FnOnce(&mut Discovery) -> R) -> R {
    let mut s = STATE.lock().unwrap_or_else(PoisonError::into_inner);
    let me = own_pid();
    if s.for_pid != me {
        *s = Discovery {
            for_pid: me,
            ..Discovery::default()
        };
    }
    if !s.checked {
        s.checked = true;
        s.host_pid = from_kernel();
    }
    f(&mut s)
}

/// This process's host pid, if known.
pub fn host_pid() -> Option<u32> {
    with_state(|s| s.host_pid)
}

/// Host pids the container's other slots recorded.
pub fn others_recorded(region: &Region, own: Option<SlotId>) -> Vec<u32> {
    region
        .snapshot()
        .slots
        .iter()
        .filter(|s| own.is_none_or(|o| o.index() != s.index))
        .map(|s| region.host_pid(s.index))
        .filter(|&p| p != 0)
        .collect()
}

/// Rule 3, after a context creation on a device: `before` and `after` are the host pids of
/// the device's compute list around it, `others` the host pids the container's other slots
/// recorded ([`others_recorded`]). Keeps the one candidate left, or the candidates to
/// narrow at the next creation.
pub fn learn_from_lists(before: &[u32], after: &[u32], others: &[u32]) {
    with_state(|s| {
        if s.host_pid.is_some() {
            return;
        }
        let c = host_pid_candidates(before, after, others, s.candidates.as_deref());
        match c.len() {
            0 => {}
            1 => {
                s.host_pid = Some(c[0]);
                s.candidates = None;
            }
            _ => s.candidates = Some(c),
        }
    });
}

/// Records the host pid (if known) in `slot`, unless it is already there. Called at
/// registration and after each context creation.
pub fn on_registered(region: &Region, slot: SlotId) {
    let Some(p) = host_pid() else { return };
    if region.host_pid(slot.index()) != p {
        if let Err(e) = region.set_host_pid(slot, p) {
            crate::debug!("recording the host pid in the region failed: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nspid_first_entry_is_the_outer_pid() {
        assert_eq!(
            first_nspid("Name:\tx\nNSpid:\t4242\t17\nPPid:\t1\n"),
            Some(4242)
        );
        assert_eq!(first_nspid("NSpid:\t17\n"), Some(17));
        assert_eq!(first_nspid("Name:\tx\n"), None);
    }

    #[test]
    fn this_test_process_knows_its_host_pid_from_the_kernel() {
        // The test runs in the initial pid namespace (or one whose /proc is the host's).
        if in_host_pid_ns() {
            assert_eq!(host_pid(), Some(std::process::id()));
        } else {
            assert_eq!(
                from_kernel().is_some(),
                is_initial_pid_ns("/proc/1/ns/pid") == Some(true)
            );
        }
    }
}
