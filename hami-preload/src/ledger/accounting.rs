//! Per-process accounting: which driver objects this process holds, how much each was
//! charged, and the charge / call / record sequence around every allocation and release.
//!
//! Plain Rust, unit-tested with closures standing in for the driver and a [`Ledger`] (the
//! shared region in the library; an in-memory ledger or a region in a temp dir in tests).
//!
//! Rules:
//! * Charge *before* calling the driver (exact admission, so no interleaving over-grants);
//!   uncharge if the driver fails.
//! * Release: take the entry out of the table first, call the driver, uncharge only if the
//!   driver succeeded (put the entry back otherwise). An object we never tracked (or already
//!   released: a double free) goes straight to the driver, whose error code is returned.
//! * A context's destruction takes its objects with it ([`Accounts::drop_context`]). A call in
//!   flight meanwhile holds an object the sweep cannot see (an allocation not yet recorded, a
//!   release that took the entry out): it asks the [`Graveyard`] whether the object's
//!   context was destroyed after the object was made, and if so uncharges it instead of
//!   recording it (again).

use crate::ffi::cuda::{CUresult, CUDA_ERROR_OUT_OF_MEMORY, CUDA_SUCCESS};
use crate::ledger::ctx_devices::CtxDevices;
use crate::ledger::keymap::{self, KeyMap};
use crate::ledger::spin::{SpinGuard, SpinLock};
use hami_abi::layout::UsageKind;
use hami_common::region::{Denied, DenyReason, RegionError};
use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, PoisonError};

/// Why a charge was refused. Plain values (no allocation on the refusal path); the message
/// is written by `Display`, only when a log line is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Deny {
    /// The region refused it (over the limit, invalid configuration, ...).
    #[error("{0}")]
    Region(Denied),
    /// The device's limit variable in this process's environment is invalid.
    #[error("device {0}: this process's memory limit configuration is invalid (see the error logged at start): allocations refused")]
    LocalConfig(usize),
    /// The shared region could not be opened (the reason, as logged at start).
    #[error("shared region unavailable ({0}): allocations refused")]
    NoRegion(&'static str),
    /// The process could not get a slot in the region at `region`.
    #[error("cannot register in the shared region {} ({why}): allocations refused", region.display())]
    NoSlot {
        /// Why.
        why: NoSlot,
        /// The region file.
        region: &'static Path,
    },
    /// The process's CUDA device `.0` is not one of the container's devices the region knows
    /// (`docs/shared-region.md`, "Which device"), and the container has limits: fail closed.
    #[error("CUDA device {0} is not a device of the container the shared region knows (CUDA_VISIBLE_DEVICES names it by a UUID no process that sees it by index, or sees every device, has recorded): allocations on it refused")]
    UnknownDevice(usize),
    /// The process is exiting: its slot is being released.
    #[error("process is exiting: allocations refused")]
    Exiting,
}

impl Deny {
    /// Whether this is a plain "over the quota" refusal (as opposed to failing closed).
    pub fn is_over_limit(&self) -> bool {
        matches!(self, Deny::Region(d) if d.reason == DenyReason::OverLimit)
    }
}

/// Why registering in the region failed (see [`Deny::NoSlot`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum NoSlot {
    /// Every slot is held by a live process.
    #[error(
        "all {} process slots are held by live processes",
        hami_abi::layout::MAX_SLOTS
    )]
    Full,
    /// The region lock is unusable.
    #[error("its lock is unusable")]
    LockFailed,
    /// The region lock was not acquired within `HAMI_LOCK_TIMEOUT_MS` (its holder is
    /// stopped or starved); the next call tries again.
    #[error("its lock was not acquired within the lock timeout (HAMI_LOCK_TIMEOUT_MS): its holder is stopped or starved")]
    LockTimeout,
    /// The region cannot be written.
    #[error("it is not writable")]
    ReadOnly,
    /// Another I/O error (logged at debug level when it happens).
    #[error("I/O error: {0}")]
    Io(std::io::ErrorKind),
}

impl NoSlot {
    /// The kind of a registration error.
    pub fn of(e: &RegionError) -> NoSlot {
        match e {
            RegionError::Full { .. } => NoSlot::Full,
            RegionError::Lock { .. } => NoSlot::LockFailed,
            RegionError::LockTimeout { .. } => NoSlot::LockTimeout,
            RegionError::ReadOnly { .. } => NoSlot::ReadOnly,
            RegionError::Io { source, .. } => NoSlot::Io(source.kind()),
            _ => NoSlot::Io(std::io::ErrorKind::Other),
        }
    }
}

