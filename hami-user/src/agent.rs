//! The agent's core: fed events through [`Agent::on_event`] and woken by [`Agent::tick`], it
//! keeps the processes, opens their regions read-only, establishes slot liveness, evaluates
//! the findings (holding racy ones until they persist), and optionally reclaims leaked slots.
//!
//! Nothing here needs root or eBPF: tests drive it with synthetic events, a fake `/proc` tree
//! and real region files.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use hami_common::event::{CudaEvent, EventKind};
use hami_common::region::{ProcessId, Region, RegionSnapshot, SlotId};
use serde::Serialize;

use crate::access::FileMeta;
use crate::findings::{
    self, Finding, FindingKey, FindingKind, ProcView, RegionView, SlotLiveness, Tolerance,
};
use crate::nvml::NvmlSnapshot;
use crate::procinfo::{self, ProcInfo};
use crate::state::{Applied, Baseline, Processes};

/// Options of the agent core.
#[derive(Clone, Debug)]
pub struct AgentOptions {
    /// Where `/proc` is.
    pub proc_root: PathBuf,
    /// Tolerance between observed and accounted.
    pub tolerance: Tolerance,
    /// How long a racy finding must persist before it is reported.
    pub settle: Duration,
    /// Release leaked slots through the region's protocol.
    pub reclaim: bool,
    /// Regions to watch even if no live process names them (host paths; slot pids are taken
    /// to be in the agent's own pid namespace).
    pub regions: Vec<PathBuf>,
}

impl Default for AgentOptions {
    fn default() -> Self {
        AgentOptions {
            proc_root: PathBuf::from("/proc"),
            tolerance: Tolerance::default(),
            settle: Duration::from_millis(300),
            reclaim: false,
            regions: Vec::new(),
        }
    }
}

/// A process the agent knows (from events or from the baseline scan).
#[derive(Debug)]
struct ProcEntry {
    info: Option<ProcInfo>,
    region: Option<usize>,
    region_error: Option<String>,
}

