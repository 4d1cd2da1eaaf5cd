//! The executable file mappings of a process, and how the agent opens the file behind one:
//! through its path inside the process's root when that names the mapped file, else through
//! the mapping itself, `/proc/<pid>/map_files/<start>-<end>`.
//!
//! A tenant can load a driver that no path names: it copies libcuda to a file, opens it,
//! unlinks it and `dlopen`s `/proc/self/fd/N` (the maps then show `/tmp/x/libcuda.so.1
//! (deleted)`), or loads a `memfd_create` copy the same way (`/memfd:NAME (deleted)`). The
//! kernel still knows the file: `/proc/<pid>/map_files/<range>` is a link to the very file
//! of that mapping, which root (`CAP_SYS_ADMIN`, or `CAP_CHECKPOINT_RESTORE`) may open
//! whatever its name, and a uprobe is placed on an inode, so the probes attached through
//! that descriptor (`/proc/self/fd/<fd>`, as for every driver) fire in every process that
//! maps it.

use std::path::{Path, PathBuf};

use crate::procinfo::maps_entries;

/// One executable file mapping, each file once (see [`exec_file_mappings`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecMapping {
    /// Device as the maps write it (`fd:01`).
    pub dev: String,
    /// Inode.
    pub inode: u64,
    /// The path as the maps show it, a ` (deleted)` suffix removed.
    pub path: String,
    /// The address range of its first executable mapping (`7f00...-7f00...`).
    pub range: String,
    /// No path names the file: deleted (unlinked after being mapped, or a memfd), or a
    /// path that is not absolute. It can only be opened through `map_files`.
    pub unnamed: bool,
}

/// Every executable file mapping (inode not 0) of a `/proc/<pid>/maps` text, each file
/// (device and inode) once, deleted files and memfds included (`unnamed`).
pub fn exec_file_mappings(maps: &str) -> Vec<ExecMapping> {
    let mut out: Vec<ExecMapping> = Vec::new();
    for m in maps_entries(maps) {
        if m.inode == 0 || m.path.is_empty() || m.perms.as_bytes().get(2) != Some(&b'x') {
            continue;
        }
        if out.iter().any(|e| e.dev == m.dev && e.inode == m.inode) {
            continue;
        }
        let (path, deleted) = match m.path.strip_suffix(" (deleted)") {
            Some(p) => (p, true),
            None => (m.path, false),
        };
        out.push(ExecMapping {
            dev: m.dev.to_string(),
            inode: m.inode,
            path: path.to_string(),
            range: m.range.to_string(),
            unnamed: deleted || !path.starts_with('/'),
        });
    }
    out
}

/// `<proc_root>/<pid>/map_files/<start>-<end>` for a maps range, in the kernel's spelling
/// of those names (lowercase hex without padding; the maps pad to 8 digits); `None` if the
/// range is malformed.
pub fn map_files_path(proc_root: &Path, pid: &str, range: &str) -> Option<PathBuf> {
    let (a, b) = range.split_once('-')?;
    let a = u64::from_str_radix(a, 16).ok()?;
    let b = u64::from_str_radix(b, 16).ok()?;
    Some(
        proc_root
            .join(pid)
            .join("map_files")
            .join(format!("{a:x}-{b:x}")),
    )
}

/// Whether the file `path` names now is the regular file the maps show as `dev` and
/// `inode` (a range the process unmapped and mapped again with another file between the
/// agent's read of its maps and this is not that file).
pub fn is_mapped_file(path: &Path, dev: &str, inode: u64) -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path)
        .is_ok_and(|m| m.is_file() && m.ino() == inode && maps_dev(m.dev()) == dev)
}

/// `st_dev` as `/proc/<pid>/maps` writes it (`major:minor`, hex, at least two digits each).
pub fn maps_dev(dev: u64) -> String {
    let major = ((dev >> 8) & 0xfff) | ((dev >> 32) & !0xfff);
    let minor = (dev & 0xff) | ((dev >> 12) & !0xff);
    format!("{major:02x}:{minor:02x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deleted_files_and_memfds_are_unnamed_mappings_each_file_once() {
        let maps = "\
00400000-00401000 r-xp 00000000 08:01 5    /usr/bin/app
7f0000000000-7f0000001000 r--p 00000000 08:01 7    /tmp/x/libcuda.so.1 (deleted)
7f0000001000-7f0000002000 r-xp 00001000 08:01 7    /tmp/x/libcuda.so.1 (deleted)
7f0000002000-7f0000003000 r-xp 00002000 08:01 7    /tmp/x/libcuda.so.1 (deleted)
7f0000010000-7f0000011000 r-xp 00000000 00:01 2051 /memfd:libcuda (deleted)
7f0000020000-7f0000021000 r-xp 00000000 00:00 0    [vdso]
7f0000030000-7f0000031000 rw-p 00000000 00:00 0
";
        let m = exec_file_mappings(maps);
        let got: Vec<(&str, u64, &str, &str, bool)> = m
            .iter()
            .map(|e| {
                (
                    e.dev.as_str(),
                    e.inode,
                    e.path.as_str(),
                    e.range.as_str(),
                    e.unnamed,
                )
            })
            .collect();
        assert_eq!(
            got,
            [
                ("08:01", 5, "/usr/bin/app", "00400000-00401000", false),
                (
                    "08:01",
                    7,
                    "/tmp/x/libcuda.so.1",
                    "7f0000001000-7f0000002000",
                    true
                ),
                (
                    "00:01",
                    2051,
                    "/memfd:libcuda",
                    "7f0000010000-7f0000011000",
                    true
                ),
            ]
        );
    }

    #[test]
    fn map_files_names_are_the_kernels_unpadded_hex() {
        let p = map_files_path(Path::new("/proc"), "42", "00400000-00401000").unwrap();
        assert_eq!(p, Path::new("/proc/42/map_files/400000-401000"));
        let p = map_files_path(Path::new("/proc"), "42", "7f00ab000000-7f00ab021000").unwrap();
        assert_eq!(p, Path::new("/proc/42/map_files/7f00ab000000-7f00ab021000"));
        assert_eq!(map_files_path(Path::new("/proc"), "42", "garbage"), None);
        assert_eq!(map_files_path(Path::new("/proc"), "42", "1-x"), None);
    }

    #[test]
    fn this_process_s_own_mapping_opens_through_map_files_as_the_same_file() {
        // Opening map_files needs CAP_SYS_ADMIN: these tests run as root, as the agent does.
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        let exe = exec_file_mappings(&maps)
            .into_iter()
            .find(|m| !m.unnamed)
            .expect("an executable file mapping");
        let p = map_files_path(Path::new("/proc"), "self", &exe.range).unwrap();
        assert!(is_mapped_file(&p, &exe.dev, exe.inode), "{p:?} {exe:?}");
        assert!(!is_mapped_file(&p, &exe.dev, exe.inode + 1));
    }
}
