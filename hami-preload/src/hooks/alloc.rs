//! Hooks of plain allocations and their releases: device pointers (`cuMemAlloc_v2`,
//! managed, pitched, stream-ordered), physical handles (`cuMemCreate` / `cuMemRelease`),
//! arrays and mipmapped arrays, and the frees of each.
#![allow(non_snake_case)]
#![allow(clippy::missing_safety_doc)] // Every hook has the documented contract of its driver function.

use super::shared::{alloc_ptr, array_alloc, finish, release};
use crate::ffi::cuda::*;
use crate::ffi::shim::hook;
use crate::ffi::symbols::{self, Cu};
use crate::ledger::accounting::{Allocated, KeySpace};
use crate::ledger::policy;
use crate::measure::current_dev_ctx;
use crate::state::ProcLedger;
use hami_abi::intercept;
use hami_abi::layout::MAX_DEVICES;
use std::ffi::c_uint;

/// The key space of row `$name` of the table (`.allocates` / `.releases`), evaluated at
/// compile time (a name without a memory row does not compile), so that a hook and the
/// agent's pairing agree.
macro_rules! space_of {
    ($name:literal) => {
        const { intercept::space_of($name) }
    };
}

hook! {
    /// Hook of `cuMemAlloc_v2`. A null `dptr` or a zero `bytesize` is
    /// `CUDA_ERROR_INVALID_VALUE` (documented), before any quota decision.
    fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, bytesize: usize) -> CUresult;
    |f| {
        if dptr.is_null() || bytesize == 0 {
            return CUDA_ERROR_INVALID_VALUE;
        }
        // SAFETY: forwarded arguments.
        unsafe { alloc_ptr("cuMemAlloc_v2", dptr, bytesize as u64, || f(dptr, bytesize)) }
    }
}

hook! {
    /// Hook of `cuMemAllocManaged` (charged to the current context's device). A null `dptr`
    /// or a zero `bytesize` is `CUDA_ERROR_INVALID_VALUE` (documented).
    fn cuMemAllocManaged(
        dptr: *mut CUdeviceptr,
        bytesize: usize,
        flags: c_uint,
    ) -> CUresult;
    |f| {
        if dptr.is_null() || bytesize == 0 {
            return CUDA_ERROR_INVALID_VALUE;
        }
        // SAFETY: forwarded arguments.
        unsafe {
            alloc_ptr("cuMemAllocManaged", dptr, bytesize as u64, || {
                f(dptr, bytesize, flags)
            })
        }
    }
}

hook! {
    /// Hook of `cuMemAllocAsync` (charged to the current context's device).
    fn cuMemAllocAsync / cuMemAllocAsync_ptsz(
        dptr: *mut CUdeviceptr,
        bytesize: usize,
        stream: CUstream,
    ) -> CUresult;
    |f, name, ptsz| {
        // SAFETY: forwarded arguments.
        unsafe {
            super::pools::alloc_async(
                name,
                dptr,
                bytesize as u64,
                None,
                stream,
                ptsz,
                || f(dptr, bytesize, stream),
            )
        }
    }
}

hook! {
    /// Hook of `cuMemAllocFromPoolAsync` (charged to the current context's device).
    fn cuMemAllocFromPoolAsync / cuMemAllocFromPoolAsync_ptsz(
        dptr: *mut CUdeviceptr,
        bytesize: usize,
        pool: CUmemoryPool,
        stream: CUstream,
    ) -> CUresult;
    |f, name, ptsz| {
        // SAFETY: forwarded arguments.
        unsafe {
            super::pools::alloc_async(
                name,
                dptr,
                bytesize as u64,
                Some(pool),
                stream,
                ptsz,
                || f(dptr, bytesize, pool, stream),
            )
        }
    }
}

hook! {
    /// Hook of `cuMemAllocPitch_v2`: charges an estimate first, then the real `pitch * height`.
    fn cuMemAllocPitch_v2(
        dptr: *mut CUdeviceptr,
        pitch: *mut usize,
        width: usize,
        height: usize,
        elem: c_uint,
    ) -> CUresult;
    |f| {
        // SAFETY: forwarded arguments.
        alloc_pitch(dptr, pitch, width, height, || unsafe { f(dptr, pitch, width, height, elem) })
    }
}

