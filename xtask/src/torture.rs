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
//!   takes longer than [`BLOCK_BOUND`]. At the end the survivors stop, dead slots are
//!   reclaimed, and each survivor's slot must hold exactly the bytes it reports holding (and
//!   `used` their sum); after they exit and a last reclaim, `used` must be 0.
//! * **Stopped processes**: random workers SIGSTOPped for up to a second and a half while the
//!   others churn; then a process that takes the region lock itself and stops while holding
//!   it (continued, then killed while stopped). The others' longest call is measured; they
//!   must all resume within [`RESUME_BOUND`] of the holder being continued or killed.
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

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use hami_common::layout::{RegionHeader, UsageKind, REGION_SIZE};
use hami_common::region::{Region, RegionSnapshot};
use hami_test_harness::{Artifacts, TestEnv};

/// No call of a running (not stopped) process may take longer than this, in the kill storm.
pub const BLOCK_BOUND: Duration = Duration::from_secs(5);
/// After a stopped lock holder is continued or killed, every process must make progress
/// again within this.
pub const RESUME_BOUND: Duration = Duration::from_secs(2);
/// How long a command may wait for one line of a workload before the scenario fails.
const LINE_WAIT: Duration = Duration::from_secs(30);
/// Per-case limit of the bad-input cases.
const CASE_TIMEOUT: Duration = Duration::from_secs(15);
/// Per-case limit of a case that is a known hang (reported as a finding).
const FINDING_TIMEOUT: Duration = Duration::from_secs(3);
const MIB: u64 = 1 << 20;

/// One profile's sizes.
#[derive(Debug, Clone)]
struct Profile {
    name: &'static str,
    storm_procs: usize,
    storm_threads: usize,
    storm_secs: u64,
    min_kills: u64,
    kill_gap_ms: u64,
    stops: usize,
    hold_secs: u64,
    race_procs: usize,
    race_rounds: usize,
    every_header_byte: bool,
}

const SHORT: Profile = Profile {
    name: "short",
    storm_procs: 8,
    storm_threads: 3,
    storm_secs: 15,
    min_kills: 100,
    kill_gap_ms: 50,
    stops: 4,
    hold_secs: 2,
    race_procs: 4,
    race_rounds: 30,
    every_header_byte: false,
};

const LONG: Profile = Profile {
    name: "long",
    storm_procs: 32,
    storm_threads: 4,
    storm_secs: 60,
    min_kills: 1000,
    kill_gap_ms: 80,
    stops: 20,
    hold_secs: 5,
    race_procs: 32,
    race_rounds: 100,
    every_header_byte: true,
};

// The sizes issue 12 asks for.
const _: () = assert!(LONG.min_kills >= 1000 && LONG.storm_procs == 32 && SHORT.storm_procs == 8);
const _: () = assert!(LONG.race_procs == 32 && LONG.race_rounds == 100);

/// Options of `cargo xtask torture`.
#[derive(Debug, Default)]
pub struct TortureOptions {
    /// The release profile (32 processes, >= 1000 kills, 100 race rounds, every header byte,
    /// agent faults, fuzzing).
    pub long: bool,
    /// Run only this scenario: `storm`, `stops`, `race`, `bad`, `agent` or `fuzz`.
    pub only: Option<String>,
}

/// Figures and failed checks gathered by the scenarios.
#[derive(Default)]
struct Report {
    figures: Vec<(String, String)>,
    failures: Vec<String>,
}

impl Report {
    fn figure(&mut self, name: &str, value: impl std::fmt::Display) {
        println!("    {name}: {value}");
        self.figures.push((name.to_string(), value.to_string()));
    }

    fn check(&mut self, ok: bool, what: impl FnOnce() -> String) {
        if !ok {
            let w = what();
            println!("    CHECK FAILED: {w}");
            self.failures.push(w);
        }
    }
}

