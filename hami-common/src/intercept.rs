//! The one list of driver functions hami-rs intercepts, each row the whole contract of its
//! function: which library exports it, whether the preload hooks it, how the agent's eBPF
//! programs probe it ([`Probe`]: the [`EventKind`] sent and the [`Shape`] of what is read),
//! and the tracked memory it makes or releases ([`Memory`], in a [`KeySpace`]).
//!
//! Every other list is derived from [`INTERCEPTS`] or checked against it:
//! * `hami-preload`: its build script (`build/hooked_rows.rs`) generates the hooked entries
//!   of the symbol tables (`src/symbols.rs`) and the hook addresses (`src/hooks/table.rs`)
//!   from the rows with `hooked: true`, so a hooked row without a hook, or a hook without a
//!   hooked row, does not compile; the hooks take their key space from their row
//!   (`space_of!`).
//! * `hami-ebpf/src/main.rs`: the `probes!` macro takes each program's slot, event kind and
//!   shape from here ([`probe_slot`], [`probe_kind`], [`probe_shape`]), so a program for a
//!   function not listed as probed does not compile, and it asserts that every probed row
//!   has a program.
//! * `hami-user`: `probes::PROBED_SYMBOLS` is [`PROBED_NAMES`]; live allocations are keyed by
//!   [`key_space`]; event names in logs and metrics are [`EventKind::name`].
//! * tests: `hprobe.c`'s function tables are generated from it
//!   (`hami-preload/tests/support/header.rs`); the fake driver's `cuGetProcAddress` table and
//!   `hook_tests!` are checked against it (`hami-preload/tests/hooks/table.rs`), as are the
//!   eBPF smoke test's expected symbols (`hami-user/tests/agent/ebpf_smoke.rs`) and
//!   `docs/contributing.md`'s worked example (`tests::contributing_md_quotes_the_code`).
//!
//! Adding a function: see `docs/contributing.md`.

use crate::event::EventKind;
use KeySpace::{Array, Handle, Mipmap, Pointer};
use Shape::{Array2d, Array3d, CtxOut, MemCreate, Mipmapped, OutSize, Pitch, Value};

/// The library that exports an intercepted function.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Library {
    /// `libcuda.so.1`, the CUDA driver API.
    Cuda,
    /// `libnvidia-ml.so.1`, NVML.
    Nvml,
}

/// What an allocation's key names: the driver releases each through a different call, so a
/// pointer and a handle of the same value are different objects. Both the preload's
/// allocation table and the agent's live allocations key objects by `(KeySpace, u64)`.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum KeySpace {
    /// A `CUdeviceptr` (`cuMemAlloc*`, managed, pitched, stream-ordered; freed by
    /// `cuMemFree*`).
    Pointer = 0,
    /// A `CUmemGenericAllocationHandle` (`cuMemCreate`, freed by `cuMemRelease`).
    Handle = 1,
    /// A `CUarray` (`cuArray*Create`, freed by `cuArrayDestroy`).
    Array = 2,
    /// A `CUmipmappedArray` (`cuMipmappedArrayCreate`, freed only by
    /// `cuMipmappedArrayDestroy`).
    Mipmap = 3,
}

/// What a function does to device memory the accounting tracks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Memory {
    /// It makes an object of this key space (its key is what the release takes).
    Allocates(KeySpace),
    /// It releases an object of this key space.
    Releases(KeySpace),
}

impl Memory {
    /// The key space the object is released in.
    pub const fn space(self) -> KeySpace {
        match self {
            Memory::Allocates(s) | Memory::Releases(s) => s,
        }
    }
}

