//! Benchmark of the agent's per-tick work at the size of a busy node, without root or
//! processes (the whole agent against real processes is `cargo xtask torture --only scale`):
//!
//! * `findings::region_usage` (the metrics' per-region, per-device figures) and
//!   `findings::evaluate` over R regions of 5 processes each, at R = 200 and R = 1000: ns per
//!   process, and how that grows with the fleet (about 1 when the work is linear);
//! * `discovery::scan_proc_maps_with` over a fake `/proc` of P processes that each map a
//!   driver and 40 other libraries: the first (full) scan, then the periodic scans that skip
//!   processes whose driver is known.
//!
//! Run with `cargo bench -p hami-user --bench scale`. Prints one `key=value` line per figure.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Instant;

use hami_abi::layout::{UsageKind, MAX_DEVICES, USAGE_KINDS};
use hami_common::region::{RegionSnapshot, SlotSnapshot};
use hami_user::findings::{self, ProcView, RegionView, SlotLiveness, Tolerance};
use hami_user::probes::discovery::{self, Classifier};

const PER_REGION: usize = 5;
const MIB: u64 = 1 << 20;

fn slot(index: usize, pid: u32) -> SlotSnapshot {
    let mut usage = [[0u64; USAGE_KINDS]; MAX_DEVICES];
    usage[0][UsageKind::Data.index()] = MIB;
    SlotSnapshot {
        index,
        pid,
        start_time: 100 + u64::from(pid),
        usage,
        charged: [0; MAX_DEVICES],
        reserve: [0; MAX_DEVICES],
    }
}

/// `regions` regions of [`PER_REGION`] hooked processes, each accounting and observed at
/// 1 MiB on device 0.
fn fleet(regions: usize) -> (Vec<ProcView>, Vec<RegionView>) {
    let mut procs = Vec::new();
    let mut views = Vec::new();
    for ri in 0..regions {
        let mut slots = Vec::new();
        let mut liveness = BTreeMap::new();
        for k in 0..PER_REGION {
            let pid = (ri * PER_REGION + k + 1000) as u32;
            slots.push(slot(k, pid));
            liveness.insert(k, SlotLiveness::Alive { host_pid: pid });
            procs.push(ProcView {
                pid,
                start_time: 100 + u64::from(pid),
                nspid: Some(pid),
                container: format!("c{ri}"),
                hooked: true,
                region: Some(ri),
                observed: [(Some(0), MIB)].into_iter().collect(),
                alloc_events: 1,
                peak_bytes: MIB,
                seen_by_events: true,
                ..Default::default()
            });
        }
        let mut limits = [0; MAX_DEVICES];
        limits[0] = 1 << 30;
        let mut used = [0; MAX_DEVICES];
        used[0] = PER_REGION as u64 * MIB;
        views.push(RegionView {
            name: format!("/tmp/region-{ri}.cache"),
            container: format!("c{ri}"),
            snapshot: RegionSnapshot {
                version: hami_abi::layout::VERSION,
                header_size: 0,
                total_size: 0,
                init_state: 2,
                device_count: 1,
                creator_pid: 1,
                created_unix: 0,
                boot_id: [0; 16],
                generation: 0,
                owner_died_recoveries: 0,
                reclaimed_slots: 0,
                limits,
                limit_flags: [0; MAX_DEVICES],
                uuids: [[0; 16]; MAX_DEVICES],
                used,
                stale_lock_breaks: 0,
                reserve_reclaims: 0,
                context_footprint: [0; MAX_DEVICES],
                slots,
                compute: Default::default(),
                arbiter: Default::default(),
                consistent: true,
            },
            liveness,
            single_device: true,
            node_devices: None,
            file: None,
            nvml: None,
            compute: Vec::new(),
        });
    }
    (procs, views)
}

/// Median seconds of `f` over `runs` runs.
fn median_secs(runs: usize, mut f: impl FnMut()) -> f64 {
    let mut v: Vec<f64> = (0..runs)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .collect();
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn findings_figures() {
    let mut per_proc = Vec::new();
    for regions in [200usize, 1000] {
        let (procs, views) = fleet(regions);
        let n = procs.len() as f64;
        let usage = median_secs(5, || {
            let u = findings::region_usage(&procs, &views);
            assert_eq!(u.len(), regions);
        });
        let eval = median_secs(5, || {
            let f = findings::evaluate(&procs, &views, Tolerance::default());
            assert!(f.is_empty(), "a clean fleet has no finding: {f:?}");
        });
        println!(
            "regions={regions} processes={} region_usage_ms={:.2} region_usage_ns_per_process={:.0} evaluate_ms={:.2} evaluate_ns_per_process={:.0}",
            procs.len(),
            usage * 1e3,
            usage * 1e9 / n,
            eval * 1e3,
            eval * 1e9 / n
        );
        per_proc.push((usage / n, eval / n));
    }
    println!(
        "growth_200_to_1000_regions region_usage_per_process={:.2} evaluate_per_process={:.2}",
        per_proc[1].0 / per_proc[0].0,
        per_proc[1].1 / per_proc[0].1
    );
}

/// A fake `/proc/<pid>` mapping a driver and 40 other libraries.
fn fake_process(root: &Path, pid: u32) {
    let dir = root.join(pid.to_string());
    std::fs::create_dir_all(dir.join("root/lib")).expect("mkdir");
    // All 52 fields, as the kernel writes them (procfs's parser wants them); the start time
    // (field 22) is 12345.
    let mut stat = format!("{pid} (p) S");
    for i in 4..=52 {
        stat.push_str(&format!(" {}", if i == 22 { 12345 } else { i }));
    }
    stat.push('\n');
    std::fs::write(dir.join("stat"), stat).expect("stat");
    let mut maps = String::new();
    for l in 0..40u64 {
        maps.push_str(&format!(
            "7f{l:010x}000-7f{l:010x}fff r-xp 00000000 08:01 {} /lib/libother{l}.so\n",
            10 + l
        ));
    }
    maps.push_str("7f0000000000-7f0000001000 r-xp 00000000 08:01 1 /lib/libcuda.so.1\n");
    std::fs::write(dir.join("maps"), maps).expect("maps");
    std::fs::write(dir.join("root/lib/libcuda.so.1"), b"").expect("lib");
}

fn discovery_figures() {
    let t = tempfile::tempdir().expect("temp dir");
    let procs = 5000u32;
    for pid in 1..=procs {
        fake_process(t.path(), pid);
    }
    let mut c = Classifier::default();
    let t0 = Instant::now();
    let found = discovery::scan_proc_maps_with(t.path(), &mut c);
    let full = t0.elapsed().as_secs_f64();
    assert_eq!(found.len(), 1, "one driver file");
    let periodic = median_secs(5, || {
        discovery::scan_proc_maps_with(t.path(), &mut c);
    });
    println!(
        "discovery_fake_proc processes={procs} full_scan_ms={:.1} periodic_scan_ms={:.1} (full scans every {})",
        full * 1e3,
        periodic * 1e3,
        discovery::FULL_SCAN_EVERY
    );
}

fn main() {
    findings_figures();
    discovery_figures();
}
