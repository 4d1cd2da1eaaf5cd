//! Hook of `nvmlInternalGetExportTable`, NVML's private function tables: nvidia-smi 580 reads
//! its process table through slots 213-215 of one of them, not through the exported process
//! lists. For that table only (by its id, a sane size word, readable memory, a driver of a
//! branch whose layout is known), the caller gets a copy made once and kept for the
//! process's life, identical but for the three process-list slots, which point to the slot
//! functions below: they call the driver's function with every argument register as given,
//! then narrow a successful answer in place to the container's processes
//! ([`crate::driver::export_table::narrow_entries`], the public lists' rule). Every other table,
//! every other slot and any surprise are the driver's, untouched; each reason to pass a table
//! through is logged once. The policy (what is checked, how entries are narrowed) is plain
//! Rust in [`crate::driver::export_table`].
#![allow(non_snake_case)]
#![allow(clippy::missing_safety_doc)] // The hook has the contract of its NVML function.

use crate::driver::export_table::{self as xt, PassThrough, Untouched, ENTRY_BYTES, PROCESS_SLOTS};
use crate::ffi::cuda::*;
use crate::ffi::shim::{self, hook};
use crate::ffi::symbols::{self, Nv};
use crate::hooks::nvml_procs::container_of;
use std::ffi::{c_char, c_uint, c_void, CStr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

/// The table handed out in place of the driver's (made once).
struct Wrapped {
    /// The driver's table.
    original: usize,
    /// Our copy (`size / 8` words), never freed or moved.
    copy: Box<[u64]>,
    /// The driver's functions of [`PROCESS_SLOTS`].
    originals: [usize; 3],
}

/// What the first successful request for the table decided, for the process's life.
static DECISION: OnceLock<Result<Wrapped, PassThrough>> = OnceLock::new();

/// Logs `what` the first time `flag` is seen unset.
fn once(flag: &AtomicBool, what: impl FnOnce()) {
    if !flag.swap(true, Ordering::Relaxed) {
        what();
    }
}

// The slot functions: every integer argument register of the platform's C calling
// convention is taken and forwarded, so that the driver's function gets exactly what the
// caller passed (of the known shape only the first three are read).
macro_rules! slot_functions {
    ($dev:ident, $count:ident, $array:ident $(, $more:ident)*) => {
        /// An export-table function, as the slot functions take and forward it.
        type SlotFn = unsafe extern "C" fn(usize, usize, usize $(, slot_functions!(@usize $more))*) -> nvmlReturn_t;

        slot_functions!(@one slot_213, 0, $dev, $count, $array $(, $more)*);
        slot_functions!(@one slot_214, 1, $dev, $count, $array $(, $more)*);
        slot_functions!(@one slot_215, 2, $dev, $count, $array $(, $more)*);

        /// Our functions of [`PROCESS_SLOTS`], in order.
        fn slot_functions() -> [u64; 3] {
            [
                slot_213 as *const () as u64,
                slot_214 as *const () as u64,
                slot_215 as *const () as u64,
            ]
        }
    };
    (@usize $x:ident) => { usize };
    (@one $name:ident, $j:expr, $dev:ident, $count:ident, $array:ident $(, $more:ident)*) => {
        /// A process-list slot of the wrapped table (see the module documentation).
        unsafe extern "C" fn $name($dev: usize, $count: usize, $array: usize $(, $more: usize)*) -> nvmlReturn_t {
            process_list($j, $dev, $count, $array, |f| {
                // SAFETY: the driver's function of this slot, with the caller's arguments.
                unsafe { f($dev, $count, $array $(, $more)*) }
            })
        }
    };
}

#[cfg(target_arch = "x86_64")]
slot_functions!(device, count, array, a3, a4, a5);
#[cfg(target_arch = "aarch64")]
slot_functions!(device, count, array, a3, a4, a5, a6, a7);

/// Whether this architecture's slot functions forward every argument register.
const SLOTS_SUPPORTED: bool = cfg!(any(target_arch = "x86_64", target_arch = "aarch64"));

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
type SlotFn = unsafe extern "C" fn(usize, usize, usize) -> nvmlReturn_t;
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
fn slot_functions() -> [u64; 3] {
    [0; 3]
}

/// Process-list slot `j` of the wrapped table: `forward(f)` calls the driver's function
/// `f` with the caller's arguments; a successful answer is narrowed.
fn process_list(
    j: usize,
    device: usize,
    count: usize,
    array: usize,
    forward: impl FnOnce(SlotFn) -> nvmlReturn_t,
) -> nvmlReturn_t {
    let Some(Ok(w)) = DECISION.get() else {
        // Unreachable: only a wrapped table points here.
        return NVML_ERROR_UNKNOWN;
    };
    // SAFETY: a non-NULL function of the driver's table (checked by `wrapped_copy`), called
    // with the slot's own signature.
    let f: SlotFn = unsafe { std::mem::transmute::<usize, SlotFn>(w.originals[j]) };
    let Some(_entered) = shim::enter() else {
        // Inside one of our hooks: the driver's answer as is.
        return forward(f);
    };
    let count = count as *mut c_uint;
    // SAFETY: the slot's contract: `count` is the caller's capacity (NULL is forwarded).
    let capacity = (!count.is_null()).then(|| unsafe { count.read() });
    let rc = forward(f);
    if let (NVML_SUCCESS, Some(capacity)) = (rc, capacity) {
        shim::guard((), || {
            narrow(PROCESS_SLOTS[j], device, count, array, capacity)
        });
    }
    rc
}

/// Narrows slot `slot`'s successful answer (`*count` entries at `array`, the caller's
/// `capacity`) to the container's processes, or leaves it as the driver wrote it.
fn narrow(slot: usize, device: usize, count: *mut c_uint, array: usize, capacity: u32) {
    static SURPRISE: AtomicBool = AtomicBool::new(false);
    let Some((members, pids_are_host)) = container_of(device as nvmlDevice_t) else {
        return;
    };
    // SAFETY: non-NULL (checked by the caller), the driver just wrote it.
    let written = unsafe { count.read() };
    let n = match xt::checked_count(capacity, written) {
        Ok(0) => return,
        Ok(n) if array != 0 => n,
        Ok(_) => return,
        Err(u) => return surprise(&SURPRISE, slot, u),
    };
    // SAFETY: the driver wrote `n` <= capacity entries of ENTRY_BYTES at `array`, the
    // caller's buffer of `capacity` entries (the slot's contract).
    let entries = unsafe { std::slice::from_raw_parts_mut(array as *mut u8, n * ENTRY_BYTES) };
    match xt::narrow_entries(entries, &members, pids_are_host) {
        // SAFETY: as above; `k` <= `n` fits.
        Ok(k) => unsafe { count.write(k as c_uint) },
        Err(u) => surprise(&SURPRISE, slot, u),
    }
}

fn surprise(flag: &AtomicBool, slot: usize, u: Untouched) {
    once(flag, || {
        crate::warn!(
            "nvmlInternalGetExportTable: slot {slot}'s answer left as the driver gave it ({u}); \
             nvidia-smi may list other containers' processes (logged once)"
        )
    });
}

/// The driver's version (`nvmlSystemGetDriverVersion`).
fn driver_version() -> Option<String> {
    // SAFETY: the documented type.
    let f = unsafe { symbols::nv::<FnNvmlDriverVersion>(Nv::nvmlSystemGetDriverVersion) }?;
    let mut buf = [0 as c_char; 96];
    // SAFETY: a buffer of the length passed.
    if unsafe { f(buf.as_mut_ptr(), buf.len() as c_uint) } != NVML_SUCCESS {
        return None;
    }
    buf[buf.len() - 1] = 0;
    // SAFETY: NUL-terminated (the last byte at least).
    let s = unsafe { CStr::from_ptr(buf.as_ptr()) };
    Some(s.to_string_lossy().into_owned())
}

/// Decides once whether the driver's table at `table` is wrapped, and makes the copy.
fn decide(table: usize) -> Result<Wrapped, PassThrough> {
    if !SLOTS_SUPPORTED {
        return Err(PassThrough::Architecture);
    }
    xt::branch_known(&driver_version().ok_or(PassThrough::NoDriverVersion)?)?;
    let maps = std::fs::read_to_string("/proc/self/maps").map_err(|_| PassThrough::Unreadable)?;
    if !table.is_multiple_of(8) || !xt::range_readable(&maps, table, 8) {
        return Err(PassThrough::Unreadable);
    }
    // SAFETY: 8 readable, aligned bytes (checked above): the size word.
    let size = unsafe { (table as *const u64).read() };
    if !xt::size_ok(size) {
        return Err(PassThrough::Size(size));
    }
    if !xt::range_readable(&maps, table, size as usize) {
        return Err(PassThrough::Unreadable);
    }
    // SAFETY: `size` readable bytes from an 8-aligned address (checked above), which the
    // driver hands to every caller as its table.
    let words = unsafe { std::slice::from_raw_parts(table as *const u64, size as usize / 8) };
    let copy = xt::wrapped_copy(words, slot_functions())?;
    let originals = PROCESS_SLOTS.map(|s| words[s] as usize);
    Ok(Wrapped {
        original: table,
        copy: copy.into_boxed_slice(),
        originals,
    })
}

/// What to hand the caller for the driver's table `table` of id `id`: our copy, or `None`
/// (the driver's, untouched).
fn wrapped_table(id: &[u8; 16], table: usize) -> Option<*const c_void> {
    static OTHER_ID: AtomicBool = AtomicBool::new(false);
    static PASSED: AtomicBool = AtomicBool::new(false);
    if *id != xt::NVSMI_TABLE_ID {
        once(&OTHER_ID, || {
            crate::debug!(
                "nvmlInternalGetExportTable: table {} passed through (not the process table's)",
                xt::guid_string(id)
            )
        });
        return None;
    }
    let decision = DECISION.get_or_init(|| decide(table));
    let r = match decision {
        Ok(w) if w.original == table => return Some(w.copy.as_ptr() as *const c_void),
        Ok(_) => PassThrough::AnotherTable,
        Err(e) => e.clone(),
    };
    once(&PASSED, || {
        crate::warn!(
            "nvmlInternalGetExportTable: table {} passed through untouched: {r}; nvidia-smi \
             lists every process it is shown (logged once)",
            xt::guid_string(id)
        )
    });
    None
}

hook! {
    /// Hook of `nvmlInternalGetExportTable` (NVML's private function tables): the table
    /// nvidia-smi reads its process table through comes back wrapped (see the module
    /// documentation); every other answer is the driver's.
    fn nvmlInternalGetExportTable(
        table: *mut *const c_void,
        id: *const c_void,
    ) -> nvmlReturn_t;
    |f| {
        // SAFETY: forwarded arguments.
        let rc = unsafe { f(table, id) };
        if rc != NVML_SUCCESS || table.is_null() || id.is_null() {
            return rc;
        }
        // SAFETY: the caller's 16-byte id (the C contract), non-NULL.
        let idv = unsafe { (id as *const [u8; 16]).read_unaligned() };
        // SAFETY: non-NULL, the driver just wrote it.
        let original = unsafe { table.read() } as usize;
        if original == 0 {
            return rc;
        }
        if let Some(copy) = shim::guard(None, || wrapped_table(&idv, original)) {
            // SAFETY: the caller's out pointer, non-NULL.
            unsafe { table.write(copy) };
        }
        rc
    }
}
