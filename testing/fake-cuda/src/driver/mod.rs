//! The fake driver's process-local state and the semantics of each call, in plain Rust.
//! The exported C functions in `lib.rs` only check pointers and delegate here.
//!
//! This module holds the state (per-process [`Inner`], the shared cross-process state), the
//! initialisation and the devices; the calls are grouped by concern in [`context`],
//! [`memory`], [`pools`], [`streams`] and [`modules`], each an `impl Inner` block.

pub mod clock;
mod context;
pub mod graph_mem;
mod graphs;
mod green;
mod hold;
mod limits;
mod memory;
mod modules;
mod pools;
mod streams;
mod timeline;

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{LazyLock, Mutex, MutexGuard, OnceLock};

use fake_state::Shared;

pub use hold::{alloc_delay, release_delay};
pub use timeline::{image_kernel_time, KernelTime};

use crate::ffi::*;

/// VMM / allocation granularity (bytes), as the real H200 driver reports it.
pub const GRANULARITY: u64 = 2 << 20;
/// Pitch alignment of `cuMemAllocPitch` (bytes), as measured on the real driver.
pub const PITCH_ALIGN: u64 = 512;
/// The largest array dimension the fake device states
/// (`CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE1D_WIDTH`, as on a compute capability 9.0 device):
/// array descriptors with a larger dimension are rejected with `CUDA_ERROR_INVALID_VALUE`.
pub const MAX_ARRAY_DIM: u64 = 131_072;
/// Driver version the fake reports (`cuDriverGetVersion`), CUDA 13.0 like the H200 machine.
pub const DEFAULT_DRIVER_VERSION: i32 = 13000;

/// What kind of allocation a device pointer is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `cuMemAlloc_v2`.
    Linear,
    /// `cuMemAllocPitch_v2`.
    Pitch,
    /// `cuMemAllocManaged`.
    Managed,
    /// `cuMemAllocAsync` / `cuMemAllocFromPoolAsync`.
    Async,
}

/// One live allocation.
#[derive(Clone, Copy, Debug)]
pub struct Alloc {
    /// Physical device index.
    pub phys: usize,
    /// Owning context handle.
    pub ctx: u64,
    /// Requested size.
    pub size: u64,
    /// Bytes charged to the device.
    pub charged: u64,
    /// Kind (kept for debugging output).
    #[allow(dead_code)]
    pub kind: Kind,
    /// The stream-ordered pool the allocation came from (its memory is the pool's).
    pub pool: Option<u64>,
}

/// A stream-ordered memory pool (`cuMemPoolCreate`, or a device's default pool).
#[derive(Clone, Copy, Debug)]
pub struct Pool {
    /// CUDA ordinal of its device.
    pub ordinal: usize,
    /// Physical index of its device.
    pub phys: usize,
    /// Bytes taken from the device (`CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT`).
    pub reserved: u64,
    /// Bytes of live allocations (`CU_MEMPOOL_ATTR_USED_MEM_CURRENT`).
    pub used: u64,
    /// High watermarks (`..._HIGH`).
    pub reserved_high: u64,
    /// See `reserved_high`.
    pub used_high: u64,
    /// `CU_MEMPOOL_ATTR_RELEASE_THRESHOLD` (default 0: everything unused is released at the
    /// next synchronisation).
    pub threshold: u64,
    /// The three reuse flags (attributes 1-3), default on.
    pub reuse: [i32; 3],
    /// `cuMemPoolDestroy` was called while allocations were outstanding: the rest of its
    /// memory goes back when the last one is freed.
    pub destroyed: bool,
}

impl Pool {
    fn new(ordinal: usize, phys: usize) -> Pool {
        Pool {
            ordinal,
            phys,
            reserved: 0,
            used: 0,
            reserved_high: 0,
            used_high: 0,
            threshold: 0,
            reuse: [1; 3],
            destroyed: false,
        }
    }
}

/// A loaded module (`cuModuleLoad*`) or library (`cuLibraryLoad*`) with `__device__` globals.
#[derive(Clone, Copy, Debug)]
pub struct Module {
    /// Context it is loaded in (libraries: 0; where they are resident is
    /// [`Inner::lib_resident`]).
    pub ctx: u64,
    /// Physical device charged (valid once `loaded`; modules only).
    pub phys: usize,
    /// Bytes of its globals (from the image), per context it is loaded in.
    pub globals: u64,
    /// Whether the globals are on the device (charged; modules only).
    pub loaded: bool,
    /// A library (`cuLibraryLoad*`): survives its context, unloaded with `cuLibraryUnload`.
    pub library: bool,
    /// Local memory per thread its kernels need (`CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES`),
    /// from the image's `local=` key.
    pub local: u64,
}

