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

mod hami_compat;

pub use hami_compat::{HamiVersion, HamiVersionError, ZONE as HAMI_ZONE};

use std::collections::{BTreeMap, HashMap};

use prometheus::{
    CounterVec, Encoder, GaugeVec, Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry,
};

use crate::findings::FindingKind;
use crate::identity::Identity;
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

fn gauge_vec(
    r: &Registry,
    name: &str,
    help: &str,
    labels: &[&str],
) -> prometheus::Result<IntGaugeVec> {
    let g = IntGaugeVec::new(Opts::new(name, help), labels)?;
    r.register(Box::new(g.clone()))?;
    Ok(g)
}

fn gauge(r: &Registry, name: &str, help: &str) -> prometheus::Result<IntGauge> {
    let g = IntGauge::new(name, help)?;
    r.register(Box::new(g.clone()))?;
    Ok(g)
}

fn counter(r: &Registry, name: &str, help: &str) -> prometheus::Result<IntCounter> {
    let c = IntCounter::new(name, help)?;
    r.register(Box::new(c.clone()))?;
    Ok(c)
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
                &hami_common::layout::VERSION.to_string(),
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

    /// Replaces the per-region gauges with `series`: a region or device not in it leaves
    /// `/metrics` now.
    pub fn set_regions(&self, series: &[RegionSeries]) {
        for f in [
            &self.limit,
            &self.accounted,
            &self.accounted_data,
            &self.observed,
            &self.compute_limit,
            &self.compute_held,
            &self.priority,
        ] {
            f.reset();
        }
        self.compute_share.reset();
        self.compute_grant.reset();
        self.compute_lent.reset();
        self.compute_turn.reset();
        for f in [
            &self.compute_seconds,
            &self.compute_throttled,
            &self.compute_throttled_seconds,
            &self.quota_refusals,
        ] {
            // The totals live in the regions: each scan sets them afresh.
            f.reset();
        }
        if let Some(h) = &self.hami {
            h.reset();
        }
        for s in series {
            let dev = s.device.to_string();
            let id = &s.identity;
            let l = [
                id.namespace.as_str(),
                id.pod.as_str(),
                id.container.as_str(),
                s.region.as_str(),
                dev.as_str(),
                s.uuid.as_str(),
            ];
            self.limit.with_label_values(&l).set(clamp(s.limit));
            self.accounted.with_label_values(&l).set(clamp(s.accounted));
            self.accounted_data
                .with_label_values(&l)
                .set(clamp(s.accounted_data));
            self.observed.with_label_values(&l).set(clamp(s.observed));
            self.compute_limit
                .with_label_values(&l)
                .set(i64::from(s.compute_limit));
            if let Some(share) = s.compute_share {
                self.compute_share.with_label_values(&l).set(share);
            }
            if let Some(g) = s.compute_grant {
                self.compute_grant.with_label_values(&l).set(g);
                self.compute_lent.with_label_values(&l).set(s.compute_lent);
                self.compute_turn.with_label_values(&l).set(s.compute_turn);
                self.compute_held
                    .with_label_values(&l)
                    .set(i64::from(s.compute_held));
            }
            if s.compute_limit != 0 {
                self.priority
                    .with_label_values(&l)
                    .set(i64::from(s.priority));
            }
            self.compute_seconds
                .with_label_values(&l)
                .inc_by(s.compute_consumed_ns as f64 / 1e9);
            self.compute_throttled
                .with_label_values(&l)
                .inc_by(s.compute_throttled as f64);
            self.compute_throttled_seconds
                .with_label_values(&l)
                .inc_by(s.compute_throttled_ns as f64 / 1e9);
            self.quota_refusals
                .with_label_values(&l)
                .inc_by(s.quota_refusals as f64);
            if let Some(h) = &self.hami {
                h.set(s);
            }
        }
    }

    /// Replaces the per-GPU gauges (each where NVML gave its figure).
    pub fn set_gpus(&self, gpus: &[GpuSeries]) {
        let fams = [
            &self.gpu_utilization,
            &self.gpu_memory_total,
            &self.gpu_memory_used,
        ];
        for f in fams {
            f.reset();
        }
        for g in gpus {
            let index = g.index.to_string();
            let l = [g.uuid.as_str(), index.as_str()];
            let values = [
                g.utilization.map(i64::from),
                g.memory_total.map(clamp),
                g.memory_used.map(clamp),
            ];
            for (f, v) in fams.iter().zip(values) {
                if let Some(v) = v {
                    f.with_label_values(&l).set(v);
                }
            }
        }
        if let Some(h) = &self.hami {
            h.set_gpus(gpus);
        }
    }

    /// Replaces the per-process gauge (only filled with `per_process`) and the process count.
    pub fn set_processes(&self, procs: &[ProcessSample]) {
        self.process_observed.reset();
        self.process_sm.reset();
        if self.opts.per_process {
            for p in procs {
                let pid = p.pid.to_string();
                let id = &p.identity;
                let l = [
                    pid.as_str(),
                    id.namespace.as_str(),
                    id.pod.as_str(),
                    id.container.as_str(),
                ];
                self.process_observed
                    .with_label_values(&l)
                    .set(clamp(p.observed));
                if let Some(u) = p.sm_util {
                    self.process_sm.with_label_values(&l).set(i64::from(u));
                }
            }
        }
        self.processes.set(procs.len() as i64);
    }

    /// Sets the per-hook process counts.
    pub fn set_hooks(&self, c: HookCounts) {
        for (h, n) in [
            ("hami_rs", c.hami_rs),
            ("hami_core", c.hami_core),
            ("none", c.none),
        ] {
            self.by_hook.with_label_values(&[h]).set(clamp(n));
        }
        self.oversubscribe_refused.set(clamp(c.oversubscribe));
    }

    /// Sets the standing-findings gauges from the findings standing now: the count per kind
    /// and, per kind, reason and workload, the number standing (a label set no finding
    /// stands for any more leaves `/metrics`).
    pub fn set_findings(&self, standing: &[FindingSeries]) {
        for k in FindingKind::ALL {
            let n = standing.iter().filter(|f| f.kind == k).count();
            self.findings.with_label_values(&[k.name()]).set(n as i64);
        }
        let mut by_labels: BTreeMap<[&str; 5], i64> = BTreeMap::new();
        for f in standing {
            let id = &f.identity;
            let l = [
                f.kind.name(),
                f.reason,
                id.namespace.as_str(),
                id.pod.as_str(),
                id.container.as_str(),
            ];
            *by_labels.entry(l).or_default() += 1;
        }
        self.finding.reset();
        for (l, n) in by_labels {
            self.finding.with_label_values(&l).set(n);
        }
    }

    /// Counts newly raised findings.
    pub fn count_new_findings(&self, new: &[crate::findings::Finding]) {
        for f in new {
            self.findings_total
                .with_label_values(&[f.kind.name()])
                .inc();
        }
    }

    /// Raises the dropped counter to `total` (a monotonic total read from the kernel side).
    pub fn set_dropped_total(&self, total: u64) {
        let cur = self.dropped.get();
        if total > cur {
            self.dropped.inc_by(total - cur);
        }
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

fn clamp(v: u64) -> i64 {
    v.min(i64::MAX as u64) as i64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ident(ns: &str, pod: &str, ctr: &str) -> Identity {
        Identity {
            namespace: ns.into(),
            pod: pod.into(),
            container: ctr.into(),
            ..Identity::default()
        }
    }

    fn series(ctr: &str, dev: u32) -> RegionSeries {
        RegionSeries {
            identity: ident("ml", "trainer-0", ctr),
            region: "/tmp/r".into(),
            device: dev,
            uuid: "GPU-0a1b2c3d-0000-1111-2222-333344445555".into(),
            limit: 100,
            accounted: 50,
            accounted_data: 40,
            observed: 45,
            context: 6,
            module: 3,
            buffer: 40,
            ..Default::default()
        }
    }

    #[test]
    fn usage_and_findings_render_with_workload_labels() {
        let m = Metrics::new(MetricsOptions {
            node: "gpu-node-1".into(),
            ..Default::default()
        })
        .unwrap();
        m.set_regions(&[series("main", 0)]);
        m.events.with_label_values(&["mem_alloc"]).inc_by(3);
        m.set_dropped_total(7);
        m.set_dropped_total(5); // never goes back
        let text = m.render();
        // dcgm-exporter's and HAMi's names: namespace, pod, container, UUID; the node last.
        assert!(
            text.contains(r#"hami_container_limit_bytes{UUID="GPU-0a1b2c3d-0000-1111-2222-333344445555",container="main",cuda_device="0",namespace="ml",pod="trainer-0",region="/tmp/r",node="gpu-node-1"} 100"#),
            "{text}"
        );
        assert!(text.contains(r#"hami_events_total{kind="mem_alloc",node="gpu-node-1"} 3"#));
        assert!(text.contains(r#"hami_events_dropped_total{node="gpu-node-1"} 7"#));
        assert!(text.contains(r#"hami_findings_standing{kind="bypass",node="gpu-node-1"} 0"#));
        assert!(text.contains(r#"hami_findings_total{kind="bypass",node="gpu-node-1"} 0"#));
        // The build info under a name of our own (HAMi serves `hami_build_info`).
        assert!(text.contains("hami_agent_build_info{"), "{text}");
        assert!(!text.contains("hami_build_info"), "{text}");
        assert!(
            text.contains(r#"process_resident_memory_bytes{node="gpu-node-1"} "#),
            "{text}"
        );
        // Every sample of the agent's own families names the node.
        for l in text.lines().filter(|l| !l.starts_with('#')) {
            assert!(l.contains(r#"node="gpu-node-1""#), "{l}");
        }
        // No family named like another's counter (OpenMetrics strips `_total`), and none of
        // the old label names.
        assert!(!text.contains("hami_findings{"));
        for l in [
            "pod_namespace=",
            "pod_name=",
            "container_name=",
            "gpu_uuid=",
            "nvml_index=",
        ] {
            assert!(!text.contains(l), "{l}: {text}");
        }
        // A region that went away disappears from the gauges.
        m.set_regions(&[]);
        assert!(!m.render().contains("hami_container_limit_bytes{"));
        // Without a node name (tests, tools), no node label.
        let bare = Metrics::new(MetricsOptions::default()).unwrap();
        assert!(!bare.render().contains("node="));
    }

    /// A workload outside Kubernetes still carries `namespace=""` and `pod=""`: scraped with
    /// `honor_labels: true` the explicit empty label keeps the target's `namespace`/`pod`
    /// (the agent's own pod) off its series (docs/deploy.md).
    #[test]
    fn empty_workload_names_are_exported_as_empty_labels() {
        let m = Metrics::new(MetricsOptions::default()).unwrap();
        let mut s = series("host", 0);
        s.identity = ident("", "", "host");
        m.set_regions(&[s]);
        let t = m.render();
        assert!(
            t.contains(r#"hami_container_limit_bytes{UUID="GPU-0a1b2c3d-0000-1111-2222-333344445555",container="host",cuda_device="0",namespace="",pod="",region="/tmp/r"} 100"#),
            "{t}"
        );
    }

    /// Only standing findings have a `hami_finding` series, with their workload's names and
    /// reason; several of one workload and reason count in one series; a finding that
    /// clears takes its series with it.
    #[test]
    fn standing_findings_are_exported_with_their_workload() {
        let m = Metrics::new(MetricsOptions::default()).unwrap();
        let f = |kind, reason, ns: &str, pod: &str, ctr: &str| FindingSeries {
            kind,
            reason,
            identity: ident(ns, pod, ctr),
        };
        use crate::findings::reason as r;
        m.set_findings(&[
            f(
                FindingKind::Bypass,
                r::NO_PRELOAD,
                "ml",
                "trainer-0",
                "main",
            ),
            f(
                FindingKind::Bypass,
                r::NO_PRELOAD,
                "ml",
                "trainer-0",
                "main",
            ),
            f(FindingKind::Bypass, r::NO_SLOT, "ml", "trainer-1", "main"),
            f(
                FindingKind::LeakedSlot,
                r::PROCESS_DEAD,
                "web",
                "infer-7",
                "srv",
            ),
        ]);
        let t = m.render();
        assert!(
            t.contains(r#"hami_finding{container="main",kind="bypass",namespace="ml",pod="trainer-0",reason="no_preload"} 2"#),
            "{t}"
        );
        assert!(
            t.contains(r#"hami_finding{container="main",kind="bypass",namespace="ml",pod="trainer-1",reason="no_slot"} 1"#),
            "{t}"
        );
        assert!(
            t.contains(r#"hami_finding{container="srv",kind="leaked_slot",namespace="web",pod="infer-7",reason="process_dead"} 1"#),
            "{t}"
        );
        assert_eq!(t.matches("hami_finding{").count(), 3, "{t}");
        assert!(
            t.contains(r#"hami_findings_standing{kind="bypass"} 3"#),
            "{t}"
        );
        assert!(t.contains(r#"hami_findings_standing{kind="leaked_slot"} 1"#));
        // The leak is reclaimed, one bypass clears.
        m.set_findings(&[f(
            FindingKind::Bypass,
            r::NO_SLOT,
            "ml",
            "trainer-1",
            "main",
        )]);
        let t = m.render();
        assert_eq!(t.matches("hami_finding{").count(), 1, "{t}");
        assert!(t.contains(r#"pod="trainer-1",reason="no_slot"} 1"#), "{t}");
        assert!(t.contains(r#"hami_findings_standing{kind="leaked_slot"} 0"#));
        m.set_findings(&[]);
        assert!(!m.render().contains("hami_finding{"));
    }

    #[test]
    fn the_arbiters_grant_lent_time_and_priority_are_exported() {
        let m = Metrics::new(MetricsOptions::default()).unwrap();
        let mut lent = series("alone", 0);
        lent.compute_limit = 30;
        lent.compute_grant = Some(100.0);
        lent.compute_lent = 70.0;
        let mut turn = series("contending", 3);
        turn.compute_limit = 50;
        turn.compute_grant = Some(50.0);
        turn.compute_turn = 50.0;
        lent.priority = 1;
        let mut held = series("low", 1);
        held.compute_limit = 50;
        held.compute_grant = Some(0.0);
        held.compute_held = true;
        held.priority = 1;
        let mut off = series("native", 2);
        off.compute_limit = 0;
        m.set_regions(&[lent, held, off, turn]);
        let t = m.render();
        let l = |ctr: &str, dev: u32| {
            format!(
                r#"{{UUID="GPU-0a1b2c3d-0000-1111-2222-333344445555",container="{ctr}",cuda_device="{dev}",namespace="ml",pod="trainer-0",region="/tmp/r"}}"#
            )
        };
        for line in [
            format!("hami_container_compute_grant_percent{} 100", l("alone", 0)),
            format!("hami_container_compute_lent_percent{} 70", l("alone", 0)),
            format!("hami_container_compute_held{} 0", l("alone", 0)),
            format!("hami_container_priority{} 1", l("alone", 0)),
            format!("hami_container_compute_grant_percent{} 0", l("low", 1)),
            format!("hami_container_compute_held{} 1", l("low", 1)),
            format!("hami_container_compute_turn_percent{} 0", l("alone", 0)),
            format!(
                "hami_container_compute_turn_percent{} 50",
                l("contending", 3)
            ),
        ] {
            assert!(t.contains(&line), "{line}\n{t}");
        }
        // No share: no grant, no priority series.
        assert!(
            !t.contains(r#"container="native""#)
                || !t.contains(&format!(
                    "hami_container_compute_grant_percent{}",
                    l("native", 2)
                )),
            "{t}"
        );
        assert!(
            !t.contains(&format!("hami_container_priority{}", l("native", 2))),
            "{t}"
        );
    }

    #[test]
    fn compute_families_follow_the_regions_and_the_gpus() {
        let m = Metrics::new(MetricsOptions::default()).unwrap();
        let mut limited = series("main", 0);
        limited.compute_limit = 30;
        limited.compute_share = Some(42.5);
        limited.compute_consumed_ns = 12_500_000_000;
        limited.compute_throttled = 4;
        limited.compute_throttled_ns = 1_250_000_000;
        limited.quota_refusals = 17;
        // Another container without a compute limit, whose share NVML did not give.
        let unmeasured = series("side", 1);
        m.set_regions(&[limited, unmeasured]);
        m.set_gpus(&[
            GpuSeries {
                index: 0,
                uuid: "GPU-0a1b2c3d-0000-1111-2222-333344445555".into(),
                utilization: Some(97),
                memory_total: Some(80 << 30),
                memory_used: Some(3 << 30),
                ..Default::default()
            },
            // A GPU whose utilisation NVML did not give: its memory still shows.
            GpuSeries {
                index: 1,
                uuid: "GPU-1".into(),
                utilization: None,
                memory_total: Some(1 << 30),
                memory_used: None,
                ..Default::default()
            },
        ]);
        let t = m.render();
        let l = r#"{UUID="GPU-0a1b2c3d-0000-1111-2222-333344445555",container="main",cuda_device="0",namespace="ml",pod="trainer-0",region="/tmp/r"}"#;
        for (fam, v) in [
            ("hami_container_compute_limit_percent", "30"),
            ("hami_container_compute_share_percent", "42.5"),
            ("hami_container_compute_seconds_total", "12.5"),
            ("hami_container_compute_throttled_total", "4"),
            ("hami_container_compute_throttled_seconds_total", "1.25"),
            ("hami_container_quota_refusals_total", "17"),
        ] {
            assert!(t.contains(&format!("{fam}{l} {v}\n")), "{fam}: {t}");
        }
        assert!(
            t.contains("# TYPE hami_container_quota_refusals_total counter"),
            "{t}"
        );
        assert!(
            t.contains("# TYPE hami_container_compute_seconds_total counter"),
            "{t}"
        );
        assert!(
            t.contains("# TYPE hami_container_compute_share_percent gauge"),
            "{t}"
        );
        assert!(
            t.contains(r#"hami_container_compute_limit_percent{UUID="GPU-0a1b2c3d-0000-1111-2222-333344445555",container="side",cuda_device="1""#),
            "{t}"
        );
        assert!(
            !t.contains(r#"hami_container_compute_share_percent{UUID="GPU-0a1b2c3d-0000-1111-2222-333344445555",container="side""#),
            "no share without NVML's figure: {t}"
        );
        assert!(
            t.contains(r#"hami_gpu_utilization_percent{UUID="GPU-0a1b2c3d-0000-1111-2222-333344445555",gpu="0"} 97"#),
            "{t}"
        );
        assert!(
            t.contains(r#"hami_gpu_memory_total_bytes{UUID="GPU-0a1b2c3d-0000-1111-2222-333344445555",gpu="0"} 85899345920"#),
            "{t}"
        );
        assert!(t.contains(r#"hami_gpu_memory_used_bytes{UUID="GPU-0a1b2c3d-0000-1111-2222-333344445555",gpu="0"} 3221225472"#));
        assert!(t.contains(r#"hami_gpu_memory_total_bytes{UUID="GPU-1",gpu="1"} 1073741824"#));
        assert!(
            !t.contains(r#"hami_gpu_utilization_percent{UUID="GPU-1""#),
            "{t}"
        );
        assert!(
            !t.contains(r#"hami_gpu_memory_used_bytes{UUID="GPU-1""#),
            "{t}"
        );
        // The next scan sets the totals afresh (they live in the region), and a region
        // that left takes its series with it.
        let mut later = series("main", 0);
        later.compute_consumed_ns = 20_000_000_000;
        m.set_regions(&[later]);
        m.set_gpus(&[]);
        let t = m.render();
        assert!(
            t.contains(&format!("hami_container_compute_seconds_total{l} 20\n")),
            "{t}"
        );
        assert!(!t.contains("container=\"side\""), "{t}");
        assert!(!t.contains("hami_gpu_utilization_percent{"), "{t}");
        assert!(!t.contains("hami_gpu_memory_total_bytes{"), "{t}");
    }

    #[test]
    fn per_process_series_are_opt_in_and_have_no_hooked_label() {
        let p = [
            ProcessSample {
                pid: 42,
                identity: ident("ml", "p", "c"),
                observed: 9,
                sm_util: Some(35),
            },
            ProcessSample {
                pid: 43,
                identity: ident("ml", "p", "c"),
                observed: 0,
                sm_util: None,
            },
        ];
        let off = Metrics::new(MetricsOptions::default()).unwrap();
        off.set_processes(&p);
        let t = off.render();
        assert!(!t.contains("hami_process_observed_bytes{"), "{t}");
        assert!(!t.contains("hami_process_sm_utilization_percent{"), "{t}");
        assert!(t.contains("hami_processes_tracked 2"));
        let on = Metrics::new(MetricsOptions {
            per_process: true,
            ..Default::default()
        })
        .unwrap();
        on.set_processes(&p);
        let t = on.render();
        assert!(
            t.contains(
                r#"hami_process_observed_bytes{container="c",namespace="ml",pid="42",pod="p"} 9"#
            ),
            "{t}"
        );
        assert!(
            t.contains(r#"hami_process_sm_utilization_percent{container="c",namespace="ml",pid="42",pod="p"} 35"#),
            "{t}"
        );
        assert!(
            !t.contains(
                r#"hami_process_sm_utilization_percent{container="c",namespace="ml",pid="43""#
            ),
            "no figure, no series: {t}"
        );
        assert!(!t.contains("hooked="));
    }

    #[test]
    fn hami_compat_families_use_hamis_names_and_labels() {
        let off = Metrics::new(MetricsOptions::default()).unwrap();
        off.set_regions(&[series("main", 1)]);
        assert!(!off.render().contains("vgpu"));
        let m = Metrics::new(MetricsOptions {
            hami_compat: true,
            node: "gpu-node-1".into(),
            ..Default::default()
        })
        .unwrap();
        m.set_regions(&[series("main", 1)]);
        let t = m.render();
        // HAMi's families carry HAMi's labels and its `zone` (no agent `node`); the agent's
        // carry `node` and no `zone`.
        for l in t.lines().filter(|l| !l.starts_with('#')) {
            let hamis = [
                "hami_vgpu_",
                "vGPU_",
                "Device_",
                "hami_container_device_",
                "hami_host_gpu_",
                "Host",
            ]
            .iter()
            .any(|p| l.starts_with(p));
            assert_eq!(!hamis, l.contains(r#"node="gpu-node-1""#), "{l}");
            assert_eq!(hamis, l.contains(r#"zone="vGPU""#), "{l}");
        }
        let u = "GPU-0a1b2c3d-0000-1111-2222-333344445555";
        let h = format!(
            r#"container="main",device_uuid="{u}",namespace="ml",pod="trainer-0",vdevice_index="1",zone="vGPU""#
        );
        let legacy = format!(
            r#"ctrname="main",deviceuuid="{u}",podname="trainer-0",podnamespace="ml",vdeviceid="1",zone="vGPU""#
        );
        assert!(
            t.contains(&format!("hami_vgpu_memory_used_bytes{{{h}}} 50\n")),
            "{t}"
        );
        assert!(t.contains(&format!("hami_vgpu_memory_limit_bytes{{{h}}} 100\n")));
        assert!(t.contains(&format!(
            "vGPU_device_memory_usage_in_bytes{{{legacy}}} 50\n"
        )));
        assert!(t.contains(&format!(
            "vGPU_device_memory_limit_in_bytes{{{legacy}}} 100\n"
        )));
        // The container's SM utilisation under HAMi's names, only where measured.
        assert!(!t.contains("Device_utilization_desc_of_container{"), "{t}");
        assert!(
            !t.contains("hami_container_device_utilization_ratio{"),
            "{t}"
        );
        let mut busy = series("main", 1);
        busy.compute_share = Some(37.5);
        m.set_regions(&[busy]);
        let t = m.render();
        assert!(
            t.contains(&format!(
                "hami_container_device_utilization_ratio{{{h}}} 37.5\n"
            )),
            "{t}"
        );
        assert!(t.contains(&format!(
            "Device_utilization_desc_of_container{{{legacy}}} 37.5\n"
        )));
        assert!(t.contains("# TYPE hami_container_device_utilization_ratio gauge"));
        m.set_regions(&[]);
        let t = m.render();
        assert!(!t.contains("vGPU_device_memory_usage_in_bytes{"));
        assert!(!t.contains("hami_container_device_utilization_ratio{"));
    }

    /// GPUs as NVML gives them, for the host GPU families.
    fn gpus() -> Vec<GpuSeries> {
        vec![
            GpuSeries {
                index: 0,
                uuid: "GPU-0a1b2c3d-0000-1111-2222-333344445555".into(),
                utilization: Some(97),
                memory_total: Some(80 << 30),
                memory_used: Some(3 << 30),
                name: Some("NVIDIA H200".into()),
                memory_utilization: Some(41),
            },
            // Without a name HAMi's monitor serves no host family for the device.
            GpuSeries {
                index: 1,
                uuid: "GPU-1".into(),
                utilization: Some(5),
                memory_total: Some(1 << 30),
                memory_used: Some(1 << 20),
                name: None,
                memory_utilization: Some(1),
            },
            // Memory figures but no utilisation.
            GpuSeries {
                index: 2,
                uuid: "GPU-2".into(),
                utilization: None,
                memory_total: Some(1 << 30),
                memory_used: Some(2 << 20),
                name: Some("NVIDIA H200".into()),
                memory_utilization: None,
            },
        ]
    }

    #[test]
    fn hami_host_gpu_families_follow_nvml_per_version() {
        let u = "GPU-0a1b2c3d-0000-1111-2222-333344445555";
        for v in HamiVersion::ALL {
            let m = Metrics::new(MetricsOptions {
                hami_compat: true,
                hami_version: v,
                node: "gpu-node-1".into(),
                ..Default::default()
            })
            .unwrap();
            m.set_gpus(&gpus());
            let t = m.render();
            let (node, nodeid) = match v {
                HamiVersion::V2_9 => ("", ""),
                HamiVersion::V2_10 => (r#",node="gpu-node-1""#, r#",nodeid="gpu-node-1""#),
            };
            let dev =
                format!(r#"device_index="0",device_type="NVIDIA-NVIDIA H200",device_uuid="{u}""#);
            let legacy =
                format!(r#"deviceidx="0",devicetype="NVIDIA-NVIDIA H200",deviceuuid="{u}""#);
            for want in [
                format!(r#"hami_host_gpu_memory_used_bytes{{{dev}{node},zone="vGPU"}} 3221225472"#),
                format!(r#"hami_host_gpu_utilization_ratio{{{dev}{node},zone="vGPU"}} 97"#),
                format!(r#"HostGPUMemoryUsage{{{legacy}{nodeid},zone="vGPU"}} 3221225472"#),
                format!(r#"HostCoreUtilization{{{legacy}{nodeid},zone="vGPU"}} 97"#),
                format!(
                    r#"hami_host_gpu_memory_used_bytes{{device_index="2",device_type="NVIDIA-NVIDIA H200",device_uuid="GPU-2"{node},zone="vGPU"}} 2097152"#
                ),
            ] {
                assert!(t.contains(&format!("{want}\n")), "{v}: {want}\n{t}");
            }
            let ctrl = format!(
                "hami_host_gpu_memory_controller_utilization_ratio{{{dev},zone=\"vGPU\"}} 41\n"
            );
            assert_eq!(t.contains(&ctrl), v == HamiVersion::V2_10, "{v}: {t}");
            // No name: no host family; no utilisation: no utilisation series.
            assert!(!t.contains(r#"device_uuid="GPU-1""#), "{t}");
            assert!(!t.contains(r#"deviceuuid="GPU-1""#), "{t}");
            assert!(
                !t.contains(r#"hami_host_gpu_utilization_ratio{device_index="2""#),
                "{t}"
            );
            // The agent's own per-GPU families are unchanged.
            assert!(
                t.contains(
                    r#"hami_gpu_memory_used_bytes{UUID="GPU-1",gpu="1",node="gpu-node-1"} 1048576"#
                ),
                "{t}"
            );
            m.set_gpus(&[]);
            assert!(!m.render().contains("hami_host_gpu_"), "{v}");
        }
        // Without --hami-compat: none of them.
        let off = Metrics::new(MetricsOptions::default()).unwrap();
        off.set_gpus(&gpus());
        let t = off.render();
        assert!(
            !t.contains("hami_host_gpu_") && !t.contains("HostGPU"),
            "{t}"
        );
    }

    #[test]
    fn hami_families_move_to_their_own_port_when_asked() {
        let m = Metrics::new(MetricsOptions {
            hami_compat: true,
            hami_separate: true,
            node: "gpu-node-1".into(),
            ..Default::default()
        })
        .unwrap();
        let mut s = series("main", 0);
        s.compute_share = Some(3.0);
        m.set_regions(&[s]);
        m.set_gpus(&gpus());
        let agent = m.render();
        let hami = m.render_hami();
        assert!(agent.contains("hami_container_limit_bytes{"), "{agent}");
        assert!(agent.contains("hami_gpu_memory_used_bytes{"), "{agent}");
        for fam in hami_compat::families(HamiVersion::default()) {
            assert!(
                !agent.contains(&format!("\n{fam}{{")),
                "{fam} on both:\n{agent}"
            );
            assert!(
                hami.contains(&format!("# TYPE {fam} gauge")),
                "{fam}:\n{hami}"
            );
        }
        // Only HAMi's, each with its zone.
        for l in hami.lines().filter(|l| !l.starts_with('#')) {
            assert!(l.contains(r#"zone="vGPU""#), "{l}");
            assert!(
                !l.starts_with("hami_container_limit") && !l.starts_with("process_"),
                "{l}"
            );
        }
        // Not separate: one exposition with both.
        let one = Metrics::new(MetricsOptions {
            hami_compat: true,
            ..Default::default()
        })
        .unwrap();
        one.set_regions(&[series("main", 0)]);
        assert!(one.render().contains("hami_vgpu_memory_used_bytes{"));
        assert!(Metrics::new(MetricsOptions::default())
            .unwrap()
            .render_hami()
            .is_empty());
    }

    /// The label sets of a family in the exposition (sorted label names per sample).
    fn label_names(text: &str, family: &str) -> Vec<Vec<String>> {
        text.lines()
            .filter_map(|l| l.strip_prefix(family)?.strip_prefix('{'))
            .map(|rest| {
                let inner = &rest[..rest.rfind('}').unwrap()];
                let mut v: Vec<String> = inner
                    .split("\",")
                    .map(|kv| kv.split('=').next().unwrap().to_string())
                    .collect();
                v.sort();
                v
            })
            .collect()
    }

    /// Every family HAMi's vGPU monitor serves, with its labels, as its source has them
    /// (`cmd/vGPUmonitor/metrics.go` and `main.go` of v2.9.0 and v2.10.0: `zone="vGPU"` on
    /// every one; the older names with `--legacy-metrics`, as in v2.4.0-v2.8.x). Each one the
    /// agent serves is served with exactly those labels, in the version chosen; the ones it
    /// does not serve are named (HAMi-core's kernel records, the scheduler's MIG annotations).
    #[test]
    fn hami_compat_matches_hamis_monitor_families_and_labels() {
        const CTR: [&str; 5] = [
            "namespace",
            "pod",
            "container",
            "vdevice_index",
            "device_uuid",
        ];
        const LEGACY: [&str; 5] = [
            "podnamespace",
            "podname",
            "ctrname",
            "vdeviceid",
            "deviceuuid",
        ];
        const HOST: [&str; 3] = ["device_index", "device_uuid", "device_type"];
        const LEGACY_HOST: [&str; 3] = ["deviceidx", "deviceuuid", "devicetype"];
        let monitor = |v: HamiVersion| -> Vec<(&str, Vec<&str>)> {
            let v10 = v == HamiVersion::V2_10;
            let host = if v10 {
                [&["node"][..], &HOST].concat()
            } else {
                HOST.to_vec()
            };
            let legacy_host = if v10 {
                [&["nodeid"][..], &LEGACY_HOST].concat()
            } else {
                LEGACY_HOST.to_vec()
            };
            let desc = if v10 {
                CTR.to_vec()
            } else {
                [
                    &CTR[..],
                    &["context_size", "module_size", "buffer_size", "offset"],
                ]
                .concat()
            };
            let mut f = vec![
                ("hami_host_gpu_memory_used_bytes", host.clone()),
                ("hami_host_gpu_utilization_ratio", host),
                ("hami_vgpu_memory_used_bytes", CTR.to_vec()),
                ("hami_vgpu_memory_limit_bytes", CTR.to_vec()),
                ("hami_container_device_memory_bytes", desc),
                ("hami_container_device_utilization_ratio", CTR.to_vec()),
                ("hami_vgpu_memory_context_bytes", CTR.to_vec()),
                ("hami_vgpu_memory_module_bytes", CTR.to_vec()),
                ("hami_vgpu_memory_buffer_bytes", CTR.to_vec()),
                ("HostGPUMemoryUsage", legacy_host.clone()),
                ("HostCoreUtilization", legacy_host),
                ("vGPU_device_memory_usage_in_bytes", LEGACY.to_vec()),
                ("vGPU_device_memory_limit_in_bytes", LEGACY.to_vec()),
                (
                    "Device_memory_desc_of_container",
                    [&LEGACY[..], &["context", "module", "data", "offset"]].concat(),
                ),
                ("Device_utilization_desc_of_container", LEGACY.to_vec()),
            ];
            if v10 {
                f.push((
                    "hami_host_gpu_memory_controller_utilization_ratio",
                    HOST.to_vec(),
                ));
            }
            f
        };
        // Served by HAMi's monitor from what only HAMi-core or the scheduler records.
        let not_served = [
            "hami_container_last_kernel_elapsed_seconds",
            "hami_mig_device_info",
            "Device_last_kernel_of_container",
            "MigInfo",
        ];
        for v in HamiVersion::ALL {
            let m = Metrics::new(MetricsOptions {
                hami_compat: true,
                hami_version: v,
                node: "gpu-node-1".into(),
                ..Default::default()
            })
            .unwrap();
            let mut s = series("main", 0);
            s.accounted = 60;
            s.compute_share = Some(12.0);
            m.set_regions(&[s]);
            m.set_gpus(&gpus()[..1]);
            let t = m.render();
            let hami = monitor(v);
            for (fam, labels) in &hami {
                let mut want: Vec<String> = labels.iter().map(|l| l.to_string()).collect();
                want.push("zone".into());
                want.sort();
                assert_eq!(label_names(&t, fam), vec![want], "{v} {fam}:\n{t}");
                assert!(m.family_names().contains(&fam.to_string()), "{v} {fam}");
            }
            // Nothing beyond them is served as HAMi's.
            let mut ours = hami_compat::families(v);
            ours.sort();
            let mut theirs: Vec<&str> = hami.iter().map(|(f, _)| *f).collect();
            theirs.sort();
            assert_eq!(ours, theirs, "{v}");
            for fam in not_served {
                assert!(!t.contains(fam), "{v} {fam}");
            }
            let u = "GPU-0a1b2c3d-0000-1111-2222-333344445555";
            let h = format!(
                r#"container="main",device_uuid="{u}",namespace="ml",pod="trainer-0",vdevice_index="0""#
            );
            assert!(
                t.contains(&format!(
                    "hami_vgpu_memory_context_bytes{{{h},zone=\"vGPU\"}} 6\n"
                )),
                "{t}"
            );
            assert!(t.contains(&format!(
                "hami_vgpu_memory_module_bytes{{{h},zone=\"vGPU\"}} 3\n"
            )));
            assert!(t.contains(&format!(
                "hami_vgpu_memory_buffer_bytes{{{h},zone=\"vGPU\"}} 40\n"
            )));
            // HAMi's offset: the total less the three parts (60 - 6 - 3 - 40).
            let desc = match v {
                HamiVersion::V2_9 => format!(
                    r#"hami_container_device_memory_bytes{{buffer_size="40",container="main",context_size="6",device_uuid="{u}",module_size="3",namespace="ml",offset="11",pod="trainer-0",vdevice_index="0",zone="vGPU"}} 60"#
                ),
                HamiVersion::V2_10 => {
                    format!("hami_container_device_memory_bytes{{{h},zone=\"vGPU\"}} 60")
                }
            };
            assert!(t.contains(&format!("{desc}\n")), "{v}: {t}");
            assert!(t.contains(
                r#"Device_memory_desc_of_container{context="6",ctrname="main",data="40","#
            ));
            // Gone with the region.
            m.set_regions(&[]);
            assert!(!m.render().contains("hami_vgpu_memory_buffer_bytes{"));
        }
        // Off: none of them.
        let off = Metrics::new(MetricsOptions::default()).unwrap();
        off.set_regions(&[series("main", 0)]);
        off.set_gpus(&gpus());
        let t = off.render();
        for (fam, _) in &monitor(HamiVersion::V2_10) {
            assert!(!t.contains(&format!("{fam}{{")), "{fam}");
        }
        assert!(!t.contains("zone="), "{t}");
    }

    #[test]
    fn processes_are_counted_by_hook_for_a_migration() {
        let m = Metrics::new(MetricsOptions::default()).unwrap();
        let t = m.render();
        for h in ["hami_rs", "hami_core", "none"] {
            assert!(
                t.contains(&format!("hami_processes_by_hook{{hook=\"{h}\"}} 0")),
                "{t}"
            );
        }
        assert!(t.contains("hami_processes_oversubscribe_refused 0"));
        m.set_hooks(HookCounts {
            hami_rs: 3,
            hami_core: 2,
            none: 1,
            oversubscribe: 1,
        });
        let t = m.render();
        assert!(
            t.contains(r#"hami_processes_by_hook{hook="hami_rs"} 3"#),
            "{t}"
        );
        assert!(t.contains(r#"hami_processes_by_hook{hook="hami_core"} 2"#));
        assert!(t.contains(r#"hami_processes_by_hook{hook="none"} 1"#));
        assert!(t.contains("hami_processes_oversubscribe_refused 1"));
        assert!(t.contains(r#"hami_findings_standing{kind="hami_core"} 0"#));
        assert!(t.contains(r#"hami_findings_standing{kind="unhooked"} 0"#));
    }

    #[test]
    fn dashboard_uses_only_exported_metrics_and_labels() {
        let m = Metrics::new(MetricsOptions {
            per_process: true,
            hami_compat: true,
            ..Default::default()
        })
        .unwrap();
        let dash = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../dashboards/hami.json"),
        )
        .unwrap();
        let _: serde_json::Value = serde_json::from_str(&dash).unwrap();
        let exported = m.family_names();
        let mut used = Vec::new();
        let mut rest = dash.as_str();
        while let Some(i) = rest.find("hami_") {
            let tail = &rest[i..];
            let end = tail
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(tail.len());
            used.push(tail[..end].to_string());
            rest = &tail[end..];
        }
        used.retain(|n| n != "hami_");
        assert!(used.len() >= 10, "{used:?}");
        for n in &used {
            assert!(exported.contains(n), "dashboard uses unknown metric {n}");
        }
        // The label names of before dcgm-exporter's and HAMi's were adopted.
        for old in [
            "pod_namespace",
            "pod_name",
            "container_name",
            "gpu_uuid",
            "nvml_index",
        ] {
            assert!(!dash.contains(old), "dashboard uses the old label {old}");
        }
        assert!(
            !dash.contains("hami_findings{"),
            "dashboard uses the old gauge name"
        );
    }
}
