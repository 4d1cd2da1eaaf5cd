//! CUDA contexts: their accounting. This file holds primary contexts (retain / release /
//! reset) and created contexts (`cuCtxCreate_*` / `cuCtxDestroy_v2`), charged as context
//! memory, plain Rust over a [`Ledger`] with the driver calls and the memory readings as
//! closures ([`Meter`]; the real driver's and NVML's is [`crate::measure`]). Beside it:
//! * [`lock`] — the region-wide context-creation lock around a measurement;
//! * [`admit`] — the admission of a context before its creation (the plain policy).
//!
//! The context → device cache of the allocation path is [`crate::ctx_devices`].

pub mod admit;
pub mod lock;

use crate::accounting::{Accounts, Deny, Ledger};
use crate::cuda::{CUresult, CUDA_ERROR_OUT_OF_MEMORY, CUDA_SUCCESS};
use crate::policy::{
    context_cost, driver_context_cost, ContextCost, ContextReadings, DriverReadings,
};
use admit::Footprint;
use hami_common::layout::{UsageKind, MAX_DEVICES};
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

/// How the memory of a new context is determined.
#[derive(Clone, Copy)]
pub struct Meter<'a> {
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
    /// ([`Meter::driver_info`]).
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

impl Meter<'_> {
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

    /// [`Meter::around`] with the region-wide lock already taken by the caller (`held`,
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
    /// taken by the caller). `admitted`: as for [`Meter::around_held`]; it is in the region's
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
        meter: &Meter<'_>,
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
        meter: &Meter<'_>,
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
        meter: &Meter<'_>,
        call: impl FnOnce() -> Result<usize, CUresult>,
    ) -> (Result<usize, CUresult>, ContextCost) {
        let m = Meter {
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
        meter: &Meter<'_>,
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
mod tests {
    use super::*;
    use crate::accounting::{Allocated, KeySpace, MemLedger};

    const MB: u64 = 1 << 20;

    /// A meter with no NVML and no lock.
    const NO_NVML: Meter<'static> = Meter {
        configured: None,
        used_now: &|_| None,
        own_used: &|_| OwnUsage::Unavailable,
        own_data: &|_| 0,
        region_data: &|_| 0,
        serialize: &|| None,
        nvml: false,
        driver_info: &|_| None,
        region_used: &|_| 0,
        footprint: &|_| 0,
        set_footprint: &|_, _| {},
    };

    /// Two processes share a device; `other` creates a context while we create ours.
    #[test]
    fn per_process_measurement_ignores_other_processes() {
        use std::cell::Cell;
        let l = MemLedger::with_limit(0, 2 << 30);
        let t = ContextTable::default();
        let device = Cell::new(1000 * MB);
        let mine = Cell::new(None::<u64>);
        let locks = Cell::new(0);
        let used_now = |_d: usize| Some(device.get());
        let own_used = |_d: usize| mine.get().map_or(OwnUsage::NotListed, OwnUsage::Listed);
        let serialize = || -> Option<Held> {
            locks.set(locks.get() + 1);
            Some(Box::new(()))
        };
        let fp = Cell::new(0u64);
        let footprint = |_d: usize| fp.get();
        let set_footprint = |_d: usize, b: u64| fp.set(b);
        let m = Meter {
            configured: None,
            used_now: &used_now,
            own_used: &own_used,
            own_data: &|_| 0,
            region_data: &|_| 0,
            serialize: &serialize,
            nvml: true,
            footprint: &footprint,
            set_footprint: &set_footprint,
            ..NO_NVML
        };
        let (r, cost) = t.primary_retain(
            &l,
            0,
            &m,
            || {
                // Ours (518 MiB) and another process's (520 MiB) at the same moment.
                device.set(device.get() + 518 * MB + 520 * MB);
                mine.set(Some(518 * MB));
                Ok(0xc0)
            },
            |_| true,
        );
        assert_eq!(r, CUDA_SUCCESS);
        assert_eq!(
            cost.and_then(|o| o.cost()),
            Some(ContextCost::PerProcess(518 * MB))
        );
        assert_eq!(l.used(0, UsageKind::Context), 518 * MB);
        assert_eq!(locks.get(), 1, "first creation: not yet known to be listed");
        // A created context on the same device: only its own growth counts, no lock now.
        let (_, cost) = t.create(
            &l,
            0,
            &m,
            || {
                mine.set(Some(518 * MB + 64 * MB));
                device.set(device.get() + 64 * MB + 700 * MB);
                Ok(0xc1)
            },
            |_| true,
        );
        assert_eq!(
            cost.and_then(|o| o.cost()),
            Some(ContextCost::PerProcess(64 * MB))
        );
        assert_eq!(locks.get(), 1);
        assert_eq!(l.used(0, UsageKind::Context), 582 * MB);
    }

    /// The device-level fallback while another process allocates: its admission charges the
    /// region before its driver call puts the bytes on the device. Read in between, the
    /// region's figure ran ahead of the device's and the context was charged 300 MiB too
    /// little (the flaky `concurrent_context_creation_without_per_process_nvml_is_serialized`
    /// saw 200 MiB for a 500 MiB context); the readings now wait for the region to hold still.
    #[test]
    fn another_processs_allocation_between_admission_and_driver_is_not_subtracted_early() {
        use std::cell::Cell;
        let l = MemLedger::with_limit(0, 1 << 32);
        let t = ContextTable::default();
        let device = Cell::new(1000 * MB);
        let region = Cell::new(0u64);
        // Device readings after the call: the other process's 300 MiB reaches the device
        // at the second one.
        let reads_after = Cell::new(None::<u32>);
        let used_now = |_d: usize| {
            if let Some(n) = reads_after.get() {
                reads_after.set(Some(n + 1));
                if n == 1 {
                    device.set(device.get() + 300 * MB);
                }
            }
            Some(device.get())
        };
        let region_data = |_d: usize| region.get();
        let m = Meter {
            configured: None,
            used_now: &used_now,
            own_used: &|_| OwnUsage::NotListed,
            own_data: &|_| 0,
            region_data: &region_data,
            serialize: &|| -> Option<Held> { Some(Box::new(())) },
            nvml: true,
            ..NO_NVML
        };
        let (r, cost) = t.primary_retain(
            &l,
            0,
            &m,
            || {
                device.set(device.get() + 500 * MB);
                // The other process's admission, its driver call still to come.
                region.set(region.get() + 300 * MB);
                reads_after.set(Some(0));
                Ok(0xc0)
            },
            |_| true,
        );
        assert_eq!(r, CUDA_SUCCESS);
        assert_eq!(
            l.used(0, UsageKind::Context),
            500 * MB,
            "{:?}",
            cost.and_then(|o| o.cost()).map(|c| c.bytes())
        );
    }

    /// NVML does not list our pid (container pid namespace): device-level delta, under the
    /// lock, minus the data this process allocated meanwhile.
    #[test]
    fn unlisted_process_falls_back_to_a_serialized_device_delta() {
        use std::cell::Cell;
        let l = MemLedger::with_limit(0, 1 << 30);
        let t = ContextTable::default();
        let device = Cell::new(0u64);
        let data = Cell::new(10 * MB);
        let held = std::rc::Rc::new(Cell::new(false));
        let used_now = |_d: usize| Some(device.get());
        let own_data = |_d: usize| data.get();
        struct Guard(std::rc::Rc<Cell<bool>>);
        impl Drop for Guard {
            fn drop(&mut self) {
                self.0.set(false);
            }
        }
        let h2 = held.clone();
        let serialize = move || -> Option<Held> {
            h2.set(true);
            Some(Box::new(Guard(h2.clone())))
        };
        let m = Meter {
            configured: None,
            used_now: &used_now,
            own_used: &|_| OwnUsage::NotListed,
            own_data: &own_data,
            region_data: &own_data,
            serialize: &serialize,
            nvml: true,
            ..NO_NVML
        };
        for round in 0..2 {
            let (_, cost) = t.create(
                &l,
                0,
                &m,
                || {
                    assert!(held.get(), "the lock is held around the creation");
                    device.set(device.get() + 300 * MB + 8 * MB);
                    data.set(data.get() + 8 * MB);
                    Ok(0xa0 + round)
                },
                |_| true,
            );
            assert!(!held.get(), "released after the measurement");
            assert_eq!(
                cost.and_then(|o| o.cost()),
                Some(ContextCost::DeviceDelta {
                    bytes: 300 * MB,
                    serialized: true
                })
            );
        }
        assert_eq!(l.used(0, UsageKind::Context), 600 * MB);
        // A failed creation charges nothing and releases the lock.
        assert_eq!(t.create(&l, 0, &m, || Err(2), |_| true).0, 2);
        assert!(!held.get());
        assert_eq!(l.used(0, UsageKind::Context), 600 * MB);
    }

    #[test]
    fn primary_lifecycle() {
        let l = MemLedger::with_limit(0, 1 << 30);
        let a = Accounts::default();
        let t = ContextTable::default();
        let used = std::cell::Cell::new(100 * MB);
        let read = |_d: usize| Some(used.get());
        let m = Meter {
            configured: None,
            used_now: &read,
            nvml: true,
            ..NO_NVML
        };
        let (r, cost) = t.primary_retain(
            &l,
            0,
            &m,
            || {
                used.set(400 * MB);
                Ok(0xc0)
            },
            |_| true,
        );
        assert_eq!(r, CUDA_SUCCESS);
        assert_eq!(
            cost.and_then(|o| o.cost()),
            Some(ContextCost::DeviceDelta {
                bytes: 300 * MB,
                serialized: false
            })
        );
        assert_eq!(l.used(0, UsageKind::Context), 300 * MB);
        // Second retain: no charge.
        assert_eq!(
            t.primary_retain(&l, 0, &m, || Ok(0xc0), |_| true).0,
            CUDA_SUCCESS
        );
        assert_eq!(l.used(0, UsageKind::Context), 300 * MB);
        a.alloc(
            &l,
            KeySpace::Pointer,
            0,
            0xc0,
            MB,
            || Ok(Allocated { key: 1, bytes: MB }),
            |_| {},
        )
        .unwrap();
        // A failed release changes nothing.
        assert_eq!(t.primary_release(&l, &a, 0, || 201), 201);
        assert_eq!(t.primary_release(&l, &a, 0, || CUDA_SUCCESS), CUDA_SUCCESS);
        assert_eq!(l.used(0, UsageKind::Context), 300 * MB);
        assert_eq!(l.used(0, UsageKind::Data), MB);
        // Last release: context and its allocations are gone.
        assert_eq!(t.primary_release(&l, &a, 0, || CUDA_SUCCESS), CUDA_SUCCESS);
        assert_eq!(l.total(0), 0);
        assert!(a.is_empty());
        // Release without retain: driver's answer, nothing changes.
        assert_eq!(t.primary_release(&l, &a, 0, || CUDA_SUCCESS), CUDA_SUCCESS);
        assert_eq!(l.total(0), 0);
    }

    #[test]
    fn configured_overhead_and_created_contexts() {
        let l = MemLedger::with_limit(1, 1 << 30);
        let a = Accounts::default();
        let t = ContextTable::default();
        let m = Meter {
            configured: Some(64 * MB),
            ..NO_NVML
        };
        assert_eq!(
            t.create(&l, 1, &m, || Ok(0xa), |_| true)
                .1
                .and_then(|o| o.cost()),
            Some(ContextCost::Configured(64 * MB))
        );
        assert_eq!(t.create(&l, 1, &m, || Err(2), |_| true).0, 2);
        assert_eq!(l.used(1, UsageKind::Context), 64 * MB);
        a.alloc(
            &l,
            KeySpace::Pointer,
            1,
            0xa,
            MB,
            || Ok(Allocated { key: 9, bytes: MB }),
            |_| {},
        )
        .unwrap();
        assert_eq!(t.destroy(&l, &a, 0xa, || 201), 201);
        assert_eq!(l.total(1), 65 * MB);
        assert_eq!(t.destroy(&l, &a, 0xa, || CUDA_SUCCESS), CUDA_SUCCESS);
        assert_eq!(l.total(1), 0);
        // Unmeasurable: nothing charged.
        let m = Meter {
            configured: None,
            ..NO_NVML
        };
        assert_eq!(
            t.create(&l, 1, &m, || Ok(0xb), |_| true)
                .1
                .and_then(|o| o.cost()),
            Some(ContextCost::Unknown)
        );
        assert_eq!(l.total(1), 0);
    }

    #[test]
    fn reset_drops_allocations_keeps_context() {
        let l = MemLedger::with_limit(0, 1 << 30);
        let a = Accounts::default();
        let t = ContextTable::default();
        let m = Meter {
            configured: Some(MB),
            ..NO_NVML
        };
        t.primary_retain(&l, 0, &m, || Ok(0xc0), |_| true);
        a.alloc(
            &l,
            KeySpace::Pointer,
            0,
            0xc0,
            5 * MB,
            || {
                Ok(Allocated {
                    key: 1,
                    bytes: 5 * MB,
                })
            },
            |_| {},
        )
        .unwrap();
        assert_eq!(t.primary_reset(&l, &a, 0, || CUDA_SUCCESS), CUDA_SUCCESS);
        assert_eq!(l.used(0, UsageKind::Data), 0);
        assert_eq!(l.used(0, UsageKind::Context), MB);
    }

    /// A meter whose device and per-process figures follow `dev_used` / `own` (NVML
    /// available, this process listed after its first context), with the footprint in
    /// `fp` and the lock counted in `locks`.
    struct Fake {
        dev_used: std::cell::Cell<u64>,
        own: std::cell::Cell<Option<u64>>,
        fp: std::cell::Cell<u64>,
        locks: std::cell::Cell<u32>,
    }

    impl Fake {
        fn new(fp: u64) -> Fake {
            Fake {
                dev_used: std::cell::Cell::new(0),
                own: std::cell::Cell::new(None),
                fp: std::cell::Cell::new(fp),
                locks: std::cell::Cell::new(0),
            }
        }

        /// The driver's context creation: `bytes` on the device and in this process.
        fn make(&self, bytes: u64) {
            self.dev_used.set(self.dev_used.get() + bytes);
            self.own.set(Some(self.own.get().unwrap_or(0) + bytes));
        }
    }

    /// Runs `f` with a meter over `fake`.
    fn with_meter<R>(fake: &Fake, configured: Option<u64>, f: impl FnOnce(&Meter<'_>) -> R) -> R {
        let used_now = |_d: usize| Some(fake.dev_used.get());
        let own_used = |_d: usize| fake.own.get().map_or(OwnUsage::NotListed, OwnUsage::Listed);
        let footprint = |_d: usize| fake.fp.get();
        let set_footprint = |_d: usize, b: u64| fake.fp.set(b);
        let serialize = || -> Option<Held> {
            fake.locks.set(fake.locks.get() + 1);
            Some(Box::new(()))
        };
        let m = Meter {
            configured,
            used_now: &used_now,
            own_used: &own_used,
            serialize: &serialize,
            nvml: true,
            footprint: &footprint,
            set_footprint: &set_footprint,
            ..NO_NVML
        };
        f(&m)
    }

    /// Issue 17: a second process of a container whose quota is full got its context anyway
    /// (the container then held the quota + 518 MiB). The known footprint is admitted before
    /// the driver is called; it does not fit, so the driver is never asked.
    #[test]
    fn a_context_that_does_not_fit_is_refused_before_the_driver_is_called() {
        let l = MemLedger::with_limit(0, 1024 * MB);
        l.try_charge(0, UsageKind::Data, 800 * MB).unwrap();
        let t = ContextTable::default();
        // Listed in NVML: the measurement takes no lock either.
        t.listed.store(true, Ordering::Relaxed);
        let fake = Fake::new(300 * MB);
        let called = std::cell::Cell::new(0);
        with_meter(&fake, None, |m| {
            for create in [false, true] {
                let call = || {
                    called.set(called.get() + 1);
                    Ok(0xc0)
                };
                let (r, o) = if create {
                    t.create(&l, 0, m, call, |_| true)
                } else {
                    t.primary_retain(&l, 0, m, call, |_| true)
                };
                assert_eq!(r, CUDA_ERROR_OUT_OF_MEMORY);
                match o {
                    Some(ContextOutcome::Refused {
                        footprint,
                        deny,
                        destroyed: false,
                    }) => {
                        assert_eq!(footprint, Footprint::Measured(300 * MB));
                        assert!(deny.is_over_limit());
                    }
                    o => panic!("{o:?}"),
                }
            }
        });
        assert_eq!(called.get(), 0, "the driver was not called");
        assert_eq!(fake.locks.get(), 0, "a known footprint needs no lock");
        assert_eq!(l.used(0, UsageKind::Context), 0);
        assert_eq!(t.primary_ctx(0), 0, "nothing retained");
        // Room again: the same retain goes through.
        l.uncharge(0, UsageKind::Data, 800 * MB);
        let (r, _) = with_meter(&fake, None, |m| {
            t.primary_retain(
                &l,
                0,
                m,
                || {
                    fake.make(300 * MB);
                    Ok(0xc0)
                },
                |_| true,
            )
        });
        assert_eq!(r, CUDA_SUCCESS);
        assert_eq!(l.used(0, UsageKind::Context), 300 * MB);
    }

    /// The admitted footprint is replaced by the measurement, up (beyond the quota: the
    /// driver already holds it) or down, and the measurement becomes the footprint.
    #[test]
    fn the_measurement_corrects_the_admitted_footprint_and_is_stored() {
        let l = MemLedger::with_limit(0, 1024 * MB);
        l.try_charge(0, UsageKind::Data, 600 * MB).unwrap();
        let t = ContextTable::default();
        let fake = Fake::new(300 * MB);
        let (r, o) = with_meter(&fake, None, |m| {
            t.primary_retain(
                &l,
                0,
                m,
                || {
                    // Fits as 300 MiB; the driver took 518.
                    assert_eq!(l.used(0, UsageKind::Context), 300 * MB, "admitted first");
                    fake.make(518 * MB);
                    Ok(0xc0)
                },
                |_| true,
            )
        });
        assert_eq!(r, CUDA_SUCCESS);
        assert_eq!(l.used(0, UsageKind::Context), 518 * MB);
        assert_eq!(
            l.total(0),
            1118 * MB,
            "beyond the quota by what the driver took"
        );
        assert_eq!(fake.fp.get(), 518 * MB, "stored for the next context");
        match o {
            Some(ContextOutcome::Charged {
                footprint,
                admitted,
                charged,
                waited,
                ..
            }) => {
                assert_eq!(footprint, Footprint::Measured(300 * MB));
                assert!(admitted);
                assert_eq!(charged, 518 * MB);
                assert_eq!(waited, None);
            }
            o => panic!("{o:?}"),
        }
        // Down: a created context in another table (another process) admitted 518, took 200.
        let t2 = ContextTable::default();
        let fake2 = Fake {
            fp: std::cell::Cell::new(518 * MB),
            ..Fake::new(0)
        };
        let l2 = MemLedger::with_limit(0, 1024 * MB);
        with_meter(&fake2, None, |m| {
            t2.create(
                &l2,
                0,
                m,
                || {
                    assert_eq!(l2.used(0, UsageKind::Context), 518 * MB);
                    fake2.make(200 * MB);
                    Ok(0xd0)
                },
                |_| true,
            )
        });
        assert_eq!(l2.used(0, UsageKind::Context), 200 * MB);
        assert_eq!(fake2.fp.get(), 200 * MB);
        // A failed creation gives the admission back; the footprint stays.
        let (r, o) = with_meter(&fake2, None, |m| {
            t2.create(&l2, 0, m, || Err(999), |_| true)
        });
        assert_eq!((r, o), (999, None));
        assert_eq!(l2.used(0, UsageKind::Context), 200 * MB);
        assert_eq!(fake2.fp.get(), 200 * MB);
        // A second context of the process is admitted at the footprint but, costing less,
        // does not replace it.
        with_meter(&fake2, None, |m| {
            t2.create(
                &l2,
                0,
                m,
                || {
                    fake2.make(64 * MB);
                    Ok(0xd1)
                },
                |_| true,
            )
        });
        assert_eq!(l2.used(0, UsageKind::Context), 264 * MB);
        assert_eq!(fake2.fp.get(), 200 * MB);
    }

    /// The container's first context on a device: nothing known to admit, so the creator
    /// holds the context-creation lock from before the admission until the measurement is
    /// stored (a process starting at the same moment waits for it, then admits it).
    #[test]
    fn an_unknown_footprint_is_measured_under_the_lock_and_stored_before_it_is_released() {
        use std::rc::Rc;
        let l = MemLedger::with_limit(0, 1024 * MB);
        let t = ContextTable::default();
        let fp = Rc::new(std::cell::Cell::new(0u64));
        let stored_at_release = Rc::new(std::cell::Cell::new(None::<u64>));
        struct Guard(Rc<std::cell::Cell<u64>>, Rc<std::cell::Cell<Option<u64>>>);
        impl Drop for Guard {
            fn drop(&mut self) {
                self.1.set(Some(self.0.get()));
            }
        }
        let own = std::cell::Cell::new(None::<u64>);
        let own_used = |_d: usize| own.get().map_or(OwnUsage::NotListed, OwnUsage::Listed);
        let footprint = |_d: usize| fp.get();
        let set_footprint = |_d: usize, b: u64| fp.set(b);
        let serialize =
            || -> Option<Held> { Some(Box::new(Guard(fp.clone(), stored_at_release.clone()))) };
        let m = Meter {
            own_used: &own_used,
            used_now: &|_| Some(0),
            serialize: &serialize,
            nvml: true,
            footprint: &footprint,
            set_footprint: &set_footprint,
            ..NO_NVML
        };
        // The process is already listed: without the unknown footprint no lock is needed.
        t.listed.store(true, Ordering::Relaxed);
        let (r, o) = t.primary_retain(
            &l,
            0,
            &m,
            || {
                assert!(
                    stored_at_release.get().is_none(),
                    "lock held around the creation"
                );
                own.set(Some(518 * MB));
                Ok(0xc0)
            },
            |_| true,
        );
        assert_eq!(r, CUDA_SUCCESS);
        assert_eq!(
            stored_at_release.get(),
            Some(518 * MB),
            "stored before the release"
        );
        assert_eq!(l.used(0, UsageKind::Context), 518 * MB);
        assert!(matches!(
            o,
            Some(ContextOutcome::Charged {
                footprint: Footprint::Unknown,
                waited: Some(_),
                ..
            })
        ));
        // Another process waiting on the lock meanwhile reads the stored figure after it.
        let t2 = ContextTable::default();
        let l2 = MemLedger::with_limit(0, 1024 * MB);
        l2.try_charge(0, UsageKind::Data, 600 * MB).unwrap();
        let fp_late = std::cell::Cell::new(0u64);
        let serialize2 = || -> Option<Held> {
            // The first process stores its measurement while we wait.
            fp_late.set(518 * MB);
            Some(Box::new(()))
        };
        let footprint2 = |_d: usize| fp_late.get();
        let m2 = Meter {
            serialize: &serialize2,
            footprint: &footprint2,
            ..m
        };
        let (r, o) = t2.primary_retain(&l2, 0, &m2, || panic!("must not be created"), |_| true);
        assert_eq!(r, CUDA_ERROR_OUT_OF_MEMORY);
        assert!(matches!(
            o,
            Some(ContextOutcome::Refused { footprint: Footprint::Measured(b), .. }) if b == 518 * MB
        ));
    }

    /// `HAMI_CONTEXT_OVERHEAD` is the footprint: admitted (refused when it does not fit),
    /// never stored, no lock; a retain of a retained primary context admits nothing.
    #[test]
    fn the_configured_overhead_is_admitted_and_retains_admit_nothing_more() {
        let l = MemLedger::with_limit(0, 1024 * MB);
        let a = Accounts::default();
        let t = ContextTable::default();
        let fake = Fake::new(0);
        with_meter(&fake, Some(700 * MB), |m| {
            assert_eq!(
                t.primary_retain(&l, 0, m, || Ok(0xc0), |_| true).0,
                CUDA_SUCCESS
            );
            assert_eq!(
                t.primary_retain(&l, 0, m, || Ok(0xc0), |_| true).0,
                CUDA_SUCCESS
            );
            assert_eq!(
                l.used(0, UsageKind::Context),
                700 * MB,
                "the second retain admits nothing"
            );
            let (r, o) = t.create(&l, 0, m, || panic!("must not be created"), |_| true);
            assert_eq!(r, CUDA_ERROR_OUT_OF_MEMORY);
            assert!(matches!(
                o,
                Some(ContextOutcome::Refused { footprint: Footprint::Configured(b), .. }) if b == 700 * MB
            ));
        });
        assert_eq!(fake.locks.get(), 0);
        assert_eq!(fake.fp.get(), 0, "not a measurement: not stored");
        assert_eq!(t.primary_release(&l, &a, 0, || CUDA_SUCCESS), CUDA_SUCCESS);
        assert_eq!(
            l.used(0, UsageKind::Context),
            700 * MB,
            "still retained once"
        );
        assert_eq!(t.primary_release(&l, &a, 0, || CUDA_SUCCESS), CUDA_SUCCESS);
        assert_eq!(
            l.used(0, UsageKind::Context),
            0,
            "the last release uncharges"
        );
    }

    /// A region that refuses for another reason than the quota (allocations failing closed)
    /// does not refuse the context: created and charged after the measurement, as before.
    #[test]
    fn a_region_failing_closed_does_not_refuse_the_context() {
        struct Closed(MemLedger);
        impl Ledger for Closed {
            fn try_charge(&self, dev: usize, _: UsageKind, _: u64) -> Result<(), Deny> {
                Err(Deny::LocalConfig(dev))
            }
            fn force_charge(&self, dev: usize, kind: UsageKind, bytes: u64) {
                self.0.force_charge(dev, kind, bytes)
            }
            fn uncharge(&self, dev: usize, kind: UsageKind, bytes: u64) {
                self.0.uncharge(dev, kind, bytes)
            }
        }
        let l = Closed(MemLedger::with_limit(0, 1024 * MB));
        let t = ContextTable::default();
        let fake = Fake::new(300 * MB);
        let (r, o) = with_meter(&fake, None, |m| {
            t.primary_retain(
                &l,
                0,
                m,
                || {
                    fake.make(300 * MB);
                    Ok(0xc0)
                },
                |_| true,
            )
        });
        assert_eq!(r, CUDA_SUCCESS);
        assert_eq!(l.0.used(0, UsageKind::Context), 300 * MB);
        assert!(matches!(
            o,
            Some(ContextOutcome::Charged {
                admitted: false,
                ..
            })
        ));
    }

    /// The container's first context, admitted after its measurement, meets a region that
    /// cannot decide (its lock timed out): not a quota refusal, so the context stays and
    /// what the driver took is recorded all the same.
    #[test]
    fn a_first_context_whose_late_admission_times_out_is_kept_and_recorded() {
        use hami_common::region::{Denied, DenyReason};
        struct Timeouts(MemLedger, std::cell::Cell<u32>);
        impl Ledger for Timeouts {
            fn try_charge(&self, dev: usize, kind: UsageKind, bytes: u64) -> Result<(), Deny> {
                self.1.set(self.1.get() + 1);
                if self.1.get() == 1 {
                    return self.0.try_charge(dev, kind, bytes);
                }
                Err(Deny::Region(Denied {
                    reason: DenyReason::LockTimeout,
                    dev,
                    limit: 1024 * MB,
                    used: 0,
                    requested: bytes,
                }))
            }
            fn force_charge(&self, dev: usize, kind: UsageKind, bytes: u64) {
                self.0.force_charge(dev, kind, bytes)
            }
            fn uncharge(&self, dev: usize, kind: UsageKind, bytes: u64) {
                self.0.uncharge(dev, kind, bytes)
            }
        }
        let l = Timeouts(MemLedger::with_limit(0, 1024 * MB), std::cell::Cell::new(0));
        let t = ContextTable::default();
        let fake = Fake::new(0);
        let (r, _) = with_meter(&fake, None, |m| {
            t.create(
                &l,
                0,
                m,
                || {
                    fake.make(300 * MB);
                    Ok(0xc0)
                },
                |_| panic!("not a quota refusal: must not be destroyed"),
            )
        });
        assert_eq!(r, CUDA_SUCCESS);
        assert_eq!(
            l.1.get(),
            2,
            "admitted before (nothing) and after (the measurement)"
        );
        assert_eq!(l.0.used(0, UsageKind::Context), 300 * MB);
    }

    /// The container's first context on a device, with nothing known to admit, turns out
    /// not to fit (a quota smaller than a context): it is destroyed again and refused, and
    /// its measurement stored, so the next creation is refused before the driver is asked.
    #[test]
    fn a_first_context_that_turns_out_not_to_fit_is_destroyed_and_refused() {
        let l = MemLedger::with_limit(0, 256 * MB);
        let t = ContextTable::default();
        let fake = Fake::new(0);
        let undone = std::cell::Cell::new(Vec::new());
        for create in [false, true] {
            let (r, o) = with_meter(&fake, None, |m| {
                let call = || {
                    fake.make(300 * MB);
                    Ok(0xc0 + create as usize)
                };
                let undo = |ctx: usize| {
                    let mut v = undone.take();
                    v.push(ctx);
                    undone.set(v);
                    true
                };
                if create {
                    t.create(&l, 0, m, call, undo)
                } else {
                    t.primary_retain(&l, 0, m, call, undo)
                }
            });
            assert_eq!(r, CUDA_ERROR_OUT_OF_MEMORY);
            assert!(
                matches!(
                    o,
                    Some(ContextOutcome::Refused { footprint: Footprint::Measured(b), destroyed: true, .. })
                        if b == 300 * MB
                ),
                "{o:?}"
            );
            assert_eq!(l.total(0), 0, "nothing stays charged");
            fake.fp.set(0); // forget it, to take the same path with a created context
            fake.own.set(None);
        }
        assert_eq!(undone.take(), vec![0xc0, 0xc1]);
        assert_eq!(t.primary_ctx(0), 0);
        // Stored: the next one is refused before the driver is called.
        let (r, _) = with_meter(&fake, None, |m| {
            t.primary_retain(
                &l,
                0,
                m,
                || {
                    fake.make(300 * MB);
                    Ok(0xc2)
                },
                |_| true,
            )
        });
        assert_eq!(r, CUDA_ERROR_OUT_OF_MEMORY);
        assert_eq!(fake.fp.get(), 300 * MB);
        let (r, o) = with_meter(&fake, None, |m| {
            t.primary_retain(&l, 0, m, || panic!("must not be created"), |_| true)
        });
        assert_eq!(r, CUDA_ERROR_OUT_OF_MEMORY);
        assert!(matches!(
            o,
            Some(ContextOutcome::Refused {
                destroyed: false,
                ..
            })
        ));
        // A context the driver does not destroy stays, charged beyond the quota.
        fake.fp.set(0);
        let (r, _) = with_meter(&fake, None, |m| {
            t.create(
                &l,
                0,
                m,
                || {
                    fake.make(300 * MB);
                    Ok(0xc3)
                },
                |_| false,
            )
        });
        assert_eq!(r, CUDA_SUCCESS);
        assert_eq!(l.used(0, UsageKind::Context), 300 * MB);
    }
}
