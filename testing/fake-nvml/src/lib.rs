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

use std::ffi::{c_char, c_uint, c_void};
use std::sync::OnceLock;

use cuda_abi::nvml::{nvmlMemory_t, nvmlMemory_v2_t, NVML_MEMORY_V2};
use fake_state::Shared;

mod export_table;
mod processes;
mod returns;
mod state;
mod utilization;
pub use export_table::*;
pub use processes::*;
pub use state::*;
pub use utilization::*;

use returns::{copy_str, nonnull, run, NvmlReturn, NVML_ERROR_ARGUMENT_VERSION_MISMATCH};
use state::{device_of, handle_by_index, shared};

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
    memory_out: *mut nvmlMemory_t,
) -> NvmlReturn {
    run(|| {
        let (sh, i) = device_of(device)?;
        nonnull(memory_out)?;
        let (total, used) = memory(sh, i);
        // SAFETY: checked non-NULL; C contract.
        unsafe {
            memory_out.write(nvmlMemory_t {
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
    memory_out: *mut nvmlMemory_v2_t,
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
            memory_out.write(nvmlMemory_v2_t {
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
