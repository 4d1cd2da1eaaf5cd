//! Context exports: primary contexts, created contexts, the current-context stack, the
//! context's device and synchronisation.

use std::ffi::{c_int, c_uint, c_void};

use crate::driver::inited;
use crate::ffi::*;
use crate::{nonnull, put, run};

// ---------------------------------------------------------------------------------------------
// Contexts

#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxRetain(pctx: *mut CUcontext, dev: CUdevice) -> CUresult {
    run(|| {
        let mut g = inited()?;
        nonnull(pctx)?;
        let h = g.primary_retain(dev)?;
        // SAFETY: checked non-NULL; C contract.
        unsafe { put(pctx, h as CUcontext) };
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxRelease(dev: CUdevice) -> CUresult {
    run(|| inited()?.primary_release(dev))
}

#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxRelease_v2(dev: CUdevice) -> CUresult {
    run(|| inited()?.primary_release(dev))
}

#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxReset(dev: CUdevice) -> CUresult {
    run(|| inited()?.primary_reset(dev))
}

#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxReset_v2(dev: CUdevice) -> CUresult {
    run(|| inited()?.primary_reset(dev))
}

#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxGetState(
    dev: CUdevice,
    flags: *mut c_uint,
    active: *mut c_int,
) -> CUresult {
    run(|| {
        let g = inited()?;
        nonnull(flags)?;
        nonnull(active)?;
        let (f, a) = g.primary_state(dev)?;
        // SAFETY: checked non-NULL; C contract.
        unsafe {
            put(flags, f);
            put(active, a as c_int);
        }
        Ok(())
    })
}

fn ctx_create(pctx: *mut CUcontext, flags: c_uint, dev: CUdevice) -> CUresult {
    run(|| {
        let mut g = inited()?;
        nonnull(pctx)?;
        if flags > 0xff {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let h = g.ctx_create(dev)?;
        // SAFETY: checked non-NULL; C contract.
        unsafe { put(pctx, h as CUcontext) };
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxCreate(
    pctx: *mut CUcontext,
    flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    ctx_create(pctx, flags, dev)
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxCreate_v2(
    pctx: *mut CUcontext,
    flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    ctx_create(pctx, flags, dev)
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxCreate_v3(
    pctx: *mut CUcontext,
    params: *mut c_void,
    num_params: c_int,
    flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    if num_params < 0 || (num_params > 0 && params.is_null()) {
        return run(|| {
            drop(inited()?);
            Err(CUDA_ERROR_INVALID_VALUE)
        });
    }
    ctx_create(pctx, flags, dev)
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxCreate_v4(
    pctx: *mut CUcontext,
    _ctx_create_params: *mut c_void,
    flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    ctx_create(pctx, flags, dev)
}

fn ctx_destroy(ctx: CUcontext) -> CUresult {
    run(|| {
        let mut g = inited()?;
        nonnull(ctx)?;
        g.ctx_destroy(ctx as u64)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxDestroy(ctx: CUcontext) -> CUresult {
    ctx_destroy(ctx)
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxDestroy_v2(ctx: CUcontext) -> CUresult {
    ctx_destroy(ctx)
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxSetCurrent(ctx: CUcontext) -> CUresult {
    run(|| inited()?.set_current(ctx as u64))
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxGetCurrent(pctx: *mut CUcontext) -> CUresult {
    run(|| {
        let _g = inited()?;
        nonnull(pctx)?;
        // SAFETY: checked non-NULL; C contract.
        unsafe { put(pctx, crate::driver::current_handle() as CUcontext) };
        Ok(())
    })
}

fn push_current(ctx: CUcontext) -> CUresult {
    run(|| {
        let g = inited()?;
        nonnull(ctx)?;
        g.push_current(ctx as u64)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxPushCurrent(ctx: CUcontext) -> CUresult {
    push_current(ctx)
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxPushCurrent_v2(ctx: CUcontext) -> CUresult {
    push_current(ctx)
}

fn pop_current(pctx: *mut CUcontext) -> CUresult {
    run(|| {
        let g = inited()?;
        let h = g.pop_current()?;
        if !pctx.is_null() {
            // SAFETY: non-NULL; C contract.
            unsafe { put(pctx, h as CUcontext) };
        }
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxPopCurrent(pctx: *mut CUcontext) -> CUresult {
    pop_current(pctx)
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxPopCurrent_v2(pctx: *mut CUcontext) -> CUresult {
    pop_current(pctx)
}

fn ctx_get_device(device: *mut CUdevice, ctx: CUcontext) -> CUresult {
    run(|| {
        let g = inited()?;
        nonnull(device)?;
        let c = if ctx.is_null() {
            g.current()?.1
        } else {
            g.ctx(ctx as u64)?
        };
        // SAFETY: checked non-NULL; C contract.
        unsafe { put(device, c.ordinal as CUdevice) };
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxGetDevice(device: *mut CUdevice) -> CUresult {
    ctx_get_device(device, std::ptr::null_mut())
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxGetDevice_v2(device: *mut CUdevice, ctx: CUcontext) -> CUresult {
    ctx_get_device(device, ctx)
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxSynchronize() -> CUresult {
    run(|| {
        let g = inited()?;
        let (c, _) = g.current()?;
        let at = g.ctx_done_at(c);
        let mut g = crate::driver::wait_until(g, Some(at))?;
        g.pools_release_at_sync();
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxSynchronize_v2(ctx: CUcontext) -> CUresult {
    run(|| {
        let g = inited()?;
        let c = if ctx.is_null() {
            g.current()?.0
        } else {
            g.ctx(ctx as u64)?;
            ctx as u64
        };
        let at = g.ctx_done_at(c);
        let mut g = crate::driver::wait_until(g, Some(at))?;
        g.pools_release_at_sync();
        Ok(())
    })
}
