//! Device memory that a context's limits take: `cuCtxSetLimit` (stack, malloc heap, printf
//! FIFO, device-runtime limits) and the local memory a launch grows.
//!
//! What the driver takes (measured on the H200, driver 580):
//! * the stack (`CU_LIMIT_STACK_SIZE`, bytes per thread) is reserved for every thread the
//!   device can hold resident (multiprocessor count x max threads per multiprocessor): raising
//!   it takes `(new - current) x resident threads` at the set call; lowering it gives that back;
//! * a launch of a kernel whose `CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES` exceeds the stack limit
//!   raises the limit to it, taking the growth the same way (kept afterwards);
//! * the heap and the printf FIFO take their size (at the next launch).
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

use crate::accounting::{Deny, Ledger};
use crate::cuda::{CUresult, CUDA_ERROR_OUT_OF_MEMORY, CUDA_SUCCESS};
use crate::keymap::KeyMap;
use crate::spin::SpinLock;
use hami_common::layout::{UsageKind, MAX_DEVICES};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

/// `CU_LIMIT_STACK_SIZE`.
pub const CU_LIMIT_STACK_SIZE: i32 = 0;
/// `CU_LIMIT_PRINTF_FIFO_SIZE`.
pub const CU_LIMIT_PRINTF_FIFO_SIZE: i32 = 1;
/// `CU_LIMIT_MALLOC_HEAP_SIZE`.
pub const CU_LIMIT_MALLOC_HEAP_SIZE: i32 = 2;
/// `CU_LIMIT_DEV_RUNTIME_SYNC_DEPTH`.
pub const CU_LIMIT_DEV_RUNTIME_SYNC_DEPTH: i32 = 3;
/// `CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT`.
pub const CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT: i32 = 4;
/// `CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES`.
pub const CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES: i32 = 3;
/// `CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT`.
pub const CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: i32 = 16;
/// `CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR`.
pub const CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR: i32 = 39;

/// How a limit's memory is sized.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sizing {
    /// Bytes per resident thread: the stack.
    PerThread,
    /// The limit is the bytes: malloc heap.
    Heap,
    /// The limit is the bytes: printf FIFO.
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
        Sizing::Heap | Sizing::Fifo => d,
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
    (key.wrapping_mul(crate::keymap::MIX) >> 60) as usize % SHARDS
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
mod tests {
    use super::*;
    use crate::accounting::MemLedger;
    use crate::cuda::{CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_UNSUPPORTED_LIMIT};
    use std::cell::{Cell, RefCell};

    const MB: u64 = 1 << 20;
    const RESIDENT: u64 = 132 * 2048;

    /// A driver model: the H200's stack/heap/FIFO defaults, one context.
    struct Model {
        limits: RefCell<[u64; 5]>,
        locals: HashMap<u64, u64>,
        sets: Cell<u32>,
        local_reads: Cell<u32>,
        set_result: Cell<CUresult>,
    }

    impl Model {
        fn new() -> Model {
            Model {
                limits: RefCell::new([1024, 8_650_752, 8 * MB, 0, 2048]),
                locals: HashMap::from([(0xf1, 24 << 10), (0xf2, 512), (0xf3, 0)]),
                sets: Cell::new(0),
                local_reads: Cell::new(0),
                set_result: Cell::new(CUDA_SUCCESS),
            }
        }
    }

    impl LimitDriver for Model {
        fn get_limit(&self, limit: i32) -> Result<u64, CUresult> {
            let l = usize::try_from(limit).map_err(|_| CUDA_ERROR_INVALID_VALUE)?;
            self.limits
                .borrow()
                .get(l)
                .copied()
                .ok_or(CUDA_ERROR_UNSUPPORTED_LIMIT)
        }
        fn set_limit(&self, limit: i32, value: u64) -> CUresult {
            self.sets.set(self.sets.get() + 1);
            if self.set_result.get() != CUDA_SUCCESS {
                return self.set_result.get();
            }
            match self.limits.borrow_mut().get_mut(limit as usize) {
                Some(v) => {
                    *v = value;
                    CUDA_SUCCESS
                }
                None => CUDA_ERROR_UNSUPPORTED_LIMIT,
            }
        }
        fn resident_threads(&self, _dev: usize) -> Option<u64> {
            Some(RESIDENT)
        }
        fn local_size(&self, func: u64, _dev: usize) -> Option<u64> {
            self.local_reads.set(self.local_reads.get() + 1);
            self.locals.get(&func).copied()
        }
    }

