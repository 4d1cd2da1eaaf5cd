//! CUDA contexts: their accounting. This file holds primary contexts (retain / release /
//! reset) and created contexts (`cuCtxCreate_*` / `cuCtxDestroy_v2`), charged as context
//! memory, plain Rust over a [`Ledger`] with the driver calls and the memory readings as
//! closures ([`ContextMeter`]; the real driver's and NVML's is [`crate::measure`]). Beside it:
//! * [`lock`] — the region-wide context-creation lock around a measurement;
//! * [`admit`] — the admission of a context before its creation (the plain policy).
//!
//! The context → device cache of the allocation path is [`crate::ledger::ctx_devices`].

pub mod admit;
pub mod lock;

use crate::ffi::cuda::{CUresult, CUDA_ERROR_OUT_OF_MEMORY, CUDA_SUCCESS};
use crate::ledger::accounting::{Accounts, Deny, Ledger};
use crate::ledger::policy::{
    context_cost, driver_context_cost, ContextCost, ContextReadings, DriverReadings,
};
use admit::Footprint;
use hami_abi::layout::{UsageKind, MAX_DEVICES};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};

#[derive(Clone, Copy, Default, Debug)]
struct Primary {
    ctx: usize,
    count: u32,
    bytes: u64,
}

#[derive(Default)]
struct Inner {
    primary: [Primary; MAX_DEVICES],
    created: HashMap<usize, (usize, u64)>,
}

/// This process's contexts and what each was charged.
#[derive(Default)]
pub struct ContextTable {
    inner: Mutex<Inner>,
    /// NVML's process list has shown this process (its pid is the one NVML reports): later
    /// context creations are measured per process, without the region-wide lock.
    listed: AtomicBool,
}

/// This process's used memory on a device, per NVML's list of running processes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OwnUsage {
    /// Listed with this many bytes.
    Listed(u64),
    /// The list was read and this process is not in it (no context there yet, or NVML
    /// numbers processes in another pid namespace).
    NotListed,
    /// The list could not be read.
    Unavailable,
}

/// A held lock; released when dropped.
pub type Held = Box<dyn std::any::Any>;

/// How the memory of a new context is determined (its readings and the region-wide lock).
#[derive(Clone, Copy)]
pub struct ContextMeter<'a> {
    /// `HAMI_CONTEXT_OVERHEAD`, if set.
    pub configured: Option<u64>,
    /// Reads the device's used memory (NVML), `None` when not available.
    pub used_now: &'a dyn Fn(usize) -> Option<u64>,
    /// Reads this process's own used memory on the device (NVML process list).
    pub own_used: &'a dyn Fn(usize) -> OwnUsage,
    /// Bytes of non-context memory this process has charged on the device (to subtract
    /// data allocated by other threads while the context was created).
    pub own_data: &'a dyn Fn(usize) -> u64,
    /// Bytes of non-context memory every process sharing the region has charged on the
    /// device (to subtract their allocations from a device-level delta).
    pub region_data: &'a dyn Fn(usize) -> u64,
    /// Takes the region-wide context-creation lock (`None`: not available).
    pub serialize: &'a dyn Fn() -> Option<Held>,
    /// NVML is available. When it is not, context memory is measured through the driver
    /// ([`ContextMeter::driver_info`]).
    pub nvml: bool,
    /// `(free, total)` of a context's device per the driver's `cuMemGetInfo_v2`, the context
    /// made current for the reading and the caller's current context restored (`None`: not
    /// available).
    pub driver_info: &'a dyn Fn(usize) -> Option<(u64, u64)>,
    /// Bytes every process sharing the region has charged on the device, all kinds.
    pub region_used: &'a dyn Fn(usize) -> u64,
    /// The device's context footprint as the region holds it (0 = not measured yet).
    pub footprint: &'a dyn Fn(usize) -> u64,
    /// Stores a measured footprint of the device in the region.
    pub set_footprint: &'a dyn Fn(usize, u64),
}

/// What a context creation did (for the log line of the hook).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ContextOutcome {
    /// Admitted with `footprint` before the driver was called, created, measured as `cost`
    /// and now charged `charged`.
    Charged {
        /// What was admitted before the creation, and where the figure came from.
        footprint: Footprint,
        /// Whether the admission went through the region (`false`: the region refused for a
        /// reason other than the quota, e.g. allocations failing closed; the context was
        /// created as before, charged after the measurement).
        admitted: bool,
        /// How the context was measured.
        cost: ContextCost,
        /// Bytes the context is charged from now on.
        charged: u64,
        /// How long the creation waited for another process to measure the container's
        /// first context on the device (`None`: the footprint was known, no wait).
        waited: Option<std::time::Duration>,
    },
    /// Refused (`CUDA_ERROR_OUT_OF_MEMORY`): the device's context footprint does not fit
    /// the quota. Nothing stays created or charged.
    Refused {
        /// The footprint that did not fit.
        footprint: Footprint,
        /// The region's refusal.
        deny: Deny,
        /// `false`: refused before the driver was called. `true`: the container's first
        /// context on the device (nothing known to admit before) was created, measured,
        /// found not to fit and destroyed again.
        destroyed: bool,
    },
}

