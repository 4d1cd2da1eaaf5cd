//! The event loop behind `hami-agent run` and `hami-agent audit`: probes -> agent core,
//! periodic ticks, NVML refresh, metrics, logging.

use std::io::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hami_abi::event::Event;
use tokio::sync::mpsc;

use crate::agent::{Agent, AgentOptions, TickOutcome};
use crate::findings::Finding;
use crate::http::Exposition;
use crate::http::Health;
use crate::metrics::{Metrics, MetricsOptions};
use crate::nvml::retry::{Backoff, Poll, Retry, FIRST_RETRY, MAX_RETRY};
use crate::nvml::{Nvml, NvmlError, NVML_LIB};
use crate::probes::{DiscoveryOptions, ProbeError, ProbeHandle, ProbeOptions, Probes};
use crate::report::{AuditReport, NvmlSummary, ProbeSummary};

/// Errors starting the agent.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The eBPF side could not start.
    #[error(transparent)]
    Probes(#[from] ProbeError),
    /// The metrics address could not be bound.
    #[error("cannot listen on {addr} for /metrics: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The error.
        source: std::io::Error,
    },
    /// The metrics registry failed (a bug).
    #[error(transparent)]
    Metrics(#[from] crate::metrics::MetricsError),
}

/// Options of the loop.
#[derive(Clone, Debug)]
pub struct RunOptions {
    /// Agent core options.
    pub agent: AgentOptions,
    /// libcuda files to attach at start (in addition to discovery).
    pub libcuda: Vec<PathBuf>,
    /// Tick period (findings evaluation, metrics).
    pub interval: Duration,
    /// libcuda discovery period.
    pub discovery_interval: Duration,
    /// NVML sampling period (the physical check compares each sample with the regions).
    pub nvml_interval: Duration,
    /// Where to serve `/metrics` (`None`: no server).
    pub metrics_addr: Option<SocketAddr>,
    /// Where to serve HAMi's vGPU monitor families alone, at `/metrics`, as HAMi's monitor
    /// does on its port 9394 (`None`: they are on `metrics_addr`, with `hami_compat`).
    pub hami_metrics_addr: Option<SocketAddr>,
    /// Stop after this long (`audit`); `None`: until interrupted.
    pub duration: Option<Duration>,
    /// Log findings as they are raised (`run`).
    pub log_findings: bool,
    /// Optional metric families.
    pub metrics: MetricsOptions,
}

/// Everything running.
struct Running {
    agent: Agent,
    events: mpsc::Receiver<Event>,
    handle: ProbeHandle,
    nvml: Option<Arc<Nvml>>,
    /// Set while an NVML query is outstanding on a helper thread.
    nvml_busy: Arc<std::sync::atomic::AtomicBool>,
    nvml_error: Option<String>,
    /// While NVML is not loaded: the attempts to load it again.
    nvml_retry: Option<Retry<Nvml, NvmlError>>,
    /// NVML was just loaded by a retry: sample it at this tick, whatever the period.
    nvml_fresh: bool,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    attached: usize,
    /// [`ProbeHandle::attach_generation`] last acted on.
    generation: u64,
    /// When the last tick (periodic or early) started.
    last_tick: Instant,
}

/// Least time between two ticks when an early one is asked for
/// ([`Agent::wants_early_tick`]): a node where unhooked processes keep starting is evaluated
/// at most this often beyond the periodic ticks.
const EARLY_TICK_GAP: Duration = Duration::from_millis(100);

