//! The fake driver's process-local state and the semantics of each call, in plain Rust.
//! The exported C functions in `lib.rs` only check pointers and delegate here.

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{LazyLock, Mutex, MutexGuard, OnceLock};

use fake_state::Shared;

use crate::ffi::*;

/// VMM / allocation granularity (bytes), as the real H200 driver reports it.
pub const GRANULARITY: u64 = 2 << 20;
/// Pitch alignment of `cuMemAllocPitch` (bytes), as measured on the real driver.
pub const PITCH_ALIGN: u64 = 512;
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
    /// Context it is loaded in (libraries: 0 until first loaded into one).
    pub ctx: u64,
    /// Physical device charged (valid once `loaded`).
    pub phys: usize,
    /// Bytes of its globals (from the image).
    pub globals: u64,
    /// Whether the globals are on the device (charged).
    pub loaded: bool,
    /// A library (`cuLibraryLoad*`): survives its context, unloaded with `cuLibraryUnload`.
    pub library: bool,
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
}

/// Physical memory made by `cuMemCreate`.
#[derive(Clone, Copy, Debug)]
pub struct PhysMem {
    phys: usize,
    size: u64,
    released: bool,
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
    /// Streams being captured into a graph.
    pub capturing: std::collections::HashSet<u64>,
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
        next_handle: 0x5000_0000,
        next_va: 0,
    })
});

thread_local! {
    /// The calling thread's context stack (top = last).
    static STACK: RefCell<Vec<u64>> = const { RefCell::new(Vec::new()) };
}

/// Result of the fake's operations: `Err` carries the CUresult.
pub type R<T> = Result<T, CUresult>;

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

