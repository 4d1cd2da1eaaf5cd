//! Hooks of the other ways device memory arrives besides plain allocations (see
//! `docs/preload.md`, "Device memory that arrives by other paths"): stream-ordered pools,
//! synchronisations (where pools give memory back), mipmapped arrays, modules and libraries
//! (eager and lazy), kernel launches; and the backstop's refresh. Thin shims over
//! [`crate::pools`], [`crate::modules`] and [`crate::backstop`], like [`crate::hooks`].
#![allow(non_snake_case)]
#![allow(clippy::missing_safety_doc)] // Every hook has the documented contract of its driver function.

use crate::accounting::Ns;
use crate::backstop::{self, Backstop};
use crate::context::measure::{current_dev_ctx, meter};
use crate::context::nvml::{nvml_own_used, nvml_ready};
use crate::context::OwnUsage;
use crate::cuda::*;
use crate::hooks::{alloc_ptr, array_alloc, enter, finish, guard, release, report_denial};
use crate::modules::Stage;
use crate::policy::{self, ContextCost};
use crate::pools::{PoolAlloc, PoolReading};
use crate::state::{self, ProcLedger};
use crate::symbols::{self, Cu};
use hami_common::layout::{UsageKind, MAX_DEVICES};
use std::ffi::{c_char, c_int, c_uint, c_void};

macro_rules! real_cu {
    ($sym:ident, $ty:ty) => {
        // SAFETY: `$ty` is the documented type of the symbol.
        match unsafe { symbols::cu::<$ty>(Cu::$sym) } {
            Some(f) => f,
            None => return CUDA_ERROR_NOT_FOUND,
        }
    };
}

// ---------------------------------------------------------------- pools

/// One `cuuint64_t` attribute of a pool (real `cuMemPoolGetAttribute`).
fn pool_attr(pool: u64, attr: c_int) -> Option<u64> {
    // SAFETY: documented type.
    let get = unsafe { symbols::cu::<FnMemPoolAttribute>(Cu::MemPoolGetAttribute) }?;
    let mut v: u64 = 0;
    // SAFETY: a `cuuint64_t` attribute and a valid out pointer.
    let r = unsafe { get(pool as CUmemoryPool, attr, (&mut v as *mut u64).cast()) };
    (r == CUDA_SUCCESS).then_some(v)
}

/// Reserved and used bytes of `pool`, `None` if the driver cannot say (or the pool is gone).
fn read_pool(pool: u64) -> Option<PoolReading> {
    Some(PoolReading {
        reserved: pool_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT)?,
        used: pool_attr(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT)?,
    })
}

/// Whether `stream` is being captured into a graph (`cuStreamIsCapturing`; the per-thread
/// default stream for a `_ptsz` call on the NULL stream). Unknown counts as not capturing.
fn capturing(stream: CUstream, ptsz: bool) -> bool {
    // SAFETY: documented type.
    let Some(f) = (unsafe { symbols::cu::<FnStreamIsCapturing>(Cu::StreamIsCapturing) }) else {
        return false;
    };
    let s = if ptsz && stream.is_null() {
        CU_STREAM_PER_THREAD as CUstream
    } else {
        stream
    };
    let mut status: c_int = CU_STREAM_CAPTURE_STATUS_NONE;
    // SAFETY: a stream handle from the caller and a valid out pointer.
    let r = unsafe { f(s, &mut status) };
    r == CUDA_SUCCESS && status != CU_STREAM_CAPTURE_STATUS_NONE
}

/// The current pool of device `dev` (`cuDeviceGetMemPool`).
fn current_pool(dev: usize) -> Option<u64> {
    // SAFETY: documented type.
    let f = unsafe { symbols::cu::<FnDeviceGetMemPool>(Cu::DeviceGetMemPool) }?;
    let mut p: CUmemoryPool = std::ptr::null_mut();
    // SAFETY: valid out pointer.
    (unsafe { f(&mut p, dev as CUdevice) } == CUDA_SUCCESS && !p.is_null()).then_some(p as u64)
}

