//! The CUDA driver's C ABI, from the `cuda-abi` crate (types, result codes, constants and
//! structs of `cuda.h`: a new one goes there), and what is the fake's own: the version of the
//! attribute table it models ([`CU_DEVICE_ATTRIBUTE_MAX`]), the error strings (as the real
//! driver 580 returns them, see `tests/data/real-errors-580.txt`) and the glue every export
//! answers through: [`run`] (a panic becomes `CUDA_ERROR_UNKNOWN`), [`nonnull`] and [`put`].

use std::ffi::{c_int, c_uint};

pub use cuda_abi::*;

/// Result of the fake's operations: `Err` carries the CUresult.
pub type R<T> = Result<T, CUresult>;

/// Number of `CUdevice_attribute` values (`CU_DEVICE_ATTRIBUTE_MAX` in CUDA 13.0, the
/// version the fake models; 136 in CUDA 12.6).
pub const CU_DEVICE_ATTRIBUTE_MAX: c_int = 148;

/// Bytes per channel of a `CUarray_format`, or `None` for formats the fake does not model.
pub fn format_bytes(format: c_uint) -> Option<u64> {
    Some(match format {
        0x01 | 0x08 => 1,        // (UN)SIGNED_INT8
        0x02 | 0x09 | 0x10 => 2, // (UN)SIGNED_INT16, HALF
        0x03 | 0x0a | 0x20 => 4, // (UN)SIGNED_INT32, FLOAT
        0xc0 | 0xc6 => 1,
        0xc1 | 0xc7 | 0xc3 | 0xc9 => 2,
        0xc2 | 0xc8 | 0xc4 | 0xca => 4,
        0xc5 | 0xcb => 8,
        _ => return None,
    })
}

/// `(name, description)` of a result code, as `cuGetErrorName` / `cuGetErrorString` give them.
pub fn error_text(code: CUresult) -> Option<(&'static str, &'static str)> {
    Some(match code {
        0 => ("CUDA_SUCCESS", "no error"),
        1 => ("CUDA_ERROR_INVALID_VALUE", "invalid argument"),
        2 => ("CUDA_ERROR_OUT_OF_MEMORY", "out of memory"),
        3 => ("CUDA_ERROR_NOT_INITIALIZED", "initialization error"),
        4 => ("CUDA_ERROR_DEINITIALIZED", "driver shutting down"),
        34 => ("CUDA_ERROR_STUB_LIBRARY", "CUDA driver is a stub library"),
        46 => (
            "CUDA_ERROR_DEVICE_UNAVAILABLE",
            "CUDA-capable device(s) is/are busy or unavailable",
        ),
        100 => ("CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"),
        101 => ("CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"),
        200 => ("CUDA_ERROR_INVALID_IMAGE", "device kernel image is invalid"),
        201 => ("CUDA_ERROR_INVALID_CONTEXT", "invalid device context"),
        202 => (
            "CUDA_ERROR_CONTEXT_ALREADY_CURRENT",
            "context already current",
        ),
        208 => ("CUDA_ERROR_ALREADY_MAPPED", "resource already mapped"),
        211 => ("CUDA_ERROR_NOT_MAPPED", "resource not mapped"),
        215 => (
            "CUDA_ERROR_UNSUPPORTED_LIMIT",
            "limit is not supported on this architecture",
        ),
        301 => ("CUDA_ERROR_FILE_NOT_FOUND", "file not found"),
        304 => (
            "CUDA_ERROR_OPERATING_SYSTEM",
            "OS call failed or operation not supported on this OS",
        ),
        400 => ("CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"),
        401 => (
            "CUDA_ERROR_ILLEGAL_STATE",
            "the operation cannot be performed in the present state",
        ),
        500 => ("CUDA_ERROR_NOT_FOUND", "named symbol not found"),
        600 => ("CUDA_ERROR_NOT_READY", "device not ready"),
        700 => (
            "CUDA_ERROR_ILLEGAL_ADDRESS",
            "an illegal memory access was encountered",
        ),
        708 => (
            "CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE",
            "cannot set while device is active in this process",
        ),
        709 => ("CUDA_ERROR_CONTEXT_IS_DESTROYED", "context is destroyed"),
        800 => ("CUDA_ERROR_NOT_PERMITTED", "operation not permitted"),
        801 => ("CUDA_ERROR_NOT_SUPPORTED", "operation not supported"),
        900 => (
            "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED",
            "operation not permitted when stream is capturing",
        ),
        910 => (
            "CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE",
            "the graph update was not performed because it included changes which violated constraints specific to instantiated graph update",
        ),
        999 => ("CUDA_ERROR_UNKNOWN", "unknown error"),
        _ => return None,
    })
}

/// NUL-terminated copies of the strings of [`error_text`], so that C gets stable pointers.
pub fn error_cstr(code: CUresult, want_name: bool) -> Option<*const std::ffi::c_char> {
    use std::collections::HashMap;
    use std::ffi::CString;
    use std::sync::OnceLock;
    static TABLE: OnceLock<HashMap<(CUresult, bool), CString>> = OnceLock::new();
    let table = TABLE.get_or_init(|| {
        let mut m = HashMap::new();
        for c in 0..1000 {
            if let Some((n, s)) = error_text(c) {
                m.insert((c, true), CString::new(n).unwrap_or_default());
                m.insert((c, false), CString::new(s).unwrap_or_default());
            }
        }
        m
    });
    table.get(&(code, want_name)).map(|c| c.as_ptr())
}

/// Runs `f`, mapping `Err(code)` to the code and a panic to `CUDA_ERROR_UNKNOWN`.
pub(crate) fn run(f: impl FnOnce() -> R<()>) -> CUresult {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(Ok(())) => CUDA_SUCCESS,
        Ok(Err(e)) => e,
        Err(_) => CUDA_ERROR_UNKNOWN,
    }
}

/// Fails with `CUDA_ERROR_INVALID_VALUE` if `p` is NULL.
pub(crate) fn nonnull<T>(p: *const T) -> R<()> {
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
pub(crate) unsafe fn put<T>(p: *mut T, v: T) {
    // SAFETY: per this function's contract.
    unsafe { p.write_unaligned(v) }
}
