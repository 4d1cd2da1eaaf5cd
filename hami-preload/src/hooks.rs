//! The exported driver and NVML functions. Each one is a thin shim: catch panics, check and
//! convert the raw arguments, call one policy function with closures over the real driver,
//! convert back.
#![allow(non_snake_case)]
#![allow(clippy::missing_safety_doc)] // Every hook has the documented contract of its driver function.

use crate::accounting::{AllocError, Allocated, Deny, Ns};
use crate::context::measure::{current_dev_ctx, log_context_cost, meter};
use crate::context::nvml::nvml_ordinal;
use crate::cuda::*;
use crate::policy::{self, DeviceQuota};
use crate::state::{self, ProcLedger, ProcState};
use crate::symbols::{self, Cu, Nv, CUDA};
use hami_common::layout::{LIMIT_FLAG_INVALID, MAX_DEVICES};
use std::cell::Cell;
use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// The hooks of pools, synchronisations, mipmapped arrays, modules and launches live in
/// [`crate::device_memory`]; the symbol table finds every hook here.
pub use crate::device_memory::{
    cuCtxSynchronize, cuCtxSynchronize_v2, cuDeviceGetDefaultMemPool, cuDeviceGetMemPool,
    cuEventSynchronize, cuKernelGetFunction, cuLaunchKernel, cuLaunchKernelEx,
    cuLaunchKernelEx_ptsz, cuLaunchKernel_ptsz, cuLibraryGetKernel, cuLibraryLoadData,
    cuLibraryLoadFromFile, cuLibraryUnload, cuMemPoolCreate, cuMemPoolDestroy,
    cuMemPoolSetAttribute, cuMemPoolTrimTo, cuMipmappedArrayCreate, cuMipmappedArrayDestroy,
    cuModuleGetFunction, cuModuleLoad, cuModuleLoadData, cuModuleLoadDataEx, cuModuleLoadFatBinary,
    cuModuleUnload, cuStreamSynchronize, cuStreamSynchronize_ptsz,
};

/// Runs `f`, turning a panic into `err` (no unwinding across the FFI boundary).
pub(crate) fn guard<R>(err: R, f: impl FnOnce() -> R) -> R {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|_| {
        crate::error!("internal error (panic) in a hook; returning an error code");
        err
    })
}

thread_local! {
    /// Whether this thread is inside one of our hooks.
    static IN_HOOK: Cell<bool> = const { Cell::new(false) };
}

/// Marks the thread as inside a hook until dropped (also when a panic unwinds to [`guard`]).
pub(crate) struct Entered;

impl Drop for Entered {
    fn drop(&mut self) {
        let _ = IN_HOOK.try_with(|f| f.set(false));
    }
}

/// Enters a hook. `None` when this thread is already inside one: the driver is calling one of
/// its own exported functions (a library linked without `-Bsymbolic` goes through its PLT,
/// i.e. into our exports; e.g. a primary-context retain that calls `cuCtxCreate_v2`, or a
/// pitched allocation that calls `cuMemAlloc_v2`). The caller then forwards the call to the
/// real function untouched: the outer hook accounts for it, exactly once, and no lock of
/// ours is taken twice by one thread.
#[inline]
pub(crate) fn enter() -> Option<Entered> {
    match IN_HOOK.try_with(|f| f.replace(true)) {
        Ok(true) => None,
        // Ok(false), or no thread-local storage any more (thread exit): account normally.
        _ => Some(Entered),
    }
}

macro_rules! real_cu {
    ($sym:ident, $ty:ty) => {
        // SAFETY: `$ty` is the documented type of the symbol.
        match unsafe { symbols::cu::<$ty>(Cu::$sym) } {
            Some(f) => f,
            None => return CUDA_ERROR_NOT_FOUND,
        }
    };
}

pub(crate) fn report_denial(what: &str, p: &ProcState, dev: usize, d: &Deny) {
    if d.is_over_limit() {
        crate::info!("{what}: CUDA_ERROR_OUT_OF_MEMORY: {d}");
    } else if p.first_denial(dev) {
        crate::error!("{what}: CUDA_ERROR_OUT_OF_MEMORY: {d}");
    } else {
        crate::debug!("{what}: CUDA_ERROR_OUT_OF_MEMORY: {d}");
    }
}

