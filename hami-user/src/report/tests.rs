use super::*;
use hami_common::region::{ProcessId, Region, RegionConfig};

#[test]
fn inspect_json_matches_a_region_written_through_the_api() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("r.cache");
    let mut cfg = RegionConfig::default();
    cfg.limits[0] = 1 << 30;
    cfg.limits[1] = 2 << 30;
    cfg.device_count = 2;
    let (r, _) = Region::open_or_create(&path, &cfg).unwrap();
    r.set_uuid(0, [0xab; 16]);
    let me = ProcessId::current();
    let s = r.register(me).unwrap();
    r.force_charge(s, 0, UsageKind::Context, 5 << 20);
    r.try_charge(s, 1, UsageKind::Data, 64 << 20).unwrap();
    // A slot of a process that does not exist.
    let ghost = ProcessId {
        pid: u32::MAX - 7,
        start_time: 1,
    };
    let g = r.register(ghost).unwrap();
    r.try_charge(g, 0, UsageKind::Data, 1 << 20).unwrap();

    let ro = Region::open_existing(&path, false).unwrap();
    let v = inspect_json("r.cache", &ro.snapshot());
    assert_eq!(v["version"], hami_abi::layout::VERSION);
    assert_eq!(v["initialised"], true);
    assert_eq!(v["device_count"], 2);
    assert_eq!(v["devices"][0]["limit"], 1u64 << 30);
    assert_eq!(v["devices"][1]["limit"], 2u64 << 30);
    assert_eq!(v["devices"][0]["used"], (5u64 << 20) + (1 << 20));
    assert_eq!(v["devices"][1]["used"], 64u64 << 20);
    assert_eq!(
        v["devices"][0]["uuid"],
        "GPU-abababab-abab-abab-abab-abababababab"
    );
    assert_eq!(v["devices"][1]["uuid"], Value::Null);
    let slots = v["slots"].as_array().unwrap();
    assert_eq!(slots.len(), 2);
    let mine = slots.iter().find(|s| s["pid"] == me.pid).unwrap();
    assert_eq!(mine["start_time"], me.start_time);
    assert_eq!(mine["liveness"], "alive");
    assert_eq!(mine["total"], (5u64 << 20) + (64 << 20));
    assert_eq!(mine["usage"][0]["device"], 0);
    assert_eq!(mine["usage"][0]["context"], 5u64 << 20);
    assert_eq!(mine["usage"][1]["data"], 64u64 << 20);
    assert_eq!(mine["usage"][1]["pool"], 0);
    let other = slots.iter().find(|s| s["pid"] == ghost.pid).unwrap();
    assert_eq!(other["liveness"], "dead");
    assert_eq!(v["devices"][0]["compute"]["sm_limit"], 0);
    assert_eq!(v["devices"][0]["compute"]["limit_percent"], Value::Null);
    let text = inspect_text("r.cache", &ro.snapshot());
    assert!(text.contains("limit 1.0 GiB (1073741824 bytes)"), "{text}");
    assert!(
        !text.contains("compute:"),
        "no compute record in use: {text}"
    );
    // Device 1's compute record as the launch gate keeps it.
    let mut snap = ro.snapshot();
    snap.compute[1].sm_limit = 30;
    snap.compute[1].consumed_ns = 2_500_000_000;
    snap.compute[1].throttled = 3;
    let text = inspect_text("r.cache", &snap);
    assert!(
        text.contains("compute: share 30 % (sm_limit 30, policy default), 2.500 s of device time used, 3 waits"),
        "{text}"
    );
    assert_eq!(
        inspect_json("r.cache", &snap)["devices"][1]["compute"]["limit_percent"],
        30
    );
    assert!(text.contains("active slots: 2"));
    assert!(text.contains("dead here"));
    assert_eq!(v["devices"][0]["context_footprint"], 0);
    assert!(
        text.contains("context footprint not measured yet"),
        "{text}"
    );
}

#[test]
fn inspect_shows_the_context_footprint_per_device() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("r.cache");
    let mut cfg = RegionConfig::default();
    cfg.limits[0] = 1 << 30;
    cfg.limits[1] = 1 << 30;
    cfg.device_count = 2;
    let (r, _) = Region::open_or_create(&path, &cfg).unwrap();
    r.set_context_footprint(1, 518 << 20);
    let ro = Region::open_existing(&path, false).unwrap();
    let v = inspect_json("r.cache", &ro.snapshot());
    assert_eq!(v["devices"][0]["context_footprint"], 0);
    assert_eq!(v["devices"][1]["context_footprint"], 518u64 << 20);
    let text = inspect_text("r.cache", &ro.snapshot());
    assert!(
        text.contains("context footprint 518.0 MiB (543162368 bytes)"),
        "{text}"
    );
}

