//! `hami-agent`: run / audit / inspect. See `docs/agent.md`.
//!
//! Exit statuses: 0 clean; 1 internal error (cannot load the probes, bind the address, ...);
//! 2 findings (`audit` saw a bypass or an over-limit); 64 usage error (bad arguments,
//! `EX_USAGE` of sysexits.h, so that it is never mistaken for findings).

use std::io::IsTerminal as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context as _, Result};
use clap::{Args, Parser, Subcommand};
use std::io::Write as _;

use hami_user::agent::AgentOptions;
use hami_user::cli;
use hami_user::compute::ComputeOptions;
use hami_user::findings::Tolerance;
use hami_user::http::parse_listen_addr;
use hami_user::metrics::{HamiVersion, MetricsOptions, DEFAULT_METRICS_ADDR};
use hami_user::report;
use hami_user::runner::{self, RunOptions};
use hami_user::tenantfs;

#[derive(Parser, Debug)]
#[command(
    name = "hami-agent",
    version,
    about = "Observes every libcuda allocation with eBPF and audits hami-preload's shared regions"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Watch until interrupted: log findings, serve /metrics and /healthz.
    Run {
        /// Address for /metrics and /healthz: HOST:PORT, :PORT or PORT.
        #[arg(long, default_value = DEFAULT_METRICS_ADDR, value_parser = parse_listen_addr)]
        metrics_addr: SocketAddr,
        /// Log as JSON lines (same as --log-format json).
        #[arg(long)]
        json_log: bool,
        /// Export `hami_process_observed_bytes` per pid (one series per GPU process).
        #[arg(long)]
        per_process_metrics: bool,
        /// Also export HAMi's vGPU monitor families (`hami_vgpu_memory_*`,
        /// `hami_container_device_*`, `hami_host_gpu_*`, their older names, all with
        /// `zone="vGPU"`) for containers that use hami-preload and for the node's GPUs.
        #[arg(long)]
        hami_compat: bool,
        /// The HAMi release whose monitor's label sets the HAMi families follow: 2.9 or
        /// 2.10 (a patch release or a leading v is accepted; 2.4-2.8: 2.9).
        #[arg(long, value_name = "VERSION", default_value = "2.10", value_parser = cli::parse_hami_version)]
        hami_version: HamiVersion,
        /// Serve HAMi's families alone at /metrics on this address (HAMi's monitor's port:
        /// :9394), and not on --metrics-addr. Needs --hami-compat.
        #[arg(long, value_name = "ADDR", value_parser = parse_listen_addr, requires = "hami_compat")]
        hami_metrics_addr: Option<SocketAddr>,
        /// The node's name, the `node` label of every metric (default: `NODE_NAME` from the
        /// environment, else the host name).
        #[arg(long, value_name = "NAME", value_parser = cli::parse_node_name)]
        node_name: Option<String>,
        #[command(flatten)]
        common: Common,
    },
    /// Watch for N seconds, print a table (or JSON); exit 2 on bypass or over-limit.
    Audit {
        /// Seconds to watch, 0 to one week (Ctrl-C ends earlier).
        #[arg(long, default_value = "5", value_parser = cli::parse_seconds, allow_negative_numbers = true)]
        seconds: Duration,
        /// Output: `table`, `wide` (the table with namespace, pod, uid, command, NVML GPU
        /// and finding reasons) or `json`.
        #[arg(short = 'o', long = "output", value_enum, default_value_t = Output::Table)]
        output: Output,
        /// Print JSON instead of the table (same as `-o json`).
        #[arg(long, conflicts_with = "output")]
        json: bool,
        /// Only the processes, regions and findings of this Kubernetes namespace.
        #[arg(long, value_name = "NS")]
        namespace: Option<String>,
        /// Only the processes, regions and findings of this pod (its name; with
        /// `--namespace` to tell apart pods of the same name).
        #[arg(long, value_name = "POD")]
        pod: Option<String>,
        #[command(flatten)]
        common: Common,
    },
    /// Dump a region file (no root, no eBPF needed).
    Inspect {
        /// The region file.
        region: PathBuf,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Args, Debug)]
