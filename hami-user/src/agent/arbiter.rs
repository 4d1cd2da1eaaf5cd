//! The agent as every GPU's arbiter of compute shares (issue 30): at most every
//! [`PERIOD_NS`], from the regions read this tick, [`Arbiter::tick`] decides what each
//! container may use of each GPU (`hami_common::arbiter::decide`: `default` work-conserving,
//! `force` a hard cap, a busy higher priority suspending the lower ones), and the decision is
//! written into each region with `pwrite` ([`region::write_arbiter`]), on a helper thread
//! bounded like every other access to a tenant's file. A word found changed since the agent
//! wrote it is tampering: logged, counted, and overwritten by this decision.

use std::collections::HashMap;
use std::sync::Arc;

use hami_common::arbiter::{encode_grant, encode_turn, Decision, Observed, PERIOD_NS};
use hami_common::region;

use super::regions::monotonic_ns;
use super::types::{Agent, INPUT_DEADLINE};
use super::views::shown_devices;
use crate::tenantfs;

/// A region's key for the arbiter: its file id (device, inode), folded.
pub(super) fn region_key(file_id: (u64, u64)) -> u64 {
    file_id.1 ^ file_id.0.rotate_left(48)
}

impl Agent {
    /// Decides and writes the grants (at most every [`PERIOD_NS`]).
    pub(super) fn arbitrate(&mut self) {
        let now = monotonic_ns();
        if self
            .arbiter
            .at
            .is_some_and(|t| now.saturating_sub(t) < PERIOD_NS)
        {
            return;
        }
        self.arbiter.at = Some(now);
        let mut obs = Vec::new();
        for r in &self.regions {
            let (Some(s), None) = (&r.snapshot, &r.error) else {
                continue;
            };
            for d in 0..shown_devices(s) {
                let c = s.compute[d];
                obs.push(Observed {
                    region: region_key(r.file_id),
                    dev: d,
                    gpu: s.uuids[d],
                    sm_limit: c.sm_limit,
                    policy: c.policy,
                    priority: s.arbiter.task_priority,
                    consumed_ns: c.consumed_ns,
                    throttled: c.throttled,
                    grant: s.arbiter.grants[d],
                });
            }
        }
        let decisions = self.arbiter.arbiter.tick(now, &obs);
        self.arbiter.latest.clear();
        let mut words: HashMap<u64, Vec<region::ArbiterWords>> = HashMap::new();
        for d in decisions {
            if d.tampered {
                self.arbiter.tampered += 1;
            }
            words.entry(d.region).or_default().push((
                d.dev,
                encode_grant(d.grant),
                encode_turn(d.turn),
            ));
            self.arbiter.latest.insert((d.region, d.dev), d);
        }
        for (key, words) in words {
            let Some(r) = self.regions.iter().find(|r| region_key(r.file_id) == key) else {
                continue;
            };
            if self
                .arbiter
                .latest
                .iter()
                .any(|((k, _), d)| *k == key && d.tampered)
            {
                tracing::warn!(region = %r.name, "arbiter grant changed by someone else (tamper): rewritten");
            }
            let f = Arc::clone(&r.fd);
            let w = words.clone();
            let done = tenantfs::bounded(
                format!("arbiter write to region {}", r.name),
                INPUT_DEADLINE,
                None,
                move || region::write_arbiter(&f, &w, now).map_err(|e| e.to_string()),
            )
            .map_err(|e| e.to_string())
            .and_then(|r| r);
            if let Err(e) = done {
                tracing::debug!(region = %r.name, error = %e, "cannot write the arbiter's decision (region read-only?)");
                for (dev, _, _) in words {
                    self.arbiter.arbiter.unwritten(key, dev);
                }
            }
        }
    }

    /// The arbiter's latest decision for a region's device, if any.
    pub(super) fn decision(&self, file_id: (u64, u64), dev: usize) -> Option<&Decision> {
        self.arbiter.latest.get(&(region_key(file_id), dev))
    }

    /// Grant words found changed since the agent wrote them (tampering), since start.
    pub fn arbiter_tampered(&self) -> u64 {
        self.arbiter.tampered
    }
}
