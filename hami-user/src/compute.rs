//! Compute shares: how much of each GPU a container really uses, from NVML's per-process SM
//! utilisation, next to the share its region holds it to (`CUDA_DEVICE_SM_LIMIT`).
//!
//! At every NVML sample (`--nvml-interval`, 1 s by default) a container's share of a device
//! is the sum of the SM utilisation NVML reports for the container's processes on that
//! device since the previous sample (a process NVML has no sample for used none). The
//! agent keeps these observations per region and device from the container's first busy
//! one; the exported share is their mean
//! over the last [`ComputeOptions::share_window`] (5 s), the `compute_over_limit` finding
//! compares their mean over the last [`ComputeOptions::window`] (30 s) with the limit. Pure:
//! no clock is read here (callers pass the instants).

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::nvml::NvmlSnapshot;

/// How the measured shares are smoothed and judged.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct ComputeOptions {
    /// Window of the exported share (`hami_container_compute_share_percent`, the audit's
    /// share column): the mean of the observations in it.
    #[serde(with = "secs")]
    pub share_window: Duration,
    /// Window of the `compute_over_limit` finding: the mean share over it is compared with
    /// the limit, and only once the container has been observed for a whole window.
    #[serde(with = "secs")]
    pub window: Duration,
    /// How many percentage points of the device the mean share may exceed the limit by.
    pub tolerance_points: f64,
}

impl Default for ComputeOptions {
    /// 5 s for the exported share; over 30 s, more than 10 points above the limit.
    fn default() -> Self {
        ComputeOptions {
            share_window: Duration::from_secs(5),
            window: Duration::from_secs(30),
            tolerance_points: 10.0,
        }
    }
}

/// Durations as seconds in JSON.
mod secs {
    use serde::Serializer;
    use std::time::Duration;

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_f64(d.as_secs_f64())
    }
}

/// The measured share of one container on one device over time: one observation per NVML
/// sample (percent of the device).
#[derive(Clone, Debug)]
pub struct ShareHistory {
    /// When the first observation was made (how long the container has been watched).
    first: Instant,
    /// `(when, share)`, oldest first, at most `keep` old.
    samples: VecDeque<(Instant, f64)>,
}

impl ShareHistory {
    /// A history starting with one observation.
    pub fn new(at: Instant, share: f64) -> ShareHistory {
        ShareHistory {
            first: at,
            samples: VecDeque::from([(at, share)]),
        }
    }

    /// Adds an observation and forgets those older than `keep`. After a gap longer than
    /// `keep` (NVML gave no figure meanwhile) the container is watched afresh: a window is
    /// only judged once it is covered by observations again.
    pub fn push(&mut self, at: Instant, share: f64, keep: Duration) {
        if self
            .samples
            .back()
            .is_some_and(|(t, _)| at.saturating_duration_since(*t) > keep)
        {
            self.samples.clear();
            self.first = at;
        }
        self.samples.push_back((at, share));
        while self
            .samples
            .front()
            .is_some_and(|(t, _)| at.saturating_duration_since(*t) > keep)
        {
            self.samples.pop_front();
        }
    }

    /// Mean of the observations made in the `window` before `now` (`None`: none).
    pub fn mean(&self, now: Instant, window: Duration) -> Option<f64> {
        let (sum, n) = self
            .samples
            .iter()
            .filter(|(t, _)| now.saturating_duration_since(*t) < window)
            .fold((0.0, 0u32), |(s, n), (_, v)| (s + v, n + 1));
        (n > 0).then(|| sum / f64::from(n))
    }

    /// How long before `now` the first observation was made.
    pub fn watched(&self, now: Instant) -> Duration {
        now.saturating_duration_since(self.first)
    }

    /// The latest observation.
    pub fn latest(&self) -> Option<f64> {
        self.samples.back().map(|(_, v)| *v)
    }
}