struct Common {
    /// Release leaked slots (dead or replaced owner) through the region's protocol.
    #[arg(long)]
    reclaim: bool,
    /// Do not act as the GPUs' arbiter of compute shares (no grants written: every container
    /// under `default` is held to its share, as `force`).
    #[arg(long)]
    no_arbiter: bool,
    /// A libcuda file to probe at start (repeatable; discovery keeps looking for others).
    #[arg(long = "libcuda", value_name = "PATH")]
    libcuda: Vec<PathBuf>,
    /// A region file to watch even if no live process names it (repeatable; slot pids are
    /// taken to be in the agent's pid namespace).
    #[arg(long = "region", value_name = "PATH")]
    regions: Vec<PathBuf>,
    /// Evaluation period in milliseconds (at most one hour).
    #[arg(long, default_value_t = 250, value_parser = cli::parse_millis, allow_negative_numbers = true)]
    interval: u64,
    /// How long a finding that can be a transient race must persist, in milliseconds (at
    /// most one hour).
    #[arg(long, default_value_t = 300, value_parser = cli::parse_millis, allow_negative_numbers = true)]
    settle_ms: u64,
    /// Minimum tolerated difference between observed and accounted: bytes or K/M/G/T
    /// (powers of 1024, as the preload's limits).
    #[arg(long, default_value = "2M", value_parser = cli::parse_size_flag, allow_negative_numbers = true)]
    tolerance_bytes: u64,
    /// Relative tolerated difference, in percent of the larger figure.
    #[arg(long, default_value_t = 1.0)]
    tolerance_pct: f64,
    /// NVML sampling period in milliseconds (the physical check; at most one hour).
    #[arg(long, default_value_t = 1000, value_parser = cli::parse_millis, allow_negative_numbers = true)]
    nvml_interval: u64,
    /// How long a finding against NVML must persist, in milliseconds (it must also hold in
    /// two NVML samples; at most one hour).
    #[arg(long, default_value_t = 1000, value_parser = cli::parse_millis, allow_negative_numbers = true)]
    nvml_settle_ms: u64,
    /// Absolute tolerance between NVML's figures and the region's: bytes or K/M/G/T.
    #[arg(long, default_value = "64M", value_parser = cli::parse_size_flag, allow_negative_numbers = true)]
    nvml_tolerance_bytes: u64,
    /// Relative tolerance between NVML's figures and the region's, in percent.
    #[arg(long, default_value_t = 2.0)]
    nvml_tolerance_pct: f64,
    /// Window of the exported compute share, in seconds: the mean of the NVML samples in it.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..=3600), allow_negative_numbers = true)]
    compute_share_window_secs: u64,
    /// Window of the `compute_over_limit` finding, in seconds: the container's mean share
    /// over it is compared with its limit, once it has been measured that long.
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=3600), allow_negative_numbers = true)]
    compute_window_secs: u64,
    /// How many percentage points of the device the mean share may exceed the limit by.
    #[arg(long, default_value_t = 10.0, value_parser = parse_points)]
    compute_tolerance_points: f64,
    /// Where /proc is.
    #[arg(long, default_value = "/proc", hide = true)]
    proc_root: PathBuf,
    /// Where the kubelet's logs are (pod and container names come from
    /// `<dir>/containers` and `<dir>/pods`).
    #[arg(long, default_value = hami_user::identity::DEFAULT_LOG_ROOT)]
    kubelet_log_dir: PathBuf,
    /// A namespace whose GPU processes run without hami-preload on purpose (repeatable):
    /// they are reported as `unhooked`, not `bypass`. Processes with
    /// `CUDA_DISABLE_CONTROL=true` (HAMi's opt-out) are `unhooked` without it.
    #[arg(long = "allow-unhooked-namespace", value_name = "NAMESPACE")]
    allow_unhooked_namespaces: Vec<String>,
    /// Log format on stderr: `text` (no colour unless stderr is a terminal) or `json`.
    /// `RUST_LOG` (or `HAMI_AGENT_LOG`) sets the filter, default `info`.
    #[arg(long, value_enum)]
    log_format: Option<LogFormat>,
}

