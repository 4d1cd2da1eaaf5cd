//! The slice of the CUDA driver API and NVML ABI the preload uses: types, constants and the
//! function-pointer types of the real functions (as documented in `cuda.h` / `nvml.h`).
#![allow(non_camel_case_types)]

use std::ffi::{c_char, c_int, c_uint, c_void};

/// `CUresult`.
pub type CUresult = c_uint;
/// `CUdevice`.
pub type CUdevice = c_int;
/// `CUdeviceptr` (64-bit).
pub type CUdeviceptr = u64;
/// `CUcontext`.
pub type CUcontext = *mut c_void;
/// `CUstream`.
pub type CUstream = *mut c_void;
/// `CUmemoryPool`.
pub type CUmemoryPool = *mut c_void;
/// `CUarray`.
pub type CUarray = *mut c_void;
/// `CUmemGenericAllocationHandle`.
pub type CUmemGenericAllocationHandle = u64;
/// `CUmipmappedArray`.
pub type CUmipmappedArray = *mut c_void;
/// `CUmodule`.
pub type CUmodule = *mut c_void;
/// `CUlibrary`.
pub type CUlibrary = *mut c_void;
/// `CUfunction`.
pub type CUfunction = *mut c_void;
/// `CUkernel`.
pub type CUkernel = *mut c_void;
/// `CUevent`.
pub type CUevent = *mut c_void;

/// `CUDA_SUCCESS`.
pub const CUDA_SUCCESS: CUresult = 0;
/// `CUDA_ERROR_INVALID_VALUE`.
pub const CUDA_ERROR_INVALID_VALUE: CUresult = 1;
/// `CUDA_ERROR_OUT_OF_MEMORY`.
pub const CUDA_ERROR_OUT_OF_MEMORY: CUresult = 2;
/// `CUDA_ERROR_NOT_INITIALIZED`.
pub const CUDA_ERROR_NOT_INITIALIZED: CUresult = 3;
/// `CUDA_ERROR_INVALID_CONTEXT`.
pub const CUDA_ERROR_INVALID_CONTEXT: CUresult = 201;
/// `CUDA_ERROR_UNSUPPORTED_LIMIT`.
pub const CUDA_ERROR_UNSUPPORTED_LIMIT: CUresult = 215;
/// `CUDA_ERROR_NOT_FOUND`.
pub const CUDA_ERROR_NOT_FOUND: CUresult = 500;
/// `CUDA_ERROR_UNKNOWN`.
pub const CUDA_ERROR_UNKNOWN: CUresult = 999;

/// `CU_MEMPOOL_ATTR_RELEASE_THRESHOLD` (`cuuint64_t`).
pub const CU_MEMPOOL_ATTR_RELEASE_THRESHOLD: c_int = 4;
/// `CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT` (`cuuint64_t`).
pub const CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT: c_int = 5;
/// `CU_MEMPOOL_ATTR_USED_MEM_CURRENT` (`cuuint64_t`).
pub const CU_MEMPOOL_ATTR_USED_MEM_CURRENT: c_int = 7;
/// `CU_STREAM_CAPTURE_STATUS_NONE`.
pub const CU_STREAM_CAPTURE_STATUS_NONE: c_int = 0;
/// `CU_STREAM_PER_THREAD`: the per-thread default stream's handle.
pub const CU_STREAM_PER_THREAD: usize = 2;

/// `CU_MEM_LOCATION_TYPE_DEVICE`.
pub const CU_MEM_LOCATION_TYPE_DEVICE: c_uint = 1;
/// `CUDA_ARRAY3D_DEFERRED_MAPPING`: the array has no backing memory of its own.
pub const CUDA_ARRAY3D_DEFERRED_MAPPING: c_uint = 0x80;
/// `CUDA_ARRAY3D_SPARSE`: a sparse array; its memory is mapped from `cuMemCreate` handles.
pub const CUDA_ARRAY3D_SPARSE: c_uint = 0x40;
/// `CUDA_ARRAY3D_LAYERED`: `depth` is a layer count.
pub const CUDA_ARRAY3D_LAYERED: c_uint = 0x01;

/// `CUuuid`.
#[repr(C)]
#[derive(Clone, Copy, Default, Debug, PartialEq, Eq)]
pub struct CUuuid {
    /// The 16 bytes.
    pub bytes: [u8; 16],
}

/// `CUmemLocation`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUmemLocation {
    /// `CUmemLocationType`.
    pub type_: c_uint,
    /// Device ordinal (for `CU_MEM_LOCATION_TYPE_DEVICE`).
    pub id: c_int,
}

