//! Prometheus metrics and the tiny `/metrics` HTTP responder.
//!
//! The metric list and the default address are documented in `docs/agent.md`.

use std::sync::Arc;
use std::time::Duration;

use prometheus::{Encoder, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::findings::{Finding, FindingKind, RegionUsage};

/// Default listen address of `/metrics`.
pub const DEFAULT_METRICS_ADDR: &str = "0.0.0.0:9494";

/// Errors building the registry.
#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    /// A metric could not be created or registered (a bug: names are fixed).
    #[error("metrics registry: {0}")]
    Registry(#[from] prometheus::Error),
}

/// One process for the per-process gauge.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcessSample {
    /// Host pid.
    pub pid: u32,
    /// Container name.
    pub container: String,
    /// Whether the preload is mapped.
    pub hooked: bool,
    /// Observed live bytes.
    pub observed: u64,
}

/// Every metric the agent exports.
pub struct Metrics {
    registry: Registry,
    /// `hami_container_limit_bytes{container,region,device}`.
    pub limit: IntGaugeVec,
    /// `hami_container_accounted_bytes{container,region,device}` (all kinds).
    pub accounted: IntGaugeVec,
    /// `hami_container_accounted_data_bytes{container,region,device}`.
    pub accounted_data: IntGaugeVec,
    /// `hami_container_observed_bytes{container,region,device}`.
    pub observed: IntGaugeVec,
    /// `hami_process_observed_bytes{pid,container,hooked}`.
    pub process_observed: IntGaugeVec,
    /// `hami_findings{kind}`: findings currently standing.
    pub findings: IntGaugeVec,
    /// `hami_findings_total{kind}`: findings raised since start.
    pub findings_total: IntCounterVec,
    /// `hami_events_total{kind}`: events consumed from the ring buffer.
    pub events: IntCounterVec,
    /// `hami_events_dropped_total`: events the kernel side could not queue.
    pub dropped: IntCounter,
    /// `hami_libcuda_attached`: distinct libcuda files with probes attached.
    pub libcuda_attached: IntGauge,
    /// `hami_processes_tracked`: GPU processes the agent tracks.
    pub processes: IntGauge,
    /// `hami_slots_reclaimed_total`: leaked slots released with `--reclaim`.
    pub reclaimed: IntCounter,
    /// `hami_nvml_available`: 1 when NVML is loaded.
    pub nvml_available: IntGauge,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics")
    }
}

fn gauge_vec(
    r: &Registry,
    name: &str,
    help: &str,
    labels: &[&str],
) -> prometheus::Result<IntGaugeVec> {
    let g = IntGaugeVec::new(Opts::new(name, help), labels)?;
    r.register(Box::new(g.clone()))?;
    Ok(g)
}

impl Metrics {
    /// Creates and registers every metric.
    pub fn new() -> Result<Metrics, MetricsError> {
        let r = Registry::new();
        let cr = ["container", "region", "device"];
        let limit = gauge_vec(
            &r,
            "hami_container_limit_bytes",
            "Region limit per device (0 = unlimited)",
            &cr,
        )?;
        let accounted = gauge_vec(
            &r,
            "hami_container_accounted_bytes",
            "Bytes the region accounts (all kinds: context, module, data)",
            &cr,
        )?;
        let accounted_data = gauge_vec(
            &r,
            "hami_container_accounted_data_bytes",
            "Data bytes the region accounts (comparable with observed)",
            &cr,
        )?;
        let observed = gauge_vec(
            &r,
            "hami_container_observed_bytes",
            "Live data bytes the probes observed for the region's processes",
            &cr,
        )?;
        let process_observed = gauge_vec(
            &r,
            "hami_process_observed_bytes",
            "Live data bytes observed per process",
            &["pid", "container", "hooked"],
        )?;
        let findings = gauge_vec(
            &r,
            "hami_findings",
            "Findings currently standing, by kind",
            &["kind"],
        )?;
        let findings_total = IntCounterVec::new(
            Opts::new(
                "hami_findings_total",
                "Findings raised since the agent started, by kind",
            ),
            &["kind"],
        )?;
        r.register(Box::new(findings_total.clone()))?;
        let events = IntCounterVec::new(
            Opts::new("hami_events_total", "Probe events consumed, by kind"),
            &["kind"],
        )?;
        r.register(Box::new(events.clone()))?;
        let dropped = IntCounter::new(
            "hami_events_dropped_total",
            "Probe events dropped because the ring buffer was full",
        )?;
        r.register(Box::new(dropped.clone()))?;
        let libcuda_attached = IntGauge::new(
            "hami_libcuda_attached",
            "Distinct libcuda files with probes attached",
        )?;
        r.register(Box::new(libcuda_attached.clone()))?;
        let processes = IntGauge::new("hami_processes_tracked", "GPU processes tracked")?;
        r.register(Box::new(processes.clone()))?;
        let reclaimed = IntCounter::new(
            "hami_slots_reclaimed_total",
            "Leaked region slots released by --reclaim",
        )?;
        r.register(Box::new(reclaimed.clone()))?;
        let nvml_available = IntGauge::new("hami_nvml_available", "1 when NVML is loaded")?;
        r.register(Box::new(nvml_available.clone()))?;
        for k in FindingKind::ALL {
            findings.with_label_values(&[k.name()]).set(0);
            findings_total.with_label_values(&[k.name()]).inc_by(0);
        }
        Ok(Metrics {
            registry: r,
            limit,
            accounted,
            accounted_data,
            observed,
            process_observed,
            findings,
            findings_total,
            events,
            dropped,
            libcuda_attached,
            processes,
            reclaimed,
            nvml_available,
        })
    }

