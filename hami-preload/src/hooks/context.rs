//! Hooks of context creation and destruction (primary retain / release / reset,
//! `cuCtxCreate*`, `cuCtxDestroy*`): each measures and charges through
//! [`crate::objects::context::ContextTable`] with the real driver's [`crate::objects::context::ContextMeter`].
#![allow(non_snake_case)]
#![allow(clippy::missing_safety_doc)] // Every hook has the documented contract of its driver function.

use super::nvml_procs::driver_host_pids;
use crate::driver::hostpid;
use crate::ffi::cuda::*;
use crate::ffi::shim::hook;
use crate::ffi::symbols::{self, Cu};
use crate::measure::nvml::nvml_handle;
use crate::measure::{log_context_outcome, meter};
use crate::objects::context::ContextOutcome;
use crate::state::{self, ProcLedger};
use std::ffi::{c_int, c_uint, c_void};

hook! {
    /// Hook of `cuDevicePrimaryCtxRetain`: the first retain per device admits and charges the
    /// context.
    fn cuDevicePrimaryCtxRetain(
        pctx: *mut CUcontext,
        dev: CUdevice,
    ) -> CUresult;
    |f| {
        // SAFETY: forwarded arguments.
        primary_retain(pctx, dev, || unsafe { f(pctx, dev) })
    }
}

/// A primary-context retain: the first one per device is admitted with the device's context
/// footprint before the driver is called (`CUDA_ERROR_OUT_OF_MEMORY` without calling it when
/// it does not fit the quota), then measured and charged what it took.
fn primary_retain(
    pctx: *mut CUcontext,
    dev: CUdevice,
    real: impl FnOnce() -> CUresult,
) -> CUresult {
    if pctx.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    if dev < 0 {
        return real();
    }
    let l = ProcLedger::current();
    let m = meter();
    let (r, outcome) = l.p.contexts.primary_retain(
        &l,
        dev as usize,
        &m,
        || match around_context_creation(dev as usize, real) {
            // SAFETY: the driver wrote *pctx (checked non-null above) on success.
            CUDA_SUCCESS => Ok(unsafe { *pctx } as usize),
            e => Err(e),
        },
        |_| undo_primary_retain(dev),
    );
    forget_destroyed(pctx, outcome);
    log_context_outcome("cuDevicePrimaryCtxRetain", dev as usize, outcome);
    if r == CUDA_SUCCESS {
        // SAFETY: *pctx written on success (checked non-null above).
        l.p.modules.context_created(unsafe { *pctx } as usize);
    }
    r
}

/// A context the driver made and the preload destroyed again (it did not fit): the handle
/// the driver wrote to `*pctx` is no longer valid, so the application is given NULL.
fn forget_destroyed(pctx: *mut CUcontext, outcome: Option<ContextOutcome>) {
    if matches!(
        outcome,
        Some(ContextOutcome::Refused {
            destroyed: true,
            ..
        })
    ) {
        // SAFETY: pctx is non-null (checked by the callers) and was written by the driver.
        unsafe { *pctx = std::ptr::null_mut() };
    }
}

/// Releases the primary context of `dev` that a first retain just took and that turned out
/// not to fit the quota (the real `cuDevicePrimaryCtxRelease_v2`, else the pre-11 name):
/// the release of that only retain destroys it. Whether the driver did.
fn undo_primary_retain(dev: CUdevice) -> bool {
    // SAFETY: documented types of the two names.
    let f = unsafe { symbols::cu::<FnDeviceOp>(Cu::cuDevicePrimaryCtxRelease_v2) }
        // SAFETY: as above.
        .or_else(|| unsafe { symbols::cu::<FnDeviceOp>(Cu::cuDevicePrimaryCtxRelease) });
    // SAFETY: a device ordinal the driver just accepted.
    f.is_some_and(|f| unsafe { f(dev) } == CUDA_SUCCESS)
}

/// Destroys a context that `cuCtxCreate*` just made and that turned out not to fit the
/// quota (the real `cuCtxDestroy_v2`, which also pops it from the calling thread's stack).
/// Whether the driver did.
fn undo_create(ctx: usize) -> bool {
    // SAFETY: documented type.
    let f = unsafe { symbols::cu::<FnCtxDestroy>(Cu::cuCtxDestroy_v2) };
    // SAFETY: the context the driver just returned to this hook, not yet handed out.
    f.is_some_and(|f| unsafe { f(ctx as CUcontext) } == CUDA_SUCCESS)
}

