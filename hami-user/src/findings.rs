//! The audit rules: a pure function from what the agent knows about processes and regions to
//! findings. Nothing here reads files or clocks; see `docs/agent.md` for the rules in prose.

use std::collections::BTreeMap;

use hami_common::layout::{UsageKind, MAX_DEVICES};
use hami_common::region::{RegionSnapshot, SlotSnapshot};
use serde::Serialize;

use crate::access::{write_denied, Creds, FileMeta};
use crate::procinfo::{EnvLimit, EnvLimits};

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
}

impl FindingKind {
    /// All kinds, in a fixed order.
    pub const ALL: [FindingKind; 6] = [
        FindingKind::Bypass,
        FindingKind::LeakedSlot,
        FindingKind::OverLimit,
        FindingKind::Tamper,
        FindingKind::Drift,
        FindingKind::LockedOut,
    ];

    /// The stable name (`bypass`, `leaked_slot`, `over_limit`, `tamper`, `drift`,
    /// `locked_out`).
    pub const fn name(self) -> &'static str {
        match self {
            FindingKind::Bypass => "bypass",
            FindingKind::LeakedSlot => "leaked_slot",
            FindingKind::OverLimit => "over_limit",
            FindingKind::Tamper => "tamper",
            FindingKind::Drift => "drift",
            FindingKind::LockedOut => "locked_out",
        }
    }

    /// Whether `audit` exits non-zero for this kind.
    pub const fn is_failure(self) -> bool {
        matches!(self, FindingKind::Bypass | FindingKind::OverLimit)
    }
}

