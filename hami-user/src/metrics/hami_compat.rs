//! HAMi's vGPU monitor families (`--hami-compat`), with HAMi's names, label names and
//! `zone` label exactly as its monitor serves them in the release chosen with
//! `--hami-version` ([`HamiVersion`]), so that HAMi's dashboards, HAMi-WebUI and alerts keep
//! working for containers moved to hami-preload and once HAMi's monitor is removed. They live
//! in a registry of their own: the agent's `node` label (set on every family of its own) is
//! not HAMi's, and is not added to them (HAMi 2.10 puts a `node` label of its own on its
//! host GPU families; so does this module, with the same value).
//!
//! Facts from HAMi's monitor (`cmd/vGPUmonitor/metrics.go` and `main.go`, v2.9.0 and
//! v2.10.0): every family is registered under the constant label `zone="vGPU"`; the host GPU
//! families are read from NVML per device (`device_type` is `NVIDIA-` and the device's NVML
//! name); the container families come from each container's shared region; the older names
//! (`HostGPUMemoryUsage`, `vGPU_device_memory_usage_in_bytes`, ...) are those of v2.4-v2.8,
//! which 2.9 and 2.10 serve with `--legacy-metrics`.

use std::collections::HashMap;
use std::fmt;
use std::str::FromStr;

use prometheus::{GaugeVec, IntGaugeVec, Opts, Registry};

use super::families::{clamp, gauge_vec};
use super::series::{GpuSeries, RegionSeries};

/// The constant label HAMi's monitor registers every family under, and its value.
pub const ZONE: (&str, &str) = ("zone", "vGPU");

/// The HAMi release whose vGPU monitor the compat families imitate: the label sets differ
/// between 2.9 and 2.10 (2.10 adds `node` to the host GPU families, adds
/// `hami_host_gpu_memory_controller_utilization_ratio`, and drops the breakdown labels of
/// `hami_container_device_memory_bytes`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum HamiVersion {
    /// HAMi 2.9.x (also for 2.4-2.8, whose monitor served the older names only: those are
    /// served with either version).
    V2_9,
    /// HAMi 2.10.x (the latest release; the default).
    #[default]
    V2_10,
}

/// A `--hami-version` that is not one of the releases whose label sets are known.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown HAMi version {0:?}: expected 2.9 or 2.10 (a patch release or a leading v is accepted, e.g. v2.10.0; use 2.9 for 2.4-2.8)")]
pub struct HamiVersionError(pub String);

impl HamiVersion {
    /// Every version known, oldest first.
    pub const ALL: [HamiVersion; 2] = [HamiVersion::V2_9, HamiVersion::V2_10];

    /// `2.9` or `2.10`.
    pub fn as_str(self) -> &'static str {
        match self {
            HamiVersion::V2_9 => "2.9",
            HamiVersion::V2_10 => "2.10",
        }
    }
}

impl fmt::Display for HamiVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for HamiVersion {
    type Err = HamiVersionError;

