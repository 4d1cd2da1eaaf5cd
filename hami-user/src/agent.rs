//! The agent's core: fed events through [`Agent::on_event`] and woken by [`Agent::tick`], it
//! keeps the processes, opens their regions read-only, establishes slot liveness, evaluates
//! the findings (holding racy ones until they persist), and optionally reclaims leaked slots.
//!
//! Nothing here needs root or eBPF: tests drive it with synthetic events, a fake `/proc` tree
//! and real region files.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hami_common::event::{CudaEvent, EventKind};
use hami_common::region::{self, ProcessId, Region, RegionSnapshot, SlotId};
use serde::Serialize;

use crate::access::FileMeta;
use crate::findings::{
    self, Finding, FindingKey, FindingKind, ProcView, RegionNvml, RegionView, SlotLiveness,
    Tolerance,
};
use crate::identity::{self, Identity, Resolver};
use crate::metrics::{ProcessSample, RegionSeries};
use crate::nvml::NvmlSnapshot;
use crate::procinfo::{self, ProcInfo};
use crate::state::{Applied, Baseline, Processes};
use crate::tenantfs;
use hami_common::layout::MAX_DEVICES;

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
    /// Regions to watch even if no live process names them (host paths; slot pids are taken
    /// to be in the agent's own pid namespace).
    pub regions: Vec<PathBuf>,
    /// Where the kubelet's logs are (`/var/log`): names of pods and containers, see
    /// [`crate::identity`].
    pub log_root: PathBuf,
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
            regions: Vec::new(),
            log_root: PathBuf::from(identity::DEFAULT_LOG_ROOT),
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

/// Owner, group and permission bits of a regular file.
fn file_meta(md: &std::fs::Metadata) -> Option<FileMeta> {
    md.is_file().then(|| FileMeta {
        mode: md.mode() & 0o7777,
        uid: md.uid(),
        gid: md.gid(),
    })
}

/// HAMi-core's library file name, which HAMi's device plugin mounts into containers.
const HAMI_CORE_NAME: &str = "libvgpu.so";
/// The symbol hami-preload exports so that it is recognised under another name.
const PRELOAD_MARKER: &str = "hami_preload_marker";

/// Opens a tenant's region path inside its root (read-write first with `reclaim`).
fn open_tenant_region(
    root: &Path,
    name: &str,
    shown: &Path,
    reclaim: bool,
) -> Result<File, tenantfs::TenantFsError> {
    if reclaim {
        if let Ok(f) = tenantfs::open_in_root(root, name, shown, true) {
            return Ok(f);
        }
    }
    tenantfs::open_in_root(root, name, shown, false)
}

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
    v.observed = (0..hami_common::layout::MAX_DEVICES)
        .map(|d| (Some(d as u32), findings::slot_data_on(slot, d)))
        .filter(|&(_, b)| b > 0)
        .collect();
    v.pre_existing = true;
}

/// [`procinfo::read_proc`] on a helper thread, given up after [`INPUT_DEADLINE`] (reading
/// `maps` or `environ` waits for the process's memory-map lock, which it can hold).
fn read_proc_bounded(proc_root: &Path, pid: u32) -> Option<ProcInfo> {
    let root = proc_root.to_path_buf();
    match tenantfs::bounded(format!("/proc/{pid}"), INPUT_DEADLINE, None, move || {
        procinfo::read_proc(&root, pid)
    }) {
        Ok(r) => r.ok(),
        Err(e) => {
            tracing::warn!(pid, error = %e, "process not readable in time");
            None
        }
    }
}

/// The files named `libvgpu.so*` (HAMi-core's name) that a process maps, by
/// `/proc/<pid>/maps` identity, each with whether it is hami-preload: its `.dynsym` defines
/// [`PRELOAD_MARKER`]. The path is the tenant's: opened inside the process's root (see
/// [`tenantfs::open_in_root`]), regular files only, at most
/// [`crate::probes::discovery::MAX_ELF_READ`] bytes read. Files in `known` are not read again.
fn preload_files_of(
    proc_root: &Path,
    pid: u32,
    known: &HashMap<(String, u64), bool>,
) -> Vec<((String, u64), bool)> {
    let Ok(maps) = procinfo::read_maps(proc_root, pid) else {
        return Vec::new();
    };
    let root = proc_root.join(pid.to_string()).join("root");
    let mut out: Vec<((String, u64), bool)> = Vec::new();
    for m in procinfo::maps_entries(&maps) {
        let path = m.path.strip_suffix(" (deleted)").unwrap_or(m.path);
        let name = path.rsplit('/').next().unwrap_or("");
        if !path.starts_with('/') || !name.starts_with(HAMI_CORE_NAME) {
            continue;
        }
        let key = (m.dev.to_string(), m.inode);
        if out.iter().any(|(k, _)| *k == key) {
            continue;
        }
        let is = match known.get(&key) {
            Some(&is) => is,
            None => tenantfs::open_in_root(&root, path, Path::new(path), false)
                .ok()
                .and_then(|f| {
                    crate::probes::discovery::dynamic_symbols_defined(
                        &object::read::ReadCache::new(f),
                        &[PRELOAD_MARKER],
                        crate::probes::discovery::MAX_ELF_READ,
                    )
                    .ok()
                })
                .is_some_and(|found| !found.is_empty()),
        };
        out.push((key, is));
    }
    out
}

/// One bounded `pread` snapshot of a region (see [`region::read_snapshot`]).
fn read_region(
    file: &Arc<File>,
    name: &str,
    busy: &Arc<AtomicBool>,
) -> Result<RegionSnapshot, String> {
    let f = Arc::clone(file);
    let path = PathBuf::from(name);
    tenantfs::bounded(
        format!("region {name}"),
        INPUT_DEADLINE,
        Some(busy),
        move || region::read_snapshot(&f, &path),
    )
    .map_err(|e| e.to_string())?
    .map_err(|e| e.to_string())
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
    pending: HashMap<FindingKey, Instant>,
    /// For findings that need NVML confirmation: the NVML sample they were first seen in.
    pending_nvml: HashMap<FindingKey, u64>,
    standing: BTreeMap<FindingKey, Finding>,
    history: BTreeMap<FindingKey, Finding>,
    reclaimed: Vec<Reclaimed>,
    /// `/proc/<pid>/maps` identities of the probed libcuda files (any file name).
    libcuda_ids: HashSet<(String, u64)>,
    /// The agent's own start time (ticks since boot), to tell processes that started after it.
    started_at: Option<u64>,
    /// Names processes the way a cluster does.
    resolver: Resolver,
    /// Regions released since start because no process used them any more.
    released_regions: u64,
    /// Mapped files checked for the preload's marker, by `/proc/<pid>/maps` identity.
    preload_files: HashMap<(String, u64), bool>,
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
}

/// Least time between two `/proc` scans for processes whose every event was dropped.
const DROP_SCAN_PERIOD: Duration = Duration::from_secs(2);

/// Why a process's observed figures are not its own events (shown in the report).
pub const EVENTS_LOST_NOTE: &str = "events lost (probe ring buffer full): observed figures \
     rebuilt from the region's accounting until the process holds no data (then its events \
     count again)";

