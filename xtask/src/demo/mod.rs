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
//!
//! This module holds the task, the build, the driver choice and the sandbox; [`story`] the
//! steps; [`agent`] the running agent seen from outside (also used by `bench` and `torture`).

mod agent;
mod story;

use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, ensure, Context, Result};
use hami_test_harness::{Artifacts, ProbeOutput};

use crate::util::{cargo, project_root, run_checked};
use story::story;

pub(crate) use agent::{describe, http_get, metric, processes_using, Agent};

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

fn print_lines(lines: &[String]) {
    for l in lines {
        println!("    {l}");
    }
}

fn print_stderr(out: &ProbeOutput) {
    if !out.stderr.trim().is_empty() {
        println!("\nthe preload's log (stderr, LIBCUDA_LOG_LEVEL=3):");
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
    fn human_sizes() {
        assert_eq!(human(1 << 30), "1 GiB");
        assert_eq!(human(5 * 256 * MIB), "1.25 GiB");
        assert_eq!(human(384 * MIB), "384 MiB");
        assert_eq!(human(12), "12 B");
    }
}