    /// `2.9`, `2.10`, with an optional leading `v` and an optional patch number
    /// (`v2.10.0`, `2.9.1`).
    fn from_str(s: &str) -> Result<HamiVersion, HamiVersionError> {
        let t = s.trim();
        let t = t.strip_prefix('v').unwrap_or(t);
        let mut parts = t.split('.');
        let (major, minor, patch) = (parts.next(), parts.next(), parts.next());
        let numeric = |p: Option<&str>| {
            p.is_none_or(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
        };
        if parts.next().is_some() || !numeric(patch) {
            return Err(HamiVersionError(s.to_string()));
        }
        match (major, minor) {
            (Some("2"), Some("9")) => Ok(HamiVersion::V2_9),
            (Some("2"), Some("10")) => Ok(HamiVersion::V2_10),
            _ => Err(HamiVersionError(s.to_string())),
        }
    }
}

/// HAMi's current label names of the per-container families.
pub(super) const HAMI_LABELS: [&str; 5] = [
    "namespace",
    "pod",
    "container",
    "vdevice_index",
    "device_uuid",
];
/// HAMi's older label names of the per-container families.
pub(super) const HAMI_LEGACY_LABELS: [&str; 5] = [
    "podnamespace",
    "podname",
    "ctrname",
    "vdeviceid",
    "deviceuuid",
];
/// The breakdown labels of `hami_container_device_memory_bytes` (2.9 only).
const BREAKDOWN_LABELS: [&str; 4] = ["context_size", "module_size", "buffer_size", "offset"];
/// The breakdown labels of `Device_memory_desc_of_container`.
const LEGACY_BREAKDOWN_LABELS: [&str; 4] = ["context", "module", "data", "offset"];

/// Labels of the host GPU families (`hami_host_gpu_memory_used_bytes`,
/// `hami_host_gpu_utilization_ratio`) in `v`.
pub(super) fn host_labels(v: HamiVersion) -> Vec<&'static str> {
    let mut l = match v {
        HamiVersion::V2_9 => vec![],
        HamiVersion::V2_10 => vec!["node"],
    };
    l.extend(["device_index", "device_uuid", "device_type"]);
    l
}

/// Labels of the older host GPU families (`HostGPUMemoryUsage`, `HostCoreUtilization`).
pub(super) fn legacy_host_labels(v: HamiVersion) -> Vec<&'static str> {
    let mut l = match v {
        HamiVersion::V2_9 => vec![],
        HamiVersion::V2_10 => vec!["nodeid"],
    };
    l.extend(["deviceidx", "deviceuuid", "devicetype"]);
    l
}

/// Labels of `hami_container_device_memory_bytes` in `v`.
fn desc_labels(v: HamiVersion) -> Vec<&'static str> {
    let mut l = HAMI_LABELS.to_vec();
    if v == HamiVersion::V2_9 {
        l.extend(BREAKDOWN_LABELS);
    }
    l
}

/// Every HAMi family the agent serves with `--hami-compat` for `v` (without `zone`, which
/// every one of them carries).
pub(super) fn families(v: HamiVersion) -> Vec<&'static str> {
    let mut f = vec![
        "hami_host_gpu_memory_used_bytes",
        "hami_host_gpu_utilization_ratio",
        "hami_vgpu_memory_used_bytes",
        "hami_vgpu_memory_limit_bytes",
        "hami_container_device_memory_bytes",
        "hami_container_device_utilization_ratio",
        "hami_vgpu_memory_context_bytes",
        "hami_vgpu_memory_module_bytes",
        "hami_vgpu_memory_buffer_bytes",
        "HostGPUMemoryUsage",
        "HostCoreUtilization",
        "vGPU_device_memory_usage_in_bytes",
        "vGPU_device_memory_limit_in_bytes",
        "Device_memory_desc_of_container",
        "Device_utilization_desc_of_container",
    ];
    if v == HamiVersion::V2_10 {
        f.push("hami_host_gpu_memory_controller_utilization_ratio");
    }
    f
}

/// HAMi's families and their registry.
pub(super) struct HamiCompat {
    /// Their own registry (`zone`, no agent `node`).
    pub(super) registry: Registry,
    /// The release imitated.
    version: HamiVersion,
    /// The node's name (the `node`/`nodeid` value of 2.10's host GPU families).
    node: String,
    /// `hami_vgpu_memory_used_bytes` (current names).
    used: IntGaugeVec,
    /// `hami_vgpu_memory_limit_bytes` (current names).
    limit: IntGaugeVec,
    /// `vGPU_device_memory_usage_in_bytes` (older names).
    legacy_used: IntGaugeVec,
    /// `vGPU_device_memory_limit_in_bytes` (older names).
    legacy_limit: IntGaugeVec,
    /// `hami_container_device_utilization_ratio`: the container's SM utilisation of the
    /// device, percent (0-100 per busy process, summed, as HAMi-core records it).
    util: GaugeVec,
    /// `Device_utilization_desc_of_container` (older name of the previous).
    legacy_util: GaugeVec,
    /// The memory breakdown families.
    breakdown: HamiBreakdown,
    /// The host GPU families.
    host: HamiHost,
}