/// What a probe reads of its function's arguments and result: which entry and return
/// programs `hami-ebpf` runs for it (the return program also depends on the
/// [`EventKind`]). Argument positions count from 0.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shape {
    /// `(T *out, size_t size, ...)`: the object the driver wrote to `*out` (argument 0),
    /// `size` bytes (argument 1).
    OutSize,
    /// `cuMemAllocPitch_v2(CUdeviceptr *out, size_t *pitch, width, height, elem)`: the
    /// pointer, and `*pitch` times `height` (argument 3) bytes; `extra` = the pitch.
    Pitch,
    /// `cuMemCreate(handle *out, size_t size, const CUmemAllocationProp *prop, flags)`: the
    /// handle, `size` bytes, `extra` = the device of `prop->location`.
    MemCreate,
    /// `(CUarray *out, const CUDA_ARRAY_DESCRIPTOR *desc)`: the array and the footprint
    /// estimate of the 2D descriptor ([`crate::array::array_footprint`]).
    Array2d,
    /// `(CUarray *out, const CUDA_ARRAY3D_DESCRIPTOR *desc)`: as [`Shape::Array2d`] with
    /// the 3D descriptor.
    Array3d,
    /// `cuMipmappedArrayCreate(CUmipmappedArray *out, const CUDA_ARRAY3D_DESCRIPTOR *desc,
    /// unsigned levels)`: the mipmapped array and the footprint estimate of all its levels
    /// ([`crate::array::mipmap_footprint`]).
    Mipmapped,
    /// `(value, ...)`: argument 0 by value (the pointer, handle or array released, the
    /// context destroyed or made current, the device whose primary context is released).
    Value,
    /// `(CUcontext *out, ..., CUdevice dev, ...)`: the context the driver wrote to `*out`
    /// and the device at argument `dev_arg`.
    CtxOut {
        /// Position of the `CUdevice` argument.
        dev_arg: u8,
    },
}

/// How the agent probes a function: the event its probe sends and what it reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Probe {
    /// The event sent when the call succeeds.
    pub kind: EventKind,
    /// The arguments and result the programs read.
    pub shape: Shape,
}

/// One intercepted function: the whole contract of it that the preload, the agent and the
/// tests share.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Intercept {
    /// Exported symbol name (versioned, e.g. `cuMemAlloc_v2`).
    pub name: &'static str,
    /// The library that exports it.
    pub lib: Library,
    /// Whether `hami-preload` exports a hook of this name.
    pub hooked: bool,
    /// How the agent probes it, or `None` if it is not probed. Probed functions have an
    /// entry program named like the symbol and a return program named `<symbol>_ret` in
    /// `hami-ebpf`.
    pub probe: Option<Probe>,
    /// The tracked device memory it makes or releases, and the key space of the object.
    pub memory: Option<Memory>,
}

impl Intercept {
    /// Whether the agent probes this function.
    pub const fn is_probed(&self) -> bool {
        self.probe.is_some()
    }

    /// The event kind of its probe, if probed.
    pub const fn kind(&self) -> Option<EventKind> {
        match self.probe {
            Some(p) => Some(p.kind),
            None => None,
        }
    }

    /// The row, noted as making an object of key space `space`.
    pub const fn allocates(self, space: KeySpace) -> Intercept {
        Intercept {
            memory: Some(Memory::Allocates(space)),
            ..self
        }
    }

    /// The row, noted as releasing an object of key space `space`.
    pub const fn releases(self, space: KeySpace) -> Intercept {
        Intercept {
            memory: Some(Memory::Releases(space)),
            ..self
        }
    }
}

/// A CUDA driver function hooked by the preload and probed by the agent.
const fn both(name: &'static str, kind: EventKind, shape: Shape) -> Intercept {
    Intercept {
        name,
        lib: Library::Cuda,
        hooked: true,
        probe: Some(Probe { kind, shape }),
        memory: None,
    }
}

/// A CUDA driver function only the preload hooks.
const fn hook(name: &'static str) -> Intercept {
    Intercept {
        name,
        lib: Library::Cuda,
        hooked: true,
        probe: None,
        memory: None,
    }
}

/// A CUDA driver function only the agent probes.
const fn probe(name: &'static str, kind: EventKind, shape: Shape) -> Intercept {
    Intercept {
        name,
        lib: Library::Cuda,
        hooked: false,
        probe: Some(Probe { kind, shape }),
        memory: None,
    }
}

/// An NVML function the preload hooks (the agent probes no NVML function).
const fn nvml_hook(name: &'static str) -> Intercept {
    Intercept {
        name,
        lib: Library::Nvml,
        hooked: true,
        probe: None,
        memory: None,
    }
}

