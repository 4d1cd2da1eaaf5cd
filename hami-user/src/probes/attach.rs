//! The eBPF object loaded ([`Probes`]) and its uprobes attached to libcuda files: the order
//! of the attaches and the announcement of attached files (the options in `options.rs`, the
//! errors in `error.rs`).

use std::collections::{HashMap, HashSet};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use aya::maps::{MapData, PerCpuArray, RingBuf};
use aya::programs::raw_trace_point::RawTracePointLink;
use aya::programs::uprobe::{UProbeAttachLocation, UProbeLink, UProbeScope};
use aya::programs::{ProgramError, RawTracePoint, UProbe};
use aya::{Ebpf, EbpfLoader};

use super::discovery::{self, mapped::maps_dev};
use super::error::ProbeError;
use super::options::ProbeOptions;
use super::stamp::FileStamp;
use super::stream::{read_counters, ProbeCounters, UserCounters};
use super::teardown::ProbeLinks;

/// The compiled eBPF object (built by `build.rs` through aya-build).
pub(super) static EBPF_OBJECT: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/hami-ebpf"));

/// libcuda symbols the programs probe (the probed rows of
/// [`hami_abi::intercept::INTERCEPTS`]). Each has an entry program named like the symbol
/// and a return program named `<symbol>_ret`.
pub const PROBED_SYMBOLS: &[&str] = &hami_abi::intercept::PROBED_NAMES;

/// The order in which [`Probes::attach_libcuda`] puts the probes in: the functions that
/// release memory or a context first, then the other context functions, then the
/// allocations ([`PROBED_SYMBOLS`] order within each group); for each function its return
/// probe, then its entry probe.
///
/// Attaching takes from milliseconds to seconds per probe while the processes keep calling.
/// In this order, an allocation seen has its release seen (a release of an allocation made
/// before its probe went in is only an unmatched free), and an entry probe never fires for
/// a call whose return is not probed (the entry would open a call on its thread that never
/// closes, and that thread's further calls would be taken for nested ones).
pub fn attach_order() -> Vec<&'static str> {
    use hami_abi::event::EventKind;
    let group = |sym: &str| match hami_abi::intercept::probe_kind(sym) {
        k if k.is_free() => 0,
        EventKind::CtxDestroy | EventKind::PrimaryCtxRelease => 0,
        k if k.is_alloc() => 2,
        _ => 1,
    };
    let mut v: Vec<&'static str> = PROBED_SYMBOLS.to_vec();
    v.sort_by_key(|s| group(s));
    v
}

/// Result of [`Probes::attach_libcuda`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttachOutcome {
    /// The path given.
    pub path: PathBuf,
    /// `(st_dev, st_ino)` of the file.
    pub file_id: (u64, u64),
    /// The same file was already attached (through this or another path): nothing done.
    pub already_attached: bool,
    /// Symbols probed (entry and return).
    pub attached: Vec<&'static str>,
    /// Symbols this libcuda does not export (tolerated: older or newer drivers).
    pub missing: Vec<&'static str>,
}

/// One attached library, see [`ProbeHandle::attached`].
#[derive(Debug, Clone)]
pub struct AttachedLibrary {
    /// Path it was attached through.
    pub path: PathBuf,
    /// `(st_dev, st_ino)`.
    pub file_id: (u64, u64),
    /// When the probes went in: calls before this time were not seen.
    pub attached_at: SystemTime,
    /// Symbols probed.
    pub symbols: Vec<&'static str>,
    /// The `(device, inode)` pairs under which `/proc/<pid>/maps` shows this file
    /// (`"fd:01"` form): its own, and those discovery saw it mapped under (overlayfs).
    pub maps_ids: Vec<(String, u64)>,
}

struct Lib {
    path: PathBuf,
    /// The file's version when attached: one rewritten in place is attached again.
    stamp: FileStamp,
    /// The file the probes are on, kept open: its `fstat` tells, whatever its paths (a
    /// container's, a dead process's root), when it is rewritten in place or unlinked (see
    /// `handle::review`). The probes hold the inode anyway.
    file: Arc<std::fs::File>,
    attached_at: SystemTime,
    symbols: Vec<&'static str>,
    maps_ids: Vec<(String, u64)>,
    /// Owned links: dropping one detaches it.
    links: Vec<UProbeLink>,
}

