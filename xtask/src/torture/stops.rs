//! Stopped processes: workers SIGSTOPped at random, and a lock holder stopped while holding
//! the region lock (continued, then killed).

use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Result};
use hami_abi::layout::RegionHeader;

use super::profile::{Profile, LINE_WAIT, MIB, RESUME_BOUND};
use super::report::Report;
use super::rng::Rng;
use super::sandbox::sandbox;
use super::worker::{field, open_region, settle_and_check, Worker};

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

/// Whether `path` lies on a tmpfs (nothing there is paged out without swap).
fn on_tmpfs(path: &Path) -> bool {
    const TMPFS_MAGIC: i64 = 0x0102_1994;
    let Ok(c) = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()) else {
        return false;
    };
    // SAFETY: statfs writes into the zeroed struct; c is a valid C string.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    unsafe { libc::statfs(c.as_ptr(), &mut st) == 0 && st.f_type as i64 == TMPFS_MAGIC }
}

/// `HAMI_LOCK_TIMEOUT_MS` of the stopped-holder variants (the default is 2000 ms: lowered to
/// keep them short).
pub(super) const VARIANT_LOCK_TIMEOUT_MS: u64 = 1000;
/// What a call may take beyond the lock timeout on a loaded 2-core machine (scheduling).
/// Less than the timeout: a call that waited twice (finding 7: a pool allocation's forced
/// charge, then its admission) is caught.
pub(super) const VARIANT_SLACK: Duration = Duration::from_millis(700);

/// How the lock holder of a variant is kept from releasing the lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum HeldBy {
    /// `PTRACE_SEIZE` + `PTRACE_INTERRUPT` (a debugger attaching), then `PTRACE_DETACH`.
    Ptrace,
    /// The holder at nice 19 burning CPU while one CPU hog per core runs at nice 0.
    Starved,
}

/// Stops `pid` the way a debugger does: seize, interrupt, wait for the stop.
fn ptrace_stop(pid: u32) -> Result<()> {
    let pid = pid as libc::pid_t;
    let null = std::ptr::null_mut::<libc::c_void>();
    // SAFETY: ptrace requests on our own child; the address and data arguments are unused.
    if unsafe { libc::ptrace(libc::PTRACE_SEIZE, pid, null, null) } != 0 {
        return Err(anyhow!(
            "PTRACE_SEIZE of {pid}: {}",
            std::io::Error::last_os_error()
        ));
    }
    // SAFETY: as above; pid is now our tracee.
    if unsafe { libc::ptrace(libc::PTRACE_INTERRUPT, pid, null, null) } != 0 {
        return Err(anyhow!(
            "PTRACE_INTERRUPT of {pid}: {}",
            std::io::Error::last_os_error()
        ));
    }
    let mut status = 0;
    // SAFETY: waitpid on our tracee with a valid status pointer; a ptrace-stop is reported to
    // the tracer and does not reap the child.
    let w = unsafe { libc::waitpid(pid, &mut status, libc::__WALL) };
    if w != pid || !libc::WIFSTOPPED(status) {
        return Err(anyhow!(
            "waitpid on the ptrace-interrupted {pid}: {w}, status {status:#x}"
        ));
    }
    Ok(())
}

fn ptrace_detach(pid: u32) -> Result<()> {
    let null = std::ptr::null_mut::<libc::c_void>();
    // SAFETY: ptrace on our stopped tracee; no pointer is dereferenced.
    if unsafe { libc::ptrace(libc::PTRACE_DETACH, pid as libc::pid_t, null, null) } != 0 {
        return Err(anyhow!(
            "PTRACE_DETACH of {pid}: {}",
            std::io::Error::last_os_error()
        ));
    }
    Ok(())
}

/// A sandbox with the variants' lock timeout, and `n` workers of `threads` threads ready.
fn variant_workers(
    load: &Path,
    n: usize,
    threads: usize,
    extra_env: &[(&str, &str)],
) -> Result<(hami_test_harness::TestEnv, Vec<Worker>)> {
    let mut env =
        sandbox(64 * MIB).env("HAMI_LOCK_TIMEOUT_MS", &VARIANT_LOCK_TIMEOUT_MS.to_string());
    for (k, v) in extra_env {
        env.set_env(k, v);
    }
    let mut ws = Vec::new();
    for i in 0..n {
        ws.push(Worker::spawn(
            &env,
            load,
            &["storm", &threads.to_string(), "6", &(200 + i).to_string()],
        )?);
    }
    for w in &ws {
        w.expect("ready", LINE_WAIT)?;
    }
    Ok((env, ws))
}

fn longest_call_us(ws: &[Worker]) -> u64 {
    ws.iter()
        .map(|w| w.stats.max_us.load(Ordering::Relaxed))
        .max()
        .unwrap_or(0)
}