/// Gives back an allocation whose pool growth did not fit: frees it on its stream, waits for
/// that stream, trims the pool to `keep` bytes.
fn undo_pool_alloc(ptr: u64, stream: CUstream, ptsz: bool, pool: u64, keep: u64) {
    let (free_sym, sync_sym) = if ptsz {
        (Cu::MemFreeAsyncPtsz, Cu::StreamSynchronizePtsz)
    } else {
        (Cu::MemFreeAsync, Cu::StreamSynchronize)
    };
    // SAFETY: documented types; the pointer the driver just returned, the caller's stream.
    unsafe {
        if let Some(free) = symbols::cu::<FnMemFreeAsync>(free_sym) {
            free(ptr, stream);
        }
        if let Some(sync) = symbols::cu::<FnStreamSynchronize>(sync_sym) {
            sync(stream);
        }
        if let Some(trim) = symbols::cu::<FnMemPoolTrimTo>(Cu::MemPoolTrimTo) {
            trim(pool as CUmemoryPool, keep as usize);
        }
    }
}

/// `cuMemAllocAsync` / `cuMemAllocFromPoolAsync` (`pool`), `_ptsz` variants (`ptsz`): the
/// pool's reservation is charged ([`crate::pools`]). During stream capture the memory comes
/// from the graph's pool, not this one: the allocation is charged itself, as data. A driver
/// that cannot describe its pools gets the same per-allocation charge.
///
/// # Safety
/// `dptr` is null or writable; `real` makes the allocation with the caller's arguments.
pub(crate) unsafe fn alloc_async(
    what: &str,
    dptr: *mut CUdeviceptr,
    bytes: u64,
    pool: Option<CUmemoryPool>,
    stream: CUstream,
    ptsz: bool,
    real: impl Fn() -> CUresult + Copy,
) -> CUresult {
    if dptr.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    let (dev, ctx) = match current_dev_ctx() {
        Ok(x) => x,
        Err(e) => return e,
    };
    let pool = match pool {
        Some(p) => Some(p as u64),
        None => current_pool(dev),
    };
    let (Some(pool), false, false) = (pool, bytes == 0, capturing(stream, ptsz)) else {
        // SAFETY: forwarded contract.
        return unsafe { alloc_ptr(what, dptr, bytes, real) };
    };
    let l = ProcLedger::current();
    let pdev = l.p.pools.device_of(pool).unwrap_or(dev);
    let read = || read_pool(pool);
    let r = l.p.pools.alloc(
        &l,
        pool,
        pdev,
        ctx,
        bytes,
        &read,
        || match real() {
            // SAFETY: the driver wrote *dptr on success.
            CUDA_SUCCESS => Ok(unsafe { *dptr }),
            e => Err(e),
        },
        |ptr, keep| undo_pool_alloc(ptr, stream, ptsz, pool, keep),
    );
    match r {
        // SAFETY: forwarded contract (`real` was not called).
        PoolAlloc::Unsupported => unsafe { alloc_ptr(what, dptr, bytes, real) },
        PoolAlloc::Done(r) => {
            if r.is_ok() {
                backstop_tick(&l, pdev);
            }
            finish(what, &l, pdev, r)
        }
    }
}

/// `cuMemFreeAsync(_ptsz)`: a pool allocation's memory stays in its pool (and charged); an
/// allocation charged by itself (made during capture) is uncharged.
pub(crate) fn free_async(ptr: CUdeviceptr, real: impl FnOnce() -> CUresult) -> CUresult {
    let l = ProcLedger::current();
    if l.p.pools.owns(ptr) {
        if let Some(r) = l.p.pools.free(&l, ptr, real) {
            return r;
        }
        return CUDA_ERROR_UNKNOWN;
    }
    release(Ns::Ptr, ptr, real)
}

/// Hook of `cuMemPoolCreate`: records the pool's device.
#[no_mangle]
pub unsafe extern "C" fn cuMemPoolCreate(
    pool: *mut CUmemoryPool,
    props: *const CUmemPoolPropsHead,
) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        let f = real_cu!(MemPoolCreate, FnMemPoolCreate);
        // SAFETY: forwarded arguments.
        let r = unsafe { f(pool, props) };
        if enter().is_some() && r == CUDA_SUCCESS && !pool.is_null() && !props.is_null() {
            // SAFETY: non-null: the caller's properties and the handle the driver wrote.
            let (loc, p) = unsafe { ((*props).location, *pool) };
            if loc.type_ == CU_MEM_LOCATION_TYPE_DEVICE && loc.id >= 0 {
                state::proc_state()
                    .pools
                    .note_device(p as u64, loc.id as usize);
            }
        }
        r
    })
}

