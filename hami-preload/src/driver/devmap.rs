//! Which of the container's devices each CUDA ordinal of this process is (issue 29).
//!
//! The region, `CUDA_DEVICE_MEMORY_LIMIT_<i>` and `CUDA_DEVICE_SM_LIMIT_<i>` number the
//! *container's* devices; the driver numbers this process's (after its
//! `CUDA_VISIBLE_DEVICES`). Every use of the region or of the configured limits goes
//! through [`placed`] first; driver calls and this process's own tables keep the ordinal.
//! The rule is [`hami_common::visible::place`] (`docs/shared-region.md`, "Which device"):
//! with the variable unset ordinal `k` is container device `k`, an index entry names the
//! container's device, a UUID entry is looked up among the UUIDs the region recorded.
//!
//! A placement found is cached for the life of the process image (fork included: the same
//! variable, the same driver). An ordinal that could not be placed is tried again at each use
//! (a process that sees the device by index may record it meanwhile), logged once; what the
//! caller does with it is [`Placed`]. Placements that define the container's device (variable
//! unset, an index entry) are recorded in the region: the UUID at the container index and the
//! device count raised to cover it.

use crate::ffi::cuda::{CUdevice, CUuuid, CUDA_SUCCESS};
use crate::ffi::symbols::{self, Cu};
use hami_abi::layout::MAX_DEVICES;
use hami_abi::uuid::GpuUuid;
use hami_common::region::Region;
use hami_common::visible::{self, Placement};
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::OnceLock;

/// Where a CUDA ordinal of this process lies, for the caller.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placed {
    /// The container's device `.0`: the region index and the `_<i>` of the limits.
    Index(usize),
    /// Not placed, and the container has neither a memory limit nor a compute share: nothing
    /// to enforce, so the device is used untracked (no charge, no view changed).
    Untracked,
    /// Not placed while the container has limits: fail closed on this device (allocations
    /// refused, the views show nothing free). Never another device's quota.
    Refused,
}

const UNPLACED: u8 = u8::MAX;

/// Cached container index per ordinal ([`UNPLACED`] until found).
static MAP: [AtomicU8; MAX_DEVICES] = [const { AtomicU8::new(UNPLACED) }; MAX_DEVICES];
/// Whether an ordinal that could not be placed was logged.
static REPORTED: [AtomicBool; MAX_DEVICES] = [const { AtomicBool::new(false) }; MAX_DEVICES];
/// `CUDA_VISIBLE_DEVICES` as the process started (the driver reads it once, at `cuInit`).
static VISIBLE: OnceLock<Option<String>> = OnceLock::new();
/// The UUID of each ordinal, once the driver answers `cuDeviceGetCount`.
static DRIVER: OnceLock<Vec<Option<[u8; 16]>>> = OnceLock::new();

fn visible_var() -> Option<&'static str> {
    VISIBLE
        .get_or_init(|| crate::ffi::config::getenv(visible::ENV_CUDA_VISIBLE_DEVICES))
        .as_deref()
}

/// The number of devices this process sees (`cuDeviceGetCount`), `None` before the driver is
/// initialised or without it.
pub fn driver_count() -> Option<usize> {
    // SAFETY: FnDeviceGetCount is the type of cuDeviceGetCount.
    let f = unsafe { symbols::cu::<crate::ffi::cuda::FnDeviceGetCount>(Cu::cuDeviceGetCount) }?;
    let mut n = 0;
    // SAFETY: valid out pointer.
    (unsafe { f(&mut n) } == CUDA_SUCCESS).then_some(n.max(0) as usize)
}

/// The UUID of CUDA device `dev` (real `cuDeviceGetUuid_v2`, else `cuDeviceGetUuid`).
pub fn device_uuid(dev: CUdevice) -> Option<[u8; 16]> {
    // SAFETY: FnDeviceGetUuid is the type of both functions.
    let f = unsafe { symbols::cu::<crate::ffi::cuda::FnDeviceGetUuid>(Cu::cuDeviceGetUuid_v2) }
        // SAFETY: as above.
        .or_else(|| unsafe {
            symbols::cu::<crate::ffi::cuda::FnDeviceGetUuid>(Cu::cuDeviceGetUuid)
        })?;
    let mut u = CUuuid::default();
    // SAFETY: valid out pointer.
    (unsafe { f(&mut u, dev) } == CUDA_SUCCESS).then_some(u.bytes)
}

