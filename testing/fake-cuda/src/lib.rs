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
//!
//! This file holds initialisation, devices and the entry points; the other exports are in
//! [`contexts`], [`memory`], [`streams`] and [`objects`] (events, graphs, modules, kernels).

#![allow(non_snake_case, clippy::missing_safety_doc)]

mod driver;
mod ffi;
mod image;
mod procaddr;

use std::ffi::{c_char, c_int, c_uint, c_void};

use driver::{inited, MAX_ARRAY_DIM};

#[cfg(test)]
mod clock_tests;
mod contexts;
mod events;
mod memory;
mod objects;
mod streams;

pub use contexts::*;
pub use events::*;
use ffi::*;
pub use memory::*;
pub use objects::*;
pub use streams::*;

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
            39 => 2048,                 // MAX_THREADS_PER_MULTIPROCESSOR
            41 | 83 | 102 | 115 => 1,   // UNIFIED_ADDRESSING, MANAGED_MEMORY, VMM, POOLS
            75 => 9,                    // COMPUTE_CAPABILITY_MAJOR
            // Texture (array) size limits of a compute capability 9.0 device.
            21 | 22 => MAX_ARRAY_DIM as c_int, // TEXTURE1D_WIDTH, TEXTURE2D_WIDTH
            23 => 65536,                       // TEXTURE2D_HEIGHT
            24..=26 => 16384,                  // TEXTURE3D_WIDTH/HEIGHT/DEPTH
            27 | 28 | 42 | 52 | 53 => 32768,   // layered and cubemap widths/heights
            29 | 43 => 2048,                   // layer counts
            47 | 48 => 8192,                   // TEXTURE3D_WIDTH/HEIGHT_ALTERNATE
            49 => 32768,                       // TEXTURE3D_DEPTH_ALTERNATE
            54 => 2046,                        // TEXTURECUBEMAP_LAYERED_LAYERS
            _ => 0,
        };
        // SAFETY: checked non-NULL; C contract.
        unsafe { put(pi, v) };
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
