//! HAMi's own dashboards and HAMi-WebUI against the agent's HAMi families, in place of HAMi's
//! vGPU monitor: every query of HAMi 2.10's Grafana dashboard and every NVIDIA query
//! HAMi-WebUI's exporter sends upstream (`tests/data/hami-queries.json`, extracted verbatim
//! with provenance) is evaluated by Prometheus's own engine (`promtool test rules`) over the
//! series the agent serves, scraped over HTTP from both its ports and parsed with
//! `prometheus_client`'s parser, as a Prometheus stores them. Each must return data, and the
//! container and GPU queries the expected values. The scheduler's families (HAMi's scheduler
//! keeps serving them; the agent does not replace it) are added as HAMi's scheduler labels
//! them, so that the joins between the two are checked too. No root needed.

use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use hami_test_harness::workspace_root;
use hami_user::http::{serve_exposition, Exposition, Health};
use hami_user::identity::Identity;
use hami_user::metrics::{GpuSeries, HamiVersion, Metrics, MetricsOptions, RegionSeries};
use serde_json::{json, Value};

use super::fixtures::{http_get, tool, venv_python};
use super::prometheus::assert_exposition_is_valid;

const NODE: &str = "gpu-node-1";
const NAMESPACE: &str = "ml-team";
const POD: &str = "trainer-0";
const CONTAINER: &str = "cuda-main";
const UUID: &str = "GPU-5c0ffee0-1111-2222-3333-444455556666";
/// The container's measured SM utilisation (percent).
const SHARE: f64 = 37.5;
/// What its region accounts on the GPU.
const ACCOUNTED: u64 = 300 << 20;
/// Memory NVML reports used on the GPU.
const GPU_USED: u64 = 2 << 30;
/// NVML's utilisation of the GPU.
const GPU_UTIL: u32 = 80;

/// One scan's worth of what the agent knows: a hami-preload container on GPU 0, and GPU 0
/// as NVML reports it.
fn scan(m: &Metrics) {
    m.set_regions(&[RegionSeries {
        identity: Identity {
            namespace: NAMESPACE.into(),
            pod: POD.into(),
            container: CONTAINER.into(),
            ..Identity::default()
        },
        region: "/usr/local/vgpu/containers/x_cuda-main/cache".into(),
        device: 0,
        uuid: UUID.into(),
        limit: 1 << 30,
        accounted: ACCOUNTED,
        accounted_data: 256 << 20,
        context: 40 << 20,
        module: 4 << 20,
        buffer: 256 << 20,
        compute_share: Some(SHARE),
        ..RegionSeries::default()
    }]);
    m.set_gpus(&[GpuSeries {
        index: 0,
        uuid: UUID.into(),
        utilization: Some(GPU_UTIL),
        memory_total: Some(80 << 30),
        memory_used: Some(GPU_USED),
        name: Some("NVIDIA H200".into()),
        memory_utilization: Some(20),
    }]);
}

/// Serves `m` on two loopback ports as `hami-agent run --hami-metrics-addr` does, and
/// scrapes both: (the agent's `/metrics`, the HAMi port's `/metrics`).
fn scrape(m: Metrics) -> (String, String) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let m = Arc::new(m);
    let health = Arc::new(Health::new());
    let mut addrs: Vec<SocketAddr> = Vec::new();
    for exposition in [Exposition::Agent, Exposition::Hami] {
        let l = rt
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        addrs.push(l.local_addr().unwrap());
        let (m, h) = (Arc::clone(&m), Arc::clone(&health));
        rt.spawn(serve_exposition(
            l,
            m,
            h,
            Duration::from_secs(10),
            exposition,
        ));
    }
    let get = |a: SocketAddr| {
        let (status, body) = http_get(a, "/metrics").unwrap();
        assert_eq!(status, 200, "{body}");
        body
    };
    let out = (get(addrs[0]), get(addrs[1]));
    rt.shutdown_background();
    out
}

/// The samples of an exposition as `prometheus_client`'s parser reads them:
/// `[name, {label: value}, value]` each.
fn parse(python: &Path, dir: &Path, name: &str, text: &str) -> Vec<Value> {
    let f = dir.join(name);
    std::fs::write(&f, text).unwrap();
    let out = Command::new(python)
        .arg("-c")
        .arg(
            "import json, sys\n\
             from prometheus_client.parser import text_string_to_metric_families\n\
             out = []\n\
             for fam in text_string_to_metric_families(open(sys.argv[1]).read()):\n\
             \x20   for s in fam.samples:\n\
             \x20       out.append([s.name, s.labels, s.value])\n\
             json.dump(out, sys.stdout)\n",
        )
        .arg(&f)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "prometheus_client refuses {name}:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice::<Vec<Value>>(&out.stdout).unwrap()
}

