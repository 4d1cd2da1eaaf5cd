//! Finding libcuda files: the host's `ld.so.cache`, well-known driver directories, and the
//! memory maps of running processes (inside containers through `/proc/<pid>/root`).

use std::collections::{HashMap, HashSet};
use std::fs;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use crate::procinfo::{maps_entries, MapsEntry};

/// Directories where NVIDIA drivers commonly put `libcuda.so.1` (host and GPU images).
pub const WELL_KNOWN_DIRS: &[&str] = &[
    "/usr/local/nvidia/lib64",
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib64",
    "/usr/lib",
    "/lib/x86_64-linux-gnu",
    "/lib64",
    "/lib",
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

/// Whether the ELF shared object at `path` defines `cuInit` and at least one of
/// [`DRIVER_SYMBOLS`] in its dynamic symbol table. Reads the section headers, `.dynsym` and
/// its string table only (not the whole file); anything unreadable or malformed is `false`.
pub fn elf_defines_driver_symbols(path: &Path) -> bool {
    let mut wanted = vec!["cuInit"];
    wanted.extend_from_slice(DRIVER_SYMBOLS);
    elf_defined_symbols(path, &wanted).is_some_and(|found| {
        found.iter().any(|s| s == "cuInit") && found.iter().any(|s| s != "cuInit")
    })
}

/// Which of `wanted` the ELF64 little-endian file at `path` defines (`st_shndx != 0`) in
/// its `.dynsym`; `None` if it is not such a file or cannot be read.
pub fn elf_defined_symbols(path: &Path, wanted: &[&str]) -> Option<Vec<String>> {
    const MAX_TABLE: u64 = 64 << 20;
    // Regular files only: a FIFO or device a tenant left at a mapped path is never opened.
    let f = crate::tenantfs::open_regular(path, false).ok()?;
    let read = |off: u64, len: u64| -> Option<Vec<u8>> {
        if len > MAX_TABLE {
            return None;
        }
        let mut b = vec![0u8; len as usize];
        f.read_exact_at(&mut b, off).ok()?;
        Some(b)
    };
    let u16_at = |b: &[u8], o: usize| -> Option<u64> {
        Some(u64::from(u16::from_le_bytes(
            b.get(o..o + 2)?.try_into().ok()?,
        )))
    };
    let u32_at = |b: &[u8], o: usize| -> Option<u64> {
        Some(u64::from(u32::from_le_bytes(
            b.get(o..o + 4)?.try_into().ok()?,
        )))
    };
    let u64_at = |b: &[u8], o: usize| -> Option<u64> {
        Some(u64::from_le_bytes(b.get(o..o + 8)?.try_into().ok()?))
    };
    let eh = read(0, 64)?;
    // ELF magic, 64-bit, little-endian.
    if &eh[..4] != b"\x7fELF" || eh[4] != 2 || eh[5] != 1 {
        return None;
    }
    let shoff = u64_at(&eh, 0x28)?;
    let shentsize = u16_at(&eh, 0x3a)?;
    let shnum = u16_at(&eh, 0x3c)?;
    if shentsize < 64 || shnum == 0 {
        return None;
    }
    let sh = read(shoff, shentsize * shnum)?;
    let section = |i: u64| -> Option<(u64, u64, u64, u64)> {
        let o = (i * shentsize) as usize;
        // (type, offset, size, link)
        Some((
            u32_at(&sh, o + 4)?,
            u64_at(&sh, o + 0x18)?,
            u64_at(&sh, o + 0x20)?,
            u32_at(&sh, o + 0x28)?,
        ))
    };
    const SHT_DYNSYM: u64 = 11;
    let (_, sym_off, sym_size, link) =
        (0..shnum).find_map(|i| section(i).filter(|s| s.0 == SHT_DYNSYM))?;
    let (_, str_off, str_size, _) = section(link).filter(|_| link < shnum)?;
    let syms = read(sym_off, sym_size)?;
    let strs = read(str_off, str_size)?;
    let mut found: Vec<String> = Vec::new();
    for sym in syms.chunks_exact(24) {
        let name = u32_at(sym, 0)? as usize;
        let shndx = u16_at(sym, 6)?;
        if shndx == 0 {
            continue; // undefined: imported, not exported
        }
        let Some(rest) = strs.get(name..) else {
            continue;
        };
        let end = rest.iter().position(|&b| b == 0).unwrap_or(rest.len());
        let Ok(n) = std::str::from_utf8(&rest[..end]) else {
            continue;
        };
        if wanted.contains(&n) && !found.iter().any(|f| f == n) {
            found.push(n.to_string());
        }
    }
    Some(found)
}

/// Remembers which mapped files (by their `/proc/<pid>/maps` device and inode) are CUDA
/// drivers, so that each file's symbols are read once.
#[derive(Debug, Default)]
pub struct Classifier {
    known: HashMap<(String, u64), bool>,
}

impl Classifier {
    /// Files remembered before the memory is cleared (a node that keeps starting containers
    /// sees new inodes for ever).
    const MAX: usize = 1 << 16;

    /// Whether the mapped file `id`, opened as `path` (named `name` in the maps), is a CUDA
    /// driver: named `libcuda.so*`, or an ELF that defines `cuInit` and an allocation
    /// function (not `libhami_preload*.so`, which defines them as hooks).
    pub fn is_driver(&mut self, id: &(String, u64), path: &Path, name: &str) -> bool {
        if is_libcuda_name(name) {
            return true;
        }
        if name.starts_with("libhami_preload") {
            return false;
        }
        if let Some(&k) = self.known.get(id) {
            return k;
        }
        let Ok(meta) = fs::metadata(path) else {
            return false; // process gone: decide next time
        };
        let k = meta.is_file() && elf_defines_driver_symbols(path);
        if self.known.len() >= Self::MAX {
            self.known.clear();
        }
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

/// [`scan_proc_maps`]: every executable file mapping is a candidate when `classifier` says
/// it is a driver (by name, or by the symbols it defines).
pub fn scan_proc_maps_with(proc_root: &Path, classifier: &mut Classifier) -> Vec<Candidate> {
    let mut out = Vec::new();
    let mut seen = HashSet::new();
    let Ok(entries) = fs::read_dir(proc_root) else {
        return out;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(pid) = name
            .to_str()
            .filter(|s| s.bytes().all(|b| b.is_ascii_digit()))
        else {
            continue;
        };
        let Ok(maps) = fs::read_to_string(proc_root.join(pid).join("maps")) else {
            continue;
        };
        for (dev, ino, path) in exec_mappings(&maps) {
            let id = (dev, ino);
            if seen.contains(&id) {
                continue;
            }
            let root = proc_root.join(pid).join("root");
            let open_path = rooted(&root, Path::new(&path));
            let name = Path::new(&path)
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or("");
            if !classifier.is_driver(&id, &open_path, name) {
                continue;
            }
            // Only for drivers (few): the path is the tenant's.
            if !resolves_inside_root(&root, &path, &open_path) {
                tracing::debug!(pid, path = %path, "mapped file's path leaves the process's root or changed: skipped");
                continue;
            }
            seen.insert(id.clone());
            out.push(Candidate {
                path: open_path,
                maps_id: Some(id),
            });
        }
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
mod tests {
    use super::*;

    fn cache_with(paths: &[&str]) -> Vec<u8> {
        let mut strings = Vec::new();
        let header = 48 + 24 * paths.len();
        let mut entries = Vec::new();
        for p in paths {
            let off = (header + strings.len()) as u32;
            strings.extend_from_slice(p.as_bytes());
            strings.push(0);
            entries.extend_from_slice(&1i32.to_le_bytes());
            entries.extend_from_slice(&off.to_le_bytes());
            entries.extend_from_slice(&off.to_le_bytes());
            entries.extend_from_slice(&0u32.to_le_bytes());
            entries.extend_from_slice(&0u64.to_le_bytes());
        }
        let mut d = NEW_MAGIC.to_vec();
        d.extend_from_slice(&(paths.len() as u32).to_le_bytes());
        d.extend_from_slice(&(strings.len() as u32).to_le_bytes());
        d.extend_from_slice(&[0u8; 4]);
        d.extend_from_slice(&[0u8; 16]);
        assert_eq!(d.len(), 48);
        d.extend(entries);
        d.extend(strings);
        d
    }

    #[test]
    fn parses_synthetic_cache() {
        let d = cache_with(&["/usr/lib/libcuda.so.1", "/lib/libc.so.6"]);
        assert_eq!(
            parse_ld_so_cache(&d),
            vec![
                "/usr/lib/libcuda.so.1".to_string(),
                "/lib/libc.so.6".to_string()
            ]
        );
        // Truncated data does not panic.
        for n in 0..d.len() {
            let _ = parse_ld_so_cache(&d[..n]);
        }
        assert!(parse_ld_so_cache(b"garbage").is_empty());
    }

    #[test]
    fn parses_host_cache_like_ldconfig() {
        // The machine's own cache: every path `ldconfig -p` prints must be found.
        let Ok(data) = fs::read("/etc/ld.so.cache") else {
            panic!("/etc/ld.so.cache missing on this machine");
        };
        let ours: HashSet<String> = parse_ld_so_cache(&data).into_iter().collect();
        let out = std::process::Command::new("ldconfig")
            .arg("-p")
            .output()
            .or_else(|_| {
                std::process::Command::new("/sbin/ldconfig")
                    .arg("-p")
                    .output()
            })
            .expect("ldconfig -p");
        let text = String::from_utf8_lossy(&out.stdout);
        let theirs: Vec<&str> = text
            .lines()
            .filter_map(|l| l.split(" => ").nth(1))
            .collect();
        assert!(!theirs.is_empty());
        for p in theirs {
            assert!(ours.contains(p.trim()), "{p} missing from our parse");
        }
    }

    #[test]
    fn maps_lines() {
        let text = "\
7f0000000000-7f0000001000 r--p 00000000 fd:01 1234     /usr/lib/x86_64-linux-gnu/libcuda.so.580.1\n\
7f0000001000-7f0000002000 r-xp 00001000 fd:01 1234     /usr/lib/x86_64-linux-gnu/libcuda.so.580.1\n\
7f0000003000-7f0000004000 r-xp 00001000 00:2a 99       /tmp/x/libcuda.so.1 (deleted)\n\
7f0000005000-7f0000006000 r-xp 00001000 00:2a 77       /opt/libcudart.so.12\n\
7f0000007000-7f0000008000 r-xp 00001000 00:2b 5        /opt/fake/libcuda.so.1\n";
        // The filter discovery uses for libcuda names, over the shared maps walker.
        let got = file_mappings(text, |m| {
            Path::new(m.path)
                .file_name()
                .and_then(|n| n.to_str())
                .is_some_and(is_libcuda_name)
        });
        assert_eq!(
            got,
            vec![
                (
                    "fd:01".into(),
                    1234,
                    "/usr/lib/x86_64-linux-gnu/libcuda.so.580.1".into()
                ),
                ("00:2b".into(), 5, "/opt/fake/libcuda.so.1".into()),
            ]
        );
    }

    #[test]
    fn exec_mappings_and_elf_symbols_of_this_process() {
        use std::os::unix::fs::MetadataExt;
        let maps = exec_mappings(&fs::read_to_string("/proc/self/maps").unwrap());
        let (dev, ino, libc) = maps
            .iter()
            .find(|(_, _, p)| p.contains("libc.so") || p.contains("libc-"))
            .cloned()
            .expect("libc mapped");
        let found = elf_defined_symbols(Path::new(&libc), &["malloc", "cuInit", "free"]).unwrap();
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(found.contains(&"malloc".to_string()));
        assert!(!elf_defines_driver_symbols(Path::new(&libc)));
        assert!(elf_defined_symbols(Path::new("/proc/self/maps"), &["malloc"]).is_none());
        let m = fs::metadata(&libc).unwrap();
        assert_eq!(m.ino(), ino);
        assert_eq!(crate::probes::maps_dev(m.dev()), dev);
        let mut c = Classifier::default();
        assert!(!c.is_driver(&(dev.clone(), ino), Path::new(&libc), "libc.so.6"));
        assert!(c.is_driver(
            &("00:00".into(), 1),
            Path::new("/nonexistent"),
            "libcuda.so.1"
        ));
        let ids = [(dev, ino)].into_iter().collect();
        let text = fs::read_to_string("/proc/self/maps").unwrap();
        assert!(crate::procinfo::maps_has_ids(&text, &ids));
        assert!(!crate::procinfo::maps_has_ids(&text, &Default::default()));
    }

    #[test]
    fn rooted_paths() {
        assert_eq!(
            rooted(
                Path::new("/proc/12/root"),
                Path::new("/usr/lib/libcuda.so.1")
            ),
            PathBuf::from("/proc/12/root/usr/lib/libcuda.so.1")
        );
        assert_eq!(rooted(Path::new(""), Path::new("/a")), PathBuf::from("/a"));
    }
}
