//! Pure policy functions: what the memory views report, how much a context costs, what an
//! array or a pitched allocation is charged.

use crate::ffi::cuda::{
    CUDA_ARRAY3D_DEFERRED_MAPPING, CUDA_ARRAY3D_DESCRIPTOR, CUDA_ARRAY3D_LAYERED,
    CUDA_ARRAY3D_SPARSE, CUDA_ARRAY_DESCRIPTOR,
};
use hami_abi::array::{array_footprint, mipmap_footprint};

/// The quota as the application sees a device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceQuota {
    /// Limit in bytes, 0 = unlimited.
    pub limit: u64,
    /// The device's configuration is invalid (fail closed).
    pub invalid: bool,
    /// Bytes admitted on the device, all processes sharing the region.
    pub used: u64,
}

/// `(free, total)` as `cuMemGetInfo_v2` / NVML report it under the quota.
///
/// * unlimited: the physical values, unchanged;
/// * invalid configuration: free 0, total the physical total (nothing can be allocated);
/// * otherwise total = min(limit, physical total) and
///   free = min(limit - used (saturating at 0), physical free).
pub fn mem_view(q: DeviceQuota, phys_free: u64, phys_total: u64) -> (u64, u64) {
    if q.invalid {
        return (0, phys_total);
    }
    if q.limit == 0 {
        return (phys_free, phys_total);
    }
    let total = q.limit.min(phys_total);
    let free = q.limit.saturating_sub(q.used).min(phys_free).min(total);
    (free, total)
}

/// `cuDeviceTotalMem_v2` under the quota.
pub fn total_view(q: DeviceQuota, phys_total: u64) -> u64 {
    if q.invalid || q.limit == 0 {
        phys_total
    } else {
        q.limit.min(phys_total)
    }
}

/// Largest context footprint believed from a before/after measurement; a larger difference
/// means something else allocated meanwhile, and the measurement is discarded.
pub const MAX_MEASURED_CONTEXT: u64 = 4 << 30;

/// How a context's memory was determined.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ContextCost {
    /// `HAMI_CONTEXT_OVERHEAD`.
    Configured(u64),
    /// This process's own used memory on the device per NVML's process list, after minus
    /// before (minus data this process allocated meanwhile). Other processes cannot disturb it.
    PerProcess(u64),
    /// NVML device used memory after minus before (minus data this process allocated
    /// meanwhile). `serialized`: measured under the region's context-creation lock, so no
    /// other process sharing the region created a context meanwhile.
    DeviceDelta {
        /// Bytes charged.
        bytes: u64,
        /// Whether the context-creation lock was held.
        serialized: bool,
    },
    /// NVML unavailable: measured through the driver (`cuMemGetInfo_v2` with the context
    /// made current temporarily), under the region's context-creation lock when `serialized`.
    /// `first`: this process had no context on the device before, so the cost is the
    /// device's used memory after the creation minus everything the region had accounted on
    /// the device; otherwise free before minus free after, minus the change of the data
    /// charged in the region meanwhile.
    Driver {
        /// Bytes charged.
        bytes: u64,
        /// First context of this process on the device (the residual method).
        first: bool,
        /// Whether the context-creation lock was held.
        serialized: bool,
    },
    /// Not measurable: nothing charged.
    Unknown,
}

impl ContextCost {
    /// Bytes to charge.
    pub fn bytes(self) -> u64 {
        match self {
            ContextCost::Configured(b)
            | ContextCost::PerProcess(b)
            | ContextCost::DeviceDelta { bytes: b, .. }
            | ContextCost::Driver { bytes: b, .. } => b,
            ContextCost::Unknown => 0,
        }
    }
}

