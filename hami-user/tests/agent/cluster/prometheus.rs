//! The real Prometheus of the scrape test: a dcgm-exporter stand-in, the server with the
//! chart's rules, its queries, the bypass alert, and the checks of the agent's exposition.

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use hami_test_harness::workspace_root;
use serde_json::Value;

use super::fixtures::{free_port, http_get, urlencode, Killed};

/// Serves `body` as a Prometheus exposition to every request, on a port of its own, from a
/// thread (until the test process ends): a stand-in for dcgm-exporter.
pub(super) fn serve_exposition(body: String) -> SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        for mut s in l.incoming().flatten() {
            let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
            let mut req = Vec::new();
            let mut buf = [0u8; 1024];
            while !req.windows(4).any(|w| w == b"\r\n\r\n") {
                match s.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => req.extend_from_slice(&buf[..n]),
                }
            }
            let _ = write!(
                s,
                "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    addr
}

/// The dashboard's queries with its variables set to "All".
fn dashboard_queries() -> Vec<(String, String)> {
    let dash: Value = serde_json::from_str(
        &std::fs::read_to_string(workspace_root().join("dashboards/hami.json")).unwrap(),
    )
    .unwrap();
    let mut out = Vec::new();
    for p in dash["panels"].as_array().unwrap() {
        for t in p["targets"].as_array().into_iter().flatten() {
            let q = t["expr"]
                .as_str()
                .unwrap()
                .replace("$node", ".*")
                .replace("$namespace", ".*")
                .replace("$container", ".*");
            out.push((p["title"].as_str().unwrap_or("").to_string(), q));
        }
    }
    assert!(out.len() >= 10, "{out:?}");
    out
}

