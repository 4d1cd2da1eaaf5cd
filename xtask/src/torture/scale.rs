//! A busy node (root): R region files and P hooked processes (`scaleproc`, 5 per region by
//! default), then the agent's cost to scan them, as figures:
//!
//! * `hami-agent audit --seconds 0` (one-shot): wall time, CPU time (user + system), peak
//!   RSS (`wait4`'s rusage), and its report checked: every process listed, hooked, with its
//!   region and its slot's bytes, every region listed, no finding.
//! * `hami-agent run`: time to ready (probes attached, every process baselined), then the
//!   steady tick (`hami_tick_duration_seconds`: mean and worst over the window), the agent's
//!   CPU per second of wall time, its RSS, and the time one `/metrics` scrape takes. The
//!   tracked process and region counts must be exact and no finding may stand.
//!
//! The scan runs at two sizes (a fifth of the fleet, then all of it) so that the cost per
//! region and process can be compared: a cost that grows faster than the fleet (a quadratic
//! scan) shows as a ratio well above 1.
//!
//! The processes of a region are one `scaleproc` and the children it forks before any CUDA
//! call (relocated library pages stay shared): about 150 KiB of private memory each. Every
//! family runs in its own process group; the fleet's `Drop` closes their stdin (they kill
//! and reap their children and exit), then SIGKILLs whatever group is left, so nothing
//! outlives the scenario, on failure too. The region files live in the sandbox's temp dir.

use std::collections::HashSet;
use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, ensure, Context, Result};
use hami_test_harness::agent::{AgentProcess, READY_LINE};
use hami_test_harness::{Artifacts, TestEnv};
use serde_json::Value;

use super::profile::{Profile, MIB};
use super::report::Report;
use super::sandbox::sandbox;

/// Bytes every process allocates (its slot's data).
const PROC_BYTES: u64 = MIB;
/// Regions whose processes start at the same time (each forks its children at once).
const SPAWN_BATCH: usize = 20;
/// How long one family may take to report ready.
const FAMILY_WAIT: Duration = Duration::from_secs(120);
/// How long the agent may take to attach and baseline the whole fleet.
const READY_WAIT: Duration = Duration::from_secs(300);

/// One `scaleproc` and its children, in their own process group.
struct Family {
    child: Child,
    stdin: Option<ChildStdin>,
    region: PathBuf,
}

/// Every family started; ended (all of them) on drop.
struct Fleet {
    families: Vec<Family>,
    procs: usize,
}

impl Fleet {
    fn new() -> Fleet {
        Fleet {
            families: Vec::new(),
            procs: 0,
        }
    }

    /// Starts families until there are `regions`, `per_region` processes each, and waits
    /// until every process holds its slot.
    fn grow(
        &mut self,
        env: &TestEnv,
        prog: &Path,
        regions: usize,
        per_region: usize,
    ) -> Result<()> {
        while self.families.len() < regions {
            let batch = SPAWN_BATCH.min(regions - self.families.len());
            let (tx, rx) = mpsc::channel();
            for _ in 0..batch {
                let i = self.families.len();
                let region = env.dir().join(format!("region-{i}.cache"));
                let mut c = env.command(prog);
                c.args([&per_region.to_string(), &PROC_BYTES.to_string()])
                    .env(hami_test_harness::ENV_REGION, &region)
                    .env(
                        hami_test_harness::ENV_FAKE_STATE,
                        env.dir().join(format!("fake-{i}.state")),
                    )
                    .stdin(Stdio::piped())
                    .stderr(Stdio::inherit())
                    .process_group(0);
                let mut child = c.spawn().context("starting scaleproc")?;
                let stdin = child.stdin.take();
                let out = child.stdout.take().expect("piped stdout");
                let tx = tx.clone();
                // One line, then the thread ends (the family writes nothing more).
                std::thread::spawn(move || {
                    let mut l = String::new();
                    let _ = BufReader::new(out).read_line(&mut l);
                    let _ = tx.send((i, l));
                });
                self.families.push(Family {
                    child,
                    stdin,
                    region,
                });
            }
            drop(tx);
            let deadline = Instant::now() + FAMILY_WAIT;
            for _ in 0..batch {
                let left = deadline.saturating_duration_since(Instant::now());
                let (i, l) = rx
                    .recv_timeout(left)
                    .map_err(|_| anyhow!("a scaleproc family did not report ready in time"))?;
                let ready =
                    hami_test_harness::KvLine::parse(l.trim()).filter(|k| k.head == "ready");
                let (n, failed) = ready
                    .as_ref()
                    .map(|k| (k.num("procs"), k.num("failed")))
                    .unwrap_or((None, None));
                ensure!(
                    n == Some(per_region as u64) && failed == Some(0),
                    "scaleproc family {i}: expected `ready procs={per_region} failed=0`, got {:?}",
                    l.trim()
                );
            }
            self.procs += batch * per_region;
        }
        Ok(())
    }

