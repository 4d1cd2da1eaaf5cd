//! Device memory that a context's limits take: `cuCtxSetLimit` (stack, malloc heap, printf
//! FIFO, device-runtime limits) and the local memory a launch grows.
//!
//! What the driver takes (measured on the H200, driver 580):
//! * the stack (`CU_LIMIT_STACK_SIZE`, bytes per thread) is reserved for every thread the
//!   device can hold resident (multiprocessor count x max threads per multiprocessor): raising
//!   it takes `(new - current) x resident threads` at the set call; lowering it gives that back;
//! * a launch of a kernel whose `CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES` exceeds the stack limit
//!   raises the limit to it, taking the growth the same way (kept afterwards);
//! * the heap takes its size and a 2 MiB page at the first launch of a kernel that calls
//!   `malloc` (H100, driver 580: 1 GiB -> +1026 MiB; set and other launches take nothing):
//!   charged at [`heap_bytes`];
//! * the printf FIFO takes almost nothing: about 1/512 of its size in 2 MiB pages, on the
//!   device but not in the process's figure, at the first launch of a kernel that calls
//!   `printf` (H100, driver 580: a 1 GiB FIFO +2 MiB, 2 GiB +4 MiB, 64 MiB and the default
//!   8.25 MiB nothing); the driver caps it at 2 GiB (a larger set succeeds and reads back
//!   2 GiB). It is charged at [`fifo_bytes`], never at its size, which would refuse a
//!   program the driver serves (`gpu/results/h100-limit-footprint-run1.txt`).
//!
//! So each growth is sized before the driver takes it and admitted first ([`Limits::set_limit`],
//! [`Limits::before_launch`]); refused, the call fails with `CUDA_ERROR_OUT_OF_MEMORY` without
//! reaching the driver. A launch that needs more local memory raises the stack limit itself
//! (`cuCtxSetLimit`) before the launch, so that the driver takes the memory at that call and
//! not inside the launch (where a module's first-launch measurement would count it again).
//!
//! Charges are context memory ([`UsageKind::Context`]) of their context, kept per context
//! (only what was charged here is ever given back) and released with it
//! ([`Limits::drop_context`]).
//!
//! The launch path: a function's local size is cached per handle (sharded spin-locked maps;
//! an epoch forgets them all when a module or context goes, as handles may be reused). A
//! kernel needing no more than the smallest stack limit seen in any context (the floor) costs a
//! cache lookup and a compare; only a kernel needing more reads the current context and its
//! reservation (under the table's lock).

use crate::ffi::cuda::{CUresult, CUDA_ERROR_OUT_OF_MEMORY, CUDA_SUCCESS};
use crate::ledger::accounting::{Deny, Ledger};
use crate::ledger::keymap::KeyMap;
use crate::ledger::spin::SpinLock;
use hami_abi::layout::{UsageKind, MAX_DEVICES};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

/// The `CUlimit`, `CUfunction_attribute` and `CUdevice_attribute` values this file's callers
/// pass to the driver (`cuda.h`, by way of the `cuda-abi` crate).
pub use crate::ffi::cuda::{
    CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
    CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES, CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT,
    CU_LIMIT_DEV_RUNTIME_SYNC_DEPTH, CU_LIMIT_MALLOC_HEAP_SIZE, CU_LIMIT_PRINTF_FIFO_SIZE,
    CU_LIMIT_STACK_SIZE,
};

/// The printf FIFO's default size (`cuCtxGetLimit` of a fresh context, H100 and H200,
/// driver 580): its footprint is part of the context's.
pub const DEFAULT_PRINTF_FIFO: u64 = 8_650_752;
/// The driver's device memory per byte of printf FIFO beyond the default: 1/512 (measured:
/// 1 GiB -> 2 MiB, 2 GiB -> 4 MiB).
pub const FIFO_DEVICE_RATIO: u64 = 512;
/// The driver's page: device memory goes in 2 MiB steps.
pub const DEVICE_PAGE: u64 = 2 << 20;

