//! What several hooks share: allocate-and-charge, release, refusal logging, the backstop's
//! refresh and what a destroyed context takes with it.

use crate::ffi::cuda::*;
use crate::ffi::symbols::{self, Cu};
use crate::ledger::accounting::{AllocError, Allocated, Deny, KeySpace};
use crate::ledger::backstop::{self, Backstop};
use crate::measure::current_dev_ctx;
use crate::measure::nvml::{nvml_own_used, nvml_ready};
use crate::objects::context::OwnUsage;
use crate::objects::pool_reservations::PoolReading;
use crate::state::{self, Holdings, ProcLedger};
use hami_abi::layout::{UsageKind, MAX_DEVICES};
use std::ffi::c_int;

/// Logs and counts a refused memory request (`CUDA_ERROR_OUT_OF_MEMORY` without the
/// driver's say). Every refusal adds one to the region's per-device counter
/// (`DeviceCompute::refusals`, what the agent exports). An over-quota refusal is a warning,
/// rate-limited per device ([`crate::ledger::refusals`]): the first at once, then at most one line
/// per interval saying how many were refused since the last; a fail-closed refusal is an
/// error the first time, debug after.
pub(crate) fn report_denial(what: &str, p: &Holdings, dev: usize, d: &Deny) {
    state::count_refusal(dev);
    if d.is_over_limit() {
        match crate::ledger::refusals::REFUSAL_LOG.on_refusal(dev, backstop::now_ms()) {
            Some(r) if r.first => crate::warn!(
                "{what}: CUDA_ERROR_OUT_OF_MEMORY: {d} (further refusals on device {dev} are reported at most every {} s)",
                crate::ledger::refusals::REPORT_INTERVAL_MS / 1000
            ),
            Some(r) => crate::warn!(
                "{what}: CUDA_ERROR_OUT_OF_MEMORY: {d} ({} requests refused on device {dev} since the last report)",
                r.refused
            ),
            None => crate::debug!("{what}: CUDA_ERROR_OUT_OF_MEMORY: {d}"),
        }
    } else if p.first_denial(dev) {
        crate::error!("{what}: CUDA_ERROR_OUT_OF_MEMORY: {d}");
    } else {
        crate::debug!("{what}: CUDA_ERROR_OUT_OF_MEMORY: {d}");
    }
}

pub(crate) fn finish(
    what: &str,
    l: &ProcLedger,
    dev: usize,
    r: Result<(), AllocError>,
) -> CUresult {
    match r {
        Ok(()) => CUDA_SUCCESS,
        Err(e) => {
            if let AllocError::Denied(d) = &e {
                report_denial(what, l.p, dev, d);
            }
            e.code()
        }
    }
}

/// Allocation of a device pointer on the current context's device. A zero-byte request
/// needs no admission and goes straight to the driver.
///
/// # Safety
/// `dptr` is null or writable.
pub(crate) unsafe fn alloc_ptr(
    what: &str,
    dptr: *mut CUdeviceptr,
    bytes: u64,
    real: impl FnOnce() -> CUresult,
) -> CUresult {
    if dptr.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    if bytes == 0 {
        // Nothing to admit, whatever the quota says: the driver's answer.
        return real();
    }
    let (dev, ctx) = match current_dev_ctx() {
        Ok(x) => x,
        Err(e) => return e,
    };
    let l = ProcLedger::current();
    let r = l.p.accounts.alloc(
        &l,
        KeySpace::Pointer,
        dev,
        ctx,
        bytes,
        || match real() {
            CUDA_SUCCESS => Ok(Allocated {
                // SAFETY: the driver wrote *dptr on success.
                key: unsafe { *dptr },
                bytes,
            }),
            e => Err(e),
        },
        |_| {},
    );
    if r.is_ok() {
        backstop_tick(&l, dev);
    }
    finish(what, &l, dev, r)
}

pub(crate) fn release(ns: KeySpace, key: u64, real: impl FnOnce() -> CUresult) -> CUresult {
    let l = ProcLedger::current();
    l.p.accounts.free(&l, ns, key, real)
}

/// Allocation of an array (or mipmapped array) of `dims` (width, height, depth or layers),
/// charged `estimate`. A refused descriptor whose dimensions no array on the device can have
/// gets the driver's `CUDA_ERROR_INVALID_VALUE`, not an out-of-memory code.
pub(crate) fn array_alloc(
    what: &str,
    ns: KeySpace,
    out: *mut CUarray,
    dims: [u64; 3],
    estimate: u64,
    real: impl FnOnce() -> CUresult,
) -> CUresult {
    let (dev, ctx) = match current_dev_ctx() {
        Ok(x) => x,
        Err(e) => return e,
    };
    let l = ProcLedger::current();
    let r = l.p.accounts.alloc(
        &l,
        ns,
        dev,
        ctx,
        estimate,
        || match real() {
            CUDA_SUCCESS => Ok(Allocated {
                // SAFETY: the driver wrote *out on success.
                key: unsafe { *out } as u64,
                bytes: estimate,
            }),
            e => Err(e),
        },
        |_| {},
    );
    if matches!(r, Err(AllocError::Denied(_)))
        && crate::ledger::policy::array_dims_beyond(dims, device_array_bound(dev))
    {
        crate::debug!(
            "{what}: CUDA_ERROR_INVALID_VALUE: dimensions {dims:?} are beyond what device {dev} \
             supports for any array (the driver's answer; not charged)"
        );
        return CUDA_ERROR_INVALID_VALUE;
    }
    finish(what, &l, dev, r)
}

