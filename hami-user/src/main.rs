//! `hami-agent`: run / audit / inspect. See `docs/agent.md`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context as _, Result};
use clap::{Args, Parser, Subcommand};
use hami_common::region::Region;
use hami_user::agent::AgentOptions;
use hami_user::findings::Tolerance;
use hami_user::metrics::DEFAULT_METRICS_ADDR;
use hami_user::report;
use hami_user::runner::{self, RunOptions};

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
    /// Watch until interrupted: log findings, serve /metrics.
    Run {
        /// Address for /metrics.
        #[arg(long, default_value = DEFAULT_METRICS_ADDR)]
        metrics_addr: SocketAddr,
        /// Log as JSON lines.
        #[arg(long)]
        json_log: bool,
        #[command(flatten)]
        common: Common,
    },
    /// Watch for N seconds, print a table (or JSON); exit 2 on bypass or over-limit.
    Audit {
        /// Seconds to watch (Ctrl-C ends earlier).
        #[arg(long, default_value_t = 5.0)]
        seconds: f64,
        /// Print JSON instead of the table.
        #[arg(long)]
        json: bool,
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
    /// A libcuda file to probe at start (repeatable; discovery keeps looking for others).
    #[arg(long = "libcuda", value_name = "PATH")]
    libcuda: Vec<PathBuf>,
    /// A region file to watch even if no live process names it (repeatable; slot pids are
    /// taken to be in the agent's pid namespace).
    #[arg(long = "region", value_name = "PATH")]
    regions: Vec<PathBuf>,
    /// Evaluation period in milliseconds.
    #[arg(long, default_value_t = 250)]
    interval: u64,
    /// How long a finding that can be a transient race must persist, in milliseconds.
    #[arg(long, default_value_t = 300)]
    settle_ms: u64,
    /// Minimum tolerated difference between observed and accounted, in bytes.
    #[arg(long, default_value_t = 2 << 20)]
    tolerance_bytes: u64,
    /// Relative tolerated difference, in percent of the larger figure.
    #[arg(long, default_value_t = 1.0)]
    tolerance_pct: f64,
    /// Where /proc is.
    #[arg(long, default_value = "/proc", hide = true)]
    proc_root: PathBuf,
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
                settle: Duration::from_millis(self.settle_ms),
                reclaim: self.reclaim,
                regions: self.regions.clone(),
            },
            libcuda: self.libcuda.clone(),
            interval: Duration::from_millis(self.interval.max(10)),
            discovery_interval: Duration::from_millis(500),
            metrics_addr,
            duration,
            log_findings: log,
        }
    }
}

fn init_logging(json: bool) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("HAMI_AGENT_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let b = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if json {
        b.json().init();
    } else {
        b.init();
    }
}

fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the tokio runtime")
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match real_main(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("hami-agent: error: {e:#}");
            ExitCode::from(1)
        }
    }
}

fn real_main(cli: Cli) -> Result<ExitCode> {
    match cli.cmd {
        Cmd::Inspect { region, json } => {
            // The region error names the path and the problem; printed once (not also as
            // a source chain).
            // A read-only open of a FIFO would block until a writer appears.
            let md = std::fs::metadata(&region)
                .map_err(|e| anyhow::anyhow!("region unreadable: {}: {e}", region.display()))?;
            if !md.is_file() {
                anyhow::bail!(
                    "region unreadable: shared region {}: not a regular file",
                    region.display()
                );
            }
            let r = Region::open_existing(&region, false)
                .map_err(|e| anyhow::anyhow!("region unreadable: {e}"))?;
            let snap = r.snapshot();
            let name = region.display().to_string();
            if json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&report::inspect_json(&name, &snap))?
                );
            } else {
                print!("{}", report::inspect_text(&name, &snap));
            }
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Run {
            metrics_addr,
            json_log,
            common,
        } => {
            init_logging(json_log);
            let opts = common.options(Some(metrics_addr), None, true);
            let rep = runtime()?
                .block_on(runner::run(opts))
                .context("hami-agent run")?;
            tracing::info!(findings = rep.findings.len(), "stopped");
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Audit {
            seconds,
            json,
            common,
        } => {
            init_logging(false);
            let secs = if seconds.is_finite() && seconds >= 0.0 {
                seconds
            } else {
                0.0
            };
            let opts = common.options(None, Some(Duration::from_secs_f64(secs)), !json);
            let rep = runtime()?
                .block_on(runner::run(opts))
                .context("hami-agent audit")?;
            if json {
                println!("{}", serde_json::to_string_pretty(&rep)?);
            } else {
                print!("{}", rep.table());
            }
            Ok(ExitCode::from(rep.exit_code() as u8))
        }
    }
}
