//! Function-pointer types of `cuda.h` entry points (what a caller of the real driver casts a
//! looked-up symbol to). Enum arguments are `c_int` (see the crate's conventions).

use core::ffi::{c_int, c_uint, c_void};

use crate::structs::{CUuuid, CUDA_MEM_ALLOC_NODE_PARAMS};
use crate::types::*;

/// `CUresult cuInit(unsigned int Flags)`.
pub type FnInit = unsafe extern "C" fn(c_uint) -> CUresult;
/// `CUresult cuDriverGetVersion(int *driverVersion)`.
pub type FnDriverGetVersion = unsafe extern "C" fn(*mut c_int) -> CUresult;
/// `CUresult cuDeviceGetCount(int *count)`.
pub type FnDeviceGetCount = unsafe extern "C" fn(*mut c_int) -> CUresult;
/// `CUresult cuDeviceGetUuid(CUuuid *uuid, CUdevice dev)` (and `_v2`).
pub type FnDeviceGetUuid = unsafe extern "C" fn(*mut CUuuid, CUdevice) -> CUresult;
/// `CUresult cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev)`.
pub type FnDeviceGetAttribute = unsafe extern "C" fn(*mut c_int, c_int, CUdevice) -> CUresult;
/// `CUresult cuDevicePrimaryCtxRelease(CUdevice dev)`, `cuDevicePrimaryCtxReset` (and `_v2`).
pub type FnDeviceOp = unsafe extern "C" fn(CUdevice) -> CUresult;
/// `CUresult cuCtxGetDevice(CUdevice *device)`.
pub type FnCtxGetDevice = unsafe extern "C" fn(*mut CUdevice) -> CUresult;
/// `CUresult cuCtxGetCurrent(CUcontext *pctx)`.
pub type FnCtxGetCurrent = unsafe extern "C" fn(*mut CUcontext) -> CUresult;
/// `CUresult cuCtxPushCurrent_v2(CUcontext ctx)`.
pub type FnCtxPushCurrent = unsafe extern "C" fn(CUcontext) -> CUresult;
/// `CUresult cuCtxPopCurrent_v2(CUcontext *pctx)`.
pub type FnCtxPopCurrent = unsafe extern "C" fn(*mut CUcontext) -> CUresult;
/// `CUresult cuCtxDestroy_v2(CUcontext ctx)`.
pub type FnCtxDestroy = unsafe extern "C" fn(CUcontext) -> CUresult;
/// `CUresult cuCtxSetLimit(CUlimit limit, size_t value)`.
pub type FnCtxSetLimit = unsafe extern "C" fn(c_int, usize) -> CUresult;
/// `CUresult cuCtxGetLimit(size_t *pvalue, CUlimit limit)`.
pub type FnCtxGetLimit = unsafe extern "C" fn(*mut usize, c_int) -> CUresult;
/// `CUresult cuMemGetInfo_v2(size_t *free, size_t *total)`.
pub type FnMemGetInfo = unsafe extern "C" fn(*mut usize, *mut usize) -> CUresult;
/// `CUresult cuMemFree_v2(CUdeviceptr dptr)`.
pub type FnMemFree = unsafe extern "C" fn(CUdeviceptr) -> CUresult;
/// `CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream)` (and `_ptsz`).
pub type FnMemFreeAsync = unsafe extern "C" fn(CUdeviceptr, CUstream) -> CUresult;
/// `CUresult cuMemRelease(CUmemGenericAllocationHandle handle)`.
pub type FnMemRelease = unsafe extern "C" fn(CUmemGenericAllocationHandle) -> CUresult;
/// `CUresult cuDeviceGetMemPool(CUmemoryPool *pool, CUdevice dev)`,
/// `cuDeviceGetDefaultMemPool`.
pub type FnDeviceGetMemPool = unsafe extern "C" fn(*mut CUmemoryPool, CUdevice) -> CUresult;
/// `CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t minBytesToKeep)`.
pub type FnMemPoolTrimTo = unsafe extern "C" fn(CUmemoryPool, usize) -> CUresult;
/// `CUresult cuMemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value)`,
/// `cuMemPoolSetAttribute`.
pub type FnMemPoolAttribute = unsafe extern "C" fn(CUmemoryPool, c_int, *mut c_void) -> CUresult;
/// `CUresult cuStreamSynchronize(CUstream hStream)` (and `_ptsz`).
pub type FnStreamSynchronize = unsafe extern "C" fn(CUstream) -> CUresult;
/// `CUresult cuStreamIsCapturing(CUstream hStream, CUstreamCaptureStatus *captureStatus)` (and
/// `_ptsz`).
pub type FnStreamIsCapturing = unsafe extern "C" fn(CUstream, *mut c_int) -> CUresult;
/// `CUresult cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode *mode)`.
pub type FnThreadExchangeStreamCaptureMode = unsafe extern "C" fn(*mut c_int) -> CUresult;
/// `CUresult cuModuleUnload(CUmodule hmod)`.
pub type FnModuleUnload = unsafe extern "C" fn(CUmodule) -> CUresult;
/// `CUresult cuLibraryUnload(CUlibrary library)`.
pub type FnLibraryUnload = unsafe extern "C" fn(CUlibrary) -> CUresult;
/// `CUresult cuFuncGetAttribute(int *pi, CUfunction_attribute attrib, CUfunction hfunc)`.
pub type FnFuncGetAttribute = unsafe extern "C" fn(*mut c_int, c_int, CUfunction) -> CUresult;
/// `CUresult cuKernelGetAttribute(int *pi, CUfunction_attribute attrib, CUkernel kernel,
/// CUdevice dev)`.
pub type FnKernelGetAttribute =
    unsafe extern "C" fn(*mut c_int, c_int, CUkernel, CUdevice) -> CUresult;
