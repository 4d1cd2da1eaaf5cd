//! Green contexts (`cuGreenCtxCreate`, CUDA 12.4+): each takes device memory of its own at
//! creation (about 5 MiB on the H200), charged as context memory of its device.
//!
//! Admitted before the driver is called with the green-context footprint last measured on
//! the device by this process, else [`DEFAULT_FOOTPRINT`] (the H200's figure rounded up);
//! refused: `CUDA_ERROR_OUT_OF_MEMORY` (a documented return of `cuGreenCtxCreate`) without
//! calling the driver. The creation is measured like a context; the measurement replaces
//! the admitted figure (charged even beyond the quota: the driver took it) and becomes the
//! device's footprint. `cuGreenCtxDestroy` gives the charge back.
//!
//! Plain Rust over a [`Ledger`]; the driver call and its measurement are a closure.

use crate::ffi::cuda::{CUresult, CUDA_SUCCESS};
use crate::ledger::accounting::{Deny, Ledger};
use hami_abi::layout::{UsageKind, MAX_DEVICES};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

/// What a green context is admitted with before one was measured on its device.
pub const DEFAULT_FOOTPRINT: u64 = 8 << 20;

/// This process's green contexts.
pub struct GreenTable {
    /// Footprint last measured per device (0: none yet).
    footprint: [AtomicU64; MAX_DEVICES],
    /// Live green contexts: handle -> (device, bytes charged).
    live: Mutex<HashMap<u64, (usize, u64)>>,
}

impl Default for GreenTable {
    fn default() -> Self {
        GreenTable {
            footprint: std::array::from_fn(|_| AtomicU64::new(0)),
            live: Mutex::new(HashMap::new()),
        }
    }
}

impl GreenTable {
    /// What a green context on `dev` is admitted with.
    pub fn footprint(&self, dev: usize) -> u64 {
        match self.footprint.get(dev).map(|f| f.load(Ordering::Relaxed)) {
            Some(f) if f > 0 => f,
            _ => DEFAULT_FOOTPRINT,
        }
    }

    /// `cuGreenCtxCreate` on `dev`: admits the footprint, then `create` (the driver call,
    /// measured: the new handle and the bytes it took, `None` when it could not be measured).
    /// `Err`: refused before the driver was called.
    pub fn create<L: Ledger + ?Sized>(
        &self,
        ledger: &L,
        dev: usize,
        create: impl FnOnce() -> (CUresult, u64, Option<u64>),
    ) -> Result<CUresult, Deny> {
        let admitted = self.footprint(dev);
        ledger.try_charge(dev, UsageKind::Context, admitted)?;
        let (r, handle, measured) = create();
        if r != CUDA_SUCCESS {
            ledger.uncharge(dev, UsageKind::Context, admitted);
            return Ok(r);
        }
        let charged = match measured {
            Some(m) => {
                if m > 0 {
                    if let Some(f) = self.footprint.get(dev) {
                        f.store(m, Ordering::Relaxed);
                    }
                }
                if m > admitted {
                    ledger.force_charge(dev, UsageKind::Context, m - admitted);
                } else {
                    ledger.uncharge(dev, UsageKind::Context, admitted - m);
                }
                m
            }
            None => admitted,
        };
        self.live
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(handle, (dev, charged));
        Ok(r)
    }

    /// `cuGreenCtxDestroy` of `handle` (`destroy`): its charge goes when the driver succeeds.
    pub fn destroy<L: Ledger + ?Sized>(
        &self,
        ledger: &L,
        handle: u64,
        destroy: impl FnOnce() -> CUresult,
    ) -> CUresult {
        let r = destroy();
        if r == CUDA_SUCCESS {
            let e = self
                .live
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .remove(&handle);
            if let Some((dev, bytes)) = e {
                ledger.uncharge(dev, UsageKind::Context, bytes);
            }
        }
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::accounting::MemLedger;
    use std::cell::Cell;

    const MB: u64 = 1 << 20;

    #[test]
    fn green_contexts_are_admitted_then_charged_what_they_measure() {
        let l = MemLedger::with_limit(0, 20 * MB);
        let t = GreenTable::default();
        let r = t.create(&l, 0, || (CUDA_SUCCESS, 1, Some(5 * MB)));
        assert_eq!(r, Ok(CUDA_SUCCESS));
        assert_eq!(l.used(0, UsageKind::Context), 5 * MB, "the measurement");
        assert_eq!(t.footprint(0), 5 * MB, "the next one is admitted with it");
        for h in 2..=4 {
            assert_eq!(
                t.create(&l, 0, || (CUDA_SUCCESS, h, Some(5 * MB))),
                Ok(CUDA_SUCCESS)
            );
        }
        let called = Cell::new(false);
        let r = t.create(&l, 0, || {
            called.set(true);
            (CUDA_SUCCESS, 5, Some(5 * MB))
        });
        assert!(r.is_err(), "20 MiB full");
        assert!(!called.get(), "refused before the driver");
        assert_eq!(t.destroy(&l, 1, || CUDA_SUCCESS), CUDA_SUCCESS);
        assert_eq!(l.used(0, UsageKind::Context), 15 * MB);
        assert_eq!(t.destroy(&l, 1, || 400), 400, "the driver's answer");
        assert_eq!(l.used(0, UsageKind::Context), 15 * MB);
    }

    #[test]
    fn a_failed_creation_keeps_nothing_and_an_unmeasured_one_keeps_the_admission() {
        let l = MemLedger::with_limit(0, 20 * MB);
        let t = GreenTable::default();
        assert_eq!(t.create(&l, 0, || (1, 0, None)), Ok(1));
        assert_eq!(l.total(0), 0);
        assert_eq!(
            t.create(&l, 0, || (CUDA_SUCCESS, 9, None)),
            Ok(CUDA_SUCCESS)
        );
        assert_eq!(l.used(0, UsageKind::Context), DEFAULT_FOOTPRINT);
    }
}
