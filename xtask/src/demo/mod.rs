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
//! This module holds the task and the build; [`story`] the steps; [`agent`] the running agent
//! seen from outside (also used by `bench` and `torture`); [`driver`] the driver choice,
//! [`sandbox`] the temp dir and [`output`] how the demo prints.

mod agent;
mod driver;
mod output;
mod sandbox;
mod story;

use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{anyhow, bail, ensure, Context, Result};
use hami_test_harness::Artifacts;

use crate::util::{cargo, project_root, run_checked};
use driver::Driver;
use output::header;
use sandbox::Sandbox;
use story::story;

pub(crate) use agent::{describe, http_get, metric, processes_using, Agent};

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
