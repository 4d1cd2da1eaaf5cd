//! The Prometheus registry: every metric the agent exports, their labels and how a scan
//! replaces them. Served by [`crate::http`].
//!
//! Labels are the names dcgm-exporter and HAMi use, so that joins need no `label_replace`:
//! the workload is `namespace`, `pod` and `container`, the GPU is `UUID` (dcgm-exporter's
//! spelling) and, on the per-GPU families, `gpu` (the NVML index, as dcgm-exporter's); the
//! agent sets `node` on every family of its own (`--node-name`). They are meant to be scraped
//! with `honor_labels: true` (the chart's ServiceMonitor), so that they win over the target's
//! labels of the same names. The HAMi-compatible families (opt-in, [`hami_compat`]) use
//! HAMi's own label names and carry no `node`, so that HAMi's dashboards see what they always
//! saw. The whole list, with types, units, labels and cardinality bounds, is in
//! `docs/agent.md`.

mod families;
mod hami_compat;
mod series;
mod update;

pub use hami_compat::{HamiVersion, HamiVersionError, ZONE as HAMI_ZONE};
pub use series::{FindingSeries, GpuSeries, HookCounts, ProcessSample, RegionSeries};

use std::collections::{BTreeMap, HashMap};

use prometheus::{
    CounterVec, Encoder, GaugeVec, Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry,
};

use crate::findings::FindingKind;
use families::{clamp, counter, gauge, gauge_vec};
use hami_compat::HamiCompat;

/// Default listen address of `/metrics`.
pub const DEFAULT_METRICS_ADDR: &str = "0.0.0.0:9494";

/// Labels of the per-container, per-device families. `cuda_device` is the container's device
/// index (CUDA's numbering there without `CUDA_VISIBLE_DEVICES`, HAMi's `vdevice_index`), not
/// dcgm-exporter's `device` (`nvidia0`) nor its `gpu` (the node's NVML index).
pub const CONTAINER_LABELS: [&str; 6] = [
    "namespace",
    "pod",
    "container",
    "region",
    "cuda_device",
    "UUID",
];

/// Labels of the per-process families (opt-in).
pub const PROCESS_LABELS: [&str; 4] = ["pid", "namespace", "pod", "container"];

/// Labels of the per-GPU families: dcgm-exporter's `UUID` and `gpu` (the NVML index).
pub const GPU_LABELS: [&str; 2] = ["UUID", "gpu"];

/// Labels of `hami_finding`: the kind, its reason and the finding's workload.
pub const FINDING_LABELS: [&str; 5] = ["kind", "reason", "namespace", "pod", "container"];

/// The label the agent sets on every family of its own: the node's name.
pub const NODE_LABEL: &str = "node";

/// Errors building the registry.
#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    /// A metric could not be created or registered (a bug: names are fixed).
    #[error("metrics registry: {0}")]
    Registry(#[from] prometheus::Error),
}

/// What to export beyond the always-on families, and the node's name.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MetricsOptions {
    /// `hami_process_observed_bytes` per pid (one series per GPU process: opt-in).
    pub per_process: bool,
    /// HAMi's vGPU monitor families (`hami_vgpu_memory_*`, `hami_host_gpu_*`,
    /// `hami_container_device_*`, their older names).
    pub hami_compat: bool,
    /// The HAMi release whose monitor's label sets they follow.
    pub hami_version: HamiVersion,
    /// HAMi's families are served on a port of their own (`--hami-metrics-addr`, as HAMi's
    /// monitor serves them on 9394): [`Metrics::render_hami`] has them, [`Metrics::render`]
    /// not, so that a Prometheus scraping both ports stores each series once.
    pub hami_separate: bool,
    /// The node's name, the `node` label of every family but HAMi's (`run` always sets
    /// one: `--node-name`, `NODE_NAME`, the host name); empty: no `node` label.
    pub node: String,
}

