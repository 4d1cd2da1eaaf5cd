//! The audit rules: a pure function from what the agent knows about processes and regions to
//! findings. Nothing here reads files or clocks; see `docs/agent.md` for the rules in prose.

mod against_nvml;
mod compute;
mod rules;
#[cfg(test)]
pub(crate) mod tests;

use std::collections::BTreeMap;

use hami_common::layout::{UsageKind, MAX_DEVICES};
use hami_common::region::{RegionSnapshot, SlotSnapshot};
use serde::Serialize;

use crate::access::{Creds, FileMeta};
use crate::compute::{ComputeOptions, ComputeView};
use crate::procinfo::EnvLimits;

use against_nvml::{nvml_process_findings, nvml_region_findings};
use compute::compute_region_findings;
use rules::{process_findings, region_findings};

/// Stable, machine-readable kinds of finding.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FindingKind {
    /// Memory allocated outside the preload's accounting.
    Bypass,
    /// A slot whose process is gone (or whose usage has no live allocations behind it).
    LeakedSlot,
    /// A container's observed usage above its region's limit.
    OverLimit,
    /// A region whose limit differs from its processes' environment.
    Tamper,
    /// Accounted usage above observed usage beyond tolerance.
    Drift,
    /// A hooked process that cannot write its container's region: every allocation it makes
    /// is refused (fail closed).
    LockedOut,
    /// A container's measured compute share of a device (NVML) above the share its region
    /// holds it to, beyond the tolerance, over the whole window.
    ComputeOverLimit,
    /// A GPU process on HAMi-core's `libvgpu.so` (mapped, without hami-preload's marker):
    /// limited by HAMi-core, not accounted in a hami-rs region; a node not migrated yet.
    HamiCore,
    /// A GPU process without the preload by request: `CUDA_DISABLE_CONTROL=true` in its
    /// environment (HAMi's opt-out) or its namespace allowlisted (`--allow-unhooked-namespace`).
    Unhooked,
}

impl FindingKind {
    /// All kinds, in a fixed order.
    pub const ALL: [FindingKind; 9] = [
        FindingKind::Bypass,
        FindingKind::LeakedSlot,
        FindingKind::OverLimit,
        FindingKind::Tamper,
        FindingKind::Drift,
        FindingKind::LockedOut,
        FindingKind::ComputeOverLimit,
        FindingKind::HamiCore,
        FindingKind::Unhooked,
    ];

    /// The stable name (`bypass`, `leaked_slot`, `over_limit`, `tamper`, `drift`,
    /// `locked_out`, `compute_over_limit`, `hami_core`, `unhooked`).
    pub const fn name(self) -> &'static str {
        match self {
            FindingKind::Bypass => "bypass",
            FindingKind::LeakedSlot => "leaked_slot",
            FindingKind::OverLimit => "over_limit",
            FindingKind::Tamper => "tamper",
            FindingKind::Drift => "drift",
            FindingKind::LockedOut => "locked_out",
            FindingKind::ComputeOverLimit => "compute_over_limit",
            FindingKind::HamiCore => "hami_core",
            FindingKind::Unhooked => "unhooked",
        }
    }

    /// Whether `audit` exits non-zero for this kind (the container's memory or compute
    /// share does not hold).
    pub const fn is_failure(self) -> bool {
        matches!(
            self,
            FindingKind::Bypass | FindingKind::OverLimit | FindingKind::ComputeOverLimit
        )
    }
}