/// A pitched allocation: an estimate is charged first, then the real `pitch * height`; an
/// allocation whose real size does not fit is freed again.
fn alloc_pitch(
    dptr: *mut CUdeviceptr,
    pitch: *mut usize,
    width: usize,
    height: usize,
    real: impl FnOnce() -> CUresult,
) -> CUresult {
    if dptr.is_null() || pitch.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    if width == 0 || height == 0 {
        // Nothing to admit: the driver's answer (it refuses an empty allocation).
        return real();
    }
    let (dev, ctx) = match current_dev_ctx() {
        Ok(x) => x,
        Err(e) => return e,
    };
    let l = ProcLedger::current();
    let estimate = policy::pitch_estimate(width as u64, height as u64);
    let r = l.p.accounts.alloc(
        &l,
        KeySpace::Pointer,
        dev,
        ctx,
        estimate,
        || match real() {
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
            if let Some(free) = unsafe { symbols::cu::<FnMemFree>(Cu::cuMemFree_v2) } {
                // SAFETY: key is the pointer the driver returned.
                unsafe { free(key) };
            }
        },
    );
    finish("cuMemAllocPitch_v2", &l, dev, r)
}

hook! {
    /// Hook of `cuMemCreate`: handles located on a device are charged to that device until
    /// `cuMemRelease`; host-located handles are not charged.
    fn cuMemCreate(
        handle: *mut CUmemGenericAllocationHandle,
        size: usize,
        prop: *const CUmemAllocationProp,
        flags: u64,
    ) -> CUresult;
    |f| {
        // SAFETY: forwarded arguments.
        mem_create(handle, size, prop, || unsafe { f(handle, size, prop, flags) })
    }
}

