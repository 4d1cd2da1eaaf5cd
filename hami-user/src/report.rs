//! Output: the `audit` report (table and JSON) and the `inspect` dump of a region.

use std::fmt::Write as _;

use hami_abi::layout::{UsageKind, INIT_READY, MAX_DEVICES};
use hami_abi::uuid::format_known;
use hami_common::region::{Liveness, LivenessProbe, ProcProbe, RegionSnapshot};
use serde::Serialize;
use serde_json::{json, Value};

use crate::agent::{ProcessRow, Reclaimed, RegionRow};
use crate::findings::{human_bytes, Finding, Tolerance};
use crate::nvml::GpuInfo;

/// Exit status of `audit` when a bypass or over-limit finding was raised.
pub const EXIT_FINDINGS: i32 = 2;

/// Probe figures for the report.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ProbeSummary {
    /// libcuda files with probes attached.
    pub attached: Vec<String>,
    /// Events written by the kernel side.
    pub sent: u64,
    /// Events dropped (ring buffer full).
    pub dropped: u64,
    /// Returns without entry.
    pub unpaired: u64,
    /// Events consumed by the agent.
    pub received: u64,
}

/// NVML figures for the report.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct NvmlSummary {
    /// Whether NVML was loaded (the physical check runs only then).
    pub available: bool,
    /// Why not, when it was not.
    pub error: Option<String>,
    /// Devices.
    pub devices: Vec<GpuInfo>,
    /// NVML samples compared with the regions.
    pub samples: u64,
    /// Whether the latest sample had per-process figures (for at least one device).
    pub per_process: bool,
    /// Tolerance of the comparisons with NVML (`None` without NVML).
    pub tolerance: Option<Tolerance>,
    /// How compute shares are smoothed and judged (`None` without NVML).
    pub compute: Option<crate::compute::ComputeOptions>,
}

impl NvmlSummary {
    /// One line on the physical check, for the table.
    pub fn line(&self) -> String {
        match (self.available, self.tolerance) {
            (true, _) if !self.per_process => format!(
                "available, {} samples, but no per-process used memory: no physical check, \
                 findings come from the probes only",
                self.samples
            ),
            (true, Some(t)) => format!(
                "available, {} samples; physical check on (over_limit / drift against NVML, \
                 unhooked processes holding memory), tolerance max({}, {}%)",
                self.samples,
                human_bytes(t.min_bytes),
                t.ratio * 100.0
            ),
            (true, None) => format!("available, {} samples", self.samples),
            (false, _) => format!(
                "not available ({}): no physical check, findings come from the probes only; \
                 unhooked processes that were running before the agent are \"unverified\"",
                self.error.as_deref().unwrap_or("not loaded")
            ),
        }
    }
}

/// A finding in the report, with whether it still stands at the end.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ReportFinding {
    /// The finding (flattened).
    #[serde(flatten)]
    pub finding: Finding,
    /// Still standing when the report was made.
    pub standing: bool,
}

/// Which rows `audit` keeps: `--namespace` and `--pod`, matched exactly against the pod
/// identity the agent resolves for each process and region (see [`crate::identity`]).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Filter {
    /// Kubernetes namespace to keep (`None`: any).
    pub namespace: Option<String>,
    /// Pod name to keep (`None`: any).
    pub pod: Option<String>,
}

impl Filter {
    /// Whether the filter keeps everything.
    pub fn is_empty(&self) -> bool {
        self.namespace.is_none() && self.pod.is_none()
    }

    /// Whether a process or region of this namespace and pod is kept.
    pub fn matches(&self, namespace: &str, pod: &str) -> bool {
        self.namespace.as_deref().is_none_or(|n| n == namespace)
            && self.pod.as_deref().is_none_or(|p| p == pod)
    }
}

/// The `audit` report.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct AuditReport {
    /// Report format version.
    pub version: u32,
    /// Seconds watched.
    pub seconds: f64,
    /// Probes.
    pub probes: ProbeSummary,
    /// NVML.
    pub nvml: NvmlSummary,
    /// GPU processes.
    pub processes: Vec<ProcessRow>,
    /// Regions.
    pub regions: Vec<RegionRow>,
    /// Every finding raised while watching.
    pub findings: Vec<ReportFinding>,
    /// Slots reclaimed (`--reclaim`).
    pub reclaimed: Vec<Reclaimed>,
    /// Whether any bypass or over-limit was found (the exit status is then non-zero).
    pub failed: bool,
    /// The `--namespace` / `--pod` filter applied (`None`: the whole node).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub filter: Option<Filter>,
}

