//! Compute shares: SM time per container against its limit.

use super::*;

/// Writes device `dev`'s compute record into a region file, as the launch gate keeps it.
fn set_compute(path: &Path, dev: usize, sm_limit: u32, consumed_ns: u64, throttled_ns: u64) {
    use core::mem::{offset_of, size_of};
    use hami_abi::layout::DeviceCompute as C;
    let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    let base = (offset_of!(hami_abi::layout::RegionLayout, compute) + dev * size_of::<C>()) as u64;
    f.write_all_at(
        &sm_limit.to_le_bytes(),
        base + offset_of!(C, sm_limit) as u64,
    )
    .unwrap();
    f.write_all_at(
        &consumed_ns.to_le_bytes(),
        base + offset_of!(C, consumed_ns) as u64,
    )
    .unwrap();
    f.write_all_at(&7u64.to_le_bytes(), base + offset_of!(C, throttled) as u64)
        .unwrap();
    f.write_all_at(
        &throttled_ns.to_le_bytes(),
        base + offset_of!(C, throttled_ns) as u64,
    )
    .unwrap();
    f.write_all_at(&5u64.to_le_bytes(), base + offset_of!(C, refusals) as u64)
        .unwrap();
}

/// [`nvml_sample`] with per-process SM utilisation on GPU 0 since the previous sample.
fn util_sample(procs: &[(u32, u64)], sm: &[(u32, u32)]) -> NvmlSnapshot {
    let mut n = nvml_sample(procs);
    let samples: Vec<crate::nvml::ProcessUtilizationSample> = sm
        .iter()
        .map(|&(pid, sm_util)| crate::nvml::ProcessUtilizationSample {
            pid,
            time_stamp: 1,
            sm_util,
            ..Default::default()
        })
        .collect();
    n.add_utilization(0, &samples);
    n.gpu_util.insert(0, 95);
    n
}

fn compute_kinds(fs: &[Finding]) -> Vec<(Option<String>, Option<u32>)> {
    fs.iter()
        .filter(|f| f.kind == FindingKind::ComputeOverLimit)
        .map(|f| (f.region.clone(), f.device))
        .collect()
}

