//! Graph memory nodes (`cuGraphAddMemAllocNode`, `cuGraphAddNode` with allocation parameters,
//! allocations captured from `cuMemAllocAsync`): admitted before the driver takes the memory.
//!
//! What the CUDA documentation says (driver API and the programming guide's "Graph Memory
//! Nodes"): adding an allocation node assigns the allocation's virtual address only; the
//! physical memory cannot be mapped at instantiation (the stream is not known) and is mapped
//! when the executable graph is uploaded (`cuGraphUpload`, `cuGraphInstantiateWithParams` with
//! `CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD`) or launched, from the device's graph memory pool,
//! which keeps it (`CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT` of `cuDeviceGetGraphMemAttribute`)
//! until `cuDeviceGraphMemTrim`, whatever is destroyed meanwhile. So, per process:
//!
//! * at instantiation (and after `cuGraphExecUpdate`) the graph's nodes are read (the nodes
//!   however they were added: by `cuGraphAddMemAllocNode`, `cuGraphAddNode`, a capture on any
//!   thread, `cuGraphNodeSetParams`): the bytes of its allocation nodes per device are the
//!   executable graph's **need**;
//! * before an upload or a launch the growth it may cause, need − (reserved − used) of the
//!   device's graph pool, is admitted ([`UsageKind::Pool`]); refused: the call returns
//!   `CUDA_ERROR_OUT_OF_MEMORY` without reaching the driver, nothing is launched, the program
//!   can go on;
//! * after it, and after `cuDeviceGraphMemTrim` and `cuGraphExecDestroy`, the charge follows
//!   the pool's reservation as the driver reports it (less the allocations captured from
//!   `cuMemAllocAsync`, already charged as data at capture).
//!
//! Plain Rust over a [`Ledger`]; the driver calls and readings are closures.

use crate::ffi::cuda::{CUresult, CUDA_SUCCESS};
use crate::ledger::accounting::{Deny, Ledger};
use hami_abi::layout::{UsageKind, MAX_DEVICES};
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

/// What the driver says about a device's graph memory pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct GraphReading {
    /// `CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT`.
    pub reserved: u64,
    /// `CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT`.
    pub used: u64,
}

/// The memory nodes of an executable graph.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ExecNeed {
    /// Bytes of its allocation nodes, per device.
    pub per_dev: Vec<(usize, u64)>,
    /// Bytes of those not freed in the graph, per device (live after a launch).
    pub unfreed: Vec<(usize, u64)>,
    /// Instantiated with `CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH`: a launch first
    /// frees what the previous one left live.
    pub auto_free: bool,
    /// Allocation nodes captured from `cuMemAllocAsync` and charged as data at capture:
    /// (device, address, bytes). Not part of `per_dev`; subtracted from the pool's reading
    /// while the data charge lasts.
    pub captured: Vec<(usize, u64, u64)>,
}

impl ExecNeed {
    /// Adds `bytes` on `dev` to `list`.
    pub fn add(list: &mut Vec<(usize, u64)>, dev: usize, bytes: u64) {
        match list.iter_mut().find(|(d, _)| *d == dev) {
            Some((_, b)) => *b = b.saturating_add(bytes),
            None => list.push((dev, bytes)),
        }
    }

    /// Whether the graph has memory nodes this table follows.
    pub fn is_empty(&self) -> bool {
        self.per_dev.is_empty() && self.captured.is_empty()
    }

    fn of(list: &[(usize, u64)], dev: usize) -> u64 {
        list.iter().filter(|(d, _)| *d == dev).map(|(_, b)| b).sum()
    }
}

struct Exec {
    need: ExecNeed,
    launched: bool,
}

struct Inner {
    execs: HashMap<u64, Exec>,
    /// Bytes charged per device ([`UsageKind::Pool`]).
    charged: [u64; MAX_DEVICES],
}

impl Default for Inner {
    fn default() -> Self {
        Inner {
            execs: HashMap::new(),
            charged: [0; MAX_DEVICES],
        }
    }
}

/// This process's executable graphs with memory nodes and the charge of its graph pools.
#[derive(Default)]
pub struct GraphTable {
    inner: Mutex<Inner>,
    /// Executable graphs with memory nodes: a launch of another costs this one load while 0.
    with_memory: AtomicUsize,
}

