//! Hooks that report memory: `cuMemGetInfo_v2`, `cuDeviceTotalMem_v2` and NVML's
//! `nvmlDeviceGetMemoryInfo(_v2)` show the container's quota instead of the device.
#![allow(non_snake_case)]
#![allow(clippy::missing_safety_doc)] // Every hook has the documented contract of its driver function.

use crate::ffi::cuda::*;
use crate::ffi::shim::hook;
use crate::ledger::policy::{self, DeviceQuota};
use crate::measure::current_dev_ctx;
use crate::measure::nvml::nvml_container_dev;
use crate::state::{self, Placed};
use hami_abi::layout::{LIMIT_FLAG_INVALID, MAX_DEVICES};

/// The quota of this process's CUDA ordinal `ord` (None: not tracked, report the physical
/// values). A device the region does not know in a container with limits shows nothing free
/// ([`crate::driver::devmap::Placed::Refused`]); never another device's quota.
fn ordinal_quota(ord: usize) -> Option<DeviceQuota> {
    match state::placed(ord) {
        Placed::Index(c) => quota(c),
        Placed::Untracked => None,
        Placed::Refused => Some(DeviceQuota {
            limit: 0,
            invalid: true,
            used: 0,
        }),
    }
}

/// The quota of the container's device `dev` (None: not tracked, report the physical values).
fn quota(dev: usize) -> Option<DeviceQuota> {
    if dev >= MAX_DEVICES {
        return None;
    }
    let g = state::global();
    let local_invalid = g.config.limit_flags[dev] & LIMIT_FLAG_INVALID != 0;
    Some(match &g.region {
        Ok(r) => DeviceQuota {
            limit: r.limit(dev),
            invalid: local_invalid || r.limit_flags(dev) & LIMIT_FLAG_INVALID != 0,
            // Allocations' usage: other processes' unused reserves are theirs to lose.
            used: r.used(dev),
        },
        // No region: allocations fail closed, so nothing is free.
        Err(_) => DeviceQuota {
            limit: g.config.limits[dev],
            invalid: true,
            used: 0,
        },
    })
}

hook! {
    /// Hook of `cuMemGetInfo_v2`: the quota of the current context's device.
    fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> CUresult;
    |f| {
        if free.is_null() || total.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        // SAFETY: forwarded, non-null out pointers.
        let r = unsafe { f(free, total) };
        if r != CUDA_SUCCESS {
            return r;
        }
        let Ok((dev, _)) = current_dev_ctx() else {
            return r;
        };
        super::shared::backstop_poll(Some(dev));
        if let Some(q) = ordinal_quota(dev) {
            // SAFETY: non-null out pointers the driver just wrote.
            unsafe {
                let (fr, to) = policy::mem_view(q, *free as u64, *total as u64);
                *free = fr as usize;
                *total = to as usize;
            }
        }
        r
    }
}

hook! {
    /// Hook of `cuDeviceTotalMem_v2`: min(limit, physical).
    fn cuDeviceTotalMem_v2(
        bytes: *mut usize,
        dev: CUdevice,
    ) -> CUresult;
    |f| {
        if bytes.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        // SAFETY: forwarded arguments.
        let r = unsafe { f(bytes, dev) };
        if r == CUDA_SUCCESS && dev >= 0 {
            if let Some(q) = ordinal_quota(dev as usize) {
                // SAFETY: non-null out pointer the driver just wrote.
                unsafe { *bytes = policy::total_view(q, *bytes as u64) as usize };
            }
        }
        r
    }
}

/// The quota of an NVML device: the container's device with its UUID
/// ([`nvml_container_dev`]); one the region does not know shows nothing free when the
/// container has limits.
fn nvml_placed(device: nvmlDevice_t) -> Option<DeviceQuota> {
    match nvml_container_dev(device) {
        Some(c) => quota(c),
        None if state::container_limited_now() => Some(DeviceQuota {
            limit: 0,
            invalid: true,
            used: 0,
        }),
        None => None,
    }
}

fn nvml_view(device: nvmlDevice_t, free: &mut u64, total: &mut u64, used: &mut u64) {
    let Some(q) = nvml_placed(device) else {
        return;
    };
    if q.limit == 0 && !q.invalid {
        return;
    }
    let (f, t) = policy::mem_view(q, *free, *total);
    *free = f;
    *total = t;
    if !q.invalid {
        *used = q.used.min(t);
    }
}

hook! {
    /// Hook of `nvmlDeviceGetMemoryInfo`: the quota of the matching CUDA device.
    fn nvmlDeviceGetMemoryInfo(device: nvmlDevice_t, memory: *mut nvmlMemory_t) -> nvmlReturn_t;
    |f| {
        if memory.is_null() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        // SAFETY: forwarded arguments.
        let r = unsafe { f(device, memory) };
        if r == NVML_SUCCESS {
            // SAFETY: non-null, just written by NVML.
            let m = unsafe { &mut *memory };
            nvml_view(device, &mut m.free, &mut m.total, &mut m.used);
        }
        r
    }
}

hook! {
    /// Hook of `nvmlDeviceGetMemoryInfo_v2`: the quota of the matching CUDA device.
    fn nvmlDeviceGetMemoryInfo_v2(device: nvmlDevice_t, memory: *mut nvmlMemory_v2_t) -> nvmlReturn_t;
    |f| {
        if memory.is_null() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        // SAFETY: forwarded arguments.
        let r = unsafe { f(device, memory) };
        if r == NVML_SUCCESS {
            // SAFETY: non-null, just written by NVML.
            let m = unsafe { &mut *memory };
            nvml_view(device, &mut m.free, &mut m.total, &mut m.used);
        }
        r
    }
}