/// The device memory a printf FIFO of `size` bytes takes beyond the default's: 1/512 of the
/// growth, rounded up to a whole page (so never below what the driver was measured to take,
/// and at most a page above).
pub fn fifo_bytes(size: u64) -> u64 {
    let grown = size.saturating_sub(DEFAULT_PRINTF_FIFO);
    if grown == 0 {
        return 0;
    }
    grown
        .div_ceil(FIFO_DEVICE_RATIO)
        .div_ceil(DEVICE_PAGE)
        .saturating_mul(DEVICE_PAGE)
}

/// The malloc heap's default size (`cuCtxGetLimit` of a fresh context, H100 and H200,
/// driver 580).
pub const DEFAULT_HEAP: u64 = 8 << 20;

/// The device memory a malloc heap of `size` bytes takes once placed: its size and a 2 MiB
/// page (H100, driver 580: 1 GiB +1026 MiB, 64 MiB +66, the default 8 MiB +10), charged for
/// any size but the default (whose memory the driver takes only if a kernel calls `malloc`;
/// left to the backstop like the context's other lazy memory).
pub fn heap_bytes(size: u64) -> u64 {
    if size == DEFAULT_HEAP {
        0
    } else {
        size.saturating_add(DEVICE_PAGE)
    }
}

/// How a limit's memory is sized.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sizing {
    /// Bytes per resident thread: the stack.
    PerThread,
    /// The malloc heap: its size and a page ([`heap_bytes`]).
    Heap,
    /// The printf FIFO: a small part of its size ([`fifo_bytes`]).
    Fifo,
    /// Sized by nobody but the driver (device-runtime limits): measured around the call.
    Measured,
    /// Takes no device memory (L2 limits, shared-memory and CIG limits, unknown values: the
    /// driver answers those).
    None,
}

/// The sizing of `limit` (a `CUlimit` value).
pub fn sizing(limit: i32) -> Sizing {
    match limit {
        CU_LIMIT_STACK_SIZE => Sizing::PerThread,
        CU_LIMIT_MALLOC_HEAP_SIZE => Sizing::Heap,
        CU_LIMIT_PRINTF_FIFO_SIZE => Sizing::Fifo,
        CU_LIMIT_DEV_RUNTIME_SYNC_DEPTH | CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT => {
            Sizing::Measured
        }
        _ => Sizing::None,
    }
}

/// The device memory a change of a limit from `current` to `new` takes (positive) or gives
/// back (negative), `resident` threads on the device for a per-thread limit. Saturates.
pub fn limit_change(sizing: Sizing, current: u64, new: u64, resident: u64) -> i128 {
    let d = i128::from(new) - i128::from(current);
    match sizing {
        Sizing::PerThread => d.saturating_mul(i128::from(resident)),
        Sizing::Heap => i128::from(heap_bytes(new)) - i128::from(heap_bytes(current)),
        Sizing::Fifo => i128::from(fifo_bytes(new)) - i128::from(fifo_bytes(current)),
        Sizing::Measured | Sizing::None => 0,
    }
}

/// The bytes a growth of the per-thread local reservation from `reserved` to `needed` takes
/// (0 when it does not grow).
pub fn local_growth(needed: u64, reserved: u64, resident: u64) -> u64 {
    needed.saturating_sub(reserved).saturating_mul(resident)
}

/// Threads a device holds resident, from its multiprocessor count and maximum threads per
/// multiprocessor (`None` when either is unknown or not positive).
pub fn resident_threads(multiprocessors: i32, threads_per_mp: i32) -> Option<u64> {
    let (m, t) = (
        u64::try_from(multiprocessors).ok()?,
        u64::try_from(threads_per_mp).ok()?,
    );
    (m > 0 && t > 0).then(|| m.saturating_mul(t))
}