fn start(opts: &RunOptions, stop: &Arc<AtomicBool>) -> Result<Running, RunError> {
    let (nvml, nvml_error, nvml_retry) = match Nvml::load() {
        Ok(n) => {
            tracing::info!(
                driver = ?n.driver_version(),
                path = ?n.library_path(),
                "NVML loaded"
            );
            (Some(Arc::new(n)), None, None)
        }
        Err(e) => {
            tracing::warn!(
                error = %e,
                "running without NVML: no physical check (over_limit and drift against NVML, \
                 unhooked processes that were running before the agent); findings come from \
                 the probes only until it loads: retrying in {FIRST_RETRY:?}, the delay \
                 doubling up to {MAX_RETRY:?}"
            );
            let retry = Retry::new(
                Arc::new(Nvml::load),
                Backoff::after_failure(FIRST_RETRY, MAX_RETRY, Instant::now()),
            );
            (None, Some(e.to_string()), Some(retry))
        }
    };
    // One pidfd per tracked process, one descriptor per open region.
    if let Some((before, after)) = crate::agent::raise_nofile_limit() {
        tracing::debug!(
            before,
            after,
            "RLIMIT_NOFILE soft limit raised to the hard limit"
        );
    }
    let mut agent = Agent::new(opts.agent.clone());
    for (name, e) in agent.region_errors() {
        tracing::warn!(region = %name, error = %e, "region unreadable");
    }
    agent.set_nvml(nvml.as_ref().map(|n| n.snapshot()));
    if nvml.is_some() && !agent.nvml_per_process() {
        tracing::warn!(
            "NVML gives no per-process used memory (process lists unreadable): no physical \
             check until it does; findings come from the probes only"
        );
    }
    let mut probes = Probes::load(&ProbeOptions::default())?;
    // SIGTERM while attaching (seconds with several libcuda files): stop between probes.
    probes.stop_on(Arc::clone(stop));
    let (events, handle) = probes.spawn(DiscoveryOptions {
        proc_root: opts.agent.proc_root.clone(),
        interval: Some(opts.discovery_interval),
        extra: opts.libcuda.clone(),
        ..DiscoveryOptions::default()
    })?;
    // One synchronous discovery pass, so that "ready" means attached where possible.
    handle.rescan();
    let attached = handle.attached();
    if attached.is_empty() {
        tracing::warn!(
            "libcuda not found (ld.so.cache, running processes, container roots, --libcuda): \
             still looking every {:?}",
            opts.discovery_interval
        );
    }
    for l in &attached {
        tracing::info!(path = %l.path.display(), symbols = l.symbols.len(), "probes attached");
    }
    let generation = handle.attach_generation();
    agent.add_libcuda_ids(handle.announced_maps_ids());
    let baselined = agent.baseline_scan();
    if !baselined.is_empty() {
        tracing::info!(pids = ?baselined, "processes running before attach: baselined (pre-existing, not observed from start)");
    }
    let metrics = Arc::new(Metrics::new(opts.metrics.clone())?);
    metrics.nvml_available.set(i64::from(nvml.is_some()));
    metrics.libcuda_attached.set(attached.len() as i64);
    Ok(Running {
        agent,
        events,
        handle,
        nvml,
        nvml_busy: Arc::default(),
        nvml_error,
        nvml_retry,
        nvml_fresh: false,
        metrics,
        health: Arc::new(Health::new()),
        attached: attached.len(),
        generation,
        last_tick: Instant::now(),
    })
}

fn log_outcome(out: &TickOutcome) {
    for f in &out.raised {
        log_finding(f);
    }
    for f in &out.cleared {
        tracing::info!(
            kind = f.kind.name(),
            reason = f.reason,
            pid = f.pid,
            region = f.region.as_deref(),
            "finding cleared"
        );
    }
    for r in &out.reclaimed {
        tracing::warn!(region = %r.region, slot = r.slot, pid = r.pid, bytes = r.bytes, "leaked slot reclaimed");
    }
}

fn log_finding(f: &Finding) {
    tracing::warn!(
        kind = f.kind.name(),
        reason = f.reason,
        pid = f.pid,
        uid = f.uid,
        nspid = f.nspid,
        container = %f.container,
        region = f.region.as_deref(),
        device = f.device,
        slot = f.slot.map(|s| s as u64),
        bytes = f.bytes,
        observed = f.observed,
        accounted = f.accounted,
        limit = f.limit,
        "finding: {}",
        f.detail
    );
}