/// The result vector of instant query `q` on Prometheus at `prom`.
pub(super) fn prom_query(prom: SocketAddr, q: &str) -> Vec<Value> {
    let (st, body) = http_get(prom, &format!("/api/v1/query?query={}", urlencode(q)))
        .unwrap_or_else(|e| panic!("query {q}: {e}"));
    assert_eq!(st, 200, "query {q}: {body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    v["data"]["result"].as_array().cloned().unwrap_or_default()
}

/// Prometheus with the chart's rules (its TSDB and config in `dir`), scraping the agent at
/// `agent_port` like the chart's ServiceMonitor and `dcgm` like dcgm-exporter's own: its
/// address, and the process (stopped on drop).
pub(super) fn start_prometheus(
    prometheus: &Path,
    dir: &Path,
    agent_port: u16,
    dcgm: SocketAddr,
) -> (SocketAddr, Killed) {
    let prom_port = free_port();
    let prom_addr: SocketAddr = format!("127.0.0.1:{prom_port}").parse().unwrap();
    let cfg = dir.join("prometheus.yml");
    let rules = workspace_root().join("deploy/helm/hami-agent/files/hami-agent.rules.yml");
    std::fs::write(
        &cfg,
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
             rule_files: ['{}']\n\
             scrape_configs:\n  - job_name: hami-system/hami-agent\n    honor_labels: true\n\
             \x20   static_configs:\n      - targets: ['127.0.0.1:{agent_port}']\n\
             \x20       labels: {{namespace: hami-system, pod: hami-agent-x7k2p, container: agent, node: gpu-node-1, service: hami-agent}}\n\
             \x20 - job_name: gpu-operator/nvidia-dcgm-exporter\n    honor_labels: false\n\
             \x20   static_configs:\n      - targets: ['{dcgm}']\n\
             \x20       labels: {{namespace: gpu-operator, pod: nvidia-dcgm-exporter-5xq9z, container: nvidia-dcgm-exporter, node: gpu-node-1}}\n",
            rules.display()
        ),
    )
    .unwrap();
    let mut prom = Command::new(prometheus);
    prom.arg(format!("--config.file={}", cfg.display()))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.join("tsdb").display()
        ))
        .arg(format!("--web.listen-address=127.0.0.1:{prom_port}"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let process = Killed(prom.spawn().expect("spawn prometheus"));
    (prom_addr, process)
}

/// Every dashboard query returns data from Prometheus at `prom_addr` once a few scrapes are in
/// (waits up to 30 s).
pub(super) fn assert_every_dashboard_query_has_data(prom_addr: SocketAddr) {
    let queries = dashboard_queries();
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut missing;
    loop {
        std::thread::sleep(Duration::from_millis(500));
        missing = Vec::new();
        for (title, q) in &queries {
            let ok = http_get(prom_addr, "/-/ready").is_ok_and(|(s, _)| s == 200)
                && !prom_query(prom_addr, q).is_empty();
            if !ok {
                missing.push(format!("{title}: {q}"));
            }
        }
        if missing.is_empty() || Instant::now() > deadline {
            break;
        }
    }
    assert!(
        missing.is_empty(),
        "dashboard queries without data:\n{}",
        missing.join("\n")
    );
}

/// The `HamiGpuMemoryBypass` alert of pod `pod`, pending or firing, from Prometheus at
/// `prom_addr` (waits up to 10 s).
pub(super) fn bypass_alert(prom_addr: SocketAddr, pod: &str) -> Value {
    (0..40)
        .find_map(|_| {
            let (_, body) = http_get(prom_addr, "/api/v1/alerts").ok()?;
            let v: Value = serde_json::from_str(&body).ok()?;
            let a = v["data"]["alerts"]
                .as_array()?
                .iter()
                // (Other workloads on this machine may bypass too: this pod's.)
                .find(|a| {
                    a["labels"]["alertname"] == "HamiGpuMemoryBypass" && a["labels"]["pod"] == pod
                })
                .cloned();
            if a.is_none() {
                std::thread::sleep(Duration::from_millis(250));
            }
            a
        })
        .expect("HamiGpuMemoryBypass neither pending nor firing")
}

/// The first sample's value of query `q`.
fn value(prom_addr: SocketAddr, q: &str) -> Option<f64> {
    prom_query(prom_addr, q)
        .first()
        .and_then(|s| s["value"][1].as_str()?.parse().ok())
}

/// The values of `rule` and of `raw` (its definition), once they agree (or after 10 s).
pub(super) fn settled(prom_addr: SocketAddr, rule: &str, raw: &str) -> (Option<f64>, Option<f64>) {
    let t0 = Instant::now();
    loop {
        let (r, w) = (value(prom_addr, rule), value(prom_addr, raw));
        if (r.is_some() && r == w) || t0.elapsed() > Duration::from_secs(10) {
            return (r, w);
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// The agent's exposition `text` passes `promtool check metrics` (but for HAMi's older
/// names) and parses with `prometheus_client` (run by `python`; the text written to `dir`).
pub(super) fn assert_exposition_is_valid(promtool: &Path, python: &Path, dir: &Path, text: &str) {
    let mut lint = Command::new(promtool)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    lint.stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = lint.wait_with_output().unwrap();
    // Clean but for HAMi's older names (`vGPU_device_memory_*`, `HostGPUMemoryUsage`,
    // `HostCoreUtilization`, `Device_*_desc_of_container`), which are HAMi's, kept exactly
    // as HAMi spells them for its dashboards (`--hami-compat` only).
    let complaints: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .chain(String::from_utf8_lossy(&out.stderr).lines())
        .filter(|l| {
            !([
                "vGPU_device_memory_",
                "HostGPUMemoryUsage",
                "HostCoreUtilization",
                "Device_utilization_desc_of_container",
                "Device_memory_desc_of_container",
            ]
            .iter()
            .any(|p| l.starts_with(p))
                && l.ends_with("not 'camelCase'"))
        })
        .map(String::from)
        .collect();
    assert!(
        complaints.is_empty(),
        "promtool check metrics:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let exposition = dir.join("metrics.txt");
    std::fs::write(&exposition, text).unwrap();
    let out = Command::new(python)
        .arg("-c")
        .arg(
            "import sys\n\
             from prometheus_client.parser import text_string_to_metric_families\n\
             fams = list(text_string_to_metric_families(open(sys.argv[1]).read()))\n\
             names = [f.name for f in fams]\n\
             assert len(names) == len(set(names)), names\n\
             print(len(fams), sum(len(f.samples) for f in fams))\n",
        )
        .arg(&exposition)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "prometheus_client refuses the exposition:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
