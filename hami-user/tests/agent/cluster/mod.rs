//! On a cluster: the real agent scraped by a real Prometheus (Debian's package) the way the
//! chart's ServiceMonitor scrapes it, next to a dcgm-exporter-shaped target, with the chart's
//! rules loaded: the dashboard's every query, the join with dcgm-exporter, the alerts' labels,
//! `promtool`, an OpenMetrics model parser, the rules' unit tests, and the Helm chart rendered
//! and validated.
//!
//! The tools come from `cargo xtask setup`: `prometheus` and `promtool` on PATH (apt), and
//! `<root>/.tools/venv` with `prometheus-client`, `kubernetes-validate` and `helm-python-sdk`
//! (PyPI). Without them these tests fail and say which is missing; they never skip. The
//! scrape test needs root (eBPF), like the other agent tests.

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use hami_test_harness::{workspace_root, AgentCommand, Artifacts, RunningProbe, TestEnv};

use crate::common::{require_root, AGENT};

mod chart;
mod fixtures;
mod hami_queries;
mod helm;
mod prometheus;

use fixtures::{free_port, http_get, label_of, sample, tool, venv_python, PodCgroup, CID};
use helm::{helm_bin, helm_template, rendered_kinds};
use prometheus::{
    assert_every_dashboard_query_has_data, assert_exposition_is_valid, bypass_alert, prom_query,
    serve_exposition, settled, start_prometheus,
};

