//! NVML's return codes (`nvmlReturn_t`) and the glue every export answers through: [`run`]
//! (a panic becomes `NVML_ERROR_UNKNOWN`), [`nonnull`] and [`copy_str`].

use std::ffi::{c_char, c_int, c_uint};

pub(crate) type NvmlReturn = c_int;
pub(crate) const NVML_SUCCESS: NvmlReturn = 0;
pub(crate) const NVML_ERROR_UNINITIALIZED: NvmlReturn = 1;
pub(crate) const NVML_ERROR_INVALID_ARGUMENT: NvmlReturn = 2;
pub(crate) const NVML_ERROR_NOT_SUPPORTED: NvmlReturn = 3;
pub(crate) const NVML_ERROR_INSUFFICIENT_SIZE: NvmlReturn = 7;
pub(crate) const NVML_ERROR_ARGUMENT_VERSION_MISMATCH: NvmlReturn = 25;
pub(crate) const NVML_ERROR_UNKNOWN: NvmlReturn = 999;

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