pub(crate) fn finish(
    what: &str,
    l: &ProcLedger,
    dev: usize,
    r: Result<(), AllocError>,
) -> CUresult {
    match r {
        Ok(()) => CUDA_SUCCESS,
        Err(e) => {
            if let AllocError::Denied(d) = &e {
                report_denial(what, l.p, dev, d);
            }
            e.code()
        }
    }
}

/// Allocation of a device pointer on the current context's device.
///
/// # Safety
/// `dptr` is null or writable.
pub(crate) unsafe fn alloc_ptr(
    what: &str,
    dptr: *mut CUdeviceptr,
    bytes: u64,
    real: impl FnOnce() -> CUresult,
) -> CUresult {
    if dptr.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    let (dev, ctx) = match current_dev_ctx() {
        Ok(x) => x,
        Err(e) => return e,
    };
    let l = ProcLedger::current();
    let r = l.p.accounts.alloc(
        &l,
        Ns::Ptr,
        dev,
        ctx,
        bytes,
        || match real() {
            CUDA_SUCCESS => Ok(Allocated {
                // SAFETY: the driver wrote *dptr on success.
                key: unsafe { *dptr },
                bytes,
            }),
            e => Err(e),
        },
        |_| {},
    );
    if r.is_ok() {
        crate::device_memory::backstop_tick(&l, dev);
    }
    finish(what, &l, dev, r)
}

pub(crate) fn release(ns: Ns, key: u64, real: impl FnOnce() -> CUresult) -> CUresult {
    let l = ProcLedger::current();
    l.p.accounts.free(&l, ns, key, real)
}

// ---------------------------------------------------------------- allocation

/// Hook of `cuMemAlloc_v2`.
#[no_mangle]
pub unsafe extern "C" fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, bytesize: usize) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        let f = real_cu!(MemAlloc, FnMemAlloc);
        let Some(_entered) = enter() else {
            // SAFETY: nested call (the driver calling its own export): forwarded untouched.
            return unsafe { f(dptr, bytesize) };
        };
        // SAFETY: forwarded arguments.
        unsafe { alloc_ptr("cuMemAlloc_v2", dptr, bytesize as u64, || f(dptr, bytesize)) }
    })
}

/// Hook of `cuMemAllocManaged` (charged to the current context's device).
#[no_mangle]
pub unsafe extern "C" fn cuMemAllocManaged(
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    flags: c_uint,
) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        let f = real_cu!(MemAllocManaged, FnMemAllocManaged);
        let Some(_entered) = enter() else {
            // SAFETY: nested call (the driver calling its own export): forwarded untouched.
            return unsafe { f(dptr, bytesize, flags) };
        };
        // SAFETY: forwarded arguments.
        unsafe {
            alloc_ptr("cuMemAllocManaged", dptr, bytesize as u64, || {
                f(dptr, bytesize, flags)
            })
        }
    })
}

/// Hook of `cuMemAllocAsync` (charged to the current context's device).
#[no_mangle]
pub unsafe extern "C" fn cuMemAllocAsync(
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    stream: CUstream,
) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        let f = real_cu!(MemAllocAsync, FnMemAllocAsync);
        let Some(_entered) = enter() else {
            // SAFETY: nested call (the driver calling its own export): forwarded untouched.
            return unsafe { f(dptr, bytesize, stream) };
        };
        // SAFETY: forwarded arguments.
        unsafe {
            crate::device_memory::alloc_async(
                "cuMemAllocAsync",
                dptr,
                bytesize as u64,
                None,
                stream,
                false,
                || f(dptr, bytesize, stream),
            )
        }
    })
}

/// Hook of `cuMemAllocAsync_ptsz`.
#[no_mangle]
pub unsafe extern "C" fn cuMemAllocAsync_ptsz(
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    stream: CUstream,
) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        let f = real_cu!(MemAllocAsyncPtsz, FnMemAllocAsync);
        let Some(_entered) = enter() else {
            // SAFETY: nested call (the driver calling its own export): forwarded untouched.
            return unsafe { f(dptr, bytesize, stream) };
        };
        // SAFETY: forwarded arguments.
        unsafe {
            crate::device_memory::alloc_async(
                "cuMemAllocAsync_ptsz",
                dptr,
                bytesize as u64,
                None,
                stream,
                true,
                || f(dptr, bytesize, stream),
            )
        }
    })
}