/// An open region.
struct RegionEntry {
    region: Region,
    name: String,
    host_path: PathBuf,
    container: String,
    pidns: Option<u64>,
    file_id: (u64, u64),
    snapshot: Option<RegionSnapshot>,
    liveness: BTreeMap<usize, SlotLiveness>,
    /// Owner, group and mode, refreshed every tick (`stat`, only while the path still names
    /// the file that was opened).
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
    pending: HashMap<FindingKey, Instant>,
    standing: BTreeMap<FindingKey, Finding>,
    history: BTreeMap<FindingKey, Finding>,
    reclaimed: Vec<Reclaimed>,
    /// `/proc/<pid>/maps` identities of the probed libcuda files (any file name).
    libcuda_ids: HashSet<(String, u64)>,
    /// The agent's own start time (ticks since boot), to tell processes that started after it.
    started_at: Option<u64>,
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
            pending: HashMap::new(),
            standing: BTreeMap::new(),
            history: BTreeMap::new(),
            reclaimed: Vec::new(),
            libcuda_ids: HashSet::new(),
            started_at,
            opts,
        };
        for p in a.opts.regions.clone() {
            let name = p.display().to_string();
            let pidns = a.own_pidns;
            if let Err(e) = a.open_region(&p, &name, "-", pidns) {
                a.region_errors.insert(name, e);
            }
        }
        a
    }

    /// The options.
    pub fn options(&self) -> &AgentOptions {
        &self.opts
    }

    /// Records the latest NVML query (used for baselines and the report).
    pub fn set_nvml(&mut self, snap: Option<NvmlSnapshot>) {
        self.nvml = snap;
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
            let nvml_bytes = self
                .nvml
                .as_ref()
                .and_then(|n| n.processes.get(&pid).copied());
            let late = match (
                self.started_at,
                procinfo::read_stat(&self.opts.proc_root, pid),
            ) {
                (Some(me), Ok(st)) => st.start_time > me,
                _ => false,
            };
            self.procs.baseline_as(
                pid,
                if late {
                    Baseline::AttachedLate { nvml_bytes }
                } else {
                    Baseline::PreExisting { nvml_bytes }
                },
            );
            self.learn(pid);
            out.push(pid);
        }
        out
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

    /// Number of tracked processes.
    pub fn process_count(&self) -> usize {
        self.procs.len()
    }

    /// Reads `/proc` for a pid and opens its region.
    fn learn(&mut self, pid: u32) {
        let info = procinfo::read_proc(&self.opts.proc_root, pid).ok();
        let mut entry = ProcEntry {
            info,
            region: None,
            region_error: None,
        };
        self.attach_region(&mut entry);
        self.entries.insert(pid, entry);
    }

    fn attach_region(&mut self, entry: &mut ProcEntry) {
        let Some(info) = &entry.info else {
            return;
        };
        let host = info.region_host_path.clone();
        let name = info.region_path.clone();
        let container = info.container.clone();
        let pidns = info.pidns;
        match std::fs::metadata(&host) {
            Ok(md) => {
                if let Some(&i) = self.region_ids.get(&(md.dev(), md.ino())) {
                    entry.region = Some(i);
                    entry.region_error = None;
                    return;
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && !info.hooked => {
                // An unhooked process without a region file: nothing to open.
                entry.region_error = Some(format!("{name}: no such file"));
                return;
            }
            Err(_) => {}
        }
        match self.open_region(&host, &name, &container, pidns) {
            Ok(i) => {
                entry.region = Some(i);
                entry.region_error = None;
            }
            Err(e) => entry.region_error = Some(e),
        }
    }

    /// Opens a region (read-only, or writable with `--reclaim`) and records it.
    fn open_region(
        &mut self,
        host: &Path,
        name: &str,
        container: &str,
        pidns: Option<u64>,
    ) -> Result<usize, String> {
        let md = std::fs::metadata(host).map_err(|e| format!("{name}: {e}"))?;
        // A read-only open of a FIFO blocks until a writer appears: a container pointing
        // its region variable at one would stall the agent. Only regular files are opened.
        if !md.is_file() {
            return Err(format!("region unreadable: {name}: not a regular file"));
        }
        let id = (md.dev(), md.ino());
        if let Some(&i) = self.region_ids.get(&id) {
            return Ok(i);
        }
        let region = if self.opts.reclaim {
            Region::open_existing(host, true).or_else(|_| Region::open_existing(host, false))
        } else {
            Region::open_existing(host, false)
        }
        .map_err(|e| format!("region unreadable: {e}"))?;
        let i = self.regions.len();
        self.regions.push(RegionEntry {
            region,
            name: name.to_string(),
            host_path: host.to_path_buf(),
            container: container.to_string(),
            pidns,
            file_id: id,
            snapshot: None,
            liveness: BTreeMap::new(),
            file: file_meta(&md),
        });
        self.region_ids.insert(id, i);
        Ok(i)
    }

    /// Refreshes `/proc` facts, snapshots regions, evaluates findings, reclaims if asked.
    pub fn tick(&mut self, now: Instant) -> TickOutcome {
        self.refresh_processes();
        self.refresh_regions();
        let (procs, regions) = self.views();
        let found = findings::evaluate(&procs, &regions, self.opts.tolerance);
        let mut out = self.settle(found, now);
        if self.opts.reclaim {
            out.reclaimed = self.reclaim();
            self.reclaimed.extend(out.reclaimed.iter().cloned());
        }
        out
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
            let needs_region = self.entries[&pid].region.is_none();
            if needs_region {
                let mut e = self.entries.remove(&pid).expect("present");
                if e.info.is_none() {
                    e.info = procinfo::read_proc(&root, pid).ok();
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

    /// Snapshots every region and establishes the liveness of each active slot.
    fn refresh_regions(&mut self) {
        let root = self.opts.proc_root.clone();
        let mut index: Option<HashMap<(u64, u32), u32>> = None;
        for r in &mut self.regions {
            // Metadata only (no open): the path may have been replaced since it was opened,
            // in which case its permissions say nothing about this region.
            r.file = std::fs::metadata(&r.host_path)
                .ok()
                .filter(|md| (md.dev(), md.ino()) == r.file_id)
                .and_then(|md| file_meta(&md));
            let snap = r.region.snapshot();
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
        let regions: Vec<RegionView> = self
            .regions
            .iter()
            .map(|r| RegionView {
                name: r.name.clone(),
                container: r.container.clone(),
                snapshot: r.snapshot.clone().unwrap_or_else(|| r.region.snapshot()),
                liveness: r.liveness.clone(),
                single_device: r.snapshot.as_ref().is_some_and(|s| s.device_count == 1)
                    || self.nvml.as_ref().is_some_and(|n| n.devices.len() == 1),
                node_devices: self
                    .nvml
                    .as_ref()
                    .map(|n| n.devices.len())
                    .filter(|&n| n > 0),
                file: r.file,
            })
            .collect();
        let procs = self
            .procs
            .iter()
            .filter_map(|p| {
                let e = self.entries.get(&p.pid)?;
                let info = e.info.as_ref()?;
                Some(ProcView {
                    pid: p.pid,
                    start_time: info.start_time,
                    nspid: info.nspid,
                    container: info.container.clone(),
                    hooked: info.hooked,
                    region: e.region,
                    region_error: e.region_error.clone(),
                    observed: p.by_device(),
                    alloc_events: p.alloc_events,
                    peak_bytes: p.peak_bytes,
                    pre_existing: p.baseline.is_pre_existing(),
                    attached_late: matches!(p.baseline, Baseline::AttachedLate { .. }),
                    nvml_bytes: self
                        .nvml
                        .as_ref()
                        .and_then(|n| n.processes.get(&p.pid).copied())
                        .or(p.baseline.nvml_bytes()),
                    seen_by_events: p.first_ns != 0 || p.alloc_events + p.free_events > 0,
                    env_limits: info.env_limits.clone(),
                    creds: info.creds.clone(),
                })
            })
            .collect();
        (procs, regions)
    }

    /// Applies the settle time: immediate findings are reported at once, racy ones once they
    /// have stood for `settle`.
    fn settle(&mut self, found: Vec<Finding>, now: Instant) -> TickOutcome {
        let mut out = TickOutcome::default();
        let mut current: BTreeMap<FindingKey, Finding> = BTreeMap::new();
        for f in found {
            current.insert(f.key(), f);
        }
        self.pending.retain(|k, _| current.contains_key(k));
        let mut standing = BTreeMap::new();
        for (k, f) in current {
            let since = *self.pending.entry(k.clone()).or_insert(now);
            let ripe = !f.needs_settle() || now.duration_since(since) >= self.opts.settle;
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
            if let Some(done) = r.region.reclaim_slot_if(SlotId::new(slot, who), who) {
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
            let unknown_device = p.by_device().contains_key(&None);
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
                observed: p.live_bytes,
                observed_by_device: p
                    .by_device()
                    .into_iter()
                    .map(|(d, b)| (d.map_or("unknown".to_string(), |d| d.to_string()), b))
                    .collect(),
                unknown_device,
                peak_observed: p.peak_bytes,
                live_allocations: p.live_count(),
                alloc_events: p.alloc_events,
                free_events: p.free_events,
                unmatched_frees: p.unmatched_frees,
                nvml: self
                    .nvml
                    .as_ref()
                    .and_then(|n| n.processes.get(&p.pid).copied()),
                baseline,
                baseline_nvml: p.baseline.nvml_bytes(),
                verdict: if verdict.is_empty() {
                    "ok".to_string()
                } else {
                    verdict.join(",")
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
                let s = r.snapshot.clone().unwrap_or_else(|| r.region.snapshot());
                RegionRow {
                    name: r.name.clone(),
                    host_path: r.host_path.display().to_string(),
                    container: r.container.clone(),
                    file_id: format!("{}:{}", r.file_id.0, r.file_id.1),
                    device_count: s.device_count,
                    limits: s.limits[..(s.device_count as usize).clamp(1, s.limits.len())].to_vec(),
                    used: s.used[..(s.device_count as usize).clamp(1, s.used.len())].to_vec(),
                    active_slots: s.slots.len(),
                    reclaimed_slots: s.reclaimed_slots,
                }
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
