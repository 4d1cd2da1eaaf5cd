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
mod regions;
#[cfg(test)]
mod tests;
mod views;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::runtime::Handle;

use hami_common::event::{Event, EventKind};
use hami_common::region::RegionSnapshot;
use serde::Serialize;

use crate::access::FileMeta;
use crate::compute::ComputeOptions;
use crate::findings::{self, Finding, FindingKey, SlotLiveness, Tolerance};
use crate::identity::{self, Identity, Resolver};
use crate::nvml::NvmlSnapshot;
use crate::procinfo::{self, ProcInfo};
use crate::state::{Applied, Processes};

pub use pidfds::raise_nofile_limit;
pub use views::{real_devices, shown_devices, ProcessRow, RegionRow};

/// How long one region read, one `/proc` read of a process or one reclaim may take before
/// the agent gives up on it for this tick (it never blocks the rest).
pub const INPUT_DEADLINE: Duration = Duration::from_secs(2);

/// Options of the agent core.
#[derive(Clone, Debug)]
pub struct AgentOptions {
    /// Where `/proc` is.
    pub proc_root: PathBuf,
    /// Tolerance between observed and accounted.
    pub tolerance: Tolerance,
    /// Tolerance between NVML's figures and the region's (or the limit).
    pub nvml_tolerance: Tolerance,
    /// How long a racy finding must persist before it is reported.
    pub settle: Duration,
    /// How long a finding against NVML must persist (and it must also hold in two NVML
    /// samples): a context is in NVML before the preload has measured and charged it.
    pub nvml_settle: Duration,
    /// Release leaked slots through the region's protocol.
    pub reclaim: bool,
    /// Act as every GPU's arbiter of compute shares (`hami_common::arbiter`): decide what
    /// each container may use and write it into its region (opened read-write for it).
    pub arbiter: bool,
    /// Regions to watch even if no live process names them (host paths; slot pids are taken
    /// to be in the agent's own pid namespace).
    pub regions: Vec<PathBuf>,
    /// Where the kubelet's logs are (`/var/log`): names of pods and containers, see
    /// [`crate::identity`].
    pub log_root: PathBuf,
    /// How compute shares are smoothed and judged.
    pub compute: ComputeOptions,
    /// Namespaces whose GPU processes run without the preload on purpose: reported as
    /// `unhooked`, not `bypass` (`--allow-unhooked-namespace`).
    pub allow_unhooked_namespaces: Vec<String>,
}

impl Default for AgentOptions {
    fn default() -> Self {
        AgentOptions {
            proc_root: PathBuf::from("/proc"),
            tolerance: Tolerance::default(),
            nvml_tolerance: Tolerance::NVML_DEFAULT,
            settle: Duration::from_millis(300),
            nvml_settle: Duration::from_millis(1000),
            reclaim: false,
            arbiter: true,
            regions: Vec::new(),
            log_root: PathBuf::from(identity::DEFAULT_LOG_ROOT),
            compute: ComputeOptions::default(),
            allow_unhooked_namespaces: Vec::new(),
        }
    }
}

/// A process the agent knows (from events or from the baseline scan).
#[derive(Debug)]
struct ProcEntry {
    info: Option<ProcInfo>,
    region: Option<usize>,
    region_error: Option<String>,
    /// Namespace, pod and container names (resolved when the process is learned).
    identity: Identity,
    /// Its pidfd in the agent's [`pidfds::ExitWatch`]: while it is not readable the process
    /// is alive, without a `/proc/<pid>/stat` read. `None`: polled through its stat.
    pidfd: Option<pidfds::Pidfd>,
}

/// An open region: a descriptor opened safely (see [`tenantfs`]) and read with `pread`
/// ([`region::read_snapshot`]), never mapped except for the short writes of a reclaim.
struct RegionEntry {
    fd: Arc<File>,
    name: String,
    host_path: PathBuf,
    container: String,
    /// Namespace, pod and container names of the region's container.
    identity: Identity,
    /// Named with `--region`: watched even when no process uses it.
    explicit: bool,
    pidns: Option<u64>,
    file_id: (u64, u64),
    snapshot: Option<RegionSnapshot>,
    /// Why the last read failed (truncated, replaced, too slow): the region is then left out
    /// of the evaluation and its processes are reported with this reason.
    error: Option<String>,
    /// Set while a read of this region is outstanding on a helper thread.
    busy: Arc<AtomicBool>,
    /// `CLOCK_MONOTONIC` just before the snapshot was read.
    read_at_ns: u64,
    liveness: BTreeMap<usize, SlotLiveness>,
    /// Owner, group and mode, refreshed every tick (`fstat` of the opened file: this
    /// region's own inode, whatever the path names now).
    file: Option<FileMeta>,
}