/// Stable reasons, more precise than the kind.
pub mod reason {
    /// Bypass: allocating through libcuda with no preload mapped.
    pub const NO_PRELOAD: &str = "no_preload";
    /// HAMi-core: HAMi-core's `libvgpu.so` is mapped instead of hami-preload.
    pub const HAMI_CORE_MAPPED: &str = "hami_core_mapped";
    /// Unhooked: `CUDA_DISABLE_CONTROL=true` in the process's environment.
    pub const DISABLE_CONTROL: &str = "disable_control";
    /// Unhooked: the container's namespace is allowlisted (`--allow-unhooked-namespace`).
    pub const NAMESPACE_ALLOWLISTED: &str = "namespace_allowlisted";
    /// Bypass: preload mapped, allocating, but no region file could be opened.
    pub const NO_REGION: &str = "no_region";
    /// Bypass: preload mapped, allocating, but no slot for the process in its region.
    pub const NO_SLOT: &str = "no_slot";
    /// Bypass: observed data above accounted data beyond tolerance.
    pub const OBSERVED_ABOVE_ACCOUNTED: &str = "observed_above_accounted";
    /// Leaked slot: the slot's process no longer exists.
    pub const PROCESS_DEAD: &str = "process_dead";
    /// Leaked slot: the slot's pid belongs to another process now (start time differs).
    pub const PID_REUSED: &str = "pid_reused";
    /// Leaked slot: a live process fully observed by the agent holds no allocations, but its
    /// slot still accounts data.
    pub const USAGE_WITHOUT_ALLOCATIONS: &str = "usage_without_allocations";
    /// Over limit: the container's observed data exceeds the region limit.
    pub const OBSERVED_ABOVE_LIMIT: &str = "observed_above_limit";
    /// Tamper: region limit differs from the environment.
    pub const LIMIT_DIFFERS_FROM_ENV: &str = "limit_differs_from_env";
    /// Tamper: the environment's value is invalid but the region enforces a limit.
    pub const ENV_INVALID_REGION_VALID: &str = "env_invalid_region_valid";
    /// Tamper: the region's compute share of a device differs from the one a live hooked
    /// process's environment sets (`CUDA_DEVICE_SM_LIMIT(_<i>)`, the policy `disable`).
    pub const COMPUTE_LIMIT_DIFFERS_FROM_ENV: &str = "compute_limit_differs_from_env";
    /// Locked out: the process's credentials do not allow it to open its region for reading
    /// and writing (file owner, group and mode), and it holds no slot there.
    pub const REGION_UNWRITABLE: &str = "region_unwritable";
    /// Drift: accounted data above observed data beyond tolerance.
    pub const ACCOUNTED_ABOVE_OBSERVED: &str = "accounted_above_observed";
    /// Over limit: the container's processes together hold more than the region's limit on a
    /// device according to NVML (per-process used memory, summed).
    pub const NVML_ABOVE_LIMIT: &str = "nvml_above_limit";
    /// Drift: NVML says a hooked process holds more on a device than its slot accounts there
    /// (all kinds): memory the preload did not see.
    pub const NVML_ABOVE_ACCOUNTED: &str = "nvml_above_accounted";
    /// Drift: a hooked process's slot accounts more on a device than NVML says it holds.
    pub const ACCOUNTED_ABOVE_NVML: &str = "accounted_above_nvml";
    /// Compute over limit: the container's mean SM share of a device over the window
    /// (NVML's per-process utilisation, summed) above its region's `sm_limit` by more than
    /// the tolerance.
    pub const SHARE_ABOVE_LIMIT: &str = "share_above_limit";
}

/// How far observed and accounted may differ before it is a finding:
/// `max(min_bytes, ratio * max(observed, accounted))`.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Tolerance {
    /// Absolute floor in bytes.
    pub min_bytes: u64,
    /// Relative part (0.01 = 1 %).
    pub ratio: f64,
}

impl Default for Tolerance {
    /// 2 MiB or 1 %, whichever is larger.
    fn default() -> Self {
        Tolerance {
            min_bytes: 2 << 20,
            ratio: 0.01,
        }
    }
}

impl Tolerance {
    /// The default tolerance of the comparisons with NVML: 64 MiB or 2 %, whichever is
    /// larger. It absorbs what the preload cannot know to the byte and NVML rounds: the
    /// driver's allocation granularity (2 MiB pages; small allocations sub-allocated), NVML's
    /// own rounding, and a context measured once at creation (see `docs/agent.md`).
    pub const NVML_DEFAULT: Tolerance = Tolerance {
        min_bytes: 64 << 20,
        ratio: 0.02,
    };

