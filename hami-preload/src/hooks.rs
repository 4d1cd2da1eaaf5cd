//! The exported driver and NVML functions. Each one is a thin shim: catch panics, check and
//! convert the raw arguments, call one policy function with closures over the real driver,
//! convert back.
#![allow(non_snake_case)]
#![allow(clippy::missing_safety_doc)] // Every hook has the documented contract of its driver function.

use crate::accounting::{AllocError, Allocated, Deny, Ns};
use crate::contexts::{Held, Meter, OwnUsage};
use crate::ctxlock::{self, CtxLock};
use crate::cuda::*;
use crate::policy::{self, ContextCost, DeviceQuota};
use crate::state::{self, ProcLedger, ProcState};
use crate::symbols::{self, Cu, Nv, CUDA};
use hami_common::layout::{LIMIT_FLAG_INVALID, MAX_DEVICES};
use std::cell::Cell;
use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Mutex, OnceLock, PoisonError};

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

/// The current context's device and the context itself. The device comes from the process's
/// context → device cache when it can (see [`crate::ctxcache`]), else from `cuCtxGetDevice`.
pub(crate) fn current_dev_ctx() -> Result<(usize, usize), CUresult> {
    let cache = &state::proc_state().accounts.ctx_devices;
    // Before asking the driver: a context destroyed after this point is not cached.
    let token = cache.token();
    let mut ctx: CUcontext = std::ptr::null_mut();
    // SAFETY: documented type; valid out pointer.
    if let Some(f) = unsafe { symbols::cu::<FnCtxGetCurrent>(Cu::CtxGetCurrent) } {
        // SAFETY: valid out pointer.
        if unsafe { f(&mut ctx) } != CUDA_SUCCESS {
            ctx = std::ptr::null_mut();
        }
    }
    let ctx = ctx as usize;
    if let Some(dev) = cache.lookup(token, ctx) {
        return Ok((dev, ctx));
    }
    // SAFETY: documented types.
    let get_dev =
        unsafe { symbols::cu::<FnCtxGetDevice>(Cu::CtxGetDevice) }.ok_or(CUDA_ERROR_NOT_FOUND)?;
    let mut dev: CUdevice = 0;
    // SAFETY: valid out pointer.
    let r = unsafe { get_dev(&mut dev) };
    if r != CUDA_SUCCESS {
        return Err(r);
    }
    let dev = dev.max(0) as usize;
    cache.fill(token, ctx, dev);
    Ok((dev, ctx))
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

/// NVML handles of CUDA ordinals, for measuring context memory.
static NVML_BY_ORDINAL: Mutex<[usize; MAX_DEVICES]> = Mutex::new([0; MAX_DEVICES]);
static NVML_INIT: OnceLock<bool> = OnceLock::new();

pub(crate) fn nvml_ready() -> bool {
    *NVML_INIT.get_or_init(|| {
        // SAFETY: documented type.
        match unsafe { symbols::nv::<FnNvmlInit>(Nv::InitV2) } {
            // SAFETY: no arguments.
            Some(f) => (unsafe { f() }) == NVML_SUCCESS,
            None => false,
        }
    })
}

/// The NVML handle of CUDA ordinal `dev` (found by UUID, cached).
fn nvml_handle(dev: usize) -> Option<nvmlDevice_t> {
    if dev >= MAX_DEVICES || !nvml_ready() {
        return None;
    }
    let mut cache = NVML_BY_ORDINAL
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    if cache[dev] == 0 {
        let uuid = state::device_uuid(dev as CUdevice)?;
        cache[dev] = nvml_handle_for_uuid(&uuid)? as usize;
    }
    Some(cache[dev] as nvmlDevice_t)
}

/// Device used memory per NVML for CUDA ordinal `dev` (real NVML, not our view).
fn nvml_used(dev: usize) -> Option<u64> {
    let h = nvml_handle(dev)?;
    // SAFETY: documented type.
    let info = unsafe { symbols::nv::<FnNvmlMemInfo>(Nv::MemInfo) }?;
    let mut m = nvmlMemory_t::default();
    // SAFETY: handle from NVML, valid out pointer.
    (unsafe { info(h, &mut m) } == NVML_SUCCESS).then_some(m.used)
}

/// This process's entry in one `nvmlDeviceGetComputeRunningProcesses*` list. `call(count,
/// buffer)` is the NVML function; `entry` reads (pid, used) from an entry. The buffer grows
/// while NVML answers `NVML_ERROR_INSUFFICIENT_SIZE`. Entries of our pid are summed (MIG
/// lists a process once per instance).
fn own_in_list<T: Copy + Default>(
    pid: u32,
    call: impl Fn(*mut c_uint, *mut T) -> nvmlReturn_t,
    entry: impl Fn(&T) -> (u32, u64),
) -> OwnUsage {
    let mut cap: usize = 64;
    for _ in 0..4 {
        let mut buf = vec![T::default(); cap];
        let mut n = cap as c_uint;
        match call(&mut n, buf.as_mut_ptr()) {
            NVML_SUCCESS => {
                let mut found = None::<u64>;
                for e in &buf[..(n as usize).min(cap)] {
                    let (p, used) = entry(e);
                    if p != pid {
                        continue;
                    }
                    if used == NVML_VALUE_NOT_AVAILABLE {
                        return OwnUsage::Unavailable;
                    }
                    found = Some(found.unwrap_or(0).saturating_add(used));
                }
                return found.map_or(OwnUsage::NotListed, OwnUsage::Listed);
            }
            NVML_ERROR_INSUFFICIENT_SIZE => cap = (n as usize).max(cap) + 16,
            _ => return OwnUsage::Unavailable,
        }
    }
    OwnUsage::Unavailable
}

/// This process's used memory on CUDA ordinal `dev` per NVML's list of compute processes
/// (`_v3`, else `_v2`, else the v1 name). NVML reports pids of the host's pid namespace: in
/// a container with its own pid namespace our `getpid()` is not listed.
pub(crate) fn nvml_own_used(dev: usize) -> OwnUsage {
    let Some(h) = nvml_handle(dev) else {
        return OwnUsage::Unavailable;
    };
    // SAFETY: no preconditions.
    let pid = unsafe { libc::getpid() } as u32;
    for sym in [Nv::ProcsV3, Nv::ProcsV2] {
        // SAFETY: `_v3` and `_v2` both take `nvmlProcessInfo_v2_t` entries.
        if let Some(f) = unsafe { symbols::nv::<FnNvmlProcsV2>(sym) } {
            let r = own_in_list(
                pid,
                // SAFETY: handle from NVML; `buf` holds `*n` entries.
                |n, buf| unsafe { f(h, n, buf) },
                |e: &nvmlProcessInfo_v2_t| (e.pid, e.used_gpu_memory),
            );
            if r != OwnUsage::Unavailable {
                return r;
            }
        }
    }
    // SAFETY: the v1 name takes `nvmlProcessInfo_v1_t` entries.
    match unsafe { symbols::nv::<FnNvmlProcsV1>(Nv::ProcsV1) } {
        Some(f) => own_in_list(
            pid,
            // SAFETY: handle from NVML; `buf` holds `*n` entries.
            |n, buf| unsafe { f(h, n, buf) },
            |e: &nvmlProcessInfo_v1_t| (e.pid, e.used_gpu_memory),
        ),
        None => OwnUsage::Unavailable,
    }
}

/// Takes the region-wide context-creation lock (see [`crate::ctxlock`]). When no
/// measurement is possible (neither NVML nor the driver's `cuMemGetInfo_v2`) there is
/// nothing to protect: no lock (it would only serialize context creation across the
/// region's processes).
fn ctx_serialize() -> Option<Held> {
    if !nvml_ready() && !driver_info_available() {
        return None;
    }
    let g = state::global();
    g.region.as_ref().ok()?;
    match CtxLock::acquire(&g.config.region_path, ctxlock::WAIT_LIMIT) {
        Ok(l) => Some(Box::new(l)),
        Err(e) => {
            crate::warn!("context-creation lock: {e}; measuring context memory without it");
            None
        }
    }
}

/// This process's non-context charges on `dev`.
fn own_data(dev: usize) -> u64 {
    ProcLedger::current().own_non_context(dev)
}

/// Non-context charges of every process sharing the region on `dev`.
fn region_data(dev: usize) -> u64 {
    let Ok(region) = &state::global().region else {
        return 0;
    };
    let kinds: Vec<usize> = hami_common::layout::UsageKind::ALL
        .iter()
        .filter(|&&k| k != hami_common::layout::UsageKind::Context)
        .map(|k| k.index())
        .collect();
    region
        .snapshot()
        .slots
        .iter()
        .filter_map(|s| s.usage.get(dev))
        .flat_map(|u| kinds.iter().map(move |&k| u[k]))
        .fold(0u64, u64::saturating_add)
}

/// Everything every process sharing the region has charged on `dev`, all kinds.
fn region_used(dev: usize) -> u64 {
    let Ok(region) = &state::global().region else {
        return 0;
    };
    region
        .snapshot()
        .slots
        .iter()
        .filter_map(|s| s.usage.get(dev))
        .flat_map(|u| u.iter().copied())
        .fold(0u64, u64::saturating_add)
}

/// Whether the driver offers `cuMemGetInfo_v2` (the driver-only context measurement).
fn driver_info_available() -> bool {
    // SAFETY: documented type.
    unsafe { symbols::cu::<FnMemGetInfo>(Cu::MemGetInfoV2) }.is_some()
}

/// `(free, total)` of `ctx`'s device per the real `cuMemGetInfo_v2`, with `ctx` made
/// current for the reading (`cuCtxPushCurrent_v2` / `cuCtxPopCurrent_v2`), so that the
/// calling thread's context stack is left exactly as it was. If `ctx` is already current no
/// push is needed; otherwise, without both push and pop, `None`.
fn driver_info(ctx: usize) -> Option<(u64, u64)> {
    // SAFETY: documented type.
    let info = unsafe { symbols::cu::<FnMemGetInfo>(Cu::MemGetInfoV2) }?;
    let mut cur: CUcontext = std::ptr::null_mut();
    // SAFETY: documented type.
    if let Some(get) = unsafe { symbols::cu::<FnCtxGetCurrent>(Cu::CtxGetCurrent) } {
        // SAFETY: valid out pointer.
        if unsafe { get(&mut cur) } != CUDA_SUCCESS {
            cur = std::ptr::null_mut();
        }
    }
    let pop = if cur as usize == ctx {
        None
    } else {
        // SAFETY: documented types.
        let push = unsafe { symbols::cu::<FnCtxPushCurrent>(Cu::CtxPushCurrentV2) }?;
        // SAFETY: documented type.
        let pop = unsafe { symbols::cu::<FnCtxPopCurrent>(Cu::CtxPopCurrentV2) }?;
        // SAFETY: a context of this process (the driver checks it).
        if unsafe { push(ctx as CUcontext) } != CUDA_SUCCESS {
            return None;
        }
        Some(pop)
    };
    let (mut free, mut total) = (0usize, 0usize);
    // SAFETY: valid out pointers; the real function, not our quota view.
    let r = unsafe { info(&mut free, &mut total) };
    if let Some(pop) = pop {
        let mut popped: CUcontext = std::ptr::null_mut();
        // SAFETY: valid out pointer; pops the context pushed above.
        unsafe { pop(&mut popped) };
    }
    (r == CUDA_SUCCESS).then_some((free as u64, total as u64))
}

/// The meter of context memory used by the context hooks.
pub(crate) fn meter() -> Meter<'static> {
    Meter {
        configured: state::global().config.context_overhead,
        used_now: &nvml_used,
        own_used: &nvml_own_used,
        own_data: &own_data,
        region_data: &region_data,
        serialize: &ctx_serialize,
        nvml: nvml_ready(),
        driver_info: &driver_info,
        region_used: &region_used,
    }
}

