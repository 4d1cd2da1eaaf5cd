//! The process lists: `nvmlDevice{Compute,Graphics,MPSCompute}RunningProcesses*`,
//! `nvmlDeviceGetRunningProcessDetailList` and the body they share with the export table's
//! lists, and their test knobs (`FAKE_NVML_HIDE_PROCESSES`, `FAKE_NVML_PROCESS_LISTS`).

use std::ffi::{c_uint, c_void};
use std::sync::OnceLock;

use cuda_abi::nvml::{
    nvmlProcessDetailList_v1_t, nvmlProcessDetail_v1_t, nvmlProcessInfo_v1_t, nvmlProcessInfo_v2_t,
    NVML_PROCESS_DETAIL_LIST_V1,
};

use crate::returns::{
    nonnull, run, NvmlReturn, NVML_ERROR_ARGUMENT_VERSION_MISMATCH, NVML_ERROR_INSUFFICIENT_SIZE,
    NVML_ERROR_INVALID_ARGUMENT,
};
use crate::state::device_of;

/// Test knob `FAKE_NVML_HIDE_PROCESSES=1`: the process lists report every pid shifted by
/// [`HIDDEN_PID_OFFSET`], as NVML looks from a container with its own pid namespace (it lists
/// host pids, none of which is the caller's `getpid()`).
/// Added to every pid under `FAKE_NVML_HIDE_PROCESSES=1`: beyond Linux's largest pid (2^22).
pub const HIDDEN_PID_OFFSET: u32 = 1 << 22;

pub(crate) fn hide_processes() -> bool {
    static V: OnceLock<bool> = OnceLock::new();
    *V.get_or_init(|| std::env::var("FAKE_NVML_HIDE_PROCESSES").is_ok_and(|v| v == "1"))
}

/// What the lists add to every pid ([`HIDDEN_PID_OFFSET`] under `FAKE_NVML_HIDE_PROCESSES=1`).
pub(crate) fn pid_shift() -> u32 {
    if hide_processes() {
        HIDDEN_PID_OFFSET
    } else {
        0
    }
}

/// Which process lists report the device's processes: `FAKE_NVML_PROCESS_LISTS`, a comma
/// list of `compute`, `graphics`, `mps` (default `compute`). The fake has no graphics
/// contexts and no MPS server: naming `graphics` models processes that also hold a graphics
/// context (nvidia-smi's type `C+G`), `mps` processes that are MPS clients; a list not named
/// is empty.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum ProcessList {
    Compute,
    Graphics,
    Mps,
}

fn lists_processes(list: ProcessList) -> bool {
    static V: OnceLock<(bool, bool, bool)> = OnceLock::new();
    let (c, g, m) = *V.get_or_init(|| match std::env::var("FAKE_NVML_PROCESS_LISTS") {
        Ok(v) => {
            let has = |n: &str| v.split(',').any(|x| x.trim() == n);
            (has("compute"), has("graphics"), has("mps"))
        }
        Err(_) => (true, false, false),
    });
    match list {
        ProcessList::Compute => c,
        ProcessList::Graphics => g,
        ProcessList::Mps => m,
    }
}

