//! Enum values, flags and special handles of `cuda.h` (typed as the code that passes them
//! uses them: see the crate's conventions).

use core::ffi::{c_int, c_uint};

// ---- streams ----

/// `CU_STREAM_LEGACY` (`((CUstream)0x1)`): the legacy default stream's handle.
pub const CU_STREAM_LEGACY: usize = 1;
/// `CU_STREAM_PER_THREAD` (`((CUstream)0x2)`): the per-thread default stream's handle.
pub const CU_STREAM_PER_THREAD: usize = 2;
/// `CU_STREAM_CAPTURE_STATUS_NONE` (`CUstreamCaptureStatus`).
pub const CU_STREAM_CAPTURE_STATUS_NONE: c_int = 0;
/// `CU_STREAM_CAPTURE_MODE_RELAXED` (`CUstreamCaptureMode`).
pub const CU_STREAM_CAPTURE_MODE_RELAXED: c_int = 2;

// ---- events ----

/// `CU_EVENT_DEFAULT` (`CUevent_flags`).
pub const CU_EVENT_DEFAULT: c_uint = 0;
/// `CU_EVENT_BLOCKING_SYNC` (`CUevent_flags`).
pub const CU_EVENT_BLOCKING_SYNC: c_uint = 1;
/// `CU_EVENT_DISABLE_TIMING` (`CUevent_flags`).
pub const CU_EVENT_DISABLE_TIMING: c_uint = 2;
/// `CU_EVENT_INTERPROCESS` (`CUevent_flags`; valid only with `CU_EVENT_DISABLE_TIMING`).
pub const CU_EVENT_INTERPROCESS: c_uint = 4;
/// `CU_EVENT_RECORD_EXTERNAL` (`CUevent_record_flags`).
pub const CU_EVENT_RECORD_EXTERNAL: c_uint = 1;
/// `CU_EVENT_WAIT_EXTERNAL` (`CUevent_wait_flags`).
pub const CU_EVENT_WAIT_EXTERNAL: c_uint = 1;

// ---- memory ----

/// `CU_MEM_ATTACH_GLOBAL` (`CUmemAttach_flags`).
pub const CU_MEM_ATTACH_GLOBAL: c_uint = 1;
/// `CU_MEM_ATTACH_HOST` (`CUmemAttach_flags`).
pub const CU_MEM_ATTACH_HOST: c_uint = 2;
/// `CU_MEM_ALLOCATION_TYPE_PINNED` (`CUmemAllocationType`).
pub const CU_MEM_ALLOCATION_TYPE_PINNED: c_uint = 1;
/// `CU_MEM_LOCATION_TYPE_DEVICE` (`CUmemLocationType`): `id` is a device ordinal.
pub const CU_MEM_LOCATION_TYPE_DEVICE: c_uint = 1;
/// `CU_MEMPOOL_ATTR_RELEASE_THRESHOLD` (`CUmemPool_attribute`; value `cuuint64_t`).
pub const CU_MEMPOOL_ATTR_RELEASE_THRESHOLD: c_int = 4;
/// `CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT` (`CUmemPool_attribute`; value `cuuint64_t`).
pub const CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT: c_int = 5;
/// `CU_MEMPOOL_ATTR_USED_MEM_CURRENT` (`CUmemPool_attribute`; value `cuuint64_t`).
pub const CU_MEMPOOL_ATTR_USED_MEM_CURRENT: c_int = 7;

// ---- arrays ----

/// `CUDA_ARRAY3D_LAYERED`: `depth` is a layer count.
pub const CUDA_ARRAY3D_LAYERED: c_uint = 0x01;
/// `CUDA_ARRAY3D_SPARSE`: a sparse array; its memory is mapped from `cuMemCreate` handles.
pub const CUDA_ARRAY3D_SPARSE: c_uint = 0x40;
/// `CUDA_ARRAY3D_DEFERRED_MAPPING`: the array has no backing memory of its own.
pub const CUDA_ARRAY3D_DEFERRED_MAPPING: c_uint = 0x80;

// ---- graphs ----

/// `CU_GRAPH_NODE_TYPE_MEM_ALLOC` (`CUgraphNodeType`).
pub const CU_GRAPH_NODE_TYPE_MEM_ALLOC: c_int = 10;
/// `CU_GRAPH_NODE_TYPE_MEM_FREE` (`CUgraphNodeType`).
pub const CU_GRAPH_NODE_TYPE_MEM_FREE: c_int = 11;
/// `CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH` (`CUgraphInstantiate_flags`).
pub const CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH: u64 = 1;
/// `CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD` (`CUgraphInstantiate_flags`;
/// `cuGraphInstantiateWithParams` only).
pub const CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD: u64 = 2;
/// `CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT` (`CUgraphMem_attribute`).
pub const CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT: c_int = 0;
/// `CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT` (`CUgraphMem_attribute`).
pub const CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT: c_int = 2;

// ---- limits and attributes ----

/// `CU_LIMIT_STACK_SIZE` (`CUlimit`).
pub const CU_LIMIT_STACK_SIZE: c_int = 0;
/// `CU_LIMIT_PRINTF_FIFO_SIZE` (`CUlimit`).
pub const CU_LIMIT_PRINTF_FIFO_SIZE: c_int = 1;
/// `CU_LIMIT_MALLOC_HEAP_SIZE` (`CUlimit`).
pub const CU_LIMIT_MALLOC_HEAP_SIZE: c_int = 2;
/// `CU_LIMIT_DEV_RUNTIME_SYNC_DEPTH` (`CUlimit`).
pub const CU_LIMIT_DEV_RUNTIME_SYNC_DEPTH: c_int = 3;
/// `CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT` (`CUlimit`).
pub const CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT: c_int = 4;
/// `CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES` (`CUfunction_attribute`).
pub const CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES: c_int = 3;
/// `CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT` (`CUdevice_attribute`).
pub const CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: c_int = 16;
/// `CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR` (`CUdevice_attribute`).
pub const CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR: c_int = 39;

// ---- launches, entry points, green contexts ----

/// `CU_LAUNCH_PARAM_END` (`((void*)0x00)`): ends a launch's `extra` list.
pub const CU_LAUNCH_PARAM_END: usize = 0;
/// `CU_LAUNCH_PARAM_BUFFER_POINTER` (`((void*)0x01)`): the next `extra` entry points to the
/// packed kernel parameters.
pub const CU_LAUNCH_PARAM_BUFFER_POINTER: usize = 1;
/// `CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM` (`CUdriverProcAddress_flags`).
pub const CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM: u64 = 2;
/// `CU_GET_PROC_ADDRESS_SUCCESS` (`CUdriverProcAddressQueryResult`).
pub const CU_GET_PROC_ADDRESS_SUCCESS: c_int = 0;
/// `CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND` (`CUdriverProcAddressQueryResult`).
pub const CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND: c_int = 1;
/// `CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT` (`CUdriverProcAddressQueryResult`).
pub const CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT: c_int = 2;
/// `CU_DEV_RESOURCE_TYPE_SM` (`CUdevResourceType`).
pub const CU_DEV_RESOURCE_TYPE_SM: c_int = 1;
