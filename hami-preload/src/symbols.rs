//! The tables of hooked names: name, our hook's address, and (through [`crate::real`]) the
//! real function's address. Used by all three ways of reaching the driver. The hooked names
//! are checked at compile time against [`hami_common::intercept::INTERCEPTS`].

use crate::real::{LazyLib, RealLib};
use hami_common::intercept::{self, Library};
use std::ffi::{c_void, CStr};

/// Define the symbol table of one library:
///
/// `LIB, Enum, NAMES, HOOKED, hook_addr, soname, probe symbol, intercept::Library;`
/// `hooked { Variant => hook_function, ... } helpers { Variant = c"name", ... }`
///
/// A hooked entry's symbol name is its hook's name (`crate::hooks::<hook_function>`, which
/// the library exports under that name). The hooked entries must be exactly the hooked rows
/// of that library in [`hami_common::intercept::INTERCEPTS`]; the build fails otherwise.
macro_rules! symbol_table {
    (
        $lib:ident, $enum:ident, $names:ident, $hooked:ident, $hook_addr:ident, $soname:literal,
        $probe:literal, $library:expr;
        hooked { $($hid:ident => $hfn:ident,)* }
        helpers { $($id:ident = $name:literal,)* }
    ) => {
        /// Symbols of the library: hooked ones first, then helpers we only call.
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        #[repr(usize)]
        #[allow(clippy::enum_variant_names)]
        pub enum $enum { $($hid,)* $($id,)* }
        /// Names, indexed by the enum.
        pub static $names: &[&CStr] = &[
            $(c_name(concat!(stringify!($hfn), "\0")),)*
            $($name,)*
        ];
        /// Number of hooked symbols (the first entries of the table).
        pub const $hooked: usize = [$(stringify!($hfn),)*].len();
        /// Our hook's address for hooked symbol `i`.
        pub fn $hook_addr(i: usize) -> *mut c_void {
            let table: &[*mut c_void] = &[$(crate::hooks::$hfn as *mut c_void,)*];
            table.get(i).copied().unwrap_or(std::ptr::null_mut())
        }
        /// The lazily resolved library.
        pub static $lib: LazyLib = LazyLib::new($soname, $probe, $names);

        const _: () = check_hooked($library, &[$(stringify!($hfn),)*]);
    };
}

