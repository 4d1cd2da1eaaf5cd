//! What the agent shows: the views the pure rules of [`crate::findings`] take, the audit
//! report's process and region rows, and the metric series.

use std::collections::{BTreeMap, HashMap};

use hami_abi::layout::MAX_DEVICES;
use hami_common::region::RegionSnapshot;
use serde::Serialize;

use crate::findings::{self, Finding, FindingKind, ProcView, RegionNvml, RegionView};
use crate::identity::Identity;
use crate::metrics::{FindingSeries, ProcessSample, RegionSeries};
use crate::state::Baseline;

use super::types::{Agent, RegionEntry, EVENTS_LOST_NOTE};

/// A process whose events were lost: its observed data is the region's accounting for its
/// slot (exact, and the preload's own), its event history no longer counts for the rules
/// that compare the two. Without a slot, nothing to rebuild from: left as observed.
fn rebuild_from_region(v: &mut ProcView, regions: &[RegionView]) {
    let Some(slot) = v
        .region
        .and_then(|i| regions.get(i))
        .and_then(|r| r.slot_of(v))
    else {
        return;
    };
    v.observed = (0..hami_abi::layout::MAX_DEVICES)
        .map(|d| (Some(d as u32), findings::slot_data_on(slot, d)))
        .filter(|&(_, b)| b > 0)
        .collect();
    v.pre_existing = true;
}

impl Agent {
    /// The views the pure rules take.
    pub(super) fn views(&self) -> (Vec<ProcView>, Vec<RegionView>) {
        self.views_of(None)
    }

    /// [`Agent::views`] with only process `only` (every process: `None`) among the
    /// processes; the regions all the same.
    pub(super) fn views_of(&self, only: Option<u32>) -> (Vec<ProcView>, Vec<RegionView>) {
        // Unreadable regions are left out; `index[i]` is region i's place in the views.
        let mut index: Vec<Option<usize>> = Vec::with_capacity(self.regions.len());
        let regions: Vec<RegionView> = self
            .regions
            .iter()
            .enumerate()
            .filter_map(|(i, r)| {
                let Some(snapshot) = r.snapshot.clone() else {
                    index.push(None);
                    return None;
                };
                index.push(Some(index.iter().flatten().count()));
                Some((i, r, snapshot))
            })
            .map(|(i, r, snapshot)| RegionView {
                compute: self.compute_views(r.file_id, &snapshot),
                name: r.name.clone(),
                container: r.container.clone(),
                single_device: real_devices(&snapshot) == Some(1)
                    || self.nvml.as_ref().is_some_and(|n| n.devices.len() == 1),
                snapshot,
                liveness: r.liveness.clone(),
                node_devices: self
                    .nvml
                    .as_ref()
                    .map(|n| n.devices.len())
                    .filter(|&n| n > 0),
                file: r.file,
                nvml: self.region_nvml(i, r),
            })
            .collect();
        let procs = self
            .procs
            .iter()
            .filter(|p| only.is_none_or(|o| o == p.pid))
            .filter_map(|p| {
                let e = self.entries.get(&p.pid)?;
                let info = e.info.as_ref()?;
                let mut v = ProcView {
                    pid: p.pid,
                    start_time: info.start_time,
                    nspid: info.nspid,
                    container: info.container.clone(),
                    hooked: info.hooked,
                    hami_core: info.hami_core,
                    unhooked_by_request: if info.disable_control {
                        Some(crate::findings::reason::DISABLE_CONTROL)
                    } else if !e.identity.namespace.is_empty()
                        && self
                            .opts
                            .allow_unhooked_namespaces
                            .contains(&e.identity.namespace)
                    {
                        Some(crate::findings::reason::NAMESPACE_ALLOWLISTED)
                    } else {
                        None
                    },
                    region: e.region.and_then(|i| index.get(i).copied().flatten()),
                    region_error: e.region_error.clone().or_else(|| {
                        let r = self.regions.get(e.region?)?;
                        r.error
                            .as_ref()
                            .map(|err| format!("region unreadable: {err}"))
                    }),
                    observed: container_devices(
                        p.by_device(),
                        info.visible_devices.as_deref(),
                        e.region
                            .and_then(|i| self.regions.get(i)?.snapshot.as_ref())
                            .map(|s| &s.uuids[..]),
                    ),
                    alloc_events: p.alloc_events,
                    peak_bytes: p.peak_bytes,
                    pre_existing: p.baseline.is_pre_existing(),
                    attached_late: matches!(p.baseline, Baseline::AttachedLate { .. }),
                    nvml_bytes: self.nvml.as_ref().and_then(|n| n.total_of(p.pid)),
                    nvml_devices: self
                        .nvml
                        .as_ref()
                        .and_then(|n| n.used_by(p.pid))
                        .unwrap_or_default(),
                    nvml_sm: self
                        .nvml
                        .as_ref()
                        .map(|n| n.sm_by(p.pid))
                        .unwrap_or_default(),
                    seen_by_events: p.first_ns != 0 || p.alloc_events + p.free_events > 0,
                    env_limits: info.env_limits.clone(),
                    creds: info.creds.clone(),
                };
                if p.events_lost {
                    rebuild_from_region(&mut v, &regions);
                }
                Some(v)
            })
            .collect();
        (procs, regions)
    }