/// `audit`'s output (`-o`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum Output {
    /// The table.
    Table,
    /// The table with more columns.
    Wide,
    /// The report as one JSON document.
    Json,
}

/// Log line format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

impl Common {
    fn options(
        &self,
        metrics_addr: Option<SocketAddr>,
        duration: Option<Duration>,
        log: bool,
    ) -> RunOptions {
        RunOptions {
            agent: AgentOptions {
                proc_root: self.proc_root.clone(),
                tolerance: Tolerance {
                    min_bytes: self.tolerance_bytes,
                    ratio: self.tolerance_pct / 100.0,
                },
                nvml_tolerance: Tolerance {
                    min_bytes: self.nvml_tolerance_bytes,
                    ratio: self.nvml_tolerance_pct / 100.0,
                },
                settle: Duration::from_millis(self.settle_ms),
                nvml_settle: Duration::from_millis(self.nvml_settle_ms),
                reclaim: self.reclaim,
                arbiter: !self.no_arbiter,
                regions: self.regions.clone(),
                log_root: self.kubelet_log_dir.clone(),
                compute: ComputeOptions {
                    share_window: Duration::from_secs(self.compute_share_window_secs),
                    window: Duration::from_secs(self.compute_window_secs),
                    tolerance_points: self.compute_tolerance_points,
                },
                allow_unhooked_namespaces: self.allow_unhooked_namespaces.clone(),
            },
            libcuda: self.libcuda.clone(),
            interval: Duration::from_millis(self.interval.max(10)),
            discovery_interval: Duration::from_millis(500),
            nvml_interval: Duration::from_millis(self.nvml_interval.max(10)),
            metrics_addr,
            hami_metrics_addr: None,
            duration,
            log_findings: log,
            metrics: MetricsOptions::default(),
        }
    }
}

/// Logging on stderr: `RUST_LOG`, else `HAMI_AGENT_LOG`, else `info`; colour only when
/// stderr is a terminal (never in files or journald).
fn init_logging(format: LogFormat) {
    let filter = ["RUST_LOG", "HAMI_AGENT_LOG"]
        .iter()
        .find_map(|v| {
            std::env::var(v)
                .ok()
                .filter(|s| !s.trim().is_empty())
                .and_then(|s| tracing_subscriber::EnvFilter::try_new(s).ok())
        })
        .unwrap_or_else(|| tracing_subscriber::EnvFilter::new("info"));
    let b = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Json => b.json().with_ansi(false).init(),
        LogFormat::Text => b.with_ansi(std::io::stderr().is_terminal()).init(),
    }
}

/// A tolerance in percentage points of a device: a number from 0 to 100.
fn parse_points(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(v) if (0.0..=100.0).contains(&v) => Ok(v),
        _ => Err(format!(
            "{s:?} is not a number of percentage points from 0 to 100"
        )),
    }
}

/// Exit status for a usage error (`EX_USAGE`).
const EXIT_USAGE: u8 = 64;

fn runtime() -> Result<tokio::runtime::Runtime> {
    // Worker threads apart from the loop: /metrics keeps answering, and SIGTERM is acted on,
    // even while the loop waits on one slow input.
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the tokio runtime")
}

/// How long the runtime's shutdown waits for its blocking tasks once the run is over.
const RUNTIME_SHUTDOWN_GRACE: Duration = Duration::from_secs(2);

/// Runs the agent's loop on a fresh runtime (see [`runtime`]) and shuts the runtime down
/// without waiting more than [`RUNTIME_SHUTDOWN_GRACE`] for its blocking tasks: dropping a
/// runtime waits for every one of them, and a discovery pass stuck in a read of a tenant's
/// input (a FIFO where a `/proc` file should be, a hung FUSE file) would hold the exit, and
/// with it the report, forever (the stop watchdog is one of the runtime's tasks: gone by
/// then). A task left behind ends with the process.
fn run_agent(opts: RunOptions) -> Result<Result<report::AuditReport, runner::RunError>> {
    let rt = runtime()?;
    let rep = rt.block_on(runner::run(opts));
    rt.shutdown_timeout(RUNTIME_SHUTDOWN_GRACE);
    Ok(rep)
}