/// Shared body of the `Get*RunningProcesses` families (and of the export table's process
/// lists); `write(k, pid, used)` fills entry k.
/// Pids are the host's ([`fake_state::host_pid`] of each process, as the real driver reports
/// them whatever pid namespace the caller is in).
pub(crate) fn process_list(
    which: ProcessList,
    device: *mut c_void,
    count: *mut c_uint,
    infos_null: bool,
    write: impl Fn(usize, u32, u64),
) -> NvmlReturn {
    run(|| {
        let (sh, i) = device_of(device)?;
        nonnull(count)?;
        let mut list = if lists_processes(which) {
            sh.processes_on(i)
        } else {
            Vec::new()
        };
        for (pid, _) in &mut list {
            *pid = pid.wrapping_add(pid_shift());
        }
        // SAFETY: checked non-NULL; C contract.
        let cap = unsafe { count.read() } as usize;
        // SAFETY: checked non-NULL; C contract.
        unsafe { count.write(list.len() as c_uint) };
        if list.len() > cap {
            return Err(NVML_ERROR_INSUFFICIENT_SIZE);
        }
        if !list.is_empty() && infos_null {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        for (k, &(pid, used)) in list.iter().enumerate() {
            write(k, pid, used);
        }
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses(
    device: *mut c_void,
    count: *mut c_uint,
    infos: *mut nvmlProcessInfo_v1_t,
) -> NvmlReturn {
    processes_v1(ProcessList::Compute, device, count, infos)
}

fn processes_v1(
    which: ProcessList,
    device: *mut c_void,
    count: *mut c_uint,
    infos: *mut nvmlProcessInfo_v1_t,
) -> NvmlReturn {
    process_list(which, device, count, infos.is_null(), |k, pid, used| {
        // SAFETY: `infos` holds at least *count (checked >= k + 1) entries (C contract).
        unsafe {
            infos.add(k).write(nvmlProcessInfo_v1_t {
                pid,
                used_gpu_memory: used,
            })
        }
    })
}

fn processes_v2(
    which: ProcessList,
    device: *mut c_void,
    count: *mut c_uint,
    infos: *mut nvmlProcessInfo_v2_t,
) -> NvmlReturn {
    process_list(which, device, count, infos.is_null(), |k, pid, used| {
        // SAFETY: `infos` holds at least *count (checked >= k + 1) entries (C contract).
        unsafe {
            infos.add(k).write(nvmlProcessInfo_v2_t {
                pid,
                used_gpu_memory: used,
                gpu_instance_id: u32::MAX,
                compute_instance_id: u32::MAX,
            })
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v2(
    device: *mut c_void,
    count: *mut c_uint,
    infos: *mut nvmlProcessInfo_v2_t,
) -> NvmlReturn {
    processes_v2(ProcessList::Compute, device, count, infos)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v3(
    device: *mut c_void,
    count: *mut c_uint,
    infos: *mut nvmlProcessInfo_v2_t,
) -> NvmlReturn {
    processes_v2(ProcessList::Compute, device, count, infos)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetGraphicsRunningProcesses(
    device: *mut c_void,
    count: *mut c_uint,
    infos: *mut nvmlProcessInfo_v1_t,
) -> NvmlReturn {
    processes_v1(ProcessList::Graphics, device, count, infos)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetGraphicsRunningProcesses_v2(
    device: *mut c_void,
    count: *mut c_uint,
    infos: *mut nvmlProcessInfo_v2_t,
) -> NvmlReturn {
    processes_v2(ProcessList::Graphics, device, count, infos)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetGraphicsRunningProcesses_v3(
    device: *mut c_void,
    count: *mut c_uint,
    infos: *mut nvmlProcessInfo_v2_t,
) -> NvmlReturn {
    processes_v2(ProcessList::Graphics, device, count, infos)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMPSComputeRunningProcesses(
    device: *mut c_void,
    count: *mut c_uint,
    infos: *mut nvmlProcessInfo_v1_t,
) -> NvmlReturn {
    processes_v1(ProcessList::Mps, device, count, infos)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMPSComputeRunningProcesses_v2(
    device: *mut c_void,
    count: *mut c_uint,
    infos: *mut nvmlProcessInfo_v2_t,
) -> NvmlReturn {
    processes_v2(ProcessList::Mps, device, count, infos)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMPSComputeRunningProcesses_v3(
    device: *mut c_void,
    count: *mut c_uint,
    infos: *mut nvmlProcessInfo_v2_t,
) -> NvmlReturn {
    processes_v2(ProcessList::Mps, device, count, infos)
}

/// The three lists in one call: `mode` 0 compute, 1 graphics, 2 MPS compute; another
/// `version` is `NVML_ERROR_ARGUMENT_VERSION_MISMATCH`, another mode
/// `NVML_ERROR_INVALID_ARGUMENT`; `numProcArrayEntries` follows the `*infoCount` protocol.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetRunningProcessDetailList(
    device: *mut c_void,
    plist: *mut nvmlProcessDetailList_v1_t,
) -> NvmlReturn {
    if plist.is_null() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    // SAFETY: non-null; C contract.
    let l = unsafe { &mut *plist };
    if l.version != NVML_PROCESS_DETAIL_LIST_V1 {
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    }
    let which = match l.mode {
        0 => ProcessList::Compute,
        1 => ProcessList::Graphics,
        2 => ProcessList::Mps,
        _ => return NVML_ERROR_INVALID_ARGUMENT,
    };
    let infos = l.proc_array;
    process_list(
        which,
        device,
        &mut l.num_proc_array_entries,
        infos.is_null(),
        |k, pid, used| {
            // SAFETY: `procArray` holds at least numProcArrayEntries (>= k + 1) entries.
            unsafe {
                infos.add(k).write(nvmlProcessDetail_v1_t {
                    pid,
                    used_gpu_memory: used,
                    gpu_instance_id: u32::MAX,
                    compute_instance_id: u32::MAX,
                    used_gpu_cc_protected_memory: 0,
                })
            }
        },
    )
}
