//! The agent's core: fed events through [`Agent::on_event`] and woken by [`Agent::tick`], it
//! keeps the processes, opens their regions read-only, establishes slot liveness, evaluates
//! the findings (holding racy ones until they persist), and optionally reclaims leaked slots.
//!
//! Nothing here needs root or eBPF: tests drive it with synthetic events, a fake `/proc` tree
//! and real region files.

mod arbiter;
mod compute;
mod exited;
pub mod history;
mod pidfds;
mod processes;
mod records;
mod regions;
#[cfg(test)]
mod tests;
mod types;
mod views;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;
use std::time::Instant;

use tokio::runtime::Handle;

use hami_abi::event::{Event, EventKind};

use crate::findings::{self, Finding, FindingKey};
use crate::identity::{self, Identity, Resolver};
use crate::procinfo;
use crate::state::{Applied, Processes};

pub use pidfds::raise_nofile_limit;
use types::DROP_SCAN_PERIOD;
pub use types::{
    Agent, AgentOptions, Reclaimed, TickOutcome, EVENTS_LOST_NOTE, INPUT_DEADLINE,
    PRELOAD_FILES_MAX,
};
pub use views::{real_devices, shown_devices, ProcessRow, RegionRow};

/// The exit watch, when `proc_root` is a procfs of the agent's own pid namespace (its pids
/// are the ones `pidfd_open` takes; a fake tree's pids name nothing, or other processes) and
/// the agent is made inside a multi-thread tokio runtime, whose reactor watches the pidfds
/// (the agent's runtime has I/O enabled: `main.rs`; registering with one that has not would
/// panic).
fn exit_watch_for(proc_root: &Path) -> Option<pidfds::ExitWatch> {
    if !pidfds::is_own_procfs(proc_root) {
        return None;
    }
    match Handle::try_current() {
        // A current-thread runtime's reactor runs only while its one thread awaits, not
        // while it ticks the agent: exits would be seen late.
        Ok(rt) if rt.runtime_flavor() != tokio::runtime::RuntimeFlavor::CurrentThread => {
            Some(pidfds::ExitWatch::new(rt))
        }
        _ => {
            tracing::debug!("no multi-thread tokio runtime for pidfds: processes' liveness read from /proc/<pid>/stat every tick");
            None
        }
    }
}

impl Agent {
    /// A new agent; opens the explicitly named regions (errors are kept for the report).
    pub fn new(opts: AgentOptions) -> Agent {
        let own_pidns = procinfo::read_pidns(&opts.proc_root, std::process::id())
            .or_else(|| procinfo::read_pidns(Path::new("/proc"), std::process::id()));
        let started_at = procinfo::read_stat(&opts.proc_root, std::process::id())
            .or_else(|_| procinfo::read_stat(Path::new("/proc"), std::process::id()))
            .ok()
            .map(|s| s.start_time);
        let mut a = Agent {
            own_pidns,
            procs: Processes::new(),
            entries: HashMap::new(),
            regions: Vec::new(),
            region_ids: HashMap::new(),
            region_errors: BTreeMap::new(),
            nvml: None,
            nvml_seq: 0,
            nvml_regions: HashMap::new(),
            compute: records::ComputeRecord::default(),
            arbiter: records::ArbiterState::default(),
            pending: HashMap::new(),
            pending_nvml: HashMap::new(),
            standing: BTreeMap::new(),
            history: history::History::default(),
            reclaimed: Vec::new(),
            libcuda_ids: HashSet::new(),
            started_at,
            resolver: Resolver::new(opts.log_root.clone()),
            released_regions: 0,
            preload_files: crate::probes::discovery::memo::Memo::new(PRELOAD_FILES_MAX),
            dropped_seen: 0,
            drops_noticed_at: None,
            lost_pending: HashSet::new(),
            scan_after_drops: false,
            last_drop_scan: None,
            tick_stats: HashMap::new(),
            early_tick: false,
            exits: exit_watch_for(&opts.proc_root),
            exited: Vec::new(),
            unclassified_exits: 0,
            opts,
        };
        for p in a.opts.regions.clone() {
            let name = p.display().to_string();
            let pidns = a.own_pidns;
            // A region in HAMi's per-container folder (`<pod uid>_<container>/`) names its
            // container; any other is labelled `-`.
            let folder = p
                .parent()
                .and_then(|d| d.file_name())
                .and_then(|n| identity::parse_hami_folder(&n.to_string_lossy()));
            let ident = match folder {
                Some(f) => a.resolver.resolve("", Some(f)),
                None => Identity {
                    container: "-".into(),
                    ..Identity::default()
                },
            };
            match a.open_region(&p, &name, "-", ident, pidns) {
                Ok(i) => a.regions[i].explicit = true,
                Err(e) => {
                    a.region_errors.insert(name, e);
                }
            }
        }
        a
    }