/// Hook of `cuMemAllocFromPoolAsync` (charged to the current context's device).
#[no_mangle]
pub unsafe extern "C" fn cuMemAllocFromPoolAsync(
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    pool: CUmemoryPool,
    stream: CUstream,
) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        let f = real_cu!(MemAllocFromPoolAsync, FnMemAllocFromPoolAsync);
        let Some(_entered) = enter() else {
            // SAFETY: nested call (the driver calling its own export): forwarded untouched.
            return unsafe { f(dptr, bytesize, pool, stream) };
        };
        // SAFETY: forwarded arguments.
        unsafe {
            crate::device_memory::alloc_async(
                "cuMemAllocFromPoolAsync",
                dptr,
                bytesize as u64,
                Some(pool),
                stream,
                false,
                || f(dptr, bytesize, pool, stream),
            )
        }
    })
}

/// Hook of `cuMemAllocFromPoolAsync_ptsz`.
#[no_mangle]
pub unsafe extern "C" fn cuMemAllocFromPoolAsync_ptsz(
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    pool: CUmemoryPool,
    stream: CUstream,
) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        let f = real_cu!(MemAllocFromPoolAsyncPtsz, FnMemAllocFromPoolAsync);
        let Some(_entered) = enter() else {
            // SAFETY: nested call (the driver calling its own export): forwarded untouched.
            return unsafe { f(dptr, bytesize, pool, stream) };
        };
        // SAFETY: forwarded arguments.
        unsafe {
            crate::device_memory::alloc_async(
                "cuMemAllocFromPoolAsync_ptsz",
                dptr,
                bytesize as u64,
                Some(pool),
                stream,
                true,
                || f(dptr, bytesize, pool, stream),
            )
        }
    })
}

/// Hook of `cuMemAllocPitch_v2`: charges an estimate first, then the real `pitch * height`.
#[no_mangle]
pub unsafe extern "C" fn cuMemAllocPitch_v2(
    dptr: *mut CUdeviceptr,
    pitch: *mut usize,
    width: usize,
    height: usize,
    elem: c_uint,
) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        let f = real_cu!(MemAllocPitch, FnMemAllocPitch);
        let Some(_entered) = enter() else {
            // SAFETY: nested call (the driver calling its own export): forwarded untouched.
            return unsafe { f(dptr, pitch, width, height, elem) };
        };
        if dptr.is_null() || pitch.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        let (dev, ctx) = match current_dev_ctx() {
            Ok(x) => x,
            Err(e) => return e,
        };
        let l = ProcLedger::current();
        let estimate = policy::pitch_estimate(width as u64, height as u64);
        let r = l.p.accounts.alloc(
            &l,
            Ns::Ptr,
            dev,
            ctx,
            estimate,
            // SAFETY: forwarded arguments; the driver wrote *dptr and *pitch on success.
            || match unsafe { f(dptr, pitch, width, height, elem) } {
                CUDA_SUCCESS => Ok(Allocated {
                    // SAFETY: the driver wrote *dptr on success.
                    key: unsafe { *dptr },
                    // SAFETY: the driver wrote *pitch on success.
                    bytes: (unsafe { *pitch } as u64).saturating_mul(height as u64),
                }),
                e => Err(e),
            },
            |key| {
                // SAFETY: documented type; frees what the driver just returned.
                if let Some(free) = unsafe { symbols::cu::<FnMemFree>(Cu::MemFree) } {
                    // SAFETY: key is the pointer the driver returned.
                    unsafe { free(key) };
                }
            },
        );
        finish("cuMemAllocPitch_v2", &l, dev, r)
    })
}

/// Hook of `cuMemCreate`: handles located on a device are charged to that device until
/// `cuMemRelease`; host-located handles are not charged.
#[no_mangle]
pub unsafe extern "C" fn cuMemCreate(
    handle: *mut CUmemGenericAllocationHandle,
    size: usize,
    prop: *const CUmemAllocationProp,
    flags: u64,
) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        let f = real_cu!(MemCreate, FnMemCreate);
        let Some(_entered) = enter() else {
            // SAFETY: nested call (the driver calling its own export): forwarded untouched.
            return unsafe { f(handle, size, prop, flags) };
        };
        if handle.is_null() || prop.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        // SAFETY: non-null pointer to the caller's properties.
        let loc = unsafe { (*prop).location };
        if loc.type_ != CU_MEM_LOCATION_TYPE_DEVICE || loc.id < 0 {
            // SAFETY: forwarded arguments.
            return unsafe { f(handle, size, prop, flags) };
        }
        let dev = loc.id as usize;
        let l = ProcLedger::current();
        let r = l.p.accounts.alloc(
            &l,
            Ns::Handle,
            dev,
            0,
            size as u64,
            // SAFETY: forwarded arguments; the driver wrote *handle on success.
            || match unsafe { f(handle, size, prop, flags) } {
                CUDA_SUCCESS => Ok(Allocated {
                    // SAFETY: the driver wrote *handle on success.
                    key: unsafe { *handle },
                    bytes: size as u64,
                }),
                e => Err(e),
            },
            |_| {},
        );
        finish("cuMemCreate", &l, dev, r)
    })
}