impl Running {
    fn update_metrics(&self) {
        let m = &self.metrics;
        m.set_regions(&self.agent.region_series());
        m.set_gpus(&self.agent.gpu_series());
        m.set_processes(&self.agent.process_samples());
        m.set_hooks(self.agent.hook_counts());
        m.regions.set(self.agent.region_count() as i64);
        let released = self.agent.released_regions();
        let unclassified = self.agent.unclassified_exits();
        if unclassified > m.unclassified.get() {
            m.unclassified.inc_by(unclassified - m.unclassified.get());
        }
        if released > m.regions_released.get() {
            m.regions_released
                .inc_by(released - m.regions_released.get());
        }
        m.region_errors.set(self.agent.region_error_count() as i64);
        m.set_findings(&self.agent.finding_series());
        let c = self.handle.counters();
        m.set_dropped_total(c.dropped);
        m.libcuda_attached
            .set(self.handle.attached_cached().len() as i64);
    }

    fn on_tick(&mut self, log: bool, last_nvml: &mut Instant, nvml_interval: Duration) {
        let t0 = Instant::now();
        self.last_tick = t0;
        self.check_new_libraries();
        self.attached = self.handle.attached_cached().len();
        self.retry_nvml();
        if let Some(n) = &self.nvml {
            if self.nvml_fresh || last_nvml.elapsed() >= nvml_interval {
                // Bounded: a driver that stops answering keeps the last figures.
                let n = Arc::clone(n);
                match crate::tenantfs::bounded(
                    "NVML query",
                    crate::agent::INPUT_DEADLINE,
                    Some(&self.nvml_busy),
                    move || n.snapshot(),
                ) {
                    Ok(snap) => {
                        // A device whose handle, UUID or memory info could not be read.
                        let failed = snap
                            .devices
                            .iter()
                            .filter(|d| d.uuid.is_none() || d.total.is_none())
                            .count();
                        self.metrics.nvml_errors.inc_by(failed as u64);
                        self.agent.set_nvml(Some(snap));
                        if std::mem::take(&mut self.nvml_fresh) && !self.agent.nvml_per_process() {
                            tracing::warn!(
                                "NVML gives no per-process used memory (process lists \
                                 unreadable): no physical check until it does; findings come \
                                 from the probes only"
                            );
                        }
                    }
                    Err(e) => {
                        // A query that did not answer in time (or one still outstanding).
                        self.metrics.nvml_errors.inc();
                        tracing::warn!(error = %e, "NVML query skipped");
                    }
                }
                *last_nvml = Instant::now();
            }
        }
        // Drops first: a process whose events were lost is rebuilt, not compared.
        self.agent.note_dropped(self.handle.counters().dropped);
        let out = self.agent.tick(Instant::now());
        if log {
            log_outcome(&out);
        }
        self.metrics.count_new_findings(&out.raised);
        self.metrics.reclaimed.inc_by(out.reclaimed.len() as u64);
        self.update_metrics();
        self.metrics
            .tick_duration
            .observe(t0.elapsed().as_secs_f64());
        self.health.beat();
    }

    /// While NVML is not loaded: collects a finished load attempt, or starts one when the
    /// backoff says (on a thread of its own: the tick never waits for it). Once loaded, NVML
    /// is used from this tick on as if it had loaded at start.
    fn retry_nvml(&mut self) {
        let Some(retry) = self.nvml_retry.as_mut() else {
            return;
        };
        match retry.poll(Instant::now()) {
            Poll::Waiting => {}
            Poll::Failed {
                error,
                attempts,
                next_in,
            } => {
                tracing::debug!(error = %error, attempts, next_in = ?next_in, "NVML still unavailable");
                self.nvml_error = Some(error);
            }
            Poll::Loaded { value, attempts } => {
                let path = value
                    .library_path()
                    .map_or_else(|| NVML_LIB.to_string(), |p| p.display().to_string());
                tracing::info!(
                    driver = ?value.driver_version(),
                    attempts,
                    "NVML loaded from {path} after {attempts} attempts"
                );
                self.nvml = Some(Arc::new(value));
                self.nvml_error = None;
                self.nvml_retry = None;
                self.nvml_fresh = true;
                self.metrics.nvml_available.set(1);
            }
        }
    }

