//! The tables of hooked names: name, our hook's address, and (through [`crate::real`]) the
//! real function's address. Used by all three ways of reaching the driver.

use crate::real::{LazyLib, RealLib};
use std::ffi::{c_void, CStr};

macro_rules! symbol_table {
    (
        $lib:ident, $enum:ident, $names:ident, $hooked:ident, $hook_addr:ident, $soname:literal,
        $probe:literal;
        hooked { $($hid:ident = $hname:literal => $hfn:path,)* }
        helpers { $($id:ident = $name:literal,)* }
    ) => {
        /// Symbols of the library: hooked ones first, then helpers we only call.
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        #[repr(usize)]
        #[allow(clippy::enum_variant_names)]
        pub enum $enum { $($hid,)* $($id,)* }
        /// Names, indexed by the enum.
        pub static $names: &[&CStr] = &[$($hname,)* $($name,)*];
        /// Number of hooked symbols (the first entries of the table).
        pub const $hooked: usize = [$($hname,)*].len();
        /// Our hook's address for hooked symbol `i`.
        pub fn $hook_addr(i: usize) -> *mut c_void {
            let table: &[*mut c_void] = &[$($hfn as *mut c_void,)*];
            table.get(i).copied().unwrap_or(std::ptr::null_mut())
        }
        /// The lazily resolved library.
        pub static $lib: LazyLib = LazyLib::new($soname, $probe, $names);
    };
}

symbol_table! {
    CUDA, Cu, CU_NAMES, CU_HOOKED, cu_hook_addr, c"libcuda.so.1", c"cuInit";
    hooked {
        MemAlloc = c"cuMemAlloc_v2" => crate::hooks::cuMemAlloc_v2,
        MemAllocPitch = c"cuMemAllocPitch_v2" => crate::hooks::cuMemAllocPitch_v2,
        MemAllocManaged = c"cuMemAllocManaged" => crate::hooks::cuMemAllocManaged,
        MemAllocAsync = c"cuMemAllocAsync" => crate::hooks::cuMemAllocAsync,
        MemAllocAsyncPtsz = c"cuMemAllocAsync_ptsz" => crate::hooks::cuMemAllocAsync_ptsz,
        MemAllocFromPoolAsync = c"cuMemAllocFromPoolAsync" => crate::hooks::cuMemAllocFromPoolAsync,
        MemAllocFromPoolAsyncPtsz = c"cuMemAllocFromPoolAsync_ptsz" => crate::hooks::cuMemAllocFromPoolAsync_ptsz,
        MemCreate = c"cuMemCreate" => crate::hooks::cuMemCreate,
        ArrayCreate = c"cuArrayCreate_v2" => crate::hooks::cuArrayCreate_v2,
        Array3DCreate = c"cuArray3DCreate_v2" => crate::hooks::cuArray3DCreate_v2,
        MemFree = c"cuMemFree_v2" => crate::hooks::cuMemFree_v2,
        MemFreeAsync = c"cuMemFreeAsync" => crate::hooks::cuMemFreeAsync,
        MemFreeAsyncPtsz = c"cuMemFreeAsync_ptsz" => crate::hooks::cuMemFreeAsync_ptsz,
        MemRelease = c"cuMemRelease" => crate::hooks::cuMemRelease,
        ArrayDestroy = c"cuArrayDestroy" => crate::hooks::cuArrayDestroy,
        PrimaryCtxRetain = c"cuDevicePrimaryCtxRetain" => crate::hooks::cuDevicePrimaryCtxRetain,
        PrimaryCtxRelease = c"cuDevicePrimaryCtxRelease" => crate::hooks::cuDevicePrimaryCtxRelease,
        PrimaryCtxReleaseV2 = c"cuDevicePrimaryCtxRelease_v2" => crate::hooks::cuDevicePrimaryCtxRelease_v2,
        PrimaryCtxReset = c"cuDevicePrimaryCtxReset" => crate::hooks::cuDevicePrimaryCtxReset,
        PrimaryCtxResetV2 = c"cuDevicePrimaryCtxReset_v2" => crate::hooks::cuDevicePrimaryCtxReset_v2,
        CtxCreateV1 = c"cuCtxCreate" => crate::hooks::cuCtxCreate,
        CtxCreateV2 = c"cuCtxCreate_v2" => crate::hooks::cuCtxCreate_v2,
        CtxCreateV3 = c"cuCtxCreate_v3" => crate::hooks::cuCtxCreate_v3,
        CtxCreateV4 = c"cuCtxCreate_v4" => crate::hooks::cuCtxCreate_v4,
        CtxDestroyV1 = c"cuCtxDestroy" => crate::hooks::cuCtxDestroy,
        CtxDestroyV2 = c"cuCtxDestroy_v2" => crate::hooks::cuCtxDestroy_v2,
        MemGetInfoV2 = c"cuMemGetInfo_v2" => crate::hooks::cuMemGetInfo_v2,
        DeviceTotalMemV2 = c"cuDeviceTotalMem_v2" => crate::hooks::cuDeviceTotalMem_v2,
        GetProcAddress = c"cuGetProcAddress" => crate::hooks::cuGetProcAddress,
        GetProcAddressV2 = c"cuGetProcAddress_v2" => crate::hooks::cuGetProcAddress_v2,
    }
    helpers {
        Init = c"cuInit",
        DeviceGetCount = c"cuDeviceGetCount",
        DeviceGetUuid = c"cuDeviceGetUuid",
        DeviceGetUuidV2 = c"cuDeviceGetUuid_v2",
        CtxGetDevice = c"cuCtxGetDevice",
        CtxGetCurrent = c"cuCtxGetCurrent",
        CtxPushCurrentV2 = c"cuCtxPushCurrent_v2",
        CtxPopCurrentV2 = c"cuCtxPopCurrent_v2",
    }
}