/// Every metric the agent exports.
pub struct Metrics {
    registry: Registry,
    opts: MetricsOptions,
    /// `hami_container_limit_bytes`.
    pub limit: IntGaugeVec,
    /// `hami_container_accounted_bytes` (all kinds).
    pub accounted: IntGaugeVec,
    /// `hami_container_accounted_data_bytes`.
    pub accounted_data: IntGaugeVec,
    /// `hami_container_observed_bytes`.
    pub observed: IntGaugeVec,
    /// `hami_container_compute_limit_percent`.
    pub compute_limit: IntGaugeVec,
    /// `hami_container_compute_share_percent`.
    pub compute_share: GaugeVec,
    /// `hami_container_compute_grant_percent`.
    pub compute_grant: GaugeVec,
    /// `hami_container_compute_lent_percent`.
    pub compute_lent: GaugeVec,
    /// `hami_container_compute_held`.
    pub compute_held: IntGaugeVec,
    /// `hami_container_compute_turn_percent`.
    pub compute_turn: GaugeVec,
    /// `hami_container_priority`.
    pub priority: IntGaugeVec,
    /// `hami_container_compute_seconds_total`.
    pub compute_seconds: CounterVec,
    /// `hami_container_compute_throttled_total`.
    pub compute_throttled: CounterVec,
    /// `hami_container_compute_throttled_seconds_total`.
    pub compute_throttled_seconds: CounterVec,
    /// `hami_container_quota_refusals_total`.
    pub quota_refusals: CounterVec,
    /// `hami_gpu_utilization_percent{UUID,gpu}`.
    pub gpu_utilization: IntGaugeVec,
    /// `hami_gpu_memory_total_bytes{UUID,gpu}`.
    pub gpu_memory_total: IntGaugeVec,
    /// `hami_gpu_memory_used_bytes{UUID,gpu}`.
    pub gpu_memory_used: IntGaugeVec,
    /// `hami_process_observed_bytes{pid,namespace,pod,container}` (opt-in).
    pub process_observed: IntGaugeVec,
    /// `hami_process_sm_utilization_percent{pid,namespace,pod,container}` (opt-in).
    pub process_sm: IntGaugeVec,
    /// `hami_findings_standing{kind}`: findings standing now.
    pub findings: IntGaugeVec,
    /// `hami_finding{kind,reason,namespace,pod,container}`: findings standing now, by
    /// workload (only label sets that stand).
    pub finding: IntGaugeVec,
    /// `hami_findings_total{kind}`: findings raised since start.
    pub findings_total: IntCounterVec,
    /// `hami_events_total{kind}`: events consumed from the ring buffer.
    pub events: IntCounterVec,
    /// `hami_events_dropped_total`: events the kernel side could not queue.
    pub dropped: IntCounter,
    /// `hami_libcuda_attached`: distinct libcuda files with probes attached.
    pub libcuda_attached: IntGauge,
    /// `hami_processes_tracked`: GPU processes the agent tracks.
    pub processes: IntGauge,
    /// `hami_regions_tracked`: regions mapped now.
    pub regions: IntGauge,
    /// `hami_regions_released_total`: regions released (closed) because no process uses them.
    pub regions_released: IntCounter,
    /// `hami_region_errors`: tracked processes whose region cannot be opened now.
    pub region_errors: IntGauge,
    /// `hami_slots_reclaimed_total`: leaked slots released with `--reclaim`.
    pub reclaimed: IntCounter,
    /// `hami_processes_unclassified_total`: processes that allocated through libcuda and were
    /// gone or exiting before the agent could read whether they map the preload.
    pub unclassified: IntCounter,
    /// `hami_nvml_available`: 1 when NVML is loaded.
    pub nvml_available: IntGauge,
    /// `hami_nvml_errors_total`: NVML device queries that failed.
    pub nvml_errors: IntCounter,
    /// `hami_processes_by_hook{hook}`: GPU processes by hook (`hami_rs`, `hami_core`, `none`).
    pub by_hook: IntGaugeVec,
    /// `hami_processes_oversubscribe_refused`: GPU processes whose `CUDA_OVERSUBSCRIBE` is
    /// refused (the quota stays physical).
    pub oversubscribe_refused: IntGauge,
    /// `hami_tick_duration_seconds`: how long each periodic scan (regions, `/proc`, findings,
    /// metrics) took.
    pub tick_duration: Histogram,
    /// HAMi's families (with `hami_compat`), in their own registry.
    hami: Option<HamiCompat>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").field("opts", &self.opts).finish()
    }
}

/// Buckets of `hami_tick_duration_seconds` (seconds): a tick of an idle node takes about a
/// millisecond, one of 1000 regions and 5000 processes tens to hundreds (docs/benchmarks.md).
pub const TICK_BUCKETS: [f64; 12] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
];