/// The driver calls the table needs (the real driver in the hooks, a model in tests).
pub trait LimitDriver {
    /// `cuCtxGetLimit` in the current context.
    fn get_limit(&self, limit: i32) -> Result<u64, CUresult>;
    /// `cuCtxSetLimit` in the current context.
    fn set_limit(&self, limit: i32, value: u64) -> CUresult;
    /// The stack limit raised for a launch (the application did not ask for this call: it
    /// must not disturb a stream capture in progress). Default: [`LimitDriver::set_limit`].
    fn raise_stack(&self, value: u64) -> CUresult {
        self.set_limit(CU_LIMIT_STACK_SIZE, value)
    }
    /// Threads device `dev` holds resident (`None`: unknown).
    fn resident_threads(&self, dev: usize) -> Option<u64>;
    /// `CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES` of a `CUfunction` or (on `dev`) a `CUkernel`
    /// (`None`: unknown).
    fn local_size(&self, func: u64, dev: usize) -> Option<u64>;
}

/// Why a limit change or a launch was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum LimitError {
    /// The region refused the growth.
    #[error("{what}: {bytes} bytes of context memory refused: {deny}")]
    Denied {
        /// What would have grown (`stack`, `heap`, `local memory`, ...).
        what: &'static str,
        /// The growth.
        bytes: u64,
        /// The region's answer.
        deny: Deny,
    },
    /// The driver refused (its code, returned as is; out of memory for a growth at launch).
    #[error("the driver returned {0}")]
    Driver(CUresult),
}

impl LimitError {
    /// The code the application gets.
    pub fn code(&self) -> CUresult {
        match self {
            LimitError::Denied { .. } => CUDA_ERROR_OUT_OF_MEMORY,
            LimitError::Driver(e) => *e,
        }
    }
}

/// What one context's limits hold, as charged here.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CtxCharges {
    /// Device ordinal charged.
    pub dev: usize,
    /// The stack limit (bytes per thread) the driver holds, as last read or set.
    pub reserved: u64,
    /// Bytes charged for the stack / local memory beyond what the context had when first seen.
    pub stack: u64,
    /// Bytes charged for heap raises.
    pub heap: u64,
    /// Bytes charged for printf FIFO raises.
    pub fifo: u64,
    /// Bytes measured for device-runtime limits.
    pub measured: u64,
    /// Bytes of heap / FIFO raises charged but not yet on the device (the driver puts them
    /// there at the context's next launch).
    pub pending: u64,
}

impl CtxCharges {
    fn total(&self) -> u64 {
        self.stack
            .saturating_add(self.heap)
            .saturating_add(self.fifo)
            .saturating_add(self.measured)
    }

    fn field(&mut self, s: Sizing) -> &mut u64 {
        match s {
            Sizing::PerThread => &mut self.stack,
            Sizing::Heap => &mut self.heap,
            Sizing::Fifo => &mut self.fifo,
            Sizing::Measured | Sizing::None => &mut self.measured,
        }
    }
}

/// The smallest stack limit seen in any context, plus one (0: none seen yet). A kernel whose
/// local size is below it cannot make any context grow: the only ways a context's limit
/// falls are `cuCtxSetLimit` (hooked: the value lowers the floor) and a reset (back to the
/// driver's default, which the first reading of a fresh context saw).
#[derive(Default)]
struct Floor(AtomicU64);

impl Floor {
    fn note(&self, reserved: u64) {
        let v = reserved.saturating_add(1);
        let _ = self
            .0
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |old| {
                (old == 0 || v < old).then_some(v)
            });
    }

    #[inline]
    fn covers(&self, local: u64) -> bool {
        local < self.0.load(Ordering::Acquire)
    }
}

/// A function's cached local size, with the epoch it was read in.
#[derive(Clone, Copy, Debug)]
struct FuncInfo {
    local: u64,
    epoch: u32,
}

const SHARDS: usize = 16;

