//! Measuring context and module memory against the real driver and NVML: the [`ContextMeter`] the
//! context hooks hand to [`crate::objects::context::ContextTable`] (NVML readings, the driver's own
//! `cuMemGetInfo_v2` through a given context, the region's charges, the region-wide
//! context-creation lock), the current context and its device, and the log line that says
//! how a context was charged. [`nvml`]: NVML device handles and readings.
//!
//! Above [`crate::state`] (it reads the process's tables and the region), below the hooks.

pub mod nvml;

use crate::ffi::cuda::*;
use crate::ffi::symbols::{self, Cu};
use crate::ledger::policy::ContextCost;
use crate::objects::context::admit::Footprint;
use crate::objects::context::lock::{self, CtxLock};
use crate::objects::context::{ContextMeter, ContextOutcome, Held};
use crate::state::{self, ProcLedger};
use nvml::{nvml_own_used, nvml_ready, nvml_used};

/// The current context's device and the context itself. The device comes from the process's
/// context → device cache when it can (see [`crate::ledger::ctx_devices`]), else from `cuCtxGetDevice`.
pub(crate) fn current_dev_ctx() -> Result<(usize, usize), CUresult> {
    let cache = &state::holdings().accounts.ctx_devices;
    // Before asking the driver: a context destroyed after this point is not cached.
    let token = cache.token();
    let mut ctx: CUcontext = std::ptr::null_mut();
    // SAFETY: documented type; valid out pointer.
    if let Some(f) = unsafe { symbols::cu::<FnCtxGetCurrent>(Cu::cuCtxGetCurrent) } {
        // SAFETY: valid out pointer.
        if unsafe { f(&mut ctx) } != CUDA_SUCCESS {
            ctx = std::ptr::null_mut();
        }
    }
    let ctx = ctx as usize;
    if let Some(dev) = cache.lookup(token, ctx) {
        return Ok((dev, ctx));
    }
    // SAFETY: documented types.
    let get_dev =
        unsafe { symbols::cu::<FnCtxGetDevice>(Cu::cuCtxGetDevice) }.ok_or(CUDA_ERROR_NOT_FOUND)?;
    let mut dev: CUdevice = 0;
    // SAFETY: valid out pointer.
    let r = unsafe { get_dev(&mut dev) };
    if r != CUDA_SUCCESS {
        return Err(r);
    }
    let dev = dev.max(0) as usize;
    cache.fill(token, ctx, dev);
    Ok((dev, ctx))
}

/// Takes the region-wide context-creation lock (see [`crate::objects::context::lock`]). When no
/// measurement is possible (neither NVML nor the driver's `cuMemGetInfo_v2`) there is
/// nothing to protect: no lock (it would only serialize context creation across the
/// region's processes).
fn ctx_serialize() -> Option<Held> {
    if !nvml_ready() && !driver_info_available() {
        return None;
    }
    let g = state::global();
    g.region.as_ref().ok()?;
    match CtxLock::acquire(&g.config.region_path, lock::WAIT_LIMIT) {
        Ok(l) => Some(Box::new(l)),
        Err(e) => {
            crate::warn!("context-creation lock: {e}; measuring context memory without it");
            None
        }
    }
}

/// This process's non-context charges on `dev`.
fn own_data(dev: usize) -> u64 {
    // Plus the limit memory the driver holds for this process (charged as context memory by
    // `lmem`, but no context's measured footprint): what arrives of it during a measured
    // call (a stack raise, a heap put there by a launch) must not be counted again.
    let l = ProcLedger::current();
    l.own_non_context(dev)
        .saturating_add(l.p.limits.on_device(dev))
}

/// The container index of this process's CUDA ordinal `dev`, when the region knows it.
fn cdev(dev: usize) -> Option<usize> {
    match state::placed(dev) {
        state::Placed::Index(c) => Some(c),
        _ => None,
    }
}

/// Non-context charges of every process sharing the region on CUDA ordinal `dev`'s device.
fn region_data(dev: usize) -> u64 {
    let Ok(region) = &state::global().region else {
        return 0;
    };
    let Some(c) = cdev(dev) else {
        return state::holdings().limits.on_device(dev);
    };
    let kinds: Vec<usize> = hami_abi::layout::UsageKind::ALL
        .iter()
        .filter(|&&k| k != hami_abi::layout::UsageKind::Context)
        .map(|k| k.index())
        .collect();
    region
        .snapshot()
        .slots
        .iter()
        .filter_map(|s| s.usage.get(c))
        .flat_map(|u| kinds.iter().map(move |&k| u[k]))
        .fold(0u64, u64::saturating_add)
        // This process's limit memory on the device (as in `own_data`).
        .saturating_add(state::holdings().limits.on_device(dev))
}

