//! Hooks of NVML's process lists (`nvmlDeviceGetComputeRunningProcesses`, `_v2`, `_v3`, the
//! graphics and MPS variants): inside a container with a quota they list the container's own
//! processes, with their pids as the container sees them and their usage from the region
//! ([`crate::driver::proclist::container_view`]). Each shim reads the driver's whole list (growing
//! its own buffer), narrows it, and answers with `nvml.h`'s `*infoCount` protocol. Unknown
//! device handles and devices without a quota pass through unchanged.
#![allow(non_snake_case)]
#![allow(clippy::missing_safety_doc)] // Every hook has the documented contract of its NVML function.

use crate::driver::hostpid;
use crate::driver::proclist::{self, ListKind, ListRead, Member, ProcEntry, Reply, NO_INSTANCE};
use crate::ffi::cuda::*;
use crate::ffi::shim::hook;
use crate::ffi::symbols::{self, Nv};
use crate::measure::nvml::nvml_container_dev;
use crate::state;
use hami_abi::layout::{LIMIT_FLAG_INVALID, MAX_DEVICES};
use hami_common::region::is_alive;
use std::ffi::c_uint;

/// An entry struct of one version of the lists.
trait NvmlProcInfo: Copy + Default {
    fn get(&self) -> ProcEntry;
    fn put(e: ProcEntry) -> Self;
}

impl NvmlProcInfo for nvmlProcessInfo_v1_t {
    fn get(&self) -> ProcEntry {
        ProcEntry {
            pid: self.pid,
            used: self.used_gpu_memory,
            gpu_instance: NO_INSTANCE,
            compute_instance: NO_INSTANCE,
            cc_protected: 0,
        }
    }
    fn put(e: ProcEntry) -> Self {
        nvmlProcessInfo_v1_t {
            pid: e.pid,
            used_gpu_memory: e.used,
        }
    }
}

