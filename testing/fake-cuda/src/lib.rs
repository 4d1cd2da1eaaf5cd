//! Fake CUDA driver (`libcuda.so.1`) for tests without a GPU.
//!
//! Exports the driver-API functions hami-rs hooks or calls, with the real C signatures and
//! result codes (checked against a real driver: `tests/data/real-*.txt`), backed by pure
//! accounting in a state file shared by every process (see the `fake-state` crate and
//! `docs/fake-driver.md`). No device memory exists: allocations get unique fake addresses.
//!
//! Every export is an `unsafe extern "C"` function following the C contract of `cuda.h`:
//! pointer arguments must be NULL or valid for the access the CUDA documentation describes.
//! Panics never cross the FFI boundary (they become `CUDA_ERROR_UNKNOWN`).

#![allow(non_snake_case, clippy::missing_safety_doc)]

mod driver;
mod ffi;
mod procaddr;

use std::ffi::{c_char, c_int, c_uint, c_void};

use driver::{inited, Inner, Kind, GRANULARITY, PITCH_ALIGN, R};

mod objects;
use ffi::*;
pub use objects::*;

/// Runs `f`, mapping `Err(code)` to the code and a panic to `CUDA_ERROR_UNKNOWN`.
fn run(f: impl FnOnce() -> R<()>) -> CUresult {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(Ok(())) => CUDA_SUCCESS,
        Ok(Err(e)) => e,
        Err(_) => CUDA_ERROR_UNKNOWN,
    }
}

/// Fails with `CUDA_ERROR_INVALID_VALUE` if `p` is NULL.
fn nonnull<T>(p: *const T) -> R<()> {
    if p.is_null() {
        Err(CUDA_ERROR_INVALID_VALUE)
    } else {
        Ok(())
    }
}

/// Writes `v` through an out-pointer already checked to be non-NULL.
///
/// # Safety
/// `p` must be valid for writes of `T` (the caller's C contract).
unsafe fn put<T>(p: *mut T, v: T) {
    // SAFETY: per this function's contract.
    unsafe { p.write_unaligned(v) }
}

// ---------------------------------------------------------------------------------------------
// Initialisation, version, errors

#[no_mangle]
pub unsafe extern "C" fn cuInit(flags: c_uint) -> CUresult {
    run(|| driver::init(flags))
}