    /// What the NVML comparison of region `i` uses: the region as read right after the
    /// latest NVML sample, and the NVML index of each of its devices (by UUID; a region that
    /// recorded no UUID for device 0 on a node with one GPU: that GPU).
    pub(super) fn region_nvml(&self, i: usize, r: &RegionEntry) -> Option<RegionNvml> {
        let n = self.nvml.as_ref()?;
        let snapshot = self.nvml_regions.get(&i)?.clone();
        let current = r.snapshot.as_ref().unwrap_or(&snapshot);
        let mut device_index = [None; MAX_DEVICES];
        for (d, slot) in device_index.iter_mut().enumerate() {
            let uuid = &current.uuids[d];
            let idx = if uuid.iter().all(|&b| b == 0) {
                (d == 0 && n.devices.len() == 1).then_some(n.devices[0].index)
            } else {
                n.index_of_uuid(uuid)
            };
            *slot = idx.filter(|i| n.queried.contains(i));
        }
        Some(RegionNvml {
            snapshot,
            device_index,
        })
    }

    /// Per region/device usage for metrics.
    pub fn usage(&self) -> Vec<findings::RegionUsage> {
        let (procs, regions) = self.views();
        findings::region_usage(&procs, &regions)
    }

    /// One series per region and device it covers (its header's device count, plus any
    /// device with usage), with its container's names and the GPU's UUID.
    pub fn region_series(&self) -> Vec<RegionSeries> {
        let node_uuid = self
            .nvml
            .as_ref()
            .filter(|n| n.devices.len() == 1)
            .and_then(|n| n.devices[0].uuid.clone());
        let mut out = Vec::new();
        for u in self.usage() {
            let Some(r) = self
                .regions
                .iter()
                .find(|r| r.name == u.region && r.container == u.container)
            else {
                continue;
            };
            let Some(snap) = r.snapshot.as_ref() else {
                continue;
            };
            let covered = (snap.device_count as usize).clamp(1, hami_abi::layout::MAX_DEVICES);
            let d = u.device as usize;
            if d >= covered && u.observed == 0 && u.accounted == 0 {
                continue;
            }
            let uuid = snap
                .uuids
                .get(d)
                .and_then(hami_abi::uuid::format_known)
                .or_else(|| {
                    if covered == 1 {
                        node_uuid.clone()
                    } else {
                        None
                    }
                })
                .unwrap_or_default();
            let compute = self
                .compute_views(r.file_id, snap)
                .into_iter()
                .find(|c| c.device == u.device)
                .unwrap_or_default();
            let kind = |k: &[hami_abi::layout::UsageKind]| -> u64 {
                snap.slots
                    .iter()
                    .filter_map(|s| s.usage.get(d))
                    .map(|row| k.iter().map(|k| row[k.index()]).sum::<u64>())
                    .fold(0u64, u64::saturating_add)
            };
            use hami_abi::layout::UsageKind as K;
            out.push(RegionSeries {
                context: kind(&[K::Context]),
                module: kind(&[K::Module]),
                buffer: kind(&[K::Data, K::Pool]),
                identity: r.identity.clone(),
                region: u.region,
                device: u.device,
                uuid,
                limit: u.limit,
                accounted: u.accounted,
                accounted_data: u.accounted_data,
                observed: u.observed,
                compute_limit: compute.limit.unwrap_or(0),
                compute_share: compute.share,
                compute_consumed_ns: compute.consumed_ns,
                compute_throttled: compute.throttled,
                compute_throttled_ns: compute.throttled_ns,
                quota_refusals: compute.refusals,
                compute_grant: compute.grant,
                compute_lent: compute.lent,
                compute_held: compute.held,
                compute_turn: compute.turn,
                priority: compute.priority,
            });
        }
        out
    }

