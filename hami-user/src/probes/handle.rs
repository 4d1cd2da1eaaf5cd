//! Running probes: the handle the agent keeps (counters, attached libraries, announced
//! files) and the periodic libcuda discovery that attaches new files.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use aya::maps::{MapData, PerCpuArray};
use hami_abi::event::Event;
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::attach::{Announce, AttachOutcome, AttachedLibrary, Probes};
use super::discovery;
use super::error::ProbeError;
use super::options::DiscoveryOptions;
use super::stamp::FileStamp;
use super::stream::{pump, second_handle, ProbeCounters};
use super::stream::{read_counters, UserCounters};
use super::teardown::ProbeLinks;

/// What the handle and the discovery task share.
pub(super) struct Shared {
    pub(super) probes: Mutex<Probes>,
    pub(super) user: Arc<UserCounters>,
    pub(super) announce: Arc<Announce>,
    /// A second handle on the counters map, read without `probes`' lock (held for seconds
    /// while a libcuda is attached): the agent's loop never waits for an attach.
    pub(super) counters: Option<PerCpuArray<MapData, u64>>,
    /// The attached libraries as last read (served while an attach holds the lock).
    pub(super) attached: Mutex<Vec<AttachedLibrary>>,
    /// Files named to attach (`--libcuda`): looked at again on every discovery pass, like
    /// the host's own driver paths, so that a file replaced there is attached again.
    pub(super) extra: Vec<PathBuf>,
    /// What discovery passes remember between them, one for the periodic task and
    /// [`ProbeHandle::rescan`]: the agent's first synchronous pass and the periodic task's
    /// immediate one make one full scan between them, not two.
    pub(super) scan: Mutex<ScanState>,
}

impl Shared {
    pub(super) fn lock(&self) -> std::sync::MutexGuard<'_, Probes> {
        self.probes.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// One discovery pass with the shared [`ScanState`] (waits for a pass in progress).
    pub(super) fn rescan(&self, proc_root: &Path) -> Vec<AttachOutcome> {
        let mut st = self.scan.lock().unwrap_or_else(|p| p.into_inner());
        rescan(self, proc_root, &mut st)
    }
}

/// Per-scan memory of the discovery task: the maps identities and the paths already
/// handled (a path with the stamp of the file it named then), bounded (see
/// [`discovery::seen::Seen`] and [`discovery::Classifier`]).
#[derive(Default)]
pub(super) struct ScanState {
    seen: discovery::seen::Seen<Option<FileStamp>>,
    classifier: discovery::Classifier,
    /// Attached files seen rewritten in place, with the version seen: attached again once
    /// a pass finds that version unchanged (not while it is being written).
    rewrites: HashMap<(u64, u64), FileStamp>,
}