/// Run every scenario of the chosen profile.
pub fn torture(opts: &TortureOptions) -> Result<()> {
    let p = if opts.long { LONG } else { SHORT };
    if let Some(o) = &opts.only {
        if !["storm", "stops", "race", "bad", "agent", "fuzz"].contains(&o.as_str()) {
            bail!("--only {o:?}: not a scenario (storm, stops, race, bad, agent, fuzz)");
        }
    }
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
    let on = |name: &str| opts.only.as_deref().is_none_or(|o| o == name);
    if on("storm") {
        step(&format!("kill storm ({} profile)", p.name));
        kill_storm(&p, &load, &mut rng, &mut r).context("kill storm")?;
    }
    if on("stops") {
        step("stopped processes and a stopped lock holder");
        stopped(&p, &load, &mut rng, &mut r).context("stopped processes")?;
    }
    if on("race") {
        step("race to the limit");
        race(&p, &load, &mut r).context("race to the limit")?;
    }
    if on("bad") {
        step("bad inputs (preload side)");
        bad_inputs(&p, &mut rng, &mut r).context("bad inputs")?;
    }
    // The agent takes seconds to attach on a loaded machine: long profile (or --only agent).
    if (opts.long && opts.only.is_none()) || opts.only.as_deref() == Some("agent") {
        step("agent faults (SIGKILL and restart, stale uprobes, ring buffer overflow)");
        agent_faults(&p, &load, &mut r).context("agent faults")?;
    }
    if (opts.long && opts.only.is_none()) || opts.only.as_deref() == Some("fuzz") {
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

/// xorshift64*: reproducible enough, no dependency.
struct Rng(u64);

impl Rng {
    fn new() -> Rng {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64)
            | 1;
        println!("random seed {seed}");
        Rng(seed)
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next() % n
        }
    }
}

/// A sandbox of one scenario: its own region and fake-driver state, the preload on, one
/// device of 1 TiB (the limit is the region's), no context memory (so that `used` is data
/// only and never legitimately above the limit).
fn sandbox(limit: u64) -> TestEnv {
    TestEnv::new()
        .preload(true)
        .env("CUDA_DEVICE_MEMORY_LIMIT", &limit.to_string())
        .env("FAKE_CUDA_DEVICE_COUNT", "1")
        .env("FAKE_CUDA_TOTAL_MEM", "1T")
        .env("FAKE_CUDA_CTX_OVERHEAD", "0")
        .env("HAMI_CONTEXT_OVERHEAD", "0")
        .env("LIBCUDA_LOG_LEVEL", "0")
}

// ---- workers ----

/// What a worker's reader thread gathered from its `tick` and `error` lines.
#[derive(Default)]
struct Stats {
    /// Longest call seen (finished in a window, or still in progress), microseconds.
    max_us: AtomicU64,
    /// `ops=` of the last tick.
    ops: AtomicU64,
    /// Ticks are ignored while `Instant` < this (the worker itself was stopped).
    ignore_until: Mutex<Option<Instant>>,
    /// `error ...` lines.
    errors: Mutex<Vec<String>>,
}

/// One running `tortureload`.
struct Worker {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
    stats: Arc<Stats>,
    pid: u32,
}

fn field(line: &str, key: &str) -> Option<u64> {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(key)?.strip_prefix('='))
        .and_then(|v| v.parse().ok())
}

