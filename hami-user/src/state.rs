//! Per-process live allocations built from the probes' events.
//!
//! [`Processes::apply`] is the whole event logic: allocations are keyed by what frees them
//! (device pointer, `cuMemCreate` handle, `CUarray`), frees look the size up, context events
//! teach which device a context belongs to, context destruction drops the memory the driver
//! frees with it, and a process-exit event drops the process.

use std::collections::{BTreeMap, HashMap};

use hami_abi::event::{Event, EventKind};
use hami_abi::intercept::KeySpace;
use serde::Serialize;

/// One live allocation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Alloc {
    /// Bytes.
    pub size: u64,
    /// The call that made it.
    #[serde(skip)]
    pub kind: EventKind,
    /// Device ordinal, when the allocation's context is known.
    pub device: Option<u32>,
    /// Context current at allocation (0 = unknown).
    pub ctx: u64,
}

/// How much of a process's life the agent saw.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Baseline {
    /// The process started while the agent was watching: every allocation was observed.
    ObservedFromStart,
    /// The process was running before the agent attached: allocations made before then were
    /// not observed. `nvml_bytes` is its NVML used memory when the agent started, if known.
    PreExisting {
        /// NVML per-process used memory at baseline time.
        nvml_bytes: Option<u64>,
    },
    /// The process started after the agent, but loaded a libcuda the agent had not probed
    /// yet (found by discovery afterwards): its allocations before the attach were missed.
    AttachedLate {
        /// NVML per-process used memory at baseline time.
        nvml_bytes: Option<u64>,
    },
}

impl Baseline {
    /// Whether the agent may have missed allocations of this process.
    pub fn is_pre_existing(&self) -> bool {
        matches!(
            self,
            Baseline::PreExisting { .. } | Baseline::AttachedLate { .. }
        )
    }

    /// NVML used memory at baseline time, if any.
    pub fn nvml_bytes(&self) -> Option<u64> {
        match *self {
            Baseline::ObservedFromStart => None,
            Baseline::PreExisting { nvml_bytes } | Baseline::AttachedLate { nvml_bytes } => {
                nvml_bytes
            }
        }
    }
}

/// One process as seen through events.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ProcState {
    /// Host pid.
    pub pid: u32,
    /// Baseline.
    pub baseline: Baseline,
    /// Live allocations.
    #[serde(skip)]
    pub allocs: HashMap<(KeySpace, u64), Alloc>,
    /// Context -> device ordinal.
    #[serde(skip)]
    pub ctx_device: HashMap<u64, u32>,
    /// Primary context retain count per device (as observed).
    #[serde(skip)]
    pub primary: HashMap<u32, (u64, u32)>,
    /// Thread -> current context (fallback when an event carries no context).
    #[serde(skip)]
    pub thread_ctx: HashMap<u32, u64>,
    /// Successful allocation events seen.
    pub alloc_events: u64,
    /// Successful free events seen.
    pub free_events: u64,
    /// Frees of something the agent never saw allocated (pre-existing, or missed).
    pub unmatched_frees: u64,
    /// Allocations whose key was already live (a free was missed).
    pub replaced: u64,
    /// Largest live total seen.
    pub peak_bytes: u64,
    /// Live bytes right now (kept in step with `allocs`).
    pub live_bytes: u64,
    /// `ts_ns` of the first and last event.
    pub first_ns: u64,
    /// `ts_ns` of the last event.
    pub last_ns: u64,
    /// Events of this process may have been dropped (the ring buffer was full): its live
    /// allocations may hold phantoms (lost frees) or miss some (lost allocations) until it
    /// is rebuilt ([`Processes::rebuild`]).
    pub events_lost: bool,
    /// Memory events older than this (`ts_ns`, `CLOCK_MONOTONIC`) are already reflected in
    /// the figures the process was rebuilt from: ignored.
    pub rebuilt_at_ns: u64,
}

impl ProcState {
    /// A process with no allocations yet.
    pub fn new(pid: u32, baseline: Baseline) -> ProcState {
        ProcState {
            pid,
            baseline,
            allocs: HashMap::new(),
            ctx_device: HashMap::new(),
            primary: HashMap::new(),
            thread_ctx: HashMap::new(),
            alloc_events: 0,
            free_events: 0,
            unmatched_frees: 0,
            replaced: 0,
            peak_bytes: 0,
            live_bytes: 0,
            first_ns: 0,
            last_ns: 0,
            events_lost: false,
            rebuilt_at_ns: 0,
        }
    }

    /// Live bytes per device (`None` = device unknown).
    pub fn by_device(&self) -> BTreeMap<Option<u32>, u64> {
        let mut m = BTreeMap::new();
        for a in self.allocs.values() {
            *m.entry(a.device).or_insert(0u64) += a.size;
        }
        m
    }

