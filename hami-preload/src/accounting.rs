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

use crate::ctx_devices::CtxDevices;
use crate::cuda::{CUresult, CUDA_ERROR_OUT_OF_MEMORY, CUDA_SUCCESS};
use crate::keymap::{self, KeyMap};
use crate::spin::{SpinGuard, SpinLock};
use hami_common::layout::UsageKind;
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
        hami_common::layout::MAX_SLOTS
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

/// Namespace of a tracked key: the table's [`KeySpace`] (`hami_common::intercept`), shared
/// with the agent.
pub use hami_common::intercept::KeySpace;

/// One tracked object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry {
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
type Map = KeyMap<Entry>;

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
    /// table's, [`crate::module_memory`]).
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
    pub fn get(&self, ns: KeySpace, key: u64) -> Option<Entry> {
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
        let entry = Entry {
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
    fn free_refused<L: Ledger + ?Sized>(&self, ledger: &L, key: Key, e: Entry) {
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
            let gone: Vec<Entry> = {
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
mod tests {
    use super::*;
    use crate::cuda::CUDA_ERROR_INVALID_VALUE;
    use std::cell::Cell;

    const MB: u64 = 1 << 20;

    fn ok(key: u64, bytes: u64) -> impl FnOnce() -> Result<Allocated, CUresult> {
        move || Ok(Allocated { key, bytes })
    }

    /// The log level of a refusal (info for a plain over-limit, error for failing closed)
    /// follows the region's typed reason, not the wording of the message.
    #[test]
    fn over_limit_is_told_by_the_reason_not_the_message() {
        let l = MemLedger::with_limit(1, 100);
        let d = l.try_charge(1, UsageKind::Data, 200).unwrap_err();
        assert_eq!(
            d,
            Deny::Region(Denied {
                reason: DenyReason::OverLimit,
                dev: 1,
                limit: 100,
                used: 0,
                requested: 200,
            })
        );
        assert!(d.is_over_limit());
        assert_eq!(
            d.to_string(),
            "device 1: 200 bytes requested, 0 of 100 bytes in use: over the limit"
        );
        for reason in [
            DenyReason::ConfigInvalid,
            DenyReason::BadDevice,
            DenyReason::SlotLost,
            DenyReason::ReadOnly,
            DenyReason::LockFailed,
        ] {
            let d = Deny::Region(Denied {
                reason,
                dev: 0,
                limit: 1,
                used: 2,
                requested: 3,
            });
            assert!(!d.is_over_limit(), "{reason:?}");
        }
        // Failing closed, whatever the text says.
        assert!(!Deny::NoRegion("quota over the limit").is_over_limit());
        assert!(!Deny::Exiting.is_over_limit());
        assert!(!Deny::LocalConfig(0).is_over_limit());
        let full = Deny::NoSlot {
            why: NoSlot::Full,
            region: Path::new("/tmp/r.cache"),
        };
        assert!(!full.is_over_limit());
        assert_eq!(
            full.to_string(),
            "cannot register in the shared region /tmp/r.cache (all 1024 process slots are \
             held by live processes): allocations refused"
        );
    }

    #[test]
    fn alloc_within_and_over_limit() {
        let l = MemLedger::with_limit(0, 10 * MB);
        let a = Accounts::default();
        assert_eq!(
            a.alloc(
                &l,
                KeySpace::Pointer,
                0,
                1,
                6 * MB,
                ok(0x1000, 6 * MB),
                |_| {}
            ),
            Ok(())
        );
        assert_eq!(l.used(0, UsageKind::Data), 6 * MB);
        let called = Cell::new(false);
        let r = a.alloc(
            &l,
            KeySpace::Pointer,
            0,
            1,
            5 * MB,
            || {
                called.set(true);
                Ok(Allocated {
                    key: 0x2000,
                    bytes: 5 * MB,
                })
            },
            |_| {},
        );
        assert_eq!(
            r.as_ref().map_err(|e| e.code()),
            Err(CUDA_ERROR_OUT_OF_MEMORY)
        );
        assert!(
            !called.get(),
            "the driver must not be called when the charge is refused"
        );
        assert_eq!(l.used(0, UsageKind::Data), 6 * MB);
        assert_eq!(a.len(), 1);
    }

    #[test]
    fn driver_failure_uncharges() {
        let l = MemLedger::with_limit(0, 10 * MB);
        let a = Accounts::default();
        let r = a.alloc(
            &l,
            KeySpace::Pointer,
            0,
            1,
            4 * MB,
            || Err(CUDA_ERROR_OUT_OF_MEMORY),
            |_| {},
        );
        assert_eq!(r, Err(AllocError::Driver(CUDA_ERROR_OUT_OF_MEMORY)));
        assert_eq!(l.total(0), 0);
        assert!(a.is_empty());
    }

    #[test]
    fn larger_real_size_charged_or_undone() {
        let l = MemLedger::with_limit(0, 10 * MB);
        let a = Accounts::default();
        // Pitch: estimate 4 MB, the driver really took 6 MB.
        assert_eq!(
            a.alloc(
                &l,
                KeySpace::Pointer,
                0,
                1,
                4 * MB,
                ok(0x10, 6 * MB),
                |_| {}
            ),
            Ok(())
        );
        assert_eq!(l.total(0), 6 * MB);
        assert_eq!(
            a.get(KeySpace::Pointer, 0x10).map(|e| e.bytes),
            Some(6 * MB)
        );
        // Estimate 3 MB fits (9 MB), the real 5 MB does not: undone, OOM, nothing charged.
        let undone = Cell::new(0u64);
        let r = a.alloc(&l, KeySpace::Pointer, 0, 1, 3 * MB, ok(0x20, 5 * MB), |k| {
            undone.set(k)
        });
        assert_eq!(r.map_err(|e| e.code()), Err(CUDA_ERROR_OUT_OF_MEMORY));
        assert_eq!(undone.get(), 0x20);
        assert_eq!(l.total(0), 6 * MB);
        assert!(a.get(KeySpace::Pointer, 0x20).is_none());
        // Smaller real size: the difference is given back.
        assert_eq!(
            a.alloc(&l, KeySpace::Array, 0, 1, 4 * MB, ok(0x30, 2 * MB), |_| {}),
            Ok(())
        );
        assert_eq!(l.total(0), 8 * MB);
    }

    #[test]
    fn free_tracked_unknown_and_double() {
        let l = MemLedger::with_limit(0, 10 * MB);
        let a = Accounts::default();
        a.alloc(
            &l,
            KeySpace::Pointer,
            0,
            1,
            2 * MB,
            ok(0x1000, 2 * MB),
            |_| {},
        )
        .unwrap();
        // Unknown pointer: the driver's own error, nothing uncharged.
        assert_eq!(
            a.free(&l, KeySpace::Pointer, 0x9999, || CUDA_ERROR_INVALID_VALUE),
            CUDA_ERROR_INVALID_VALUE
        );
        assert_eq!(l.total(0), 2 * MB);
        // Same value in another namespace is not the pointer.
        assert_eq!(
            a.free(&l, KeySpace::Handle, 0x1000, || CUDA_ERROR_INVALID_VALUE),
            CUDA_ERROR_INVALID_VALUE
        );
        assert_eq!(l.total(0), 2 * MB);
        // Driver refuses the free: still charged and tracked.
        assert_eq!(a.free(&l, KeySpace::Pointer, 0x1000, || 700), 700);
        assert_eq!(l.total(0), 2 * MB);
        assert!(a.get(KeySpace::Pointer, 0x1000).is_some());
        // Real free.
        assert_eq!(
            a.free(&l, KeySpace::Pointer, 0x1000, || CUDA_SUCCESS),
            CUDA_SUCCESS
        );
        assert_eq!(l.total(0), 0);
        // Double free: untracked now, the driver answers.
        assert_eq!(
            a.free(&l, KeySpace::Pointer, 0x1000, || CUDA_ERROR_INVALID_VALUE),
            CUDA_ERROR_INVALID_VALUE
        );
        assert_eq!(l.total(0), 0);
    }

    #[test]
    fn stamps_compare_across_the_wrap() {
        assert!(precedes(1, 2));
        assert!(!precedes(2, 2));
        assert!(!precedes(3, 2));
        assert!(
            precedes(u32::MAX, 1),
            "inserted just before the counter wrapped"
        );
        assert!(!precedes(1, u32::MAX));
    }

    #[test]
    fn a_free_failing_because_another_thread_freed_the_key_meanwhile_uncharges() {
        let l = MemLedger::with_limit(0, 10 * MB);
        let a = Accounts::default();
        a.alloc(
            &l,
            KeySpace::Pointer,
            0,
            1,
            2 * MB,
            ok(0x1000, 2 * MB),
            |_| {},
        )
        .unwrap();
        // Our free took the entry; while its driver call runs, another thread's free of the
        // same key (no entry) succeeds; ours then fails.
        let r = a.free(&l, KeySpace::Pointer, 0x1000, || {
            assert_eq!(
                a.free(&l, KeySpace::Pointer, 0x1000, || CUDA_SUCCESS),
                CUDA_SUCCESS
            );
            CUDA_ERROR_INVALID_VALUE
        });
        assert_eq!(r, CUDA_ERROR_INVALID_VALUE);
        assert_eq!(l.total(0), 0, "uncharged once");
        assert!(a.get(KeySpace::Pointer, 0x1000).is_none());
        // A new allocation at the same address is charged and freed normally.
        a.alloc(&l, KeySpace::Pointer, 0, 1, MB, ok(0x1000, MB), |_| {})
            .unwrap();
        assert_eq!(
            a.free(&l, KeySpace::Pointer, 0x1000, || 700),
            700,
            "a refused free"
        );
        assert_eq!(
            l.total(0),
            MB,
            "still charged: the old record does not match it"
        );
        assert_eq!(
            a.free(&l, KeySpace::Pointer, 0x1000, || CUDA_SUCCESS),
            CUDA_SUCCESS
        );
        assert_eq!(l.total(0), 0);
    }

    #[test]
    fn an_entry_put_back_after_another_threads_successful_free_is_released_by_it() {
        use std::sync::Barrier;
        let l = MemLedger::with_limit(0, 10 * MB);
        let a = Accounts::default();
        a.alloc(
            &l,
            KeySpace::Pointer,
            0,
            1,
            2 * MB,
            ok(0x1000, 2 * MB),
            |_| {},
        )
        .unwrap();
        let (inside, freed, back) = (Barrier::new(2), Barrier::new(2), Barrier::new(2));
        std::thread::scope(|s| {
            s.spawn(|| {
                // Takes the entry, fails after the other free succeeded, puts it back.
                let r = a.free(&l, KeySpace::Pointer, 0x1000, || {
                    inside.wait();
                    freed.wait();
                    CUDA_ERROR_INVALID_VALUE
                });
                assert_eq!(r, CUDA_ERROR_INVALID_VALUE);
                back.wait();
            });
            s.spawn(|| {
                inside.wait();
                // Finds no entry; its driver call succeeds; it looks again only after the
                // entry was put back.
                let r = a.free(&l, KeySpace::Pointer, 0x1000, || {
                    freed.wait();
                    back.wait();
                    CUDA_SUCCESS
                });
                assert_eq!(r, CUDA_SUCCESS);
            });
        });
        assert_eq!(l.total(0), 0, "uncharged once");
        assert!(a.get(KeySpace::Pointer, 0x1000).is_none());
    }

    #[test]
    fn context_teardown_releases_its_objects() {
        let l = MemLedger::with_limit(0, 100 * MB);
        let a = Accounts::default();
        a.alloc(&l, KeySpace::Pointer, 0, 7, MB, ok(1, MB), |_| {})
            .unwrap();
        a.alloc(&l, KeySpace::Array, 0, 7, 2 * MB, ok(2, 2 * MB), |_| {})
            .unwrap();
        a.alloc(&l, KeySpace::Pointer, 0, 8, 4 * MB, ok(3, 4 * MB), |_| {})
            .unwrap();
        assert_eq!(a.drop_context(&l, 7), 2);
        assert_eq!(l.total(0), 4 * MB);
        assert_eq!(a.len(), 1);
        assert_eq!(a.drop_context(&l, 0), 0);
    }

    /// A context destroyed while a release of one of its objects is in flight: the release
    /// holds the entry, the sweep does not see it, the driver then refuses the release (the
    /// object went with the context). The entry must not be put back.
    #[test]
    fn a_free_refused_after_its_context_was_destroyed_meanwhile_uncharges() {
        let l = MemLedger::with_limit(0, 100 * MB);
        let a = Accounts::default();
        a.alloc(
            &l,
            KeySpace::Pointer,
            0,
            7,
            2 * MB,
            ok(0x1000, 2 * MB),
            |_| {},
        )
        .unwrap();
        a.alloc(&l, KeySpace::Array, 0, 8, MB, ok(0x2000, MB), |_| {})
            .unwrap();
        let r = a.free(&l, KeySpace::Pointer, 0x1000, || {
            assert_eq!(a.drop_context(&l, 7), 0, "the free holds the entry");
            CUDA_ERROR_INVALID_VALUE
        });
        assert_eq!(r, CUDA_ERROR_INVALID_VALUE);
        assert_eq!(l.total(0), MB, "uncharged once");
        assert!(a.get(KeySpace::Pointer, 0x1000).is_none());
        // Another context's destruction meanwhile: the refused free puts its entry back.
        let r = a.free(&l, KeySpace::Array, 0x2000, || {
            a.drop_context(&l, 7);
            CUDA_ERROR_INVALID_VALUE
        });
        assert_eq!(r, CUDA_ERROR_INVALID_VALUE);
        assert_eq!(a.get(KeySpace::Array, 0x2000).map(|e| e.bytes), Some(MB));
        assert_eq!(a.drop_context(&l, 8), 1);
        assert_eq!(l.total(0), 0);
    }

    /// The mirror: the driver made the object, then its context was destroyed (with it)
    /// before the allocation recorded it.
    #[test]
    fn an_object_whose_context_was_destroyed_before_it_was_recorded_is_uncharged() {
        let l = MemLedger::with_limit(0, 100 * MB);
        let a = Accounts::default();
        let r = a.alloc(
            &l,
            KeySpace::Pointer,
            0,
            7,
            4 * MB,
            || {
                assert_eq!(a.drop_context(&l, 7), 0);
                Ok(Allocated {
                    key: 0x1000,
                    bytes: 4 * MB,
                })
            },
            |_| panic!("not undone: the driver's success is returned"),
        );
        assert_eq!(r, Ok(()));
        assert_eq!(l.total(0), 0);
        assert!(a.is_empty());
        // A new context reusing the handle (made after the destruction was recorded): its
        // objects are recorded, and a refused free of one puts it back.
        a.alloc(&l, KeySpace::Pointer, 0, 7, MB, ok(0x2000, MB), |_| {})
            .unwrap();
        assert_eq!(a.free(&l, KeySpace::Pointer, 0x2000, || 700), 700);
        assert_eq!(a.get(KeySpace::Pointer, 0x2000).map(|e| e.ctx), Some(7));
        assert_eq!(l.total(0), MB);
        assert_eq!(a.drop_context(&l, 7), 1);
        assert_eq!(l.total(0), 0);
    }

    /// Threads allocating and freeing in a context while another destroys it, round after
    /// round: whatever the interleaving, nothing stays charged once the context is gone and
    /// nothing is uncharged twice (an object of another context stays charged throughout, so
    /// a double uncharge shows below it rather than saturating at 0).
    #[test]
    fn allocations_and_frees_racing_a_context_destruction_stay_exact() {
        use std::sync::atomic::{AtomicBool, AtomicU64};
        let l = MemLedger::with_limit(0, 1 << 40);
        let a = Accounts::default();
        // The "driver": live objects, and the context each belongs to.
        let live = Mutex::new(HashMap::<u64, usize>::new());
        let next = AtomicU64::new(1);
        a.alloc(&l, KeySpace::Array, 0, 1, 64 * MB, ok(0xa, 64 * MB), |_| {})
            .unwrap();
        for round in 0..200usize {
            let ctx = 0x100 + round % 3;
            let alive = AtomicBool::new(true);
            std::thread::scope(|s| {
                for _ in 0..2 {
                    s.spawn(|| {
                        for _ in 0..20 {
                            let key = next.fetch_add(1, Ordering::Relaxed) << 8;
                            let _ = a.alloc(
                                &l,
                                KeySpace::Pointer,
                                0,
                                ctx,
                                MB,
                                || {
                                    let mut g = live.lock().unwrap();
                                    if !alive.load(Ordering::SeqCst) {
                                        return Err(CUDA_ERROR_INVALID_VALUE);
                                    }
                                    g.insert(key, ctx);
                                    drop(g);
                                    // Returning from the driver: the window before the
                                    // object is recorded.
                                    std::thread::yield_now();
                                    Ok(Allocated { key, bytes: MB })
                                },
                                |_| {},
                            );
                            std::thread::yield_now();
                            a.free(&l, KeySpace::Pointer, key, || {
                                // Entering the driver: the window after the entry was
                                // taken out.
                                std::thread::yield_now();
                                match live.lock().unwrap().remove(&key) {
                                    Some(_) => CUDA_SUCCESS,
                                    None => CUDA_ERROR_INVALID_VALUE,
                                }
                            });
                        }
                    });
                }
                s.spawn(|| {
                    std::thread::yield_now();
                    let mut g = live.lock().unwrap();
                    alive.store(false, Ordering::SeqCst);
                    g.retain(|_, c| *c != ctx);
                    drop(g);
                    a.drop_context(&l, ctx);
                });
            });
            assert_eq!(a.len(), 1, "round {round}");
            assert_eq!(l.total(0), 64 * MB, "round {round}");
        }
    }

    #[test]
    fn reused_key_releases_stale_entry() {
        let l = MemLedger::with_limit(0, 100 * MB);
        let a = Accounts::default();
        a.alloc(&l, KeySpace::Pointer, 0, 1, MB, ok(1, MB), |_| {})
            .unwrap();
        a.alloc(&l, KeySpace::Pointer, 0, 1, 3 * MB, ok(1, 3 * MB), |_| {})
            .unwrap();
        assert_eq!(l.total(0), 3 * MB);
        assert_eq!(a.len(), 1);
    }

    #[test]
    fn threads_never_exceed_limit() {
        let l = MemLedger::with_limit(0, 64 * MB);
        let a = Accounts::default();
        let granted = std::sync::atomic::AtomicU64::new(0);
        std::thread::scope(|s| {
            for t in 0..8u64 {
                let (l, a, granted) = (&l, &a, &granted);
                s.spawn(move || {
                    for i in 0..100u64 {
                        let key = (t << 32) | (i + 1);
                        if a.alloc(l, KeySpace::Pointer, 0, 1, MB, ok(key, MB), |_| {})
                            .is_ok()
                        {
                            granted.fetch_add(MB, std::sync::atomic::Ordering::Relaxed);
                        }
                    }
                });
            }
        });
        assert_eq!(granted.into_inner(), 64 * MB);
        assert_eq!(l.total(0), 64 * MB);
    }
}