#[no_mangle]
pub unsafe extern "C" fn cuDriverGetVersion(version: *mut c_int) -> CUresult {
    run(|| {
        nonnull(version)?;
        // SAFETY: checked non-NULL; C contract.
        unsafe { put(version, driver::driver_version()) };
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGetErrorString(error: CUresult, p_str: *mut *const c_char) -> CUresult {
    run(|| {
        nonnull(p_str)?;
        let s = error_cstr(error, false);
        // SAFETY: checked non-NULL; C contract.
        unsafe { put(p_str, s.unwrap_or(std::ptr::null())) };
        s.map(|_| ()).ok_or(CUDA_ERROR_INVALID_VALUE)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGetErrorName(error: CUresult, p_str: *mut *const c_char) -> CUresult {
    run(|| {
        nonnull(p_str)?;
        let s = error_cstr(error, true);
        // SAFETY: checked non-NULL; C contract.
        unsafe { put(p_str, s.unwrap_or(std::ptr::null())) };
        s.map(|_| ()).ok_or(CUDA_ERROR_INVALID_VALUE)
    })
}

// ---------------------------------------------------------------------------------------------
// Devices

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetCount(count: *mut c_int) -> CUresult {
    run(|| {
        let g = inited()?;
        nonnull(count)?;
        // SAFETY: checked non-NULL; C contract.
        unsafe { put(count, g.device_count() as c_int) };
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGet(device: *mut CUdevice, ordinal: c_int) -> CUresult {
    run(|| {
        let g = inited()?;
        nonnull(device)?;
        g.phys_of(ordinal)?;
        // SAFETY: checked non-NULL; C contract.
        unsafe { put(device, ordinal) };
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetName(name: *mut c_char, len: c_int, dev: CUdevice) -> CUresult {
    run(|| {
        let g = inited()?;
        nonnull(name)?;
        let n = g.device_name(dev)?;
        if len <= 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let bytes = n.as_bytes();
        let k = bytes.len().min(len as usize - 1);
        // SAFETY: `name` is valid for `len` bytes (C contract) and k + 1 <= len.
        unsafe {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), name as *mut u8, k);
            *name.add(k) = 0;
        }
        Ok(())
    })
}

fn device_uuid(uuid: *mut CUuuid, dev: CUdevice) -> CUresult {
    run(|| {
        let g = inited()?;
        nonnull(uuid)?;
        let u = g.device_uuid(dev)?;
        // SAFETY: checked non-NULL; C contract.
        unsafe { put(uuid, CUuuid { bytes: u }) };
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetUuid(uuid: *mut CUuuid, dev: CUdevice) -> CUresult {
    device_uuid(uuid, dev)
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetUuid_v2(uuid: *mut CUuuid, dev: CUdevice) -> CUresult {
    device_uuid(uuid, dev)
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: CUdevice) -> CUresult {
    run(|| {
        let g = inited()?;
        nonnull(bytes)?;
        let t = g.total_mem(dev)?;
        // SAFETY: checked non-NULL; C contract.
        unsafe { put(bytes, t as usize) };
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetAttribute(
    pi: *mut c_int,
    attrib: c_int,
    dev: CUdevice,
) -> CUresult {
    run(|| {
        let g = inited()?;
        nonnull(pi)?;
        let phys = g.phys_of(dev)?;
        if attrib <= 0 || attrib >= CU_DEVICE_ATTRIBUTE_MAX {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let v = match attrib {
            1 => 1024,                  // MAX_THREADS_PER_BLOCK
            10 => 32,                   // WARP_SIZE
            16 => 132,                  // MULTIPROCESSOR_COUNT
            33 => 0x10 + phys as c_int, // PCI_BUS_ID
            41 | 83 | 102 | 115 => 1,   // UNIFIED_ADDRESSING, MANAGED_MEMORY, VMM, POOLS
            75 => 9,                    // COMPUTE_CAPABILITY_MAJOR
            _ => 0,
        };
        // SAFETY: checked non-NULL; C contract.
        unsafe { put(pi, v) };
        Ok(())
    })
}

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
        unsafe { put(pctx, driver::current_handle() as CUcontext) };
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
        let mut g = inited()?;
        g.current()?;
        g.pools_release_at_sync();
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxSynchronize_v2(ctx: CUcontext) -> CUresult {
    run(|| {
        let mut g = inited()?;
        if ctx.is_null() {
            g.current()?;
        } else {
            g.ctx(ctx as u64)?;
        }
        g.pools_release_at_sync();
        Ok(())
    })
}

// ---------------------------------------------------------------------------------------------
// Linear memory

fn alloc_into(dptr: *mut CUdeviceptr, f: impl FnOnce(&mut Inner) -> R<u64>) -> CUresult {
    run(|| {
        let mut g = inited()?;
        nonnull(dptr)?;
        let p = f(&mut g)?;
        // SAFETY: checked non-NULL; C contract.
        unsafe { put(dptr, p) };
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, bytesize: usize) -> CUresult {
    alloc_into(dptr, |g| {
        if bytesize == 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        g.alloc(bytesize as u64, bytesize as u64, Kind::Linear, None)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemFree_v2(dptr: CUdeviceptr) -> CUresult {
    run(|| inited()?.free(dptr))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> CUresult {
    run(|| {
        let g = inited()?;
        nonnull(free)?;
        nonnull(total)?;
        let (f, t) = g.mem_info()?;
        // SAFETY: checked non-NULL; C contract.
        unsafe {
            put(free, f as usize);
            put(total, t as usize);
        }
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAllocPitch_v2(
    dptr: *mut CUdeviceptr,
    p_pitch: *mut usize,
    width_in_bytes: usize,
    height: usize,
    element_size_bytes: c_uint,
) -> CUresult {
    run(|| {
        let mut g = inited()?;
        nonnull(dptr)?;
        nonnull(p_pitch)?;
        if width_in_bytes == 0 || height == 0 || !matches!(element_size_bytes, 4 | 8 | 16) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let pitch = (width_in_bytes as u64).div_ceil(PITCH_ALIGN) * PITCH_ALIGN;
        let bytes = pitch
            .checked_mul(height as u64)
            .ok_or(CUDA_ERROR_OUT_OF_MEMORY)?;
        let p = g.alloc(bytes, bytes, Kind::Pitch, None)?;
        // SAFETY: checked non-NULL; C contract.
        unsafe {
            put(dptr, p);
            put(p_pitch, pitch as usize);
        }
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAllocManaged(
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    flags: c_uint,
) -> CUresult {
    alloc_into(dptr, |g| {
        if bytesize == 0 || (flags != CU_MEM_ATTACH_GLOBAL && flags != CU_MEM_ATTACH_HOST) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let size = bytesize as u64;
        g.alloc(size, Inner::managed_charge(size), Kind::Managed, None)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemGetAddressRange_v2(
    pbase: *mut CUdeviceptr,
    psize: *mut usize,
    dptr: CUdeviceptr,
) -> CUresult {
    run(|| {
        let g = inited()?;
        let (b, s) = g.address_range(dptr)?;
        if !pbase.is_null() {
            // SAFETY: non-NULL; C contract.
            unsafe { put(pbase, b) };
        }
        if !psize.is_null() {
            // SAFETY: non-NULL; C contract.
            unsafe { put(psize, s as usize) };
        }
        Ok(())
    })
}

// ---------------------------------------------------------------------------------------------
// Stream-ordered allocation and pools

fn alloc_async(
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    pool: Option<CUmemoryPool>,
    stream: CUstream,
) -> CUresult {
    run(|| {
        let mut g = inited()?;
        nonnull(dptr)?;
        let pool = match pool {
            Some(p) => {
                g.pool_ordinal(p as u64)?;
                p as u64
            }
            None => {
                let (_, c) = g.current()?;
                g.current_pool(c.ordinal as CUdevice)?
            }
        };
        g.check_stream(stream as u64)?;
        // A zero-byte stream-ordered allocation succeeds on the real driver. During capture
        // the memory comes from the graph's pool: charged by itself (the H200 showed it
        // allocated at capture), given back at the captured free.
        let p = if bytesize == 0 {
            0
        } else if g.is_capturing(stream as u64) {
            g.alloc(bytesize as u64, bytesize as u64, Kind::Async, None)?
        } else {
            g.pool_alloc(pool, bytesize as u64)?
        };
        // SAFETY: checked non-NULL; C contract.
        unsafe { put(dptr, p) };
        Ok(())
    })
}

fn free_async(dptr: CUdeviceptr, stream: CUstream) -> CUresult {
    run(|| {
        let mut g = inited()?;
        g.check_stream(stream as u64)?;
        g.free(dptr)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAllocAsync(
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    stream: CUstream,
) -> CUresult {
    alloc_async(dptr, bytesize, None, stream)
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAllocAsync_ptsz(
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    stream: CUstream,
) -> CUresult {
    alloc_async(dptr, bytesize, None, stream)
}

#[no_mangle]
pub unsafe extern "C" fn cuMemFreeAsync(dptr: CUdeviceptr, stream: CUstream) -> CUresult {
    free_async(dptr, stream)
}

#[no_mangle]
pub unsafe extern "C" fn cuMemFreeAsync_ptsz(dptr: CUdeviceptr, stream: CUstream) -> CUresult {
    free_async(dptr, stream)
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAllocFromPoolAsync(
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    pool: CUmemoryPool,
    stream: CUstream,
) -> CUresult {
    alloc_async(dptr, bytesize, Some(pool), stream)
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAllocFromPoolAsync_ptsz(
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    pool: CUmemoryPool,
    stream: CUstream,
) -> CUresult {
    alloc_async(dptr, bytesize, Some(pool), stream)
}

fn location_ordinal(loc: &CUmemLocation) -> R<CUdevice> {
    if loc.type_ != CU_MEM_LOCATION_TYPE_DEVICE {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    Ok(loc.id)
}

#[no_mangle]
pub unsafe extern "C" fn cuMemPoolCreate(
    pool: *mut CUmemoryPool,
    props: *const CUmemPoolProps,
) -> CUresult {
    run(|| {
        let mut g = inited()?;
        nonnull(pool)?;
        nonnull(props)?;
        // SAFETY: checked non-NULL; C contract.
        let p = unsafe { props.read_unaligned() };
        if p.alloc_type != CU_MEM_ALLOCATION_TYPE_PINNED {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let ord = location_ordinal(&p.location)?;
        let h = g.pool_create(ord).map_err(|_| CUDA_ERROR_INVALID_VALUE)?;
        // SAFETY: checked non-NULL; C contract.
        unsafe { put(pool, h as CUmemoryPool) };
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemPoolDestroy(pool: CUmemoryPool) -> CUresult {
    run(|| inited()?.pool_destroy(pool as u64))
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetDefaultMemPool(
    pool: *mut CUmemoryPool,
    dev: CUdevice,
) -> CUresult {
    run(|| {
        let mut g = inited()?;
        nonnull(pool)?;
        let h = g.default_pool(dev)?;
        // SAFETY: checked non-NULL; C contract.
        unsafe { put(pool, h as CUmemoryPool) };
        Ok(())
    })
}

// ---------------------------------------------------------------------------------------------
// Virtual memory management

#[no_mangle]
pub unsafe extern "C" fn cuMemCreate(
    handle: *mut CUmemGenericAllocationHandle,
    size: usize,
    prop: *const CUmemAllocationProp,
    flags: u64,
) -> CUresult {
    run(|| {
        let mut g = inited()?;
        nonnull(handle)?;
        nonnull(prop)?;
        // SAFETY: checked non-NULL; C contract.
        let p = unsafe { &*prop };
        if p.type_ != CU_MEM_ALLOCATION_TYPE_PINNED || flags > 1 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let ord = location_ordinal(&p.location)?;
        let h = g.mem_create(size as u64, ord)?;
        // SAFETY: checked non-NULL; C contract.
        unsafe { put(handle, h) };
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemRelease(handle: CUmemGenericAllocationHandle) -> CUresult {
    run(|| inited()?.mem_release(handle))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAddressReserve(
    ptr: *mut CUdeviceptr,
    size: usize,
    alignment: usize,
    _addr: CUdeviceptr,
    flags: u64,
) -> CUresult {
    run(|| {
        let mut g = inited()?;
        nonnull(ptr)?;
        if flags != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let va = g.address_reserve(size as u64, alignment as u64)?;
        // SAFETY: checked non-NULL; C contract.
        unsafe { put(ptr, va) };
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAddressFree(ptr: CUdeviceptr, size: usize) -> CUresult {
    run(|| inited()?.address_free(ptr, size as u64))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemMap(
    ptr: CUdeviceptr,
    size: usize,
    offset: usize,
    handle: CUmemGenericAllocationHandle,
    flags: u64,
) -> CUresult {
    run(|| {
        let mut g = inited()?;
        if flags != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        g.mem_map(ptr, size as u64, offset as u64, handle)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemUnmap(ptr: CUdeviceptr, size: usize) -> CUresult {
    run(|| inited()?.mem_unmap(ptr, size as u64))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemSetAccess(
    ptr: CUdeviceptr,
    size: usize,
    desc: *const CUmemAccessDesc,
    count: usize,
) -> CUresult {
    run(|| {
        let g = inited()?;
        if count == 0 || desc.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: `desc` points to `count` descriptors (C contract), checked non-NULL.
        let descs = unsafe { std::slice::from_raw_parts(desc, count) };
        let ords: Vec<i32> = descs
            .iter()
            .map(|d| location_ordinal(&d.location))
            .collect::<R<_>>()?;
        g.set_access(ptr, size as u64, &ords)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemGetAllocationGranularity(
    granularity: *mut usize,
    prop: *const CUmemAllocationProp,
    option: c_int,
) -> CUresult {
    run(|| {
        let g = inited()?;
        nonnull(granularity)?;
        nonnull(prop)?;
        if !(0..=1).contains(&option) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: checked non-NULL; C contract.
        let p = unsafe { &*prop };
        g.phys_of(location_ordinal(&p.location)?)?;
        // SAFETY: checked non-NULL; C contract.
        unsafe { put(granularity, GRANULARITY as usize) };
        Ok(())
    })
}

// ---------------------------------------------------------------------------------------------
// Arrays

fn array_bytes(w: usize, h: usize, d: usize, format: c_uint, channels: c_uint) -> R<u64> {
    let per = format_bytes(format).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    if w == 0 || !matches!(channels, 1 | 2 | 4) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    (w as u64)
        .checked_mul(h.max(1) as u64)
        .and_then(|x| x.checked_mul(d.max(1) as u64))
        .and_then(|x| x.checked_mul(per * channels as u64))
        .ok_or(CUDA_ERROR_OUT_OF_MEMORY)
}

#[no_mangle]
pub unsafe extern "C" fn cuArrayCreate_v2(
    p_handle: *mut CUarray,
    desc: *const CUDA_ARRAY_DESCRIPTOR,
) -> CUresult {
    run(|| {
        let mut g = inited()?;
        nonnull(p_handle)?;
        nonnull(desc)?;
        // SAFETY: checked non-NULL; C contract.
        let d = unsafe { desc.read_unaligned() };
        let bytes = array_bytes(d.width, d.height, 1, d.format, d.num_channels)?;
        let a = g.array_create(bytes)?;
        // SAFETY: checked non-NULL; C contract.
        unsafe { put(p_handle, a as CUarray) };
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuArray3DCreate_v2(
    p_handle: *mut CUarray,
    desc: *const CUDA_ARRAY3D_DESCRIPTOR,
) -> CUresult {
    run(|| {
        let mut g = inited()?;
        nonnull(p_handle)?;
        nonnull(desc)?;
        // SAFETY: checked non-NULL; C contract.
        let d = unsafe { desc.read_unaligned() };
        if d.depth > 0 && d.height == 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let bytes = array_bytes(d.width, d.height, d.depth, d.format, d.num_channels)?;
        let a = g.array_create(bytes)?;
        // SAFETY: checked non-NULL; C contract.
        unsafe { put(p_handle, a as CUarray) };
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuArrayDestroy(h: CUarray) -> CUresult {
    run(|| inited()?.array_destroy(h as u64))
}

// ---------------------------------------------------------------------------------------------
// Streams and modules

#[no_mangle]
pub unsafe extern "C" fn cuStreamCreate(ph: *mut CUstream, flags: c_uint) -> CUresult {
    run(|| {
        let mut g = inited()?;
        nonnull(ph)?;
        if flags > 1 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let s = g.stream_create()?;
        // SAFETY: checked non-NULL; C contract.
        unsafe { put(ph, s as CUstream) };
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamDestroy(h: CUstream) -> CUresult {
    run(|| inited()?.stream_destroy(h as u64))
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamDestroy_v2(h: CUstream) -> CUresult {
    run(|| inited()?.stream_destroy(h as u64))
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamSynchronize(h: CUstream) -> CUresult {
    stream_sync(h)
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamSynchronize_ptsz(h: CUstream) -> CUresult {
    stream_sync(h)
}

fn stream_sync(h: CUstream) -> CUresult {
    run(|| {
        let mut g = inited()?;
        g.check_stream(h as u64)?;
        if g.is_capturing(h as u64) {
            return Err(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
        }
        g.pools_release_at_sync();
        Ok(())
    })
}

// ---------------------------------------------------------------------------------------------
// Entry points

#[no_mangle]
pub unsafe extern "C" fn cuGetProcAddress(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cuda_version: c_int,
    flags: u64,
) -> CUresult {
    run(|| procaddr::get_proc_address(symbol, pfn, cuda_version, flags, None))
}

#[no_mangle]
pub unsafe extern "C" fn cuGetProcAddress_v2(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cuda_version: c_int,
    flags: u64,
    symbol_status: *mut c_int,
) -> CUresult {
    run(|| procaddr::get_proc_address(symbol, pfn, cuda_version, flags, Some(symbol_status)))
}