    fn regions(&self) -> usize {
        self.families.len()
    }

    fn region_names(&self) -> HashSet<String> {
        self.families
            .iter()
            .map(|f| f.region.display().to_string())
            .collect()
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        // EOF on stdin: each family kills and reaps its children and exits.
        for f in &mut self.families {
            drop(f.stdin.take());
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        for f in &mut self.families {
            let pgid = f.child.id() as libc::pid_t;
            loop {
                match f.child.try_wait() {
                    Ok(Some(_)) | Err(_) => break,
                    Ok(None) if Instant::now() < deadline => {
                        std::thread::sleep(Duration::from_millis(10))
                    }
                    Ok(None) => {
                        let _ = f.child.kill();
                        let _ = f.child.wait();
                        break;
                    }
                }
            }
            // Whatever is left of the group (a child whose parent died first).
            // SAFETY: kill(2) on a process group this scenario created.
            unsafe { libc::kill(-pgid, libc::SIGKILL) };
        }
        for f in &self.families {
            hami_test_harness::wait_for_group_gone(f.child.id() as i32);
        }
    }
}

/// User + system CPU seconds of a rusage.
/// The last 20 lines of an agent's log, newest first.
fn tail(log: &[String]) -> String {
    log.iter()
        .rev()
        .take(20)
        .cloned()
        .collect::<Vec<_>>()
        .join("\n")
}

fn cpu_secs(ru: &libc::rusage) -> f64 {
    let t = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 / 1e6;
    t(ru.ru_utime) + t(ru.ru_stime)
}

/// The agent's environment: no preload, no fake NVML on the library path (NVML is not part
/// of this measurement: the fake's per-process lists would cover one sandbox's state only).
fn agent_command(bin: &Path, art: &Artifacts, env: &TestEnv) -> Command {
    let mut c = Command::new(bin);
    c.env_remove("LD_PRELOAD")
        .env_remove("LD_LIBRARY_PATH")
        .env("RUST_LOG", "warn")
        .current_dir(env.dir());
    let _ = art;
    c
}

/// What one audit cost.
struct AuditCost {
    /// Host pids of the fleet's processes, as the report lists them.
    pids: HashSet<u64>,
    /// Until the ready line: probes attached, every process baselined.
    ready: f64,
    wall: f64,
    cpu: f64,
    peak_rss_kib: i64,
}

/// `hami-agent audit --seconds 0 --json`, measured, and its report checked against the fleet.
fn audit(bin: &Path, art: &Artifacts, env: &TestEnv, fleet: &Fleet) -> Result<AuditCost> {
    let mut c = agent_command(bin, art, env);
    c.args(["audit", "--seconds", "0", "--json", "--libcuda"])
        .arg(&art.fake_libcuda);
    let t0 = Instant::now();
    let mut ready = None;
    let agent = AgentProcess::try_spawn_within(c, READY_WAIT, |l| {
        if l.starts_with(READY_LINE) {
            ready = Some(t0.elapsed().as_secs_f64());
        }
    })
    .context("hami-agent audit: not ready")?;
    let (status, out, log, ru) = agent
        .try_finish_measured_within(READY_WAIT.saturating_sub(t0.elapsed()))
        .map_err(|(e, log)| anyhow!("hami-agent audit: {e}; its log:\n{}", tail(&log)))?;
    let wall = t0.elapsed().as_secs_f64();
    // 0, or 2 for findings (other processes of this shared machine may have some: only
    // those about the fleet count, below).
    ensure!(
        matches!(status.code(), Some(0 | 2)),
        "hami-agent audit exited with {status}; its log:\n{}",
        tail(&log)
    );
    let rep: Value = serde_json::from_str(&out).context("hami-agent audit --json: not JSON")?;
    let pids = check_report(&rep, fleet)?;
    Ok(AuditCost {
        pids,
        ready: ready.ok_or_else(|| anyhow!("hami-agent audit never said it was ready"))?,
        wall,
        cpu: cpu_secs(&ru),
        peak_rss_kib: ru.ru_maxrss,
    })
}

/// Every fleet process listed (hooked, its region, its slot's bytes), every region listed,
/// no finding about them. Returns their pids.
fn check_report(rep: &Value, fleet: &Fleet) -> Result<HashSet<u64>> {
    let rows = rep["processes"]
        .as_array()
        .ok_or_else(|| anyhow!("audit report without a processes array"))?;
    let regions = fleet.region_names();
    let ours: Vec<&Value> = rows
        .iter()
        .filter(|r| r["region"].as_str().is_some_and(|n| regions.contains(n)))
        .collect();
    ensure!(
        ours.len() == fleet.procs,
        "audit lists {} of the fleet's {} processes with their region ({} rows in all)",
        ours.len(),
        fleet.procs,
        rows.len()
    );
    let bad: Vec<&&Value> = ours
        .iter()
        .filter(|r| {
            r["hooked"] != Value::Bool(true)
                || r["accounted"].as_u64() != Some(PROC_BYTES)
                || r["verdict"] != "ok"
        })
        .take(3)
        .collect();
    ensure!(
        bad.is_empty(),
        "fleet processes not seen as hooked with their slot ({PROC_BYTES} bytes), verdict ok: {bad:?}"
    );
    let listed = rep["regions"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter(|r| r["name"].as_str().is_some_and(|n| regions.contains(n)))
                .count()
        })
        .unwrap_or(0);
    ensure!(
        listed == fleet.regions(),
        "audit lists {listed} of the fleet's {} regions",
        fleet.regions()
    );
    let pids: HashSet<u64> = ours.iter().filter_map(|r| r["pid"].as_u64()).collect();
    let findings: Vec<&Value> = rep["findings"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter(|f| about_fleet(f, &regions, &pids))
                .collect()
        })
        .unwrap_or_default();
    ensure!(
        findings.is_empty(),
        "audit reports {} finding(s) on a clean fleet: {findings:?}",
        findings.len()
    );
    Ok(pids)
}

