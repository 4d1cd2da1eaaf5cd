//! Benchmark (not a test): added cost of the preload.
//!
//! * ns per `cuMemAlloc_v2` + `cuMemFree_v2` pair against the fake driver, with and without
//!   the preload (cudaprobe `bench-pair`), for 1, 8 and 64 processes contending on one region;
//! * cost of registering a process when 1000 slots are live.
//!
//! Run: `cargo bench -p hami-preload` (builds the fake driver and cudaprobe itself).

use hami_common::region::{ProcessId, Region, RegionConfig};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent().and_then(Path::parent).unwrap().to_path_buf()
}

fn build() -> (PathBuf, PathBuf, PathBuf) {
    let prof = profile_dir();
    let target = prof.parent().unwrap();
    let release = prof.file_name().is_some_and(|n| n == "release");
    let mut c = Command::new(env!("CARGO"));
    c.args([
        "build",
        "-p",
        "hami-preload",
        "-p",
        "fake-cuda",
        "-p",
        "fake-nvml",
    ])
    .env("CARGO_TARGET_DIR", target)
    .current_dir(env!("CARGO_MANIFEST_DIR"));
    if release {
        c.arg("--release");
    }
    assert!(c.status().unwrap().success());
    let libdir = prof.join("bench-libs");
    std::fs::create_dir_all(&libdir).unwrap();
    for (from, to) in [
        ("libcuda.so", "libcuda.so.1"),
        ("libnvidia_ml.so", "libnvidia-ml.so.1"),
    ] {
        let _ = std::fs::remove_file(libdir.join(to));
        std::fs::copy(prof.join(from), libdir.join(to)).unwrap();
    }
    let _ = std::fs::remove_file(libdir.join("libcuda.so"));
    std::os::unix::fs::symlink("libcuda.so.1", libdir.join("libcuda.so")).unwrap();
    let probe = prof.join("bench-cudaprobe");
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../testing/programs/cudaprobe.c");
    assert!(Command::new("cc")
        .args(["-O2", "-o"])
        .arg(&probe)
        .arg(&src)
        .arg("-L")
        .arg(&libdir)
        .args(["-lcuda", "-ldl", "-lpthread"])
        .status()
        .unwrap()
        .success());
    (prof.join("libhami_preload.so"), libdir, probe)
}

/// Runs `procs` cudaprobes doing `n` pairs each; returns the mean ns per pair.
fn pairs(
    preload: Option<&Path>,
    libdir: &Path,
    probe: &Path,
    dir: &Path,
    procs: usize,
    n: u64,
) -> f64 {
    let kids: Vec<_> = (0..procs)
        .map(|_| {
            let mut c = Command::new(probe);
            c.args(["init", "ctx", "bench-pair", &n.to_string(), "1M"])
                .env("LD_LIBRARY_PATH", libdir)
                .env("FAKE_CUDA_STATE", dir.join("fake.state"))
                .env("FAKE_CUDA_TOTAL_MEM", "1T")
                .env("CUDA_DEVICE_MEMORY_LIMIT", "512G")
                .env("HAMI_CONTEXT_OVERHEAD", "0")
                .env("CUDA_DEVICE_MEMORY_SHARED_CACHE", dir.join("region"))
                .stdout(Stdio::piped());
            if let Some(p) = preload {
                c.env("LD_PRELOAD", p);
            }
            c.spawn().unwrap()
        })
        .collect();
    let mut ns = Vec::new();
    for k in kids {
        let out = k.wait_with_output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let line = text
            .lines()
            .find(|l| l.contains("op=bench-pair"))
            .unwrap_or("");
        let v = line
            .split_whitespace()
            .find_map(|f| f.strip_prefix("ns_per_pair="))
            .unwrap_or_else(|| panic!("no figure in {text:?}"))
            .parse::<f64>()
            .unwrap();
        assert!(line.contains("failures=0"), "{text}");
        ns.push(v);
    }
    ns.iter().sum::<f64>() / ns.len() as f64
}

fn main() {
    // `cargo bench` passes `--bench`; ignore arguments.
    let (preload, libdir, probe) = build();
    let dir = std::env::temp_dir().join(format!("hami-preload-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    println!("ns per cuMemAlloc_v2+cuMemFree_v2 pair (fake driver), mean over processes:");
    println!(
        "{:>6} {:>14} {:>14} {:>12}",
        "procs", "without", "with preload", "added"
    );
    for procs in [1usize, 8, 64] {
        let n = if procs == 64 { 20_000 } else { 200_000 };
        let without = pairs(None, &libdir, &probe, &dir, procs, n);
        let with = pairs(Some(&preload), &libdir, &probe, &dir, procs, n);
        println!(
            "{procs:>6} {without:>14.1} {with:>14.1} {:>12.1}",
            with - without
        );
    }

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
