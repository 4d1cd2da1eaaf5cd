use super::*;
use crate::identity::Identity;

mod hami_families;

fn ident(ns: &str, pod: &str, ctr: &str) -> Identity {
    Identity {
        namespace: ns.into(),
        pod: pod.into(),
        container: ctr.into(),
        ..Identity::default()
    }
}

fn series(ctr: &str, dev: u32) -> RegionSeries {
    RegionSeries {
        identity: ident("ml", "trainer-0", ctr),
        region: "/tmp/r".into(),
        device: dev,
        uuid: "GPU-0a1b2c3d-0000-1111-2222-333344445555".into(),
        limit: 100,
        accounted: 50,
        accounted_data: 40,
        observed: 45,
        context: 6,
        module: 3,
        buffer: 40,
        ..Default::default()
    }
}

#[test]
fn usage_and_findings_render_with_workload_labels() {
    let m = Metrics::new(MetricsOptions {
        node: "gpu-node-1".into(),
        ..Default::default()
    })
    .unwrap();
    m.set_regions(&[series("main", 0)]);
    m.events.with_label_values(&["mem_alloc"]).inc_by(3);
    m.set_dropped_total(7);
    m.set_dropped_total(5); // never goes back
    let text = m.render();
    // dcgm-exporter's and HAMi's names: namespace, pod, container, UUID; the node last.
    assert!(
        text.contains(r#"hami_container_limit_bytes{UUID="GPU-0a1b2c3d-0000-1111-2222-333344445555",container="main",cuda_device="0",namespace="ml",pod="trainer-0",region="/tmp/r",node="gpu-node-1"} 100"#),
        "{text}"
    );
    assert!(text.contains(r#"hami_events_total{kind="mem_alloc",node="gpu-node-1"} 3"#));
    assert!(text.contains(r#"hami_events_dropped_total{node="gpu-node-1"} 7"#));
    assert!(text.contains(r#"hami_findings_standing{kind="bypass",node="gpu-node-1"} 0"#));
    assert!(text.contains(r#"hami_findings_total{kind="bypass",node="gpu-node-1"} 0"#));
    // The build info under a name of our own (HAMi serves `hami_build_info`).
    assert!(text.contains("hami_agent_build_info{"), "{text}");
    assert!(!text.contains("hami_build_info"), "{text}");
    assert!(
        text.contains(r#"process_resident_memory_bytes{node="gpu-node-1"} "#),
        "{text}"
    );
    // Every sample of the agent's own families names the node.
    for l in text.lines().filter(|l| !l.starts_with('#')) {
        assert!(l.contains(r#"node="gpu-node-1""#), "{l}");
    }
    // No family named like another's counter (OpenMetrics strips `_total`), and none of
    // the old label names.
    assert!(!text.contains("hami_findings{"));
    for l in [
        "pod_namespace=",
        "pod_name=",
        "container_name=",
        "gpu_uuid=",
        "nvml_index=",
    ] {
        assert!(!text.contains(l), "{l}: {text}");
    }
    // A region that went away disappears from the gauges.
    m.set_regions(&[]);
    assert!(!m.render().contains("hami_container_limit_bytes{"));
    // Without a node name (tests, tools), no node label.
    let bare = Metrics::new(MetricsOptions::default()).unwrap();
    assert!(!bare.render().contains("node="));
}

/// A workload outside Kubernetes still carries `namespace=""` and `pod=""`: scraped with
/// `honor_labels: true` the explicit empty label keeps the target's `namespace`/`pod`
/// (the agent's own pod) off its series (docs/deploy.md).
#[test]
fn empty_workload_names_are_exported_as_empty_labels() {
    let m = Metrics::new(MetricsOptions::default()).unwrap();
    let mut s = series("host", 0);
    s.identity = ident("", "", "host");
    m.set_regions(&[s]);
    let t = m.render();
    assert!(
        t.contains(r#"hami_container_limit_bytes{UUID="GPU-0a1b2c3d-0000-1111-2222-333344445555",container="host",cuda_device="0",namespace="",pod="",region="/tmp/r"} 100"#),
        "{t}"
    );
}

/// Only standing findings have a `hami_finding` series, with their workload's names and
/// reason; several of one workload and reason count in one series; a finding that
/// clears takes its series with it.
#[test]
fn standing_findings_are_exported_with_their_workload() {
    let m = Metrics::new(MetricsOptions::default()).unwrap();
    let f = |kind, reason, ns: &str, pod: &str, ctr: &str| FindingSeries {
        kind,
        reason,
        identity: ident(ns, pod, ctr),
    };
    use crate::findings::reason as r;
    m.set_findings(&[
        f(
            FindingKind::Bypass,
            r::NO_PRELOAD,
            "ml",
            "trainer-0",
            "main",
        ),
        f(
            FindingKind::Bypass,
            r::NO_PRELOAD,
            "ml",
            "trainer-0",
            "main",
        ),
        f(FindingKind::Bypass, r::NO_SLOT, "ml", "trainer-1", "main"),
        f(
            FindingKind::LeakedSlot,
            r::PROCESS_DEAD,
            "web",
            "infer-7",
            "srv",
        ),
    ]);
    let t = m.render();
    assert!(
        t.contains(r#"hami_finding{container="main",kind="bypass",namespace="ml",pod="trainer-0",reason="no_preload"} 2"#),
        "{t}"
    );
    assert!(
        t.contains(r#"hami_finding{container="main",kind="bypass",namespace="ml",pod="trainer-1",reason="no_slot"} 1"#),
        "{t}"
    );
    assert!(
        t.contains(r#"hami_finding{container="srv",kind="leaked_slot",namespace="web",pod="infer-7",reason="process_dead"} 1"#),
        "{t}"
    );
    assert_eq!(t.matches("hami_finding{").count(), 3, "{t}");
    assert!(
        t.contains(r#"hami_findings_standing{kind="bypass"} 3"#),
        "{t}"
    );
    assert!(t.contains(r#"hami_findings_standing{kind="leaked_slot"} 1"#));
    // The leak is reclaimed, one bypass clears.
    m.set_findings(&[f(
        FindingKind::Bypass,
        r::NO_SLOT,
        "ml",
        "trainer-1",
        "main",
    )]);
    let t = m.render();
    assert_eq!(t.matches("hami_finding{").count(), 1, "{t}");
    assert!(t.contains(r#"pod="trainer-1",reason="no_slot"} 1"#), "{t}");
    assert!(t.contains(r#"hami_findings_standing{kind="leaked_slot"} 0"#));
    m.set_findings(&[]);
    assert!(!m.render().contains("hami_finding{"));
}

#[test]
fn the_arbiters_grant_lent_time_and_priority_are_exported() {
    let m = Metrics::new(MetricsOptions::default()).unwrap();
    let mut lent = series("alone", 0);
    lent.compute_limit = 30;
    lent.compute_grant = Some(100.0);
    lent.compute_lent = 70.0;
    let mut turn = series("contending", 3);
    turn.compute_limit = 50;
    turn.compute_grant = Some(50.0);
    turn.compute_turn = 50.0;
    lent.priority = 1;
    let mut held = series("low", 1);
    held.compute_limit = 50;
    held.compute_grant = Some(0.0);
    held.compute_held = true;
    held.priority = 1;
    let mut off = series("native", 2);
    off.compute_limit = 0;
    m.set_regions(&[lent, held, off, turn]);
    let t = m.render();
    let l = |ctr: &str, dev: u32| {
        format!(
            r#"{{UUID="GPU-0a1b2c3d-0000-1111-2222-333344445555",container="{ctr}",cuda_device="{dev}",namespace="ml",pod="trainer-0",region="/tmp/r"}}"#
        )
    };
    for line in [
        format!("hami_container_compute_grant_percent{} 100", l("alone", 0)),
        format!("hami_container_compute_lent_percent{} 70", l("alone", 0)),
        format!("hami_container_compute_held{} 0", l("alone", 0)),
        format!("hami_container_priority{} 1", l("alone", 0)),
        format!("hami_container_compute_grant_percent{} 0", l("low", 1)),
        format!("hami_container_compute_held{} 1", l("low", 1)),
        format!("hami_container_compute_turn_percent{} 0", l("alone", 0)),
        format!(
            "hami_container_compute_turn_percent{} 50",
            l("contending", 3)
        ),
    ] {
        assert!(t.contains(&line), "{line}\n{t}");
    }
    // No share: no grant, no priority series.
    assert!(
        !t.contains(r#"container="native""#)
            || !t.contains(&format!(
                "hami_container_compute_grant_percent{}",
                l("native", 2)
            )),
        "{t}"
    );
    assert!(
        !t.contains(&format!("hami_container_priority{}", l("native", 2))),
        "{t}"
    );
}

#[test]
fn compute_families_follow_the_regions_and_the_gpus() {
    let m = Metrics::new(MetricsOptions::default()).unwrap();
    let mut limited = series("main", 0);
    limited.compute_limit = 30;
    limited.compute_share = Some(42.5);
    limited.compute_consumed_ns = 12_500_000_000;
    limited.compute_throttled = 4;
    limited.compute_throttled_ns = 1_250_000_000;
    limited.quota_refusals = 17;
    // Another container without a compute limit, whose share NVML did not give.
    let unmeasured = series("side", 1);
    m.set_regions(&[limited, unmeasured]);
    m.set_gpus(&[
        GpuSeries {
            index: 0,
            uuid: "GPU-0a1b2c3d-0000-1111-2222-333344445555".into(),
            utilization: Some(97),
            memory_total: Some(80 << 30),
            memory_used: Some(3 << 30),
            ..Default::default()
        },
        // A GPU whose utilisation NVML did not give: its memory still shows.
        GpuSeries {
            index: 1,
            uuid: "GPU-1".into(),
            utilization: None,
            memory_total: Some(1 << 30),
            memory_used: None,
            ..Default::default()
        },
    ]);
    let t = m.render();
    let l = r#"{UUID="GPU-0a1b2c3d-0000-1111-2222-333344445555",container="main",cuda_device="0",namespace="ml",pod="trainer-0",region="/tmp/r"}"#;
    for (fam, v) in [
        ("hami_container_compute_limit_percent", "30"),
        ("hami_container_compute_share_percent", "42.5"),
        ("hami_container_compute_seconds_total", "12.5"),
        ("hami_container_compute_throttled_total", "4"),
        ("hami_container_compute_throttled_seconds_total", "1.25"),
        ("hami_container_quota_refusals_total", "17"),
    ] {
        assert!(t.contains(&format!("{fam}{l} {v}\n")), "{fam}: {t}");
    }
    assert!(
        t.contains("# TYPE hami_container_quota_refusals_total counter"),
        "{t}"
    );
    assert!(
        t.contains("# TYPE hami_container_compute_seconds_total counter"),
        "{t}"
    );
    assert!(
        t.contains("# TYPE hami_container_compute_share_percent gauge"),
        "{t}"
    );
    assert!(
        t.contains(r#"hami_container_compute_limit_percent{UUID="GPU-0a1b2c3d-0000-1111-2222-333344445555",container="side",cuda_device="1""#),
        "{t}"
    );
    assert!(
        !t.contains(r#"hami_container_compute_share_percent{UUID="GPU-0a1b2c3d-0000-1111-2222-333344445555",container="side""#),
        "no share without NVML's figure: {t}"
    );
    assert!(
        t.contains(r#"hami_gpu_utilization_percent{UUID="GPU-0a1b2c3d-0000-1111-2222-333344445555",gpu="0"} 97"#),
        "{t}"
    );
    assert!(
        t.contains(r#"hami_gpu_memory_total_bytes{UUID="GPU-0a1b2c3d-0000-1111-2222-333344445555",gpu="0"} 85899345920"#),
        "{t}"
    );
    assert!(t.contains(r#"hami_gpu_memory_used_bytes{UUID="GPU-0a1b2c3d-0000-1111-2222-333344445555",gpu="0"} 3221225472"#));
    assert!(t.contains(r#"hami_gpu_memory_total_bytes{UUID="GPU-1",gpu="1"} 1073741824"#));
    assert!(
        !t.contains(r#"hami_gpu_utilization_percent{UUID="GPU-1""#),
        "{t}"
    );
    assert!(
        !t.contains(r#"hami_gpu_memory_used_bytes{UUID="GPU-1""#),
        "{t}"
    );
    // The next scan sets the totals afresh (they live in the region), and a region
    // that left takes its series with it.
    let mut later = series("main", 0);
    later.compute_consumed_ns = 20_000_000_000;
    m.set_regions(&[later]);
    m.set_gpus(&[]);
    let t = m.render();
    assert!(
        t.contains(&format!("hami_container_compute_seconds_total{l} 20\n")),
        "{t}"
    );
    assert!(!t.contains("container=\"side\""), "{t}");
    assert!(!t.contains("hami_gpu_utilization_percent{"), "{t}");
    assert!(!t.contains("hami_gpu_memory_total_bytes{"), "{t}");
}

#[test]
fn per_process_series_are_opt_in_and_have_no_hooked_label() {
    let p = [
        ProcessSample {
            pid: 42,
            identity: ident("ml", "p", "c"),
            observed: 9,
            sm_util: Some(35),
        },
        ProcessSample {
            pid: 43,
            identity: ident("ml", "p", "c"),
            observed: 0,
            sm_util: None,
        },
    ];
    let off = Metrics::new(MetricsOptions::default()).unwrap();
    off.set_processes(&p);
    let t = off.render();
    assert!(!t.contains("hami_process_observed_bytes{"), "{t}");
    assert!(!t.contains("hami_process_sm_utilization_percent{"), "{t}");
    assert!(t.contains("hami_processes_tracked 2"));
    let on = Metrics::new(MetricsOptions {
        per_process: true,
        ..Default::default()
    })
    .unwrap();
    on.set_processes(&p);
    let t = on.render();
    assert!(
        t.contains(
            r#"hami_process_observed_bytes{container="c",namespace="ml",pid="42",pod="p"} 9"#
        ),
        "{t}"
    );
    assert!(
        t.contains(r#"hami_process_sm_utilization_percent{container="c",namespace="ml",pid="42",pod="p"} 35"#),
        "{t}"
    );
    assert!(
        !t.contains(r#"hami_process_sm_utilization_percent{container="c",namespace="ml",pid="43""#),
        "no figure, no series: {t}"
    );
    assert!(!t.contains("hooked="));
}

#[test]
fn processes_are_counted_by_hook_for_a_migration() {
    let m = Metrics::new(MetricsOptions::default()).unwrap();
    let t = m.render();
    for h in ["hami_rs", "hami_core", "none"] {
        assert!(
            t.contains(&format!("hami_processes_by_hook{{hook=\"{h}\"}} 0")),
            "{t}"
        );
    }
    assert!(t.contains("hami_processes_oversubscribe_refused 0"));
    m.set_hooks(HookCounts {
        hami_rs: 3,
        hami_core: 2,
        none: 1,
        oversubscribe: 1,
    });
    let t = m.render();
    assert!(
        t.contains(r#"hami_processes_by_hook{hook="hami_rs"} 3"#),
        "{t}"
    );
    assert!(t.contains(r#"hami_processes_by_hook{hook="hami_core"} 2"#));
    assert!(t.contains(r#"hami_processes_by_hook{hook="none"} 1"#));
    assert!(t.contains("hami_processes_oversubscribe_refused 1"));
    assert!(t.contains(r#"hami_findings_standing{kind="hami_core"} 0"#));
    assert!(t.contains(r#"hami_findings_standing{kind="unhooked"} 0"#));
}

#[test]
fn dashboard_uses_only_exported_metrics_and_labels() {
    let m = Metrics::new(MetricsOptions {
        per_process: true,
        hami_compat: true,
        ..Default::default()
    })
    .unwrap();
    let dash = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../dashboards/hami.json"),
    )
    .unwrap();
    let _: serde_json::Value = serde_json::from_str(&dash).unwrap();
    let exported = m.family_names();
    let mut used = Vec::new();
    let mut rest = dash.as_str();
    while let Some(i) = rest.find("hami_") {
        let tail = &rest[i..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        used.push(tail[..end].to_string());
        rest = &tail[end..];
    }
    used.retain(|n| n != "hami_");
    assert!(used.len() >= 10, "{used:?}");
    for n in &used {
        assert!(exported.contains(n), "dashboard uses unknown metric {n}");
    }
    // The label names of before dcgm-exporter's and HAMi's were adopted.
    for old in [
        "pod_namespace",
        "pod_name",
        "container_name",
        "gpu_uuid",
        "nvml_index",
    ] {
        assert!(!dash.contains(old), "dashboard uses the old label {old}");
    }
    assert!(
        !dash.contains("hami_findings{"),
        "dashboard uses the old gauge name"
    );
}