/// `CUmemAllocationProp` (only the leading fields are read).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUmemAllocationProp {
    /// `CUmemAllocationType`.
    pub type_: c_uint,
    /// `CUmemAllocationHandleType`.
    pub requested_handle_types: c_uint,
    /// Where the memory lives.
    pub location: CUmemLocation,
    /// Windows only.
    pub win32_handle_meta_data: *mut c_void,
    /// `allocFlags` (compressionType, gpuDirectRDMACapable, usage, reserved[4]).
    pub alloc_flags: [u8; 8],
}

/// The leading fields of `CUmemPoolProps` (the only ones read; the rest is never touched).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUmemPoolPropsHead {
    /// `CUmemAllocationType`.
    pub alloc_type: c_uint,
    /// `CUmemAllocationHandleType`.
    pub handle_types: c_uint,
    /// Where the pool's memory lives.
    pub location: CUmemLocation,
}

/// `CUDA_ARRAY_DESCRIPTOR`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUDA_ARRAY_DESCRIPTOR {
    /// Width in elements.
    pub width: usize,
    /// Height in elements.
    pub height: usize,
    /// `CUarray_format`.
    pub format: c_uint,
    /// Channels per element.
    pub num_channels: c_uint,
}

/// `CUDA_ARRAY3D_DESCRIPTOR`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUDA_ARRAY3D_DESCRIPTOR {
    /// Width in elements.
    pub width: usize,
    /// Height in elements.
    pub height: usize,
    /// Depth in elements (or layers).
    pub depth: usize,
    /// `CUarray_format`.
    pub format: c_uint,
    /// Channels per element.
    pub num_channels: c_uint,
    /// `CUDA_ARRAY3D_*` flags.
    pub flags: c_uint,
}

// ---- NVML ----

/// `nvmlReturn_t`.
pub type nvmlReturn_t = c_uint;
/// `nvmlDevice_t`.
pub type nvmlDevice_t = *mut c_void;
/// `NVML_SUCCESS`.
pub const NVML_SUCCESS: nvmlReturn_t = 0;
/// `NVML_ERROR_INVALID_ARGUMENT`.
pub const NVML_ERROR_INVALID_ARGUMENT: nvmlReturn_t = 2;
/// `NVML_ERROR_FUNCTION_NOT_FOUND`.
pub const NVML_ERROR_FUNCTION_NOT_FOUND: nvmlReturn_t = 13;
/// `NVML_ERROR_UNKNOWN`.
pub const NVML_ERROR_UNKNOWN: nvmlReturn_t = 999;
/// `NVML_ERROR_INSUFFICIENT_SIZE`.
pub const NVML_ERROR_INSUFFICIENT_SIZE: nvmlReturn_t = 7;
/// `NVML_VALUE_NOT_AVAILABLE`: a process's `usedGpuMemory` NVML cannot report.
pub const NVML_VALUE_NOT_AVAILABLE: u64 = u64::MAX;

/// `nvmlProcessInfo_v1_t` (entries of `nvmlDeviceGetComputeRunningProcesses`, the v1 name).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct nvmlProcessInfo_v1_t {
    /// Process id (as the host's pid namespace numbers it).
    pub pid: c_uint,
    /// Device memory the process uses, or [`NVML_VALUE_NOT_AVAILABLE`].
    pub used_gpu_memory: u64,
}

/// `nvmlProcessInfo_v2_t`, also `nvmlProcessInfo_t` (entries of
/// `nvmlDeviceGetComputeRunningProcesses_v2` and `_v3`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct nvmlProcessInfo_v2_t {
    /// Process id (as the host's pid namespace numbers it).
    pub pid: c_uint,
    /// Device memory the process uses, or [`NVML_VALUE_NOT_AVAILABLE`].
    pub used_gpu_memory: u64,
    /// GPU instance (MIG), `0xFFFFFFFF` if none.
    pub gpu_instance_id: c_uint,
    /// Compute instance (MIG), `0xFFFFFFFF` if none.
    pub compute_instance_id: c_uint,
}

/// `nvmlMemory_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct nvmlMemory_t {
    /// Total installed memory.
    pub total: u64,
    /// Unallocated memory.
    pub free: u64,
    /// Allocated memory.
    pub used: u64,
}

/// `nvmlMemory_v2_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct nvmlMemory_v2_t {
    /// Struct version (set by the caller).
    pub version: c_uint,
    /// Total memory.
    pub total: u64,
    /// Reserved by the driver/firmware.
    pub reserved: u64,
    /// Unallocated memory.
    pub free: u64,
    /// Allocated memory.
    pub used: u64,
}

// ---- function pointer types of the real functions ----

