//! Fake NVML (`libnvidia-ml.so.1`) fed from the fake CUDA driver's shared state file, so
//! that NVML and the fake driver agree on total, used and per-process memory.
//!
//! NVML device indices are physical (`CUDA_VISIBLE_DEVICES` does not apply, as with the real
//! NVML). `used` includes every process's allocations and context overhead. Result codes and
//! struct layouts follow `nvml.h` (checked against a real NVML 580:
//! `testing/fake-cuda/tests/data/real-nvml-580.txt`); the reserved memory of the real
//! `nvmlDeviceGetMemoryInfo_v2` is 0 here, so v1 and v2 report the same `used`.
//!
//! Every export is an `unsafe extern "C"` function following the C contract of `nvml.h`;
//! panics never cross the FFI boundary (they become `NVML_ERROR_UNKNOWN`).

#![allow(non_snake_case, clippy::missing_safety_doc)]

use std::ffi::{c_char, c_int, c_uint, c_void};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;

use fake_state::Shared;

mod export_table;
mod utilization;
pub use export_table::*;
pub use utilization::*;

type NvmlReturn = c_int;
const NVML_SUCCESS: NvmlReturn = 0;
const NVML_ERROR_UNINITIALIZED: NvmlReturn = 1;
const NVML_ERROR_INVALID_ARGUMENT: NvmlReturn = 2;
const NVML_ERROR_NOT_SUPPORTED: NvmlReturn = 3;
const NVML_ERROR_INSUFFICIENT_SIZE: NvmlReturn = 7;
const NVML_ERROR_ARGUMENT_VERSION_MISMATCH: NvmlReturn = 25;
const NVML_ERROR_UNKNOWN: NvmlReturn = 999;

/// Driver version string reported by `nvmlSystemGetDriverVersion` unless
/// `FAKE_NVML_DRIVER_VERSION` names another (a test asking for a branch whose export-table
/// layout is unknown).
const DRIVER_VERSION: &str = "580.159.04";

fn driver_version() -> &'static str {
    static V: OnceLock<String> = OnceLock::new();
    V.get_or_init(|| {
        std::env::var("FAKE_NVML_DRIVER_VERSION").unwrap_or_else(|_| DRIVER_VERSION.to_string())
    })
}

/// `nvmlMemory_t`.
#[repr(C)]
pub struct NvmlMemory {
    total: u64,
    free: u64,
    used: u64,
}

/// `nvmlMemory_v2_t`.
#[repr(C)]
pub struct NvmlMemoryV2 {
    version: c_uint,
    total: u64,
    reserved: u64,
    free: u64,
    used: u64,
}

/// `nvmlMemory_v2`: `sizeof(nvmlMemory_v2_t) | 2 << 24` (0x2000028).
pub const NVML_MEMORY_V2: c_uint = (std::mem::size_of::<NvmlMemoryV2>() as c_uint) | (2 << 24);

/// `nvmlProcessInfo_v1_t`.
#[repr(C)]
pub struct ProcessInfoV1 {
    pid: c_uint,
    used_gpu_memory: u64,
}

/// `nvmlProcessInfo_v2_t` (also `nvmlProcessInfo_t`, used by `_v2` and `_v3`).
#[repr(C)]
pub struct ProcessInfoV2 {
    pid: c_uint,
    used_gpu_memory: u64,
    gpu_instance_id: c_uint,
    compute_instance_id: c_uint,
}

/// Init reference count (NVML allows nested init/shutdown).
static INIT_COUNT: AtomicU32 = AtomicU32::new(0);
static SHARED: OnceLock<Result<Shared, String>> = OnceLock::new();

fn run(f: impl FnOnce() -> Result<(), NvmlReturn>) -> NvmlReturn {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(Ok(())) => NVML_SUCCESS,
        Ok(Err(e)) => e,
        Err(_) => NVML_ERROR_UNKNOWN,
    }
}

