//! A running `hami-agent` seen from outside (its JSON log, its metrics endpoint,
//! `hami-agent inspect`), shared by the demo, the benchmarks and the torture scenarios.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, ensure, Context, Result};
use hami_test_harness::AgentProcess;
use serde_json::Value;

use super::driver::Driver;
use super::output::human;
use super::sandbox::Sandbox;

/// A running `hami-agent run` (the harness's [`AgentProcess`]), its JSON log parsed line by
/// line.
pub(crate) struct Agent {
    proc: AgentProcess,
    log: Vec<Value>,
    /// The agent's ready line.
    pub(crate) ready: String,
    /// Where it serves `/metrics` (`host:port`).
    pub(crate) metrics_addr: String,
}

impl Agent {
    pub(super) fn start(bin: &Path, driver: &Driver, sb: &Sandbox) -> Result<Agent> {
        let mut c = Command::new(bin);
        c.args([
            "run",
            "--reclaim",
            "--json-log",
            "--metrics-addr",
            "127.0.0.1:0",
        ])
        .arg("--libcuda")
        .arg(&driver.libcuda);
        driver.apply(&mut c, sb);
        println!(
            "$ hami-agent run --reclaim --json-log --metrics-addr 127.0.0.1:0 --libcuda {}",
            driver.libcuda.display()
        );
        Agent::spawn(c, true)
    }

    /// Starts `cmd` (a `hami-agent run --json-log --metrics-addr ...` command) and waits for
    /// its ready line; with `echo`, prints the attach lines and errors it logs meanwhile.
    pub(crate) fn spawn(c: Command, echo: bool) -> Result<Agent> {
        let mut log = Vec::new();
        let mut metrics_addr = String::new();
        let proc = AgentProcess::try_spawn(c, |l| {
            let Some(f) = parse_record(l) else { return };
            if f["message"] == "serving /metrics" {
                metrics_addr = f["addr"].as_str().unwrap_or_default().to_string();
            }
            if echo && (f["message"] == "probes attached" || f["level"] == "ERROR") {
                println!("    {}", describe(&f));
            }
            log.push(f);
        })?;
        ensure!(
            !metrics_addr.is_empty(),
            "the agent did not say where it serves /metrics"
        );
        let ready = proc.log().last().cloned().unwrap_or_default();
        Ok(Agent {
            proc,
            log,
            ready,
            metrics_addr,
        })
    }

    /// The next stderr line (JSON lines are also parsed into `log`, with `level` added).
    pub(super) fn next_line(&mut self, deadline: Instant) -> Result<String> {
        let l = self.proc.next_line(deadline)?;
        self.push(&l);
        Ok(l)
    }

    pub(super) fn push(&mut self, line: &str) {
        if let Some(f) = parse_record(line) {
            self.log.push(f);
        }
    }

    /// Takes in every line already written.
    pub(crate) fn drain(&mut self) {
        let seen = self.proc.log().len();
        self.proc.drain();
        let new: Vec<String> = self.proc.log()[seen..].to_vec();
        for l in &new {
            self.push(l);
        }
    }

    /// Every JSON log record taken in so far (its `fields`, with `message` and `level`).
    pub(crate) fn records(&self) -> &[Value] {
        &self.log
    }

    /// Findings logged so far.
    pub(crate) fn findings(&self) -> Vec<&Value> {
        self.log
            .iter()
            .filter(|f| f.get("kind").is_some())
            .collect()
    }

    /// Waits for a log record (its `fields`, with `message`) matching `pred`; already seen
    /// records count.
    pub(super) fn wait_json(
        &mut self,
        timeout: Duration,
        pred: impl Fn(&Value) -> bool,
    ) -> Result<Value> {
        let deadline = Instant::now() + timeout;
        let mut seen = 0;
        loop {
            if let Some(f) = self.log[seen..].iter().find(|f| pred(f)) {
                return Ok(f.clone());
            }
            seen = self.log.len();
            if let Err(e) = self.next_line(deadline) {
                let tail: Vec<String> =
                    self.log.iter().rev().take(10).rev().map(describe).collect();
                bail!(
                    "the expected agent log record did not come ({e}); last records:\n  {}",
                    tail.join("\n  ")
                );
            }
        }
    }

    /// The agent's pid.
    pub(crate) fn pid(&self) -> u32 {
        self.proc.pid() as u32
    }

    /// `GET /metrics`.
    pub(crate) fn metrics(&self) -> Result<String> {
        http_get(&self.metrics_addr, "/metrics")
    }

    /// SIGTERM, then wait (at most 30 s) for a clean exit.
    pub(crate) fn stop(self) -> Result<()> {
        self.proc.signal(libc::SIGTERM);
        let (st, _, _) = self
            .proc
            .try_finish_within(Duration::from_secs(30))
            .map_err(|(e, _)| e)
            .context("after SIGTERM")?;
        ensure!(st.success(), "hami-agent exited with {st}");
        Ok(())
    }
}

/// A JSON log line's `fields`, with its `level` added; `None` for a line that is not JSON.
fn parse_record(line: &str) -> Option<Value> {
    let v = serde_json::from_str::<Value>(line).ok()?;
    let mut f = v.get("fields").cloned().unwrap_or(Value::Null);
    if let Some(o) = f.as_object_mut() {
        o.insert("level".into(), v["level"].clone());
    }
    Some(f)
}

