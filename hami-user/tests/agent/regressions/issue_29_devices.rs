//! Regressions of issue 29: the per-device series of a container whose processes narrow its
//! GPUs with `CUDA_VISIBLE_DEVICES`.

use super::*;

/// Guards issue 29 (hami-preload: the region's devices are the container's, known by UUID;
/// hami-agent: probe-observed bytes keyed by the container's device). One container, two
/// GPUs, limits 1 GiB and 2 GiB: process B sees both and holds 200 MiB on device 0, process
/// A (`CUDA_VISIBLE_DEVICES=1`) holds 600 MiB on its only device, the container's device 1.
/// The agent's per-device series carry each device's own limit, usage and UUID (before:
/// A's 600 MiB were on device 0, observed and accounted, and device 0 carried GPU 1's UUID).
#[test]
fn per_device_series_follow_the_containers_devices_whatever_each_process_sees() {
    let _g = serial();
    let env = hami_test_harness::TestEnv::new()
        .preload(true)
        .env("FAKE_CUDA_DEVICE_COUNT", "2")
        .env("FAKE_CUDA_CTX_OVERHEAD", "0")
        .env("HAMI_CONTEXT_OVERHEAD", "0")
        .env("HAMI_ADMISSION_RESERVE", "0")
        .env("CUDA_DEVICE_MEMORY_LIMIT_0", "1G")
        .env("CUDA_DEVICE_MEMORY_LIMIT_1", "2G");
    let mut agent = hami_test_harness::AgentProcess::run_json(AGENT, &env, &["--interval", "100"]);
    let addr = agent.metrics_addr();
    let spawn = |cvd: Option<&str>, ops: &[&str]| {
        let mut c = env.cudaprobe_cmd(ops);
        match cvd {
            Some(v) => c.env("CUDA_VISIBLE_DEVICES", v),
            None => c.env_remove("CUDA_VISIBLE_DEVICES"),
        };
        c.stdin(Stdio::piped());
        let mut p = hami_test_harness::RunningProbe::start(c);
        p.wait_for("wait");
        p
    };
    let mut b = spawn(None, &["init", "ctx", "alloc", "200M", "wait"]);
    let mut a = spawn(Some("1"), &["init", "ctx", "alloc", "600M", "wait"]);
    let region = env.region_path().display().to_string();
    let want = [
        (
            "0",
            "GPU-facec0da-0000-4000-8000-000000000000",
            1024 * MIB,
            200 * MIB,
        ),
        (
            "1",
            "GPU-facec0da-0000-4000-8000-000000000001",
            2048 * MIB,
            600 * MIB,
        ),
    ];
    // The value of `family`'s series of this region on `device` with `uuid` (None: absent).
    let value = |m: &str, family: &str, device: &str, uuid: &str| -> Option<u64> {
        m.lines()
            .filter(|l| l.starts_with(&format!("{family}{{")))
            .filter(|l| l.contains(&format!("region=\"{region}\"")))
            .filter(|l| l.contains(&format!("cuda_device=\"{device}\"")))
            .find(|l| l.contains(&format!("UUID=\"{uuid}\"")))
            .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .map(|v| v as u64)
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    let metrics = loop {
        let m = hami_test_harness::get_metrics(addr, Duration::from_secs(3)).expect("/metrics");
        let done = want.iter().all(|&(d, u, _, bytes)| {
            value(&m, "hami_container_observed_bytes", d, u) == Some(bytes)
                && value(&m, "hami_container_accounted_data_bytes", d, u) == Some(bytes)
        });
        if done || Instant::now() > deadline {
            break m;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let ours: Vec<&str> = metrics
        .lines()
        .filter(|l| l.contains(&format!("region=\"{region}\"")))
        .collect();
    for (d, u, limit, bytes) in want {
        for (family, v) in [
            ("hami_container_limit_bytes", limit),
            ("hami_container_accounted_data_bytes", bytes),
            ("hami_container_observed_bytes", bytes),
        ] {
            assert_eq!(
                value(&metrics, family, d, u),
                Some(v),
                "{family} of device {d} ({u}):\n{}",
                ours.join("\n")
            );
        }
    }
    a.resume();
    b.resume();
    agent.stop();
}
