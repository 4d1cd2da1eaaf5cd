//! The race to the limit: every process and thread allocates fixed chunks until refused.

use std::path::Path;
use std::time::Instant;

use anyhow::Result;
use hami_abi::layout::UsageKind;

use super::profile::{Profile, LINE_WAIT, MIB};
use super::report::Report;
use super::sandbox::sandbox;
use super::worker::{consistent_snapshot, field, open_region, Worker};

pub(super) fn race(p: &Profile, load: &Path, r: &mut Report) -> Result<()> {
    let threads = 8usize;
    let chunk = 2 * MIB;
    // About 2.5 chunks per thread, and not a multiple of the chunk.
    let limit = (p.race_procs * threads) as u64 * chunk * 5 / 2 + MIB;
    let expect = limit / chunk * chunk;
    let env = sandbox(limit);
    let mut workers = Vec::new();
    for _ in 0..p.race_procs {
        workers.push(Worker::spawn(
            &env,
            load,
            &["race", &threads.to_string(), &(chunk / MIB).to_string()],
        )?);
    }
    for w in &workers {
        w.expect("ready", LINE_WAIT)?;
    }
    let region = open_region(env.region_path(), false)?;
    let (mut worst_gap, mut over, mut max_us, mut wrong) = (0u64, 0u64, 0u64, 0u64);
    let t0 = Instant::now();
    for round in 0..p.race_rounds {
        for w in workers.iter_mut() {
            w.send("go")?;
        }
        let mut total = 0u64;
        for w in &workers {
            let l = w.expect("round ", LINE_WAIT)?;
            total += field(&l, "bytes").unwrap_or(0);
            max_us = max_us.max(field(&l, "max_us").unwrap_or(0));
            r.check(
                field(&l, "errors") == Some(0) && field(&l, "refused") == Some(threads as u64),
                || format!("race round {round}: pid {}: {l} {:?}", w.pid, w.errors()),
            );
        }
        // What the allocations hold: the admitted total less unused admission reserves.
        let s = consistent_snapshot(&region)?;
        let used = s.used[0] - s.reserved(0);
        if s.used[0] > limit {
            over += 1;
        }
        if total > limit {
            over += 1;
        }
        if total != expect || used != total {
            wrong += 1;
            println!("    round {round}: granted {total}, region {used}, expected {expect}");
        }
        worst_gap = worst_gap.max(limit.saturating_sub(total));
        for w in workers.iter_mut() {
            w.send("free")?;
        }
        for w in &workers {
            let l = w.expect("freed ", LINE_WAIT)?;
            r.check(field(&l, "errors") == Some(0), || {
                format!("race round {round}: pid {} failed to free: {l}", w.pid)
            });
        }
        // After every free only what the stream-ordered pools keep reserved may stay charged
        // (released by the driver at the next synchronisation; the device really holds it).
        let s = consistent_snapshot(&region)?;
        let used = s.used[0] - s.reserved(0);
        let reserved: u64 = s
            .slots
            .iter()
            .map(|sl| sl.usage[0][UsageKind::Pool.index()])
            .sum();
        r.check(used == reserved, || {
            format!(
                "race round {round}: {used} bytes left after every free, pools reserve {reserved}"
            )
        });
    }
    let secs = t0.elapsed().as_secs_f64();
    for w in workers {
        w.finish(LINE_WAIT)?;
    }
    r.figure(
        "race: rounds of processes x threads",
        format!("{} of {} x {threads}", p.race_rounds, p.race_procs),
    );
    r.figure(
        "race: limit / chunk (MiB)",
        format!("{:.0} / {}", limit as f64 / MIB as f64, chunk / MIB),
    );
    r.figure("race: rounds over the limit", over);
    r.figure(
        "race: rounds not granting exactly floor(limit/chunk) chunks",
        wrong,
    );
    r.figure(
        "race: largest unused room at refusal (MiB)",
        format!("{:.1}", worst_gap as f64 / MIB as f64),
    );
    r.figure(
        "race: longest call (ms)",
        format!("{:.1}", max_us as f64 / 1000.0),
    );
    r.figure("race: duration (s)", format!("{secs:.1}"));
    r.check(over == 0, || format!("race: {over} rounds over the limit"));
    r.check(wrong == 0, || {
        format!("race: {wrong} rounds did not grant exactly {expect} bytes")
    });
    Ok(())
}
