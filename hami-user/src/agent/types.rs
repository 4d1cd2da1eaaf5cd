//! What the [`Agent`] is made of: its options, the entries it keeps per process and per
//! region, what a tick produces, and its limits.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::File;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hami_common::region::RegionSnapshot;
use serde::Serialize;

use super::records::{ArbiterState, ComputeRecord};
use super::{history, pidfds};
use crate::access::FileMeta;
use crate::compute::ComputeOptions;
use crate::findings::{Finding, FindingKey, SlotLiveness, Tolerance};
use crate::identity::{self, Identity, Resolver};
use crate::nvml::NvmlSnapshot;
use crate::procinfo::{self, ProcInfo};
use crate::state::Processes;

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
pub(super) struct KnownProcess {
    pub(super) info: Option<ProcInfo>,
    pub(super) region: Option<usize>,
    pub(super) region_error: Option<String>,
    /// Namespace, pod and container names (resolved when the process is learned).
    pub(super) identity: Identity,
    /// Its pidfd in the agent's [`pidfds::ExitWatch`]: while it is not readable the process
    /// is alive, without a `/proc/<pid>/stat` read. `None`: polled through its stat.
    pub(super) pidfd: Option<pidfds::Pidfd>,
}

/// An open region: a descriptor opened safely (see [`tenantfs`]) and read with `pread`
/// ([`region::read_snapshot`]), never mapped except for the short writes of a reclaim.
pub(super) struct RegionEntry {
    pub(super) fd: Arc<File>,
    pub(super) name: String,
    pub(super) host_path: PathBuf,
    pub(super) container: String,
    /// Namespace, pod and container names of the region's container.
    pub(super) identity: Identity,
    /// Named with `--region`: watched even when no process uses it.
    pub(super) explicit: bool,
    pub(super) pidns: Option<u64>,
    pub(super) file_id: (u64, u64),
    pub(super) snapshot: Option<RegionSnapshot>,
    /// Why the last read failed (truncated, replaced, too slow): the region is then left out
    /// of the evaluation and its processes are reported with this reason.
    pub(super) error: Option<String>,
    /// Set while a read of this region is outstanding on a helper thread.
    pub(super) busy: Arc<AtomicBool>,
    /// `CLOCK_MONOTONIC` just before the snapshot was read.
    pub(super) read_at_ns: u64,
    pub(super) liveness: BTreeMap<usize, SlotLiveness>,
    /// Owner, group and mode, refreshed every tick (`fstat` of the opened file: this
    /// region's own inode, whatever the path names now).
    pub(super) file: Option<FileMeta>,
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
    pub(super) opts: AgentOptions,
    pub(super) own_pidns: Option<u64>,
    pub(super) procs: Processes,
    pub(super) entries: HashMap<u32, KnownProcess>,
    pub(super) regions: Vec<RegionEntry>,
    pub(super) region_ids: HashMap<(u64, u64), usize>,
    pub(super) region_errors: BTreeMap<String, String>,
    pub(super) nvml: Option<NvmlSnapshot>,
    /// NVML samples taken so far.
    pub(super) nvml_seq: u64,
    /// Each open region (by index) as read right after the latest NVML sample.
    pub(super) nvml_regions: HashMap<usize, RegionSnapshot>,
    /// Compute shares measured at the NVML samples.
    pub(super) compute: ComputeRecord,
    pub(super) arbiter: ArbiterState,
    pub(super) pending: HashMap<FindingKey, Instant>,
    /// For findings that need NVML confirmation: the NVML sample they were first seen in.
    pub(super) pending_nvml: HashMap<FindingKey, u64>,
    pub(super) standing: BTreeMap<FindingKey, Finding>,
    /// Findings reported since start, bounded (see [`history`]).
    pub(super) history: history::History,
    pub(super) reclaimed: Vec<Reclaimed>,
    /// `/proc/<pid>/maps` identities of the probed libcuda files (any file name).
    pub(super) libcuda_ids: HashSet<(String, u64)>,
    /// The agent's own start time (ticks since boot), to tell processes that started after it.
    pub(super) started_at: Option<u64>,
    /// Names processes the way a cluster does.
    pub(super) resolver: Resolver,
    /// Regions released since start because no process used them any more.
    pub(super) released_regions: u64,
    /// Mapped files checked for the preload's marker, by `/proc/<pid>/maps` identity (the
    /// least recently looked up forgotten beyond [`PRELOAD_FILES_MAX`]: read again).
    pub(super) preload_files: crate::probes::discovery::memo::Memo<(String, u64), bool>,
    /// Ring-buffer drops counted so far ([`Agent::note_dropped`]).
    pub(super) dropped_seen: u64,
    /// When drops were last noticed (ticks since boot): a process learned later that had
    /// started before may have lost events too.
    pub(super) drops_noticed_at: Option<u64>,
    /// Pids to mark as having lost events once they are tracked.
    pub(super) lost_pending: HashSet<u32>,
    /// Drops were noticed since the last scan for processes the agent may not know at all
    /// (every event of theirs lost); and when that scan last ran.
    pub(super) scan_after_drops: bool,
    pub(super) last_drop_scan: Option<Instant>,
    /// `/proc/<pid>/stat` as read in the current tick (cleared at its start): the process
    /// refresh and the slots' liveness read each pid once per tick.
    pub(super) tick_stats: HashMap<u32, Option<procinfo::Stat>>,
    /// A process not seen before allocated without the preload since the last tick: a
    /// bypass to report now rather than at the next periodic tick ([`Agent::wants_early_tick`]).
    pub(super) early_tick: bool,
    /// The tracked processes' pidfds (see [`pidfds`]); `None` when `proc_root` is not this
    /// kernel's `/proc` (its pids are not ours to open) or there is no tokio runtime.
    pub(super) exits: Option<pidfds::ExitWatch>,
    /// Findings about processes that exited before a tick evaluated them (judged from what
    /// the agent recorded while they lived: [`Agent::judge_exit`]), raised at the next tick.
    pub(super) exited: Vec<Finding>,
    /// Processes that allocated and exited before the agent could read their `/proc` at
    /// their first event: not classified (hooked or not unknown), counted and logged.
    pub(super) unclassified_exits: u64,
}

/// `libvgpu.so*` files whose marker check the agent remembers at most.
pub const PRELOAD_FILES_MAX: usize = 1024;

/// Least time between two `/proc` scans for processes whose every event was dropped.
pub(super) const DROP_SCAN_PERIOD: Duration = Duration::from_secs(2);

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
