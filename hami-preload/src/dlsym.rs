//! Our exported `dlsym`.
//!
//! glibc's `dlsym` resolves `RTLD_NEXT` relative to its caller's return address, so a plain
//! Rust wrapper calling the real `dlsym` would break `RTLD_NEXT` for every other caller. The
//! exported `dlsym` is therefore a naked trampoline: it keeps the two arguments, asks
//! [`hami_dlsym_decide`] whether the name is one we hook, and otherwise *jumps* (not calls)
//! into the real `dlsym`, with the caller's return address still on the stack.

use crate::ffi::real;
use crate::ffi::symbols::{self, CUDA, NVML};
use crate::hooks::table;
use std::ffi::{c_char, c_void, CStr};

/// Decides whether `dlsym(handle, name)` must return one of our hooks.
///
/// Returns our hook's address, or null to let the real `dlsym` answer. Names that do not
/// start with `cu` or `nvml` cost one atomic load and two byte compares: no lock, no
/// allocation. Also makes sure the real `dlsym` is known (the trampoline jumps to it).
extern "C" fn hami_dlsym_decide(handle: *mut c_void, name: *const c_char) -> *mut c_void {
    real::real_dlsym_ptr();
    if name.is_null() {
        return std::ptr::null_mut();
    }
    // SAFETY: `name` is a non-null C string passed to dlsym by its caller: its first byte is
    // readable, and the second one too when the first is not the terminator.
    let b0 = unsafe { *name as u8 };
    if b0 != b'c' && b0 != b'n' {
        return std::ptr::null_mut();
    }
    // SAFETY: see above (b0 is not NUL).
    let b1 = unsafe { *name.add(1) as u8 };
    if b0 == b'c' && b1 == b'u' {
        decide_slow(handle, name, true)
    } else if b0 == b'n' && b1 == b'v' {
        decide_slow(handle, name, false)
    } else {
        std::ptr::null_mut()
    }
}

#[cold]
fn decide_slow(handle: *mut c_void, name: *const c_char, cuda: bool) -> *mut c_void {
    // No panic may unwind into the trampoline.
    std::panic::catch_unwind(|| {
        if real::resolving() || crate::ffi::config::control_disabled() {
            return std::ptr::null_mut();
        }
        // SAFETY: non-null C string from the caller.
        let name = unsafe { CStr::from_ptr(name) };
        let (idx, lib, hook) = if cuda {
            match symbols::cu_hooked_index(name.to_bytes()) {
                Some(i) => (i, CUDA.get(false), table::cu_hook_addr(i)),
                None => return std::ptr::null_mut(),
            }
        } else {
            match symbols::nv_hooked_index(name.to_bytes()) {
                Some(i) => (i, NVML.get(false), table::nv_hook_addr(i)),
                None => return std::ptr::null_mut(),
            }
        };
        // The library is not loaded yet: whatever `handle` is, it cannot be the driver.
        let Some(lib) = lib else {
            return std::ptr::null_mut();
        };
        let real_addr = lib.get(idx);
        if real_addr.is_null() {
            // The installed driver lacks it: never hand out a hook for it.
            return std::ptr::null_mut();
        }
        if is_pseudo_handle(handle) {
            // RTLD_DEFAULT / RTLD_NEXT: the driver's definition is what the caller reaches.
            return hook;
        }
        // A real handle: hook only if this handle resolves the name to the driver's function.
        // SAFETY: `handle` is what the caller passed to dlsym, a real handle.
        if unsafe { real::real_dlsym(handle, name) } == real_addr {
            hook
        } else {
            std::ptr::null_mut()
        }
    })
    .unwrap_or(std::ptr::null_mut())
}

fn is_pseudo_handle(handle: *mut c_void) -> bool {
    handle == libc::RTLD_DEFAULT || handle == libc::RTLD_NEXT
}

/// Exported `dlsym` (x86_64): see the module documentation.
///
/// # Safety
/// Same contract as glibc's `dlsym`.
#[cfg(target_arch = "x86_64")]
#[unsafe(naked)]
#[no_mangle]
pub unsafe extern "C" fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void {
    // On entry rsp = 8 (mod 16). Two pushes + 8 bytes make it 0 (mod 16) for the call.
    core::arch::naked_asm!(
        "push rdi",
        "push rsi",
        "sub rsp, 8",
        "call {decide}",
        "add rsp, 8",
        "pop rsi",
        "pop rdi",
        "test rax, rax",
        "jz 2f",
        "ret",
        "2:",
        "mov rax, qword ptr [rip + {real}]",
        "test rax, rax",
        "jz 3f",
        "jmp rax",
        "3:",
        "ret",
        decide = sym hami_dlsym_decide,
        real = sym real::REAL_DLSYM,
    )
}

/// Exported `dlsym` (aarch64): see the module documentation.
///
/// # Safety
/// Same contract as glibc's `dlsym`.
#[cfg(target_arch = "aarch64")]
#[unsafe(naked)]
#[no_mangle]
pub unsafe extern "C" fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void {
    core::arch::naked_asm!(
        "stp x29, x30, [sp, #-32]!",
        "mov x29, sp",
        "stp x0, x1, [sp, #16]",
        "bl {decide}",
        "mov x9, x0",
        "ldp x0, x1, [sp, #16]",
        "ldp x29, x30, [sp], #32",
        "cbz x9, 2f",
        "mov x0, x9",
        "ret",
        "2:",
        "adrp x9, {real}",
        "ldr x9, [x9, :lo12:{real}]",
        "cbz x9, 3f",
        "br x9",
        "3:",
        "mov x0, #0",
        "ret",
        decide = sym hami_dlsym_decide,
        real = sym real::REAL_DLSYM,
    )
}
