//! `cargo xtask demo`: the whole story, end to end, with real output (root; eBPF).
//!
//! 0. setup, then build the preload, the fake driver and `cudaprobe` (through the test
//!    harness's [`Artifacts`]) and `hami-agent`;
//! 1. start `hami-agent run --reclaim` and wait for its ready line;
//! 2. a workload under the preload with a 1 GiB quota: allocations granted, then refused with
//!    `CUDA_ERROR_OUT_OF_MEMORY` at the quota; `cuMemGetInfo` reports the quota; the region
//!    (`hami-agent inspect`) and the agent's metrics agree (accounted = observed);
//! 3. the same program without the preload: the agent's `bypass` finding (pid, bytes) and the
//!    region's `over_limit`;
//! 4. a preloaded workload SIGKILLed while holding memory: the `leaked_slot` finding, the
//!    agent reclaiming the slot, and a new process using the full quota;
//! 5. where the metrics are, a few lines of them, then everything stopped.
//!
//! The driver is the fake one (`testing/fake-cuda`) unless the machine has a real NVIDIA
//! driver: a `libcuda.so.1` that is not our fake (at `/usr/local/nvidia/lib64` or in the
//! `ld.so` cache) **and** a working `nvidia-smi`. Every step checks its expected outcome; the
//! demo exits non-zero if one did not happen.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, ensure, Context, Result};
use hami_test_harness::{Artifacts, OpLine, ProbeOutput, RunningProbe};
use serde_json::Value;

use crate::util::{cargo, project_root, run_checked};

const MIB: u64 = 1 << 20;
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

/// Run the demo (see the module doc).
pub fn demo() -> Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("the demo loads eBPF programs into the kernel: run it as root");
    }
    let root = project_root();
    header("0/5", "setup and build");
    crate::setup::setup().context("setup failed")?;
    let (art, agent_bin) = build(&root)?;
    let driver = Driver::detect(art);
    println!("\ndriver: {}", driver.describe());

    let sandbox = Sandbox::new()?;
    let started = Instant::now();
    let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| {
        story(art, &agent_bin, &driver, &sandbox)
    }));
    let result = match outcome {
        Ok(r) => r,
        Err(p) => Err(anyhow!(
            "a demo step panicked: {}",
            p.downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| p.downcast_ref::<&str>().copied())
                .unwrap_or("(no message)")
        )),
    };
    // Whatever happened, nothing of ours may be left running.
    let left = processes_using(sandbox.path());
    for pid in &left {
        // SAFETY: kill(2) on a process that uses our sandbox (one we started).
        unsafe { libc::kill(*pid as libc::pid_t, libc::SIGKILL) };
    }
    drop(sandbox);
    result?;
    ensure!(
        left.is_empty(),
        "processes were left running (killed now): {left:?}"
    );
    println!(
        "\ndemo: every step did what it should ({:.1} s after the build, {} driver)",
        started.elapsed().as_secs_f64(),
        driver.short()
    );
    Ok(())
}

/// Builds the artifacts; returns them and the `hami-agent` binary.
pub(crate) fn build(root: &Path) -> Result<(&'static Artifacts, PathBuf)> {
    println!("building the preload, the fake driver and cudaprobe (testing/harness)");
    let art = std::panic::catch_unwind(Artifacts::get)
        .map_err(|_| anyhow!("building the test artifacts failed (see the message above)"))?;
    let release = art.profile_dir.file_name().is_some_and(|n| n == "release");
    println!("building hami-agent (eBPF object embedded)");
    let mut cmd = cargo(root);
    cmd.args(["build", "-p", "hami-user", "--bin", "hami-agent"])
        .env("CARGO_TARGET_DIR", &art.target_dir);
    if release {
        cmd.arg("--release");
    }
    run_checked(&mut cmd)?;
    let agent = art.profile_dir.join("hami-agent");
    ensure!(agent.exists(), "{} was not built", agent.display());
    Ok((art, agent))
}