/// Whether a finding (its JSON, from the report or a log record's fields) is about the fleet.
fn about_fleet(f: &Value, regions: &HashSet<String>, pids: &HashSet<u64>) -> bool {
    f["region"].as_str().is_some_and(|n| regions.contains(n))
        || f["pid"].as_u64().is_some_and(|p| pids.contains(&p))
}

/// What the running agent cost.
struct RunCost {
    ready: f64,
    ticks: u64,
    tick_mean: f64,
    tick_max_bucket: f64,
    cpu_per_sec: f64,
    rss_kib: u64,
    peak_rss_kib: u64,
    scrape: f64,
}

/// `VmRSS` and `VmHWM` of a process, KiB.
fn rss_kib(pid: u32) -> (u64, u64) {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let get = |k: &str| {
        s.lines()
            .find_map(|l| l.strip_prefix(k))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or(0)
    };
    (get("VmRSS:"), get("VmHWM:"))
}

/// utime + stime of a process in seconds.
fn proc_cpu(pid: u32) -> f64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let f: Vec<&str> = s
        .rsplit_once(") ")
        .map(|(_, r)| r.split_whitespace().collect())
        .unwrap_or_default();
    // Fields 14 and 15 (utime, stime) are at 11 and 12 after the state (field 3).
    let ticks: u64 = [11, 12]
        .iter()
        .filter_map(|&i| f.get(i)?.parse::<u64>().ok())
        .sum();
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1);
    ticks as f64 / hz as f64
}