pub(crate) fn array_alloc(
    what: &str,
    ns: Ns,
    out: *mut CUarray,
    estimate: u64,
    real: impl FnOnce() -> CUresult,
) -> CUresult {
    let (dev, ctx) = match current_dev_ctx() {
        Ok(x) => x,
        Err(e) => return e,
    };
    let l = ProcLedger::current();
    let r = l.p.accounts.alloc(
        &l,
        ns,
        dev,
        ctx,
        estimate,
        || match real() {
            CUDA_SUCCESS => Ok(Allocated {
                // SAFETY: the driver wrote *out on success.
                key: unsafe { *out } as u64,
                bytes: estimate,
            }),
            e => Err(e),
        },
        |_| {},
    );
    finish(what, &l, dev, r)
}

/// Hook of `cuArrayCreate_v2` (charged with the documented footprint estimate).
#[no_mangle]
pub unsafe extern "C" fn cuArrayCreate_v2(
    out: *mut CUarray,
    desc: *const CUDA_ARRAY_DESCRIPTOR,
) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        let f = real_cu!(ArrayCreate, FnArrayCreate);
        let Some(_entered) = enter() else {
            // SAFETY: nested call (the driver calling its own export): forwarded untouched.
            return unsafe { f(out, desc) };
        };
        if out.is_null() || desc.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        // SAFETY: non-null descriptor from the caller.
        let estimate = policy::array_charge(unsafe { &*desc });
        // SAFETY: forwarded arguments.
        array_alloc("cuArrayCreate_v2", Ns::Array, out, estimate, || unsafe {
            f(out, desc)
        })
    })
}

/// Hook of `cuArray3DCreate_v2` (charged with the documented footprint estimate).
#[no_mangle]
pub unsafe extern "C" fn cuArray3DCreate_v2(
    out: *mut CUarray,
    desc: *const CUDA_ARRAY3D_DESCRIPTOR,
) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        let f = real_cu!(Array3DCreate, FnArray3DCreate);
        let Some(_entered) = enter() else {
            // SAFETY: nested call (the driver calling its own export): forwarded untouched.
            return unsafe { f(out, desc) };
        };
        if out.is_null() || desc.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        // SAFETY: non-null descriptor from the caller.
        let estimate = policy::array3d_charge(unsafe { &*desc });
        // SAFETY: forwarded arguments.
        array_alloc("cuArray3DCreate_v2", Ns::Array, out, estimate, || unsafe {
            f(out, desc)
        })
    })
}

// ---------------------------------------------------------------- release

/// Hook of `cuMemFree_v2`.
#[no_mangle]
pub unsafe extern "C" fn cuMemFree_v2(dptr: CUdeviceptr) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        let f = real_cu!(MemFree, FnMemFree);
        let Some(_entered) = enter() else {
            // SAFETY: nested call (the driver calling its own export): forwarded untouched.
            return unsafe { f(dptr) };
        };
        // SAFETY: forwarded argument.
        release(Ns::Ptr, dptr, || unsafe { f(dptr) })
    })
}

/// Hook of `cuMemFreeAsync` (released when the free is enqueued successfully).
#[no_mangle]
pub unsafe extern "C" fn cuMemFreeAsync(dptr: CUdeviceptr, stream: CUstream) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        let f = real_cu!(MemFreeAsync, FnMemFreeAsync);
        let Some(_entered) = enter() else {
            // SAFETY: nested call (the driver calling its own export): forwarded untouched.
            return unsafe { f(dptr, stream) };
        };
        // SAFETY: forwarded arguments.
        crate::device_memory::free_async(dptr, || unsafe { f(dptr, stream) })
    })
}