/// One observation: the share of NVML device `index` that the processes `pids` used since
/// the previous NVML sample (the sum of their SM utilisation, in percent), with each busy
/// process's part. `None` when NVML's utilisation of that device is unknown at this sample.
pub fn container_share(
    nvml: &NvmlSnapshot,
    index: u32,
    pids: impl IntoIterator<Item = u32>,
) -> Option<(f64, Vec<(u32, u32)>)> {
    if !nvml.util_queried.contains(&index) {
        return None;
    }
    let mut parts: Vec<(u32, u32)> = pids
        .into_iter()
        .filter_map(|p| nvml.sm_on(p, index).filter(|&u| u > 0).map(|u| (p, u)))
        .collect();
    parts.sort_unstable();
    parts.dedup_by_key(|(p, _)| *p);
    let total = parts.iter().map(|&(_, u)| f64::from(u)).sum();
    Some((total, parts))
}

/// What the findings and the metrics know about one region device's compute share.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ComputeView {
    /// Region device ordinal.
    pub device: u32,
    /// The share the container is held to, in percent (`None`: no compute limit).
    pub limit: Option<u32>,
    /// `sm_limit` as the region records it (0 = none).
    pub sm_limit: u32,
    /// Policy as the region records it (`COMPUTE_POLICY_*`).
    pub policy: u32,
    /// The measured share over the share window (`None`: NVML gave no utilisation for it).
    pub share: Option<f64>,
    /// The measured share over the finding's window.
    pub window_share: Option<f64>,
    /// How long the share has been measured (seconds).
    pub watched_secs: f64,
    /// Busy processes at the latest observation: host pid and SM utilisation (percent).
    pub by_pid: Vec<(u32, u32)>,
    /// When the latest observation was made, in ns of `CLOCK_MONOTONIC`: the windows end
    /// there (`None`: never measured).
    pub sampled_at_ns: Option<u64>,
    /// Device time (ns) the container's metered work used (the launch gate's count).
    pub consumed_ns: u64,
    /// Times the container's processes waited at the gate.
    pub throttled: u64,
    /// Time (ns) they waited.
    pub throttled_ns: u64,
    /// Memory requests the preload refused on the device (the region's refusal counter).
    pub refusals: u64,
    /// The container's `CUDA_TASK_PRIORITY` as its region records it (0 the highest).
    pub priority: u32,
    /// What the agent's arbiter lets it use now, in percent of the device (`None`: no
    /// decision: no share, or the arbiter is off).
    pub grant: Option<f64>,
    /// Of the grant, the percent above the share: idle time lent to it.
    pub lent: f64,
    /// Held back (suspended) while a container of a higher priority is busy.
    pub held: bool,
    /// The container's turn while several contend for the GPU, as a percent of the turn
    /// period (0: no turn, it submits at any time).
    pub turn: f64,
    /// Busy in the arbiter's eyes (used the device in the last 300 ms).
    pub busy: bool,
}