/// `sum` and `count` of `hami_tick_duration_seconds`, and the smallest bucket holding
/// every tick. Samples carry labels (the agent's `node`, the buckets' `le`).
fn tick_stats(text: &str) -> (f64, u64, f64) {
    // (family, labels, value) of each sample line.
    let samples = || {
        text.lines().filter_map(|l| {
            let (series, v) = l.rsplit_once(' ')?;
            let (name, labels) = series.split_once('{').unwrap_or((series, ""));
            Some((name, labels, v.parse::<f64>().ok()?))
        })
    };
    let val = |name: &str| samples().find_map(|(n, _, v)| (n == name).then_some(v));
    let sum = val("hami_tick_duration_seconds_sum").unwrap_or(0.0);
    let count = val("hami_tick_duration_seconds_count").unwrap_or(0.0) as u64;
    let max_bucket = samples()
        .filter(|(n, _, _)| *n == "hami_tick_duration_seconds_bucket")
        .filter_map(|(_, labels, v)| {
            let le = labels.split("le=\"").nth(1)?.split('"').next()?;
            Some((le.parse::<f64>().unwrap_or(f64::INFINITY), v as u64))
        })
        .find(|&(_, n)| n >= count)
        .map_or(f64::INFINITY, |(le, _)| le);
    (sum, count, max_bucket)
}