    /// The allowed difference around `a` and `b`.
    pub fn allowance(&self, a: u64, b: u64) -> u64 {
        let rel = (a.max(b) as f64 * self.ratio) as u64;
        self.min_bytes.max(rel)
    }

    /// Whether `a` exceeds `b` by more than the allowance.
    pub fn exceeds(&self, a: u64, b: u64) -> bool {
        a > b && a - b > self.allowance(a, b)
    }
}

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

/// Identity of a finding across evaluations: kind, reason, pid, region, device, slot.
pub type FindingKey = (
    FindingKind,
    &'static str,
    Option<u32>,
    Option<String>,
    Option<u32>,
    Option<usize>,
);

/// One finding.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Finding {
    /// The kind.
    pub kind: FindingKind,
    /// A stable, more precise reason (see [`reason`]).
    pub reason: &'static str,
    /// Host pid concerned, if one.
    pub pid: Option<u32>,
    /// Filesystem uid of that process, when known.
    pub uid: Option<u32>,
    /// Pid inside its container.
    pub nspid: Option<u32>,
    /// Container.
    pub container: String,
    /// Region (path as its processes name it).
    pub region: Option<String>,
    /// Device ordinal, when the finding is about one device.
    pub device: Option<u32>,
    /// Slot index, for slot findings.
    pub slot: Option<usize>,
    /// The bytes at stake (unaccounted, leaked, over the limit, or the region's limit for
    /// tamper).
    pub bytes: u64,
    /// Observed bytes, when relevant.
    pub observed: Option<u64>,
    /// Accounted bytes, when relevant.
    pub accounted: Option<u64>,
    /// Limit, when relevant.
    pub limit: Option<u64>,
    /// Human explanation.
    pub detail: String,
}

impl Finding {
    /// Identity of a finding across evaluations (same problem, possibly other numbers).
    pub fn key(&self) -> FindingKey {
        (
            self.kind,
            self.reason,
            self.pid,
            self.region.clone(),
            self.device,
            self.slot,
        )
    }

    /// Whether the finding compares with NVML and so must hold in two NVML samples in a row
    /// (besides the settle time) before it is reported: NVML and the region are read at
    /// slightly different moments, and a process's context exists in NVML before the
    /// preload has measured and charged it.
    pub fn needs_nvml_confirmation(&self) -> bool {
        matches!(
            self.reason,
            reason::NVML_ABOVE_LIMIT | reason::NVML_ABOVE_ACCOUNTED | reason::ACCOUNTED_ABOVE_NVML
        )
    }

    /// Whether the finding can be a transient race between the preload's accounting and the
    /// driver call the probes see, so it must persist a while before it is reported.
    /// (Only a process with no preload at all, a dead slot owner, and a tamper are
    /// immediate.)
    pub fn needs_settle(&self) -> bool {
        !matches!(
            self.reason,
            reason::NO_PRELOAD
                | reason::PROCESS_DEAD
                | reason::PID_REUSED
                | reason::LIMIT_DIFFERS_FROM_ENV
                | reason::ENV_INVALID_REGION_VALID
                | reason::COMPUTE_LIMIT_DIFFERS_FROM_ENV
                // Already held over the whole compute window.
                | reason::SHARE_ABOVE_LIMIT
        )
    }
}