/// Everything every process sharing the region has charged on CUDA ordinal `dev`'s device,
/// all kinds.
fn region_used(dev: usize) -> u64 {
    let (Ok(region), Some(c)) = (&state::global().region, cdev(dev)) else {
        return 0;
    };
    region
        .snapshot()
        .slots
        .iter()
        .filter_map(|s| s.usage.get(c))
        .flat_map(|u| u.iter().copied())
        .fold(0u64, u64::saturating_add)
}

/// The region's context footprint of CUDA ordinal `dev`'s device (0: not measured yet, no
/// region, or a device the region does not know).
fn footprint(dev: usize) -> u64 {
    let (Ok(r), Some(c)) = (&state::global().region, cdev(dev)) else {
        return 0;
    };
    r.context_footprint(c)
}

/// Stores a measured context footprint of CUDA ordinal `dev`'s device in the region.
fn set_footprint(dev: usize, bytes: u64) {
    if let (Ok(r), Some(c)) = (&state::global().region, cdev(dev)) {
        let dev = c;
        if r.context_footprint(dev) != bytes {
            crate::debug!("device {dev}: context footprint {bytes} bytes stored in the region");
            r.set_context_footprint(dev, bytes);
        }
    }
}

/// Whether the driver offers `cuMemGetInfo_v2` (the driver-only context measurement).
fn driver_info_available() -> bool {
    // SAFETY: documented type.
    unsafe { symbols::cu::<FnMemGetInfo>(Cu::cuMemGetInfo_v2) }.is_some()
}

/// `(free, total)` of `ctx`'s device per the real `cuMemGetInfo_v2`, with `ctx` made
/// current for the reading (`cuCtxPushCurrent_v2` / `cuCtxPopCurrent_v2`), so that the
/// calling thread's context stack is left exactly as it was. If `ctx` is already current no
/// push is needed; otherwise, without both push and pop, `None`.
fn driver_info(ctx: usize) -> Option<(u64, u64)> {
    // SAFETY: documented type.
    let info = unsafe { symbols::cu::<FnMemGetInfo>(Cu::cuMemGetInfo_v2) }?;
    let mut cur: CUcontext = std::ptr::null_mut();
    // SAFETY: documented type.
    if let Some(get) = unsafe { symbols::cu::<FnCtxGetCurrent>(Cu::cuCtxGetCurrent) } {
        // SAFETY: valid out pointer.
        if unsafe { get(&mut cur) } != CUDA_SUCCESS {
            cur = std::ptr::null_mut();
        }
    }
    let pop = if cur as usize == ctx {
        None
    } else {
        // SAFETY: documented types.
        let push = unsafe { symbols::cu::<FnCtxPushCurrent>(Cu::cuCtxPushCurrent_v2) }?;
        // SAFETY: documented type.
        let pop = unsafe { symbols::cu::<FnCtxPopCurrent>(Cu::cuCtxPopCurrent_v2) }?;
        // SAFETY: a context of this process (the driver checks it).
        if unsafe { push(ctx as CUcontext) } != CUDA_SUCCESS {
            return None;
        }
        Some(pop)
    };
    let (mut free, mut total) = (0usize, 0usize);
    // SAFETY: valid out pointers; the real function, not our quota view.
    let r = unsafe { info(&mut free, &mut total) };
    if let Some(pop) = pop {
        let mut popped: CUcontext = std::ptr::null_mut();
        // SAFETY: valid out pointer; pops the context pushed above.
        unsafe { pop(&mut popped) };
    }
    (r == CUDA_SUCCESS).then_some((free as u64, total as u64))
}

/// The meter of context memory used by the context hooks.
pub(crate) fn meter() -> ContextMeter<'static> {
    ContextMeter {
        configured: state::global().config.context_overhead,
        used_now: &nvml_used,
        own_used: &nvml_own_used,
        own_data: &own_data,
        region_data: &region_data,
        serialize: &ctx_serialize,
        nvml: nvml_ready(),
        driver_info: &driver_info,
        region_used: &region_used,
        footprint: &footprint,
        set_footprint: &set_footprint,
    }
}

