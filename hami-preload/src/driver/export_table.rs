//! NVML's private export table, the way nvidia-smi 580 reads its process table (plain Rust,
//! no driver): when a table may be wrapped, and what a wrapped process-list slot does with
//! the driver's answer. The hook and the slot functions are in `hooks/nvml_export.rs`;
//! `docs/preload.md`, "Process lists: what nvidia-smi shows", says why.
//!
//! What is known (NVIDIA's mock NVML, k8s-test-infra `pkg/gpu/mocknvml`, from probing the
//! real nvidia-smi 580.65.06): `nvmlInternalGetExportTable(const void **table, const
//! nvmlExportTableUUID *id)` hands out, for the id [`NVSMI_TABLE_ID`], an array of 8-byte
//! words: word 0 is the table's size in bytes, word `i` the function of slot `i`. Slots 213,
//! 214 and 215 ([`PROCESS_SLOTS`]) are per-device process lists, `fn(nvmlDevice_t device,
//! unsigned *count /* in: capacity, out: entries written */, entry *array)`, whose entries
//! are [`ENTRY_BYTES`] long (pid u32 @0, usedGpuMemory u64 @8, gpuInstanceId u32 @16,
//! computeInstanceId u32 @20, usedGpuCcProtectedMemory u64 @24, the process name inline,
//! NUL-terminated, in [`NAME_BYTES`] @[`NAME_OFFSET`]). That layout is known for the 580
//! branch only ([`KNOWN_BRANCHES`]). Anything else is passed through untouched.

use crate::driver::proclist::{kept_entries, Member, ProcEntry};

/// Raw bytes of the id of the table nvidia-smi reads its process table through: GUID
/// `6c3efec4-8fc9-4e6c-a327-ee696e12f7c4` (first 4 bytes, next 2, next 2 little-endian,
/// then 8 bytes as is).
pub const NVSMI_TABLE_ID: [u8; 16] = [
    0xc4, 0xfe, 0x3e, 0x6c, 0xc9, 0x8f, 0x6c, 0x4e, 0xa3, 0x27, 0xee, 0x69, 0x6e, 0x12, 0xf7, 0xc4,
];

/// The table's process-list slots (word indices).
pub const PROCESS_SLOTS: [usize; 3] = [213, 214, 215];

/// The smallest size word accepted: room for the size and every slot up to the last
/// process list.
pub const MIN_TABLE_BYTES: u64 = 8 * (PROCESS_SLOTS[2] as u64 + 1);

/// The largest size word accepted (a larger one is not a table of function pointers we
/// know: 8192 slots).
pub const MAX_TABLE_BYTES: u64 = 64 * 1024;

/// Driver branches (the major version of `nvmlSystemGetDriverVersion`) whose process-list
/// slots and entry layout are known.
pub const KNOWN_BRANCHES: &[u32] = &[580];

/// Bytes of one entry of a process-list slot.
pub const ENTRY_BYTES: usize = 4128;
/// Offset of the inline process name in an entry.
pub const NAME_OFFSET: usize = 32;
/// Bytes of the inline process name (NUL-terminated within them).
pub const NAME_BYTES: usize = 4096;

/// The GUID `id` prints as (`6c3efec4-8fc9-4e6c-a327-ee696e12f7c4` for
/// [`NVSMI_TABLE_ID`]), for the logs.
pub fn guid_string(id: &[u8; 16]) -> String {
    format!(
        "{:02x}{:02x}{:02x}{:02x}-{:02x}{:02x}-{:02x}{:02x}-{:02x}{:02x}-{:02x}{:02x}{:02x}{:02x}{:02x}{:02x}",
        id[3], id[2], id[1], id[0], id[5], id[4], id[7], id[6], id[8], id[9], id[10], id[11],
        id[12], id[13], id[14], id[15]
    )
}

