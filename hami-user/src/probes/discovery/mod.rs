//! Finding libcuda files: the host's `ld.so.cache`, well-known driver directories, and the
//! memory maps of running processes (inside containers through `/proc/<pid>/root`).

use std::collections::HashSet;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use crate::procinfo::{maps_entries, MapsEntry};

pub mod mapped;
pub mod memo;
pub mod seen;
mod symbols;

pub use symbols::{
    dynamic_symbols_defined, elf_defined_symbols, is_elf, open_driver_file, uprobe_offsets,
    ElfError, MAX_ELF_READ,
};

use mapped::{exec_file_mappings, is_mapped_file, map_files_path};
use memo::Memo;

/// Directories where NVIDIA drivers commonly put `libcuda.so.1` (host and GPU images).
pub const WELL_KNOWN_DIRS: &[&str] = &[
    "/usr/local/nvidia/lib64",
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib64",
    "/usr/lib",
    "/lib/x86_64-linux-gnu",
    "/lib64",
    "/lib",
    // aarch64 nodes (GH200, GB200): Debian/Ubuntu's multiarch directories.
    "/usr/lib/aarch64-linux-gnu",
    "/lib/aarch64-linux-gnu",
    // The GPU operator's driver container, seen from the host (its root at
    // /run/nvidia/driver): Ubuntu images use the multiarch directory, RHEL ones lib64.
    "/run/nvidia/driver/usr/lib/x86_64-linux-gnu",
    "/run/nvidia/driver/usr/lib/aarch64-linux-gnu",
    "/run/nvidia/driver/usr/lib64",
];

/// Whether a file name looks like a CUDA driver library (`libcuda.so`, `libcuda.so.1`,
/// `libcuda.so.580.1.2`, ...).
pub fn is_libcuda_name(name: &str) -> bool {
    name.starts_with("libcuda.so")
}

/// Symbols whose definition marks a library as a CUDA driver even when its file name is not
/// `libcuda.so*` (a driver installed under another name and reached through a symlink: the
/// maps then show the target's name).
pub const DRIVER_SYMBOLS: &[&str] = &[
    "cuMemAlloc_v2",
    "cuMemAllocAsync",
    "cuMemCreate",
    "cuMemAllocManaged",
];

/// The symbol every build of hami-preload defines (and no driver does): a file named
/// `libhami_preload*` without it is not the preload.
pub const PRELOAD_MARKER: &str = "hami_preload_marker";

/// Whether the ELF shared object at `path` defines `cuInit` and at least one of
/// [`DRIVER_SYMBOLS`] in its dynamic symbol table (see [`elf_defined_symbols`]).
pub fn elf_defines_driver_symbols(path: &Path) -> bool {
    let mut wanted = vec!["cuInit"];
    wanted.extend_from_slice(DRIVER_SYMBOLS);
    elf_defined_symbols(path, &wanted).is_some_and(|found| {
        found.iter().any(|s| s == "cuInit") && found.iter().any(|s| s != "cuInit")
    })
}

/// Remembers which mapped files (by their `/proc/<pid>/maps` device and inode) are CUDA
/// drivers, so that each file's symbols are read once; and, across the periodic scans of
/// [`scan_proc_maps_with`], which processes already map a driver (their `maps` are read
/// again only every [`FULL_SCAN_EVERY`] scans).
///
/// Bounded: the files' answers are a [`Memo`] of at most [`Classifier::MAX`] entries whose
/// epoch moves at every full scan; a file no full scan has seen mapped for more than
/// [`Classifier::KEEP_FULL_SCANS`] full scans is forgotten (read again if it comes back).
/// The processes with a driver are those of the latest scan only.
#[derive(Debug)]
pub struct Classifier {
    known: Memo<(String, u64), bool>,
    /// Processes (pid, start time) whose `maps` showed a driver at the last reading.
    with_driver: HashSet<(u32, u64)>,
    /// Scans done with this classifier.
    scans: u64,
    /// Whether the latest scan was a full one (see [`Classifier::last_scan_full`]).
    last_full: bool,
    /// Files (maps identities) whose mappers full scans look for (see [`Classifier::watch`]).
    watched: HashSet<(String, u64)>,
    /// What the last scan found of `watched`, when it was a full one that read every live
    /// process's maps (see [`Classifier::take_watched`]).
    watch_result: Option<WatchResult>,
}