/// Hook of `cuMemFreeAsync_ptsz`.
#[no_mangle]
pub unsafe extern "C" fn cuMemFreeAsync_ptsz(dptr: CUdeviceptr, stream: CUstream) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        let f = real_cu!(MemFreeAsyncPtsz, FnMemFreeAsync);
        let Some(_entered) = enter() else {
            // SAFETY: nested call (the driver calling its own export): forwarded untouched.
            return unsafe { f(dptr, stream) };
        };
        // SAFETY: forwarded arguments.
        crate::device_memory::free_async(dptr, || unsafe { f(dptr, stream) })
    })
}

/// Hook of `cuMemRelease`.
#[no_mangle]
pub unsafe extern "C" fn cuMemRelease(handle: CUmemGenericAllocationHandle) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        let f = real_cu!(MemRelease, FnMemRelease);
        let Some(_entered) = enter() else {
            // SAFETY: nested call (the driver calling its own export): forwarded untouched.
            return unsafe { f(handle) };
        };
        // SAFETY: forwarded argument.
        release(Ns::Handle, handle, || unsafe { f(handle) })
    })
}

/// Hook of `cuArrayDestroy`.
#[no_mangle]
pub unsafe extern "C" fn cuArrayDestroy(array: CUarray) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        let f = real_cu!(ArrayDestroy, FnArrayDestroy);
        let Some(_entered) = enter() else {
            // SAFETY: nested call (the driver calling its own export): forwarded untouched.
            return unsafe { f(array) };
        };
        // SAFETY: forwarded argument.
        release(Ns::Array, array as u64, || unsafe { f(array) })
    })
}

// ---------------------------------------------------------------- contexts

/// Hook of `cuDevicePrimaryCtxRetain`: the first retain per device charges the context.
#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxRetain(pctx: *mut CUcontext, dev: CUdevice) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        let f = real_cu!(PrimaryCtxRetain, FnPrimaryCtxRetain);
        let Some(_entered) = enter() else {
            // SAFETY: nested call (the driver calling its own export): forwarded untouched.
            return unsafe { f(pctx, dev) };
        };
        if pctx.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        if dev < 0 {
            // SAFETY: forwarded arguments.
            return unsafe { f(pctx, dev) };
        }
        let l = ProcLedger::current();
        let m = meter();
        let (r, cost) = l.p.contexts.primary_retain(&l, dev as usize, &m, || {
            // SAFETY: forwarded arguments; *pctx written on success.
            match unsafe { f(pctx, dev) } {
                // SAFETY: the driver wrote *pctx on success.
                CUDA_SUCCESS => Ok(unsafe { *pctx } as usize),
                e => Err(e),
            }
        });
        log_context_cost("cuDevicePrimaryCtxRetain", dev as usize, cost);
        r
    })
}

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
        crate::device_memory::context_gone(&l, before);
    }
    r
}

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
        crate::device_memory::context_gone(&l, ctx);
    }
    r
}

/// Hook of `cuDevicePrimaryCtxRelease` (pre-11 name of the `_v2` function).
#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxRelease(dev: CUdevice) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        let f = real_cu!(PrimaryCtxRelease, FnDeviceOp);
        let Some(_entered) = enter() else {
            // SAFETY: nested call (the driver calling its own export): forwarded untouched.
            return unsafe { f(dev) };
        };
        primary_release(f, dev)
    })
}

/// Hook of `cuDevicePrimaryCtxRelease_v2`: the last release uncharges the context.
#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxRelease_v2(dev: CUdevice) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        let f = real_cu!(PrimaryCtxReleaseV2, FnDeviceOp);
        let Some(_entered) = enter() else {
            // SAFETY: nested call (the driver calling its own export): forwarded untouched.
            return unsafe { f(dev) };
        };
        primary_release(f, dev)
    })
}

/// Hook of `cuDevicePrimaryCtxReset`.
#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxReset(dev: CUdevice) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        let f = real_cu!(PrimaryCtxReset, FnDeviceOp);
        let Some(_entered) = enter() else {
            // SAFETY: nested call (the driver calling its own export): forwarded untouched.
            return unsafe { f(dev) };
        };
        primary_reset(f, dev)
    })
}

