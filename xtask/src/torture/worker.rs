//! The workers of the scenarios: a running `tortureload` read line by line in the background
//! ([`Worker`]), the region seen from outside, and the end-of-scenario check that the region
//! equals what the survivors hold.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use hami_abi::layout::UsageKind;
use hami_common::region::{Region, RegionSnapshot};
use hami_test_harness::TestEnv;

use super::profile::LINE_WAIT;
use super::report::Report;

/// What a worker's reader thread gathered from its `tick` and `error` lines.
#[derive(Default)]
pub(super) struct Stats {
    /// Longest call seen (finished in a window, or still in progress), microseconds.
    pub(super) max_us: AtomicU64,
    /// `ops=` of the last tick.
    pub(super) ops: AtomicU64,
    /// Ticks are ignored while `Instant` < this (the worker itself was stopped).
    pub(super) ignore_until: Mutex<Option<Instant>>,
    /// `error ...` lines.
    pub(super) errors: Mutex<Vec<String>>,
    /// The last `tick` line.
    pub(super) last_tick: Mutex<String>,
}

/// One running `tortureload`.
pub(super) struct Worker {
    pub(super) child: Child,
    pub(super) stdin: Option<ChildStdin>,
    pub(super) lines: Receiver<String>,
    pub(super) stats: Arc<Stats>,
    pub(super) pid: u32,
}

/// Numeric field `key` of a workload line (decimal), through the harness's line scanner.
pub(super) fn field(line: &str, key: &str) -> Option<u64> {
    hami_test_harness::field(line, key)?.parse().ok()
}