/// The NVML handle of the device with `uuid`: `nvmlDeviceGetHandleByUUID`, else a scan of
/// the devices by index comparing `nvmlDeviceGetUUID`.
fn nvml_handle_for_uuid(uuid: &[u8; 16]) -> Option<nvmlDevice_t> {
    // SAFETY: documented type.
    if let Some(by_uuid) = unsafe { symbols::nv::<FnNvmlHandleByUuid>(Nv::HandleByUuid) } {
        let s = std::ffi::CString::new(format_uuid(uuid)).ok()?;
        let mut h: nvmlDevice_t = std::ptr::null_mut();
        // SAFETY: valid C string and out pointer.
        if unsafe { by_uuid(s.as_ptr(), &mut h) } == NVML_SUCCESS && !h.is_null() {
            return Some(h);
        }
    }
    // SAFETY: documented types.
    let count = unsafe { symbols::nv::<FnNvmlGetCount>(Nv::GetCountV2) }?;
    // SAFETY: documented type.
    let by_index = unsafe { symbols::nv::<FnNvmlHandleByIndex>(Nv::HandleByIndexV2) }?;
    let mut n: c_uint = 0;
    // SAFETY: valid out pointer.
    if unsafe { count(&mut n) } != NVML_SUCCESS {
        return None;
    }
    (0..n).find_map(|i| {
        let mut h: nvmlDevice_t = std::ptr::null_mut();
        // SAFETY: valid out pointer.
        if unsafe { by_index(i, &mut h) } != NVML_SUCCESS || h.is_null() {
            return None;
        }
        (nvml_uuid(h)? == *uuid).then_some(h)
    })
}

