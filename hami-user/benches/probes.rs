//! Benchmark of the eBPF probes on the workspace's fake driver (root needed):
//!
//! * added cost per `cuMemAlloc_v2` + `cuMemFree_v2` pair with the probes attached, against
//!   the same run without them (`cudaprobe bench-pair`);
//! * events per second taken from the ring buffer with zero drops (several `cudaprobe`s in
//!   parallel, one per CPU), and the counters that prove nothing was dropped;
//! * resident memory of this process with the probes loaded and streaming.
//!
//! Run with `cargo bench -p hami-user --bench probes` (`-- N` sets the pairs per process).
//! Prints one `key=value` line per figure.

use std::time::{Duration, Instant};

use hami_abi::event::EventKind;
use hami_test_harness::TestEnv;
use hami_user::probes::{DiscoveryOptions, ProbeOptions, Probes};

fn ns_per_pair(env: &TestEnv, n: u64) -> f64 {
    let out = env.run_probe(&["init", "ctx", "bench-pair", &n.to_string(), "4K"]);
    assert!(out.status.success(), "cudaprobe failed:\n{}", out.stdout);
    let line = &out.find("bench-pair")[0];
    line.get("ns_per_pair")
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no ns_per_pair in {}", line.raw))
}

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn main() {
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(euid, 0, "the probe benchmark needs root");
    let n: u64 = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(200_000);
    let env = TestEnv::new();
    let art = hami_test_harness::Artifacts::get();
    let rss_before = rss_kib();

    // Without probes.
    let base = median((0..3).map(|_| ns_per_pair(&env, n)).collect());

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let t = Instant::now();
        let mut probes = Probes::load(&ProbeOptions::default()).expect("loading probes");
        let load_ms = t.elapsed().as_secs_f64() * 1e3;
        let t = Instant::now();
        probes.attach_libcuda(&art.fake_libcuda).expect("attach");
        let attach_ms = t.elapsed().as_secs_f64() * 1e3;
        let (mut rx, handle) = probes
            .spawn(DiscoveryOptions {
                interval: None,
                ..Default::default()
            })
            .unwrap();
        // Consumer: counts allocation events.
        let consumer = tokio::spawn(async move {
            let mut allocs = 0u64;
            while let Some(ev) = rx.recv().await {
                if ev.kind == EventKind::MemAlloc {
                    allocs += 1;
                }
            }
            allocs
        });

        // With probes: the same pairs, one process (the consumer runs meanwhile).
        let env2 = TestEnv::new();
        let with = tokio::task::spawn_blocking(move || {
            median((0..3).map(|_| ns_per_pair(&env2, n)).collect())
        })
        .await
        .unwrap();

        // Throughput: one process per CPU at once.
        let cpus = std::thread::available_parallelism().map_or(2, |n| n.get());
        let before = handle.counters();
        let t = Instant::now();
        let workers: Vec<_> = (0..cpus)
            .map(|_| {
                tokio::task::spawn_blocking(move || {
                    let env = TestEnv::new();
                    ns_per_pair(&env, n);
                })
            })
            .collect();
        for w in workers {
            w.await.unwrap();
        }
        // Wait until user space has read everything the programs sent.
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let c = handle.counters();
            if c.received >= c.sent || Instant::now() > deadline {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let secs = t.elapsed().as_secs_f64();
        let after = handle.counters();
        let sent = after.sent - before.sent;
        let dropped = after.dropped - before.dropped;
        let rss_after = rss_kib();

        println!("pairs_per_process={n}");
        println!("probes_load_ms={load_ms:.1}");
        println!("probes_attach_ms={attach_ms:.1}");
        println!("ns_per_pair_without_probes={base:.1}");
        println!("ns_per_pair_with_probes={with:.1}");
        println!("added_ns_per_pair={:.1}", with - base);
        println!("parallel_processes={cpus}");
        println!("events_sent={sent}");
        println!("events_dropped={dropped}");
        println!("events_per_second={:.0}", sent as f64 / secs);
        println!("unpaired={}", after.unpaired);
        println!("rss_kib_before_probes={rss_before}");
        println!("rss_kib_with_probes={rss_after}");
        drop(handle);
        let allocs = consumer.await.unwrap();
        println!("alloc_events_received={allocs}");
    });
}
