//! Context exports: primary contexts, created contexts, the current-context stack, the
//! context's device and synchronisation.

use std::ffi::{c_int, c_uint, c_void};

use crate::driver::inited;
use crate::ffi::*;

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
        let mut g = crate::driver::clock::wait_until(g, Some(at))?;
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
        let mut g = crate::driver::clock::wait_until(g, Some(at))?;
        g.pools_release_at_sync();
        Ok(())
    })
}

// ---------------------------------------------------------------------------------------------
// Limits

#[no_mangle]
pub unsafe extern "C" fn cuCtxSetLimit(limit: c_int, value: usize) -> CUresult {
    run(|| inited()?.ctx_set_limit(limit, value as u64))
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxGetLimit(pvalue: *mut usize, limit: c_int) -> CUresult {
    run(|| {
        let g = inited()?;
        nonnull(pvalue)?;
        let v = g.ctx_get_limit(limit)?;
        // SAFETY: checked non-NULL; C contract.
        unsafe { put(pvalue, v as usize) };
        Ok(())
    })
}

// ---------------------------------------------------------------------------------------------
// Green contexts (CUDA 12.4)

/// Bytes of `CUdevResource` the fake writes: the type and, at offset 96 (after the 92 bytes
/// of internal padding), `CUdevSmResource::smCount`.
const RESOURCE_SM_COUNT_AT: usize = 96;

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetDevResource(
    dev: CUdevice,
    resource: *mut c_void,
    ty: c_int,
) -> CUresult {
    run(|| {
        let g = inited()?;
        nonnull(resource)?;
        g.phys_of(dev)?;
        if ty != CU_DEV_RESOURCE_TYPE_SM {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let p = resource as *mut u8;
        // SAFETY: the caller's CUdevResource (at least 144 bytes in every CUDA 12.4+ header):
        // its type, zeroed padding, the SM count; the device's ordinal is kept in the
        // padding so that a descriptor knows its device.
        unsafe {
            std::ptr::write_bytes(p, 0, RESOURCE_SM_COUNT_AT + 4);
            (p as *mut c_int).write_unaligned(ty);
            (p.add(8) as *mut c_int).write_unaligned(dev);
            (p.add(RESOURCE_SM_COUNT_AT) as *mut c_uint).write_unaligned(132);
        }
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDevResourceGenerateDesc(
    desc: *mut *mut c_void,
    resources: *mut c_void,
    n: c_uint,
) -> CUresult {
    run(|| {
        let mut g = inited()?;
        nonnull(desc)?;
        nonnull(resources)?;
        if n == 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let p = resources as *const u8;
        // SAFETY: the caller's first CUdevResource, as cuDeviceGetDevResource wrote it.
        let (ty, dev) = unsafe {
            (
                (p as *const c_int).read_unaligned(),
                (p.add(8) as *const c_int).read_unaligned(),
            )
        };
        if ty != CU_DEV_RESOURCE_TYPE_SM {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        g.phys_of(dev)?;
        let h = g.green_desc(dev as usize);
        // SAFETY: checked non-NULL; C contract.
        unsafe { put(desc, h as *mut c_void) };
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGreenCtxCreate(
    ctx: *mut *mut c_void,
    desc: *mut c_void,
    dev: CUdevice,
    flags: c_uint,
) -> CUresult {
    run(|| {
        let mut g = inited()?;
        nonnull(ctx)?;
        let h = g.green_create(desc as u64, dev, flags)?;
        // SAFETY: checked non-NULL; C contract.
        unsafe { put(ctx, h as *mut c_void) };
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGreenCtxDestroy(ctx: *mut c_void) -> CUresult {
    run(|| inited()?.green_destroy(ctx as u64))
}