impl Metrics {
    /// Creates and registers every metric.
    pub fn new(opts: MetricsOptions) -> Result<Metrics, MetricsError> {
        let node = (!opts.node.is_empty())
            .then(|| HashMap::from([(NODE_LABEL.to_string(), opts.node.clone())]));
        let r = Registry::new_custom(None, node)?;
        let cl = &CONTAINER_LABELS;
        let limit = gauge_vec(
            &r,
            "hami_container_limit_bytes",
            "Region memory limit per device in bytes (0 = unlimited)",
            cl,
        )?;
        let accounted = gauge_vec(
            &r,
            "hami_container_accounted_bytes",
            "Bytes the region accounts per device, all kinds (context, module, data, pool, other): what counts against the limit",
            cl,
        )?;
        let accounted_data = gauge_vec(
            &r,
            "hami_container_accounted_data_bytes",
            "Data bytes the region accounts per device (comparable with observed)",
            cl,
        )?;
        let observed = gauge_vec(
            &r,
            "hami_container_observed_bytes",
            "Live data bytes the probes observed for the region's processes per device",
            cl,
        )?;
        let compute_limit = gauge_vec(
            &r,
            "hami_container_compute_limit_percent",
            "Compute share of the device the region holds the container to, in percent (CUDA_DEVICE_SM_LIMIT; 0 = no compute limit)",
            cl,
        )?;
        let compute_share = GaugeVec::new(
            Opts::new(
                "hami_container_compute_share_percent",
                "Measured compute share of the device, in percent: NVML's SM utilisation of the container's processes, summed, mean over the share window (5 s)",
            ),
            cl,
        )?;
        r.register(Box::new(compute_share.clone()))?;
        let fgauge = |name: &str, help: &str| -> prometheus::Result<GaugeVec> {
            let g = GaugeVec::new(Opts::new(name, help), cl)?;
            r.register(Box::new(g.clone()))?;
            Ok(g)
        };
        let compute_grant = fgauge(
            "hami_container_compute_grant_percent",
            "What the agent's arbiter lets the container use of the device now, in percent (default policy: the share plus idle time lent, 0 while held for a higher priority; force: the share; absent without a share or with the arbiter off)",
        )?;
        let compute_lent = fgauge(
            "hami_container_compute_lent_percent",
            "Of the arbiter's grant, the percent of the device above the container's share: idle time lent to it",
        )?;
        let compute_turn = fgauge(
            "hami_container_compute_turn_percent",
            "The container's turn of every 40 ms while several containers contend for the GPU, in percent of that period (its launches wait for it); 0: no turn, it launches at any time",
        )?;
        let compute_held = gauge_vec(
            &r,
            "hami_container_compute_held",
            "1 while the arbiter holds the container back (suspended) because a container of a higher CUDA_TASK_PRIORITY is busy on the GPU, else 0",
            cl,
        )?;
        let priority = gauge_vec(
            &r,
            "hami_container_priority",
            "The container's CUDA_TASK_PRIORITY as its region records it (0 the highest; HAMi's default 1)",
            cl,
        )?;
        let counter_vec = |name: &str, help: &str| -> prometheus::Result<CounterVec> {
            let c = CounterVec::new(Opts::new(name, help), cl)?;
            r.register(Box::new(c.clone()))?;
            Ok(c)
        };
        let compute_seconds = counter_vec(
            "hami_container_compute_seconds_total",
            "Device time the container's metered work used, in seconds (the launch gate's count, from the region)",
        )?;
        let compute_throttled = counter_vec(
            "hami_container_compute_throttled_total",
            "Times a process of the container waited at the launch gate (over its compute share)",
        )?;
        let compute_throttled_seconds = counter_vec(
            "hami_container_compute_throttled_seconds_total",
            "Time the container's processes waited at the launch gate, in seconds",
        )?;
        let quota_refusals = counter_vec(
            "hami_container_quota_refusals_total",
            "Memory requests the preload refused with CUDA_ERROR_OUT_OF_MEMORY on the device (over the container's quota or failing closed), from the region",
        )?;
        let gpu_utilization = gauge_vec(
            &r,
            "hami_gpu_utilization_percent",
            "Utilisation of the whole GPU in percent (NVML nvmlDeviceGetUtilizationRates)",
            &GPU_LABELS,
        )?;
        let gpu_memory_total = gauge_vec(
            &r,
            "hami_gpu_memory_total_bytes",
            "Memory of the whole GPU in bytes (NVML nvmlDeviceGetMemoryInfo total)",
            &GPU_LABELS,
        )?;
        let gpu_memory_used = gauge_vec(
            &r,
            "hami_gpu_memory_used_bytes",
            "Memory used on the whole GPU in bytes, every process and the driver's own (NVML nvmlDeviceGetMemoryInfo used)",
            &GPU_LABELS,
        )?;
        let process_sm = gauge_vec(
            &r,
            "hami_process_sm_utilization_percent",
            "NVML SM utilisation per process at the latest sample, percent of a device (only with --per-process-metrics)",
            &PROCESS_LABELS,
        )?;
        let process_observed = gauge_vec(
            &r,
            "hami_process_observed_bytes",
            "Live data bytes observed per process (only with --per-process-metrics)",
            &PROCESS_LABELS,
        )?;
        let findings = gauge_vec(
            &r,
            "hami_findings_standing",
            "Findings standing now, by kind",
            &["kind"],
        )?;
        let finding = gauge_vec(
            &r,
            "hami_finding",
            "Findings standing now, by kind, reason and workload (only those standing: a finding that clears takes its series with it)",
            &FINDING_LABELS,
        )?;
        let findings_total = IntCounterVec::new(
            Opts::new(
                "hami_findings_total",
                "Findings raised since the agent started, by kind",
            ),
            &["kind"],
        )?;
        r.register(Box::new(findings_total.clone()))?;
        let events = IntCounterVec::new(
            Opts::new("hami_events_total", "Probe events consumed, by kind"),
            &["kind"],
        )?;
        r.register(Box::new(events.clone()))?;
        let dropped = counter(
            &r,
            "hami_events_dropped_total",
            "Probe events dropped because the ring buffer was full",
        )?;
        let libcuda_attached = gauge(
            &r,
            "hami_libcuda_attached",
            "Distinct libcuda files with probes attached",
        )?;
        let processes = gauge(&r, "hami_processes_tracked", "GPU processes tracked")?;
        let regions = gauge(&r, "hami_regions_tracked", "Shared regions mapped now")?;
        let regions_released = counter(
            &r,
            "hami_regions_released_total",
            "Regions released (closed) because none of their processes is left",
        )?;
        let region_errors = gauge(
            &r,
            "hami_region_errors",
            "Tracked processes whose region cannot be opened now",
        )?;
        let reclaimed = counter(
            &r,
            "hami_slots_reclaimed_total",
            "Leaked region slots released by --reclaim",
        )?;
        let unclassified = counter(
            &r,
            "hami_processes_unclassified_total",
            "Processes that allocated through libcuda and exited before the agent could read whether they map hami-preload (neither bypass nor hooked can be said)",
        )?;
        let nvml_available = gauge(&r, "hami_nvml_available", "1 when NVML is loaded")?;
        let nvml_errors = counter(
            &r,
            "hami_nvml_errors_total",
            "NVML device queries that failed (device handle, UUID or memory info)",
        )?;
        let by_hook = gauge_vec(
            &r,
            "hami_processes_by_hook",
            "GPU processes tracked, by the library that hooks them: hami_rs (hami-preload), hami_core (HAMi-core), none",
            &["hook"],
        )?;
        for h in ["hami_rs", "hami_core", "none"] {
            by_hook.with_label_values(&[h]).set(0);
        }
        let oversubscribe_refused = gauge(
            &r,
            "hami_processes_oversubscribe_refused",
            "GPU processes whose CUDA_OVERSUBSCRIBE hami-preload refuses (their quota stays within physical memory)",
        )?;
        let tick_duration = Histogram::with_opts(
            HistogramOpts::new(
                "hami_tick_duration_seconds",
                "Time one periodic scan took (regions read, /proc refreshed, findings evaluated, metrics updated)",
            )
            .buckets(TICK_BUCKETS.to_vec()),
        )?;
        r.register(Box::new(tick_duration.clone()))?;
        // `hami_build_info` is one of HAMi's own families: this one is the agent's.
        let build = gauge_vec(
            &r,
            "hami_agent_build_info",
            "Always 1; the agent's version and the layout version it reads",
            &["version", "region_layout"],
        )?;
        build
            .with_label_values(&[
                env!("CARGO_PKG_VERSION"),
                &hami_abi::layout::VERSION.to_string(),
            ])
            .set(1);
        #[cfg(target_os = "linux")]
        r.register(Box::new(
            prometheus::process_collector::ProcessCollector::for_self(),
        ))?;
        let hami = if opts.hami_compat {
            Some(HamiCompat::new(opts.hami_version, &opts.node)?)
        } else {
            None
        };
        for k in FindingKind::ALL {
            findings.with_label_values(&[k.name()]).set(0);
            findings_total.with_label_values(&[k.name()]).inc_by(0);
        }
        Ok(Metrics {
            registry: r,
            opts,
            limit,
            accounted,
            accounted_data,
            observed,
            compute_limit,
            compute_grant,
            compute_lent,
            compute_held,
            compute_turn,
            priority,
            compute_share,
            compute_seconds,
            compute_throttled,
            compute_throttled_seconds,
            quota_refusals,
            gpu_utilization,
            gpu_memory_total,
            gpu_memory_used,
            process_observed,
            process_sm,
            findings,
            finding,
            findings_total,
            events,
            dropped,
            libcuda_attached,
            processes,
            regions,
            regions_released,
            unclassified,
            region_errors,
            reclaimed,
            nvml_available,
            nvml_errors,
            by_hook,
            oversubscribe_refused,
            tick_duration,
            hami,
        })
    }