    /// A libcuda file is being attached (or its attach just finished): the processes that
    /// already map it may have allocated unseen, so they are baselined before any of its
    /// events is applied (a process that started after the agent is marked *attached
    /// late*); processes started after the attach finished are not.
    fn check_new_libraries(&mut self) {
        let g = self.handle.attach_generation();
        if g == self.generation {
            return;
        }
        self.generation = g;
        // Replaced, not added to: the files detached since (unlinked, mapped by nobody) go.
        self.agent.set_libcuda_ids(self.handle.announced_maps_ids());
        // Once the attach is over, a process started after it was watched from its start
        // (the generation moves again then; while it is in progress, every one counts).
        let cutoff = self.handle.attach_settled_ticks();
        let b = self.agent.baseline_scan_started_by(cutoff);
        if !b.is_empty() {
            tracing::info!(pids = ?b, "baselined processes of a newly attached libcuda (loaded it before its probes went in)");
        }
    }

    fn consume(&mut self, ev: &Event) {
        self.check_new_libraries();
        self.metrics
            .events
            .with_label_values(&[ev.kind.name()])
            .inc();
        self.agent.on_event(ev);
    }

    fn report(&self, seconds: f64) -> AuditReport {
        let c = self.handle.counters();
        let standing = self.agent.standing();
        AuditReport::new(
            seconds,
            ProbeSummary {
                attached: self
                    .handle
                    .attached()
                    .iter()
                    .map(|l| l.path.display().to_string())
                    .collect(),
                sent: c.sent,
                dropped: c.dropped,
                unpaired: c.unpaired,
                received: c.received,
            },
            NvmlSummary {
                available: self.nvml.is_some(),
                error: self.nvml_error.clone(),
                samples: self.agent.nvml_samples(),
                per_process: self.agent.nvml_per_process(),
                tolerance: self
                    .nvml
                    .as_ref()
                    .map(|_| self.agent.options().nvml_tolerance),
                compute: self.nvml.as_ref().map(|_| self.agent.options().compute),
                devices: self
                    .agent
                    .nvml()
                    .map(|n| n.devices.clone())
                    .unwrap_or_default(),
            },
            self.agent.process_rows(),
            self.agent.region_rows(),
            self.agent.history(),
            &standing,
            self.agent.reclaimed().to_vec(),
        )
    }
}

/// How long the loop may take to stop after SIGTERM/SIGINT before the process exits anyway.
pub const STOP_GRACE: Duration = Duration::from_secs(10);

/// A task on another worker thread: after SIGTERM or SIGINT, sets `stop` at once (an
/// attach in progress, which holds the loop's thread, ends before its next probe; see
/// [`crate::probes::Probes::stop_on`]), then, if the loop has not finished within
/// [`STOP_GRACE`] (stuck on an input despite every bound), exits the process.
fn spawn_term_watchdog(stop: Arc<AtomicBool>) {
    let Ok(mut term) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
    else {
        return;
    };
    let Ok(mut int) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())
    else {
        return;
    };
    tokio::spawn(async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        stop.store(true, Ordering::SeqCst);
        tokio::time::sleep(STOP_GRACE).await;
        let _ = writeln!(
            std::io::stderr(),
            "hami-agent: not stopped {STOP_GRACE:?} after the signal: exiting now"
        );
        std::process::exit(143);
    });
}