impl AuditReport {
    /// Builds the report from the agent's history and standing findings.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        seconds: f64,
        probes: ProbeSummary,
        nvml: NvmlSummary,
        processes: Vec<ProcessRow>,
        regions: Vec<RegionRow>,
        history: Vec<Finding>,
        standing: &[Finding],
        reclaimed: Vec<Reclaimed>,
    ) -> AuditReport {
        let failed = history.iter().any(|f| f.kind.is_failure());
        let findings = history
            .into_iter()
            .map(|f| {
                let standing = standing.iter().any(|s| s.key() == f.key());
                ReportFinding {
                    finding: f,
                    standing,
                }
            })
            .collect();
        AuditReport {
            version: 1,
            seconds,
            probes,
            nvml,
            processes,
            regions,
            findings,
            reclaimed,
            failed,
            filter: None,
        }
    }

    /// Keeps only the processes and regions of the filter's namespace and pod, the findings
    /// about them (by pid; a finding without a pid by its region and container) and the
    /// slots reclaimed in kept regions. `failed` (and so the exit status) then reflects the
    /// kept findings only. An empty filter keeps everything.
    pub fn filtered(mut self, filter: &Filter) -> AuditReport {
        if filter.is_empty() {
            return self;
        }
        self.processes
            .retain(|p| filter.matches(&p.namespace, &p.pod));
        self.regions
            .retain(|r| filter.matches(&r.namespace, &r.pod));
        let pids: Vec<u32> = self.processes.iter().map(|p| p.pid).collect();
        let regions = &self.regions;
        let in_region = |name: Option<&str>, container: &str| {
            name.is_some_and(|n| {
                regions
                    .iter()
                    .any(|r| r.name == n && r.container == container)
            })
        };
        self.findings.retain(|f| match f.finding.pid {
            Some(pid) => pids.contains(&pid),
            None => in_region(f.finding.region.as_deref(), &f.finding.container),
        });
        self.reclaimed
            .retain(|r| in_region(Some(&r.region), &r.container));
        self.failed = self.findings.iter().any(|f| f.finding.kind.is_failure());
        self.filter = Some(filter.clone());
        self
    }

    /// The process exit status for this report.
    pub fn exit_code(&self) -> i32 {
        if self.failed {
            EXIT_FINDINGS
        } else {
            0
        }
    }

    /// The human table.
    pub fn table(&self) -> String {
        self.render(false)
    }

    /// The human table with more columns (`-o wide`): namespace, pod, uid and command
    /// after the container, the NVML GPU indexes after the device, and the reasons of the
    /// process's standing findings at the end.
    pub fn table_wide(&self) -> String {
        self.render(true)
    }

    fn render(&self, wide: bool) -> String {
        // The compute column only where some container has a compute limit.
        let compute = self.processes.iter().any(|p| p.compute_limit.is_some());
        let mut header: Vec<&str> = vec!["PID", "CONTAINER"];
        if wide {
            header.extend(["NAMESPACE", "POD", "UID", "COMMAND"]);
        }
        header.extend(["NSPID", "HOOKED", "DEVICE"]);
        if wide {
            header.push("NVML_GPU");
        }
        header.extend(["REGION", "LIMIT", "ACCOUNTED", "OBSERVED", "NVML"]);
        if compute {
            header.push("COMPUTE");
        }
        header.push("VERDICT");
        if wide {
            header.push("REASONS");
        }
        let mut rows: Vec<Vec<String>> = vec![header.iter().map(|h| h.to_string()).collect()];
        let list = |v: &[u32]| {
            if v.is_empty() {
                "-".to_string()
            } else {
                v.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
            }
        };
        let text = |s: &str| {
            if s.is_empty() {
                "-".to_string()
            } else {
                s.to_string()
            }
        };
        let opt = |v: Option<u64>| v.map_or("-".to_string(), human_bytes);
        for p in &self.processes {
            let mut verdict = p.verdict.clone();
            if p.baseline.is_some() {
                verdict.push_str(" (baseline)");
            }
            let mut row = vec![p.pid.to_string(), short_container(&p.container)];
            if wide {
                row.extend([
                    text(&p.namespace),
                    text(&p.pod),
                    p.uid.map_or("-".into(), |u| u.to_string()),
                    text(&p.comm),
                ]);
            }
            row.extend([
                p.nspid.map_or("-".into(), |n| n.to_string()),
                match p.hooked {
                    Some(true) => "yes".into(),
                    Some(false) => "no".into(),
                    None => "?".into(),
                },
                list(&p.devices),
            ]);
            if wide {
                row.push(list(&p.nvml_devices));
            }
            row.extend([
                p.region.clone().unwrap_or_else(|| "-".into()),
                match p.limit {
                    Some(0) => "unlimited".into(),
                    l => opt(l),
                },
                opt(p.accounted),
                format!(
                    "{}{}",
                    human_bytes(p.observed),
                    if p.unknown_device { "*" } else { "" }
                ),
                opt(p.nvml),
            ]);
            if compute {
                row.push(compute_cell(p.compute_share, p.compute_limit));
            }
            row.push(verdict);
            if wide {
                let mut reasons: Vec<&str> = self
                    .findings
                    .iter()
                    .filter(|f| f.standing && f.finding.pid == Some(p.pid))
                    .map(|f| f.finding.reason)
                    .collect();
                reasons.sort_unstable();
                reasons.dedup();
                row.push(if reasons.is_empty() {
                    "-".into()
                } else {
                    reasons.join(",")
                });
            }
            rows.push(row);
        }
        let mut widths = vec![0usize; rows[0].len()];
        for r in &rows {
            for (w, c) in widths.iter_mut().zip(r.iter()) {
                *w = (*w).max(c.chars().count());
            }
        }
        let mut out = String::new();
        for r in &rows {
            let line: Vec<String> = r
                .iter()
                .zip(widths.iter())
                .map(|(c, w)| format!("{c:<w$}"))
                .collect();
            let _ = writeln!(out, "{}", line.join("  ").trim_end());
        }
        if self.processes.is_empty() {
            match &self.filter {
                Some(f) => {
                    let _ = writeln!(
                        out,
                        "(no GPU process seen in namespace {} pod {})",
                        f.namespace.as_deref().unwrap_or("*"),
                        f.pod.as_deref().unwrap_or("*")
                    );
                }
                None => {
                    let _ = writeln!(out, "(no GPU process seen)");
                }
            }
        }
        if !self.processes.is_empty() {
            let _ = writeln!(
            out,
            "DEVICE = the container's devices (its region's indices, whatever the process's CUDA_VISIBLE_DEVICES) its memory is on, from the probes and its region slot"
        );
        }
        if self.processes.iter().any(|p| p.unknown_device) {
            let _ = writeln!(
                out,
                "* some allocations could not be attributed to a device (context not seen): per-process totals only"
            );
        }
        if compute {
            let window = self.nvml.compute.map_or(String::new(), |c| {
                format!(" over {} s", c.share_window.as_secs_f64())
            });
            let _ = writeln!(
                out,
                "COMPUTE = the container's share of device 0 (NVML SM utilisation of its processes, mean{window}) / the share it is held to"
            );
        }
        if self.processes.iter().any(|p| p.baseline.is_some()) {
            let _ = writeln!(
                out,
                "(baseline) = running before the agent attached, or loaded a libcuda before its probes went in (\"attached late\"): observed counts only allocations made since, so the probes' comparisons skip it; NVML's comparisons do not (an unhooked process holding device memory is a bypass whenever it started)"
            );
        }
        let _ = writeln!(out);
        if self.findings.is_empty() {
            let _ = writeln!(out, "findings: none");
        } else {
            let _ = writeln!(out, "findings:");
            for f in &self.findings {
                let fi = &f.finding;
                let _ = writeln!(
                    out,
                    "  {:<11} {:<26} pid={} container={} region={} bytes={}{}: {}",
                    fi.kind.name(),
                    fi.reason,
                    fi.pid.map_or("-".into(), |p| p.to_string()),
                    short_container(&fi.container),
                    fi.region.as_deref().unwrap_or("-"),
                    fi.bytes,
                    if f.standing { "" } else { " (cleared)" },
                    fi.detail
                );
            }
        }
        for r in &self.reclaimed {
            let _ = writeln!(
                out,
                "reclaimed: slot {} of {} (pid {}), {} released",
                r.slot,
                r.region,
                r.pid,
                human_bytes(r.bytes)
            );
        }
        let _ = writeln!(
            out,
            "probes: {} libcuda attached, {} events, {} dropped; NVML: {}",
            self.probes.attached.len(),
            self.probes.received,
            self.probes.dropped,
            self.nvml.line()
        );
        out
    }
}