/// `hami-agent run` over the fleet for `window`, measured.
fn run_agent(
    bin: &Path,
    art: &Artifacts,
    env: &TestEnv,
    fleet: &Fleet,
    pids: &HashSet<u64>,
    window: Duration,
) -> Result<RunCost> {
    let mut c = agent_command(bin, art, env);
    c.args([
        "run",
        "--json-log",
        "--metrics-addr",
        "127.0.0.1:0",
        "--interval",
        "1000",
        "--libcuda",
    ])
    .arg(&art.fake_libcuda)
    .env("RUST_LOG", "info");
    let t0 = Instant::now();
    let mut addr = String::new();
    let mut agent = AgentProcess::try_spawn_within(c, READY_WAIT, |l| {
        if let Ok(v) = serde_json::from_str::<Value>(l) {
            if v["fields"]["message"] == "serving /metrics" {
                addr = v["fields"]["addr"].as_str().unwrap_or_default().to_string();
            }
        }
    })
    .context("hami-agent run: not ready")?;
    let at_ready = agent.log().len();
    let ready = t0.elapsed().as_secs_f64();
    ensure!(
        !addr.is_empty(),
        "the agent did not say where it serves /metrics"
    );
    let pid = agent.pid() as u32;
    // Wait for the first tick after ready (it takes in what the baseline left).
    let first = Instant::now() + Duration::from_secs(120);
    let m0 = loop {
        let m = crate::demo::http_get(&addr, "/metrics")?;
        if tick_stats(&m).1 >= 1 || Instant::now() > first {
            break m;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let (s0, n0, _) = tick_stats(&m0);
    let c0 = proc_cpu(pid);
    let w0 = Instant::now();
    std::thread::sleep(window);
    let ts = Instant::now();
    let m1 = crate::demo::http_get(&addr, "/metrics")?;
    let scrape = ts.elapsed().as_secs_f64();
    let wall = w0.elapsed().as_secs_f64();
    let c1 = proc_cpu(pid);
    let (s1, n1, max_bucket) = tick_stats(&m1);
    let (rss, hwm) = rss_kib(pid);
    let metric = |n: &str| crate::demo::metric(&m1, n, &[]);
    // At least the fleet (other processes of this shared machine may use CUDA too).
    ensure!(
        metric("hami_processes_tracked") >= Some(fleet.procs as u64),
        "the running agent tracks {:?} processes, the fleet has {}",
        metric("hami_processes_tracked"),
        fleet.procs
    );
    ensure!(
        metric("hami_regions_tracked") >= Some(fleet.regions() as u64),
        "the running agent tracks {:?} regions, the fleet has {}",
        metric("hami_regions_tracked"),
        fleet.regions()
    );
    // Findings are logged as they are raised (other processes of this shared machine may
    // have some: only those about the fleet count).
    let regions = fleet.region_names();
    agent.drain();
    let ours: Vec<Value> = agent.log()[at_ready..]
        .iter()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .map(|v| v["fields"].clone())
        .filter(|f| f.get("kind").is_some() && about_fleet(f, &regions, pids))
        .collect();
    ensure!(
        ours.is_empty(),
        "{} finding(s) raised on a clean fleet: {ours:?}",
        ours.len()
    );
    ensure!(
        n1 > n0,
        "no tick in {window:?} (the tick is slower than the window)"
    );
    drop(agent);
    Ok(RunCost {
        ready,
        ticks: n1 - n0,
        tick_mean: (s1 - s0) / (n1 - n0) as f64,
        tick_max_bucket: max_bucket,
        cpu_per_sec: (c1 - c0) / wall,
        rss_kib: rss,
        peak_rss_kib: hwm,
        scrape,
    })
}

/// Names another `hami-agent` binary (a release build of an earlier commit, eBPF embedded):
/// on the whole fleet, it and this build are then measured in alternation, so that the
/// machine's load hits both alike (the baseline measured in the same run).
pub(super) const BASELINE_AGENT: &str = "HAMI_SCALE_BASELINE_AGENT";

/// Rounds of [`alternate`].
const ALTERNATE_ROUNDS: usize = 2;

/// [`BASELINE_AGENT`] and this build, alternated on the same fleet: an audit and a run each,
/// [`ALTERNATE_ROUNDS`] times; both must pass the same checks.
fn alternate(
    base: &Path,
    bin: &Path,
    art: &Artifacts,
    env: &TestEnv,
    fleet: &Fleet,
    p: &Profile,
    r: &mut Report,
) -> Result<()> {
    let (nr, np) = (fleet.regions(), fleet.procs);
    let window = Duration::from_secs(p.scale_window_secs);
    for round in 1..=ALTERNATE_ROUNDS {
        for (name, b) in [("baseline", base), ("this build", bin)] {
            let tag =
                format!("scale {nr} regions / {np} processes, alternated round {round}, {name}");
            let a = audit(b, art, env, fleet).with_context(|| format!("{tag}: audit"))?;
            let run = run_agent(b, art, env, fleet, &a.pids, window)
                .with_context(|| format!("{tag}: run"))?;
            r.figure(
                &format!(
                    "{tag}: audit wall / CPU / peak RSS; run tick mean / CPU per second / peak RSS"
                ),
                format!(
                    "{:.2} s / {:.2} s / {:.1} MiB; {:.1} ms / {:.1} % / {:.1} MiB",
                    a.wall,
                    a.cpu,
                    a.peak_rss_kib as f64 / 1024.0,
                    run.tick_mean * 1e3,
                    run.cpu_per_sec * 100.0,
                    run.peak_rss_kib as f64 / 1024.0
                ),
            );
        }
    }
    Ok(())
}

/// The scenario: the fleet at a fifth of its size, then whole; at each size an audit and a
/// running agent, measured.
pub(super) fn scale(p: &Profile, r: &mut Report) -> Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("the agent loads eBPF programs: run as root");
    }
    let (art, bin) = crate::demo::build(&hami_test_harness::workspace_root())?;
    let prog = art.compile_against_fake(
        &hami_test_harness::workspace_root().join("testing/programs/scaleproc.c"),
        "scaleproc",
    );
    let env = sandbox(1 << 30);
    let mut fleet = Fleet::new();
    let per = p.scale_procs / p.scale_regions;
    let mut last: Option<(usize, usize, f64, f64)> = None;
    for regions in [p.scale_regions / 5, p.scale_regions] {
        let t = Instant::now();
        fleet.grow(&env, &prog, regions, per)?;
        let (nr, np) = (fleet.regions(), fleet.procs);
        let tag = format!("scale {nr} regions / {np} processes");
        println!(
            "    {np} processes on {nr} regions started in {:.1} s",
            t.elapsed().as_secs_f64()
        );
        let a = audit(&bin, art, &env, &fleet).with_context(|| format!("{tag}: audit"))?;
        r.figure(
            &format!("{tag}: audit ready after / wall / CPU / peak RSS"),
            format!(
                "{:.2} s / {:.2} s / {:.2} s / {:.1} MiB",
                a.ready,
                a.wall,
                a.cpu,
                a.peak_rss_kib as f64 / 1024.0
            ),
        );
        let window = Duration::from_secs(p.scale_window_secs);
        let run = run_agent(&bin, art, &env, &fleet, &a.pids, window)
            .with_context(|| format!("{tag}: run"))?;
        r.figure(
            &format!("{tag}: run ready after"),
            format!("{:.2} s", run.ready),
        );
        r.figure(
            &format!("{tag}: run tick mean (worst <=) over {} ticks", run.ticks),
            format!(
                "{:.1} ms ({} ms)",
                run.tick_mean * 1e3,
                run.tick_max_bucket * 1e3
            ),
        );
        r.figure(
            &format!("{tag}: run tick per region / per process"),
            format!(
                "{:.1} us / {:.1} us",
                run.tick_mean * 1e6 / nr as f64,
                run.tick_mean * 1e6 / np as f64
            ),
        );
        r.figure(
            &format!("{tag}: run CPU per second (1 s ticks), RSS now / peak, one /metrics GET"),
            format!(
                "{:.1} % / {:.1} MiB / {:.1} MiB / {:.0} ms",
                run.cpu_per_sec * 100.0,
                run.rss_kib as f64 / 1024.0,
                run.peak_rss_kib as f64 / 1024.0,
                run.scrape * 1e3
            ),
        );
        if let Some((pr, pp, pa, pt)) = last {
            // Cost per process at the larger size over that at the smaller: about 1 when
            // the scan is linear.
            let grow = np as f64 / pp as f64;
            let audit_ratio = (a.cpu / pa) / grow;
            let tick_ratio = (run.tick_mean / pt) / grow;
            r.figure(
                &format!("scale growth {pr}->{nr} regions: audit CPU / tick, per process, ratio"),
                format!("{audit_ratio:.2} / {tick_ratio:.2}"),
            );
            r.check(tick_ratio < p.scale_max_ratio, || {
                format!(
                    "the tick's cost per process grew {tick_ratio:.2}x from {pp} to {np} processes (linear: about 1; bound {})",
                    p.scale_max_ratio
                )
            });
        }
        last = Some((nr, np, a.cpu, run.tick_mean));
    }
    if let Some(base) = std::env::var_os(BASELINE_AGENT).map(PathBuf::from) {
        alternate(&base, &bin, art, &env, &fleet, p, r)?;
    }
    drop(fleet);
    let left = crate::demo::processes_using(env.dir());
    r.check(left.is_empty(), || {
        format!("fleet processes left after the scenario: {left:?}")
    });
    Ok(())
}

#[cfg(test)]
mod tick_stats_tests {
    /// The agent's exposition: every sample labelled with its node, the buckets' `le` last.
    #[test]
    fn reads_labelled_histogram_samples() {
        let m = "hami_tick_duration_seconds_bucket{node=\"n1\",le=\"0.001\"} 1\n\
                 hami_tick_duration_seconds_bucket{node=\"n1\",le=\"0.0025\"} 3\n\
                 hami_tick_duration_seconds_bucket{node=\"n1\",le=\"+Inf\"} 3\n\
                 hami_tick_duration_seconds_sum{node=\"n1\"} 0.004\n\
                 hami_tick_duration_seconds_count{node=\"n1\"} 3\n";
        assert_eq!(super::tick_stats(m), (0.004, 3, 0.0025));
        let bare = "hami_tick_duration_seconds_bucket{le=\"0.5\"} 2\n\
                    hami_tick_duration_seconds_sum 0.6\nhami_tick_duration_seconds_count 2\n";
        assert_eq!(super::tick_stats(bare), (0.6, 2, 0.5));
    }
}