    /// The findings standing now, each with the workload it is about (for `hami_finding`).
    pub fn finding_series(&self) -> Vec<FindingSeries> {
        self.standing
            .values()
            .map(|f| FindingSeries {
                kind: f.kind,
                reason: f.reason,
                identity: self.finding_identity(f),
            })
            .collect()
    }

    /// Whose a finding is: its process's container (named as its region's when it has one,
    /// as the container series are), else its region's, else its container name alone.
    fn finding_identity(&self, f: &Finding) -> Identity {
        if let Some(e) = f.pid.and_then(|pid| self.entries.get(&pid)) {
            return match e.region.and_then(|i| self.regions.get(i)) {
                Some(r) => r.identity.clone(),
                None => e.identity.clone(),
            };
        }
        // Every container's region may have the same path (`/tmp/cudevshr.cache`): the
        // container tells them apart.
        let region = f.region.as_deref().and_then(|name| {
            self.regions
                .iter()
                .find(|r| r.name == name && r.container == f.container)
        });
        match region {
            Some(r) => r.identity.clone(),
            None => Identity {
                container: f.container.clone(),
                ..Identity::default()
            },
        }
    }

    /// Tracked GPU processes by the library that hooks them (hami-preload, HAMi-core's
    /// `libvgpu.so`, none), and those whose `CUDA_OVERSUBSCRIBE` is refused.
    pub fn hook_counts(&self) -> crate::metrics::HookCounts {
        let mut c = crate::metrics::HookCounts::default();
        for p in self.procs.iter() {
            let Some(info) = self.entries.get(&p.pid).and_then(|e| e.info.as_ref()) else {
                continue;
            };
            if info.hooked {
                c.hami_rs += 1;
            } else if info.hami_core {
                c.hami_core += 1;
            } else {
                c.none += 1;
            }
            if info.oversubscribe {
                c.oversubscribe += 1;
            }
        }
        c
    }

    /// Observed bytes per tracked process, with its container's names (a process whose
    /// events were lost shows its rebuilt figures, as in the report).
    pub fn process_samples(&self) -> Vec<ProcessSample> {
        let (views, _) = self.views();
        let views: HashMap<u32, &ProcView> = views.iter().map(|v| (v.pid, v)).collect();
        self.procs
            .iter()
            .map(|p| ProcessSample {
                pid: p.pid,
                identity: self
                    .entries
                    .get(&p.pid)
                    .map(|e| match e.region {
                        Some(i) => self.regions[i].identity.clone(),
                        None => e.identity.clone(),
                    })
                    .unwrap_or_else(|| Identity {
                        container: "unknown".into(),
                        ..Identity::default()
                    }),
                observed: match views.get(&p.pid) {
                    Some(v) if p.events_lost => v.observed.values().sum(),
                    _ => p.by_device().values().sum(),
                },
                sm_util: views
                    .get(&p.pid)
                    .filter(|v| !v.nvml_sm.is_empty())
                    .map(|v| v.sm_total()),
            })
            .collect()
    }

