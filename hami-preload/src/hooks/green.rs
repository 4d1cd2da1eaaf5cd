//! Hooks of green contexts ([`crate::objects::green`]): creation admitted and measured, destruction
//! uncharged.
#![allow(non_snake_case)]
#![allow(clippy::missing_safety_doc)] // Every hook has the documented contract of its driver function.

use super::shared::report_denial;
use crate::ffi::cuda::*;
use crate::ffi::shim::hook;
use crate::ledger::policy::ContextCost;
use crate::measure::{current_dev_ctx, meter};
use crate::state::ProcLedger;
use hami_abi::layout::MAX_DEVICES;
use std::ffi::{c_uint, c_void};

hook! {
    /// Hook of `cuGreenCtxCreate`: the device's green-context footprint is admitted before
    /// the driver is called (refused: `CUDA_ERROR_OUT_OF_MEMORY`), the creation measured and
    /// charged as context memory.
    fn cuGreenCtxCreate(
        out: *mut *mut c_void,
        desc: *mut c_void,
        dev: CUdevice,
        flags: c_uint,
    ) -> CUresult;
    |f| {
        let Some(d) = usize::try_from(dev).ok().filter(|&d| d < MAX_DEVICES) else {
            // SAFETY: forwarded arguments (an invalid device: the driver's answer).
            return unsafe { f(out, desc, dev, flags) };
        };
        if out.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        let l = ProcLedger::current();
        // A context of this process on the device, read through by the driver-only
        // measurement (without one it has nothing to read and the admission stays charged).
        let cur = current_dev_ctx()
            .ok()
            .filter(|&(cd, _)| cd == d)
            .map(|(_, c)| c);
        let r = l.p.greens.create(&l, d, || {
            let (r, cost) = l.p.contexts.measure(d, cur, &meter(), || {
                // SAFETY: forwarded arguments.
                match unsafe { f(out, desc, dev, flags) } {
                    CUDA_SUCCESS => Ok(cur.unwrap_or(0)),
                    e => Err(e),
                }
            });
            match r {
                Ok(_) => {
                    let measured = (!matches!(cost, ContextCost::Unknown)).then(|| cost.bytes());
                    // SAFETY: non-null (checked above), written by the driver on success.
                    let handle = unsafe { *out } as u64;
                    (CUDA_SUCCESS, handle, measured)
                }
                Err(e) => (e, 0, None),
            }
        });
        match r {
            Ok(r) => r,
            Err(deny) => {
                report_denial("cuGreenCtxCreate", l.p, d, &deny);
                CUDA_ERROR_OUT_OF_MEMORY
            }
        }
    }
}

hook! {
    /// Hook of `cuGreenCtxDestroy`: the green context's charge goes.
    fn cuGreenCtxDestroy(ctx: *mut c_void) -> CUresult;
    |f| {
        let l = ProcLedger::current();
        // SAFETY: forwarded argument.
        l.p.greens.destroy(&l, ctx as u64, || unsafe { f(ctx) })
    }
}