#[test]
fn a_containers_compute_share_is_its_processes_sum_and_over_limit_after_a_whole_window() {
    let w = World::new();
    // Container A: two processes sharing one region held to 30 %; container B: its own
    // region, no compute limit.
    w.spawn(100, 7, true, "1g");
    w.spawn(101, 8, true, "1g");
    let cid_b = CID.replace('0', "b");
    w.spawn_in(&cid_b, 200, 9, true, "1g");
    let ra = w.region(100, 1 << 30, &[101]);
    register(&ra, 100, 7, 0);
    register(&ra, 101, 8, 0);
    let rb = w.region(200, 1 << 30, &[]);
    register(&rb, 200, 9, 0);
    let path_a = w.root.join("100/root/hami/r.cache");
    set_compute(&path_a, 0, 30, 9_000_000_000, 2_500_000_000);
    let mut a = w.agent(false);
    let mem = [(100, 10 * MIB), (101, 10 * MIB), (200, 10 * MIB)];
    let t0 = Instant::now();
    let at = |s: u64| t0 + Duration::from_secs(s);
    // Before their first kernels (contexts, loading): idle, shown as 0 and not averaged in.
    for s in (1..=3u64).rev() {
        let before = t0 - Duration::from_secs(s);
        a.set_nvml_at(Some(util_sample(&mem, &[(200, 50)])), before);
        assert_eq!(compute_kinds(&a.tick(before).raised), vec![]);
    }
    let row = a.process_rows().into_iter().find(|r| r.pid == 100).unwrap();
    assert_eq!(
        (row.compute_share, row.compute_limit),
        (Some(0.0), Some(30))
    );
    // 25 % + 20 % for A (45 %, 15 points over its share), 50 % for B.
    let busy = [(100, 25), (101, 20), (200, 50)];
    for s in 0..30 {
        a.set_nvml_at(Some(util_sample(&mem, &busy)), at(s));
        let out = a.tick(at(s));
        assert_eq!(
            compute_kinds(&out.raised),
            vec![],
            "at {s} s: not a whole window yet"
        );
    }
    assert_eq!(a.process_count(), 3, "learned from NVML");
    // What is shown: A's share and limit in the rows, both regions in the series.
    let row = a.process_rows().into_iter().find(|r| r.pid == 101).unwrap();
    assert_eq!(
        (row.compute_share, row.compute_limit),
        (Some(45.0), Some(30))
    );
    assert_eq!(row.sm_util, Some(20));
    let sample = a
        .process_samples()
        .into_iter()
        .find(|p| p.pid == 100)
        .unwrap();
    assert_eq!(sample.sm_util, Some(25), "the opt-in per-process series");
    let b_row = a.process_rows().into_iter().find(|r| r.pid == 200).unwrap();
    assert_eq!((b_row.compute_share, b_row.compute_limit), (None, None));
    let series = a.region_series();
    let sa = series
        .iter()
        .find(|s| s.region == "/hami/r.cache" && s.compute_limit == 30)
        .unwrap();
    assert_eq!(sa.compute_share, Some(45.0));
    assert_eq!(
        (
            sa.compute_consumed_ns,
            sa.compute_throttled,
            sa.compute_throttled_ns
        ),
        (9_000_000_000, 7, 2_500_000_000)
    );
    assert_eq!(sa.quota_refusals, 5, "the region's refusal counter");
    let sb = series.iter().find(|s| s.compute_limit == 0).unwrap();
    assert_eq!(sb.compute_share, Some(50.0), "B's own processes only");
    assert_eq!(a.gpu_series()[0].utilization, Some(95));
    // 30 s watched: the finding, for A's region and device 0 only.
    a.set_nvml_at(Some(util_sample(&mem, &busy)), at(30));
    let out = a.tick(at(30));
    assert_eq!(
        compute_kinds(&out.raised),
        vec![(Some("/hami/r.cache".to_string()), Some(0))]
    );
    let f = out
        .raised
        .iter()
        .find(|f| f.kind == FindingKind::ComputeOverLimit)
        .unwrap();
    assert_eq!((f.observed, f.limit), (Some(45), Some(30)));
    assert!(f.detail.contains("100: 25 %, 101: 20 %"), "{}", f.detail);
    let row = a.process_rows().into_iter().find(|r| r.pid == 100).unwrap();
    assert!(
        row.verdict.contains("compute_over_limit"),
        "{}",
        row.verdict
    );
    let json = serde_json::to_value(a.region_rows()).unwrap();
    let rec = &json
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["compute"][0]["sm_limit"] == 30)
        .unwrap()["compute"][0];
    assert_eq!(rec["limit"], 30);
    assert_eq!(rec["share"], 45.0);
    assert_eq!(rec["consumed_ns"], 9_000_000_000u64);
    // A comes back to its share (30 %): the mean over 30 s falls within the tolerance and
    // the finding clears, not at the first sample.
    let within = [(100, 15), (101, 15), (200, 50)];
    let mut cleared_at = None;
    for s in 31..60 {
        a.set_nvml_at(Some(util_sample(&mem, &within)), at(s));
        let out = a.tick(at(s));
        if out
            .cleared
            .iter()
            .any(|f| f.kind == FindingKind::ComputeOverLimit)
        {
            cleared_at = Some(s);
            break;
        }
    }
    // Mean of (30 - k) x 45 and k x 30 reaches 40 at k = 10 samples.
    assert_eq!(cleared_at, Some(40));
}

#[test]
fn unhooked_process_nvml_sees_using_sm_time_is_learned_and_a_bypass() {
    let w = World::new();
    w.spawn(300, 10, false, "1g");
    let mut a = w.agent(false);
    // NVML lists no used memory for it, only SM time.
    a.set_nvml(Some(util_sample(&[], &[(300, 40)])));
    assert_eq!(a.process_count(), 1, "learned from its SM time");
    let out = a.tick(Instant::now());
    assert_eq!(
        kinds(&out.raised),
        vec![(FindingKind::Bypass, findings::reason::NO_PRELOAD)]
    );
    assert!(out.raised[0].detail.contains("40 % of a GPU's SM time"));
}

/// Issue 20: `audit` shows the devices a process's memory is on (its slot's usage by
/// device, CUDA ordinals), each once, sorted.
#[test]
fn process_rows_list_the_devices_the_memory_is_on() {
    let w = World::new();
    w.spawn(100, 7, true, "1g");
    let r = w.region(100, 1 << 30, &[]);
    let s = register(&r, 100, 7, 64 * MIB);
    let mut a = w.agent(false);
    a.on_event(&ev(EventKind::MemAlloc, 100, 64 * MIB, 0x7000, 0));
    a.tick(Instant::now());
    assert_eq!(a.process_rows()[0].devices, vec![0]);
    r.force_charge(s, 2, UsageKind::Data, 8 * MIB);
    a.tick(Instant::now());
    let row = &a.process_rows()[0];
    assert_eq!(row.devices, vec![0, 2]);
    // No NVML here: no NVML device either.
    assert!(row.nvml_devices.is_empty());
    let j = serde_json::to_value(row).unwrap();
    assert_eq!(j["devices"], serde_json::json!([0, 2]));
}
