//! What NVML says, read through the real library: device handles found by UUID (so that a
//! CUDA ordinal and an NVML device are matched however each numbers them), device used memory
//! and this process's entry in the compute-process lists. The readings behind context and
//! module measurement ([`crate::measure`]) and the NVML memory views of the hooks.

use crate::ffi::cuda::*;
use crate::ffi::symbols::{self, Cu, Nv};
use crate::objects::context::OwnUsage;
use crate::state;
use hami_abi::layout::MAX_DEVICES;
use std::ffi::{c_char, c_uint, CStr};
use std::sync::{Mutex, OnceLock, PoisonError};

/// NVML handles of CUDA ordinals, for measuring context memory.
static NVML_BY_ORDINAL: Mutex<[usize; MAX_DEVICES]> = Mutex::new([0; MAX_DEVICES]);
static NVML_INIT: OnceLock<bool> = OnceLock::new();

/// Whether NVML is present and initialised (`nvmlInit_v2`, once per process).
pub(crate) fn nvml_ready() -> bool {
    *NVML_INIT.get_or_init(|| {
        // SAFETY: documented type.
        match unsafe { symbols::nv::<FnNvmlInit>(Nv::nvmlInit_v2) } {
            // SAFETY: no arguments.
            Some(f) => (unsafe { f() }) == NVML_SUCCESS,
            None => false,
        }
    })
}

/// The NVML handle of CUDA ordinal `dev` (found by UUID, cached).
pub(crate) fn nvml_handle(dev: usize) -> Option<nvmlDevice_t> {
    if dev >= MAX_DEVICES || !nvml_ready() {
        return None;
    }
    let mut cache = NVML_BY_ORDINAL
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    if cache[dev] == 0 {
        let uuid = crate::driver::devmap::device_uuid(dev as CUdevice)?;
        cache[dev] = nvml_handle_for_uuid(&uuid)? as usize;
    }
    Some(cache[dev] as nvmlDevice_t)
}

/// Device used memory per NVML for CUDA ordinal `dev` (real NVML, not our view).
pub(crate) fn nvml_used(dev: usize) -> Option<u64> {
    let h = nvml_handle(dev)?;
    // SAFETY: documented type.
    let info = unsafe { symbols::nv::<FnNvmlMemInfo>(Nv::nvmlDeviceGetMemoryInfo) }?;
    let mut m = nvmlMemory_t::default();
    // SAFETY: handle from NVML, valid out pointer.
    (unsafe { info(h, &mut m) } == NVML_SUCCESS).then_some(m.used)
}

/// This process's entry in one `nvmlDeviceGetComputeRunningProcesses*` list. `call(count,
/// buffer)` is the NVML function; `entry` reads (pid, used) from an entry. The buffer grows
/// while NVML answers `NVML_ERROR_INSUFFICIENT_SIZE`. Entries of our pid are summed (MIG
/// lists a process once per instance).
fn own_in_list<T: Copy + Default>(
    pid: u32,
    call: impl Fn(*mut c_uint, *mut T) -> nvmlReturn_t,
    entry: impl Fn(&T) -> (u32, u64),
) -> OwnUsage {
    let mut cap: usize = 64;
    for _ in 0..4 {
        let mut buf = vec![T::default(); cap];
        let mut n = cap as c_uint;
        match call(&mut n, buf.as_mut_ptr()) {
            NVML_SUCCESS => {
                let mut found = None::<u64>;
                for e in &buf[..(n as usize).min(cap)] {
                    let (p, used) = entry(e);
                    if p != pid {
                        continue;
                    }
                    if used == NVML_VALUE_NOT_AVAILABLE {
                        return OwnUsage::Unavailable;
                    }
                    found = Some(found.unwrap_or(0).saturating_add(used));
                }
                return found.map_or(OwnUsage::NotListed, OwnUsage::Listed);
            }
            NVML_ERROR_INSUFFICIENT_SIZE => cap = (n as usize).max(cap) + 16,
            _ => return OwnUsage::Unavailable,
        }
    }
    OwnUsage::Unavailable
}

/// This process's used memory on CUDA ordinal `dev` per NVML's list of compute processes
/// (`_v3`, else `_v2`, else the v1 name). NVML reports pids of the host's pid namespace: in
/// a container with its own pid namespace our `getpid()` is not listed.
pub(crate) fn nvml_own_used(dev: usize) -> OwnUsage {
    let Some(h) = nvml_handle(dev) else {
        return OwnUsage::Unavailable;
    };
    // SAFETY: no preconditions.
    let pid = unsafe { libc::getpid() } as u32;
    for sym in [
        Nv::nvmlDeviceGetComputeRunningProcesses_v3,
        Nv::nvmlDeviceGetComputeRunningProcesses_v2,
    ] {
        // SAFETY: `_v3` and `_v2` both take `nvmlProcessInfo_v2_t` entries.
        if let Some(f) = unsafe { symbols::nv::<FnNvmlProcsV2>(sym) } {
            let r = own_in_list(
                pid,
                // SAFETY: handle from NVML; `buf` holds `*n` entries.
                |n, buf| unsafe { f(h, n, buf) },
                |e: &nvmlProcessInfo_v2_t| (e.pid, e.used_gpu_memory),
            );
            if r != OwnUsage::Unavailable {
                return r;
            }
        }
    }
    // SAFETY: the v1 name takes `nvmlProcessInfo_v1_t` entries.
    match unsafe { symbols::nv::<FnNvmlProcsV1>(Nv::nvmlDeviceGetComputeRunningProcesses) } {
        Some(f) => own_in_list(
            pid,
            // SAFETY: handle from NVML; `buf` holds `*n` entries.
            |n, buf| unsafe { f(h, n, buf) },
            |e: &nvmlProcessInfo_v1_t| (e.pid, e.used_gpu_memory),
        ),
        None => OwnUsage::Unavailable,
    }
}

