//! Benchmark (not a test): added cost of the preload.
//!
//! * `cuMemAlloc_v2` + `cuMemFree_v2` pairs against the fake driver, with and without the
//!   preload in the same run, for 1, 8 and 64 processes contending on one region. The
//!   processes (cudaprobe `bench-for`) are started, wait at a barrier until every one is
//!   initialised, then all loop for the same fixed time, so they really overlap. Reported:
//!   CPU time (user + sys) per pair over all processes, which does not count time spent
//!   descheduled when there are more processes than CPUs, and pairs per second of all
//!   processes together. Rounds (a run without, then one with the preload) repeat; medians
//!   are shown, `added` being the median of each round's difference. A run during which
//!   uprobes sat on the fake driver's functions (an eBPF agent of another test on a shared
//!   machine: microseconds per call) is run again (up to 10 times); a round still left with
//!   such a run is discarded.
//!   `HAMI_BENCH_SECONDS` (default 0.5) and `HAMI_BENCH_ROUNDS` (default 5) tune it.
//!   The same rounds also run the preload with `HAMI_ADMISSION_RESERVE=0` (every admission
//!   and release takes the region lock, as before admission reserves): a second table, the
//!   baseline for the reserves measured in the same run.
//!   `HAMI_BENCH_BASELINE=<path of another libhami_preload.so>` (e.g. a build of the previous
//!   commit) adds a run with that library to every round and a third table: a change to the
//!   preload compared with its baseline under the same conditions (the host may be shared).
//! * the launch hook: CPU ns per `cuLaunchKernel` of a kernel taking 0 ns on the fake driver
//!   (cudaprobe `launch-cost`), without the preload, with it and no compute share, and with
//!   `CUDA_DEVICE_SM_LIMIT=50` (the gate: capture check, two timing events, queries), rounds
//!   alternating (and `HAMI_BENCH_BASELINE` too, no share); medians. CPU time leaves out
//!   the gate's sleeps. `HAMI_BENCH_ONLY=launch` runs this part alone,
//!   `HAMI_BENCH_LAUNCHES` (default 100000) sets the launches per run.
//! * cost of registering a process when 1000 slots are live.
//! * an empty-kernel launch (`cuLaunchKernel`, cudaprobe `bench-launch`), native vs preloaded,
//!   runs alternating, medians of the rounds: the launch hook's cost (the local-memory check of
//!   `objects/lmem.rs`, the module table's first-launch check). Also for a kernel with 24 KiB of local
//!   memory per thread (after its one growth: the path that reads the current context).
//!   `HAMI_BENCH_ONLY=launch` runs only these; `HAMI_BENCH_LAUNCHES` (default 200000) sets
//!   the launches per run.
//!
//! Run: `cargo bench -p hami-preload` (the test harness builds the fake driver, the preload
//! and cudaprobe).

use hami_common::region::{ProcessId, Region, RegionConfig};
use hami_test_harness::Artifacts;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

/// The preload, the fake driver's directory and cudaprobe, built by the test harness.
fn build() -> (PathBuf, PathBuf, PathBuf) {
    let a = Artifacts::get();
    (
        a.preload_so.clone(),
        a.fake_lib_dir.clone(),
        a.cudaprobe.clone(),
    )
}

/// One run of `procs` cudaprobes started together, each doing pairs for `secs` seconds.
#[derive(Clone, Copy, Debug)]
struct Run {
    /// Pairs done by all processes.
    pairs: f64,
    /// CPU time (user + sys) of all processes over their loops, ns.
    cpu_ns: f64,
    /// From the first process's start to the last one's end, ns.
    wall_ns: f64,
    /// Time all processes were running their loops at once, ns.
    overlap_ns: f64,
}

impl Run {
    fn cpu_per_pair(&self) -> f64 {
        self.cpu_ns / self.pairs
    }
    fn mpairs_per_s(&self) -> f64 {
        self.pairs / self.wall_ns * 1e3
    }
}

/// `CLOCK_MONOTONIC` in ns (the clock cudaprobe reports on).
fn monotonic_ns() -> u64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid out pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut t) };
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

