//! Stopped processes: workers SIGSTOPped at random, and a lock holder stopped while holding
//! the region lock (continued, then killed).

use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Result};
use hami_common::layout::RegionHeader;

use super::worker::{open_region, settle_and_check, Worker};
use super::{sandbox, Profile, Report, Rng, LINE_WAIT, MIB, RESUME_BOUND};

/// `State:` letter of `/proc/<pid>/stat`.
pub(super) fn proc_state(pid: u32) -> Option<char> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    s.rsplit_once(')')?.1.trim_start().chars().next()
}

pub(super) fn wait_state(pid: u32, want: char, wait: Duration) -> bool {
    let deadline = Instant::now() + wait;
    while Instant::now() < deadline {
        if proc_state(pid) == Some(want) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    false
}

/// Sum of the workers' op counters.
pub(super) fn total_ops(ws: &[Worker]) -> u64 {
    ws.iter().map(|w| w.stats.ops.load(Ordering::Relaxed)).sum()
}

/// How long until every worker's op counter moved past `before` (None: not within `wait`).
pub(super) fn time_to_progress(ws: &[Worker], before: &[u64], wait: Duration) -> Option<Duration> {
    let t0 = Instant::now();
    while t0.elapsed() < wait {
        if ws
            .iter()
            .zip(before)
            .all(|(w, &b)| w.stats.ops.load(Ordering::Relaxed) > b)
        {
            return Some(t0.elapsed());
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    None
}

pub(super) fn stopped(p: &Profile, load: &Path, rng: &mut Rng, r: &mut Report) -> Result<()> {
    let procs = 6;
    let limit = 64 * MIB;
    let env = sandbox(limit);
    let mut workers = Vec::new();
    for i in 0..procs {
        workers.push(Worker::spawn(
            &env,
            load,
            &["storm", "2", "6", &(100 + i).to_string()],
        )?);
    }
    for w in &workers {
        w.expect("ready", LINE_WAIT)?;
    }
    let region = open_region(env.region_path(), false)?;
    std::thread::sleep(Duration::from_millis(300));

    // 1. Random stops of whole workers (wherever they are, the lock included by chance).
    let mut longest_stop = Duration::ZERO;
    for _ in 0..p.stops {
        let i = rng.below(procs as u64) as usize;
        let d = Duration::from_millis(300 + rng.below(1200));
        longest_stop = longest_stop.max(d);
        let w = &workers[i];
        *w.stats
            .ignore_until
            .lock()
            .map_err(|_| anyhow!("poisoned"))? = Some(Instant::now() + Duration::from_secs(3600));
        w.signal(libc::SIGSTOP);
        std::thread::sleep(d);
        w.signal(libc::SIGCONT);
        *w.stats
            .ignore_until
            .lock()
            .map_err(|_| anyhow!("poisoned"))? = Some(Instant::now() + Duration::from_millis(500));
        std::thread::sleep(Duration::from_millis(200));
    }
    std::thread::sleep(Duration::from_millis(300));
    let random_max_us = workers
        .iter()
        .map(|w| w.stats.max_us.load(Ordering::Relaxed))
        .max()
        .unwrap_or(0);
    r.figure("stops: random SIGSTOPs (300..1500 ms)", p.stops);
    r.figure(
        "stops: longest call of a running process during random stops (ms)",
        format!("{:.1}", random_max_us as f64 / 1000.0),
    );
    r.check(
        random_max_us <= (longest_stop + RESUME_BOUND).as_micros() as u64,
        || {
            format!(
                "stops: a running process blocked {} ms, more than the longest stop ({:?}) + {:?}",
                random_max_us / 1000,
                longest_stop,
                RESUME_BOUND
            )
        },
    );

    // 2. A process stopped while holding the region lock: continued after hold_secs.
    let lock_off = core::mem::offset_of!(RegionHeader, lock).to_string();
    let region_path = env.region_path().display().to_string();
    for w in &workers {
        w.stats.max_us.store(0, Ordering::Relaxed);
    }
    let holder = Worker::spawn(&env, load, &["holdlock", &region_path, &lock_off])?;
    let l = holder.expect("locked", LINE_WAIT)?;
    r.check(wait_state(holder.pid, 'T', LINE_WAIT), || {
        "stops: the lock holder did not stop".into()
    });
    std::thread::sleep(Duration::from_millis(300));
    let ops0 = total_ops(&workers);
    std::thread::sleep(Duration::from_secs(p.hold_secs));
    let ops_during = total_ops(&workers) - ops0;
    let before: Vec<u64> = workers
        .iter()
        .map(|w| w.stats.ops.load(Ordering::Relaxed))
        .collect();
    holder.signal(libc::SIGCONT);
    let resumed = time_to_progress(&workers, &before, RESUME_BOUND * 5);
    holder.expect("unlocked", LINE_WAIT)?;
    let ok = holder.finish(LINE_WAIT)?;
    r.check(l == "locked rc=0" && ok, || {
        format!("stops: the lock holder failed: {l}")
    });
    std::thread::sleep(Duration::from_millis(300));
    let held_max_us = workers
        .iter()
        .map(|w| w.stats.max_us.load(Ordering::Relaxed))
        .max()
        .unwrap_or(0);
    r.figure(
        "stops: lock holder stopped for (s)",
        format!("{}", p.hold_secs),
    );
    r.figure("stops: calls completed by the others meanwhile", ops_during);
    r.figure(
        "stops: longest call of the others (ms)",
        format!("{:.1}", held_max_us as f64 / 1000.0),
    );
    // The preload's lock timeout (HAMI_LOCK_TIMEOUT_MS, default 2000 ms) bounds every call;
    // 1 s of slack for a loaded machine.
    r.check(held_max_us <= 3_000_000, || {
        format!(
            "stops: a call waited {:.1} ms on the stopped lock holder (the lock timeout is 2000 ms)",
            held_max_us as f64 / 1000.0
        )
    });
    r.figure(
        "stops: all resumed after SIGCONT within (ms)",
        resumed.map_or("never".into(), |d| format!("{:.1}", d.as_secs_f64() * 1e3)),
    );
    r.check(resumed.is_some_and(|d| d <= RESUME_BOUND), || {
        format!("stops: after the holder was continued, not every process made progress within {RESUME_BOUND:?} ({resumed:?})")
    });

    // 3. A process stopped while holding the lock, then SIGKILLed: the robust mutex hands
    //    the lock to the next taker (owner-died recovery).
    let rec0 = region.snapshot().owner_died_recoveries;
    let holder = Worker::spawn(&env, load, &["holdlock", &region_path, &lock_off])?;
    holder.expect("locked", LINE_WAIT)?;
    r.check(wait_state(holder.pid, 'T', LINE_WAIT), || {
        "stops: the second lock holder did not stop".into()
    });
    std::thread::sleep(Duration::from_millis(500));
    let before: Vec<u64> = workers
        .iter()
        .map(|w| w.stats.ops.load(Ordering::Relaxed))
        .collect();
    holder.kill();
    let resumed_kill = time_to_progress(&workers, &before, RESUME_BOUND * 5);
    let rec1 = region.snapshot().owner_died_recoveries;
    r.figure(
        "stops: all resumed after the stopped holder was SIGKILLed within (ms)",
        resumed_kill.map_or("never".into(), |d| format!("{:.1}", d.as_secs_f64() * 1e3)),
    );
    r.check(resumed_kill.is_some_and(|d| d <= RESUME_BOUND), || {
        format!("stops: after the stopped holder was killed, not every process made progress within {RESUME_BOUND:?} ({resumed_kill:?})")
    });
    r.check(rec1 > rec0, || {
        "stops: killing the lock holder caused no owner-died recovery".into()
    });
    let (lost, left) = settle_and_check("stops", &env, workers, r)?;
    r.figure("stops: bytes lost or leaked", lost);
    r.figure("stops: bytes left after exit", left);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    #[test]
    fn a_stopped_child_is_seen_stopped() {
        let mut c = Command::new("sleep").arg("30").spawn().unwrap();
        assert!(wait_state(c.id(), 'S', Duration::from_secs(10)));
        // SAFETY: kill(2) on our own child.
        unsafe { libc::kill(c.id() as libc::pid_t, libc::SIGSTOP) };
        assert!(wait_state(c.id(), 'T', Duration::from_secs(10)));
        c.kill().unwrap();
        c.wait().unwrap();
        assert_eq!(proc_state(u32::MAX), None);
    }
}
