//! NVML's return codes (`nvmlReturn_t`) and the glue every export answers through: [`run`]
//! (a panic becomes `NVML_ERROR_UNKNOWN`), [`nonnull`] and [`copy_str`].

use std::ffi::{c_char, c_uint};

/// `nvmlReturn_t` and its codes, from the `cuda-abi` crate (`nvml.h`).
pub(crate) use cuda_abi::nvml::{
    nvmlReturn_t as NvmlReturn, NVML_ERROR_ARGUMENT_VERSION_MISMATCH, NVML_ERROR_INSUFFICIENT_SIZE,
    NVML_ERROR_INVALID_ARGUMENT, NVML_ERROR_NOT_FOUND, NVML_ERROR_NOT_SUPPORTED,
    NVML_ERROR_UNINITIALIZED, NVML_ERROR_UNKNOWN, NVML_SUCCESS,
};

/// Runs an export's body: its `Err` is the export's result, `Ok` is `NVML_SUCCESS` and a
/// panic `NVML_ERROR_UNKNOWN` (panics never cross the FFI boundary).
pub(crate) fn run(f: impl FnOnce() -> Result<(), NvmlReturn>) -> NvmlReturn {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(Ok(())) => NVML_SUCCESS,
        Ok(Err(e)) => e,
        Err(_) => NVML_ERROR_UNKNOWN,
    }
}

/// `NVML_ERROR_INVALID_ARGUMENT` for a NULL pointer.
pub(crate) fn nonnull<T>(p: *const T) -> Result<(), NvmlReturn> {
    if p.is_null() {
        Err(NVML_ERROR_INVALID_ARGUMENT)
    } else {
        Ok(())
    }
}

/// Copies `s` into a C buffer of `len` bytes, NUL-terminated.
pub(crate) fn copy_str(buf: *mut c_char, len: c_uint, s: &str) -> Result<(), NvmlReturn> {
    nonnull(buf)?;
    if (len as usize) < s.len() + 1 {
        return Err(NVML_ERROR_INSUFFICIENT_SIZE);
    }
    // SAFETY: `buf` holds `len` >= s.len() + 1 bytes (C contract).
    unsafe {
        std::ptr::copy_nonoverlapping(s.as_ptr(), buf as *mut u8, s.len());
        *buf.add(s.len()) = 0;
    }
    Ok(())
}