/// Starts `procs` cudaprobes (`bench-for`), waits until each is initialised and registered
/// (its `state=ready` line), releases them all at once with a common deadline through the
/// one pipe that is every process's stdin, and sums what they report.
fn run(
    preload: Option<&Path>,
    libdir: &Path,
    probe: &Path,
    dir: &Path,
    procs: usize,
    secs: f64,
    extra_env: &[(&str, &str)],
) -> Run {
    let (gate_r, gate_w) = std::io::pipe().unwrap();
    let mut kids: Vec<_> = (0..procs)
        .map(|_| {
            let mut c = Command::new(probe);
            c.args(["init", "ctx", "bench-for", &secs.to_string(), "1M"])
                .env("LD_LIBRARY_PATH", libdir)
                .env("FAKE_CUDA_STATE", dir.join("fake.state"))
                .env("FAKE_CUDA_TOTAL_MEM", "1T")
                .env("CUDA_DEVICE_MEMORY_LIMIT", "512G")
                .env("HAMI_CONTEXT_OVERHEAD", "0")
                .env("CUDA_DEVICE_MEMORY_SHARED_CACHE", region_for(dir, preload))
                .env_remove("LD_PRELOAD")
                .stdin(gate_r.try_clone().unwrap())
                .stdout(Stdio::piped());
            if let Some(p) = preload {
                c.env("LD_PRELOAD", p);
            }
            c.envs(extra_env.iter().copied());
            c.spawn().unwrap()
        })
        .collect();
    drop(gate_r);
    let mut outs: Vec<_> = kids
        .iter_mut()
        .map(|k| BufReader::new(k.stdout.take().unwrap()))
        .collect();
    let mut seen: Vec<String> = vec![String::new(); procs];
    for (o, text) in outs.iter_mut().zip(&mut seen) {
        loop {
            let mut line = String::new();
            let n = o.read_line(&mut line).unwrap();
            assert!(n > 0, "cudaprobe ended before the barrier:\n{text}");
            text.push_str(&line);
            if line.contains("op=bench-for state=ready") {
                break;
            }
        }
    }
    // One 24-byte record per process, the common deadline, in one write (atomic: less than
    // PIPE_BUF): every process takes one record and they all start now and stop together.
    let deadline = format!("{:<23}\n", monotonic_ns() + (secs * 1e9) as u64);
    let mut gate_w = gate_w;
    gate_w.write_all(deadline.repeat(procs).as_bytes()).unwrap();
    drop(gate_w);
    let mut total = Run {
        pairs: 0.0,
        cpu_ns: 0.0,
        wall_ns: 0.0,
        overlap_ns: 0.0,
    };
    let (mut first_start, mut last_start) = (f64::MAX, f64::MIN);
    let (mut first_end, mut last_end) = (f64::MAX, f64::MIN);
    for ((k, mut o), mut text) in kids.into_iter().zip(outs).zip(seen) {
        o.read_to_string(&mut text).unwrap();
        assert!(k.wait_with_output().unwrap().status.success(), "{text}");
        let line = text
            .lines()
            .find(|l| l.contains("op=bench-for") && l.contains("pairs="))
            .unwrap_or_else(|| panic!("no figure in {text:?}"));
        assert!(line.contains("failures=0"), "{text}");
        let field = |key: &str| -> f64 {
            line.split_whitespace()
                .find_map(|f| f.strip_prefix(key))
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("no {key} in {line:?}"))
        };
        let (start, end) = (field("start_ns="), field("end_ns="));
        total.pairs += field("pairs=");
        total.cpu_ns += field("cpu_ns=");
        first_start = first_start.min(start);
        last_start = last_start.max(start);
        first_end = first_end.min(end);
        last_end = last_end.max(end);
    }
    total.wall_ns = last_end - first_start;
    total.overlap_ns = (first_end - last_start).max(0.0);
    total
}

/// ns per `cuLaunchKernel` of one cudaprobe doing `n` launches of a kernel with `local`
/// bytes of local memory per thread (fake driver), with or without the preload.
fn launch_ns(
    preload: Option<&Path>,
    libdir: &Path,
    probe: &Path,
    dir: &Path,
    n: u64,
    local: &str,
) -> f64 {
    let mut c = Command::new(probe);
    let local = format!("local={local}");
    c.args([
        "init",
        "ctx",
        "modload",
        "0",
        &local,
        "getfunc",
        "launch",
        "bench-launch",
    ])
    .arg(n.to_string())
    .env("LD_LIBRARY_PATH", libdir)
    .env("FAKE_CUDA_STATE", dir.join("fake.state"))
    .env("FAKE_CUDA_TOTAL_MEM", "1T")
    .env("CUDA_DEVICE_MEMORY_LIMIT", "512G")
    .env("HAMI_CONTEXT_OVERHEAD", "0")
    .env("CUDA_DEVICE_MEMORY_SHARED_CACHE", region_for(dir, preload))
    .env_remove("LD_PRELOAD")
    .stdin(Stdio::null());
    if let Some(p) = preload {
        c.env("LD_PRELOAD", p);
    }
    let out = c.output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    let line = text
        .lines()
        .find(|l| l.starts_with("op=bench-launch"))
        .unwrap_or_else(|| panic!("no bench-launch line in {text:?}"));
    assert!(line.contains("failures=0"), "{text}");
    line.split_whitespace()
        .find_map(|f| f.strip_prefix("ns_per_launch="))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no ns_per_launch in {line:?}"))
}

