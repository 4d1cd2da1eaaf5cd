//! [`Seen`]: which discovery candidates were already handled, so that a file is attached (or
//! found to export nothing) once, not at every pass; bounded on a node where processes and
//! containers come and go.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use super::memo::Memo;

/// Maps identities remembered at most (a node maps far fewer distinct libcuda files; a
/// tenant mapping more only makes the agent look at the oldest ones again).
pub const SEEN_MAPS_MAX: usize = 4096;

/// Full scans an identity is remembered for after the last one that saw it mapped (see
/// [`Seen::end`]): 1 = it is forgotten at the second full scan (5 to 10 s at the agent's
/// 500 ms passes) that finds no process mapping it.
pub const SEEN_FULL_SCANS: u64 = 1;

/// What discovery passes remember of the candidates they handled (attached, already
/// attached, or found not to be a driver), by kind of candidate:
///
/// * found in `/proc/<pid>/maps`: by its maps identity (device and inode), in a [`Memo`]:
///   touched each time a pass offers it again, forgotten once no full scan (every live
///   process read) has offered it for more than [`SEEN_FULL_SCANS`] full scans (nobody maps
///   it any more), and never more than [`SEEN_MAPS_MAX`] of them. While any process maps a
///   file it stays remembered, so a file found to export nothing is not read again; one
///   that comes back after being forgotten is examined again, once.
/// * found by path (`ld.so.cache`, the driver directories, `--libcuda`): by path, with the
///   stamp `S` of the file it named when handled (a new file at the path is handled again);
///   a path no pass offers any more (it names nothing now) is forgotten at the end of the
///   pass, so this holds at most the paths of the latest pass.
#[derive(Debug)]
pub struct Seen<S> {
    maps: Memo<(String, u64), ()>,
    paths: HashMap<PathBuf, S>,
    /// Paths offered in the pass in progress.
    offered: HashSet<PathBuf>,
}

impl<S> Default for Seen<S> {
    fn default() -> Seen<S> {
        Seen::new(SEEN_MAPS_MAX)
    }
}

impl<S> Seen<S> {
    /// Empty, remembering at most `maps_cap` maps identities.
    pub fn new(maps_cap: usize) -> Seen<S> {
        Seen {
            maps: Memo::new(maps_cap),
            paths: HashMap::new(),
            offered: HashSet::new(),
        }
    }

    /// A pass begins; `full`: its maps scan read every live process.
    pub fn begin(&mut self, full: bool) {
        if full {
            self.maps.advance();
        }
        self.offered.clear();
    }

    /// Whether the maps identity `id` was not handled yet (touches it if it was).
    pub fn is_new_map(&mut self, id: &(String, u64)) -> bool {
        !self.maps.contains(id)
    }

    /// Whether the path `p`, naming a file of stamp `stamp` now, was not handled with that
    /// stamp (the path counts as offered in this pass).
    pub fn is_new_path(&mut self, p: &Path, stamp: &S) -> bool
    where
        S: PartialEq,
    {
        self.offered.insert(p.to_path_buf());
        self.paths.get(p) != Some(stamp)
    }

    /// The maps identity `id` was handled.
    pub fn handled_map(&mut self, id: (String, u64)) {
        self.maps.insert(id, ());
    }

    /// The path `p` was handled when it named a file of stamp `stamp`.
    pub fn handled_path(&mut self, p: PathBuf, stamp: S) {
        self.offered.insert(p.clone());
        self.paths.insert(p, stamp);
    }

    /// Forgets the maps identity `id` (its file's probes were detached).
    pub fn forget_map(&mut self, id: &(String, u64)) {
        self.maps.remove(id);
    }

    /// The pass is over (`full` as given to [`Seen::begin`]): the paths it did not offer and,
    /// after a full scan, the identities not offered for more than [`SEEN_FULL_SCANS`] full
    /// scans are forgotten.
    pub fn end(&mut self, full: bool) {
        if full {
            self.maps.expire(SEEN_FULL_SCANS);
        }
        let offered = &self.offered;
        self.paths.retain(|p, _| offered.contains(p));
    }

    /// Maps identities remembered.
    pub fn maps_len(&self) -> usize {
        self.maps.len()
    }

    /// Paths remembered.
    pub fn paths_len(&self) -> usize {
        self.paths.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(ino: u64) -> (String, u64) {
        ("08:01".to_string(), ino)
    }

    /// One pass offering `ids`, handling the new ones; returns those that were new.
    fn pass(s: &mut Seen<u32>, full: bool, ids: &[u64]) -> Vec<u64> {
        s.begin(full);
        let mut new = Vec::new();
        for &i in ids {
            if s.is_new_map(&id(i)) {
                new.push(i);
                s.handled_map(id(i));
            }
        }
        s.end(full);
        new
    }

    #[test]
    fn a_file_mapped_all_along_is_handled_once_and_a_gone_one_is_forgotten_then_examined_again() {
        let mut s: Seen<u32> = Seen::new(64);
        // File 1 (say, a libcuda.so.1 that exports nothing) is mapped by a long-lived
        // process: offered by the full scans only (its mapper is skipped in between).
        assert_eq!(pass(&mut s, true, &[1, 2]), [1, 2]);
        for round in 0..5 {
            for _ in 1..10 {
                assert_eq!(pass(&mut s, false, &[]), Vec::<u64>::new());
            }
            // 2's process exited after the first full scan.
            let new = pass(&mut s, true, &[1]);
            assert_eq!(new, Vec::<u64>::new(), "round {round}: 1 is examined again");
        }
        assert_eq!(
            s.maps_len(),
            1,
            "2 is forgotten once no full scan offers it"
        );
        // 2 is mapped again later: examined again, once.
        assert_eq!(pass(&mut s, false, &[2]), [2]);
        assert_eq!(pass(&mut s, false, &[2]), Vec::<u64>::new());
    }

    #[test]
    fn never_more_than_the_cap_under_churn_and_bounded_by_the_live_files_after_it() {
        let mut s: Seen<u32> = Seen::new(100);
        // 10 000 short-lived processes, each with a copy of libcuda of its own (a new inode),
        // 30 alive at a time, a pass every 10 processes, every 10th pass a full one.
        let mut next = 0u64;
        for p in 0..1000u64 {
            let live: Vec<u64> = (next.saturating_sub(20)..next + 10).collect();
            next += 10;
            pass(&mut s, p % 10 == 0, &live);
            assert!(
                s.maps_len() <= 100,
                "{} remembered at pass {p}",
                s.maps_len()
            );
        }
        // The churn stops: nothing is mapped any more.
        for p in 0..20 {
            pass(&mut s, p % 10 == 0, &[]);
        }
        assert_eq!(s.maps_len(), 0);
    }

    #[test]
    fn a_path_is_handled_again_when_its_file_changes_and_forgotten_when_not_offered() {
        let mut s: Seen<u32> = Seen::default();
        let p = PathBuf::from("/usr/lib/libcuda.so.1");
        let q = PathBuf::from("/opt/libcuda.so.1");
        s.begin(true);
        assert!(s.is_new_path(&p, &1));
        s.handled_path(p.clone(), 1);
        assert!(s.is_new_path(&q, &7));
        s.handled_path(q.clone(), 7);
        s.end(true);
        s.begin(false);
        assert!(!s.is_new_path(&p, &1));
        assert!(s.is_new_path(&p, &2), "a new file renamed over the path");
        s.end(false);
        assert_eq!(s.paths_len(), 1, "q not offered: forgotten");
        s.begin(false);
        assert!(s.is_new_path(&q, &7));
        s.end(false);
    }
}