/// The largest array dimension device `dev` states ([`crate::ledger::policy::ARRAY_DIM_ATTRIBUTES`]),
/// or 0 when the driver does not say.
#[cold]
fn device_array_bound(dev: usize) -> u64 {
    // SAFETY: the documented type of cuDeviceGetAttribute.
    let Some(get) = (unsafe {
        crate::ffi::symbols::cu::<FnDeviceGetAttribute>(
            crate::ffi::symbols::Cu::cuDeviceGetAttribute,
        )
    }) else {
        return 0;
    };
    let Ok(dev) = CUdevice::try_from(dev) else {
        return 0;
    };
    crate::ledger::policy::ARRAY_DIM_ATTRIBUTES
        .iter()
        .filter_map(|&a| {
            let mut v: std::ffi::c_int = 0;
            // SAFETY: a valid out pointer; attribute and device are plain integers.
            (unsafe { get(&mut v, a, dev) } == CUDA_SUCCESS).then_some(v)
        })
        .filter(|&v| v > 0)
        .max()
        .map_or(0, |v| v as u64)
}

// ---------------------------------------------------------------- contexts

/// Context `ctx` was destroyed (or reset): its modules are gone, and the pools may have
/// given memory back.
pub(crate) fn context_gone(l: &ProcLedger, ctx: usize) {
    l.p.modules.drop_context(l, ctx);
    l.p.pools.drop_context(l, ctx, &read_pool);
    l.p.limits.drop_context(l, ctx);
}

// ---------------------------------------------------------------- backstop

/// After an allocation on `dev`: asks for a backstop refresh only when the quota's headroom
/// is small (two atomic loads otherwise).
#[inline]
pub(crate) fn backstop_tick(l: &ProcLedger, dev: usize) {
    if l.g.config.backstop_interval_ms.is_none() {
        return;
    }
    if let (Ok(r), state::Placed::Index(c)) = (&l.g.region, state::placed(dev)) {
        if backstop::headroom_small(r.limit(c), r.admitted(c)) {
            backstop_poll(Some(dev));
        }
    }
}

/// Refreshes "other" on CUDA ordinal `only` (or on every ordinal whose container device this
/// process has charges on), for each device at most once per interval.
#[cold]
pub(crate) fn backstop_poll(only: Option<usize>) {
    let g = state::global();
    let Some(interval) = g.config.backstop_interval_ms else {
        return;
    };
    let Ok(region) = &g.region else {
        return;
    };
    let p = state::holdings();
    let Some(slot) = p.slot() else {
        return;
    };
    let now = backstop::now_ms();
    let charged = |c: usize| {
        UsageKind::ALL
            .iter()
            .any(|&k| region.slot_usage(slot, c, k) != 0)
    };
    // (ordinal: for the driver and NVML, container index: for the region)
    let devs: Vec<(usize, usize)> = match only {
        Some(d) if d < MAX_DEVICES => match state::placed(d) {
            state::Placed::Index(c) => vec![(d, c)],
            _ => return,
        },
        Some(_) => return,
        None => (0..crate::driver::devmap::driver_count()
            .unwrap_or(0)
            .min(MAX_DEVICES))
            .filter_map(|d| match state::placed(d) {
                state::Placed::Index(c) if charged(c) => Some((d, c)),
                _ => None,
            })
            .collect(),
    };
    for (dev, c) in devs {
        if !p.backstop.claim(dev, now, interval) || !nvml_ready() {
            continue;
        }
        let OwnUsage::Listed(own) = nvml_own_used(dev) else {
            continue;
        };
        let accounted = UsageKind::ALL
            .iter()
            .filter(|&&k| k != UsageKind::Other)
            .map(|&k| region.slot_usage(slot, c, k))
            .fold(0u64, u64::saturating_add);
        let current = region.slot_usage(slot, c, UsageKind::Other);
        let target = backstop::other_target(own, accounted);
        let l = ProcLedger::current();
        let change = Backstop::apply(&l, dev, current, target);
        if change != 0 {
            crate::debug!(
                "backstop: device {dev} (the container's device {c}): the driver reports {own} bytes for this process, {accounted} accounted: other = {target} bytes"
            );
        }
    }
}

/// One `cuuint64_t` attribute of a pool (real `cuMemPoolGetAttribute`).
fn pool_attr(pool: u64, attr: c_int) -> Option<u64> {
    // SAFETY: documented type.
    let get = unsafe { symbols::cu::<FnMemPoolAttribute>(Cu::cuMemPoolGetAttribute) }?;
    let mut v: u64 = 0;
    // SAFETY: a `cuuint64_t` attribute and a valid out pointer.
    let r = unsafe { get(pool as CUmemoryPool, attr, (&mut v as *mut u64).cast()) };
    (r == CUDA_SUCCESS).then_some(v)
}

/// Reserved and used bytes of `pool`, `None` if the driver cannot say (or the pool is gone).
pub(crate) fn read_pool(pool: u64) -> Option<PoolReading> {
    Some(PoolReading {
        reserved: pool_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT)?,
        used: pool_attr(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT)?,
    })
}