/// Per-process table of limit charges and of functions' local sizes.
pub struct Limits {
    floor: Floor,
    epoch: AtomicU32,
    funcs: [SpinLock<KeyMap<FuncInfo>>; SHARDS],
    ctxs: Mutex<HashMap<usize, CtxCharges>>,
    resident: [AtomicU64; MAX_DEVICES],
    /// Contexts with a `pending` raise (the launch path looks further only when non-zero).
    pending_ctxs: AtomicUsize,
    /// Per device, bytes of the memory charged here that the driver holds now
    /// ([`Limits::on_device`]).
    on_device: [AtomicU64; MAX_DEVICES],
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            floor: Floor::default(),
            epoch: AtomicU32::new(0),
            funcs: std::array::from_fn(|_| SpinLock::new(KeyMap::default())),
            ctxs: Mutex::new(HashMap::new()),
            resident: std::array::from_fn(|_| AtomicU64::new(0)),
            pending_ctxs: AtomicUsize::new(0),
            on_device: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }
}

fn shard_of(key: u64) -> usize {
    (key.wrapping_mul(crate::ledger::keymap::MIX) >> 60) as usize % SHARDS
}

impl Limits {
    fn lock(&self) -> MutexGuard<'_, HashMap<usize, CtxCharges>> {
        self.ctxs.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// What context `ctx`'s limits hold as charged here (`None`: nothing recorded).
    pub fn charges(&self, ctx: usize) -> Option<CtxCharges> {
        self.lock().get(&ctx).copied()
    }

    /// Resident threads of `dev`, cached.
    fn resident<D: LimitDriver + ?Sized>(&self, drv: &D, dev: usize) -> Option<u64> {
        let slot = self.resident.get(dev)?;
        match slot.load(Ordering::Relaxed) {
            0 => {
                let r = drv.resident_threads(dev)?;
                slot.store(r, Ordering::Relaxed);
                Some(r)
            }
            r => Some(r),
        }
    }