/// Why a table is passed through untouched (logged once).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PassThrough {
    /// The size word is not a multiple of 8, too small to hold the process-list slots, or
    /// above [`MAX_TABLE_BYTES`].
    Size(u64),
    /// The table (its size word, or the bytes it claims) is not readable memory.
    Unreadable,
    /// The driver's version could not be read.
    NoDriverVersion,
    /// A driver branch whose layout is not known.
    Branch(String),
    /// A process-list slot is NULL.
    NullSlot(usize),
    /// Another table than the one wrapped first came with the same id (the wrapped slots
    /// forward to the first one's functions).
    AnotherTable,
    /// This architecture's calling convention is not forwarded by the slot functions.
    Architecture,
}

impl std::fmt::Display for PassThrough {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PassThrough::Size(s) => write!(
                f,
                "its size word {s} is not a multiple of 8 in {MIN_TABLE_BYTES}..={MAX_TABLE_BYTES}"
            ),
            PassThrough::Unreadable => write!(f, "its memory is not readable"),
            PassThrough::NoDriverVersion => write!(f, "the driver's version could not be read"),
            PassThrough::Branch(v) => write!(
                f,
                "driver {v} is not of a branch whose layout is known ({KNOWN_BRANCHES:?})"
            ),
            PassThrough::NullSlot(i) => write!(f, "its slot {i} is NULL"),
            PassThrough::AnotherTable => {
                write!(f, "another table than the first came with the same id")
            }
            PassThrough::Architecture => write!(f, "this architecture is not supported"),
        }
    }
}

/// Whether the size word `size` can be the table's (see [`PassThrough::Size`]).
pub fn size_ok(size: u64) -> bool {
    size.is_multiple_of(8) && (MIN_TABLE_BYTES..=MAX_TABLE_BYTES).contains(&size)
}

/// The branch (major version) of a driver version string (`"580.159.04"` → 580).
pub fn driver_branch(version: &str) -> Option<u32> {
    let major = version.trim().split('.').next()?;
    if major.is_empty() || !major.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    major.parse().ok()
}

/// `Ok` when driver `version` is of a branch in [`KNOWN_BRANCHES`].
pub fn branch_known(version: &str) -> Result<(), PassThrough> {
    match driver_branch(version) {
        Some(b) if KNOWN_BRANCHES.contains(&b) => Ok(()),
        _ => Err(PassThrough::Branch(version.to_string())),
    }
}

/// Whether `[addr, addr + len)` is readable in the mappings `maps` (the text of
/// `/proc/self/maps`): covered by mappings with `r` permission that follow each other.
pub fn range_readable(maps: &str, addr: usize, len: usize) -> bool {
    let Some(end) = addr.checked_add(len) else {
        return false;
    };
    let mut at = addr;
    let mut ranges: Vec<(usize, usize, bool)> = maps
        .lines()
        .filter_map(|l| {
            let mut f = l.split_ascii_whitespace();
            let (lo, hi) = f.next()?.split_once('-')?;
            let perms = f.next()?;
            Some((
                usize::from_str_radix(lo, 16).ok()?,
                usize::from_str_radix(hi, 16).ok()?,
                perms.starts_with('r'),
            ))
        })
        .collect();
    ranges.sort_unstable();
    for (lo, hi, r) in ranges {
        if at >= end {
            break;
        }
        if lo <= at && at < hi {
            if !r {
                return false;
            }
            at = hi;
        }
    }
    at >= end
}

/// The wrapped copy of a table (`words`, the original's `size / 8` words): the same words
/// with each process-list slot `PROCESS_SLOTS[j]` replaced by `ours[j]`; `Err` when one of
/// the originals is NULL.
pub fn wrapped_copy(words: &[u64], ours: [u64; 3]) -> Result<Vec<u64>, PassThrough> {
    let mut copy = words.to_vec();
    for (j, &slot) in PROCESS_SLOTS.iter().enumerate() {
        match copy.get_mut(slot) {
            Some(0) => return Err(PassThrough::NullSlot(slot)),
            Some(w) => *w = ours[j],
            None => return Err(PassThrough::Size(words.len() as u64 * 8)),
        }
    }
    Ok(copy)
}

