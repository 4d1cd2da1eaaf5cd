//! `cuGetProcAddress` / `cuGetProcAddress_v2`: base name + CUDA version + flags -> the
//! exported versioned function, with the mapping the real driver 580 uses for every function
//! this fake exports (`tests/data/real-procaddr-580.txt`).

use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::OnceLock;

use crate::driver::{driver_version, R};
use crate::ffi::*;

/// One base name: `(since_version, function)` variants in ascending order, plus the
/// per-thread-default-stream variant.
struct Entry {
    name: &'static str,
    versions: Vec<(c_int, usize)>,
    ptsz: Option<(c_int, usize)>,
}

macro_rules! f {
    ($f:path) => {
        $f as *const () as usize
    };
}

fn table() -> &'static [Entry] {
    static T: OnceLock<Vec<Entry>> = OnceLock::new();
    T.get_or_init(|| {
        use crate::*;
        let e = |name, versions: Vec<(c_int, usize)>| Entry {
            name,
            versions,
            ptsz: None,
        };
        let p = |name, versions: Vec<(c_int, usize)>, ptsz: (c_int, usize)| Entry {
            name,
            versions,
            ptsz: Some(ptsz),
        };
        vec![
            e("cuInit", vec![(2000, f!(cuInit))]),
            e("cuDriverGetVersion", vec![(2020, f!(cuDriverGetVersion))]),
            e("cuGetErrorString", vec![(6000, f!(cuGetErrorString))]),
            e("cuGetErrorName", vec![(6000, f!(cuGetErrorName))]),
            e("cuDeviceGet", vec![(2000, f!(cuDeviceGet))]),
            e("cuDeviceGetCount", vec![(2000, f!(cuDeviceGetCount))]),
            e("cuDeviceGetName", vec![(2000, f!(cuDeviceGetName))]),
            e(
                "cuDeviceGetUuid",
                vec![
                    (10020, f!(cuDeviceGetUuid)),
                    (11040, f!(cuDeviceGetUuid_v2)),
                ],
            ),
            e("cuDeviceTotalMem", vec![(3020, f!(cuDeviceTotalMem_v2))]),
            e(
                "cuDeviceGetAttribute",
                vec![(2000, f!(cuDeviceGetAttribute))],
            ),
            e(
                "cuDevicePrimaryCtxRetain",
                vec![(7000, f!(cuDevicePrimaryCtxRetain))],
            ),
            e(
                "cuDevicePrimaryCtxRelease",
                vec![
                    (7000, f!(cuDevicePrimaryCtxRelease)),
                    (11000, f!(cuDevicePrimaryCtxRelease_v2)),
                ],
            ),
            e(
                "cuDevicePrimaryCtxReset",
                vec![
                    (7000, f!(cuDevicePrimaryCtxReset)),
                    (11000, f!(cuDevicePrimaryCtxReset_v2)),
                ],
            ),
            e(
                "cuDevicePrimaryCtxGetState",
                vec![(7000, f!(cuDevicePrimaryCtxGetState))],
            ),
            e(
                "cuCtxCreate",
                vec![
                    (2000, f!(cuCtxCreate)),
                    (3020, f!(cuCtxCreate_v2)),
                    (11040, f!(cuCtxCreate_v3)),
                    (12050, f!(cuCtxCreate_v4)),
                ],
            ),
            e(
                "cuCtxDestroy",
                vec![(2000, f!(cuCtxDestroy)), (4000, f!(cuCtxDestroy_v2))],
            ),
            e("cuCtxSetCurrent", vec![(4000, f!(cuCtxSetCurrent))]),
            e("cuCtxGetCurrent", vec![(4000, f!(cuCtxGetCurrent))]),
            e(
                "cuCtxGetDevice",
                vec![(2000, f!(cuCtxGetDevice)), (13000, f!(cuCtxGetDevice_v2))],
            ),
            e(
                "cuCtxPushCurrent",
                vec![
                    (2000, f!(cuCtxPushCurrent)),
                    (4000, f!(cuCtxPushCurrent_v2)),
                ],
            ),
            e(
                "cuCtxPopCurrent",
                vec![(2000, f!(cuCtxPopCurrent)), (4000, f!(cuCtxPopCurrent_v2))],
            ),
            e(
                "cuCtxSynchronize",
                vec![
                    (2000, f!(cuCtxSynchronize)),
                    (13000, f!(cuCtxSynchronize_v2)),
                ],
            ),
            e("cuMemAlloc", vec![(3020, f!(cuMemAlloc_v2))]),
            e("cuMemFree", vec![(3020, f!(cuMemFree_v2))]),
            e("cuMemGetInfo", vec![(3020, f!(cuMemGetInfo_v2))]),
            e("cuMemAllocPitch", vec![(3020, f!(cuMemAllocPitch_v2))]),
            e(
                "cuMemGetAddressRange",
                vec![(3020, f!(cuMemGetAddressRange_v2))],
            ),
            e("cuMemAllocManaged", vec![(6000, f!(cuMemAllocManaged))]),
            p(
                "cuMemAllocAsync",
                vec![(11020, f!(cuMemAllocAsync))],
                (11020, f!(cuMemAllocAsync_ptsz)),
            ),
            p(
                "cuMemFreeAsync",
                vec![(11020, f!(cuMemFreeAsync))],
                (11020, f!(cuMemFreeAsync_ptsz)),
            ),
            p(
                "cuMemAllocFromPoolAsync",
                vec![(11020, f!(cuMemAllocFromPoolAsync))],
                (11020, f!(cuMemAllocFromPoolAsync_ptsz)),
            ),
            e("cuMemPoolCreate", vec![(11020, f!(cuMemPoolCreate))]),
            e("cuMemPoolDestroy", vec![(11020, f!(cuMemPoolDestroy))]),
            e(
                "cuDeviceGetDefaultMemPool",
                vec![(11020, f!(cuDeviceGetDefaultMemPool))],
            ),
            e("cuMemCreate", vec![(10020, f!(cuMemCreate))]),
            e("cuMemRelease", vec![(10020, f!(cuMemRelease))]),
            e(
                "cuMemAddressReserve",
                vec![(10020, f!(cuMemAddressReserve))],
            ),
            e("cuMemAddressFree", vec![(10020, f!(cuMemAddressFree))]),
            e("cuMemMap", vec![(10020, f!(cuMemMap))]),
            e(
                "cuMemRetainAllocationHandle",
                vec![(11000, f!(cuMemRetainAllocationHandle))],
            ),
            e("cuMemUnmap", vec![(10020, f!(cuMemUnmap))]),
            e("cuMemSetAccess", vec![(10020, f!(cuMemSetAccess))]),
            e(
                "cuMemGetAllocationGranularity",
                vec![(10020, f!(cuMemGetAllocationGranularity))],
            ),
            e("cuArrayCreate", vec![(3020, f!(cuArrayCreate_v2))]),
            e("cuArray3DCreate", vec![(3020, f!(cuArray3DCreate_v2))]),
            e("cuArrayDestroy", vec![(2000, f!(cuArrayDestroy))]),
            e("cuStreamCreate", vec![(2000, f!(cuStreamCreate))]),
            e(
                "cuStreamDestroy",
                vec![(2000, f!(cuStreamDestroy)), (4000, f!(cuStreamDestroy_v2))],
            ),
            p(
                "cuStreamSynchronize",
                vec![(2000, f!(cuStreamSynchronize))],
                (7000, f!(cuStreamSynchronize_ptsz)),
            ),
            e("cuModuleLoadData", vec![(2000, f!(cuModuleLoadData))]),
            e("cuModuleUnload", vec![(2000, f!(cuModuleUnload))]),
            e("cuModuleLoad", vec![(2000, f!(cuModuleLoad))]),
            e("cuModuleLoadDataEx", vec![(2010, f!(cuModuleLoadDataEx))]),
            e(
                "cuModuleLoadFatBinary",
                vec![(2000, f!(cuModuleLoadFatBinary))],
            ),
            e("cuModuleGetFunction", vec![(2000, f!(cuModuleGetFunction))]),
            e("cuModuleGetGlobal", vec![(3020, f!(cuModuleGetGlobal_v2))]),
            e("cuLibraryGetGlobal", vec![(12000, f!(cuLibraryGetGlobal))]),
            e("cuLibraryGetModule", vec![(12000, f!(cuLibraryGetModule))]),
            e("cuLibraryLoadData", vec![(12000, f!(cuLibraryLoadData))]),
            e(
                "cuLibraryLoadFromFile",
                vec![(12000, f!(cuLibraryLoadFromFile))],
            ),
            e("cuLibraryUnload", vec![(12000, f!(cuLibraryUnload))]),
            e("cuLibraryGetKernel", vec![(12000, f!(cuLibraryGetKernel))]),
            e(
                "cuKernelGetFunction",
                vec![(12000, f!(cuKernelGetFunction))],
            ),
            e("cuCtxSetLimit", vec![(3010, f!(cuCtxSetLimit))]),
            e("cuCtxGetLimit", vec![(3010, f!(cuCtxGetLimit))]),
            e("cuFuncGetAttribute", vec![(2020, f!(cuFuncGetAttribute))]),
            e(
                "cuKernelGetAttribute",
                vec![(12000, f!(cuKernelGetAttribute))],
            ),
            p(
                "cuLaunchKernel",
                vec![(4000, f!(cuLaunchKernel))],
                (7000, f!(cuLaunchKernel_ptsz)),
            ),
            p(
                "cuLaunchKernelEx",
                vec![(11060, f!(cuLaunchKernelEx))],
                (11060, f!(cuLaunchKernelEx_ptsz)),
            ),
            e("cuEventCreate", vec![(2000, f!(cuEventCreate))]),
            p(
                "cuEventRecord",
                vec![(2000, f!(cuEventRecord))],
                (7000, f!(cuEventRecord_ptsz)),
            ),
            e("cuEventSynchronize", vec![(2000, f!(cuEventSynchronize))]),
            e("cuEventQuery", vec![(2000, f!(cuEventQuery))]),
            p(
                "cuEventRecordWithFlags",
                vec![(11010, f!(cuEventRecordWithFlags))],
                (11010, f!(cuEventRecordWithFlags_ptsz)),
            ),
            p(
                "cuStreamWaitEvent",
                vec![(3020, f!(cuStreamWaitEvent))],
                (7000, f!(cuStreamWaitEvent_ptsz)),
            ),
            e(
                "cuEventElapsedTime",
                vec![
                    (2000, f!(cuEventElapsedTime)),
                    (12080, f!(cuEventElapsedTime_v2)),
                ],
            ),
            p(
                "cuStreamQuery",
                vec![(2000, f!(cuStreamQuery))],
                (7000, f!(cuStreamQuery_ptsz)),
            ),
            p(
                "cuLaunchCooperativeKernel",
                vec![(9000, f!(cuLaunchCooperativeKernel))],
                (9000, f!(cuLaunchCooperativeKernel_ptsz)),
            ),
            e(
                "cuGraphInstantiate",
                vec![
                    (11000, f!(cuGraphInstantiate_v2)),
                    (12000, f!(cuGraphInstantiateWithFlags)),
                ],
            ),
            e(
                "cuGraphInstantiateWithFlags",
                vec![(11040, f!(cuGraphInstantiateWithFlags))],
            ),
            p(
                "cuGraphLaunch",
                vec![(10000, f!(cuGraphLaunch))],
                (10000, f!(cuGraphLaunch_ptsz)),
            ),
            e("cuGraphExecDestroy", vec![(10000, f!(cuGraphExecDestroy))]),
            e("cuGraphDestroy", vec![(10000, f!(cuGraphDestroy))]),
            e("cuEventDestroy", vec![(4000, f!(cuEventDestroy_v2))]),
            p(
                "cuStreamIsCapturing",
                vec![(10000, f!(cuStreamIsCapturing))],
                (10000, f!(cuStreamIsCapturing_ptsz)),
            ),
            e(
                "cuStreamBeginCapture",
                vec![(11000, f!(cuStreamBeginCapture_v2))],
            ),
            e("cuStreamEndCapture", vec![(10000, f!(cuStreamEndCapture))]),
            e("cuStreamCreate", vec![(2000, f!(cuStreamCreate))]),
            e("cuDeviceGetMemPool", vec![(11020, f!(cuDeviceGetMemPool))]),
            e("cuDeviceSetMemPool", vec![(11020, f!(cuDeviceSetMemPool))]),
            e("cuMemPoolTrimTo", vec![(11020, f!(cuMemPoolTrimTo))]),
            e(
                "cuMemPoolGetAttribute",
                vec![(11020, f!(cuMemPoolGetAttribute))],
            ),
            e(
                "cuMemPoolSetAttribute",
                vec![(11020, f!(cuMemPoolSetAttribute))],
            ),
            e(
                "cuMipmappedArrayCreate",
                vec![(5000, f!(cuMipmappedArrayCreate))],
            ),
            e(
                "cuMipmappedArrayDestroy",
                vec![(5000, f!(cuMipmappedArrayDestroy))],
            ),
            e(
                "cuGetProcAddress",
                vec![
                    (11030, f!(cuGetProcAddress)),
                    (12000, f!(cuGetProcAddress_v2)),
                ],
            ),
        ]
    })
}

