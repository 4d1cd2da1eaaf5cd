//! `CUDA_VISIBLE_DEVICES` as the CUDA driver reads it, and which of the container's devices a
//! process's CUDA ordinal is (issue 29; the rule: `docs/shared-region.md`, "Which device").
//!
//! A container's devices are the devices the driver enumerates with `CUDA_VISIBLE_DEVICES`
//! unset, in the driver's order: HAMi's device plugin gives a container its GPUs (through
//! `NVIDIA_VISIBLE_DEVICES`, never `CUDA_VISIBLE_DEVICES`) and sets
//! `CUDA_DEVICE_MEMORY_LIMIT_<i>` for the container's device `i`, CUDA ordinal `i` of a process
//! that does not narrow. The region is indexed by that container index. A launcher that sets
//! `CUDA_VISIBLE_DEVICES` for a process narrows or reorders what the process sees; [`place`]
//! maps each of its ordinals back:
//!
//! * variable unset: ordinal `k` is the container's device `k` (the process sees them all);
//! * entry `k` an index `n`: the container's device `n` (the driver's indices are those of
//!   its enumeration without the variable);
//! * entry `k` a `GPU-<uuid>` / `MIG-<uuid>` (or a unique prefix): the container index at
//!   which the region recorded the UUID the driver reports for ordinal `k`
//!   (`cuDeviceGetUuid`); not recorded → unknown.
//!
//! Both the preload and the agent use it. Allocation-free: the values are slices of the variable.

use hami_abi::layout::MAX_DEVICES;

/// Name of the variable.
pub const ENV_CUDA_VISIBLE_DEVICES: &str = "CUDA_VISIBLE_DEVICES";

/// One entry of `CUDA_VISIBLE_DEVICES`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Entry<'a> {
    /// A device index: the driver's numbering without `CUDA_VISIBLE_DEVICES`.
    Index(u32),
    /// `GPU-<uuid or unique prefix>` or `MIG-<...>`, as written (without the spaces around).
    Uuid(&'a str),
}

/// The entry `e` (already trimmed), or `None` where the driver stops reading the list.
fn entry(e: &str) -> Option<Entry<'_>> {
    if !e.is_empty() && e.bytes().all(|b| b.is_ascii_digit()) {
        return e.parse().ok().map(Entry::Index);
    }
    let prefix = e.get(..4)?;
    let uuid_form = prefix.eq_ignore_ascii_case("GPU-") || prefix.eq_ignore_ascii_case("MIG-");
    (uuid_form && e.len() > 4).then_some(Entry::Uuid(e))
}

/// The entries the driver may take from `value`, in order: comma-separated, spaces around each
/// ignored, up to the first that is neither a decimal index nor a `GPU-`/`MIG-` UUID (the
/// driver stops reading there). The driver also stops at an index beyond its devices, an
/// unknown or ambiguous UUID and a repeated entry, which only it can tell: so a process's
/// ordinal `k` is entry `k` for `k` below its `cuDeviceGetCount`, never beyond.
pub fn entries(value: &str) -> impl Iterator<Item = Entry<'_>> {
    value.split(',').map(str::trim).map_while(entry)
}

/// How a process's ordinal was placed among the container's devices.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Basis {
    /// `CUDA_VISIBLE_DEVICES` unset: the process sees every device of the container.
    Unnarrowed,
    /// An index entry of `CUDA_VISIBLE_DEVICES`.
    Index,
    /// The UUID the driver reports, found in the region's recorded list.
    Recorded,
}

impl Basis {
    /// Whether the placement defines the container's device (and so may be recorded in the
    /// region), rather than being read from it.
    pub fn authoritative(self) -> bool {
        !matches!(self, Basis::Recorded)
    }

    /// For log lines.
    pub fn describe(self) -> &'static str {
        match self {
            Basis::Unnarrowed => "CUDA_VISIBLE_DEVICES unset",
            Basis::Index => "an index entry of CUDA_VISIBLE_DEVICES",
            Basis::Recorded => "its UUID as the region recorded it",
        }
    }
}

/// Why an ordinal could not be placed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unknown {
    /// The driver reported no UUID for the ordinal (and the variable gives no index).
    NoUuid,
    /// The ordinal's UUID is not in the region's list: no process that sees the device by
    /// index (or every device) has recorded it yet, or it is not one of the container's.
    NotRecorded,
    /// The index is beyond the devices a region can hold ([`MAX_DEVICES`]).
    BeyondMax,
}