/// Where charges go.
pub trait Ledger {
    /// Charges `bytes` if the limit allows it.
    fn try_charge(&self, dev: usize, kind: UsageKind, bytes: u64) -> Result<(), Deny>;
    /// Charges `bytes` regardless of the limit (memory the driver already took).
    fn force_charge(&self, dev: usize, kind: UsageKind, bytes: u64);
    /// Releases `bytes` (saturating).
    fn uncharge(&self, dev: usize, kind: UsageKind, bytes: u64);
}

/// Namespace of a tracked key: the table's [`KeySpace`] (`hami_abi::intercept`), shared
/// with the agent.
pub use hami_abi::intercept::KeySpace;

/// One tracked object: what it charged, where.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tracked {
    /// Device ordinal charged.
    pub dev: usize,
    /// Kind charged.
    pub kind: UsageKind,
    /// Bytes charged.
    pub bytes: u64,
    /// Context the object belongs to (0 = none: freed only explicitly).
    pub ctx: usize,
    /// The [`Graveyard`]'s stamp before the object was made: a destruction of `ctx` stamped
    /// later took the object with it.
    pub born: u32,
}

const SHARDS: usize = 16;

/// Whether stamp `a` comes before stamp `b` (wrapping counters: within 2^31 steps).
fn precedes(a: u32, b: u32) -> bool {
    (1..=i32::MAX as u32).contains(&b.wrapping_sub(a))
}

/// A tracked object's identity: its namespace and its key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Key(KeySpace, u64);

impl Key {
    /// The namespace as the map's small integer.
    #[inline]
    fn space(self) -> u8 {
        self.0 as u8
    }
}

/// Tracked objects by key.
type Map = KeyMap<Tracked>;

/// How many records of each kind a shard keeps for racing frees (see [`Shard`]).
const RACE_RECORDS: usize = 4;

/// One shard of the table.
///
/// Two threads freeing the same key at once (an application error, but the region must stay
/// exact): one takes the entry, the other finds none and goes to the driver; exactly one
/// driver call succeeds. If the one without the entry succeeds, the other's call fails and
/// would put the entry back (a leak). So the rare paths leave records: a successful free of
/// an untracked key notes the key in `freed`, where a refused free finds it and uncharges
/// instead of putting its entry back; a refused free that did put its entry back counts and
/// notes it in `reinserted`, where the successful free, looking after it, finds it and
/// releases the entry. Inserting a key (a new allocation) clears its records. The common
/// paths only read.
#[derive(Default)]
struct Shard {
    map: Map,
    /// Entries put back after a refused free, wrapping (stamps of `reinserted`).
    reinserts: u32,
    /// Keys whose untracked free succeeded, most recent last.
    freed: Vec<Key>,
    /// Keys put back after a refused free, with their stamp, most recent last.
    reinserted: Vec<(Key, u32)>,
}

impl Shard {
    /// Records `item` in `list`, keeping the most recent [`RACE_RECORDS`].
    fn note<T>(list: &mut Vec<T>, item: T) {
        if list.len() == RACE_RECORDS {
            list.remove(0);
        }
        list.push(item);
    }
}

/// How many context destructions the [`Graveyard`] remembers.
const GRAVES: usize = 16;

/// The contexts destroyed most recently, each with a stamp from a counter that every
/// destruction advances ([`Accounts::drop_context`], called by every path that destroys a
/// context, under the context table's lock, after the driver succeeded).
///
/// An allocation reads the stamp ([`Graveyard::stamp`]) before calling the driver and keeps
/// it with its entry; whoever is about to record the entry (the allocation itself, or a
/// release the driver refused, putting it back) asks [`Graveyard::destroyed_since`] under the
/// entry's shard lock. A destruction of the entry's context stamped later took the object
/// with it: the entry's context was alive when the object was made (the driver made it there),
/// and a new context reusing the handle cannot be created before the destruction is stamped
/// (creation takes the same lock), so an allocation in such a new context reads a later stamp.
/// Reading the counter costs one atomic load; the list is locked only when it moved.
///
/// A call during which more than [`GRAVES`] contexts were destroyed may miss its context's
/// destruction (then its object stays charged, as before this record existed).
#[derive(Default)]
pub struct Graveyard {
    stamp: AtomicU32,
    recent: Mutex<Vec<(usize, u32)>>,
}

