//! The demo's story, steps 1 to 5: the agent started, a workload held to its quota, the same
//! program without the preload found as a bypass, a killed process's leaked slot reclaimed.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{anyhow, ensure, Result};
use hami_test_harness::{Artifacts, OpLine, ProbeOutput, RunningProbe};

use super::agent::{describe, inspect_json, metric, print_inspect, processes_using, Agent};
use super::driver::Driver;
use super::output::{check, header, human, print_lines, print_stderr, MIB};
use super::sandbox::Sandbox;

/// The quota of the demo's container.
const QUOTA: &str = "1G";
const QUOTA_BYTES: u64 = 1 << 30;
/// Allocation size of steps 2 and 3 (five of them: 1.25 GiB, over the quota).
const CHUNK: &str = "256M";
const CHUNK_BYTES: u64 = 256 * MIB;
const CHUNKS: usize = 5;
/// What the process killed in step 4 holds (fits next to a real H200 context, ~520 MiB).
const HELD: &str = "384M";
const HELD_BYTES: u64 = 384 * MIB;
/// Step size of the "full quota" allocation in step 4.
const FILL: &str = "32M";
const FILL_BYTES: u64 = 32 * MIB;
/// How long the agent may take to report a finding (it evaluates every 250 ms).
const FINDING_TIMEOUT: Duration = Duration::from_secs(5);