    /// The entry of `ctx`, read from the driver (the current context's stack limit) the first
    /// time. `None`: the driver does not say.
    fn entry<'a, D: LimitDriver + ?Sized>(
        &self,
        g: &'a mut HashMap<usize, CtxCharges>,
        drv: &D,
        dev: usize,
        ctx: usize,
    ) -> Option<&'a mut CtxCharges> {
        match g.entry(ctx) {
            std::collections::hash_map::Entry::Occupied(e) => Some(e.into_mut()),
            std::collections::hash_map::Entry::Vacant(v) => {
                let reserved = drv.get_limit(CU_LIMIT_STACK_SIZE).ok()?;
                self.floor.note(reserved);
                Some(v.insert(CtxCharges {
                    dev,
                    reserved,
                    ..CtxCharges::default()
                }))
            }
        }
    }

    /// `cuCtxSetLimit(limit, value)` in context `ctx` on `dev`: the growth is admitted before
    /// `drv.set_limit` (refused: [`LimitError::Denied`], the driver not called), a lowering
    /// gives back what this table charged for that limit after the driver succeeded.
    /// [`Sizing::Measured`] and [`Sizing::None`] limits go straight to the driver (the hook
    /// measures the former).
    pub fn set_limit<L: Ledger + ?Sized, D: LimitDriver + ?Sized>(
        &self,
        ledger: &L,
        drv: &D,
        dev: usize,
        ctx: usize,
        limit: i32,
        value: u64,
    ) -> Result<(), LimitError> {
        let s = sizing(limit);
        if matches!(s, Sizing::Measured | Sizing::None) || ctx == 0 {
            return driver(drv.set_limit(limit, value));
        }
        let mut g = self.lock();
        let current = match drv.get_limit(limit) {
            Ok(c) => c,
            // An unsupported limit or no context: the driver's own answer.
            Err(_) => return driver(drv.set_limit(limit, value)),
        };
        let resident = match s {
            Sizing::PerThread => match self.resident(drv, dev) {
                Some(r) => r,
                None => {
                    crate::debug!("cuCtxSetLimit: device {dev}: resident threads unknown: the stack is not admitted (the backstop accounts for it)");
                    return driver(drv.set_limit(limit, value));
                }
            },
            _ => 0,
        };
        let change = limit_change(s, current, value, resident);
        let grow = u64::try_from(change.max(0)).unwrap_or(u64::MAX);
        if grow > 0 {
            ledger
                .try_charge(dev, UsageKind::Context, grow)
                .map_err(|deny| LimitError::Denied {
                    what: what(s),
                    bytes: grow,
                    deny,
                })?;
        }
        let r = drv.set_limit(limit, value);
        if r != CUDA_SUCCESS {
            ledger.uncharge(dev, UsageKind::Context, grow);
            return Err(LimitError::Driver(r));
        }
        // The driver may have set less than asked (it caps the printf FIFO at 2 GiB): what
        // it reads back is what is held; the admitted excess goes back.
        let mut grow = grow;
        if grow > 0 {
            if let Ok(actual) = drv.get_limit(limit) {
                let real = limit_change(s, current, actual, resident).max(0);
                let real = u64::try_from(real).unwrap_or(u64::MAX);
                if real < grow {
                    ledger.uncharge(dev, UsageKind::Context, grow - real);
                    grow = real;
                }
            }
        }
        let Some(e) = self.entry(&mut g, drv, dev, ctx) else {
            // Cannot be recorded (the driver stopped answering): nothing stays charged.
            ledger.uncharge(dev, UsageKind::Context, grow);
            return Ok(());
        };
        let was_pending = e.pending > 0;
        let f = e.field(s);
        *f = f.saturating_add(grow);
        let mut back = 0;
        if change < 0 {
            back = u64::try_from(-change).unwrap_or(u64::MAX).min(*f);
            *f -= back;
            ledger.uncharge(dev, UsageKind::Context, back);
        }
        if matches!(s, Sizing::Heap | Sizing::Fifo) {
            // Not on the device until the next launch; a lowering first takes back what is
            // not there yet.
            let pending = e.pending.saturating_add(grow);
            let not_there = back.min(pending);
            e.pending = pending - not_there;
            self.pending_moved(was_pending, e.pending > 0);
            self.moved(dev, -i128::from(back - not_there));
        } else {
            // The stack is taken (or given back) at the call.
            self.moved(dev, i128::from(grow) - i128::from(back));
        }
        if s == Sizing::PerThread {
            e.reserved = value;
            self.floor.note(current);
            self.floor.note(value);
        }
        Ok(())
    }

    /// A measured device-runtime limit change took `bytes` in `ctx`: charged (refused:
    /// [`LimitError::Denied`], and the hook puts the old value back).
    pub fn charge_measured<L: Ledger + ?Sized, D: LimitDriver + ?Sized>(
        &self,
        ledger: &L,
        drv: &D,
        dev: usize,
        ctx: usize,
        bytes: u64,
    ) -> Result<(), LimitError> {
        if bytes == 0 || ctx == 0 {
            return Ok(());
        }
        let mut g = self.lock();
        ledger
            .try_charge(dev, UsageKind::Context, bytes)
            .map_err(|deny| LimitError::Denied {
                what: "device-runtime limit",
                bytes,
                deny,
            })?;
        match self.entry(&mut g, drv, dev, ctx) {
            Some(e) => {
                e.measured = e.measured.saturating_add(bytes);
                self.moved(dev, i128::from(bytes));
            }
            // Cannot be recorded against the context: not kept (the backstop sees it).
            None => ledger.uncharge(dev, UsageKind::Context, bytes),
        }
        Ok(())
    }

    /// The local size of `func`, cached per handle (read from the driver on `dev` once).
    #[inline]
    fn local_of<D: LimitDriver + ?Sized>(
        &self,
        drv: &D,
        func: u64,
        dev: impl FnOnce() -> Option<usize>,
    ) -> u64 {
        let epoch = self.epoch.load(Ordering::Acquire);
        let shard = &self.funcs[shard_of(func)];
        if let Some(i) = shard.lock().get(0, func) {
            if i.epoch == epoch {
                return i.local;
            }
        }
        self.read_local(drv, func, dev, epoch)
    }

    #[cold]
    fn read_local<D: LimitDriver + ?Sized>(
        &self,
        drv: &D,
        func: u64,
        dev: impl FnOnce() -> Option<usize>,
        epoch: u32,
    ) -> u64 {
        let local = dev().and_then(|d| drv.local_size(func, d)).unwrap_or(0);
        self.funcs[shard_of(func)]
            .lock()
            .insert(0, func, FuncInfo { local, epoch });
        local
    }

    /// Before a launch of `func` in the current context (`current()`: device and context):
    /// if the kernel needs more local memory per thread than the context holds, the growth is
    /// admitted and the stack limit raised to it (the driver takes the memory there). Refused
    /// by the region: [`LimitError::Denied`]; the driver cannot raise it for lack of memory:
    /// [`LimitError::Driver`] with `CUDA_ERROR_OUT_OF_MEMORY`. Either way the launch must
    /// not happen. Anything this cannot size (no context, no attribute) is left to the
    /// driver.
    #[inline]
    pub fn before_launch<L: Ledger + ?Sized, D: LimitDriver + ?Sized>(
        &self,
        ledger: &L,
        drv: &D,
        func: u64,
        current: impl Fn() -> Option<(usize, usize)>,
    ) -> Result<(), LimitError> {
        let local = self.local_of(drv, func, || current().map(|c| c.0));
        if local == 0 || self.floor.covers(local) {
            return Ok(());
        }
        self.grow_for(ledger, drv, local, current)
    }

    #[cold]
    fn grow_for<L: Ledger + ?Sized, D: LimitDriver + ?Sized>(
        &self,
        ledger: &L,
        drv: &D,
        local: u64,
        current: impl Fn() -> Option<(usize, usize)>,
    ) -> Result<(), LimitError> {
        let Some((dev, ctx)) = current().filter(|c| c.1 != 0) else {
            return Ok(());
        };
        let mut g = self.lock();
        let Some(e) = self.entry(&mut g, drv, dev, ctx) else {
            return Ok(());
        };
        if local <= e.reserved {
            return Ok(());
        }
        // The limit may have grown by a path not seen here (an unhooked launch entry point):
        // read it before charging or setting (setting a smaller value would lower it).
        if let Ok(now) = drv.get_limit(CU_LIMIT_STACK_SIZE) {
            e.reserved = now;
            if local <= now {
                return Ok(());
            }
        }
        let Some(resident) = self.resident(drv, dev) else {
            return Ok(());
        };
        let grow = local_growth(local, e.reserved, resident);
        ledger
            .try_charge(dev, UsageKind::Context, grow)
            .map_err(|deny| LimitError::Denied {
                what: "local memory",
                bytes: grow,
                deny,
            })?;
        match drv.raise_stack(local) {
            CUDA_SUCCESS => {
                e.reserved = local;
                e.stack = e.stack.saturating_add(grow);
                self.moved(dev, i128::from(grow));
                Ok(())
            }
            CUDA_ERROR_OUT_OF_MEMORY => {
                ledger.uncharge(dev, UsageKind::Context, grow);
                Err(LimitError::Driver(CUDA_ERROR_OUT_OF_MEMORY))
            }
            r => {
                // The driver would not raise it this way: the launch decides (its growth, if
                // any, is left to the backstop).
                ledger.uncharge(dev, UsageKind::Context, grow);
                crate::debug!("launch: raising the stack limit to {local} bytes for a kernel's local memory failed ({r}): left to the driver");
                Ok(())
            }
        }
    }

    /// Keeps [`Limits::pending_ctxs`] in step with one context's `pending` going from
    /// `was` to `now` (non-zero or not).
    fn pending_moved(&self, was: bool, now: bool) {
        match (was, now) {
            (false, true) => {
                self.pending_ctxs.fetch_add(1, Ordering::AcqRel);
            }
            (true, false) => {
                self.pending_ctxs.fetch_sub(1, Ordering::AcqRel);
            }
            _ => {}
        }
    }

    /// After a launch in the current context (`current()`), inside any measurement around it:
    /// a raise charged at `cuCtxSetLimit` and put on the device by this launch now counts as
    /// on the device ([`Limits::on_device`]), so that a module's first-launch measurement does
    /// not charge it a second time. One atomic load unless a raise is pending somewhere.
    #[inline]
    pub fn after_launch(&self, launched: bool, current: impl FnOnce() -> Option<(usize, usize)>) {
        if !launched || self.pending_ctxs.load(Ordering::Acquire) == 0 {
            return;
        }
        self.realise(current);
    }

    #[cold]
    fn realise(&self, current: impl FnOnce() -> Option<(usize, usize)>) {
        let Some((_, ctx)) = current() else {
            return;
        };
        let mut g = self.lock();
        let Some(e) = g.get_mut(&ctx).filter(|e| e.pending > 0) else {
            return;
        };
        let (dev, pending) = (e.dev, e.pending);
        e.pending = 0;
        self.pending_moved(true, false);
        self.moved(dev, i128::from(pending));
    }

    /// `delta` bytes charged here arrived on (positive) or left (negative) device `dev`.
    fn moved(&self, dev: usize, delta: i128) {
        let Some(c) = self.on_device.get(dev) else {
            return;
        };
        let d = u64::try_from(delta.unsigned_abs()).unwrap_or(u64::MAX);
        let _ = c.fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| {
            Some(if delta >= 0 {
                v.saturating_add(d)
            } else {
                v.saturating_sub(d)
            })
        });
    }

    /// Bytes charged here (stack, local memory, heap and FIFO raises once a launch put them
    /// there, measured device-runtime limits) that the driver holds on `dev` now. Context
    /// memory in the region, but not part of any context's measured footprint: measurements
    /// (a module's first launch, a context created meanwhile) count it with this process's
    /// non-context memory, whose changes during the measured call they subtract.
    pub fn on_device(&self, dev: usize) -> u64 {
        self.on_device
            .get(dev)
            .map_or(0, |r| r.load(Ordering::Acquire))
    }

    /// Module or library handles (and their functions) may be gone: every cached local size
    /// is read again at its next launch.
    pub fn forget_functions(&self) {
        self.epoch.fetch_add(1, Ordering::AcqRel);
    }

    /// Context `ctx` was destroyed or reset: what its limits held is given back, its record
    /// dropped (a reset context starts from the driver's defaults again).
    pub fn drop_context<L: Ledger + ?Sized>(&self, ledger: &L, ctx: usize) {
        self.forget_functions();
        let gone = self.lock().remove(&ctx);
        if let Some(e) = gone {
            self.pending_moved(e.pending > 0, false);
            self.moved(e.dev, -i128::from(e.total().saturating_sub(e.pending)));
            ledger.uncharge(e.dev, UsageKind::Context, e.total());
        }
    }
}

fn what(s: Sizing) -> &'static str {
    match s {
        Sizing::PerThread => "stack",
        Sizing::Heap => "malloc heap",
        Sizing::Fifo => "printf FIFO",
        Sizing::Measured => "device-runtime limit",
        Sizing::None => "limit",
    }
}

fn driver(r: CUresult) -> Result<(), LimitError> {
    match r {
        CUDA_SUCCESS => Ok(()),
        e => Err(LimitError::Driver(e)),
    }
}

#[cfg(test)]
mod tests;
