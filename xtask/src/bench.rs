//! `cargo xtask bench`: every benchmark of the workspace (release), then one summary table.
//!
//! 1. `cargo bench -p hami-common --bench region`: region charge/uncharge pair,
//!    1/8/64 processes contending, registration with 1000 live slots;
//! 2. `cargo bench -p hami-preload --bench overhead`: ns per `cuMemAlloc_v2`+`cuMemFree_v2`
//!    pair on the fake driver with and without the preload (same run), 1/8/64 processes on one
//!    region, registration with 1000 live slots, and `cuLaunchKernel` native vs preloaded
//!    (an empty kernel, one with 24 KiB of local memory);
//! 3. `cargo bench -p hami-user --bench probes` (root): the same pair with the eBPF probes
//!    attached and not, events/s with the drop counters;
//! 4. the real `hami-agent run` (release) under load: one `cudaprobe bench-pair` per CPU
//!    against the fake driver; events/s it consumed, drops, and its RSS (idle, peak);
//! 5. the preload's cost per exec of `/bin/true` against an empty preload
//!    ([`crate::bench_exec`]; alone: `cargo xtask bench exec`, no root needed).
//!
//! The benchmarks' own output is shown as it comes; the summary is printed at the end and
//! saved to `<target dir>/bench-summary.md`. It is a benchmark, not a test: figures are
//! reported, never judged, except that a benchmark that fails or prints no figure fails the
//! task.

use std::fmt::Write as _;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, ensure, Context, Result};

use crate::demo::{metric, Agent};
use crate::util::{cargo, project_root, run_checked};

/// Pairs per process in the agent load test.
const LOAD_PAIRS: u64 = 200_000;

/// A benchmark `cargo xtask bench` can run alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Only {
    /// The preload's cost per exec ([`crate::bench_exec`]).
    Exec,
}

/// Run every benchmark (or only `only`) and print the summary; `compare`: other preloads for
/// the exec bench.
pub fn bench(only: Option<Only>, compare: &[PathBuf]) -> Result<()> {
    if only == Some(Only::Exec) {
        let root = project_root();
        let target = target_dir(&root)?;
        crate::bench_exec::bench_exec(&root, &target, compare)?;
        return Ok(());
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("the eBPF benchmarks load programs into the kernel: run as root");
    }
    let root = project_root();
    crate::setup::setup().context("setup failed")?;
    let target = target_dir(&root)?;
    let context = machine_context(&root);

    step("region (hami-common)");
    let region = run_bench(&root, &["-p", "hami-common", "--bench", "region"])?;
    step("preload overhead (hami-preload)");
    let preload = run_bench(&root, &["-p", "hami-preload", "--bench", "overhead"])?;
    step("eBPF probes (hami-user)");
    let probes = run_bench(&root, &["-p", "hami-user", "--bench", "probes"])?;
    step("hami-agent run under load");
    let load = agent_load(&root, &target)?;
    step("cost per exec (preload vs empty preload)");
    let exec = crate::bench_exec::bench_exec(&root, &target, compare)?;
    let exec_row = need(exec.summary_row(), "exec cost (exec bench)")?;

    let summary = summarize(&context, &region, &preload, &probes, &load, &exec_row)?;
    let path = target.join("bench-summary.md");
    std::fs::write(&path, &summary).with_context(|| format!("writing {}", path.display()))?;
    println!("\n{summary}");
    println!("(saved to {})", path.display());
    Ok(())
}

fn step(what: &str) {
    println!("\n==> xtask bench: {what}");
}

/// The cargo target dir, as cargo itself resolves it.
fn target_dir(root: &Path) -> Result<PathBuf> {
    let out = cargo(root)
        .args(["metadata", "--format-version", "1", "--no-deps"])
        .stderr(Stdio::inherit())
        .output()
        .context("running cargo metadata")?;
    ensure!(out.status.success(), "cargo metadata failed");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    v["target_directory"]
        .as_str()
        .map(PathBuf::from)
        .ok_or_else(|| anyhow!("cargo metadata gave no target_directory"))
}

