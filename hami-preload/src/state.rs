//! Process-wide state, created lazily at the first hooked call.
//!
//! * [`Global`]: configuration and the opened region. Built once per process image (kept
//!   across `fork`: the mapping is shared and the lock process-shared).
//! * [`Holdings`]: what this process holds: its region slot and the tables of the driver
//!   objects it made (allocations, contexts, pools, modules, limits, gate submissions).
//!   Replaced by a fresh one in a forked child (the `pthread_atfork` child handler), so a
//!   child registers its own slot and does not inherit its parent's allocations. The old one
//!   is leaked on purpose: another parent thread may have held one of its locks at the fork.
//!
//! No lock is held while building either: two threads racing on the first call both build,
//! one result is kept. Nothing runs at load time; a `.fini_array` entry unregisters the slot
//! at normal exit (and does nothing in a process that never used CUDA).

pub use crate::driver::devmap::Placed;
use crate::ffi::config::Config;
use crate::ffi::log::Level;
use crate::ledger::accounting::{Accounts, Deny, Ledger, NoSlot};
use crate::objects::context::ContextTable;
use hami_abi::layout::{UsageKind, MAX_DEVICES};
use hami_common::region::{
    compute_policy_name, DenyReason, OpenOutcome, ProcessId, Region, RegionConfig, SlotId,
};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicPtr, Ordering};
use std::sync::{Mutex, OnceLock, PoisonError};

/// Configuration and region, shared by every thread (and inherited by forked children).
pub struct Global {
    /// The parsed environment.
    pub config: Config,
    /// The region, or why it could not be opened.
    pub region: Result<Region, String>,
}

static GLOBAL: OnceLock<Global> = OnceLock::new();

/// The global state, built on first use.
#[inline]
pub fn global() -> &'static Global {
    match GLOBAL.get() {
        Some(g) => g,
        None => global_slow(),
    }
}

#[cold]
#[inline(never)]
fn global_slow() -> &'static Global {
    let (g, messages) = build_global();
    if GLOBAL.set(g).is_ok() {
        // Only the thread whose state was kept reports.
        for (level, m) in messages {
            crate::ffi::log::write(level, format_args!("{m}"));
        }
    }
    GLOBAL.get().expect("GLOBAL was just set")
}

fn device_count() -> u32 {
    crate::driver::devmap::driver_count().map_or(0, |n| n as u32)
}

