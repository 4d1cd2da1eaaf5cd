//! Process slots: registration, release at exit, reclaim of dead processes' slots.

use core::sync::atomic::Ordering;
use std::sync::Arc;

use super::handle::*;
use super::liveness::*;
use super::types::*;
use hami_abi::layout::{MAX_SLOTS, SLOT_ACTIVE};

impl Region {
    // ---- slots ----

    /// Registers `who` (a live process, normally [`ProcessId::current`]) and returns its
    /// slot. Reuses a slot already holding exactly `who`. A slot with the same pid but another
    /// start time belongs to a dead process (pids are unique among live processes of a pid
    /// namespace) and is reclaimed. If no slot is free, dead processes' slots are reclaimed
    /// (liveness probe) and the registration retried; [`RegionError::Full`] if all are live.
    /// Cost: one lock and a scan of the slot table (no `/proc` access unless full).
    pub fn register(&self, who: ProcessId) -> Result<SlotId, RegionError> {
        if let Some(s) = self.try_register(who)? {
            return Ok(s);
        }
        self.reclaim_dead();
        if let Some(s) = self.try_register(who)? {
            return Ok(s);
        }
        Err(RegionError::Full {
            path: self.path.clone(),
        })
    }

    pub(super) fn try_register(&self, who: ProcessId) -> Result<Option<SlotId>, RegionError> {
        let g = self.lock()?;
        let mut free = None;
        let mut stale = None;
        for i in 0..MAX_SLOTS {
            if self.s_status(i).load(Ordering::Relaxed) == SLOT_ACTIVE {
                if self.s_pid(i).load(Ordering::Relaxed) == who.pid {
                    if self.s_start(i).load(Ordering::Relaxed) == who.start_time {
                        return Ok(Some(SlotId::new(i, who)));
                    }
                    stale = Some(i);
                }
            } else if free.is_none() {
                free = Some(i);
            }
        }
        let chosen = match stale {
            Some(i) => {
                g.begin_write();
                self.clear_slot_locked(i, true);
                self.h_reclaimed().fetch_add(1, Ordering::Relaxed);
                Some(i)
            }
            None => {
                if free.is_some() {
                    g.begin_write();
                }
                free
            }
        };
        Ok(chosen.map(|i| {
            self.claim_slot_locked(i, who);
            g.end_write();
            SlotId::new(i, who)
        }))
    }

    /// Releases the slot at normal exit: its usage is subtracted from the totals and it is
    /// freed. Does nothing if the slot no longer holds its owner.
    pub fn unregister(&self, slot: SlotId) {
        let Ok(g) = self.lock() else { return };
        if self.holds(slot) {
            g.begin_write();
            self.clear_slot_locked(slot.index(), true);
            g.end_write();
        }
    }

    /// Records the host pid of `slot`'s process (its pid in the initial pid namespace, as
    /// NVML's process lists report it), under the lock and only while the slot still holds
    /// its owner, so that a slot reclaimed and reused meanwhile is never given another
    /// process's host pid. Nothing on a read-only mapping.
    pub fn set_host_pid(&self, slot: SlotId, host_pid: u32) -> Result<(), RegionError> {
        if !self.writable {
            return Err(RegionError::ReadOnly {
                path: self.path.clone(),
                reason: "set_host_pid on a read-only mapping".into(),
            });
        }
        let _g = self.lock()?;
        if self.holds(slot) {
            self.s_host_pid(slot.index())
                .store(host_pid, Ordering::Relaxed);
        }
        Ok(())
    }

    /// The host pid recorded in slot `index` (0: not known, or free). One load, no lock.
    pub fn host_pid(&self, index: usize) -> u32 {
        if index >= MAX_SLOTS {
            return 0;
        }
        self.s_host_pid(index).load(Ordering::Relaxed)
    }

    /// Whether `slot` still belongs to its owner (it may have been reclaimed).
    pub fn is_registered(&self, slot: SlotId) -> bool {
        self.holds(slot)
    }

    // ---- reclaim ----

    /// Frees the slots of dead processes according to the region's liveness probe (default:
    /// the caller's `/proc`, valid for processes in the caller's pid namespace). Liveness is
    /// gathered without the lock; each slot is re-checked under the lock (same pid and start
    /// time, still active) before it is freed. Returns what was freed.
    pub fn reclaim_dead(&self) -> Vec<ReclaimedSlot> {
        let probe = Arc::clone(&self.probe);
        self.reclaim_dead_with(&*probe)
    }

    /// [`Region::reclaim_dead`] with an explicit probe (the agent: container pids).
    pub fn reclaim_dead_with(&self, probe: &dyn LivenessProbe) -> Vec<ReclaimedSlot> {
        if !self.writable {
            return Vec::new();
        }
        let dead: Vec<(usize, ProcessId)> = (0..MAX_SLOTS)
            .filter(|&i| self.s_status(i).load(Ordering::Acquire) == SLOT_ACTIVE)
            .map(|i| {
                (
                    i,
                    ProcessId {
                        pid: self.s_pid(i).load(Ordering::Relaxed),
                        start_time: self.s_start(i).load(Ordering::Relaxed),
                    },
                )
            })
            .filter(|&(_, who)| probe.liveness(who) == Liveness::Dead)
            .collect();
        if dead.is_empty() {
            return Vec::new();
        }
        let Ok(g) = self.lock() else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for (i, who) in dead {
            if self.holds(SlotId::new(i, who)) {
                g.begin_write();
                let usage = self.clear_slot_locked(i, true);
                self.h_reclaimed().fetch_add(1, Ordering::Relaxed);
                g.end_write();
                out.push(ReclaimedSlot {
                    index: i,
                    pid: who.pid,
                    start_time: who.start_time,
                    usage,
                });
            }
        }
        out
    }

    /// Frees `slot` only if it still holds `expected` (the agent's `--reclaim`, after it has
    /// established by its own means that `expected` is dead).
    pub fn reclaim_slot_if(&self, slot: SlotId, expected: ProcessId) -> Option<ReclaimedSlot> {
        let target = SlotId::new(slot.index(), expected);
        let g = self.lock().ok()?;
        if !self.holds(target) {
            return None;
        }
        g.begin_write();
        let usage = self.clear_slot_locked(target.index(), true);
        self.h_reclaimed().fetch_add(1, Ordering::Relaxed);
        g.end_write();
        Some(ReclaimedSlot {
            index: target.index(),
            pid: expected.pid,
            start_time: expected.start_time,
            usage,
        })
    }
}
