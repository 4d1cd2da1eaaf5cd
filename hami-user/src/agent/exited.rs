//! Processes that exit before a tick evaluates them (issue 31): an unhooked process that
//! allocates and exits between two ticks would otherwise never be judged, since the
//! evaluation only looks at the processes alive at the tick. Its classification (hooked,
//! HAMi-core, unhooked by request) was recorded when its first event arrived (the agent reads
//! its `/proc` then, while the process is inside a CUDA call: [`Agent::learn`]), and its
//! allocations are in the probes' figures; at its exit (its exit event, or its pidfd / stat
//! seen gone) it is judged by the same rules from that record, and what they find is raised
//! at the next tick (reported once, into the history, then cleared: the process is gone).

use crate::findings::{self, Finding, FindingKind};

use super::history::HISTORY_MAX;
use super::types::{Agent, TickOutcome};

/// The detail an exited process's finding gets, after the rule's own.
pub(super) fn exited_note(comm: &str, pid: u32, peak: u64) -> String {
    format!(
        "; {comm} (pid {pid}) exited before the agent's next evaluation, having held up to {}: \
         judged from what the agent recorded at its first event",
        findings::human_bytes(peak)
    )
}

/// Whether a finding about a process that exited is one [`Agent::judge_exit`] reports: the
/// findings that say which hook (or none) the process ran with.
pub(super) fn reported_at_exit(f: &Finding, pid: u32) -> bool {
    f.pid == Some(pid)
        && matches!(
            f.kind,
            FindingKind::Bypass | FindingKind::HamiCore | FindingKind::Unhooked
        )
        && f.reason != findings::reason::OBSERVED_ABOVE_ACCOUNTED
}

impl Agent {
    /// Judges process `pid` as it exits (call before its entry is dropped): an unhooked
    /// process that allocated gets the findings the rules give it from what the agent
    /// recorded (its `/proc` facts read at its first event, its allocations), unless they
    /// are standing already (reported while it lived); they are raised at the next tick.
    /// Hooked processes cost nothing here. A process whose `/proc` was already gone at its
    /// first event cannot be classified: counted ([`Agent::unclassified_exits`]) and logged.
    pub(super) fn judge_exit(&mut self, pid: u32) {
        let Some(e) = self.entries.get(&pid) else {
            return;
        };
        let Some(p) = self.procs.get(pid) else {
            return;
        };
        if p.alloc_events == 0 {
            return;
        }
        let peak = p.peak_bytes;
        let Some(info) = e.info.as_ref() else {
            self.unclassified_exits += 1;
            // Counted (`hami_processes_unclassified_total`), not a line each: short-lived
            // hooked processes (a script's CUDA call) end up here too.
            tracing::debug!(
                pid,
                "a process allocated and exited before the agent could read its /proc: not \
                 classified (hooked or not unknown)"
            );
            return;
        };
        if info.hooked {
            return;
        }
        let comm = info.comm.clone();
        let (procs, regions) = self.views_of(Some(pid));
        let found = findings::evaluate_all(
            &procs,
            &regions,
            self.opts.tolerance,
            self.opts.nvml_tolerance,
            &self.opts.compute,
        );
        for mut f in found {
            if !reported_at_exit(&f, pid) || self.standing.contains_key(&f.key()) {
                continue;
            }
            f.bytes = f.bytes.max(peak);
            f.detail.push_str(&exited_note(&comm, pid, peak));
            if self.exited.len() < HISTORY_MAX {
                self.exited.push(f);
            }
        }
        self.early_tick = true;
    }

    /// Raises the findings of processes that exited since the last tick (see
    /// [`Agent::judge_exit`]): reported once, kept in the history as cleared.
    pub(super) fn raise_exited(&mut self, out: &mut TickOutcome) {
        for f in std::mem::take(&mut self.exited) {
            let k = f.key();
            if self.standing.contains_key(&k) {
                continue;
            }
            self.history.insert(k.clone(), f.clone());
            self.history.cleared(k);
            out.raised.push(f);
        }
    }

    /// Processes that allocated and exited before the agent could read their `/proc` (not
    /// classified, so not reported).
    pub fn unclassified_exits(&self) -> u64 {
        self.unclassified_exits
    }
}