/// What a full scan found of the files given to [`Classifier::watch`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WatchResult {
    /// The files looked for.
    pub watched: HashSet<(String, u64)>,
    /// Those that some live process maps (any mapping, deleted files included).
    pub mapped: HashSet<(String, u64)>,
}

/// A process whose `maps` showed a CUDA driver is skipped by the periodic scan except on
/// every `FULL_SCAN_EVERY`-th scan (the first scan is a full one): its driver was found
/// then, and a second driver mapped later by the same process is found within this many
/// scans (5 s at the agent's 500 ms), and so is a driver whose attach failed because its
/// process was gone when it was tried (the caller's retry). Every other process is read at
/// every scan (it may load a driver at any moment). Reading `/proc/<pid>/maps` of 5000 GPU processes every 500 ms
/// cost the agent more than a core (docs/benchmarks.md, Scale).
pub const FULL_SCAN_EVERY: u64 = 10;

impl Default for Classifier {
    fn default() -> Classifier {
        Classifier {
            known: Memo::new(Classifier::MAX),
            with_driver: HashSet::new(),
            scans: 0,
            last_full: false,
            watched: HashSet::new(),
            watch_result: None,
        }
    }
}

impl Classifier {
    /// Files whose answer is remembered at most (a node that keeps starting containers sees
    /// new inodes for ever; the least recently seen are forgotten first).
    pub const MAX: usize = 1 << 14;

    /// Full scans a file's answer is kept for after the last one that saw it mapped.
    pub const KEEP_FULL_SCANS: u64 = 1;

    /// Whether the latest [`scan_proc_maps_with`] read every live process's maps (the first
    /// scan and every [`FULL_SCAN_EVERY`]-th).
    pub fn last_scan_full(&self) -> bool {
        self.last_full
    }

    /// Files whose answer (driver or not) is remembered now.
    pub fn known_len(&self) -> usize {
        self.known.len()
    }

    /// Processes whose maps showed a driver at the latest scan.
    pub fn with_driver_len(&self) -> usize {
        self.with_driver.len()
    }

    /// From the next full scan on (every [`FULL_SCAN_EVERY`]-th), look for processes that
    /// map any of `ids` (`/proc/<pid>/maps` device and inode; replaces the previous set).
    /// Only a full scan reads every process, so only it can say that nobody maps a file.
    pub fn watch(&mut self, ids: impl IntoIterator<Item = (String, u64)>) {
        self.watched = ids.into_iter().collect();
    }

    /// What the latest full scan found of the watched files, once (`None` if there was no
    /// full scan since the last call, nothing was watched, or a live process's maps could
    /// not be read: then nobody can be said not to map them).
    pub fn take_watched(&mut self) -> Option<WatchResult> {
        self.watch_result.take()
    }

    /// Whether the mapped file `id`, opened as `path` (named `name` in the maps), is a CUDA
    /// driver: named `libcuda.so*`, or an ELF that defines `cuInit` and an allocation
    /// function (not hami-preload, which defines them as hooks: a file that defines
    /// [`PRELOAD_MARKER`] too).
    pub fn is_driver(&mut self, id: &(String, u64), path: &Path, name: &str) -> bool {
        if is_libcuda_name(name) {
            return true;
        }
        if let Some(&k) = self.known.get(id) {
            return k;
        }
        let Ok(meta) = fs::metadata(path) else {
            return false; // process gone: decide next time
        };
        // hami-preload defines the driver's functions as hooks: a file of its name is the
        // preload when it defines the preload's marker, else a driver under a false name
        // (a tenant hiding its libcuda from the probes) if its symbols say so.
        let k = meta.is_file()
            && if name.starts_with("libhami_preload") {
                elf_defined_symbols(path, &[PRELOAD_MARKER]).is_some_and(|found| found.is_empty())
                    && elf_defines_driver_symbols(path)
            } else {
                elf_defines_driver_symbols(path)
            };
        self.known.insert(id.clone(), k);
        k
    }
}