/// One discovery pass: every candidate not handled yet is attached. A path is handled again
/// when the file it names changed (a driver upgrade renames a new file over the old one, or
/// rewrites it): the new file is attached before processes load it. The attached files
/// themselves are looked at first (see [`review`]).
pub(super) fn rescan(shared: &Shared, proc_root: &Path, st: &mut ScanState) -> Vec<AttachOutcome> {
    let mut out = Vec::new();
    let unlinked = review(shared, st, &mut out);
    // Who still maps the unlinked ones: answered by the next full scan of the maps.
    let watch: Vec<(String, u64)> = {
        let p = shared.lock();
        unlinked.iter().flat_map(|id| p.maps_ids_of(*id)).collect()
    };
    st.classifier.watch(watch);
    let mut candidates = discovery::discover_libcuda_with(proc_root, &mut st.classifier);
    candidates.extend(shared.extra.iter().map(|p| discovery::Candidate {
        path: p.clone(),
        maps_id: None,
    }));
    let full = st.classifier.last_scan_full();
    st.seen.begin(full);
    for c in candidates {
        let stamp = match &c.maps_id {
            Some(_) => None,
            None => FileStamp::of(&c.path),
        };
        let new = match &c.maps_id {
            Some(id) => st.seen.is_new_map(id),
            None => st.seen.is_new_path(&c.path, &stamp),
        };
        if !new {
            continue;
        }
        // The file is a tenant's: a malformed ELF that makes the loader panic must cost this
        // candidate only, not the discovery task (every later library would go unprobed).
        let res = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            shared.lock().attach_libcuda(&c.path)
        })) {
            Ok(r) => r,
            Err(_) => {
                tracing::warn!(path = %c.path.display(), "attaching this file panicked: skipped");
                Err(ProbeError::NotLibcuda(c.path.clone()))
            }
        };
        if let (Ok(o), Some(mid)) = (&res, &c.maps_id) {
            shared.lock().add_maps_id(o.file_id, mid);
        }
        let done = match res {
            Ok(o) => {
                if !o.already_attached {
                    out.push(o);
                }
                true
            }
            Err(ProbeError::NotLibcuda(_) | ProbeError::Closed) => true,
            Err(ProbeError::File { .. }) => false, // process gone: retry next time if still there
            Err(e) => {
                tracing::warn!(path = %c.path.display(), error = %e, "cannot attach libcuda probes");
                true
            }
        };
        if done {
            match c.maps_id {
                Some(id) => st.seen.handled_map(id),
                None => st.seen.handled_path(c.path, stamp),
            }
        }
    }
    st.seen.end(full);
    if full {
        let m = st.memory(&shared.lock());
        tracing::debug!(
            target: MEMORY_LOG_TARGET,
            seen_maps = m.seen_maps,
            seen_paths = m.seen_paths,
            classified = m.classified,
            with_driver = m.with_driver,
            rejected = m.rejected,
            attached = m.attached,
            "discovery memory"
        );
        crate::heap::give_back();
    }
    let taken = st.classifier.take_watched();
    if !unlinked.is_empty() {
        tracing::debug!(unlinked = ?unlinked, watch = ?taken, "unlinked libcuda files");
    }
    if let Some(w) = taken {
        retire_unmapped(shared, &unlinked, &w, st);
    }
    out
}

/// Looks at every attached file through the descriptor kept open (one `fstat` each, made
/// without holding the probes): one rewritten in place (same inode, another size or time)
/// is attached again, whatever path it was found by (into `out`), once a pass finds it
/// unchanged since the previous one (a file being copied in is not read half-written; one
/// whose attach fails is tried again when it changes); the unlinked ones (a driver upgrade
/// renamed a new file over it, or removed it: no path names it any more) are returned, to
/// be detached once no process maps them.
fn review(shared: &Shared, st: &mut ScanState, out: &mut Vec<AttachOutcome>) -> Vec<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    let files = shared.lock().files();
    let mut unlinked = Vec::new();
    let mut rewrites = HashMap::new();
    for (id, stamp, file) in files {
        let Ok(meta) = file.metadata() else { continue };
        let now = FileStamp::from(&meta);
        if meta.nlink() == 0 {
            unlinked.push(id);
        } else if now != stamp {
            if st.rewrites.get(&id) != Some(&now) {
                rewrites.insert(id, now);
                continue;
            }
            match shared.lock().reattach_rewritten(id, now) {
                Some(Ok(o)) => out.push(o),
                Some(Err(e)) => {
                    tracing::warn!(error = %e, "cannot attach a rewritten libcuda again")
                }
                None => {}
            }
        }
    }
    st.rewrites = rewrites;
    unlinked
}

/// Detaches (in the background) the probes of the `unlinked` files that the full scan `w`
/// watched in full and found mapped by no live process: nobody runs that code any more,
/// and nobody can load it by a path. A file known under more maps identities than were
/// watched (one learned during the pass) waits for the next full scan.
fn retire_unmapped(
    shared: &Shared,
    unlinked: &[(u64, u64)],
    w: &discovery::WatchResult,
    st: &mut ScanState,
) {
    let mut p = shared.lock();
    for id in unlinked {
        p.forget_failed(*id);
        let ids = p.maps_ids_of(*id);
        if ids.is_empty()
            || !ids.iter().all(|i| w.watched.contains(i))
            || ids.iter().any(|i| w.mapped.contains(i))
        {
            continue;
        }
        if let Some(gone) = p.retire(*id) {
            for g in &gone {
                st.seen.forget_map(g);
            }
        }
    }
}

