//! Our hooks' addresses, indexed like the hooked entries of the symbol tables
//! ([`crate::ffi::symbols`]), both generated from the hooked rows of
//! [`hami_abi::intercept::INTERCEPTS`]: what `dlsym` and `cuGetProcAddress` hand out. A
//! hooked row without a hook of its name in [`crate::hooks`] does not compile.

use crate::ffi::real::RealLib;
use crate::ffi::symbols::{self, cuda_hooked, nvml_hooked};
use std::ffi::c_void;

/// Defines `$addr(i)`: our hook for hooked symbol `i` of one library.
macro_rules! hook_table {
    ($(#[$doc:meta])* $addr:ident; hooked { $($h:ident,)* }) => {
        $(#[$doc])*
        pub fn $addr(i: usize) -> *mut c_void {
            let table: &[*mut c_void] = &[$(crate::hooks::$h as *mut c_void,)*];
            table.get(i).copied().unwrap_or(std::ptr::null_mut())
        }
    };
}

cuda_hooked! {
    hook_table! {
        /// Our hook's address for hooked CUDA symbol `i` (`Cu::<name> as usize`).
        cu_hook_addr;
    }
}

nvml_hooked! {
    hook_table! {
        /// Our hook's address for hooked NVML symbol `i` (`Nv::<name> as usize`).
        nv_hook_addr;
    }
}

/// If `addr` is the real address of a hooked CUDA function, our hook for it.
pub fn cu_hook_for_real(lib: &RealLib, addr: *mut c_void) -> Option<*mut c_void> {
    symbols::cu_hooked_real_index(lib, addr).map(cu_hook_addr)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ffi::symbols::{
        cu_hooked_index, nv_hooked_index, Cu, CU_HOOKED, CU_NAMES, NV_HOOKED,
    };
    use hami_abi::intercept::{Library, INTERCEPTS};

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
        // The hook handed out for a name is the exported function of that name.
        assert_eq!(
            cu_hook_addr(Cu::cuMemFree_v2 as usize),
            super::super::cuMemFree_v2 as *mut c_void
        );
        assert!(cu_hook_addr(CU_HOOKED).is_null());
        // Functions the preload only calls, or only the agent probes, are not handed out.
        assert_eq!(cu_hook_for_real(&lib, fake_real(Cu::cuInit as usize)), None);
        assert_eq!(cu_hook_for_real(&lib, std::ptr::null_mut()), None);
    }
}
