//! `nvmlInternalGetExportTable`: NVML's private function table that nvidia-smi 580 reads its
//! process table through, modelled on what NVIDIA's own mock NVML (NVIDIA/k8s-test-infra,
//! `pkg/gpu/mocknvml`) recovered by probing the real nvidia-smi 580.65.06:
//!
//! * the table asked for with the id [`NVSMI_TABLE_ID`] (GUID
//!   `6c3efec4-8fc9-4e6c-a327-ee696e12f7c4`) is an array of 8-byte words: word 0 is the
//!   table's size in bytes, word `i` the function of slot `i`; any other id is
//!   `NVML_ERROR_NOT_SUPPORTED`;
//! * slots 213, 214 and 215 are per-device process lists,
//!   `fn(nvmlDevice_t, unsigned *count /* in: capacity, out: entries */, entry *array)`, with
//!   [`ENTRY_BYTES`]-byte entries (pid u32 @0, usedGpuMemory u64 @8, gpuInstanceId u32 @16,
//!   computeInstanceId u32 @20, usedGpuCcProtectedMemory u64 @24, the process name inline,
//!   NUL-terminated, in 4096 bytes @32). Which is compute, graphics or MPS is not known for the
//!   real driver; here 213 is the compute list, 214 graphics, 215 MPS (each follows
//!   `FAKE_NVML_PROCESS_LISTS` like the public lists). A capacity below the entries is
//!   answered like the public lists (`NVML_ERROR_INSUFFICIENT_SIZE`, the count needed);
//! * slot 81 is a device handle by index, `fn(index, nvmlDevice_t *out, 0x22)`; every other
//!   slot is a stub that answers `NVML_ERROR_NOT_SUPPORTED` whatever it is given.
//!
//! Test knobs (read once): `FAKE_NVML_EXPORT_SIZE` (the size word, default the table's
//! [`TABLE_WORDS`] * 8 bytes), `FAKE_NVML_EXPORT_ALIAS` (32 hex digits: a second id, raw bytes
//! in order, that also answers with the table), `FAKE_NVML_EXPORT_NAMES=unterminated` (every
//! name fills its 4096 bytes without a NUL: a corrupt answer).

use std::ffi::{c_uint, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Once, OnceLock};

use crate::processes::{pid_shift, process_list, ProcessList};
use crate::returns::{
    NvmlReturn, NVML_ERROR_INVALID_ARGUMENT, NVML_ERROR_NOT_SUPPORTED, NVML_SUCCESS,
};
use crate::state::handle_by_index;

/// Raw bytes of the id nvidia-smi asks for: GUID `6c3efec4-8fc9-4e6c-a327-ee696e12f7c4`
/// (first 4 bytes, next 2, next 2 little-endian, then 8 bytes as is).
pub const NVSMI_TABLE_ID: [u8; 16] = [
    0xc4, 0xfe, 0x3e, 0x6c, 0xc9, 0x8f, 0x6c, 0x4e, 0xa3, 0x27, 0xee, 0x69, 0x6e, 0x12, 0xf7, 0xc4,
];
/// Words in the fake's table (word 0 the size, then slots 1..).
pub const TABLE_WORDS: usize = 256;
/// Bytes per entry of the process-list slots.
pub const ENTRY_BYTES: usize = 4128;
/// Offset of the inline process name in an entry.
pub const NAME_OFFSET: usize = 32;
/// Bytes of the inline process name.
pub const NAME_BYTES: usize = 4096;

/// The table: in the library's own data (a caller can tell it is NVML's by its address).
static TABLE: [AtomicUsize; TABLE_WORDS] = [const { AtomicUsize::new(0) }; TABLE_WORDS];
static FILLED: Once = Once::new();

/// The size word: `FAKE_NVML_EXPORT_SIZE`, else the table's size.
fn size_word() -> usize {
    std::env::var("FAKE_NVML_EXPORT_SIZE")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(TABLE_WORDS * 8)
}

/// `FAKE_NVML_EXPORT_ALIAS`, parsed.
fn alias() -> Option<[u8; 16]> {
    static V: OnceLock<Option<[u8; 16]>> = OnceLock::new();
    *V.get_or_init(|| {
        let v = std::env::var("FAKE_NVML_EXPORT_ALIAS").ok()?;
        let v = v.trim();
        if v.len() != 32 {
            return None;
        }
        let mut id = [0u8; 16];
        for (i, b) in id.iter_mut().enumerate() {
            *b = u8::from_str_radix(v.get(2 * i..2 * i + 2)?, 16).ok()?;
        }
        Some(id)
    })
}