/// Why a process-list slot's answer was left as the driver gave it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Untouched {
    /// The driver wrote more entries than the caller's capacity.
    CountOverCapacity {
        /// The caller's `*count` before the call.
        capacity: u32,
        /// The driver's `*count` after it.
        count: u32,
    },
    /// Entry `index`'s name has no NUL within its [`NAME_BYTES`].
    UnterminatedName {
        /// The entry.
        index: usize,
    },
}

impl std::fmt::Display for Untouched {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Untouched::CountOverCapacity { capacity, count } => {
                write!(f, "{count} entries for a capacity of {capacity}")
            }
            Untouched::UnterminatedName { index } => {
                write!(f, "entry {index}'s name is not NUL-terminated")
            }
        }
    }
}

/// The entries to read of a slot's successful answer: `count` (the driver's `*count`) when
/// it is within `capacity` (the caller's `*count` before the call).
pub fn checked_count(capacity: u32, count: u32) -> Result<usize, Untouched> {
    if count > capacity {
        Err(Untouched::CountOverCapacity { capacity, count })
    } else {
        Ok(count as usize)
    }
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut w = [0u8; 4];
    w.copy_from_slice(&b[at..at + 4]);
    u32::from_ne_bytes(w)
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[at..at + 8]);
    u64::from_ne_bytes(w)
}

/// The numeric fields of one entry.
fn entry_of(e: &[u8]) -> ProcEntry {
    ProcEntry {
        pid: u32_at(e, 0),
        used: u64_at(e, 8),
        gpu_instance: u32_at(e, 16),
        compute_instance: u32_at(e, 20),
        cc_protected: u64_at(e, 24),
    }
}