/// The story (steps 1 to 5).
pub(super) fn story(
    art: &Artifacts,
    agent_bin: &Path,
    driver: &Driver,
    sb: &Sandbox,
) -> Result<()> {
    let region = sb.region();
    let region_s = region.display().to_string();

    header("1/5", "the node agent");
    let mut agent = Agent::start(agent_bin, driver, sb)?;
    println!("    {}", agent.ready);
    println!("    serving http://{}/metrics", agent.metrics_addr);

    // ---------------------------------------------------------------------------------
    header(
        "2/5",
        &format!("a workload under the preload, quota {QUOTA}"),
    );
    let w = Workload {
        art,
        driver,
        sb,
        preload: true,
    };
    let mut ops = vec!["--via", "procaddr", "init", "ctx", "meminfo"];
    for _ in 0..CHUNKS {
        ops.extend(["alloc", CHUNK]);
    }
    ops.extend(["meminfo", "wait"]);
    w.show(&ops);
    let mut p = w.spawn(&ops);
    p.wait_for("wait");
    let pid = p.pid;
    print_lines(&p.seen);
    let lines: Vec<OpLine> = p.seen.iter().filter_map(|l| OpLine::parse(l)).collect();
    let allocs: Vec<&OpLine> = lines.iter().filter(|o| o.op == "alloc").collect();
    let granted = allocs.iter().take_while(|o| o.ok()).count();
    ensure!(granted >= 1, "no allocation was granted under the quota");
    ensure!(
        allocs[granted..]
            .iter()
            .all(|o| o.name() == Some("CUDA_ERROR_OUT_OF_MEMORY")),
        "after the first refusal every allocation must be refused with CUDA_ERROR_OUT_OF_MEMORY"
    );
    ensure!(
        granted < CHUNKS,
        "no allocation was refused at the quota ({CHUNKS} x {CHUNK} granted)"
    );
    let granted_bytes = granted as u64 * CHUNK_BYTES;
    check(&format!(
        "{granted} x {CHUNK} granted, then CUDA_ERROR_OUT_OF_MEMORY at the {QUOTA} quota"
    ));
    let meminfo = lines
        .iter()
        .find(|o| o.op == "meminfo")
        .ok_or_else(|| anyhow!("no meminfo line"))?;
    ensure!(
        meminfo.num("total") == Some(QUOTA_BYTES),
        "cuMemGetInfo total is {:?}, not the quota {QUOTA_BYTES}",
        meminfo.num("total")
    );
    check(&format!(
        "cuMemGetInfo reports total = {} (the quota, not the device), free = {}",
        human(QUOTA_BYTES),
        human(meminfo.num("free").unwrap_or(0))
    ));

    println!("\n$ hami-agent inspect {region_s}");
    print_inspect(agent_bin, &region)?;
    let ins = inspect_json(agent_bin, &region)?;
    let slot = ins["slots"]
        .as_array()
        .and_then(|s| s.iter().find(|s| s["pid"] == pid))
        .ok_or_else(|| anyhow!("no slot for pid {pid} in the region:\n{ins:#}"))?;
    let data = slot["usage"][0]["data"].as_u64().unwrap_or(0);
    ensure!(
        data == granted_bytes,
        "the region accounts {data} data bytes for pid {pid}, expected {granted_bytes}"
    );
    ensure!(
        ins["devices"][0]["used"].as_u64().unwrap_or(u64::MAX) <= QUOTA_BYTES,
        "region device 0 used is above the quota:\n{ins:#}"
    );
    check(&format!(
        "the region accounts {} of data for pid {pid} (+ its context), within the quota",
        human(data)
    ));

    let labels = format!("region=\"{region_s}\"");
    let deadline = Instant::now() + Duration::from_secs(3);
    let (observed, accounted) = loop {
        let m = agent.metrics()?;
        let observed = metric(&m, "hami_container_observed_bytes", &[&labels]);
        let accounted = metric(&m, "hami_container_accounted_data_bytes", &[&labels]);
        if (observed == Some(granted_bytes) && accounted == Some(granted_bytes))
            || Instant::now() > deadline
        {
            break (observed, accounted);
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    println!(
        "\n$ curl -s http://{}/metrics | grep {region_s}",
        agent.metrics_addr
    );
    for l in agent.metrics()?.lines() {
        if l.starts_with("hami_container_") && l.contains(&labels) {
            println!("    {l}");
        }
    }
    ensure!(
        observed == Some(granted_bytes) && accounted == Some(granted_bytes),
        "the agent should observe what the region accounts ({granted_bytes}): observed {observed:?}, accounted {accounted:?}"
    );
    agent.drain();
    ensure!(
        !agent.findings().iter().any(|f| f["pid"] == pid),
        "the agent reported a finding for the hooked process {pid}"
    );
    check("the agent observes through eBPF exactly what the region accounts; no finding for this process");
    p.resume();
    let out = p.finish();
    print_stderr(&out);
    ensure!(out.status.success(), "the workload failed:\n{}", out.dump());

    // ---------------------------------------------------------------------------------
    header("3/5", "the same program without the preload");
    let w = Workload {
        preload: false,
        ..w
    };
    w.show(&ops);
    let mut p = w.spawn(&ops);
    p.wait_for("wait");
    let t0 = Instant::now();
    let pid = p.pid;
    print_lines(&p.seen);
    let lines: Vec<OpLine> = p.seen.iter().filter_map(|l| OpLine::parse(l)).collect();
    let ok = lines.iter().filter(|o| o.op == "alloc" && o.ok()).count();
    ensure!(
        ok == CHUNKS,
        "without the preload every allocation should succeed ({ok} of {CHUNKS} did)"
    );
    let total_bytes = CHUNKS as u64 * CHUNK_BYTES;
    println!(
        "    (nothing enforces the quota: {} granted on a {QUOTA} quota)",
        human(total_bytes)
    );
    let f = agent.wait_json(FINDING_TIMEOUT, |f| {
        f["kind"] == "bypass" && f["pid"] == pid
    })?;
    let took = t0.elapsed();
    println!("\nagent log:");
    println!("    {}", describe(&f));
    ensure!(
        f["bytes"].as_u64() == Some(total_bytes),
        "the bypass finding should carry {total_bytes} bytes: {f}"
    );
    check(&format!(
        "bypass ({}) reported for pid {pid} with {} within {} ms",
        f["reason"].as_str().unwrap_or("?"),
        human(total_bytes),
        took.as_millis()
    ));
    let f = agent.wait_json(FINDING_TIMEOUT, |f| {
        f["kind"] == "over_limit" && f["region"] == region_s.as_str()
    })?;
    println!("    {}", describe(&f));
    check("over_limit reported for the region (observed data above its limit)");
    p.resume();
    let out = p.finish();
    ensure!(out.status.success(), "the workload failed:\n{}", out.dump());

    // ---------------------------------------------------------------------------------
    header("4/5", "a preloaded workload killed while holding memory");
    let w = Workload { preload: true, ..w };
    let ops = ["--via", "procaddr", "init", "ctx", "alloc", HELD, "wait"];
    w.show(&ops);
    let mut p = w.spawn(&ops);
    let a = p.wait_for("alloc");
    ensure!(a.ok(), "the {HELD} allocation failed: {}", a.raw);
    p.wait_for("wait");
    let pid = p.pid;
    print_lines(&p.seen);
    println!("\n$ kill -KILL {pid}");
    let st = p.kill();
    println!("    {st}");
    let f = agent.wait_json(FINDING_TIMEOUT, |f| {
        f["kind"] == "leaked_slot" && f["nspid"] == pid && f["region"] == region_s.as_str()
    })?;
    println!("\nagent log:");
    println!("    {}", describe(&f));
    let leaked = f["bytes"].as_u64().unwrap_or(0);
    ensure!(
        leaked >= HELD_BYTES,
        "the leaked slot should hold at least {HELD_BYTES} bytes: {f}"
    );
    check(&format!(
        "leaked_slot ({}) for pid {pid}: {} still accounted",
        f["reason"].as_str().unwrap_or("?"),
        human(leaked)
    ));
    let r = agent.wait_json(FINDING_TIMEOUT, |f| {
        f["message"] == "leaked slot reclaimed" && f["pid"] == pid
    })?;
    println!("    {}", describe(&r));
    println!("\n$ hami-agent inspect {region_s}");
    print_inspect(agent_bin, &region)?;
    let ins = inspect_json(agent_bin, &region)?;
    ensure!(
        ins["slots"].as_array().is_some_and(|s| s.is_empty())
            && ins["devices"][0]["used"] == 0
            && ins["reclaimed_slots"].as_u64() >= Some(1),
        "after the reclaim the region should have no slot and nothing used:\n{ins:#}"
    );
    check("the agent (--reclaim) released the slot through the region's protocol");

    let ops = ["--via", "procaddr", "init", "ctx", "meminfo", "fill", FILL];
    w.show(&ops);
    let out = w.run(&ops);
    print_lines(&out.stdout.lines().map(str::to_string).collect::<Vec<_>>());
    let free = out.last("meminfo").num("free").unwrap_or(0);
    let fill = out.last("fill").num("total").unwrap_or(0);
    ensure!(
        free >= HELD_BYTES && fill + FILL_BYTES > free && fill >= HELD_BYTES,
        "a new process should have the full quota (minus its own context): free {free}, filled {fill}"
    );
    check(&format!(
        "a new process allocated {} ({FILL} at a time) of the {} free under the quota",
        human(fill),
        human(free)
    ));

    // ---------------------------------------------------------------------------------
    header("5/5", "metrics, then stop");
    let m = agent.metrics()?;
    println!(
        "metrics: http://{}/metrics (hami-agent run serves them on 0.0.0.0:9494 by default)",
        agent.metrics_addr
    );
    println!("$ curl -s http://{}/metrics | grep ...", agent.metrics_addr);
    for l in m.lines() {
        let interesting = (l.starts_with("hami_container_") && l.contains(&labels))
            || l.starts_with("hami_findings_total")
            || l.starts_with("hami_events_total")
            || l.starts_with("hami_events_dropped_total")
            || l.starts_with("hami_slots_reclaimed_total")
            || l.starts_with("hami_libcuda_attached");
        if interesting {
            println!("    {l}");
        }
    }
    ensure!(
        metric(&m, "hami_events_dropped_total", &[]) == Some(0),
        "events were dropped"
    );
    ensure!(
        metric(&m, "hami_findings_total", &["kind=\"bypass\""]) >= Some(1)
            && metric(&m, "hami_findings_total", &["kind=\"leaked_slot\""]) >= Some(1)
            && metric(&m, "hami_slots_reclaimed_total", &[]) >= Some(1),
        "the metrics should count the bypass, the leaked slot and its reclaim"
    );
    check("the metrics count the findings and the reclaim; no event dropped");
    println!("\nstopping the agent (SIGTERM; a short-lived helper process detaches its uprobes)");
    let t = Instant::now();
    agent.stop()?;
    println!("    stopped in {:.1} s", t.elapsed().as_secs_f64());
    let left = processes_using(sb.path());
    ensure!(left.is_empty(), "processes left running: {left:?}");
    check("nothing left running");
    Ok(())
}

/// How the demo's workloads are started.
#[derive(Clone, Copy)]
pub(super) struct Workload<'a> {
    art: &'a Artifacts,
    driver: &'a Driver,
    sb: &'a Sandbox,
    preload: bool,
}

impl Workload<'_> {
    fn command(&self, ops: &[&str]) -> Command {
        let mut c = Command::new(&self.art.cudaprobe);
        c.args(ops);
        self.driver.apply(&mut c, self.sb);
        c.env("CUDA_DEVICE_MEMORY_LIMIT", QUOTA)
            .env("CUDA_DEVICE_MEMORY_SHARED_CACHE", self.sb.region())
            .env("LIBCUDA_LOG_LEVEL", "3")
            .current_dir(self.sb.path())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if self.preload {
            c.env("LD_PRELOAD", &self.art.preload_so);
        }
        c
    }

    /// Prints the command line as a user would type it.
    fn show(&self, ops: &[&str]) {
        let pre = if self.preload {
            "LD_PRELOAD=libhami_preload.so "
        } else {
            ""
        };
        println!(
            "\n$ {pre}CUDA_DEVICE_MEMORY_LIMIT={QUOTA} cudaprobe {}",
            ops.join(" ")
        );
    }

    fn spawn(&self, ops: &[&str]) -> RunningProbe {
        let mut c = self.command(ops);
        c.stdin(Stdio::piped());
        RunningProbe::start(c)
    }

    fn run(&self, ops: &[&str]) -> ProbeOutput {
        let out = self.command(ops).output().expect("spawn cudaprobe");
        ProbeOutput::from_output(out)
    }
}