/// `name` (which ends in NUL) as a C string, in constants.
const fn c_name(name: &'static str) -> &'static CStr {
    match CStr::from_bytes_with_nul(name.as_bytes()) {
        Ok(c) => c,
        Err(_) => panic!("a hooked symbol name contains a NUL byte"),
    }
}

/// Compile-time check that `names` are exactly the hooked rows of `lib` in
/// [`INTERCEPTS`](hami_common::intercept::INTERCEPTS), each once.
const fn check_hooked(lib: Library, names: &[&str]) {
    let mut i = 0;
    while i < names.len() {
        assert!(
            intercept::is_hooked(lib, names[i].as_bytes()),
            "a hook in symbol_table! is not a hooked row of hami_common::intercept::INTERCEPTS"
        );
        let mut j = i + 1;
        while j < names.len() {
            assert!(
                !intercept::str_eq(names[i], names[j]),
                "a hook appears twice in symbol_table!"
            );
            j += 1;
        }
        i += 1;
    }
    assert!(
        names.len() == intercept::hooked_count(lib),
        "a hooked row of hami_common::intercept::INTERCEPTS has no hook in symbol_table!"
    );
}

symbol_table! {
    CUDA, Cu, CU_NAMES, CU_HOOKED, cu_hook_addr, c"libcuda.so.1", c"cuInit", Library::Cuda;
    hooked {
        MemAlloc => cuMemAlloc_v2,
        MemAllocPitch => cuMemAllocPitch_v2,
        MemAllocManaged => cuMemAllocManaged,
        MemAllocAsync => cuMemAllocAsync,
        MemAllocAsyncPtsz => cuMemAllocAsync_ptsz,
        MemAllocFromPoolAsync => cuMemAllocFromPoolAsync,
        MemAllocFromPoolAsyncPtsz => cuMemAllocFromPoolAsync_ptsz,
        MemCreate => cuMemCreate,
        ArrayCreate => cuArrayCreate_v2,
        Array3DCreate => cuArray3DCreate_v2,
        MemFree => cuMemFree_v2,
        MemFreeAsync => cuMemFreeAsync,
        MemFreeAsyncPtsz => cuMemFreeAsync_ptsz,
        MemRelease => cuMemRelease,
        ArrayDestroy => cuArrayDestroy,
        PrimaryCtxRetain => cuDevicePrimaryCtxRetain,
        PrimaryCtxRelease => cuDevicePrimaryCtxRelease,
        PrimaryCtxReleaseV2 => cuDevicePrimaryCtxRelease_v2,
        PrimaryCtxReset => cuDevicePrimaryCtxReset,
        PrimaryCtxResetV2 => cuDevicePrimaryCtxReset_v2,
        CtxCreateV1 => cuCtxCreate,
        CtxCreateV2 => cuCtxCreate_v2,
        CtxCreateV3 => cuCtxCreate_v3,
        CtxCreateV4 => cuCtxCreate_v4,
        CtxDestroyV1 => cuCtxDestroy,
        CtxDestroyV2 => cuCtxDestroy_v2,
        MemGetInfoV2 => cuMemGetInfo_v2,
        DeviceTotalMemV2 => cuDeviceTotalMem_v2,
        GetProcAddress => cuGetProcAddress,
        GetProcAddressV2 => cuGetProcAddress_v2,
        MemPoolCreate => cuMemPoolCreate,
        MemPoolDestroy => cuMemPoolDestroy,
        MemPoolTrimTo => cuMemPoolTrimTo,
        MemPoolSetAttribute => cuMemPoolSetAttribute,
        DeviceGetDefaultMemPool => cuDeviceGetDefaultMemPool,
        DeviceGetMemPool => cuDeviceGetMemPool,
        StreamSynchronize => cuStreamSynchronize,
        StreamSynchronizePtsz => cuStreamSynchronize_ptsz,
        CtxSynchronize => cuCtxSynchronize,
        CtxSynchronizeV2 => cuCtxSynchronize_v2,
        EventSynchronize => cuEventSynchronize,
        MipmappedArrayCreate => cuMipmappedArrayCreate,
        MipmappedArrayDestroy => cuMipmappedArrayDestroy,
        ModuleLoad => cuModuleLoad,
        ModuleLoadData => cuModuleLoadData,
        ModuleLoadDataEx => cuModuleLoadDataEx,
        ModuleLoadFatBinary => cuModuleLoadFatBinary,
        ModuleUnload => cuModuleUnload,
        ModuleGetFunction => cuModuleGetFunction,
        LibraryLoadData => cuLibraryLoadData,
        LibraryLoadFromFile => cuLibraryLoadFromFile,
        LibraryUnload => cuLibraryUnload,
        LibraryGetKernel => cuLibraryGetKernel,
        KernelGetFunction => cuKernelGetFunction,
        ModuleGetGlobalV2 => cuModuleGetGlobal_v2,
        LibraryGetGlobal => cuLibraryGetGlobal,
        LibraryGetModule => cuLibraryGetModule,
        LaunchKernel => cuLaunchKernel,
        LaunchKernelPtsz => cuLaunchKernel_ptsz,
        LaunchKernelEx => cuLaunchKernelEx,
        LaunchKernelExPtsz => cuLaunchKernelEx_ptsz,
        CtxSetLimit => cuCtxSetLimit,
        LaunchCooperativeKernel => cuLaunchCooperativeKernel,
        LaunchCooperativeKernelPtsz => cuLaunchCooperativeKernel_ptsz,
        GraphLaunch => cuGraphLaunch,
        GraphLaunchPtsz => cuGraphLaunch_ptsz,
        MemMap => cuMemMap,
        MemUnmap => cuMemUnmap,
        MemAddressFree => cuMemAddressFree,
        MemRetainAllocationHandle => cuMemRetainAllocationHandle,
    }
    helpers {
        Init = c"cuInit",
        DeviceGetCount = c"cuDeviceGetCount",
        DeviceGetUuid = c"cuDeviceGetUuid",
        DeviceGetUuidV2 = c"cuDeviceGetUuid_v2",
        DeviceGetAttribute = c"cuDeviceGetAttribute",
        CtxGetDevice = c"cuCtxGetDevice",
        CtxGetCurrent = c"cuCtxGetCurrent",
        CtxPushCurrentV2 = c"cuCtxPushCurrent_v2",
        CtxPopCurrentV2 = c"cuCtxPopCurrent_v2",
        MemPoolGetAttribute = c"cuMemPoolGetAttribute",
        StreamIsCapturing = c"cuStreamIsCapturing",
        DriverGetVersion = c"cuDriverGetVersion",
        CtxGetLimit = c"cuCtxGetLimit",
        FuncGetAttribute = c"cuFuncGetAttribute",
        KernelGetAttribute = c"cuKernelGetAttribute",
        StreamIsCapturingPtsz = c"cuStreamIsCapturing_ptsz",
        EventCreate = c"cuEventCreate",
        EventDestroyV2 = c"cuEventDestroy_v2",
        EventRecord = c"cuEventRecord",
        EventRecordPtsz = c"cuEventRecord_ptsz",
        EventQuery = c"cuEventQuery",
        EventElapsedTime = c"cuEventElapsedTime",
        EventElapsedTimeV2 = c"cuEventElapsedTime_v2",
        ThreadExchangeStreamCaptureMode = c"cuThreadExchangeStreamCaptureMode",
    }
}

symbol_table! {
    NVML, Nv, NV_NAMES, NV_HOOKED, nv_hook_addr, c"libnvidia-ml.so.1", c"nvmlInit_v2",
    Library::Nvml;
    hooked {
        MemInfo => nvmlDeviceGetMemoryInfo,
        MemInfoV2 => nvmlDeviceGetMemoryInfo_v2,
        // Process lists (hooks/nvml_procs.rs); the compute ones are also read for measurement.
        ProcsV1 => nvmlDeviceGetComputeRunningProcesses,
        ProcsV2 => nvmlDeviceGetComputeRunningProcesses_v2,
        ProcsV3 => nvmlDeviceGetComputeRunningProcesses_v3,
        GraphicsV1 => nvmlDeviceGetGraphicsRunningProcesses,
        GraphicsV2 => nvmlDeviceGetGraphicsRunningProcesses_v2,
        GraphicsV3 => nvmlDeviceGetGraphicsRunningProcesses_v3,
        MpsV1 => nvmlDeviceGetMPSComputeRunningProcesses,
        MpsV2 => nvmlDeviceGetMPSComputeRunningProcesses_v2,
        MpsV3 => nvmlDeviceGetMPSComputeRunningProcesses_v3,
        DetailList => nvmlDeviceGetRunningProcessDetailList,
    }
    helpers {
        InitV2 = c"nvmlInit_v2",
        GetUuid = c"nvmlDeviceGetUUID",
        HandleByUuid = c"nvmlDeviceGetHandleByUUID",
        GetCountV2 = c"nvmlDeviceGetCount_v2",
        HandleByIndexV2 = c"nvmlDeviceGetHandleByIndex_v2",
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

#[cfg(test)]
mod tests {
    use super::*;
    use hami_common::intercept::INTERCEPTS;

    /// Every hooked row of the intercept table is reachable through all three paths: by name
    /// (`dlsym`, the `*_hooked_index` lookups), and by the real address the driver hands out
    /// (`cuGetProcAddress`, [`cu_hook_for_real`]).
    #[test]
    fn every_hooked_row_has_a_hook_reachable_by_name_and_by_real_address() {
        // A fake resolved libcuda whose "real" functions are at distinct addresses.
        let fake_real = |i: usize| (0x1000 + 0x10 * i) as *mut c_void;
        let lib = RealLib {
            handle: std::ptr::null_mut(),
            fns: (0..CU_NAMES.len()).map(fake_real).collect(),
        };
        let mut hooks = Vec::new();
        for row in INTERCEPTS.iter().filter(|r| r.hooked) {
            let (index, hook) = match row.lib {
                Library::Cuda => {
                    let i = cu_hooked_index(row.name.as_bytes())
                        .unwrap_or_else(|| panic!("{} has no CUDA hook", row.name));
                    assert_eq!(
                        cu_hook_for_real(&lib, fake_real(i)),
                        Some(cu_hook_addr(i)),
                        "cuGetProcAddress would not hand out the hook of {}",
                        row.name
                    );
                    (i, cu_hook_addr(i))
                }
                Library::Nvml => {
                    let i = nv_hooked_index(row.name.as_bytes())
                        .unwrap_or_else(|| panic!("{} has no NVML hook", row.name));
                    (i, nv_hook_addr(i))
                }
            };
            assert!(!hook.is_null(), "{} (entry {index})", row.name);
            assert!(!hooks.contains(&hook), "{} shares a hook", row.name);
            hooks.push(hook);
        }
        assert_eq!(hooks.len(), CU_HOOKED + NV_HOOKED);
        // Functions the preload only calls, or only the agent probes, are not handed out.
        assert_eq!(cu_hooked_index(b"cuInit"), None);
        assert_eq!(cu_hooked_index(b"cuCtxSetCurrent"), None);
        assert_eq!(cu_hook_for_real(&lib, fake_real(Cu::Init as usize)), None);
        assert_eq!(cu_hook_for_real(&lib, std::ptr::null_mut()), None);
    }

    #[test]
    fn hooked_names_are_the_hook_functions_names() {
        assert_eq!(CU_NAMES[Cu::MemAlloc as usize], c"cuMemAlloc_v2");
        assert_eq!(
            CU_NAMES[Cu::GetProcAddressV2 as usize],
            c"cuGetProcAddress_v2"
        );
        assert_eq!(
            NV_NAMES[Nv::MemInfoV2 as usize],
            c"nvmlDeviceGetMemoryInfo_v2"
        );
        assert_eq!(CU_NAMES[Cu::Init as usize], c"cuInit");
    }
}