/// The UUID of an NVML device (real `nvmlDeviceGetUUID`).
fn nvml_uuid(device: nvmlDevice_t) -> Option<[u8; 16]> {
    // SAFETY: documented type.
    let get_uuid = unsafe { symbols::nv::<FnNvmlGetUuid>(Nv::GetUuid) }?;
    let mut buf = [0 as c_char; 96];
    // SAFETY: buffer and its length.
    if unsafe { get_uuid(device, buf.as_mut_ptr(), buf.len() as c_uint) } != NVML_SUCCESS {
        return None;
    }
    // SAFETY: NVML wrote a NUL-terminated string into the zeroed buffer (last byte untouched).
    let s = unsafe { CStr::from_ptr(buf.as_ptr()) }
        .to_string_lossy()
        .into_owned();
    parse_uuid(&s)
}

fn log_context_cost(what: &str, dev: usize, cost: Option<ContextCost>) {
    match cost {
        Some(ContextCost::Unknown) => crate::warn!(
            "{what}: device {dev}: context memory could not be measured (no NVML or driver reading, or one disturbed by other processes' memory); charged 0 bytes (set HAMI_CONTEXT_OVERHEAD to fix a value)"
        ),
        Some(ContextCost::Driver { bytes, first: false, serialized }) => crate::info!(
            "{what}: device {dev}: context charged {bytes} bytes (measured from cuMemGetInfo (no NVML): free before (through this process's existing context) minus free after (through the new one), corrected for the region's data charged meanwhile; context-creation lock {})",
            if serialized { "held" } else { "NOT held" }
        ),
        Some(ContextCost::Driver { bytes, first: true, serialized }) => crate::info!(
            "{what}: device {dev}: context charged {bytes} bytes (measured from cuMemGetInfo (no NVML): device used after (total - free through the new context) minus the region's accounted usage; assumes the region's processes are the device's only users; context-creation lock {})",
            if serialized { "held" } else { "NOT held" }
        ),
        Some(ContextCost::Configured(b)) => {
            crate::info!("{what}: device {dev}: context charged {b} bytes (HAMI_CONTEXT_OVERHEAD)")
        }
        Some(ContextCost::PerProcess(b)) => crate::info!(
            "{what}: device {dev}: context charged {b} bytes (measured per process: this process's NVML used memory after minus before)"
        ),
        Some(ContextCost::DeviceDelta { bytes, serialized: true }) => crate::info!(
            "{what}: device {dev}: context charged {bytes} bytes (measured at device level, serialized: NVML device used memory after minus before under the region's context-creation lock; this pid is not in NVML's process list)"
        ),
        Some(ContextCost::DeviceDelta { bytes, serialized: false }) => crate::warn!(
            "{what}: device {dev}: context charged {bytes} bytes (measured at device level WITHOUT the context-creation lock: may include other processes' concurrent contexts)"
        ),
        None => {}
    }
}

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