fn shared() -> Result<&'static Shared, NvmlReturn> {
    if INIT_COUNT.load(Ordering::Acquire) == 0 {
        return Err(NVML_ERROR_UNINITIALIZED);
    }
    SHARED
        .get()
        .and_then(|r| r.as_ref().ok())
        .ok_or(NVML_ERROR_UNINITIALIZED)
}

/// Device handles are `index + 1` cast to a pointer (never dereferenced by callers).
fn device_of(h: *mut c_void) -> Result<(&'static Shared, usize), NvmlReturn> {
    let sh = shared()?;
    let i = (h as usize).wrapping_sub(1);
    if h.is_null() || i >= sh.device_count() {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    Ok((sh, i))
}

fn nonnull<T>(p: *const T) -> Result<(), NvmlReturn> {
    if p.is_null() {
        Err(NVML_ERROR_INVALID_ARGUMENT)
    } else {
        Ok(())
    }
}

/// Copies `s` into a C buffer of `len` bytes, NUL-terminated.
fn copy_str(buf: *mut c_char, len: c_uint, s: &str) -> Result<(), NvmlReturn> {
    nonnull(buf)?;
    if (len as usize) < s.len() + 1 {
        return Err(NVML_ERROR_INSUFFICIENT_SIZE);
    }
    // SAFETY: `buf` holds `len` >= s.len() + 1 bytes (C contract).
    unsafe {
        std::ptr::copy_nonoverlapping(s.as_ptr(), buf as *mut u8, s.len());
        *buf.add(s.len()) = 0;
    }
    Ok(())
}

fn init() -> NvmlReturn {
    run(|| {
        match SHARED.get_or_init(|| Shared::open_default().map_err(|e| e.to_string())) {
            Ok(_) => {}
            Err(e) => {
                eprintln!("fake libnvidia-ml: {e}");
                return Err(NVML_ERROR_UNKNOWN);
            }
        }
        INIT_COUNT.fetch_add(1, Ordering::AcqRel);
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlInit_v2() -> NvmlReturn {
    init()
}

#[no_mangle]
pub unsafe extern "C" fn nvmlInit() -> NvmlReturn {
    init()
}

#[no_mangle]
pub unsafe extern "C" fn nvmlInitWithFlags(_flags: c_uint) -> NvmlReturn {
    init()
}

#[no_mangle]
pub unsafe extern "C" fn nvmlShutdown() -> NvmlReturn {
    run(|| {
        INIT_COUNT
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |c| c.checked_sub(1))
            .map(|_| ())
            .map_err(|_| NVML_ERROR_UNINITIALIZED)
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlErrorString(result: NvmlReturn) -> *const c_char {
    let s: &'static [u8] = match result {
        0 => b"Success\0",
        1 => b"Uninitialized\0",
        2 => b"Invalid Argument\0",
        3 => b"Not Supported\0",
        4 => b"Insufficient Permissions\0",
        5 => b"Already Initialized\0",
        6 => b"Not Found\0",
        7 => b"Insufficient Size\0",
        9 => b"Driver Not Loaded\0",
        13 => b"Function Not Found\0",
        15 => b"GPU is lost\0",
        25 => b"Argument version mismatch\0",
        _ => b"Unknown Error\0",
    };
    s.as_ptr() as *const c_char
}

#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetDriverVersion(
    version: *mut c_char,
    length: c_uint,
) -> NvmlReturn {
    run(|| {
        shared()?;
        copy_str(version, length, driver_version())
    })
}

fn device_count(count: *mut c_uint) -> NvmlReturn {
    run(|| {
        let sh = shared()?;
        nonnull(count)?;
        // SAFETY: checked non-NULL; C contract.
        unsafe { count.write(sh.device_count() as c_uint) };
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCount_v2(count: *mut c_uint) -> NvmlReturn {
    device_count(count)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCount(count: *mut c_uint) -> NvmlReturn {
    device_count(count)
}

pub(crate) fn handle_by_index(index: c_uint, device: *mut *mut c_void) -> NvmlReturn {
    run(|| {
        let sh = shared()?;
        nonnull(device)?;
        if index as usize >= sh.device_count() {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        // SAFETY: checked non-NULL; C contract.
        unsafe { device.write((index as usize + 1) as *mut c_void) };
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex_v2(
    index: c_uint,
    device: *mut *mut c_void,
) -> NvmlReturn {
    handle_by_index(index, device)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex(
    index: c_uint,
    device: *mut *mut c_void,
) -> NvmlReturn {
    handle_by_index(index, device)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetIndex(device: *mut c_void, index: *mut c_uint) -> NvmlReturn {
    run(|| {
        let (_, i) = device_of(device)?;
        nonnull(index)?;
        // SAFETY: checked non-NULL; C contract.
        unsafe { index.write(i as c_uint) };
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetUUID(
    device: *mut c_void,
    uuid: *mut c_char,
    length: c_uint,
) -> NvmlReturn {
    run(|| {
        let (sh, i) = device_of(device)?;
        copy_str(
            uuid,
            length,
            &fake_state::format_uuid(&sh.file().devices[i].uuid),
        )
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetName(
    device: *mut c_void,
    name: *mut c_char,
    length: c_uint,
) -> NvmlReturn {
    run(|| {
        let (sh, i) = device_of(device)?;
        copy_str(name, length, &sh.device_name(i))
    })
}

/// (total, used) of device `i`.
fn memory(sh: &Shared, i: usize) -> (u64, u64) {
    let total = sh.file().devices[i].total;
    (total, sh.used(i).min(total))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo(
    device: *mut c_void,
    memory_out: *mut NvmlMemory,
) -> NvmlReturn {
    run(|| {
        let (sh, i) = device_of(device)?;
        nonnull(memory_out)?;
        let (total, used) = memory(sh, i);
        // SAFETY: checked non-NULL; C contract.
        unsafe {
            memory_out.write(NvmlMemory {
                total,
                free: total - used,
                used,
            })
        };
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(
    device: *mut c_void,
    memory_out: *mut NvmlMemoryV2,
) -> NvmlReturn {
    run(|| {
        let (sh, i) = device_of(device)?;
        nonnull(memory_out)?;
        // SAFETY: checked non-NULL; C contract (the caller sets `version` first).
        let version = unsafe { (*memory_out).version };
        if version != NVML_MEMORY_V2 {
            return Err(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
        }
        let (total, used) = memory(sh, i);
        // SAFETY: checked non-NULL; C contract.
        unsafe {
            memory_out.write(NvmlMemoryV2 {
                version,
                total,
                reserved: 0,
                free: total - used,
                used,
            })
        };
        Ok(())
    })
}

/// Test knob `FAKE_NVML_HIDE_PROCESSES=1`: the process lists report every pid shifted by
/// [`HIDDEN_PID_OFFSET`], as NVML looks from a container with its own pid namespace (it lists
/// host pids, none of which is the caller's `getpid()`).
/// Added to every pid under `FAKE_NVML_HIDE_PROCESSES=1`: beyond Linux's largest pid (2^22).
pub const HIDDEN_PID_OFFSET: u32 = 1 << 22;

fn hide_processes() -> bool {
    static V: OnceLock<bool> = OnceLock::new();
    *V.get_or_init(|| std::env::var("FAKE_NVML_HIDE_PROCESSES").is_ok_and(|v| v == "1"))
}

/// What the lists add to every pid ([`HIDDEN_PID_OFFSET`] under `FAKE_NVML_HIDE_PROCESSES=1`).
fn pid_shift() -> u32 {
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
    infos: *mut ProcessInfoV1,
) -> NvmlReturn {
    processes_v1(ProcessList::Compute, device, count, infos)
}

fn processes_v1(
    which: ProcessList,
    device: *mut c_void,
    count: *mut c_uint,
    infos: *mut ProcessInfoV1,
) -> NvmlReturn {
    process_list(which, device, count, infos.is_null(), |k, pid, used| {
        // SAFETY: `infos` holds at least *count (checked >= k + 1) entries (C contract).
        unsafe {
            infos.add(k).write(ProcessInfoV1 {
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
    infos: *mut ProcessInfoV2,
) -> NvmlReturn {
    process_list(which, device, count, infos.is_null(), |k, pid, used| {
        // SAFETY: `infos` holds at least *count (checked >= k + 1) entries (C contract).
        unsafe {
            infos.add(k).write(ProcessInfoV2 {
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
    infos: *mut ProcessInfoV2,
) -> NvmlReturn {
    processes_v2(ProcessList::Compute, device, count, infos)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v3(
    device: *mut c_void,
    count: *mut c_uint,
    infos: *mut ProcessInfoV2,
) -> NvmlReturn {
    processes_v2(ProcessList::Compute, device, count, infos)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetGraphicsRunningProcesses(
    device: *mut c_void,
    count: *mut c_uint,
    infos: *mut ProcessInfoV1,
) -> NvmlReturn {
    processes_v1(ProcessList::Graphics, device, count, infos)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetGraphicsRunningProcesses_v2(
    device: *mut c_void,
    count: *mut c_uint,
    infos: *mut ProcessInfoV2,
) -> NvmlReturn {
    processes_v2(ProcessList::Graphics, device, count, infos)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetGraphicsRunningProcesses_v3(
    device: *mut c_void,
    count: *mut c_uint,
    infos: *mut ProcessInfoV2,
) -> NvmlReturn {
    processes_v2(ProcessList::Graphics, device, count, infos)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMPSComputeRunningProcesses(
    device: *mut c_void,
    count: *mut c_uint,
    infos: *mut ProcessInfoV1,
) -> NvmlReturn {
    processes_v1(ProcessList::Mps, device, count, infos)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMPSComputeRunningProcesses_v2(
    device: *mut c_void,
    count: *mut c_uint,
    infos: *mut ProcessInfoV2,
) -> NvmlReturn {
    processes_v2(ProcessList::Mps, device, count, infos)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMPSComputeRunningProcesses_v3(
    device: *mut c_void,
    count: *mut c_uint,
    infos: *mut ProcessInfoV2,
) -> NvmlReturn {
    processes_v2(ProcessList::Mps, device, count, infos)
}

/// `nvmlProcessDetail_v1_t`.
#[repr(C)]
pub struct ProcessDetailV1 {
    pid: c_uint,
    used_gpu_memory: u64,
    gpu_instance_id: c_uint,
    compute_instance_id: c_uint,
    used_gpu_cc_protected_memory: u64,
}

/// `nvmlProcessDetailList_v1_t`.
#[repr(C)]
pub struct ProcessDetailListV1 {
    version: c_uint,
    mode: c_uint,
    num_proc_array_entries: c_uint,
    proc_array: *mut ProcessDetailV1,
}

/// `nvmlProcessDetailList_v1`: `sizeof(nvmlProcessDetailList_v1_t) | 1 << 24` (0x1000018).
pub const NVML_PROCESS_DETAIL_LIST_V1: c_uint =
    (std::mem::size_of::<ProcessDetailListV1>() as c_uint) | (1 << 24);

/// The three lists in one call: `mode` 0 compute, 1 graphics, 2 MPS compute; another
/// `version` is `NVML_ERROR_ARGUMENT_VERSION_MISMATCH`, another mode
/// `NVML_ERROR_INVALID_ARGUMENT`; `numProcArrayEntries` follows the `*infoCount` protocol.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetRunningProcessDetailList(
    device: *mut c_void,
    plist: *mut ProcessDetailListV1,
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
                infos.add(k).write(ProcessDetailV1 {
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
