//! The one list of driver functions hami-rs intercepts: which the preload hooks, which the
//! agent's eBPF programs probe, and the [`EventKind`] each probe reports.
//!
//! Every other list is derived from [`INTERCEPTS`] or checked against it when it is built:
//! * `hami-preload/src/symbols.rs`: the `symbol_table!` macro asserts (at compile time) that
//!   its hooked entries are exactly the rows with `hooked: true` of their library.
//! * `hami-ebpf/src/main.rs`: the `probes!` macro takes each program's slot and event kind
//!   from here ([`probe_slot`], [`probe_kind`]), so a program for a function not listed as
//!   probed does not compile, and it asserts that every probed row has a program.
//! * `hami-user`: `probes::PROBED_SYMBOLS` is [`PROBED_NAMES`]; event names in logs and
//!   metrics are [`EventKind::name`].
//!
//! Adding a function: see `docs/contributing.md`.

use crate::event::EventKind;

/// The library that exports an intercepted function.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Library {
    /// `libcuda.so.1`, the CUDA driver API.
    Cuda,
    /// `libnvidia-ml.so.1`, NVML.
    Nvml,
}

/// One intercepted function.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Intercept {
    /// Exported symbol name (versioned, e.g. `cuMemAlloc_v2`).
    pub name: &'static str,
    /// The library that exports it.
    pub lib: Library,
    /// Whether `hami-preload` exports a hook of this name.
    pub hooked: bool,
    /// The event the agent's probe on this function sends, or `None` if it is not probed.
    /// Probed functions have an entry program named like the symbol and a return program
    /// named `<symbol>_ret` in `hami-ebpf`.
    pub probe: Option<EventKind>,
}

impl Intercept {
    /// Whether the agent probes this function.
    pub const fn is_probed(&self) -> bool {
        self.probe.is_some()
    }
}

/// A CUDA driver function hooked by the preload and probed by the agent.
const fn both(name: &'static str, kind: EventKind) -> Intercept {
    Intercept {
        name,
        lib: Library::Cuda,
        hooked: true,
        probe: Some(kind),
    }
}

/// A CUDA driver function only the preload hooks.
const fn hook(name: &'static str) -> Intercept {
    Intercept {
        name,
        lib: Library::Cuda,
        hooked: true,
        probe: None,
    }
}

/// A CUDA driver function only the agent probes.
const fn probe(name: &'static str, kind: EventKind) -> Intercept {
    Intercept {
        name,
        lib: Library::Cuda,
        hooked: false,
        probe: Some(kind),
    }
}

/// An NVML function the preload hooks (the agent probes no NVML function).
const fn nvml_hook(name: &'static str) -> Intercept {
    Intercept {
        name,
        lib: Library::Nvml,
        hooked: true,
        probe: None,
    }
}