impl ContextOutcome {
    /// How the context was measured, if it was created.
    pub fn cost(&self) -> Option<ContextCost> {
        match self {
            ContextOutcome::Charged { cost, .. } => Some(*cost),
            ContextOutcome::Refused { .. } => None,
        }
    }
}

impl ContextMeter<'_> {
    /// Runs `call` (a context creation on `dev`) between readings. Unless this process is
    /// already known to appear in NVML's process list (`listed`), the region-wide lock is
    /// held around the readings and the call, so that a device-level fallback is not
    /// disturbed by another process's concurrent context creation.
    ///
    /// Without NVML the driver is read instead (always under the lock): `existing`, a
    /// context this process already has on `dev`, gives the reading before the call.
    fn around(
        &self,
        dev: usize,
        existing: Option<usize>,
        listed: &AtomicBool,
        call: impl FnOnce() -> Result<usize, CUresult>,
    ) -> (Result<usize, CUresult>, ContextCost) {
        let held = if self.wants_lock(listed) {
            (self.serialize)()
        } else {
            None
        };
        let (r, cost, _held) = self.around_held(dev, existing, listed, held, 0, call);
        (r, cost)
    }

    /// Whether a measurement takes the region-wide lock: when NVML is unavailable (the
    /// driver-only method) or this process is not yet known to be in NVML's process list.
    fn wants_lock(&self, listed: &AtomicBool) -> bool {
        self.configured.is_none() && (!self.nvml || !listed.load(Ordering::Relaxed))
    }

    /// [`ContextMeter::around`] with the region-wide lock already taken by the caller (`held`,
    /// `None`: not held), handed back so that the caller can finish under it. `admitted`:
    /// bytes this process already charged in the region for the context being created (its
    /// pre-admitted footprint), not on the device yet before the call.
    fn around_held(
        &self,
        dev: usize,
        existing: Option<usize>,
        listed: &AtomicBool,
        held: Option<Held>,
        admitted: u64,
        call: impl FnOnce() -> Result<usize, CUresult>,
    ) -> (Result<usize, CUresult>, ContextCost, Option<Held>) {
        if let Some(b) = self.configured {
            return (call(), ContextCost::Configured(b), held);
        }
        if !self.nvml {
            return self.around_driver(dev, existing, held, admitted, call);
        }
        let data_before = (self.own_data)(dev);
        let mut region_before = (self.region_data)(dev);
        let own_before = match (self.own_used)(dev) {
            OwnUsage::Listed(b) => Some(b),
            OwnUsage::NotListed => Some(0),
            OwnUsage::Unavailable => None,
        };
        let mut dev_before = (self.used_now)(dev);
        if held.is_some() && !listed.load(Ordering::Relaxed) {
            // The device-level fallback (this process not listed by NVML): another process
            // may be between its admission (charged in the region) and its driver call (not
            // yet on the device). Let it reach the driver before the readings are taken.
            (dev_before, region_before) = settle_readings(region_before, || {
                ((self.used_now)(dev), (self.region_data)(dev))
            });
        }
        let r = call();
        if r.is_err() {
            return (r, ContextCost::Unknown, held);
        }
        let own_after = match (self.own_used)(dev) {
            OwnUsage::Listed(a) => Some(a),
            _ => None,
        };
        let mut dev_after = (self.used_now)(dev);
        let change = |now: u64, before: u64| (i128::from(now) - i128::from(before)) as i64;
        let own_meanwhile = change((self.own_data)(dev), data_before);
        let mut region_after = (self.region_data)(dev);
        if region_after != region_before && own_after.is_none() {
            // Another process allocated or freed meanwhile: the region is charged before its
            // driver call (and uncharged after a free), so the device reading may not show
            // it yet. Read both again until the region figure holds still across a pause.
            (dev_after, region_after) = settle_readings(region_after, || {
                ((self.used_now)(dev), (self.region_data)(dev))
            });
        }
        let region_meanwhile = change(region_after, region_before);
        let serialized = held.is_some();
        if own_after.is_some() {
            listed.store(true, Ordering::Relaxed);
        }
        let readings = ContextReadings {
            own_before,
            own_after,
            dev_before,
            dev_after,
            own_meanwhile,
            region_meanwhile,
            serialized,
        };
        (r, context_cost(None, &readings), held)
    }

    /// The driver-only measurement (NVML unavailable), under the region-wide lock (`held`,
    /// taken by the caller). `admitted`: as for [`ContextMeter::around_held`]; it is in the region's
    /// accounted usage but was not on the device before the call.
    fn around_driver(
        &self,
        dev: usize,
        existing: Option<usize>,
        held: Option<Held>,
        admitted: u64,
        call: impl FnOnce() -> Result<usize, CUresult>,
    ) -> (Result<usize, CUresult>, ContextCost, Option<Held>) {
        let region_before = (self.region_data)(dev);
        let free_before = existing
            .and_then(|c| (self.driver_info)(c))
            .map(|(free, _)| free);
        let r = call();
        let Ok(ctx) = r else {
            return (r, ContextCost::Unknown, held);
        };
        let mut after = (self.driver_info)(ctx);
        let mut region_after = (self.region_data)(dev);
        if region_after != region_before {
            // As in `around`: another process's allocation may be charged and not yet made.
            (after, region_after) = settle_readings(region_after, || {
                ((self.driver_info)(ctx), (self.region_data)(dev))
            });
        }
        let region_meanwhile = (i128::from(region_after) - i128::from(region_before)) as i64;
        // Our own admission is in the region's figure; the residual method wants what the
        // region accounted apart from the new context.
        let region_used = (self.region_used)(dev).saturating_sub(admitted);
        let serialized = held.is_some();
        let readings = DriverReadings {
            free_before,
            after,
            region_meanwhile,
            region_used,
            serialized,
        };
        (r, driver_context_cost(&readings), held)
    }
}