#[test]
fn inspect_shows_the_refusals_per_device() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("r.cache");
    let mut cfg = RegionConfig::default();
    cfg.limits[0] = 1 << 30;
    cfg.device_count = 2;
    let (r, _) = Region::open_or_create(&path, &cfg).unwrap();
    for _ in 0..3 {
        r.count_refusal(1);
    }
    let ro = Region::open_existing(&path, false).unwrap();
    let v = inspect_json("r.cache", &ro.snapshot());
    assert_eq!(v["devices"][0]["refusals"], 0);
    assert_eq!(v["devices"][1]["refusals"], 3);
    let text = inspect_text("r.cache", &ro.snapshot());
    assert!(text.contains("3 memory request(s) refused"), "{text}");
}

#[test]
fn inspect_separates_allocations_from_admission_reserves() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("r.cache");
    let mut cfg = RegionConfig::default();
    cfg.limits[0] = 1 << 30;
    let (r, _) = Region::open_or_create(&path, &cfg).unwrap();
    let r = r.with_tuning(hami_common::region::Tuning {
        reserve: 16 << 20,
        ..Default::default()
    });
    let s = r.register(ProcessId::current()).unwrap();
    r.try_charge(s, 0, UsageKind::Data, 4 << 20).unwrap();
    let v = inspect_json("r.cache", &r.snapshot());
    assert_eq!(v["devices"][0]["used"], 4u64 << 20);
    assert_eq!(v["devices"][0]["reserved"], 16u64 << 20);
    assert_eq!(v["devices"][0]["admitted"], 20u64 << 20);
    assert_eq!(v["devices"][0]["accounted"], 4u64 << 20);
    assert_eq!(v["slots"][0]["usage"][0]["charged"], 20u64 << 20);
    assert_eq!(v["slots"][0]["usage"][0]["reserve"], 16u64 << 20);
    let text = inspect_text("r.cache", &r.snapshot());
    assert!(
        text.contains("used 4.0 MiB (4194304 bytes), reserved 16.0 MiB"),
        "{text}"
    );
}

#[test]
fn nvml_line_says_whether_the_physical_check_ran() {
    let off = NvmlSummary {
        error: Some("NVML unavailable (libnvidia-ml.so.1): not found".into()),
        ..Default::default()
    };
    let l = off.line();
    assert!(l.starts_with("not available (NVML unavailable"), "{l}");
    assert!(l.contains("no physical check"), "{l}");
    let mut on = NvmlSummary {
        available: true,
        samples: 3,
        per_process: true,
        tolerance: Some(Tolerance::NVML_DEFAULT),
        ..Default::default()
    };
    let l = on.line();
    assert!(l.contains("physical check on"), "{l}");
    assert!(l.contains("max(64.0 MiB, 2%)"), "{l}");
    on.per_process = false;
    assert!(on.line().contains("no per-process used memory"));
    let j = serde_json::to_value(&on).unwrap();
    assert_eq!(j["tolerance"]["min_bytes"], 64u64 << 20);
    assert_eq!(j["samples"], 3);
}

#[test]
fn audit_table_shows_the_compute_share_where_a_limit_exists() {
    let row = |pid: u32, limit: Option<u32>, share: Option<f64>| ProcessRow {
        pid,
        container: "c".into(),
        hooked: Some(true),
        compute_limit: limit,
        compute_share: share,
        verdict: "ok".into(),
        ..Default::default()
    };
    let report = |rows| {
        AuditReport::new(
            1.0,
            ProbeSummary::default(),
            NvmlSummary {
                compute: Some(crate::compute::ComputeOptions::default()),
                ..Default::default()
            },
            rows,
            vec![],
            vec![],
            &[],
            vec![],
        )
    };
    // No container with a compute limit: the table as before.
    let plain = report(vec![row(1, None, None)]).table();
    assert!(!plain.contains("COMPUTE"), "{plain}");
    let t = report(vec![
        row(1, Some(30), Some(45.25)),
        row(2, Some(50), None),
        row(3, None, None),
    ])
    .table();
    let lines: Vec<&str> = t.lines().collect();
    assert!(lines[0].contains("NVML  COMPUTE    VERDICT"), "{t}");
    assert!(lines[1].contains("45.2%/30%"), "{t}");
    assert!(lines[2].contains("-/50%"), "{t}");
    assert!(t.contains("mean over 5 s"), "{t}");
    let j = serde_json::to_value(report(vec![row(1, Some(30), Some(45.25))])).unwrap();
    assert_eq!(j["processes"][0]["compute_limit"], 30);
    assert_eq!(j["processes"][0]["compute_share"], 45.25);
    assert_eq!(j["nvml"]["compute"]["window"], 30.0);
    assert_eq!(j["nvml"]["compute"]["tolerance_points"], 10.0);
}