impl Worker {
    fn spawn(env: &TestEnv, load: &Path, args: &[&str]) -> Result<Worker> {
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

    fn send(&mut self, cmd: &str) -> Result<()> {
        let s = self.stdin.as_mut().context("stdin closed")?;
        writeln!(s, "{cmd}").with_context(|| format!("writing {cmd:?} to pid {}", self.pid))?;
        s.flush()?;
        Ok(())
    }

    /// The next line starting with `prefix` (other lines are skipped).
    fn expect(&self, prefix: &str, wait: Duration) -> Result<String> {
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

    fn signal(&self, sig: libc::c_int) {
        // SAFETY: kill has no memory preconditions; pid is our own child, not yet reaped.
        unsafe { libc::kill(self.pid as libc::pid_t, sig) };
    }

    fn kill(mut self) -> Arc<Stats> {
        self.signal(libc::SIGKILL);
        let _ = self.child.wait();
        Arc::clone(&self.stats)
    }

    /// Waits for the exit (at most `wait`); Ok(true) if it exited with status 0.
    fn finish(mut self, wait: Duration) -> Result<bool> {
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

    fn errors(&self) -> Vec<String> {
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
fn open_region(path: &Path, writable: bool) -> Result<Region> {
    let deadline = Instant::now() + LINE_WAIT;
    loop {
        match Region::open_existing(path, writable) {
            Ok(r) => return Ok(r),
            Err(e) if Instant::now() > deadline => return Err(e.into()),
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

fn consistent_snapshot(r: &Region) -> Result<RegionSnapshot> {
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

fn data(s: &RegionSnapshot, pid: u32) -> u64 {
    s.slots_of_pid(pid)
        .map(|sl| sl.usage[0][UsageKind::Data.index()])
        .sum()
}

/// Bytes pid's slots charge for its stream-ordered pools on device 0. The preload charges a
/// pool's reserve (never below its live allocations), so async allocations are in here, not
/// in [`data`], and a pool may keep more than it has handed out.
fn pool(s: &RegionSnapshot, pid: u32) -> u64 {
    s.slots_of_pid(pid)
        .map(|sl| sl.usage[0][UsageKind::Pool.index()])
        .sum()
}

/// Stops every worker, reclaims dead slots, checks that the region equals what the
/// survivors hold; lets them free and exit; checks that the region is empty.
/// Returns (bytes lost or leaked while live, bytes left after exit).
fn settle_and_check(
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
    r.check(s.used[0] == sum_slots_all, || {
        format!(
            "{what}: used = {} but the active slots add up to {sum_slots_all}",
            s.used[0]
        )
    });
    // Bytes lost (negative) or leaked (positive) beyond what the pools may keep reserved.
    let diff = s.used[0] as i128 - sum_held as i128;
    let lost = if diff < 0 {
        diff
    } else {
        (diff - sum_pool as i128).max(0)
    };
    r.check(lost == 0, || {
        format!(
            "{what}: region used {} vs {} held by the live processes (pools reserve {sum_pool})",
            s.used[0], sum_held
        )
    });
    println!(
        "    {what}: {} live processes hold {sum_held} bytes, region used {} (pool reserve {sum_pool}; {} slots reclaimed at the end)",
        held.len(),
        s.used[0],
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

// ---- kill storm ----

fn kill_storm(p: &Profile, load: &Path, rng: &mut Rng, r: &mut Report) -> Result<()> {
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

// ---- stopped processes ----

/// `State:` letter of `/proc/<pid>/stat`.
fn proc_state(pid: u32) -> Option<char> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    s.rsplit_once(')')?.1.trim_start().chars().next()
}

fn wait_state(pid: u32, want: char, wait: Duration) -> bool {
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
fn total_ops(ws: &[Worker]) -> u64 {
    ws.iter().map(|w| w.stats.ops.load(Ordering::Relaxed)).sum()
}

/// How long until every worker's op counter moved past `before` (None: not within `wait`).
fn time_to_progress(ws: &[Worker], before: &[u64], wait: Duration) -> Option<Duration> {
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

fn stopped(p: &Profile, load: &Path, rng: &mut Rng, r: &mut Report) -> Result<()> {
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

// ---- race to the limit ----

fn race(p: &Profile, load: &Path, r: &mut Report) -> Result<()> {
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
        let used = consistent_snapshot(&region)?.used[0];
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
        let used = s.used[0];
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

// ---- bad inputs ----

/// One bad-input case: what the region path points at, or the environment.
struct Case {
    name: String,
    /// Extra environment (on top of a 1 GiB limit).
    env: Vec<(String, String)>,
    /// Contents of the region file (None: leave the path as prepared by `prepare`).
    file: Option<Vec<u8>>,
    /// Runs before the probe (make a directory, a FIFO...), given the region path.
    prepare: Option<fn(&Path) -> std::io::Result<()>>,
    /// Expected result of the 2 MiB allocation.
    rc: i32,
    /// Text the preload's stderr must contain (case-insensitive).
    says: &'static str,
    /// A known design finding (docs/torture.md): a hang is reported as this finding, with a
    /// short timeout, instead of failing the run.
    finding: Option<&'static str>,
}

fn bad_inputs(p: &Profile, rng: &mut Rng, r: &mut Report) -> Result<()> {
    // A valid region to corrupt.
    let env = sandbox(1 << 30);
    let out = run_probe(&env, &[], CASE_TIMEOUT)?;
    if out.rc != Some(0) {
        bail!("the reference run failed: {}\n{}", out.stdout, out.stderr);
    }
    let valid = std::fs::read(env.region_path()).context("reading the reference region")?;
    if valid.len() != REGION_SIZE {
        bail!("the reference region is {} bytes", valid.len());
    }
    let hs = std::mem::size_of::<RegionHeader>();
    let mut cases = Vec::new();
    let mut cuts: Vec<usize> = if p.every_header_byte {
        (1..=hs).collect()
    } else {
        let mut v = vec![1, 7, 8, 9, 12, 15, 16, 20, 24, 31, 32, 40, 48];
        v.extend([hs / 4, hs / 2, hs - 8, hs - 1, hs, hs + 1]);
        v
    };
    cuts.extend([REGION_SIZE / 2, REGION_SIZE - 1]);
    for cut in cuts {
        cases.push(Case {
            name: format!("truncated to {cut} bytes"),
            env: vec![],
            file: Some(valid[..cut].to_vec()),
            prepare: None,
            rc: 2,
            says: "truncated",
            finding: None,
        });
    }
    let random: Vec<u8> = (0..REGION_SIZE).map(|_| rng.next() as u8).collect();
    cases.push(case_file("random bytes, region size", random, "bad magic"));
    let random_short: Vec<u8> = (0..100).map(|_| rng.next() as u8 | 1).collect();
    cases.push(case_file("random bytes, 100", random_short, "bad magic"));
    let mut m = valid.clone();
    m[0] ^= 0xff;
    cases.push(case_file("wrong magic", m, "bad magic"));
    let off = core::mem::offset_of!(RegionHeader, version);
    let mut m = valid.clone();
    let next = hami_common::layout::VERSION + 1;
    m[off..off + 4].copy_from_slice(&next.to_le_bytes());
    cases.push(case_file(
        &format!("layout version {next} (the next one)"),
        m,
        "layout version",
    ));
    let mut m = valid.clone();
    m[off..off + 4].copy_from_slice(&u32::MAX.to_le_bytes());
    cases.push(case_file("layout version u32::MAX", m, "layout version"));
    let off = core::mem::offset_of!(RegionHeader, header_size);
    let mut m = valid.clone();
    m[off..off + 4].copy_from_slice(&8u32.to_le_bytes());
    cases.push(case_file("header_size 8", m, "header_size"));
    let off = core::mem::offset_of!(RegionHeader, total_size);
    let mut m = valid.clone();
    m[off..off + 8].copy_from_slice(&u64::MAX.to_le_bytes());
    cases.push(case_file("total_size u64::MAX", m, "total_size"));
    let mut m = valid.clone();
    m.extend_from_slice(&[0u8; 4096]);
    cases.push(case_file("file 4 KiB too long", m, "file size"));
    cases.push(Case {
        name: "a directory".into(),
        env: vec![],
        file: None,
        prepare: Some(|p| std::fs::create_dir(p)),
        rc: 2,
        says: "directory",
        finding: None,
    });
    cases.push(Case {
        name: "a FIFO".into(),
        env: vec![],
        file: None,
        prepare: Some(|p| {
            let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes())
                .map_err(std::io::Error::other)?;
            // SAFETY: c is a valid C string.
            if unsafe { libc::mkfifo(c.as_ptr(), 0o600) } != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        }),
        rc: 2,
        says: "not a regular file",
        finding: None,
    });
    cases.push(Case {
        name: "in a missing directory".into(),
        env: vec![(
            "CUDA_DEVICE_MEMORY_SHARED_CACHE".into(),
            "/nonexistent-hami-torture/dir/region".into(),
        )],
        file: None,
        prepare: None,
        rc: 2,
        says: "/nonexistent-hami-torture/dir/region",
        finding: None,
    });
    for v in [
        "lots",
        "1.5G",
        "-1",
        "",
        "   ",
        "0x10",
        "4GB",
        "1 G",
        "+5",
        "G",
        "1e9",
        "١٢",
        "1G\t2",
        "18446744073709551616",
        "16777216T",
    ] {
        cases.push(Case {
            name: format!("CUDA_DEVICE_MEMORY_LIMIT={v:?}"),
            env: vec![("CUDA_DEVICE_MEMORY_LIMIT".into(), v.into())],
            file: None,
            prepare: None,
            rc: 2,
            says: "invalid CUDA_DEVICE_MEMORY_LIMIT",
            finding: None,
        });
    }
    for v in ["x", "-3", "99999999999999999999"] {
        cases.push(Case {
            name: format!("CUDA_DEVICE_MEMORY_LIMIT_0={v:?}"),
            env: vec![("CUDA_DEVICE_MEMORY_LIMIT_0".into(), v.into())],
            file: None,
            prepare: None,
            rc: 2,
            says: "invalid CUDA_DEVICE_MEMORY_LIMIT_0",
            finding: None,
        });
    }
    cases.push(Case {
        name: "HAMI_CONTEXT_OVERHEAD=\"lots\" (reported, then measured)".into(),
        env: vec![("HAMI_CONTEXT_OVERHEAD".into(), "lots".into())],
        file: None,
        prepare: None,
        rc: 0,
        says: "invalid HAMI_CONTEXT_OVERHEAD",
        finding: None,
    });
    cases.push(Case {
        name: "LIBCUDA_LOG_LEVEL=\"loud\" (warned, 1 used)".into(),
        env: vec![("LIBCUDA_LOG_LEVEL".into(), "loud".into())],
        file: None,
        prepare: None,
        rc: 0,
        says: "LIBCUDA_LOG_LEVEL",
        finding: None,
    });
    // The lock word names a thread that does not exist (and no owner-died mark): what a
    // holder leaves when the kernel could not walk its robust list, or a copied file.
    let mut t = Command::new("true").spawn().context("starting true")?;
    let gone = t.id();
    t.wait()?;
    let mut m = valid.clone();
    let off = core::mem::offset_of!(RegionHeader, lock);
    m[off..off + 4].copy_from_slice(&gone.to_le_bytes());
    cases.push(Case {
        name: "lock word held by a thread that does not exist".into(),
        env: vec![],
        file: Some(m),
        prepare: None,
        rc: 2,
        says: "lock",
        finding: Some("stale lock word: the first locker waits forever"),
    });

    let (mut passed, mut findings, mut slowest) = (0usize, 0usize, Duration::ZERO);
    let n = cases.len();
    for c in cases {
        let mut env = sandbox(1 << 30);
        for (k, v) in &c.env {
            env.set_env(k, v);
        }
        let path = env
            .vars()
            .get("CUDA_DEVICE_MEMORY_SHARED_CACHE")
            .map(PathBuf::from)
            .unwrap_or_default();
        if let Some(bytes) = &c.file {
            std::fs::write(&path, bytes)?;
        }
        if let Some(prep) = c.prepare {
            prep(&path).with_context(|| format!("preparing {}", c.name))?;
        }
        let t = Instant::now();
        let wait = if c.finding.is_some() {
            FINDING_TIMEOUT
        } else {
            CASE_TIMEOUT
        };
        let out = run_probe(&env, &[], wait);
        let took = t.elapsed();
        let out = match (out, c.finding) {
            (Ok(o), _) => o,
            (Err(e), Some(f)) => {
                findings += 1;
                r.figure(
                    &format!("bad inputs: FINDING ({})", c.name),
                    format!("{f}: {e:#}"),
                );
                continue;
            }
            (Err(e), None) => {
                r.check(false, || format!("bad input {}: {e:#}", c.name));
                continue;
            }
        };
        slowest = slowest.max(took);
        let says = out.stderr.to_lowercase().contains(&c.says.to_lowercase());
        let kept = c
            .file
            .as_ref()
            .is_none_or(|b| std::fs::read(&path).is_ok_and(|now| &now == b));
        let good = out.exited_cleanly && out.rc == Some(c.rc) && says && kept;
        if good {
            passed += 1;
        }
        r.check(good, || {
            format!(
                "bad input {}: want rc={} and a log line with {:?}, file untouched; got rc={:?}, exit ok={}, file kept={kept}\n      stdout: {}\n      stderr: {}",
                c.name,
                c.rc,
                c.says,
                out.rc,
                out.exited_cleanly,
                out.stdout.trim(),
                out.stderr.trim()
            )
        });
    }
    // Hook arguments the CUDA documentation gives a result for (1 GiB limit). The
    // expected codes, in order, of the listed ops' lines.
    let arg_cases: [ArgCase; 7] = [
        ("cuMemAlloc_v2 of 0 bytes", &["alloc", "0"], &[("alloc", 1)]),
        (
            "cuMemAlloc_v2 into NULL",
            &["alloc-null"],
            &[("alloc-null", 1)],
        ),
        (
            "cuMemAlloc_v2 of SIZE_MAX, then the whole quota",
            &["alloc", "18446744073709551615", "alloc", "1G"],
            &[("alloc", 2), ("alloc", 0)],
        ),
        (
            "cuMemCreate of a size that is not a multiple of the granularity",
            &["create", "1"],
            &[("create", 1)],
        ),
        ("cuMemFree_v2(0)", &["free-raw", "0"], &[("free-raw", 0)]),
        (
            "cuMemFree_v2 of an unknown pointer, then the whole quota",
            &["free-raw", "0x1234", "alloc", "1G"],
            &[("free-raw", 1), ("alloc", 0)],
        ),
        (
            "free everything twice, then the whole quota",
            &["alloc", "512M", "free", "all", "free", "all", "alloc", "1G"],
            &[("alloc", 0), ("alloc", 0)],
        ),
    ];
    let mut arg_passed = 0;
    for (name, ops, want) in arg_cases {
        let env = sandbox(1 << 30);
        let mut all = vec!["init", "ctx"];
        all.extend_from_slice(ops);
        let out = match run_ops(&env, &all, CASE_TIMEOUT) {
            Ok(o) => o,
            Err(e) => {
                r.check(false, || format!("hook arguments, {name}: {e:#}"));
                continue;
            }
        };
        let lines: Vec<(String, Option<u64>)> = out
            .stdout
            .lines()
            .filter_map(|l| {
                let op = l.strip_prefix("op=")?.split_whitespace().next()?;
                Some((op.to_string(), field(l, "rc")))
            })
            .collect();
        let mut got = Vec::new();
        let mut it = lines.iter();
        for (op, _) in want {
            got.push(it.find(|(o, _)| o == op).and_then(|(_, rc)| *rc));
        }
        let ok = out.exited_cleanly
            && got
                .iter()
                .zip(want.iter())
                .all(|(g, (_, w))| *g == Some(*w as u64));
        if ok {
            arg_passed += 1;
        }
        r.check(ok, || {
            format!(
                "hook arguments, {name}: want {want:?}, got {got:?}\n      stdout: {}\n      stderr: {}",
                out.stdout.trim(),
                out.stderr.trim()
            )
        });
    }
    r.figure(
        "hook arguments: cases passed",
        format!("{arg_passed} / {}", arg_cases.len()),
    );
    r.figure(
        "bad inputs: cases passed / known findings",
        format!("{passed} / {n} (findings: {findings})"),
    );
    r.figure(
        "bad inputs: slowest case (ms)",
        format!("{:.0}", slowest.as_secs_f64() * 1e3),
    );
    Ok(())
}

/// A hook-argument case: name, cudaprobe ops (after `init ctx`), expected `(op, rc)` in order.
type ArgCase = (
    &'static str,
    &'static [&'static str],
    &'static [(&'static str, i32)],
);

fn case_file(name: &str, bytes: Vec<u8>, says: &'static str) -> Case {
    Case {
        name: name.into(),
        env: vec![],
        file: Some(bytes),
        prepare: None,
        rc: 2,
        says,
        finding: None,
    }
}

struct ProbeRun {
    /// rc of the `alloc` op.
    rc: Option<i32>,
    exited_cleanly: bool,
    stdout: String,
    stderr: String,
}

/// `cudaprobe init ctx alloc 2M EXTRA...` under `env`, killed after `wait`.
fn run_probe(env: &TestEnv, extra: &[&str], wait: Duration) -> Result<ProbeRun> {
    let mut ops = vec!["init", "ctx", "alloc", "2M"];
    ops.extend_from_slice(extra);
    run_ops(env, &ops, wait)
}

/// `cudaprobe OPS...` under `env`, killed after `wait`; `rc` = that of the first `alloc`.
fn run_ops(env: &TestEnv, ops: &[&str], wait: Duration) -> Result<ProbeRun> {
    let mut c: Command = env.cudaprobe_cmd(ops);
    let mut child = c.spawn().context("starting cudaprobe")?;
    let mut so = child.stdout.take().context("stdout")?;
    let mut se = child.stderr.take().context("stderr")?;
    let ho = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut so, &mut s);
        s
    });
    let he = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut se, &mut s);
        s
    });
    let t0 = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait()? {
            break s;
        }
        if t0.elapsed() > wait {
            let _ = child.kill();
            let _ = child.wait();
            bail!("cudaprobe did not finish within {wait:?} (hang)");
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let stdout = ho.join().unwrap_or_default();
    let stderr = he.join().unwrap_or_default();
    let rc = stdout
        .lines()
        .find(|l| l.starts_with("op=alloc "))
        .and_then(|l| field(l, "rc"))
        .map(|v| v as i32);
    Ok(ProbeRun {
        rc,
        exited_cleanly: status.code().is_some(),
        stdout,
        stderr,
    })
}

// ---- agent faults ----

/// The eBPF program ids the process holds (`prog_id:` in `/proc/<pid>/fdinfo/*`: program
/// and link descriptors).
fn bpf_prog_ids(pid: u32) -> Vec<u32> {
    let mut ids = Vec::new();
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/fdinfo")) else {
        return ids;
    };
    for e in dir.flatten() {
        if let Ok(t) = std::fs::read_to_string(e.path()) {
            for l in t.lines() {
                if let Some(v) = l.strip_prefix("prog_id:") {
                    if let Ok(id) = v.trim().parse() {
                        ids.push(id);
                    }
                }
            }
        }
    }
    ids.sort_unstable();
    ids.dedup();
    ids
}

/// Whether the kernel still has eBPF program `id` (`BPF_PROG_GET_FD_BY_ID`). A uprobe left
/// behind by a dead agent would keep its program alive.
fn bpf_prog_exists(id: u32) -> bool {
    const BPF_PROG_GET_FD_BY_ID: libc::c_long = 13;
    // union bpf_attr for this command: prog_id, next_id, open_flags.
    let attr: [u32; 3] = [id, 0, 0];
    // SAFETY: the attr buffer is valid for its size; the command only reads it.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_PROG_GET_FD_BY_ID,
            attr.as_ptr(),
            std::mem::size_of_val(&attr) as libc::c_uint,
        )
    };
    if fd >= 0 {
        // SAFETY: a descriptor the kernel just gave us.
        unsafe { libc::close(fd as libc::c_int) };
        return true;
    }
    false
}

/// Programs of `ids` still loaded after up to 20 s (the kernel frees them asynchronously
/// once the last descriptor is closed; several seconds on a loaded machine).
fn lingering(ids: &[u32]) -> Vec<u32> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let left: Vec<u32> = ids
            .iter()
            .copied()
            .filter(|&i| bpf_prog_exists(i))
            .collect();
        if left.is_empty() || Instant::now() > deadline {
            return left;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn start_agent(bin: &Path, art: &Artifacts, env: &TestEnv) -> Result<crate::demo::Agent> {
    let mut c = Command::new(bin);
    c.args([
        "run",
        "--json-log",
        "--metrics-addr",
        "127.0.0.1:0",
        "--libcuda",
    ])
    .arg(&art.fake_libcuda)
    .env_remove("LD_PRELOAD")
    .env("LD_LIBRARY_PATH", &art.fake_lib_dir)
    .envs(env.vars());
    crate::demo::Agent::spawn(c, false)
}

fn agent_faults(p: &Profile, load: &Path, r: &mut Report) -> Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("the agent loads eBPF programs: run as root");
    }
    let (art, bin) = crate::demo::build(&hami_test_harness::workspace_root())?;
    let env = sandbox(1 << 40);
    // Paced (1 ms between calls): a debug agent on a loaded machine keeps up, so a finding
    // is a false one, not the effect of lost events.
    let mut workers = Vec::new();
    for i in 0..3 {
        workers.push(Worker::spawn(
            &env,
            load,
            &["storm", "1", "4", &(200 + i).to_string(), "1000"],
        )?);
    }
    for w in &workers {
        w.expect("ready", LINE_WAIT)?;
    }
    let mine: Vec<u64> = workers.iter().map(|w| w.pid as u64).collect();
    let restarts = if p.every_header_byte { 5 } else { 1 };
    let (mut false_findings, mut stale, mut progs) = (0usize, 0usize, 0usize);
    for round in 0..restarts {
        let agent = start_agent(&bin, art, &env)?;
        std::thread::sleep(Duration::from_millis(1000));
        let ids = bpf_prog_ids(agent.pid());
        progs = progs.max(ids.len());
        r.check(!ids.is_empty(), || {
            format!("agent round {round}: the running agent holds no eBPF program")
        });
        // SIGKILL mid-workload: no exit path runs.
        agent_signal(agent.pid(), libc::SIGKILL);
        drop(agent);
        let left = lingering(&ids);
        stale += left.len();
        r.check(left.is_empty(), || {
            format!("agent round {round}: after SIGKILL of the agent, its eBPF programs {left:?} are still loaded (stale probes)")
        });
        // Restarted mid-workload: the running processes are old news, not bypasses.
        let mut agent = start_agent(&bin, art, &env)?;
        let m0 = agent.metrics()?;
        let d0 = crate::demo::metric(&m0, "hami_events_dropped_total", &[]).unwrap_or(0);
        std::thread::sleep(Duration::from_secs(3));
        agent.drain();
        let m1 = agent.metrics()?;
        let d1 = crate::demo::metric(&m1, "hami_events_dropped_total", &[]).unwrap_or(0);
        let f = ours(&agent, &mine, env.region_path());
        false_findings += f.len();
        // For whoever debugs it: the events the agent consumed, by kind.
        let events: Vec<&str> = m1
            .lines()
            .filter(|l| l.starts_with("hami_events_total{"))
            .collect();
        r.check(f.is_empty() || d1 > d0, || {
            format!("agent round {round}: findings after a restart with only hooked processes within quota (no event dropped): {f:?}; events consumed: {events:?}")
        });
        if round + 1 == restarts {
            // Overflow the ring buffer: stop the consumer while unpaced processes churn.
            let mut fast = Vec::new();
            for i in 0..2 {
                fast.push(Worker::spawn(
                    &env,
                    load,
                    &["storm", "2", "4", &(300 + i).to_string()],
                )?);
            }
            for w in &fast {
                w.expect("ready", LINE_WAIT)?;
            }
            let all: Vec<u64> = mine
                .iter()
                .copied()
                .chain(fast.iter().map(|w| w.pid as u64))
                .collect();
            let before = ours(&agent, &all, env.region_path()).len();
            let m0 = agent.metrics()?;
            let d0 = crate::demo::metric(&m0, "hami_events_dropped_total", &[]).unwrap_or(0);
            agent_signal(agent.pid(), libc::SIGSTOP);
            std::thread::sleep(Duration::from_secs(3));
            agent_signal(agent.pid(), libc::SIGCONT);
            std::thread::sleep(Duration::from_secs(3));
            let m1 = agent.metrics()?;
            let d1 = crate::demo::metric(&m1, "hami_events_dropped_total", &[]).unwrap_or(0);
            agent.drain();
            let after = ours(&agent, &all, env.region_path());
            r.figure(
                "agent: events dropped while the agent was stopped 3 s",
                d1 - d0,
            );
            r.figure(
                "agent: FINDING: false findings raised after the overflow (hooked processes within quota)",
                after.len() - before,
            );
            for f in after.iter().skip(before).take(3) {
                println!("      {f}");
            }
            r.check(d1 > d0, || {
                "agent: stopping the consumer 3 s under load dropped no event (ring not overflowed, or drops not counted)".into()
            });
            workers.extend(fast);
        }
        let ids = bpf_prog_ids(agent.pid());
        agent.stop()?;
        let left = lingering(&ids);
        r.check(left.is_empty(), || {
            format!("agent round {round}: after the agent stopped, eBPF programs {left:?} are still loaded")
        });
    }
    r.figure("agent: SIGKILLs + restarts mid-workload", restarts);
    r.figure("agent: eBPF programs held by the agent", progs);
    r.figure(
        "agent: programs left loaded after SIGKILL (stale probes)",
        stale,
    );
    r.figure("agent: false findings after restart", false_findings);
    let (lost, _) = settle_and_check("agent faults", &env, workers, r)?;
    r.figure("agent: bytes lost or leaked (region)", lost);
    Ok(())
}

/// Findings raised about this scenario's processes or region (the machine may run others).
fn ours(agent: &crate::demo::Agent, pids: &[u64], region: &Path) -> Vec<String> {
    let region = region.display().to_string();
    agent
        .findings()
        .into_iter()
        .filter(|v| v["message"] != "finding cleared")
        .filter(|v| {
            v["pid"].as_u64().is_some_and(|p| pids.contains(&p))
                || v["region"].as_str().is_some_and(|r| r.contains(&region))
        })
        .map(crate::demo::describe)
        .collect()
}

fn agent_signal(pid: u32, sig: libc::c_int) {
    // SAFETY: kill(2) on the agent we started.
    unsafe { libc::kill(pid as libc::pid_t, sig) };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workload_lines_are_read_by_key() {
        let l = "held bytes=4194304 count=2 max_us=17 ops=9 refused=1 errors=0";
        assert_eq!(field(l, "bytes"), Some(4 << 20));
        assert_eq!(field(l, "errors"), Some(0));
        assert_eq!(field(l, "max_us"), Some(17));
        assert_eq!(field(l, "us"), None, "whole keys only");
        assert_eq!(field("tick win_us=x", "win_us"), None);
    }

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
