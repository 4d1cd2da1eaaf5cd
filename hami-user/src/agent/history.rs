//! [`History`]: every finding reported since start (the latest figures of each), for the
//! audit's report, bounded: on a node where short-lived processes keep raising findings
//! (a bypass each) it would otherwise grow with the agent's uptime.

use std::collections::{BTreeMap, HashSet, VecDeque};

use crate::findings::{Finding, FindingKey};

/// Cleared findings kept at most; beyond it the longest cleared go first, the findings that
/// make `audit` fail ([`crate::findings::FindingKind::is_failure`]) only when no other is
/// left, and the last of those never (so the audit's exit status stays what it was).
/// Standing findings are always kept.
pub const HISTORY_MAX: usize = 4096;

/// The findings reported since start, by key (see the module docs).
#[derive(Debug)]
pub struct History {
    map: BTreeMap<FindingKey, Finding>,
    /// Keys as their findings cleared, oldest first (a key may be there twice: raised again
    /// and cleared again; its latest place counts).
    cleared: VecDeque<FindingKey>,
    cap: usize,
}

impl Default for History {
    fn default() -> History {
        History::new(HISTORY_MAX)
    }
}

impl History {
    /// Empty, keeping at most `cap` cleared findings.
    pub fn new(cap: usize) -> History {
        History {
            map: BTreeMap::new(),
            cleared: VecDeque::new(),
            cap,
        }
    }

    /// `f` stands (reported, with its latest figures).
    pub fn insert(&mut self, k: FindingKey, f: Finding) {
        self.map.insert(k, f);
    }

    /// The finding `k` stopped standing.
    pub fn cleared(&mut self, k: FindingKey) {
        self.cleared.push_back(k);
    }

    /// Drops cleared findings beyond the cap (see [`HISTORY_MAX`]); `standing` are the keys
    /// standing now.
    pub fn bound(&mut self, standing: &BTreeMap<FindingKey, Finding>) {
        if self.cleared.len() > 2 * self.cap.max(1) {
            self.compact(standing);
        }
        let over = |h: &History| h.map.len().saturating_sub(standing.len()) > h.cap;
        if !over(self) {
            return;
        }
        // The others first, oldest cleared first; then the failures, but the last one.
        for failures in [false, true] {
            let mut failing = self.map.values().filter(|f| f.kind.is_failure()).count();
            let mut kept = VecDeque::new();
            while over(self) {
                let Some(k) = self.cleared.pop_front() else {
                    break;
                };
                if standing.contains_key(&k) {
                    continue; // raised again: queued again when it clears
                }
                let Some(f) = self.map.get(&k) else {
                    continue; // already gone (a duplicate)
                };
                let failure = f.kind.is_failure();
                if failure && (!failures || failing <= 1) {
                    kept.push_back(k);
                    continue;
                }
                failing -= usize::from(failure);
                self.map.remove(&k);
            }
            kept.append(&mut self.cleared);
            self.cleared = kept;
        }
    }

    /// Keeps in `cleared` only the latest place of each key still held and not standing.
    fn compact(&mut self, standing: &BTreeMap<FindingKey, Finding>) {
        let mut seen = HashSet::new();
        let mut out: VecDeque<FindingKey> = VecDeque::new();
        while let Some(k) = self.cleared.pop_back() {
            if self.map.contains_key(&k) && !standing.contains_key(&k) && seen.insert(k.clone()) {
                out.push_front(k);
            }
        }
        self.cleared = out;
    }

    /// Every finding held (standing and cleared), in key order.
    pub fn values(&self) -> impl Iterator<Item = &Finding> {
        self.map.values()
    }

    /// Findings held.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether none is held.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::findings::{reason, FindingKind};

    fn finding(kind: FindingKind, pid: u32) -> Finding {
        Finding {
            kind,
            reason: reason::NO_PRELOAD,
            pid: Some(pid),
            uid: None,
            nspid: None,
            container: "c".into(),
            region: None,
            device: None,
            slot: None,
            bytes: 0,
            observed: None,
            accounted: None,
            limit: None,
            detail: String::new(),
        }
    }

    #[test]
    fn cleared_findings_are_bounded_oldest_first_failures_last_and_the_last_failure_kept() {
        let mut h = History::new(8);
        let mut standing = BTreeMap::new();
        // One bypass long ago, then 10 000 short-lived processes each raising a drift that
        // clears, while one finding stands all along.
        let bypass = finding(FindingKind::Bypass, 1);
        h.insert(bypass.key(), bypass.clone());
        h.cleared(bypass.key());
        let stand = finding(FindingKind::Drift, 2);
        standing.insert(stand.key(), stand.clone());
        h.insert(stand.key(), stand.clone());
        for pid in 10..10_010 {
            let f = finding(FindingKind::Drift, pid);
            h.insert(f.key(), f.clone());
            h.cleared(f.key());
            h.bound(&standing);
            assert!(h.len() <= 8 + 1, "{} held at pid {pid}", h.len());
            assert!(h.cleared.len() <= 2 * 8 + 1, "{} queued", h.cleared.len());
        }
        let kinds: Vec<(FindingKind, Option<u32>)> = h.values().map(|f| (f.kind, f.pid)).collect();
        assert!(kinds.contains(&(FindingKind::Bypass, Some(1))), "{kinds:?}");
        assert!(kinds.contains(&(FindingKind::Drift, Some(2))), "{kinds:?}");
        assert!(
            kinds.contains(&(FindingKind::Drift, Some(10_009))),
            "{kinds:?}"
        );
        assert!(
            !kinds.contains(&(FindingKind::Drift, Some(10))),
            "{kinds:?}"
        );
        // Failures beyond the cap go too, all but the last one.
        for pid in 20_000..20_100 {
            let f = finding(FindingKind::Bypass, pid);
            h.insert(f.key(), f.clone());
            h.cleared(f.key());
            h.bound(&standing);
        }
        assert!(h.len() <= 9);
        assert!(h.values().any(|f| f.kind.is_failure()));
        // A key raised again while queued is kept while it stands.
        let again = finding(FindingKind::Bypass, 20_099);
        standing.insert(again.key(), again.clone());
        for pid in 30_000..30_100 {
            let f = finding(FindingKind::Drift, pid);
            h.insert(f.key(), f.clone());
            h.cleared(f.key());
            h.bound(&standing);
        }
        assert!(h.values().any(|f| f.pid == Some(20_099)));
    }
}