/// `45.2%/30%` (measured share / limit), `-/30%` when the share is unknown, `-` without
/// a compute limit.
fn compute_cell(share: Option<f64>, limit: Option<u32>) -> String {
    match (share, limit) {
        (_, None) => "-".into(),
        (Some(s), Some(l)) => format!("{s:.1}%/{l}%"),
        (None, Some(l)) => format!("-/{l}%"),
    }
}

/// First 12 characters of a 64-hex container id; other names unchanged.
pub fn short_container(c: &str) -> String {
    if c.len() == 64 && c.bytes().all(|b| b.is_ascii_hexdigit()) {
        c[..12].to_string()
    } else {
        c.to_string()
    }
}

fn liveness_name(l: Liveness) -> &'static str {
    match l {
        Liveness::Alive => "alive",
        Liveness::Dead => "dead",
        Liveness::Unknown => "unknown",
    }
}

/// Devices worth printing: the devices the region's processes really see (the count the
/// preload records from `cuDeviceGetCount`) plus any other with usage; while no process has
/// recorded it (count 0), every device with a limit, flags or usage.
fn shown_devices(s: &RegionSnapshot) -> Vec<usize> {
    let real = crate::agent::real_devices(s);
    (0..MAX_DEVICES)
        .filter(|&d| match real {
            Some(n) => d < n || s.used[d] != 0,
            None => d == 0 || s.limits[d] != 0 || s.limit_flags[d] != 0 || s.used[d] != 0,
        })
        .collect()
}