/// `CUresult cuEventCreate(CUevent *phEvent, unsigned int Flags)`.
pub type FnEventCreate = unsafe extern "C" fn(*mut CUevent, c_uint) -> CUresult;
/// `CUresult cuEventDestroy_v2(CUevent hEvent)`.
pub type FnEventDestroy = unsafe extern "C" fn(CUevent) -> CUresult;
/// `CUresult cuEventRecord(CUevent hEvent, CUstream hStream)` (and `_ptsz`).
pub type FnEventRecord = unsafe extern "C" fn(CUevent, CUstream) -> CUresult;
/// `CUresult cuEventQuery(CUevent hEvent)`.
pub type FnEventQuery = unsafe extern "C" fn(CUevent) -> CUresult;
/// `CUresult cuEventElapsedTime(float *pMilliseconds, CUevent hStart, CUevent hEnd)` (and
/// `_v2`).
pub type FnEventElapsedTime = unsafe extern "C" fn(*mut f32, CUevent, CUevent) -> CUresult;
/// `CUresult cuGraphGetNodes(CUgraph hGraph, CUgraphNode *nodes, size_t *numNodes)`.
pub type FnGraphGetNodes = unsafe extern "C" fn(CUgraph, *mut CUgraphNode, *mut usize) -> CUresult;
/// `CUresult cuGraphNodeGetType(CUgraphNode hNode, CUgraphNodeType *type)`.
pub type FnGraphNodeGetType = unsafe extern "C" fn(CUgraphNode, *mut c_int) -> CUresult;
/// `CUresult cuGraphMemAllocNodeGetParams(CUgraphNode hNode, CUDA_MEM_ALLOC_NODE_PARAMS
/// *params_out)`.
pub type FnGraphMemAllocNodeGetParams =
    unsafe extern "C" fn(CUgraphNode, *mut CUDA_MEM_ALLOC_NODE_PARAMS) -> CUresult;
/// `CUresult cuGraphMemFreeNodeGetParams(CUgraphNode hNode, CUdeviceptr *dptr_out)`.
pub type FnGraphMemFreeNodeGetParams =
    unsafe extern "C" fn(CUgraphNode, *mut CUdeviceptr) -> CUresult;
/// `CUresult cuDeviceGetGraphMemAttribute(CUdevice device, CUgraphMem_attribute attr, void
/// *value)` (value `cuuint64_t`).
pub type FnDeviceGetGraphMemAttribute =
    unsafe extern "C" fn(CUdevice, c_int, *mut c_void) -> CUresult;