/// Every intercepted function. The probed rows' order gives the eBPF programs their slot
/// numbers ([`probe_slot`]); otherwise order does not matter.
pub const INTERCEPTS: &[Intercept] = &[
    // Allocations.
    both("cuMemAlloc_v2", EventKind::MemAlloc, OutSize).allocates(Pointer),
    both("cuMemAllocPitch_v2", EventKind::MemAllocPitch, Pitch).allocates(Pointer),
    both("cuMemAllocManaged", EventKind::MemAllocManaged, OutSize).allocates(Pointer),
    both("cuMemAllocAsync", EventKind::MemAllocAsync, OutSize).allocates(Pointer),
    both("cuMemAllocAsync_ptsz", EventKind::MemAllocAsync, OutSize).allocates(Pointer),
    both(
        "cuMemAllocFromPoolAsync",
        EventKind::MemAllocFromPool,
        OutSize,
    )
    .allocates(Pointer),
    both(
        "cuMemAllocFromPoolAsync_ptsz",
        EventKind::MemAllocFromPool,
        OutSize,
    )
    .allocates(Pointer),
    both("cuMemCreate", EventKind::MemCreate, MemCreate).allocates(Handle),
    both("cuArrayCreate_v2", EventKind::ArrayCreate, Array2d).allocates(Array),
    both("cuArray3DCreate_v2", EventKind::Array3DCreate, Array3d).allocates(Array),
    both(
        "cuMipmappedArrayCreate",
        EventKind::MipmappedArrayCreate,
        Mipmapped,
    )
    .allocates(Mipmap),
    // Releases.
    both("cuMemFree_v2", EventKind::MemFree, Value).releases(Pointer),
    both("cuMemFreeAsync", EventKind::MemFreeAsync, Value).releases(Pointer),
    both("cuMemFreeAsync_ptsz", EventKind::MemFreeAsync, Value).releases(Pointer),
    both("cuMemRelease", EventKind::MemRelease, Value).releases(Handle),
    both("cuArrayDestroy", EventKind::ArrayDestroy, Value).releases(Array),
    both(
        "cuMipmappedArrayDestroy",
        EventKind::MipmappedArrayDestroy,
        Value,
    )
    .releases(Mipmap),
    // Contexts. `CtxOut`'s argument is the position of the `CUdevice` parameter:
    // cuCtxCreate_v2(CUcontext*, unsigned flags, CUdevice),
    // cuCtxCreate_v3(CUcontext*, CUexecAffinityParam*, int n, unsigned flags, CUdevice),
    // cuCtxCreate_v4(CUcontext*, CUctxCreateParams*, unsigned flags, CUdevice),
    // cuDevicePrimaryCtxRetain(CUcontext*, CUdevice).
    both(
        "cuCtxCreate_v2",
        EventKind::CtxCreate,
        CtxOut { dev_arg: 2 },
    ),
    both(
        "cuCtxCreate_v3",
        EventKind::CtxCreate,
        CtxOut { dev_arg: 4 },
    ),
    both(
        "cuCtxCreate_v4",
        EventKind::CtxCreate,
        CtxOut { dev_arg: 3 },
    ),
    both("cuCtxDestroy_v2", EventKind::CtxDestroy, Value),
    both(
        "cuDevicePrimaryCtxRetain",
        EventKind::PrimaryCtxRetain,
        CtxOut { dev_arg: 1 },
    ),
    both(
        "cuDevicePrimaryCtxRelease",
        EventKind::PrimaryCtxRelease,
        Value,
    ),
    both(
        "cuDevicePrimaryCtxRelease_v2",
        EventKind::PrimaryCtxRelease,
        Value,
    ),
    probe("cuCtxSetCurrent", EventKind::CtxSetCurrent, Value),
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
    // Stream-ordered pools: their reservation is charged (hami-preload/src/pool_reservations.rs).
    // A handle released while mapped (or retained) keeps its memory (hami-preload/src/vmm.rs).
    hook("cuMemMap"),
    hook("cuMemUnmap"),
    hook("cuMemAddressFree"),
    hook("cuMemRetainAllocationHandle"),
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
        Some(Intercept { probe: Some(p), .. }) => p.kind,
        _ => panic!("not a probed function of hami_common::intercept::INTERCEPTS"),
    }
}