/// `inspect --json`: the whole snapshot, with per-slot liveness as seen from the caller's
/// pid namespace.
pub fn inspect_json(path: &str, s: &RegionSnapshot) -> Value {
    let probe = ProcProbe;
    let devices: Vec<Value> = shown_devices(s)
        .into_iter()
        .map(|d| {
            json!({
                "index": d,
                "limit": s.limits[d],
                "flags": s.limit_flags[d],
                "config_invalid": s.config_invalid(d),
                "uuid": format_known(&s.uuids[d]),
                "used": s.used[d].saturating_sub(s.reserved(d)),
                "reserved": s.reserved(d),
                "admitted": s.used[d],
                "accounted": s.accounted(d),
                "context_footprint": s.context_footprint[d],
                "compute": {
                    "sm_limit": s.compute[d].sm_limit,
                    "policy": s.compute[d].policy,
                    "limit_percent": s.compute[d].limit_percent(),
                    "budget_ns": s.compute[d].budget_ns,
                    "consumed_ns": s.compute[d].consumed_ns,
                    "throttled": s.compute[d].throttled,
                    "throttled_ns": s.compute[d].throttled_ns,
                },
                "refusals": s.compute[d].refusals,
            })
        })
        .collect();
    let slots: Vec<Value> = s
        .slots
        .iter()
        .map(|sl| {
            let usage: Vec<Value> = (0..MAX_DEVICES)
                .filter(|&d| sl.device_total(d) != 0 || sl.charged[d] != 0)
                .map(|d| {
                    json!({
                        "device": d,
                        "context": sl.usage[d][UsageKind::Context.index()],
                        "module": sl.usage[d][UsageKind::Module.index()],
                        "data": sl.usage[d][UsageKind::Data.index()],
                        "pool": sl.usage[d][UsageKind::Pool.index()],
                        "other": sl.usage[d][UsageKind::Other.index()],
                        "charged": sl.charged[d],
                        "reserve": sl.reserve[d],
                    })
                })
                .collect();
            json!({
                "index": sl.index,
                "pid": sl.pid,
                "start_time": sl.start_time,
                "total": sl.total(),
                "liveness": liveness_name(probe.liveness(sl.process())),
                "usage": usage,
            })
        })
        .collect();
    json!({
        "path": path,
        "version": s.version,
        "header_size": s.header_size,
        "total_size": s.total_size,
        "initialised": s.init_state == INIT_READY,
        "device_count": s.device_count,
        "creator_pid": s.creator_pid,
        "created_unix": s.created_unix,
        "boot_id": s.boot_id.iter().map(|b| format!("{b:02x}")).collect::<String>(),
        "generation": s.generation,
        "consistent": s.consistent,
        "owner_died_recoveries": s.owner_died_recoveries,
        "reclaimed_slots": s.reclaimed_slots,
        "devices": devices,
        "slots": slots,
    })
}

