//! `cargo xtask torture [--long]`: what production does to a quota system, bounded in time,
//! against the fake driver with the real preload. Every scenario prints its figures and the
//! task fails (listing every failed check) if any check fails. The short profile (the
//! default, about a minute on 2 cores) also runs at the end of `cargo xtask test`; `--long` is
//! for releases. The figures are summarised in `docs/torture.md`.
//!
//! * **Kill storm**: N processes (`testing/programs/tortureload.c`, several threads each,
//!   every hook family: `cuMemAlloc_v2`, `cuMemAllocPitch_v2`, `cuMemAllocAsync`,
//!   `cuMemCreate`, `cuArrayCreate_v2`) share one region and allocate/free under a limit they
//!   keep hitting; random ones are SIGKILLed at random moments and replaced. Checked all
//!   along: the region's `used` never exceeds the limit, no call (finished or in progress)
//!   takes longer than [`BLOCK_BOUND`](profile::BLOCK_BOUND). At the end the survivors stop,
//!   dead slots are reclaimed, and each survivor's slot must hold exactly the bytes it
//!   reports holding (and `used` their sum); after they exit and a last reclaim, `used` must
//!   be 0.
//! * **Stopped processes**: random workers SIGSTOPped for up to a second and a half while the
//!   others churn; then a process that takes the region lock itself and stops while holding
//!   it (continued, then killed while stopped). The others' longest call is measured; they
//!   must all resume within [`RESUME_BOUND`](profile::RESUME_BOUND) of the holder being
//!   continued or killed. Then, with `HAMI_LOCK_TIMEOUT_MS=500`: a holder ptrace-stopped
//!   (seize + interrupt, detach), a holder at nice 19 behind a CPU hog per core (`--long`),
//!   and a process whose region mapping is paged out before its calls: every call stays
//!   within the lock timeout (+ 1 s of scheduling slack) and no byte is lost.
//! * **Race to the limit**: P processes x 8 threads allocate fixed chunks (thread t uses
//!   family t % 5) until refused; the total must be exactly `floor(limit / chunk) * chunk`.
//! * **Bad inputs**: the region path pointing at truncated, random, wrong-magic/version/size
//!   files, a directory, a FIFO, a missing directory; malformed environment values. Each case:
//!   the allocation is refused with `CUDA_ERROR_OUT_OF_MEMORY` (or succeeds where the docs say
//!   the value is only warned about), a log line names what was wrong, no crash, no hang (a
//!   timeout per case), and the bad file is left byte for byte as it was. Hook arguments the
//!   CUDA documentation gives a result for (0 bytes, NULL, `SIZE_MAX`, unaligned
//!   `cuMemCreate`, unknown and repeated frees): that result, and no charge left behind.
//! * **Agent faults** (`--long`, root): the agent SIGKILLed and restarted mid-workload (its
//!   eBPF programs must be gone, no false finding after the restart), its ring buffer
//!   overflowed on purpose (drops counted).
//! * **Churn** (`--long` or `--only churn`, root): 10 000 short-lived hooked processes in
//!   20 phases, each phase from a fresh copy of the driver reached by two paths: the agent's
//!   `VmRSS` at the start, middle and end must stay within a bound, discovery's sets within
//!   their caps and, at the end, hold only what is live ([`churn`]).
//! * **Short-lived bypasses** (`--long` or `--only short`, root; issue 31): 1000 unhooked
//!   processes that allocate 64 MiB and exit 200 ms later, beside hooked ones: at least 99 %
//!   reported as `bypass` with their pid, no hooked one reported ([`short`]).
//! * **Scale** (`--long` or `--only scale`, root): R region files and P hooked processes
//!   (1000 / 5000 in the long profile, 100 / 500 otherwise), measured at a fifth of that size
//!   and whole: `hami-agent audit`'s wall time, CPU time and peak RSS, and `hami-agent run`'s
//!   time to ready, tick, CPU and RSS; every process and region must be seen, no finding may
//!   stand, and the tick's cost per process may not grow with the fleet (quadratic scans).
//!   With `HAMI_SCALE_BASELINE_AGENT=<another hami-agent>` (a release build of an earlier
//!   commit), that agent and this build are then alternated on the whole fleet (audit and
//!   run, twice each): a baseline measured in the same run.

//!
//! One module per scenario ([`storm`], [`stops`], [`race`], [`bad_inputs`], [`agent`],
//! [`scale`]); the
//! workers and the end-of-scenario region check they share are in [`worker`]; the profiles and
//! bounds in [`profile`], the [`report`], the [`rng`], the [`sandbox`] and the `cudaprobe`
//! runs ([`probe`]) they share have a file each.

mod agent;
mod bad_files;
mod bad_inputs;
mod churn;
mod probe;
mod profile;
mod race;
mod report;
mod rng;
mod sandbox;
mod scale;
mod short;
mod stops;
mod storm;
mod worker;

use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use hami_test_harness::Artifacts;

use profile::{LONG, SHORT};
use report::Report;
use rng::Rng;