impl Unknown {
    /// For log lines.
    pub fn describe(self) -> &'static str {
        match self {
            Unknown::NoUuid => "the driver reports no UUID for it and CUDA_VISIBLE_DEVICES gives no index",
            Unknown::NotRecorded => "its UUID is not among the container's devices the region has recorded (no process that sees it by index, or sees every device, has run yet)",
            Unknown::BeyondMax => "its index is beyond the 16 devices a region holds",
        }
    }
}

/// Where a process's CUDA ordinal lies among the container's devices.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    /// The container's device `index`.
    At {
        /// The container index (what `CUDA_DEVICE_MEMORY_LIMIT_<i>` and the region use).
        index: usize,
        /// How it was found.
        by: Basis,
    },
    /// Not known.
    Unknown(Unknown),
}

/// Places CUDA ordinal `ordinal` of a process whose `CUDA_VISIBLE_DEVICES` is `visible`
/// (`None` = unset), for which the driver reports `uuid`, against the UUIDs a region has
/// recorded per container index (`recorded`, all-zero = unknown). See the module
/// documentation for the rule.
pub fn place(
    ordinal: usize,
    visible: Option<&str>,
    uuid: Option<&[u8; 16]>,
    recorded: &[[u8; 16]],
) -> Placement {
    let at = |index: usize, by| {
        if index < MAX_DEVICES {
            Placement::At { index, by }
        } else {
            Placement::Unknown(Unknown::BeyondMax)
        }
    };
    let Some(v) = visible else {
        return at(ordinal, Basis::Unnarrowed);
    };
    if let Some(Entry::Index(n)) = entries(v).nth(ordinal) {
        return at(n as usize, Basis::Index);
    }
    let Some(u) = uuid.filter(|u| u.iter().any(|&b| b != 0)) else {
        return Placement::Unknown(Unknown::NoUuid);
    };
    match recorded.iter().position(|r| r == u) {
        Some(i) => at(i, Basis::Recorded),
        None => Placement::Unknown(Unknown::NotRecorded),
    }
}

/// Whether the `GPU-`/`MIG-` entry `text` names `raw`: its hex digits (dashes ignored, any
/// case) are a prefix of `raw`'s.
fn entry_names(text: &str, raw: &[u8; 16]) -> bool {
    let Some(hex) = text.get(4..) else {
        return false;
    };
    let mut n = 0usize;
    for c in hex.chars().filter(|&c| c != '-') {
        let (Some(v), Some(&b)) = (c.to_digit(16), raw.get(n / 2)) else {
            return false;
        };
        let nibble = if n.is_multiple_of(2) { b >> 4 } else { b & 0xf };
        if u32::from(nibble) != v {
            return false;
        }
        n += 1;
    }
    n > 0
}