/// A refusal: the device and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    /// Device whose quota refused.
    pub dev: usize,
    /// The region's answer.
    pub deny: Deny,
}

impl GraphTable {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn recount(&self, g: &Inner) {
        self.with_memory.store(g.execs.len(), Ordering::Relaxed);
    }

    /// Whether some executable graph has memory nodes.
    #[inline]
    pub fn any(&self) -> bool {
        self.with_memory.load(Ordering::Relaxed) != 0
    }

    /// Records what executable graph `exec` needs (replacing what it needed before; an empty
    /// need forgets it).
    pub fn note_exec(&self, exec: u64, need: ExecNeed) {
        let mut g = self.lock();
        if need.is_empty() {
            g.execs.remove(&exec);
        } else {
            let launched = g.execs.get(&exec).is_some_and(|e| e.launched);
            g.execs.insert(exec, Exec { need, launched });
        }
        self.recount(&g);
    }

    /// Whether `exec` was instantiated with `CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH`
    /// (as far as this table knows).
    pub fn auto_free(&self, exec: u64) -> bool {
        self.any()
            && self
                .lock()
                .execs
                .get(&exec)
                .is_some_and(|e| e.need.auto_free)
    }

    /// Whether `exec` has memory nodes.
    pub fn has(&self, exec: u64) -> bool {
        self.any() && self.lock().execs.contains_key(&exec)
    }

    /// The devices `exec` allocates on (empty if it has no memory nodes).
    pub fn devices_of(&self, exec: u64) -> Vec<usize> {
        if !self.any() {
            return Vec::new();
        }
        let g = self.lock();
        g.execs.get(&exec).map_or_else(Vec::new, |e| {
            let mut v: Vec<usize> = e.need.per_dev.iter().map(|(d, _)| *d).collect();
            v.extend(e.need.captured.iter().map(|(d, _, _)| *d));
            v.sort_unstable();
            v.dedup();
            v
        })
    }

    /// Forgets `exec` (`cuGraphExecDestroy` succeeded); returns its devices.
    pub fn forget_exec(&self, exec: u64) -> Vec<usize> {
        let devs = self.devices_of(exec);
        let mut g = self.lock();
        g.execs.remove(&exec);
        self.recount(&g);
        devs
    }

    /// Sets the charge of `dev` to what the pool reading says, less the captured allocations
    /// still charged as data (`captured_live`).
    fn settle<L: Ledger + ?Sized>(
        g: &mut Inner,
        ledger: &L,
        dev: usize,
        r: GraphReading,
        captured_live: &dyn Fn(u64) -> bool,
    ) {
        let Some(c) = g.charged.get(dev).copied() else {
            return;
        };
        let data: u64 = g
            .execs
            .values()
            .flat_map(|e| e.need.captured.iter())
            .filter(|(d, p, _)| *d == dev && captured_live(*p))
            .map(|(_, _, b)| b)
            .sum();
        let target = r.reserved.saturating_sub(data);
        if target > c {
            ledger.force_charge(dev, UsageKind::Pool, target - c);
        } else if target < c {
            ledger.uncharge(dev, UsageKind::Pool, c - target);
        }
        g.charged[dev] = target;
    }

    /// Re-reads `dev`'s graph pool and sets its charge (after a trim, a destroyed executable
    /// graph). A pool that cannot be read keeps its charge.
    pub fn refresh<L: Ledger + ?Sized>(
        &self,
        ledger: &L,
        dev: usize,
        read: &dyn Fn(usize) -> Option<GraphReading>,
        captured_live: &dyn Fn(u64) -> bool,
    ) {
        if dev >= MAX_DEVICES {
            return;
        }
        let mut g = self.lock();
        if let Some(r) = read(dev) {
            Self::settle(&mut g, ledger, dev, r, captured_live);
        }
    }