    /// Replaces the per-region gauges with `usage`.
    pub fn set_usage(&self, usage: &[RegionUsage]) {
        self.limit.reset();
        self.accounted.reset();
        self.accounted_data.reset();
        self.observed.reset();
        for u in usage {
            let dev = u.device.to_string();
            let l = [u.container.as_str(), u.region.as_str(), dev.as_str()];
            self.limit.with_label_values(&l).set(clamp(u.limit));
            self.accounted.with_label_values(&l).set(clamp(u.accounted));
            self.accounted_data
                .with_label_values(&l)
                .set(clamp(u.accounted_data));
            self.observed.with_label_values(&l).set(clamp(u.observed));
        }
    }

    /// Replaces the per-process gauge.
    pub fn set_processes(&self, procs: &[ProcessSample]) {
        self.process_observed.reset();
        for p in procs {
            let pid = p.pid.to_string();
            let hooked = if p.hooked { "true" } else { "false" };
            self.process_observed
                .with_label_values(&[pid.as_str(), p.container.as_str(), hooked])
                .set(clamp(p.observed));
        }
        self.processes.set(procs.len() as i64);
    }

    /// Sets the standing-findings gauge from the current findings.
    pub fn set_findings(&self, standing: &[Finding]) {
        for k in FindingKind::ALL {
            let n = standing.iter().filter(|f| f.kind == k).count();
            self.findings.with_label_values(&[k.name()]).set(n as i64);
        }
    }

    /// Counts newly raised findings.
    pub fn count_new_findings(&self, new: &[Finding]) {
        for f in new {
            self.findings_total
                .with_label_values(&[f.kind.name()])
                .inc();
        }
    }

    /// Raises the dropped counter to `total` (a monotonic total read from the kernel side).
    pub fn set_dropped_total(&self, total: u64) {
        let cur = self.dropped.get();
        if total > cur {
            self.dropped.inc_by(total - cur);
        }
    }

    /// The text exposition format.
    pub fn render(&self) -> String {
        let mut buf = Vec::new();
        let enc = prometheus::TextEncoder::new();
        // Encoding fixed, valid metric families into a Vec cannot fail.
        if enc.encode(&self.registry.gather(), &mut buf).is_err() {
            return String::new();
        }
        String::from_utf8_lossy(&buf).into_owned()
    }
}

fn clamp(v: u64) -> i64 {
    v.min(i64::MAX as u64) as i64
}

/// Serves `GET /metrics` on `listener` until the task is dropped. Anything else gets 404;
/// malformed or slow requests are dropped after a few seconds.
pub async fn serve(listener: TcpListener, metrics: Arc<Metrics>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let m = Arc::clone(&metrics);
        tokio::spawn(async move {
            let _ = tokio::time::timeout(Duration::from_secs(5), respond(stream, &m)).await;
        });
    }
}

/// The response for a request line's path.
pub fn route(path: &str, metrics: &Metrics) -> (u16, &'static str, String) {
    match path.split('?').next().unwrap_or("") {
        "/metrics" => (
            200,
            "text/plain; version=0.0.4; charset=utf-8",
            metrics.render(),
        ),
        "/" => (
            200,
            "text/plain; charset=utf-8",
            "hami-agent: see /metrics\n".to_string(),
        ),
        _ => (404, "text/plain; charset=utf-8", "not found\n".to_string()),
    }
}

