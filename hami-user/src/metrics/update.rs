//! How a scan replaces the registry's series ([`super::Metrics`]'s `set_*` methods).

use super::*;

impl Metrics {
    /// Replaces the per-region gauges with `series`: a region or device not in it leaves
    /// `/metrics` now.
    pub fn set_regions(&self, series: &[RegionSeries]) {
        for f in [
            &self.limit,
            &self.accounted,
            &self.accounted_data,
            &self.observed,
            &self.compute_limit,
            &self.compute_held,
            &self.priority,
        ] {
            f.reset();
        }
        self.compute_share.reset();
        self.compute_grant.reset();
        self.compute_lent.reset();
        self.compute_turn.reset();
        for f in [
            &self.compute_seconds,
            &self.compute_throttled,
            &self.compute_throttled_seconds,
            &self.quota_refusals,
        ] {
            // The totals live in the regions: each scan sets them afresh.
            f.reset();
        }
        if let Some(h) = &self.hami {
            h.reset();
        }
        for s in series {
            let dev = s.device.to_string();
            let id = &s.identity;
            let l = [
                id.namespace.as_str(),
                id.pod.as_str(),
                id.container.as_str(),
                s.region.as_str(),
                dev.as_str(),
                s.uuid.as_str(),
            ];
            self.limit.with_label_values(&l).set(clamp(s.limit));
            self.accounted.with_label_values(&l).set(clamp(s.accounted));
            self.accounted_data
                .with_label_values(&l)
                .set(clamp(s.accounted_data));
            self.observed.with_label_values(&l).set(clamp(s.observed));
            self.compute_limit
                .with_label_values(&l)
                .set(i64::from(s.compute_limit));
            if let Some(share) = s.compute_share {
                self.compute_share.with_label_values(&l).set(share);
            }
            if let Some(g) = s.compute_grant {
                self.compute_grant.with_label_values(&l).set(g);
                self.compute_lent.with_label_values(&l).set(s.compute_lent);
                self.compute_turn.with_label_values(&l).set(s.compute_turn);
                self.compute_held
                    .with_label_values(&l)
                    .set(i64::from(s.compute_held));
            }
            if s.compute_limit != 0 {
                self.priority
                    .with_label_values(&l)
                    .set(i64::from(s.priority));
            }
            self.compute_seconds
                .with_label_values(&l)
                .inc_by(s.compute_consumed_ns as f64 / 1e9);
            self.compute_throttled
                .with_label_values(&l)
                .inc_by(s.compute_throttled as f64);
            self.compute_throttled_seconds
                .with_label_values(&l)
                .inc_by(s.compute_throttled_ns as f64 / 1e9);
            self.quota_refusals
                .with_label_values(&l)
                .inc_by(s.quota_refusals as f64);
            if let Some(h) = &self.hami {
                h.set(s);
            }
        }
    }

    /// Replaces the per-GPU gauges (each where NVML gave its figure).
    pub fn set_gpus(&self, gpus: &[GpuSeries]) {
        let fams = [
            &self.gpu_utilization,
            &self.gpu_memory_total,
            &self.gpu_memory_used,
        ];
        for f in fams {
            f.reset();
        }
        for g in gpus {
            let index = g.index.to_string();
            let l = [g.uuid.as_str(), index.as_str()];
            let values = [
                g.utilization.map(i64::from),
                g.memory_total.map(clamp),
                g.memory_used.map(clamp),
            ];
            for (f, v) in fams.iter().zip(values) {
                if let Some(v) = v {
                    f.with_label_values(&l).set(v);
                }
            }
        }
        if let Some(h) = &self.hami {
            h.set_gpus(gpus);
        }
    }

    /// Replaces the per-process gauge (only filled with `per_process`) and the process count.
    pub fn set_processes(&self, procs: &[ProcessSample]) {
        self.process_observed.reset();
        self.process_sm.reset();
        if self.opts.per_process {
            for p in procs {
                let pid = p.pid.to_string();
                let id = &p.identity;
                let l = [
                    pid.as_str(),
                    id.namespace.as_str(),
                    id.pod.as_str(),
                    id.container.as_str(),
                ];
                self.process_observed
                    .with_label_values(&l)
                    .set(clamp(p.observed));
                if let Some(u) = p.sm_util {
                    self.process_sm.with_label_values(&l).set(i64::from(u));
                }
            }
        }
        self.processes.set(procs.len() as i64);
    }

    /// Sets the per-hook process counts.
    pub fn set_hooks(&self, c: HookCounts) {
        for (h, n) in [
            ("hami_rs", c.hami_rs),
            ("hami_core", c.hami_core),
            ("none", c.none),
        ] {
            self.by_hook.with_label_values(&[h]).set(clamp(n));
        }
        self.oversubscribe_refused.set(clamp(c.oversubscribe));
    }

    /// Sets the standing-findings gauges from the findings standing now: the count per kind
    /// and, per kind, reason and workload, the number standing (a label set no finding
    /// stands for any more leaves `/metrics`).
    pub fn set_findings(&self, standing: &[FindingSeries]) {
        for k in FindingKind::ALL {
            let n = standing.iter().filter(|f| f.kind == k).count();
            self.findings.with_label_values(&[k.name()]).set(n as i64);
        }
        let mut by_labels: BTreeMap<[&str; 5], i64> = BTreeMap::new();
        for f in standing {
            let id = &f.identity;
            let l = [
                f.kind.name(),
                f.reason,
                id.namespace.as_str(),
                id.pod.as_str(),
                id.container.as_str(),
            ];
            *by_labels.entry(l).or_default() += 1;
        }
        self.finding.reset();
        for (l, n) in by_labels {
            self.finding.with_label_values(&l).set(n);
        }
    }

    /// Counts newly raised findings.
    pub fn count_new_findings(&self, new: &[crate::findings::Finding]) {
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
}
