//! The agent's record of compute shares: at each NVML sample, every open region's share of
//! each device it covers (its processes' SM utilisation, summed; see [`crate::compute`]),
//! kept per region file and device for the windows the metrics and the findings use.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use hami_common::region::RegionSnapshot;

use crate::compute::{container_share, ComputeView, ShareHistory};

use super::types::Agent;
use super::views::shown_devices;

/// Observations kept beyond the longest window (a sample late by up to this much still
/// finds the previous ones).
const KEEP_SLACK: Duration = Duration::from_secs(5);

impl Agent {
    /// Observes the latest NVML sample's compute shares (called by
    /// [`Agent::set_nvml_at`], after the regions were read again).
    pub(super) fn observe_compute(&mut self, now: Instant) {
        let Some(n) = self.nvml.as_ref() else {
            return;
        };
        // Each region's processes, hooked or not (the pids NVML names are host pids).
        let mut users: HashMap<usize, Vec<u32>> = HashMap::new();
        for (&pid, e) in &self.entries {
            if let Some(i) = e.region {
                users.entry(i).or_default().push(pid);
            }
        }
        let mut seen = Vec::new();
        for (i, r) in self.regions.iter().enumerate() {
            let Some(rn) = self.region_nvml(i, r) else {
                continue;
            };
            let covered = shown_devices(r.snapshot.as_ref().unwrap_or(&rn.snapshot));
            for (d, idx) in rn.device_index.iter().enumerate().take(covered) {
                let Some(idx) = *idx else { continue };
                let pids = users.get(&i).map(Vec::as_slice).unwrap_or(&[]);
                if let Some((share, parts)) = container_share(n, idx, pids.iter().copied()) {
                    seen.push(((r.file_id, d), share, parts));
                }
            }
        }
        let o = &self.opts.compute;
        let keep = o.window.max(o.share_window) + KEEP_SLACK;
        for (key, share, parts) in seen {
            let (h, p) = self.compute.histories.entry(key).or_default();
            match h {
                Some(h) => h.push(now, share, keep),
                None if share > 0.0 => *h = Some(ShareHistory::new(now, share)),
                None => {}
            }
            *p = parts;
        }
        // Regions released since: their histories go with them.
        let open = &self.region_ids;
        self.compute
            .histories
            .retain(|(file, _), _| open.contains_key(file));
        self.compute.at = Some(now);
        self.compute.at_ns = Some(super::regions::monotonic_ns());
    }

    /// Each GPU at the latest NVML sample: its utilisation, memory and name, where NVML gave
    /// them.
    pub fn gpu_series(&self) -> Vec<crate::metrics::GpuSeries> {
        let Some(n) = &self.nvml else {
            return Vec::new();
        };
        n.devices
            .iter()
            .map(|d| crate::metrics::GpuSeries {
                index: d.index,
                uuid: d.uuid.clone().unwrap_or_default(),
                utilization: n.gpu_util.get(&d.index).copied(),
                memory_total: d.total,
                memory_used: d.used,
                name: n.names.get(&d.index).cloned(),
                memory_utilization: n.mem_util.get(&d.index).copied(),
            })
            .collect()
    }

    /// The compute views of an open region (its file id and current snapshot): per device it
    /// covers, the limit and counters it records and the share measured, the windows ending
    /// at the latest NVML sample.
    pub(super) fn compute_views(
        &self,
        file: (u64, u64),
        snap: &RegionSnapshot,
    ) -> Vec<ComputeView> {
        let o = &self.opts.compute;
        (0..shown_devices(snap))
            .map(|d| {
                let rec = snap.compute[d];
                let mut v = ComputeView {
                    device: d as u32,
                    limit: rec.limit_percent(),
                    sm_limit: rec.sm_limit,
                    policy: rec.policy,
                    consumed_ns: rec.consumed_ns,
                    throttled: rec.throttled,
                    throttled_ns: rec.throttled_ns,
                    refusals: rec.refusals,
                    priority: snap.arbiter.task_priority,
                    ..ComputeView::default()
                };
                if let Some(dec) = self.decision(file, d) {
                    let bp = f64::from(dec.grant.bp);
                    v.grant = Some(bp / 100.0);
                    v.lent = ((bp - f64::from(dec.share) * 100.0) / 100.0).max(0.0);
                    v.held = dec.grant.held;
                    v.turn = dec.turn.map_or(0.0, |t| {
                        f64::from(t.len) * 100.0 / f64::from(hami_common::arbiter::TURN_UNITS)
                    });
                    v.busy = dec.busy;
                }
                if let (Some((h, parts)), Some(at)) =
                    (self.compute.histories.get(&(file, d)), self.compute.at)
                {
                    match h {
                        Some(h) => {
                            v.share = h.mean(at, o.share_window);
                            v.window_share = h.mean(at, o.window);
                            v.watched_secs = h.watched(at).as_secs_f64();
                        }
                        // Measured, never busy yet.
                        None => {
                            v.share = Some(0.0);
                            v.window_share = Some(0.0);
                        }
                    }
                    v.by_pid = parts.clone();
                    v.sampled_at_ns = self.compute.at_ns;
                }
                v
            })
            .collect()
    }
}
