//! What NVML's process lists (and `nvmlDeviceGetRunningProcessDetailList`) show inside a
//! container (plain Rust, no driver): the driver's
//! entries (host pids, the driver's usage) narrowed to the container's own processes (the
//! region's slots), each with its pid as the container sees it and its usage from the region;
//! the `*infoCount` protocol of `nvmlDeviceGet*RunningProcesses*`; and how a process finds
//! its own host pid from two readings of the list around its first context creation.
//! The hooks are in `hooks/nvml_procs.rs`; `docs/preload.md`, "Process lists", says why.

use crate::ffi::cuda::{
    nvmlReturn_t, NVML_ERROR_INSUFFICIENT_SIZE, NVML_ERROR_INVALID_ARGUMENT,
    NVML_VALUE_NOT_AVAILABLE,
};

/// `gpuInstanceId` / `computeInstanceId` of an entry outside MIG (`0xFFFFFFFF`).
pub const NO_INSTANCE: u32 = u32::MAX;

/// One entry of an NVML process list, whatever the struct version.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProcEntry {
    /// Pid: the host's as the driver reports it, the container's in what the hook returns.
    pub pid: u32,
    /// `usedGpuMemory`: bytes, or [`NVML_VALUE_NOT_AVAILABLE`].
    pub used: u64,
    /// `gpuInstanceId` (v2 entries; [`NO_INSTANCE`] outside MIG and for v1).
    pub gpu_instance: u32,
    /// `computeInstanceId` (v2 entries; [`NO_INSTANCE`] outside MIG and for v1).
    pub compute_instance: u32,
    /// `usedGpuCcProtectedMemory` (`nvmlProcessDetail_v1_t` only; 0 otherwise): the
    /// driver's, which the region does not count.
    pub cc_protected: u64,
}

/// One process of the container on the device: a region slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Member {
    /// Pid in the container's pid namespace (the slot's `pid`).
    pub pid: u32,
    /// Its pid in the host's pid namespace (the slot's `host_pid`), if it found it.
    pub host_pid: Option<u32>,
    /// Its usage on the device from the region (every kind, reserves excluded).
    pub used: u64,
    /// Whether it runs (a slot whose process died and was not reclaimed yet is not listed).
    pub alive: bool,
}

/// Which list a call asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ListKind {
    /// `nvmlDeviceGetComputeRunningProcesses*`.
    Compute,
    /// `nvmlDeviceGetGraphicsRunningProcesses*`.
    Graphics,
    /// `nvmlDeviceGetMPSComputeRunningProcesses*`.
    Mps,
}

/// The container's view of one of the driver's lists:
///
/// * an entry whose host pid is a member's (`host_pid`, or its `pid` when `pids_are_host`:
///   the caller runs in the host's pid namespace, so a slot's pid is a host pid) is kept, with
///   the member's pid and its usage from the region; the instance ids stay the driver's. A
///   process the driver lists more than once (once per MIG instance) has its usage on the
///   first entry and [`NVML_VALUE_NOT_AVAILABLE`] on the others (the region counts per
///   device, not per instance);
/// * every other entry (another container's process, or the host's) is left out;
/// * for the compute list only, a live member that holds memory on the device and whose host
///   pid is unknown (it could not tell itself apart from another process starting at the same
///   moment, or an older preload made its slot) is listed from the region alone, without
///   instance ids: it certainly has a context there, and leaving it out would hide one of the
///   container's processes. Graphics and MPS lists never get such entries (a CUDA slot says
///   nothing about graphics contexts or MPS clients).
pub fn container_view(
    kind: ListKind,
    driver: &[ProcEntry],
    members: &[Member],
    pids_are_host: bool,
) -> Vec<ProcEntry> {
    let kept = kept_entries(driver, members, pids_are_host);
    let mut out: Vec<ProcEntry> = kept.entries.iter().map(|&(_, e)| e).collect();
    if kind == ListKind::Compute {
        for (i, m) in members.iter().enumerate() {
            if !kept.matched[i] && m.host_pid.is_none() && m.alive && m.used > 0 {
                out.push(ProcEntry {
                    pid: m.pid,
                    used: m.used,
                    gpu_instance: NO_INSTANCE,
                    compute_instance: NO_INSTANCE,
                    cc_protected: 0,
                });
            }
        }
    }
    out
}

/// The driver's entries that are the container's ([`kept_entries`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Kept {
    /// `(index in the driver's list, the entry as the container sees it)`, in the driver's
    /// order.
    pub entries: Vec<(usize, ProcEntry)>,
    /// Per member: whether some driver entry is its.
    pub matched: Vec<bool>,
}

