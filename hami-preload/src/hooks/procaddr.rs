//! Hooks of `cuGetProcAddress(_v2)`: a function pointer the driver hands out is replaced by
//! our hook when it is the real address of a hooked function.
#![allow(non_snake_case)]
#![allow(clippy::missing_safety_doc)] // Every hook has the documented contract of its driver function.

use crate::ffi::cuda::*;
use crate::ffi::shim::hook;
use crate::ffi::symbols::{Cu, CUDA};
use std::ffi::{c_char, c_int, c_void, CStr};

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
    if let Some(h) = super::table::cu_hook_for_real(lib, addr) {
        // SAFETY: as above.
        unsafe { *pfn = h };
        return;
    }
    if !symbol.is_null() && !addr.is_null() {
        // SAFETY: non-null C string from the caller.
        if unsafe { CStr::from_ptr(symbol) }.to_bytes() == b"cuGetProcAddress" {
            let ours = if version >= 12000 {
                super::table::cu_hook_addr(Cu::cuGetProcAddress_v2 as usize)
            } else {
                super::table::cu_hook_addr(Cu::cuGetProcAddress as usize)
            };
            // SAFETY: as above.
            unsafe { *pfn = ours };
        }
    }
}

hook! {
    /// Hook of `cuGetProcAddress` (CUDA 11.3+ signature).
    fn cuGetProcAddress(
        symbol: *const c_char,
        pfn: *mut *mut c_void,
        version: c_int,
        flags: u64,
    ) -> CUresult;
    |f| {
        // SAFETY: forwarded arguments.
        let r = unsafe { f(symbol, pfn, version, flags) };
        if r == CUDA_SUCCESS {
            // SAFETY: pfn as passed by the caller and written by the driver.
            unsafe { fix_pfn(symbol, pfn, version) };
        }
        r
    }
}

hook! {
    /// Hook of `cuGetProcAddress_v2` (CUDA 12+ signature).
    fn cuGetProcAddress_v2(
        symbol: *const c_char,
        pfn: *mut *mut c_void,
        version: c_int,
        flags: u64,
        status: *mut c_int,
    ) -> CUresult;
    |f| {
        // SAFETY: forwarded arguments.
        let r = unsafe { f(symbol, pfn, version, flags, status) };
        if r == CUDA_SUCCESS {
            // SAFETY: pfn as passed by the caller and written by the driver.
            unsafe { fix_pfn(symbol, pfn, version) };
        }
        r
    }
}