fn note_pool_of(pool: *mut CUmemoryPool, dev: CUdevice, r: CUresult) -> CUresult {
    if r == CUDA_SUCCESS && !pool.is_null() && dev >= 0 && (dev as usize) < MAX_DEVICES {
        // SAFETY: non-null, written by the driver.
        let p = unsafe { *pool };
        state::proc_state()
            .pools
            .note_device(p as u64, dev as usize);
    }
    r
}

/// Hook of `cuDeviceGetDefaultMemPool`: records the pool's device.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetDefaultMemPool(
    pool: *mut CUmemoryPool,
    dev: CUdevice,
) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        let f = real_cu!(DeviceGetDefaultMemPool, FnDeviceGetMemPool);
        // SAFETY: forwarded arguments.
        note_pool_of(pool, dev, unsafe { f(pool, dev) })
    })
}

/// Hook of `cuDeviceGetMemPool`: records the pool's device.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetMemPool(pool: *mut CUmemoryPool, dev: CUdevice) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        let f = real_cu!(DeviceGetMemPool, FnDeviceGetMemPool);
        // SAFETY: forwarded arguments.
        note_pool_of(pool, dev, unsafe { f(pool, dev) })
    })
}

/// Hook of `cuMemPoolDestroy`: its unused memory is uncharged; outstanding allocations stay
/// charged until freed.
#[no_mangle]
pub unsafe extern "C" fn cuMemPoolDestroy(pool: CUmemoryPool) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        let f = real_cu!(MemPoolDestroy, FnMemPoolDestroy);
        let Some(_entered) = enter() else {
            // SAFETY: nested call (the driver calling its own export): forwarded untouched.
            return unsafe { f(pool) };
        };
        let l = ProcLedger::current();
        // SAFETY: forwarded argument.
        l.p.pools.destroy(&l, pool as u64, || unsafe { f(pool) })
    })
}

/// Hook of `cuMemPoolTrimTo`: the pool's reservation is re-read afterwards.
#[no_mangle]
pub unsafe extern "C" fn cuMemPoolTrimTo(pool: CUmemoryPool, keep: usize) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        let f = real_cu!(MemPoolTrimTo, FnMemPoolTrimTo);
        let Some(_entered) = enter() else {
            // SAFETY: nested call (the driver calling its own export): forwarded untouched.
            return unsafe { f(pool, keep) };
        };
        // SAFETY: forwarded arguments.
        let r = unsafe { f(pool, keep) };
        if r == CUDA_SUCCESS {
            let l = ProcLedger::current();
            l.p.pools.refresh(&l, pool as u64, &read_pool);
        }
        r
    })
}

/// Hook of `cuMemPoolSetAttribute`: remembers the release threshold (which decides whether a
/// synchronisation can give memory back).
#[no_mangle]
pub unsafe extern "C" fn cuMemPoolSetAttribute(
    pool: CUmemoryPool,
    attr: c_int,
    value: *mut c_void,
) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        let f = real_cu!(MemPoolSetAttribute, FnMemPoolAttribute);
        // SAFETY: forwarded arguments.
        let r = unsafe { f(pool, attr, value) };
        if r == CUDA_SUCCESS && attr == CU_MEMPOOL_ATTR_RELEASE_THRESHOLD && !value.is_null() {
            // SAFETY: the driver accepted it as the attribute's `cuuint64_t`.
            let v = unsafe { (value as *const u64).read_unaligned() };
            state::proc_state().pools.set_threshold(pool as u64, v);
        }
        r
    })
}

// ---------------------------------------------------------------- synchronisation

/// After a successful synchronisation: pools above their release threshold may have given
/// memory back; the backstop may be due.
fn after_sync(r: CUresult) -> CUresult {
    if r == CUDA_SUCCESS {
        let p = state::proc_state();
        if p.pools.any_releasable() {
            let l = ProcLedger::current();
            p.pools.refresh_releasable(&l, &read_pool);
        }
        backstop_poll(None);
    }
    r
}

