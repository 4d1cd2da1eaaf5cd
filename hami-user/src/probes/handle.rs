//! Running probes: the handle the agent keeps (counters, attached libraries, announced
//! files) and the periodic libcuda discovery that attaches new files.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use aya::maps::{MapData, PerCpuArray};
use tokio::task::JoinHandle;

use super::stream::{read_counters, UserCounters};
use super::{
    discovery, Announce, AttachOutcome, AttachedLibrary, ProbeCounters, ProbeError, ProbeLinks,
    Probes,
};

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
/// handled (a path with the stamp of the file it named then).
#[derive(Default)]
pub(super) struct ScanState {
    seen_maps: HashSet<(String, u64)>,
    seen_paths: HashMap<PathBuf, Option<FileStamp>>,
    classifier: discovery::Classifier,
}

/// One discovery pass: every candidate not handled yet is attached. A path is handled again
/// when the file it names changed (a driver upgrade renames a new file over the old one, or
/// rewrites it): the new file is attached before processes load it.
pub(super) fn rescan(shared: &Shared, proc_root: &Path, st: &mut ScanState) -> Vec<AttachOutcome> {
    let mut out = Vec::new();
    let mut candidates = discovery::discover_libcuda_with(proc_root, &mut st.classifier);
    candidates.extend(shared.extra.iter().map(|p| discovery::Candidate {
        path: p.clone(),
        maps_id: None,
    }));
    for c in candidates {
        let stamp = match &c.maps_id {
            Some(_) => None,
            None => FileStamp::of(&c.path),
        };
        let new = match &c.maps_id {
            Some(id) => !st.seen_maps.contains(id),
            None => st.seen_paths.get(&c.path) != Some(&stamp),
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
                Some(id) => {
                    st.seen_maps.insert(id);
                }
                None => {
                    st.seen_paths.insert(c.path, stamp);
                }
            }
        }
    }
    out
}

/// What identifies one version of a file: device, inode, size and modification time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct FileStamp {
    id: (u64, u64),
    len: u64,
    mtime: (i64, i64),
}

impl FileStamp {
    /// The stamp of the file `path` names now (symlinks followed); `None` if it cannot be
    /// read.
    pub(super) fn of(path: &Path) -> Option<FileStamp> {
        std::fs::metadata(path).ok().map(|m| FileStamp::from(&m))
    }
}

impl From<&std::fs::Metadata> for FileStamp {
    fn from(m: &std::fs::Metadata) -> FileStamp {
        use std::os::unix::fs::MetadataExt;
        FileStamp {
            id: (m.dev(), m.ino()),
            len: m.len(),
            mtime: (m.mtime(), m.mtime_nsec()),
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