/// The NVML handle of the device with `uuid`: `nvmlDeviceGetHandleByUUID`, else a scan of
/// the devices by index comparing `nvmlDeviceGetUUID`.
fn nvml_handle_for_uuid(uuid: &[u8; 16]) -> Option<nvmlDevice_t> {
    // SAFETY: documented type.
    let by_uuid = unsafe { symbols::nv::<FnNvmlHandleByUuid>(Nv::nvmlDeviceGetHandleByUUID) };
    if let Some(by_uuid) = by_uuid {
        let s = std::ffi::CString::new(format_uuid(uuid)).ok()?;
        let mut h: nvmlDevice_t = std::ptr::null_mut();
        // SAFETY: valid C string and out pointer.
        if unsafe { by_uuid(s.as_ptr(), &mut h) } == NVML_SUCCESS && !h.is_null() {
            return Some(h);
        }
    }
    // SAFETY: documented types.
    let count = unsafe { symbols::nv::<FnNvmlGetCount>(Nv::nvmlDeviceGetCount_v2) }?;
    // SAFETY: documented type.
    let by_index =
        unsafe { symbols::nv::<FnNvmlHandleByIndex>(Nv::nvmlDeviceGetHandleByIndex_v2) }?;
    let mut n: c_uint = 0;
    // SAFETY: valid out pointer.
    if unsafe { count(&mut n) } != NVML_SUCCESS {
        return None;
    }
    (0..n).find_map(|i| {
        let mut h: nvmlDevice_t = std::ptr::null_mut();
        // SAFETY: valid out pointer.
        if unsafe { by_index(i, &mut h) } != NVML_SUCCESS || h.is_null() {
            return None;
        }
        (nvml_uuid(h)? == *uuid).then_some(h)
    })
}

/// The UUID of an NVML device (real `nvmlDeviceGetUUID`).
pub(crate) fn nvml_uuid(device: nvmlDevice_t) -> Option<[u8; 16]> {
    // SAFETY: documented type.
    let get_uuid = unsafe { symbols::nv::<FnNvmlGetUuid>(Nv::nvmlDeviceGetUUID) }?;
    let mut buf = [0 as c_char; 96];
    // SAFETY: buffer and its length.
    if unsafe { get_uuid(device, buf.as_mut_ptr(), buf.len() as c_uint) } != NVML_SUCCESS {
        return None;
    }
    // SAFETY: NVML wrote a NUL-terminated string into the zeroed buffer (last byte untouched).
    let s = unsafe { CStr::from_ptr(buf.as_ptr()) }
        .to_string_lossy()
        .into_owned();
    parse_uuid(&s)
}

/// Container indices of NVML devices already identified.
static NVML_INDICES: Mutex<Vec<(usize, usize)>> = Mutex::new(Vec::new());

/// The container's index of an NVML device (NVML lists every device of the container,
/// whatever `CUDA_VISIBLE_DEVICES` says): where the region recorded its UUID. When it is not
/// recorded yet (e.g. `nvidia-smi` first), this process initialises the driver and records
/// what it can place itself ([`crate::driver::devmap::record_all`]), then looks again. `None`: the
/// region does not know the device.
pub(crate) fn nvml_container_dev(device: nvmlDevice_t) -> Option<usize> {
    {
        let known = NVML_INDICES.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(&(_, o)) = known.iter().find(|(h, _)| *h == device as usize) {
            return Some(o);
        }
    }
    let uuid = nvml_uuid(device)?;
    let g = state::global();
    let region = g.region.as_ref().ok()?;
    let find = || (0..MAX_DEVICES).find(|&d| region.uuid(d) == uuid);
    let mut found = find();
    if found.is_none() {
        // SAFETY: documented type.
        if let Some(init) = unsafe { symbols::cu::<FnInit>(Cu::cuInit) } {
            // SAFETY: a plain call; an error leaves the driver uninitialised (nothing placed).
            if unsafe { init(0) } == CUDA_SUCCESS {
                crate::driver::devmap::record_all(region);
                found = find();
            }
        }
    }
    let o = found?;
    NVML_INDICES
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .push((device as usize, o));
    Some(o)
}