/// Hook of `cuDevicePrimaryCtxReset_v2`: the primary context's allocations are gone.
#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxReset_v2(dev: CUdevice) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        let f = real_cu!(PrimaryCtxResetV2, FnDeviceOp);
        let Some(_entered) = enter() else {
            // SAFETY: nested call (the driver calling its own export): forwarded untouched.
            return unsafe { f(dev) };
        };
        primary_reset(f, dev)
    })
}

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
    let (r, cost) = l.p.contexts.create(&l, dev as usize, &m, || match real() {
        // SAFETY: *pctx written on success.
        CUDA_SUCCESS => Ok(unsafe { *pctx } as usize),
        e => Err(e),
    });
    log_context_cost(what, dev as usize, cost);
    r
}

/// Hook of `cuCtxCreate_v2`.
#[no_mangle]
pub unsafe extern "C" fn cuCtxCreate_v2(
    pctx: *mut CUcontext,
    flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        let f = real_cu!(CtxCreateV2, FnCtxCreateV2);
        let Some(_entered) = enter() else {
            // SAFETY: nested call (the driver calling its own export): forwarded untouched.
            return unsafe { f(pctx, flags, dev) };
        };
        // SAFETY: forwarded arguments.
        ctx_create("cuCtxCreate_v2", pctx, dev, || unsafe {
            f(pctx, flags, dev)
        })
    })
}

/// Hook of `cuCtxCreate`, the pre-3.2 name of `cuCtxCreate_v2` (same arguments and meaning;
/// still exported by the driver and reached by `cuGetProcAddress("cuCtxCreate", < 3020)`).
#[no_mangle]
pub unsafe extern "C" fn cuCtxCreate(
    pctx: *mut CUcontext,
    flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        let f = real_cu!(CtxCreateV1, FnCtxCreateV2);
        let Some(_entered) = enter() else {
            // SAFETY: nested call (the driver calling its own export): forwarded untouched.
            return unsafe { f(pctx, flags, dev) };
        };
        // SAFETY: forwarded arguments.
        ctx_create("cuCtxCreate", pctx, dev, || unsafe { f(pctx, flags, dev) })
    })
}

/// Hook of `cuCtxCreate_v3`.
#[no_mangle]
pub unsafe extern "C" fn cuCtxCreate_v3(
    pctx: *mut CUcontext,
    params: *mut c_void,
    num_params: c_int,
    flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        let f = real_cu!(CtxCreateV3, FnCtxCreateV3);
        let Some(_entered) = enter() else {
            // SAFETY: nested call (the driver calling its own export): forwarded untouched.
            return unsafe { f(pctx, params, num_params, flags, dev) };
        };
        // SAFETY: forwarded arguments.
        ctx_create("cuCtxCreate_v3", pctx, dev, || unsafe {
            f(pctx, params, num_params, flags, dev)
        })
    })
}

/// Hook of `cuCtxCreate_v4`.
#[no_mangle]
pub unsafe extern "C" fn cuCtxCreate_v4(
    pctx: *mut CUcontext,
    params: *mut c_void,
    flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        let f = real_cu!(CtxCreateV4, FnCtxCreateV4);
        let Some(_entered) = enter() else {
            // SAFETY: nested call (the driver calling its own export): forwarded untouched.
            return unsafe { f(pctx, params, flags, dev) };
        };
        // SAFETY: forwarded arguments.
        ctx_create("cuCtxCreate_v4", pctx, dev, || unsafe {
            f(pctx, params, flags, dev)
        })
    })
}

/// Hook of `cuCtxDestroy`, the pre-4.0 name of `cuCtxDestroy_v2`: when the driver succeeds the
/// context is gone, so it is uncharged the same way.
#[no_mangle]
pub unsafe extern "C" fn cuCtxDestroy(ctx: CUcontext) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        let f = real_cu!(CtxDestroyV1, FnCtxDestroy);
        let Some(_entered) = enter() else {
            // SAFETY: nested call (the driver calling its own export): forwarded untouched.
            return unsafe { f(ctx) };
        };
        let l = ProcLedger::current();
        // SAFETY: forwarded argument.
        let r =
            l.p.contexts
                .destroy(&l, &l.p.accounts, ctx as usize, || unsafe { f(ctx) });
        if r == CUDA_SUCCESS {
            crate::device_memory::context_gone(&l, ctx as usize);
        }
        r
    })
}