/// Human size: `1.5 GiB`, `512 KiB`, `12 B`.
pub fn human_bytes(b: u64) -> String {
    const U: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut i = 0;
    while v >= 1024.0 && i < U.len() - 1 {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{b} B")
    } else {
        format!("{v:.1} {}", U[i])
    }
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

/// Computes every finding, comparing with NVML within [`Tolerance::NVML_DEFAULT`]. See
/// [`evaluate_with_nvml`].
pub fn evaluate(procs: &[ProcView], regions: &[RegionView], tol: Tolerance) -> Vec<Finding> {
    evaluate_with_nvml(procs, regions, tol, Tolerance::NVML_DEFAULT)
}

/// Computes every finding, judging compute shares with [`ComputeOptions::default`]. See
/// [`evaluate_all`].
pub fn evaluate_with_nvml(
    procs: &[ProcView],
    regions: &[RegionView],
    tol: Tolerance,
    nvml_tol: Tolerance,
) -> Vec<Finding> {
    evaluate_all(procs, regions, tol, nvml_tol, &ComputeOptions::default())
}

/// Computes every finding. `procs[i].region` indexes `regions`. `tol` is the tolerance
/// between the probes' figures and the region's, `nvml_tol` the one between NVML's and the
/// region's (or the limit), `compute` how compute shares are judged.
pub fn evaluate_all(
    procs: &[ProcView],
    regions: &[RegionView],
    tol: Tolerance,
    nvml_tol: Tolerance,
    compute: &ComputeOptions,
) -> Vec<Finding> {
    let mut out = Vec::new();
    // Each region's processes, grouped once (regions x processes was the tick's cost at
    // 1000 regions and 5000 processes).
    let mut users: Vec<Vec<&ProcView>> = vec![Vec::new(); regions.len()];
    for p in procs {
        process_findings(p, regions, tol, &mut out);
        nvml_process_findings(p, regions, nvml_tol, &mut out);
        if let Some(u) = p.region.and_then(|ri| users.get_mut(ri)) {
            u.push(p);
        }
    }
    for (r, users) in regions.iter().zip(&users) {
        region_findings(r, users, tol, &mut out);
        nvml_region_findings(r, users, nvml_tol, &mut out);
        compute_region_findings(r, compute, &mut out);
    }
    out
}

/// `; NVML: <bytes> on the GPU` when NVML gave a figure for the process, else empty.
pub(super) fn nvml_note(p: &ProcView) -> String {
    p.nvml_bytes.map_or(String::new(), |b| {
        format!("; NVML: {} on the GPU", human_bytes(b))
    })
}

/// `unlimited (0)`, or the limit in human units and bytes.
pub(super) fn human_or_unlimited(b: u64) -> String {
    if b == 0 {
        "unlimited (0)".to_string()
    } else {
        format!("{} ({b} bytes)", human_bytes(b))
    }
}

/// Per (region, device) figures for metrics and the table.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct RegionUsage {
    /// Container.
    pub container: String,
    /// Region name.
    pub region: String,
    /// Device ordinal.
    pub device: u32,
    /// Limit (0 = unlimited).
    pub limit: u64,
    /// Accounted, all kinds (what counts against the limit).
    pub accounted: u64,
    /// Accounted data only (comparable with observed).
    pub accounted_data: u64,
    /// Observed data of the region's users.
    pub observed: u64,
}

/// Limit / accounted / observed per region and device: devices with usage, plus devices
/// below the region's device count that exist on the node (NVML's count, when known).
pub fn region_usage(procs: &[ProcView], regions: &[RegionView]) -> Vec<RegionUsage> {
    let mut out = Vec::new();
    // Each region's users, grouped once (not a pass over every process per region and device).
    let mut users: Vec<Vec<&ProcView>> = vec![Vec::new(); regions.len()];
    for p in procs {
        if let Some(u) = p.region.and_then(|i| users.get_mut(i)) {
            u.push(p);
        }
    }
    for (ri, r) in regions.iter().enumerate() {
        let single = r.single_device;
        for d in 0..MAX_DEVICES {
            let observed: u64 = users[ri].iter().map(|p| observed_on(p, d, single)).sum();
            let accounted = r.snapshot.accounted(d);
            let limit = r.snapshot.limits[d];
            let visible = r.node_devices.unwrap_or(r.devices()).max(1);
            if observed == 0 && accounted == 0 && (d >= visible || (d >= r.devices() && limit == 0))
            {
                continue;
            }
            out.push(RegionUsage {
                container: r.container.clone(),
                region: r.name.clone(),
                device: d as u32,
                limit,
                accounted,
                accounted_data: r.snapshot.slots.iter().map(|s| slot_data_on(s, d)).sum(),
                observed,
            });
        }
    }
    out
}