/// What a function or kernel handle belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Owner {
    /// A `CUfunction` of a module or library.
    Function(u64),
    /// A `CUkernel` of a library (context-independent).
    Kernel(u64),
}

/// Where lazily loaded module memory arrives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Loading {
    /// `CUDA_MODULE_LOADING=EAGER`: at load.
    Eager,
    /// Lazy (the CUDA 12.2+ default): at the first function lookup of the module.
    AtFunction,
    /// Lazy, with `FAKE_CUDA_LAZY_AT_LAUNCH=1`: at the first launch of one of its kernels.
    AtLaunch,
}

/// `CUDA_MODULE_LOADING` (`EAGER` / `LAZY`, default lazy) and `FAKE_CUDA_LAZY_AT_LAUNCH`.
pub fn loading() -> Loading {
    static V: OnceLock<Loading> = OnceLock::new();
    *V.get_or_init(|| {
        let eager = std::env::var("CUDA_MODULE_LOADING")
            .is_ok_and(|v| v.trim().eq_ignore_ascii_case("EAGER"));
        if eager {
            Loading::Eager
        } else if std::env::var("FAKE_CUDA_LAZY_AT_LAUNCH").is_ok_and(|v| v == "1") {
            Loading::AtLaunch
        } else {
            Loading::AtFunction
        }
    })
}

/// `FAKE_CUDA_POOL_GRANULE`: the step a stream-ordered pool grows and shrinks by (default
/// 2 MiB).
pub fn pool_granule() -> u64 {
    static V: OnceLock<u64> = OnceLock::new();
    *V.get_or_init(|| {
        std::env::var("FAKE_CUDA_POOL_GRANULE")
            .ok()
            .and_then(|v| fake_state::parse_size(&v))
            .filter(|&g| g > 0)
            .unwrap_or(GRANULARITY)
    })
}

/// Globals size a fake module image declares: an image (or file) starting with
/// `FAKECUBIN` followed by `globals=<size>` (sizes as `FAKE_CUDA_TOTAL_MEM`), e.g.
/// `FAKECUBIN globals=1536M`. Any other image has no globals. `None`: the image says
/// `FAKECUBIN` but the size is malformed (`CUDA_ERROR_INVALID_IMAGE`).
pub fn image_globals(image: &[u8]) -> Option<u64> {
    let Some(rest) = image.strip_prefix(b"FAKECUBIN") else {
        return Some(0);
    };
    let text = std::str::from_utf8(rest).ok()?;
    let mut globals = 0;
    for word in text.split_ascii_whitespace() {
        if let Some(v) = word.strip_prefix("globals=") {
            globals = fake_state::parse_size(v)?;
        }
    }
    Some(globals)
}

/// Local memory per thread a fake module image declares for its kernels: `local=<size>`
/// after `FAKECUBIN` (sizes as `FAKE_CUDA_TOTAL_MEM`), e.g. `FAKECUBIN globals=0 local=24K`.
/// Absent (or not a `FAKECUBIN` image): 0. `None`: the size is malformed
/// (`CUDA_ERROR_INVALID_IMAGE`).
pub fn image_local(image: &[u8]) -> Option<u64> {
    let Some(rest) = image.strip_prefix(b"FAKECUBIN") else {
        return Some(0);
    };
    let text = std::str::from_utf8(rest).ok()?;
    let mut local = 0;
    for word in text.split_ascii_whitespace() {
        if let Some(v) = word.strip_prefix("local=") {
            local = fake_state::parse_size(v)?;
        }
    }
    Some(local)
}

/// A context.
#[derive(Clone, Copy, Debug)]
pub struct Ctx {
    /// CUDA ordinal.
    pub ordinal: usize,
    /// Physical device index.
    pub phys: usize,
    /// Primary context of its device.
    pub primary: bool,
    /// Usable (not destroyed / released).
    pub alive: bool,
    /// Its limits (`cuCtxSetLimit`) and the memory they hold ([`limits`]).
    pub limits: limits::Limits,
}

/// Physical memory made by `cuMemCreate`.
#[derive(Clone, Copy, Debug)]
pub struct PhysMem {
    phys: usize,
    size: u64,
    /// References to the handle: 1 from `cuMemCreate`, one more per
    /// `cuMemRetainAllocationHandle`, one fewer per `cuMemRelease`.
    refs: u32,
    maps: u32,
}

/// Primary context bookkeeping of one ordinal.
#[derive(Clone, Copy, Debug, Default)]
pub struct Primary {
    handle: u64,
    refcount: u32,
}