/// Hook of `cuCtxDestroy_v2`: uncharges the context and everything allocated in it.
#[no_mangle]
pub unsafe extern "C" fn cuCtxDestroy_v2(ctx: CUcontext) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        let f = real_cu!(CtxDestroyV2, FnCtxDestroy);
        let Some(_entered) = enter() else {
            // SAFETY: nested call (the driver calling its own export): forwarded untouched.
            return unsafe { f(ctx) };
        };
        let l = ProcLedger::current();
        // SAFETY: forwarded argument.
        let r =
            l.p.contexts
                .destroy(&l, &l.p.accounts, ctx as usize, || unsafe { f(ctx) });
        if r == CUDA_SUCCESS {
            crate::device_memory::context_gone(&l, ctx as usize);
        }
        r
    })
}

// ---------------------------------------------------------------- views

/// The quota of CUDA ordinal `dev` (None: not tracked, report the physical values).
fn quota(dev: usize) -> Option<DeviceQuota> {
    if dev >= MAX_DEVICES {
        return None;
    }
    let g = state::global();
    let local_invalid = g.config.limit_flags[dev] & LIMIT_FLAG_INVALID != 0;
    Some(match &g.region {
        Ok(r) => DeviceQuota {
            limit: r.limit(dev),
            invalid: local_invalid || r.limit_flags(dev) & LIMIT_FLAG_INVALID != 0,
            // Allocations' usage: other processes' unused reserves are theirs to lose.
            used: r.used(dev),
        },
        // No region: allocations fail closed, so nothing is free.
        Err(_) => DeviceQuota {
            limit: g.config.limits[dev],
            invalid: true,
            used: 0,
        },
    })
}

/// Hook of `cuMemGetInfo_v2`: the quota of the current context's device.
#[no_mangle]
pub unsafe extern "C" fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        let f = real_cu!(MemGetInfoV2, FnMemGetInfo);
        let Some(_entered) = enter() else {
            // SAFETY: nested call (the driver calling its own export): forwarded untouched.
            return unsafe { f(free, total) };
        };
        if free.is_null() || total.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        // SAFETY: forwarded, non-null out pointers.
        let r = unsafe { f(free, total) };
        if r != CUDA_SUCCESS {
            return r;
        }
        let Ok((dev, _)) = current_dev_ctx() else {
            return r;
        };
        crate::device_memory::backstop_poll(Some(dev));
        if let Some(q) = quota(dev) {
            // SAFETY: non-null out pointers the driver just wrote.
            unsafe {
                let (fr, to) = policy::mem_view(q, *free as u64, *total as u64);
                *free = fr as usize;
                *total = to as usize;
            }
        }
        r
    })
}

/// Hook of `cuDeviceTotalMem_v2`: min(limit, physical).
#[no_mangle]
pub unsafe extern "C" fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: CUdevice) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        let f = real_cu!(DeviceTotalMemV2, FnDeviceTotalMem);
        let Some(_entered) = enter() else {
            // SAFETY: nested call (the driver calling its own export): forwarded untouched.
            return unsafe { f(bytes, dev) };
        };
        if bytes.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        // SAFETY: forwarded arguments.
        let r = unsafe { f(bytes, dev) };
        if r == CUDA_SUCCESS && dev >= 0 {
            if let Some(q) = quota(dev as usize) {
                // SAFETY: non-null out pointer the driver just wrote.
                unsafe { *bytes = policy::total_view(q, *bytes as u64) as usize };
            }
        }
        r
    })
}

fn nvml_view(device: nvmlDevice_t, free: &mut u64, total: &mut u64, used: &mut u64) {
    let Some(q) = nvml_ordinal(device).and_then(quota) else {
        return;
    };
    if q.limit == 0 && !q.invalid {
        return;
    }
    let (f, t) = policy::mem_view(q, *free, *total);
    *free = f;
    *total = t;
    if !q.invalid {
        *used = q.used.min(t);
    }
}

/// Hook of `nvmlDeviceGetMemoryInfo`: the quota of the matching CUDA device.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo(
    device: nvmlDevice_t,
    memory: *mut nvmlMemory_t,
) -> nvmlReturn_t {
    guard(NVML_ERROR_UNKNOWN, || {
        // SAFETY: documented type.
        let Some(f) = (unsafe { symbols::nv::<FnNvmlMemInfo>(Nv::MemInfo) }) else {
            return NVML_ERROR_FUNCTION_NOT_FOUND;
        };
        let Some(_entered) = enter() else {
            // SAFETY: nested call (NVML calling its own export): forwarded untouched.
            return unsafe { f(device, memory) };
        };
        if memory.is_null() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        // SAFETY: forwarded arguments.
        let r = unsafe { f(device, memory) };
        if r == NVML_SUCCESS {
            // SAFETY: non-null, just written by NVML.
            let m = unsafe { &mut *memory };
            nvml_view(device, &mut m.free, &mut m.total, &mut m.used);
        }
        r
    })
}