/// Test knob `FAKE_CUDA_CTX_CREATE_DELAY_MS`: how long creating a context (`cuCtxCreate*`, a
/// first `cuDevicePrimaryCtxRetain`) takes after its memory is charged, to make the creations
/// of concurrent processes overlap as they do on a real GPU. Default 0.
fn ctx_create_delay() -> std::time::Duration {
    static V: OnceLock<u64> = OnceLock::new();
    std::time::Duration::from_millis(*V.get_or_init(|| {
        std::env::var("FAKE_CUDA_CTX_CREATE_DELAY_MS")
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    }))
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
    g.slot = shared.slot_for(std::process::id());
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

    fn activate_context(&mut self, h: u64, ordinal: usize, phys: usize, primary: bool) -> R<()> {
        self.charge(phys, self.shared().ctx_overhead())?;
        self.shared().count_context(phys, self.slot, 1);
        let delay = ctx_create_delay();
        if !delay.is_zero() {
            std::thread::sleep(delay);
        }
        self.contexts.insert(
            h,
            Ctx {
                ordinal,
                phys,
                primary,
                alive: true,
            },
        );
        Ok(())
    }

    /// Frees everything a context owns (allocations, arrays, streams, modules).
    fn free_context_resources(&mut self, h: u64) {
        let dead: Vec<u64> = self
            .allocs
            .iter()
            .filter(|(_, a)| a.ctx == h)
            .map(|(&p, _)| p)
            .collect();
        for p in dead {
            let _ = self.free(p);
        }
        let dead: Vec<u64> = self
            .mipmaps
            .iter()
            .filter(|(_, a)| a.ctx == h)
            .map(|(&p, _)| p)
            .collect();
        for p in dead {
            if let Some(a) = self.mipmaps.remove(&p) {
                self.uncharge(a.phys, a.charged);
            }
        }
        let dead: Vec<u64> = self
            .arrays
            .iter()
            .filter(|(_, a)| a.ctx == h)
            .map(|(&p, _)| p)
            .collect();
        for p in dead {
            if let Some(a) = self.arrays.remove(&p) {
                self.uncharge(a.phys, a.charged);
            }
        }
        self.streams.retain(|_, c| *c != h);
        self.events.retain(|_, c| *c != h);
        let dead: Vec<u64> = self
            .modules
            .iter()
            .filter(|(_, m)| m.ctx == h)
            .map(|(&k, _)| k)
            .collect();
        for k in dead {
            let m = self.modules[&k];
            if m.loaded {
                self.uncharge(m.phys, m.globals);
            }
            if m.library {
                // A library outlives its context: loaded again at its next use.
                if let Some(x) = self.modules.get_mut(&k) {
                    x.loaded = false;
                    x.ctx = 0;
                }
            } else {
                self.modules.remove(&k);
                self.functions.retain(|_, o| *o != Owner::Function(k));
            }
        }
    }

    fn deactivate_context(&mut self, h: u64) {
        self.free_context_resources(h);
        if let Some(c) = self.contexts.get_mut(&h) {
            if c.alive {
                c.alive = false;
                let phys = c.phys;
                self.uncharge(phys, self.shared().ctx_overhead());
                self.shared().count_context(phys, self.slot, -1);
            }
        }
    }

    /// `cuCtxCreate*`: creates a context and pushes it on the calling thread's stack.
    pub fn ctx_create(&mut self, dev: CUdevice) -> R<u64> {
        let phys = self.phys_of(dev)?;
        let h = self.handle(0xc0);
        self.activate_context(h, dev as usize, phys, false)?;
        with_stack(|s| s.push(h));
        Ok(h)
    }

    /// `cuCtxDestroy_v2`.
    pub fn ctx_destroy(&mut self, h: u64) -> R<()> {
        match self.contexts.get(&h) {
            None => return Err(CUDA_ERROR_INVALID_CONTEXT),
            Some(c) if c.primary => return Err(CUDA_ERROR_INVALID_CONTEXT),
            Some(c) if !c.alive => return Err(CUDA_ERROR_CONTEXT_IS_DESTROYED),
            Some(_) => {}
        }
        self.deactivate_context(h);
        with_stack(|s| s.retain(|&x| x != h));
        Ok(())
    }

    /// `cuDevicePrimaryCtxRetain`.
    pub fn primary_retain(&mut self, dev: CUdevice) -> R<u64> {
        let phys = self.phys_of(dev)?;
        let ord = dev as usize;
        if self.primary[ord].handle == 0 {
            let h = self.handle(0xc1);
            self.primary[ord].handle = h;
            self.contexts.insert(
                h,
                Ctx {
                    ordinal: ord,
                    phys,
                    primary: true,
                    alive: false,
                },
            );
        }
        let h = self.primary[ord].handle;
        if self.primary[ord].refcount == 0 {
            self.activate_context(h, ord, phys, true)?;
        }
        self.primary[ord].refcount += 1;
        Ok(h)
    }

    /// `cuDevicePrimaryCtxRelease(_v2)`.
    pub fn primary_release(&mut self, dev: CUdevice) -> R<()> {
        self.phys_of(dev)?;
        let p = &mut self.primary[dev as usize];
        if p.refcount == 0 {
            return Err(CUDA_ERROR_INVALID_CONTEXT);
        }
        p.refcount -= 1;
        if p.refcount == 0 {
            let h = p.handle;
            self.deactivate_context(h);
        }
        Ok(())
    }

    /// `cuDevicePrimaryCtxReset(_v2)`: frees everything the primary context owns.
    pub fn primary_reset(&mut self, dev: CUdevice) -> R<()> {
        self.phys_of(dev)?;
        let h = self.primary[dev as usize].handle;
        if h != 0 {
            self.free_context_resources(h);
        }
        Ok(())
    }

    /// `cuDevicePrimaryCtxGetState`: (flags, active).
    pub fn primary_state(&self, dev: CUdevice) -> R<(u32, bool)> {
        self.phys_of(dev)?;
        Ok((0, self.primary[dev as usize].refcount > 0))
    }

    /// `cuCtxSetCurrent`.
    pub fn set_current(&self, h: u64) -> R<()> {
        if h != 0 {
            match self.contexts.get(&h) {
                None => return Err(CUDA_ERROR_INVALID_CONTEXT),
                Some(c) if !c.alive && !c.primary => return Err(CUDA_ERROR_CONTEXT_IS_DESTROYED),
                Some(_) => {}
            }
        }
        with_stack(|s| {
            s.pop();
            if h != 0 {
                s.push(h);
            }
        });
        Ok(())
    }

    /// `cuCtxPushCurrent_v2`.
    pub fn push_current(&self, h: u64) -> R<()> {
        match self.contexts.get(&h) {
            None => Err(CUDA_ERROR_INVALID_CONTEXT),
            Some(c) if !c.alive && !c.primary => Err(CUDA_ERROR_CONTEXT_IS_DESTROYED),
            Some(_) => {
                with_stack(|s| s.push(h));
                Ok(())
            }
        }
    }

    /// `cuCtxPopCurrent_v2`.
    pub fn pop_current(&self) -> R<u64> {
        with_stack(|s| s.pop()).ok_or(CUDA_ERROR_INVALID_CONTEXT)
    }

    /// `cuMemGetInfo_v2`: (free, total) of the current context's device.
    pub fn mem_info(&self) -> R<(u64, u64)> {
        let (_, c) = self.current()?;
        let sh = self.shared();
        let total = sh.file().devices[c.phys].total;
        let used = sh.used(c.phys);
        Ok((total.saturating_sub(used), total))
    }

    /// Allocates `size` bytes (charging `charged`) on the current context's device, or on
    /// `ordinal` if given (pools).
    pub fn alloc(&mut self, size: u64, charged: u64, kind: Kind, ordinal: Option<usize>) -> R<u64> {
        let (h, c) = self.current()?;
        let phys = match ordinal {
            Some(o) => self.visible[o],
            None => c.phys,
        };
        self.charge(phys, charged)?;
        let ptr = self.shared().next_address(phys, size);
        self.allocs.insert(
            ptr,
            Alloc {
                phys,
                ctx: h,
                size,
                charged,
                kind,
                pool: None,
            },
        );
        Ok(ptr)
    }

    /// Charged bytes of a managed allocation.
    pub fn managed_charge(size: u64) -> u64 {
        if managed_charges() {
            size
        } else {
            0
        }
    }

    /// `cuMemFree_v2` / `cuMemFreeAsync`.
    pub fn free(&mut self, ptr: u64) -> R<()> {
        if ptr == 0 {
            return Ok(());
        }
        match self.allocs.remove(&ptr) {
            Some(a) => {
                self.uncharge(a.phys, a.charged);
                if let Some(h) = a.pool {
                    self.pool_give_back(h, a.size);
                }
                Ok(())
            }
            None => Err(CUDA_ERROR_INVALID_VALUE),
        }
    }

    /// `cuMemGetAddressRange_v2`: (base, size) of the allocation containing `ptr`.
    pub fn address_range(&self, ptr: u64) -> R<(u64, u64)> {
        if let Some((&base, a)) = self.allocs.range(..=ptr).next_back() {
            if ptr < base + a.size.max(1) {
                return Ok((base, a.size));
            }
        }
        if let Some((&va, &(size, _))) = self.mappings.range(..=ptr).next_back() {
            if ptr < va + size {
                return Ok((va, size));
            }
        }
        Err(CUDA_ERROR_NOT_FOUND)
    }

    /// `cuArrayCreate_v2` / `cuArray3DCreate_v2`: `bytes` is the array's footprint.
    pub fn array_create(&mut self, bytes: u64) -> R<u64> {
        let (h, c) = self.current()?;
        let charged = bytes.div_ceil(GRANULARITY) * GRANULARITY;
        self.charge(c.phys, charged)?;
        let a = self.handle(0xa0);
        self.arrays.insert(
            a,
            Alloc {
                phys: c.phys,
                ctx: h,
                size: bytes,
                charged,
                kind: Kind::Linear,
                pool: None,
            },
        );
        Ok(a)
    }

    /// `cuMipmappedArrayCreate`: `bytes` is the footprint of every level.
    pub fn mipmap_create(&mut self, bytes: u64) -> R<u64> {
        let (h, c) = self.current()?;
        let charged = bytes.div_ceil(GRANULARITY) * GRANULARITY;
        self.charge(c.phys, charged)?;
        let a = self.handle(0xa1);
        self.mipmaps.insert(
            a,
            Alloc {
                phys: c.phys,
                ctx: h,
                size: bytes,
                charged,
                kind: Kind::Linear,
                pool: None,
            },
        );
        Ok(a)
    }

    /// `cuMipmappedArrayDestroy`.
    pub fn mipmap_destroy(&mut self, a: u64) -> R<()> {
        match self.mipmaps.remove(&a) {
            Some(x) => {
                self.uncharge(x.phys, x.charged);
                Ok(())
            }
            None => Err(CUDA_ERROR_INVALID_HANDLE),
        }
    }

    /// `cuArrayDestroy`.
    pub fn array_destroy(&mut self, a: u64) -> R<()> {
        match self.arrays.remove(&a) {
            Some(x) => {
                self.uncharge(x.phys, x.charged);
                Ok(())
            }
            None => Err(CUDA_ERROR_INVALID_HANDLE),
        }
    }

    /// `cuMemCreate`.
    pub fn mem_create(&mut self, size: u64, ordinal: CUdevice) -> R<u64> {
        let phys = self.phys_of(ordinal)?;
        if size == 0 || size & (GRANULARITY - 1) != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        self.charge(phys, size)?;
        let h = self.handle(0xe0);
        self.phys_mem.insert(
            h,
            PhysMem {
                phys,
                size,
                released: false,
                maps: 0,
            },
        );
        Ok(h)
    }

    fn drop_phys_if_done(&mut self, h: u64) {
        if let Some(m) = self.phys_mem.get(&h).copied() {
            if m.released && m.maps == 0 {
                self.phys_mem.remove(&h);
                self.uncharge(m.phys, m.size);
            }
        }
    }

    /// `cuMemRelease`: the memory goes back once it is also unmapped everywhere.
    pub fn mem_release(&mut self, h: u64) -> R<()> {
        match self.phys_mem.get_mut(&h) {
            Some(m) if !m.released => m.released = true,
            _ => return Err(CUDA_ERROR_INVALID_VALUE),
        }
        self.drop_phys_if_done(h);
        Ok(())
    }

    /// `cuMemAddressReserve`.
    pub fn address_reserve(&mut self, size: u64, align: u64) -> R<u64> {
        if size == 0 || size & (GRANULARITY - 1) != 0 || (align != 0 && !align.is_power_of_two()) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let align = align.max(GRANULARITY);
        let base = (0x7e00_0000_0000u64 + self.next_va).div_ceil(align) * align;
        self.next_va = base + size - 0x7e00_0000_0000 + GRANULARITY;
        self.reservations.insert(base, size);
        Ok(base)
    }

    fn in_reservation(&self, ptr: u64, size: u64) -> bool {
        self.reservations
            .range(..=ptr)
            .next_back()
            .is_some_and(|(&b, &s)| ptr >= b && ptr.saturating_add(size) <= b + s)
    }

    fn unmap_range(&mut self, ptr: u64, size: u64) {
        let hit: Vec<u64> = self
            .mappings
            .range(ptr..ptr.saturating_add(size))
            .map(|(&va, _)| va)
            .collect();
        for va in hit {
            if let Some((_, h)) = self.mappings.remove(&va) {
                if let Some(m) = self.phys_mem.get_mut(&h) {
                    m.maps = m.maps.saturating_sub(1);
                }
                self.drop_phys_if_done(h);
            }
        }
    }

    /// `cuMemAddressFree` (mappings left in the range are unmapped).
    pub fn address_free(&mut self, ptr: u64, size: u64) -> R<()> {
        match self.reservations.get(&ptr) {
            Some(&s) if s == size => {}
            _ => return Err(CUDA_ERROR_INVALID_VALUE),
        }
        self.unmap_range(ptr, size);
        self.reservations.remove(&ptr);
        Ok(())
    }

    /// `cuMemMap`.
    pub fn mem_map(&mut self, ptr: u64, size: u64, offset: u64, h: u64) -> R<()> {
        let m = match self.phys_mem.get(&h) {
            Some(m) if !m.released => *m,
            _ => return Err(CUDA_ERROR_INVALID_VALUE),
        };
        if size == 0
            || size & (GRANULARITY - 1) != 0
            || offset & (GRANULARITY - 1) != 0
            || offset.saturating_add(size) > m.size
            || !self.in_reservation(ptr, size)
        {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let overlaps_before = self
            .mappings
            .range(..=ptr)
            .next_back()
            .is_some_and(|(&va, &(s, _))| va + s > ptr);
        let overlaps_after = self.mappings.range(ptr..ptr + size).next().is_some();
        if overlaps_before || overlaps_after {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        self.mappings.insert(ptr, (size, h));
        if let Some(m) = self.phys_mem.get_mut(&h) {
            m.maps += 1;
        }
        Ok(())
    }

    /// `cuMemUnmap` (unmapping an unmapped range of a reservation succeeds, as measured).
    pub fn mem_unmap(&mut self, ptr: u64, size: u64) -> R<()> {
        if size == 0 || !self.in_reservation(ptr, size) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        self.unmap_range(ptr, size);
        Ok(())
    }

    /// `cuMemSetAccess`: the range must be reserved.
    pub fn set_access(&self, ptr: u64, size: u64, ordinals: &[i32]) -> R<()> {
        if size == 0 || !self.in_reservation(ptr, size) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        for &o in ordinals {
            self.phys_of(o)?;
        }
        Ok(())
    }

    /// `cuMemPoolCreate`.
    pub fn pool_create(&mut self, ordinal: CUdevice) -> R<u64> {
        let phys = self.phys_of(ordinal)?;
        let h = self.handle(0xb0);
        self.pools.insert(h, Pool::new(ordinal as usize, phys));
        Ok(h)
    }

    /// `cuMemPoolDestroy`: unused memory goes back at once, the rest when its allocations
    /// are freed. A device whose current pool it was uses its default pool again.
    pub fn pool_destroy(&mut self, h: u64) -> R<()> {
        if self.default_pools.values().any(|&p| p == h) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        match self.pools.get(&h) {
            Some(p) if !p.destroyed => {}
            _ => return Err(CUDA_ERROR_INVALID_VALUE),
        }
        self.current_pools.retain(|_, p| *p != h);
        self.pool_shrink(h, 0);
        let gone = match self.pools.get_mut(&h) {
            Some(p) if p.used == 0 => true,
            Some(p) => {
                p.destroyed = true;
                false
            }
            None => false,
        };
        if gone {
            self.pools.remove(&h);
        }
        Ok(())
    }

    /// `cuDeviceGetDefaultMemPool`.
    pub fn default_pool(&mut self, ordinal: CUdevice) -> R<u64> {
        let phys = self.phys_of(ordinal)?;
        let o = ordinal as usize;
        if let Some(&h) = self.default_pools.get(&o) {
            return Ok(h);
        }
        let h = self.handle(0xb1);
        self.pools.insert(h, Pool::new(o, phys));
        self.default_pools.insert(o, h);
        Ok(h)
    }

    /// `cuDeviceGetMemPool`: the current pool of a device.
    pub fn current_pool(&mut self, ordinal: CUdevice) -> R<u64> {
        self.phys_of(ordinal)?;
        match self.current_pools.get(&(ordinal as usize)) {
            Some(&h) => Ok(h),
            None => self.default_pool(ordinal),
        }
    }

    /// `cuDeviceSetMemPool`: the pool must be located on that device.
    pub fn set_current_pool(&mut self, ordinal: CUdevice, h: u64) -> R<()> {
        self.phys_of(ordinal)?;
        match self.pools.get(&h) {
            Some(p) if !p.destroyed && p.ordinal == ordinal as usize => {
                self.current_pools.insert(ordinal as usize, h);
                Ok(())
            }
            _ => Err(CUDA_ERROR_INVALID_VALUE),
        }
    }

    /// Ordinal of a (live) pool.
    pub fn pool_ordinal(&self, h: u64) -> R<usize> {
        match self.pools.get(&h) {
            Some(p) if !p.destroyed => Ok(p.ordinal),
            _ => Err(CUDA_ERROR_INVALID_VALUE),
        }
    }

    /// A stream-ordered allocation of `size` bytes from pool `h`: the pool grows by what its
    /// unused reserve lacks, rounded up to [`pool_granule`]; only the growth is charged.
    pub fn pool_alloc(&mut self, h: u64, size: u64) -> R<u64> {
        let (ctx, _) = self.current()?;
        let p = *self.pools.get(&h).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        let free = p.reserved.saturating_sub(p.used);
        let mut growth = 0;
        if size > free {
            let g = pool_granule();
            growth = (size - free)
                .checked_next_multiple_of(g)
                .ok_or(CUDA_ERROR_OUT_OF_MEMORY)?;
            if self.charge(p.phys, growth).is_err() {
                // As the real driver, give back what other pools keep unused, then retry.
                let others: Vec<u64> = self.pools.keys().copied().filter(|&k| k != h).collect();
                for k in others {
                    self.pool_shrink(k, 0);
                }
                self.charge(p.phys, growth)?;
            }
        }
        let ptr = self.shared().next_address(p.phys, size);
        if let Some(p) = self.pools.get_mut(&h) {
            p.reserved += growth;
            p.used += size;
            p.reserved_high = p.reserved_high.max(p.reserved);
            p.used_high = p.used_high.max(p.used);
        }
        self.allocs.insert(
            ptr,
            Alloc {
                phys: p.phys,
                ctx,
                size,
                charged: 0,
                kind: Kind::Async,
                pool: Some(h),
            },
        );
        Ok(ptr)
    }

    /// An allocation of `size` bytes went back to pool `h`.
    fn pool_give_back(&mut self, h: u64, size: u64) {
        let Some(p) = self.pools.get_mut(&h) else {
            return;
        };
        p.used = p.used.saturating_sub(size);
        if p.destroyed && p.used == 0 {
            let (phys, reserved) = (p.phys, p.reserved);
            self.pools.remove(&h);
            self.uncharge(phys, reserved);
        }
    }

    /// Releases pool `h`'s unused memory down to `keep` bytes reserved (never below what its
    /// live allocations need, rounded up to the granule). Returns the bytes released.
    fn pool_shrink(&mut self, h: u64, keep: u64) -> u64 {
        let Some(p) = self.pools.get_mut(&h) else {
            return 0;
        };
        let floor = p
            .used
            .checked_next_multiple_of(pool_granule())
            .unwrap_or(p.used)
            .max(keep);
        if p.reserved <= floor {
            return 0;
        }
        let released = p.reserved - floor;
        p.reserved = floor;
        let phys = p.phys;
        self.uncharge(phys, released);
        released
    }

    /// `cuMemPoolTrimTo`.
    pub fn pool_trim(&mut self, h: u64, keep: u64) -> R<()> {
        self.pool_ordinal(h)?;
        self.pool_shrink(h, keep);
        Ok(())
    }

    /// What a stream, event or context synchronisation does to pools: each gives back its
    /// unused memory above its release threshold.
    pub fn pools_release_at_sync(&mut self) {
        let all: Vec<(u64, u64)> = self.pools.iter().map(|(&h, p)| (h, p.threshold)).collect();
        for (h, threshold) in all {
            self.pool_shrink(h, threshold);
        }
    }

    /// `cuMemPoolGetAttribute`: `Ok(value)` (int attributes widened).
    pub fn pool_get_attr(&self, h: u64, attr: i32) -> R<u64> {
        let p = match self.pools.get(&h) {
            Some(p) if !p.destroyed => p,
            _ => return Err(CUDA_ERROR_INVALID_VALUE),
        };
        Ok(match attr {
            1..=3 => p.reuse[attr as usize - 1] as u64,
            4 => p.threshold,
            5 => p.reserved,
            6 => p.reserved_high,
            7 => p.used,
            8 => p.used_high,
            _ => return Err(CUDA_ERROR_INVALID_VALUE),
        })
    }

    /// `cuMemPoolSetAttribute`: the reuse flags, the release threshold, and the high
    /// watermarks (which only accept 0, resetting them to the current value).
    pub fn pool_set_attr(&mut self, h: u64, attr: i32, value: u64) -> R<()> {
        let p = match self.pools.get_mut(&h) {
            Some(p) if !p.destroyed => p,
            _ => return Err(CUDA_ERROR_INVALID_VALUE),
        };
        match attr {
            1..=3 => p.reuse[attr as usize - 1] = (value as u32 != 0) as i32,
            4 => p.threshold = value,
            6 if value == 0 => p.reserved_high = p.reserved,
            8 if value == 0 => p.used_high = p.used,
            _ => return Err(CUDA_ERROR_INVALID_VALUE),
        }
        Ok(())
    }

    /// `cuEventCreate`.
    pub fn event_create(&mut self) -> R<u64> {
        let (c, _) = self.current()?;
        let h = self.handle(0xe5);
        self.events.insert(h, c);
        Ok(h)
    }

    /// Validates an event handle.
    pub fn check_event(&self, h: u64) -> R<()> {
        match self.events.get(&h) {
            Some(&c) => self.ctx(c).map(|_| ()),
            None => Err(CUDA_ERROR_INVALID_HANDLE),
        }
    }

    /// `cuEventDestroy_v2`.
    pub fn event_destroy(&mut self, h: u64) -> R<()> {
        self.events
            .remove(&h)
            .map(|_| ())
            .ok_or(CUDA_ERROR_INVALID_HANDLE)
    }

    /// Validates a stream handle (the null, legacy and per-thread streams need a context).
    pub fn check_stream(&self, s: u64) -> R<()> {
        if s == 0 || s == CU_STREAM_LEGACY as u64 || s == CU_STREAM_PER_THREAD as u64 {
            self.current()?;
            return Ok(());
        }
        match self.streams.get(&s) {
            Some(&c) => self.ctx(c).map(|_| ()),
            None => Err(CUDA_ERROR_INVALID_HANDLE),
        }
    }

    /// `cuStreamBeginCapture_v2`: only a created stream can be captured.
    pub fn begin_capture(&mut self, s: u64) -> R<()> {
        self.check_stream(s)?;
        if !self.streams.contains_key(&s) {
            return Err(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
        }
        if !self.capturing.insert(s) {
            return Err(CUDA_ERROR_ILLEGAL_STATE);
        }
        Ok(())
    }

    /// `cuStreamEndCapture`: a graph handle.
    pub fn end_capture(&mut self, s: u64) -> R<u64> {
        self.check_stream(s)?;
        if !self.capturing.remove(&s) {
            return Err(CUDA_ERROR_ILLEGAL_STATE);
        }
        Ok(self.handle(0x6a))
    }

    /// Whether stream `s` is being captured.
    pub fn is_capturing(&self, s: u64) -> bool {
        self.capturing.contains(&s)
    }

    /// `cuStreamCreate`.
    pub fn stream_create(&mut self) -> R<u64> {
        let (c, _) = self.current()?;
        let h = self.handle(0x50);
        self.streams.insert(h, c);
        Ok(h)
    }

    /// `cuStreamDestroy_v2`.
    pub fn stream_destroy(&mut self, s: u64) -> R<()> {
        self.capturing.remove(&s);
        self.streams
            .remove(&s)
            .map(|_| ())
            .ok_or(CUDA_ERROR_INVALID_HANDLE)
    }

    /// `cuModuleLoad*` (`library == false`, loaded in the current context) and
    /// `cuLibraryLoad*` (context-independent; with eager loading loaded into the current
    /// context if there is one). `globals` bytes arrive now with eager loading, else at the
    /// first function lookup or launch ([`loading`]).
    pub fn module_load(&mut self, globals: u64, library: bool) -> R<u64> {
        let ctx = match self.current() {
            Ok((c, _)) => c,
            Err(e) if !library => return Err(e),
            Err(_) => 0,
        };
        let h = self.handle(if library { 0x31 } else { 0x30 });
        self.modules.insert(
            h,
            Module {
                ctx,
                phys: 0,
                globals,
                loaded: false,
                library,
            },
        );
        if loading() == Loading::Eager && ctx != 0 {
            if let Err(e) = self.module_make_resident(h) {
                self.modules.remove(&h);
                return Err(e);
            }
        }
        Ok(h)
    }

    /// Puts module `h`'s globals on the device of its context (a library: of the current
    /// context), charging them.
    fn module_make_resident(&mut self, h: u64) -> R<()> {
        let m = *self.modules.get(&h).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        if m.loaded {
            return Ok(());
        }
        let (ctx, c) = if m.library {
            self.current()?
        } else {
            (m.ctx, self.ctx(m.ctx)?)
        };
        self.charge(c.phys, m.globals)?;
        if let Some(x) = self.modules.get_mut(&h) {
            x.loaded = true;
            x.phys = c.phys;
            x.ctx = ctx;
        }
        Ok(())
    }

    /// `cuModuleUnload` / `cuLibraryUnload`.
    pub fn module_unload(&mut self, h: u64, library: bool) -> R<()> {
        match self.modules.get(&h) {
            Some(m) if m.library == library => {}
            _ => return Err(CUDA_ERROR_INVALID_HANDLE),
        }
        if let Some(m) = self.modules.remove(&h) {
            if m.loaded {
                self.uncharge(m.phys, m.globals);
            }
        }
        self.functions
            .retain(|_, o| *o != Owner::Function(h) && *o != Owner::Kernel(h));
        Ok(())
    }

    /// `cuModuleGetFunction`: a function handle; lazy modules load here (unless at launch).
    pub fn module_get_function(&mut self, h: u64) -> R<u64> {
        match self.modules.get(&h) {
            Some(m) if !m.library => {}
            _ => return Err(CUDA_ERROR_INVALID_HANDLE),
        }
        if loading() == Loading::AtFunction {
            self.module_make_resident(h)?;
        }
        let f = self.handle(0xf0);
        self.functions.insert(f, Owner::Function(h));
        Ok(f)
    }

    /// `cuLibraryGetKernel`: a context-independent kernel handle (nothing is loaded).
    pub fn library_get_kernel(&mut self, h: u64) -> R<u64> {
        match self.modules.get(&h) {
            Some(m) if m.library => {}
            _ => return Err(CUDA_ERROR_INVALID_HANDLE),
        }
        let k = self.handle(0xf1);
        self.functions.insert(k, Owner::Kernel(h));
        Ok(k)
    }

    /// `cuKernelGetFunction`: the kernel's function in the current context; the library is
    /// loaded into it here (unless at launch).
    pub fn kernel_get_function(&mut self, k: u64) -> R<u64> {
        let Some(&Owner::Kernel(lib)) = self.functions.get(&k) else {
            return Err(CUDA_ERROR_INVALID_HANDLE);
        };
        self.current()?;
        if loading() == Loading::AtFunction {
            self.module_make_resident(lib)?;
        }
        let f = self.handle(0xf0);
        self.functions.insert(f, Owner::Function(lib));
        Ok(f)
    }

    /// `cuLaunchKernel(Ex)` of a function or a kernel handle: its module is loaded first if
    /// it is not yet (a failure to load is the launch's error).
    pub fn launch(&mut self, f: u64) -> R<()> {
        let owner = match self.functions.get(&f) {
            Some(Owner::Function(m)) | Some(Owner::Kernel(m)) => *m,
            None => return Err(CUDA_ERROR_INVALID_HANDLE),
        };
        self.current()?;
        self.module_make_resident(owner)
    }
}