/// Process-local driver state.
pub struct Inner {
    /// Shared state, once initialised.
    pub shared: Option<&'static Shared>,
    /// This process's slot in the shared state.
    pub slot: Option<usize>,
    /// CUDA ordinal -> physical index.
    pub visible: Vec<usize>,
    /// Contexts by handle.
    pub contexts: HashMap<u64, Ctx>,
    /// Primary contexts by ordinal.
    pub primary: Vec<Primary>,
    /// Live allocations by base address.
    pub allocs: BTreeMap<u64, Alloc>,
    /// Arrays by handle.
    pub arrays: HashMap<u64, Alloc>,
    /// `cuMemCreate` handles.
    pub phys_mem: HashMap<u64, PhysMem>,
    /// Reserved VA ranges: base -> size.
    pub reservations: BTreeMap<u64, u64>,
    /// Mappings: va -> (size, handle).
    pub mappings: BTreeMap<u64, (u64, u64)>,
    /// Memory pools by handle.
    pub pools: HashMap<u64, Pool>,
    /// Default pools by ordinal.
    pub default_pools: HashMap<usize, u64>,
    /// Current pools (`cuDeviceSetMemPool`) by ordinal; absent = the default pool.
    pub current_pools: HashMap<usize, u64>,
    /// Mipmapped arrays by handle.
    pub mipmaps: HashMap<u64, Alloc>,
    /// Events: handle -> context.
    pub events: HashMap<u64, u64>,
    /// Function and kernel handles.
    pub functions: HashMap<u64, Owner>,
    /// Created streams: handle -> context.
    pub streams: HashMap<u64, u64>,
    /// Loaded modules and libraries by handle.
    pub modules: HashMap<u64, Module>,
    /// Where each library's globals are resident: (library, context) -> physical device. A
    /// library is loaded into every context it is used in, each with its own globals.
    pub lib_resident: HashMap<(u64, u64), usize>,
    /// Streams being captured into a graph.
    pub capturing: std::collections::HashSet<u64>,
    /// Simulated device time: stream tails, events, graphs (`clock.rs`).
    pub clock: timeline::Timeline,
    /// Graph nodes, executable graphs' memory nodes and the graph pools (`graphs.rs`).
    pub gmem: graph_mem::GraphMem,
    /// Green contexts and resource descriptors (`green.rs`).
    pub greens: green::Greens,
    next_handle: u64,
    next_va: u64,
}

static INITIALIZED: AtomicBool = AtomicBool::new(false);
/// Set in a forked child: its charges must go to a slot of its own, not the parent's.
static FORKED: AtomicBool = AtomicBool::new(false);

extern "C" fn after_fork_in_child() {
    FORKED.store(true, Ordering::Release);
}
static SHARED: OnceLock<Result<Shared, String>> = OnceLock::new();
static INNER: LazyLock<Mutex<Inner>> = LazyLock::new(|| {
    Mutex::new(Inner {
        shared: None,
        slot: None,
        visible: Vec::new(),
        contexts: HashMap::new(),
        primary: Vec::new(),
        allocs: BTreeMap::new(),
        arrays: HashMap::new(),
        phys_mem: HashMap::new(),
        reservations: BTreeMap::new(),
        mappings: BTreeMap::new(),
        pools: HashMap::new(),
        default_pools: HashMap::new(),
        current_pools: HashMap::new(),
        mipmaps: HashMap::new(),
        events: HashMap::new(),
        functions: HashMap::new(),
        capturing: std::collections::HashSet::new(),
        streams: HashMap::new(),
        modules: HashMap::new(),
        lib_resident: HashMap::new(),
        clock: timeline::Timeline::default(),
        gmem: graph_mem::GraphMem::default(),
        greens: green::Greens::default(),
        next_handle: 0x5000_0000,
        next_va: 0,
    })
});

thread_local! {
    /// The calling thread's context stack (top = last).
    static STACK: RefCell<Vec<u64>> = const { RefCell::new(Vec::new()) };
}

/// Driver version reported (`FAKE_CUDA_DRIVER_VERSION` or 13000).
pub fn driver_version() -> i32 {
    static V: OnceLock<i32> = OnceLock::new();
    *V.get_or_init(|| {
        std::env::var("FAKE_CUDA_DRIVER_VERSION")
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(DEFAULT_DRIVER_VERSION)
    })
}

/// Whether `cuMemAllocManaged` charges device memory (`FAKE_CUDA_MANAGED_CHARGES=1`); the
/// real driver does not (managed memory is only resident once touched).
fn managed_charges() -> bool {
    static V: OnceLock<bool> = OnceLock::new();
    *V.get_or_init(|| std::env::var("FAKE_CUDA_MANAGED_CHARGES").is_ok_and(|v| v == "1"))
}

