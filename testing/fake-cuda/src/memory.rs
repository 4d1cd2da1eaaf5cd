//! Memory exports: linear, pitched and managed allocations, the memory query, virtual
//! memory management and arrays.

use std::ffi::{c_int, c_uint, c_void};

use crate::driver::{
    alloc_delay, inited, release_delay, Inner, Kind, GRANULARITY, MAX_ARRAY_DIM, PITCH_ALIGN,
};
use crate::ffi::*;
use crate::streams::location_ordinal;

// ---------------------------------------------------------------------------------------------
// Linear memory

fn alloc_into(dptr: *mut CUdeviceptr, f: impl FnOnce(&mut Inner) -> R<u64>) -> CUresult {
    run(|| {
        let mut g = inited()?;
        nonnull(dptr)?;
        let p = f(&mut g)?;
        // SAFETY: checked non-NULL; C contract.
        unsafe { put(dptr, p) };
        drop(g);
        alloc_delay();
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
    run(|| {
        release_delay();
        inited()?.free(dptr)
    })
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
        let pitch = (width_in_bytes as u64)
            .div_ceil(PITCH_ALIGN)
            .checked_mul(PITCH_ALIGN)
            .ok_or(CUDA_ERROR_OUT_OF_MEMORY)?;
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

/// Largest managed allocation the fake grants (128 TiB: the unified address range).
const MANAGED_VA_BYTES: u64 = 1 << 47;

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
        // Managed memory may oversubscribe the device, not the 47-bit virtual address space
        // the driver reserves for it.
        if size > MANAGED_VA_BYTES {
            return Err(CUDA_ERROR_OUT_OF_MEMORY);
        }
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
    run(|| {
        release_delay();
        inited()?.mem_release(handle)
    })
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
pub unsafe extern "C" fn cuMemRetainAllocationHandle(
    handle: *mut CUmemGenericAllocationHandle,
    addr: *mut c_void,
) -> CUresult {
    run(|| {
        if handle.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let h = inited()?.retain_allocation_handle(addr as u64)?;
        // SAFETY: non-NULL out-parameter (C contract).
        unsafe { *handle = h };
        Ok(())
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
    // No array dimension beyond the device's largest texture size exists: the driver
    // rejects the descriptor, whatever memory is free.
    if [w, h, d].iter().any(|&x| x as u64 > MAX_ARRAY_DIM) {
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
        drop(g);
        alloc_delay();
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
        drop(g);
        alloc_delay();
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuArrayDestroy(h: CUarray) -> CUresult {
    run(|| {
        release_delay();
        inited()?.array_destroy(h as u64)
    })
}