/// The `tracing` target of the `discovery memory` line logged (at debug level) after every
/// full scan: the sizes of [`DiscoveryMemory`] (`RUST_LOG=hami_user::probes::memory=debug`).
pub const MEMORY_LOG_TARGET: &str = "hami_user::probes::memory";

/// How much discovery remembers now (see [`ProbeHandle::discovery_memory`]): every figure is
/// bounded, by the files mapped now or by a documented cap.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DiscoveryMemory {
    /// Maps identities handled (attached, or found not to be a driver), at most
    /// [`discovery::seen::SEEN_MAPS_MAX`].
    pub seen_maps: usize,
    /// Paths handled (`ld.so.cache`, driver directories, `--libcuda`) that the latest pass
    /// offered.
    pub seen_paths: usize,
    /// Mapped files classified (driver or not), at most [`discovery::Classifier::MAX`].
    pub classified: usize,
    /// Processes whose maps showed a driver at the latest scan.
    pub with_driver: usize,
    /// Files found to export none of the probed functions, at most
    /// [`super::REJECTED_MAX`].
    pub rejected: usize,
    /// Files attached (each until it is unlinked and mapped by nobody).
    pub attached: usize,
}

impl ScanState {
    fn memory(&self, p: &Probes) -> DiscoveryMemory {
        DiscoveryMemory {
            seen_maps: self.seen.maps_len(),
            seen_paths: self.seen.paths_len(),
            classified: self.classifier.known_len(),
            with_driver: self.classifier.with_driver_len(),
            rejected: p.rejected_len(),
            attached: p.attached_len(),
        }
    }
}

/// Handle on running probes (see [`Probes::spawn`]). Dropping it stops the event and
/// discovery tasks and detaches every probe.
pub struct ProbeHandle {
    pub(super) shared: Arc<Shared>,
    pub(super) tasks: Vec<JoinHandle<()>>,
    pub(super) proc_root: PathBuf,
}

impl ProbeHandle {
    /// Counters summed over CPUs (never waits for an attach in progress).
    pub fn counters(&self) -> ProbeCounters {
        match &self.shared.counters {
            Some(c) => read_counters(c, &self.shared.user),
            None => read_counters(&self.shared.lock().counters, &self.shared.user),
        }
    }

    /// The libraries attached so far (with the time each was attached); waits for an
    /// attach in progress.
    pub fn attached(&self) -> Vec<AttachedLibrary> {
        let now = self.shared.lock().attached();
        *self
            .shared
            .attached
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = now.clone();
        now
    }

    /// [`ProbeHandle::attached`] without waiting: while an attach holds the probes
    /// (seconds), the list as last read (for periodic work that must not stall).
    pub fn attached_cached(&self) -> Vec<AttachedLibrary> {
        let mut cache = self
            .shared
            .attached
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        match self.shared.probes.try_lock() {
            Ok(p) => *cache = p.attached(),
            Err(std::sync::TryLockError::Poisoned(p)) => *cache = p.into_inner().attached(),
            Err(std::sync::TryLockError::WouldBlock) => {}
        }
        cache.clone()
    }

    /// Increases each time a libcuda file is about to be attached (before its first probe
    /// goes in) or becomes known under another maps identity. A consumer that sees it change
    /// should baseline the processes that map [`ProbeHandle::announced_maps_ids`] *before*
    /// applying further events: events of a newly probed library can follow at once.
    pub fn attach_generation(&self) -> u64 {
        self.shared.announce.generation.load(Ordering::SeqCst)
    }

    /// When the latest libcuda attach finished, in clock ticks since boot (comparable with
    /// a process's start time); `None` while one is in progress. A process that started
    /// after it and maps only attached files was watched from its start.
    pub fn attach_settled_ticks(&self) -> Option<u64> {
        match self.shared.announce.settled_ticks.load(Ordering::SeqCst) {
            0 => None,
            t => Some(t),
        }
    }