    /// The options it was built with.
    pub fn options(&self) -> &MetricsOptions {
        &self.opts
    }

    /// Every family gathered: the agent's, then HAMi's (with `hami_compat`).
    fn gather(&self) -> Vec<prometheus::proto::MetricFamily> {
        let mut v = self.registry.gather();
        if let Some(h) = &self.hami {
            v.extend(h.registry.gather());
        }
        v
    }

    /// The text exposition format (version 0.0.4) of `families`.
    fn encode(families: &[prometheus::proto::MetricFamily]) -> String {
        let mut buf = Vec::new();
        let enc = prometheus::TextEncoder::new();
        // Encoding fixed, valid metric families into a Vec cannot fail.
        if enc.encode(families, &mut buf).is_err() {
            return String::new();
        }
        String::from_utf8_lossy(&buf).into_owned()
    }

    /// The text exposition format (version 0.0.4) of the agent's `/metrics`: its own
    /// families and, with `hami_compat` unless `hami_separate`, HAMi's.
    pub fn render(&self) -> String {
        if self.opts.hami_separate {
            Self::encode(&self.registry.gather())
        } else {
            Self::encode(&self.gather())
        }
    }

    /// HAMi's families alone, as HAMi's monitor serves them on its port (empty without
    /// `hami_compat`).
    pub fn render_hami(&self) -> String {
        match &self.hami {
            Some(h) => Self::encode(&h.registry.gather()),
            None => String::new(),
        }
    }