/// One libcuda file found by [`discover_libcuda_detailed`].
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Candidate {
    /// Path to open from the agent's mount namespace (through `/proc/<pid>/root` for files
    /// found in a process's maps).
    pub path: PathBuf,
    /// Device and inode as written in `/proc/<pid>/maps` (the real file, even on overlayfs),
    /// when found there.
    pub maps_id: Option<(String, u64)>,
}

/// Every libcuda file found, as paths the agent can open (no deduplication by inode here;
/// [`super::Probes::attach_libcuda`] dedupes by device and inode).
pub fn discover_libcuda(proc_root: &Path) -> Vec<PathBuf> {
    let mut seen = HashSet::new();
    discover_libcuda_detailed(proc_root)
        .into_iter()
        .map(|c| c.path)
        .filter(|p| seen.insert(p.clone()))
        .collect()
}

/// [`discover_libcuda`] with the maps identity of each candidate.
pub fn discover_libcuda_detailed(proc_root: &Path) -> Vec<Candidate> {
    discover_libcuda_with(proc_root, &mut Classifier::default())
}

/// [`discover_libcuda_detailed`] remembering, in `classifier`, which mapped files are drivers.
pub fn discover_libcuda_with(proc_root: &Path, classifier: &mut Classifier) -> Vec<Candidate> {
    let mut out = Vec::new();
    for cache in [
        PathBuf::from("/etc/ld.so.cache"),
        proc_root.join("1/root/etc/ld.so.cache"),
    ] {
        let prefix = cache
            .parent()
            .and_then(Path::parent)
            .map(Path::to_path_buf)
            .unwrap_or_default();
        if let Ok(data) = fs::read(&cache) {
            for p in parse_ld_so_cache(&data) {
                if Path::new(&p)
                    .file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(is_libcuda_name)
                {
                    out.push(Candidate {
                        path: rooted(&prefix, Path::new(&p)),
                        maps_id: None,
                    });
                }
            }
        }
    }
    for dir in WELL_KNOWN_DIRS {
        for name in ["libcuda.so.1", "libcuda.so"] {
            let p = Path::new(dir).join(name);
            if p.is_file() {
                out.push(Candidate {
                    path: p,
                    maps_id: None,
                });
            }
        }
    }
    out.extend(scan_proc_maps_with(proc_root, classifier));
    out.retain(|c| c.path.is_file());
    out
}

/// `prefix` + absolute `p` (`/proc/1/root` + `/usr/lib/x.so`).
fn rooted(prefix: &Path, p: &Path) -> PathBuf {
    if prefix.as_os_str().is_empty() || prefix == Path::new("/") {
        return p.to_path_buf();
    }
    prefix.join(p.strip_prefix("/").unwrap_or(p))
}

/// libcuda files mapped by running processes, as `<proc_root>/<pid>/root/<path>`.
pub fn scan_proc_maps(proc_root: &Path) -> Vec<Candidate> {
    scan_proc_maps_with(proc_root, &mut Classifier::default())
}

/// Reads a `/proc/<pid>/maps` file, at most `max` bytes (a process can make its maps as
/// large as it likes: a mapping per page). `true`: the file was longer; what is returned
/// then ends at its last complete line within `max` (a cut line is no mapping).
fn read_maps_bounded(path: &Path, max: u64) -> io::Result<(Vec<u8>, bool)> {
    use std::io::Read;
    let mut out = Vec::new();
    fs::File::open(path)?
        .take(max.saturating_add(1))
        .read_to_end(&mut out)?;
    if out.len() as u64 <= max {
        return Ok((out, false));
    }
    out.truncate(max as usize);
    let end = out.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
    out.truncate(end);
    Ok((out, true))
}

