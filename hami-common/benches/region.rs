//! Shared-region micro-benchmarks (a benchmark, not a test): prints figures.
//!
//! `cargo bench -p hami-common --bench region`
//!
//! * charge+uncharge pair, one thread;
//! * the same pair with 1, 8 and 64 processes contending on one region, with the lock on
//!   every admission (no reserve: the baseline) and with admission reserves, in the same run:
//!   wall-clock ns per pair as seen by each process, and CPU ns per pair over all processes
//!   (what a pair costs, not counting time spent descheduled with more processes than CPUs);
//! * registering (and unregistering) a process when 1000 slots are live;
//! * the liveness probe (`/proc/<pid>/stat`), which reclaim pays per active slot.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hami_abi::layout::{UsageKind, MAX_DEVICES};
use hami_common::region::{
    Liveness, LivenessProbe, ProcProbe, ProcessId, Region, RegionConfig, Tuning,
};

struct AllAlive;
impl LivenessProbe for AllAlive {
    fn liveness(&self, _who: ProcessId) -> Liveness {
        Liveness::Alive
    }
}

fn region_path(name: &str) -> PathBuf {
    let p = std::env::temp_dir().join(format!("hami-bench-{}-{name}", std::process::id()));
    let _ = std::fs::remove_file(&p);
    p
}

fn open(path: &Path) -> Region {
    let cfg = RegionConfig {
        limits: [1 << 40; MAX_DEVICES],
        device_count: 1,
        ..RegionConfig::default()
    };
    Region::open_or_create(path, &cfg).expect("open region").0
}

/// This thread's CPU time (user + system), in ns.
fn cpu_ns() -> u64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) };
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

/// Charge+uncharge pairs in one process over `dur`: (pairs, wall ns per pair, CPU ns spent).
fn pairs(r: &Region, dur: Duration) -> (u64, f64, u64) {
    let s = r.register(ProcessId::current()).expect("register");
    let cpu0 = cpu_ns();
    let start = Instant::now();
    let mut n = 0u64;
    while start.elapsed() < dur {
        for _ in 0..1000 {
            if r.try_charge(s, 0, UsageKind::Data, 4096).is_ok() {
                r.uncharge(s, 0, UsageKind::Data, 4096);
            }
        }
        n += 1000;
    }
    let ns = start.elapsed().as_nanos() as f64 / n as f64;
    let cpu = cpu_ns() - cpu0;
    r.unregister(s);
    (n, ns, cpu)
}

fn contended(procs: usize, tuning: Tuning, what: &str) {
    let path = region_path(&format!("contend{procs}"));
    let r = open(&path).with_tuning(tuning);
    let dur = Duration::from_millis(1000);
    let mut fds = Vec::new();
    let mut kids = Vec::new();
    for _ in 0..procs {
        let mut p = [0; 2];
        // SAFETY: valid out array.
        assert_eq!(unsafe { libc::pipe(p.as_mut_ptr()) }, 0);
        // SAFETY: the child only runs region operations and _exits.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            let (n, ns, cpu) = pairs(&r, dur);
            let buf = [
                n.to_le_bytes(),
                ns.to_bits().to_le_bytes(),
                cpu.to_le_bytes(),
            ]
            .concat();
            // SAFETY: writes a live buffer to our pipe, then exits.
            unsafe {
                libc::write(p[1], buf.as_ptr().cast(), buf.len());
                libc::_exit(0);
            }
        }
        // SAFETY: closes the parent's write end.
        unsafe { libc::close(p[1]) };
        fds.push(p[0]);
        kids.push(pid);
    }
    let mut total = 0u64;
    let mut cpu = 0u64;
    let mut per = Vec::new();
    for fd in fds {
        let mut buf = [0u8; 24];
        // SAFETY: reads into a live buffer.
        let got = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), 24) };
        assert_eq!(got, 24);
        total += u64::from_le_bytes(buf[..8].try_into().unwrap());
        per.push(f64::from_bits(u64::from_le_bytes(
            buf[8..16].try_into().unwrap(),
        )));
        cpu += u64::from_le_bytes(buf[16..].try_into().unwrap());
        // SAFETY: our fd.
        unsafe { libc::close(fd) };
    }
    for k in kids {
        let mut st = 0;
        // SAFETY: reaps our child.
        unsafe { libc::waitpid(k, &mut st, 0) };
    }
    let mean = per.iter().sum::<f64>() / per.len() as f64;
    println!(
        "contended, {procs:>2} processes{what}: {:>8.1} ns per pair seen by each process, {:>6.1} M pairs/s in total, {:>6.1} CPU ns per pair, region used after: {}",
        mean,
        total as f64 / dur.as_secs_f64() / 1e6,
        cpu as f64 / total as f64,
        r.admitted(0)
    );
    let _ = std::fs::remove_file(&path);
}

/// The preload's default tuning: a 64 MiB admission reserve.
fn reserves() -> Tuning {
    Tuning {
        reserve: 64 << 20,
        ..Tuning::default()
    }
}

fn main() {
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    println!("shared-region benchmark ({cores} cores)");

    let path = region_path("single");
    let r = open(&path);
    let (_, ns, _) = pairs(&r, Duration::from_millis(1000));
    println!("try_charge+uncharge pair, 1 thread:        {ns:>8.1} ns");
    let r = r.with_tuning(reserves());
    let (_, ns, _) = pairs(&r, Duration::from_millis(1000));
    println!("same, with admission reserves:              {ns:>8.1} ns");
    drop(r);
    let _ = std::fs::remove_file(&path);

    // The lock on every admission first (the baseline, as before reserves), then reserves.
    for procs in [1, 8, 64] {
        contended(procs, Tuning::default(), "");
    }
    for procs in [1, 8, 64] {
        contended(procs, reserves(), " with reserves");
    }

    // Registration with 1000 live slots (liveness probe injected: all alive).
    let path = region_path("register");
    let r = open(&path).with_probe(Arc::new(AllAlive));
    for i in 0..1000u32 {
        let s = r
            .register(ProcessId {
                pid: 1_000_000 + i,
                start_time: 1,
            })
            .expect("register");
        r.force_charge(s, 0, UsageKind::Data, 4096);
    }
    let iters = 2000u32;
    let start = Instant::now();
    for i in 0..iters {
        let s = r
            .register(ProcessId {
                pid: 2_000_000 + i,
                start_time: 1,
            })
            .expect("register");
        r.unregister(s);
    }
    let us = start.elapsed().as_secs_f64() * 1e6 / iters as f64;
    println!("register+unregister with 1000 live slots:  {us:>8.2} us");

    // What reclaim pays per active slot: one /proc/<pid>/stat read.
    let me = ProcessId::current();
    let n = 20_000;
    let start = Instant::now();
    for _ in 0..n {
        assert_eq!(ProcProbe.liveness(me), Liveness::Alive);
    }
    let us = start.elapsed().as_secs_f64() * 1e6 / n as f64;
    println!(
        "liveness probe (/proc/<pid>/stat):          {us:>8.2} us per slot (reclaim_dead over 1000 live slots ~ {:.1} ms)",
        us
    );
    let start = Instant::now();
    let freed = r.reclaim_dead_with(&ProcProbe);
    println!(
        "reclaim_dead over 1000 slots of absent pids: {:>8.2} ms ({} freed)",
        start.elapsed().as_secs_f64() * 1e3,
        freed.len()
    );
    drop(r);
    let _ = std::fs::remove_file(&path);
}
