//! Hook of `cuCtxSetLimit` and the launch path's local-memory admission: the sizing and the
//! charges are [`crate::objects::lmem`]; here is the real driver behind [`LimitDriver`].
#![allow(non_snake_case)]
#![allow(clippy::missing_safety_doc)] // Every hook has the documented contract of its driver function.

use super::shared::report_denial;
use crate::ffi::cuda::*;
use crate::ffi::shim::hook;
use crate::ffi::symbols::{self, Cu};
use crate::measure::{current_dev_ctx, meter};
use crate::objects::lmem::{self, LimitDriver, LimitError, Sizing};
use crate::state::ProcLedger;
use std::ffi::c_int;

/// The real driver's limit, attribute and device queries.
pub struct RealLimitDriver;

impl LimitDriver for RealLimitDriver {
    fn get_limit(&self, limit: i32) -> Result<u64, CUresult> {
        // SAFETY: documented type.
        let f = unsafe { symbols::cu::<FnCtxGetLimit>(Cu::cuCtxGetLimit) }
            .ok_or(CUDA_ERROR_NOT_FOUND)?;
        let mut v: usize = 0;
        // SAFETY: a valid out pointer; the limit is a plain integer.
        match unsafe { f(&mut v, limit) } {
            CUDA_SUCCESS => Ok(v as u64),
            e => Err(e),
        }
    }

    fn set_limit(&self, limit: i32, value: u64) -> CUresult {
        // SAFETY: documented type.
        let Some(f) = (unsafe { symbols::cu::<FnCtxSetLimit>(Cu::cuCtxSetLimit) }) else {
            return CUDA_ERROR_NOT_FOUND;
        };
        let Ok(v) = usize::try_from(value) else {
            return CUDA_ERROR_INVALID_VALUE;
        };
        // SAFETY: plain integers.
        unsafe { f(limit, v) }
    }

    fn raise_stack(&self, value: u64) -> CUresult {
        // This thread's capture mode relaxed around the call: a stream capture in progress
        // (global mode) would otherwise refuse it as a potentially unsafe call and be
        // invalidated. The memory is then taken now, admitted, and the graph's launches find
        // the limit already raised.
        // SAFETY: documented type.
        let exchange = unsafe {
            symbols::cu::<FnThreadExchangeStreamCaptureMode>(Cu::cuThreadExchangeStreamCaptureMode)
        };
        let mut mode: c_int = CU_STREAM_CAPTURE_MODE_RELAXED;
        // SAFETY: a valid in/out pointer.
        let swapped = exchange.is_some_and(|f| unsafe { f(&mut mode) } == CUDA_SUCCESS);
        let r = self.set_limit(lmem::CU_LIMIT_STACK_SIZE, value);
        if swapped {
            if let Some(f) = exchange {
                // SAFETY: as above; puts the thread's previous mode back.
                unsafe { f(&mut mode) };
            }
        }
        r
    }