fn build_global() -> (Global, Vec<(Level, String)>) {
    crate::ffi::log::init();
    let config = Config::from_env();
    let mut messages = Vec::new();
    for e in &config.errors {
        // Region permissions: reported with the region, which stays closed.
        let Some(consequence) = crate::ffi::config::consequence(e) else {
            continue;
        };
        messages.push((Level::Error, format!("{e}; {consequence}")));
    }
    if let Some(v) = &config.lock_timeout_invalid {
        messages.push((
            Level::Warn,
            format!(
                "invalid {}={v:?}: not a number of milliseconds (at most an hour); using {}",
                crate::ffi::config::ENV_LOCK_TIMEOUT,
                crate::ffi::config::DEFAULT_LOCK_TIMEOUT_MS
            ),
        ));
    }
    if let Some(v) = &config.oversubscribe_refused {
        messages.push((
            Level::Warn,
            format!(
                "{}={v:?} refused: hami-preload does not oversubscribe device memory into host memory; each device's quota stays its CUDA_DEVICE_MEMORY_LIMIT, within the GPU's physical memory",
                crate::ffi::config::ENV_OVERSUBSCRIBE
            ),
        ));
    }
    if let Some(v) = &config.backstop_invalid {
        messages.push((
            Level::Warn,
            format!(
                "invalid {}={v:?}: not a number of milliseconds; using {}",
                crate::ffi::config::ENV_BACKSTOP_INTERVAL,
                crate::ffi::config::DEFAULT_BACKSTOP_INTERVAL_MS
            ),
        ));
    }
    let rc = RegionConfig {
        limits: config.limits,
        limit_flags: config.limit_flags,
        // The devices this process really sees; 0 (unknown) before the driver is initialised.
        // Never the configured count: `CUDA_DEVICE_MEMORY_LIMIT` sets all 16 ordinals, and
        // the agent would then show 16 devices on a 1-GPU node (the count is recorded again
        // at registration, after `cuInit`).
        device_count: device_count(),
        mode: config.region_mode,
        group: config.region_group,
        sm_limits: config.sm_limits,
        compute_policy: config.compute_policy,
        task_priority: config.task_priority,
    };
    let opened = match config.region_error() {
        // Fail closed: neither create nor use a region with permissions nobody asked for.
        Some(e) => Err(format!(
            "shared region {}: not opened: {e}",
            config.region_path
        )),
        None => Region::open_or_create(Path::new(&config.region_path), &rc)
            .map(|(r, outcome)| (r.with_tuning(config.tuning()), outcome))
            .map_err(|e| e.to_string()),
    };
    let region = match opened {
        Ok((r, OpenOutcome::Created)) => {
            messages.push((
                Level::Info,
                format!("created shared region {}", config.region_path),
            ));
            Ok(r)
        }
        Ok((r, OpenOutcome::Existing { differs })) => {
            for d in r.compute_differences(&rc) {
                messages.push((
                    Level::Warn,
                    format!(
                        "device {}: this process's compute share ({} %, policy {}) differs from the shared region's ({} %, policy {}); the region's applies",
                        d.dev,
                        d.requested_sm_limit,
                        compute_policy_name(d.requested_policy),
                        d.region_sm_limit,
                        compute_policy_name(d.region_policy)
                    ),
                ));
            }
            for d in differs {
                messages.push((
                    Level::Warn,
                    format!(
                        "device {}: this process's limit ({} bytes, flags {}) differs from the shared region's ({} bytes, flags {}); the region's applies",
                        d.dev, d.requested_limit, d.requested_flags, d.region_limit, d.region_flags
                    ),
                ));
            }
            Ok(r)
        }
        Err(e) => {
            messages.push((
                Level::Error,
                format!("{e}; every allocation fails with CUDA_ERROR_OUT_OF_MEMORY"),
            ));
            Err(e)
        }
    };
    (Global { config, region }, messages)
}

/// Registration state, changed under [`Holdings`]'s `slot` lock.
#[derive(Default)]
struct Registration {
    /// The slot, while registered.
    current: Option<SlotId>,
    /// The last slot published for the hot path, boxed and never freed (a reader may still
    /// be copying from it after the slot is forgotten). Kept after that: registering again
    /// into the same slot (the usual case) reuses it, so boxes are only made for new slots.
    published: Option<&'static SlotId>,
}

/// What this process holds: its region slot and the tables of its driver objects (replaced
/// in a forked child).
pub struct Holdings {
    who: OnceLock<ProcessId>,
    slot: Mutex<Registration>,
    /// The registered slot for the hot path, read without a lock: null, or the box of
    /// [`Registration::published`].
    slot_id: AtomicPtr<SlotId>,
    exiting: AtomicBool,
    /// Tracked driver objects.
    pub accounts: Accounts,
    /// Contexts.
    pub contexts: ContextTable,
    /// Stream-ordered pools.
    pub pools: crate::objects::pool_reservations::PoolTable,
    /// Executable graphs with memory nodes and the graph pools' charge.
    pub graphs: crate::objects::graph_memory::GraphTable,
    /// Green contexts.
    pub greens: crate::objects::green::GreenTable,
    /// Mapped `cuMemCreate` handles, which outlive their release while mapped.
    pub mappings: crate::objects::vmm::Mappings,
    /// Modules and libraries.
    pub modules: crate::objects::module_memory::ModuleTable,
    /// The backstop's refresh clock.
    pub backstop: crate::ledger::backstop::Backstop,
    /// Context limits and local memory.
    pub limits: crate::objects::lmem::Limits,
    /// The launch gate's submissions in flight and spare events.
    pub gate: crate::compute::gate::Gate,
    denial_logged: [AtomicBool; MAX_DEVICES],
}