/// `CLOCK_MONOTONIC` now in ns (the clock of the probes' `ts_ns`).
fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid out pointer; CLOCK_MONOTONIC always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64).saturating_mul(1_000_000_000) + ts.tv_nsec as u64
}

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
            pending: HashMap::new(),
            pending_nvml: HashMap::new(),
            standing: BTreeMap::new(),
            history: BTreeMap::new(),
            reclaimed: Vec::new(),
            libcuda_ids: HashSet::new(),
            started_at,
            resolver: Resolver::new(opts.log_root.clone()),
            released_regions: 0,
            preload_files: HashMap::new(),
            dropped_seen: 0,
            drops_noticed_at: None,
            lost_pending: HashSet::new(),
            scan_after_drops: false,
            last_drop_scan: None,
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

    /// Records the latest NVML query: the physical figures the findings compare with. The
    /// compute processes NVML lists that the agent does not track yet are learned (baselined:
    /// the probes did not see them allocate), then every open region is read, so that the
    /// comparison pairs NVML and the regions at the same moment. `None`: NVML unavailable.
    pub fn set_nvml(&mut self, snap: Option<NvmlSnapshot>) {
        self.nvml = snap;
        let Some(n) = &self.nvml else {
            self.nvml_regions.clear();
            return;
        };
        self.nvml_seq += 1;
        let me = std::process::id();
        let new: Vec<(u32, Option<u64>)> = n
            .compute
            .iter()
            .filter(|&&pid| pid != me && self.procs.get(pid).is_none())
            .map(|&pid| (pid, n.total_of(pid)))
            .collect();
        for (pid, nvml_bytes) in new {
            // Only a process that has a libcuda mapped is taken for the one NVML names: a
            // pid this /proc does not show, or shows as something else (NVML naming pids
            // of another pid namespace), is left alone.
            let Ok(maps) = procinfo::read_maps(&self.opts.proc_root, pid) else {
                continue;
            };
            let probed = procinfo::maps_has_ids(&maps, &self.libcuda_ids);
            if !probed && !procinfo::maps_has_libcuda(&maps) {
                continue;
            }
            if !self.started_before_agent(pid) {
                if probed {
                    // Its driver was probed before it loaded it: every call of it was seen
                    // (its first event may just not have arrived yet, e.g. a context
                    // creation still running).
                    self.learn(pid);
                    self.procs.baseline_as(pid, Baseline::ObservedFromStart);
                }
                // Otherwise its libcuda is not probed yet: discovery attaches it and
                // baselines the process as attached late.
                continue;
            }
            self.baseline_pid(pid, nvml_bytes);
        }
        self.nvml_regions = self
            .regions
            .iter()
            .enumerate()
            .filter_map(|(i, r)| read_region(&r.fd, &r.name, &r.busy).ok().map(|s| (i, s)))
            .collect();
    }

    /// NVML samples taken so far.
    pub fn nvml_samples(&self) -> u64 {
        self.nvml_seq
    }

    /// Whether the latest NVML sample gave per-process figures for at least one device (the
    /// physical check needs them).
    pub fn nvml_per_process(&self) -> bool {
        self.nvml.as_ref().is_some_and(|n| !n.queried.is_empty())
    }

    /// The latest NVML query.
    pub fn nvml(&self) -> Option<&NvmlSnapshot> {
        self.nvml.as_ref()
    }

    /// Adds the `/proc/<pid>/maps` identities (`("fd:01", inode)`) of probed libcuda files,
    /// so that processes mapping a driver under another file name count as GPU processes.
    pub fn add_libcuda_ids(&mut self, ids: impl IntoIterator<Item = (String, u64)>) {
        self.libcuda_ids.extend(ids);
    }

    /// Baselines every process that has a libcuda mapped now and is not tracked yet: it may
    /// have allocated before the probes went in. Call right after probes are attached (and
    /// after each newly attached libcuda). Returns the pids baselined.
    pub fn baseline_scan(&mut self) -> Vec<u32> {
        let mut out = Vec::new();
        let me = std::process::id();
        for pid in procinfo::list_pids(&self.opts.proc_root) {
            if pid == me || self.procs.get(pid).is_some() {
                continue;
            }
            let Ok(maps) = procinfo::read_maps(&self.opts.proc_root, pid) else {
                continue;
            };
            if !procinfo::maps_has_libcuda(&maps)
                && !procinfo::maps_has_ids(&maps, &self.libcuda_ids)
            {
                continue;
            }
            let nvml_bytes = self.nvml.as_ref().and_then(|n| n.total_of(pid));
            self.baseline_pid(pid, nvml_bytes);
            out.push(pid);
        }
        out
    }

    /// Whether `pid` started before the agent (unknown start times count as before).
    fn started_before_agent(&self, pid: u32) -> bool {
        match (
            self.started_at,
            procinfo::read_stat(&self.opts.proc_root, pid),
        ) {
            (Some(me), Ok(st)) => st.start_time <= me,
            _ => true,
        }
    }

    /// Tracks a process the probes did not see from its start: *attached late* when it
    /// started after the agent, *pre-existing* otherwise.
    fn baseline_pid(&mut self, pid: u32, nvml_bytes: Option<u64>) {
        let late = !self.started_before_agent(pid);
        self.procs.baseline_as(
            pid,
            if late {
                Baseline::AttachedLate { nvml_bytes }
            } else {
                Baseline::PreExisting { nvml_bytes }
            },
        );
        self.learn(pid);
    }

    /// Consumes one event.
    pub fn on_event(&mut self, ev: &CudaEvent) -> Applied {
        let Some(kind) = EventKind::from_u32(ev.kind) else {
            return Applied::Ignored;
        };
        if kind == EventKind::ProcessExit {
            self.entries.remove(&ev.tgid);
            return self.procs.apply(ev);
        }
        if !self.entries.contains_key(&ev.tgid) {
            self.learn(ev.tgid);
        }
        self.procs.apply(ev)
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

    /// Reads `/proc` for a pid and opens its region.
    fn learn(&mut self, pid: u32) {
        let mut info = read_proc_bounded(&self.opts.proc_root, pid);
        if let Some(i) = info.as_mut().filter(|i| !i.hooked) {
            i.hooked = self.preload_under_other_name(pid);
        }
        if let (Some(at), Some(i)) = (self.drops_noticed_at, &info) {
            if i.start_time <= at {
                self.lost_pending.insert(pid);
            }
        }
        let identity = self.identify(pid, info.as_ref());
        let mut entry = ProcEntry {
            info,
            region: None,
            region_error: None,
            identity,
        };
        self.attach_region(&mut entry);
        self.entries.insert(pid, entry);
    }

    /// Whether the process maps hami-preload installed under HAMi-core's file name
    /// (`libvgpu.so*`): such a file counts when its `.dynsym` defines the preload's marker
    /// symbol. One check per file identity, on a helper thread given up after
    /// [`INPUT_DEADLINE`] (`maps` waits for the process's memory-map lock).
    fn preload_under_other_name(&mut self, pid: u32) -> bool {
        let proc_root = self.opts.proc_root.clone();
        let known = self.preload_files.clone();
        match tenantfs::bounded(
            format!("/proc/{pid}/maps (libvgpu.so)"),
            INPUT_DEADLINE,
            None,
            move || preload_files_of(&proc_root, pid, &known),
        ) {
            Ok(files) => {
                let found = files.iter().any(|(_, is)| *is);
                self.preload_files.extend(files);
                found
            }
            Err(e) => {
                tracing::warn!(pid, error = %e, "mapped libraries not readable in time");
                false
            }
        }
    }

    /// Namespace, pod and container names of a process (see [`crate::identity`]).
    fn identify(&mut self, pid: u32, info: Option<&ProcInfo>) -> Identity {
        let Some(info) = info else {
            return Identity {
                container: "unknown".into(),
                ..Identity::default()
            };
        };
        let folder = identity::hami_folder_of(&self.opts.proc_root, pid, &info.region_path);
        self.resolver.resolve(&info.cgroup, folder)
    }

    fn attach_region(&mut self, entry: &mut ProcEntry) {
        let Some(info) = &entry.info else {
            return;
        };
        let host = info.region_host_path.clone();
        let name = info.region_path.clone();
        let container = info.container.clone();
        let pidns = info.pidns;
        // The path is the tenant's: resolved inside the process's root, regular files only.
        let root = self.opts.proc_root.join(info.pid.to_string()).join("root");
        let reclaim = self.opts.reclaim;
        let shown = PathBuf::from(&name);
        let opened = {
            let (root, name, shown) = (root.clone(), name.clone(), shown.clone());
            tenantfs::bounded(
                format!("region {name} of pid {}", info.pid),
                INPUT_DEADLINE,
                None,
                move || open_tenant_region(&root, &name, &shown, reclaim),
            )
            .and_then(|r| r)
        };
        let file = match opened {
            Ok(f) => f,
            Err(tenantfs::TenantFsError::Io { source, .. })
                if source.kind() == std::io::ErrorKind::NotFound && !info.hooked =>
            {
                // An unhooked process without a region file: nothing to open.
                entry.region_error = Some(format!("{name}: no such file"));
                return;
            }
            Err(e) => {
                entry.region_error = Some(format!("region unreadable: {e}"));
                return;
            }
        };
        let ident = entry.identity.clone();
        match self.add_region(file, &host, &name, &container, ident, pidns) {
            Ok(i) => {
                entry.region = Some(i);
                entry.region_error = None;
            }
            Err(e) => entry.region_error = Some(e),
        }
    }

    /// Opens a region the administrator named (`--region`: a host path, symlinks followed)
    /// and records it.
    fn open_region(
        &mut self,
        host: &Path,
        name: &str,
        container: &str,
        identity: Identity,
        pidns: Option<u64>,
    ) -> Result<usize, String> {
        let reclaim = self.opts.reclaim;
        let path = host.to_path_buf();
        let file = tenantfs::bounded(format!("region {name}"), INPUT_DEADLINE, None, move || {
            if reclaim {
                tenantfs::open_regular(&path, true)
                    .or_else(|_| tenantfs::open_regular(&path, false))
            } else {
                tenantfs::open_regular(&path, false)
            }
        })
        .and_then(|r| r)
        .map_err(|e| format!("region unreadable: {e}"))?;
        self.add_region(file, host, name, container, identity, pidns)
    }

    /// Records an opened region file (once per file: the same inode through several paths
    /// is one region), after checking that it reads as a valid region.
    fn add_region(
        &mut self,
        file: File,
        host: &Path,
        name: &str,
        container: &str,
        identity: Identity,
        pidns: Option<u64>,
    ) -> Result<usize, String> {
        let md = file.metadata().map_err(|e| format!("{name}: fstat: {e}"))?;
        let id = (md.dev(), md.ino());
        if let Some(&i) = self.region_ids.get(&id) {
            return Ok(i);
        }
        let file = Arc::new(file);
        let busy = Arc::new(AtomicBool::new(false));
        let snapshot =
            read_region(&file, name, &busy).map_err(|e| format!("region unreadable: {e}"))?;
        let i = self.regions.len();
        self.regions.push(RegionEntry {
            fd: file,
            name: name.to_string(),
            host_path: host.to_path_buf(),
            container: container.to_string(),
            identity,
            explicit: false,
            pidns,
            file_id: id,
            snapshot: Some(snapshot),
            error: None,
            busy,
            read_at_ns: monotonic_ns(),
            liveness: BTreeMap::new(),
            file: file_meta(&md),
        });
        self.region_ids.insert(id, i);
        Ok(i)
    }

    /// Refreshes `/proc` facts, snapshots regions, evaluates findings, reclaims if asked.
    pub fn tick(&mut self, now: Instant) -> TickOutcome {
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
        self.rebuild_lost();
        let (procs, regions) = self.views();
        let mut found = findings::evaluate_with_nvml(
            &procs,
            &regions,
            self.opts.tolerance,
            self.opts.nvml_tolerance,
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
        if self.opts.reclaim {
            out.reclaimed = self.reclaim();
            self.reclaimed.extend(out.reclaimed.iter().cloned());
        }
        out
    }

    /// Marks the processes waiting for it, and rebuilds each marked process whose slot
    /// accounts no data now (a quiet moment: its true live data is zero).
    fn rebuild_lost(&mut self) {
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

    /// Drops processes that are gone (missed exit events) or whose pid was reused; retries
    /// opening regions that were not there yet.
    fn refresh_processes(&mut self) {
        let root = self.opts.proc_root.clone();
        let pids: Vec<u32> = self.entries.keys().copied().collect();
        for pid in pids {
            let gone = match (procinfo::read_stat(&root, pid), &self.entries[&pid].info) {
                (Ok(st), Some(info)) => st.is_dead() || st.start_time != info.start_time,
                (Ok(st), None) => st.is_dead(),
                (Err(_), _) => true,
            };
            if gone {
                self.entries.remove(&pid);
                self.procs.remove(pid);
                continue;
            }
            // No region yet, or its region no longer reads (truncated, replaced): look again
            // (a replaced file is another inode, so another region).
            let needs_region = match self.entries[&pid].region {
                None => true,
                Some(i) => self.regions.get(i).is_some_and(|r| r.error.is_some()),
            };
            if needs_region {
                let mut e = self.entries.remove(&pid).expect("present");
                if e.info.is_none() {
                    e.info = read_proc_bounded(&root, pid);
                    if e.info.as_ref().is_some_and(|i| !i.hooked) {
                        let hooked = self.preload_under_other_name(pid);
                        if let Some(i) = e.info.as_mut() {
                            i.hooked = hooked;
                        }
                    }
                    if e.info.is_some() {
                        e.identity = self.identify(pid, e.info.as_ref());
                    }
                }
                self.attach_region(&mut e);
                self.entries.insert(pid, e);
            }
        }
        // Processes known only through events but never learned (raced with exit).
        let unknown: Vec<u32> = self
            .procs
            .iter()
            .map(|p| p.pid)
            .filter(|p| !self.entries.contains_key(p))
            .collect();
        for pid in unknown {
            if procinfo::read_stat(&root, pid).is_err() {
                self.procs.remove(pid);
            } else {
                self.learn(pid);
            }
        }
    }

    /// Releases (closes, and so drops from the metrics) every region that no tracked process
    /// uses and whose slots all belong to processes that are gone *cleanly* (no slot at all),
    /// or that no longer reads. A region holding a leaked slot (owner dead, usage left) stays:
    /// its leak is a finding until reclaimed. Regions named with `--region` always stay.
    fn release_idle_regions(&mut self) {
        let used: HashSet<usize> = self.entries.values().filter_map(|e| e.region).collect();
        let keep: Vec<bool> = self
            .regions
            .iter()
            .enumerate()
            .map(|(i, r)| {
                r.explicit
                    || used.contains(&i)
                    || (r.error.is_none()
                        && r.snapshot.as_ref().is_none_or(|s| !s.slots.is_empty()))
            })
            .collect();
        if keep.iter().all(|k| *k) {
            return;
        }
        let mut remap = vec![None; self.regions.len()];
        let mut kept = Vec::with_capacity(self.regions.len());
        for (i, r) in std::mem::take(&mut self.regions).into_iter().enumerate() {
            if keep[i] {
                remap[i] = Some(kept.len());
                kept.push(r);
            } else {
                tracing::debug!(region = %r.name, container = %r.identity.container, "region released: no process left");
                self.released_regions += 1;
                // Dropping the entry closes its descriptor (a read still outstanding on a
                // helper thread holds its own reference until it ends).
            }
        }
        self.regions = kept;
        self.region_ids = self
            .regions
            .iter()
            .enumerate()
            .map(|(i, r)| (r.file_id, i))
            .collect();
        for e in self.entries.values_mut() {
            e.region = e.region.and_then(|i| remap[i]);
        }
        // The NVML-time copies are by region index too.
        self.nvml_regions = std::mem::take(&mut self.nvml_regions)
            .into_iter()
            .filter_map(|(i, s)| Some((remap.get(i).copied().flatten()?, s)))
            .collect();
    }

    /// Regions open now.
    pub fn region_count(&self) -> usize {
        self.regions.len()
    }

    /// Regions released since start because no process used them any more.
    pub fn released_regions(&self) -> u64 {
        self.released_regions
    }

    /// Tracked processes whose region cannot be opened now.
    pub fn region_error_count(&self) -> usize {
        self.entries
            .values()
            .filter(|e| e.region.is_none() && e.info.as_ref().is_some_and(|i| i.hooked))
            .count()
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
            let covered = (snap.device_count as usize).clamp(1, hami_common::layout::MAX_DEVICES);
            let d = u.device as usize;
            if d >= covered && u.observed == 0 && u.accounted == 0 {
                continue;
            }
            let uuid = snap
                .uuids
                .get(d)
                .and_then(crate::metrics::format_uuid)
                .or_else(|| {
                    if covered == 1 {
                        node_uuid.clone()
                    } else {
                        None
                    }
                })
                .unwrap_or_default();
            out.push(RegionSeries {
                identity: r.identity.clone(),
                region: u.region,
                device: u.device,
                uuid,
                limit: u.limit,
                accounted: u.accounted,
                accounted_data: u.accounted_data,
                observed: u.observed,
            });
        }
        out
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
            })
            .collect()
    }

    /// Snapshots every region and establishes the liveness of each active slot.
    fn refresh_regions(&mut self) {
        let root = self.opts.proc_root.clone();
        let mut index: Option<HashMap<(u64, u32), u32>> = None;
        for r in &mut self.regions {
            // The opened file's own metadata (fstat: never the path, which a tenant may
            // have pointed elsewhere since).
            r.file = r.fd.metadata().ok().and_then(|md| file_meta(&md));
            let read_at = monotonic_ns();
            let snap = match read_region(&r.fd, &r.name, &r.busy) {
                Ok(s) => s,
                Err(e) => {
                    if r.error.as_deref() != Some(e.as_str()) {
                        tracing::warn!(region = %r.name, error = %e, "region unreadable: left out until it reads again");
                    }
                    r.error = Some(e);
                    r.snapshot = None;
                    r.liveness.clear();
                    continue;
                }
            };
            r.error = None;
            r.read_at_ns = read_at;
            let mut live = BTreeMap::new();
            for s in &snap.slots {
                let host_pid = match r.pidns {
                    Some(ns) if Some(ns) != self.own_pidns => index
                        .get_or_insert_with(|| procinfo::nspid_index(&root))
                        .get(&(ns, s.pid))
                        .copied(),
                    Some(_) => Some(s.pid),
                    None => {
                        live.insert(s.index, SlotLiveness::Unknown);
                        continue;
                    }
                };
                let l = match host_pid.map(|hp| (hp, procinfo::read_stat(&root, hp))) {
                    None | Some((_, Err(_))) => SlotLiveness::Dead,
                    Some((_, Ok(st))) if st.is_dead() => SlotLiveness::Dead,
                    Some((hp, Ok(st))) if s.start_time != 0 && st.start_time != s.start_time => {
                        SlotLiveness::Reused {
                            host_pid: hp,
                            start_time: st.start_time,
                        }
                    }
                    Some((hp, Ok(_))) => SlotLiveness::Alive { host_pid: hp },
                };
                live.insert(s.index, l);
            }
            r.snapshot = Some(snap);
            r.liveness = live;
        }
    }

    /// The views the pure rules take.
    fn views(&self) -> (Vec<ProcView>, Vec<RegionView>) {
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
            .filter_map(|p| {
                let e = self.entries.get(&p.pid)?;
                let info = e.info.as_ref()?;
                let mut v = ProcView {
                    pid: p.pid,
                    start_time: info.start_time,
                    nspid: info.nspid,
                    container: info.container.clone(),
                    hooked: info.hooked,
                    region: e.region.and_then(|i| index.get(i).copied().flatten()),
                    region_error: e.region_error.clone().or_else(|| {
                        let r = self.regions.get(e.region?)?;
                        r.error
                            .as_ref()
                            .map(|err| format!("region unreadable: {err}"))
                    }),
                    observed: p.by_device(),
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
    fn region_nvml(&self, i: usize, r: &RegionEntry) -> Option<RegionNvml> {
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

    /// Applies the settle time: immediate findings are reported at once, racy ones once they
    /// have stood for `settle`, and findings against NVML once they have stood for
    /// `nvml_settle` and held in two NVML samples in a row.
    fn settle(&mut self, found: Vec<Finding>, now: Instant) -> TickOutcome {
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
            }
        }
        self.standing = standing;
        out
    }

    /// Releases every standing leaked slot whose owner is dead or replaced, through
    /// `reclaim_slot_if` with the identity the slot held (a live process is never touched).
    fn reclaim(&mut self) -> Vec<Reclaimed> {
        let mut out = Vec::new();
        let targets: Vec<Finding> = self
            .standing
            .values()
            .filter(|f| {
                f.kind == FindingKind::LeakedSlot
                    && (f.reason == findings::reason::PROCESS_DEAD
                        || f.reason == findings::reason::PID_REUSED)
            })
            .cloned()
            .collect();
        for f in targets {
            let Some(slot) = f.slot else { continue };
            let Some(r) = self
                .regions
                .iter()
                .find(|r| Some(&r.name) == f.region.as_ref() && r.liveness.contains_key(&slot))
            else {
                continue;
            };
            let Some(s) = r.snapshot.as_ref().and_then(|s| s.slot(slot)) else {
                continue;
            };
            let who = ProcessId {
                pid: s.pid,
                start_time: s.start_time,
            };
            // Mapped (writable) only for this write, on a helper thread: a tenant holding the
            // region lock forever, or truncating the file now, costs that thread, not the agent.
            let file = match r.fd.try_clone() {
                Ok(f) => f,
                Err(e) => {
                    tracing::warn!(region = %r.name, error = %e, "cannot reclaim: dup");
                    continue;
                }
            };
            let path = PathBuf::from(&r.name);
            let done = tenantfs::bounded(
                format!("reclaim in region {}", r.name),
                INPUT_DEADLINE,
                Some(&r.busy),
                move || {
                    Region::open_file(file, &path, true)
                        .map(|region| region.reclaim_slot_if(SlotId::new(slot, who), who))
                        .map_err(|e| e.to_string())
                },
            )
            .map_err(|e| e.to_string())
            .and_then(|r| r);
            let done = match done {
                Ok(d) => d,
                Err(e) => {
                    tracing::warn!(region = %r.name, slot, error = %e, "cannot reclaim leaked slot");
                    None
                }
            };
            if let Some(done) = done {
                tracing::info!(
                    region = %r.name, slot, pid = who.pid, bytes = done.total(),
                    "reclaimed leaked slot"
                );
                out.push(Reclaimed {
                    region: r.name.clone(),
                    container: r.container.clone(),
                    slot,
                    pid: who.pid,
                    start_time: who.start_time,
                    bytes: done.total(),
                });
            }
        }
        if !out.is_empty() {
            // The slots are gone: drop their findings now rather than at the next tick.
            let gone: Vec<FindingKey> = self
                .standing
                .iter()
                .filter(|(_, f)| {
                    out.iter().any(|r| {
                        f.kind == FindingKind::LeakedSlot
                            && f.slot == Some(r.slot)
                            && f.region.as_deref() == Some(r.region.as_str())
                    })
                })
                .map(|(k, _)| k.clone())
                .collect();
            for k in gone {
                self.standing.remove(&k);
                self.pending.remove(&k);
            }
            self.refresh_regions();
        }
        out
    }

    /// Findings standing now.
    pub fn standing(&self) -> Vec<Finding> {
        self.standing.values().cloned().collect()
    }

    /// Every finding reported since start (latest numbers for each).
    pub fn history(&self) -> Vec<Finding> {
        self.history.values().cloned().collect()
    }

    /// Slots reclaimed since start.
    pub fn reclaimed(&self) -> &[Reclaimed] {
        &self.reclaimed
    }

    /// Per region/device usage for metrics.
    pub fn usage(&self) -> Vec<findings::RegionUsage> {
        let (procs, regions) = self.views();
        findings::region_usage(&procs, &regions)
    }

    /// Regions that could not be opened, by name.
    pub fn region_errors(&self) -> &BTreeMap<String, String> {
        &self.region_errors
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
                            && f.kind == FindingKind::OverLimit
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
            let by_device = rebuilt.map_or_else(|| p.by_device(), |v| v.observed.clone());
            let unknown_device = by_device.contains_key(&None);
            rows.push(ProcessRow {
                pid: p.pid,
                comm: info.map(|i| i.comm.clone()).unwrap_or_default(),
                container: info.map(|i| i.container.clone()).unwrap_or_default(),
                nspid: info.and_then(|i| i.nspid),
                hooked: info.map(|i| i.hooked),
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
                unknown_device,
                peak_observed: p.peak_bytes,
                live_allocations: p.live_count(),
                alloc_events: p.alloc_events,
                free_events: p.free_events,
                unmatched_frees: p.unmatched_frees,
                nvml: self.nvml.as_ref().and_then(|n| n.total_of(p.pid)),
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
                    file_id: format!("{}:{}", r.file_id.0, r.file_id.1),
                    device_count: 0,
                    limits: Vec::new(),
                    used: Vec::new(),
                    active_slots: 0,
                    reclaimed_slots: 0,
                    error: r.error.clone(),
                };
                if let Some(s) = &r.snapshot {
                    let n = shown_devices(s);
                    row.device_count = s.device_count;
                    row.limits = s.limits[..n].to_vec();
                    row.used = s.used[..n].to_vec();
                    row.active_slots = s.slots.len();
                    row.reclaimed_slots = s.reclaimed_slots;
                }
                row
            })
            .collect()
    }
}

/// One process in the audit table / JSON.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ProcessRow {
    /// Host pid.
    pub pid: u32,
    /// Command name.
    pub comm: String,
    /// Container.
    pub container: String,
    /// Pid inside the container.
    pub nspid: Option<u32>,
    /// Preload mapped (`None`: unknown, the process was gone before it could be read).
    pub hooked: Option<bool>,
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
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct RegionRow {
    /// Path as its processes name it.
    pub name: String,
    /// Path the agent opened.
    pub host_path: String,
    /// Container.
    pub container: String,
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
    /// Why the region could not be read at the last tick (truncated, replaced, too slow);
    /// its figures are then empty.
    pub error: Option<String>,
}

/// Devices the region's processes really see (the `device_count` the preload records from
/// `cuDeviceGetCount`), `None` when no process recorded it yet (0) or it is out of range.
pub fn real_devices(s: &RegionSnapshot) -> Option<usize> {
    let n = s.device_count as usize;
    (1..=hami_common::layout::MAX_DEVICES)
        .contains(&n)
        .then_some(n)
}

/// Devices to show for a region: the real count, else (unknown) up to the last device with
/// a limit, a flag, usage or a UUID; at least 1.
pub fn shown_devices(s: &RegionSnapshot) -> usize {
    real_devices(s).unwrap_or_else(|| {
        (0..hami_common::layout::MAX_DEVICES)
            .rev()
            .find(|&d| {
                s.limits[d] != 0 || s.limit_flags[d] != 0 || s.used[d] != 0 || s.uuids[d] != [0; 16]
            })
            .map_or(1, |d| d + 1)
    })
}

#[cfg(test)]
#[allow(clippy::cloned_ref_to_slice_refs, clippy::field_reassign_with_default)]
mod tests {
    use super::*;
    use crate::procinfo::tests::fake_proc;
    use crate::state::tests::ev;
    use hami_common::layout::{RegionHeader, UsageKind, MAX_DEVICES};
    use hami_common::region::RegionConfig;
    use std::os::unix::fs::FileExt;

    const MIB: u64 = 1 << 20;
    const NS: u64 = 4026599999;
    const CID: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    struct World {
        _tmp: tempfile::TempDir,
        root: PathBuf,
    }

    impl World {
        fn new() -> World {
            let tmp = tempfile::tempdir().unwrap();
            let root = tmp.path().join("proc");
            std::fs::create_dir_all(&root).unwrap();
            World { _tmp: tmp, root }
        }

        /// A container process; `hooked` maps the preload; its region is
        /// `/hami/r.cache` under its root.
        fn spawn(&self, pid: u32, nspid: u32, hooked: bool, limit: &str) {
            let mut maps = vec!["/usr/lib/x86_64-linux-gnu/libcuda.so.1"];
            if hooked {
                maps.push("/usr/local/vgpu/libhami_preload.so");
            }
            fake_proc(
                &self.root,
                pid,
                5000 + pid as u64,
                &[pid, nspid],
                NS,
                &format!("0::/kubepods/besteffort/podx/{CID}\n"),
                &maps,
                &[
                    ("CUDA_DEVICE_MEMORY_LIMIT", limit),
                    ("CUDA_DEVICE_MEMORY_SHARED_CACHE", "/hami/r.cache"),
                ],
            );
        }

        fn kill(&self, pid: u32) {
            std::fs::remove_dir_all(self.root.join(pid.to_string())).unwrap();
        }

        /// Creates the region as the preload would, inside `pid`'s root, and hard-links it
        /// into the other roots (one file shared by the container).
        fn region(&self, pid: u32, limit: u64, others: &[u32]) -> Region {
            let path = self.root.join(format!("{pid}/root/hami/r.cache"));
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            let mut cfg = RegionConfig::default();
            cfg.limits[0] = limit;
            cfg.device_count = 1;
            let (r, _) = Region::open_or_create(&path, &cfg).unwrap();
            for o in others {
                let p = self.root.join(format!("{o}/root/hami/r.cache"));
                std::fs::create_dir_all(p.parent().unwrap()).unwrap();
                std::fs::hard_link(&path, &p).unwrap();
            }
            r
        }

        fn agent(&self, reclaim: bool) -> Agent {
            Agent::new(AgentOptions {
                proc_root: self.root.clone(),
                settle: Duration::from_millis(0),
                reclaim,
                ..Default::default()
            })
        }
    }

    fn register(r: &Region, pid: u32, nspid: u32, data: u64) -> SlotId {
        let who = ProcessId {
            pid: nspid,
            start_time: 5000 + pid as u64,
        };
        let s = r.register(who).unwrap();
        r.force_charge(s, 0, UsageKind::Context, 10 * MIB);
        if data > 0 {
            r.try_charge(s, 0, UsageKind::Data, data).unwrap();
        }
        s
    }

    fn kinds(fs: &[Finding]) -> Vec<(FindingKind, &'static str)> {
        let mut v: Vec<_> = fs.iter().map(|f| (f.kind, f.reason)).collect();
        v.sort();
        v
    }

    /// An event stamped now (`CLOCK_MONOTONIC`, like the probes').
    fn ev_now(kind: EventKind, pid: u32, size: u64, addr: u64) -> CudaEvent {
        let mut e = ev(kind, pid, size, addr, 0);
        e.ts_ns = monotonic_ns();
        e
    }

    #[test]
    fn lost_events_rebuild_from_the_region_and_count_again_after_a_quiet_moment() {
        let w = World::new();
        w.spawn(100, 7, true, "1g");
        let r = w.region(100, 1 << 30, &[]);
        let s = register(&r, 100, 7, 64 * MIB);
        // The free of 0x8000 was dropped: a phantom 32 MiB in the agent's books.
        let evs = [
            ev(EventKind::MemAlloc, 100, 64 * MIB, 0x7000, 0),
            ev(EventKind::MemAlloc, 100, 32 * MIB, 0x8000, 0),
        ];
        // Control: without the drop count, the phantom is a bypass.
        let mut blind = w.agent(false);
        for e in &evs {
            blind.on_event(e);
        }
        assert_eq!(
            kinds(&blind.tick(Instant::now()).raised),
            vec![(
                FindingKind::Bypass,
                findings::reason::OBSERVED_ABOVE_ACCOUNTED
            )]
        );
        let mut a = w.agent(false);
        for e in &evs {
            a.on_event(e);
        }
        assert!(a.note_dropped(5));
        assert!(!a.note_dropped(5), "same total: nothing new");
        let out = a.tick(Instant::now());
        assert!(out.raised.is_empty(), "{:?}", out.raised);
        let row = &a.process_rows()[0];
        assert_eq!(row.observed, 64 * MIB, "rebuilt from the region");
        assert_eq!(row.accounted, Some(64 * MIB));
        assert!(row
            .events_lost
            .as_deref()
            .is_some_and(|n| n.contains("events lost")));
        // Quiet moment: the process frees everything; the region says 0 data.
        r.uncharge(s, 0, UsageKind::Data, 64 * MIB);
        assert!(a.tick(Instant::now()).raised.is_empty());
        let row = &a.process_rows()[0];
        assert_eq!(row.events_lost, None);
        assert_eq!(row.observed, 0);
        // A stale queued event (stamped before the rebuild) is ignored; new ones count.
        a.on_event(&ev(EventKind::MemAlloc, 100, 8 * MIB, 0x9000, 0));
        assert_eq!(a.process_rows()[0].observed, 0);
        a.on_event(&ev_now(EventKind::MemAlloc, 100, 16 * MIB, 0xa000));
        let out = a.tick(Instant::now());
        assert_eq!(
            kinds(&out.raised),
            vec![(
                FindingKind::Bypass,
                findings::reason::OBSERVED_ABOVE_ACCOUNTED
            )]
        );
    }

    #[test]
    fn process_learned_after_drops_that_started_before_is_marked() {
        let w = World::new();
        w.spawn(100, 7, true, "1g");
        let r = w.region(100, 1 << 30, &[]);
        register(&r, 100, 7, 64 * MIB);
        let mut a = w.agent(false);
        // The fake processes started at tick 5100, long before "now".
        a.note_dropped(1);
        a.on_event(&ev(EventKind::MemAlloc, 100, 96 * MIB, 0x7000, 0));
        assert!(a.tick(Instant::now()).raised.is_empty());
        assert!(a.process_rows()[0].events_lost.is_some());
    }

    #[test]
    fn process_whose_every_event_was_dropped_is_found_after_the_drops() {
        let w = World::new();
        w.spawn(100, 7, false, "1g");
        let mut a = w.agent(false);
        a.started_at = Some(1); // it started after the agent
        assert!(a.tick(Instant::now()).raised.is_empty());
        assert!(a.process_rows().is_empty(), "no event: unknown");
        a.note_dropped(10);
        let out = a.tick(Instant::now());
        assert_eq!(
            kinds(&out.raised),
            vec![(FindingKind::Bypass, findings::reason::NO_PRELOAD)]
        );
        let rows = a.process_rows();
        assert_eq!(rows.len(), 1);
        assert!(rows[0].events_lost.is_some());
        assert!(rows[0]
            .baseline
            .as_deref()
            .is_some_and(|b| b.contains("attached late")));
    }

    #[test]
    fn truncated_region_is_left_out_with_its_reason_and_reads_again_when_restored() {
        let w = World::new();
        w.spawn(100, 7, true, "1g");
        let r = w.region(100, 1 << 30, &[]);
        register(&r, 100, 7, 64 * MIB);
        let mut a = w.agent(false);
        a.on_event(&ev(EventKind::MemAlloc, 100, 64 * MIB, 0x7000, 0));
        assert!(a.tick(Instant::now()).raised.is_empty());
        let path = w.root.join("100/root/hami/r.cache");
        let good = std::fs::read(&path).unwrap();
        drop(r);
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(good.len() as u64 / 2)
            .unwrap();
        let out = a.tick(Instant::now());
        assert_eq!(
            kinds(&out.raised),
            vec![(FindingKind::Bypass, findings::reason::NO_REGION)]
        );
        assert!(
            out.raised[0].detail.contains("truncated"),
            "{}",
            out.raised[0].detail
        );
        let rows = a.region_rows();
        assert!(rows[0]
            .error
            .as_deref()
            .is_some_and(|e| e.contains("truncated")));
        assert!(rows[0].limits.is_empty());
        std::fs::write(&path, &good).unwrap();
        let out = a.tick(Instant::now());
        assert_eq!(out.cleared.len(), 1, "{:?}", out);
        assert_eq!(a.region_rows()[0].error, None);
    }

    #[test]
    fn region_path_that_is_a_fifo_is_refused_without_blocking() {
        let w = World::new();
        w.spawn(100, 7, true, "1g");
        let dir = w.root.join("100/root/hami");
        std::fs::create_dir_all(&dir).unwrap();
        let c = std::ffi::CString::new(dir.join("r.cache").to_str().unwrap()).unwrap();
        // SAFETY: valid C string.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let mut a = w.agent(false);
        a.on_event(&ev(EventKind::MemAlloc, 100, 64 * MIB, 0x7000, 0));
        let out = a.tick(Instant::now());
        assert_eq!(
            kinds(&out.raised),
            vec![(FindingKind::Bypass, findings::reason::NO_REGION)]
        );
        assert!(
            out.raised[0].detail.contains("FIFO"),
            "{}",
            out.raised[0].detail
        );
    }

    #[test]
    fn hooked_process_within_quota_has_no_finding() {
        let w = World::new();
        w.spawn(100, 7, true, "1g");
        let r = w.region(100, 1 << 30, &[]);
        register(&r, 100, 7, 64 * MIB);
        let mut a = w.agent(false);
        a.on_event(&ev(EventKind::MemAlloc, 100, 64 * MIB, 0x7000, 0));
        let out = a.tick(Instant::now());
        assert!(out.raised.is_empty(), "{:?}", out.raised);
        let rows = a.process_rows();
        assert_eq!(rows.len(), 1);
        let row = &rows[0];
        assert_eq!(row.container, CID);
        assert_eq!(row.nspid, Some(7));
        assert_eq!(row.hooked, Some(true));
        assert_eq!(row.region.as_deref(), Some("/hami/r.cache"));
        assert_eq!(row.accounted, Some(64 * MIB));
        assert_eq!(row.observed, 64 * MIB);
        assert_eq!(row.accounted_total, Some(74 * MIB));
        assert_eq!(row.limit, Some(1 << 30));
        assert_eq!(row.verdict, "ok");
        let u = a.usage();
        assert_eq!(u[0].observed, 64 * MIB);
        assert_eq!(u[0].accounted_data, 64 * MIB);
    }

    #[test]
    fn unhooked_process_is_bypass_and_container_over_limit() {
        let w = World::new();
        w.spawn(100, 7, true, "100m");
        w.spawn(101, 8, false, "100m");
        let r = w.region(100, 100 * MIB, &[101]);
        register(&r, 100, 7, 60 * MIB);
        let mut a = w.agent(false);
        a.on_event(&ev(EventKind::MemAlloc, 100, 60 * MIB, 0x7000, 0));
        a.on_event(&ev(EventKind::MemAlloc, 101, 80 * MIB, 0x9000, 0));
        let out = a.tick(Instant::now());
        assert_eq!(
            kinds(&out.raised),
            vec![
                (FindingKind::Bypass, findings::reason::NO_PRELOAD),
                (
                    FindingKind::OverLimit,
                    findings::reason::OBSERVED_ABOVE_LIMIT
                ),
            ]
        );
        let b = out
            .raised
            .iter()
            .find(|f| f.kind == FindingKind::Bypass)
            .unwrap();
        assert_eq!(b.pid, Some(101));
        assert_eq!(b.bytes, 80 * MIB);
        assert_eq!(b.container, CID);
        // Standing findings are raised once; freeing clears the bypass's bytes but the
        // process stays a bypass (it allocated without the preload).
        assert!(a.tick(Instant::now()).raised.is_empty());
        a.on_event(&ev(EventKind::MemFree, 101, 0, 0x9000, 0));
        let out = a.tick(Instant::now());
        assert_eq!(
            kinds(&out.cleared),
            vec![(
                FindingKind::OverLimit,
                findings::reason::OBSERVED_ABOVE_LIMIT
            )]
        );
        let rows = a.process_rows();
        let r101 = rows.iter().find(|r| r.pid == 101).unwrap();
        assert_eq!(r101.verdict, "bypass");
        assert_eq!(r101.hooked, Some(false));
        // Exit drops it.
        a.on_event(&ev(EventKind::ProcessExit, 101, 0, 0, 0));
        assert_eq!(a.process_count(), 1);
        let out = a.tick(Instant::now());
        assert_eq!(
            kinds(&out.cleared),
            vec![(FindingKind::Bypass, findings::reason::NO_PRELOAD)]
        );
        assert_eq!(a.history().len(), 2);
    }

    /// Regression: a container whose region variable names a FIFO stalled the agent for
    /// good (a read-only `open` of a FIFO waits for a writer; with `--reclaim` the writable
    /// open failed and the read-only fallback blocked).
    #[test]
    fn region_path_at_a_fifo_is_an_error_not_a_hang() {
        let w = World::new();
        w.spawn(100, 7, true, "1g");
        let path = w.root.join("100/root/hami/r.cache");
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        let c = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
        // SAFETY: c is a valid C string.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let d = std::sync::Arc::clone(&done);
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_secs(20));
            if !d.load(std::sync::atomic::Ordering::SeqCst) {
                eprintln!("the agent's tick hung on a FIFO region path");
                std::process::abort();
            }
        });
        for reclaim in [false, true] {
            let mut a = w.agent(reclaim);
            a.on_event(&ev(EventKind::MemAlloc, 100, 64 * MIB, 0x7000, 0));
            a.tick(Instant::now());
            assert!(a.region_rows().is_empty());
            assert_eq!(a.process_count(), 1);
        }
        done.store(true, std::sync::atomic::Ordering::SeqCst);
    }

    #[test]
    fn killed_process_leaks_its_slot_and_reclaim_frees_it() {
        let w = World::new();
        w.spawn(100, 7, true, "1g");
        let r = w.region(100, 1 << 30, &[]);
        register(&r, 100, 7, 512 * MIB);
        let mut a = w.agent(true);
        a.on_event(&ev(EventKind::MemAlloc, 100, 512 * MIB, 0x7000, 0));
        assert!(a.tick(Instant::now()).raised.is_empty());
        // SIGKILL: no exit handler ran; the slot still holds the memory.
        w.kill(100);
        let out = a.tick(Instant::now());
        assert_eq!(
            kinds(&out.raised),
            vec![(FindingKind::LeakedSlot, findings::reason::PROCESS_DEAD)]
        );
        assert_eq!(out.raised[0].bytes, 522 * MIB);
        assert_eq!(out.raised[0].nspid, Some(7));
        assert_eq!(out.reclaimed.len(), 1);
        assert_eq!(out.reclaimed[0].bytes, 522 * MIB);
        let snap = r.snapshot();
        assert!(snap.slots.is_empty());
        assert_eq!(snap.used[0], 0);
        // A new process can use the whole quota.
        w.spawn(102, 9, true, "1g");
        let s = register(&r, 102, 9, 0);
        r.try_charge(s, 0, UsageKind::Data, (1 << 30) - 10 * MIB)
            .unwrap();
        assert!(a.tick(Instant::now()).raised.is_empty());
        assert_eq!(a.reclaimed().len(), 1);
    }

    #[test]
    fn reclaim_never_touches_a_live_process() {
        let w = World::new();
        w.spawn(100, 7, true, "1g");
        let r = w.region(100, 1 << 30, &[]);
        register(&r, 100, 7, 64 * MIB);
        let mut a = w.agent(true);
        // The agent sees no allocation: a fully observed live process with usage but no
        // allocations is reported, but never reclaimed.
        a.on_event(&ev(EventKind::CtxSetCurrent, 100, 0, 0xc, 0));
        let out = a.tick(Instant::now());
        assert_eq!(
            kinds(&out.raised),
            vec![(
                FindingKind::LeakedSlot,
                findings::reason::USAGE_WITHOUT_ALLOCATIONS
            )]
        );
        assert!(out.reclaimed.is_empty());
        assert_eq!(r.snapshot().slots.len(), 1);
    }

    #[test]
    fn hand_edited_limit_is_tamper() {
        let w = World::new();
        w.spawn(100, 7, true, "1g");
        let r = w.region(100, 1 << 30, &[]);
        register(&r, 100, 7, 0);
        let mut a = w.agent(false);
        a.on_event(&ev(EventKind::CtxSetCurrent, 100, 0, 0xc, 0));
        assert!(a.tick(Instant::now()).raised.is_empty());
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(w.root.join("100/root/hami/r.cache"))
            .unwrap();
        let off = core::mem::offset_of!(RegionHeader, limits) as u64;
        f.write_all_at(&(8u64 << 30).to_le_bytes(), off).unwrap();
        let out = a.tick(Instant::now());
        assert_eq!(
            kinds(&out.raised),
            vec![(
                FindingKind::Tamper,
                findings::reason::LIMIT_DIFFERS_FROM_ENV
            )]
        );
        assert_eq!(out.raised[0].limit, Some(8 << 30));
        assert_eq!(out.raised[0].device, Some(0));
        let _ = MAX_DEVICES;
    }

    #[test]
    fn process_running_before_the_agent_is_baselined_not_bypass() {
        let w = World::new();
        w.spawn(100, 7, true, "1g");
        let r = w.region(100, 1 << 30, &[]);
        register(&r, 100, 7, 500 * MIB);
        let mut a = w.agent(false);
        assert_eq!(a.baseline_scan(), vec![100]);
        // It allocates 10 MiB more after the agent attached, and frees an old buffer.
        a.on_event(&ev(EventKind::MemAlloc, 100, 10 * MIB, 0x7000, 0));
        a.on_event(&ev(EventKind::MemFree, 100, 0, 0x1000, 0));
        let out = a.tick(Instant::now());
        assert!(out.raised.is_empty(), "{:?}", out.raised);
        let row = &a.process_rows()[0];
        assert_eq!(
            row.baseline.as_deref(),
            Some("pre-existing, not observed from start")
        );
        assert_eq!(row.unmatched_frees, 1);
        assert_eq!(row.verdict, "ok");
    }

    fn libvgpu_process(w: &World, pid: u32, marker: bool) {
        fake_proc(
            &w.root,
            pid,
            5000 + pid as u64,
            &[pid, 7],
            NS,
            &format!("0::/kubepods/besteffort/podx/{CID}\n"),
            &[
                "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
                "/usr/local/vgpu/libvgpu.so",
            ],
            &[("CUDA_DEVICE_MEMORY_LIMIT", "1g")],
        );
        let lib = w.root.join(format!("{pid}/root/usr/local/vgpu/libvgpu.so"));
        std::fs::create_dir_all(lib.parent().unwrap()).unwrap();
        let src = lib.with_extension("c");
        let body = if marker {
            "unsigned int hami_preload_marker = 1; int cuInit(unsigned f) { return f; }\n"
        } else {
            "int cuInit(unsigned f) { return f; }\n"
        };
        std::fs::write(&src, body).unwrap();
        hami_test_harness::cc(&src, &lib, &["-shared", "-fPIC"]);
    }

    #[test]
    fn preload_installed_as_hamis_libvgpu_counts_as_hooked() {
        let w = World::new();
        libvgpu_process(&w, 100, true);
        let mut a = w.agent(false);
        a.on_event(&ev(EventKind::MemAlloc, 100, MIB, 0x7000, 0));
        assert_eq!(a.process_rows()[0].hooked, Some(true));
        // HAMi-core's own libvgpu.so (no marker) is not hami-preload.
        let w = World::new();
        libvgpu_process(&w, 101, false);
        let mut a = w.agent(false);
        a.on_event(&ev(EventKind::MemAlloc, 101, MIB, 0x7000, 0));
        assert_eq!(a.process_rows()[0].hooked, Some(false));
    }

    #[test]
    fn region_leaves_the_metrics_and_is_closed_once_its_last_process_exits() {
        let w = World::new();
        w.spawn(100, 7, true, "1g");
        let r = w.region(100, 1 << 30, &[]);
        let s = register(&r, 100, 7, 64 * MIB);
        let mut a = w.agent(false);
        a.on_event(&ev(EventKind::MemAlloc, 100, 64 * MIB, 0x7000, 0));
        a.tick(Instant::now());
        assert_eq!(a.region_count(), 1);
        let series = a.region_series();
        // A 1-device region: one series, not one per possible device.
        assert_eq!(series.len(), 1, "{series:?}");
        assert_eq!(series[0].device, 0);
        assert_eq!(series[0].identity.container, &CID[..12]);
        let md = std::fs::metadata(w.root.join("100/root/hami/r.cache")).unwrap();
        let file = (md.dev(), md.ino());
        let open_before = fds_open_on(file);
        assert!(open_before >= 1, "the agent holds the region open");
        // The process exits cleanly: its slot is released, its exit event arrives.
        r.unregister(s);
        a.on_event(&ev(EventKind::ProcessExit, 100, 0, 0, 0));
        w.kill(100);
        a.tick(Instant::now());
        assert_eq!(a.region_count(), 0);
        assert!(a.region_series().is_empty());
        assert_eq!(a.released_regions(), 1);
        // Its descriptor is closed (a read on a helper thread may finish just after).
        let t = Instant::now();
        while fds_open_on(file) != open_before - 1 && t.elapsed() < Duration::from_secs(2) {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(fds_open_on(file), open_before - 1);
    }

    /// Descriptors of this process open on the file `(dev, inode)`.
    fn fds_open_on((dev, ino): (u64, u64)) -> usize {
        std::fs::read_dir("/proc/self/fd")
            .unwrap()
            .flatten()
            .filter(|e| std::fs::metadata(e.path()).is_ok_and(|m| m.dev() == dev && m.ino() == ino))
            .count()
    }

    #[test]
    fn region_series_account_every_usage_kind_pool_and_other_included() {
        let w = World::new();
        w.spawn(100, 7, true, "1g");
        let r = w.region(100, 1 << 30, &[]);
        let s = register(&r, 100, 7, 64 * MIB);
        r.force_charge(s, 0, UsageKind::Module, 2 * MIB);
        r.force_charge(s, 0, UsageKind::Pool, 32 * MIB);
        r.force_charge(s, 0, UsageKind::Other, 4 * MIB);
        let mut a = w.agent(false);
        a.on_event(&ev(EventKind::MemAlloc, 100, 64 * MIB, 0x7000, 0));
        a.tick(Instant::now());
        let series = a.region_series();
        assert_eq!(series.len(), 1, "{series:?}");
        // Context 10 + module 2 + data 64 + pool 32 + other 4.
        assert_eq!(series[0].accounted, 112 * MIB);
        assert_eq!(series[0].accounted_data, 64 * MIB);
    }

    #[test]
    fn region_with_a_leaked_slot_stays() {
        let w = World::new();
        w.spawn(100, 7, true, "1g");
        let r = w.region(100, 1 << 30, &[]);
        register(&r, 100, 7, 64 * MIB);
        let mut a = w.agent(false);
        a.on_event(&ev(EventKind::MemAlloc, 100, 64 * MIB, 0x7000, 0));
        a.tick(Instant::now());
        w.kill(100);
        a.tick(Instant::now());
        assert_eq!(a.region_count(), 1);
        assert_eq!(a.region_series().len(), 1);
    }

    #[test]
    fn region_series_cover_only_the_header_devices_and_name_their_uuid() {
        let w = World::new();
        w.spawn(100, 7, true, "1g");
        let path = w.root.join("100/root/hami/r.cache");
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        let mut cfg = RegionConfig::default();
        // A global limit: every device slot carries it, but the container sees 2 GPUs.
        cfg.limits = [1 << 30; MAX_DEVICES];
        cfg.device_count = 2;
        let (r, _) = Region::open_or_create(&path, &cfg).unwrap();
        r.set_uuid(1, [0xab; 16]);
        register(&r, 100, 7, MIB);
        let mut a = w.agent(false);
        a.on_event(&ev(EventKind::MemAlloc, 100, MIB, 0x7000, 0));
        a.tick(Instant::now());
        let series = a.region_series();
        assert_eq!(
            series.iter().map(|s| s.device).collect::<Vec<_>>(),
            vec![0, 1]
        );
        assert_eq!(series[0].uuid, "");
        assert_eq!(series[1].uuid, "GPU-abababab-abab-abab-abab-abababababab");
    }

    /// An NVML sample of one GPU (index 0, no UUID) listing `procs` as compute processes.
    fn nvml_sample(procs: &[(u32, u64)]) -> NvmlSnapshot {
        let mut n = NvmlSnapshot {
            devices: vec![crate::nvml::GpuInfo {
                index: 0,
                uuid: None,
                total: Some(16 << 30),
                used: None,
            }],
            ..Default::default()
        };
        n.queried.insert(0);
        for &(pid, bytes) in procs {
            n.add_process(0, pid, Some(bytes), true);
        }
        n.finish();
        n
    }

    #[test]
    fn unhooked_process_listed_by_nvml_is_learned_and_reported_at_once() {
        let w = World::new();
        w.spawn(100, 7, true, "1g");
        w.spawn(101, 8, false, "1g");
        let r = w.region(100, 1 << 30, &[101]);
        register(&r, 100, 7, 0);
        let mut a = w.agent(false);
        // A pid NVML names that is not a CUDA process here (no libcuda mapped): left alone.
        fake_proc(&w.root, 102, 5102, &[102], NS, "0::/\n", &[], &[]);
        // No libcuda event, no baseline scan: only NVML knows it holds 512 MiB.
        a.set_nvml(Some(nvml_sample(&[
            (100, 10 * MIB),
            (101, 512 * MIB),
            (102, 64 * MIB),
        ])));
        assert_eq!(a.process_count(), 2);
        let out = a.tick(Instant::now());
        assert_eq!(
            kinds(&out.raised),
            vec![(FindingKind::Bypass, findings::reason::NO_PRELOAD)]
        );
        assert_eq!(out.raised[0].pid, Some(101));
        assert_eq!(out.raised[0].bytes, 512 * MIB);
        assert_eq!(out.raised[0].container, CID);
        let row = a.process_rows().into_iter().find(|r| r.pid == 101).unwrap();
        assert_eq!(row.nvml, Some(512 * MIB));
        assert_eq!(row.verdict, "bypass");
    }

    #[test]
    fn without_nvml_an_unhooked_pre_existing_process_is_unverified() {
        let w = World::new();
        w.spawn(101, 8, false, "1g");
        let mut a = w.agent(false);
        a.set_nvml(None);
        assert_eq!(a.baseline_scan(), vec![101]);
        assert!(a.tick(Instant::now()).raised.is_empty());
        assert_eq!(a.process_rows()[0].verdict, "unverified");
        // With NVML listing nothing for it, it is known to hold nothing.
        a.set_nvml(Some(nvml_sample(&[])));
        a.tick(Instant::now());
        assert_eq!(a.process_rows()[0].verdict, "ok");
    }

    #[test]
    fn nvml_drift_needs_two_samples_and_clears_when_accounted() {
        let w = World::new();
        w.spawn(100, 7, true, "1g");
        let r = w.region(100, 1 << 30, &[]);
        let s = register(&r, 100, 7, 64 * MIB);
        let mut a = w.agent(false);
        a.on_event(&ev(EventKind::MemAlloc, 100, 64 * MIB, 0x7000, 0));
        // The region accounts 10 MiB context + 64 MiB; NVML says 1.5 GiB more.
        let blind = 74 * MIB + 1536 * MIB;
        a.set_nvml(Some(nvml_sample(&[(100, blind)])));
        let t0 = Instant::now();
        assert!(a.tick(t0).raised.is_empty(), "one sample is not enough");
        assert!(a.tick(t0 + Duration::from_secs(1)).raised.is_empty());
        a.set_nvml(Some(nvml_sample(&[(100, blind)])));
        let out = a.tick(t0 + Duration::from_secs(2));
        assert_eq!(
            kinds(&out.raised),
            vec![
                (FindingKind::OverLimit, findings::reason::NVML_ABOVE_LIMIT),
                (FindingKind::Drift, findings::reason::NVML_ABOVE_ACCOUNTED),
            ]
        );
        let d = out
            .raised
            .iter()
            .find(|f| f.kind == FindingKind::Drift)
            .unwrap();
        assert_eq!(d.bytes, 1536 * MIB);
        assert_eq!(d.accounted, Some(74 * MIB));
        let rows = a.process_rows();
        assert_eq!(rows[0].verdict, "drift,over_limit");
        // The preload learns to charge it (as module memory here): the next sample agrees.
        r.force_charge(s, 0, UsageKind::Module, 1536 * MIB);
        a.set_nvml(Some(nvml_sample(&[(100, blind)])));
        let out = a.tick(t0 + Duration::from_secs(3));
        assert_eq!(
            kinds(&out.cleared),
            vec![(FindingKind::Drift, findings::reason::NVML_ABOVE_ACCOUNTED)]
        );
        // A single sample that disagrees again is not reported.
        a.set_nvml(Some(nvml_sample(&[(100, blind + (1 << 30))])));
        let out = a.tick(t0 + Duration::from_secs(4));
        assert!(
            out.raised.iter().all(|f| f.kind != FindingKind::Drift),
            "{:?}",
            out.raised
        );
    }

    #[test]
    fn racy_findings_wait_for_the_settle_time() {
        let w = World::new();
        w.spawn(100, 7, true, "1g");
        let r = w.region(100, 1 << 30, &[]);
        let s = register(&r, 100, 7, 0);
        let mut a = Agent::new(AgentOptions {
            proc_root: w.root.clone(),
            settle: Duration::from_millis(200),
            ..Default::default()
        });
        // The alloc returned before the preload charged: transiently above accounted.
        a.on_event(&ev(EventKind::MemAlloc, 100, 64 * MIB, 0x7000, 0));
        let t0 = Instant::now();
        assert!(a.tick(t0).raised.is_empty());
        r.try_charge(s, 0, UsageKind::Data, 64 * MIB).unwrap();
        assert!(a.tick(t0 + Duration::from_millis(300)).raised.is_empty());
        // A real one persists.
        a.on_event(&ev(EventKind::MemAlloc, 100, 64 * MIB, 0x8000, 0));
        assert!(a.tick(t0 + Duration::from_millis(400)).raised.is_empty());
        let out = a.tick(t0 + Duration::from_millis(700));
        assert_eq!(
            kinds(&out.raised),
            vec![(
                FindingKind::Bypass,
                findings::reason::OBSERVED_ABOVE_ACCOUNTED
            )]
        );
    }
}