fn finding(
    kind: crate::findings::FindingKind,
    pid: Option<u32>,
    region: Option<&str>,
    container: &str,
) -> Finding {
    Finding {
        kind,
        reason: crate::findings::reason::NO_PRELOAD,
        pid,
        uid: None,
        nspid: None,
        container: container.into(),
        region: region.map(str::to_string),
        device: None,
        slot: None,
        bytes: 1 << 20,
        observed: None,
        accounted: None,
        limit: None,
        detail: "x".into(),
    }
}

fn pod_row(pid: u32, ns: &str, pod: &str, devices: Vec<u32>) -> ProcessRow {
    ProcessRow {
        pid,
        comm: "python".into(),
        container: format!("{pod}-main"),
        namespace: ns.into(),
        pod: pod.into(),
        uid: Some(1000 + pid),
        hooked: Some(true),
        region: Some("/tmp/cudevshr.cache".into()),
        devices,
        nvml_devices: vec![3],
        verdict: "ok".into(),
        ..Default::default()
    }
}

fn region_row(ns: &str, pod: &str) -> RegionRow {
    RegionRow {
        name: "/tmp/cudevshr.cache".into(),
        host_path: format!("/run/{pod}/cudevshr.cache"),
        container: format!("{pod}-main"),
        namespace: ns.into(),
        pod: pod.into(),
        file_id: "1:2".into(),
        device_count: 1,
        limits: vec![1 << 30],
        used: vec![0],
        active_slots: 1,
        reclaimed_slots: 0,
        compute: vec![],
        error: None,
    }
}

#[test]
fn audit_table_shows_the_devices_and_wide_adds_identity_columns() {
    use crate::findings::FindingKind::Bypass;
    let f = finding(Bypass, Some(7), None, "b-main");
    let rep = AuditReport::new(
        1.0,
        ProbeSummary::default(),
        NvmlSummary::default(),
        vec![
            pod_row(5, "team-a", "a", vec![0, 1]),
            pod_row(7, "team-b", "b", vec![]),
        ],
        vec![],
        vec![f.clone()],
        &[f],
        vec![],
    );
    let t = rep.table();
    let lines: Vec<&str> = t.lines().collect();
    let cols: Vec<&str> = lines[0].split_whitespace().collect();
    let dev = cols
        .iter()
        .position(|c| *c == "DEVICE")
        .expect("DEVICE column");
    assert_eq!(lines[1].split_whitespace().nth(dev), Some("0,1"), "{t}");
    assert_eq!(lines[2].split_whitespace().nth(dev), Some("-"), "{t}");
    assert!(!t.contains("NAMESPACE"), "{t}");
    let w = rep.table_wide();
    let lines: Vec<&str> = w.lines().collect();
    let cols: Vec<&str> = lines[0].split_whitespace().collect();
    for c in [
        "NAMESPACE",
        "POD",
        "UID",
        "COMMAND",
        "DEVICE",
        "NVML_GPU",
        "REASONS",
    ] {
        assert!(cols.contains(&c), "{c} missing: {w}");
    }
    let cell = |line: &str, name: &str| {
        let i = cols.iter().position(|c| *c == name).unwrap();
        line.split_whitespace().nth(i).unwrap().to_string()
    };
    assert_eq!(cell(lines[1], "NAMESPACE"), "team-a");
    assert_eq!(cell(lines[1], "POD"), "a");
    assert_eq!(cell(lines[1], "UID"), "1005");
    assert_eq!(cell(lines[1], "DEVICE"), "0,1");
    assert_eq!(cell(lines[1], "NVML_GPU"), "3");
    // REASONS is last (OBSERVED holds a space: the last word, not the column index).
    assert_eq!(cols.last(), Some(&"REASONS"));
    assert_eq!(lines[1].split_whitespace().last(), Some("-"), "{w}");
    assert_eq!(
        lines[2].split_whitespace().last(),
        Some(crate::findings::reason::NO_PRELOAD),
        "{w}"
    );
    let j = serde_json::to_value(&rep).unwrap();
    assert_eq!(j["processes"][0]["devices"], json!([0, 1]));
    assert_eq!(j["processes"][0]["nvml_devices"], json!([3]));
    assert_eq!(j["processes"][0]["namespace"], "team-a");
    assert_eq!(j["processes"][0]["pod"], "a");
    assert!(j.get("filter").is_none());
}