    /// An upload or launch of `exec` (`real`): the growth of each device's graph pool it may
    /// cause is admitted first; refused, `real` is not called. Afterwards each pool's charge
    /// follows its reading (a pool that cannot be read keeps what was admitted, or gives it
    /// back if the call failed). `launch`: a launch (an auto-free launch frees what the
    /// previous one left live), not an upload.
    pub fn run<L: Ledger + ?Sized>(
        &self,
        ledger: &L,
        exec: u64,
        launch: bool,
        read: &dyn Fn(usize) -> Option<GraphReading>,
        captured_live: &dyn Fn(u64) -> bool,
        real: impl FnOnce() -> CUresult,
    ) -> Result<CUresult, Refused> {
        if !self.any() {
            return Ok(real());
        }
        // Held across the driver call: two threads launching at once must not both count
        // the same room in the pool.
        let mut g = self.lock();
        let Some(e) = g.execs.get(&exec) else {
            drop(g);
            return Ok(real());
        };
        let need = e.need.clone();
        let launched = e.launched;
        let mut admitted: Vec<(usize, u64)> = Vec::new();
        for &(dev, bytes) in &need.per_dev {
            if dev >= MAX_DEVICES {
                continue;
            }
            let r = read(dev);
            if let Some(r) = r {
                Self::settle(&mut g, ledger, dev, r, captured_live);
            }
            let (free, used) = r.map_or((0, 0), |r| (r.reserved.saturating_sub(r.used), r.used));
            // What an auto-free launch frees before it allocates (at most what is in use).
            let credit = if launch && need.auto_free && launched {
                ExecNeed::of(&need.unfreed, dev).min(used)
            } else {
                0
            };
            let growth = bytes.saturating_sub(free.saturating_add(credit));
            if growth == 0 {
                continue;
            }
            if let Err(deny) = ledger.try_charge(dev, UsageKind::Pool, growth) {
                for &(d, b) in &admitted {
                    ledger.uncharge(d, UsageKind::Pool, b);
                    g.charged[d] = g.charged[d].saturating_sub(b);
                }
                return Err(Refused { dev, deny });
            }
            g.charged[dev] = g.charged[dev].saturating_add(growth);
            admitted.push((dev, growth));
        }
        let rc = real();
        if rc == CUDA_SUCCESS && launch {
            if let Some(e) = g.execs.get_mut(&exec) {
                e.launched = true;
            }
        }
        for &(dev, bytes) in &need.per_dev {
            if dev >= MAX_DEVICES {
                continue;
            }
            match read(dev) {
                Some(r) => Self::settle(&mut g, ledger, dev, r, captured_live),
                None if rc != CUDA_SUCCESS => {
                    let b = ExecNeed::of(&admitted, dev);
                    ledger.uncharge(dev, UsageKind::Pool, b);
                    g.charged[dev] = g.charged[dev].saturating_sub(b);
                }
                None => {
                    let _ = bytes;
                }
            }
        }
        Ok(rc)
    }