impl ComputeView {
    /// Whether the mean share over the whole window exceeds the limit by more than the
    /// tolerance, the container having been measured for at least the window: the
    /// `compute_over_limit` rule. Returns the mean share and the limit when it does. Not
    /// while the arbiter lends the container idle time (its latest grant is above its share):
    /// a heuristic, the window's mean may still hold time used before the loan.
    pub fn over_limit(&self, opts: &ComputeOptions) -> Option<(f64, u32)> {
        // Lent idle time by the arbiter (`default`): using it is no excess (issue 30).
        if self.lent > 0.0 {
            return None;
        }
        let limit = self.limit?;
        let share = self.window_share?;
        if self.watched_secs + 1e-9 < opts.window.as_secs_f64() {
            return None;
        }
        (share > f64::from(limit) + opts.tolerance_points).then_some((share, limit))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nvml::ProcessUtilizationSample;

    fn util(device: u32, samples: &[(u32, u32)]) -> NvmlSnapshot {
        let mut n = NvmlSnapshot::default();
        let s: Vec<ProcessUtilizationSample> = samples
            .iter()
            .map(|&(pid, sm)| ProcessUtilizationSample {
                pid,
                time_stamp: 1,
                sm_util: sm,
                ..Default::default()
            })
            .collect();
        n.add_utilization(device, &s);
        n
    }

    #[test]
    fn a_containers_share_is_the_sum_over_its_processes_only() {
        // Two processes of the container at 20 % and 25 %, a neighbour at 50 %.
        let n = util(0, &[(10, 20), (11, 25), (99, 50)]);
        let (share, parts) = container_share(&n, 0, [10, 11, 12]).unwrap();
        assert_eq!(share, 45.0);
        assert_eq!(
            parts,
            vec![(10, 20), (11, 25)],
            "idle process 12 not listed"
        );
        // A pid named twice counts once.
        assert_eq!(container_share(&n, 0, [10, 10]).unwrap().0, 20.0);
        // A device read with nobody busy: 0, not unknown.
        assert_eq!(container_share(&util(0, &[]), 0, [10]).unwrap().0, 0.0);
        // A device whose utilisation was not read: unknown.
        assert_eq!(container_share(&n, 1, [10]), None);
    }

    #[test]
    fn the_share_is_the_mean_over_the_window_and_old_observations_leave() {
        let t0 = Instant::now();
        let s = |secs: u64| t0 + Duration::from_secs(secs);
        let mut h = ShareHistory::new(t0, 90.0);
        for i in 1..=20 {
            h.push(s(i), 30.0, Duration::from_secs(30));
        }
        // The last 10 s: ten observations of 30.
        assert_eq!(h.mean(s(20), Duration::from_secs(10)), Some(30.0));
        // The last 30 s: the 90 at t0 too.
        let all = h.mean(s(20), Duration::from_secs(30)).unwrap();
        assert!((all - (90.0 + 20.0 * 30.0) / 21.0).abs() < 1e-9, "{all}");
        assert_eq!(h.watched(s(20)), Duration::from_secs(20));
        assert_eq!(h.latest(), Some(30.0));
        // Twenty-five seconds on, only what is younger than `keep` (30 s) is left.
        h.push(s(45), 50.0, Duration::from_secs(30));
        let left = h.mean(s(45), Duration::from_secs(60)).unwrap();
        assert!((left - (6.0 * 30.0 + 50.0) / 7.0).abs() < 1e-9, "{left}");
        assert_eq!(
            h.mean(s(100), Duration::from_secs(10)),
            None,
            "nothing recent"
        );
        assert_eq!(
            h.watched(s(45)),
            Duration::from_secs(45),
            "watched since t0"
        );
        // A gap longer than `keep` (no NVML figure for 40 s): watched afresh from then.
        h.push(s(85), 70.0, Duration::from_secs(30));
        assert_eq!(h.mean(s(85), Duration::from_secs(60)), Some(70.0));
        assert_eq!(h.watched(s(85)), Duration::ZERO);
    }

    #[test]
    fn over_limit_needs_the_tolerance_the_whole_window_and_a_limit() {
        let o = ComputeOptions::default();
        assert_eq!(o.window, Duration::from_secs(30));
        assert_eq!(o.tolerance_points, 10.0);
        let v = ComputeView {
            limit: Some(30),
            window_share: Some(45.0),
            watched_secs: 30.0,
            ..Default::default()
        };
        assert_eq!(v.over_limit(&o), Some((45.0, 30)));
        // Within the tolerance (40 = 30 + 10 exactly): quiet.
        let at_edge = ComputeView {
            window_share: Some(40.0),
            ..v.clone()
        };
        assert_eq!(at_edge.over_limit(&o), None);
        // Not watched for a whole window yet: quiet.
        let young = ComputeView {
            watched_secs: 29.0,
            ..v.clone()
        };
        assert_eq!(young.over_limit(&o), None);
        // No limit, or no measurement: quiet.
        let unlimited = ComputeView {
            limit: None,
            ..v.clone()
        };
        assert_eq!(unlimited.over_limit(&o), None);
        let unmeasured = ComputeView {
            window_share: None,
            ..v
        };
        assert_eq!(unmeasured.over_limit(&o), None);
    }
}