symbol_table! {
    NVML, Nv, NV_NAMES, NV_HOOKED, nv_hook_addr, c"libnvidia-ml.so.1", c"nvmlInit_v2";
    hooked {
        MemInfo = c"nvmlDeviceGetMemoryInfo" => crate::hooks::nvmlDeviceGetMemoryInfo,
        MemInfoV2 = c"nvmlDeviceGetMemoryInfo_v2" => crate::hooks::nvmlDeviceGetMemoryInfo_v2,
    }
    helpers {
        InitV2 = c"nvmlInit_v2",
        GetUuid = c"nvmlDeviceGetUUID",
        HandleByUuid = c"nvmlDeviceGetHandleByUUID",
        GetCountV2 = c"nvmlDeviceGetCount_v2",
        HandleByIndexV2 = c"nvmlDeviceGetHandleByIndex_v2",
        ProcsV3 = c"nvmlDeviceGetComputeRunningProcesses_v3",
        ProcsV2 = c"nvmlDeviceGetComputeRunningProcesses_v2",
        ProcsV1 = c"nvmlDeviceGetComputeRunningProcesses",
    }
}

/// Index of hooked CUDA symbol `name`, if we hook it.
pub fn cu_hooked_index(name: &[u8]) -> Option<usize> {
    CU_NAMES[..CU_HOOKED]
        .iter()
        .position(|n| n.to_bytes() == name)
}

/// Index of hooked NVML symbol `name`, if we hook it.
pub fn nv_hooked_index(name: &[u8]) -> Option<usize> {
    NV_NAMES[..NV_HOOKED]
        .iter()
        .position(|n| n.to_bytes() == name)
}

/// If `addr` is the real address of a hooked CUDA function, our hook for it.
pub fn cu_hook_for_real(lib: &RealLib, addr: *mut c_void) -> Option<*mut c_void> {
    if addr.is_null() {
        return None;
    }
    (0..CU_HOOKED)
        .find(|&i| lib.get(i) == addr)
        .map(cu_hook_addr)
}

/// Entry `index` of `lib` (loaded on first use) as a function pointer of type `F`, if the
/// library is there and defines it.
///
/// # Safety
/// `F` must be the function-pointer type of that entry.
#[inline]
unsafe fn typed<F: Copy>(lib: &LazyLib, index: usize) -> Option<F> {
    let p = lib.get(true)?.get(index);
    if p.is_null() {
        return None;
    }
    debug_assert_eq!(std::mem::size_of::<F>(), std::mem::size_of::<*mut c_void>());
    // SAFETY: the caller guarantees F is the function pointer type for this entry.
    Some(unsafe { std::mem::transmute_copy::<*mut c_void, F>(&p) })
}

/// The real CUDA function `sym` as a function pointer of type `F`, if the driver has it.
///
/// # Safety
/// `F` must be the function-pointer type of `sym`.
#[inline]
pub unsafe fn cu<F: Copy>(sym: Cu) -> Option<F> {
    // SAFETY: forwarded contract.
    unsafe { typed(&CUDA, sym as usize) }
}

/// The real NVML function `sym` as a function pointer of type `F`, if NVML has it.
///
/// # Safety
/// `F` must be the function-pointer type of `sym`.
#[inline]
pub unsafe fn nv<F: Copy>(sym: Nv) -> Option<F> {
    // SAFETY: forwarded contract.
    unsafe { typed(&NVML, sym as usize) }
}
