//! Hooks of stream-ordered pools and of synchronisations: `cuMemAllocAsync` /
//! `cuMemAllocFromPoolAsync` (and `_ptsz`) charge what the pool reserves
//! ([`crate::objects::pool_reservations`]); pool creation, destruction, trims and attributes, and every
//! synchronisation (where a pool may give memory back), keep that charge current.
#![allow(non_snake_case)]
#![allow(clippy::missing_safety_doc)] // Every hook has the documented contract of its driver function.

use super::shared::{alloc_ptr, backstop_poll, backstop_tick, finish, read_pool, release};
use crate::ffi::cuda::*;
use crate::ffi::shim::{enter, hook};
use crate::ffi::symbols::{self, Cu};
use crate::ledger::accounting::KeySpace;
use crate::measure::current_dev_ctx;
use crate::objects::pool_reservations::PoolAlloc;
use crate::state::{self, ProcLedger};
use hami_abi::layout::MAX_DEVICES;
use std::ffi::{c_int, c_void};

/// Whether `stream` is being captured into a graph (`cuStreamIsCapturing`; the per-thread
/// default stream for a `_ptsz` call on the NULL stream). Unknown counts as not capturing.
fn capturing(stream: CUstream, ptsz: bool) -> bool {
    // SAFETY: documented type.
    let Some(f) = (unsafe { symbols::cu::<FnStreamIsCapturing>(Cu::cuStreamIsCapturing) }) else {
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
    let f = unsafe { symbols::cu::<FnDeviceGetMemPool>(Cu::cuDeviceGetMemPool) }?;
    let mut p: CUmemoryPool = std::ptr::null_mut();
    // SAFETY: valid out pointer.
    (unsafe { f(&mut p, dev as CUdevice) } == CUDA_SUCCESS && !p.is_null()).then_some(p as u64)
}

/// Gives back an allocation whose pool growth did not fit: frees it on its stream, waits for
/// that stream, trims the pool to `keep` bytes.
fn undo_pool_alloc(ptr: u64, stream: CUstream, ptsz: bool, pool: u64, keep: u64) {
    let (free_sym, sync_sym) = if ptsz {
        (Cu::cuMemFreeAsync_ptsz, Cu::cuStreamSynchronize_ptsz)
    } else {
        (Cu::cuMemFreeAsync, Cu::cuStreamSynchronize)
    };
    // SAFETY: documented types; the pointer the driver just returned, the caller's stream.
    unsafe {
        if let Some(free) = symbols::cu::<FnMemFreeAsync>(free_sym) {
            free(ptr, stream);
        }
        if let Some(sync) = symbols::cu::<FnStreamSynchronize>(sync_sym) {
            sync(stream);
        }
        if let Some(trim) = symbols::cu::<FnMemPoolTrimTo>(Cu::cuMemPoolTrimTo) {
            trim(pool as CUmemoryPool, keep as usize);
        }
    }
}

/// `cuMemAllocAsync` / `cuMemAllocFromPoolAsync` (`pool`), `_ptsz` variants (`ptsz`): the
/// pool's reservation is charged ([`crate::objects::pool_reservations`]). During stream capture the memory comes
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
/// allocation charged by itself (made during capture) is uncharged. A pool allocation that
/// stops being one between the two looks (its context destroyed meanwhile) goes to the
/// driver like any other pointer, whose answer is returned.
pub(crate) fn free_async(ptr: CUdeviceptr, real: impl Fn() -> CUresult + Copy) -> CUresult {
    let l = ProcLedger::current();
    if l.p.pools.owns(ptr) {
        if let Some(r) = l.p.pools.free(&l, ptr, real) {
            return r;
        }
    }
    release(KeySpace::Pointer, ptr, real)
}

hook! {
    /// Hook of `cuMemPoolCreate`: records the pool's device.
    fn cuMemPoolCreate(
        pool: *mut CUmemoryPool,
        props: *const CUmemPoolPropsHead,
    ) -> CUresult;
    observe |f| {
        // SAFETY: forwarded arguments.
        let r = unsafe { f(pool, props) };
        if enter().is_some() && r == CUDA_SUCCESS && !pool.is_null() && !props.is_null() {
            // SAFETY: non-null: the caller's properties and the handle the driver wrote.
            let (loc, p) = unsafe { ((*props).location, *pool) };
            if loc.type_ == CU_MEM_LOCATION_TYPE_DEVICE && loc.id >= 0 {
                state::holdings()
                    .pools
                    .note_device(p as u64, loc.id as usize);
            }
        }
        r
    }
}

fn note_pool_of(pool: *mut CUmemoryPool, dev: CUdevice, r: CUresult) -> CUresult {
    if r == CUDA_SUCCESS && !pool.is_null() && dev >= 0 && (dev as usize) < MAX_DEVICES {
        // SAFETY: non-null, written by the driver.
        let p = unsafe { *pool };
        state::holdings().pools.note_device(p as u64, dev as usize);
    }
    r
}

hook! {
    /// Hook of `cuDeviceGetDefaultMemPool`: records the pool's device.
    fn cuDeviceGetDefaultMemPool(
        pool: *mut CUmemoryPool,
        dev: CUdevice,
    ) -> CUresult;
    observe |f| {
        // SAFETY: forwarded arguments.
        note_pool_of(pool, dev, unsafe { f(pool, dev) })
    }
}

hook! {
    /// Hook of `cuDeviceGetMemPool`: records the pool's device.
    fn cuDeviceGetMemPool(
        pool: *mut CUmemoryPool,
        dev: CUdevice,
    ) -> CUresult;
    observe |f| {
        // SAFETY: forwarded arguments.
        note_pool_of(pool, dev, unsafe { f(pool, dev) })
    }
}

hook! {
    /// Hook of `cuMemPoolDestroy`: its unused memory is uncharged; outstanding allocations stay
    /// charged until freed.
    fn cuMemPoolDestroy(pool: CUmemoryPool) -> CUresult;
    |f| {
        let l = ProcLedger::current();
        // SAFETY: forwarded argument.
        l.p.pools.destroy(&l, pool as u64, || unsafe { f(pool) })
    }
}

hook! {
    /// Hook of `cuMemPoolTrimTo`: the pool's reservation is re-read afterwards.
    fn cuMemPoolTrimTo(pool: CUmemoryPool, keep: usize) -> CUresult;
    |f| {
        // SAFETY: forwarded arguments.
        let r = unsafe { f(pool, keep) };
        if r == CUDA_SUCCESS {
            let l = ProcLedger::current();
            l.p.pools.refresh(&l, pool as u64, &read_pool);
        }
        r
    }
}

hook! {
    /// Hook of `cuMemPoolSetAttribute`: remembers the release threshold (which decides whether a
    /// synchronisation can give memory back).
    fn cuMemPoolSetAttribute(
        pool: CUmemoryPool,
        attr: c_int,
        value: *mut c_void,
    ) -> CUresult;
    observe |f| {
        // SAFETY: forwarded arguments.
        let r = unsafe { f(pool, attr, value) };
        if r == CUDA_SUCCESS && attr == CU_MEMPOOL_ATTR_RELEASE_THRESHOLD && !value.is_null() {
            // SAFETY: the driver accepted it as the attribute's `cuuint64_t`.
            let v = unsafe { (value as *const u64).read_unaligned() };
            state::holdings().pools.set_threshold(pool as u64, v);
        }
        r
    }
}

// ---------------------------------------------------------------- synchronisation

/// After a successful synchronisation: pools above their release threshold may have given
/// memory back; the backstop may be due; the launch gate debits what completed.
fn after_sync(r: CUresult) -> CUresult {
    if r == CUDA_SUCCESS {
        super::launch::gate_on_sync();
        let p = state::holdings();
        if p.pools.any_releasable() {
            let l = ProcLedger::current();
            p.pools.refresh_releasable(&l, &read_pool);
        }
        backstop_poll(None);
    }
    r
}

macro_rules! sync_hook {
    ($(#[$doc:meta])* $name:ident / $ptsz:ident($($arg:ident: $aty:ty),*)) => {
        hook! {
            $(#[$doc])*
            fn $name / $ptsz($($arg: $aty),*) -> CUresult;
            |f, _, _| {
                // SAFETY: forwarded arguments.
                after_sync(unsafe { f($($arg),*) })
            }
        }
    };
    ($(#[$doc:meta])* $name:ident($($arg:ident: $aty:ty),*)) => {
        hook! {
            $(#[$doc])*
            fn $name($($arg: $aty),*) -> CUresult;
            |f| {
                // SAFETY: forwarded arguments.
                after_sync(unsafe { f($($arg),*) })
            }
        }
    };
}

sync_hook!(
    /// Hook of `cuStreamSynchronize`.
    cuStreamSynchronize / cuStreamSynchronize_ptsz(stream: CUstream)
);
sync_hook!(
    /// Hook of `cuCtxSynchronize`.
    cuCtxSynchronize()
);
sync_hook!(
    /// Hook of `cuCtxSynchronize_v2` (CUDA 13).
    cuCtxSynchronize_v2(ctx: CUcontext)
);
sync_hook!(
    /// Hook of `cuEventSynchronize`.
    cuEventSynchronize(event: CUevent)
);