#[test]
fn prometheus_scrapes_the_agent_like_a_servicemonitor_and_every_dashboard_query_has_data() {
    require_root();
    let _g = hami_test_harness::serial();
    let prometheus = tool("prometheus");
    let promtool = tool("promtool");
    let python = venv_python();
    let a = Artifacts::get();
    // A one-GPU container with a global limit (the limit applies to every device index),
    // and a compute share (the arbiter's panel: its grant, lent time and priority).
    let env = TestEnv::new()
        .preload(true)
        .env("FAKE_CUDA_DEVICE_COUNT", "1")
        .env("CUDA_DEVICE_MEMORY_LIMIT", "1g")
        .env("CUDA_DEVICE_SM_LIMIT", "50");
    // What the kubelet writes on every node: the container's log link names it.
    let logs = env.dir().join("var-log");
    std::fs::create_dir_all(logs.join("containers")).unwrap();
    std::fs::write(
        logs.join(format!("containers/trainer-0_ml-team_cuda-main-{CID}.log")),
        "",
    )
    .unwrap();
    let cg = PodCgroup::create();

    let agent_port = free_port();
    let agent_addr: SocketAddr = format!("127.0.0.1:{agent_port}").parse().unwrap();
    let agent = AgentCommand::new(AGENT)
        .args(["run", "--metrics-addr", &format!("127.0.0.1:{agent_port}")])
        .args([
            "--per-process-metrics",
            "--hami-compat",
            "--interval",
            "200",
        ])
        .arg("--kubelet-log-dir")
        .arg(&logs)
        .fake_driver(&env)
        .env("FAKE_CUDA_DEVICE_COUNT", "1")
        // What the chart passes from the pod's spec.nodeName (the downward API).
        .env("NODE_NAME", "gpu-node-1")
        .start();

    // A hooked workload in the pod's cgroup: context + 256 MiB under a 1 GiB limit.
    let mut sh = env.command(Path::new("/bin/sh"));
    sh.arg("-c")
        .arg(r#"echo $$ > "$0" && exec "$@""#)
        .arg(cg.procs())
        .arg(&a.cudaprobe)
        .args(["init", "ctx", "alloc", "256M", "wait"]);
    sh.stdin(Stdio::piped());
    let mut probe = RunningProbe::start(sh);
    probe.wait_for("wait");
    // And a process of the same pod without the preload: a standing bypass.
    let mut raw = env.command(Path::new("/bin/sh"));
    raw.env_remove("LD_PRELOAD")
        .arg("-c")
        .arg(r#"echo $$ > "$0" && exec "$@""#)
        .arg(cg.procs())
        .arg(&a.cudaprobe)
        .args(["init", "ctx", "alloc", "64M", "wait"]);
    raw.stdin(Stdio::piped());
    let mut bypass = RunningProbe::start(raw);
    bypass.wait_for("wait");

    // The GPU as the agent's NVML names it, and the agent's own `node` label.
    let t0 = Instant::now();
    let (uuid, gpu_total) = loop {
        let (_, t) = http_get(agent_addr, "/metrics").unwrap();
        if let Some((l, v)) = sample(&t, "hami_gpu_memory_total_bytes", &[]) {
            assert!(l.contains(r#"node="gpu-node-1""#), "{l}");
            break (label_of(l, "UUID").unwrap().to_string(), v);
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "no GPU memory series:\n{t}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(
        uuid.starts_with("GPU-") && gpu_total > 0.0,
        "{uuid} {gpu_total}"
    );
    // HAMi's host GPU family from the same NVML (--hami-compat): the GPU's UUID, its NVML
    // name as HAMi's device_type, HAMi 2.10's node label and HAMi's zone.
    let (_, t) = http_get(agent_addr, "/metrics").unwrap();
    let (l, used) = sample(
        &t,
        "hami_host_gpu_memory_used_bytes",
        &[&format!(r#"device_uuid="{uuid}""#)],
    )
    .unwrap_or_else(|| panic!("no HAMi host GPU series:\n{t}"));
    for want in [
        r#"device_index="0""#,
        r#"device_type="NVIDIA-"#,
        r#"node="gpu-node-1""#,
        r#"zone="vGPU""#,
    ] {
        assert!(l.contains(want), "{want}: {l}");
    }
    // The same NVML figure as the agent's own family, in the same scrape.
    let ours = sample(
        &t,
        "hami_gpu_memory_used_bytes",
        &[&format!(r#"UUID="{uuid}""#)],
    );
    assert_eq!(ours.map(|(_, v)| v), Some(used), "{t}");
    // dcgm-exporter's framebuffer family for that GPU (MiB), as it labels it.
    const DCGM_USED_MIB: u64 = 2048;
    let dcgm = serve_exposition(format!(
        "# HELP DCGM_FI_DEV_FB_USED Framebuffer memory used (in MiB).\n\
         # TYPE DCGM_FI_DEV_FB_USED gauge\n\
         DCGM_FI_DEV_FB_USED{{gpu=\"0\",UUID=\"{uuid}\",device=\"nvidia0\",modelName=\"NVIDIA H200\",Hostname=\"node1\"}} {DCGM_USED_MIB}\n"
    ));

    // Prometheus with the chart's rules, scraping the agent like the chart's ServiceMonitor
    // (honor_labels: true, the target labels a Kubernetes endpoint gets, `node` by the
    // ServiceMonitor's relabelling) and dcgm-exporter like its own ServiceMonitor does
    // (honor_labels: false).
    let (prom_addr, _prom) = start_prometheus(&prometheus, env.dir(), agent_port, dcgm);

    // Every dashboard query returns data once a few scrapes are in.
    assert_every_dashboard_query_has_data(prom_addr);

    // The workload's names survived the scrape in the labels dcgm-exporter and HAMi use
    // (the agent's win over the target's, honor_labels), with the node and the GPU's UUID;
    // nothing was moved aside as exported_*.
    let r = prom_query(
        prom_addr,
        &format!(
            r#"hami_container_limit_bytes{{namespace="ml-team",pod="trainer-0",container="cuda-main",node="gpu-node-1",cuda_device="0",UUID="{uuid}",job="hami-system/hami-agent"}}"#
        ),
    );
    assert_eq!(r.len(), 1, "{r:?}");
    assert_eq!(r[0]["value"][1], "1073741824");
    let moved = prom_query(
        prom_addr,
        r#"{__name__=~"hami_.*", exported_namespace=~".+"} or {__name__=~"hami_.*", exported_pod=~".+"} or {__name__=~"hami_.*", exported_node=~".+"}"#,
    );
    assert!(moved.is_empty(), "labels moved aside: {moved:?}");
    // The agent's own series (no workload) carry the target's labels, and its node.
    let own = prom_query(
        prom_addr,
        r#"hami_agent_build_info{namespace="hami-system",pod="hami-agent-x7k2p",node="gpu-node-1"}"#,
    );
    assert_eq!(own.len(), 1, "{own:?}");
    // One region on one GPU: one series per family, not one per possible device index.
    let devs = prom_query(prom_addr, r#"hami_container_limit_bytes{pod="trainer-0"}"#);
    assert_eq!(devs.len(), 1, "{devs:?}");
    // The bypass stands with its pod's names and reason, in Prometheus as on /metrics.
    let f = prom_query(
        prom_addr,
        r#"hami_finding{kind="bypass",reason="no_preload",namespace="ml-team",pod="trainer-0",container="cuda-main",node="gpu-node-1"} == 1"#,
    );
    assert_eq!(f.len(), 1, "{f:?}");
    // The alert on it (pending: `for: 1m`) names the node and the pod, and its runbook.
    let alert = bypass_alert(prom_addr, "trainer-0");
    assert_eq!(alert["labels"]["node"], "gpu-node-1", "{alert:#}");
    assert_eq!(alert["labels"]["namespace"], "ml-team", "{alert:#}");
    let summary = alert["annotations"]["summary"].as_str().unwrap_or("");
    assert!(
        summary.contains("ml-team/trainer-0") && summary.contains("node gpu-node-1"),
        "{alert:#}"
    );
    assert!(
        !summary.contains("127.0.0.1"),
        "names the agent's address: {summary}"
    );
    assert_eq!(
        alert["annotations"]["runbook_url"], "docs/runbooks.md#hamigpumemorybypass",
        "{alert:#}"
    );

    // The join with dcgm-exporter by UUID: what dcgm-exporter says is used on the GPU less
    // what the containers' regions account there, labelled with the agent's node. (Other
    // workloads on this machine may use the fake GPU too: each rule is compared with its
    // definition computed from the raw series at the same moment, until both agree.)
    let sel = format!(r#"{{node="gpu-node-1",UUID="{uuid}"}}"#);
    let mine = format!(r#"{{UUID="{uuid}"}}"#);
    let (unattributed, want) = settled(
        prom_addr,
        &format!("hami:gpu_memory_unattributed_bytes:dcgm{sel}"),
        &format!("{DCGM_USED_MIB} * 1048576 - sum(hami_container_accounted_bytes{mine})"),
    );
    assert_eq!(
        unattributed, want,
        "{DCGM_USED_MIB} MiB less the containers'"
    );
    // This pod's container alone accounts its context and 256 MiB.
    let unattributed = unattributed.unwrap();
    assert!(
        unattributed <= ((DCGM_USED_MIB - 256) << 20) as f64,
        "{unattributed}"
    );
    let joined = prom_query(
        prom_addr,
        &format!("hami:gpu_memory_unattributed_bytes:dcgm{sel}"),
    );
    assert_eq!(joined.len(), 1, "{joined:?}");
    let (used, want) = settled(
        prom_addr,
        &format!("hami:container_memory_used_bytes:by_gpu{sel}"),
        &format!("sum(hami_container_accounted_bytes{mine})"),
    );
    assert_eq!(used, want);
    assert!(used.unwrap() >= (256u64 << 20) as f64, "{used:?}");
    let (allocated, want) = settled(
        prom_addr,
        &format!("hami:container_memory_limit_bytes:by_gpu{sel}"),
        &format!("sum(hami_container_limit_bytes{mine})"),
    );
    assert_eq!(allocated, want);
    assert!(allocated.unwrap() >= (1u64 << 30) as f64, "{allocated:?}");
    let (dcgm_used, _) = settled(
        prom_addr,
        &format!("hami:gpu_memory_used_bytes:dcgm{sel}"),
        &format!("vector({DCGM_USED_MIB} * 1048576)"),
    );
    assert_eq!(dcgm_used, Some((DCGM_USED_MIB << 20) as f64));
    // HAMi's families keep HAMi's labels, not moved aside (honor_labels); they carry no
    // `node` of their own (their `node` is the target's).
    let h = prom_query(
        prom_addr,
        r#"hami_vgpu_memory_used_bytes{namespace="ml-team",pod="trainer-0",container="cuda-main",vdevice_index="0"} > 256 * 1024 * 1024"#,
    );
    assert_eq!(h.len(), 1, "{h:?}");
    assert_eq!(
        prom_query(
            prom_addr,
            r#"vGPU_device_memory_limit_in_bytes{podnamespace="ml-team",podname="trainer-0",ctrname="cuda-main",vdeviceid="0"}"#
        )
        .len(),
        1
    );
    // Its compute share (idle here: 0 %, but measured), in the agent's family and in HAMi's.
    let share = prom_query(
        prom_addr,
        r#"hami_container_compute_share_percent{namespace="ml-team",pod="trainer-0",container="cuda-main",cuda_device="0"}"#,
    );
    assert_eq!(share.len(), 1, "{share:?}");
    assert_eq!(
        prom_query(
            prom_addr,
            r#"Device_utilization_desc_of_container{podnamespace="ml-team",podname="trainer-0",ctrname="cuda-main",vdeviceid="0"}"#
        )
        .len(),
        1
    );

    // HAMi's breakdown families: the 256 MiB are the container's buffer, its context is
    // context, and the total (HAMi 2.10, the default: without the parts as labels; the older
    // name keeps them).
    let b = prom_query(
        prom_addr,
        r#"hami_vgpu_memory_buffer_bytes{pod="trainer-0",vdevice_index="0"} == 256 * 1024 * 1024"#,
    );
    assert_eq!(b.len(), 1, "{b:?}");
    let c = prom_query(
        prom_addr,
        r#"hami_vgpu_memory_context_bytes{pod="trainer-0"} > 0"#,
    );
    assert_eq!(c.len(), 1, "{c:?}");
    let d = prom_query(
        prom_addr,
        r#"hami_container_device_memory_bytes{pod="trainer-0",vdevice_index="0"} > 256 * 1024 * 1024"#,
    );
    assert_eq!(d.len(), 1, "{d:?}");
    let parts = prom_query(
        prom_addr,
        r#"hami_container_device_memory_bytes{buffer_size!=""}"#,
    );
    assert!(parts.is_empty(), "2.10 has no breakdown labels: {parts:?}");
    let legacy = prom_query(
        prom_addr,
        r#"Device_memory_desc_of_container{podname="trainer-0",data="268435456"}"#,
    );
    assert_eq!(legacy.len(), 1, "{legacy:?}");
    // The hooked workload counts under hami_rs.
    let hooks = prom_query(prom_addr, r#"hami_processes_by_hook{hook="hami_rs"} >= 1"#);
    assert_eq!(hooks.len(), 1, "{hooks:?}");

    // The exposition itself: promtool's linter and an OpenMetrics-model parser.
    let (st, text) = http_get(agent_addr, "/metrics").unwrap();
    assert_eq!(st, 200);
    assert_exposition_is_valid(&promtool, &python, env.dir(), &text);
    let (st, _) = http_get(agent_addr, "/healthz").unwrap();
    assert_eq!(st, 200);

    // The last process exits: its region's series leave /metrics within one scan.
    let region = env.region_path().display().to_string();
    assert!(text.contains(&format!("region=\"{region}\"")), "{text}");
    // (The unhooked process names the region in its environment: it goes first.)
    bypass.resume();
    let _ = bypass.finish();
    probe.resume();
    let _ = probe.finish();
    let t0 = Instant::now();
    let gone = loop {
        let (_, t) = http_get(agent_addr, "/metrics").unwrap();
        if !t.contains(&format!("region=\"{region}\"")) {
            break t0.elapsed();
        }
        assert!(
            t0.elapsed() < Duration::from_secs(3),
            "region still exported 3 s after its last process exited:\n{t}"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    // One scan is 200 ms here; allow the exit to be noticed and one more tick.
    assert!(gone < Duration::from_millis(600), "took {gone:?}");
    // Counted as released (other agents' workloads on this machine may add to it).
    let (_, t) = http_get(agent_addr, "/metrics").unwrap();
    let released = sample(&t, "hami_regions_released_total", &[r#"node="gpu-node-1""#])
        .map_or(0.0, |(_, v)| v);
    assert!(released >= 1.0, "{t}");
    agent.stop();
}

#[test]
fn alert_rules_pass_their_promtool_tests() {
    let promtool = tool("promtool");
    let root = workspace_root();
    let rules = root.join("deploy/helm/hami-agent/files/hami-agent.rules.yml");
    let out = Command::new(&promtool)
        .args(["check", "rules"])
        .arg(&rules)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let tests = root.join("deploy/rules/hami-agent.rules.test.yml");
    let out = Command::new(&promtool)
        .args(["test", "rules"])
        .arg(&tests)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "promtool test rules:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // Every alert has a case that fires and one that does not.
    let rules_text = std::fs::read_to_string(&rules).unwrap();
    let tests_text = std::fs::read_to_string(&tests).unwrap();
    let alerts: Vec<&str> = rules_text
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- alert: "))
        .collect();
    assert_eq!(alerts.len(), 10, "{alerts:?}");
    // Every alert links its runbook: a section of docs/runbooks.md that exists (GitHub's
    // anchors: the heading lowercased).
    let runbooks = std::fs::read_to_string(root.join("docs/runbooks.md")).unwrap();
    let anchors: Vec<String> = runbooks
        .lines()
        .filter_map(|l| l.strip_prefix("## "))
        .map(|h| h.trim().to_lowercase())
        .collect();
    let urls: Vec<&str> = rules_text
        .lines()
        .filter_map(|l| l.trim().strip_prefix("runbook_url: "))
        .map(|u| u.trim_matches('"'))
        .collect();
    assert_eq!(urls.len(), alerts.len(), "{urls:?}");
    for (a, u) in alerts.iter().zip(&urls) {
        assert_eq!(
            *u,
            format!("docs/runbooks.md#{}", a.to_lowercase()),
            "{a}: runbook_url"
        );
        assert!(
            anchors.contains(&a.to_lowercase()),
            "docs/runbooks.md has no section {a}"
        );
    }
    // The recording rules, each with its promtool case.
    let records: Vec<&str> = rules_text
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- record: "))
        .collect();
    assert_eq!(records.len(), 4, "{records:?}");
    for r in records {
        assert!(
            tests_text.contains(&format!("- expr: {r}\n")),
            "{r}: no promql_expr_test"
        );
    }
    for a in alerts {
        let cases: Vec<&str> = tests_text
            .split("- eval_time:")
            .filter(|c| c.contains(&format!("alertname: {a}\n")))
            .collect();
        assert!(
            cases.iter().any(|c| c.contains("exp_alerts: []")),
            "{a}: no case where it stays silent"
        );
        assert!(
            cases.iter().any(|c| c.contains("exp_labels:")),
            "{a}: no case where it fires"
        );
    }
}

/// The agent recognises hami-preload installed as HAMi's `libvgpu.so` by this symbol: the
/// real library must export it (docs/deploy.md).
#[test]
fn the_preload_exports_the_marker_the_agent_looks_for() {
    let a = Artifacts::get();
    let found =
        hami_user::probes::discovery::elf_defined_symbols(&a.preload_so, &["hami_preload_marker"]);
    assert_eq!(
        found.as_deref(),
        Some(&["hami_preload_marker".to_string()][..]),
        "{}",
        a.preload_so.display()
    );
}