fn float_gauge_vec(
    r: &Registry,
    name: &str,
    help: &str,
    labels: &[&str],
) -> prometheus::Result<GaugeVec> {
    let g = GaugeVec::new(Opts::new(name, help), labels)?;
    r.register(Box::new(g.clone()))?;
    Ok(g)
}

impl HamiCompat {
    /// Creates and registers HAMi's families as HAMi `version`'s monitor serves them;
    /// `node` is the node's name.
    pub(super) fn new(version: HamiVersion, node: &str) -> prometheus::Result<HamiCompat> {
        let zone = HashMap::from([(ZONE.0.to_string(), ZONE.1.to_string())]);
        let r = Registry::new_custom(None, Some(zone))?;
        Ok(HamiCompat {
            version,
            node: node.to_string(),
            used: gauge_vec(
                &r,
                "hami_vgpu_memory_used_bytes",
                "vGPU device memory usage in bytes (HAMi-compatible; from hami-preload's region)",
                &HAMI_LABELS,
            )?,
            limit: gauge_vec(
                &r,
                "hami_vgpu_memory_limit_bytes",
                "vGPU device memory limit in bytes (HAMi-compatible; from hami-preload's region)",
                &HAMI_LABELS,
            )?,
            legacy_used: gauge_vec(
                &r,
                "vGPU_device_memory_usage_in_bytes",
                "vGPU device usage (HAMi-compatible, older name)",
                &HAMI_LEGACY_LABELS,
            )?,
            legacy_limit: gauge_vec(
                &r,
                "vGPU_device_memory_limit_in_bytes",
                "vGPU device limit (HAMi-compatible, older name)",
                &HAMI_LEGACY_LABELS,
            )?,
            util: float_gauge_vec(
                &r,
                "hami_container_device_utilization_ratio",
                "Container SM utilisation of the device, 0-100 per busy process, summed (HAMi-compatible: NVML's per-process SM utilisation of the container's processes, mean over the share window)",
                &HAMI_LABELS,
            )?,
            legacy_util: float_gauge_vec(
                &r,
                "Device_utilization_desc_of_container",
                "Container device utilization description (HAMi-compatible, older name: the container's measured SM utilisation of the device, percent)",
                &HAMI_LEGACY_LABELS,
            )?,
            breakdown: HamiBreakdown::new(&r, version)?,
            host: HamiHost::new(&r, version)?,
            registry: r,
        })
    }

    /// Removes every per-container series (each scan sets them afresh).
    pub(super) fn reset(&self) {
        for f in [
            &self.used,
            &self.limit,
            &self.legacy_used,
            &self.legacy_limit,
        ] {
            f.reset();
        }
        self.util.reset();
        self.legacy_util.reset();
        self.breakdown.reset();
    }

    /// Sets one region's device.
    pub(super) fn set(&self, s: &RegionSeries) {
        let dev = s.device.to_string();
        let id = &s.identity;
        let h = [
            id.namespace.as_str(),
            id.pod.as_str(),
            id.container.as_str(),
            dev.as_str(),
            s.uuid.as_str(),
        ];
        // HAMi's monitor reports "used" as everything the container holds on the device
        // (context, modules, data, pools, other): the region's accounted total.
        self.used.with_label_values(&h).set(clamp(s.accounted));
        self.limit.with_label_values(&h).set(clamp(s.limit));
        self.legacy_used
            .with_label_values(&h)
            .set(clamp(s.accounted));
        self.legacy_limit.with_label_values(&h).set(clamp(s.limit));
        // Unknown (NVML gave no figure) is no series, rather than HAMi's 0.
        if let Some(share) = s.compute_share {
            self.util.with_label_values(&h).set(share);
            self.legacy_util.with_label_values(&h).set(share);
        }
        self.breakdown.set(&h, s);
    }

