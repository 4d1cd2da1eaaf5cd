//! A finding (its kind, reason and figures), the tolerances the rules judge with, and how
//! sizes are written in findings.

use serde::Serialize;

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

/// `unlimited (0)`, or the limit in human units and bytes.
pub(super) fn human_or_unlimited(b: u64) -> String {
    if b == 0 {
        "unlimited (0)".to_string()
    } else {
        format!("{} ({b} bytes)", human_bytes(b))
    }
}