    /// The options.
    pub fn options(&self) -> &AgentOptions {
        &self.opts
    }

    /// Consumes one event.
    pub fn on_event(&mut self, ev: &Event) -> Applied {
        let kind = ev.kind;
        if kind == EventKind::ProcessExit {
            self.judge_exit(ev.tgid);
            self.entries.remove(&ev.tgid);
            return self.procs.apply(ev);
        }
        if !self.entries.contains_key(&ev.tgid) {
            self.learn(ev.tgid);
            if kind.is_alloc()
                && self
                    .entries
                    .get(&ev.tgid)
                    .is_some_and(|e| e.info.as_ref().is_some_and(|i| !i.hooked))
            {
                self.early_tick = true;
            }
        }
        self.procs.apply(ev)
    }

    /// Whether an unhooked process was first seen allocating since the last tick: the
    /// caller should tick soon (the bypass is then reported within a fraction of the tick
    /// interval); cleared by [`Agent::tick`].
    pub fn wants_early_tick(&self) -> bool {
        self.early_tick
    }

    /// Tells the agent the probes' total of dropped events (ring buffer full). When it grew,
    /// every tracked process (and any learned later that had started by now) is marked as
    /// having lost events: its observed figures are rebuilt instead of compared (see
    /// [`EVENTS_LOST_NOTE`]). Returns whether it grew.
    pub fn note_dropped(&mut self, total: u64) -> bool {
        if total <= self.dropped_seen {
            return false;
        }
        tracing::warn!(
            dropped = total - self.dropped_seen,
            total,
            "probe events dropped (ring buffer full): tracked processes marked, their figures rebuilt"
        );
        self.dropped_seen = total;
        self.procs.mark_all_events_lost();
        self.scan_after_drops = true;
        self.drops_noticed_at = procinfo::now_ticks(&self.opts.proc_root)
            .or_else(|| procinfo::now_ticks(Path::new("/proc")));
        true
    }

    /// Number of tracked processes.
    pub fn process_count(&self) -> usize {
        self.procs.len()
    }

    /// Refreshes `/proc` facts, snapshots regions, evaluates findings, reclaims if asked.
    pub fn tick(&mut self, now: Instant) -> TickOutcome {
        self.tick_stats.clear();
        self.early_tick = false;
        self.refresh_processes();
        if self.scan_after_drops
            && self
                .last_drop_scan
                .is_none_or(|t| now.saturating_duration_since(t) >= DROP_SCAN_PERIOD)
        {
            // A process whose every event was dropped is unknown: find it the way processes
            // running before the probes are found (libcuda mapped), marked as such.
            self.scan_after_drops = false;
            self.last_drop_scan = Some(now);
            for pid in self.baseline_scan() {
                self.procs.mark_events_lost(pid);
            }
        }
        self.refresh_regions();
        self.release_idle_regions();
        if self.opts.arbiter {
            self.arbitrate();
        }
        self.rebuild_lost();
        let (procs, regions) = self.views();
        let mut found = findings::evaluate_all(
            &procs,
            &regions,
            self.opts.tolerance,
            self.opts.nvml_tolerance,
            &self.opts.compute,
        );
        for f in &mut found {
            if f.pid
                .is_some_and(|pid| self.procs.get(pid).is_some_and(|p| p.events_lost))
            {
                f.detail.push_str("; ");
                f.detail.push_str(EVENTS_LOST_NOTE);
            }
        }
        let mut out = self.settle(found, now);
        self.raise_exited(&mut out);
        if self.opts.reclaim {
            out.reclaimed = self.reclaim();
            self.reclaimed.extend(out.reclaimed.iter().cloned());
        }
        out
    }