macro_rules! sync_hook {
    ($(#[$doc:meta])* $name:ident, $sym:ident, $ty:ty, ($($arg:ident: $aty:ty),*)) => {
        $(#[$doc])*
        #[no_mangle]
        pub unsafe extern "C" fn $name($($arg: $aty),*) -> CUresult {
            guard(CUDA_ERROR_UNKNOWN, || {
                let f = real_cu!($sym, $ty);
                let Some(_entered) = enter() else {
                    // SAFETY: nested call (the driver calling its own export): forwarded.
                    return unsafe { f($($arg),*) };
                };
                // SAFETY: forwarded arguments.
                after_sync(unsafe { f($($arg),*) })
            })
        }
    };
}

sync_hook!(
    /// Hook of `cuStreamSynchronize`.
    cuStreamSynchronize, StreamSynchronize, FnStreamSynchronize, (stream: CUstream)
);
sync_hook!(
    /// Hook of `cuStreamSynchronize_ptsz`.
    cuStreamSynchronize_ptsz, StreamSynchronizePtsz, FnStreamSynchronize, (stream: CUstream)
);
sync_hook!(
    /// Hook of `cuCtxSynchronize`.
    cuCtxSynchronize, CtxSynchronize, FnCtxSynchronize, ()
);
sync_hook!(
    /// Hook of `cuCtxSynchronize_v2` (CUDA 13).
    cuCtxSynchronize_v2, CtxSynchronizeV2, FnCtxSynchronizeV2, (ctx: CUcontext)
);
sync_hook!(
    /// Hook of `cuEventSynchronize`.
    cuEventSynchronize, EventSynchronize, FnEventSynchronize, (event: CUevent)
);

// ---------------------------------------------------------------- mipmapped arrays

/// Hook of `cuMipmappedArrayCreate` (charged with the footprint estimate of every level).
#[no_mangle]
pub unsafe extern "C" fn cuMipmappedArrayCreate(
    out: *mut CUmipmappedArray,
    desc: *const CUDA_ARRAY3D_DESCRIPTOR,
    levels: c_uint,
) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        let f = real_cu!(MipmappedArrayCreate, FnMipmappedArrayCreate);
        let Some(_entered) = enter() else {
            // SAFETY: nested call (the driver calling its own export): forwarded untouched.
            return unsafe { f(out, desc, levels) };
        };
        if out.is_null() || desc.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        // SAFETY: non-null descriptor from the caller.
        let estimate = policy::mipmap_charge(unsafe { &*desc }, levels);
        // SAFETY: forwarded arguments.
        array_alloc(
            "cuMipmappedArrayCreate",
            Ns::Mipmap,
            out,
            estimate,
            || unsafe { f(out, desc, levels) },
        )
    })
}

/// Hook of `cuMipmappedArrayDestroy`.
#[no_mangle]
pub unsafe extern "C" fn cuMipmappedArrayDestroy(array: CUmipmappedArray) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        let f = real_cu!(MipmappedArrayDestroy, FnMipmappedArrayDestroy);
        let Some(_entered) = enter() else {
            // SAFETY: nested call (the driver calling its own export): forwarded untouched.
            return unsafe { f(array) };
        };
        // SAFETY: forwarded argument.
        release(Ns::Mipmap, array as u64, || unsafe { f(array) })
    })
}

// ---------------------------------------------------------------- modules and libraries

fn log_module_cost(what: &str, dev: usize, cost: ContextCost) {
    match cost {
        ContextCost::Unknown => crate::debug!(
            "{what}: device {dev}: module memory not measurable (no reading, or one disturbed); the backstop accounts for it"
        ),
        c if c.bytes() > 0 => {
            crate::info!("{what}: device {dev}: module memory {} bytes ({c:?})", c.bytes())
        }
        _ => {}
    }
}

/// Whether module memory arrives at load: `CUDA_MODULE_LOADING=EAGER`, or a driver older than
/// 12.2 (whose default is eager). Otherwise (lazy loading) nothing is measured at load: the
/// memory arrives at the first lookup or launch, measured there, which spares the NVML
/// readings for the many libraries a framework registers and never uses.
fn eager_loading() -> bool {
    static EAGER: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *EAGER.get_or_init(|| {
        if let Ok(v) = std::env::var("CUDA_MODULE_LOADING") {
            return v.trim().eq_ignore_ascii_case("EAGER");
        }
        // SAFETY: documented type.
        let Some(f) = (unsafe { symbols::cu::<FnDriverGetVersion>(Cu::DriverGetVersion) }) else {
            return true;
        };
        let mut v: c_int = 0;
        // SAFETY: valid out pointer.
        (unsafe { f(&mut v) } != CUDA_SUCCESS) || v < 12020
    })
}

