//! Processes the agent tracks: reading a pid's `/proc` facts (bounded), recognising the
//! preload under HAMi-core's file name, baselining processes the probes did not see from
//! their start (running before the agent, or listed by NVML), and dropping processes that
//! are gone.

use crate::probes::discovery::memo::Memo;
use std::path::Path;

use crate::identity::{self, Identity};
use crate::nvml::NvmlSnapshot;
use crate::procinfo::{self, ProcInfo};
use crate::state::Baseline;
use crate::tenantfs;

use super::regions::read_region;
use super::types::{Agent, KnownProcess, INPUT_DEADLINE};

/// HAMi-core's library file name, which HAMi's device plugin mounts into containers.
pub(super) const HAMI_CORE_NAME: &str = "libvgpu.so";
/// The symbol hami-preload exports so that it is recognised under another name.
pub(super) const PRELOAD_MARKER: &str = "hami_preload_marker";

/// [`procinfo::read_proc`] on a helper thread, given up after [`INPUT_DEADLINE`] (reading
/// `maps` or `environ` waits for the process's memory-map lock, which it can hold).
pub(super) fn read_proc_bounded(proc_root: &Path, pid: u32) -> Option<ProcInfo> {
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
    known: &Memo<(String, u64), bool>,
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
        let is = match known.peek(&key) {
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

impl Agent {
    /// Records the latest NVML query: the physical figures the findings compare with. The
    /// compute processes NVML lists that the agent does not track yet are learned (baselined:
    /// the probes did not see them allocate), then every open region is read, so that the
    /// comparison pairs NVML and the regions at the same moment. `None`: NVML unavailable.
    pub fn set_nvml(&mut self, snap: Option<NvmlSnapshot>) {
        self.set_nvml_at(snap, std::time::Instant::now());
    }

    /// [`Agent::set_nvml`] for a sample taken at `now`: besides, each region's compute share
    /// of each device is observed (see [`crate::compute`]).
    pub fn set_nvml_at(&mut self, snap: Option<NvmlSnapshot>, now: std::time::Instant) {
        self.nvml = snap;
        let Some(n) = &self.nvml else {
            self.nvml_regions.clear();
            return;
        };
        self.nvml_seq += 1;
        let me = std::process::id();
        // Compute processes, and any process NVML says used SM time.
        let mut listed: Vec<u32> = n.compute.iter().chain(n.sm_util.keys()).copied().collect();
        listed.sort_unstable();
        listed.dedup();
        let new: Vec<(u32, Option<u64>)> = listed
            .into_iter()
            .filter(|&pid| pid != me && self.procs.get(pid).is_none())
            .map(|pid| (pid, n.total_of(pid)))
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
        self.observe_compute(now);
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

    /// [`Agent::add_libcuda_ids`], the identities not given forgotten (libraries whose
    /// probes were detached: unlinked and mapped by nobody).
    pub fn set_libcuda_ids(&mut self, ids: impl IntoIterator<Item = (String, u64)>) {
        self.libcuda_ids = ids.into_iter().collect();
    }

    /// Baselines every process that has a libcuda mapped now and is not tracked yet: it may
    /// have allocated before the probes went in. Call right after probes are attached (and
    /// after each newly attached libcuda). Returns the pids baselined.
    pub fn baseline_scan(&mut self) -> Vec<u32> {
        self.baseline_scan_started_by(None)
    }

    /// [`Agent::baseline_scan`] of the processes that started by `cutoff` (clock ticks since
    /// boot; `None`: all): pass the time the latest libcuda attach finished, after which a
    /// process that loads a probed libcuda is watched from its start.
    pub fn baseline_scan_started_by(&mut self, cutoff: Option<u64>) -> Vec<u32> {
        let mut out = Vec::new();
        let me = std::process::id();
        for pid in procinfo::list_pids(&self.opts.proc_root) {
            if pid == me || self.procs.get(pid).is_some() {
                continue;
            }
            if let Some(c) = cutoff {
                if procinfo::read_stat(&self.opts.proc_root, pid).is_ok_and(|st| st.start_time > c)
                {
                    continue;
                }
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
    pub(super) fn started_before_agent(&self, pid: u32) -> bool {
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
    pub(super) fn baseline_pid(&mut self, pid: u32, nvml_bytes: Option<u64>) {
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

    /// Reads `/proc` for a pid and opens its region.
    pub(super) fn learn(&mut self, pid: u32) {
        let mut info = read_proc_bounded(&self.opts.proc_root, pid);
        if let Some(i) = info.as_mut().filter(|i| !i.hooked) {
            (i.hooked, i.hami_core) = self.preload_under_other_name(pid);
        }
        if let (Some(at), Some(i)) = (self.drops_noticed_at, &info) {
            if i.start_time <= at {
                self.lost_pending.insert(pid);
            }
        }
        let identity = self.identify(pid, info.as_ref());
        // Opened after the facts were read, and checked against their start time.
        let root = self.opts.proc_root.clone();
        let expected = info.as_ref().map(|i| i.start_time);
        let pidfd = self
            .exits
            .as_mut()
            .and_then(|w| w.watch(&root, pid, expected));
        let mut entry = KnownProcess {
            info,
            region: None,
            region_error: None,
            identity,
            pidfd,
        };
        self.attach_region(&mut entry);
        self.entries.insert(pid, entry);
    }

    /// Whether the process maps hami-preload installed under HAMi-core's file name
    /// (`libvgpu.so*`): such a file counts when its `.dynsym` defines the preload's marker
    /// symbol. One check per file identity, on a helper thread given up after
    /// [`INPUT_DEADLINE`] (`maps` waits for the process's memory-map lock).
    /// Returns (hami-preload mapped, HAMi-core mapped: a `libvgpu.so*` without the marker
    /// and no hami-preload).
    pub(super) fn preload_under_other_name(&mut self, pid: u32) -> (bool, bool) {
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
                let hami_core = !found && !files.is_empty();
                for (k, is) in files {
                    self.preload_files.insert(k, is);
                }
                (found, hami_core)
            }
            Err(e) => {
                tracing::warn!(pid, error = %e, "mapped libraries not readable in time");
                (false, false)
            }
        }
    }

    /// Namespace, pod and container names of a process (see [`crate::identity`]).
    pub(super) fn identify(&mut self, pid: u32, info: Option<&ProcInfo>) -> Identity {
        let Some(info) = info else {
            return Identity {
                container: "unknown".into(),
                ..Identity::default()
            };
        };
        let folder = identity::hami_folder_of(&self.opts.proc_root, pid, &info.region_path);
        self.resolver.resolve(&info.cgroup, folder)
    }

    /// Drops processes that are gone (missed exit events) or whose pid was reused; retries
    /// opening regions that were not there yet. A process with a pidfd is gone when the
    /// reactor has seen its pidfd readable (no system call); the others are read from
    /// `/proc/<pid>/stat`.
    pub(super) fn refresh_processes(&mut self) {
        let root = self.opts.proc_root.clone();
        let pids: Vec<u32> = self.entries.keys().copied().collect();
        for pid in pids {
            let e = &self.entries[&pid];
            let gone = match e.pidfd.as_ref().and_then(|p| p.exited()) {
                Some(exited) => exited,
                None => match (
                    procinfo::tick_stat(&mut self.tick_stats, &root, pid),
                    &e.info,
                ) {
                    (Some(st), Some(info)) => st.is_dead() || st.start_time != info.start_time,
                    (Some(st), None) => st.is_dead(),
                    (None, _) => true,
                },
            };
            if gone {
                self.judge_exit(pid);
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
                        let (hooked, hami_core) = self.preload_under_other_name(pid);
                        if let Some(i) = e.info.as_mut() {
                            i.hooked = hooked;
                            i.hami_core = hami_core;
                        }
                    }
                    if e.info.is_some() {
                        e.identity = self.identify(pid, e.info.as_ref());
                    }
                    // Facts of another process than the pidfd's (it exited since): back to
                    // the stat path, which drops it.
                    if let (Some(i), Some(p)) = (&e.info, &e.pidfd) {
                        if i.start_time != p.start_time {
                            e.pidfd = None;
                        }
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
}