    /// Names of every family registered (those with labels appear in `render` once set).
    pub fn family_names(&self) -> Vec<String> {
        let mut v: Vec<String> = self.gather().iter().map(|f| f.name().to_string()).collect();
        // Labelled families without samples are not gathered.
        for f in [
            "hami_container_limit_bytes",
            "hami_container_accounted_bytes",
            "hami_container_accounted_data_bytes",
            "hami_container_observed_bytes",
            "hami_container_compute_limit_percent",
            "hami_container_compute_share_percent",
            "hami_container_compute_grant_percent",
            "hami_container_compute_lent_percent",
            "hami_container_compute_turn_percent",
            "hami_container_compute_held",
            "hami_container_priority",
            "hami_container_compute_seconds_total",
            "hami_container_compute_throttled_total",
            "hami_container_compute_throttled_seconds_total",
            "hami_container_quota_refusals_total",
            "hami_gpu_utilization_percent",
            "hami_gpu_memory_total_bytes",
            "hami_gpu_memory_used_bytes",
            "hami_process_observed_bytes",
            "hami_process_sm_utilization_percent",
            "hami_finding",
            "hami_events_total",
        ] {
            v.push(f.to_string());
        }
        if self.opts.hami_compat {
            v.extend(
                hami_compat::families(self.opts.hami_version)
                    .iter()
                    .map(|f| f.to_string()),
            );
        }
        v.sort();
        v.dedup();
        v
    }
}

#[cfg(test)]
mod tests;