    /// Bytes charged on `dev` (tests, diagnostics).
    pub fn charged(&self, dev: usize) -> u64 {
        self.lock().charged.get(dev).copied().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::accounting::MemLedger;
    use std::cell::Cell;

    const MB: u64 = 1 << 20;

    fn need(dev: usize, bytes: u64, unfreed: u64, auto_free: bool) -> ExecNeed {
        ExecNeed {
            per_dev: vec![(dev, bytes)],
            unfreed: if unfreed > 0 {
                vec![(dev, unfreed)]
            } else {
                vec![]
            },
            auto_free,
            captured: vec![],
        }
    }

    #[test]
    fn a_launch_beyond_the_quota_is_refused_before_the_driver() {
        let l = MemLedger::with_limit(0, 1024 * MB);
        l.try_charge(0, UsageKind::Context, 500 * MB).unwrap();
        let t = GraphTable::default();
        t.note_exec(7, need(0, 1536 * MB, 1536 * MB, false));
        let called = Cell::new(false);
        let r = t.run(
            &l,
            7,
            true,
            &|_| Some(GraphReading::default()),
            &|_| false,
            || {
                called.set(true);
                CUDA_SUCCESS
            },
        );
        assert!(matches!(r, Err(Refused { dev: 0, .. })), "{r:?}");
        assert!(!called.get(), "the driver was not asked");
        assert_eq!(l.used(0, UsageKind::Pool), 0);
    }

    #[test]
    fn a_launch_that_fits_is_charged_the_pool_reading_and_a_trim_gives_it_back() {
        let l = MemLedger::with_limit(0, 1024 * MB);
        let t = GraphTable::default();
        t.note_exec(7, need(0, 256 * MB, 256 * MB, false));
        let pool = Cell::new(GraphReading::default());
        let read = |_| Some(pool.get());
        let r = t.run(&l, 7, true, &read, &|_| false, || {
            pool.set(GraphReading {
                reserved: 258 * MB,
                used: 256 * MB,
            });
            CUDA_SUCCESS
        });
        assert_eq!(r, Ok(CUDA_SUCCESS));
        assert_eq!(l.used(0, UsageKind::Pool), 258 * MB, "the driver's figure");
        // The allocation freed, then the pool trimmed.
        pool.set(GraphReading::default());
        t.refresh(&l, 0, &read, &|_| false);
        assert_eq!(l.used(0, UsageKind::Pool), 0);
    }

    #[test]
    fn room_in_the_pool_needs_no_admission() {
        let l = MemLedger::with_limit(0, 1024 * MB);
        let t = GraphTable::default();
        t.note_exec(7, need(0, 600 * MB, 0, false));
        let pool = GraphReading {
            reserved: 600 * MB,
            used: 0,
        };
        // Charged what the pool holds, then the launch needs nothing more although
        // 600 + 600 would not fit.
        let r = t.run(&l, 7, true, &|_| Some(pool), &|_| false, || CUDA_SUCCESS);
        assert_eq!(r, Ok(CUDA_SUCCESS));
        assert_eq!(l.used(0, UsageKind::Pool), 600 * MB);
    }

    #[test]
    fn an_auto_free_relaunch_counts_what_it_frees() {
        let l = MemLedger::with_limit(0, 1024 * MB);
        let t = GraphTable::default();
        t.note_exec(7, need(0, 700 * MB, 700 * MB, true));
        let pool = Cell::new(GraphReading::default());
        let read = |_| Some(pool.get());
        let launch = || {
            pool.set(GraphReading {
                reserved: 700 * MB,
                used: 700 * MB,
            });
            CUDA_SUCCESS
        };
        assert_eq!(
            t.run(&l, 7, true, &read, &|_| false, launch),
            Ok(CUDA_SUCCESS)
        );
        assert_eq!(
            t.run(&l, 7, true, &read, &|_| false, launch),
            Ok(CUDA_SUCCESS)
        );
        assert_eq!(l.used(0, UsageKind::Pool), 700 * MB);
    }

    #[test]
    fn a_failed_launch_without_readings_gives_the_admission_back() {
        let l = MemLedger::with_limit(0, 1024 * MB);
        let t = GraphTable::default();
        t.note_exec(7, need(0, 100 * MB, 100 * MB, false));
        let r = t.run(&l, 7, true, &|_| None, &|_| false, || 1);
        assert_eq!(r, Ok(1));
        assert_eq!(l.used(0, UsageKind::Pool), 0);
        let r = t.run(&l, 7, true, &|_| None, &|_| false, || CUDA_SUCCESS);
        assert_eq!(r, Ok(CUDA_SUCCESS));
        assert_eq!(
            l.used(0, UsageKind::Pool),
            100 * MB,
            "kept: nothing better known"
        );
    }

    #[test]
    fn captured_allocations_charged_as_data_are_not_charged_twice() {
        let l = MemLedger::with_limit(0, 1024 * MB);
        let t = GraphTable::default();
        t.note_exec(
            7,
            ExecNeed {
                captured: vec![(0, 0xabc, 300 * MB)],
                ..ExecNeed::default()
            },
        );
        let read = |_| {
            Some(GraphReading {
                reserved: 300 * MB,
                used: 300 * MB,
            })
        };
        t.refresh(&l, 0, &read, &|p| p == 0xabc);
        assert_eq!(l.used(0, UsageKind::Pool), 0, "still charged as data");
        t.refresh(&l, 0, &read, &|_| false);
        assert_eq!(l.used(0, UsageKind::Pool), 300 * MB, "the data charge went");
    }

    #[test]
    fn graphs_without_memory_nodes_cost_one_load() {
        let t = GraphTable::default();
        assert!(!t.any());
        t.note_exec(1, ExecNeed::default());
        assert!(!t.any());
        t.note_exec(2, need(0, MB, 0, false));
        assert!(t.any());
        assert_eq!(t.forget_exec(2), vec![0]);
        assert!(!t.any());
    }
}