/// Pause between two readings of [`settle_readings`].
const SETTLE_PAUSE: std::time::Duration = std::time::Duration::from_millis(10);
/// Most readings [`settle_readings`] takes (at most ~100 ms, only when another process's data
/// changed during a context creation).
const SETTLE_TRIES: usize = 10;

/// Reads `(device figure, region data)` with `read` after a pause, again and again, until the
/// region data equals the previous reading (`last` first): the allocations and frees other
/// processes were making during a measurement have then reached the driver, and the device
/// figure read with it includes them. Gives the latest pair after [`SETTLE_TRIES`] readings.
fn settle_readings<D>(mut last: u64, read: impl Fn() -> (D, u64)) -> (D, u64) {
    let mut tries = 0;
    loop {
        std::thread::sleep(SETTLE_PAUSE);
        let (d, region) = read();
        tries += 1;
        if region == last || tries >= SETTLE_TRIES {
            return (d, region);
        }
        last = region;
    }
}

impl ContextTable {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A context creation on `dev` (a first primary retain, a `cuCtxCreate*`): admitted
    /// with the device's footprint before `call` (refused with `CUDA_ERROR_OUT_OF_MEMORY`,
    /// without calling the driver, when it does not fit the quota), measured around it, then
    /// charged what was measured (the difference from the admitted figure charged or given
    /// back) and the measurement stored as the device's footprint (see [`admit`]).
    ///
    /// When the footprint is not known yet (the container's first context on the device),
    /// the region-wide context-creation lock is taken first (bounded wait, see [`lock`]) and
    /// held until the measurement is stored: a process starting at the same moment waits
    /// for it there, reads the footprint again and admits it. When the measurement itself
    /// takes the lock, the admission is made under it too. The container's first context,
    /// admitted with nothing, is admitted with its measurement after the creation; if that
    /// does not fit, `undo` destroys it (returns whether the driver did) and the creation
    /// is refused. Returns the context and the bytes it is now charged, and what happened.
    fn admit_create<L: Ledger + ?Sized>(
        &self,
        ledger: &L,
        dev: usize,
        existing: Option<usize>,
        meter: &ContextMeter<'_>,
        call: impl FnOnce() -> Result<usize, CUresult>,
        undo: impl FnOnce(usize) -> bool,
    ) -> (Result<(usize, u64), CUresult>, Option<ContextOutcome>) {
        let mut fp = admit::footprint(meter.configured, (meter.footprint)(dev));
        let mut waited = None;
        let unknown = fp == Footprint::Unknown;
        let held = if unknown || meter.wants_lock(&self.listed) {
            let t = std::time::Instant::now();
            let held = (meter.serialize)();
            if unknown {
                waited = Some(t.elapsed());
                // Another process may have measured it while we waited.
                fp = admit::footprint(meter.configured, (meter.footprint)(dev));
            }
            held
        } else {
            None
        };
        let want = fp.bytes();
        let admitted = match ledger.try_charge(dev, UsageKind::Context, want) {
            Ok(()) => true,
            Err(deny) if deny.is_over_limit() => {
                return (
                    Err(CUDA_ERROR_OUT_OF_MEMORY),
                    Some(ContextOutcome::Refused {
                        footprint: fp,
                        deny,
                        destroyed: false,
                    }),
                );
            }
            // Failing closed for allocations (configuration, region, slot): the context is
            // not the application's allocation; it is created and charged after as before.
            Err(_) => false,
        };
        let pre = if admitted { want } else { 0 };
        let (r, cost, held) = meter.around_held(dev, existing, &self.listed, held, pre, call);
        let ctx = match r {
            Ok(ctx) => ctx,
            Err(e) => {
                ledger.uncharge(dev, UsageKind::Context, pre);
                return (Err(e), None);
            }
        };
        let settled = admit::settle(pre, cost, existing.is_none());
        if let Some(b) = settled.store {
            (meter.set_footprint)(dev, b);
        }
        if settled.charged > pre {
            let extra = settled.charged - pre;
            // Nothing was known to admit (the container's first context on the device): the
            // measured context is admitted now like any other, and one that does not fit is
            // destroyed again (the footprint stays stored: the next one is refused before
            // the driver is asked).
            let refused = match fp {
                Footprint::Unknown if admitted => {
                    match ledger.try_charge(dev, UsageKind::Context, extra) {
                        Ok(()) => None,
                        Err(deny) if deny.is_over_limit() => Some(deny),
                        Err(_) => {
                            // Not a quota refusal (e.g. the region lock timed out): the
                            // driver holds it, so it is recorded all the same.
                            ledger.force_charge(dev, UsageKind::Context, extra);
                            None
                        }
                    }
                }
                _ => {
                    // The driver already holds it: beyond the quota if need be.
                    ledger.force_charge(dev, UsageKind::Context, extra);
                    None
                }
            };
            if let Some(deny) = refused {
                if undo(ctx) {
                    return (
                        Err(CUDA_ERROR_OUT_OF_MEMORY),
                        Some(ContextOutcome::Refused {
                            footprint: Footprint::Measured(settled.charged),
                            deny,
                            destroyed: true,
                        }),
                    );
                }
                // Could not be destroyed: the application keeps it, charged as it is.
                ledger.force_charge(dev, UsageKind::Context, extra);
            }
        } else {
            ledger.uncharge(dev, UsageKind::Context, pre - settled.charged);
        }
        // Released only now: a waiter reads the stored footprint.
        drop(held);
        (
            Ok((ctx, settled.charged)),
            Some(ContextOutcome::Charged {
                footprint: fp,
                admitted,
                cost,
                charged: settled.charged,
                waited,
            }),
        )
    }