/// The NVML readings taken around a context creation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ContextReadings {
    /// This process's used memory on the device before (0 when NVML does not list it yet);
    /// `None`: NVML's process list is unavailable.
    pub own_before: Option<u64>,
    /// This process's used memory on the device after; `None`: not listed (another pid
    /// namespace) or unavailable.
    pub own_after: Option<u64>,
    /// The device's used memory before.
    pub dev_before: Option<u64>,
    /// The device's used memory after.
    pub dev_after: Option<u64>,
    /// Change of this process's non-context charges on the device between the readings
    /// (data other threads allocated or freed meanwhile).
    pub own_meanwhile: i64,
    /// Change of the non-context charges of every process sharing the region on the device
    /// between the readings (their allocations are not serialized with context creation).
    pub region_meanwhile: i64,
    /// Whether the context-creation lock was held around the readings.
    pub serialized: bool,
}

/// `after - before - meanwhile`, if that is neither negative nor above
/// [`MAX_MEASURED_CONTEXT`] (then something else happened meanwhile: discarded).
fn delta(before: Option<u64>, after: Option<u64>, meanwhile: i64) -> Option<u64> {
    let d = i128::from(after?) - i128::from(before?) - i128::from(meanwhile);
    (0..=i128::from(MAX_MEASURED_CONTEXT))
        .contains(&d)
        .then_some(d as u64)
}

/// The memory a new context takes: the configured override, else this process's own NVML
/// usage delta, else the device-level delta, else unknown.
pub fn context_cost(configured: Option<u64>, r: &ContextReadings) -> ContextCost {
    if let Some(b) = configured {
        return ContextCost::Configured(b);
    }
    if let Some(b) = delta(r.own_before, r.own_after, r.own_meanwhile) {
        return ContextCost::PerProcess(b);
    }
    match delta(r.dev_before, r.dev_after, r.region_meanwhile) {
        Some(bytes) => ContextCost::DeviceDelta {
            bytes,
            serialized: r.serialized,
        },
        None => ContextCost::Unknown,
    }
}

/// Largest context footprint believed from the driver-only residual method (device used
/// memory minus what the region accounted): more means that memory of processes outside the
/// region was counted, and the measurement is discarded.
pub const MAX_RESIDUAL_CONTEXT: u64 = 2 << 30;

/// The driver readings taken around a context creation when NVML is unavailable.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DriverReadings {
    /// Free memory of the device before, read through another context of this process on
    /// the device; `None`: this process had none (or it could not be read).
    pub free_before: Option<u64>,
    /// `(free, total)` of the device after, read through the new context.
    pub after: Option<(u64, u64)>,
    /// Change of the non-context charges of every process sharing the region on the device
    /// between the readings.
    pub region_meanwhile: i64,
    /// Everything the region had accounted on the device (all processes, all kinds) after
    /// the creation, before the new context is charged.
    pub region_used: u64,
    /// Whether the context-creation lock was held around the readings.
    pub serialized: bool,
}

/// The memory a new context takes, measured through the driver (NVML unavailable): with a
/// before reading, the device-level delta of [`context_cost`] (same correction for the
/// region's data charged meanwhile); without one, the device's used memory after minus the
/// region's accounted usage, believed only within `0..=`[`MAX_RESIDUAL_CONTEXT`] (the region's
/// processes are assumed to be the device's only users).
pub fn driver_context_cost(r: &DriverReadings) -> ContextCost {
    let Some((free, total)) = r.after else {
        return ContextCost::Unknown;
    };
    let used_after = total.saturating_sub(free);
    let (bytes, first) = match r.free_before {
        Some(fb) => {
            let used_before = total.saturating_sub(fb);
            (
                delta(Some(used_before), Some(used_after), r.region_meanwhile),
                false,
            )
        }
        None => {
            let d = i128::from(used_after) - i128::from(r.region_used);
            let ok = (0..=i128::from(MAX_RESIDUAL_CONTEXT)).contains(&d);
            (ok.then_some(d as u64), true)
        }
    };
    match bytes {
        Some(bytes) => ContextCost::Driver {
            bytes,
            first,
            serialized: r.serialized,
        },
        None => ContextCost::Unknown,
    }
}

/// Alignment a pitched allocation's rows are assumed to get when estimating the charge made
/// before the call (the real pitch is charged after it).
pub const PITCH_ALIGN: u64 = 512;

