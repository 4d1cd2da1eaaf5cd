//! Context accounting: primary contexts (retain / release / reset) and created contexts
//! (`cuCtxCreate_*` / `cuCtxDestroy_v2`), charged as context memory. Plain Rust over a
//! [`Ledger`]; the driver calls and the memory readings are closures.

use crate::accounting::{Accounts, Ledger};
use crate::cuda::{CUresult, CUDA_SUCCESS};
use crate::policy::{context_cost, ContextCost};
use hami_common::layout::{UsageKind, MAX_DEVICES};
use std::collections::HashMap;
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
}

/// How the memory of a new context is determined.
pub struct Meter<'a> {
    /// `HAMI_CONTEXT_OVERHEAD`, if set.
    pub configured: Option<u64>,
    /// Reads the device's used memory (NVML), `None` when not available.
    pub used_now: &'a dyn Fn(usize) -> Option<u64>,
}

impl Meter<'_> {
    fn around(
        &self,
        dev: usize,
        call: impl FnOnce() -> Result<usize, CUresult>,
    ) -> (Result<usize, CUresult>, ContextCost) {
        if let Some(b) = self.configured {
            return (call(), ContextCost::Configured(b));
        }
        let before = (self.used_now)(dev);
        let r = call();
        let after = if r.is_ok() {
            (self.used_now)(dev)
        } else {
            None
        };
        (r, context_cost(None, before, after))
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
        let (r, cost) = meter.around(dev, call);
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
        let (r, cost) = meter.around(dev, call);
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
        };
        let (r, cost) = t.primary_retain(&l, 0, &m, || {
            used.set(400 * MB);
            Ok(0xc0)
        });
        assert_eq!(r, CUDA_SUCCESS);
        assert_eq!(cost, Some(ContextCost::Measured(300 * MB)));
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
        let read = |_d: usize| None;
        let m = Meter {
            configured: Some(64 * MB),
            used_now: &read,
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
            used_now: &read,
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
        let read = |_d: usize| None;
        let m = Meter {
            configured: Some(MB),
            used_now: &read,
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