fn lock() -> MutexGuard<'static, Inner> {
    INNER.lock().unwrap_or_else(|e| e.into_inner())
}

/// Locks the state after checking that `cuInit` succeeded.
pub fn inited() -> R<MutexGuard<'static, Inner>> {
    if !INITIALIZED.load(Ordering::Acquire) {
        return Err(CUDA_ERROR_NOT_INITIALIZED);
    }
    Ok(lock())
}

/// `cuInit`.
pub fn init(flags: u32) -> R<()> {
    if flags != 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    if INITIALIZED.load(Ordering::Acquire) {
        return Ok(());
    }
    let mut g = lock();
    if INITIALIZED.load(Ordering::Acquire) {
        return Ok(());
    }
    let shared = match SHARED.get_or_init(|| Shared::open_default().map_err(|e| e.to_string())) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("fake libcuda: {e}");
            return Err(CUDA_ERROR_UNKNOWN);
        }
    };
    let uuids: Vec<[u8; 16]> = (0..shared.device_count())
        .map(|i| shared.file().devices[i].uuid)
        .collect();
    let cvd = std::env::var_os("CUDA_VISIBLE_DEVICES")
        .map(|v| std::ffi::CString::new(v.into_encoded_bytes()).unwrap_or_default());
    let visible = fake_state::resolve_visible_devices(cvd.as_deref(), &uuids);
    if visible.is_empty() {
        return Err(CUDA_ERROR_NO_DEVICE);
    }
    g.slot = shared.slot_for(fake_state::host_pid());
    g.shared = Some(shared);
    // SAFETY: registers a handler that only stores to an atomic (async-signal-safe).
    unsafe { libc::pthread_atfork(None, None, Some(after_fork_in_child)) };
    g.primary = vec![Primary::default(); visible.len()];
    g.visible = visible;
    INITIALIZED.store(true, Ordering::Release);
    Ok(())
}

/// Current context handle of the calling thread (0 if none).
pub fn current_handle() -> u64 {
    STACK.with(|s| s.borrow().last().copied().unwrap_or(0))
}

fn with_stack<T>(f: impl FnOnce(&mut Vec<u64>) -> T) -> T {
    STACK.with(|s| f(&mut s.borrow_mut()))
}

impl Inner {
    fn shared(&self) -> &'static Shared {
        // `inited()` guarantees it is set.
        self.shared
            .expect("fake libcuda used before cuInit succeeded")
    }

    fn handle(&mut self, kind: u64) -> u64 {
        self.next_handle += 1;
        (kind << 40) | (self.next_handle << 4)
    }

    /// Physical index of a valid ordinal.
    pub fn phys_of(&self, dev: CUdevice) -> R<usize> {
        if dev < 0 || dev as usize >= self.visible.len() {
            return Err(CUDA_ERROR_INVALID_DEVICE);
        }
        Ok(self.visible[dev as usize])
    }

    /// Number of visible devices.
    pub fn device_count(&self) -> usize {
        self.visible.len()
    }

    /// Name of an ordinal.
    pub fn device_name(&self, dev: CUdevice) -> R<String> {
        let p = self.phys_of(dev)?;
        Ok(self.shared().device_name(p))
    }

    /// UUID of an ordinal.
    pub fn device_uuid(&self, dev: CUdevice) -> R<[u8; 16]> {
        let p = self.phys_of(dev)?;
        Ok(self.shared().file().devices[p].uuid)
    }

    /// Total memory of an ordinal.
    pub fn total_mem(&self, dev: CUdevice) -> R<u64> {
        let p = self.phys_of(dev)?;
        Ok(self.shared().file().devices[p].total)
    }

    /// Validates a context handle for use.
    pub fn ctx(&self, h: u64) -> R<Ctx> {
        match self.contexts.get(&h) {
            None => Err(CUDA_ERROR_INVALID_CONTEXT),
            Some(c) if !c.alive => Err(CUDA_ERROR_CONTEXT_IS_DESTROYED),
            Some(c) => Ok(*c),
        }
    }

    /// The calling thread's current context.
    pub fn current(&self) -> R<(u64, Ctx)> {
        let h = current_handle();
        if h == 0 {
            return Err(CUDA_ERROR_INVALID_CONTEXT);
        }
        Ok((h, self.ctx(h)?))
    }

    fn charge(&self, phys: usize, bytes: u64) -> R<()> {
        self.shared()
            .charge(phys, self.slot, bytes)
            .map_err(|_| CUDA_ERROR_OUT_OF_MEMORY)
    }

    fn uncharge(&self, phys: usize, bytes: u64) {
        self.shared().uncharge(phys, self.slot, bytes)
    }
}