/// A plain HTTP/1.0 GET; returns the body.
pub(crate) fn http_get(addr: &str, path: &str) -> Result<String> {
    let mut s = TcpStream::connect(addr).with_context(|| format!("connecting to {addr}"))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n")?;
    let mut resp = String::new();
    s.read_to_string(&mut resp)?;
    let (head, body) = resp
        .split_once("\r\n\r\n")
        .ok_or_else(|| anyhow!("malformed HTTP response from {addr}"))?;
    ensure!(
        head.starts_with("HTTP/1.") && head.contains(" 200 "),
        "GET {path}: {}",
        head.lines().next().unwrap_or("")
    );
    Ok(body.to_string())
}

/// The value of the first sample of `name` whose label set contains every `labels` item.
pub(crate) fn metric(text: &str, name: &str, labels: &[&str]) -> Option<u64> {
    text.lines().find_map(|l| {
        let (series, value) = l.rsplit_once(' ')?;
        let (n, rest) = series.split_once('{').unwrap_or((series, ""));
        (n == name && labels.iter().all(|want| rest.contains(want)))
            .then(|| value.parse::<f64>().ok().map(|v| v as u64))
            .flatten()
    })
}

pub(super) fn inspect_json(bin: &Path, region: &Path) -> Result<Value> {
    let o = Command::new(bin)
        .args(["inspect", "--json"])
        .arg(region)
        .output()?;
    ensure!(
        o.status.success(),
        "hami-agent inspect failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    Ok(serde_json::from_slice(&o.stdout)?)
}

/// `hami-agent inspect` (human), leaving out the devices nobody uses.
pub(super) fn print_inspect(bin: &Path, region: &Path) -> Result<()> {
    let o = Command::new(bin).arg("inspect").arg(region).output()?;
    ensure!(
        o.status.success(),
        "hami-agent inspect failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let text = String::from_utf8_lossy(&o.stdout);
    let mut hidden = 0;
    for l in text.lines() {
        let idle_device = l.starts_with("    ")
            && !l.starts_with("     ")
            && l.contains(": limit ")
            && l.contains("used 0 B")
            && !l.contains("GPU-");
        if idle_device {
            hidden += 1;
        } else {
            println!("    {l}");
        }
    }
    if hidden > 0 {
        println!("    ({hidden} unused devices of the region not shown)");
    }
    Ok(())
}

/// A log record for humans: level, message, then the finding's fields.
pub(crate) fn describe(f: &Value) -> String {
    let mut s = format!(
        "{} {}",
        f["level"].as_str().unwrap_or(""),
        f["message"].as_str().unwrap_or("")
    );
    let order = [
        "kind",
        "reason",
        "pid",
        "nspid",
        "container",
        "region",
        "device",
        "slot",
        "bytes",
        "observed",
        "accounted",
        "limit",
        "path",
        "symbols",
        "error",
    ];
    let map: BTreeMap<&str, &Value> = f
        .as_object()
        .map(|o| o.iter().map(|(k, v)| (k.as_str(), v)).collect())
        .unwrap_or_default();
    for k in order {
        if let Some(v) = map.get(k) {
            let shown = match v {
                Value::String(t) => t.clone(),
                Value::Number(n) if matches!(k, "bytes" | "observed" | "accounted" | "limit") => {
                    human(n.as_u64().unwrap_or(0))
                }
                other => other.to_string(),
            };
            s += &format!(" {k}={shown}");
        }
    }
    s
}

/// Processes whose environment names `dir` (our workloads and agent).
pub(crate) fn processes_using(dir: &Path) -> Vec<u32> {
    let needle = dir.display().to_string();
    let me = std::process::id();
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    rd.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| pid != me)
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/environ"))
                .is_ok_and(|env| env.windows(needle.len()).any(|w| w == needle.as_bytes()))
                && !is_zombie(*pid)
        })
        .collect()
}

pub(crate) fn is_zombie(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(") ").map(|(_, r)| r.starts_with('Z')))
        .unwrap_or(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    pub(super) fn metric_lookup_matches_name_and_labels() {
        let text = "# HELP x y\n\
                    hami_findings_total{kind=\"bypass\"} 2\n\
                    hami_findings_total{kind=\"leaked_slot\"} 1\n\
                    hami_events_dropped_total 0\n\
                    hami_container_observed_bytes{container=\"host\",cuda_device=\"0\",region=\"/r\",node=\"n1\"} 536870912\n";
        assert_eq!(
            metric(text, "hami_findings_total", &["kind=\"leaked_slot\""]),
            Some(1)
        );
        assert_eq!(metric(text, "hami_events_dropped_total", &[]), Some(0));
        assert_eq!(
            metric(
                text,
                "hami_container_observed_bytes",
                &["region=\"/r\"", "cuda_device=\"0\""]
            ),
            Some(536870912)
        );
        assert_eq!(
            metric(text, "hami_container_observed_bytes", &["region=\"/x\""]),
            None
        );
        assert_eq!(metric(text, "hami_findings", &[]), None);
    }

    #[test]
    pub(super) fn describe_orders_fields_and_sizes_bytes() {
        let f = serde_json::json!({
            "level": "WARN", "message": "finding: x", "kind": "bypass",
            "pid": 7, "bytes": 536870912, "container": "host"
        });
        assert_eq!(
            describe(&f),
            "WARN finding: x kind=bypass pid=7 container=host bytes=512 MiB"
        );
    }
}
