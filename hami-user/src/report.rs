//! Output: the `audit` report (table and JSON) and the `inspect` dump of a region.

use std::fmt::Write as _;

use hami_common::layout::{UsageKind, INIT_READY, MAX_DEVICES};
use hami_common::region::{Liveness, LivenessProbe, ProcProbe, RegionSnapshot};
use hami_common::uuid::format_known;
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
mod tests {
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
        assert_eq!(v["version"], hami_common::layout::VERSION);
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
}