impl Graveyard {
    /// The current stamp (take it before the driver call that makes an object).
    #[inline]
    pub fn stamp(&self) -> u32 {
        self.stamp.load(Ordering::Acquire)
    }

    /// Whether context `ctx` was destroyed after stamp `born` was read.
    #[inline]
    pub fn destroyed_since(&self, ctx: usize, born: u32) -> bool {
        ctx != 0 && self.stamp() != born && self.recorded_since(ctx, born)
    }

    #[cold]
    fn recorded_since(&self, ctx: usize, born: u32) -> bool {
        let g = self.recent.lock().unwrap_or_else(PoisonError::into_inner);
        g.iter().any(|&(c, s)| c == ctx && precedes(born, s))
    }

    /// Records the destruction of `ctx` (before its objects are swept).
    fn bury(&self, ctx: usize) {
        let mut g = self.recent.lock().unwrap_or_else(PoisonError::into_inner);
        let s = self.stamp.load(Ordering::Relaxed).wrapping_add(1);
        if g.len() == GRAVES {
            g.remove(0);
        }
        g.push((ctx, s));
        self.stamp.store(s, Ordering::Release);
    }
}

/// The table of tracked objects, sharded to keep threads from contending. Each shard's lock
/// is a [`SpinLock`]: its sections only look up, insert or remove a few entries (and, rarely,
/// ask the [`Graveyard`], whose lock is held for a few stores and never while taking a shard's).
pub struct Accounts {
    shards: [SpinLock<Shard>; SHARDS],
    /// Context → device cache of the allocation path, emptied by [`Accounts::drop_context`].
    pub ctx_devices: CtxDevices,
    /// Contexts destroyed recently, for the calls in flight meanwhile (also the module
    /// table's, [`crate::objects::module_memory`]).
    pub graveyard: Graveyard,
}

impl Default for Accounts {
    fn default() -> Self {
        Accounts {
            shards: std::array::from_fn(|_| SpinLock::new(Shard::default())),
            ctx_devices: CtxDevices::default(),
            graveyard: Graveyard::default(),
        }
    }
}

fn shard_of(key: u64) -> usize {
    // Device pointers are at least 256-byte aligned: mix the higher bits. (The maps inside
    // the shards use the bits below these four.)
    let h = key.wrapping_mul(keymap::MIX);
    (h >> 60) as usize % SHARDS
}

/// What an allocating driver call produced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Allocated {
    /// The key the object is released by.
    pub key: u64,
    /// Bytes it really takes (may differ from the estimate charged first).
    pub bytes: u64,
}