impl Holdings {
    fn new() -> Holdings {
        Holdings {
            who: OnceLock::new(),
            slot: Mutex::new(Registration::default()),
            slot_id: AtomicPtr::new(std::ptr::null_mut()),
            exiting: AtomicBool::new(false),
            accounts: Accounts::default(),
            contexts: ContextTable::default(),
            pools: Default::default(),
            graphs: Default::default(),
            greens: Default::default(),
            mappings: Default::default(),
            modules: Default::default(),
            backstop: Default::default(),
            limits: Default::default(),
            gate: Default::default(),
            denial_logged: std::array::from_fn(|_| AtomicBool::new(false)),
        }
    }

    /// Whether a fail-closed denial on `dev` was already logged at error level (and marks it).
    pub fn first_denial(&self, dev: usize) -> bool {
        self.denial_logged
            .get(dev)
            .is_some_and(|f| !f.swap(true, Ordering::Relaxed))
    }

    /// This process's slot, if registered. One load and a copy.
    #[inline]
    pub fn slot(&self) -> Option<SlotId> {
        let p = self.slot_id.load(Ordering::Acquire);
        // SAFETY: null or a box published by `register` (Release, after it was written),
        // never freed nor written again.
        (!p.is_null()).then(|| unsafe { *p })
    }

    /// Registers (once) and returns the slot.
    #[inline]
    fn ensure_slot(&self, region: &'static Region) -> Result<SlotId, Deny> {
        match self.slot() {
            Some(s) => Ok(s),
            None => self.register(region),
        }
    }

    #[cold]
    #[inline(never)]
    fn register(&self, region: &'static Region) -> Result<SlotId, Deny> {
        let mut g = self.slot.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(s) = g.current {
            return Ok(s);
        }
        let who = *self.who.get_or_init(ProcessId::current);
        let s = region.register(who).map_err(|e| {
            crate::debug!("registering in the shared region failed: {e}");
            Deny::NoSlot {
                why: NoSlot::of(&e),
                region: region.path(),
            }
        })?;
        // A slot already holding exactly this process (same pid and start time) is what a
        // previous program image left before `exec`: its objects are gone.
        for dev in 0..MAX_DEVICES {
            for kind in UsageKind::ALL {
                let u = region.slot_usage(s, dev, kind);
                if u != 0 {
                    region.uncharge(s, dev, kind, u);
                }
            }
        }
        crate::driver::devmap::record_all(region);
        crate::driver::hostpid::on_registered(region, s);
        g.current = Some(s);
        let boxed: &'static SlotId = match g.published {
            Some(b) if *b == s => b,
            _ => Box::leak(Box::new(s)),
        };
        g.published = Some(boxed);
        self.slot_id
            .store(std::ptr::from_ref(boxed).cast_mut(), Ordering::Release);
        crate::debug!(
            "registered in {} as slot {}",
            region.path().display(),
            s.index()
        );
        Ok(s)
    }

    fn forget_slot(&self) {
        let mut g = self.slot.lock().unwrap_or_else(PoisonError::into_inner);
        g.current = None;
        // The box stays (see `Registration::published`).
        self.slot_id.store(std::ptr::null_mut(), Ordering::Release);
    }
}

/// Where CUDA ordinal `ord` of this process lies among the container's devices
/// ([`crate::driver::devmap`]): the region's index, or what to do with a device the region does not
/// know.
#[inline]
pub fn placed(ord: usize) -> Placed {
    let g = global();
    crate::driver::devmap::placed(ord, g.region.as_ref().ok(), || container_limited(g))
}

/// Adds one to the region's refusal counter of the container's device that this process's
/// CUDA ordinal `ord` is (nothing for a device the region does not know).
pub fn count_refusal(ord: usize) {
    if let (Ok(region), Placed::Index(c)) = (&global().region, placed(ord)) {
        region.count_refusal(c);
    }
}

/// Whether the container has any memory limit or compute share (an unknown device then
/// fails closed).
pub fn container_limited_now() -> bool {
    container_limited(global())
}