/// Every intercepted function. The probed rows' order gives the eBPF programs their slot
/// numbers ([`probe_slot`]); otherwise order does not matter.
pub const INTERCEPTS: &[Intercept] = &[
    // Allocations.
    both("cuMemAlloc_v2", EventKind::MemAlloc),
    both("cuMemAllocPitch_v2", EventKind::MemAllocPitch),
    both("cuMemAllocManaged", EventKind::MemAllocManaged),
    both("cuMemAllocAsync", EventKind::MemAllocAsync),
    both("cuMemAllocAsync_ptsz", EventKind::MemAllocAsync),
    both("cuMemAllocFromPoolAsync", EventKind::MemAllocFromPool),
    both("cuMemAllocFromPoolAsync_ptsz", EventKind::MemAllocFromPool),
    both("cuMemCreate", EventKind::MemCreate),
    both("cuArrayCreate_v2", EventKind::ArrayCreate),
    both("cuArray3DCreate_v2", EventKind::Array3DCreate),
    // Releases.
    both("cuMemFree_v2", EventKind::MemFree),
    both("cuMemFreeAsync", EventKind::MemFreeAsync),
    both("cuMemFreeAsync_ptsz", EventKind::MemFreeAsync),
    both("cuMemRelease", EventKind::MemRelease),
    both("cuArrayDestroy", EventKind::ArrayDestroy),
    // Contexts.
    both("cuCtxCreate_v2", EventKind::CtxCreate),
    both("cuCtxCreate_v3", EventKind::CtxCreate),
    both("cuCtxCreate_v4", EventKind::CtxCreate),
    both("cuCtxDestroy_v2", EventKind::CtxDestroy),
    both("cuDevicePrimaryCtxRetain", EventKind::PrimaryCtxRetain),
    both("cuDevicePrimaryCtxRelease", EventKind::PrimaryCtxRelease),
    both("cuDevicePrimaryCtxRelease_v2", EventKind::PrimaryCtxRelease),
    probe("cuCtxSetCurrent", EventKind::CtxSetCurrent),
    hook("cuDevicePrimaryCtxReset"),
    hook("cuDevicePrimaryCtxReset_v2"),
    hook("cuCtxCreate"),
    hook("cuCtxDestroy"),
    // Memory queries (answered within the limit).
    hook("cuMemGetInfo_v2"),
    hook("cuDeviceTotalMem_v2"),
    // Function lookup (hands out our hooks for the functions above).
    hook("cuGetProcAddress"),
    hook("cuGetProcAddress_v2"),
    // Stream-ordered pools: their reservation is charged (hami-preload/src/pools.rs).
    hook("cuMemPoolCreate"),
    hook("cuMemPoolDestroy"),
    hook("cuMemPoolTrimTo"),
    hook("cuMemPoolSetAttribute"),
    hook("cuDeviceGetDefaultMemPool"),
    hook("cuDeviceGetMemPool"),
    // Synchronisations, where pools under their release threshold give memory back.
    hook("cuStreamSynchronize"),
    hook("cuStreamSynchronize_ptsz"),
    hook("cuCtxSynchronize"),
    hook("cuCtxSynchronize_v2"),
    hook("cuEventSynchronize"),
    // Mipmapped arrays.
    hook("cuMipmappedArrayCreate"),
    hook("cuMipmappedArrayDestroy"),
    // Module and library memory, eager (at load) and lazy (first lookup, first launch).
    hook("cuModuleLoad"),
    hook("cuModuleLoadData"),
    hook("cuModuleLoadDataEx"),
    hook("cuModuleLoadFatBinary"),
    hook("cuModuleUnload"),
    hook("cuModuleGetFunction"),
    hook("cuLibraryLoadData"),
    hook("cuLibraryLoadFromFile"),
    hook("cuLibraryUnload"),
    hook("cuLibraryGetKernel"),
    hook("cuKernelGetFunction"),
    hook("cuModuleGetGlobal_v2"),
    hook("cuLibraryGetGlobal"),
    hook("cuLibraryGetModule"),
    hook("cuLaunchKernel"),
    hook("cuLaunchKernel_ptsz"),
    hook("cuLaunchKernelEx"),
    hook("cuLaunchKernelEx_ptsz"),
    // Context limits: the stack, heap and printf FIFO they reserve (hami-preload/src/lmem.rs).
    hook("cuCtxSetLimit"),
    // The launch gate (compute share): the other kernel submissions.
    hook("cuLaunchCooperativeKernel"),
    hook("cuLaunchCooperativeKernel_ptsz"),
    hook("cuGraphLaunch"),
    hook("cuGraphLaunch_ptsz"),
    nvml_hook("nvmlDeviceGetMemoryInfo"),
    nvml_hook("nvmlDeviceGetMemoryInfo_v2"),
    // NVML's process lists: the container's own processes (issue 20).
    nvml_hook("nvmlDeviceGetComputeRunningProcesses"),
    nvml_hook("nvmlDeviceGetComputeRunningProcesses_v2"),
    nvml_hook("nvmlDeviceGetComputeRunningProcesses_v3"),
    nvml_hook("nvmlDeviceGetGraphicsRunningProcesses"),
    nvml_hook("nvmlDeviceGetGraphicsRunningProcesses_v2"),
    nvml_hook("nvmlDeviceGetGraphicsRunningProcesses_v3"),
    nvml_hook("nvmlDeviceGetMPSComputeRunningProcesses"),
    nvml_hook("nvmlDeviceGetMPSComputeRunningProcesses_v2"),
    nvml_hook("nvmlDeviceGetMPSComputeRunningProcesses_v3"),
    nvml_hook("nvmlDeviceGetRunningProcessDetailList"),
];

/// `a == b`, usable in constants.
pub const fn str_eq(a: &str, b: &str) -> bool {
    bytes_eq(a.as_bytes(), b.as_bytes())
}

/// `a == b`, usable in constants.
pub const fn bytes_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

/// The row of `name`, if it is intercepted.
pub const fn find(name: &str) -> Option<&'static Intercept> {
    let mut i = 0;
    while i < INTERCEPTS.len() {
        if str_eq(INTERCEPTS[i].name, name) {
            return Some(&INTERCEPTS[i]);
        }
        i += 1;
    }
    None
}

/// Whether the preload hooks `name` (as bytes, e.g. from a `CStr`) of library `lib`.
pub const fn is_hooked(lib: Library, name: &[u8]) -> bool {
    let mut i = 0;
    while i < INTERCEPTS.len() {
        let row = &INTERCEPTS[i];
        if row.hooked && lib as u8 == row.lib as u8 && bytes_eq(row.name.as_bytes(), name) {
            return true;
        }
        i += 1;
    }
    false
}

/// Number of functions of `lib` the preload hooks.
pub const fn hooked_count(lib: Library) -> usize {
    let mut n = 0;
    let mut i = 0;
    while i < INTERCEPTS.len() {
        if INTERCEPTS[i].hooked && lib as u8 == INTERCEPTS[i].lib as u8 {
            n += 1;
        }
        i += 1;
    }
    n
}