/// Stable reasons, more precise than the kind.
pub mod reason {
    /// Bypass: allocating through libcuda with no preload mapped.
    pub const NO_PRELOAD: &str = "no_preload";
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
fn observed_on(p: &ProcView, dev: usize, single_device: bool) -> u64 {
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

/// Computes every finding. `procs[i].region` indexes `regions`. `tol` is the tolerance
/// between the probes' figures and the region's, `nvml_tol` the one between NVML's and the
/// region's (or the limit).
pub fn evaluate_with_nvml(
    procs: &[ProcView],
    regions: &[RegionView],
    tol: Tolerance,
    nvml_tol: Tolerance,
) -> Vec<Finding> {
    let mut out = Vec::new();
    for p in procs {
        process_findings(p, regions, tol, &mut out);
        nvml_process_findings(p, regions, nvml_tol, &mut out);
    }
    for (ri, r) in regions.iter().enumerate() {
        region_findings(ri, r, procs, tol, &mut out);
        nvml_region_findings(ri, r, procs, nvml_tol, &mut out);
    }
    out
}

fn nvml_note(p: &ProcView) -> String {
    p.nvml_bytes.map_or(String::new(), |b| {
        format!("; NVML: {} on the GPU", human_bytes(b))
    })
}

fn process_findings(p: &ProcView, regions: &[RegionView], tol: Tolerance, out: &mut Vec<Finding>) {
    let observed = p.observed_total();
    let region = p.region.and_then(|i| regions.get(i));
    let base = |kind, reason, bytes, detail: String| Finding {
        kind,
        reason,
        pid: Some(p.pid),
        uid: p.creds.as_ref().map(|c| c.fsuid),
        nspid: p.nspid,
        container: p.container.clone(),
        region: region.map(|r| r.name.clone()),
        device: None,
        slot: None,
        bytes,
        observed: Some(observed),
        accounted: None,
        limit: None,
        detail,
    };
    if !p.hooked {
        let nvml = p.nvml_bytes.unwrap_or(0);
        if p.alloc_events > 0 {
            out.push(base(
                FindingKind::Bypass,
                reason::NO_PRELOAD,
                observed,
                format!(
                    "allocating through libcuda without libhami_preload.so: {} live (peak {}, {} allocations seen){}",
                    human_bytes(observed),
                    human_bytes(p.peak_bytes),
                    p.alloc_events,
                    nvml_note(p)
                ),
            ));
        } else if nvml > 0 && !p.attached_late {
            // NVML is the physical truth: an unhooked process holding device memory is a
            // bypass whenever it started. When it started is context, not an excuse.
            let context = if p.pre_existing {
                "it was running before the agent attached (pre-existing), so its allocations \
                 were not observed, but nothing of it is accounted"
            } else if p.seen_by_events {
                "no allocation through the probed functions was seen (context, module, pool or \
                 other memory the probes do not cover)"
            } else {
                "the probes saw none of its calls"
            };
            out.push(base(
                FindingKind::Bypass,
                reason::NO_PRELOAD,
                nvml.max(observed),
                format!(
                    "holds {} of device memory according to NVML without libhami_preload.so; {context}",
                    human_bytes(nvml),
                ),
            ));
        } else if p.attached_late {
            // It loaded a libcuda the agent had not probed yet, after the agent started:
            // an unhooked CUDA process whose first allocations could not be seen. Report it
            // (it is not a process that was running before the agent).
            let bytes = observed.max(p.nvml_bytes.unwrap_or(0));
            out.push(base(
                FindingKind::Bypass,
                reason::NO_PRELOAD,
                bytes,
                format!(
                    "uses libcuda without libhami_preload.so; its libcuda was probed only after it \
                     was loaded, so allocations before then were not observed ({} observed since, NVML {})",
                    human_bytes(observed),
                    p.nvml_bytes.map_or("unavailable".to_string(), human_bytes)
                ),
            ));
        }
        return;
    }
    let Some(r) = region else {
        if p.alloc_events > 0 && observed > 0 {
            out.push(base(
                FindingKind::Bypass,
                reason::NO_REGION,
                observed,
                format!(
                    "preload mapped but no usable region ({}): {} unaccounted",
                    p.region_error.as_deref().unwrap_or("not found"),
                    human_bytes(observed)
                ),
            ));
        }
        return;
    };
    let Some(slot) = r.slot_of(p) else {
        // No slot: if it cannot write the region, it never will have one.
        if let Some(why) = r
            .file
            .as_ref()
            .zip(p.creds.as_ref())
            .and_then(|(f, c)| write_denied(f, c))
        {
            out.push(base(
                FindingKind::LockedOut,
                reason::REGION_UNWRITABLE,
                0,
                format!(
                    "cannot write region {}: {why}; every allocation of this process is refused",
                    r.name
                ),
            ));
        }
        if p.alloc_events > 0 && observed > 0 {
            out.push(base(
                FindingKind::Bypass,
                reason::NO_SLOT,
                observed,
                format!(
                    "preload mapped but no slot for pid {} in {}: {} unaccounted",
                    p.slot_pid(),
                    r.name,
                    human_bytes(observed)
                ),
            ));
        }
        return;
    };
    let accounted = slot_data(slot);
    // Above: compared with data + pool (async allocations are charged to their pool).
    // Below: with data alone (a pool may legitimately hold more than its live allocations).
    let ceiling = slot_probe_ceiling(slot);
    let with_numbers = |mut f: Finding| {
        f.accounted = Some(accounted);
        f.slot = Some(slot.index);
        f
    };
    if tol.exceeds(observed, ceiling) {
        out.push(with_numbers(base(
            FindingKind::Bypass,
            reason::OBSERVED_ABOVE_ACCOUNTED,
            observed - ceiling,
            format!(
                "observed {} but the region accounts {} of data and pools (tolerance {})",
                human_bytes(observed),
                human_bytes(ceiling),
                human_bytes(tol.allowance(observed, ceiling))
            ),
        )));
        return;
    }
    // Accounted above observed: only meaningful when the agent saw the whole life.
    if p.pre_existing || !p.seen_by_events {
        return;
    }
    if tol.exceeds(accounted, observed) {
        if observed == 0 {
            out.push(with_numbers(base(
                FindingKind::LeakedSlot,
                reason::USAGE_WITHOUT_ALLOCATIONS,
                accounted,
                format!(
                    "slot {} accounts {} of data but the process holds no allocations",
                    slot.index,
                    human_bytes(accounted)
                ),
            )));
        } else {
            out.push(with_numbers(base(
                FindingKind::Drift,
                reason::ACCOUNTED_ABOVE_OBSERVED,
                accounted - observed,
                format!(
                    "accounted {} but observed {} (tolerance {})",
                    human_bytes(accounted),
                    human_bytes(observed),
                    human_bytes(tol.allowance(observed, accounted))
                ),
            )));
        }
    }
}

fn region_findings(
    ri: usize,
    r: &RegionView,
    procs: &[ProcView],
    tol: Tolerance,
    out: &mut Vec<Finding>,
) {
    let users: Vec<&ProcView> = procs.iter().filter(|p| p.region == Some(ri)).collect();
    let snap = &r.snapshot;
    // Leaked slots.
    for s in &snap.slots {
        let (reason, detail) = match r.liveness.get(&s.index) {
            Some(SlotLiveness::Dead) => (
                reason::PROCESS_DEAD,
                format!(
                    "slot {} holds pid {} (start {}), which no longer exists",
                    s.index, s.pid, s.start_time
                ),
            ),
            Some(SlotLiveness::Reused {
                host_pid,
                start_time,
            }) => (
                reason::PID_REUSED,
                format!(
                    "slot {} holds pid {} started at {}, but that pid (host {}) started at {}",
                    s.index, s.pid, s.start_time, host_pid, start_time
                ),
            ),
            _ => continue,
        };
        out.push(Finding {
            kind: FindingKind::LeakedSlot,
            reason,
            pid: None,
            uid: None,
            nspid: Some(s.pid),
            container: r.container.clone(),
            region: Some(r.name.clone()),
            device: None,
            slot: Some(s.index),
            bytes: s.total(),
            observed: None,
            accounted: Some(s.total()),
            limit: None,
            detail: format!("{detail}; {} still accounted", human_bytes(s.total())),
        });
    }
    // Tamper: the region's limit against each live hooked user's environment (the preload
    // is what reads the environment; an unhooked process's variables mean nothing).
    let mut tampered = std::collections::BTreeSet::new();
    for p in users.iter().filter(|p| p.hooked) {
        for d in 0..MAX_DEVICES {
            if d >= r.devices() && !p.env_limits.per_device.contains_key(&(d as u32)) {
                continue;
            }
            if tampered.contains(&d) {
                continue;
            }
            let region_limit = snap.limits[d];
            let invalid = snap.config_invalid(d);
            let (reason, want) = match p.env_limits.for_device(d as u32) {
                Some(EnvLimit::Bytes(b)) if b != region_limit || invalid => {
                    (reason::LIMIT_DIFFERS_FROM_ENV, human_or_unlimited(b))
                }
                Some(EnvLimit::Invalid) if !invalid => (
                    reason::ENV_INVALID_REGION_VALID,
                    "an invalid value".to_string(),
                ),
                _ => continue,
            };
            tampered.insert(d);
            out.push(Finding {
                kind: FindingKind::Tamper,
                reason,
                pid: Some(p.pid),
                uid: p.creds.as_ref().map(|c| c.fsuid),
                nspid: p.nspid,
                container: p.container.clone(),
                region: Some(r.name.clone()),
                device: Some(d as u32),
                slot: None,
                bytes: region_limit,
                observed: None,
                accounted: None,
                limit: Some(region_limit),
                detail: format!(
                    "device {d}: region limit is {}{}, but pid {}'s environment sets {want}",
                    human_or_unlimited(region_limit),
                    if invalid { " (flagged invalid)" } else { "" },
                    p.pid
                ),
            });
        }
    }
    // Over limit: observed data of the region's users per device.
    let single = r.single_device;
    for d in 0..r.devices() {
        let Some(limit) = snap.limit(d) else { continue };
        let observed: u64 = users.iter().map(|p| observed_on(p, d, single)).sum();
        if observed > limit && observed - limit > tol.allowance(observed, limit) {
            let pids: Vec<String> = users
                .iter()
                .filter(|p| observed_on(p, d, single) > 0)
                .map(|p| p.pid.to_string())
                .collect();
            out.push(Finding {
                kind: FindingKind::OverLimit,
                reason: reason::OBSERVED_ABOVE_LIMIT,
                pid: None,
                uid: None,
                nspid: None,
                container: r.container.clone(),
                region: Some(r.name.clone()),
                device: Some(d as u32),
                slot: None,
                bytes: observed - limit,
                observed: Some(observed),
                accounted: Some(snap.accounted(d)),
                limit: Some(limit),
                detail: format!(
                    "device {d}: observed {} above the limit {} (pids {})",
                    human_bytes(observed),
                    human_bytes(limit),
                    pids.join(",")
                ),
            });
        }
    }
}

/// The physical check of one hooked process: on each device of its region, what NVML says
/// it holds against what its slot accounts there (all kinds), both read at the NVML sample.
fn nvml_process_findings(
    p: &ProcView,
    regions: &[RegionView],
    tol: Tolerance,
    out: &mut Vec<Finding>,
) {
    if !p.hooked || p.nvml_devices.is_empty() {
        return;
    }
    let drift =
        |reason, device: Option<u32>, slot: Option<usize>, held: u64, acc: u64, detail| Finding {
            kind: FindingKind::Drift,
            reason,
            pid: Some(p.pid),
            uid: p.creds.as_ref().map(|c| c.fsuid),
            nspid: p.nspid,
            container: p.container.clone(),
            region: p
                .region
                .and_then(|i| regions.get(i))
                .map(|r| r.name.clone()),
            device,
            slot,
            bytes: held.abs_diff(acc),
            observed: Some(held),
            accounted: Some(acc),
            limit: None,
            detail,
        };
    let Some(r) = p.region.and_then(|i| regions.get(i)) else {
        // Hooked, but no usable region: nothing it holds is accounted anywhere.
        let held = crate::nvml::saturating_sum(p.nvml_devices.values());
        if tol.exceeds(held, 0) {
            out.push(drift(
                reason::NVML_ABOVE_ACCOUNTED,
                None,
                None,
                held,
                0,
                format!(
                    "NVML says it holds {} but it has no usable region ({}): none of it is accounted",
                    human_bytes(held),
                    p.region_error.as_deref().unwrap_or("not found")
                ),
            ));
        }
        return;
    };
    // Opened after the latest NVML sample: compared at the next one.
    let Some(n) = &r.nvml else { return };
    let slot = slot_in(&n.snapshot, p);
    for (d, idx) in n.device_index.iter().enumerate() {
        let Some(idx) = *idx else { continue };
        let Some(&held) = p.nvml_devices.get(&idx) else {
            continue;
        };
        let acc = slot.map_or(0, |s| s.device_total(d));
        let allowance = tol.allowance(held, acc);
        let where_ = match slot {
            Some(s) => format!("its slot {} accounts {}", s.index, human_bytes(acc)),
            None => format!("it has no slot in {} (nothing accounted)", r.name),
        };
        if tol.exceeds(held, acc) {
            out.push(drift(
                reason::NVML_ABOVE_ACCOUNTED,
                Some(d as u32),
                slot.map(|s| s.index),
                held,
                acc,
                format!(
                    "device {d} (NVML GPU {idx}): NVML says it holds {}, {where_}: {} the preload did not see (tolerance {})",
                    human_bytes(held),
                    human_bytes(held - acc),
                    human_bytes(allowance)
                ),
            ));
        } else if held > 0 && tol.exceeds(acc, held) {
            // A process NVML does not list at all is not compared this way: NVML and the
            // agent may not name it by the same pid (a driver reporting namespaced pids).
            out.push(drift(
                reason::ACCOUNTED_ABOVE_NVML,
                Some(d as u32),
                slot.map(|s| s.index),
                held,
                acc,
                format!(
                    "device {d} (NVML GPU {idx}): {where_} but NVML says it holds {} (tolerance {})",
                    human_bytes(held),
                    human_bytes(allowance)
                ),
            ));
        }
    }
}

/// The physical check of one region: per device, what NVML says the region's processes
/// (hooked or not) hold together, against the region's limit.
fn nvml_region_findings(
    ri: usize,
    r: &RegionView,
    procs: &[ProcView],
    tol: Tolerance,
    out: &mut Vec<Finding>,
) {
    let Some(n) = &r.nvml else { return };
    let users: Vec<&ProcView> = procs.iter().filter(|p| p.region == Some(ri)).collect();
    for (d, idx) in n.device_index.iter().enumerate() {
        let (Some(idx), Some(limit)) = (*idx, r.snapshot.limit(d)) else {
            continue;
        };
        let held: Vec<(u32, u64)> = users
            .iter()
            .filter_map(|p| p.nvml_devices.get(&idx).map(|&b| (p.pid, b)))
            .filter(|&(_, b)| b > 0)
            .collect();
        let total = crate::nvml::saturating_sum(held.iter().map(|(_, b)| b));
        if !(total > limit && tol.exceeds(total, limit)) {
            continue;
        }
        let unknown: Vec<String> = users
            .iter()
            .filter(|p| !p.nvml_devices.contains_key(&idx))
            .map(|p| p.pid.to_string())
            .collect();
        let list: Vec<String> = held
            .iter()
            .map(|(pid, b)| format!("{pid}: {}", human_bytes(*b)))
            .collect();
        let accounted = n.snapshot.accounted(d);
        out.push(Finding {
            kind: FindingKind::OverLimit,
            reason: reason::NVML_ABOVE_LIMIT,
            pid: None,
            uid: None,
            nspid: None,
            container: r.container.clone(),
            region: Some(r.name.clone()),
            device: Some(d as u32),
            slot: None,
            bytes: total - limit,
            observed: Some(total),
            accounted: Some(accounted),
            limit: Some(limit),
            detail: format!(
                "device {d} (NVML GPU {idx}): the container's processes hold {} according to NVML \
                 ({}), above the limit {}; the region accounts {}{}",
                human_bytes(total),
                list.join(", "),
                human_bytes(limit),
                human_bytes(accounted),
                if unknown.is_empty() {
                    String::new()
                } else {
                    format!(" (no NVML figure for pids {})", unknown.join(","))
                }
            ),
        });
    }
}

fn human_or_unlimited(b: u64) -> String {
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

#[cfg(test)]
#[allow(clippy::cloned_ref_to_slice_refs, clippy::field_reassign_with_default)]
pub(crate) mod tests {
    use super::*;
    use hami_common::layout::USAGE_KINDS;

    const MIB: u64 = 1 << 20;

    pub(crate) fn snapshot(limit0: u64, slots: Vec<SlotSnapshot>) -> RegionSnapshot {
        let mut limits = [0; MAX_DEVICES];
        limits[0] = limit0;
        let mut used = [0; MAX_DEVICES];
        for s in &slots {
            for (d, u) in used.iter_mut().enumerate() {
                *u += s.device_total(d);
            }
        }
        RegionSnapshot {
            version: 1,
            header_size: 0,
            total_size: 0,
            init_state: 2,
            device_count: 1,
            creator_pid: 1,
            created_unix: 0,
            boot_id: [0; 16],
            generation: 0,
            owner_died_recoveries: 0,
            reclaimed_slots: 0,
            stale_lock_breaks: 0,
            reserve_reclaims: 0,
            limits,
            limit_flags: [0; MAX_DEVICES],
            uuids: [[0; 16]; MAX_DEVICES],
            used,
            slots,
            consistent: true,
        }
    }

    pub(crate) fn slot(index: usize, pid: u32, start: u64, ctx: u64, data: u64) -> SlotSnapshot {
        let mut usage = [[0u64; USAGE_KINDS]; MAX_DEVICES];
        usage[0][UsageKind::Context.index()] = ctx;
        usage[0][UsageKind::Data.index()] = data;
        let mut charged = [0u64; MAX_DEVICES];
        charged[0] = ctx + data;
        SlotSnapshot {
            index,
            pid,
            start_time: start,
            usage,
            charged,
            reserve: [0; MAX_DEVICES],
        }
    }

    fn region(snap: RegionSnapshot, live: &[(usize, SlotLiveness)]) -> RegionView {
        RegionView {
            name: "/tmp/cudevshr.cache".into(),
            container: "c1".into(),
            snapshot: snap,
            liveness: live.iter().copied().collect(),
            single_device: true,
            node_devices: None,
            file: None,
            nvml: None,
        }
    }

    fn proc_(pid: u32, hooked: bool, observed: u64) -> ProcView {
        let mut env = EnvLimits::default();
        env.all = Some(EnvLimit::Bytes(1 << 30));
        ProcView {
            pid,
            start_time: 100 + pid as u64,
            nspid: Some(pid),
            container: "c1".into(),
            hooked,
            region: Some(0),
            observed: [(Some(0), observed)].into_iter().collect(),
            alloc_events: u64::from(observed > 0),
            peak_bytes: observed,
            seen_by_events: true,
            env_limits: env,
            ..Default::default()
        }
    }

    fn kinds(f: &[Finding]) -> Vec<(FindingKind, &'static str)> {
        f.iter().map(|f| (f.kind, f.reason)).collect()
    }

    #[test]
    fn tolerance_is_max_of_floor_and_ratio() {
        let t = Tolerance::default();
        assert_eq!(t.allowance(0, 0), 2 * MIB);
        assert_eq!(t.allowance(1000 * MIB, 10), 10 * MIB);
        assert!(!t.exceeds(2 * MIB, 0));
        assert!(t.exceeds(2 * MIB + 1, 0));
        assert!(!t.exceeds(0, 5 * MIB));
    }

    #[test]
    fn hooked_within_quota_accounted_equals_observed_no_finding() {
        let r = region(
            snapshot(1 << 30, vec![slot(0, 10, 110, 300 * MIB, 64 * MIB)]),
            &[(0, SlotLiveness::Alive { host_pid: 10 })],
        );
        let p = proc_(10, true, 64 * MIB);
        assert!(evaluate(&[p.clone()], &[r.clone()], Tolerance::default()).is_empty());
        let u = region_usage(&[p], &[r]);
        assert_eq!(u.len(), 1);
        assert_eq!(u[0].observed, 64 * MIB);
        assert_eq!(u[0].accounted_data, 64 * MIB);
        assert_eq!(u[0].accounted, 364 * MIB);
        assert_eq!(u[0].limit, 1 << 30);
    }

    /// Issue 13: a hooked process of another uid than the region's owner, with no slot and a
    /// region mode that excludes it, is locked out; the finding names the region, the pid,
    /// the uid and why.
    #[test]
    fn process_that_cannot_write_its_region_is_locked_out() {
        let mut r = region(
            snapshot(1 << 30, vec![slot(0, 10, 110, 0, 64 * MIB)]),
            &[(0, SlotLiveness::Alive { host_pid: 10 })],
        );
        r.file = Some(FileMeta {
            mode: 0o600,
            uid: 0,
            gid: 0,
        });
        let nobody = Creds {
            fsuid: 65534,
            fsgid: 65534,
            groups: vec![],
            cap_eff: 0,
        };
        // Its allocations are refused by the preload: the probes see none.
        let mut p = proc_(12, true, 0);
        p.creds = Some(nobody.clone());
        let f = evaluate(&[p.clone()], &[r.clone()], Tolerance::default());
        assert_eq!(
            kinds(&f),
            vec![(FindingKind::LockedOut, reason::REGION_UNWRITABLE)]
        );
        assert_eq!(f[0].pid, Some(12));
        assert_eq!(f[0].uid, Some(65534));
        assert_eq!(f[0].region.as_deref(), Some("/tmp/cudevshr.cache"));
        assert!(f[0].detail.contains("0600") && f[0].detail.contains("uid 65534"));
        assert!(!FindingKind::LockedOut.is_failure());

        // The same process is fine with the default mode, or in the file's group with 0660.
        let mut open = r.clone();
        open.file = Some(FileMeta {
            mode: 0o666,
            uid: 0,
            gid: 0,
        });
        assert!(evaluate(&[p.clone()], &[open], Tolerance::default()).is_empty());
        let mut grp = r.clone();
        grp.file = Some(FileMeta {
            mode: 0o660,
            uid: 0,
            gid: 65534,
        });
        assert!(evaluate(&[p.clone()], &[grp], Tolerance::default()).is_empty());

        // A process that holds a slot got in (e.g. before a chmod): not locked out.
        let mut in_slot = proc_(10, true, 64 * MIB);
        in_slot.creds = Some(nobody);
        assert!(evaluate(&[in_slot], &[r.clone()], Tolerance::default()).is_empty());

        // Root with CAP_DAC_OVERRIDE writes anything; unknown credentials or metadata: no
        // finding.
        let mut root = p.clone();
        root.creds = Some(Creds {
            cap_eff: 1 << 1,
            ..Creds::default()
        });
        assert!(evaluate(&[root], &[r.clone()], Tolerance::default()).is_empty());
        let mut unknown = p.clone();
        unknown.creds = None;
        assert!(evaluate(&[unknown], &[r.clone()], Tolerance::default()).is_empty());
        r.file = None;
        assert!(evaluate(&[p], &[r], Tolerance::default()).is_empty());
    }

    #[test]
    fn bypass_without_preload_with_pid_and_bytes() {
        let r = region(snapshot(1 << 30, vec![]), &[]);
        let p = proc_(11, false, 64 * MIB);
        let f = evaluate(&[p], &[r], Tolerance::default());
        assert_eq!(kinds(&f), vec![(FindingKind::Bypass, reason::NO_PRELOAD)]);
        assert_eq!(f[0].pid, Some(11));
        assert_eq!(f[0].bytes, 64 * MIB);
        assert!(!f[0].needs_settle());
        // Without any allocation seen, an unhooked process is not reported.
        let idle = proc_(12, false, 0);
        assert!(evaluate(&[idle], &[], Tolerance::default()).is_empty());
    }

    /// Regression (H200, torch `backend:cudaMallocAsync` under the preload): async
    /// allocations are charged to the slot's pool, not its data; the probes' live bytes were
    /// compared with data alone and a preloaded process was reported as a bypass.
    #[test]
    fn async_allocations_charged_to_the_pool_are_no_bypass() {
        let mut s = slot(0, 13, 113, 0, 0);
        s.usage[0][UsageKind::Pool.index()] = 1024 * MIB;
        let r = region(
            snapshot(1 << 30, vec![s]),
            &[(0, SlotLiveness::Alive { host_pid: 13 })],
        );
        // 1 GiB live from the pool: inside data + pool.
        let f = evaluate(
            &[proc_(13, true, 1024 * MIB)],
            &[r.clone()],
            Tolerance::default(),
        );
        assert!(f.is_empty(), "{f:?}");
        // The pool keeps its reserve after the free: the probes see 0 live, no finding either
        // (a reserve above the live allocations is not drift).
        let f = evaluate(&[proc_(13, true, 0)], &[r.clone()], Tolerance::default());
        assert!(f.is_empty(), "{f:?}");
        // Beyond data + pool it is still a bypass.
        let f = evaluate(&[proc_(13, true, 2048 * MIB)], &[r], Tolerance::default());
        let bypass = f
            .iter()
            .find(|f| f.reason == reason::OBSERVED_ABOVE_ACCOUNTED)
            .expect("bypass beyond data + pool");
        assert_eq!(bypass.kind, FindingKind::Bypass);
        assert_eq!(bypass.bytes, 1024 * MIB);
    }

    #[test]
    fn bypass_no_slot_no_region_and_observed_above_accounted() {
        let r = region(
            snapshot(1 << 30, vec![slot(0, 13, 113, 0, 10 * MIB)]),
            &[(0, SlotLiveness::Alive { host_pid: 13 })],
        );
        // Slot exists but accounts 10 MiB while 64 MiB are live.
        let f = evaluate(
            &[proc_(13, true, 64 * MIB)],
            &[r.clone()],
            Tolerance::default(),
        );
        assert_eq!(
            kinds(&f),
            vec![(FindingKind::Bypass, reason::OBSERVED_ABOVE_ACCOUNTED)]
        );
        assert_eq!(f[0].bytes, 54 * MIB);
        assert_eq!(f[0].accounted, Some(10 * MIB));
        assert!(f[0].needs_settle());
        // Hooked but no slot with its pid.
        let f = evaluate(
            &[proc_(14, true, 8 * MIB)],
            &[r.clone()],
            Tolerance::default(),
        );
        assert_eq!(kinds(&f), vec![(FindingKind::Bypass, reason::NO_SLOT)]);
        // A slot with the same pid but another start time is not its slot.
        let mut p = proc_(13, true, 8 * MIB);
        p.start_time = 999;
        let f = evaluate(&[p], &[r], Tolerance::default());
        assert_eq!(kinds(&f), vec![(FindingKind::Bypass, reason::NO_SLOT)]);
        // Hooked without region.
        let mut p = proc_(15, true, 8 * MIB);
        p.region = None;
        p.region_error = Some("permission denied".into());
        let f = evaluate(&[p], &[], Tolerance::default());
        assert_eq!(kinds(&f), vec![(FindingKind::Bypass, reason::NO_REGION)]);
        assert!(f[0].detail.contains("permission denied"));
    }

    #[test]
    fn leaked_slots_dead_reused_and_usage_without_allocations() {
        let r = region(
            snapshot(
                1 << 30,
                vec![
                    slot(0, 20, 120, MIB, 32 * MIB),
                    slot(1, 21, 121, MIB, 0),
                    slot(2, 22, 122, 0, 16 * MIB),
                    slot(3, 23, 123, 0, 16 * MIB),
                ],
            ),
            &[
                (0, SlotLiveness::Dead),
                (
                    1,
                    SlotLiveness::Reused {
                        host_pid: 21,
                        start_time: 5000,
                    },
                ),
                (2, SlotLiveness::Alive { host_pid: 22 }),
                (3, SlotLiveness::Unknown),
            ],
        );
        let p22 = proc_(22, true, 0);
        let f = evaluate(&[p22.clone()], &[r.clone()], Tolerance::default());
        let mut k = kinds(&f);
        k.sort();
        assert_eq!(
            k,
            vec![
                (FindingKind::LeakedSlot, reason::PID_REUSED),
                (FindingKind::LeakedSlot, reason::PROCESS_DEAD),
                (FindingKind::LeakedSlot, reason::USAGE_WITHOUT_ALLOCATIONS),
            ]
        );
        let dead = f.iter().find(|f| f.reason == reason::PROCESS_DEAD).unwrap();
        assert_eq!(dead.slot, Some(0));
        assert_eq!(dead.bytes, 33 * MIB);
        assert_eq!(dead.nspid, Some(20));
        // A pre-existing process is never reported for usage the agent could not see.
        let mut pre = p22;
        pre.pre_existing = true;
        let f = evaluate(&[pre], &[r], Tolerance::default());
        assert!(f
            .iter()
            .all(|f| f.reason != reason::USAGE_WITHOUT_ALLOCATIONS));
    }

    #[test]
    fn over_limit_sums_the_container_including_unknown_device_on_single_gpu() {
        let r = region(
            snapshot(100 * MIB, vec![slot(0, 30, 130, 0, 60 * MIB)]),
            &[(0, SlotLiveness::Alive { host_pid: 30 })],
        );
        let mut hooked = proc_(30, true, 60 * MIB);
        hooked.env_limits.all = Some(EnvLimit::Bytes(100 * MIB));
        let mut rogue = proc_(31, false, 0);
        rogue.observed = [(None, 80 * MIB)].into_iter().collect();
        rogue.alloc_events = 1;
        let f = evaluate(&[hooked, rogue], &[r], Tolerance::default());
        let mut k = kinds(&f);
        k.sort();
        assert_eq!(
            k,
            vec![
                (FindingKind::Bypass, reason::NO_PRELOAD),
                (FindingKind::OverLimit, reason::OBSERVED_ABOVE_LIMIT),
            ]
        );
        let o = f.iter().find(|f| f.kind == FindingKind::OverLimit).unwrap();
        assert_eq!(o.observed, Some(140 * MIB));
        assert_eq!(o.limit, Some(100 * MIB));
        assert_eq!(o.bytes, 40 * MIB);
        assert_eq!(o.device, Some(0));
        assert!(o.detail.contains("30,31"));
    }

    #[test]
    fn tamper_when_region_limit_differs_from_env() {
        let mut snap = snapshot(2 << 30, vec![slot(0, 40, 140, 0, 0)]);
        let r = region(snap.clone(), &[(0, SlotLiveness::Alive { host_pid: 40 })]);
        let p = proc_(40, true, 0); // env says 1 GiB
        let f = evaluate(&[p.clone()], &[r], Tolerance::default());
        assert_eq!(
            kinds(&f),
            vec![(FindingKind::Tamper, reason::LIMIT_DIFFERS_FROM_ENV)]
        );
        assert_eq!(f[0].limit, Some(2 << 30));
        assert_eq!(f[0].device, Some(0));
        // Same limit: nothing.
        snap.limits[0] = 1 << 30;
        let r = region(snap.clone(), &[(0, SlotLiveness::Alive { host_pid: 40 })]);
        assert!(evaluate(&[p.clone()], &[r], Tolerance::default()).is_empty());
        // Invalid env but a valid region limit.
        let mut bad = p;
        bad.env_limits.all = Some(EnvLimit::Invalid);
        let r = region(snap, &[(0, SlotLiveness::Alive { host_pid: 40 })]);
        let f = evaluate(&[bad], &[r], Tolerance::default());
        assert_eq!(
            kinds(&f),
            vec![(FindingKind::Tamper, reason::ENV_INVALID_REGION_VALID)]
        );
    }

    #[test]
    fn drift_only_for_fully_observed_processes() {
        let r = region(
            snapshot(1 << 30, vec![slot(0, 50, 150, 0, 100 * MIB)]),
            &[(0, SlotLiveness::Alive { host_pid: 50 })],
        );
        let p = proc_(50, true, 40 * MIB);
        let f = evaluate(&[p.clone()], &[r.clone()], Tolerance::default());
        assert_eq!(
            kinds(&f),
            vec![(FindingKind::Drift, reason::ACCOUNTED_ABOVE_OBSERVED)]
        );
        assert_eq!(f[0].observed, Some(40 * MIB));
        assert_eq!(f[0].accounted, Some(100 * MIB));
        assert_eq!(f[0].bytes, 60 * MIB);
        // Within tolerance: nothing.
        let close = proc_(50, true, 99 * MIB);
        assert!(evaluate(&[close], &[r.clone()], Tolerance::default()).is_empty());
        // Baseline: a process running before the agent is not drift (nor bypass).
        let mut pre = p;
        pre.pre_existing = true;
        assert!(evaluate(&[pre], &[r], Tolerance::default()).is_empty());
    }

    #[test]
    fn pre_existing_hooked_process_started_before_agent_is_not_bypass() {
        // The workload allocated 500 MiB before the agent started, 10 MiB after.
        let r = region(
            snapshot(1 << 30, vec![slot(0, 60, 160, 0, 510 * MIB)]),
            &[(0, SlotLiveness::Alive { host_pid: 60 })],
        );
        let mut p = proc_(60, true, 10 * MIB);
        p.pre_existing = true;
        assert!(evaluate(&[p], &[r], Tolerance::default()).is_empty());
    }

    #[test]
    fn usage_rows_follow_the_node_gpus_not_the_region_device_count() {
        // The preload records 16 configured devices when a global limit is set.
        let mut snap = snapshot(1 << 30, vec![slot(0, 70, 170, 0, 8 * MIB)]);
        snap.device_count = 16;
        for l in snap.limits.iter_mut() {
            *l = 1 << 30;
        }
        let mut r = region(snap, &[(0, SlotLiveness::Alive { host_pid: 70 })]);
        assert_eq!(region_usage(&[], std::slice::from_ref(&r)).len(), 16);
        r.node_devices = Some(1);
        let u = region_usage(&[], &[r]);
        assert_eq!(u.len(), 1);
        assert_eq!(u[0].accounted_data, 8 * MIB);
    }

    const GIB: u64 = 1 << 30;

    /// `r` with an NVML pairing: the region as it is, device 0 at NVML index `idx`.
    fn with_nvml(mut r: RegionView, idx: u32) -> RegionView {
        let mut device_index = [None; MAX_DEVICES];
        device_index[0] = Some(idx);
        r.nvml = Some(RegionNvml {
            snapshot: r.snapshot.clone(),
            device_index,
        });
        r
    }

    fn with_nvml_bytes(mut p: ProcView, idx: u32, bytes: u64) -> ProcView {
        p.nvml_bytes = Some(bytes);
        p.nvml_devices = [(idx, bytes)].into_iter().collect();
        p
    }

    #[test]
    fn nvml_tolerance_default_is_64_mib_or_2_percent() {
        let t = Tolerance::NVML_DEFAULT;
        assert_eq!(t.allowance(0, 0), 64 * MIB);
        assert_eq!(t.allowance(10 * GIB, 0), (10 * GIB) / 50);
        assert!(!t.exceeds(600 * MIB, 540 * MIB));
        assert!(t.exceeds(605 * MIB, 540 * MIB));
    }

    #[test]
    fn unhooked_process_holding_memory_per_nvml_is_bypass_whenever_it_started() {
        let r = region(snapshot(GIB, vec![]), &[]);
        // Running before the agent, no allocation seen since: NVML says it holds 1.5 GiB.
        let mut pre = with_nvml_bytes(proc_(12, false, 0), 0, 1536 * MIB);
        pre.pre_existing = true;
        pre.seen_by_events = false;
        let f = evaluate(&[pre.clone()], &[r.clone()], Tolerance::default());
        assert_eq!(kinds(&f), vec![(FindingKind::Bypass, reason::NO_PRELOAD)]);
        assert_eq!(f[0].pid, Some(12));
        assert_eq!(f[0].bytes, 1536 * MIB);
        assert!(f[0].detail.contains("pre-existing"), "{}", f[0].detail);
        assert!(!f[0].needs_settle() && !f[0].needs_nvml_confirmation());
        assert!(f[0].kind.is_failure());
        // Started under the agent, only a context (no allocation event): still a bypass.
        let mut fresh = with_nvml_bytes(proc_(13, false, 0), 0, 300 * MIB);
        fresh.seen_by_events = true;
        let f = evaluate(&[fresh], &[r.clone()], Tolerance::default());
        assert_eq!(kinds(&f), vec![(FindingKind::Bypass, reason::NO_PRELOAD)]);
        assert_eq!(f[0].bytes, 300 * MIB);
        // NVML lists nothing for it: nothing to report.
        let idle = with_nvml_bytes(proc_(14, false, 0), 0, 0);
        assert!(evaluate(&[idle], &[r.clone()], Tolerance::default()).is_empty());
        // No NVML: the probes' rule alone (a pre-existing process that allocates nothing
        // after attach cannot be judged).
        pre.nvml_bytes = None;
        pre.nvml_devices.clear();
        assert!(evaluate(&[pre], &[r], Tolerance::default()).is_empty());
    }

    #[test]
    fn nvml_above_accounted_and_over_limit_catch_a_blind_preload() {
        // The region says 300 MiB context + 256 MiB data; the probes agree on the data; NVML
        // says 1.5 GiB more (memory the preload never saw: a pool's reserve, a module's
        // globals, a mipmapped array).
        let snap = snapshot(GIB, vec![slot(0, 50, 150, 300 * MIB, 256 * MIB)]);
        let r = with_nvml(
            region(snap, &[(0, SlotLiveness::Alive { host_pid: 50 })]),
            0,
        );
        let held = 556 * MIB + 1536 * MIB;
        let mut p = with_nvml_bytes(proc_(50, true, 256 * MIB), 0, held);
        let f = evaluate(&[p.clone()], &[r.clone()], Tolerance::default());
        let mut k = kinds(&f);
        k.sort();
        assert_eq!(
            k,
            vec![
                (FindingKind::OverLimit, reason::NVML_ABOVE_LIMIT),
                (FindingKind::Drift, reason::NVML_ABOVE_ACCOUNTED),
            ]
        );
        let d = f.iter().find(|f| f.kind == FindingKind::Drift).unwrap();
        assert_eq!(
            (d.pid, d.device, d.slot, d.bytes, d.observed, d.accounted),
            (
                Some(50),
                Some(0),
                Some(0),
                1536 * MIB,
                Some(held),
                Some(556 * MIB)
            )
        );
        assert!(d.needs_settle() && d.needs_nvml_confirmation());
        let o = f.iter().find(|f| f.kind == FindingKind::OverLimit).unwrap();
        assert_eq!(
            (o.bytes, o.observed, o.limit),
            (held - GIB, Some(held), Some(GIB))
        );
        assert_eq!(o.accounted, Some(556 * MIB));
        assert!(o.detail.contains("50: 2.0 GiB"), "{}", o.detail);
        // The baseline does not matter: NVML and the region are complete figures.
        p.pre_existing = true;
        assert_eq!(evaluate(&[p], &[r.clone()], Tolerance::default()).len(), 2);
        // Within the tolerance (64 MiB here): nothing.
        let close = with_nvml_bytes(proc_(50, true, 256 * MIB), 0, 556 * MIB + 60 * MIB);
        assert!(evaluate(&[close], &[r], Tolerance::default()).is_empty());
    }

    #[test]
    fn accounted_above_nvml_is_drift_the_other_way() {
        let snap = snapshot(2 * GIB, vec![slot(0, 51, 151, 300 * MIB, GIB)]);
        let r = with_nvml(
            region(snap, &[(0, SlotLiveness::Alive { host_pid: 51 })]),
            0,
        );
        let mut p = with_nvml_bytes(proc_(51, true, GIB), 0, 300 * MIB);
        p.env_limits.all = Some(EnvLimit::Bytes(2 * GIB));
        let f = evaluate(&[p.clone()], &[r.clone()], Tolerance::default());
        assert_eq!(
            kinds(&f),
            vec![(FindingKind::Drift, reason::ACCOUNTED_ABOVE_NVML)]
        );
        assert_eq!(f[0].bytes, GIB);
        assert!(!f[0].kind.is_failure());
        // Not listed by NVML at all: not compared (NVML may name it by another pid).
        p.nvml_devices.insert(0, 0);
        assert!(evaluate(&[p], &[r], Tolerance::default()).is_empty());
    }

    #[test]
    fn nvml_rules_need_nvml_on_both_sides() {
        let snap = snapshot(GIB, vec![slot(0, 52, 152, 0, 0)]);
        let plain = region(snap, &[(0, SlotLiveness::Alive { host_pid: 52 })]);
        let p = with_nvml_bytes(proc_(52, true, 0), 0, 3 * GIB);
        // The region was opened after the latest NVML sample: compared at the next one.
        assert!(evaluate(&[p.clone()], &[plain.clone()], Tolerance::default()).is_empty());
        // The region's device is not a GPU NVML knows (UUID not found): nothing compared.
        let mut r = with_nvml(plain, 0);
        r.nvml.as_mut().unwrap().device_index[0] = None;
        assert!(evaluate(&[p.clone()], &[r.clone()], Tolerance::default()).is_empty());
        // NVML read the device but has no figure for the process: unknown, not zero.
        r.nvml.as_mut().unwrap().device_index[0] = Some(1);
        let f = evaluate(&[p], &[r], Tolerance::default());
        assert!(f.is_empty(), "{f:?}");
    }

    #[test]
    fn nvml_devices_are_matched_through_the_region_mapping() {
        // Region device 0 is NVML GPU 3 (CUDA_VISIBLE_DEVICES=3). An unhooked process of the
        // container holds 2 GiB there: bypass and, with the hooked one, over the limit.
        let snap = snapshot(GIB, vec![slot(0, 53, 153, 300 * MIB, 0)]);
        let r = with_nvml(
            region(snap, &[(0, SlotLiveness::Alive { host_pid: 53 })]),
            3,
        );
        let hooked = with_nvml_bytes(proc_(53, true, 0), 3, 300 * MIB);
        let rogue = with_nvml_bytes(proc_(54, false, 0), 3, 2 * GIB);
        let mut elsewhere = with_nvml_bytes(proc_(55, true, 0), 0, 8 * GIB);
        elsewhere.region = None;
        elsewhere.region_error = Some("no such file".into());
        let f = evaluate(&[hooked, rogue, elsewhere], &[r], Tolerance::default());
        let mut k: Vec<_> = f.iter().map(|f| (f.kind, f.reason, f.pid)).collect();
        k.sort();
        assert_eq!(
            k,
            vec![
                (FindingKind::Bypass, reason::NO_PRELOAD, Some(54)),
                (FindingKind::OverLimit, reason::NVML_ABOVE_LIMIT, None),
                // Hooked without a usable region: nothing of its 8 GiB is accounted.
                (FindingKind::Drift, reason::NVML_ABOVE_ACCOUNTED, Some(55)),
            ]
        );
        let o = f.iter().find(|f| f.kind == FindingKind::OverLimit).unwrap();
        assert_eq!(o.observed, Some(2 * GIB + 300 * MIB));
        assert!(o.detail.contains("NVML GPU 3"), "{}", o.detail);
    }

    #[test]
    fn human_sizes() {
        assert_eq!(human_bytes(12), "12 B");
        assert_eq!(human_bytes(1536), "1.5 KiB");
        assert_eq!(human_bytes(64 * MIB), "64.0 MiB");
    }
}