    const CTX: usize = 0xc0;
    fn cur() -> Option<(usize, usize)> {
        Some((0, CTX))
    }

    #[test]
    fn sizing_follows_the_documented_limits() {
        assert_eq!(sizing(0), Sizing::PerThread);
        assert_eq!(sizing(1), Sizing::Fifo);
        assert_eq!(sizing(2), Sizing::Heap);
        assert_eq!(sizing(3), Sizing::Measured);
        assert_eq!(sizing(4), Sizing::Measured);
        assert_eq!(sizing(5), Sizing::None);
        assert_eq!(sizing(-1), Sizing::None);
    }

    #[test]
    fn changes_are_sized_as_the_h200_takes_them() {
        // Measured: stack 1024 -> 8192 took 1848 MiB; a 24 KiB local array 6072 MiB.
        assert_eq!(
            limit_change(Sizing::PerThread, 1024, 8192, RESIDENT),
            1848 << 20
        );
        assert_eq!(
            limit_change(Sizing::PerThread, 8192, 1024, RESIDENT),
            -(1848 << 20)
        );
        assert_eq!(local_growth(24 << 10, 1024, RESIDENT), 6072 << 20);
        assert_eq!(local_growth(512, 1024, RESIDENT), 0);
        assert_eq!(
            limit_change(Sizing::Heap, 8 * MB, 2048 * MB, RESIDENT),
            i128::from(2040 * MB)
        );
        assert_eq!(limit_change(Sizing::Measured, 0, 100, RESIDENT), 0);
        assert_eq!(
            limit_change(Sizing::PerThread, 0, u64::MAX, u64::MAX),
            i128::MAX
        );
        assert_eq!(resident_threads(132, 2048), Some(RESIDENT));
        assert_eq!(resident_threads(0, 2048), None);
        assert_eq!(resident_threads(132, -1), None);
    }

    #[test]
    fn a_stack_raise_over_the_limit_is_refused_without_the_driver() {
        let l = MemLedger::with_limit(0, 1024 * MB);
        let d = Model::new();
        let t = Limits::default();
        let e = t.set_limit(&l, &d, 0, CTX, 0, 8192).unwrap_err();
        assert_eq!(e.code(), CUDA_ERROR_OUT_OF_MEMORY);
        assert_eq!(d.sets.get(), 0, "the driver is not called");
        assert_eq!(d.get_limit(0), Ok(1024));
        assert_eq!(l.total(0), 0);
    }

    #[test]
    fn a_stack_raise_is_charged_and_its_lowering_gives_it_back() {
        let l = MemLedger::with_limit(0, 4096 * MB);
        let d = Model::new();
        let t = Limits::default();
        t.set_limit(&l, &d, 0, CTX, 0, 8192).unwrap();
        assert_eq!(l.used(0, UsageKind::Context), 1848 * MB);
        assert_eq!(t.charges(CTX).unwrap().reserved, 8192);
        // Lowering below the first-seen value gives back only what was charged.
        t.set_limit(&l, &d, 0, CTX, 0, 512).unwrap();
        assert_eq!(l.used(0, UsageKind::Context), 0);
        assert_eq!(t.charges(CTX).unwrap().stack, 0);
    }

    #[test]
    fn a_refused_driver_call_keeps_nothing_charged() {
        let l = MemLedger::with_limit(0, 4096 * MB);
        let d = Model::new();
        d.set_result.set(CUDA_ERROR_INVALID_VALUE);
        let t = Limits::default();
        let e = t.set_limit(&l, &d, 0, CTX, 2, 512 * MB).unwrap_err();
        assert_eq!(e, LimitError::Driver(CUDA_ERROR_INVALID_VALUE));
        assert_eq!(l.total(0), 0);
    }

