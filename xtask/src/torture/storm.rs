//! The kill storm: workers SIGKILLed at random moments and replaced while the others keep
//! allocating under the limit.

use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::Result;

use super::profile::{Profile, BLOCK_BOUND, LINE_WAIT, MIB};
use super::report::Report;
use super::rng::Rng;
use super::sandbox::sandbox;
use super::worker::{open_region, settle_and_check, Worker};

pub(super) fn kill_storm(p: &Profile, load: &Path, rng: &mut Rng, r: &mut Report) -> Result<()> {
    let per_thread_hold = 8;
    // About half of what the threads would like to hold: refusals happen all the time.
    let limit = (p.storm_procs * p.storm_threads * per_thread_hold) as u64 * 5 * MIB / 2 + MIB;
    let env = sandbox(limit);
    let threads = p.storm_threads.to_string();
    let hold = per_thread_hold.to_string();
    let mut seed = 0u64;
    let spawn = |seed: &mut u64| -> Result<Worker> {
        *seed += 1;
        Worker::spawn(&env, load, &["storm", &threads, &hold, &seed.to_string()])
    };
    let mut workers = Vec::new();
    for _ in 0..p.storm_procs {
        workers.push(spawn(&mut seed)?);
    }
    for w in &workers {
        w.expect("ready", LINE_WAIT)?;
    }
    let region = open_region(env.region_path(), false)?;
    println!(
        "    {} processes x {} threads, limit {} MiB, {} s{}",
        p.storm_procs,
        p.storm_threads,
        limit / MIB,
        p.storm_secs,
        if p.min_kills > 0 {
            format!(" and >= {} kills", p.min_kills)
        } else {
            String::new()
        }
    );
    let t0 = Instant::now();
    let (mut kills, mut samples, mut over, mut max_used) = (0u64, 0u64, 0u64, 0u64);
    let (mut max_us, mut killed_ops) = (0u64, 0u64);
    let mut errors: Vec<String> = Vec::new();
    let hard_cap = Duration::from_secs(p.storm_secs * 10);
    while (t0.elapsed() < Duration::from_secs(p.storm_secs) || kills < p.min_kills)
        && t0.elapsed() < hard_cap
    {
        let gap = Instant::now() + Duration::from_millis(rng.below(p.kill_gap_ms * 2));
        while Instant::now() < gap {
            let used = region.snapshot().used[0];
            samples += 1;
            max_used = max_used.max(used);
            if used > limit {
                over += 1;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        let i = rng.below(workers.len() as u64) as usize;
        let victim = workers.swap_remove(i);
        errors.extend(victim.errors());
        let st = victim.kill();
        max_us = max_us.max(st.max_us.load(Ordering::Relaxed));
        killed_ops += st.ops.load(Ordering::Relaxed);
        kills += 1;
        workers.push(spawn(&mut seed)?);
    }
    let secs = t0.elapsed().as_secs_f64();
    for w in &workers {
        max_us = max_us.max(w.stats.max_us.load(Ordering::Relaxed));
        errors.extend(w.errors());
    }
    let ops: u64 = killed_ops
        + workers
            .iter()
            .map(|w| w.stats.ops.load(Ordering::Relaxed))
            .sum::<u64>();
    let recoveries = region.snapshot().owner_died_recoveries;
    let reclaimed = region.snapshot().reclaimed_slots;
    let (lost, left) = settle_and_check("kill storm", &env, workers, r)?;
    r.figure(
        "kill storm: processes x threads",
        format!("{} x {}", p.storm_procs, p.storm_threads),
    );
    r.figure("kill storm: duration (s)", format!("{secs:.1}"));
    r.figure("kill storm: SIGKILLs", kills);
    r.figure(
        "kill storm: CUDA calls made (all processes, as of their last tick)",
        ops,
    );
    r.figure("kill storm: slots reclaimed (by the preloads)", reclaimed);
    r.figure("kill storm: lock owner-died recoveries", recoveries);
    r.figure(
        "kill storm: region samples / over-grants",
        format!("{samples} / {over}"),
    );
    r.figure(
        "kill storm: max used / limit (MiB)",
        format!("{:.1} / {}", max_used as f64 / MIB as f64, limit / MIB),
    );
    r.figure(
        "kill storm: longest call (ms)",
        format!("{:.1}", max_us as f64 / 1000.0),
    );
    r.figure("kill storm: bytes lost or leaked (live)", lost);
    r.figure("kill storm: bytes left after exit + reclaim", left);
    r.check(over == 0, || {
        format!("kill storm: region used exceeded the limit in {over} of {samples} samples (max {max_used} > {limit})")
    });
    r.check(max_us <= BLOCK_BOUND.as_micros() as u64, || {
        format!(
            "kill storm: a call took {} ms (bound {:?})",
            max_us / 1000,
            BLOCK_BOUND
        )
    });
    r.check(errors.is_empty(), || {
        format!("kill storm: unexpected CUDA errors: {errors:?}")
    });
    r.check(kills >= p.min_kills, || {
        format!("kill storm: only {kills} kills (want {})", p.min_kills)
    });
    Ok(())
}