/// [`scan_proc_maps`]: every executable file mapping is a candidate when `classifier` says
/// it is a driver (by name, or by the symbols it defines). With a classifier kept across
/// scans, a process that already mapped a driver is read again only every
/// [`FULL_SCAN_EVERY`] scans.
pub fn scan_proc_maps_with(proc_root: &Path, classifier: &mut Classifier) -> Vec<Candidate> {
    let mut out = Vec::new();
    let mut seen = HashSet::new();
    let Ok(entries) = fs::read_dir(proc_root) else {
        classifier.last_full = false;
        return out;
    };
    let full = classifier.scans.is_multiple_of(FULL_SCAN_EVERY);
    classifier.scans += 1;
    classifier.last_full = full;
    if full {
        classifier.known.advance();
    }
    let before = std::mem::take(&mut classifier.with_driver);
    // Only a full scan reads every process: only it can tell that nobody maps a file.
    let mut watch = (full && !classifier.watched.is_empty()).then(|| WatchResult {
        watched: classifier.watched.clone(),
        mapped: HashSet::new(),
    });
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(pid) = name
            .to_str()
            .filter(|s| s.bytes().all(|b| b.is_ascii_digit()))
        else {
            continue;
        };
        // (pid, start time): a reused pid is another process, read at once.
        let me = pid.parse::<u32>().ok().and_then(|n| {
            let st = crate::procinfo::read_stat(proc_root, n).ok()?;
            Some((n, st.start_time))
        });
        if let Some(me) = me.filter(|me| !full && before.contains(me)) {
            classifier.with_driver.insert(me);
            continue;
        }
        // Lossy: a file name that is not UTF-8 (a tenant's) must not hide the process's other
        // mappings.
        let maps = match read_maps_bounded(
            &proc_root.join(pid).join("maps"),
            crate::tenantfs::MAX_PROC_FILE,
        ) {
            Ok((b, truncated)) => {
                if truncated {
                    // Its first part is still looked at (a driver mapped there is found);
                    // whether it maps a watched file, this reading cannot tell.
                    watch = None;
                    let limit = crate::tenantfs::MAX_PROC_FILE;
                    if full {
                        tracing::warn!(
                            pid,
                            limit,
                            "maps larger than the limit: only its first part read"
                        );
                    } else {
                        tracing::debug!(
                            pid,
                            limit,
                            "maps larger than the limit: only its first part read"
                        );
                    }
                }
                String::from_utf8_lossy(&b).into_owned()
            }
            Err(e) => {
                // A live process whose maps could not be read may map a watched file; one
                // whose maps the agent may not read at all (EACCES: another user namespace's
                // init, an LSM) is outside its view, for discovery as for this.
                if e.kind() != io::ErrorKind::PermissionDenied && proc_root.join(pid).exists() {
                    watch = None;
                }
                continue;
            }
        };
        if let Some(w) = watch.as_mut() {
            for m in maps_entries(&maps) {
                if m.inode != 0 {
                    let id = (m.dev.to_string(), m.inode);
                    if w.watched.contains(&id) {
                        w.mapped.insert(id);
                    }
                }
            }
        }
        for m in exec_file_mappings(&maps) {
            let id = (m.dev.clone(), m.inode);
            if seen.contains(&id) {
                // A driver this scan already found (and offered) in another process.
                if let Some(me) = me {
                    classifier.with_driver.insert(me);
                }
                continue;
            }
            let root = proc_root.join(pid).join("root");
            // A file no path names (deleted, a memfd) is read through the mapping itself.
            let by_mapping = || map_files_path(proc_root, pid, &m.range);
            let named = (!m.unnamed).then(|| rooted(&root, Path::new(&m.path)));
            let Some(read_path) = named.clone().or_else(by_mapping) else {
                continue;
            };
            let name = Path::new(&m.path)
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or("");
            if !classifier.is_driver(&id, &read_path, name) {
                continue;
            }
            // Only for drivers (few): the path is the tenant's. One that does not name the
            // mapped file inside the process's root (deleted, a memfd, changed since, or
            // leaving the root) is opened through `/proc/<pid>/map_files`.
            let open_path = match named.filter(|p| resolves_inside_root(&root, &m.path, p)) {
                Some(p) => p,
                None => match by_mapping().filter(|p| is_mapped_file(p, &m.dev, m.inode)) {
                    Some(p) => {
                        tracing::debug!(pid, path = %m.path, via = %p.display(), "driver mapped without a usable path: opened through the mapping");
                        p
                    }
                    None => {
                        tracing::debug!(pid, path = %m.path, "mapped driver's path leaves the process's root or changed, and its mapping cannot be opened: skipped");
                        continue;
                    }
                },
            };
            if let Some(me) = me {
                classifier.with_driver.insert(me);
            }
            seen.insert(id.clone());
            out.push(Candidate {
                path: open_path,
                maps_id: Some(id),
            });
        }
    }
    if full {
        classifier.watch_result = watch;
        classifier.known.expire(Classifier::KEEP_FULL_SCANS);
    }
    out
}