async fn respond(mut stream: TcpStream, metrics: &Metrics) -> std::io::Result<()> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") && !buf.windows(2).any(|w| w == b"\n\n") {
        let n = stream.read(&mut chunk).await?;
        if n == 0 || buf.len() > 16 * 1024 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    let req = String::from_utf8_lossy(&buf);
    let mut parts = req.lines().next().unwrap_or("").split_whitespace();
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let (status, ctype, body) = if method == "GET" || method == "HEAD" {
        route(path, metrics)
    } else {
        (
            405,
            "text/plain; charset=utf-8",
            "method not allowed\n".to_string(),
        )
    };
    let reason = match status {
        200 => "OK",
        404 => "Not Found",
        _ => "Method Not Allowed",
    };
    let head = format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await?;
    if method != "HEAD" {
        stream.write_all(body.as_bytes()).await?;
    }
    stream.shutdown().await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_and_findings_render() {
        let m = Metrics::new().unwrap();
        m.set_usage(&[RegionUsage {
            container: "c1".into(),
            region: "/tmp/r".into(),
            device: 0,
            limit: 100,
            accounted: 50,
            accounted_data: 40,
            observed: 45,
        }]);
        m.events.with_label_values(&["mem_alloc"]).inc_by(3);
        m.set_dropped_total(7);
        m.set_dropped_total(5); // never goes back
        let text = m.render();
        assert!(
            text.contains(
                r#"hami_container_limit_bytes{container="c1",device="0",region="/tmp/r"} 100"#
            ),
            "{text}"
        );
        assert!(text.contains(
            r#"hami_container_observed_bytes{container="c1",device="0",region="/tmp/r"} 45"#
        ));
        assert!(text.contains(r#"hami_events_total{kind="mem_alloc"} 3"#));
        assert!(text.contains("hami_events_dropped_total 7"));
        assert!(text.contains(r#"hami_findings{kind="bypass"} 0"#));
        // A region that went away disappears from the gauges.
        m.set_usage(&[]);
        assert!(!m.render().contains("hami_container_limit_bytes{"));
        assert_eq!(route("/nope", &m).0, 404);
        assert_eq!(route("/metrics?x=1", &m).0, 200);
    }

    #[test]
    fn dashboard_uses_only_exported_metrics() {
        let m = Metrics::new().unwrap();
        let dash = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../dashboards/hami.json"),
        )
        .unwrap();
        let _: serde_json::Value = serde_json::from_str(&dash).unwrap();
        // Metric families that exist even before any sample (label-less or pre-seeded).
        let mut exported: Vec<String> = m
            .registry
            .gather()
            .iter()
            .map(|f| f.name().to_string())
            .collect();
        // Labelled gauges appear once set; their names are fixed in `Metrics::new`.
        exported.extend(
            [
                "hami_container_limit_bytes",
                "hami_container_accounted_bytes",
                "hami_container_accounted_data_bytes",
                "hami_container_observed_bytes",
                "hami_process_observed_bytes",
                "hami_events_total",
            ]
            .map(String::from),
        );
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
        for n in used {
            assert!(exported.contains(&n), "dashboard uses unknown metric {n}");
        }
        // And every labelled family really renders under that name once set.
        m.set_usage(&[RegionUsage {
            container: "c".into(),
            region: "r".into(),
            device: 0,
            limit: 1,
            accounted: 1,
            accounted_data: 1,
            observed: 1,
        }]);
        m.set_processes(&[ProcessSample {
            pid: 1,
            container: "c".into(),
            hooked: true,
            observed: 1,
        }]);
        m.events.with_label_values(&["mem_alloc"]).inc();
        let text = m.render();
        for n in &exported {
            assert!(
                text.contains(&format!("{n}{{")) || text.contains(&format!("{n} ")),
                "{n}"
            );
        }
    }

    #[tokio::test]
    async fn http_server_serves_metrics() {
        let m = Arc::new(Metrics::new().unwrap());
        m.processes.set(3);
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let task = tokio::spawn(serve(l, Arc::clone(&m)));
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        assert!(out.starts_with("HTTP/1.1 200 OK\r\n"), "{out}");
        assert!(out.contains("hami_processes_tracked 3"));
        task.abort();
    }
}