/// A lock holder kept from releasing the region lock for `hold` by `how`: the others' longest
/// call must stay within the lock timeout (+ [`VARIANT_SLACK`]), they must keep completing
/// calls (refusals and frees, which take no lock), resume within [`RESUME_BOUND`] once the
/// holder lets go, and the region must equal what they hold afterwards.
pub(super) fn held_variant(how: HeldBy, hold: Duration, load: &Path, r: &mut Report) -> Result<()> {
    let tag = match how {
        HeldBy::Ptrace => "stops (ptrace-stopped holder)",
        HeldBy::Starved => "stops (starved holder, nice 19 + CPU hogs)",
    };
    let (env, workers) = variant_workers(load, 4, 2, &[])?;
    std::thread::sleep(Duration::from_millis(300));
    let lock_off = core::mem::offset_of!(RegionHeader, lock).to_string();
    let region_path = env.region_path().display().to_string();
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    let mut hogs = Vec::new();
    let holder = match how {
        HeldBy::Ptrace => {
            Worker::spawn(&env, load, &["holdlock", &region_path, &lock_off, "wait"])?
        }
        HeldBy::Starved => {
            let ms = (hold + Duration::from_secs(30)).as_millis().to_string();
            for _ in 0..cores {
                hogs.push(Worker::spawn(&env, load, &["spin", &ms])?);
            }
            std::thread::sleep(Duration::from_millis(200));
            // 1 s of CPU at nice 19 against a hog per core: many seconds of wall time.
            Worker::spawn(
                &env,
                load,
                &["holdlock", &region_path, &lock_off, "spin", "1000"],
            )?
        }
    };
    let l = holder.expect("locked", LINE_WAIT)?;
    r.check(l == "locked rc=0", || {
        format!("{tag}: the holder failed: {l}")
    });
    if how == HeldBy::Ptrace {
        ptrace_stop(holder.pid)?;
        r.check(wait_state(holder.pid, 't', LINE_WAIT), || {
            format!("{tag}: the holder is not in a ptrace stop")
        });
    }
    for w in &workers {
        w.stats.max_us.store(0, Ordering::Relaxed);
    }
    let ops0 = total_ops(&workers);
    let t0 = Instant::now();
    if how == HeldBy::Ptrace {
        newcomer(tag, &env, r)?;
    }
    std::thread::sleep(hold.saturating_sub(t0.elapsed()));
    let ops_during = total_ops(&workers) - ops0;
    let held_for = t0.elapsed();
    // Still holding at the end? (A starved holder that finished early proves less.)
    let mut still = proc_state(holder.pid) == Some('t');
    let max_us = longest_call_us(&workers);
    let before: Vec<u64> = workers
        .iter()
        .map(|w| w.stats.ops.load(Ordering::Relaxed))
        .collect();
    match how {
        HeldBy::Ptrace => {
            ptrace_detach(holder.pid)?;
            let mut holder = holder;
            holder.send("release")?;
            holder.expect("unlocked", LINE_WAIT)?;
            r.check(holder.finish(LINE_WAIT)?, || {
                format!("{tag}: the holder exited with an error")
            });
        }
        HeldBy::Starved => {
            for h in hogs.drain(..) {
                h.kill();
            }
            let u = holder.expect("unlocked", LINE_WAIT)?;
            still = field(&u, "wall_ms").unwrap_or(0) >= held_for.as_millis() as u64;
            r.figure(
                &format!("{tag}: holder held the lock for (ms wall / ms CPU)"),
                format!(
                    "{} / {}",
                    field(&u, "wall_ms").unwrap_or(0),
                    field(&u, "cpu_ms").unwrap_or(0)
                ),
            );
            r.check(holder.finish(LINE_WAIT)?, || {
                format!("{tag}: the holder exited with an error")
            });
        }
    }
    let resumed = time_to_progress(&workers, &before, RESUME_BOUND * 5);
    r.figure(
        &format!("{tag}: held for (ms), still held at the end"),
        format!("{:.0}, {still}", held_for.as_secs_f64() * 1e3),
    );
    r.figure(
        &format!("{tag}: calls completed by the others meanwhile"),
        ops_during,
    );
    r.figure(
        &format!("{tag}: longest call of the others (ms)"),
        format!("{:.1}", max_us as f64 / 1000.0),
    );
    let bound = Duration::from_millis(VARIANT_LOCK_TIMEOUT_MS) + VARIANT_SLACK;
    r.check(max_us <= bound.as_micros() as u64, || {
        format!(
            "{tag}: a call took {:.1} ms, beyond the lock timeout {VARIANT_LOCK_TIMEOUT_MS} ms + {VARIANT_SLACK:?}",
            max_us as f64 / 1000.0
        )
    });
    r.check(still, || {
        format!("{tag}: the holder let go of the lock before the end of the {hold:?} (not stopped or starved: the scenario proves nothing)")
    });
    r.check(ops_during > 0, || {
        format!("{tag}: the others completed no call while the holder held the lock")
    });
    r.figure(
        &format!("{tag}: all resumed after the release within (ms)"),
        resumed.map_or("never".into(), |d| format!("{:.1}", d.as_secs_f64() * 1e3)),
    );
    r.check(resumed.is_some_and(|d| d <= RESUME_BOUND), || {
        format!("{tag}: not every process made progress within {RESUME_BOUND:?} of the release ({resumed:?})")
    });
    let (lost, left) = settle_and_check(tag, &env, workers, r)?;
    r.figure(
        &format!("{tag}: bytes lost or leaked / left after exit"),
        format!("{lost} / {left}"),
    );
    Ok(())
}