/// The CUDA driver the demo runs against.
struct Driver {
    /// `Some(nvidia-smi's description)` for a real driver.
    real: Option<String>,
    /// The `libcuda.so.1` the agent probes.
    libcuda: PathBuf,
    /// Environment for every process (agent and workloads).
    env: Vec<(String, String)>,
}

impl Driver {
    fn detect(art: &Artifacts) -> Driver {
        if let (Some(lib), Some(smi)) = (real_libcuda(), nvidia_smi()) {
            let dir = lib.parent().map(Path::to_path_buf).unwrap_or_default();
            return Driver {
                real: Some(smi),
                libcuda: lib,
                env: vec![("LD_LIBRARY_PATH".into(), dir.display().to_string())],
            };
        }
        Driver {
            real: None,
            libcuda: art.fake_libcuda.clone(),
            env: vec![
                (
                    "LD_LIBRARY_PATH".into(),
                    art.fake_lib_dir.display().to_string(),
                ),
                ("FAKE_CUDA_DEVICE_COUNT".into(), "1".into()),
                ("FAKE_CUDA_TOTAL_MEM".into(), "16G".into()),
            ],
        }
    }

    fn short(&self) -> &'static str {
        if self.real.is_some() {
            "real NVIDIA"
        } else {
            "fake"
        }
    }

    fn describe(&self) -> String {
        match &self.real {
            Some(smi) => format!(
                "real NVIDIA driver ({smi}), {}",
                self.libcuda.display()
            ),
            None => format!(
                "fake (testing/fake-cuda: 1 device of 16 GiB, 300 MiB per context), {}\n        \
                 (no real NVIDIA driver here: the same command uses one when libcuda.so.1 and nvidia-smi work)",
                self.libcuda.display()
            ),
        }
    }

    /// Applies the driver environment (and the fake's state file in `sandbox`) to `cmd`.
    fn apply(&self, cmd: &mut Command, sandbox: &Sandbox) {
        cmd.env_remove("LD_PRELOAD");
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        if self.real.is_none() {
            cmd.env("FAKE_CUDA_STATE", sandbox.path().join("fake-cuda.state"));
        } else {
            cmd.env_remove("FAKE_CUDA_STATE");
        }
    }
}

/// A real `libcuda.so.1` (not our fake): `/usr/local/nvidia/lib64` or the `ld.so` cache.
fn real_libcuda() -> Option<PathBuf> {
    let mut candidates = vec![PathBuf::from("/usr/local/nvidia/lib64/libcuda.so.1")];
    for ldconfig in ["ldconfig", "/sbin/ldconfig"] {
        if let Ok(o) = Command::new(ldconfig).arg("-p").output() {
            for line in String::from_utf8_lossy(&o.stdout).lines() {
                if line.trim_start().starts_with("libcuda.so.1 ") {
                    if let Some((_, p)) = line.split_once("=> ") {
                        candidates.push(PathBuf::from(p.trim()));
                    }
                }
            }
            break;
        }
    }
    candidates.into_iter().find(|p| {
        // Our fake names its state file variable; NVIDIA's library does not.
        std::fs::read(p).is_ok_and(|b| !b.windows(15).any(|w| w == b"FAKE_CUDA_STATE"))
    })
}

/// `nvidia-smi`'s first GPU, if it runs.
fn nvidia_smi() -> Option<String> {
    let o = Command::new("nvidia-smi")
        .args([
            "--query-gpu=name,memory.total,driver_version",
            "--format=csv,noheader",
        ])
        .output()
        .ok()?;
    if !o.status.success() {
        return None;
    }
    let s = String::from_utf8_lossy(&o.stdout);
    let first = s.lines().next()?.trim();
    (!first.is_empty()).then(|| first.to_string())
}

/// The demo's temp dir (region file, fake driver state); removed on drop.
struct Sandbox {
    dir: PathBuf,
}

impl Sandbox {
    fn new() -> Result<Sandbox> {
        let dir = std::env::temp_dir().join(format!("hami-demo-{}", std::process::id()));
        if dir.exists() {
            std::fs::remove_dir_all(&dir)?;
        }
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        Ok(Sandbox { dir })
    }