/// The scenarios `--only` can pick.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Scenario {
    /// The kill storm.
    Storm,
    /// Stopped processes and a stopped lock holder.
    Stops,
    /// The race to the limit.
    Race,
    /// Bad inputs (preload side).
    Bad,
    /// Agent faults (root).
    Agent,
    /// A busy node: the agent's scan of many regions and processes (root).
    Scale,
    /// The cargo-fuzz targets, 60 s each.
    Fuzz,
    /// The agent's memory under 10 000 short-lived CUDA processes (root).
    Churn,
    /// 1000 short-lived unhooked processes, each reported as a bypass (root, issue 31).
    Short,
}

/// Options of `cargo xtask torture`.
#[derive(Debug, Default)]
pub struct TortureOptions {
    /// The release profile (32 processes, >= 1000 kills, 100 race rounds, every header byte,
    /// agent faults, fuzzing).
    pub long: bool,
    /// Run only this scenario.
    pub only: Option<Scenario>,
}

/// Run every scenario of the chosen profile.
pub fn torture(opts: &TortureOptions) -> Result<()> {
    let p = if opts.long { LONG } else { SHORT };
    let t0 = Instant::now();
    println!("building the preload, the fake driver and the workloads (testing/harness)");
    let art = std::panic::catch_unwind(Artifacts::get)
        .map_err(|_| anyhow!("building the test artifacts failed (see the message above)"))?;
    let load = art.compile_against_fake(
        &hami_test_harness::workspace_root().join("testing/programs/tortureload.c"),
        "tortureload",
    );
    let mut r = Report::default();
    let mut rng = Rng::new();
    let on = |s: Scenario| opts.only.is_none_or(|o| o == s);
    if on(Scenario::Storm) {
        step(&format!("kill storm ({} profile)", p.name));
        storm::kill_storm(&p, &load, &mut rng, &mut r).context("kill storm")?;
    }
    if on(Scenario::Stops) {
        step("stopped processes and a stopped lock holder");
        stops::stopped(&p, &load, &mut rng, &mut r).context("stopped processes")?;
        let d = Duration::from_millis(p.variant_ms);
        step("lock holder stopped by ptrace");
        stops::held_variant(stops::HeldBy::Ptrace, d, &load, &mut r)
            .context("ptrace-stopped lock holder")?;
        if p.starved {
            step("lock holder starved (nice 19, a CPU hog per core)");
            stops::held_variant(stops::HeldBy::Starved, d, &load, &mut r)
                .context("starved lock holder")?;
        }
        step("region mapping paged out before each call");
        stops::paged_out(d, &load, &mut r).context("paged-out region")?;
    }
    if on(Scenario::Race) {
        step("race to the limit");
        race::race(&p, &load, &mut r).context("race to the limit")?;
    }
    if on(Scenario::Bad) {
        step("bad inputs (preload side)");
        bad_inputs::bad_inputs(&p, &mut rng, &mut r).context("bad inputs")?;
    }
    // The agent takes seconds to attach on a loaded machine: long profile (or --only agent).
    if (opts.long && opts.only.is_none()) || opts.only == Some(Scenario::Agent) {
        step("agent faults (SIGKILL and restart, stale uprobes, ring buffer overflow)");
        agent::agent_faults(&p, &load, &mut r).context("agent faults")?;
    }
    if (opts.long && opts.only.is_none()) || opts.only == Some(Scenario::Scale) {
        step(&format!(
            "scale: {} regions / {} processes, audit and run measured",
            p.scale_regions, p.scale_procs
        ));
        scale::scale(&p, &mut r).context("scale")?;
    }
    if (opts.long && opts.only.is_none()) || opts.only == Some(Scenario::Churn) {
        step(&format!(
            "churn: {} short-lived CUDA processes, the agent's memory measured",
            churn::PROCS
        ));
        churn::churn(&mut r).context("churn")?;
    }
    if (opts.long && opts.only.is_none()) || opts.only == Some(Scenario::Short) {
        step(&format!(
            "short-lived bypasses: {} unhooked processes that allocate and exit 200 ms later",
            short::PROCS
        ));
        short::short_lived(&mut r).context("short-lived bypasses")?;
    }
    if (opts.long && opts.only.is_none()) || opts.only == Some(Scenario::Fuzz) {
        step("fuzz targets (60 s each)");
        match crate::fuzz::fuzz(60) {
            Ok(res) => {
                for f in res {
                    r.figure(
                        &format!("fuzz {}: executions / crashes", f.target),
                        format!("{} / {}", f.execs, f.crashes),
                    );
                }
            }
            Err(e) => r.check(false, || format!("fuzz: {e:#}")),
        }
    }
    let secs = t0.elapsed().as_secs_f64();
    println!("\n==> torture ({} profile) took {secs:.1} s", p.name);
    println!("| figure | value |\n|---|---|");
    for (k, v) in &r.figures {
        println!("| {k} | {v} |");
    }
    if !r.failures.is_empty() {
        bail!(
            "{} torture check(s) failed:\n  {}",
            r.failures.len(),
            r.failures.join("\n  ")
        );
    }
    println!("all torture checks passed");
    Ok(())
}

fn step(what: &str) {
    println!("\n==> xtask torture: {what}");
}