/// The membership rule every view of a driver list shares (the public lists through
/// [`container_view`], NVML's export table through `crate::driver::export_table`): an entry whose
/// host pid is a member's (`host_pid`, or its `pid` when `pids_are_host`) is kept, with the
/// member's pid and its usage from the region (on the first entry of a process the driver
/// lists more than once, [`NVML_VALUE_NOT_AVAILABLE`] on the others); the instance ids and
/// the protected memory stay the driver's. Every other entry is left out.
pub fn kept_entries(driver: &[ProcEntry], members: &[Member], pids_are_host: bool) -> Kept {
    let mut entries = Vec::new();
    let mut matched = vec![false; members.len()];
    for (k, e) in driver.iter().enumerate() {
        let found = members.iter().position(|m| match m.host_pid {
            Some(h) => h == e.pid,
            None => pids_are_host && m.pid == e.pid,
        });
        let Some(i) = found else { continue };
        let m = members[i];
        let used = if matched[i] {
            NVML_VALUE_NOT_AVAILABLE
        } else {
            m.used
        };
        matched[i] = true;
        entries.push((
            k,
            ProcEntry {
                pid: m.pid,
                used,
                ..*e
            },
        ));
    }
    Kept { entries, matched }
}

/// What a process-list call answers for `n` entries, given the caller's `*infoCount`
/// (`capacity`) and whether its array is NULL, per `nvml.h`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reply {
    /// `NVML_SUCCESS`: write the `n` entries (none when `n` is 0, even into a NULL array)
    /// and set `*infoCount = n`.
    Fill(usize),
    /// `NVML_ERROR_INSUFFICIENT_SIZE` with `*infoCount` = the entries needed (also the
    /// answer to the size query `*infoCount == 0` when there are entries).
    TooSmall(usize),
    /// An error, `*infoCount` untouched (a NULL array that would have to hold entries).
    Error(nvmlReturn_t),
}

/// The reply for `n` entries (see [`Reply`]).
pub fn reply(capacity: u32, infos_null: bool, n: usize) -> Reply {
    if n > capacity as usize {
        Reply::TooSmall(n)
    } else if n > 0 && infos_null {
        Reply::Error(NVML_ERROR_INVALID_ARGUMENT)
    } else {
        Reply::Fill(n)
    }
}

/// What reading a driver list gave, one call of a loop that grows the buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ListRead {
    /// `NVML_SUCCESS` with this many entries.
    Done(usize),
    /// `NVML_ERROR_INSUFFICIENT_SIZE`, the driver asking for this many.
    Grow(usize),
    /// Any other result.
    Failed(nvmlReturn_t),
}

/// Classifies one driver answer (`rc`, the `*infoCount` it wrote).
pub fn reading(rc: nvmlReturn_t, count: u32) -> ListRead {
    match rc {
        crate::ffi::cuda::NVML_SUCCESS => ListRead::Done(count as usize),
        NVML_ERROR_INSUFFICIENT_SIZE => ListRead::Grow(count as usize),
        e => ListRead::Failed(e),
    }
}

/// The capacity of the next attempt after the driver asked for `needed` entries with a
/// buffer of `cap` (processes may start in between: some room beyond what it asked).
pub fn next_capacity(cap: usize, needed: usize) -> usize {
    needed.max(cap).saturating_add(16)
}

