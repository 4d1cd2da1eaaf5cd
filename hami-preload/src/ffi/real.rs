//! Finding the real driver functions, without going through our own `dlsym`.
//!
//! * The real `dlsym` comes from `dlvsym(RTLD_NEXT, "dlsym", <glibc version>)` (we do not
//!   export `dlvsym`, so this cannot recurse).
//! * `libcuda.so.1` and `libnvidia-ml.so.1` are opened with `dlopen` (first `RTLD_NOLOAD`,
//!   then loading them when a hook needs them), and every symbol we hook or call is looked up
//!   once on that handle with the real `dlsym`.
//!
//! Nothing here holds a lock while calling into the dynamic loader: two threads racing on the
//! first call both resolve, one result is kept (`dlopen` is reference counted, so the extra
//! handle is harmless). A thread-local flag makes resolution re-entrancy safe: if loading
//! the driver calls back into our `dlsym`, the inner call passes through.

use std::cell::Cell;
use std::ffi::{c_char, c_void, CStr};
use std::sync::atomic::{AtomicPtr, Ordering};
use std::sync::OnceLock;

/// The real `dlsym`, once known. Read by the `dlsym` trampoline (see `crate::dlsym`).
pub(crate) static REAL_DLSYM: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());

type DlsymFn = unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void;

/// The real `dlsym` (resolved on first use).
pub fn real_dlsym_ptr() -> *mut c_void {
    let p = REAL_DLSYM.load(Ordering::Acquire);
    if !p.is_null() {
        return p;
    }
    let mut found = std::ptr::null_mut();
    for ver in [c"GLIBC_2.34", c"GLIBC_2.2.5", c"GLIBC_2.17"] {
        // SAFETY: dlvsym with RTLD_NEXT and valid C strings; it is not interposed by us.
        found = unsafe { libc::dlvsym(libc::RTLD_NEXT, c"dlsym".as_ptr(), ver.as_ptr()) };
        if !found.is_null() {
            break;
        }
    }
    if !found.is_null() {
        REAL_DLSYM.store(found, Ordering::Release);
    }
    found
}

/// Calls the real `dlsym(handle, name)`; null if it is unknown or the symbol is missing.
///
/// # Safety
/// `handle` is a `dlopen` handle or a pseudo-handle (`RTLD_DEFAULT`, `RTLD_NEXT`).
pub unsafe fn real_dlsym(handle: *mut c_void, name: &CStr) -> *mut c_void {
    let p = real_dlsym_ptr();
    if p.is_null() {
        return std::ptr::null_mut();
    }
    // SAFETY: `p` is glibc's dlsym, whose type is `DlsymFn`.
    let f: DlsymFn = unsafe { std::mem::transmute::<*mut c_void, DlsymFn>(p) };
    // SAFETY: handle comes from dlopen (or is a pseudo-handle); name is a C string.
    unsafe { f(handle, name.as_ptr()) }
}

thread_local! {
    static RESOLVING: Cell<bool> = const { Cell::new(false) };
}

/// Whether this thread is inside a resolution (used to pass re-entrant `dlsym` calls through).
pub fn resolving() -> bool {
    RESOLVING.with(|r| r.get())
}

/// A resolved library: its handle and the real addresses of the symbols of its table.
pub struct RealLib {
    /// The `dlopen` handle.
    pub handle: *mut c_void,
    /// Real address per symbol (null when the library lacks it), indexed like the table.
    pub fns: Vec<*mut c_void>,
}

// SAFETY: the handle and the function addresses are immutable after resolution and valid in
// every thread.
unsafe impl Send for RealLib {}
// SAFETY: see above.
unsafe impl Sync for RealLib {}

impl RealLib {
    /// Real address of symbol `i` (null when missing).
    pub fn get(&self, i: usize) -> *mut c_void {
        self.fns.get(i).copied().unwrap_or(std::ptr::null_mut())
    }
}