/// What the probe of `name` reads ([`Shape`]).
///
/// # Panics
/// If `name` is not a probed row (at compile time when used in a constant).
pub const fn probe_shape(name: &str) -> Shape {
    match find(name) {
        Some(Intercept { probe: Some(p), .. }) => p.shape,
        _ => panic!("not a probed function of hami_common::intercept::INTERCEPTS"),
    }
}

/// The key space of the object that row `name` makes or releases (the preload's hooks take
/// theirs from here, e.g. `const { intercept::space_of("cuMemFree_v2") }`).
///
/// # Panics
/// If `name` is not a row with [`Intercept::memory`] (at compile time in a constant).
pub const fn space_of(name: &str) -> KeySpace {
    match find(name) {
        Some(Intercept {
            memory: Some(m), ..
        }) => m.space(),
        _ => panic!("not a memory row of hami_common::intercept::INTERCEPTS"),
    }
}

/// Key space by event kind value (`[EventKind as usize]`), from the probed memory rows.
const SPACE_BY_KIND: [Option<KeySpace>; 65] = {
    let mut out = [None; 65];
    let mut i = 0;
    while i < INTERCEPTS.len() {
        if let (Some(p), Some(m)) = (INTERCEPTS[i].probe, INTERCEPTS[i].memory) {
            out[p.kind as usize] = Some(m.space());
        }
        i += 1;
    }
    out
};

/// The key space an event of `kind` allocates or releases in (the agent's pairing of
/// allocations and releases), from the rows probed with that kind; `None` for kinds that
/// are not memory events.
pub const fn key_space(kind: EventKind) -> Option<KeySpace> {
    let v = kind as usize;
    if v < SPACE_BY_KIND.len() {
        SPACE_BY_KIND[v]
    } else {
        None
    }
}