/// A slot released by `--reclaim`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Reclaimed {
    /// Region name.
    pub region: String,
    /// Container.
    pub container: String,
    /// Slot index.
    pub slot: usize,
    /// Pid the slot held (its namespace).
    pub pid: u32,
    /// Start time the slot held.
    pub start_time: u64,
    /// Bytes released.
    pub bytes: u64,
}

/// What one [`Agent::tick`] produced.
#[derive(Clone, Debug, Default)]
pub struct TickOutcome {
    /// Findings reported for the first time.
    pub raised: Vec<Finding>,
    /// Findings that stopped standing.
    pub cleared: Vec<Finding>,
    /// Slots reclaimed.
    pub reclaimed: Vec<Reclaimed>,
}

/// The agent core. See the module docs.
pub struct Agent {
    opts: AgentOptions,
    own_pidns: Option<u64>,
    procs: Processes,
    entries: HashMap<u32, ProcEntry>,
    regions: Vec<RegionEntry>,
    region_ids: HashMap<(u64, u64), usize>,
    region_errors: BTreeMap<String, String>,
    nvml: Option<NvmlSnapshot>,
    /// NVML samples taken so far.
    nvml_seq: u64,
    /// Each open region (by index) as read right after the latest NVML sample.
    nvml_regions: HashMap<usize, RegionSnapshot>,
    /// Compute shares measured at the NVML samples.
    compute: compute::ComputeRecord,
    arbiter: arbiter::ArbiterState,
    pending: HashMap<FindingKey, Instant>,
    /// For findings that need NVML confirmation: the NVML sample they were first seen in.
    pending_nvml: HashMap<FindingKey, u64>,
    standing: BTreeMap<FindingKey, Finding>,
    /// Findings reported since start, bounded (see [`history`]).
    history: history::History,
    reclaimed: Vec<Reclaimed>,
    /// `/proc/<pid>/maps` identities of the probed libcuda files (any file name).
    libcuda_ids: HashSet<(String, u64)>,
    /// The agent's own start time (ticks since boot), to tell processes that started after it.
    started_at: Option<u64>,
    /// Names processes the way a cluster does.
    resolver: Resolver,
    /// Regions released since start because no process used them any more.
    released_regions: u64,
    /// Mapped files checked for the preload's marker, by `/proc/<pid>/maps` identity (the
    /// least recently looked up forgotten beyond [`PRELOAD_FILES_MAX`]: read again).
    preload_files: crate::probes::discovery::memo::Memo<(String, u64), bool>,
    /// Ring-buffer drops counted so far ([`Agent::note_dropped`]).
    dropped_seen: u64,
    /// When drops were last noticed (ticks since boot): a process learned later that had
    /// started before may have lost events too.
    drops_noticed_at: Option<u64>,
    /// Pids to mark as having lost events once they are tracked.
    lost_pending: HashSet<u32>,
    /// Drops were noticed since the last scan for processes the agent may not know at all
    /// (every event of theirs lost); and when that scan last ran.
    scan_after_drops: bool,
    last_drop_scan: Option<Instant>,
    /// `/proc/<pid>/stat` as read in the current tick (cleared at its start): the process
    /// refresh and the slots' liveness read each pid once per tick.
    tick_stats: HashMap<u32, Option<procinfo::Stat>>,
    /// A process not seen before allocated without the preload since the last tick: a
    /// bypass to report now rather than at the next periodic tick ([`Agent::wants_early_tick`]).
    early_tick: bool,
    /// The tracked processes' pidfds (see [`pidfds`]); `None` when `proc_root` is not this
    /// kernel's `/proc` (its pids are not ours to open) or there is no tokio runtime.
    exits: Option<pidfds::ExitWatch>,
    /// Findings about processes that exited before a tick evaluated them (judged from what
    /// the agent recorded while they lived: [`Agent::judge_exit`]), raised at the next tick.
    exited: Vec<Finding>,
    /// Processes that allocated and exited before the agent could read their `/proc` at
    /// their first event: not classified (hooked or not unknown), counted and logged.
    unclassified_exits: u64,
}

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

/// `libvgpu.so*` files whose marker check the agent remembers at most.
pub const PRELOAD_FILES_MAX: usize = 1024;

/// Least time between two `/proc` scans for processes whose every event was dropped.
const DROP_SCAN_PERIOD: Duration = Duration::from_secs(2);

/// Why a process's observed figures are not its own events (shown in the report).
pub const EVENTS_LOST_NOTE: &str = "events lost (probe ring buffer full): observed figures \
     rebuilt from the region's accounting until the process holds no data (then its events \
     count again)";

impl std::fmt::Debug for Agent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Agent")
            .field("processes", &self.procs.len())
            .field("regions", &self.regions.len())
            .finish()
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
            compute: compute::ComputeRecord::default(),
            arbiter: arbiter::ArbiterState::default(),
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
