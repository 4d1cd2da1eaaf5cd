//! What a scan hands the registry ([`super::Metrics`]): the series of regions, GPUs, processes
//! and findings, and the hook counts.

use crate::findings::FindingKind;
use crate::identity::Identity;

/// One region on one device it covers, with the names of its container.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RegionSeries {
    /// Whose region it is.
    pub identity: Identity,
    /// Region path as its processes name it.
    pub region: String,
    /// The container's device index (the region's; CUDA's numbering there without
    /// `CUDA_VISIBLE_DEVICES`).
    pub device: u32,
    /// GPU UUID (`GPU-...`), empty when neither the region nor NVML names it.
    pub uuid: String,
    /// Limit (0 = unlimited).
    pub limit: u64,
    /// Accounted, all kinds (what counts against the limit).
    pub accounted: u64,
    /// Accounted data only (comparable with observed).
    pub accounted_data: u64,
    /// Observed live data bytes of the region's processes.
    pub observed: u64,
    /// The compute share the container is held to on the device, in percent (0 = none).
    pub compute_limit: u32,
    /// The measured compute share in percent of the device (NVML, mean over the share
    /// window); `None` when NVML gave no utilisation for the device.
    pub compute_share: Option<f64>,
    /// Device time (ns) the launch gate counted for the container (only grows).
    pub compute_consumed_ns: u64,
    /// Times the container's processes waited at the launch gate.
    pub compute_throttled: u64,
    /// Time (ns) they waited.
    pub compute_throttled_ns: u64,
    /// Memory requests the preload refused on the device for the container (the region's
    /// `DeviceCompute::refusals`; only grows).
    pub quota_refusals: u64,
    /// What the agent's arbiter lets the container use now, percent of the device (`None`:
    /// no decision).
    pub compute_grant: Option<f64>,
    /// Of the grant, the percent above the share (idle time lent).
    pub compute_lent: f64,
    /// Held back while a container of a higher priority is busy on the GPU.
    pub compute_held: bool,
    /// The container's turn of the GPU's period while several contend, percent (0: none).
    pub compute_turn: f64,
    /// The container's `CUDA_TASK_PRIORITY` (0 the highest).
    pub priority: u32,
    /// Accounted context bytes (HAMi's `context`).
    pub context: u64,
    /// Accounted module bytes (HAMi's `module`).
    pub module: u64,
    /// Accounted data and pool bytes (HAMi's `buffer`: what the application allocated).
    pub buffer: u64,
}

/// One GPU as NVML sees it, for the `hami_gpu_*` families.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GpuSeries {
    /// NVML index.
    pub index: u32,
    /// UUID (`GPU-...`), empty when unknown.
    pub uuid: String,
    /// Device utilisation in percent (`nvmlDeviceGetUtilizationRates`), when NVML gave it.
    pub utilization: Option<u32>,
    /// Total memory in bytes (`nvmlDeviceGetMemoryInfo`), when NVML gave it.
    pub memory_total: Option<u64>,
    /// Used memory in bytes (`nvmlDeviceGetMemoryInfo`), when NVML gave it.
    pub memory_used: Option<u64>,
    /// Product name (`nvmlDeviceGetName`), when NVML gave it (HAMi's `device_type`).
    pub name: Option<String>,
    /// Memory controller utilisation in percent (`nvmlDeviceGetUtilizationRates`,
    /// `memory`), when NVML gave it.
    pub memory_utilization: Option<u32>,
}

/// One process for the opt-in per-process gauge.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcessSample {
    /// Host pid.
    pub pid: u32,
    /// Whose process it is.
    pub identity: Identity,
    /// Observed live bytes.
    pub observed: u64,
    /// NVML SM utilisation at the latest sample, percent of a device summed over the GPUs
    /// whose utilisation was read (`None`: unknown).
    pub sm_util: Option<u32>,
}

/// One standing finding with the workload it is about, for `hami_finding`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FindingSeries {
    /// Its kind.
    pub kind: FindingKind,
    /// Its stable reason ([`crate::findings::reason`]: a fixed set).
    pub reason: &'static str,
    /// The container it is about (its process's, or its region's).
    pub identity: Identity,
}

/// Tracked GPU processes by hook (`hami_processes_by_hook`), for watching a migration.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HookCounts {
    /// hami-preload mapped (under its own name or as HAMi's `libvgpu.so`).
    pub hami_rs: u64,
    /// HAMi-core's `libvgpu.so` mapped.
    pub hami_core: u64,
    /// Neither.
    pub none: u64,
    /// `CUDA_OVERSUBSCRIBE` set, refused by hami-preload (`hami_processes_oversubscribe_refused`).
    pub oversubscribe: u64,
}