    fn resident_threads(&self, dev: usize) -> Option<u64> {
        // SAFETY: documented type.
        let get = unsafe { symbols::cu::<FnDeviceGetAttribute>(Cu::cuDeviceGetAttribute) }?;
        let dev = CUdevice::try_from(dev).ok()?;
        let attr = |a: c_int| {
            let mut v: c_int = 0;
            // SAFETY: a valid out pointer; attribute and device are plain integers.
            (unsafe { get(&mut v, a, dev) } == CUDA_SUCCESS).then_some(v)
        };
        lmem::resident_threads(
            attr(lmem::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?,
            attr(lmem::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR)?,
        )
    }

    fn local_size(&self, func: u64, dev: usize) -> Option<u64> {
        let mut v: c_int = 0;
        // SAFETY: documented type.
        if let Some(f) = unsafe { symbols::cu::<FnFuncGetAttribute>(Cu::cuFuncGetAttribute) } {
            // SAFETY: a valid out pointer; the handle is the application's, as it launches it.
            if unsafe {
                f(
                    &mut v,
                    lmem::CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES,
                    func as CUfunction,
                )
            } == CUDA_SUCCESS
            {
                return u64::try_from(v).ok();
            }
        }
        // Not a CUfunction: a CUkernel (cuLibraryGetKernel), asked on the current device.
        // SAFETY: documented type.
        let k = unsafe { symbols::cu::<FnKernelGetAttribute>(Cu::cuKernelGetAttribute) }?;
        let dev = CUdevice::try_from(dev).ok()?;
        // SAFETY: as above.
        (unsafe {
            k(
                &mut v,
                lmem::CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES,
                func as CUkernel,
                dev,
            )
        } == CUDA_SUCCESS)
            .then(|| u64::try_from(v).ok())
            .flatten()
    }
}

fn refused(what: &str, l: &ProcLedger, dev: usize, e: LimitError) -> CUresult {
    if let LimitError::Denied { deny, .. } = &e {
        report_denial(what, l.p, dev, deny);
        crate::debug!("{what}: {e}");
    }
    e.code()
}

hook! {
    /// Hook of `cuCtxSetLimit`: the memory a raised limit reserves is admitted first.
    fn cuCtxSetLimit(limit: c_int, value: usize) -> CUresult;
    |f| {
        // SAFETY: forwarded arguments (every call below).
        set_limit(limit, value as u64, || unsafe { f(limit, value) })
    }
}

/// `cuCtxSetLimit` in the current context ([`crate::objects::lmem::Limits::set_limit`]); the
/// device-runtime limits, which nothing can size beforehand, are measured around the call
/// and put back if what they took does not fit.
fn set_limit(limit: c_int, value: u64, real: impl FnOnce() -> CUresult) -> CUresult {
    let Ok((dev, ctx)) = current_dev_ctx() else {
        // No context: the driver's answer (CUDA_ERROR_INVALID_CONTEXT).
        return real();
    };
    let l = ProcLedger::current();
    if lmem::sizing(limit) == Sizing::Measured {
        let old = RealLimitDriver.get_limit(limit).ok();
        let (r, cost) =
            l.p.contexts
                .measure(dev, Some(ctx), &meter(), || match real() {
                    CUDA_SUCCESS => Ok(ctx),
                    e => Err(e),
                });
        if let Err(e) = r {
            return e;
        }
        return match l
            .p
            .limits
            .charge_measured(&l, &RealLimitDriver, dev, ctx, cost.bytes())
        {
            Ok(()) => CUDA_SUCCESS,
            Err(e) => {
                if let Some(old) = old {
                    RealLimitDriver.set_limit(limit, old);
                }
                refused("cuCtxSetLimit", &l, dev, e)
            }
        };
    }
    // `RealLimitDriver::set_limit` is the same real function as `real`.
    match l
        .p
        .limits
        .set_limit(&l, &RealLimitDriver, dev, ctx, limit, value)
    {
        Ok(()) => CUDA_SUCCESS,
        Err(e) => refused("cuCtxSetLimit", &l, dev, e),
    }
}

/// Before a launch of `func`: `Some(code)` when the launch must not happen (its local memory
/// does not fit), `None` to go on ([`crate::objects::lmem::Limits::before_launch`]).
#[inline]
pub(crate) fn before_launch(what: &str, func: CUfunction) -> Option<CUresult> {
    let l = ProcLedger::current();
    match l
        .p
        .limits
        .before_launch(&l, &RealLimitDriver, func as u64, || current_dev_ctx().ok())
    {
        Ok(()) => None,
        Err(e) => {
            let dev = current_dev_ctx().map_or(0, |c| c.0);
            Some(refused(what, &l, dev, e))
        }
    }
}

/// `real` (a launch) followed by [`crate::objects::lmem::Limits::after_launch`], inside whatever
/// measures around it.
#[inline]
pub(crate) fn after_launch(real: impl FnOnce() -> CUresult) -> impl FnOnce() -> CUresult {
    move || {
        let r = real();
        ProcLedger::current()
            .p
            .limits
            .after_launch(r == CUDA_SUCCESS, || current_dev_ctx().ok());
        r
    }
}