/// The UUIDs of this process's ordinals, read once the driver is initialised.
fn driver_uuids() -> Option<&'static [Option<[u8; 16]>]> {
    if let Some(v) = DRIVER.get() {
        return Some(v);
    }
    let n = driver_count()?.min(MAX_DEVICES);
    let uuids = (0..n).map(|d| device_uuid(d as CUdevice)).collect();
    let _ = DRIVER.set(uuids);
    DRIVER.get().map(Vec::as_slice)
}

/// The container index of CUDA ordinal `ord`, or `None` when it cannot be placed (see the
/// module documentation); `limited` says whether the container has any limit, which decides
/// [`Placed::Refused`] against [`Placed::Untracked`]. One atomic load once placed.
#[inline]
pub fn placed(ord: usize, region: Option<&Region>, limited: impl FnOnce() -> bool) -> Placed {
    if let Some(c) = MAP.get(ord) {
        let v = c.load(Ordering::Relaxed);
        if v != UNPLACED {
            return Placed::Index(v as usize);
        }
    }
    match place_slow(ord, region, true) {
        Some(i) => Placed::Index(i),
        None if limited() => Placed::Refused,
        None => Placed::Untracked,
    }
}

/// Places every ordinal this process sees and records the authoritative ones in `region`
/// (at registration, so that a later process naming a device by UUID finds it). Logs
/// nothing for an ordinal it cannot place: that is said when the device is used.
pub fn record_all(region: &Region) {
    let Some(uuids) = driver_uuids() else { return };
    for ord in 0..uuids.len() {
        place_slow(ord, Some(region), false);
    }
}

#[cold]
#[inline(never)]
fn place_slow(ord: usize, region: Option<&Region>, report: bool) -> Option<usize> {
    let uuids = driver_uuids()?;
    let uuid = uuids.get(ord).copied().flatten();
    let recorded: [[u8; 16]; MAX_DEVICES] =
        std::array::from_fn(|d| region.map_or([0; 16], |r| r.uuid(d)));
    let shown = uuid.map_or_else(|| "no UUID".to_string(), |u| GpuUuid(u).to_string());
    match visible::place(ord, visible_var(), uuid.as_ref(), &recorded) {
        Placement::At { index, by } => {
            if let (true, Some(r), Some(u)) = (by.authoritative(), region, uuid) {
                record(r, index, u);
            }
            if let Some(c) = MAP.get(ord) {
                if c.swap(index as u8, Ordering::Relaxed) == UNPLACED {
                    crate::debug!(
                        "CUDA device {ord} ({shown}) is the container's device {index} ({})",
                        by.describe()
                    );
                }
            }
            Some(index)
        }
        Placement::Unknown(why) => {
            if report
                && REPORTED
                    .get(ord)
                    .is_some_and(|f| !f.swap(true, Ordering::Relaxed))
            {
                crate::warn!(
                    "CUDA device {ord} ({shown}, CUDA_VISIBLE_DEVICES={:?}) is not a device of the container the shared region knows: {}; if the container has limits, allocations on it are refused and its views show nothing free (never another device's quota)",
                    visible_var().unwrap_or(""),
                    why.describe()
                );
            }
            None
        }
    }
}

/// Records `uuid` as the container's device `index` (and the device count to cover it).
fn record(region: &Region, index: usize, uuid: [u8; 16]) {
    let old = region.uuid(index);
    if old != uuid {
        if old != [0; 16] {
            crate::warn!(
                "the shared region recorded {} as the container's device {index}; this process sees {} there (do the container's processes set different CUDA_DEVICE_ORDER?): recording {}",
                GpuUuid(old),
                GpuUuid(uuid),
                GpuUuid(uuid)
            );
        }
        region.set_uuid(index, uuid);
    }
    region.set_device_count(index as u32 + 1);
}