    fn path(&self) -> &Path {
        &self.dir
    }

    fn region(&self) -> PathBuf {
        self.dir.join("region.cache")
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The story (steps 1 to 5).
fn story(art: &Artifacts, agent_bin: &Path, driver: &Driver, sb: &Sandbox) -> Result<()> {
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
struct Workload<'a> {
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
            .env("LIBCUDA_LOG_LEVEL", "2")
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

/// A running `hami-agent run`, its JSON log read line by line.
pub(crate) struct Agent {
    child: Child,
    rx: Receiver<String>,
    log: Vec<Value>,
    /// The agent's ready line.
    pub(crate) ready: String,
    /// Where it serves `/metrics` (`host:port`).
    pub(crate) metrics_addr: String,
}

impl Agent {
    fn start(bin: &Path, driver: &Driver, sb: &Sandbox) -> Result<Agent> {
        let mut c = Command::new(bin);
        c.args([
            "run",
            "--reclaim",
            "--json-log",
            "--metrics-addr",
            "127.0.0.1:0",
        ])
        .arg("--libcuda")
        .arg(&driver.libcuda);
        driver.apply(&mut c, sb);
        println!(
            "$ hami-agent run --reclaim --json-log --metrics-addr 127.0.0.1:0 --libcuda {}",
            driver.libcuda.display()
        );
        Agent::spawn(c, true)
    }

    /// Starts `cmd` (a `hami-agent run --json-log --metrics-addr ...` command) and waits for
    /// its ready line; with `echo`, prints the attach lines and errors it logs meanwhile.
    pub(crate) fn spawn(mut c: Command, echo: bool) -> Result<Agent> {
        c.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = c
            .spawn()
            .with_context(|| format!("starting {:?}", c.get_program()))?;
        let err = child.stderr.take().expect("piped stderr");
        let (tx, rx) = channel();
        std::thread::spawn(move || {
            for l in BufReader::new(err).lines() {
                let Ok(l) = l else { break };
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        let mut agent = Agent {
            child,
            rx,
            log: Vec::new(),
            ready: String::new(),
            metrics_addr: String::new(),
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let l = agent.next_line(deadline)?;
            if l.starts_with("hami-agent: ready") {
                agent.ready = l;
                break;
            }
            if let Some(f) = agent.log.last() {
                if f["message"] == "serving /metrics" {
                    agent.metrics_addr = f["addr"].as_str().unwrap_or_default().to_string();
                }
                if echo && (f["message"] == "probes attached" || f["level"] == "ERROR") {
                    println!("    {}", describe(f));
                }
            }
        }
        ensure!(
            !agent.metrics_addr.is_empty(),
            "the agent did not say where it serves /metrics"
        );
        Ok(agent)
    }

    /// The next stderr line (JSON lines are also parsed into `log`, with `level` added).
    fn next_line(&mut self, deadline: Instant) -> Result<String> {
        let left = deadline.saturating_duration_since(Instant::now());
        match self.rx.recv_timeout(left) {
            Ok(l) => {
                self.push(&l);
                Ok(l)
            }
            Err(RecvTimeoutError::Timeout) => bail!("timed out waiting for the agent"),
            Err(RecvTimeoutError::Disconnected) => {
                let st = self.child.wait().ok();
                bail!("hami-agent exited ({st:?})")
            }
        }
    }

    fn push(&mut self, line: &str) {
        if let Ok(v) = serde_json::from_str::<Value>(line) {
            let mut f = v.get("fields").cloned().unwrap_or(Value::Null);
            if let Some(o) = f.as_object_mut() {
                o.insert("level".into(), v["level"].clone());
            }
            self.log.push(f);
        }
    }

    /// Takes in every line already written.
    pub(crate) fn drain(&mut self) {
        while let Ok(l) = self.rx.try_recv() {
            self.push(&l);
        }
    }

    /// Findings logged so far.
    pub(crate) fn findings(&self) -> Vec<&Value> {
        self.log
            .iter()
            .filter(|f| f.get("kind").is_some())
            .collect()
    }

    /// Waits for a log record (its `fields`, with `message`) matching `pred`; already seen
    /// records count.
    fn wait_json(&mut self, timeout: Duration, pred: impl Fn(&Value) -> bool) -> Result<Value> {
        let deadline = Instant::now() + timeout;
        let mut seen = 0;
        loop {
            if let Some(f) = self.log[seen..].iter().find(|f| pred(f)) {
                return Ok(f.clone());
            }
            seen = self.log.len();
            if let Err(e) = self.next_line(deadline) {
                let tail: Vec<String> =
                    self.log.iter().rev().take(10).rev().map(describe).collect();
                bail!(
                    "the expected agent log record did not come ({e}); last records:\n  {}",
                    tail.join("\n  ")
                );
            }
        }
    }

    /// The agent's pid.
    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// `GET /metrics`.
    pub(crate) fn metrics(&self) -> Result<String> {
        http_get(&self.metrics_addr, "/metrics")
    }

    /// SIGTERM, then wait (at most 30 s) for a clean exit.
    pub(crate) fn stop(mut self) -> Result<()> {
        // SAFETY: kill(2) on our own child, not yet reaped.
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(st) = self.child.try_wait()? {
                ensure!(st.success(), "hami-agent exited with {st}");
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("hami-agent did not stop within 30 s of SIGTERM");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// A plain HTTP/1.0 GET; returns the body.
fn http_get(addr: &str, path: &str) -> Result<String> {
    let mut s = TcpStream::connect(addr).with_context(|| format!("connecting to {addr}"))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n")?;
    let mut resp = String::new();
    s.read_to_string(&mut resp)?;
    let (head, body) = resp
        .split_once("\r\n\r\n")
        .ok_or_else(|| anyhow!("malformed HTTP response from {addr}"))?;
    ensure!(
        head.starts_with("HTTP/1.") && head.contains(" 200 "),
        "GET {path}: {}",
        head.lines().next().unwrap_or("")
    );
    Ok(body.to_string())
}

/// The value of the first sample of `name` whose label set contains every `labels` item.
pub(crate) fn metric(text: &str, name: &str, labels: &[&str]) -> Option<u64> {
    text.lines().find_map(|l| {
        let (series, value) = l.rsplit_once(' ')?;
        let (n, rest) = series.split_once('{').unwrap_or((series, ""));
        (n == name && labels.iter().all(|want| rest.contains(want)))
            .then(|| value.parse::<f64>().ok().map(|v| v as u64))
            .flatten()
    })
}

fn inspect_json(bin: &Path, region: &Path) -> Result<Value> {
    let o = Command::new(bin)
        .args(["inspect", "--json"])
        .arg(region)
        .output()?;
    ensure!(
        o.status.success(),
        "hami-agent inspect failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    Ok(serde_json::from_slice(&o.stdout)?)
}

/// `hami-agent inspect` (human), leaving out the devices nobody uses.
fn print_inspect(bin: &Path, region: &Path) -> Result<()> {
    let o = Command::new(bin).arg("inspect").arg(region).output()?;
    ensure!(
        o.status.success(),
        "hami-agent inspect failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let text = String::from_utf8_lossy(&o.stdout);
    let mut hidden = 0;
    for l in text.lines() {
        let idle_device = l.starts_with("    ")
            && !l.starts_with("     ")
            && l.contains(": limit ")
            && l.contains("used 0 B")
            && !l.contains("GPU-");
        if idle_device {
            hidden += 1;
        } else {
            println!("    {l}");
        }
    }
    if hidden > 0 {
        println!("    ({hidden} unused devices of the region not shown)");
    }
    Ok(())
}

/// A log record for humans: level, message, then the finding's fields.
pub(crate) fn describe(f: &Value) -> String {
    let mut s = format!(
        "{} {}",
        f["level"].as_str().unwrap_or(""),
        f["message"].as_str().unwrap_or("")
    );
    let order = [
        "kind",
        "reason",
        "pid",
        "nspid",
        "container",
        "region",
        "device",
        "slot",
        "bytes",
        "observed",
        "accounted",
        "limit",
        "path",
        "symbols",
        "error",
    ];
    let map: BTreeMap<&str, &Value> = f
        .as_object()
        .map(|o| o.iter().map(|(k, v)| (k.as_str(), v)).collect())
        .unwrap_or_default();
    for k in order {
        if let Some(v) = map.get(k) {
            let shown = match v {
                Value::String(t) => t.clone(),
                Value::Number(n) if matches!(k, "bytes" | "observed" | "accounted" | "limit") => {
                    human(n.as_u64().unwrap_or(0))
                }
                other => other.to_string(),
            };
            s += &format!(" {k}={shown}");
        }
    }
    s
}

/// Processes whose environment names `dir` (our workloads and agent).
fn processes_using(dir: &Path) -> Vec<u32> {
    let needle = dir.display().to_string();
    let me = std::process::id();
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    rd.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| pid != me)
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/environ"))
                .is_ok_and(|env| env.windows(needle.len()).any(|w| w == needle.as_bytes()))
                && !is_zombie(*pid)
        })
        .collect()
}

fn is_zombie(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(") ").map(|(_, r)| r.starts_with('Z')))
        .unwrap_or(true)
}

fn print_lines(lines: &[String]) {
    for l in lines {
        println!("    {l}");
    }
}

fn print_stderr(out: &ProbeOutput) {
    if !out.stderr.trim().is_empty() {
        println!("\nthe preload's log (stderr, LIBCUDA_LOG_LEVEL=2):");
    }
    for l in out.stderr.lines() {
        println!("    {l}");
    }
}

fn human(b: u64) -> String {
    if b >= 1 << 30 && b & ((1 << 28) - 1) == 0 {
        format!("{} GiB", b as f64 / (1u64 << 30) as f64)
    } else if b >= MIB {
        format!("{:.0} MiB", b as f64 / MIB as f64)
    } else {
        format!("{b} B")
    }
}

fn header(n: &str, title: &str) {
    println!(
        "\n=== {n}  {title} {}",
        "=".repeat(60usize.saturating_sub(title.len()))
    );
}

fn check(what: &str) {
    println!("  ok: {what}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metric_lookup_matches_name_and_labels() {
        let text = "# HELP x y\n\
                    hami_findings_total{kind=\"bypass\"} 2\n\
                    hami_findings_total{kind=\"leaked_slot\"} 1\n\
                    hami_events_dropped_total 0\n\
                    hami_container_observed_bytes{container=\"host\",device=\"0\",region=\"/r\"} 536870912\n";
        assert_eq!(
            metric(text, "hami_findings_total", &["kind=\"leaked_slot\""]),
            Some(1)
        );
        assert_eq!(metric(text, "hami_events_dropped_total", &[]), Some(0));
        assert_eq!(
            metric(
                text,
                "hami_container_observed_bytes",
                &["region=\"/r\"", "device=\"0\""]
            ),
            Some(536870912)
        );
        assert_eq!(
            metric(text, "hami_container_observed_bytes", &["region=\"/x\""]),
            None
        );
        assert_eq!(metric(text, "hami_findings", &[]), None);
    }

    #[test]
    fn human_sizes() {
        assert_eq!(human(1 << 30), "1 GiB");
        assert_eq!(human(5 * 256 * MIB), "1.25 GiB");
        assert_eq!(human(384 * MIB), "384 MiB");
        assert_eq!(human(12), "12 B");
    }

    #[test]
    fn describe_orders_fields_and_sizes_bytes() {
        let f = serde_json::json!({
            "level": "WARN", "message": "finding: x", "kind": "bypass",
            "pid": 7, "bytes": 536870912, "container": "host"
        });
        assert_eq!(
            describe(&f),
            "WARN finding: x kind=bypass pid=7 container=host bytes=512 MiB"
        );
    }
}
