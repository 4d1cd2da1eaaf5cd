//! Finding libcuda files: the host's `ld.so.cache`, well-known driver directories, and the
//! memory maps of running processes (inside containers through `/proc/<pid>/root`).

use std::collections::HashSet;
use std::fs;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};

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
    out.extend(scan_proc_maps(proc_root));
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
        let Ok(f) = fs::File::open(proc_root.join(pid).join("maps")) else {
            continue;
        };
        for (dev, ino, path) in libcuda_in_maps(BufReader::new(f)) {
            if !seen.insert((dev.clone(), ino)) {
                continue;
            }
            out.push(Candidate {
                path: rooted(&proc_root.join(pid).join("root"), Path::new(&path)),
                maps_id: Some((dev, ino)),
            });
        }
    }
    out
}

/// `(dev, inode, path)` of every libcuda mapping in a `/proc/<pid>/maps` text.
pub fn libcuda_in_maps(r: impl BufRead) -> Vec<(String, u64, String)> {
    let mut out: Vec<(String, u64, String)> = Vec::new();
    for line in r.lines().map_while(Result::ok) {
        if !line.contains("libcuda.so") {
            continue;
        }
        // address perms offset dev inode path
        let mut it = line.splitn(6, ' ');
        let (_, _, _, Some(dev), Some(ino), Some(path)) = (
            it.next(),
            it.next(),
            it.next(),
            it.next(),
            it.next(),
            it.next(),
        ) else {
            continue;
        };
        let path = path.trim_start();
        // " (deleted)" files cannot be opened by path any more.
        if !path.starts_with('/') || path.ends_with(" (deleted)") {
            continue;
        }
        let is_cuda = Path::new(path)
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(is_libcuda_name);
        let Ok(ino) = ino.parse::<u64>() else {
            continue;
        };
        if is_cuda && !out.iter().any(|(d, i, _)| d == dev && *i == ino) {
            out.push((dev.to_string(), ino, path.to_string()));
        }
    }
    out
}

const NEW_MAGIC: &[u8] = b"glibc-ld.so.cache1.1";
const OLD_MAGIC: &[u8] = b"ld.so-1.7.0";

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
        let got = libcuda_in_maps(text.as_bytes());
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
