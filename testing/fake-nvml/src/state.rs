//! What every export reads: the init reference count (`nvmlInit*` / `nvmlShutdown`), the fake
//! driver's shared state opened at the first init, and device handles (`index + 1`).

use std::ffi::{c_uint, c_void};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;

use fake_state::Shared;

use crate::returns::{
    nonnull, run, NvmlReturn, NVML_ERROR_INVALID_ARGUMENT, NVML_ERROR_UNINITIALIZED,
    NVML_ERROR_UNKNOWN,
};

/// Init reference count (NVML allows nested init/shutdown).
static INIT_COUNT: AtomicU32 = AtomicU32::new(0);
static SHARED: OnceLock<Result<Shared, String>> = OnceLock::new();

/// The fake driver's state, or `NVML_ERROR_UNINITIALIZED` outside init/shutdown.
pub(crate) fn shared() -> Result<&'static Shared, NvmlReturn> {
    if INIT_COUNT.load(Ordering::Acquire) == 0 {
        return Err(NVML_ERROR_UNINITIALIZED);
    }
    SHARED
        .get()
        .and_then(|r| r.as_ref().ok())
        .ok_or(NVML_ERROR_UNINITIALIZED)
}

/// Device handles are `index + 1` cast to a pointer (never dereferenced by callers).
pub(crate) fn device_of(h: *mut c_void) -> Result<(&'static Shared, usize), NvmlReturn> {
    let sh = shared()?;
    let i = (h as usize).wrapping_sub(1);
    if h.is_null() || i >= sh.device_count() {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    Ok((sh, i))
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

/// Writes the handle of device `index` (`nvmlDeviceGetHandleByIndex*`, the export table's
/// slot 81).
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
