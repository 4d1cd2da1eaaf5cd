//! Hooks of NVML's process lists (`nvmlDeviceGetComputeRunningProcesses`, `_v2`, `_v3`, the
//! graphics and MPS variants): inside a container with a quota they list the container's own
//! processes, with their pids as the container sees them and their usage from the region
//! ([`crate::proclist::container_view`]). Each shim reads the driver's whole list (growing
//! its own buffer), narrows it, and answers with `nvml.h`'s `*infoCount` protocol. Unknown
//! device handles and devices without a quota pass through unchanged.
#![allow(non_snake_case)]
#![allow(clippy::missing_safety_doc)] // Every hook has the documented contract of its NVML function.

use crate::context::nvml::nvml_ordinal;
use crate::cuda::*;
use crate::hostpid;
use crate::proclist::{self, ListKind, Member, ProcEntry, Reading, Reply, NO_INSTANCE};
use crate::shim::hook;
use crate::state;
use crate::symbols::{self, Nv};
use hami_common::layout::{LIMIT_FLAG_INVALID, MAX_DEVICES};
use hami_common::region::is_alive;
use std::ffi::c_uint;

/// An entry struct of one version of the lists.
trait Entry: Copy + Default {
    fn get(&self) -> ProcEntry;
    fn put(e: ProcEntry) -> Self;
}

impl Entry for nvmlProcessInfo_v1_t {
    fn get(&self) -> ProcEntry {
        ProcEntry {
            pid: self.pid,
            used: self.used_gpu_memory,
            gpu_instance: NO_INSTANCE,
            compute_instance: NO_INSTANCE,
        }
    }
    fn put(e: ProcEntry) -> Self {
        nvmlProcessInfo_v1_t {
            pid: e.pid,
            used_gpu_memory: e.used,
        }
    }
}

impl Entry for nvmlProcessInfo_v2_t {
    fn get(&self) -> ProcEntry {
        ProcEntry {
            pid: self.pid,
            used: self.used_gpu_memory,
            gpu_instance: self.gpu_instance_id,
            compute_instance: self.compute_instance_id,
        }
    }
    fn put(e: ProcEntry) -> Self {
        nvmlProcessInfo_v2_t {
            pid: e.pid,
            used_gpu_memory: e.used,
            gpu_instance_id: e.gpu_instance,
            compute_instance_id: e.compute_instance,
        }
    }
}

/// Why the driver's list could not be read.
enum ListError {
    /// The driver's error (the call returns it).
    Driver(nvmlReturn_t),
    /// The list kept growing between calls: answer with the driver's own call.
    Unsettled,
}

/// The driver's whole list through `call(count, buffer)`, growing the buffer while NVML
/// answers `NVML_ERROR_INSUFFICIENT_SIZE`.
fn driver_list<T: Entry>(
    call: impl Fn(*mut c_uint, *mut T) -> nvmlReturn_t,
) -> Result<Vec<ProcEntry>, ListError> {
    let mut cap: usize = 64;
    for _ in 0..8 {
        let mut buf = vec![T::default(); cap];
        let mut n = cap as c_uint;
        match proclist::reading(call(&mut n, buf.as_mut_ptr()), n) {
            Reading::Done(k) => return Ok(buf[..k.min(cap)].iter().map(T::get).collect()),
            Reading::Grow(k) => cap = proclist::next_capacity(cap, k),
            Reading::Failed(e) => return Err(ListError::Driver(e)),
        }
    }
    Err(ListError::Unsettled)
}

/// Host pids in the real compute list of `device` (`_v3`, else `_v2`, else the v1 name);
/// `None` when it cannot be read. For [`hostpid`].
pub(crate) fn driver_host_pids(device: nvmlDevice_t) -> Option<Vec<u32>> {
    for sym in [Nv::ProcsV3, Nv::ProcsV2] {
        // SAFETY: `_v3` and `_v2` both take `nvmlProcessInfo_v2_t` entries.
        if let Some(f) = unsafe { symbols::nv::<FnNvmlProcsV2>(sym) } {
            let call = |n: *mut c_uint, buf: *mut nvmlProcessInfo_v2_t| {
                // SAFETY: a handle from NVML; `buf` holds `*n` entries.
                unsafe { f(device, n, buf) }
            };
            if let Ok(l) = driver_list(call) {
                return Some(l.iter().map(|e| e.pid).collect());
            }
        }
    }
    // SAFETY: the v1 name takes `nvmlProcessInfo_v1_t` entries.
    let f = unsafe { symbols::nv::<FnNvmlProcsV1>(Nv::ProcsV1) }?;
    // SAFETY: a handle from NVML; `buf` holds `*n` entries.
    driver_list(|n, buf: *mut nvmlProcessInfo_v1_t| unsafe { f(device, n, buf) })
        .ok()
        .map(|l| l.iter().map(|e| e.pid).collect())
}