/// A lazily resolved library.
pub struct LazyLib {
    cell: OnceLock<RealLib>,
    soname: &'static CStr,
    probe: &'static CStr,
    names: &'static [&'static CStr],
}

impl LazyLib {
    /// A library with soname `soname` and the symbols `names`. `probe` is a function only
    /// that library defines (and we do not export), used to find it when it was loaded
    /// under another name.
    pub const fn new(
        soname: &'static CStr,
        probe: &'static CStr,
        names: &'static [&'static CStr],
    ) -> LazyLib {
        LazyLib {
            cell: OnceLock::new(),
            soname,
            probe,
            names,
        }
    }

    /// The library if it is already resolved.
    pub fn get_resolved(&self) -> Option<&RealLib> {
        self.cell.get()
    }

    /// Resolves the library. With `load == false` only a library that is already loaded is
    /// used (`RTLD_NOLOAD`). Returns `None` when it cannot be found or on re-entrant calls.
    #[inline]
    pub fn get(&self, load: bool) -> Option<&RealLib> {
        match self.cell.get() {
            Some(l) => Some(l),
            None => self.get_slow(load),
        }
    }

    #[cold]
    #[inline(never)]
    fn get_slow(&self, load: bool) -> Option<&RealLib> {
        if resolving() {
            return None;
        }
        RESOLVING.with(|r| r.set(true));
        let lib = self.open(load);
        RESOLVING.with(|r| r.set(false));
        let lib = lib?;
        let _ = self.cell.set(lib);
        self.cell.get()
    }

    fn open(&self, load: bool) -> Option<RealLib> {
        let flags = libc::RTLD_NOW | libc::RTLD_GLOBAL;
        // SAFETY: dlopen with a valid C string.
        let mut h = unsafe { libc::dlopen(self.soname.as_ptr(), flags | libc::RTLD_NOLOAD) };
        if h.is_null() {
            // Loaded under another name (e.g. a `libcuda.so` without a soname, linked with
            // `-lcuda`): the object that defines the probe function in the global scope.
            // SAFETY: RTLD_DEFAULT is a valid pseudo-handle.
            h = unsafe { defining_object(libc::RTLD_DEFAULT, self.probe) };
        }
        if h.is_null() && load {
            // SAFETY: as above.
            h = unsafe { libc::dlopen(self.soname.as_ptr(), flags) };
            if h.is_null() {
                crate::debug!("cannot load {}", self.soname.to_string_lossy());
            }
        }
        if h.is_null() {
            return None;
        }
        // SAFETY: `h` is the handle dlopen just returned.
        let fns = self
            .names
            .iter()
            .map(|n| unsafe { real_dlsym(h, n) })
            .collect();
        Some(RealLib { handle: h, fns })
    }
}

/// The object that defines `probe` as `handle` resolves it, opened again by its path with
/// `RTLD_NOLOAD` (a handle of the object itself, not of whatever depends on it). Null if the
/// symbol is not found or its object cannot be named.
///
/// # Safety
/// `handle` is a `dlopen` handle or a pseudo-handle.
unsafe fn defining_object(handle: *mut c_void, probe: &CStr) -> *mut c_void {
    // SAFETY: per the contract.
    let addr = unsafe { real_dlsym(handle, probe) };
    if addr.is_null() {
        return std::ptr::null_mut();
    }
    // SAFETY: Dl_info is plain data; all-zero is a valid value.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: `addr` is an address dlsym returned; `info` is a valid out pointer.
    if unsafe { libc::dladdr(addr, &mut info) } == 0 || info.dli_fname.is_null() {
        return std::ptr::null_mut();
    }
    // SAFETY: dladdr returned a NUL-terminated name that lives as long as the object.
    if unsafe { *info.dli_fname } == 0 {
        return std::ptr::null_mut();
    }
    // SAFETY: valid C string; RTLD_NOLOAD never loads anything new.
    unsafe { libc::dlopen(info.dli_fname, libc::RTLD_NOW | libc::RTLD_NOLOAD) }
}