impl Worker {
    pub(super) fn spawn(env: &TestEnv, load: &Path, args: &[&str]) -> Result<Worker> {
        let mut c = env.command(load);
        c.args(args).stdin(Stdio::piped()).stderr(Stdio::null());
        let mut child = c.spawn().context("starting tortureload")?;
        let stdin = child.stdin.take();
        let out = child.stdout.take().context("tortureload stdout")?;
        let stats = Arc::new(Stats::default());
        let (tx, rx) = channel();
        let st = Arc::clone(&stats);
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                if line.starts_with("tick ") {
                    let ignored = st
                        .ignore_until
                        .lock()
                        .map(|g| g.is_some_and(|t| Instant::now() < t))
                        .unwrap_or(false);
                    if !ignored {
                        let m = field(&line, "win_us")
                            .unwrap_or(0)
                            .max(field(&line, "inflight_us").unwrap_or(0));
                        st.max_us.fetch_max(m, Ordering::Relaxed);
                    }
                    st.ops
                        .store(field(&line, "ops").unwrap_or(0), Ordering::Relaxed);
                    if let Ok(mut t) = st.last_tick.lock() {
                        *t = line;
                    }
                } else {
                    if line.starts_with("error") {
                        if let Ok(mut e) = st.errors.lock() {
                            e.push(line.clone());
                        }
                    }
                    if tx.send(line).is_err() {
                        break;
                    }
                }
            }
        });
        let pid = child.id();
        Ok(Worker {
            child,
            stdin,
            lines: rx,
            stats,
            pid,
        })
    }

    pub(super) fn send(&mut self, cmd: &str) -> Result<()> {
        let s = self.stdin.as_mut().context("stdin closed")?;
        writeln!(s, "{cmd}").with_context(|| format!("writing {cmd:?} to pid {}", self.pid))?;
        s.flush()?;
        Ok(())
    }

    /// The next line starting with `prefix` (other lines are skipped).
    pub(super) fn expect(&self, prefix: &str, wait: Duration) -> Result<String> {
        let deadline = Instant::now() + wait;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) if l.starts_with(prefix) => return Ok(l),
                Ok(_) => {}
                Err(RecvTimeoutError::Timeout) => {
                    bail!(
                        "pid {}: no {prefix:?} line within {:?} (hung?)",
                        self.pid,
                        wait
                    )
                }
                Err(RecvTimeoutError::Disconnected) => {
                    bail!("pid {}: exited before printing {prefix:?}", self.pid)
                }
            }
        }
    }

    pub(super) fn signal(&self, sig: libc::c_int) {
        // SAFETY: kill has no memory preconditions; pid is our own child, not yet reaped.
        unsafe { libc::kill(self.pid as libc::pid_t, sig) };
    }

    pub(super) fn kill(mut self) -> Arc<Stats> {
        self.signal(libc::SIGKILL);
        let _ = self.child.wait();
        Arc::clone(&self.stats)
    }

    /// Waits for the exit (at most `wait`); Ok(true) if it exited with status 0.
    pub(super) fn finish(mut self, wait: Duration) -> Result<bool> {
        drop(self.stdin.take());
        let deadline = Instant::now() + wait;
        loop {
            if let Some(st) = self.child.try_wait()? {
                return Ok(st.success());
            }
            if Instant::now() > deadline {
                self.signal(libc::SIGKILL);
                let _ = self.child.wait();
                bail!("pid {} did not exit within {wait:?} (hung?)", self.pid);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    pub(super) fn errors(&self) -> Vec<String> {
        self.stats
            .errors
            .lock()
            .map(|e| e.clone())
            .unwrap_or_default()
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            self.signal(libc::SIGCONT);
            self.signal(libc::SIGKILL);
            let _ = self.child.wait();
        }
    }
}

/// Opens the region once its first process has created it.
pub(super) fn open_region(path: &Path, writable: bool) -> Result<Region> {
    let deadline = Instant::now() + LINE_WAIT;
    loop {
        match Region::open_existing(path, writable) {
            Ok(r) => return Ok(r),
            Err(e) if Instant::now() > deadline => return Err(e.into()),
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

pub(super) fn consistent_snapshot(r: &Region) -> Result<RegionSnapshot> {
    for _ in 0..1000 {
        let s = r.snapshot();
        if s.consistent {
            return Ok(s);
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    bail!(
        "no consistent snapshot of {} in 1000 tries",
        r.path().display()
    )
}

pub(super) fn data(s: &RegionSnapshot, pid: u32) -> u64 {
    s.slots_of_pid(pid)
        .map(|sl| sl.usage[0][UsageKind::Data.index()])
        .sum()
}

/// Bytes pid's slots charge for its stream-ordered pools on device 0. The preload charges a
/// pool's reserve (never below its live allocations), so async allocations are in here, not
/// in [`data`], and a pool may keep more than it has handed out.
pub(super) fn pool(s: &RegionSnapshot, pid: u32) -> u64 {
    s.slots_of_pid(pid)
        .map(|sl| sl.usage[0][UsageKind::Pool.index()])
        .sum()
}

/// Stops every worker, reclaims dead slots, checks that the region equals what the
/// survivors hold; lets them free and exit; checks that the region is empty.
/// Returns (bytes lost or leaked while live, bytes left after exit).
pub(super) fn settle_and_check(
    what: &str,
    env: &TestEnv,
    workers: Vec<Worker>,
    r: &mut Report,
) -> Result<(i128, u64)> {
    let mut workers = workers;
    for w in workers.iter_mut() {
        w.signal(libc::SIGCONT);
        w.send("stop")?;
    }
    let mut held = BTreeMap::new();
    for w in &workers {
        let l = w.expect("held ", LINE_WAIT)?;
        held.insert(w.pid, field(&l, "bytes").unwrap_or(u64::MAX));
        r.check(field(&l, "errors") == Some(0), || {
            format!(
                "{what}: pid {} reported errors: {l} {:?}",
                w.pid,
                w.errors()
            )
        });
    }
    let region = open_region(env.region_path(), true)?;
    let reclaimed = region.reclaim_dead().len();
    let s = consistent_snapshot(&region)?;
    let sum_held: u64 = held.values().sum();
    let mut sum_slots_all = 0u64;
    for sl in &s.slots {
        sum_slots_all += sl.device_total(0);
        r.check(held.contains_key(&sl.pid), || {
            format!(
                "{what}: slot {} of pid {} (not a live worker) survived reclaim holding {} bytes",
                sl.index,
                sl.pid,
                sl.total()
            )
        });
    }
    // Exact when no pool holds anything; with pools: data <= held <= data + pool (a pool's
    // reserve above its live allocations is memory the device really holds for the process).
    let mut sum_pool = 0u64;
    for (&pid, &h) in &held {
        let d = data(&s, pid);
        let p = pool(&s, pid);
        sum_pool += p;
        r.check(d <= h && h <= d + p, || {
            format!("{what}: pid {pid} holds {h} bytes, its slot says {d} of data and {p} of pools")
        });
    }
    // The header's admitted total is the slots' charges: their usage plus their unused
    // admission reserves.
    let reserved = s.reserved(0);
    r.check(
        s.used[0] == s.charged(0) && s.used[0] == sum_slots_all + reserved,
        || {
            format!(
                "{what}: used = {} but the active slots are charged {} and add up to {sum_slots_all} + {reserved} reserved",
                s.used[0],
                s.charged(0)
            )
        },
    );
    // Bytes lost (negative) or leaked (positive) beyond what the pools may keep reserved.
    let in_use = s.used[0] - reserved;
    let diff = in_use as i128 - sum_held as i128;
    let lost = if diff < 0 {
        diff
    } else {
        (diff - sum_pool as i128).max(0)
    };
    r.check(lost == 0, || {
        format!(
            "{what}: region used {in_use} vs {sum_held} held by the live processes (pools reserve {sum_pool})"
        )
    });
    println!(
        "    {what}: {} live processes hold {sum_held} bytes, region used {in_use} (admission reserves {reserved}; pool reserve {sum_pool}; {} slots reclaimed at the end)",
        held.len(),
        reclaimed
    );
    for w in workers.iter_mut() {
        w.send("exit")?;
    }
    for w in workers {
        let pid = w.pid;
        let l = w.expect("freed ", LINE_WAIT)?;
        r.check(field(&l, "errors") == Some(0), || {
            format!("{what}: pid {pid} failed to free: {l}")
        });
        let ok = w.finish(LINE_WAIT)?;
        r.check(ok, || format!("{what}: pid {pid} exited with an error"));
    }
    region.reclaim_dead();
    let s = consistent_snapshot(&region)?;
    r.check(s.used[0] == 0 && s.slots.is_empty(), || {
        format!(
            "{what}: after every process exited: used {} bytes, {} slots left",
            s.used[0],
            s.slots.len()
        )
    });
    Ok((lost, s.used[0]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    pub(super) fn workload_lines_are_read_by_key() {
        let l = "held bytes=4194304 count=2 max_us=17 ops=9 refused=1 errors=0";
        assert_eq!(field(l, "bytes"), Some(4 << 20));
        assert_eq!(field(l, "errors"), Some(0));
        assert_eq!(field(l, "max_us"), Some(17));
        assert_eq!(field(l, "us"), None, "whole keys only");
        assert_eq!(field("tick win_us=x", "win_us"), None);
    }
}