    /// One row per GPU process known to the agent (tracked through events or the baseline).
    pub fn process_rows(&self) -> Vec<ProcessRow> {
        let (procs, regions) = self.views();
        let standing = self.standing();
        let mut rows = Vec::new();
        for p in self.procs.iter() {
            let e = self.entries.get(&p.pid);
            let info = e.and_then(|e| e.info.as_ref());
            let view = procs.iter().find(|v| v.pid == p.pid);
            let region = view.and_then(|v| v.region).and_then(|i| regions.get(i));
            let slot = match (region, view) {
                (Some(r), Some(v)) => r.slot_of(v),
                _ => None,
            };
            let mut verdict: Vec<&'static str> = standing
                .iter()
                .filter(|f| {
                    f.pid == Some(p.pid)
                        || (f.pid.is_none()
                            && matches!(
                                f.kind,
                                FindingKind::OverLimit | FindingKind::ComputeOverLimit
                            )
                            && region.is_some_and(|r| f.region.as_deref() == Some(&r.name)))
                })
                .map(|f| f.kind.name())
                .collect();
            verdict.sort_unstable();
            verdict.dedup();
            let baseline = match p.baseline {
                Baseline::ObservedFromStart => None,
                Baseline::PreExisting { .. } => {
                    Some("pre-existing, not observed from start".to_string())
                }
                Baseline::AttachedLate { .. } => Some(
                    "attached late: started after the agent, libcuda probed after it was loaded; earlier allocations not observed"
                        .to_string(),
                ),
            };
            // A process whose events were lost shows its rebuilt figures (see views()).
            let rebuilt = p.events_lost.then_some(view).flatten();
            // By the container's device (the view maps the probes' ordinals, issue 29).
            let by_device = view.map_or_else(|| p.by_device(), |v| v.observed.clone());
            let unknown_device = by_device.contains_key(&None);
            // The container's devices (its region's indices): where the probes saw
            // allocations and where its region slot holds usage.
            let mut devices: Vec<u32> = by_device.keys().filter_map(|d| *d).collect();
            if let Some(s) = slot {
                devices.extend(
                    (0..hami_abi::layout::MAX_DEVICES)
                        .filter(|&i| s.device_total(i) != 0 || s.charged[i] != 0)
                        .map(|i| i as u32),
                );
            }
            devices.sort_unstable();
            devices.dedup();
            rows.push(ProcessRow {
                pid: p.pid,
                comm: info.map(|i| i.comm.clone()).unwrap_or_default(),
                container: info.map(|i| i.container.clone()).unwrap_or_default(),
                namespace: e.map(|e| e.identity.namespace.clone()).unwrap_or_default(),
                pod: e.map(|e| e.identity.pod.clone()).unwrap_or_default(),
                uid: view.and_then(|v| v.creds.as_ref()).map(|c| c.fsuid),
                nspid: info.and_then(|i| i.nspid),
                hooked: info.map(|i| i.hooked),
                hook: info.map(|i| {
                    if i.hooked {
                        "hami_rs"
                    } else if i.hami_core {
                        "hami_core"
                    } else {
                        "none"
                    }
                }),
                region: region
                    .map(|r| r.name.clone())
                    .or_else(|| e.and_then(|e| e.region_error.clone())),
                limit: region.map(|r| r.snapshot.limits[0]),
                accounted: slot.map(findings::slot_data),
                accounted_total: slot.map(|s| s.total()),
                observed: rebuilt.map_or(p.live_bytes, |v| v.observed_total()),
                observed_by_device: by_device
                    .into_iter()
                    .map(|(d, b)| (d.map_or("unknown".to_string(), |d| d.to_string()), b))
                    .collect(),
                devices,
                nvml_devices: self
                    .nvml
                    .as_ref()
                    .map(|n| n.devices_of(p.pid))
                    .unwrap_or_default(),
                unknown_device,
                peak_observed: p.peak_bytes,
                live_allocations: p.live_count(),
                alloc_events: p.alloc_events,
                free_events: p.free_events,
                unmatched_frees: p.unmatched_frees,
                nvml: self.nvml.as_ref().and_then(|n| n.total_of(p.pid)),
                sm_util: self
                    .nvml
                    .as_ref()
                    .map(|n| n.sm_by(p.pid))
                    .filter(|m| !m.is_empty())
                    .map(|m| m.values().fold(0u32, |a, &b| a.saturating_add(b))),
                compute_limit: region.and_then(|r| r.compute.first()).and_then(|c| c.limit),
                compute_share: region
                    .and_then(|r| r.compute.first())
                    .and_then(|c| c.limit.and(c.share)),
                baseline,
                baseline_nvml: p.baseline.nvml_bytes(),
                events_lost: p.events_lost.then(|| EVENTS_LOST_NOTE.to_string()),
                verdict: if !verdict.is_empty() {
                    verdict.join(",")
                } else if info.is_some_and(|i| !i.hooked)
                    && p.baseline.is_pre_existing()
                    && self.nvml.as_ref().and_then(|n| n.total_of(p.pid)).is_none()
                {
                    // What it held before the probes went in cannot be known without an
                    // NVML figure for it.
                    "unverified".to_string()
                } else {
                    "ok".to_string()
                },
            });
        }
        rows
    }