    /// Replaces the host GPU series with `gpus`'.
    pub(super) fn set_gpus(&self, gpus: &[GpuSeries]) {
        self.host.set(gpus, self.version, &self.node);
    }
}

/// HAMi's memory breakdown families, as its vGPU monitor serves them (the older name
/// `Device_memory_desc_of_container` as in v2.4.0-v2.8.x and with `--legacy-metrics`).
struct HamiBreakdown {
    /// The release imitated.
    version: HamiVersion,
    /// `hami_vgpu_memory_context_bytes`.
    context: IntGaugeVec,
    /// `hami_vgpu_memory_module_bytes`.
    module: IntGaugeVec,
    /// `hami_vgpu_memory_buffer_bytes`.
    buffer: IntGaugeVec,
    /// `hami_container_device_memory_bytes` (the total; in 2.9 the parts as labels).
    desc: IntGaugeVec,
    /// `Device_memory_desc_of_container` (older name and labels).
    legacy_desc: IntGaugeVec,
}

impl HamiBreakdown {
    fn new(r: &Registry, version: HamiVersion) -> prometheus::Result<HamiBreakdown> {
        let mut legacy_labels = HAMI_LEGACY_LABELS.to_vec();
        legacy_labels.extend(LEGACY_BREAKDOWN_LABELS);
        Ok(HamiBreakdown {
            version,
            context: gauge_vec(
                r,
                "hami_vgpu_memory_context_bytes",
                "vGPU device context memory in bytes (HAMi-compatible; from hami-preload's region)",
                &HAMI_LABELS,
            )?,
            module: gauge_vec(
                r,
                "hami_vgpu_memory_module_bytes",
                "vGPU device module memory in bytes (HAMi-compatible; from hami-preload's region)",
                &HAMI_LABELS,
            )?,
            buffer: gauge_vec(
                r,
                "hami_vgpu_memory_buffer_bytes",
                "vGPU device buffer (data and pool) memory in bytes (HAMi-compatible; from hami-preload's region)",
                &HAMI_LABELS,
            )?,
            desc: gauge_vec(
                r,
                "hami_container_device_memory_bytes",
                match version {
                    HamiVersion::V2_9 => "Container device memory in bytes with its breakdown as labels (HAMi-compatible)",
                    HamiVersion::V2_10 => "Container device memory in bytes (HAMi-compatible)",
                },
                &desc_labels(version),
            )?,
            legacy_desc: gauge_vec(
                r,
                "Device_memory_desc_of_container",
                "Container device memory description (HAMi-compatible, older name)",
                &legacy_labels,
            )?,
        })
    }

    fn reset(&self) {
        for f in [
            &self.context,
            &self.module,
            &self.buffer,
            &self.desc,
            &self.legacy_desc,
        ] {
            f.reset();
        }
    }

    fn set(&self, h: &[&str; 5], s: &RegionSeries) {
        self.context.with_label_values(h).set(clamp(s.context));
        self.module.with_label_values(h).set(clamp(s.module));
        self.buffer.with_label_values(h).set(clamp(s.buffer));
        // HAMi's offset: the total less its three parts (here: backstop and other memory).
        let offset = s
            .accounted
            .saturating_sub(s.context)
            .saturating_sub(s.module)
            .saturating_sub(s.buffer);
        let parts = [
            s.context.to_string(),
            s.module.to_string(),
            s.buffer.to_string(),
            offset.to_string(),
        ];
        let mut l: Vec<&str> = h.to_vec();
        l.extend(parts.iter().map(String::as_str));
        let desc: &[&str] = match self.version {
            HamiVersion::V2_9 => &l,
            HamiVersion::V2_10 => h,
        };
        self.desc.with_label_values(desc).set(clamp(s.accounted));
        self.legacy_desc
            .with_label_values(&l)
            .set(clamp(s.accounted));
    }
}