/// [`place`] for an observer that cannot ask the process's driver for its UUIDs (the node
/// agent, which reads the process's environment): a UUID entry is matched by its text, a
/// unique prefix among the UUIDs the region recorded. An ordinal beyond the entries the
/// text gives, or a UUID entry that matches no recorded UUID or several, is unknown.
pub fn place_by_entry(ordinal: usize, visible: Option<&str>, recorded: &[[u8; 16]]) -> Placement {
    let at = |index: usize, by| {
        if index < MAX_DEVICES {
            Placement::At { index, by }
        } else {
            Placement::Unknown(Unknown::BeyondMax)
        }
    };
    let Some(v) = visible else {
        return at(ordinal, Basis::Unnarrowed);
    };
    match entries(v).nth(ordinal) {
        Some(Entry::Index(n)) => at(n as usize, Basis::Index),
        Some(Entry::Uuid(text)) => {
            let mut found = recorded
                .iter()
                .enumerate()
                .filter(|(_, r)| r.iter().any(|&b| b != 0) && entry_names(text, r));
            match (found.next(), found.next()) {
                (Some((i, _)), None) => at(i, Basis::Recorded),
                _ => Placement::Unknown(Unknown::NotRecorded),
            }
        }
        None => Placement::Unknown(Unknown::NotRecorded),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(v: &str) -> Vec<Entry<'_>> {
        entries(v).collect()
    }

    #[test]
    fn entries_read_as_the_driver_does() {
        assert_eq!(list("1,0"), [Entry::Index(1), Entry::Index(0)]);
        assert_eq!(list(" 2 , 0 "), [Entry::Index(2), Entry::Index(0)]);
        assert_eq!(
            list("GPU-facec0da-0000,MIG-1234,gpu-ab"),
            [
                Entry::Uuid("GPU-facec0da-0000"),
                Entry::Uuid("MIG-1234"),
                Entry::Uuid("gpu-ab")
            ]
        );
        // Up to the first invalid entry.
        assert_eq!(list("1,abc,0"), [Entry::Index(1)]);
        assert_eq!(list("-1,0"), []);
        assert_eq!(list("+1"), []);
        assert_eq!(list(""), []);
        assert_eq!(list("GPU-"), []);
        assert_eq!(list("0,,1"), [Entry::Index(0)]);
        assert_eq!(list("99999999999,0"), []);
    }

    fn uuid(i: u8) -> [u8; 16] {
        let mut u = [0xfa; 16];
        u[15] = i;
        u
    }

    #[test]
    fn unset_is_the_containers_numbering() {
        let rec = [[0u8; 16]; MAX_DEVICES];
        assert_eq!(
            place(1, None, Some(&uuid(1)), &rec),
            Placement::At {
                index: 1,
                by: Basis::Unnarrowed
            }
        );
        assert_eq!(
            place(16, None, None, &rec),
            Placement::Unknown(Unknown::BeyondMax)
        );
    }

    #[test]
    fn index_entries_name_the_containers_device_whatever_was_recorded() {
        let mut rec = [[0u8; 16]; MAX_DEVICES];
        rec[0] = uuid(0);
        rec[1] = uuid(1);
        // CUDA_VISIBLE_DEVICES=1: the process's only device is the container's device 1.
        assert_eq!(
            place(0, Some("1"), Some(&uuid(1)), &rec),
            Placement::At {
                index: 1,
                by: Basis::Index
            }
        );
        // Reordered.
        assert_eq!(
            place(1, Some("1,0"), Some(&uuid(0)), &rec),
            Placement::At {
                index: 0,
                by: Basis::Index
            }
        );
        assert_eq!(
            place(0, Some("16"), Some(&uuid(1)), &rec),
            Placement::Unknown(Unknown::BeyondMax)
        );
    }

    #[test]
    fn uuid_entries_are_found_in_the_recorded_list_or_unknown() {
        let mut rec = [[0u8; 16]; MAX_DEVICES];
        rec[1] = uuid(1);
        let v = Some("GPU-fafafafa,0");
        assert_eq!(
            place(0, v, Some(&uuid(1)), &rec),
            Placement::At {
                index: 1,
                by: Basis::Recorded
            }
        );
        // A mixed list: the index entry after the UUID one.
        assert_eq!(
            place(1, v, Some(&uuid(0)), &rec),
            Placement::At {
                index: 0,
                by: Basis::Index
            }
        );
        assert_eq!(
            place(0, v, Some(&uuid(2)), &rec),
            Placement::Unknown(Unknown::NotRecorded)
        );
        assert_eq!(place(0, v, None, &rec), Placement::Unknown(Unknown::NoUuid));
        assert_eq!(
            place(0, v, Some(&[0; 16]), &rec),
            Placement::Unknown(Unknown::NoUuid),
            "an all-zero UUID is no UUID (it would match every unrecorded index)"
        );
        // An ordinal beyond what the parser took (a form it does not know): by UUID.
        assert_eq!(
            place(0, Some("weird"), Some(&uuid(1)), &rec),
            Placement::At {
                index: 1,
                by: Basis::Recorded
            }
        );
        assert!(!Basis::Recorded.authoritative());
        assert!(Basis::Index.authoritative() && Basis::Unnarrowed.authoritative());
    }

    #[test]
    fn an_observer_places_uuid_entries_by_their_text() {
        let mut rec = [[0u8; 16]; MAX_DEVICES];
        rec[0] = uuid(0);
        rec[1] = uuid(1);
        let full1 = "GPU-fafafafa-fafa-fafa-fafa-fafafafafa01";
        assert_eq!(
            place_by_entry(0, Some(full1), &rec),
            Placement::At {
                index: 1,
                by: Basis::Recorded
            }
        );
        assert_eq!(
            place_by_entry(0, Some("gpu-FAFAFAFA-fafa-fafa-fafa-fafafafafa00"), &rec),
            Placement::At {
                index: 0,
                by: Basis::Recorded
            }
        );
        // A prefix shared by both: ambiguous (the driver would have stopped there too).
        assert_eq!(
            place_by_entry(0, Some("GPU-fafa"), &rec),
            Placement::Unknown(Unknown::NotRecorded)
        );
        assert_eq!(
            place_by_entry(0, Some("GPU-0123"), &rec),
            Placement::Unknown(Unknown::NotRecorded)
        );
        assert_eq!(
            place_by_entry(1, Some("1,0"), &rec),
            Placement::At {
                index: 0,
                by: Basis::Index
            }
        );
        assert_eq!(
            place_by_entry(2, None, &rec),
            Placement::At {
                index: 2,
                by: Basis::Unnarrowed
            }
        );
        assert_eq!(
            place_by_entry(1, Some("1"), &rec),
            Placement::Unknown(Unknown::NotRecorded)
        );
    }
}