    /// `cuDevicePrimaryCtxRetain`: the first retain of `dev` in this process admits the
    /// context's footprint before `call` and charges what it measures (see
    /// [`ContextTable::admit_create`]); a retain of a retained primary context admits
    /// nothing. `call` returns the context; `undo` releases it again (a first retain that
    /// turned out not to fit). Returns the driver's code (or `CUDA_ERROR_OUT_OF_MEMORY`) and,
    /// for a first retain, what happened.
    pub fn primary_retain<L: Ledger + ?Sized>(
        &self,
        ledger: &L,
        dev: usize,
        meter: &ContextMeter<'_>,
        call: impl FnOnce() -> Result<usize, CUresult>,
        undo: impl FnOnce(usize) -> bool,
    ) -> (CUresult, Option<ContextOutcome>) {
        if dev >= MAX_DEVICES {
            return (call().err().unwrap_or(CUDA_SUCCESS), None);
        }
        let mut g = self.lock();
        if g.primary[dev].count > 0 {
            return match call() {
                Ok(ctx) => {
                    g.primary[dev].count += 1;
                    g.primary[dev].ctx = ctx;
                    (CUDA_SUCCESS, None)
                }
                Err(e) => (e, None),
            };
        }
        let existing = Self::existing(&g, dev);
        let (r, outcome) = self.admit_create(ledger, dev, existing, meter, call, undo);
        match r {
            Ok((ctx, bytes)) => {
                g.primary[dev] = Primary {
                    ctx,
                    count: 1,
                    bytes,
                };
                (CUDA_SUCCESS, outcome)
            }
            Err(e) => (e, outcome),
        }
    }