    #[test]
    fn heap_and_fifo_raises_are_charged_by_their_size() {
        let l = MemLedger::with_limit(0, 1024 * MB);
        let d = Model::new();
        let t = Limits::default();
        let e = t.set_limit(&l, &d, 0, CTX, 2, 2048 * MB).unwrap_err();
        assert!(matches!(
            e,
            LimitError::Denied {
                what: "malloc heap",
                ..
            }
        ));
        assert_eq!(d.sets.get(), 0);
        t.set_limit(&l, &d, 0, CTX, 2, 264 * MB).unwrap();
        t.set_limit(&l, &d, 0, CTX, 1, 8_650_752 + 100 * MB)
            .unwrap();
        assert_eq!(l.used(0, UsageKind::Context), 356 * MB);
        t.set_limit(&l, &d, 0, CTX, 2, 8 * MB).unwrap();
        assert_eq!(l.used(0, UsageKind::Context), 100 * MB);
        // Device-runtime and other limits pass through, uncharged.
        t.set_limit(&l, &d, 0, CTX, 4, 4096).unwrap();
        assert_eq!(l.used(0, UsageKind::Context), 100 * MB);
        t.drop_context(&l, CTX);
        assert_eq!(l.total(0), 0);
        assert_eq!(t.charges(CTX), None);
    }

    #[test]
    fn a_pending_heap_raise_is_realised_by_the_next_launch_only() {
        let l = MemLedger::with_limit(0, 4096 * MB);
        let d = Model::new();
        let t = Limits::default();
        t.after_launch(true, cur);
        assert_eq!(t.on_device(0), 0);
        t.set_limit(&l, &d, 0, CTX, 2, 520 * MB).unwrap();
        t.set_limit(&l, &d, 0, CTX, 2, 264 * MB).unwrap(); // lowered before any launch
        assert_eq!(t.charges(CTX).unwrap().pending, 256 * MB);
        t.after_launch(false, cur); // a failed launch puts nothing there
        assert_eq!(t.on_device(0), 0);
        t.after_launch(true, cur);
        assert_eq!(t.on_device(0), 256 * MB);
        t.after_launch(true, cur);
        assert_eq!(t.on_device(0), 256 * MB, "once");
        assert_eq!(l.used(0, UsageKind::Context), 256 * MB, "still charged");
        // The stack is there at the set; the context's end takes everything away.
        t.set_limit(&l, &d, 0, CTX, 0, 2048).unwrap();
        assert_eq!(t.on_device(0), 256 * MB + 264 * MB);
        t.set_limit(&l, &d, 0, CTX, 0, 1536).unwrap();
        assert_eq!(t.on_device(0), 256 * MB + 132 * MB);
        t.drop_context(&l, CTX);
        assert_eq!(t.on_device(0), 0);
        assert_eq!(l.total(0), 0);
    }

    #[test]
    fn a_launch_needing_local_memory_is_admitted_first_and_set_once() {
        let l = MemLedger::with_limit(0, 8192 * MB);
        let d = Model::new();
        let t = Limits::default();
        t.before_launch(&l, &d, 0xf1, cur).unwrap();
        assert_eq!(l.used(0, UsageKind::Context), 6072 * MB);
        assert_eq!(d.get_limit(0), Ok(24 << 10), "the stack limit was raised");
        assert_eq!(d.sets.get(), 1);
        for _ in 0..10 {
            t.before_launch(&l, &d, 0xf1, cur).unwrap();
            t.before_launch(&l, &d, 0xf2, cur).unwrap();
        }
        assert_eq!(d.sets.get(), 1, "later launches grow nothing");
        assert_eq!(d.local_reads.get(), 2, "local sizes are cached");
        assert_eq!(l.used(0, UsageKind::Context), 6072 * MB);
        // Lowering the limit gives it back; the next launch grows it again.
        t.set_limit(&l, &d, 0, CTX, 0, 1024).unwrap();
        assert_eq!(l.used(0, UsageKind::Context), 0);
        t.before_launch(&l, &d, 0xf1, cur).unwrap();
        assert_eq!(l.used(0, UsageKind::Context), 6072 * MB);
    }

    #[test]
    fn a_launch_beyond_the_quota_is_refused_and_changes_nothing() {
        let l = MemLedger::with_limit(0, 1024 * MB);
        let d = Model::new();
        let t = Limits::default();
        let e = t.before_launch(&l, &d, 0xf1, cur).unwrap_err();
        assert_eq!(e.code(), CUDA_ERROR_OUT_OF_MEMORY);
        assert_eq!(d.sets.get(), 0);
        assert_eq!(d.get_limit(0), Ok(1024));
        assert_eq!(l.total(0), 0);
        // Small kernels still launch.
        t.before_launch(&l, &d, 0xf2, cur).unwrap();
        t.before_launch(&l, &d, 0xf3, cur).unwrap();
    }