/// The host pids this process may have, from the lists read before and after its context
/// was created: the pids new in `after` (a pid already listed before is another process's),
/// less `others` (host pids other slots of the container recorded); narrowed by the
/// candidates of an earlier creation (`earlier`: this process is listed in both). One
/// candidate left: that is this process. More: another process created a context at the
/// same moment (keep them for the next creation). None: the driver does not list this
/// process (another pid numbering, MPS).
pub fn host_pid_candidates(
    before: &[u32],
    after: &[u32],
    others: &[u32],
    earlier: Option<&[u32]>,
) -> Vec<u32> {
    let mut c: Vec<u32> = after
        .iter()
        .copied()
        .filter(|p| !before.contains(p) && !others.contains(p))
        .filter(|p| earlier.is_none_or(|e| e.contains(p)))
        .collect();
    c.sort_unstable();
    c.dedup();
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(pid: u32, used: u64) -> ProcEntry {
        ProcEntry {
            pid,
            used,
            gpu_instance: NO_INSTANCE,
            compute_instance: NO_INSTANCE,
            cc_protected: 0,
        }
    }

    fn m(pid: u32, host: Option<u32>, used: u64) -> Member {
        Member {
            pid,
            host_pid: host,
            used,
            alive: true,
        }
    }

    #[test]
    fn only_members_are_kept_with_their_own_pid_and_region_usage() {
        // Host pids 5001 (ours, ns pid 7), 5002 (another container), 5003 (ours, ns pid 9).
        let driver = [e(5001, 900), e(5002, 800), e(5003, 700)];
        let members = [m(7, Some(5001), 256), m(9, Some(5003), 512)];
        let v = container_view(ListKind::Compute, &driver, &members, false);
        assert_eq!(v, vec![e(7, 256), e(9, 512)]);
    }

    #[test]
    fn without_a_pid_namespace_a_slot_pid_is_a_host_pid() {
        let driver = [e(100, 1), e(200, 2)];
        let members = [m(200, None, 50)];
        assert_eq!(
            container_view(ListKind::Graphics, &driver, &members, true),
            vec![e(200, 50)]
        );
        // In a namespace the same slot pid means nothing to the driver: the graphics list
        // drops it, the compute list shows it from the region.
        assert!(container_view(ListKind::Graphics, &driver, &members, false).is_empty());
        assert_eq!(
            container_view(ListKind::Compute, &driver, &members, false),
            vec![e(200, 50)]
        );
    }

    #[test]
    fn unresolved_members_come_from_the_region_only_when_alive_and_holding_memory() {
        let driver = [e(5002, 800)];
        let mut dead = m(3, None, 64);
        dead.alive = false;
        let idle = m(4, None, 0);
        let known_absent = m(5, Some(6000), 64);
        let unresolved = m(6, None, 128);
        let members = [dead, idle, known_absent, unresolved];
        assert_eq!(
            container_view(ListKind::Compute, &driver, &members, false),
            vec![e(6, 128)]
        );
        assert!(container_view(ListKind::Mps, &driver, &members, false).is_empty());
    }

    #[test]
    fn a_process_listed_per_instance_has_its_usage_once() {
        let mut a = e(5001, 10);
        a.gpu_instance = 1;
        a.compute_instance = 0;
        let mut b = a;
        b.gpu_instance = 2;
        let v = container_view(ListKind::Compute, &[a, b], &[m(7, Some(5001), 300)], false);
        assert_eq!(v.len(), 2);
        assert_eq!((v[0].pid, v[0].used, v[0].gpu_instance), (7, 300, 1));
        assert_eq!(
            (v[1].pid, v[1].used, v[1].gpu_instance),
            (7, NVML_VALUE_NOT_AVAILABLE, 2)
        );
    }

    #[test]
    fn the_count_protocol_follows_nvml_h() {
        // Size query: *infoCount == 0, NULL array.
        assert_eq!(reply(0, true, 0), Reply::Fill(0));
        assert_eq!(reply(0, true, 3), Reply::TooSmall(3));
        assert_eq!(reply(2, false, 3), Reply::TooSmall(3));
        assert_eq!(reply(3, false, 3), Reply::Fill(3));
        assert_eq!(reply(8, false, 3), Reply::Fill(3));
        assert_eq!(reply(8, true, 3), Reply::Error(NVML_ERROR_INVALID_ARGUMENT));
    }

    #[test]
    fn readings_grow_the_buffer() {
        assert_eq!(reading(0, 4), ListRead::Done(4));
        assert_eq!(
            reading(NVML_ERROR_INSUFFICIENT_SIZE, 70),
            ListRead::Grow(70)
        );
        assert_eq!(reading(15, 0), ListRead::Failed(15));
        assert_eq!(next_capacity(64, 70), 86);
        assert_eq!(next_capacity(64, 3), 80);
    }

    #[test]
    fn the_host_pid_is_the_one_new_pid() {
        assert_eq!(
            host_pid_candidates(&[10, 11], &[10, 11, 12], &[], None),
            [12]
        );
        // A pid another slot of the container recorded is not ours.
        assert_eq!(host_pid_candidates(&[10], &[10, 12, 13], &[13], None), [12]);
        // Two processes created contexts at the same moment: undecided ...
        let c = host_pid_candidates(&[10], &[10, 12, 13], &[], None);
        assert_eq!(c, [12, 13]);
        // ... until the next creation (another device) narrows it.
        assert_eq!(host_pid_candidates(&[], &[12, 14], &[], Some(&c)), [12]);
        // Not listed at all.
        assert!(host_pid_candidates(&[10], &[10], &[], None).is_empty());
    }
}