/// A process started while the lock holder is stopped cannot register in the region: its
/// first allocation must be refused with `CUDA_ERROR_OUT_OF_MEMORY` within the lock timeout
/// (+ slack), with a log line naming the lock timeout (it said "I/O error: other error").
fn newcomer(tag: &str, env: &hami_test_harness::TestEnv, r: &mut Report) -> Result<()> {
    let t = Instant::now();
    let out = super::probe::run_probe(env, &[], LINE_WAIT)?;
    let took = t.elapsed();
    r.figure(
        &format!("{tag}: a new process's first allocation"),
        format!("rc {:?} in {:.0} ms", out.rc, took.as_secs_f64() * 1e3),
    );
    let line = out
        .stderr
        .lines()
        .find(|l| l.contains("HAMI_LOCK_TIMEOUT_MS"))
        .map(str::trim);
    if let Some(l) = line {
        println!("    {tag}: the new process says: {l}");
    }
    // One wait in all (after a wait ran out, the same thread does not wait again for one more
    // timeout), plus slack.
    let bound = Duration::from_millis(VARIANT_LOCK_TIMEOUT_MS) + VARIANT_SLACK;
    r.check(
        out.rc == Some(2) && out.exited_cleanly && line.is_some() && took <= bound,
        || {
            format!(
                "{tag}: a process started while the holder is stopped: want CUDA_ERROR_OUT_OF_MEMORY within {bound:?} and a log line naming HAMI_LOCK_TIMEOUT_MS; got rc {:?} in {took:?}\n      stderr: {}",
                out.rc,
                out.stderr.trim()
            )
        },
    );
    Ok(())
}

/// One process whose region mapping is paged out (msync, `MADV_PAGEOUT`,
/// `POSIX_FADV_DONTNEED`) before every call of one of its threads: its calls fault the
/// region back in from disk. One process only: `MADV_PAGEOUT` skips pages mapped by more
/// than one process. Its longest call must stay within the lock timeout (+ slack) and the
/// region must equal what it holds afterwards.
pub(super) fn paged_out(run: Duration, load: &Path, r: &mut Report) -> Result<()> {
    let tag = "stops (region paged out before each call)";
    let (env, workers) = variant_workers(load, 1, 2, &[("TORTURE_PAGEOUT", "1")])?;
    for w in &workers {
        w.stats.max_us.store(0, Ordering::Relaxed);
    }
    let ops0 = total_ops(&workers);
    std::thread::sleep(run);
    let ops = total_ops(&workers) - ops0;
    let max_us = longest_call_us(&workers);
    let last = workers[0]
        .stats
        .last_tick
        .lock()
        .map(|t| t.clone())
        .unwrap_or_default();
    let (pageouts, pages, evicted) = (
        field(&last, "pageouts").unwrap_or(0),
        field(&last, "pages").unwrap_or(0),
        field(&last, "evicted").unwrap_or(0),
    );
    r.figure(
        &format!("{tag}: page-outs / calls"),
        format!("{pageouts} / {ops}"),
    );
    r.figure(
        &format!("{tag}: pages not resident right after a page-out, on average"),
        format!("{:.0} of {pages}", evicted as f64 / pageouts.max(1) as f64),
    );
    r.figure(
        &format!("{tag}: longest call (ms)"),
        format!("{:.1}", max_us as f64 / 1000.0),
    );
    r.check(pageouts > 0 && ops > 0, || {
        format!("{tag}: no page-out or no call happened ({pageouts} page-outs, {ops} calls)")
    });
    // On tmpfs (no swap) nothing can be paged out: the scenario then proves nothing more
    // than the others; anywhere else the mapping must really have gone.
    if on_tmpfs(env.region_path()) {
        r.figure(
            &format!("{tag}: note"),
            "region on tmpfs: pages cannot be evicted",
        );
    } else {
        r.check(evicted > 0, || {
            format!("{tag}: the region's pages stayed resident (0 of {pages} evicted by {pageouts} page-outs)")
        });
    }
    let bound = Duration::from_millis(VARIANT_LOCK_TIMEOUT_MS) + VARIANT_SLACK;
    r.check(max_us <= bound.as_micros() as u64, || {
        format!(
            "{tag}: a call took {:.1} ms, beyond the lock timeout {VARIANT_LOCK_TIMEOUT_MS} ms + {VARIANT_SLACK:?}",
            max_us as f64 / 1000.0
        )
    });
    let (lost, left) = settle_and_check(tag, &env, workers, r)?;
    r.figure(
        &format!("{tag}: bytes lost or leaked / left after exit"),
        format!("{lost} / {left}"),
    );
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