    #[test]
    fn a_driver_out_of_memory_refuses_the_launch_and_uncharges() {
        let l = MemLedger::with_limit(0, 8192 * MB);
        let d = Model::new();
        d.set_result.set(CUDA_ERROR_OUT_OF_MEMORY);
        let t = Limits::default();
        let e = t.before_launch(&l, &d, 0xf1, cur).unwrap_err();
        assert_eq!(e, LimitError::Driver(CUDA_ERROR_OUT_OF_MEMORY));
        assert_eq!(l.total(0), 0);
    }

    #[test]
    fn a_limit_grown_elsewhere_is_not_charged_or_lowered() {
        let l = MemLedger::with_limit(0, 8192 * MB);
        let d = Model::new();
        let t = Limits::default();
        t.before_launch(&l, &d, 0xf2, cur).unwrap(); // records the context at 1024
        d.limits.borrow_mut()[0] = 32 << 10; // an unhooked path grew it
        t.before_launch(&l, &d, 0xf1, cur).unwrap();
        assert_eq!(d.get_limit(0), Ok(32 << 10));
        assert_eq!(l.total(0), 0);
    }

    #[test]
    fn a_measured_limit_is_charged_and_launches_still_grow() {
        let l = MemLedger::with_limit(0, 8192 * MB);
        let d = Model::new();
        let t = Limits::default();
        t.charge_measured(&l, &d, 0, CTX, 64 * MB).unwrap();
        let e = t.charge_measured(&l, &d, 0, CTX, 8192 * MB).unwrap_err();
        assert_eq!(e.code(), CUDA_ERROR_OUT_OF_MEMORY);
        t.before_launch(&l, &d, 0xf1, cur).unwrap();
        assert_eq!(l.used(0, UsageKind::Context), 64 * MB + 6072 * MB);
        t.drop_context(&l, CTX);
        assert_eq!(l.total(0), 0);
    }

    #[test]
    fn forgotten_functions_are_read_again() {
        let l = MemLedger::with_limit(0, 8192 * MB);
        let d = Model::new();
        let t = Limits::default();
        t.before_launch(&l, &d, 0xf3, cur).unwrap();
        t.before_launch(&l, &d, 0xf3, cur).unwrap();
        assert_eq!(d.local_reads.get(), 1);
        t.forget_functions();
        t.before_launch(&l, &d, 0xf3, cur).unwrap();
        assert_eq!(d.local_reads.get(), 2);
    }

    #[test]
    fn concurrent_launches_charge_one_growth() {
        use std::sync::Arc;
        /// A thread-safe model of the stack limit only.
        struct Shared(Mutex<u64>, AtomicU32);
        impl LimitDriver for Shared {
            fn get_limit(&self, _: i32) -> Result<u64, CUresult> {
                Ok(*self.0.lock().unwrap())
            }
            fn set_limit(&self, _: i32, v: u64) -> CUresult {
                self.1.fetch_add(1, Ordering::Relaxed);
                *self.0.lock().unwrap() = v;
                CUDA_SUCCESS
            }
            fn resident_threads(&self, _: usize) -> Option<u64> {
                Some(RESIDENT)
            }
            fn local_size(&self, _: u64, _: usize) -> Option<u64> {
                Some(24 << 10)
            }
        }
        let l = Arc::new(MemLedger::with_limit(0, 8192 * MB));
        let d = Arc::new(Shared(Mutex::new(1024), AtomicU32::new(0)));
        let t = Arc::new(Limits::default());
        let hs: Vec<_> = (0..8)
            .map(|_| {
                let (l, d, t) = (l.clone(), d.clone(), t.clone());
                std::thread::spawn(move || {
                    for _ in 0..100 {
                        t.before_launch(&*l, &*d, 0xf1, cur).unwrap();
                    }
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
        assert_eq!(l.used(0, UsageKind::Context), 6072 * MB);
        assert_eq!(d.1.load(Ordering::Relaxed), 1);
    }
}