/// Commit, CPUs, load average: what the figures depend on.
fn machine_context(root: &Path) -> String {
    let commit = Command::new("git")
        .args(["describe", "--always", "--dirty"])
        .current_dir(root)
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| "unknown".into());
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let load = std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next().map(str::to_string))
        .unwrap_or_else(|| "?".into());
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, m)| m.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    format!(
        "commit {commit}; {cpus} CPUs ({cpu}); load average {load} at start; \
         fake driver (testing/fake-cuda), release builds"
    )
}

/// `cargo bench ARGS` with its stdout shown and returned.
fn run_bench(root: &Path, args: &[&str]) -> Result<String> {
    let mut cmd = cargo(root);
    cmd.arg("bench").args(args);
    let shown = format!("cargo bench {}", args.join(" "));
    println!("$ {shown}");
    cmd.stdout(Stdio::piped()).stderr(Stdio::inherit());
    let mut child = cmd.spawn().with_context(|| format!("starting {shown}"))?;
    let mut text = String::new();
    let out = child.stdout.take().expect("piped stdout");
    for line in BufReader::new(out).lines() {
        let line = line?;
        println!("{line}");
        text.push_str(&line);
        text.push('\n');
    }
    let st = child.wait()?;
    ensure!(st.success(), "{shown} failed with {st}");
    Ok(text)
}

/// What the real agent did under load.
#[derive(Debug, Default, Clone, PartialEq)]
struct AgentLoad {
    processes: usize,
    pairs_per_process: u64,
    events: u64,
    dropped: u64,
    seconds: f64,
    rss_idle_kib: u64,
    rss_peak_kib: u64,
    /// The agent's CPU time (user + system) while it consumed the load, ms.
    cpu_ms: f64,
}

/// A process's CPU time (user + system) from `/proc/<pid>/stat`, ms.
fn cpu_ms(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command (which may hold spaces): state is field 3, utime 14, stime 15.
    let rest = stat.rsplit_once(')')?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    Some(ticks * 1000.0 / hz)
}