/// Rounds thrown away (uprobes seen) before the remaining ones are kept regardless.
const MAX_DISCARDED: usize = 10;

/// Times one run is repeated while uprobes are seen around it.
const MAX_RETRIES: usize = 10;

/// Watches the first byte of the fake driver's `cuMemAlloc_v2` and `cuMemFree_v2` as mapped
/// into this process: an eBPF agent attaching uprobes to that library (another test on a
/// shared machine; agents find libcuda in every process's maps) writes `int3` (0xCC) there in
/// every process mapping the file, and each trap costs microseconds per call.
struct UprobeWatch {
    fns: Vec<*const u8>,
}

impl UprobeWatch {
    fn new(libcuda: &Path) -> UprobeWatch {
        let path = std::ffi::CString::new(libcuda.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: valid C string. The fake driver does nothing until cuInit.
        let h = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_LAZY | libc::RTLD_LOCAL) };
        let fns = [c"cuMemAlloc_v2", c"cuMemFree_v2"]
            .iter()
            .filter(|_| !h.is_null())
            // SAFETY: valid handle and C string.
            .map(|n| unsafe { libc::dlsym(h, n.as_ptr()) } as *const u8)
            .filter(|p| !p.is_null())
            .collect();
        UprobeWatch { fns }
    }

    fn seen(&self) -> bool {
        // SAFETY: the addresses of functions of a library that stays loaded.
        self.fns
            .iter()
            .any(|&p| unsafe { p.read_volatile() } == 0xCC)
    }
}