/// Charge estimated before `cuMemAllocPitch_v2`: width rounded up to [`PITCH_ALIGN`] times
/// height (saturating).
pub fn pitch_estimate(width: u64, height: u64) -> u64 {
    let w = width.saturating_add(PITCH_ALIGN - 1) / PITCH_ALIGN * PITCH_ALIGN;
    w.saturating_mul(height)
}

/// The `CUdevice_attribute`s that bound a CUDA array's dimensions: the largest 1D, 2D, 3D
/// (and alternate 3D), layered and cubemap texture sizes and layer counts
/// (`CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE1D_WIDTH` = 21 to `..._TEXTURE2D_LAYERED_LAYERS` = 29,
/// `..._TEXTURE1D_LAYERED_WIDTH`/`_LAYERS` = 42/43, `..._TEXTURE3D_*_ALTERNATE` = 47 to 49,
/// `..._TEXTURECUBEMAP_WIDTH` and `..._LAYERED_WIDTH`/`_LAYERS` = 54 to 56).
pub const ARRAY_DIM_ATTRIBUTES: [i32; 17] = [
    21, 22, 23, 24, 25, 26, 27, 28, 29, 42, 43, 47, 48, 49, 54, 55, 56,
];

/// Whether an array's `dims` (width, height, depth or layers) go beyond `bound`, the largest
/// of the device's [`ARRAY_DIM_ATTRIBUTES`]: no array of that shape exists on the device,
/// so the driver answers `CUDA_ERROR_INVALID_VALUE` whatever memory is free. Deliberately
/// lenient (one bound for every dimension and kind of array): it is asked only when the
/// quota refuses the array, to give the driver's code rather than an out-of-memory one for a
/// descriptor the driver would reject. A `bound` of 0 (unknown) decides nothing.
pub fn array_dims_beyond(dims: [u64; 3], bound: u64) -> bool {
    bound > 0 && dims.iter().any(|&d| d > bound)
}

/// Charge for `cuArrayCreate_v2`.
pub fn array_charge(d: &CUDA_ARRAY_DESCRIPTOR) -> u64 {
    array_footprint(d.width as u64, d.height as u64, 0, d.format, d.num_channels)
}

/// Flags of arrays without memory of their own: what gets mapped into them
/// (`cuMemMapArrayAsync`) comes from `cuMemCreate`, charged there.
const NO_BACKING: u32 = CUDA_ARRAY3D_DEFERRED_MAPPING | CUDA_ARRAY3D_SPARSE;

/// Charge for `cuArray3DCreate_v2`: 0 for `CUDA_ARRAY3D_DEFERRED_MAPPING` and
/// `CUDA_ARRAY3D_SPARSE` arrays (they have no memory of their own; what gets mapped into them
/// comes from `cuMemCreate`, charged there).
pub fn array3d_charge(d: &CUDA_ARRAY3D_DESCRIPTOR) -> u64 {
    if d.flags & NO_BACKING != 0 {
        return 0;
    }
    array_footprint(
        d.width as u64,
        d.height as u64,
        d.depth as u64,
        d.format,
        d.num_channels,
    )
}