/// A physical allocation (`cuMemCreate`): charged to the device it is located on.
fn mem_create(
    handle: *mut CUmemGenericAllocationHandle,
    size: usize,
    prop: *const CUmemAllocationProp,
    real: impl FnOnce() -> CUresult,
) -> CUresult {
    if handle.is_null() || prop.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    if size == 0 {
        // Nothing to admit: the driver's answer (it refuses an empty allocation).
        return real();
    }
    // SAFETY: non-null pointer to the caller's properties.
    let loc = unsafe { (*prop).location };
    if loc.type_ != CU_MEM_LOCATION_TYPE_DEVICE || loc.id < 0 {
        return real();
    }
    let dev = loc.id as usize;
    if dev >= MAX_DEVICES {
        return mem_create_beyond_region(dev, handle, real);
    }
    let l = ProcLedger::current();
    let r = l.p.accounts.alloc(
        &l,
        KeySpace::Handle,
        dev,
        0,
        size as u64,
        || match real() {
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
}

/// `cuMemCreate` located on a device ordinal the region has no room for (`>= MAX_DEVICES`):
/// the driver's answer when it refuses (a device that does not exist:
/// `CUDA_ERROR_INVALID_DEVICE`); an allocation it made is released again and refused with
/// `CUDA_ERROR_OUT_OF_MEMORY`, since it could not be accounted (fail closed).
fn mem_create_beyond_region(
    dev: usize,
    handle: *mut CUmemGenericAllocationHandle,
    real: impl FnOnce() -> CUresult,
) -> CUresult {
    let r = real();
    if r != CUDA_SUCCESS {
        return r;
    }
    // SAFETY: non-null (checked by the caller), written by the driver on success.
    let h = unsafe { *handle };
    // SAFETY: documented type; releases the handle the driver just returned.
    if let Some(release) = unsafe { symbols::cu::<FnMemRelease>(Cu::cuMemRelease) } {
        // SAFETY: as above.
        unsafe { release(h) };
    }
    crate::error!(
        "cuMemCreate: CUDA_ERROR_OUT_OF_MEMORY: device {dev} is beyond the {MAX_DEVICES} devices the shared region accounts for"
    );
    CUDA_ERROR_OUT_OF_MEMORY
}

hook! {
    /// Hook of `cuArrayCreate_v2` (charged with the documented footprint estimate).
    fn cuArrayCreate_v2(
        out: *mut CUarray,
        desc: *const CUDA_ARRAY_DESCRIPTOR,
    ) -> CUresult;
    |f| {
        if out.is_null() || desc.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        // SAFETY: non-null descriptor from the caller.
        let d = unsafe { &*desc };
        let dims = [d.width as u64, d.height as u64, 0];
        let estimate = policy::array_charge(d);
        // SAFETY: forwarded arguments.
        array_alloc("cuArrayCreate_v2", space_of!("cuArrayCreate_v2"), out, dims, estimate, || unsafe {
            f(out, desc)
        })
    }
}

hook! {
    /// Hook of `cuArray3DCreate_v2` (charged with the documented footprint estimate).
    fn cuArray3DCreate_v2(
        out: *mut CUarray,
        desc: *const CUDA_ARRAY3D_DESCRIPTOR,
    ) -> CUresult;
    |f| {
        if out.is_null() || desc.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        // SAFETY: non-null descriptor from the caller.
        let d = unsafe { &*desc };
        let dims = [d.width as u64, d.height as u64, d.depth as u64];
        let estimate = policy::array3d_charge(d);
        // SAFETY: forwarded arguments.
        array_alloc("cuArray3DCreate_v2", space_of!("cuArray3DCreate_v2"), out, dims, estimate, || unsafe {
            f(out, desc)
        })
    }
}

// ---------------------------------------------------------------- mipmapped arrays

hook! {
    /// Hook of `cuMipmappedArrayCreate` (charged with the footprint estimate of every level).
    fn cuMipmappedArrayCreate(
        out: *mut CUmipmappedArray,
        desc: *const CUDA_ARRAY3D_DESCRIPTOR,
        levels: c_uint,
    ) -> CUresult;
    |f| {
        if out.is_null() || desc.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        // SAFETY: non-null descriptor from the caller.
        let d = unsafe { &*desc };
        let dims = [d.width as u64, d.height as u64, d.depth as u64];
        let estimate = policy::mipmap_charge(d, levels);
        // SAFETY: forwarded arguments.
        array_alloc(
            "cuMipmappedArrayCreate",
            space_of!("cuMipmappedArrayCreate"),
            out,
            dims,
            estimate,
            || unsafe { f(out, desc, levels) },
        )
    }
}

hook! {
    /// Hook of `cuMipmappedArrayDestroy`.
    fn cuMipmappedArrayDestroy(
        array: CUmipmappedArray,
    ) -> CUresult;
    |f| {
        // SAFETY: forwarded argument.
        release(space_of!("cuMipmappedArrayDestroy"), array as u64, || unsafe { f(array) })
    }
}

// ---------------------------------------------------------------- release

hook! {
    /// Hook of `cuMemFree_v2`.
    fn cuMemFree_v2(dptr: CUdeviceptr) -> CUresult;
    |f| {
        // SAFETY: forwarded argument.
        release(space_of!("cuMemFree_v2"), dptr, || unsafe { f(dptr) })
    }
}

hook! {
    /// Hook of `cuMemFreeAsync` (released when the free is enqueued successfully).
    fn cuMemFreeAsync / cuMemFreeAsync_ptsz(dptr: CUdeviceptr, stream: CUstream) -> CUresult;
    |f, _, _| {
        // SAFETY: forwarded arguments.
        super::pools::free_async(dptr, || unsafe { f(dptr, stream) })
    }
}

hook! {
    /// Hook of `cuMemRelease`.
    fn cuMemRelease(handle: CUmemGenericAllocationHandle) -> CUresult;
    |f| {
        // SAFETY: forwarded argument.
        super::vmm::mem_release(space_of!("cuMemRelease"), handle, || unsafe { f(handle) })
    }
}

hook! {
    /// Hook of `cuArrayDestroy`.
    fn cuArrayDestroy(array: CUarray) -> CUresult;
    |f| {
        // SAFETY: forwarded argument.
        release(space_of!("cuArrayDestroy"), array as u64, || unsafe { f(array) })
    }
}
