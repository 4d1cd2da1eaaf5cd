use super::*;
use crate::identity::Identity;

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
fn hami_compat_families_use_hamis_names_and_labels() {
    let off = Metrics::new(MetricsOptions::default()).unwrap();
    off.set_regions(&[series("main", 1)]);
    assert!(!off.render().contains("vgpu"));
    let m = Metrics::new(MetricsOptions {
        hami_compat: true,
        node: "gpu-node-1".into(),
        ..Default::default()
    })
    .unwrap();
    m.set_regions(&[series("main", 1)]);
    let t = m.render();
    // HAMi's families carry HAMi's labels and its `zone` (no agent `node`); the agent's
    // carry `node` and no `zone`.
    for l in t.lines().filter(|l| !l.starts_with('#')) {
        let hamis = [
            "hami_vgpu_",
            "vGPU_",
            "Device_",
            "hami_container_device_",
            "hami_host_gpu_",
            "Host",
        ]
        .iter()
        .any(|p| l.starts_with(p));
        assert_eq!(!hamis, l.contains(r#"node="gpu-node-1""#), "{l}");
        assert_eq!(hamis, l.contains(r#"zone="vGPU""#), "{l}");
    }
    let u = "GPU-0a1b2c3d-0000-1111-2222-333344445555";
    let h = format!(
        r#"container="main",device_uuid="{u}",namespace="ml",pod="trainer-0",vdevice_index="1",zone="vGPU""#
    );
    let legacy = format!(
        r#"ctrname="main",deviceuuid="{u}",podname="trainer-0",podnamespace="ml",vdeviceid="1",zone="vGPU""#
    );
    assert!(
        t.contains(&format!("hami_vgpu_memory_used_bytes{{{h}}} 50\n")),
        "{t}"
    );
    assert!(t.contains(&format!("hami_vgpu_memory_limit_bytes{{{h}}} 100\n")));
    assert!(t.contains(&format!(
        "vGPU_device_memory_usage_in_bytes{{{legacy}}} 50\n"
    )));
    assert!(t.contains(&format!(
        "vGPU_device_memory_limit_in_bytes{{{legacy}}} 100\n"
    )));
    // The container's SM utilisation under HAMi's names, only where measured.
    assert!(!t.contains("Device_utilization_desc_of_container{"), "{t}");
    assert!(
        !t.contains("hami_container_device_utilization_ratio{"),
        "{t}"
    );
    let mut busy = series("main", 1);
    busy.compute_share = Some(37.5);
    m.set_regions(&[busy]);
    let t = m.render();
    assert!(
        t.contains(&format!(
            "hami_container_device_utilization_ratio{{{h}}} 37.5\n"
        )),
        "{t}"
    );
    assert!(t.contains(&format!(
        "Device_utilization_desc_of_container{{{legacy}}} 37.5\n"
    )));
    assert!(t.contains("# TYPE hami_container_device_utilization_ratio gauge"));
    m.set_regions(&[]);
    let t = m.render();
    assert!(!t.contains("vGPU_device_memory_usage_in_bytes{"));
    assert!(!t.contains("hami_container_device_utilization_ratio{"));
}

/// GPUs as NVML gives them, for the host GPU families.
fn gpus() -> Vec<GpuSeries> {
    vec![
        GpuSeries {
            index: 0,
            uuid: "GPU-0a1b2c3d-0000-1111-2222-333344445555".into(),
            utilization: Some(97),
            memory_total: Some(80 << 30),
            memory_used: Some(3 << 30),
            name: Some("NVIDIA H200".into()),
            memory_utilization: Some(41),
        },
        // Without a name HAMi's monitor serves no host family for the device.
        GpuSeries {
            index: 1,
            uuid: "GPU-1".into(),
            utilization: Some(5),
            memory_total: Some(1 << 30),
            memory_used: Some(1 << 20),
            name: None,
            memory_utilization: Some(1),
        },
        // Memory figures but no utilisation.
        GpuSeries {
            index: 2,
            uuid: "GPU-2".into(),
            utilization: None,
            memory_total: Some(1 << 30),
            memory_used: Some(2 << 20),
            name: Some("NVIDIA H200".into()),
            memory_utilization: None,
        },
    ]
}

#[test]
fn hami_host_gpu_families_follow_nvml_per_version() {
    let u = "GPU-0a1b2c3d-0000-1111-2222-333344445555";
    for v in HamiVersion::ALL {
        let m = Metrics::new(MetricsOptions {
            hami_compat: true,
            hami_version: v,
            node: "gpu-node-1".into(),
            ..Default::default()
        })
        .unwrap();
        m.set_gpus(&gpus());
        let t = m.render();
        let (node, nodeid) = match v {
            HamiVersion::V2_9 => ("", ""),
            HamiVersion::V2_10 => (r#",node="gpu-node-1""#, r#",nodeid="gpu-node-1""#),
        };
        let dev = format!(r#"device_index="0",device_type="NVIDIA-NVIDIA H200",device_uuid="{u}""#);
        let legacy = format!(r#"deviceidx="0",devicetype="NVIDIA-NVIDIA H200",deviceuuid="{u}""#);
        for want in [
            format!(r#"hami_host_gpu_memory_used_bytes{{{dev}{node},zone="vGPU"}} 3221225472"#),
            format!(r#"hami_host_gpu_utilization_ratio{{{dev}{node},zone="vGPU"}} 97"#),
            format!(r#"HostGPUMemoryUsage{{{legacy}{nodeid},zone="vGPU"}} 3221225472"#),
            format!(r#"HostCoreUtilization{{{legacy}{nodeid},zone="vGPU"}} 97"#),
            format!(
                r#"hami_host_gpu_memory_used_bytes{{device_index="2",device_type="NVIDIA-NVIDIA H200",device_uuid="GPU-2"{node},zone="vGPU"}} 2097152"#
            ),
        ] {
            assert!(t.contains(&format!("{want}\n")), "{v}: {want}\n{t}");
        }
        let ctrl = format!(
            "hami_host_gpu_memory_controller_utilization_ratio{{{dev},zone=\"vGPU\"}} 41\n"
        );
        assert_eq!(t.contains(&ctrl), v == HamiVersion::V2_10, "{v}: {t}");
        // No name: no host family; no utilisation: no utilisation series.
        assert!(!t.contains(r#"device_uuid="GPU-1""#), "{t}");
        assert!(!t.contains(r#"deviceuuid="GPU-1""#), "{t}");
        assert!(
            !t.contains(r#"hami_host_gpu_utilization_ratio{device_index="2""#),
            "{t}"
        );
        // The agent's own per-GPU families are unchanged.
        assert!(
            t.contains(
                r#"hami_gpu_memory_used_bytes{UUID="GPU-1",gpu="1",node="gpu-node-1"} 1048576"#
            ),
            "{t}"
        );
        m.set_gpus(&[]);
        assert!(!m.render().contains("hami_host_gpu_"), "{v}");
    }
    // Without --hami-compat: none of them.
    let off = Metrics::new(MetricsOptions::default()).unwrap();
    off.set_gpus(&gpus());
    let t = off.render();
    assert!(
        !t.contains("hami_host_gpu_") && !t.contains("HostGPU"),
        "{t}"
    );
}

#[test]
fn hami_families_move_to_their_own_port_when_asked() {
    let m = Metrics::new(MetricsOptions {
        hami_compat: true,
        hami_separate: true,
        node: "gpu-node-1".into(),
        ..Default::default()
    })
    .unwrap();
    let mut s = series("main", 0);
    s.compute_share = Some(3.0);
    m.set_regions(&[s]);
    m.set_gpus(&gpus());
    let agent = m.render();
    let hami = m.render_hami();
    assert!(agent.contains("hami_container_limit_bytes{"), "{agent}");
    assert!(agent.contains("hami_gpu_memory_used_bytes{"), "{agent}");
    for fam in hami_compat::families(HamiVersion::default()) {
        assert!(
            !agent.contains(&format!("\n{fam}{{")),
            "{fam} on both:\n{agent}"
        );
        assert!(
            hami.contains(&format!("# TYPE {fam} gauge")),
            "{fam}:\n{hami}"
        );
    }
    // Only HAMi's, each with its zone.
    for l in hami.lines().filter(|l| !l.starts_with('#')) {
        assert!(l.contains(r#"zone="vGPU""#), "{l}");
        assert!(
            !l.starts_with("hami_container_limit") && !l.starts_with("process_"),
            "{l}"
        );
    }
    // Not separate: one exposition with both.
    let one = Metrics::new(MetricsOptions {
        hami_compat: true,
        ..Default::default()
    })
    .unwrap();
    one.set_regions(&[series("main", 0)]);
    assert!(one.render().contains("hami_vgpu_memory_used_bytes{"));
    assert!(Metrics::new(MetricsOptions::default())
        .unwrap()
        .render_hami()
        .is_empty());
}

/// The label sets of a family in the exposition (sorted label names per sample).
fn label_names(text: &str, family: &str) -> Vec<Vec<String>> {
    text.lines()
        .filter_map(|l| l.strip_prefix(family)?.strip_prefix('{'))
        .map(|rest| {
            let inner = &rest[..rest.rfind('}').unwrap()];
            let mut v: Vec<String> = inner
                .split("\",")
                .map(|kv| kv.split('=').next().unwrap().to_string())
                .collect();
            v.sort();
            v
        })
        .collect()
}

/// Every family HAMi's vGPU monitor serves, with its labels, as its source has them
/// (`cmd/vGPUmonitor/metrics.go` and `main.go` of v2.9.0 and v2.10.0: `zone="vGPU"` on
/// every one; the older names with `--legacy-metrics`, as in v2.4.0-v2.8.x). Each one the
/// agent serves is served with exactly those labels, in the version chosen; the ones it
/// does not serve are named (HAMi-core's kernel records, the scheduler's MIG annotations).
#[test]
fn hami_compat_matches_hamis_monitor_families_and_labels() {
    const CTR: [&str; 5] = [
        "namespace",
        "pod",
        "container",
        "vdevice_index",
        "device_uuid",
    ];
    const LEGACY: [&str; 5] = [
        "podnamespace",
        "podname",
        "ctrname",
        "vdeviceid",
        "deviceuuid",
    ];
    const HOST: [&str; 3] = ["device_index", "device_uuid", "device_type"];
    const LEGACY_HOST: [&str; 3] = ["deviceidx", "deviceuuid", "devicetype"];
    let monitor = |v: HamiVersion| -> Vec<(&str, Vec<&str>)> {
        let v10 = v == HamiVersion::V2_10;
        let host = if v10 {
            [&["node"][..], &HOST].concat()
        } else {
            HOST.to_vec()
        };
        let legacy_host = if v10 {
            [&["nodeid"][..], &LEGACY_HOST].concat()
        } else {
            LEGACY_HOST.to_vec()
        };
        let desc = if v10 {
            CTR.to_vec()
        } else {
            [
                &CTR[..],
                &["context_size", "module_size", "buffer_size", "offset"],
            ]
            .concat()
        };
        let mut f = vec![
            ("hami_host_gpu_memory_used_bytes", host.clone()),
            ("hami_host_gpu_utilization_ratio", host),
            ("hami_vgpu_memory_used_bytes", CTR.to_vec()),
            ("hami_vgpu_memory_limit_bytes", CTR.to_vec()),
            ("hami_container_device_memory_bytes", desc),
            ("hami_container_device_utilization_ratio", CTR.to_vec()),
            ("hami_vgpu_memory_context_bytes", CTR.to_vec()),
            ("hami_vgpu_memory_module_bytes", CTR.to_vec()),
            ("hami_vgpu_memory_buffer_bytes", CTR.to_vec()),
            ("HostGPUMemoryUsage", legacy_host.clone()),
            ("HostCoreUtilization", legacy_host),
            ("vGPU_device_memory_usage_in_bytes", LEGACY.to_vec()),
            ("vGPU_device_memory_limit_in_bytes", LEGACY.to_vec()),
            (
                "Device_memory_desc_of_container",
                [&LEGACY[..], &["context", "module", "data", "offset"]].concat(),
            ),
            ("Device_utilization_desc_of_container", LEGACY.to_vec()),
        ];
        if v10 {
            f.push((
                "hami_host_gpu_memory_controller_utilization_ratio",
                HOST.to_vec(),
            ));
        }
        f
    };
    // Served by HAMi's monitor from what only HAMi-core or the scheduler records.
    let not_served = [
        "hami_container_last_kernel_elapsed_seconds",
        "hami_mig_device_info",
        "Device_last_kernel_of_container",
        "MigInfo",
    ];
    for v in HamiVersion::ALL {
        let m = Metrics::new(MetricsOptions {
            hami_compat: true,
            hami_version: v,
            node: "gpu-node-1".into(),
            ..Default::default()
        })
        .unwrap();
        let mut s = series("main", 0);
        s.accounted = 60;
        s.compute_share = Some(12.0);
        m.set_regions(&[s]);
        m.set_gpus(&gpus()[..1]);
        let t = m.render();
        let hami = monitor(v);
        for (fam, labels) in &hami {
            let mut want: Vec<String> = labels.iter().map(|l| l.to_string()).collect();
            want.push("zone".into());
            want.sort();
            assert_eq!(label_names(&t, fam), vec![want], "{v} {fam}:\n{t}");
            assert!(m.family_names().contains(&fam.to_string()), "{v} {fam}");
        }
        // Nothing beyond them is served as HAMi's.
        let mut ours = hami_compat::families(v);
        ours.sort();
        let mut theirs: Vec<&str> = hami.iter().map(|(f, _)| *f).collect();
        theirs.sort();
        assert_eq!(ours, theirs, "{v}");
        for fam in not_served {
            assert!(!t.contains(fam), "{v} {fam}");
        }
        let u = "GPU-0a1b2c3d-0000-1111-2222-333344445555";
        let h = format!(
            r#"container="main",device_uuid="{u}",namespace="ml",pod="trainer-0",vdevice_index="0""#
        );
        assert!(
            t.contains(&format!(
                "hami_vgpu_memory_context_bytes{{{h},zone=\"vGPU\"}} 6\n"
            )),
            "{t}"
        );
        assert!(t.contains(&format!(
            "hami_vgpu_memory_module_bytes{{{h},zone=\"vGPU\"}} 3\n"
        )));
        assert!(t.contains(&format!(
            "hami_vgpu_memory_buffer_bytes{{{h},zone=\"vGPU\"}} 40\n"
        )));
        // HAMi's offset: the total less the three parts (60 - 6 - 3 - 40).
        let desc = match v {
            HamiVersion::V2_9 => format!(
                r#"hami_container_device_memory_bytes{{buffer_size="40",container="main",context_size="6",device_uuid="{u}",module_size="3",namespace="ml",offset="11",pod="trainer-0",vdevice_index="0",zone="vGPU"}} 60"#
            ),
            HamiVersion::V2_10 => {
                format!("hami_container_device_memory_bytes{{{h},zone=\"vGPU\"}} 60")
            }
        };
        assert!(t.contains(&format!("{desc}\n")), "{v}: {t}");
        assert!(
            t.contains(r#"Device_memory_desc_of_container{context="6",ctrname="main",data="40","#)
        );
        // Gone with the region.
        m.set_regions(&[]);
        assert!(!m.render().contains("hami_vgpu_memory_buffer_bytes{"));
    }
    // Off: none of them.
    let off = Metrics::new(MetricsOptions::default()).unwrap();
    off.set_regions(&[series("main", 0)]);
    off.set_gpus(&gpus());
    let t = off.render();
    for (fam, _) in &monitor(HamiVersion::V2_10) {
        assert!(!t.contains(&format!("{fam}{{")), "{fam}");
    }
    assert!(!t.contains("zone="), "{t}");
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