/// Logs a context creation: a refusal (at warning level, shown by default: the application
/// sees a failed `cudaSetDevice` / first call; also counted in the region's refusal counter),
/// or what was admitted and charged.
pub(crate) fn log_context_outcome(what: &str, dev: usize, outcome: Option<ContextOutcome>) {
    let Some(o) = outcome else { return };
    if matches!(o, ContextOutcome::Refused { .. }) {
        state::count_refusal(dev);
    }
    match o {
        ContextOutcome::Refused {
            footprint,
            deny,
            destroyed: false,
        } => crate::warn!(
            "{what}: CUDA_ERROR_OUT_OF_MEMORY: device {dev}: a new context takes {} bytes ({}) and does not fit the quota: {deny}; the context was not created",
            footprint.bytes(),
            footprint_source(footprint)
        ),
        ContextOutcome::Refused {
            footprint,
            deny,
            destroyed: true,
        } => crate::warn!(
            "{what}: CUDA_ERROR_OUT_OF_MEMORY: device {dev}: a new context takes {} bytes (measured: the container's first context on the device) and does not fit the quota: {deny}; the context was destroyed again",
            footprint.bytes()
        ),
        ContextOutcome::Charged {
            footprint,
            admitted,
            cost,
            charged,
            waited,
        } => {
            log_context_cost(what, dev, Some(cost));
            if let Some(w) = waited.filter(|w| w.as_millis() > 0) {
                crate::info!(
                    "{what}: device {dev}: waited {} ms for the context-creation lock (the container's first context on the device being measured)",
                    w.as_millis()
                );
            }
            crate::info!(
                "{what}: device {dev}: admitted {} bytes before the creation ({}{}), charged {charged} after",
                if admitted { footprint.bytes() } else { 0 },
                footprint_source(footprint),
                if admitted { "" } else { "; not admitted: the region refused for a reason other than the quota" }
            );
        }
    }
}

/// Where a context footprint came from, for the log.
fn footprint_source(f: Footprint) -> &'static str {
    match f {
        Footprint::Configured(_) => "HAMI_CONTEXT_OVERHEAD",
        Footprint::Measured(_) => {
            "the device's context footprint measured earlier in the container"
        }
        Footprint::Unknown => {
            "footprint not measured yet: the container's first context on the device"
        }
    }
}

/// Logs what a context creation was charged and how it was measured.
pub(crate) fn log_context_cost(what: &str, dev: usize, cost: Option<ContextCost>) {
    match cost {
        Some(ContextCost::Unknown) => crate::warn!(
            "{what}: device {dev}: context memory could not be measured (no NVML or driver reading, or one disturbed by other processes' memory); charged 0 bytes (set HAMI_CONTEXT_OVERHEAD to fix a value)"
        ),
        Some(ContextCost::Driver { bytes, first: false, serialized }) => crate::info!(
            "{what}: device {dev}: context charged {bytes} bytes (measured from cuMemGetInfo (no NVML): free before (through this process's existing context) minus free after (through the new one), corrected for the region's data charged meanwhile; context-creation lock {})",
            if serialized { "held" } else { "NOT held" }
        ),
        Some(ContextCost::Driver { bytes, first: true, serialized }) => crate::info!(
            "{what}: device {dev}: context charged {bytes} bytes (measured from cuMemGetInfo (no NVML): device used after (total - free through the new context) minus the region's accounted usage; assumes the region's processes are the device's only users; context-creation lock {})",
            if serialized { "held" } else { "NOT held" }
        ),
        Some(ContextCost::Configured(b)) => {
            crate::info!("{what}: device {dev}: context charged {b} bytes (HAMI_CONTEXT_OVERHEAD)")
        }
        Some(ContextCost::PerProcess(b)) => crate::info!(
            "{what}: device {dev}: context charged {b} bytes (measured per process: this process's NVML used memory after minus before)"
        ),
        Some(ContextCost::DeviceDelta { bytes, serialized: true }) => crate::info!(
            "{what}: device {dev}: context charged {bytes} bytes (measured at device level, serialized: NVML device used memory after minus before under the region's context-creation lock; this pid is not in NVML's process list)"
        ),
        Some(ContextCost::DeviceDelta { bytes, serialized: false }) => crate::warn!(
            "{what}: device {dev}: context charged {bytes} bytes (measured at device level WITHOUT the context-creation lock: may include other processes' concurrent contexts)"
        ),
        None => {}
    }
}