    /// One row per open region.
    pub fn region_rows(&self) -> Vec<RegionRow> {
        self.regions
            .iter()
            .map(|r| {
                let mut row = RegionRow {
                    name: r.name.clone(),
                    host_path: r.host_path.display().to_string(),
                    container: r.container.clone(),
                    namespace: r.identity.namespace.clone(),
                    pod: r.identity.pod.clone(),
                    file_id: format!("{}:{}", r.file_id.0, r.file_id.1),
                    device_count: 0,
                    limits: Vec::new(),
                    used: Vec::new(),
                    active_slots: 0,
                    reclaimed_slots: 0,
                    compute: Vec::new(),
                    error: r.error.clone(),
                };
                if let Some(s) = &r.snapshot {
                    let n = shown_devices(s);
                    row.device_count = s.device_count;
                    row.limits = s.limits[..n].to_vec();
                    row.used = s.used[..n].to_vec();
                    row.active_slots = s.slots.len();
                    row.reclaimed_slots = s.reclaimed_slots;
                    row.compute = self.compute_views(r.file_id, s);
                }
                row
            })
            .collect()
    }
}

/// One process in the audit table / JSON.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ProcessRow {
    /// Host pid.
    pub pid: u32,
    /// Command name.
    pub comm: String,
    /// Container.
    pub container: String,
    /// Kubernetes namespace (empty outside Kubernetes or when unknown).
    pub namespace: String,
    /// Pod name (empty outside Kubernetes or when unknown).
    pub pod: String,
    /// Filesystem uid of the process, when known.
    pub uid: Option<u32>,
    /// Pid inside the container.
    pub nspid: Option<u32>,
    /// Preload mapped (`None`: unknown, the process was gone before it could be read).
    pub hooked: Option<bool>,
    /// Which library hooks it: `hami_rs`, `hami_core` (HAMi-core's `libvgpu.so`) or `none`
    /// (`None`: unknown), as `hami_processes_by_hook` counts it.
    pub hook: Option<&'static str>,
    /// Region name (or why none).
    pub region: Option<String>,
    /// Region limit on device 0 (0 = unlimited).
    pub limit: Option<u64>,
    /// Data bytes its slot accounts.
    pub accounted: Option<u64>,
    /// All bytes its slot accounts (context included).
    pub accounted_total: Option<u64>,
    /// Observed live data bytes.
    pub observed: u64,
    /// Observed by device (`unknown` when the context's device was not seen).
    pub observed_by_device: BTreeMap<String, u64>,
    /// The container's devices (its region's indices, `docs/shared-region.md`, "Which
    /// device") its memory is on: where the probes saw its allocations (their CUDA ordinals
    /// mapped through its `CUDA_VISIBLE_DEVICES`) and where its region slot holds usage; the
    /// process's ordinals for a process without a region; sorted, no duplicates.
    pub devices: Vec<u32>,
    /// NVML device indexes (the node's numbering) where NVML reports memory used by it.
    pub nvml_devices: Vec<u32>,
    /// Whether some bytes could not be attributed to a device.
    pub unknown_device: bool,
    /// Peak observed.
    pub peak_observed: u64,
    /// Live allocations.
    pub live_allocations: usize,
    /// Allocation events.
    pub alloc_events: u64,
    /// Free events.
    pub free_events: u64,
    /// Frees of allocations never seen.
    pub unmatched_frees: u64,
    /// NVML used memory.
    pub nvml: Option<u64>,
    /// NVML SM utilisation at the latest sample, percent of a device, summed over the
    /// devices whose utilisation was read (`None`: unknown).
    pub sm_util: Option<u32>,
    /// The compute share its container is held to on device 0, percent (`None`: no limit).
    pub compute_limit: Option<u32>,
    /// Its container's measured share of device 0 (percent, mean over the share window),
    /// shown where a compute limit exists.
    pub compute_share: Option<f64>,
    /// `pre-existing, not observed from start` for baselined processes.
    pub baseline: Option<String>,
    /// NVML used memory at baseline time.
    pub baseline_nvml: Option<u64>,
    /// Set when the probes dropped events while this process was tracked: why its
    /// observed figures are not its own events (see [`EVENTS_LOST_NOTE`]).
    pub events_lost: Option<String>,
    /// `ok` or the standing finding kinds, comma-separated.
    pub verdict: String,
}