/// A series in promtool's input notation.
fn series_notation(name: &str, labels: &serde_json::Map<String, Value>) -> String {
    let mut l: Vec<String> = labels
        .iter()
        .map(|(k, v)| {
            let v = v
                .as_str()
                .unwrap()
                .replace('\\', "\\\\")
                .replace('"', "\\\"");
            format!("{k}=\"{v}\"")
        })
        .collect();
    l.sort();
    format!("{name}{{{}}}", l.join(","))
}

/// HAMi's scheduler's per-GPU families for the same GPU, labelled as its source labels them
/// (`cmd/scheduler/metrics.go`, v2.10.0; `zone="vGPU"` too). The agent does not serve these:
/// HAMi's scheduler does, and HAMi's dashboard joins the monitor's host families with them.
fn scheduler_series() -> Vec<(String, f64)> {
    let dev = format!(
        r#"device_index="0",device_type="NVIDIA-NVIDIA H200",device_uuid="{UUID}",node="{NODE}",zone="vGPU""#
    );
    vec![
        (
            format!("hami_gpu_memory_limit_bytes{{{dev}}}"),
            80.0 * 1024.0 * 1024.0 * 1024.0,
        ),
        (
            format!(r#"hami_gpu_memory_allocated_bytes{{device_cores="100",{dev}}}"#),
            1024.0 * 1024.0 * 1024.0,
        ),
        (format!("hami_gpu_shared_count{{{dev}}}"), 1.0),
        (format!("hami_gpu_core_allocated_ratio{{{dev}}}"), 30.0),
        (
            format!("hami_node_gpu_memory_allocated_ratio{{{dev}}}"),
            1.25,
        ),
    ]
}

/// The dashboard's and the WebUI's variables, as a user viewing this container picks them.
fn substitute(expr: &str) -> String {
    expr.replace("$device_uuid", UUID)
        .replace("$namespace", NAMESPACE)
        .replace("$node", NODE)
        .replace("$pod", POD)
        .replace("$container", CONTAINER)
}

/// Every expression of the fixture, variables substituted: (where it comes from, PromQL).
/// `label_values(metric, label)` (a Grafana variable) becomes the selector that must hold the
/// value a user picks.
fn fixture_queries() -> Vec<(String, String)> {
    let path = workspace_root().join("hami-user/tests/data/hami-queries.json");
    let fx: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let mut out = Vec::new();
    for src in fx["sources"].as_array().unwrap() {
        let origin = format!(
            "{}@{}:{}",
            src["repo"].as_str().unwrap(),
            src["tag"].as_str().unwrap(),
            src["file"].as_str().unwrap()
        );
        for v in src["variables"].as_array().unwrap() {
            let def = v["definition"].as_str().unwrap();
            let inner = def
                .strip_prefix("label_values(")
                .and_then(|d| d.strip_suffix(')'))
                .unwrap_or_else(|| panic!("{origin}: not label_values: {def}"));
            let (metric, label) = inner.split_once(',').unwrap();
            let label = label.trim();
            let value = substitute(&format!("${label}"));
            out.push((
                format!("{origin} variable {}", v["variable"]),
                format!(r#"{metric}{{{label}="{value}"}}"#),
            ));
        }
        for q in src["queries"].as_array().unwrap() {
            let at = q
                .get("panel")
                .or_else(|| q.get("function"))
                .and_then(Value::as_str)
                .unwrap();
            out.push((
                format!("{origin} {at:?}"),
                substitute(q["expr"].as_str().unwrap()),
            ));
        }
    }
    out
}

/// What the container and GPU queries must return (summed), by where they come from.
fn expected_sum(origin: &str) -> Option<f64> {
    [
        ("\"Container device utilization\"", SHARE),
        ("\"taskCoreUsed\"", SHARE),
        ("\"taskMemoryUsed\"", ACCOUNTED as f64),
        ("\"Host GPU memory used\"", GPU_USED as f64),
        ("\"Host GPU utilization\"", f64::from(GPU_UTIL)),
        (
            "\"vGPU memory used % of limit\"",
            100.0 * ACCOUNTED as f64 / (1u64 << 30) as f64,
        ),
    ]
    .iter()
    .find(|(k, _)| origin.ends_with(k))
    .map(|(_, v)| *v)
}

/// Evaluates every fixture query over `samples` (plus the scheduler's series) with
/// `promtool test rules`: each returns data, and those of [`expected_sum`] their value.
fn assert_queries_have_data(promtool: &Path, dir: &Path, label: &str, samples: &[Value]) {
    // 16 minutes of scrapes every 15 s, each the same value: the WebUI's [10m:] subqueries
    // see a full window at the evaluation time (15m).
    let mut input = Vec::new();
    for s in samples {
        let labels = s[1].as_object().unwrap();
        let name = s[0].as_str().unwrap();
        let v = s[2].as_f64().unwrap();
        if !v.is_finite() {
            continue;
        }
        input.push(json!({"series": series_notation(name, labels), "values": format!("{v}x64")}));
    }
    for (series, v) in scheduler_series() {
        input.push(json!({"series": series, "values": format!("{v}x64")}));
    }
    let queries = fixture_queries();
    assert!(queries.len() >= 20, "{queries:?}");
    let mut tests = Vec::new();
    let mut names = Vec::new();
    for (origin, expr) in &queries {
        tests.push(json!({
            "expr": format!("count({expr}) > bool 0"),
            "eval_time": "15m",
            "exp_samples": [{"labels": "{}", "value": 1}],
        }));
        names.push(format!("has data: {origin}: {expr}"));
        if let Some(v) = expected_sum(origin) {
            tests.push(json!({
                "expr": format!("sum({expr})"),
                "eval_time": "15m",
                "exp_samples": [{"labels": "{}", "value": v}],
            }));
            names.push(format!("value {v}: {origin}: {expr}"));
        }
    }
    assert_eq!(
        names.iter().filter(|n| n.starts_with("value")).count(),
        6,
        "a query the values are checked for is missing from the fixture: {names:#?}"
    );
    // YAML is a superset of JSON.
    let file = dir.join(format!("hami-queries-{label}.test.yml"));
    let doc = json!({
        "rule_files": [],
        "evaluation_interval": "15s",
        "tests": [{"interval": "15s", "input_series": input, "promql_expr_test": tests}],
    });
    std::fs::write(&file, serde_json::to_string_pretty(&doc).unwrap()).unwrap();
    let out = Command::new(promtool)
        .args(["test", "rules"])
        .arg(&file)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "HAMi {label}: a HAMi dashboard or HAMi-WebUI query finds no data or the wrong value \
         in the agent's series (the queries, in order:\n{}\n)\npromtool:\n{}{}",
        names.join("\n"),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn hami_dashboard_and_webui_queries_find_the_agents_hami_families() {
    let promtool = tool("promtool");
    let python = venv_python();
    let dir = tempfile::tempdir().unwrap();
    for version in HamiVersion::ALL {
        let m = Metrics::new(MetricsOptions {
            hami_compat: true,
            hami_version: version,
            hami_separate: true,
            node: NODE.into(),
            ..MetricsOptions::default()
        })
        .unwrap();
        scan(&m);
        let (agent, hami) = scrape(m);
        assert_exposition_is_valid(&promtool, &python, dir.path(), &hami);
        let ours = parse(&python, dir.path(), "agent.txt", &agent);
        let theirs = parse(&python, dir.path(), "hami.txt", &hami);
        // HAMi's monitor registers every family under zone="vGPU"; the agent's own have none.
        for s in &theirs {
            assert_eq!(s[1]["zone"], "vGPU", "{s}");
        }
        for s in &ours {
            assert!(s[1].get("zone").is_none(), "{s}");
        }
        // A Prometheus scraping both ports stores each series once.
        let key = |s: &Value| series_notation(s[0].as_str().unwrap(), s[1].as_object().unwrap());
        let theirs_keys: std::collections::BTreeSet<String> = theirs.iter().map(key).collect();
        for s in &ours {
            assert!(!theirs_keys.contains(&key(s)), "on both ports: {}", key(s));
        }
        let all: Vec<Value> = ours.into_iter().chain(theirs).collect();
        assert_queries_have_data(&promtool, dir.path(), version.as_str(), &all);
    }
}