/// Whether the container has any memory limit or compute share (an unknown device then
/// fails closed). Without a region everything fails closed anyway.
fn container_limited(g: &Global) -> bool {
    let c = &g.config;
    let local =
        (0..MAX_DEVICES).any(|d| c.limits[d] != 0 || c.limit_flags[d] != 0 || c.sm_limits[d] != 0);
    local
        || g.region.as_ref().map_or(true, |r| {
            (0..MAX_DEVICES).any(|d| r.limit(d) != 0 || r.limit_flags(d) != 0 || r.sm_limit(d) != 0)
        })
}

static PROC: AtomicPtr<Holdings> = AtomicPtr::new(std::ptr::null_mut());
static HANDLERS: std::sync::Once = std::sync::Once::new();

/// This process's holdings, created on first use.
#[inline]
pub fn holdings() -> &'static Holdings {
    let p = PROC.load(Ordering::Acquire);
    if !p.is_null() {
        // SAFETY: PROC only ever holds leaked boxes, never freed.
        return unsafe { &*p };
    }
    holdings_slow()
}

#[cold]
#[inline(never)]
fn holdings_slow() -> &'static Holdings {
    HANDLERS.call_once(|| {
        // SAFETY: registering a handler with no preconditions; the library is never unloaded
        // (linked with -z nodelete).
        unsafe { libc::pthread_atfork(None, None, Some(atfork_child)) };
    });
    let fresh = Box::into_raw(Box::new(Holdings::new()));
    match PROC.compare_exchange(
        std::ptr::null_mut(),
        fresh,
        Ordering::AcqRel,
        Ordering::Acquire,
    ) {
        // SAFETY: just published, never freed.
        Ok(_) => unsafe { &*fresh },
        Err(existing) => {
            // SAFETY: `fresh` was never shared.
            drop(unsafe { Box::from_raw(fresh) });
            // SAFETY: as above.
            unsafe { &*existing }
        }
    }
}

extern "C" fn atfork_child() {
    // The child starts with no slot and no objects; the parent's state is leaked (one of
    // its mutexes may have been held by another parent thread).
    PROC.store(std::ptr::null_mut(), Ordering::Release);
}

/// Unregisters the slot at normal process exit. Other threads may still be running hooks:
/// they then fail closed (the state itself is never freed).
extern "C" fn at_exit() {
    let p = PROC.load(Ordering::Acquire);
    if p.is_null() {
        return;
    }
    // SAFETY: never freed.
    let p = unsafe { &*p };
    p.exiting.store(true, Ordering::Release);
    let Some(slot) = p.slot() else { return };
    if let Some(Ok(region)) = GLOBAL.get().map(|g| g.region.as_ref()) {
        region.unregister(slot);
    }
    p.forget_slot();
}

#[used]
#[link_section = ".fini_array"]
static AT_EXIT: extern "C" fn() = at_exit;

/// The [`Ledger`] of this process: the region, through its slot.
pub struct ProcLedger {
    /// Global state.
    pub g: &'static Global,
    /// This process's holdings.
    pub p: &'static Holdings,
}

impl ProcLedger {
    /// The ledger of the calling process.
    pub fn current() -> ProcLedger {
        ProcLedger {
            g: global(),
            p: holdings(),
        }
    }

    fn region(&self) -> Result<&'static Region, Deny> {
        let g: &'static Global = self.g;
        g.region.as_ref().map_err(|e| Deny::NoRegion(e.as_str()))
    }

    /// Bytes this process has charged on its CUDA ordinal `dev` other than context memory (0
    /// before it registers, and for a device the region does not know).
    pub fn own_non_context(&self, dev: usize) -> u64 {
        let (Ok(region), Some(slot)) = (self.region(), self.p.slot()) else {
            return 0;
        };
        let Placed::Index(cdev) = placed(dev) else {
            return 0;
        };
        UsageKind::ALL
            .iter()
            .filter(|&&k| k != UsageKind::Context)
            .map(|&k| region.slot_usage(slot, cdev, k))
            .fold(0u64, u64::saturating_add)
    }

    fn local_invalid(&self, cdev: usize) -> bool {
        self.g
            .config
            .limit_flags
            .get(cdev)
            .is_some_and(|f| f & hami_abi::layout::LIMIT_FLAG_INVALID != 0)
    }
}