    /// Number of live allocations.
    pub fn live_count(&self) -> usize {
        self.allocs.len()
    }

    fn insert(&mut self, key: (KeySpace, u64), a: Alloc) {
        if let Some(old) = self.allocs.insert(key, a) {
            self.replaced += 1;
            self.live_bytes = self.live_bytes.saturating_sub(old.size);
        }
        self.live_bytes = self.live_bytes.saturating_add(a.size);
        self.peak_bytes = self.peak_bytes.max(self.live_bytes);
    }

    fn remove(&mut self, key: (KeySpace, u64)) -> Option<Alloc> {
        let a = self.allocs.remove(&key)?;
        self.live_bytes = self.live_bytes.saturating_sub(a.size);
        Some(a)
    }

    /// Drops every allocation made in `ctx` (the driver frees them with the context).
    fn drop_ctx(&mut self, ctx: u64) -> u64 {
        if ctx == 0 {
            return 0;
        }
        let keys: Vec<_> = self
            .allocs
            .iter()
            .filter(|(_, a)| a.ctx == ctx)
            .map(|(k, _)| *k)
            .collect();
        let mut freed = 0;
        for k in keys {
            if let Some(a) = self.remove(k) {
                freed += a.size;
            }
        }
        freed
    }

    fn device_of(&self, ctx: u64) -> Option<u32> {
        self.ctx_device.get(&ctx).copied()
    }
}

/// What [`Processes::apply`] did with an event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Applied {
    /// A new allocation (bytes).
    Alloc(u64),
    /// A matched free (bytes).
    Free(u64),
    /// A free of something never seen allocated.
    UnmatchedFree,
    /// A context event (device attribution; `u64` = bytes dropped with a destroyed context).
    Context(u64),
    /// The process exited and was dropped (its live bytes at exit).
    Exit(u64),
    /// Unknown kind or an exit of an untracked process.
    Ignored,
}

/// All processes seen through events.
#[derive(Debug, Default)]
pub struct Processes {
    procs: BTreeMap<u32, ProcState>,
}

impl Processes {
    /// No processes.
    pub fn new() -> Processes {
        Processes::default()
    }

    /// Records a process that was running before the agent attached.
    pub fn baseline(&mut self, pid: u32, nvml_bytes: Option<u64>) {
        self.procs.insert(
            pid,
            ProcState::new(pid, Baseline::PreExisting { nvml_bytes }),
        );
    }

    /// Records a process with the given baseline (replacing nothing: a tracked process is
    /// left as it is).
    pub fn baseline_as(&mut self, pid: u32, baseline: Baseline) {
        self.procs
            .entry(pid)
            .or_insert_with(|| ProcState::new(pid, baseline));
    }

    /// A tracked process.
    pub fn get(&self, pid: u32) -> Option<&ProcState> {
        self.procs.get(&pid)
    }

    /// All tracked processes, by pid.
    pub fn iter(&self) -> impl Iterator<Item = &ProcState> {
        self.procs.values()
    }

    /// Number of tracked processes.
    pub fn len(&self) -> usize {
        self.procs.len()
    }

    /// Whether no process is tracked.
    pub fn is_empty(&self) -> bool {
        self.procs.is_empty()
    }

    /// Forgets a process (it exited, or its pid now belongs to another process).
    pub fn remove(&mut self, pid: u32) -> Option<ProcState> {
        self.procs.remove(&pid)
    }

    /// Marks `pid` as having possibly lost events (no-op for an untracked pid).
    pub fn mark_events_lost(&mut self, pid: u32) {
        if let Some(p) = self.procs.get_mut(&pid) {
            p.events_lost = true;
        }
    }

    /// Marks every tracked process as having possibly lost events (the ring buffer does not
    /// say whose events it dropped).
    pub fn mark_all_events_lost(&mut self) {
        for p in self.procs.values_mut() {
            p.events_lost = true;
        }
    }

    /// Rebuilds a process whose events were lost, at a moment when its true live data is
    /// known to be zero (its region slot accounts no data): its live allocations are
    /// cleared, memory events stamped before `now_ns` (`CLOCK_MONOTONIC`, the clock of
    /// `ts_ns`) are ignored from now on (still queued, already reflected), and the mark goes.
    pub fn rebuild(&mut self, pid: u32, now_ns: u64) {
        if let Some(p) = self.procs.get_mut(&pid) {
            p.allocs.clear();
            p.live_bytes = 0;
            p.rebuilt_at_ns = now_ns;
            p.events_lost = false;
        }
    }