    /// `cuDevicePrimaryCtxRelease(_v2)`: the last release destroys the primary context and
    /// everything allocated in it.
    pub fn primary_release<L: Ledger + ?Sized>(
        &self,
        ledger: &L,
        accounts: &Accounts,
        dev: usize,
        call: impl FnOnce() -> CUresult,
    ) -> CUresult {
        if dev >= MAX_DEVICES {
            return call();
        }
        let mut g = self.lock();
        let r = call();
        if r == CUDA_SUCCESS && g.primary[dev].count > 0 {
            g.primary[dev].count -= 1;
            if g.primary[dev].count == 0 {
                let p = std::mem::take(&mut g.primary[dev]);
                ledger.uncharge(dev, UsageKind::Context, p.bytes);
                accounts.drop_context(ledger, p.ctx);
            }
        }
        r
    }

    /// `cuDevicePrimaryCtxReset(_v2)`: destroys every allocation of the primary context.
    pub fn primary_reset<L: Ledger + ?Sized>(
        &self,
        ledger: &L,
        accounts: &Accounts,
        dev: usize,
        call: impl FnOnce() -> CUresult,
    ) -> CUresult {
        if dev >= MAX_DEVICES {
            return call();
        }
        let g = self.lock();
        let r = call();
        if r == CUDA_SUCCESS {
            accounts.drop_context(ledger, g.primary[dev].ctx);
        }
        r
    }

    /// A context this process already has on `dev` (its primary context if retained, else
    /// a created one).
    fn existing(g: &Inner, dev: usize) -> Option<usize> {
        let p = g.primary[dev];
        if p.count > 0 && p.ctx != 0 {
            return Some(p.ctx);
        }
        g.created
            .iter()
            .find(|(_, &(d, _))| d == dev)
            .map(|(&c, _)| c)
    }

    /// Measures the device memory `call` brings onto `dev` (a module load, a first lookup or
    /// launch), as context memory is measured: `existing` is a context of this process on
    /// `dev` (for the driver-only reading) and `call` returns the context to read through
    /// afterwards. `meter.configured` is ignored: that is a context figure.
    pub fn measure(
        &self,
        dev: usize,
        existing: Option<usize>,
        meter: &ContextMeter<'_>,
        call: impl FnOnce() -> Result<usize, CUresult>,
    ) -> (Result<usize, CUresult>, ContextCost) {
        let m = ContextMeter {
            configured: None,
            ..*meter
        };
        m.around(dev, existing, &self.listed, call)
    }

    /// The primary context of `dev` as last retained (0 if none).
    pub fn primary_ctx(&self, dev: usize) -> usize {
        self.lock().primary.get(dev).map_or(0, |p| p.ctx)
    }

    /// `cuCtxCreate*`: admits the device's context footprint before `call` and charges what
    /// the new context measures (see [`ContextTable::admit_create`]; `undo` destroys the
    /// context again).
    pub fn create<L: Ledger + ?Sized>(
        &self,
        ledger: &L,
        dev: usize,
        meter: &ContextMeter<'_>,
        call: impl FnOnce() -> Result<usize, CUresult>,
        undo: impl FnOnce(usize) -> bool,
    ) -> (CUresult, Option<ContextOutcome>) {
        if dev >= MAX_DEVICES {
            return (call().err().unwrap_or(CUDA_SUCCESS), None);
        }
        let mut g = self.lock();
        let existing = Self::existing(&g, dev);
        let (r, outcome) = self.admit_create(ledger, dev, existing, meter, call, undo);
        match r {
            Ok((ctx, bytes)) => {
                if let Some((odev, obytes)) = g.created.insert(ctx, (dev, bytes)) {
                    ledger.uncharge(odev, UsageKind::Context, obytes);
                }
                (CUDA_SUCCESS, outcome)
            }
            Err(e) => (e, outcome),
        }
    }

    /// `cuCtxDestroy_v2`: releases the context's memory and everything allocated in it.
    pub fn destroy<L: Ledger + ?Sized>(
        &self,
        ledger: &L,
        accounts: &Accounts,
        ctx: usize,
        call: impl FnOnce() -> CUresult,
    ) -> CUresult {
        let mut g = self.lock();
        let r = call();
        if r == CUDA_SUCCESS {
            if let Some((dev, bytes)) = g.created.remove(&ctx) {
                ledger.uncharge(dev, UsageKind::Context, bytes);
            }
            accounts.drop_context(ledger, ctx);
        }
        r
    }
}

#[cfg(test)]
mod tests;
