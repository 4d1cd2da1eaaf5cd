//! Whether a process may write its region file, decided from metadata only: the process's
//! credentials (`/proc/<pid>/status`) and the file's owner, group and mode (`stat`). The agent
//! opens nothing on the process's behalf. Pure functions; see `docs/agent.md` (`locked_out`).

use serde::Serialize;

/// `CAP_DAC_OVERRIDE`: bypasses file read/write permission checks.
const CAP_DAC_OVERRIDE: u32 = 1;

/// The credentials the kernel checks when a process opens a file.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Creds {
    /// Filesystem uid (`Uid:` fourth field; equals the effective uid unless changed).
    pub fsuid: u32,
    /// Filesystem gid (`Gid:` fourth field).
    pub fsgid: u32,
    /// Supplementary groups (`Groups:`).
    pub groups: Vec<u32>,
    /// Effective capabilities (`CapEff:`).
    pub cap_eff: u64,
}

impl Creds {
    /// Whether the process bypasses permission bits (`CAP_DAC_OVERRIDE`).
    pub fn dac_override(&self) -> bool {
        self.cap_eff & (1 << CAP_DAC_OVERRIDE) != 0
    }
}

impl Creds {
    /// The fields of a parsed `/proc/<pid>/status` (`procinfo::parse_status`, which
    /// `procinfo::parse_creds` calls with this) that [`Creds`] holds.
    pub fn from_status(status: &procfs::process::Status) -> Creds {
        Creds {
            fsuid: status.fuid,
            fsgid: status.fgid,
            // Gids as the kernel writes them (`%u`), which procfs parsed as `i32`.
            groups: status.groups.iter().map(|&g| g as u32).collect(),
            cap_eff: status.capeff,
        }
    }
}

/// Owner, group and permission bits of a file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct FileMeta {
    /// Permission bits (`st_mode & 0o7777`).
    pub mode: u32,
    /// Owner uid.
    pub uid: u32,
    /// Group gid.
    pub gid: u32,
}

/// Why a process with `creds` cannot open a file with `file`'s metadata for reading and
/// writing (the region is mapped shared, read-write), or `None` if it can. Follows the
/// kernel's rule: the owner class if the fsuid owns the file, else the group class if the
/// fsgid or a supplementary group is the file's group, else the other class; only the first
/// matching class counts. `CAP_DAC_OVERRIDE` allows everything. (A read-only mount or an
/// immutable file are not visible in this metadata.)
pub fn write_denied(file: &FileMeta, creds: &Creds) -> Option<String> {
    if creds.dac_override() {
        return None;
    }
    let (class, shift) = if creds.fsuid == file.uid {
        ("owner", 6)
    } else if creds.fsgid == file.gid || creds.groups.contains(&file.gid) {
        ("group", 3)
    } else {
        ("other", 0)
    };
    let bits = (file.mode >> shift) & 0o7;
    let missing = match (bits & 0o4 != 0, bits & 0o2 != 0) {
        (true, true) => return None,
        (true, false) => "write",
        (false, true) => "read",
        (false, false) => "read and write",
    };
    Some(format!(
        "uid {} (gid {}, groups {:?}) falls in the {class} class of mode {:04o} (owner {}:{}), which lacks {missing}",
        creds.fsuid, creds.fsgid, creds.groups, file.mode, file.uid, file.gid
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn creds(uid: u32, gid: u32, groups: &[u32]) -> Creds {
        Creds {
            fsuid: uid,
            fsgid: gid,
            groups: groups.to_vec(),
            cap_eff: 0,
        }
    }

    #[test]
    fn owner_group_other_classes() {
        let f = |mode| FileMeta {
            mode,
            uid: 0,
            gid: 44,
        };
        let nobody = creds(65534, 65534, &[]);
        let member = creds(65534, 65534, &[44]);
        let owner = creds(0, 0, &[]);
        assert_eq!(write_denied(&f(0o666), &nobody), None);
        let why = write_denied(&f(0o600), &nobody).unwrap();
        assert!(why.contains("other class") && why.contains("0600"), "{why}");
        assert!(why.contains("read and write"), "{why}");
        assert_eq!(write_denied(&f(0o660), &member), None);
        assert!(write_denied(&f(0o660), &nobody).is_some());
        assert!(write_denied(&f(0o644), &member)
            .unwrap()
            .contains("lacks write"));
        // Only the first matching class counts: an owner without write is refused even if
        // others may write.
        assert!(write_denied(&f(0o466), &owner)
            .unwrap()
            .contains("owner class"));
        // The fsgid counts like a supplementary group.
        assert_eq!(write_denied(&f(0o660), &creds(7, 44, &[])), None);
    }

    #[test]
    fn dac_override_writes_anything() {
        let root = Creds {
            cap_eff: 1 << CAP_DAC_OVERRIDE,
            ..creds(0, 0, &[])
        };
        let f = FileMeta {
            mode: 0o000,
            uid: 5,
            gid: 5,
        };
        assert_eq!(write_denied(&f, &root), None);
        // uid 0 without the capability (e.g. dropped by the runtime) is an ordinary user.
        assert!(write_denied(&f, &creds(0, 0, &[])).is_some());
    }
}