/// A library rewritten in place whose attach again failed: kept open to try again when it
/// changes (see [`Probes::reattach_rewritten`]).
struct Failed {
    path: PathBuf,
    file: Arc<std::fs::File>,
    /// The version that failed.
    stamp: FileStamp,
}

/// Libraries announced before their probes go in (see [`ProbeHandle::attach_generation`]).
#[derive(Debug, Default)]
pub(super) struct Announce {
    pub(super) generation: AtomicU64,
    pub(super) maps_ids: Mutex<Vec<(String, u64)>>,
    /// When the latest attach finished, in clock ticks since boot (the unit of a process's
    /// start time in `/proc/<pid>/stat`); 0 while one is in progress (or before the first).
    pub(super) settled_ticks: AtomicU64,
}

impl Announce {
    /// An attach begins.
    fn begin(&self) {
        self.settled_ticks.store(0, Ordering::SeqCst);
    }

    /// The attach in progress (if any) is over: its time is recorded and the generation
    /// moves again, so that a consumer looks once more (see
    /// [`ProbeHandle::attach_settled_ticks`]).
    fn settle(&self) {
        if self.settled_ticks.load(Ordering::SeqCst) == 0 {
            let now = crate::procinfo::now_ticks(Path::new("/proc")).unwrap_or(1);
            self.settled_ticks.store(now.max(1), Ordering::SeqCst);
            self.generation.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// `ids` are no longer attached: they go from the list, without moving the generation
    /// (nothing new to baseline).
    fn remove(&self, ids: &[(String, u64)]) {
        let mut v = self.maps_ids.lock().unwrap_or_else(|p| p.into_inner());
        v.retain(|i| !ids.contains(i));
    }

    fn add(&self, id: (String, u64)) {
        let mut v = self.maps_ids.lock().unwrap_or_else(|p| p.into_inner());
        if !v.contains(&id) {
            v.push(id);
        }
        drop(v);
        self.generation.fetch_add(1, Ordering::SeqCst);
    }
}

/// Files found not to be libcuda that [`Probes`] remembers at most (a file is looked at again
/// once forgotten; discovery itself does not offer a file again while it stays mapped).
pub const REJECTED_MAX: usize = 1024;

/// Loaded (not yet streaming) probes. See the module docs.
pub struct Probes {
    pub(super) announce: Arc<Announce>,
    ebpf: Ebpf,
    libs: HashMap<(u64, u64), Lib>,
    /// Libraries rewritten in place whose attach again failed.
    failed: HashMap<(u64, u64), Failed>,
    /// Files that are not libcuda, with the version found so (checked once per version; the
    /// least recently looked up forgotten beyond [`REJECTED_MAX`]).
    rejected: discovery::memo::Memo<(u64, u64), FileStamp>,
    pub(super) counters: PerCpuArray<MapData, u64>,
    pub(super) ring: Option<RingBuf<MapData>>,
    exit_tp: Option<RawTracePointLink>,
    /// Set by [`Probes::take_links`]: attaching is refused from then on.
    closed: bool,
    /// Set from outside (SIGTERM, see [`Probes::stop_on`]): an attach in progress stops
    /// before its next probe, and none starts.
    stop: Arc<AtomicBool>,
    /// The probes of an attach stopped half-way (see `stop`): kept until
    /// [`Probes::take_links`] (detaching them here would cost about 0.1 s each).
    abandoned: Vec<UProbeLink>,
}

fn prog_err(name: &str, e: ProgramError) -> ProbeError {
    ProbeError::Program {
        name: name.to_string(),
        source: Box::new(e),
    }
}

impl Probes {
    /// Load the programs and maps into the kernel, and attach the process-exit (raw) tracepoint.
    /// libcuda probes are attached by [`Probes::attach_libcuda`] or [`Probes::spawn`].
    pub fn load(opts: &ProbeOptions) -> Result<Probes, ProbeError> {
        // SAFETY: geteuid has no preconditions and cannot fail.
        let euid = unsafe { libc::geteuid() };
        if euid != 0 {
            return Err(ProbeError::NotRoot { euid });
        }
        if EBPF_OBJECT.is_empty() {
            return Err(ProbeError::NoObject);
        }
        raise_memlock();
        let tgid: u32 = opts.ignore_tgid.unwrap_or_else(std::process::id);
        let mut ebpf = EbpfLoader::new()
            .override_global("HAMI_AGENT_TGID", &tgid, true)
            .map_max_entries("EVENTS", opts.ring_bytes)
            .load(EBPF_OBJECT)
            .map_err(|e| {
                if Path::new("/sys/kernel/btf/vmlinux").exists() {
                    ProbeError::Load(Box::new(e))
                } else {
                    ProbeError::NoBtf(e.to_string())
                }
            })?;
        for sym in PROBED_SYMBOLS {
            for name in [sym.to_string(), format!("{sym}_ret")] {
                let prog: &mut UProbe = ebpf
                    .program_mut(&name)
                    .ok_or_else(|| ProbeError::Missing(format!("program {name}")))?
                    .try_into()
                    .map_err(|e| prog_err(&name, e))?;
                prog.load().map_err(|e| prog_err(&name, e))?;
            }
        }
        let tp: &mut RawTracePoint = ebpf
            .program_mut("sched_process_exit")
            .ok_or_else(|| ProbeError::Missing("program sched_process_exit".into()))?
            .try_into()
            .map_err(|e| prog_err("sched_process_exit", e))?;
        tp.load().map_err(|e| prog_err("sched_process_exit", e))?;
        // A raw tracepoint: attached through bpf(), no tracefs mount needed.
        let tp_err = |e| ProbeError::Attach {
            symbol: "raw tracepoint sched_process_exit".into(),
            path: PathBuf::from("(kernel)"),
            source: Box::new(e),
        };
        let tp_id = tp.attach("sched_process_exit").map_err(tp_err)?;
        let exit_tp = tp.take_link(tp_id).map_err(tp_err)?;
        let counters = ebpf
            .take_map("COUNTERS")
            .ok_or_else(|| ProbeError::Missing("map COUNTERS".into()))?;
        let counters = PerCpuArray::try_from(counters).map_err(|e| ProbeError::Map {
            name: "COUNTERS",
            source: Box::new(e),
        })?;
        let ring = ebpf
            .take_map("EVENTS")
            .ok_or_else(|| ProbeError::Missing("map EVENTS".into()))?;
        let ring = RingBuf::try_from(ring).map_err(|e| ProbeError::Map {
            name: "EVENTS",
            source: Box::new(e),
        })?;
        Ok(Probes {
            announce: Arc::default(),
            ebpf,
            libs: HashMap::new(),
            failed: HashMap::new(),
            rejected: discovery::memo::Memo::new(REJECTED_MAX),
            counters,
            ring: Some(ring),
            exit_tp: Some(exit_tp),
            closed: false,
            stop: Arc::default(),
            abandoned: Vec::new(),
        })
    }

    /// Stops attaching once `flag` is set (the agent sets it on SIGTERM/SIGINT): an attach
    /// in progress ends before its next probe with [`ProbeError::Closed`] (the probes it
    /// put in stay, for [`Probes::take_links`]), and no other starts. Attaching one libcuda
    /// takes about 100 probes, several of them in a row can take seconds.
    pub fn stop_on(&mut self, flag: Arc<AtomicBool>) {
        self.stop = flag;
    }

    fn stopping(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    /// Attach every probe to the libcuda at `path` (for all processes). A file already
    /// attached (same device and inode, through any path) is skipped. Functions this libcuda
    /// does not export are listed in [`AttachOutcome::missing`]; other failures detach what
    /// was attached and return the error.
    pub fn attach_libcuda(&mut self, path: &Path) -> Result<AttachOutcome, ProbeError> {
        let r = self.attach_libcuda_now(path, path);
        self.announce.settle();
        r
    }

    /// [`Probes::attach_libcuda`] of the file opened as `open`, recorded (and logged) as
    /// `path`, but for recording when it is over.
    fn attach_libcuda_now(
        &mut self,
        path: &Path,
        open: &Path,
    ) -> Result<AttachOutcome, ProbeError> {
        if self.closed || self.stopping() {
            return Err(ProbeError::Closed);
        }
        let meta = std::fs::metadata(open).map_err(|source| ProbeError::File {
            path: path.to_path_buf(),
            source,
        })?;
        let id = (meta.dev(), meta.ino());
        let stamp = FileStamp::from(&meta);
        if self.libs.get(&id).is_some_and(|l| l.stamp != stamp) {
            // Rewritten in place (same inode, other contents): the probes' offsets and saved
            // instructions are the old file's. Out with them, in with new ones.
            tracing::warn!(path = %path.display(), "libcuda rewritten in place: probes attached again");
            self.detach_libcuda(id);
        }
        if let Some(lib) = self.libs.get(&id) {
            return Ok(AttachOutcome {
                path: path.to_path_buf(),
                file_id: id,
                already_attached: true,
                attached: lib.symbols.clone(),
                missing: Vec::new(),
            });
        }
        // By inode and version: a deleted file's inode number may come back with a driver.
        if self.rejected.get(&id) == Some(&stamp) {
            return Err(ProbeError::NotLibcuda(path.to_path_buf()));
        }
        check_elf(path, open)?;
        // The probes' file offsets, computed from bounded reads of this descriptor (never an
        // mmap: a tenant truncating a mapped file would kill the agent with SIGBUS), and the
        // probes attached through `/proc/self/fd/<fd>`: the kernel resolves that to the very
        // inode read here, whatever the tenant does to the path meanwhile.
        let (file, offsets) = read_offsets(path, open, id)?;
        let target = PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd()));
        // Announced before the first probe goes in: a consumer that sees an event of this
        // library sees the announcement too, and can baseline its processes first.
        self.announce.begin();
        self.announce.add((maps_dev(id.0), id.1));
        let mut links: Vec<UProbeLink> = Vec::new();
        let mut attached = Vec::new();
        let mut missing = Vec::new();
        // Releases before allocations, each return before its entry (see `attach_order`).
        for sym in attach_order() {
            if self.stopping() {
                tracing::info!(path = %path.display(), probes = links.len(), "stopping: attach left unfinished");
                self.abandoned.append(&mut links);
                return Err(ProbeError::Closed);
            }
            let ret_name = format!("{sym}_ret");
            let offset = offsets.get(sym).copied();
            match self.attach_one(&ret_name, offset, &target) {
                Ok(l) => links.push(l),
                Err(AttachErr::NoSymbol) => {
                    tracing::debug!(symbol = sym, path = %path.display(), "not exported; skipped");
                    missing.push(sym);
                    continue;
                }
                Err(AttachErr::Other(e)) => {
                    drop(ProbeLinks::new(links));
                    return Err(ProbeError::Attach {
                        symbol: ret_name,
                        path: path.to_path_buf(),
                        source: Box::new(e),
                    });
                }
            }
            match self.attach_one(sym, offset, &target) {
                Ok(l) => links.push(l),
                Err(AttachErr::NoSymbol) => {
                    // Not after the return probe resolved the same symbol; should it happen,
                    // the return probe goes too (a return alone reports nothing).
                    drop(ProbeLinks::new(links.pop().into_iter().collect::<Vec<_>>()));
                    missing.push(sym);
                    continue;
                }
                Err(AttachErr::Other(e)) => {
                    drop(ProbeLinks::new(links));
                    return Err(ProbeError::Attach {
                        symbol: sym.to_string(),
                        path: path.to_path_buf(),
                        source: Box::new(e),
                    });
                }
            }
            attached.push(sym);
        }
        let table_order = |s: &&str| PROBED_SYMBOLS.iter().position(|p| p == s);
        attached.sort_by_key(table_order);
        missing.sort_by_key(table_order);
        if attached.is_empty() {
            self.rejected.insert(id, stamp);
            return Err(ProbeError::NotLibcuda(path.to_path_buf()));
        }
        tracing::info!(
            path = %path.display(),
            probed = attached.len(),
            missing = ?missing,
            "attached libcuda probes"
        );
        // Attached again (by its path, say) after a failed attempt: nothing to retry.
        self.failed.remove(&id);
        self.libs.insert(
            id,
            Lib {
                path: path.to_path_buf(),
                stamp,
                attached_at: SystemTime::now(),
                symbols: attached.clone(),
                maps_ids: vec![(maps_dev(id.0), id.1)],
                file: Arc::new(file),
                links,
            },
        );
        Ok(AttachOutcome {
            path: path.to_path_buf(),
            file_id: id,
            already_attached: false,
            attached,
            missing,
        })
    }

    /// Attaches program `prog` at file offset `offset` (`None`: the symbol is not defined)
    /// of `target`. The offset is given to aya as an absolute one: aya then never opens the
    /// file itself (with a symbol name it would `mmap` it, and a `.gnu_debuglink` file too).
    fn attach_one(
        &mut self,
        prog: &str,
        offset: Option<u64>,
        target: &Path,
    ) -> Result<UProbeLink, AttachErr> {
        let offset = offset.ok_or(AttachErr::NoSymbol)?;
        let p: &mut UProbe = self
            .ebpf
            .program_mut(prog)
            .ok_or_else(|| AttachErr::Other(ProgramError::NotLoaded))?
            .try_into()
            .map_err(AttachErr::Other)?;
        let at = UProbeAttachLocation::AbsoluteOffset(offset);
        match p.attach(at, target, UProbeScope::AllProcesses) {
            // Take ownership of the link so that detaching is dropping it, from any thread.
            Ok(id) => p.take_link(id).map_err(AttachErr::Other),
            Err(e) => Err(AttachErr::Other(e)),
        }
    }

    /// Files remembered as not libcuda.
    pub(super) fn rejected_len(&self) -> usize {
        self.rejected.len()
    }

    /// Files attached.
    pub(super) fn attached_len(&self) -> usize {
        self.libs.len()
    }

    /// Records that `/proc/<pid>/maps` shows the attached library `file_id` as `maps_id`.
    pub(super) fn add_maps_id(&mut self, file_id: (u64, u64), maps_id: &(String, u64)) {
        if let Some(l) = self.libs.get_mut(&file_id) {
            if !l.maps_ids.contains(maps_id) {
                l.maps_ids.push(maps_id.clone());
                self.announce.add(maps_id.clone());
            }
        }
    }

    /// The maps identities of the attached library `file_id` (empty if not attached).
    pub(super) fn maps_ids_of(&self, file_id: (u64, u64)) -> Vec<(String, u64)> {
        self.libs
            .get(&file_id)
            .map(|l| l.maps_ids.clone())
            .unwrap_or_default()
    }

    /// The attached files, each with its open descriptor, for [`Probes::review`]'s
    /// `fstat`s (made without holding the probes).
    pub(super) fn files(&self) -> Vec<((u64, u64), FileStamp, Arc<std::fs::File>)> {
        let libs = self
            .libs
            .iter()
            .map(|(id, l)| (*id, l.stamp, l.file.clone()));
        let failed = self
            .failed
            .iter()
            .map(|(id, f)| (*id, f.stamp, f.file.clone()));
        libs.chain(failed).collect()
    }

    /// Forgets a file whose attach again after a rewrite failed (see [`Probes::failed`]):
    /// it is unlinked, nobody can load it any more.
    pub(super) fn forget_failed(&mut self, file_id: (u64, u64)) {
        self.failed.remove(&file_id);
    }

    /// The library `file_id` was rewritten in place (its descriptor's `fstat` says another
    /// size or time): its probes' offsets and saved instructions are the old contents'.
    /// They are detached (here, blocking: they must be gone before the new ones go in, on
    /// the same inode) and the file is attached again, read through the descriptor kept
    /// (its path may name nothing now: a container's, through a dead process's root).
    /// `now` is the file's stamp as last seen (the version attached); if the attach fails
    /// (a file being written, or no longer a driver) it is tried again when that changes.
    pub(super) fn reattach_rewritten(
        &mut self,
        file_id: (u64, u64),
        now: FileStamp,
    ) -> Option<Result<AttachOutcome, ProbeError>> {
        let (path, file) = match (self.libs.remove(&file_id), self.failed.remove(&file_id)) {
            (Some(lib), _) => {
                tracing::warn!(path = %lib.path.display(), "libcuda rewritten in place: probes attached again");
                drop(ProbeLinks::new(lib.links));
                (lib.path, lib.file)
            }
            (None, Some(f)) => (f.path, f.file),
            (None, None) => return None,
        };
        self.rejected.remove(&file_id);
        let open = PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd()));
        let r = self.attach_libcuda_now(&path, &open);
        self.announce.settle();
        if r.is_err() && !self.closed {
            self.failed.insert(
                file_id,
                Failed {
                    path,
                    file,
                    stamp: now,
                },
            );
        }
        Some(r)
    }

    /// Detaches the probes of the library `file_id`, unlinked (no path names it) and mapped
    /// by no process, in the background (a thread: about 0.1 s per probe in the kernel),
    /// and forgets it; returns its maps identities (`None` if it was not attached). Its
    /// events already in the ring buffer are those of processes that have exited: applied
    /// as usual. The attach generation does not move (nothing to baseline).
    pub(super) fn retire(&mut self, file_id: (u64, u64)) -> Option<Vec<(String, u64)>> {
        let lib = self.libs.remove(&file_id)?;
        let still: HashSet<&(String, u64)> =
            self.libs.values().flat_map(|l| l.maps_ids.iter()).collect();
        let gone: Vec<(String, u64)> = lib
            .maps_ids
            .iter()
            .filter(|i| !still.contains(i))
            .cloned()
            .collect();
        self.announce.remove(&gone);
        tracing::info!(
            path = %lib.path.display(),
            links = lib.links.len(),
            "libcuda unlinked and no longer mapped: probes detached"
        );
        ProbeLinks::new(lib.links).detach_in_thread();
        Some(lib.maps_ids)
    }

    /// Detach every probe from the library `file_id` (see [`AttachOutcome::file_id`]);
    /// returns whether it was attached.
    pub fn detach_libcuda(&mut self, file_id: (u64, u64)) -> bool {
        match self.libs.remove(&file_id) {
            Some(lib) => {
                drop(ProbeLinks::new(lib.links));
                true
            }
            None => false,
        }
    }

    /// Takes every link out (the process-exit tracepoint and all libcuda probes) and refuses
    /// further attaching. The probes stay in the kernel until the returned [`ProbeLinks`] is
    /// dropped or handed off: detaching is slow (about 0.1 s per link, one after another in
    /// the kernel), so a caller that is about to exit can use
    /// [`ProbeLinks::detach_in_background`].
    pub fn take_links(&mut self) -> ProbeLinks {
        self.closed = true;
        self.failed.clear();
        let mut links = ProbeLinks::default();
        for (_, lib) in self.libs.drain() {
            links.extend(lib.links);
        }
        links.extend(self.abandoned.drain(..));
        if let Some(tp) = self.exit_tp.take() {
            links.push(tp);
        }
        links
    }

    /// The libraries attached so far.
    pub fn attached(&self) -> Vec<AttachedLibrary> {
        let mut v: Vec<AttachedLibrary> = self
            .libs
            .iter()
            .map(|(id, l)| AttachedLibrary {
                path: l.path.clone(),
                file_id: *id,
                attached_at: l.attached_at,
                symbols: l.symbols.clone(),
                maps_ids: l.maps_ids.clone(),
            })
            .collect();
        v.sort_by_key(|l| l.attached_at);
        v
    }

    /// Counters summed over CPUs (`received`/`malformed` are 0 before [`Probes::spawn`]).
    pub fn counters(&self) -> ProbeCounters {
        read_counters(&self.counters, &UserCounters::default())
    }

    /// Take the raw ring buffer (for callers that poll it themselves); [`Probes::spawn`]
    /// needs it, so call one or the other.
    pub fn take_ring(&mut self) -> Option<RingBuf<MapData>> {
        self.ring.take()
    }
}

