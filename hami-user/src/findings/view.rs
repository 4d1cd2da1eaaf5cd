//! What the rules see of a GPU process ([`ProcView`]) and of an open region
//! ([`RegionView`]), with the slot helpers the rules share.

use std::collections::BTreeMap;

use hami_abi::layout::{UsageKind, MAX_DEVICES};
use hami_common::region::{RegionSnapshot, SlotSnapshot};
use serde::Serialize;

use super::finding::human_bytes;
use crate::access::{Creds, FileMeta};
use crate::compute::ComputeView;
use crate::procinfo::EnvLimits;

/// Whether a region slot's process is alive, as established by the agent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum SlotLiveness {
    /// Alive (same pid and start time); its host pid.
    Alive {
        /// Host pid.
        host_pid: u32,
    },
    /// No process with the slot's pid in the region's pid namespace.
    Dead,
    /// The pid belongs to another process (different start time).
    Reused {
        /// Host pid of the new process.
        host_pid: u32,
        /// Its start time.
        start_time: u64,
    },
    /// Cannot tell (pid namespace unknown): never reported, never reclaimed.
    Unknown,
}

/// One GPU process as the rules see it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ProcView {
    /// Host pid.
    pub pid: u32,
    /// Start time (ticks since boot).
    pub start_time: u64,
    /// Pid inside its container.
    pub nspid: Option<u32>,
    /// Container name.
    pub container: String,
    /// Whether the preload is mapped.
    pub hooked: bool,
    /// Whether HAMi-core's `libvgpu.so` is mapped (and hami-preload is not).
    pub hami_core: bool,
    /// Why it runs without the preload on purpose ([`reason::DISABLE_CONTROL`],
    /// [`reason::NAMESPACE_ALLOWLISTED`]), if it does.
    pub unhooked_by_request: Option<&'static str>,
    /// Index of its region in the regions slice, if one is open.
    pub region: Option<usize>,
    /// Why its region could not be opened, if it could not.
    pub region_error: Option<String>,
    /// Observed live data bytes by device (`None` = device unknown).
    pub observed: BTreeMap<Option<u32>, u64>,
    /// Allocation events seen since the agent attached.
    pub alloc_events: u64,
    /// Largest observed live total.
    pub peak_bytes: u64,
    /// Running before the agent attached.
    pub pre_existing: bool,
    /// Started after the agent, but its libcuda was probed only after it loaded it (some of
    /// its allocations may have been missed). Implies `pre_existing`.
    pub attached_late: bool,
    /// NVML per-process used memory at the latest sample, summed over the devices where it
    /// is known (`None`: NVML unavailable or nothing known).
    pub nvml_bytes: Option<u64>,
    /// NVML per-process used memory by NVML device index at the latest sample; a device
    /// absent from the map is unknown, `0` means NVML read the device and does not list the
    /// process.
    pub nvml_devices: BTreeMap<u32, u64>,
    /// NVML SM utilisation in percent by NVML device index at the latest sample, on the
    /// devices whose utilisation was read (`0`: read, the process used none).
    pub nvml_sm: BTreeMap<u32, u32>,
    /// Whether any event of this process was seen.
    pub seen_by_events: bool,
    /// Limits from its environment.
    pub env_limits: EnvLimits,
    /// Its credentials (`/proc/<pid>/status`), when readable.
    pub creds: Option<Creds>,
}

impl ProcView {
    /// Observed live data bytes on all devices.
    pub fn observed_total(&self) -> u64 {
        self.observed.values().sum()
    }

    /// The pid its slot would carry (pid inside its namespace).
    pub fn slot_pid(&self) -> u32 {
        self.nspid.unwrap_or(self.pid)
    }

    /// Its SM utilisation summed over the devices NVML read (percent of one device).
    pub fn sm_total(&self) -> u32 {
        self.nvml_sm
            .values()
            .fold(0u32, |a, &b| a.saturating_add(b))
    }
}