/// Writes `text` to stdout. A reader that went away (`hami-agent inspect R --json | head`)
/// is not an error: the rest is dropped quietly.
fn print_out(text: &str) -> Result<()> {
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        Err(e) => Err(e).context("writing to stdout"),
    }
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            return match e.kind() {
                clap::error::ErrorKind::DisplayHelp | clap::error::ErrorKind::DisplayVersion => {
                    ExitCode::SUCCESS
                }
                _ => ExitCode::from(EXIT_USAGE),
            };
        }
    };
    match real_main(cli) {
        Ok(code) => code,
        Err(e) => {
            // stderr may be closed too: nothing more to say then.
            let _ = writeln!(std::io::stderr(), "hami-agent: error: {e:#}");
            ExitCode::from(1)
        }
    }
}

fn real_main(cli: Cli) -> Result<ExitCode> {
    match cli.cmd {
        Cmd::Inspect { region, json } => {
            // The region error names the path and the problem; printed once (not also as
            // a source chain).
            // Opened like the agent opens regions: a FIFO, device or socket is refused without
            // waiting, and the file is copied with pread (a file truncated meanwhile is an
            // error, not a SIGBUS).
            let file = tenantfs::open_regular(&region, false)
                .map_err(|e| anyhow::anyhow!("region unreadable: {e}"))?;
            let snap = hami_common::region::read_snapshot(&file, &region)
                .map_err(|e| anyhow::anyhow!("region unreadable: {e}"))?;
            let name = region.display().to_string();
            if json {
                let mut text = serde_json::to_string_pretty(&report::inspect_json(&name, &snap))?;
                text.push('\n');
                print_out(&text)?;
            } else {
                print_out(&report::inspect_text(&name, &snap))?;
            }
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Run {
            metrics_addr,
            json_log,
            per_process_metrics,
            hami_compat,
            hami_version,
            hami_metrics_addr,
            node_name,
            common,
        } => {
            hami_user::heap::pin_mmap_threshold();
            init_logging(if json_log {
                LogFormat::Json
            } else {
                common.log_format.unwrap_or(LogFormat::Text)
            });
            // A bad NODE_NAME is a usage error like a bad --node-name (exit 64).
            let node = match cli::node_name(
                node_name,
                std::env::var(cli::NODE_NAME_ENV).ok(),
                cli::host_name,
            ) {
                Ok(n) => n,
                Err(e) => {
                    let _ = writeln!(std::io::stderr(), "hami-agent: error: {e}");
                    return Ok(ExitCode::from(EXIT_USAGE));
                }
            };
            let mut opts = common.options(Some(metrics_addr), None, true);
            opts.hami_metrics_addr = hami_metrics_addr;
            opts.metrics = MetricsOptions {
                per_process: per_process_metrics,
                hami_compat,
                hami_version,
                hami_separate: hami_metrics_addr.is_some(),
                node,
            };
            let rep = run_agent(opts)?.context("hami-agent run")?;
            tracing::info!(findings = rep.findings.len(), "stopped");
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Audit {
            seconds,
            output,
            json,
            namespace,
            pod,
            common,
        } => {
            let output = if json { Output::Json } else { output };
            let json = output == Output::Json;
            let filter = report::Filter { namespace, pod };
            // With --json, stdout is the report only and stderr is JSON lines too.
            init_logging(common.log_format.unwrap_or(if json {
                LogFormat::Json
            } else {
                LogFormat::Text
            }));
            let opts = common.options(None, Some(seconds), !json);
            let rep = run_agent(opts)?
                .context("hami-agent audit")?
                .filtered(&filter);
            match output {
                Output::Json => {
                    let mut text = serde_json::to_string_pretty(&rep)?;
                    text.push('\n');
                    print_out(&text)?;
                }
                Output::Wide => print_out(&rep.table_wide())?,
                Output::Table => print_out(&rep.table())?,
            }
            Ok(ExitCode::from(rep.exit_code() as u8))
        }
    }
}