// A probed row's memory agrees with its event kind: allocation kinds allocate, release kinds
// release, other kinds neither; the rows of one kind share one key space.
const _: () = {
    let mut i = 0;
    while i < INTERCEPTS.len() {
        let row = &INTERCEPTS[i];
        if let Some(p) = row.probe {
            assert!(
                (p.kind as usize) < SPACE_BY_KIND.len(),
                "an event kind above 64 in INTERCEPTS"
            );
            match row.memory {
                Some(Memory::Allocates(s)) => {
                    assert!(
                        p.kind.is_alloc(),
                        "a row allocates but its kind is not an allocation"
                    );
                    assert!(
                        SPACE_BY_KIND[p.kind as usize].unwrap() as u8 == s as u8,
                        "rows of one event kind name different key spaces"
                    );
                }
                Some(Memory::Releases(s)) => {
                    assert!(
                        p.kind.is_free(),
                        "a row releases but its kind is not a release"
                    );
                    assert!(
                        SPACE_BY_KIND[p.kind as usize].unwrap() as u8 == s as u8,
                        "rows of one event kind name different key spaces"
                    );
                }
                None => assert!(
                    !p.kind.is_alloc() && !p.kind.is_free(),
                    "a probed allocation or release row has no key space (.allocates / .releases)"
                ),
            }
        }
        i += 1;
    }
};

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
    // The crate is `no_std` without its `std` feature; its tests read files.
    extern crate std;
    use std::vec::Vec;

    /// The code blocks of `docs/contributing.md` marked ```` ```rust file=PATH ```` (or `c`)
    /// are in that file: each run of lines between `...` lines appears there, as consecutive
    /// lines (leading and trailing blanks aside), in the order of the block. The worked
    /// example is the code itself, so it compiles and cannot drift.
    #[test]
    fn contributing_md_quotes_the_code() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let doc = std::fs::read_to_string(root.join("docs/contributing.md")).unwrap();
        let mut checked = 0;
        let mut lines = doc.lines();
        while let Some(line) = lines.next() {
            let Some(path) = line.trim().strip_prefix("```").and_then(|info| {
                info.split_whitespace()
                    .find_map(|w| w.strip_prefix("file="))
            }) else {
                continue;
            };
            let mut block = Vec::new();
            for l in lines.by_ref() {
                if l.trim() == "```" {
                    break;
                }
                block.push(l.trim());
            }
            let src = std::fs::read_to_string(root.join(path))
                .unwrap_or_else(|e| panic!("contributing.md quotes {path}: {e}"));
            let src: Vec<&str> = src.lines().map(str::trim).collect();
            let mut from = 0;
            for run in block.split(|l| *l == "...") {
                let run: Vec<&str> = run.iter().copied().filter(|l| !l.is_empty()).collect();
                if run.is_empty() {
                    continue;
                }
                let at = (from..src.len().saturating_sub(run.len() - 1))
                    .find(|&i| src[i..i + run.len()] == run[..])
                    .unwrap_or_else(|| {
                        panic!("contributing.md: not in {path} (after line {from}): {run:#?}")
                    });
                from = at + run.len();
            }
            checked += 1;
        }
        assert!(checked >= 10, "only {checked} blocks marked with a file");
    }

    #[test]
    fn key_spaces_pair_each_allocation_with_its_release() {
        use EventKind::*;
        for k in [
            MemAlloc,
            MemAllocPitch,
            MemAllocManaged,
            MemAllocAsync,
            MemAllocFromPool,
        ] {
            assert_eq!(key_space(k), Some(KeySpace::Pointer), "{k:?}");
        }
        assert_eq!(key_space(MemFree), Some(KeySpace::Pointer));
        assert_eq!(key_space(MemFreeAsync), Some(KeySpace::Pointer));
        assert_eq!(key_space(MemCreate), Some(KeySpace::Handle));
        assert_eq!(key_space(MemRelease), Some(KeySpace::Handle));
        for k in [ArrayCreate, Array3DCreate, ArrayDestroy] {
            assert_eq!(key_space(k), Some(KeySpace::Array), "{k:?}");
        }
        // A mipmapped array is released only by cuMipmappedArrayDestroy.
        assert_eq!(key_space(MipmappedArrayCreate), Some(KeySpace::Mipmap));
        assert_eq!(key_space(MipmappedArrayDestroy), Some(KeySpace::Mipmap));
        for k in [
            CtxCreate,
            CtxDestroy,
            PrimaryCtxRetain,
            PrimaryCtxRelease,
            CtxSetCurrent,
        ] {
            assert_eq!(key_space(k), None, "{k:?}");
        }
        assert_eq!(key_space(ProcessExit), None);
        // Every memory kind has a key space, and hook-only rows have theirs too.
        for k in EventKind::ALL {
            assert_eq!(key_space(k).is_some(), k.is_alloc() || k.is_free(), "{k:?}");
        }
        assert_eq!(space_of("cuMipmappedArrayCreate"), KeySpace::Mipmap);
        assert_eq!(space_of("cuMipmappedArrayDestroy"), KeySpace::Mipmap);
        assert_eq!(space_of("cuMemFreeAsync_ptsz"), KeySpace::Pointer);
    }

    #[test]
    #[should_panic(expected = "not a memory row")]
    fn a_context_function_has_no_key_space() {
        space_of("cuCtxCreate_v2");
    }

    #[test]
    fn slots_follow_the_probed_rows_and_start_at_one() {
        assert_eq!(probe_slot("cuMemAlloc_v2"), 1);
        for (i, name) in PROBED_NAMES.iter().enumerate() {
            assert_eq!(probe_slot(name), i as u64 + 1);
        }
    }

    #[test]
    fn probe_kinds_come_from_the_rows() {
        assert_eq!(probe_kind("cuMemAllocAsync_ptsz"), EventKind::MemAllocAsync);
        assert_eq!(probe_kind("cuCtxCreate_v4"), EventKind::CtxCreate);
        for row in INTERCEPTS.iter().filter(|r| r.is_probed()) {
            assert_eq!(Some(probe_kind(row.name)), row.kind());
            assert_eq!(Some(probe_shape(row.name)), row.probe.map(|p| p.shape));
            // Probes report allocations, frees and context changes, never process exits
            // (those come from the tracepoint).
            assert_ne!(row.kind(), Some(EventKind::ProcessExit));
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
        assert_eq!(row.kind(), Some(EventKind::MemCreate));
        assert_eq!(row.probe.map(|p| p.shape), Some(Shape::MemCreate));
        assert_eq!(row.memory, Some(Memory::Allocates(KeySpace::Handle)));
        assert!(find("cuMemcpy").is_none());
    }
}
