//! Regions the agent reads: opening a tenant's region file inside its root, bounded `pread`
//! snapshots, slot liveness, releasing regions no process uses, and reclaiming leaked slots.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use hami_common::region::{self, ProcessId, Region, RegionSnapshot, SlotId};

use crate::access::FileMeta;
use crate::findings::{self, Finding, FindingKey, FindingKind, SlotLiveness};
use crate::identity::Identity;
use crate::procinfo;
use crate::tenantfs;

use super::types::{Agent, KnownProcess, Reclaimed, RegionEntry, INPUT_DEADLINE};

/// Owner, group and permission bits of a regular file.
pub(super) fn file_meta(md: &std::fs::Metadata) -> Option<FileMeta> {
    md.is_file().then(|| FileMeta {
        mode: md.mode() & 0o7777,
        uid: md.uid(),
        gid: md.gid(),
    })
}

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

/// One bounded `pread` snapshot of a region (see [`region::read_snapshot`]).
pub(super) fn read_region(
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

/// `CLOCK_MONOTONIC` now in ns (the clock of the probes' `ts_ns`).
pub(super) fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid out pointer; CLOCK_MONOTONIC always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64).saturating_mul(1_000_000_000) + ts.tv_nsec as u64
}

impl Agent {
    pub(super) fn attach_region(&mut self, entry: &mut KnownProcess) {
        let Some(info) = &entry.info else {
            return;
        };
        let host = info.region_host_path.clone();
        let name = info.region_path.clone();
        let container = info.container.clone();
        let pidns = info.pidns;
        // The path is the tenant's: resolved inside the process's root, regular files only.
        let root = self.opts.proc_root.join(info.pid.to_string()).join("root");
        let reclaim = self.opts.reclaim || self.opts.arbiter;
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
    pub(super) fn open_region(
        &mut self,
        host: &Path,
        name: &str,
        container: &str,
        identity: Identity,
        pidns: Option<u64>,
    ) -> Result<usize, String> {
        let reclaim = self.opts.reclaim || self.opts.arbiter;
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
    pub(super) fn add_region(
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

    /// Snapshots every region and establishes the liveness of each active slot.
    pub(super) fn refresh_regions(&mut self) {
        let root = self.opts.proc_root.clone();
        let mut index: Option<HashMap<(u64, u32), u32>> = None;
        let stats = &mut self.tick_stats;
        let entries = &self.entries;
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
                // A tracked process with a pidfd not readable at this tick's check, and the
                // slot's start time: alive, no stat read.
                if let Some(hp) = host_pid.filter(|hp| {
                    entries
                        .get(hp)
                        .and_then(|e| e.pidfd.as_ref())
                        .is_some_and(|p| s.start_time == 0 || p.start_time == s.start_time)
                }) {
                    live.insert(s.index, SlotLiveness::Alive { host_pid: hp });
                    continue;
                }
                let l = match host_pid.map(|hp| (hp, procinfo::tick_stat(stats, &root, hp))) {
                    None | Some((_, None)) => SlotLiveness::Dead,
                    Some((_, Some(st))) if st.is_dead() => SlotLiveness::Dead,
                    Some((hp, Some(st))) if s.start_time != 0 && st.start_time != s.start_time => {
                        SlotLiveness::Reused {
                            host_pid: hp,
                            start_time: st.start_time,
                        }
                    }
                    Some((hp, Some(_))) => SlotLiveness::Alive { host_pid: hp },
                };
                live.insert(s.index, l);
            }
            r.snapshot = Some(snap);
            r.liveness = live;
        }
    }

    /// Releases (closes, and so drops from the metrics) every region that no tracked process
    /// uses and whose slots all belong to processes that are gone *cleanly* (no slot at all),
    /// or that no longer reads. A region holding a leaked slot (owner dead, usage left) stays:
    /// its leak is a finding until reclaimed. Regions named with `--region` always stay.
    pub(super) fn release_idle_regions(&mut self) {
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

    /// Releases every standing leaked slot whose owner is dead or replaced, through
    /// `reclaim_slot_if` with the identity the slot held (a live process is never touched).
    pub(super) fn reclaim(&mut self) -> Vec<Reclaimed> {
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
}