/// Starts the release `hami-agent run` on the fake driver the probes bench laid out, runs one
/// `cudaprobe bench-pair` per CPU (no preload: every pair is two events) and measures.
fn agent_load(root: &Path, target: &Path) -> Result<AgentLoad> {
    run_checked(cargo(root).args([
        "build",
        "--release",
        "-p",
        "hami-user",
        "--bin",
        "hami-agent",
    ]))?;
    let release = target.join("release");
    let agent_bin = release.join("hami-agent");
    // Laid out by the harness when the probes bench ran (release profile).
    let lib_dir = release.join("fake-driver");
    let libcuda = lib_dir.join("libcuda.so.1");
    let cudaprobe = release.join("test-programs").join("cudaprobe");
    for p in [&agent_bin, &libcuda, &cudaprobe] {
        ensure!(
            p.exists(),
            "{} missing (the probes bench builds it)",
            p.display()
        );
    }
    let dir = std::env::temp_dir().join(format!("hami-bench-agent-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let _cleanup = RemoveOnDrop(dir.clone());
    let env = [
        ("LD_LIBRARY_PATH", lib_dir.display().to_string()),
        (
            "FAKE_CUDA_STATE",
            dir.join("fake.state").display().to_string(),
        ),
        ("FAKE_CUDA_DEVICE_COUNT", "1".to_string()),
        ("FAKE_CUDA_TOTAL_MEM", "1T".to_string()),
    ];
    let mut c = Command::new(&agent_bin);
    c.args([
        "run",
        "--json-log",
        "--metrics-addr",
        "127.0.0.1:0",
        "--libcuda",
    ])
    .arg(&libcuda)
    .env_remove("LD_PRELOAD")
    .envs(env.iter().map(|(k, v)| (k, v)));
    println!(
        "$ hami-agent run --json-log --metrics-addr 127.0.0.1:0 --libcuda {}",
        libcuda.display()
    );
    let agent = Agent::spawn(c, true)?;
    println!("    {}", agent.ready);
    let pid = agent.pid();
    std::thread::sleep(Duration::from_millis(500));
    let rss_idle_kib = status_kib(pid, "VmRSS:").unwrap_or(0);
    let m0 = agent.metrics()?;
    let (ev0, drop0) = (sum_metric(&m0, "hami_events_total"), dropped(&m0));
    let cpu0 = cpu_ms(pid).unwrap_or(0.0);

    let processes = std::thread::available_parallelism().map_or(2, |n| n.get());
    let t0 = Instant::now();
    let mut kids = Vec::new();
    for _ in 0..processes {
        kids.push(
            Command::new(&cudaprobe)
                .args(["init", "ctx", "bench-pair", &LOAD_PAIRS.to_string(), "4K"])
                .env_remove("LD_PRELOAD")
                .envs(env.iter().map(|(k, v)| (k, v)))
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .context("starting cudaprobe")?,
        );
    }
    for k in kids {
        let out = k.wait_with_output()?;
        let text = String::from_utf8_lossy(&out.stdout);
        ensure!(
            out.status.success() && text.contains("failures=0"),
            "cudaprobe bench-pair failed:\n{text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // Until the agent has consumed every event (both per pair) or the count stops moving.
    let want = ev0 + 2 * LOAD_PAIRS * processes as u64;
    let mut last = (0, Instant::now());
    let (events, secs, m) = loop {
        let m = agent.metrics()?;
        let ev = sum_metric(&m, "hami_events_total");
        let now = Instant::now();
        if ev >= want {
            break (ev - ev0, t0.elapsed().as_secs_f64(), m);
        }
        if ev != last.0 {
            last = (ev, now);
        } else if now.duration_since(last.1) > Duration::from_secs(3) {
            break (ev - ev0, last.1.duration_since(t0).as_secs_f64(), m);
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let rss_peak_kib = status_kib(pid, "VmHWM:").unwrap_or(0);
    let cpu = cpu_ms(pid).unwrap_or(cpu0) - cpu0;
    let load = AgentLoad {
        cpu_ms: cpu,
        processes,
        pairs_per_process: LOAD_PAIRS,
        events,
        dropped: dropped(&m) - drop0,
        seconds: secs,
        rss_idle_kib,
        rss_peak_kib,
    };
    println!(
        "agent: {} events in {:.2} s ({:.0}/s), {} dropped; RSS idle {} KiB, peak {} KiB",
        load.events,
        load.seconds,
        load.events as f64 / load.seconds,
        load.dropped,
        load.rss_idle_kib,
        load.rss_peak_kib
    );
    agent.stop()?;
    Ok(load)
}

struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A `/proc/<pid>/status` field in KiB.
fn status_kib(pid: u32, field: &str) -> Option<u64> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()?
        .lines()
        .find(|l| l.starts_with(field))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// The sum of every sample of `name` (all label sets).
fn sum_metric(text: &str, name: &str) -> u64 {
    text.lines()
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|r| r.starts_with('{') || r.starts_with(' '))
        })
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .map(|v| v as u64)
        .sum()
}

fn dropped(m: &str) -> u64 {
    metric(m, "hami_events_dropped_total", &[]).unwrap_or(0)
}

/// The first number on the first line starting with `prefix` (after the prefix).
/// The number after `added ` on the line starting with `prefix`.
fn added_of(text: &str, prefix: &str) -> Option<f64> {
    let line = text
        .lines()
        .map(str::trim_start)
        .find(|l| l.starts_with(prefix))?;
    line.split("added ")
        .nth(1)?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

fn figure(text: &str, prefix: &str) -> Option<f64> {
    text.lines()
        .map(str::trim_start)
        .find_map(|l| l.strip_prefix(prefix))
        .and_then(|rest| {
            rest.split(|c: char| c.is_whitespace() || c == ',' || c == ':')
                .find_map(|t| t.parse::<f64>().ok())
        })
}

/// The region bench's contended line for `procs` (`label`: "" for the lock on every
/// admission, " with reserves"): (ns per pair seen by each process, million pairs per second
/// in total, CPU ns per pair over all processes).
fn contended(text: &str, procs: u32, label: &str) -> Option<(f64, f64, f64)> {
    let prefix = format!("contended, {procs:>2} processes{label}:");
    let line = text
        .lines()
        .map(str::trim_start)
        .find(|l| l.starts_with(&prefix))?;
    let ns = figure(line, &prefix)?;
    let part = |what: &str| -> Option<f64> {
        line.split(',')
            .find(|part| part.contains(what))?
            .split_whitespace()
            .find_map(|t| t.parse().ok())
    };
    Some((ns, part("M pairs/s")?, part("CPU ns per pair")?))
}

/// `key=value` figure of the probes bench.
fn kv(text: &str, key: &str) -> Option<f64> {
    figure(text, &format!("{key}="))
}

/// A row of the preload bench's table: `procs cpu_without cpu_with added mpairs_without
/// mpairs_with` (CPU ns per pair over all processes, million pairs per second in total);
/// with `prefix` "locked", the same row of the baseline table (`HAMI_ADMISSION_RESERVE=0`).
fn preload_row(text: &str, procs: u32, prefix: &str) -> Option<[f64; 5]> {
    text.lines().find_map(|l| {
        let l = if prefix.is_empty() {
            l
        } else {
            l.trim_start().strip_prefix(prefix)?
        };
        let v: Vec<f64> = l
            .split_whitespace()
            .map(|t| t.parse::<f64>())
            .collect::<Result<_, _>>()
            .ok()?;
        (v.len() == 6 && v[0] == f64::from(procs)).then(|| [v[1], v[2], v[3], v[4], v[5]])
    })
}

/// The preload bench's launch line for `label` (`empty kernel`, ...): ns per launch native,
/// preloaded, added.
fn launch_row(text: &str, label: &str) -> Option<[f64; 3]> {
    let line = text
        .lines()
        .map(str::trim_start)
        .find(|l| l.starts_with(&format!("launch ({label},")))?;
    let after = |key: &str| -> Option<f64> {
        line.split(key)
            .nth(1)?
            .split_whitespace()
            .next()?
            .trim_start_matches('+')
            .parse()
            .ok()
    };
    Some([
        after(": native ")?,
        after(", preloaded ")?,
        after(", added ")?,
    ])
}

fn need<T>(v: Option<T>, what: &str) -> Result<T> {
    v.ok_or_else(|| anyhow!("no figure for {what} in the benchmark output"))
}

/// The summary table (markdown).
fn summarize(
    context: &str,
    region: &str,
    preload: &str,
    probes: &str,
    load: &AgentLoad,
    exec_row: &str,
) -> Result<String> {
    let mut s = String::from("# hami-rs benchmark summary\n\n");
    writeln!(s, "{context}.\n")?;
    writeln!(s, "| figure | measured | target |")?;
    writeln!(s, "|---|---|---|")?;

    for procs in [1u32, 8, 64] {
        let [without, with, added, mps_without, mps_with] = need(
            preload_row(preload, procs, ""),
            &format!("{procs} processes (preload bench)"),
        )?;
        let [_, _, added_locked, _, _] = need(
            preload_row(preload, procs, "locked"),
            &format!("{procs} processes, HAMI_ADMISSION_RESERVE=0 (preload bench)"),
        )?;
        let target = match procs {
            1 => "< 100 ns added",
            _ => "flat to 64 processes",
        };
        writeln!(
            s,
            "| `cuMemAlloc_v2`+`cuMemFree_v2` pair, {procs} process{} on one region, CPU ns per pair: without / with preload / **added** (pairs/s of all processes: without / with); added with `HAMI_ADMISSION_RESERVE=0` (lock on every admission) in the same rounds | {without:.1} / {with:.1} / **{added:+.1} ns** ({mps_without:.2} / {mps_with:.2} M/s); locked: {added_locked:+.1} ns | {target} |",
            if procs == 1 { "" } else { "es" }
        )?;
    }
    for label in ["empty kernel", "kernel with 24 KiB local memory"] {
        let [native, with, added] = need(
            launch_row(preload, label),
            &format!("launch of an {label} (preload bench)"),
        )?;
        writeln!(
            s,
            "| `cuLaunchKernel` of an {label} (fake driver), ns per launch: native / preloaded / **added**, same run | {native:.1} / {with:.1} / **{added:+.1} ns** | same launch cost |"
        )?;
    }
    let native = need(
        figure(preload, "launch hook, native:"),
        "launch hook (preload bench)",
    )?;
    for (label, prefix) in [
        ("no compute share", "launch hook, no share:"),
        (
            "`CUDA_DEVICE_SM_LIMIT=50` (the launch gate)",
            "launch hook, 50 % share:",
        ),
    ] {
        let with = need(figure(preload, prefix), "launch hook (preload bench)")?;
        let added = need(
            figure(preload, prefix).and(added_of(preload, prefix)),
            "launch hook (preload bench)",
        )?;
        writeln!(
            s,
            "| `cuLaunchKernel` of a 0 ns kernel (fake driver), CPU ns per launch, {label}: native / with preload / **added** | {native:.1} / {with:.1} / **{added:+.1} ns** | {} |",
            if prefix.contains("no share") { "within noise of native" } else { "" }
        )?;
    }
    let reg_preload = need(
        figure(preload, "register+unregister with 1000 live slots:"),
        "registration (preload bench)",
    )?;
    writeln!(
        s,
        "| register + unregister a process with 1000 live slots (preload bench, real pids) | **{reg_preload:.1} µs** | < 100 µs |"
    )?;
    let reg_region = need(
        figure(region, "register+unregister with 1000 live slots:"),
        "registration (region bench)",
    )?;
    writeln!(
        s,
        "| register + unregister with 1000 live slots (region bench, liveness injected) | {reg_region:.2} µs | < 100 µs |"
    )?;
    let charge = need(
        figure(region, "try_charge+uncharge pair, 1 thread:"),
        "charge/uncharge (region bench)",
    )?;
    writeln!(
        s,
        "| region `try_charge`+`uncharge` pair, 1 thread | **{charge:.1} ns** | |"
    )?;
    for (label, what) in [
        ("", "lock on every admission"),
        (
            " with reserves",
            "admission reserves (the preload's default)",
        ),
    ] {
        let mut per = Vec::new();
        let mut total = Vec::new();
        let mut cpu = Vec::new();
        for procs in [1, 8, 64] {
            let (ns, mps, c) = need(
                contended(region, procs, label),
                &format!("contended {procs}{label} (region bench)"),
            )?;
            per.push(ns);
            total.push(mps);
            cpu.push(c);
        }
        writeln!(
            s,
            "| region charge+uncharge pair, {what}, 1 / 8 / 64 processes contending: CPU ns per pair over all processes | **{:.1} / {:.1} / {:.1} ns** | contended within 1.2x of 1 process |",
            cpu[0], cpu[1], cpu[2]
        )?;
        writeln!(
            s,
            "| same, ns per pair seen by each (wall clock) / pairs per second of all processes together | {:.1} / {:.1} / {:.1} ns; {:.1} / {:.1} / {:.1} M/s | |",
            per[0], per[1], per[2], total[0], total[1], total[2]
        )?;
    }

    let base = need(
        kv(probes, "ns_per_pair_without_probes"),
        "pair without probes",
    )?;
    let with = need(kv(probes, "ns_per_pair_with_probes"), "pair with probes")?;
    let added = need(kv(probes, "added_ns_per_pair"), "added ns per pair")?;
    writeln!(
        s,
        "| pair without / with the eBPF probes attached / **added** (same run) | {base:.1} / {with:.1} / **{added:+.1} ns** | |"
    )?;
    let eps = need(kv(probes, "events_per_second"), "events per second")?;
    let sent = need(kv(probes, "events_sent"), "events sent")?;
    let dropped = need(kv(probes, "events_dropped"), "events dropped")?;
    let par = kv(probes, "parallel_processes").unwrap_or(0.0);
    writeln!(
        s,
        "| eBPF events/s into user space, {par:.0} processes (probes bench) | **{eps:.0} events/s**, {sent:.0} sent, {dropped:.0} dropped | zero drops |"
    )?;
    let agent_eps = load.events as f64 / load.seconds.max(1e-9);
    writeln!(
        s,
        "| `hami-agent run` consuming, {} processes x {} pairs | **{agent_eps:.0} events/s**, {} events, {} dropped | zero drops |",
        load.processes, load.pairs_per_process, load.events, load.dropped
    )?;
    writeln!(
        s,
        "| `hami-agent run` CPU: per 100k events/s (share of one core), over that load | **{:.1} %** ({:.0} ms CPU for {} events) | |",
        load.cpu_ms / 1000.0 * 100_000.0 / load.events.max(1) as f64 * 100.0,
        load.cpu_ms,
        load.events
    )?;
    writeln!(
        s,
        "| `hami-agent run` RSS: idle / peak under that load | {:.1} / **{:.1} MiB** | |",
        load.rss_idle_kib as f64 / 1024.0,
        load.rss_peak_kib as f64 / 1024.0
    )?;
    if let (Some(before), Some(after)) = (
        kv(probes, "rss_kib_before_probes"),
        kv(probes, "rss_kib_with_probes"),
    ) {
        writeln!(
            s,
            "| probes bench process RSS before / with probes loaded and streaming | {:.1} / {:.1} MiB | |",
            before / 1024.0,
            after / 1024.0
        )?;
    }
    s.push_str(exec_row);
    writeln!(
        s,
        "\nSources: `cargo bench -p hami-preload --bench overhead`, `cargo bench -p hami-common --bench region`, \
         `cargo bench -p hami-user --bench probes`, `hami-agent run` and the exec cost (`cargo xtask bench exec`) measured by `cargo xtask bench`. \
         Preload figures: processes released together by a barrier and stopped at a common deadline; CPU time (user+sys) per pair \
         over all processes, so time spent descheduled with more processes than CPUs is not counted (median of several rounds). \
         Region contention figures are wall-clock means per process and do include it."
    )?;
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    const REGION: &str = "shared-region benchmark (2 cores)
try_charge+uncharge pair, 1 thread:            41.3 ns
contended,  1 processes:     45.0 ns per pair seen by each process,   22.1 M pairs/s in total,   44.0 CPU ns per pair, region used after: 0
contended,  8 processes:    310.2 ns per pair seen by each process,    6.0 M pairs/s in total,  150.0 CPU ns per pair, region used after: 0
contended, 64 processes:   2900.5 ns per pair seen by each process,    5.0 M pairs/s in total,  250.0 CPU ns per pair, region used after: 0
contended,  1 processes with reserves:     40.0 ns per pair seen by each process,   24.0 M pairs/s in total,   40.0 CPU ns per pair, region used after: 0
contended,  8 processes with reserves:    170.0 ns per pair seen by each process,   45.0 M pairs/s in total,   42.0 CPU ns per pair, region used after: 0
contended, 64 processes with reserves:   1300.0 ns per pair seen by each process,   51.0 M pairs/s in total,   41.0 CPU ns per pair, region used after: 0
register+unregister with 1000 live slots:      3.25 us
";
    const PRELOAD: &str =
        "cuMemAlloc_v2+cuMemFree_v2 pair (fake driver, 1 MiB), 2 CPUs: N processes on one region ...
cpu = CPU ns (user+sys) per pair over all processes ...; Mpairs/s = pairs of all processes / wall time of the run.
 procs  cpu_without     cpu_with        added Mpairs/s_without   Mpairs/s_with
     1        250.0        300.5         50.5           4.00            3.33
     8        900.0       1000.0        100.0           2.22            2.00
    64       9000.0       9500.0        500.0           0.22            0.21
baseline of the same rounds: the preload with HAMI_ADMISSION_RESERVE=0
locked      1        250.0        340.0         90.0           4.00            3.00
locked      8        900.0       1150.0        250.0           2.22            1.80
locked     64       9000.0       9700.0        700.0           0.22            0.20
launch (empty kernel, fake driver, 200000 cuLaunchKernel): native 80.5 ns, preloaded 95.0 ns, added +14.5 ns per launch (median of 5 rounds)
launch (kernel with 24 KiB local memory, fake driver, 200000 cuLaunchKernel): native 81.0 ns, preloaded 160.0 ns, added +79.0 ns per launch (median of 5 rounds)
launch hook, native: 120.0 ns/launch
launch hook, no share: 125.5 ns/launch, added 5.5
launch hook, 50 % share: 900.0 ns/launch, added 780.0
register+unregister with 1000 live slots: 12.5 us
";
    const PROBES: &str = "pairs_per_process=200000
ns_per_pair_without_probes=250.0
ns_per_pair_with_probes=1250.5
added_ns_per_pair=1000.5
parallel_processes=2
events_sent=800000
events_dropped=0
events_per_second=1200000
rss_kib_before_probes=3000
rss_kib_with_probes=9000
";

    #[test]
    fn cpu_time_of_a_process_is_read() {
        let t = cpu_ms(std::process::id()).unwrap();
        assert!(t >= 0.0);
        assert_eq!(cpu_ms(u32::MAX), None);
    }

    #[test]
    fn figures_are_parsed_from_each_bench() {
        assert_eq!(
            figure(REGION, "try_charge+uncharge pair, 1 thread:"),
            Some(41.3)
        );
        assert_eq!(contended(REGION, 8, ""), Some((310.2, 6.0, 150.0)));
        assert_eq!(contended(REGION, 64, ""), Some((2900.5, 5.0, 250.0)));
        assert_eq!(
            contended(REGION, 8, " with reserves"),
            Some((170.0, 45.0, 42.0))
        );
        assert_eq!(contended(REGION, 2, ""), None);
        assert_eq!(
            figure(REGION, "register+unregister with 1000 live slots:"),
            Some(3.25)
        );
        assert_eq!(
            preload_row(PRELOAD, 8, ""),
            Some([900.0, 1000.0, 100.0, 2.22, 2.0])
        );
        assert_eq!(
            preload_row(PRELOAD, 8, "locked"),
            Some([900.0, 1150.0, 250.0, 2.22, 1.8])
        );
        assert_eq!(preload_row(PRELOAD, 2, ""), None);
        assert_eq!(
            launch_row(PRELOAD, "empty kernel"),
            Some([80.5, 95.0, 14.5])
        );
        assert_eq!(
            launch_row(PRELOAD, "kernel with 24 KiB local memory"),
            Some([81.0, 160.0, 79.0])
        );
        assert_eq!(launch_row(PRELOAD, "other kernel"), None);
        assert_eq!(figure(PRELOAD, "launch hook, native:"), Some(120.0));
        assert_eq!(figure(PRELOAD, "launch hook, no share:"), Some(125.5));
        assert_eq!(added_of(PRELOAD, "launch hook, no share:"), Some(5.5));
        assert_eq!(added_of(PRELOAD, "launch hook, 50 % share:"), Some(780.0));
        assert_eq!(added_of(PRELOAD, "launch hook, native:"), None);
        assert_eq!(kv(PROBES, "events_dropped"), Some(0.0));
        assert_eq!(kv(PROBES, "added_ns_per_pair"), Some(1000.5));
        assert_eq!(kv(PROBES, "nothing"), None);
    }

    #[test]
    fn summary_has_every_figure_and_fails_without_one() {
        let load = AgentLoad {
            processes: 2,
            pairs_per_process: 10,
            events: 40,
            dropped: 0,
            seconds: 0.5,
            rss_idle_kib: 10240,
            rss_peak_kib: 20480,
            cpu_ms: 100.0,
        };
        let s = summarize("ctx", REGION, PRELOAD, PROBES, &load, "| exec row |\n").unwrap();
        for want in [
            "**+50.5 ns**",
            "**+500.0 ns** (0.22 / 0.21 M/s)",
            "**12.5 µs**",
            "**25000.0 %** (100 ms CPU for 40 events)",
            "3.25 µs",
            "80.5 / 95.0 / **+14.5 ns**",
            "81.0 / 160.0 / **+79.0 ns**",
            "**41.3 ns**",
            "45.0 / 310.2 / 2900.5 ns; 22.1 / 6.0 / 5.0 M/s",
            "**44.0 / 150.0 / 250.0 ns**",
            "**40.0 / 42.0 / 41.0 ns**",
            "locked: +250.0 ns",
            "**+1000.5 ns**",
            "**1200000 events/s**",
            "**80 events/s**, 40 events, 0 dropped",
            "10.0 / **20.0 MiB**",
            "| exec row |\n",
        ] {
            assert!(s.contains(want), "{want:?} missing in:\n{s}");
        }
        let e = summarize("ctx", REGION, "", PROBES, &load, "").unwrap_err();
        assert!(e.to_string().contains("preload bench"), "{e}");
    }

    #[test]
    fn metric_sums_over_label_sets() {
        let m = "hami_events_total{kind=\"mem_alloc\"} 10\nhami_events_total{kind=\"mem_free\"} 7\nhami_events_total_x 100\nhami_events_dropped_total 3\n";
        assert_eq!(sum_metric(m, "hami_events_total"), 17);
        assert_eq!(dropped(m), 3);
    }
}