/// A module or library load: measured, charged, unloaded again if it does not fit.
/// `real` loads (the handle lands in `*out`), `unload` undoes it.
fn module_load(
    what: &str,
    out: *mut *mut c_void,
    library: bool,
    real: impl FnOnce() -> CUresult,
    unload: impl FnOnce(u64),
) -> CUresult {
    if out.is_null() {
        return real();
    }
    let cur = current_dev_ctx().ok();
    let l = ProcLedger::current();
    let m = meter();
    let measure = || match cur {
        Some((dev, ctx)) if eager_loading() => {
            let (r, cost) = l.p.contexts.measure(dev, Some(ctx), &m, || match real() {
                CUDA_SUCCESS => Ok(ctx),
                e => Err(e),
            });
            log_module_cost(what, dev, cost);
            // SAFETY: the driver wrote *out on success.
            (r.map(|_| unsafe { *out } as u64), cost.bytes())
        }
        _ => match real() {
            // SAFETY: as above.
            CUDA_SUCCESS => (Ok(unsafe { *out } as u64), 0),
            e => (Err(e), 0),
        },
    };
    let r = l.p.modules.load(
        &l,
        cur.map(|c| c.0),
        cur.map_or(0, |c| c.1),
        library,
        measure,
        unload,
    );
    let dev = cur.map_or(0, |c| c.0);
    if r.is_ok() {
        backstop_poll(Some(dev));
    }
    finish(what, &l, dev, r)
}

/// Unloads what a refused load loaded.
fn unload_module(h: u64) {
    // SAFETY: documented type; the handle the driver just returned.
    if let Some(f) = unsafe { symbols::cu::<FnModuleUnload>(Cu::ModuleUnload) } {
        // SAFETY: as above.
        unsafe { f(h as CUmodule) };
    }
}

/// Unloads what a refused library load loaded.
fn unload_library(h: u64) {
    // SAFETY: documented type; the handle the driver just returned.
    if let Some(f) = unsafe { symbols::cu::<FnLibraryUnload>(Cu::LibraryUnload) } {
        // SAFETY: as above.
        unsafe { f(h as CUlibrary) };
    }
}

/// The first lookup or launch of `owner`'s functions: measured around `real` and charged
/// ([`crate::modules::ModuleTable::charge_stage`]); every later one just calls `real`.
fn first_use(what: &str, owner: u64, stage: Stage, real: impl FnOnce() -> CUresult) -> CUresult {
    let l = ProcLedger::current();
    if !l.p.modules.claim(owner, stage) {
        return real();
    }
    let Ok((dev, ctx)) = current_dev_ctx() else {
        return real();
    };
    let (r, cost) =
        l.p.contexts
            .measure(dev, Some(ctx), &meter(), || match real() {
                CUDA_SUCCESS => Ok(ctx),
                e => Err(e),
            });
    if let Err(e) = r {
        return e;
    }
    log_module_cost(what, dev, cost);
    match l
        .p
        .modules
        .charge_stage(&l, owner, stage, dev, cost.bytes())
    {
        Ok(()) => {
            if cost.bytes() > 0 {
                backstop_poll(Some(dev));
            }
            CUDA_SUCCESS
        }
        Err(d) => {
            report_denial(what, l.p, dev, &d);
            CUDA_ERROR_OUT_OF_MEMORY
        }
    }
}

/// Hook of `cuModuleLoad`.
#[no_mangle]
pub unsafe extern "C" fn cuModuleLoad(module: *mut CUmodule, fname: *const c_char) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        let f = real_cu!(ModuleLoad, FnModuleLoad);
        let Some(_entered) = enter() else {
            // SAFETY: nested call (the driver calling its own export): forwarded untouched.
            return unsafe { f(module, fname) };
        };
        // SAFETY: forwarded arguments.
        module_load(
            "cuModuleLoad",
            module,
            false,
            || unsafe { f(module, fname) },
            unload_module,
        )
    })
}