/// One open region as the rules see it.
#[derive(Clone, Debug, PartialEq)]
pub struct RegionView {
    /// Path as processes name it (e.g. `/tmp/cudevshr.cache`).
    pub name: String,
    /// Container of the processes that use it (or of the first one seen).
    pub container: String,
    /// The snapshot.
    pub snapshot: RegionSnapshot,
    /// Liveness per active slot index.
    pub liveness: BTreeMap<usize, SlotLiveness>,
    /// Whether the node has a single GPU (region device count 1, or NVML sees one): bytes
    /// whose device is unknown then count for device 0.
    pub single_device: bool,
    /// GPUs on the node when known (NVML): limits of devices beyond are not reported.
    pub node_devices: Option<usize>,
    /// Owner, group and mode of the region file, when known.
    pub file: Option<FileMeta>,
    /// What the comparison with NVML uses (`None`: NVML unavailable, or the region was
    /// opened after the latest NVML sample).
    pub nvml: Option<RegionNvml>,
    /// Per device the region covers: its compute limit and measured share.
    pub compute: Vec<ComputeView>,
}

/// A region as it was when NVML was sampled, and where its devices are in NVML.
#[derive(Clone, Debug, PartialEq)]
pub struct RegionNvml {
    /// The region read right after the NVML sample (so that both describe the same moment).
    pub snapshot: RegionSnapshot,
    /// NVML index of each region device (found by UUID), `None` when unknown.
    pub device_index: [Option<u32>; MAX_DEVICES],
}

/// The slot of process `p` in `snap`, if it has one (matching pid and, when recorded, start
/// time).
pub fn slot_in<'a>(snap: &'a RegionSnapshot, p: &ProcView) -> Option<&'a SlotSnapshot> {
    let pid = p.slot_pid();
    snap.slots
        .iter()
        .find(|s| s.pid == pid && (s.start_time == 0 || s.start_time == p.start_time))
}

impl RegionView {
    /// The slot of process `p`, if it has one (matching pid and, when recorded, start time).
    pub fn slot_of(&self, p: &ProcView) -> Option<&SlotSnapshot> {
        slot_in(&self.snapshot, p)
    }

    /// Number of devices to consider (at least 1).
    pub fn devices(&self) -> usize {
        (self.snapshot.device_count as usize).clamp(1, MAX_DEVICES)
    }
}

/// Data bytes (the kind the probes observe) a slot accounts on all devices.
pub fn slot_data(s: &SlotSnapshot) -> u64 {
    s.usage.iter().map(|d| d[UsageKind::Data.index()]).sum()
}

/// The most a slot's probed allocations may add up to: its data plus what its stream-ordered
/// pools are charged (the preload charges a pool's reserve, which is never below the live
/// allocations made from it, so `cuMemAllocAsync` bytes are in `pool`, not `data`).
pub fn slot_probe_ceiling(s: &SlotSnapshot) -> u64 {
    s.usage
        .iter()
        .map(|d| d[UsageKind::Data.index()].saturating_add(d[UsageKind::Pool.index()]))
        .fold(0u64, u64::saturating_add)
}

/// Data bytes a slot accounts on one device.
pub fn slot_data_on(s: &SlotSnapshot, dev: usize) -> u64 {
    s.usage.get(dev).map_or(0, |d| d[UsageKind::Data.index()])
}

/// Observed bytes on `dev` for `p`, attributing unknown-device bytes to device 0 when the
/// region has a single device.
pub(super) fn observed_on(p: &ProcView, dev: usize, single_device: bool) -> u64 {
    let known = p.observed.get(&Some(dev as u32)).copied().unwrap_or(0);
    let unknown = if single_device && dev == 0 {
        p.observed.get(&None).copied().unwrap_or(0)
    } else {
        0
    };
    known + unknown
}

/// `; NVML: <bytes> on the GPU` when NVML gave a figure for the process, else empty.
pub(super) fn nvml_note(p: &ProcView) -> String {
    p.nvml_bytes.map_or(String::new(), |b| {
        format!("; NVML: {} on the GPU", human_bytes(b))
    })
}