/// Narrows a slot's answer in place to the container's processes: `entries` is the
/// driver's answer (its `*count` entries of [`ENTRY_BYTES`], nothing beyond), `members`
/// and `pids_are_host` the container's processes as for the public lists. Every entry is
/// checked first (a name NUL-terminated within its [`NAME_BYTES`]); on any surprise
/// nothing is written and the reason is returned. Otherwise the kept entries
/// ([`kept_entries`], the public lists' rule: the member's pid, its usage from the region;
/// instance ids, protected memory and the name bytes stay the driver's) are moved to the
/// front in the driver's order, the bytes of the entries left out are zeroed, and the new
/// count is returned. Entries are never added (a process the driver does not list has no
/// name to show, and which slot is the compute list is not known).
pub fn narrow_entries(
    entries: &mut [u8],
    members: &[Member],
    pids_are_host: bool,
) -> Result<usize, Untouched> {
    let n = entries.len() / ENTRY_BYTES;
    let mut driver = Vec::with_capacity(n);
    for (index, e) in entries.chunks_exact(ENTRY_BYTES).enumerate() {
        if !e[NAME_OFFSET..NAME_OFFSET + NAME_BYTES].contains(&0) {
            return Err(Untouched::UnterminatedName { index });
        }
        driver.push(entry_of(e));
    }
    let kept = kept_entries(&driver, members, pids_are_host);
    for (j, &(k, e)) in kept.entries.iter().enumerate() {
        // k >= j: the kept entries are in the driver's order.
        if k != j {
            entries.copy_within(k * ENTRY_BYTES..(k + 1) * ENTRY_BYTES, j * ENTRY_BYTES);
        }
        let at = j * ENTRY_BYTES;
        entries[at..at + 4].copy_from_slice(&e.pid.to_ne_bytes());
        entries[at + 8..at + 16].copy_from_slice(&e.used.to_ne_bytes());
    }
    let k = kept.entries.len();
    entries[k * ENTRY_BYTES..n * ENTRY_BYTES].fill(0);
    Ok(k)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ffi::cuda::NVML_VALUE_NOT_AVAILABLE;

    #[test]
    fn the_id_prints_as_nvidia_smis_guid() {
        assert_eq!(
            guid_string(&NVSMI_TABLE_ID),
            "6c3efec4-8fc9-4e6c-a327-ee696e12f7c4"
        );
    }

    #[test]
    fn a_size_word_must_hold_the_process_slots_and_stay_small() {
        assert!(size_ok(216 * 8));
        assert!(size_ok(0x1000));
        assert!(size_ok(64 * 1024));
        assert!(!size_ok(215 * 8), "slot 215 would be past the end");
        assert!(!size_ok(0x1004), "not a multiple of 8");
        assert!(!size_ok(64 * 1024 + 8));
        assert!(!size_ok(0));
        assert!(!size_ok(!7));
    }

    #[test]
    fn only_the_580_branch_is_known() {
        assert_eq!(driver_branch("580.159.04"), Some(580));
        assert_eq!(driver_branch(" 580.65.06\n"), Some(580));
        assert!(branch_known("580.159.04").is_ok());
        assert!(branch_known("580").is_ok());
        assert_eq!(
            branch_known("575.57.08"),
            Err(PassThrough::Branch("575.57.08".into()))
        );
        assert!(branch_known("590.1").is_err());
        assert!(branch_known("").is_err());
        assert!(branch_known("r580").is_err());
        assert!(branch_known("+580.1").is_err());
    }

    #[test]
    fn readability_follows_the_maps() {
        let maps = "\
1000-3000 r--p 00000000 08:01 1 /usr/lib/libnvidia-ml.so.1
3000-4000 rw-p 00002000 08:01 1 /usr/lib/libnvidia-ml.so.1
4000-5000 ---p 00000000 00:00 0
6000-7000 r-xp 00000000 00:00 0
";
        assert!(range_readable(maps, 0x1000, 8));
        assert!(
            range_readable(maps, 0x2ff8, 0x1008),
            "across adjacent mappings"
        );
        assert!(
            !range_readable(maps, 0x3ff8, 16),
            "into a mapping without r"
        );
        assert!(!range_readable(maps, 0x5ff8, 16), "from a hole");
        assert!(!range_readable(maps, 0x6ff8, 16), "past the last mapping");
        assert!(!range_readable(maps, 0x800, 8));
        assert!(!range_readable(maps, usize::MAX - 4, 8));
        assert!(range_readable(maps, 0x6000, 0x1000));
    }

    #[test]
    fn the_copy_replaces_the_process_slots_only() {
        let words: Vec<u64> = (0..256u64)
            .map(|i| if i == 0 { 2048 } else { 0x10_000 + i })
            .collect();
        let c = wrapped_copy(&words, [1, 2, 3]).unwrap();
        assert_eq!(c.len(), 256);
        assert_eq!((c[213], c[214], c[215]), (1, 2, 3));
        for (i, (&a, &b)) in words.iter().zip(&c).enumerate() {
            if !PROCESS_SLOTS.contains(&i) {
                assert_eq!(a, b, "word {i}");
            }
        }
        let mut holed = words.clone();
        holed[214] = 0;
        assert_eq!(
            wrapped_copy(&holed, [1, 2, 3]),
            Err(PassThrough::NullSlot(214))
        );
        assert!(wrapped_copy(&words[..215], [1, 2, 3]).is_err());
    }

    /// Entries of the given `(pid, used, name)`, `extra` trailing garbage entries beyond.
    fn entries(list: &[(u32, u64, &str)]) -> Vec<u8> {
        let mut b = vec![0u8; list.len() * ENTRY_BYTES];
        for (k, &(pid, used, name)) in list.iter().enumerate() {
            let e = &mut b[k * ENTRY_BYTES..(k + 1) * ENTRY_BYTES];
            e[0..4].copy_from_slice(&pid.to_ne_bytes());
            e[4..8].copy_from_slice(&[0xAA; 4]); // padding the driver may leave as is
            e[8..16].copy_from_slice(&used.to_ne_bytes());
            e[16..20].copy_from_slice(&(k as u32).to_ne_bytes());
            e[20..24].copy_from_slice(&u32::MAX.to_ne_bytes());
            e[24..32].copy_from_slice(&(7 * k as u64).to_ne_bytes());
            e[NAME_OFFSET..NAME_OFFSET + name.len()].copy_from_slice(name.as_bytes());
        }
        b
    }

    fn name_at(b: &[u8], k: usize) -> &str {
        let f = &b[k * ENTRY_BYTES + NAME_OFFSET..k * ENTRY_BYTES + NAME_OFFSET + NAME_BYTES];
        std::str::from_utf8(&f[..f.iter().position(|&c| c == 0).unwrap()]).unwrap()
    }

    fn m(pid: u32, host: u32, used: u64) -> Member {
        Member {
            pid,
            host_pid: Some(host),
            used,
            alive: true,
        }
    }

    #[test]
    fn the_containers_entries_are_kept_in_place_with_their_names() {
        // Host pids 5001 (another container), 5002 (ours, pid 7), 5003 (another),
        // 5004 (ours, pid 9).
        let mut b = entries(&[
            (5001, 900, "/b/one"),
            (5002, 800, "/a/one"),
            (5003, 700, "/b/two"),
            (5004, 600, "/a/two"),
        ]);
        let before = b.clone();
        let members = [m(7, 5002, 256), m(9, 5004, 512)];
        assert_eq!(narrow_entries(&mut b, &members, false), Ok(2));
        let e0 = entry_of(&b[..ENTRY_BYTES]);
        let e1 = entry_of(&b[ENTRY_BYTES..2 * ENTRY_BYTES]);
        // The member's pid and region usage; the driver's instance ids and protected memory.
        assert_eq!(
            (e0.pid, e0.used, e0.gpu_instance, e0.cc_protected),
            (7, 256, 1, 7)
        );
        assert_eq!(
            (e1.pid, e1.used, e1.gpu_instance, e1.cc_protected),
            (9, 512, 3, 21)
        );
        assert_eq!((name_at(&b, 0), name_at(&b, 1)), ("/a/one", "/a/two"));
        // Every other byte of a kept entry is the driver's (padding included).
        assert_eq!(b[4..8], before[ENTRY_BYTES + 4..ENTRY_BYTES + 8]);
        // The entries left out are gone, bytes and all.
        assert!(b[2 * ENTRY_BYTES..].iter().all(|&c| c == 0));
    }

    #[test]
    fn a_process_listed_twice_has_its_usage_once() {
        let mut b = entries(&[(5002, 1, "/a"), (5002, 2, "/a")]);
        assert_eq!(narrow_entries(&mut b, &[m(7, 5002, 300)], false), Ok(2));
        assert_eq!(entry_of(&b).used, 300);
        assert_eq!(entry_of(&b[ENTRY_BYTES..]).used, NVML_VALUE_NOT_AVAILABLE);
    }

    #[test]
    fn without_members_nothing_is_left() {
        let mut b = entries(&[(5001, 900, "/b/one")]);
        assert_eq!(narrow_entries(&mut b, &[], false), Ok(0));
        assert!(b.iter().all(|&c| c == 0));
        let mut none: Vec<u8> = Vec::new();
        assert_eq!(narrow_entries(&mut none, &[], false), Ok(0));
    }

    #[test]
    fn a_name_without_nul_leaves_the_answer_untouched() {
        let mut b = entries(&[(5002, 800, "/a/one"), (5001, 900, "/b/one")]);
        b[ENTRY_BYTES + NAME_OFFSET..2 * ENTRY_BYTES].fill(b'x');
        let before = b.clone();
        assert_eq!(
            narrow_entries(&mut b, &[m(7, 5002, 256)], false),
            Err(Untouched::UnterminatedName { index: 1 })
        );
        assert_eq!(b, before);
        // A NUL in the last byte of the name is a name.
        b[2 * ENTRY_BYTES - 1] = 0;
        assert_eq!(narrow_entries(&mut b, &[m(7, 5002, 256)], false), Ok(1));
    }

    #[test]
    fn a_count_over_the_capacity_is_a_surprise() {
        assert_eq!(checked_count(250, 3), Ok(3));
        assert_eq!(checked_count(250, 250), Ok(250));
        assert_eq!(checked_count(0, 0), Ok(0));
        assert_eq!(
            checked_count(2, 3),
            Err(Untouched::CountOverCapacity {
                capacity: 2,
                count: 3
            })
        );
    }
}