/// Charge for `cuMipmappedArrayCreate`: every level (`hami_abi::array::mipmap_footprint`,
/// layers kept at every level for `CUDA_ARRAY3D_LAYERED`); 0 for deferred-mapping and sparse
/// mipmapped arrays (memory mapped into them comes from `cuMemCreate`).
pub fn mipmap_charge(d: &CUDA_ARRAY3D_DESCRIPTOR, levels: u32) -> u64 {
    if d.flags & NO_BACKING != 0 {
        return 0;
    }
    mipmap_footprint(
        d.width as u64,
        d.height as u64,
        d.depth as u64,
        d.format,
        d.num_channels,
        levels,
        d.flags & CUDA_ARRAY3D_LAYERED != 0,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const GB: u64 = 1 << 30;

    fn q(limit: u64, used: u64) -> DeviceQuota {
        DeviceQuota {
            limit,
            invalid: false,
            used,
        }
    }

    #[test]
    fn array_dims_beyond_the_device_bound() {
        // Every dimension counts, a 0 (unused) one never does.
        assert!(array_dims_beyond([131_073, 0, 0], 131_072));
        assert!(array_dims_beyond([16, 131_073, 0], 131_072));
        assert!(array_dims_beyond([16, 16, u64::MAX], 131_072));
        assert!(!array_dims_beyond([131_072, 65_536, 0], 131_072));
        // An unknown bound decides nothing.
        assert!(!array_dims_beyond([u64::MAX, u64::MAX, u64::MAX], 0));
    }

    #[test]
    fn mem_view_cases() {
        // Unlimited: pass through.
        assert_eq!(mem_view(q(0, 5 * GB), 70 * GB, 80 * GB), (70 * GB, 80 * GB));
        // Quota: total = limit, free = limit - used.
        assert_eq!(
            mem_view(q(10 * GB, 3 * GB), 70 * GB, 80 * GB),
            (7 * GB, 10 * GB)
        );
        // Over-used (contexts force-charged): free saturates at 0.
        assert_eq!(
            mem_view(q(10 * GB, 12 * GB), 70 * GB, 80 * GB),
            (0, 10 * GB)
        );
        // Never above the physical free.
        assert_eq!(mem_view(q(10 * GB, GB), 2 * GB, 80 * GB), (2 * GB, 10 * GB));
        // Limit above the physical size.
        assert_eq!(
            mem_view(q(100 * GB, 0), 70 * GB, 80 * GB),
            (70 * GB, 80 * GB)
        );
        // Invalid configuration: nothing free.
        let bad = DeviceQuota {
            limit: 0,
            invalid: true,
            used: 0,
        };
        assert_eq!(mem_view(bad, 70 * GB, 80 * GB), (0, 80 * GB));
        assert_eq!(total_view(bad, 80 * GB), 80 * GB);
        assert_eq!(total_view(q(10 * GB, 0), 80 * GB), 10 * GB);
        assert_eq!(total_view(q(0, 0), 80 * GB), 80 * GB);
    }

    #[test]
    fn context_costs() {
        let dev = |b, a| ContextReadings {
            dev_before: Some(b),
            dev_after: Some(a),
            serialized: true,
            ..ContextReadings::default()
        };
        assert_eq!(
            context_cost(Some(5), &dev(1, 100)),
            ContextCost::Configured(5)
        );
        assert_eq!(
            context_cost(None, &dev(100, 400)),
            ContextCost::DeviceDelta {
                bytes: 300,
                serialized: true
            }
        );
        assert_eq!(context_cost(None, &dev(400, 100)), ContextCost::Unknown);
        let no_before = ContextReadings {
            dev_before: None,
            ..dev(0, 100)
        };
        assert_eq!(context_cost(None, &no_before), ContextCost::Unknown);
        assert_eq!(context_cost(None, &dev(0, 5 * GB)), ContextCost::Unknown);
        assert_eq!(ContextCost::Unknown.bytes(), 0);
        // Per-process readings win over a disturbed device-level delta.
        let both = ContextReadings {
            own_before: Some(0),
            own_after: Some(518),
            dev_before: Some(1000),
            dev_after: Some(2100),
            own_meanwhile: 0,
            region_meanwhile: 0,
            serialized: false,
        };
        assert_eq!(context_cost(None, &both), ContextCost::PerProcess(518));
        // Data this process allocated meanwhile is not context memory.
        let data = ContextReadings {
            own_before: Some(100),
            own_after: Some(700),
            own_meanwhile: 64,
            ..both
        };
        assert_eq!(context_cost(None, &data), ContextCost::PerProcess(536));
        // Another thread freed 64 bytes meanwhile.
        let freed = ContextReadings {
            own_meanwhile: -64,
            ..data
        };
        assert_eq!(context_cost(None, &freed), ContextCost::PerProcess(664));
        // Not listed after (container pid namespace): the device-level delta.
        let hidden = ContextReadings {
            own_after: None,
            ..both
        };
        assert_eq!(
            context_cost(None, &hidden),
            ContextCost::DeviceDelta {
                bytes: 1100,
                serialized: false
            }
        );
        // A per-process delta that makes no sense falls back to the device level.
        let odd = ContextReadings {
            own_before: Some(900),
            own_after: Some(100),
            ..both
        };
        assert_eq!(context_cost(None, &odd).bytes(), 1100);
        // Other processes of the region allocated 500 and freed 20 meanwhile.
        let busy = ContextReadings {
            region_meanwhile: 480,
            ..hidden
        };
        assert_eq!(context_cost(None, &busy).bytes(), 620);
    }

    #[test]
    fn pitch_and_arrays() {
        assert_eq!(pitch_estimate(1000, 10), 1024 * 10);
        assert_eq!(pitch_estimate(512, 3), 512 * 3);
        assert_eq!(pitch_estimate(u64::MAX, 2), u64::MAX);
        let d = CUDA_ARRAY_DESCRIPTOR {
            width: 1024,
            height: 1024,
            format: 0x20,
            num_channels: 4,
        };
        assert_eq!(array_charge(&d), 16 << 20);
        let mut d3 = CUDA_ARRAY3D_DESCRIPTOR {
            width: 1024,
            height: 1024,
            depth: 2,
            format: 0x20,
            num_channels: 4,
            flags: 0,
        };
        assert_eq!(array3d_charge(&d3), 32 << 20);
        d3.flags = CUDA_ARRAY3D_DEFERRED_MAPPING;
        assert_eq!(array3d_charge(&d3), 0);
        assert_eq!(mipmap_charge(&d3, 3), 0);
        d3.flags = CUDA_ARRAY3D_SPARSE;
        assert_eq!((array3d_charge(&d3), mipmap_charge(&d3, 3)), (0, 0));
        // Layered: 2 layers of 1024 x 1024 float4 (16 MiB each) at both levels.
        d3.flags = CUDA_ARRAY3D_LAYERED;
        assert_eq!(mipmap_charge(&d3, 2), 2 * (16 << 20) + 2 * (4 << 20));
        let m = CUDA_ARRAY3D_DESCRIPTOR {
            width: 16384,
            height: 16384,
            depth: 0,
            format: 0x20,
            num_channels: 2,
            flags: 0,
        };
        assert_eq!(mipmap_charge(&m, 1), 2048 << 20);
        assert!(mipmap_charge(&m, 15) > 2048 << 20);
    }

    #[test]
    fn driver_context_cost_before_delta_and_first_residual() {
        const MB: u64 = 1 << 20;
        let r = DriverReadings {
            free_before: Some(1000 * MB),
            after: Some((600 * MB, 2000 * MB)),
            region_meanwhile: 100 * MB as i64,
            region_used: 0,
            serialized: true,
        };
        // free before - free after = 400 MiB, of which 100 MiB data charged meanwhile.
        let want = ContextCost::Driver {
            bytes: 300 * MB,
            first: false,
            serialized: true,
        };
        assert_eq!(driver_context_cost(&r), want);
        // First context: device used (1400 MiB) minus the region's accounted 1100 MiB.
        let first = DriverReadings {
            free_before: None,
            region_used: 1100 * MB,
            ..r
        };
        assert_eq!(
            driver_context_cost(&first),
            ContextCost::Driver {
                bytes: 300 * MB,
                first: true,
                serialized: true
            }
        );
        // Another tenant's memory: above 2 GiB or negative is discarded.
        let big = DriverReadings {
            after: Some((0, 3000 * MB)),
            region_used: 0,
            ..first
        };
        assert_eq!(driver_context_cost(&big), ContextCost::Unknown);
        let neg = DriverReadings {
            region_used: 1500 * MB,
            ..first
        };
        assert_eq!(driver_context_cost(&neg), ContextCost::Unknown);
        let none = DriverReadings { after: None, ..r };
        assert_eq!(driver_context_cost(&none), ContextCost::Unknown);
    }
}