/// CUDA ordinals of NVML devices already identified.
static NVML_ORDINALS: Mutex<Vec<(usize, usize)>> = Mutex::new(Vec::new());

/// The CUDA ordinal (as this process numbers devices) of an NVML device, by UUID.
fn nvml_ordinal(device: nvmlDevice_t) -> Option<usize> {
    {
        let known = NVML_ORDINALS.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(&(_, o)) = known.iter().find(|(h, _)| *h == device as usize) {
            return Some(o);
        }
    }
    let uuid = nvml_uuid(device)?;
    let g = state::global();
    let region = g.region.as_ref().ok();
    let mut found = region.and_then(|r| (0..MAX_DEVICES).find(|&d| r.uuid(d) == uuid));
    if found.is_none() {
        // No CUDA process recorded the UUIDs yet (e.g. nvidia-smi first): ask the driver.
        // SAFETY: documented types.
        let init = unsafe { symbols::cu::<FnInit>(Cu::Init) };
        // SAFETY: documented types.
        let count = unsafe { symbols::cu::<FnDeviceGetCount>(Cu::DeviceGetCount) };
        if let (Some(init), Some(count)) = (init, count) {
            let mut n: c_int = 0;
            // SAFETY: plain calls with valid out pointers.
            if unsafe { init(0) } == CUDA_SUCCESS && unsafe { count(&mut n) } == CUDA_SUCCESS {
                for d in 0..(n.max(0) as usize).min(MAX_DEVICES) {
                    if let Some(u) = state::device_uuid(d as CUdevice) {
                        if let Some(r) = region {
                            r.set_uuid(d, u);
                        }
                        if u == uuid {
                            found = Some(d);
                        }
                    }
                }
            }
        }
    }
    let o = found?;
    NVML_ORDINALS
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .push((device as usize, o));
    Some(o)
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