/// `cuInit`.
pub type FnInit = unsafe extern "C" fn(c_uint) -> CUresult;
/// `cuDeviceGetCount`.
pub type FnDeviceGetCount = unsafe extern "C" fn(*mut c_int) -> CUresult;
/// `cuDeviceGetUuid(_v2)`.
pub type FnDeviceGetUuid = unsafe extern "C" fn(*mut CUuuid, CUdevice) -> CUresult;
/// `cuCtxGetDevice`.
pub type FnCtxGetDevice = unsafe extern "C" fn(*mut CUdevice) -> CUresult;
/// `cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev)`.
pub type FnDeviceGetAttribute = unsafe extern "C" fn(*mut c_int, c_int, CUdevice) -> CUresult;
/// `cuCtxGetCurrent`.
pub type FnCtxGetCurrent = unsafe extern "C" fn(*mut CUcontext) -> CUresult;
/// `cuCtxPushCurrent_v2`.
pub type FnCtxPushCurrent = unsafe extern "C" fn(CUcontext) -> CUresult;
/// `cuCtxPopCurrent_v2`.
pub type FnCtxPopCurrent = unsafe extern "C" fn(*mut CUcontext) -> CUresult;
/// `cuMemFree_v2`.
pub type FnMemFree = unsafe extern "C" fn(CUdeviceptr) -> CUresult;
/// `cuMemFreeAsync(_ptsz)`.
pub type FnMemFreeAsync = unsafe extern "C" fn(CUdeviceptr, CUstream) -> CUresult;
/// `cuMemRelease`.
pub type FnMemRelease = unsafe extern "C" fn(CUmemGenericAllocationHandle) -> CUresult;
/// `cuDevicePrimaryCtxRelease(_v2)`, `cuDevicePrimaryCtxReset(_v2)`.
pub type FnDeviceOp = unsafe extern "C" fn(CUdevice) -> CUresult;
/// `cuCtxDestroy_v2`.
pub type FnCtxDestroy = unsafe extern "C" fn(CUcontext) -> CUresult;
/// `cuMemGetInfo_v2`.
pub type FnMemGetInfo = unsafe extern "C" fn(*mut usize, *mut usize) -> CUresult;
/// `cuDriverGetVersion`.
pub type FnDriverGetVersion = unsafe extern "C" fn(*mut c_int) -> CUresult;
/// `cuDeviceGetMemPool`, `cuDeviceGetDefaultMemPool`.
pub type FnDeviceGetMemPool = unsafe extern "C" fn(*mut CUmemoryPool, CUdevice) -> CUresult;
/// `cuMemPoolTrimTo`.
pub type FnMemPoolTrimTo = unsafe extern "C" fn(CUmemoryPool, usize) -> CUresult;
/// `cuMemPoolGetAttribute`, `cuMemPoolSetAttribute`.
pub type FnMemPoolAttribute = unsafe extern "C" fn(CUmemoryPool, c_int, *mut c_void) -> CUresult;
/// `cuStreamSynchronize(_ptsz)`.
pub type FnStreamSynchronize = unsafe extern "C" fn(CUstream) -> CUresult;
/// `cuStreamIsCapturing(_ptsz)`.
pub type FnStreamIsCapturing = unsafe extern "C" fn(CUstream, *mut c_int) -> CUresult;
/// `cuModuleUnload`.
pub type FnModuleUnload = unsafe extern "C" fn(CUmodule) -> CUresult;
/// `cuLibraryUnload`.
pub type FnLibraryUnload = unsafe extern "C" fn(CUlibrary) -> CUresult;
/// `cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode *mode)`.
pub type FnThreadExchangeStreamCaptureMode = unsafe extern "C" fn(*mut c_int) -> CUresult;
/// `CU_STREAM_CAPTURE_MODE_RELAXED`.
pub const CU_STREAM_CAPTURE_MODE_RELAXED: c_int = 2;
/// `cuCtxSetLimit(CUlimit limit, size_t value)`.
pub type FnCtxSetLimit = unsafe extern "C" fn(c_int, usize) -> CUresult;
/// `cuCtxGetLimit(size_t *pvalue, CUlimit limit)`.
pub type FnCtxGetLimit = unsafe extern "C" fn(*mut usize, c_int) -> CUresult;
/// `cuFuncGetAttribute(int *pi, CUfunction_attribute attrib, CUfunction hfunc)`.
pub type FnFuncGetAttribute = unsafe extern "C" fn(*mut c_int, c_int, CUfunction) -> CUresult;
/// `cuKernelGetAttribute(int *pi, CUfunction_attribute attrib, CUkernel kernel, CUdevice dev)`.
pub type FnKernelGetAttribute =
    unsafe extern "C" fn(*mut c_int, c_int, CUkernel, CUdevice) -> CUresult;
