//! C types, result codes and error strings of the CUDA driver API (values from `cuda.h`;
//! strings as the real driver 580 returns them, see `tests/data/real-errors-580.txt`), and the
//! glue every export answers through: [`run`] (a panic becomes `CUDA_ERROR_UNKNOWN`),
//! [`nonnull`] and [`put`].

#![allow(non_camel_case_types)]

use std::ffi::{c_int, c_uint, c_void};

/// `CUresult`.
pub type CUresult = c_int;
/// `CUdevice` (an ordinal).
pub type CUdevice = c_int;
/// `CUdeviceptr` (64-bit).
pub type CUdeviceptr = u64;
/// `CUcontext` (opaque pointer).
pub type CUcontext = *mut c_void;
/// `CUstream` (opaque pointer).
pub type CUstream = *mut c_void;
/// `CUarray` (opaque pointer).
pub type CUarray = *mut c_void;
/// `CUmemoryPool` (opaque pointer).
pub type CUmemoryPool = *mut c_void;
/// `CUmemGenericAllocationHandle`.
pub type CUmemGenericAllocationHandle = u64;

/// Result of the fake's operations: `Err` carries the CUresult.
pub type R<T> = Result<T, CUresult>;

pub const CUDA_SUCCESS: CUresult = 0;
pub const CUDA_ERROR_INVALID_VALUE: CUresult = 1;
pub const CUDA_ERROR_OUT_OF_MEMORY: CUresult = 2;
pub const CUDA_ERROR_NOT_INITIALIZED: CUresult = 3;
pub const CUDA_ERROR_NO_DEVICE: CUresult = 100;
pub const CUDA_ERROR_INVALID_DEVICE: CUresult = 101;
pub const CUDA_ERROR_INVALID_IMAGE: CUresult = 200;
pub const CUDA_ERROR_INVALID_CONTEXT: CUresult = 201;
pub const CUDA_ERROR_FILE_NOT_FOUND: CUresult = 301;
pub const CUDA_ERROR_UNSUPPORTED_LIMIT: CUresult = 215;
pub const CUDA_ERROR_INVALID_HANDLE: CUresult = 400;
pub const CUDA_ERROR_NOT_FOUND: CUresult = 500;
pub const CUDA_ERROR_NOT_READY: CUresult = 600;
pub const CUDA_ERROR_ILLEGAL_STATE: CUresult = 401;
pub const CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED: CUresult = 900;
pub const CUDA_ERROR_CONTEXT_IS_DESTROYED: CUresult = 709;
pub const CUDA_ERROR_UNKNOWN: CUresult = 999;

/// `CU_GET_PROC_ADDRESS_SUCCESS`.
pub const CU_GET_PROC_ADDRESS_SUCCESS: c_int = 0;
/// `CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND`.
pub const CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND: c_int = 1;
/// `CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT`.
pub const CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT: c_int = 2;
/// `CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM`.
pub const CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM: u64 = 2;

/// `CU_STREAM_LEGACY`.
pub const CU_STREAM_LEGACY: usize = 1;
/// `CU_STREAM_PER_THREAD`.
pub const CU_STREAM_PER_THREAD: usize = 2;

/// `CU_MEM_ATTACH_GLOBAL`.
pub const CU_MEM_ATTACH_GLOBAL: c_uint = 1;
/// `CU_MEM_ATTACH_HOST`.
pub const CU_MEM_ATTACH_HOST: c_uint = 2;
/// `CU_MEM_ALLOCATION_TYPE_PINNED`.
pub const CU_MEM_ALLOCATION_TYPE_PINNED: c_uint = 1;
/// `CU_MEM_LOCATION_TYPE_DEVICE`.
pub const CU_MEM_LOCATION_TYPE_DEVICE: c_uint = 1;

/// Number of `CUdevice_attribute` values (`CU_DEVICE_ATTRIBUTE_MAX` in CUDA 13.0).
pub const CU_DEVICE_ATTRIBUTE_MAX: c_int = 148;

/// `CUuuid`.
#[repr(C)]
pub struct CUuuid {
    pub bytes: [u8; 16],
}

/// `CUmemLocation`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CUmemLocation {
    pub type_: c_uint,
    pub id: c_int,
}

/// `CUmemAllocationProp` (the fields the fake reads come first; the rest is not touched).
#[repr(C)]
pub struct CUmemAllocationProp {
    pub type_: c_uint,
    pub requested_handle_types: c_uint,
    pub location: CUmemLocation,
    pub win32_handle_meta_data: *mut c_void,
    pub alloc_flags: [u8; 8],
}

/// `CUmemPoolProps` (leading fields).
#[repr(C)]
pub struct CUmemPoolProps {
    pub alloc_type: c_uint,
    pub handle_types: c_uint,
    pub location: CUmemLocation,
}

/// `CUmemAccessDesc`.
#[repr(C)]
pub struct CUmemAccessDesc {
    pub location: CUmemLocation,
    pub flags: c_uint,
}

/// `CUDA_ARRAY_DESCRIPTOR` (v2).
#[repr(C)]
pub struct CUDA_ARRAY_DESCRIPTOR {
    pub width: usize,
    pub height: usize,
    pub format: c_uint,
    pub num_channels: c_uint,
}

/// `CUDA_ARRAY3D_DESCRIPTOR` (v2).
#[repr(C)]
pub struct CUDA_ARRAY3D_DESCRIPTOR {
    pub width: usize,
    pub height: usize,
    pub depth: usize,
    pub format: c_uint,
    pub num_channels: c_uint,
    pub flags: c_uint,
}

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

/// `CUmemPoolProps` whole (88 bytes, CUDA 12.2+ layout), as graph allocation nodes carry it.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CUmemPoolPropsFull {
    pub alloc_type: c_uint,
    pub handle_types: c_uint,
    pub location: CUmemLocation,
    pub win32_security_attributes: *mut c_void,
    pub max_size: usize,
    pub usage: u16,
    pub reserved: [u8; 54],
}

/// `CUDA_MEM_ALLOC_NODE_PARAMS` (v1 and v2 have one layout).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CUDA_MEM_ALLOC_NODE_PARAMS {
    pub pool_props: CUmemPoolPropsFull,
    pub access_descs: *const CUmemAccessDesc,
    pub access_desc_count: usize,
    pub bytesize: usize,
    pub dptr: CUdeviceptr,
}

/// `CUgraphNodeParams` (CUDA 12.2+): the node type, then a 232-byte union at offset 16.
#[repr(C)]
pub struct CUgraphNodeParams {
    pub type_: c_int,
    pub reserved0: [c_int; 3],
    pub union: [u64; 29],
    pub reserved2: i64,
}

/// `CUDA_GRAPH_INSTANTIATE_PARAMS`.
#[repr(C)]
pub struct CUDA_GRAPH_INSTANTIATE_PARAMS {
    pub flags: u64,
    pub h_upload_stream: CUstream,
    pub h_err_node_out: *mut c_void,
    pub result_out: c_int,
}

/// `CUgraphExecUpdateResultInfo`.
#[repr(C)]
pub struct CUgraphExecUpdateResultInfo {
    pub result: c_int,
    pub error_node: *mut c_void,
    pub error_from_node: *mut c_void,
}

/// `CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE`.
pub const CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE: CUresult = 910;

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