/// A primary-context release: the last one uncharges the context and what it held.
fn primary_release(f: FnDeviceOp, dev: CUdevice) -> CUresult {
    if dev < 0 {
        // SAFETY: forwarded argument.
        return unsafe { f(dev) };
    }
    let l = ProcLedger::current();
    let before = l.p.contexts.primary_ctx(dev as usize);
    // SAFETY: forwarded argument.
    let r =
        l.p.contexts
            .primary_release(&l, &l.p.accounts, dev as usize, || unsafe { f(dev) });
    if r == CUDA_SUCCESS && before != 0 && l.p.contexts.primary_ctx(dev as usize) == 0 {
        // The last release destroyed the primary context.
        super::shared::context_gone(&l, before);
    }
    r
}

/// A primary-context reset: the context and everything allocated in it are uncharged.
fn primary_reset(f: FnDeviceOp, dev: CUdevice) -> CUresult {
    if dev < 0 {
        // SAFETY: forwarded argument.
        return unsafe { f(dev) };
    }
    let l = ProcLedger::current();
    let ctx = l.p.contexts.primary_ctx(dev as usize);
    // SAFETY: forwarded argument.
    let r =
        l.p.contexts
            .primary_reset(&l, &l.p.accounts, dev as usize, || unsafe { f(dev) });
    if r == CUDA_SUCCESS {
        super::shared::context_gone(&l, ctx);
    }
    r
}

hook! {
    /// Hook of `cuDevicePrimaryCtxRelease` (pre-11 name of the `_v2` function).
    fn cuDevicePrimaryCtxRelease(dev: CUdevice) -> CUresult;
    |f| {
        primary_release(f, dev)
    }
}

hook! {
    /// Hook of `cuDevicePrimaryCtxRelease_v2`: the last release uncharges the context.
    fn cuDevicePrimaryCtxRelease_v2(dev: CUdevice) -> CUresult;
    |f| {
        primary_release(f, dev)
    }
}

hook! {
    /// Hook of `cuDevicePrimaryCtxReset`.
    fn cuDevicePrimaryCtxReset(dev: CUdevice) -> CUresult;
    |f| {
        primary_reset(f, dev)
    }
}

hook! {
    /// Hook of `cuDevicePrimaryCtxReset_v2`: the primary context's allocations are gone.
    fn cuDevicePrimaryCtxReset_v2(dev: CUdevice) -> CUresult;
    |f| {
        primary_reset(f, dev)
    }
}

/// A context creation (`cuCtxCreate*`, every variant and every path to it): admitted with
/// `dev`'s context footprint before the driver is called (`CUDA_ERROR_OUT_OF_MEMORY` without
/// calling it when it does not fit the quota), then measured and charged to `dev`.
fn ctx_create(
    what: &str,
    pctx: *mut CUcontext,
    dev: CUdevice,
    real: impl FnOnce() -> CUresult,
) -> CUresult {
    if pctx.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    if dev < 0 {
        return real();
    }
    let l = ProcLedger::current();
    let m = meter();
    let (r, outcome) = l.p.contexts.create(
        &l,
        dev as usize,
        &m,
        || match around_context_creation(dev as usize, real) {
            // SAFETY: *pctx written on success.
            CUDA_SUCCESS => Ok(unsafe { *pctx } as usize),
            e => Err(e),
        },
        undo_create,
    );
    forget_destroyed(pctx, outcome);
    log_context_outcome(what, dev as usize, outcome);
    if r == CUDA_SUCCESS {
        // SAFETY: *pctx written on success (checked non-null above).
        l.p.modules.context_created(unsafe { *pctx } as usize);
    }
    r
}

hook! {
    /// Hook of `cuCtxCreate_v2`.
    fn cuCtxCreate_v2(
        pctx: *mut CUcontext,
        flags: c_uint,
        dev: CUdevice,
    ) -> CUresult;
    |f| {
        // SAFETY: forwarded arguments.
        ctx_create("cuCtxCreate_v2", pctx, dev, || unsafe {
            f(pctx, flags, dev)
        })
    }
}