/// The container's processes on `device` and whether slot pids are host pids; `None` (pass
/// through) for a device the preload does not know or without a quota, or without a region.
fn container_of(device: nvmlDevice_t) -> Option<(Vec<Member>, bool)> {
    let dev = nvml_ordinal(device)?;
    if dev >= MAX_DEVICES {
        return None;
    }
    let g = state::global();
    let region = g.region.as_ref().ok()?;
    let invalid = (region.limit_flags(dev) | g.config.limit_flags[dev]) & LIMIT_FLAG_INVALID != 0;
    if region.limit(dev) == 0 && !invalid {
        return None;
    }
    let snap = region.snapshot();
    let members = snap
        .slots
        .iter()
        .map(|s| {
            let host_pid = Some(region.host_pid(s.index)).filter(|&p| p != 0);
            Member {
                pid: s.pid,
                host_pid,
                used: s.device_total(dev),
                // Only needed (a /proc read) for a slot listed from the region alone.
                alive: host_pid.is_some() || is_alive(&s.process()),
            }
        })
        .collect();
    Some((members, hostpid::in_host_pid_ns()))
}

/// One hooked list: `real(device, count, infos)` is NVML's function.
fn list<T: Entry>(
    kind: ListKind,
    real: unsafe extern "C" fn(nvmlDevice_t, *mut c_uint, *mut T) -> nvmlReturn_t,
    device: nvmlDevice_t,
    count: *mut c_uint,
    infos: *mut T,
) -> nvmlReturn_t {
    if count.is_null() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    let Some((members, pids_are_host)) = container_of(device) else {
        // SAFETY: forwarded arguments.
        return unsafe { real(device, count, infos) };
    };
    // SAFETY: a device handle the caller got from NVML; `buf` holds `*n` entries.
    let driver = match driver_list(|n, buf| unsafe { real(device, n, buf) }) {
        Ok(l) => l,
        Err(ListError::Driver(e)) => return e,
        // SAFETY: forwarded arguments.
        Err(ListError::Unsettled) => return unsafe { real(device, count, infos) },
    };
    let view = proclist::container_view(kind, &driver, &members, pids_are_host);
    // SAFETY: checked non-null; the caller's capacity.
    let cap = unsafe { count.read() };
    match proclist::reply(cap, infos.is_null(), view.len()) {
        Reply::Fill(n) => {
            for (k, e) in view.iter().enumerate() {
                // SAFETY: k < n <= *infoCount entries of the caller's array (non-null when
                // n > 0, see `reply`).
                unsafe { infos.add(k).write(T::put(*e)) };
            }
            // SAFETY: checked non-null.
            unsafe { count.write(n as c_uint) };
            NVML_SUCCESS
        }
        Reply::TooSmall(n) => {
            // SAFETY: checked non-null.
            unsafe { count.write(n as c_uint) };
            NVML_ERROR_INSUFFICIENT_SIZE
        }
        Reply::Error(e) => e,
    }
}

macro_rules! list_hooks {
    ($($(#[$doc:meta])* $name:ident = $sym:ident, $kind:ident, $entry:ty, $fty:ty;)*) => {
        $(
            hook! {
                $(#[$doc])*
                fn $name(
                    device: nvmlDevice_t,
                    info_count: *mut c_uint,
                    infos: *mut $entry,
                ) = Nv::$sym as $fty;
                |f| {
                    list(ListKind::$kind, f, device, info_count, infos)
                }
            }
        )*
    };
}

list_hooks! {
    /// Hook of `nvmlDeviceGetComputeRunningProcesses` (v1 entries): the container's processes.
    nvmlDeviceGetComputeRunningProcesses = ProcsV1, Compute, nvmlProcessInfo_v1_t, FnNvmlProcsV1;
    /// Hook of `nvmlDeviceGetComputeRunningProcesses_v2`: the container's processes.
    nvmlDeviceGetComputeRunningProcesses_v2 = ProcsV2, Compute, nvmlProcessInfo_v2_t, FnNvmlProcsV2;
    /// Hook of `nvmlDeviceGetComputeRunningProcesses_v3`: the container's processes.
    nvmlDeviceGetComputeRunningProcesses_v3 = ProcsV3, Compute, nvmlProcessInfo_v2_t, FnNvmlProcsV2;
    /// Hook of `nvmlDeviceGetGraphicsRunningProcesses` (v1 entries): the container's processes.
    nvmlDeviceGetGraphicsRunningProcesses = GraphicsV1, Graphics, nvmlProcessInfo_v1_t, FnNvmlProcsV1;
    /// Hook of `nvmlDeviceGetGraphicsRunningProcesses_v2`: the container's processes.
    nvmlDeviceGetGraphicsRunningProcesses_v2 = GraphicsV2, Graphics, nvmlProcessInfo_v2_t, FnNvmlProcsV2;
    /// Hook of `nvmlDeviceGetGraphicsRunningProcesses_v3`: the container's processes.
    nvmlDeviceGetGraphicsRunningProcesses_v3 = GraphicsV3, Graphics, nvmlProcessInfo_v2_t, FnNvmlProcsV2;
    /// Hook of `nvmlDeviceGetMPSComputeRunningProcesses` (v1 entries): the container's clients.
    nvmlDeviceGetMPSComputeRunningProcesses = MpsV1, Mps, nvmlProcessInfo_v1_t, FnNvmlProcsV1;
    /// Hook of `nvmlDeviceGetMPSComputeRunningProcesses_v2`: the container's clients.
    nvmlDeviceGetMPSComputeRunningProcesses_v2 = MpsV2, Mps, nvmlProcessInfo_v2_t, FnNvmlProcsV2;
    /// Hook of `nvmlDeviceGetMPSComputeRunningProcesses_v3`: the container's clients.
    nvmlDeviceGetMPSComputeRunningProcesses_v3 = MpsV3, Mps, nvmlProcessInfo_v2_t, FnNvmlProcsV2;
}