/// Whether `path`, resolved inside `root` (symlinks kept inside it, see
/// [`crate::tenantfs::open_in_root`]), is the same regular file as `open_path` (the same
/// path as the host's kernel resolves it, through `/proc/<pid>/root`, where an absolute
/// symlink would lead out of the container). Tenants control these paths.
fn resolves_inside_root(root: &Path, path: &str, open_path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    let Ok(inside) = crate::tenantfs::open_in_root(root, path, Path::new(path), false) else {
        return false;
    };
    match (inside.metadata(), fs::metadata(open_path)) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

/// `(dev, inode, path)` of the file mappings `keep` accepts, each file once, deleted files
/// left out (they cannot be opened by path any more).
fn file_mappings(maps: &str, keep: impl Fn(&MapsEntry<'_>) -> bool) -> Vec<(String, u64, String)> {
    let mut out: Vec<(String, u64, String)> = Vec::new();
    for m in maps_entries(maps) {
        if m.inode == 0 || !m.path.starts_with('/') || m.path.ends_with(" (deleted)") || !keep(&m) {
            continue;
        }
        if !out.iter().any(|(d, i, _)| d == m.dev && *i == m.inode) {
            out.push((m.dev.to_string(), m.inode, m.path.to_string()));
        }
    }
    out
}

const NEW_MAGIC: &[u8] = b"glibc-ld.so.cache1.1";
const OLD_MAGIC: &[u8] = b"ld.so-1.7.0";

/// `(dev, inode, path)` of every executable file mapping in a `/proc/<pid>/maps` text (each
/// file once; deleted files left out: they cannot be opened by path).
pub fn exec_mappings(maps: &str) -> Vec<(String, u64, String)> {
    file_mappings(maps, |m| m.perms.as_bytes().get(2) == Some(&b'x'))
}

/// Library paths listed in an `ld.so.cache` file (glibc's new format, possibly after the old
/// one). Unknown or truncated data gives what could be read, never a panic.
pub fn parse_ld_so_cache(data: &[u8]) -> Vec<String> {
    let mut out = Vec::new();
    // New format, standalone or following an old-format table.
    let start = if data.starts_with(NEW_MAGIC) {
        Some(0)
    } else if data.starts_with(OLD_MAGIC) {
        data.windows(NEW_MAGIC.len()).position(|w| w == NEW_MAGIC)
    } else {
        None
    };
    let Some(base) = start else {
        return out;
    };
    let rd_u32 = |off: usize| -> Option<u32> {
        data.get(off..off + 4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    };
    // Header: magic+version (20), nlibs u32, len_strings u32, flags u8, pad[3],
    // extension_offset u32, unused[3] u32 = 48 bytes. Entries of 24 bytes: flags i32,
    // key u32, value u32, osversion u32, hwcap u64. String offsets are from `base`.
    let Some(nlibs) = rd_u32(base + 20) else {
        return out;
    };
    let entries = base + 48;
    for i in 0..nlibs as usize {
        let e = entries + i * 24;
        let Some(value) = rd_u32(e + 8) else {
            break;
        };
        let s = base + value as usize;
        if let Some(rest) = data.get(s..) {
            let end = rest.iter().position(|&b| b == 0).unwrap_or(rest.len());
            if let Ok(p) = std::str::from_utf8(&rest[..end]) {
                out.push(p.to_string());
            }
        }
    }
    out
}

#[cfg(test)]
mod tests;