hook! {
    /// Hook of `cuCtxCreate`, the pre-3.2 name of `cuCtxCreate_v2` (same arguments and meaning;
    /// still exported by the driver and reached by `cuGetProcAddress("cuCtxCreate", < 3020)`).
    fn cuCtxCreate(
        pctx: *mut CUcontext,
        flags: c_uint,
        dev: CUdevice,
    ) -> CUresult;
    |f| {
        // SAFETY: forwarded arguments.
        ctx_create("cuCtxCreate", pctx, dev, || unsafe { f(pctx, flags, dev) })
    }
}

hook! {
    /// Hook of `cuCtxCreate_v3`.
    fn cuCtxCreate_v3(
        pctx: *mut CUcontext,
        params: *mut c_void,
        num_params: c_int,
        flags: c_uint,
        dev: CUdevice,
    ) -> CUresult;
    |f| {
        // SAFETY: forwarded arguments.
        ctx_create("cuCtxCreate_v3", pctx, dev, || unsafe {
            f(pctx, params, num_params, flags, dev)
        })
    }
}

hook! {
    /// Hook of `cuCtxCreate_v4`.
    fn cuCtxCreate_v4(
        pctx: *mut CUcontext,
        params: *mut c_void,
        flags: c_uint,
        dev: CUdevice,
    ) -> CUresult;
    |f| {
        // SAFETY: forwarded arguments.
        ctx_create("cuCtxCreate_v4", pctx, dev, || unsafe {
            f(pctx, params, flags, dev)
        })
    }
}

/// A context destruction: the context and everything allocated in it are uncharged when the
/// driver succeeds.
fn ctx_destroy(ctx: CUcontext, real: impl FnOnce() -> CUresult) -> CUresult {
    let l = ProcLedger::current();
    let r = l.p.contexts.destroy(&l, &l.p.accounts, ctx as usize, real);
    if r == CUDA_SUCCESS {
        super::shared::context_gone(&l, ctx as usize);
    }
    r
}

hook! {
    /// Hook of `cuCtxDestroy`, the pre-4.0 name of `cuCtxDestroy_v2`: when the driver succeeds the
    /// context is gone, so it is uncharged the same way.
    fn cuCtxDestroy(ctx: CUcontext) -> CUresult;
    |f| {
        // SAFETY: forwarded argument.
        ctx_destroy(ctx, || unsafe { f(ctx) })
    }
}

hook! {
    /// Hook of `cuCtxDestroy_v2`: uncharges the context and everything allocated in it.
    fn cuCtxDestroy_v2(ctx: CUcontext) -> CUresult;
    |f| {
        // SAFETY: forwarded argument.
        ctx_destroy(ctx, || unsafe { f(ctx) })
    }
}

// ---------------------------------------------------------------- host pid

/// Runs `create` (a context creation on CUDA ordinal `dev`), reading the device's compute
/// list around it while this process's host pid is unknown ([`crate::driver::hostpid`], rule 3), then
/// records the host pid in the slot. Costs one lock when the host pid is already known and
/// recorded.
fn around_context_creation(dev: usize, create: impl FnOnce() -> CUresult) -> CUresult {
    let before = if hostpid::host_pid().is_none() {
        nvml_handle(dev).and_then(driver_host_pids)
    } else {
        None
    };
    let r = create();
    if r != CUDA_SUCCESS {
        return r;
    }
    if let Some(before) = before {
        let after = nvml_handle(dev).and_then(driver_host_pids);
        let l = ProcLedger::current();
        let others = match &l.g.region {
            Ok(region) => hostpid::others_recorded(region, l.p.slot()),
            Err(_) => Vec::new(),
        };
        if let Some(after) = after {
            hostpid::learn_from_lists(&before, &after, &others);
        }
        match hostpid::host_pid() {
            Some(p) => crate::debug!("host pid {p} (found in NVML's process list)"),
            None => crate::debug!("host pid not found in NVML's process list yet"),
        }
    }
    let g = state::global();
    if let (Ok(region), Some(slot)) = (&g.region, state::holdings().slot()) {
        hostpid::on_registered(region, slot);
    }
    r
}