/// One region in the audit JSON.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RegionRow {
    /// Path as its processes name it.
    pub name: String,
    /// Path the agent opened.
    pub host_path: String,
    /// Container.
    pub container: String,
    /// Kubernetes namespace of the region's container (empty when unknown).
    pub namespace: String,
    /// Pod of the region's container (empty when unknown).
    pub pod: String,
    /// `dev:inode`.
    pub file_id: String,
    /// Devices.
    pub device_count: u32,
    /// Limits per device.
    pub limits: Vec<u64>,
    /// Admitted totals per device.
    pub used: Vec<u64>,
    /// Active slots.
    pub active_slots: usize,
    /// Slots reclaimed so far (header counter).
    pub reclaimed_slots: u64,
    /// Per device: its compute limit, the launch gate's counters and the measured share.
    pub compute: Vec<crate::compute::ComputeView>,
    /// Why the region could not be read at the last tick (truncated, replaced, too slow);
    /// its figures are then empty.
    pub error: Option<String>,
}

/// Devices the region's processes really see (the `device_count` the preload records from
/// `cuDeviceGetCount`), `None` when no process recorded it yet (0) or it is out of range.
pub fn real_devices(s: &RegionSnapshot) -> Option<usize> {
    let n = s.device_count as usize;
    (1..=hami_abi::layout::MAX_DEVICES)
        .contains(&n)
        .then_some(n)
}

/// Devices to show for a region: the real count, else (unknown) up to the last device with
/// a limit, a flag, usage or a UUID; at least 1.
pub fn shown_devices(s: &RegionSnapshot) -> usize {
    real_devices(s).unwrap_or_else(|| {
        (0..hami_abi::layout::MAX_DEVICES)
            .rev()
            .find(|&d| {
                s.limits[d] != 0 || s.limit_flags[d] != 0 || s.used[d] != 0 || s.uuids[d] != [0; 16]
            })
            .map_or(1, |d| d + 1)
    })
}

/// A process's observed bytes keyed by the container's device (the region's index) instead
/// of the process's CUDA ordinal (what the probes see): through its `CUDA_VISIBLE_DEVICES`
/// and the UUIDs its region recorded (`hami_common::visible::place_by_entry`; issue 29). An
/// ordinal that cannot be placed is an unknown device (`None`), never another device.
pub(crate) fn container_devices(
    by_ordinal: BTreeMap<Option<u32>, u64>,
    visible: Option<&str>,
    recorded: Option<&[[u8; 16]]>,
) -> BTreeMap<Option<u32>, u64> {
    use hami_common::visible::{place_by_entry, Placement};
    if visible.is_none() {
        return by_ordinal;
    }
    let mut out = BTreeMap::new();
    for (ord, bytes) in by_ordinal {
        let key =
            ord.and_then(
                |o| match place_by_entry(o as usize, visible, recorded.unwrap_or(&[])) {
                    Placement::At { index, .. } => Some(index as u32),
                    Placement::Unknown(_) => None,
                },
            );
        *out.entry(key).or_insert(0) += bytes;
    }
    out
}