/// Runs until interrupted (or `opts.duration`), then returns the report.
pub async fn run(opts: RunOptions) -> Result<AuditReport, RunError> {
    // Signal handlers before anything else: attaching the probes can take seconds, and a
    // SIGINT/SIGTERM sent meanwhile (an audit stopped early) must end the run with its report,
    // not kill the process with the default action. The watchdog listens too.
    use tokio::signal::unix::{signal, SignalKind};
    let mut int = signal(SignalKind::interrupt()).ok();
    let mut term = signal(SignalKind::terminate()).ok();
    let stop = Arc::new(AtomicBool::new(false));
    spawn_term_watchdog(Arc::clone(&stop));
    let mut r = start(&opts, &stop)?;
    // Unhealthy when the loop has not ticked for 10 periods (at least 10 s).
    let max_age = (opts.interval * 10).max(Duration::from_secs(10));
    let mut servers = Vec::new();
    let endpoints = [
        (opts.metrics_addr, Exposition::Agent),
        (opts.hami_metrics_addr, Exposition::Hami),
    ];
    for (addr, exposition) in endpoints {
        let Some(addr) = addr else { continue };
        let l = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|source| RunError::Bind { addr, source })?;
        let local = l.local_addr().unwrap_or(addr);
        // `/healthz` too; tools and tests match these messages.
        match exposition {
            Exposition::Agent => tracing::info!(addr = %local, "serving /metrics"),
            Exposition::Hami => {
                tracing::info!(addr = %local, "serving HAMi's monitor families at /metrics")
            }
        }
        let (m, h) = (Arc::clone(&r.metrics), Arc::clone(&r.health));
        servers.push(tokio::spawn(async move {
            if let Err(e) = crate::http::serve_exposition(l, m, h, max_age, exposition).await {
                tracing::error!(error = %e, ?exposition, "a /metrics server stopped");
            }
        }));
    }
    // Tests and scripts wait for this line on stderr before starting workloads (a closed
    // stderr is no reason to stop).
    let _ = writeln!(
        std::io::stderr(),
        "hami-agent: ready ({} libcuda attached, {} processes baselined)",
        r.attached,
        r.agent.process_count()
    );
    let t0 = Instant::now();
    let deadline = opts.duration.map(|d| tokio::time::Instant::now() + d);
    let mut ticker = tokio::time::interval(opts.interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_nvml = Instant::now();
    let sleep_until = async move {
        match deadline {
            Some(d) => tokio::time::sleep_until(d).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(sleep_until);
    loop {
        tokio::select! {
            ev = r.events.recv() => {
                let Some(ev) = ev else {
                    tracing::error!("the probe event stream ended");
                    break;
                };
                r.consume(&ev);
                // Drain what is queued before looking at the clock again.
                for _ in 0..4096 {
                    match r.events.try_recv() {
                        Ok(ev) => r.consume(&ev),
                        Err(_) => break,
                    }
                }
                // A new unhooked process allocated: evaluate now (at most every
                // EARLY_TICK_GAP), not at the next periodic tick.
                if r.agent.wants_early_tick() && r.last_tick.elapsed() >= EARLY_TICK_GAP {
                    r.on_tick(opts.log_findings, &mut last_nvml, opts.nvml_interval);
                }
            }
            _ = ticker.tick() => r.on_tick(opts.log_findings, &mut last_nvml, opts.nvml_interval),
            _ = async { match int.as_mut() { Some(t) => { t.recv().await; } None => std::future::pending().await } } => break,
            _ = async { match term.as_mut() { Some(t) => { t.recv().await; } None => std::future::pending().await } } => break,
            _ = &mut sleep_until => break,
        }
    }
    // Take in what is still queued, then one last evaluation.
    while let Ok(ev) = r.events.try_recv() {
        r.consume(&ev);
    }
    r.on_tick(opts.log_findings, &mut last_nvml, opts.nvml_interval);
    for s in servers {
        s.abort();
    }
    let report = r.report(t0.elapsed().as_secs_f64());
    // Detaching costs the kernel about 0.1 s per probe, one after another (4-5 s for one
    // libcuda): a keeper process takes the links over so that the agent exits now.
    let links = r.handle.shutdown();
    let (n, t) = (links.len(), Instant::now());
    let background = links.detach_in_background();
    tracing::debug!(links = n, background, elapsed = ?t.elapsed(), "probes detached");
    Ok(report)
}