/// The [`Ledger`]'s `dev` is this process's CUDA ordinal (what its tables and the driver
/// use); the region is charged at the container's index of that device ([`placed`]).
impl Ledger for ProcLedger {
    fn try_charge(&self, dev: usize, kind: UsageKind, bytes: u64) -> Result<(), Deny> {
        if self.p.exiting.load(Ordering::Relaxed) {
            return Err(Deny::Exiting);
        }
        let cdev = match placed(dev) {
            Placed::Index(c) => c,
            Placed::Untracked => return Ok(()),
            Placed::Refused => return Err(Deny::UnknownDevice(dev)),
        };
        if self.local_invalid(cdev) {
            return Err(Deny::LocalConfig(cdev));
        }
        let region = self.region()?;
        let mut retried = false;
        loop {
            let slot = self.p.ensure_slot(region)?;
            match region.try_charge(slot, cdev, kind, bytes) {
                Ok(()) => return Ok(()),
                Err(d) if !retried && d.reason == DenyReason::SlotLost => {
                    crate::warn!(
                        "process slot {} was reclaimed; registering again",
                        slot.index()
                    );
                    self.p.forget_slot();
                }
                Err(d) if !retried && d.reason == DenyReason::OverLimit => {
                    // Dead processes may still hold usage: reclaim, then decide again.
                    if region.reclaim_dead().is_empty() {
                        return Err(Deny::Region(d));
                    }
                }
                Err(d) => return Err(Deny::Region(d)),
            }
            retried = true;
        }
    }

    fn force_charge(&self, dev: usize, kind: UsageKind, bytes: u64) {
        if bytes == 0 || self.p.exiting.load(Ordering::Relaxed) {
            return;
        }
        let Placed::Index(cdev) = placed(dev) else {
            return;
        };
        if let Ok(region) = self.region() {
            if let Ok(slot) = self.p.ensure_slot(region) {
                region.force_charge(slot, cdev, kind, bytes);
            }
        }
    }

    fn uncharge(&self, dev: usize, kind: UsageKind, bytes: u64) {
        let Placed::Index(cdev) = placed(dev) else {
            return;
        };
        if let (Ok(region), Some(slot)) = (self.region(), self.p.slot()) {
            region.uncharge(slot, cdev, kind, bytes);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The hot path's copy of the slot follows registration, loss and registration again,
    /// and readers racing with those changes only ever see the whole slot of this process
    /// or none.
    #[test]
    fn the_published_slot_follows_registration_and_is_never_torn() {
        let dir = std::env::temp_dir().join(format!("hami-state-slot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (region, _) = Region::open_or_create(&dir.join("region"), &RegionConfig::default())
            .expect("region in a temp dir");
        let region: &'static Region = Box::leak(Box::new(region));
        let p = Holdings::new();
        assert_eq!(p.slot(), None, "not registered yet");
        let s = p.ensure_slot(region).expect("registers");
        assert_eq!(p.slot(), Some(s));
        assert_eq!(s.owner(), ProcessId::current());
        assert!(region.is_registered(s));
        p.forget_slot();
        assert_eq!(p.slot(), None, "forgotten");
        let again = p.ensure_slot(region).expect("registers again");
        assert_eq!(p.slot(), Some(again));
        assert_eq!(again, s, "the same process gets its slot back");
        let boxed = p.slot_id.load(Ordering::Relaxed);

        let stop = AtomicBool::new(false);
        std::thread::scope(|t| {
            for _ in 0..2 {
                t.spawn(|| {
                    let mut seen = 0u32;
                    while !stop.load(Ordering::Relaxed) {
                        if let Some(got) = p.slot() {
                            assert_eq!(got, s);
                            seen += 1;
                        }
                    }
                    std::hint::black_box(seen);
                });
            }
            for _ in 0..2000 {
                p.forget_slot();
                assert_eq!(p.ensure_slot(region), Ok(s));
            }
            stop.store(true, Ordering::Relaxed);
        });
        assert_eq!(
            p.slot_id.load(Ordering::Relaxed),
            boxed,
            "registering again into the same slot made no new box"
        );
        region.unregister(s);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
