//! Scalar and handle types of `cuda.h`.

use core::ffi::{c_int, c_uint, c_void};

/// `CUresult` (`typedef enum cudaError_enum {...} CUresult;`): unsigned, as gcc and bindgen
/// give a C enum of non-negative values on Linux. The codes are in [`crate::result`].
pub type CUresult = c_uint;
/// `CUdevice` (`typedef int CUdevice_v1`): a device ordinal.
pub type CUdevice = c_int;
/// `CUdeviceptr` (`CUdeviceptr_v2`, `unsigned long long` on 64-bit targets).
pub type CUdeviceptr = u64;
/// `CUcontext` (`struct CUctx_st *`).
pub type CUcontext = *mut c_void;
/// `CUstream` (`struct CUstream_st *`).
pub type CUstream = *mut c_void;
/// `CUevent` (`struct CUevent_st *`).
pub type CUevent = *mut c_void;
/// `CUmemoryPool` (`struct CUmemPoolHandle_st *`).
pub type CUmemoryPool = *mut c_void;
/// `CUarray` (`struct CUarray_st *`).
pub type CUarray = *mut c_void;
/// `CUmipmappedArray` (`struct CUmipmappedArray_st *`).
pub type CUmipmappedArray = *mut c_void;
/// `CUmemGenericAllocationHandle` (`CUmemGenericAllocationHandle_v1`, `unsigned long long`).
pub type CUmemGenericAllocationHandle = u64;
/// `CUmodule` (`struct CUmod_st *`).
pub type CUmodule = *mut c_void;
/// `CUlibrary` (`struct CUlib_st *`).
pub type CUlibrary = *mut c_void;
/// `CUfunction` (`struct CUfunc_st *`).
pub type CUfunction = *mut c_void;
/// `CUkernel` (`struct CUkern_st *`).
pub type CUkernel = *mut c_void;
/// `CUgraph` (`struct CUgraph_st *`).
pub type CUgraph = *mut c_void;
/// `CUgraphNode` (`struct CUgraphNode_st *`).
pub type CUgraphNode = *mut c_void;
/// `CUgraphExec` (`struct CUgraphExec_st *`).
pub type CUgraphExec = *mut c_void;