/// Looks `name` up: `Ok(fn)`, or `Err(status)` (`SYMBOL_NOT_FOUND` / `VERSION_NOT_SUFFICIENT`).
pub fn lookup(name: &[u8], version: c_int, flags: u64) -> Result<usize, c_int> {
    let Some(e) = table().iter().find(|e| e.name.as_bytes() == name) else {
        return Err(CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
    };
    if flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM != 0 {
        if let Some((since, f)) = e.ptsz {
            return if version >= since {
                Ok(f)
            } else {
                Err(CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT)
            };
        }
    }
    e.versions
        .iter()
        .rev()
        .find(|(since, _)| version >= *since)
        .map(|&(_, f)| f)
        .ok_or(CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT)
}

/// Both entry points. `status` is `None` for the 4-argument `cuGetProcAddress`, which (as
/// measured) fails with `CUDA_ERROR_NOT_FOUND` and leaves `*pfn` alone when nothing matches;
/// `cuGetProcAddress_v2` succeeds with `*pfn = NULL` and reports why in `*symbolStatus`.
pub fn get_proc_address(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
    status: Option<*mut c_int>,
) -> R<()> {
    // The real driver crashes on a NULL symbol or pfn; the fake reports them instead.
    if symbol.is_null() || pfn.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    if version > driver_version() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: checked non-NULL; the C contract makes it a NUL-terminated string.
    let name = unsafe { CStr::from_ptr(symbol) }.to_bytes();
    let found = lookup(name, version, flags);
    match status {
        None => {
            let f = found.map_err(|_| CUDA_ERROR_NOT_FOUND)?;
            // SAFETY: checked non-NULL; C contract.
            unsafe { pfn.write(f as *mut c_void) };
            Ok(())
        }
        Some(st) => {
            let (f, code) = match found {
                Ok(f) => (f, CU_GET_PROC_ADDRESS_SUCCESS),
                Err(code) => (0, code),
            };
            // SAFETY: checked non-NULL; C contract.
            unsafe { pfn.write(f as *mut c_void) };
            if !st.is_null() {
                // SAFETY: non-NULL; C contract.
                unsafe { st.write(code) };
            }
            Ok(())
        }
    }
}