enum AttachErr {
    NoSymbol,
    Other(ProgramError),
}

impl Drop for Probes {
    /// Detaches every probe, all at once (see [`ProbeLinks`]); the programs and maps go
    /// after, with the [`Ebpf`].
    fn drop(&mut self) {
        drop(self.take_links());
    }
}

/// The file opened as `open` (named `path` in errors) must be an ELF object (read through
/// [`discovery::is_elf`]).
fn check_elf(path: &Path, open: &Path) -> Result<(), ProbeError> {
    match discovery::is_elf(open) {
        Ok(true) => Ok(()),
        Ok(false) => Err(ProbeError::NotLibcuda(path.to_path_buf())),
        Err(source) => Err(ProbeError::File {
            path: path.to_path_buf(),
            source,
        }),
    }
}

/// Opens the file at `open` (as discovery does: never blocking, regular files only; named
/// `path` in errors), checks that it is still the file `id` (`(st_dev, st_ino)`), and
/// computes the uprobe offset of each of [`PROBED_SYMBOLS`] it defines (see
/// [`discovery::uprobe_offsets`]).
fn read_offsets(
    path: &Path,
    open: &Path,
    id: (u64, u64),
) -> Result<(std::fs::File, HashMap<&'static str, u64>), ProbeError> {
    let elf_err = |source| ProbeError::Elf {
        path: path.to_path_buf(),
        source,
    };
    let file = match discovery::open_driver_file(open) {
        Ok(f) => f,
        Err(discovery::ElfError::Io(source)) => {
            return Err(ProbeError::File {
                path: path.to_path_buf(),
                source,
            })
        }
        Err(e) => return Err(elf_err(e)),
    };
    let meta = file.metadata().map_err(|source| ProbeError::File {
        path: path.to_path_buf(),
        source,
    })?;
    if (meta.dev(), meta.ino()) != id {
        // Swapped between the stat and the open: the next scan looks again.
        return Err(ProbeError::File {
            path: path.to_path_buf(),
            source: io::Error::other("the file was replaced while being attached"),
        });
    }
    let cache = object::read::ReadCache::new(&file);
    let found = discovery::uprobe_offsets(&cache, PROBED_SYMBOLS, discovery::MAX_ELF_READ)
        .map_err(elf_err)?;
    let offsets = found
        .into_iter()
        .filter_map(|(name, off)| {
            let sym = PROBED_SYMBOLS.iter().find(|s| **s == name)?;
            Some((*sym, off))
        })
        .collect();
    drop(cache);
    Ok((file, offsets))
}

