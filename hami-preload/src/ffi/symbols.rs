//! The symbol tables of the two libraries the preload reaches: each symbol's name and
//! (through [`crate::ffi::real`]) the real function's address. The hooked symbols come first,
//! generated from the rows with `hooked: true` of [`hami_abi::intercept::INTERCEPTS`]
//! (`build/hooked_rows.rs`); the helpers, functions the preload only calls, follow, listed
//! here. Our hooks' addresses are in `crate::hooks::table`, so that this module, which only
//! resolves the real driver, does not depend on the hooks.

use crate::ffi::real::{LazyLib, RealLib};
use hami_abi::intercept::{self, Library};
use std::ffi::{c_void, CStr};

// `cuda_hooked!` and `nvml_hooked!`: the hooked rows' names, from the build script.
include!(concat!(env!("OUT_DIR"), "/hooked_rows.rs"));

/// Defines the symbol table of one library:
///
/// `LIB, Enum, NAMES, HOOKED, soname, probe symbol, intercept::Library;`
/// `helpers { symbol, ... } hooked { symbol, ... }`
///
/// Each variant of `Enum` is named like its symbol (`Cu::cuMemAlloc_v2`), so a hook finds its
/// real function by its own name. The hooked entries come from `cuda_hooked!` /
/// `nvml_hooked!` and are placed first.
macro_rules! symbol_table {
    (
        $lib:ident, $enum:ident, $names:ident, $hooked:ident, $soname:literal,
        $probe:literal, $library:expr;
        helpers { $($id:ident,)* }
        hooked { $($hid:ident,)* }
    ) => {
        /// Symbols of the library, named like the symbol: hooked ones first, then helpers
        /// we only call.
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        #[repr(usize)]
        #[allow(non_camel_case_types)]
        pub enum $enum { $($hid,)* $($id,)* }
        /// Names, indexed by the enum.
        pub static $names: &[&CStr] = &[
            $(c_name(concat!(stringify!($hid), "\0")),)*
            $(c_name(concat!(stringify!($id), "\0")),)*
        ];
        /// Number of hooked symbols (the first entries of the table).
        pub const $hooked: usize = [$(stringify!($hid),)*].len();
        /// The lazily resolved library.
        pub static $lib: LazyLib = LazyLib::new($soname, $probe, $names);

        const _: () = check_hooked($library, &[$(stringify!($hid),)*], &[$(stringify!($id),)*]);
    };
}

/// `name` (which ends in NUL) as a C string, in constants.
const fn c_name(name: &'static str) -> &'static CStr {
    match CStr::from_bytes_with_nul(name.as_bytes()) {
        Ok(c) => c,
        Err(_) => panic!("a symbol name contains a NUL byte"),
    }
}

/// Compile-time check that `hooked` are exactly the hooked rows of `lib` in
/// [`INTERCEPTS`](hami_abi::intercept::INTERCEPTS), each once (what the build script
/// generated), and that no helper is one of them.
const fn check_hooked(lib: Library, hooked: &[&str], helpers: &[&str]) {
    let mut i = 0;
    while i < hooked.len() {
        assert!(
            intercept::is_hooked(lib, hooked[i].as_bytes()),
            "a hooked symbol is not a hooked row of hami_abi::intercept::INTERCEPTS"
        );
        let mut j = i + 1;
        while j < hooked.len() {
            assert!(
                !intercept::str_eq(hooked[i], hooked[j]),
                "a hooked symbol appears twice"
            );
            j += 1;
        }
        i += 1;
    }
    assert!(
        hooked.len() == intercept::hooked_count(lib),
        "a hooked row of hami_abi::intercept::INTERCEPTS is missing from the symbol table"
    );
    let mut i = 0;
    while i < helpers.len() {
        assert!(
            !intercept::is_hooked(lib, helpers[i].as_bytes()),
            "a helper of symbol_table! is a hooked row: it is in the generated section already"
        );
        i += 1;
    }
}

cuda_hooked! {
    symbol_table! {
        CUDA, Cu, CU_NAMES, CU_HOOKED, c"libcuda.so.1", c"cuInit", Library::Cuda;
        helpers {
            cuInit,
            cuDeviceGetCount,
            cuDeviceGetUuid,
            cuDeviceGetUuid_v2,
            cuDeviceGetAttribute,
            cuCtxGetDevice,
            cuCtxGetCurrent,
            cuCtxPushCurrent_v2,
            cuCtxPopCurrent_v2,
            cuMemPoolGetAttribute,
            cuStreamIsCapturing,
            cuDriverGetVersion,
            cuCtxGetLimit,
            cuFuncGetAttribute,
            cuKernelGetAttribute,
            cuStreamIsCapturing_ptsz,
            cuEventCreate,
            cuEventDestroy_v2,
            cuEventRecord,
            cuEventRecord_ptsz,
            cuEventQuery,
            cuEventElapsedTime,
            cuEventElapsedTime_v2,
            cuThreadExchangeStreamCaptureMode,
            cuGraphGetNodes,
            cuGraphNodeGetType,
            cuGraphMemAllocNodeGetParams,
            cuGraphMemFreeNodeGetParams,
            cuDeviceGetGraphMemAttribute,
        }
    }
}

nvml_hooked! {
    symbol_table! {
        NVML, Nv, NV_NAMES, NV_HOOKED, c"libnvidia-ml.so.1", c"nvmlInit_v2", Library::Nvml;
        helpers {
            nvmlInit_v2,
            nvmlDeviceGetUUID,
            nvmlDeviceGetHandleByUUID,
            nvmlDeviceGetCount_v2,
            nvmlDeviceGetHandleByIndex_v2,
            nvmlSystemGetDriverVersion,
        }
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

/// If `addr` is the real address of a hooked CUDA function in `lib`, its index (the hook
/// for it: `crate::hooks::table::cu_hook_for_real`).
pub fn cu_hooked_real_index(lib: &RealLib, addr: *mut c_void) -> Option<usize> {
    if addr.is_null() {
        return None;
    }
    (0..CU_HOOKED).find(|&i| lib.get(i) == addr)
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

    #[test]
    fn names_are_the_variants_and_hooked_ones_come_first() {
        assert_eq!(CU_NAMES[Cu::cuMemAlloc_v2 as usize], c"cuMemAlloc_v2");
        assert_eq!(
            CU_NAMES[Cu::cuGetProcAddress_v2 as usize],
            c"cuGetProcAddress_v2"
        );
        assert_eq!(
            NV_NAMES[Nv::nvmlDeviceGetMemoryInfo_v2 as usize],
            c"nvmlDeviceGetMemoryInfo_v2"
        );
        assert_eq!(CU_NAMES[Cu::cuInit as usize], c"cuInit");
        assert!(
            (Cu::cuInit as usize) >= CU_HOOKED,
            "helpers follow the hooked entries"
        );
        assert!((Nv::nvmlInit_v2 as usize) >= NV_HOOKED);
        assert_eq!(
            cu_hooked_index(b"cuMemAlloc_v2"),
            Some(Cu::cuMemAlloc_v2 as usize)
        );
        // Functions the preload only calls, or only the agent probes, are not hooked.
        assert_eq!(cu_hooked_index(b"cuInit"), None);
        assert_eq!(cu_hooked_index(b"cuCtxSetCurrent"), None);
    }
}