/// Hook of `cuModuleLoadData`.
#[no_mangle]
pub unsafe extern "C" fn cuModuleLoadData(module: *mut CUmodule, image: *const c_void) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        let f = real_cu!(ModuleLoadData, FnModuleLoadData);
        let Some(_entered) = enter() else {
            // SAFETY: nested call (the driver calling its own export): forwarded untouched.
            return unsafe { f(module, image) };
        };
        // SAFETY: forwarded arguments.
        module_load(
            "cuModuleLoadData",
            module,
            false,
            || unsafe { f(module, image) },
            unload_module,
        )
    })
}

/// Hook of `cuModuleLoadDataEx`.
#[no_mangle]
pub unsafe extern "C" fn cuModuleLoadDataEx(
    module: *mut CUmodule,
    image: *const c_void,
    num_options: c_uint,
    options: *mut c_int,
    values: *mut *mut c_void,
) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        let f = real_cu!(ModuleLoadDataEx, FnModuleLoadDataEx);
        let Some(_entered) = enter() else {
            // SAFETY: nested call (the driver calling its own export): forwarded untouched.
            return unsafe { f(module, image, num_options, options, values) };
        };
        module_load(
            "cuModuleLoadDataEx",
            module,
            false,
            // SAFETY: forwarded arguments.
            || unsafe { f(module, image, num_options, options, values) },
            unload_module,
        )
    })
}

/// Hook of `cuModuleLoadFatBinary`.
#[no_mangle]
pub unsafe extern "C" fn cuModuleLoadFatBinary(
    module: *mut CUmodule,
    fat_cubin: *const c_void,
) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        let f = real_cu!(ModuleLoadFatBinary, FnModuleLoadData);
        let Some(_entered) = enter() else {
            // SAFETY: nested call (the driver calling its own export): forwarded untouched.
            return unsafe { f(module, fat_cubin) };
        };
        module_load(
            "cuModuleLoadFatBinary",
            module,
            false,
            // SAFETY: forwarded arguments.
            || unsafe { f(module, fat_cubin) },
            unload_module,
        )
    })
}

/// Hook of `cuModuleUnload`.
#[no_mangle]
pub unsafe extern "C" fn cuModuleUnload(module: CUmodule) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        let f = real_cu!(ModuleUnload, FnModuleUnload);
        let Some(_entered) = enter() else {
            // SAFETY: nested call (the driver calling its own export): forwarded untouched.
            return unsafe { f(module) };
        };
        let l = ProcLedger::current();
        // SAFETY: forwarded argument.
        l.p.modules
            .unload(&l, module as u64, || unsafe { f(module) })
    })
}

/// Hook of `cuLibraryLoadData`.
#[no_mangle]
pub unsafe extern "C" fn cuLibraryLoadData(
    library: *mut CUlibrary,
    code: *const c_void,
    jit_options: *mut c_int,
    jit_values: *mut *mut c_void,
    num_jit: c_uint,
    lib_options: *mut c_int,
    lib_values: *mut *mut c_void,
    num_lib: c_uint,
) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        let f = real_cu!(LibraryLoadData, FnLibraryLoadData);
        // SAFETY: forwarded arguments (every call below).
        let call = || unsafe {
            f(
                library,
                code,
                jit_options,
                jit_values,
                num_jit,
                lib_options,
                lib_values,
                num_lib,
            )
        };
        let Some(_entered) = enter() else {
            return call();
        };
        module_load("cuLibraryLoadData", library, true, call, unload_library)
    })
}

/// Hook of `cuLibraryLoadFromFile`.
#[no_mangle]
pub unsafe extern "C" fn cuLibraryLoadFromFile(
    library: *mut CUlibrary,
    fname: *const c_char,
    jit_options: *mut c_int,
    jit_values: *mut *mut c_void,
    num_jit: c_uint,
    lib_options: *mut c_int,
    lib_values: *mut *mut c_void,
    num_lib: c_uint,
) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        let f = real_cu!(LibraryLoadFromFile, FnLibraryLoadFromFile);
        // SAFETY: forwarded arguments (every call below).
        let call = || unsafe {
            f(
                library,
                fname,
                jit_options,
                jit_values,
                num_jit,
                lib_options,
                lib_values,
                num_lib,
            )
        };
        let Some(_entered) = enter() else {
            return call();
        };
        module_load("cuLibraryLoadFromFile", library, true, call, unload_library)
    })
}