fn unterminated_names() -> bool {
    static V: OnceLock<bool> = OnceLock::new();
    *V.get_or_init(|| {
        std::env::var("FAKE_NVML_EXPORT_NAMES").is_ok_and(|v| v.trim() == "unterminated")
    })
}

/// Every slot but the known ones.
unsafe extern "C" fn stub_slot() -> NvmlReturn {
    NVML_ERROR_NOT_SUPPORTED
}

/// Slot 81: `fn(index, nvmlDevice_t *out, 0x22)`.
unsafe extern "C" fn slot_handle_by_index(
    index: c_uint,
    device: *mut *mut c_void,
    _flags: c_uint,
) -> NvmlReturn {
    handle_by_index(index, device)
}

/// Writes entry `k` of a process-list slot's array.
///
/// # Safety
/// `array` holds more than `k` entries of [`ENTRY_BYTES`].
unsafe fn write_entry(array: *mut u8, k: usize, pid: u32, used: u64, name: &str) {
    let mut e = [0u8; ENTRY_BYTES];
    e[0..4].copy_from_slice(&pid.to_ne_bytes());
    e[8..16].copy_from_slice(&used.to_ne_bytes());
    e[16..20].copy_from_slice(&u32::MAX.to_ne_bytes());
    e[20..24].copy_from_slice(&u32::MAX.to_ne_bytes());
    let field = &mut e[NAME_OFFSET..NAME_OFFSET + NAME_BYTES];
    if unterminated_names() {
        field.fill(b'x');
    } else {
        let n = name.len().min(NAME_BYTES - 1);
        field[..n].copy_from_slice(&name.as_bytes()[..n]);
    }
    // SAFETY: the caller's contract.
    unsafe { std::ptr::copy_nonoverlapping(e.as_ptr(), array.add(k * ENTRY_BYTES), ENTRY_BYTES) };
}

/// A process-list slot: `which`'s processes with their names.
fn slot_list(
    which: ProcessList,
    device: *mut c_void,
    count: *mut c_uint,
    array: *mut u8,
) -> NvmlReturn {
    process_list(which, device, count, array.is_null(), |k, pid, used| {
        let name = fake_state::process_name(pid.wrapping_sub(pid_shift()));
        // SAFETY: `array` holds at least *count (checked >= k + 1) entries (the slot's
        // contract).
        unsafe { write_entry(array, k, pid, used, &name) }
    })
}

unsafe extern "C" fn slot_compute(
    device: *mut c_void,
    count: *mut c_uint,
    array: *mut u8,
) -> NvmlReturn {
    slot_list(ProcessList::Compute, device, count, array)
}

unsafe extern "C" fn slot_graphics(
    device: *mut c_void,
    count: *mut c_uint,
    array: *mut u8,
) -> NvmlReturn {
    slot_list(ProcessList::Graphics, device, count, array)
}

unsafe extern "C" fn slot_mps(
    device: *mut c_void,
    count: *mut c_uint,
    array: *mut u8,
) -> NvmlReturn {
    slot_list(ProcessList::Mps, device, count, array)
}

fn fill() {
    FILLED.call_once(|| {
        TABLE[0].store(size_word(), Ordering::Relaxed);
        for (i, w) in TABLE.iter().enumerate().skip(1) {
            let f = match i {
                81 => slot_handle_by_index as *const () as usize,
                213 => slot_compute as *const () as usize,
                214 => slot_graphics as *const () as usize,
                215 => slot_mps as *const () as usize,
                _ => stub_slot as *const () as usize,
            };
            w.store(f, Ordering::Relaxed);
        }
    });
}

/// `nvmlReturn_t nvmlInternalGetExportTable(const void **ppExportTable, const
/// nvmlExportTableUUID *id)`: the table for [`NVSMI_TABLE_ID`] (or the alias knob), else
/// `NVML_ERROR_NOT_SUPPORTED`; NULL arguments are `NVML_ERROR_INVALID_ARGUMENT`.
#[no_mangle]
pub unsafe extern "C" fn nvmlInternalGetExportTable(
    table: *mut *const c_void,
    id: *const [u8; 16],
) -> NvmlReturn {
    if table.is_null() || id.is_null() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    // SAFETY: non-null; 16 bytes (the C contract).
    let id = unsafe { id.read_unaligned() };
    if id != NVSMI_TABLE_ID && Some(id) != alias() {
        return NVML_ERROR_NOT_SUPPORTED;
    }
    fill();
    // SAFETY: non-null out pointer (the C contract).
    unsafe { table.write(TABLE.as_ptr() as *const c_void) };
    NVML_SUCCESS
}