    /// Applies one event.
    pub fn apply(&mut self, ev: &Event) -> Applied {
        let kind = ev.kind;
        if kind == EventKind::ProcessExit {
            return match self.procs.remove(&ev.tgid) {
                Some(p) => Applied::Exit(p.live_bytes),
                None => Applied::Ignored,
            };
        }
        let p = self
            .procs
            .entry(ev.tgid)
            .or_insert_with(|| ProcState::new(ev.tgid, Baseline::ObservedFromStart));
        if p.first_ns == 0 {
            p.first_ns = ev.ts_ns;
        }
        p.last_ns = p.last_ns.max(ev.ts_ns);
        let ctx = if ev.ctx != 0 {
            ev.ctx
        } else {
            p.thread_ctx.get(&ev.tid).copied().unwrap_or(0)
        };
        if (kind.is_alloc() || kind.is_free()) && ev.ts_ns < p.rebuilt_at_ns {
            // Made before the process was rebuilt: already reflected in its figures.
            return Applied::Ignored;
        }
        if kind.is_alloc() {
            let Some(space) = ev.key_space() else {
                return Applied::Ignored;
            };
            p.alloc_events += 1;
            let a = Alloc {
                size: ev.size,
                kind,
                device: p.device_of(ctx),
                ctx,
            };
            p.insert((space, ev.addr), a);
            return Applied::Alloc(ev.size);
        }
        if kind.is_free() {
            let Some(space) = ev.key_space() else {
                return Applied::Ignored;
            };
            p.free_events += 1;
            return match p.remove((space, ev.addr)) {
                Some(a) => Applied::Free(a.size),
                None => {
                    p.unmatched_frees += 1;
                    Applied::UnmatchedFree
                }
            };
        }
        match kind {
            EventKind::PrimaryCtxRetain => {
                let dev = ev.extra as u32;
                p.ctx_device.insert(ev.addr, dev);
                let e = p.primary.entry(dev).or_insert((ev.addr, 0));
                e.0 = ev.addr;
                e.1 += 1;
                p.thread_ctx.entry(ev.tid).or_insert(ev.addr);
                Applied::Context(0)
            }
            EventKind::PrimaryCtxRelease => {
                // The primary context is reset (its memory freed) when the last reference
                // goes. Only act on references the agent saw taken.
                let dev = ev.extra as u32;
                let mut freed = 0;
                if let Some((pctx, refs)) = p.primary.get_mut(&dev) {
                    *refs = refs.saturating_sub(1);
                    if *refs == 0 {
                        let pctx = *pctx;
                        p.primary.remove(&dev);
                        freed = p.drop_ctx(pctx);
                    }
                }
                Applied::Context(freed)
            }
            EventKind::CtxCreate => {
                // `extra` carries the device ordinal when the probe read it.
                p.ctx_device.insert(ev.addr, ev.extra as u32);
                p.thread_ctx.insert(ev.tid, ev.addr);
                Applied::Context(0)
            }
            EventKind::CtxDestroy => {
                let freed = p.drop_ctx(ev.addr);
                p.ctx_device.remove(&ev.addr);
                p.thread_ctx.retain(|_, c| *c != ev.addr);
                Applied::Context(freed)
            }
            EventKind::CtxSetCurrent => {
                p.thread_ctx.insert(ev.tid, ev.addr);
                Applied::Context(0)
            }
            _ => Applied::Ignored,
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn ev(kind: EventKind, pid: u32, size: u64, addr: u64, ctx: u64) -> Event {
        Event {
            tgid: pid,
            tid: pid,
            ts_ns: 1,
            size,
            addr,
            ctx,
            ..Event::new(kind)
        }
    }

    #[test]
    fn alloc_free_pairing_by_key_space() {
        let mut ps = Processes::new();
        assert_eq!(
            ps.apply(&ev(EventKind::MemAlloc, 10, 100, 0xa000, 0)),
            Applied::Alloc(100)
        );
        // A handle with the same numeric value as the pointer is a different allocation.
        assert_eq!(
            ps.apply(&ev(EventKind::MemCreate, 10, 50, 0xa000, 0)),
            Applied::Alloc(50)
        );
        ps.apply(&ev(EventKind::ArrayCreate, 10, 7, 0xb, 0));
        assert_eq!(ps.get(10).unwrap().live_bytes, 157);
        // cuMemFreeAsync can free a cuMemAlloc pointer (same key space).
        assert_eq!(
            ps.apply(&ev(EventKind::MemFreeAsync, 10, 0, 0xa000, 0)),
            Applied::Free(100)
        );
        assert_eq!(
            ps.apply(&ev(EventKind::MemFree, 10, 0, 0xa000, 0)),
            Applied::UnmatchedFree
        );
        assert_eq!(
            ps.apply(&ev(EventKind::MemRelease, 10, 0, 0xa000, 0)),
            Applied::Free(50)
        );
        assert_eq!(
            ps.apply(&ev(EventKind::ArrayDestroy, 10, 0, 0xb, 0)),
            Applied::Free(7)
        );
        let p = ps.get(10).unwrap();
        assert_eq!(p.live_bytes, 0);
        assert_eq!(p.peak_bytes, 157);
        assert_eq!(p.alloc_events, 3);
        assert_eq!(p.free_events, 4);
        assert_eq!(p.unmatched_frees, 1);
        assert_eq!(p.baseline, Baseline::ObservedFromStart);
    }

    #[test]
    fn a_mipmapped_array_is_released_only_by_its_own_destroy() {
        let mut ps = Processes::new();
        assert_eq!(
            ps.apply(&ev(EventKind::MipmappedArrayCreate, 13, 64, 0xd0, 0)),
            Applied::Alloc(64)
        );
        // An array of the same handle value is another object.
        assert_eq!(
            ps.apply(&ev(EventKind::ArrayDestroy, 13, 0, 0xd0, 0)),
            Applied::UnmatchedFree
        );
        assert_eq!(
            ps.apply(&ev(EventKind::MipmappedArrayDestroy, 13, 0, 0xd0, 0)),
            Applied::Free(64)
        );
        assert_eq!(ps.get(13).unwrap().live_bytes, 0);
    }

    #[test]
    fn exit_drops_process_and_reused_key_counts_replacement() {
        let mut ps = Processes::new();
        ps.apply(&ev(EventKind::MemAlloc, 11, 100, 1, 0));
        ps.apply(&ev(EventKind::MemAlloc, 11, 30, 1, 0));
        let p = ps.get(11).unwrap();
        assert_eq!(p.live_bytes, 30);
        assert_eq!(p.replaced, 1);
        assert_eq!(
            ps.apply(&ev(EventKind::ProcessExit, 11, 0, 0, 0)),
            Applied::Exit(30)
        );
        assert!(ps.get(11).is_none());
        assert_eq!(
            ps.apply(&ev(EventKind::ProcessExit, 11, 0, 0, 0)),
            Applied::Ignored
        );
        assert!(ps.is_empty());
    }

    #[test]
    fn device_attribution_from_contexts() {
        let mut ps = Processes::new();
        let mut r = ev(EventKind::PrimaryCtxRetain, 12, 0, 0xc1, 0);
        r.extra = 1;
        ps.apply(&r);
        let mut c = ev(EventKind::CtxCreate, 12, 0, 0xc2, 0);
        c.extra = 0;
        c.tid = 99;
        ps.apply(&c);
        ps.apply(&ev(EventKind::MemAlloc, 12, 10, 1, 0xc1));
        ps.apply(&ev(EventKind::MemAlloc, 12, 20, 2, 0xc2));
        ps.apply(&ev(EventKind::MemAlloc, 12, 40, 3, 0xdead)); // unknown context
                                                               // No ctx in the event: thread 99's current context (0xc2, device 0).
        let mut t = ev(EventKind::MemAlloc, 12, 80, 4, 0);
        t.tid = 99;
        ps.apply(&t);
        let by = ps.get(12).unwrap().by_device();
        assert_eq!(by.get(&Some(1)), Some(&10));
        assert_eq!(by.get(&Some(0)), Some(&100));
        assert_eq!(by.get(&None), Some(&40));
        // Destroying 0xc2 frees its memory.
        assert_eq!(
            ps.apply(&ev(EventKind::CtxDestroy, 12, 0, 0xc2, 0)),
            Applied::Context(100)
        );
        assert_eq!(ps.get(12).unwrap().live_bytes, 50);
        // Primary context: the release of the last reference frees its memory.
        ps.apply(&r); // second retain
        let mut rel = ev(EventKind::PrimaryCtxRelease, 12, 0, 0, 0);
        rel.extra = 1;
        assert_eq!(ps.apply(&rel), Applied::Context(0));
        assert_eq!(ps.apply(&rel), Applied::Context(10));
        assert_eq!(ps.get(12).unwrap().live_bytes, 40);
        // A release the agent never saw retained does nothing.
        assert_eq!(ps.apply(&rel), Applied::Context(0));
    }

    #[test]
    fn baseline_processes_count_unmatched_frees() {
        let mut ps = Processes::new();
        ps.baseline(20, Some(1 << 20));
        assert_eq!(
            ps.apply(&ev(EventKind::MemFree, 20, 0, 0x55, 0)),
            Applied::UnmatchedFree
        );
        let p = ps.get(20).unwrap();
        assert!(p.baseline.is_pre_existing());
        assert_eq!(p.unmatched_frees, 1);
        // The tracepoint's kind is no allocation: an exit of an untracked process.
        assert_eq!(
            ps.apply(&ev(EventKind::ProcessExit, 21, 0, 0, 0)),
            Applied::Ignored
        );
    }
}
