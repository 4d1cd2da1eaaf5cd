//! CUDA contexts: their accounting and their measurement. This file holds the accounting:
//! primary contexts (retain / release / reset) and created contexts (`cuCtxCreate_*` /
//! `cuCtxDestroy_v2`), charged as context memory, plain Rust over a [`Ledger`] with the
//! driver calls and the memory readings as closures ([`Meter`]). Beside it:
//! * [`measure`] — the [`Meter`] of the real driver and NVML, the current context's device;
//! * [`nvml`] — NVML device handles and readings;
//! * [`cache`] — the context → device cache of the allocation path;
//! * [`lock`] — the region-wide context-creation lock around a measurement.

pub mod cache;
pub mod lock;
pub mod measure;
pub mod nvml;

use crate::accounting::{Accounts, Ledger};
use crate::cuda::{CUresult, CUDA_SUCCESS};
use crate::policy::{
    context_cost, driver_context_cost, ContextCost, ContextReadings, DriverReadings,
};
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
        if let Some(b) = self.configured {
            return (call(), ContextCost::Configured(b));
        }
        if !self.nvml {
            return self.around_driver(dev, existing, call);
        }
        let held = if listed.load(Ordering::Relaxed) {
            None
        } else {
            (self.serialize)()
        };
        let data_before = (self.own_data)(dev);
        let mut region_before = (self.region_data)(dev);
        let own_before = match (self.own_used)(dev) {
            OwnUsage::Listed(b) => Some(b),
            OwnUsage::NotListed => Some(0),
            OwnUsage::Unavailable => None,
        };
        let mut dev_before = (self.used_now)(dev);
        if held.is_some() {
            // The device-level fallback (this process not listed by NVML): another process
            // may be between its admission (charged in the region) and its driver call (not
            // yet on the device). Let it reach the driver before the readings are taken.
            (dev_before, region_before) = settle_readings(region_before, || {
                ((self.used_now)(dev), (self.region_data)(dev))
            });
        }
        let r = call();
        if r.is_err() {
            return (r, ContextCost::Unknown);
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
        drop(held);
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
        (r, context_cost(None, &readings))
    }

    /// The driver-only measurement (NVML unavailable), under the region-wide lock.
    fn around_driver(
        &self,
        dev: usize,
        existing: Option<usize>,
        call: impl FnOnce() -> Result<usize, CUresult>,
    ) -> (Result<usize, CUresult>, ContextCost) {
        let held = (self.serialize)();
        let region_before = (self.region_data)(dev);
        let free_before = existing
            .and_then(|c| (self.driver_info)(c))
            .map(|(free, _)| free);
        let r = call();
        let Ok(ctx) = r else {
            return (r, ContextCost::Unknown);
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
        let region_used = (self.region_used)(dev);
        let serialized = held.is_some();
        drop(held);
        let readings = DriverReadings {
            free_before,
            after,
            region_meanwhile,
            region_used,
            serialized,
        };
        (r, driver_context_cost(&readings))
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

    /// `cuDevicePrimaryCtxRetain`: the first retain of `dev` in this process charges the
    /// context's memory. `call` returns the context. Returns the driver's code and, for a
    /// first retain, how the cost was determined.
    pub fn primary_retain<L: Ledger + ?Sized>(
        &self,
        ledger: &L,
        dev: usize,
        meter: &Meter<'_>,
        call: impl FnOnce() -> Result<usize, CUresult>,
    ) -> (CUresult, Option<ContextCost>) {
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
        let (r, cost) = meter.around(dev, existing, &self.listed, call);
        match r {
            Ok(ctx) => {
                let bytes = cost.bytes();
                ledger.force_charge(dev, UsageKind::Context, bytes);
                g.primary[dev] = Primary {
                    ctx,
                    count: 1,
                    bytes,
                };
                (CUDA_SUCCESS, Some(cost))
            }
            Err(e) => (e, None),
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

    /// `cuCtxCreate_v2/v3/v4`: charges the new context's memory.
    pub fn create<L: Ledger + ?Sized>(
        &self,
        ledger: &L,
        dev: usize,
        meter: &Meter<'_>,
        call: impl FnOnce() -> Result<usize, CUresult>,
    ) -> (CUresult, Option<ContextCost>) {
        if dev >= MAX_DEVICES {
            return (call().err().unwrap_or(CUDA_SUCCESS), None);
        }
        let mut g = self.lock();
        let existing = Self::existing(&g, dev);
        let (r, cost) = meter.around(dev, existing, &self.listed, call);
        match r {
            Ok(ctx) => {
                let bytes = cost.bytes();
                ledger.force_charge(dev, UsageKind::Context, bytes);
                if let Some((odev, obytes)) = g.created.insert(ctx, (dev, bytes)) {
                    ledger.uncharge(odev, UsageKind::Context, obytes);
                }
                (CUDA_SUCCESS, Some(cost))
            }
            Err(e) => (e, None),
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
    use crate::accounting::{Allocated, MemLedger, Ns};

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
    };

    /// Two processes share a device; `other` creates a context while we create ours.
    #[test]
    fn per_process_measurement_ignores_other_processes() {
        use std::cell::Cell;
        let l = MemLedger::with_limit(0, 1 << 30);
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
        let m = Meter {
            configured: None,
            used_now: &used_now,
            own_used: &own_used,
            own_data: &|_| 0,
            region_data: &|_| 0,
            serialize: &serialize,
            nvml: true,
            ..NO_NVML
        };
        let (r, cost) = t.primary_retain(&l, 0, &m, || {
            // Ours (518 MiB) and another process's (520 MiB) at the same moment.
            device.set(device.get() + 518 * MB + 520 * MB);
            mine.set(Some(518 * MB));
            Ok(0xc0)
        });
        assert_eq!(r, CUDA_SUCCESS);
        assert_eq!(cost, Some(ContextCost::PerProcess(518 * MB)));
        assert_eq!(l.used(0, UsageKind::Context), 518 * MB);
        assert_eq!(locks.get(), 1, "first creation: not yet known to be listed");
        // A created context on the same device: only its own growth counts, no lock now.
        let (_, cost) = t.create(&l, 0, &m, || {
            mine.set(Some(518 * MB + 64 * MB));
            device.set(device.get() + 64 * MB + 700 * MB);
            Ok(0xc1)
        });
        assert_eq!(cost, Some(ContextCost::PerProcess(64 * MB)));
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
        let (r, cost) = t.primary_retain(&l, 0, &m, || {
            device.set(device.get() + 500 * MB);
            // The other process's admission, its driver call still to come.
            region.set(region.get() + 300 * MB);
            reads_after.set(Some(0));
            Ok(0xc0)
        });
        assert_eq!(r, CUDA_SUCCESS);
        assert_eq!(
            l.used(0, UsageKind::Context),
            500 * MB,
            "{:?}",
            cost.map(|c| c.bytes())
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
            let (_, cost) = t.create(&l, 0, &m, || {
                assert!(held.get(), "the lock is held around the creation");
                device.set(device.get() + 300 * MB + 8 * MB);
                data.set(data.get() + 8 * MB);
                Ok(0xa0 + round)
            });
            assert!(!held.get(), "released after the measurement");
            assert_eq!(
                cost,
                Some(ContextCost::DeviceDelta {
                    bytes: 300 * MB,
                    serialized: true
                })
            );
        }
        assert_eq!(l.used(0, UsageKind::Context), 600 * MB);
        // A failed creation charges nothing and releases the lock.
        assert_eq!(t.create(&l, 0, &m, || Err(2)).0, 2);
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
        let (r, cost) = t.primary_retain(&l, 0, &m, || {
            used.set(400 * MB);
            Ok(0xc0)
        });
        assert_eq!(r, CUDA_SUCCESS);
        assert_eq!(
            cost,
            Some(ContextCost::DeviceDelta {
                bytes: 300 * MB,
                serialized: false
            })
        );
        assert_eq!(l.used(0, UsageKind::Context), 300 * MB);
        // Second retain: no charge.
        assert_eq!(t.primary_retain(&l, 0, &m, || Ok(0xc0)).0, CUDA_SUCCESS);
        assert_eq!(l.used(0, UsageKind::Context), 300 * MB);
        a.alloc(
            &l,
            Ns::Ptr,
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
            t.create(&l, 1, &m, || Ok(0xa)).1,
            Some(ContextCost::Configured(64 * MB))
        );
        assert_eq!(t.create(&l, 1, &m, || Err(2)).0, 2);
        assert_eq!(l.used(1, UsageKind::Context), 64 * MB);
        a.alloc(
            &l,
            Ns::Ptr,
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
            t.create(&l, 1, &m, || Ok(0xb)).1,
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
        t.primary_retain(&l, 0, &m, || Ok(0xc0));
        a.alloc(
            &l,
            Ns::Ptr,
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
}