/// HAMi's host GPU families: the whole GPU as NVML reports it, per device.
struct HamiHost {
    /// `hami_host_gpu_memory_used_bytes`.
    memory_used: IntGaugeVec,
    /// `hami_host_gpu_utilization_ratio`.
    utilization: IntGaugeVec,
    /// `hami_host_gpu_memory_controller_utilization_ratio` (2.10).
    memory_controller: Option<IntGaugeVec>,
    /// `HostGPUMemoryUsage` (older name).
    legacy_memory_used: IntGaugeVec,
    /// `HostCoreUtilization` (older name).
    legacy_utilization: IntGaugeVec,
}

impl HamiHost {
    fn new(r: &Registry, version: HamiVersion) -> prometheus::Result<HamiHost> {
        let l = host_labels(version);
        let legacy = legacy_host_labels(version);
        let memory_controller = match version {
            HamiVersion::V2_9 => None,
            HamiVersion::V2_10 => Some(gauge_vec(
                r,
                "hami_host_gpu_memory_controller_utilization_ratio",
                "GPU memory controller utilization ratio, 0-100 (HAMi-compatible: NVML nvmlDeviceGetUtilizationRates memory)",
                &["device_index", "device_uuid", "device_type"],
            )?),
        };
        Ok(HamiHost {
            memory_used: gauge_vec(
                r,
                "hami_host_gpu_memory_used_bytes",
                "GPU device memory usage in bytes (HAMi-compatible: NVML nvmlDeviceGetMemoryInfo used)",
                &l,
            )?,
            utilization: gauge_vec(
                r,
                "hami_host_gpu_utilization_ratio",
                "GPU core utilization ratio, 0-100 (HAMi-compatible: NVML nvmlDeviceGetUtilizationRates gpu)",
                &l,
            )?,
            memory_controller,
            legacy_memory_used: gauge_vec(
                r,
                "HostGPUMemoryUsage",
                "GPU device memory usage (HAMi-compatible, older name)",
                &legacy,
            )?,
            legacy_utilization: gauge_vec(
                r,
                "HostCoreUtilization",
                "GPU core utilization (HAMi-compatible, older name)",
                &legacy,
            )?,
        })
    }

    /// Replaces every series with `gpus`': a GPU without a UUID or a name (HAMi's monitor
    /// skips those too) or a figure NVML did not give has no series.
    fn set(&self, gpus: &[GpuSeries], version: HamiVersion, node: &str) {
        let mut all = vec![
            &self.memory_used,
            &self.utilization,
            &self.legacy_memory_used,
            &self.legacy_utilization,
        ];
        all.extend(self.memory_controller.as_ref());
        for f in all {
            f.reset();
        }
        for g in gpus {
            let Some(name) = g.name.as_deref().filter(|_| !g.uuid.is_empty()) else {
                continue;
            };
            let index = g.index.to_string();
            let device_type = format!("NVIDIA-{name}");
            let dev = [index.as_str(), g.uuid.as_str(), device_type.as_str()];
            let mut l: Vec<&str> = match version {
                HamiVersion::V2_9 => vec![],
                HamiVersion::V2_10 => vec![node],
            };
            l.extend(dev);
            if let Some(used) = g.memory_used {
                self.memory_used.with_label_values(&l).set(clamp(used));
                self.legacy_memory_used
                    .with_label_values(&l)
                    .set(clamp(used));
            }
            if let Some(u) = g.utilization {
                self.utilization.with_label_values(&l).set(i64::from(u));
                self.legacy_utilization
                    .with_label_values(&l)
                    .set(i64::from(u));
            }
            if let (Some(f), Some(u)) = (&self.memory_controller, g.memory_utilization) {
                f.with_label_values(&dev).set(i64::from(u));
            }
        }
    }
}