impl NvmlProcInfo for nvmlProcessInfo_v2_t {
    fn get(&self) -> ProcEntry {
        ProcEntry {
            pid: self.pid,
            used: self.used_gpu_memory,
            gpu_instance: self.gpu_instance_id,
            compute_instance: self.compute_instance_id,
            cc_protected: 0,
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

impl NvmlProcInfo for nvmlProcessDetail_v1_t {
    fn get(&self) -> ProcEntry {
        ProcEntry {
            pid: self.pid,
            used: self.used_gpu_memory,
            gpu_instance: self.gpu_instance_id,
            compute_instance: self.compute_instance_id,
            cc_protected: self.used_gpu_cc_protected_memory,
        }
    }
    fn put(e: ProcEntry) -> Self {
        nvmlProcessDetail_v1_t {
            pid: e.pid,
            used_gpu_memory: e.used,
            gpu_instance_id: e.gpu_instance,
            compute_instance_id: e.compute_instance,
            used_gpu_cc_protected_memory: e.cc_protected,
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
fn driver_list<T: NvmlProcInfo>(
    call: impl Fn(*mut c_uint, *mut T) -> nvmlReturn_t,
) -> Result<Vec<ProcEntry>, ListError> {
    let mut cap: usize = 64;
    for _ in 0..8 {
        let mut buf = vec![T::default(); cap];
        let mut n = cap as c_uint;
        match proclist::reading(call(&mut n, buf.as_mut_ptr()), n) {
            ListRead::Done(k) => return Ok(buf[..k.min(cap)].iter().map(T::get).collect()),
            ListRead::Grow(k) => cap = proclist::next_capacity(cap, k),
            ListRead::Failed(e) => return Err(ListError::Driver(e)),
        }
    }
    Err(ListError::Unsettled)
}

/// Host pids in the real compute list of `device` (`_v3`, else `_v2`, else the v1 name);
/// `None` when it cannot be read. For [`hostpid`].
pub(crate) fn driver_host_pids(device: nvmlDevice_t) -> Option<Vec<u32>> {
    for sym in [
        Nv::nvmlDeviceGetComputeRunningProcesses_v3,
        Nv::nvmlDeviceGetComputeRunningProcesses_v2,
    ] {
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
    let f = unsafe { symbols::nv::<FnNvmlProcsV1>(Nv::nvmlDeviceGetComputeRunningProcesses) }?;
    // SAFETY: a handle from NVML; `buf` holds `*n` entries.
    driver_list(|n, buf: *mut nvmlProcessInfo_v1_t| unsafe { f(device, n, buf) })
        .ok()
        .map(|l| l.iter().map(|e| e.pid).collect())
}

/// The container's processes on `device` and whether slot pids are host pids; `None` (pass
/// through) for a device the preload does not know or without a quota, or without a region.
pub(crate) fn container_of(device: nvmlDevice_t) -> Option<(Vec<Member>, bool)> {
    let dev = nvml_container_dev(device)?;
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

/// What a hooked list answers before it is written back.
enum Narrowed {
    /// Not the container's business (or the driver's list would not settle): call the
    /// driver with the caller's arguments.
    PassThrough,
    /// The driver's error.
    Failed(nvmlReturn_t),
    /// The container's entries.
    View(Vec<ProcEntry>),
}

/// The container's view of `device`'s `kind` list, read through `call(count, buffer)`.
fn narrowed<T: NvmlProcInfo>(
    kind: ListKind,
    device: nvmlDevice_t,
    call: impl Fn(*mut c_uint, *mut T) -> nvmlReturn_t,
) -> Narrowed {
    let Some((members, pids_are_host)) = container_of(device) else {
        return Narrowed::PassThrough;
    };
    match driver_list(call) {
        Ok(driver) => Narrowed::View(proclist::container_view(
            kind,
            &driver,
            &members,
            pids_are_host,
        )),
        Err(ListError::Driver(e)) => Narrowed::Failed(e),
        Err(ListError::Unsettled) => Narrowed::PassThrough,
    }
}

/// One hooked list: `real(device, count, infos)` is NVML's function.
fn list<T: NvmlProcInfo>(
    kind: ListKind,
    real: unsafe extern "C" fn(nvmlDevice_t, *mut c_uint, *mut T) -> nvmlReturn_t,
    device: nvmlDevice_t,
    count: *mut c_uint,
    infos: *mut T,
) -> nvmlReturn_t {
    if count.is_null() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    let call = |n: *mut c_uint, buf: *mut T| {
        // SAFETY: a device handle the caller got from NVML; `buf` holds `*n` entries.
        unsafe { real(device, n, buf) }
    };
    match narrowed(kind, device, call) {
        // SAFETY: forwarded arguments.
        Narrowed::PassThrough => unsafe { real(device, count, infos) },
        Narrowed::Failed(e) => e,
        // SAFETY: `count` is non-null; `infos` holds `*count` entries (the C contract).
        Narrowed::View(view) => unsafe { answer(&view, count, infos) },
    }
}

/// Writes `view` back with `nvml.h`'s protocol ([`proclist::reply`]).
///
/// # Safety
/// `count` is valid; `infos` is NULL or holds `*count` entries.
unsafe fn answer<T: NvmlProcInfo>(
    view: &[ProcEntry],
    count: *mut c_uint,
    infos: *mut T,
) -> nvmlReturn_t {
    // SAFETY: valid (the caller's contract); the caller's capacity.
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

hook! {
    /// Hook of `nvmlDeviceGetRunningProcessDetailList` (`nvmlProcessDetailList_v1`): the
    /// container's processes of the list's mode, like the lists above. Another struct
    /// version or mode is the driver's to answer.
    fn nvmlDeviceGetRunningProcessDetailList(
        device: nvmlDevice_t,
        plist: *mut nvmlProcessDetailList_v1_t,
    ) -> nvmlReturn_t;
    |f| {
        if plist.is_null() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        // SAFETY: non-null, the caller's struct.
        let (version, mode) = unsafe { ((*plist).version, (*plist).mode) };
        let kind = match mode {
            0 => ListKind::Compute,
            1 => ListKind::Graphics,
            2 => ListKind::Mps,
            // SAFETY: forwarded arguments.
            _ => return unsafe { f(device, plist) },
        };
        if version != NVML_PROCESS_DETAIL_LIST_V1 {
            // SAFETY: forwarded arguments.
            return unsafe { f(device, plist) };
        }
        let call = |n: *mut c_uint, buf: *mut nvmlProcessDetail_v1_t| {
            let mut l = nvmlProcessDetailList_v1_t {
                version,
                mode,
                // SAFETY: `n` is driver_list's own counter.
                num_proc_array_entries: unsafe { *n },
                proc_array: buf,
            };
            // SAFETY: a handle from the caller; `buf` holds `*n` entries.
            let r = unsafe { f(device, &mut l) };
            // SAFETY: as above.
            unsafe { *n = l.num_proc_array_entries };
            r
        };
        match narrowed(kind, device, call) {
            // SAFETY: forwarded arguments.
            Narrowed::PassThrough => unsafe { f(device, plist) },
            Narrowed::Failed(e) => e,
            // SAFETY: the caller's struct (non-null); its array holds
            // `numProcArrayEntries` entries (the C contract).
            Narrowed::View(view) => unsafe {
                answer(&view, &raw mut (*plist).num_proc_array_entries, (*plist).proc_array)
            },
        }
    }
}

macro_rules! list_hooks {
    ($($(#[$doc:meta])* $name:ident = $kind:ident, $entry:ty;)*) => {
        $(
            hook! {
                $(#[$doc])*
                fn $name(
                    device: nvmlDevice_t,
                    info_count: *mut c_uint,
                    infos: *mut $entry,
                ) -> nvmlReturn_t;
                |f| {
                    list(ListKind::$kind, f, device, info_count, infos)
                }
            }
        )*
    };
}

list_hooks! {
    /// Hook of `nvmlDeviceGetComputeRunningProcesses` (v1 entries): the container's processes.
    nvmlDeviceGetComputeRunningProcesses = Compute, nvmlProcessInfo_v1_t;
    /// Hook of `nvmlDeviceGetComputeRunningProcesses_v2`: the container's processes.
    nvmlDeviceGetComputeRunningProcesses_v2 = Compute, nvmlProcessInfo_v2_t;
    /// Hook of `nvmlDeviceGetComputeRunningProcesses_v3`: the container's processes.
    nvmlDeviceGetComputeRunningProcesses_v3 = Compute, nvmlProcessInfo_v2_t;
    /// Hook of `nvmlDeviceGetGraphicsRunningProcesses` (v1 entries): the container's processes.
    nvmlDeviceGetGraphicsRunningProcesses = Graphics, nvmlProcessInfo_v1_t;
    /// Hook of `nvmlDeviceGetGraphicsRunningProcesses_v2`: the container's processes.
    nvmlDeviceGetGraphicsRunningProcesses_v2 = Graphics, nvmlProcessInfo_v2_t;
    /// Hook of `nvmlDeviceGetGraphicsRunningProcesses_v3`: the container's processes.
    nvmlDeviceGetGraphicsRunningProcesses_v3 = Graphics, nvmlProcessInfo_v2_t;
    /// Hook of `nvmlDeviceGetMPSComputeRunningProcesses` (v1 entries): the container's clients.
    nvmlDeviceGetMPSComputeRunningProcesses = Mps, nvmlProcessInfo_v1_t;
    /// Hook of `nvmlDeviceGetMPSComputeRunningProcesses_v2`: the container's clients.
    nvmlDeviceGetMPSComputeRunningProcesses_v2 = Mps, nvmlProcessInfo_v2_t;
    /// Hook of `nvmlDeviceGetMPSComputeRunningProcesses_v3`: the container's clients.
    nvmlDeviceGetMPSComputeRunningProcesses_v3 = Mps, nvmlProcessInfo_v2_t;
}