/// A `CUgraphExec`.
pub type CUgraphExec = *mut c_void;
/// `cuEventCreate`.
pub type FnEventCreate = unsafe extern "C" fn(*mut CUevent, c_uint) -> CUresult;
/// `cuEventDestroy_v2`.
pub type FnEventDestroy = unsafe extern "C" fn(CUevent) -> CUresult;
/// `cuEventRecord(_ptsz)`.
pub type FnEventRecord = unsafe extern "C" fn(CUevent, CUstream) -> CUresult;
/// `cuEventQuery`.
pub type FnEventQuery = unsafe extern "C" fn(CUevent) -> CUresult;
/// `cuEventElapsedTime(_v2)` (milliseconds).
pub type FnEventElapsedTime = unsafe extern "C" fn(*mut f32, CUevent, CUevent) -> CUresult;
/// The head of `CUlaunchConfig` up to its stream (`cuLaunchKernelEx`).
#[repr(C)]
pub struct CUlaunchConfigHead {
    /// `gridDimX..blockDimZ`, `sharedMemBytes`.
    pub dims: [c_uint; 7],
    /// `hStream`.
    pub stream: CUstream,
}

/// `nvmlInit_v2`.
pub type FnNvmlInit = unsafe extern "C" fn() -> nvmlReturn_t;
/// `nvmlDeviceGetMemoryInfo`.
pub type FnNvmlMemInfo = unsafe extern "C" fn(nvmlDevice_t, *mut nvmlMemory_t) -> nvmlReturn_t;
/// `nvmlDeviceGetUUID`.
pub type FnNvmlGetUuid = unsafe extern "C" fn(nvmlDevice_t, *mut c_char, c_uint) -> nvmlReturn_t;
/// `nvmlDeviceGetHandleByUUID`.
pub type FnNvmlHandleByUuid =
    unsafe extern "C" fn(*const c_char, *mut nvmlDevice_t) -> nvmlReturn_t;

/// `nvmlDeviceGetComputeRunningProcesses` (v1 entries).
pub type FnNvmlProcsV1 =
    unsafe extern "C" fn(nvmlDevice_t, *mut c_uint, *mut nvmlProcessInfo_v1_t) -> nvmlReturn_t;
/// `nvmlDeviceGetComputeRunningProcesses_v2` / `_v3` (v2 entries).
pub type FnNvmlProcsV2 =
    unsafe extern "C" fn(nvmlDevice_t, *mut c_uint, *mut nvmlProcessInfo_v2_t) -> nvmlReturn_t;
/// `nvmlDeviceGetCount_v2`.
pub type FnNvmlGetCount = unsafe extern "C" fn(*mut c_uint) -> nvmlReturn_t;
/// `nvmlDeviceGetHandleByIndex_v2`.
pub type FnNvmlHandleByIndex = unsafe extern "C" fn(c_uint, *mut nvmlDevice_t) -> nvmlReturn_t;
/// `nvmlSystemGetDriverVersion`.
pub type FnNvmlDriverVersion = unsafe extern "C" fn(*mut c_char, c_uint) -> nvmlReturn_t;

/// Parses an NVML UUID string (`GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`) into its 16 bytes.
/// Any prefix before the first hex group (e.g. `GPU-`) is accepted only if it is `GPU-`.
pub fn parse_uuid(s: &str) -> Option<[u8; 16]> {
    let hex = s.strip_prefix("GPU-").unwrap_or(s);
    let digits: Vec<u8> = hex.bytes().filter(|&b| b != b'-').collect();
    if digits.len() != 32 || hex.bytes().filter(|&b| b == b'-').count() != 4 {
        return None;
    }
    let mut out = [0u8; 16];
    for (i, pair) in digits.chunks(2).enumerate() {
        let hi = (pair[0] as char).to_digit(16)?;
        let lo = (pair[1] as char).to_digit(16)?;
        out[i] = (hi * 16 + lo) as u8;
    }
    Some(out)
}