/// Hook of `cuLibraryUnload`.
#[no_mangle]
pub unsafe extern "C" fn cuLibraryUnload(library: CUlibrary) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        let f = real_cu!(LibraryUnload, FnLibraryUnload);
        let Some(_entered) = enter() else {
            // SAFETY: nested call (the driver calling its own export): forwarded untouched.
            return unsafe { f(library) };
        };
        let l = ProcLedger::current();
        // SAFETY: forwarded argument.
        l.p.modules
            .unload(&l, library as u64, || unsafe { f(library) })
    })
}

/// Hook of `cuModuleGetFunction`: a lazily loaded module's memory may arrive here.
#[no_mangle]
pub unsafe extern "C" fn cuModuleGetFunction(
    func: *mut CUfunction,
    module: CUmodule,
    name: *const c_char,
) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        let f = real_cu!(ModuleGetFunction, FnModuleGetFunction);
        let Some(_entered) = enter() else {
            // SAFETY: nested call (the driver calling its own export): forwarded untouched.
            return unsafe { f(func, module, name) };
        };
        let owner = module as u64;
        // SAFETY: forwarded arguments.
        let r = first_use("cuModuleGetFunction", owner, Stage::Lookup, || unsafe {
            f(func, module, name)
        });
        if r == CUDA_SUCCESS && !func.is_null() {
            // SAFETY: written by the driver on success.
            let h = unsafe { *func } as u64;
            state::proc_state().modules.note_function(h, owner);
        }
        r
    })
}

/// Hook of `cuLibraryGetKernel`: nothing is loaded; the kernel is remembered as the
/// library's (it may be launched directly).
#[no_mangle]
pub unsafe extern "C" fn cuLibraryGetKernel(
    kernel: *mut CUkernel,
    library: CUlibrary,
    name: *const c_char,
) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        let f = real_cu!(LibraryGetKernel, FnLibraryGetKernel);
        // SAFETY: forwarded arguments.
        let r = unsafe { f(kernel, library, name) };
        if r == CUDA_SUCCESS && !kernel.is_null() && enter().is_some() {
            // SAFETY: written by the driver on success.
            let k = unsafe { *kernel } as u64;
            state::proc_state().modules.note_function(k, library as u64);
        }
        r
    })
}

/// Hook of `cuKernelGetFunction`: the library is loaded into the current context here
/// (lazily loaded memory may arrive).
#[no_mangle]
pub unsafe extern "C" fn cuKernelGetFunction(func: *mut CUfunction, kernel: CUkernel) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        let f = real_cu!(KernelGetFunction, FnKernelGetFunction);
        let Some(_entered) = enter() else {
            // SAFETY: nested call (the driver calling its own export): forwarded untouched.
            return unsafe { f(func, kernel) };
        };
        let p = state::proc_state();
        let Some(owner) = p.modules.owner_of(kernel as u64) else {
            // SAFETY: forwarded arguments.
            return unsafe { f(func, kernel) };
        };
        // SAFETY: forwarded arguments.
        let r = first_use("cuKernelGetFunction", owner, Stage::Lookup, || unsafe {
            f(func, kernel)
        });
        if r == CUDA_SUCCESS && !func.is_null() {
            // SAFETY: written by the driver on success.
            p.modules.note_function(unsafe { *func } as u64, owner);
        }
        r
    })
}

/// A launch of `func` (a `CUfunction` or a `CUkernel`): the first launch of each module's
/// kernels is measured; otherwise (the usual case) one atomic load and the call.
fn launch(what: &str, func: CUfunction, real: impl FnOnce() -> CUresult) -> CUresult {
    let p = state::proc_state();
    if !p.modules.any_unlaunched() {
        return real();
    }
    match p.modules.owner_of(func as u64) {
        Some(owner) => first_use(what, owner, Stage::Launch, real),
        None => real(),
    }
}

/// Hook of `cuLaunchKernel`.
#[no_mangle]
pub unsafe extern "C" fn cuLaunchKernel(
    func: CUfunction,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    bx: c_uint,
    by: c_uint,
    bz: c_uint,
    shared: c_uint,
    stream: CUstream,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        let f = real_cu!(LaunchKernel, FnLaunchKernel);
        // SAFETY: forwarded arguments (every call below).
        let call = || unsafe { f(func, gx, gy, gz, bx, by, bz, shared, stream, params, extra) };
        let Some(_entered) = enter() else {
            return call();
        };
        launch("cuLaunchKernel", func, call)
    })
}