fn raise_memlock() {
    let lim = libc::rlimit {
        rlim_cur: libc::RLIM_INFINITY,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: setrlimit reads a valid, initialised rlimit struct.
    let rc = unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &lim) };
    if rc != 0 {
        tracing::warn!(
            error = %io::Error::last_os_error(),
            "cannot raise RLIMIT_MEMLOCK; continuing (recent kernels account eBPF memory to the cgroup)"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hami_abi::intercept::probe_kind;

    #[test]
    fn releases_are_attached_before_allocations_and_every_symbol_once() {
        let order = attach_order();
        let mut sorted = order.clone();
        sorted.sort_unstable();
        let mut all = PROBED_SYMBOLS.to_vec();
        all.sort_unstable();
        assert_eq!(sorted, all);
        let pos = |s: &str| order.iter().position(|o| *o == s).unwrap();
        let last_release = order.iter().rposition(|s| probe_kind(s).is_free()).unwrap();
        let first_alloc = order.iter().position(|s| probe_kind(s).is_alloc()).unwrap();
        assert!(last_release < first_alloc, "{order:?}");
        assert!(pos("cuArrayDestroy") < pos("cuArrayCreate_v2"));
        assert!(pos("cuMemFree_v2") < pos("cuMemAllocPitch_v2"));
        assert!(pos("cuCtxDestroy_v2") < pos("cuCtxCreate_v2"));
        assert!(pos("cuDevicePrimaryCtxRelease_v2") < pos("cuDevicePrimaryCtxRetain"));
    }
}