/// Formats 16 UUID bytes the way NVML does (`GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`): the
/// workspace's one formatter, [`hami_abi::uuid::format`].
pub use hami_abi::uuid::format as format_uuid;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn struct_sizes_match_cuda_h() {
        assert_eq!(std::mem::size_of::<CUmemAllocationProp>(), 32);
        assert_eq!(std::mem::size_of::<CUDA_ARRAY_DESCRIPTOR>(), 24);
        assert_eq!(std::mem::size_of::<CUDA_ARRAY3D_DESCRIPTOR>(), 40);
        assert_eq!(std::mem::size_of::<nvmlMemory_t>(), 24);
        assert_eq!(std::mem::size_of::<nvmlMemory_v2_t>(), 40);
        assert_eq!(std::mem::size_of::<nvmlProcessInfo_v1_t>(), 16);
        assert_eq!(std::mem::size_of::<nvmlProcessInfo_v2_t>(), 24);
    }

    #[test]
    fn uuid_round_trip() {
        let b: [u8; 16] = core::array::from_fn(|i| (i * 17) as u8);
        let s = format_uuid(&b);
        assert_eq!(s.len(), 40);
        assert_eq!(parse_uuid(&s), Some(b));
        assert_eq!(parse_uuid("GPU-xyz"), None);
        assert_eq!(parse_uuid("MIG-00000000-0000-0000-0000-000000000000"), None);
    }
}

// ---- graphs with memory nodes (hami-preload/src/objects/graph_memory.rs) ----

/// A `CUgraph`.
pub type CUgraph = *mut c_void;
/// A `CUgraphNode`.
pub type CUgraphNode = *mut c_void;
/// `CU_GRAPH_NODE_TYPE_MEM_ALLOC`.
pub const CU_GRAPH_NODE_TYPE_MEM_ALLOC: c_int = 10;
/// `CU_GRAPH_NODE_TYPE_MEM_FREE`.
pub const CU_GRAPH_NODE_TYPE_MEM_FREE: c_int = 11;
/// `CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH`.
pub const CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH: u64 = 1;
/// `CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD` (`cuGraphInstantiateWithParams` only).
pub const CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD: u64 = 2;
/// `CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT`.
pub const CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT: c_int = 0;
/// `CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT`.
pub const CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT: c_int = 2;

/// `CUDA_MEM_ALLOC_NODE_PARAMS` (v1 and v2 share the layout): `CUmemPoolProps` (88 bytes:
/// allocType, handleTypes, location at 8, the rest not read), then the access descriptors,
/// the size and the address the driver assigns.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUDA_MEM_ALLOC_NODE_PARAMS {
    /// `poolProps`' leading fields.
    pub pool_props: CUmemPoolPropsHead,
    /// The rest of `poolProps` (win32 attributes, maxSize, usage, reserved).
    pub pool_props_rest: [u64; 9],
    /// `accessDescs`.
    pub access_descs: *const c_void,
    /// `accessDescCount`.
    pub access_desc_count: usize,
    /// `bytesize`.
    pub bytesize: usize,
    /// `dptr`.
    pub dptr: CUdeviceptr,
}

/// `CUDA_GRAPH_INSTANTIATE_PARAMS`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUDA_GRAPH_INSTANTIATE_PARAMS {
    /// `CUgraphInstantiate_flags`.
    pub flags: u64,
    /// `hUploadStream`.
    pub upload_stream: CUstream,
    /// `hErrNode_out`.
    pub err_node_out: CUgraphNode,
    /// `result_out` (`CUgraphInstantiateResult`).
    pub result_out: c_int,
}

/// `cuGraphGetNodes(CUgraph, CUgraphNode *nodes, size_t *numNodes)`.
pub type FnGraphGetNodes = unsafe extern "C" fn(CUgraph, *mut CUgraphNode, *mut usize) -> CUresult;
/// `cuGraphNodeGetType(CUgraphNode, CUgraphNodeType *)`.
pub type FnGraphNodeGetType = unsafe extern "C" fn(CUgraphNode, *mut c_int) -> CUresult;
/// `cuGraphMemAllocNodeGetParams(CUgraphNode, CUDA_MEM_ALLOC_NODE_PARAMS *)`.
pub type FnGraphMemAllocNodeGetParams =
    unsafe extern "C" fn(CUgraphNode, *mut CUDA_MEM_ALLOC_NODE_PARAMS) -> CUresult;
/// `cuGraphMemFreeNodeGetParams(CUgraphNode, CUdeviceptr *)`.
pub type FnGraphMemFreeNodeGetParams =
    unsafe extern "C" fn(CUgraphNode, *mut CUdeviceptr) -> CUresult;
/// `cuDeviceGetGraphMemAttribute(CUdevice, CUgraphMem_attribute, void *)` (`cuuint64_t`).
pub type FnDeviceGetGraphMemAttribute =
    unsafe extern "C" fn(CUdevice, c_int, *mut c_void) -> CUresult;

const _: () = assert!(std::mem::size_of::<CUDA_MEM_ALLOC_NODE_PARAMS>() == 120);
const _: () = assert!(std::mem::size_of::<CUDA_GRAPH_INSTANTIATE_PARAMS>() == 32);
