//! The HAMi-compatible families: HAMi's names and labels, per HAMi version, their own port,
//! and a match against HAMi's own monitor.

use super::*;

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