    /// The `/proc/<pid>/maps` identities of every libcuda file attached or being attached.
    pub fn announced_maps_ids(&self) -> Vec<(String, u64)> {
        self.shared
            .announce
            .maps_ids
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Attach a libcuda file now (blocking: a few ms per file).
    pub fn attach_libcuda(&self, path: &Path) -> Result<AttachOutcome, ProbeError> {
        self.shared.lock().attach_libcuda(path)
    }

    /// How much discovery remembers now (waits for a pass or an attach in progress).
    pub fn discovery_memory(&self) -> DiscoveryMemory {
        let st = self.shared.scan.lock().unwrap_or_else(|p| p.into_inner());
        st.memory(&self.shared.lock())
    }

    /// Run one discovery pass now (blocking) and return what was newly attached.
    pub fn rescan(&self) -> Vec<AttachOutcome> {
        self.shared.rescan(&self.proc_root)
    }

    /// Stops the event and discovery tasks and takes every link out (see
    /// [`Probes::take_links`]); the probes go when the result is dropped or handed off.
    pub fn shutdown(self) -> ProbeLinks {
        for t in &self.tasks {
            t.abort();
        }
        self.shared.lock().take_links()
    }
}

impl Drop for ProbeHandle {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

impl Probes {
    /// Start streaming: a tokio task reads the ring buffer into the returned channel, and
    /// (unless `discovery.interval` is `None`) a task re-runs libcuda discovery periodically
    /// and attaches new files. Must be called inside a tokio runtime (with the `net` driver
    /// enabled, i.e. `enable_io`). Dropping the [`ProbeHandle`] stops both tasks and detaches
    /// the probes.
    pub fn spawn(
        mut self,
        discovery: DiscoveryOptions,
    ) -> Result<(mpsc::Receiver<Event>, ProbeHandle), ProbeError> {
        let ring = self
            .ring
            .take()
            .ok_or_else(|| ProbeError::Missing("ring buffer (already taken)".into()))?;
        // SAFETY: the ring buffer owns its fd, which stays open and unchanged until the
        // AsyncFd (which owns the RingBuf) is dropped.
        let afd = unsafe { AsyncFd::register_with_interest(ring, Interest::READABLE) }
            .map_err(|e| ProbeError::Runtime(e.into_parts().1))?;
        let (tx, rx) = mpsc::channel(discovery.channel_capacity.max(1));
        let user = Arc::new(UserCounters::default());
        let counters = second_handle(&self.counters);
        let shared = Arc::new(Shared {
            extra: discovery.extra.clone(),
            scan: Mutex::default(),
            announce: self.announce.clone(),
            attached: Mutex::new(self.attached()),
            probes: Mutex::new(self),
            user: user.clone(),
            counters,
        });
        let mut tasks = vec![tokio::spawn(pump(afd, tx, user))];
        for p in &discovery.extra {
            match shared.lock().attach_libcuda(p) {
                Ok(_) | Err(ProbeError::Closed) => {}
                Err(e) => tracing::warn!(path = %p.display(), error = %e, "cannot attach libcuda"),
            }
        }
        let handle_shared = shared.clone();
        if let Some(interval) = discovery.interval {
            let proc_root = discovery.proc_root.clone();
            tasks.push(tokio::spawn(async move {
                let mut tick = tokio::time::interval(interval);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    tick.tick().await;
                    let sh = shared.clone();
                    let root = proc_root.clone();
                    match tokio::task::spawn_blocking(move || {
                        sh.rescan(&root);
                    })
                    .await
                    {
                        Ok(()) => {}
                        Err(e) => {
                            tracing::error!(error = %e, "libcuda discovery task failed");
                            return;
                        }
                    }
                }
            }));
        }
        Ok((
            rx,
            ProbeHandle {
                shared: handle_shared,
                tasks,
                proc_root: discovery.proc_root,
            },
        ))
    }
}