fn median(v: impl Iterator<Item = f64>) -> f64 {
    let mut v: Vec<f64> = v.collect();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    // `cargo bench` passes `--bench`; ignore arguments.
    let (preload, libdir, probe) = build();
    let dir = std::env::temp_dir().join(format!("hami-preload-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let secs: f64 = env_or("HAMI_BENCH_SECONDS", 0.5);
    let rounds: usize = env_or("HAMI_BENCH_ROUNDS", 5).max(1);
    if std::env::var("HAMI_BENCH_ONLY").is_ok_and(|v| v == "launch") {
        bench_launches(&preload, &libdir, &probe, &dir, rounds);
        let _ = std::fs::remove_dir_all(&dir);
        return;
    }
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!(
        "cuMemAlloc_v2+cuMemFree_v2 pair (fake driver, 1 MiB), {cpus} CPUs: N processes on one region \
         released together by a barrier and stopped at a common deadline {secs} s later; rounds \
         without and with the preload alternate; median of {rounds} rounds (added: median of the \
         rounds' differences)."
    );
    println!(
        "cpu = CPU ns (user+sys) per pair over all processes (flat = the added column does not \
         grow with N); Mpairs/s = pairs of all processes / wall time of the run."
    );
    println!(
        "{:>6} {:>12} {:>12} {:>12} {:>15} {:>15}",
        "procs", "cpu_without", "cpu_with", "added", "Mpairs/s_without", "Mpairs/s_with"
    );
    let baseline: Option<PathBuf> = std::env::var_os("HAMI_BENCH_BASELINE").map(PathBuf::from);
    if let Some(b) = &baseline {
        assert!(
            b.is_file(),
            "HAMI_BENCH_BASELINE={}: no such file",
            b.display()
        );
    }
    if std::env::var("HAMI_BENCH_ONLY").as_deref() == Ok("launch") {
        launch_costs(&preload, baseline.as_deref(), &libdir, &probe, &dir, rounds);
        let _ = std::fs::remove_dir_all(&dir);
        return;
    }
    let probes = UprobeWatch::new(&libdir.join("libcuda.so.1"));
    let mut locked_rows = Vec::new();
    let mut baseline_rows = Vec::new();
    for procs in [1usize, 8, 64] {
        let (mut without, mut with, mut locked) = (Vec::new(), Vec::new(), Vec::new());
        let mut based = Vec::new();
        let mut discarded = 0;
        // One run, repeated while uprobes are seen before or after it; `dirty` when it
        // never ran clean.
        let dirty = std::cell::Cell::new(false);
        let repeated = std::cell::Cell::new(0usize);
        let clean_run = |preload: Option<&Path>, env: &[(&str, &str)]| {
            let mut tries = 0;
            loop {
                let before = probes.seen();
                let r = run(preload, &libdir, &probe, &dir, procs, secs, env);
                tries += 1;
                if !before && !probes.seen() {
                    return r;
                }
                if tries > MAX_RETRIES {
                    dirty.set(true);
                    return r;
                }
                repeated.set(repeated.get() + 1);
            }
        };
        while without.len() < rounds {
            let a = clean_run(None, &[]);
            let b = clean_run(Some(&preload), &[]);
            let c = clean_run(Some(&preload), &[("HAMI_ADMISSION_RESERVE", "0")]);
            let d = baseline.as_deref().map(|b| clean_run(Some(b), &[]));
            if dirty.take() {
                discarded += 1;
                if discarded <= MAX_DISCARDED {
                    continue;
                }
            }
            without.push(a);
            with.push(b);
            locked.push(c);
            based.extend(d);
        }
        let overlaps: Vec<String> = without
            .iter()
            .chain(&with)
            .map(|r| format!("{:.0}%", r.overlap_ns / r.wall_ns * 100.0))
            .collect();
        let row = |with: &[Run]| {
            let cpu_without = median(without.iter().map(Run::cpu_per_pair));
            let cpu_with = median(with.iter().map(Run::cpu_per_pair));
            let added: Vec<f64> = without
                .iter()
                .zip(with)
                .map(|(a, b)| b.cpu_per_pair() - a.cpu_per_pair())
                .collect();
            let mps_without = median(without.iter().map(Run::mpairs_per_s));
            let mps_with = median(with.iter().map(Run::mpairs_per_s));
            (
                format!(
                    "{procs:>6} {cpu_without:>12.1} {cpu_with:>12.1} {:>12.1} {mps_without:>15.2} {mps_with:>15.2}",
                    median(added.iter().copied())
                ),
                added,
            )
        };
        let (line, added) = row(&with);
        println!("{line}");
        locked_rows.push(row(&locked).0);
        if baseline.is_some() {
            baseline_rows.push(row(&based).0);
        }
        let spread: Vec<String> = added.iter().map(|a| format!("{a:.0}")).collect();
        println!("       (added per round: {})", spread.join(" "));
        println!(
            "       (all processes running at once, share of each run's wall time: {})",
            overlaps.join(" ")
        );
        if repeated.get() > 0 {
            println!(
                "       ({} run(s) repeated: uprobes on the driver's functions)",
                repeated.get()
            );
        }
        if discarded > 0 {
            println!(
                "       ({discarded} round(s) with uprobes on the driver's functions discarded{})",
                if discarded > MAX_DISCARDED {
                    "; the rest kept anyway: figures include uprobe traps"
                } else {
                    ""
                }
            );
        }
    }
    println!(
        "baseline of the same rounds: the preload with HAMI_ADMISSION_RESERVE=0 (the lock on \
         every admission and release)"
    );
    for l in locked_rows {
        println!("locked {l}");
    }
    if let Some(b) = &baseline {
        println!(
            "baseline of the same rounds: HAMI_BENCH_BASELINE={} (default settings)",
            b.display()
        );
        for l in baseline_rows {
            println!("baseline {l}");
        }
    }

    bench_launches(&preload, &libdir, &probe, &dir, rounds);
    launch_costs(&preload, baseline.as_deref(), &libdir, &probe, &dir, rounds);

    // Registration with 1000 live slots.
    let path = dir.join("reg-region");
    let (r, _) = Region::open_or_create(&path, &RegionConfig::default()).unwrap();
    let me = ProcessId::current();
    for i in 0..1000u32 {
        r.register(ProcessId {
            pid: 4_000_000 + i,
            start_time: me.start_time,
        })
        .unwrap();
    }
    let rounds = 2000;
    let t0 = Instant::now();
    for i in 0..rounds {
        let s = r
            .register(ProcessId {
                pid: 5_000_000 + i,
                start_time: 1,
            })
            .unwrap();
        r.unregister(s);
    }
    let per = t0.elapsed().as_nanos() as f64 / rounds as f64;
    println!(
        "register+unregister with 1000 live slots: {:.1} us",
        per / 1000.0
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Launches: native vs preloaded, alternating, `HAMI_BENCH_LAUNCHES` per run (default
/// 200000): an empty kernel and one with 24 KiB of local memory per thread.
fn bench_launches(preload: &Path, libdir: &Path, probe: &Path, dir: &Path, rounds: usize) {
    let launches: u64 = env_or("HAMI_BENCH_LAUNCHES", 200_000);
    for (label, local) in [
        ("empty kernel", "0"),
        ("kernel with 24 KiB local memory", "24K"),
    ] {
        let (mut native, mut hooked, mut added) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..rounds {
            let a = launch_ns(None, libdir, probe, dir, launches, local);
            let b = launch_ns(Some(preload), libdir, probe, dir, launches, local);
            native.push(a);
            hooked.push(b);
            added.push(b - a);
        }
        println!(
            "launch ({label}, fake driver, {launches} cuLaunchKernel): native {:.1} ns, preloaded {:.1} ns, added {:+.1} ns per launch (median of {rounds} rounds)",
            median(native.into_iter()),
            median(hooked.into_iter()),
            median(added.into_iter()),
        );
    }
}

/// CPU ns per launch of one `cudaprobe launch-cost` run.
fn launch_cost(
    preload: Option<&Path>,
    libdir: &Path,
    probe: &Path,
    dir: &Path,
    n: u64,
    extra_env: &[(&str, &str)],
) -> f64 {
    let mut c = Command::new(probe);
    c.args(["init", "ctx", "launch-cost", &n.to_string()])
        .env("LD_LIBRARY_PATH", libdir)
        .env("FAKE_CUDA_STATE", dir.join("fake-launch.state"))
        .env("HAMI_CONTEXT_OVERHEAD", "0")
        .env("CUDA_DEVICE_MEMORY_SHARED_CACHE", dir.join("launch-region"))
        .env_remove("LD_PRELOAD")
        .env_remove("CUDA_DEVICE_SM_LIMIT")
        .envs(extra_env.iter().copied());
    if let Some(p) = preload {
        c.env("LD_PRELOAD", p);
    }
    // A fresh region each run: the share of the previous run's creator must not stay.
    let _ = std::fs::remove_file(dir.join("launch-region"));
    let out = c.output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    let line = text
        .lines()
        .find(|l| l.contains("op=launch-cost") && l.contains("rc=0"))
        .unwrap_or_else(|| panic!("no figure in {text:?}"));
    line.split_whitespace()
        .find_map(|f| f.strip_prefix("cpu_ns_per_launch="))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no cpu_ns_per_launch in {line:?}"))
}

/// The launch hook's cost: native, the preload without a share, with a share (the gate).
fn launch_costs(
    preload: &Path,
    baseline: Option<&Path>,
    libdir: &Path,
    probe: &Path,
    dir: &Path,
    rounds: usize,
) {
    let n: u64 = env_or("HAMI_BENCH_LAUNCHES", 100_000);
    let limit = [("CUDA_DEVICE_SM_LIMIT", "50")];
    let (mut native, mut nolimit, mut gated, mut based) = (vec![], vec![], vec![], vec![]);
    for _ in 0..rounds {
        native.push(launch_cost(None, libdir, probe, dir, n, &[]));
        nolimit.push(launch_cost(Some(preload), libdir, probe, dir, n, &[]));
        gated.push(launch_cost(Some(preload), libdir, probe, dir, n, &limit));
        if let Some(b) = baseline {
            based.push(launch_cost(Some(b), libdir, probe, dir, n, &[]));
        }
    }
    let m = |v: &[f64]| median(v.iter().copied());
    let added = |v: &[f64]| median(v.iter().zip(&native).map(|(a, b)| a - b));
    println!(
        "launch hook: cuLaunchKernel of a 0 ns kernel (fake driver), {n} launches, CPU ns per \
         launch, median of {rounds} rounds (added: median of the rounds' differences)"
    );
    println!("launch hook, native: {:.1} ns/launch", m(&native));
    println!(
        "launch hook, no share: {:.1} ns/launch, added {:.1}",
        m(&nolimit),
        added(&nolimit)
    );
    println!(
        "launch hook, 50 % share: {:.1} ns/launch, added {:.1}",
        m(&gated),
        added(&gated)
    );
    if baseline.is_some() {
        println!(
            "launch hook, baseline, no share: {:.1} ns/launch, added {:.1}",
            m(&based),
            added(&based)
        );
    }
}

/// The region file of the runs of `preload`: one per build, so that a baseline built with
/// another layout version (`HAMI_BENCH_BASELINE`) never opens this build's region (it would
/// refuse it and fail closed).
fn region_for(dir: &Path, preload: Option<&Path>) -> PathBuf {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    preload.hash(&mut h);
    dir.join(format!("region-{:016x}", h.finish()))
}