impl Accounts {
    #[inline]
    fn shard(&self, key: u64) -> SpinGuard<'_, Shard> {
        self.shards[shard_of(key)].lock()
    }

    /// Number of tracked objects.
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().map.len()).sum()
    }

    /// Whether nothing is tracked.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The entry for `key`, if tracked.
    pub fn get(&self, ns: KeySpace, key: u64) -> Option<Tracked> {
        self.shard(key).map.get(ns as u8, key)
    }

    /// Charges `estimate` bytes of data on `dev`, runs the driver `call`, and records what it
    /// returned. If the driver's real size is larger than the estimate, the difference is
    /// charged too; if that is refused, `undo` releases the object and OOM is returned. An
    /// object whose context `ctx` was destroyed meanwhile (with it) is uncharged, not recorded.
    ///
    /// Returns the driver's error, [`CUDA_ERROR_OUT_OF_MEMORY`] on a refused charge, or
    /// [`CUDA_SUCCESS`].
    #[allow(clippy::too_many_arguments)]
    pub fn alloc<L: Ledger + ?Sized>(
        &self,
        ledger: &L,
        ns: KeySpace,
        dev: usize,
        ctx: usize,
        estimate: u64,
        call: impl FnOnce() -> Result<Allocated, CUresult>,
        undo: impl FnOnce(u64),
    ) -> Result<(), AllocError> {
        let born = self.graveyard.stamp();
        ledger
            .try_charge(dev, UsageKind::Data, estimate)
            .map_err(AllocError::Denied)?;
        let got = match call() {
            Ok(a) => a,
            Err(e) => {
                ledger.uncharge(dev, UsageKind::Data, estimate);
                return Err(AllocError::Driver(e));
            }
        };
        if got.bytes > estimate {
            if let Err(d) = ledger.try_charge(dev, UsageKind::Data, got.bytes - estimate) {
                undo(got.key);
                ledger.uncharge(dev, UsageKind::Data, estimate);
                return Err(AllocError::Denied(d));
            }
        } else if got.bytes < estimate {
            ledger.uncharge(dev, UsageKind::Data, estimate - got.bytes);
        }
        let entry = Tracked {
            dev,
            kind: UsageKind::Data,
            bytes: got.bytes,
            ctx,
            born,
        };
        let (stale, gone) = {
            let mut s = self.shard(got.key);
            let key = Key(ns, got.key);
            if !s.freed.is_empty() {
                s.freed.retain(|k| *k != key);
            }
            // Under the shard lock: a destruction not seen here sweeps this shard later.
            let gone = self.graveyard.destroyed_since(ctx, born);
            let old = if gone {
                s.map.remove(key.space(), key.1)
            } else {
                s.map.insert(key.space(), key.1, entry)
            };
            if old.is_some() && !s.reinserted.is_empty() {
                s.reinserted.retain(|(k, _)| *k != key);
            }
            (old, gone)
        };
        if let Some(old) = stale {
            // The driver handed out a key we still tracked: the old object is gone (released
            // by a path we do not see, e.g. a context torn down) and must not stay charged.
            ledger.uncharge(old.dev, old.kind, old.bytes);
        }
        if gone {
            // Its context was destroyed (and the object with it) before it could be recorded.
            ledger.uncharge(dev, UsageKind::Data, got.bytes);
        }
        Ok(())
    }

    /// Releases `key`: the driver `call` decides; on success the charge is released. An
    /// untracked key (unknown, or a double free) goes to the driver and its result is
    /// returned untouched. Two threads freeing the same key at once uncharge it once (see
    /// [`Shard`]).
    pub fn free<L: Ledger + ?Sized>(
        &self,
        ledger: &L,
        ns: KeySpace,
        key: u64,
        call: impl FnOnce() -> CUresult,
    ) -> CUresult {
        let (taken, start) = {
            let mut s = self.shard(key);
            (s.map.remove(ns as u8, key), s.reinserts)
        };
        let r = call();
        match taken {
            Some(e) if r == CUDA_SUCCESS => ledger.uncharge(e.dev, e.kind, e.bytes),
            Some(e) => self.free_refused(ledger, Key(ns, key), e),
            None if r == CUDA_SUCCESS => self.untracked_freed(ledger, Key(ns, key), start),
            None => {}
        }
        r
    }

    /// The driver refused to free tracked `key` (entry `e`): put the entry back, unless
    /// another thread's free of the key succeeded meanwhile (see [`Shard`]) or the object's
    /// context was destroyed since it was made (the object went with it; the sweep did not
    /// see the entry, which this free held).
    #[cold]
    fn free_refused<L: Ledger + ?Sized>(&self, ledger: &L, key: Key, e: Tracked) {
        let mut s = self.shard(key.1);
        if let Some(i) = s.freed.iter().position(|k| *k == key) {
            // Freed meanwhile by another thread's call: gone.
            s.freed.remove(i);
            drop(s);
            ledger.uncharge(e.dev, e.kind, e.bytes);
        } else if self.graveyard.destroyed_since(e.ctx, e.born) {
            // Under the shard lock: a destruction not seen here sweeps this shard later and
            // finds the entry put back.
            drop(s);
            ledger.uncharge(e.dev, e.kind, e.bytes);
        } else {
            // Still allocated, as far as we know: nobody else can have been given the key.
            s.map.insert(key.space(), key.1, e);
            s.reinserts = s.reinserts.wrapping_add(1);
            let stamp = s.reinserts;
            Shard::note(&mut s.reinserted, (key, stamp));
        }
    }

    /// The driver freed `key`, untracked when the free began (`start`: the shard's
    /// re-insertion count then). An entry another thread put back since, after its own free
    /// of the key was refused, is this object's: released here. Otherwise the key is noted
    /// for such a free still in flight (see [`Shard`]).
    #[cold]
    fn untracked_freed<L: Ledger + ?Sized>(&self, ledger: &L, key: Key, start: u32) {
        let mut s = self.shard(key.1);
        let put_back = s
            .reinserted
            .iter()
            .position(|&(k, stamp)| k == key && precedes(start, stamp));
        match put_back {
            Some(i) if s.map.contains(key.space(), key.1) => {
                s.reinserted.remove(i);
                let e = s.map.remove(key.space(), key.1);
                drop(s);
                if let Some(e) = e {
                    ledger.uncharge(e.dev, e.kind, e.bytes);
                }
            }
            _ => Shard::note(&mut s.freed, key),
        }
    }

    /// Forgets every object of context `ctx` (the driver destroyed them with the context)
    /// and releases their charges. Returns how many there were. Every path that destroys a
    /// context calls this (under the context table's lock, after the driver succeeded); it
    /// also empties the context → device cache (the handle may be reused by a context on
    /// another device) and records the destruction in the [`Graveyard`] first, for the
    /// objects calls in flight hold.
    pub fn drop_context<L: Ledger + ?Sized>(&self, ledger: &L, ctx: usize) -> usize {
        self.ctx_devices.invalidate();
        if ctx == 0 {
            return 0;
        }
        self.graveyard.bury(ctx);
        let mut n = 0;
        for s in &self.shards {
            let gone: Vec<Tracked> = {
                let mut g = s.lock();
                let keys: Vec<(u8, u64)> = g
                    .map
                    .iter()
                    .filter(|(_, _, e)| e.ctx == ctx)
                    .map(|(space, key, _)| (space, key))
                    .collect();
                keys.iter()
                    .filter_map(|&(space, key)| g.map.remove(space, key))
                    .collect()
            };
            for e in gone {
                ledger.uncharge(e.dev, e.kind, e.bytes);
                n += 1;
            }
        }
        n
    }
}