#[test]
fn audit_filters_rows_and_findings_by_namespace_and_pod() {
    use crate::findings::FindingKind::{Bypass, OverLimit};
    let history = vec![
        finding(Bypass, Some(7), None, "b-main"),
        // A region finding without a pid: kept by region name and container.
        finding(OverLimit, None, Some("/tmp/cudevshr.cache"), "a-main"),
        finding(OverLimit, None, Some("/tmp/cudevshr.cache"), "b-main"),
    ];
    let rep = AuditReport::new(
        1.0,
        ProbeSummary::default(),
        NvmlSummary::default(),
        vec![
            pod_row(5, "team-a", "a", vec![0]),
            pod_row(6, "team-a", "a2", vec![0]),
            pod_row(7, "team-b", "b", vec![1]),
        ],
        vec![region_row("team-a", "a"), region_row("team-b", "b")],
        history,
        &[],
        vec![Reclaimed {
            region: "/tmp/cudevshr.cache".into(),
            container: "b-main".into(),
            slot: 0,
            pid: 9,
            start_time: 1,
            bytes: 1,
        }],
    );
    assert!(rep.failed);
    let same = rep.clone().filtered(&Filter::default());
    assert_eq!(same, rep);

    let a = rep.clone().filtered(&Filter {
        namespace: Some("team-a".into()),
        pod: None,
    });
    assert_eq!(
        a.processes.iter().map(|p| p.pid).collect::<Vec<_>>(),
        [5, 6]
    );
    assert_eq!(a.regions.len(), 1);
    assert_eq!(a.findings.len(), 1);
    assert_eq!(a.findings[0].finding.container, "a-main");
    assert!(a.reclaimed.is_empty());
    // Over-limit is a failure too: the exit status follows the kept findings.
    assert!(a.failed);

    let a2 = rep.clone().filtered(&Filter {
        namespace: Some("team-a".into()),
        pod: Some("a2".into()),
    });
    assert_eq!(a2.processes.iter().map(|p| p.pid).collect::<Vec<_>>(), [6]);
    assert!(a2.findings.is_empty());
    assert!(!a2.failed);
    assert_eq!(a2.exit_code(), 0);

    let b = rep.clone().filtered(&Filter {
        namespace: None,
        pod: Some("b".into()),
    });
    assert_eq!(b.processes.iter().map(|p| p.pid).collect::<Vec<_>>(), [7]);
    assert_eq!(b.findings.len(), 2);
    assert_eq!(b.reclaimed.len(), 1);
    let j = serde_json::to_value(&b).unwrap();
    assert_eq!(j["filter"]["pod"], "b");
    assert_eq!(j["processes"][0]["devices"], json!([1]));

    let none = rep.filtered(&Filter {
        namespace: Some("nowhere".into()),
        pod: None,
    });
    assert!(none.processes.is_empty() && none.findings.is_empty());
    assert!(none
        .table()
        .contains("(no GPU process seen in namespace nowhere pod *)"));
}

#[test]
fn audit_table_and_exit_code() {
    use crate::findings::{FindingKind, FindingKind::*};
    let f = Finding {
        kind: Bypass,
        reason: crate::findings::reason::NO_PRELOAD,
        pid: Some(42),
        uid: None,
        nspid: Some(42),
        container: "host".into(),
        region: None,
        device: None,
        slot: None,
        bytes: 1 << 20,
        observed: Some(1 << 20),
        accounted: None,
        limit: None,
        detail: "x".into(),
    };
    let rep = AuditReport::new(
        1.0,
        ProbeSummary::default(),
        NvmlSummary::default(),
        vec![],
        vec![],
        vec![f.clone()],
        &[],
        vec![],
    );
    assert!(rep.failed);
    assert_eq!(rep.exit_code(), EXIT_FINDINGS);
    assert!(!rep.findings[0].standing);
    let t = rep.table();
    assert!(t.contains("bypass"), "{t}");
    assert!(t.contains("(cleared)"));
    let j = serde_json::to_value(&rep).unwrap();
    assert_eq!(j["findings"][0]["kind"], "bypass");
    assert_eq!(j["findings"][0]["pid"], 42);
    assert_eq!(j["failed"], true);
    let mut drift = f;
    drift.kind = FindingKind::Drift;
    let ok = AuditReport::new(
        1.0,
        ProbeSummary::default(),
        NvmlSummary::default(),
        vec![],
        vec![],
        vec![drift.clone()],
        &[drift],
        vec![],
    );
    assert_eq!(ok.exit_code(), 0);
    assert_eq!(short_container(&"a".repeat(64)), "aaaaaaaaaaaa");
}
