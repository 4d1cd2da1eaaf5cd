//! HAMi's vGPU monitor families (`--hami-compat`), with HAMi's names and label names exactly
//! as its monitor serves them, so that HAMi's dashboards and alerts keep working for
//! containers moved to hami-preload. They live in a registry of their own: the agent's
//! `node` label (set on every family of its own) is not HAMi's, and is not added to them.

use prometheus::{GaugeVec, IntGaugeVec, Opts, Registry};

use super::{clamp, gauge_vec, RegionSeries};

/// HAMi's current label names.
pub(super) const HAMI_LABELS: [&str; 5] = [
    "namespace",
    "pod",
    "container",
    "vdevice_index",
    "device_uuid",
];
/// HAMi's older label names.
pub(super) const HAMI_LEGACY_LABELS: [&str; 5] = [
    "podnamespace",
    "podname",
    "ctrname",
    "vdeviceid",
    "deviceuuid",
];

/// Every HAMi family the agent serves with `--hami-compat`.
pub(super) const FAMILIES: [&str; 10] = [
    "hami_vgpu_memory_used_bytes",
    "hami_vgpu_memory_limit_bytes",
    "vGPU_device_memory_usage_in_bytes",
    "vGPU_device_memory_limit_in_bytes",
    "Device_utilization_desc_of_container",
    "hami_vgpu_memory_context_bytes",
    "hami_vgpu_memory_module_bytes",
    "hami_vgpu_memory_buffer_bytes",
    "hami_container_device_memory_bytes",
    "Device_memory_desc_of_container",
];

/// HAMi's families and their registry.
pub(super) struct HamiCompat {
    /// Their own registry (no `node` label).
    pub(super) registry: Registry,
    /// `hami_vgpu_memory_used_bytes` (current names).
    used: IntGaugeVec,
    /// `hami_vgpu_memory_limit_bytes` (current names).
    limit: IntGaugeVec,
    /// `vGPU_device_memory_usage_in_bytes` (older names).
    legacy_used: IntGaugeVec,
    /// `vGPU_device_memory_limit_in_bytes` (older names).
    legacy_limit: IntGaugeVec,
    /// `Device_utilization_desc_of_container` (the container's SM utilisation of the
    /// device, percent).
    legacy_util: GaugeVec,
    /// The memory breakdown families.
    breakdown: HamiBreakdown,
}

impl HamiCompat {
    /// Creates and registers HAMi's families.
    pub(super) fn new() -> prometheus::Result<HamiCompat> {
        let r = Registry::new();
        let legacy_util = GaugeVec::new(
            Opts::new(
                "Device_utilization_desc_of_container",
                "Container device utilization description (HAMi-compatible: the container's measured compute share of the device, percent)",
            ),
            &HAMI_LEGACY_LABELS,
        )?;
        r.register(Box::new(legacy_util.clone()))?;
        Ok(HamiCompat {
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
            legacy_util,
            breakdown: HamiBreakdown::new(&r)?,
            registry: r,
        })
    }

    /// Removes every series (each scan sets them afresh).
    pub(super) fn reset(&self) {
        for f in [
            &self.used,
            &self.limit,
            &self.legacy_used,
            &self.legacy_limit,
        ] {
            f.reset();
        }
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
        if let Some(share) = s.compute_share {
            self.legacy_util.with_label_values(&h).set(share);
        }
        self.breakdown.set(&h, s);
    }
}

/// HAMi's memory breakdown families, as its vGPU monitor serves them (v2.9.0; the older
/// name `Device_memory_desc_of_container` as in v2.4.0-v2.5.x and with `--legacy-metrics`).
struct HamiBreakdown {
    /// `hami_vgpu_memory_context_bytes`.
    context: IntGaugeVec,
    /// `hami_vgpu_memory_module_bytes`.
    module: IntGaugeVec,
    /// `hami_vgpu_memory_buffer_bytes`.
    buffer: IntGaugeVec,
    /// `hami_container_device_memory_bytes` (the total; the parts as labels).
    desc: IntGaugeVec,
    /// `Device_memory_desc_of_container` (older name and labels).
    legacy_desc: IntGaugeVec,
}

impl HamiBreakdown {
    fn new(r: &Registry) -> prometheus::Result<HamiBreakdown> {
        let mut desc_labels = HAMI_LABELS.to_vec();
        desc_labels.extend(["context_size", "module_size", "buffer_size", "offset"]);
        let mut legacy_labels = HAMI_LEGACY_LABELS.to_vec();
        legacy_labels.extend(["context", "module", "data", "offset"]);
        Ok(HamiBreakdown {
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
                "Container device memory in bytes with its breakdown as labels (HAMi-compatible)",
                &desc_labels,
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
        self.desc.with_label_values(&l).set(clamp(s.accounted));
        self.legacy_desc
            .with_label_values(&l)
            .set(clamp(s.accounted));
    }
}