    /// Marks the processes waiting for it, and rebuilds each marked process whose slot
    /// accounts no data now (a quiet moment: its true live data is zero).
    pub(super) fn rebuild_lost(&mut self) {
        let pending: Vec<u32> = self.lost_pending.iter().copied().collect();
        for pid in pending {
            if self.procs.get(pid).is_some() {
                self.procs.mark_events_lost(pid);
                self.lost_pending.remove(&pid);
            } else if !self.entries.contains_key(&pid) {
                self.lost_pending.remove(&pid);
            }
        }
        let marked: Vec<u32> = self
            .procs
            .iter()
            .filter(|p| p.events_lost)
            .map(|p| p.pid)
            .collect();
        for pid in marked {
            let Some(e) = self.entries.get(&pid) else {
                continue;
            };
            let (Some(info), Some(r)) = (&e.info, e.region.and_then(|i| self.regions.get(i)))
            else {
                continue;
            };
            let Some(snap) = r.snapshot.as_ref().filter(|s| s.consistent) else {
                continue;
            };
            let slot_pid = info.nspid.unwrap_or(pid);
            let Some(slot) = snap.slots.iter().find(|s| {
                s.pid == slot_pid && (s.start_time == 0 || s.start_time == info.start_time)
            }) else {
                continue;
            };
            if findings::slot_data(slot) == 0 {
                tracing::info!(
                    pid,
                    "process with lost events holds no data: rebuilt, its events count again"
                );
                self.procs.rebuild(pid, r.read_at_ns);
            }
        }
    }

    /// Applies the settle time: immediate findings are reported at once, racy ones once they
    /// have stood for `settle`, and findings against NVML once they have stood for
    /// `nvml_settle` and held in two NVML samples in a row.
    pub(super) fn settle(&mut self, found: Vec<Finding>, now: Instant) -> TickOutcome {
        let mut out = TickOutcome::default();
        let mut current: BTreeMap<FindingKey, Finding> = BTreeMap::new();
        for f in found {
            current.insert(f.key(), f);
        }
        self.pending.retain(|k, _| current.contains_key(k));
        self.pending_nvml.retain(|k, _| current.contains_key(k));
        let mut standing = BTreeMap::new();
        for (k, f) in current {
            let since = *self.pending.entry(k.clone()).or_insert(now);
            let mut ripe = !f.needs_settle() || now.duration_since(since) >= self.opts.settle;
            if f.needs_nvml_confirmation() {
                let first = *self.pending_nvml.entry(k.clone()).or_insert(self.nvml_seq);
                ripe &= self.nvml_seq > first && now.duration_since(since) >= self.opts.nvml_settle;
            }
            if !ripe {
                continue;
            }
            if !self.standing.contains_key(&k) {
                out.raised.push(f.clone());
            }
            self.history.insert(k.clone(), f.clone());
            standing.insert(k, f);
        }
        for (k, f) in std::mem::take(&mut self.standing) {
            if !standing.contains_key(&k) {
                out.cleared.push(f);
                self.history.cleared(k);
            }
        }
        self.history.bound(&standing);
        self.standing = standing;
        out
    }

    /// Findings standing now.
    pub fn standing(&self) -> Vec<Finding> {
        self.standing.values().cloned().collect()
    }

    /// Every finding reported since start (latest numbers for each; at most
    /// [`history::HISTORY_MAX`] cleared ones, see there).
    pub fn history(&self) -> Vec<Finding> {
        self.history.values().cloned().collect()
    }

    /// Slots reclaimed since start.
    pub fn reclaimed(&self) -> &[Reclaimed] {
        &self.reclaimed
    }

    /// Regions that could not be opened, by name.
    pub fn region_errors(&self) -> &BTreeMap<String, String> {
        &self.region_errors
    }
}