/// Hook of `cuLaunchKernel_ptsz`.
#[no_mangle]
pub unsafe extern "C" fn cuLaunchKernel_ptsz(
    func: CUfunction,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    bx: c_uint,
    by: c_uint,
    bz: c_uint,
    shared: c_uint,
    stream: CUstream,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        let f = real_cu!(LaunchKernelPtsz, FnLaunchKernel);
        // SAFETY: forwarded arguments (every call below).
        let call = || unsafe { f(func, gx, gy, gz, bx, by, bz, shared, stream, params, extra) };
        let Some(_entered) = enter() else {
            return call();
        };
        launch("cuLaunchKernel_ptsz", func, call)
    })
}

/// Hook of `cuLaunchKernelEx`.
#[no_mangle]
pub unsafe extern "C" fn cuLaunchKernelEx(
    config: *const c_void,
    func: CUfunction,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        let f = real_cu!(LaunchKernelEx, FnLaunchKernelEx);
        // SAFETY: forwarded arguments (every call below).
        let call = || unsafe { f(config, func, params, extra) };
        let Some(_entered) = enter() else {
            return call();
        };
        launch("cuLaunchKernelEx", func, call)
    })
}

/// Hook of `cuLaunchKernelEx_ptsz`.
#[no_mangle]
pub unsafe extern "C" fn cuLaunchKernelEx_ptsz(
    config: *const c_void,
    func: CUfunction,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        let f = real_cu!(LaunchKernelExPtsz, FnLaunchKernelEx);
        // SAFETY: forwarded arguments (every call below).
        let call = || unsafe { f(config, func, params, extra) };
        let Some(_entered) = enter() else {
            return call();
        };
        launch("cuLaunchKernelEx_ptsz", func, call)
    })
}

// ---------------------------------------------------------------- contexts

/// Context `ctx` was destroyed (or reset): its modules are gone, and the pools may have
/// given memory back.
pub(crate) fn context_gone(l: &ProcLedger, ctx: usize) {
    l.p.modules.drop_context(l, ctx);
    l.p.pools.drop_context(l, ctx, &read_pool);
}

// ---------------------------------------------------------------- backstop

/// After an allocation on `dev`: asks for a backstop refresh only when the quota's headroom
/// is small (two atomic loads otherwise).
#[inline]
pub(crate) fn backstop_tick(l: &ProcLedger, dev: usize) {
    if l.g.config.backstop_interval_ms.is_none() {
        return;
    }
    if let Ok(r) = &l.g.region {
        if backstop::headroom_small(r.limit(dev), r.admitted(dev)) {
            backstop_poll(Some(dev));
        }
    }
}

/// Refreshes "other" on `only` (or on every device this process has charges on), for each
/// device at most once per interval.
#[cold]
pub(crate) fn backstop_poll(only: Option<usize>) {
    let g = state::global();
    let Some(interval) = g.config.backstop_interval_ms else {
        return;
    };
    let Ok(region) = &g.region else {
        return;
    };
    let p = state::proc_state();
    let Some(slot) = p.slot() else {
        return;
    };
    let now = backstop::now_ms();
    let devs: Vec<usize> = match only {
        Some(d) if d < MAX_DEVICES => vec![d],
        Some(_) => return,
        None => (0..MAX_DEVICES)
            .filter(|&d| {
                UsageKind::ALL
                    .iter()
                    .any(|&k| region.slot_usage(slot, d, k) != 0)
            })
            .collect(),
    };
    for dev in devs {
        if !p.backstop.claim(dev, now, interval) || !nvml_ready() {
            continue;
        }
        let OwnUsage::Listed(own) = nvml_own_used(dev) else {
            continue;
        };
        let accounted = UsageKind::ALL
            .iter()
            .filter(|&&k| k != UsageKind::Other)
            .map(|&k| region.slot_usage(slot, dev, k))
            .fold(0u64, u64::saturating_add);
        let current = region.slot_usage(slot, dev, UsageKind::Other);
        let target = backstop::other_target(own, accounted);
        let l = ProcLedger::current();
        let change = Backstop::apply(&l, dev, current, target);
        if change != 0 {
            crate::debug!(
                "backstop: device {dev}: the driver reports {own} bytes for this process, {accounted} accounted: other = {target} bytes"
            );
        }
    }
}