/// Why an allocation failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AllocError {
    /// The charge was refused.
    Denied(Deny),
    /// The driver failed (its code).
    Driver(CUresult),
}

impl AllocError {
    /// The `CUresult` to return to the application.
    pub fn code(&self) -> CUresult {
        match self {
            AllocError::Denied(_) => CUDA_ERROR_OUT_OF_MEMORY,
            AllocError::Driver(e) => *e,
        }
    }
}

/// An in-memory [`Ledger`] with per-device limits, for tests and benchmarks.
#[derive(Default)]
pub struct MemLedger {
    inner: Mutex<MemLedgerInner>,
}

#[derive(Default)]
struct MemLedgerInner {
    limits: HashMap<usize, u64>,
    used: HashMap<(usize, usize), u64>,
}

impl MemLedger {
    /// A ledger with `limit` on device `dev`.
    pub fn with_limit(dev: usize, limit: u64) -> MemLedger {
        let l = MemLedger::default();
        l.inner
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .limits
            .insert(dev, limit);
        l
    }

    /// Bytes of `kind` charged on `dev`.
    pub fn used(&self, dev: usize, kind: UsageKind) -> u64 {
        let g = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        g.used.get(&(dev, kind.index())).copied().unwrap_or(0)
    }

    /// Bytes of every kind charged on `dev`.
    pub fn total(&self, dev: usize) -> u64 {
        UsageKind::ALL.iter().map(|&k| self.used(dev, k)).sum()
    }
}

impl Ledger for MemLedger {
    fn try_charge(&self, dev: usize, kind: UsageKind, bytes: u64) -> Result<(), Deny> {
        let mut g = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        let total: u64 = UsageKind::ALL
            .iter()
            .map(|k| g.used.get(&(dev, k.index())).copied().unwrap_or(0))
            .sum();
        let limit = g.limits.get(&dev).copied().unwrap_or(0);
        if limit != 0 && total.saturating_add(bytes) > limit {
            return Err(Deny::Region(Denied {
                reason: DenyReason::OverLimit,
                dev,
                limit,
                used: total,
                requested: bytes,
            }));
        }
        *g.used.entry((dev, kind.index())).or_default() += bytes;
        Ok(())
    }

    fn force_charge(&self, dev: usize, kind: UsageKind, bytes: u64) {
        let mut g = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        *g.used.entry((dev, kind.index())).or_default() += bytes;
    }

    fn uncharge(&self, dev: usize, kind: UsageKind, bytes: u64) {
        let mut g = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        let u = g.used.entry((dev, kind.index())).or_default();
        *u = u.saturating_sub(bytes);
    }
}

#[cfg(test)]
mod tests;