/// `inspect`: the human dump.
pub fn inspect_text(path: &str, s: &RegionSnapshot) -> String {
    let probe = ProcProbe;
    let mut o = String::new();
    let _ = writeln!(o, "region {path}");
    let _ = writeln!(
        o,
        "  layout v{}, {} bytes, {}, {} device(s), created by pid {} at {} (unix)",
        s.version,
        s.total_size,
        if s.init_state == INIT_READY {
            "initialised"
        } else {
            "NOT initialised"
        },
        s.device_count,
        s.creator_pid,
        s.created_unix
    );
    let _ = writeln!(
        o,
        "  generation {}{}, {} lock-owner deaths recovered, {} slots reclaimed",
        s.generation,
        if s.consistent {
            ""
        } else {
            " (copy not consistent)"
        },
        s.owner_died_recoveries,
        s.reclaimed_slots
    );
    let _ = writeln!(o, "  devices:");
    for d in shown_devices(s) {
        let _ = writeln!(
            o,
            "    {d}: limit {}{}, used {} ({} bytes), reserved {}, slots account {}{}",
            if s.limits[d] == 0 {
                "unlimited".to_string()
            } else {
                format!("{} ({} bytes)", human_bytes(s.limits[d]), s.limits[d])
            },
            if s.config_invalid(d) {
                " [INVALID CONFIG: fails closed]"
            } else {
                ""
            },
            human_bytes(s.used[d].saturating_sub(s.reserved(d))),
            s.used[d].saturating_sub(s.reserved(d)),
            human_bytes(s.reserved(d)),
            human_bytes(s.accounted(d)),
            format_known(&s.uuids[d])
                .map(|u| format!(", {u}"))
                .unwrap_or_default()
        );
        let _ = writeln!(
            o,
            "       context footprint {}, {} memory request(s) refused",
            match s.context_footprint[d] {
                0 => "not measured yet".to_string(),
                f => format!("{} ({f} bytes)", human_bytes(f)),
            },
            s.compute[d].refusals
        );
        let c = &s.compute[d];
        if c.sm_limit != 0 || c.policy != 0 || c.consumed_ns != 0 || c.throttled != 0 {
            let _ = writeln!(
                o,
                "       compute: share {} (sm_limit {}, policy {}), {:.3} s of device time used, \
                 {} waits at the gate ({:.3} s), budget {} ns",
                c.limit_percent()
                    .map_or("none".to_string(), |l| format!("{l} %")),
                c.sm_limit,
                hami_common::region::compute_policy_name(c.policy),
                c.consumed_ns as f64 / 1e9,
                c.throttled,
                c.throttled_ns as f64 / 1e9,
                c.budget_ns
            );
        }
    }
    let _ = writeln!(o, "  active slots: {}", s.slots.len());
    for sl in &s.slots {
        let _ = writeln!(
            o,
            "    slot {}: pid {} (start {}, {} here), total {}",
            sl.index,
            sl.pid,
            sl.start_time,
            liveness_name(probe.liveness(sl.process())),
            human_bytes(sl.total())
        );
        for d in (0..MAX_DEVICES).filter(|&d| sl.device_total(d) != 0) {
            let _ = writeln!(
                o,
                "      device {d}: context {}, module {}, data {}, pool {}, other {}",
                sl.usage[d][UsageKind::Context.index()],
                sl.usage[d][UsageKind::Module.index()],
                sl.usage[d][UsageKind::Data.index()],
                sl.usage[d][UsageKind::Pool.index()],
                sl.usage[d][UsageKind::Other.index()]
            );
        }
    }
    o
}

#[cfg(test)]
mod tests;