/// Number of probed functions.
pub const PROBED_COUNT: usize = {
    let mut n = 0;
    let mut i = 0;
    while i < INTERCEPTS.len() {
        if INTERCEPTS[i].is_probed() {
            n += 1;
        }
        i += 1;
    }
    n
};

/// The probed functions' names, in slot order (`PROBED_NAMES[s - 1]` has slot `s`).
pub const PROBED_NAMES: [&str; PROBED_COUNT] = {
    let mut out = [""; PROBED_COUNT];
    let mut n = 0;
    let mut i = 0;
    while i < INTERCEPTS.len() {
        if INTERCEPTS[i].is_probed() {
            out[n] = INTERCEPTS[i].name;
            n += 1;
        }
        i += 1;
    }
    out
};

/// The eBPF slot of probed function `name`: 1 + its position among the probed rows. It keys
/// the arguments an entry program saves for its return program, so it is unique per
/// function and below 256 (see `hami-ebpf`).
///
/// # Panics
/// If `name` is not a probed row (at compile time when used in a constant).
pub const fn probe_slot(name: &str) -> u64 {
    let mut i = 0;
    while i < PROBED_COUNT {
        if str_eq(PROBED_NAMES[i], name) {
            return i as u64 + 1;
        }
        i += 1;
    }
    panic!("not a probed function of hami_common::intercept::INTERCEPTS")
}

/// The event kind the probe of `name` sends.
///
/// # Panics
/// If `name` is not a probed row (at compile time when used in a constant).
pub const fn probe_kind(name: &str) -> EventKind {
    match find(name) {
        Some(Intercept {
            probe: Some(kind), ..
        }) => *kind,
        _ => panic!("not a probed function of hami_common::intercept::INTERCEPTS"),
    }
}

// Slots are the low 8 bits of the eBPF programs' keys.
const _: () = assert!(
    PROBED_COUNT < 256,
    "too many probed functions for 8-bit slots"
);

// Names are unique, and each row is hooked, probed or both.
const _: () = {
    let mut i = 0;
    while i < INTERCEPTS.len() {
        assert!(
            INTERCEPTS[i].hooked || INTERCEPTS[i].is_probed(),
            "a row of INTERCEPTS is neither hooked nor probed"
        );
        let mut j = i + 1;
        while j < INTERCEPTS.len() {
            assert!(
                !str_eq(INTERCEPTS[i].name, INTERCEPTS[j].name),
                "a name appears twice in INTERCEPTS"
            );
            j += 1;
        }
        i += 1;
    }
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_follow_the_probed_rows_and_start_at_one() {
        assert_eq!(probe_slot("cuMemAlloc_v2"), 1);
        assert_eq!(probe_slot("cuArray3DCreate_v2"), 10);
        assert_eq!(probe_slot("cuCtxSetCurrent"), 23);
        for (i, name) in PROBED_NAMES.iter().enumerate() {
            assert_eq!(probe_slot(name), i as u64 + 1);
        }
    }

    #[test]
    fn probe_kinds_come_from_the_rows() {
        assert_eq!(probe_kind("cuMemAllocAsync_ptsz"), EventKind::MemAllocAsync);
        assert_eq!(probe_kind("cuCtxCreate_v4"), EventKind::CtxCreate);
        for row in INTERCEPTS.iter().filter(|r| r.is_probed()) {
            assert_eq!(Some(probe_kind(row.name)), row.probe);
            // Probes report allocations, frees and context changes, never process exits
            // (those come from the tracepoint).
            assert_ne!(row.probe, Some(EventKind::ProcessExit));
        }
    }

    #[test]
    #[should_panic(expected = "not a probed function")]
    fn a_hook_only_function_has_no_slot() {
        probe_slot("cuMemGetInfo_v2");
    }

    #[test]
    fn hooked_lookup_is_per_library() {
        assert!(is_hooked(Library::Cuda, b"cuMemAlloc_v2"));
        assert!(!is_hooked(Library::Nvml, b"cuMemAlloc_v2"));
        assert!(is_hooked(Library::Nvml, b"nvmlDeviceGetMemoryInfo_v2"));
        // Probed only.
        assert!(!is_hooked(Library::Cuda, b"cuCtxSetCurrent"));
        assert!(!is_hooked(Library::Cuda, b"cuMemAlloc"));
        assert_eq!(hooked_count(Library::Nvml), 12);
        assert_eq!(
            hooked_count(Library::Cuda) + hooked_count(Library::Nvml),
            INTERCEPTS.iter().filter(|r| r.hooked).count()
        );
    }

    #[test]
    fn find_returns_the_row() {
        let row = find("cuMemCreate").expect("listed");
        assert_eq!(row.lib, Library::Cuda);
        assert!(row.hooked);
        assert_eq!(row.probe, Some(EventKind::MemCreate));
        assert!(find("cuMemcpy").is_none());
    }
}