/// Hook of `nvmlDeviceGetMemoryInfo_v2`: the quota of the matching CUDA device.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(
    device: nvmlDevice_t,
    memory: *mut nvmlMemory_v2_t,
) -> nvmlReturn_t {
    guard(NVML_ERROR_UNKNOWN, || {
        // SAFETY: documented type.
        let Some(f) = (unsafe { symbols::nv::<FnNvmlMemInfoV2>(Nv::MemInfoV2) }) else {
            return NVML_ERROR_FUNCTION_NOT_FOUND;
        };
        let Some(_entered) = enter() else {
            // SAFETY: nested call (NVML calling its own export): forwarded untouched.
            return unsafe { f(device, memory) };
        };
        if memory.is_null() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        // SAFETY: forwarded arguments.
        let r = unsafe { f(device, memory) };
        if r == NVML_SUCCESS {
            // SAFETY: non-null, just written by NVML.
            let m = unsafe { &mut *memory };
            nvml_view(device, &mut m.free, &mut m.total, &mut m.used);
        }
        r
    })
}

// ---------------------------------------------------------------- cuGetProcAddress

/// After a successful real `cuGetProcAddress*`: hand out our hook instead of the real
/// function when `*pfn` is the real address of a function we hook (any name, version or
/// flags that lead there).
///
/// # Safety
/// `pfn` is null or points to the function pointer the driver wrote.
unsafe fn fix_pfn(symbol: *const c_char, pfn: *mut *mut c_void, version: c_int) {
    if pfn.is_null() {
        return;
    }
    let Some(lib) = CUDA.get_resolved() else {
        return;
    };
    // SAFETY: non-null, written by the driver.
    let addr = unsafe { *pfn };
    if let Some(h) = symbols::cu_hook_for_real(lib, addr) {
        // SAFETY: as above.
        unsafe { *pfn = h };
        return;
    }
    if !symbol.is_null() && !addr.is_null() {
        // SAFETY: non-null C string from the caller.
        if unsafe { CStr::from_ptr(symbol) }.to_bytes() == b"cuGetProcAddress" {
            let ours = if version >= 12000 {
                symbols::cu_hook_addr(Cu::GetProcAddressV2 as usize)
            } else {
                symbols::cu_hook_addr(Cu::GetProcAddress as usize)
            };
            // SAFETY: as above.
            unsafe { *pfn = ours };
        }
    }
}

/// Hook of `cuGetProcAddress` (CUDA 11.3+ signature).
#[no_mangle]
pub unsafe extern "C" fn cuGetProcAddress(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        let f = real_cu!(GetProcAddress, FnGetProcAddress);
        let Some(_entered) = enter() else {
            // SAFETY: nested call (the driver calling its own export): forwarded untouched.
            return unsafe { f(symbol, pfn, version, flags) };
        };
        // SAFETY: forwarded arguments.
        let r = unsafe { f(symbol, pfn, version, flags) };
        if r == CUDA_SUCCESS {
            // SAFETY: pfn as passed by the caller and written by the driver.
            unsafe { fix_pfn(symbol, pfn, version) };
        }
        r
    })
}

/// Hook of `cuGetProcAddress_v2` (CUDA 12+ signature).
#[no_mangle]
pub unsafe extern "C" fn cuGetProcAddress_v2(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
    status: *mut c_int,
) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        let f = real_cu!(GetProcAddressV2, FnGetProcAddressV2);
        let Some(_entered) = enter() else {
            // SAFETY: nested call (the driver calling its own export): forwarded untouched.
            return unsafe { f(symbol, pfn, version, flags, status) };
        };
        // SAFETY: forwarded arguments.
        let r = unsafe { f(symbol, pfn, version, flags, status) };
        if r == CUDA_SUCCESS {
            // SAFETY: pfn as passed by the caller and written by the driver.
            unsafe { fix_pfn(symbol, pfn, version) };
        }
        r
    })
}
