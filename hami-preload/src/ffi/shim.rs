//! The prelude every exported hook shares, written once: `guard` (a panic becomes an error
//! code, never an unwind across FFI), the real function's lookup, the re-entry check
//! (`enter`: a call the driver makes to its own exports is forwarded untouched) and the
//! forward. `hook!` defines a hook from its signature, its symbol and its body.
//!
//! ```ignore
//! hook! {
//!     /// Hook of `cuMemFree_v2`.
//!     fn cuMemFree_v2(dptr: CUdeviceptr) -> CUresult;
//!     |f| {
//!         // SAFETY: forwarded argument.
//!         release(KeySpace::Pointer, dptr, || unsafe { f(dptr) })
//!     }
//! }
//! ```
//!
//! expands to `#[no_mangle] pub unsafe extern "C" fn cuMemFree_v2(dptr: CUdeviceptr) ->
//! CUresult` that returns `CUDA_ERROR_UNKNOWN` on a panic, `CUDA_ERROR_NOT_FOUND` when the
//! driver lacks the function, forwards a nested call as is, and otherwise runs the body with
//! `f` the real function and the thread marked as inside a hook. The hook is declared with
//! the C prototype of the function it replaces, and that is all it says about it: the real
//! function is the table entry of the hook's own name (`symbols::Cu::cuMemFree_v2`, which
//! exists only for a row of `INTERCEPTS` with `hooked: true`), and its type is the hook's own
//! signature (`unsafe extern "C" fn(CUdeviceptr) -> CUresult`). `-> nvmlReturn_t` makes an
//! NVML hook (`symbols::Nv::<name>`, `NVML_ERROR_UNKNOWN`, `NVML_ERROR_FUNCTION_NOT_FOUND`).
//! `observe |f|` leaves out the re-entry check: for hooks that only record what the driver
//! returned and call `enter` themselves where it matters. With `CUDA_DISABLE_CONTROL=true`
//! every hook forwards its call untouched (one atomic load), before any state is built.
//!
//! A function and its per-thread-default-stream twin share one body:
//!
//! ```ignore
//! hook! {
//!     /// Hook of `cuGraphUpload`.
//!     fn cuGraphUpload / cuGraphUpload_ptsz(exec: CUgraphExec, stream: CUstream) -> CUresult;
//!     |f, name, _| {
//!         // SAFETY: forwarded arguments.
//!         with_graph_memory(name, exec, false, || unsafe { f(exec, stream) })
//!     }
//! }
//! ```
//!
//! defines the two hooks `cuGraphUpload` and `cuGraphUpload_ptsz`, each with the prelude
//! above and its own real function (`symbols::Cu::cuGraphUpload`,
//! `symbols::Cu::cuGraphUpload_ptsz`); in the body `name` is the hook's own symbol name
//! (`&'static str`) and `ptsz` whether it is the `_ptsz` twin (`_` for one it does not use).
//! The doc comment is the first one's; the twin's says whose twin it is.

use std::cell::Cell;
use std::panic::{catch_unwind, AssertUnwindSafe};

/// Runs `f`, turning a panic into `err` (no unwinding across the FFI boundary).
pub(crate) fn guard<R>(err: R, f: impl FnOnce() -> R) -> R {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|_| {
        crate::error!("internal error (panic) in a hook; returning an error code");
        err
    })
}

thread_local! {
    /// Whether this thread is inside one of our hooks.
    static IN_HOOK: Cell<bool> = const { Cell::new(false) };
}

/// Marks the thread as inside a hook until dropped (also when a panic unwinds to [`guard`]).
pub(crate) struct Entered;

impl Drop for Entered {
    fn drop(&mut self) {
        let _ = IN_HOOK.try_with(|f| f.set(false));
    }
}

/// Enters a hook. `None` when this thread is already inside one: the driver is calling one of
/// its own exported functions (a library linked without `-Bsymbolic` goes through its PLT,
/// i.e. into our exports; e.g. a primary-context retain that calls `cuCtxCreate_v2`, or a
/// pitched allocation that calls `cuMemAlloc_v2`). The caller then forwards the call to the
/// real function untouched: the outer hook accounts for it, exactly once, and no lock of
/// ours is taken twice by one thread.
#[inline]
pub(crate) fn enter() -> Option<Entered> {
    match IN_HOOK.try_with(|f| f.replace(true)) {
        Ok(true) => None,
        // Ok(false), or no thread-local storage any more (thread exit): account normally.
        _ => Some(Entered),
    }
}

/// Defines one exported hook with the shared prelude (see the module documentation), or a
/// function and its per-thread-default-stream twin (`fn cuX / cuX_ptsz(..)`, one body).
macro_rules! hook {
    (
        $(#[$doc:meta])*
        fn $name:ident / $ptsz:ident($($arg:ident: $aty:ty),* $(,)?) -> CUresult;
        |$f:ident, $n:pat_param, $p:pat_param| $body:block
    ) => {
        $crate::ffi::shim::hook! {
            $(#[$doc])*
            fn $name($($arg: $aty),*) -> CUresult;
            |$f| {
                let $n: &'static str = stringify!($name);
                let $p: bool = false;
                $body
            }
        }
        $crate::ffi::shim::hook! {
            #[doc = concat!(
                "Hook of `", stringify!($ptsz), "`: [`", stringify!($name),
                "`] on the per-thread default stream.",
            )]
            fn $ptsz($($arg: $aty),*) -> CUresult;
            |$f| {
                let $n: &'static str = stringify!($ptsz);
                let $p: bool = true;
                $body
            }
        }
    };
    (
        $(#[$doc:meta])*
        fn $name:ident($($arg:ident: $aty:ty),* $(,)?) -> CUresult;
        |$f:ident| $body:block
    ) => {
        $(#[$doc])*
        #[no_mangle]
        pub unsafe extern "C" fn $name($($arg: $aty),*) -> $crate::ffi::cuda::CUresult {
            $crate::ffi::shim::guard($crate::ffi::cuda::CUDA_ERROR_UNKNOWN, || {
                // SAFETY: the hook's signature is the C prototype of the symbol of its name.
                let Some($f) = (unsafe {
                    $crate::ffi::symbols::cu::<unsafe extern "C" fn($($aty),*) -> $crate::ffi::cuda::CUresult>(
                        $crate::ffi::symbols::Cu::$name,
                    )
                }) else {
                    return $crate::ffi::cuda::CUDA_ERROR_NOT_FOUND;
                };
                if $crate::ffi::config::control_disabled() {
                    // SAFETY: `CUDA_DISABLE_CONTROL=true`: forwarded untouched.
                    return unsafe { $f($($arg),*) };
                }
                let Some(_entered) = $crate::ffi::shim::enter() else {
                    // SAFETY: nested call (the driver calling its own export): forwarded
                    // untouched, with the caller's arguments.
                    return unsafe { $f($($arg),*) };
                };
                $body
            })
        }
    };
    (
        $(#[$doc:meta])*
        fn $name:ident($($arg:ident: $aty:ty),* $(,)?) -> CUresult;
        observe |$f:ident| $body:block
    ) => {
        $(#[$doc])*
        #[no_mangle]
        pub unsafe extern "C" fn $name($($arg: $aty),*) -> $crate::ffi::cuda::CUresult {
            $crate::ffi::shim::guard($crate::ffi::cuda::CUDA_ERROR_UNKNOWN, || {
                // SAFETY: the hook's signature is the C prototype of the symbol of its name.
                let Some($f) = (unsafe {
                    $crate::ffi::symbols::cu::<unsafe extern "C" fn($($aty),*) -> $crate::ffi::cuda::CUresult>(
                        $crate::ffi::symbols::Cu::$name,
                    )
                }) else {
                    return $crate::ffi::cuda::CUDA_ERROR_NOT_FOUND;
                };
                if $crate::ffi::config::control_disabled() {
                    // SAFETY: `CUDA_DISABLE_CONTROL=true`: forwarded untouched.
                    return unsafe { $f($($arg),*) };
                }
                $body
            })
        }
    };
    (
        $(#[$doc:meta])*
        fn $name:ident($($arg:ident: $aty:ty),* $(,)?) -> nvmlReturn_t;
        |$f:ident| $body:block
    ) => {
        $(#[$doc])*
        #[no_mangle]
        pub unsafe extern "C" fn $name($($arg: $aty),*) -> $crate::ffi::cuda::nvmlReturn_t {
            $crate::ffi::shim::guard($crate::ffi::cuda::NVML_ERROR_UNKNOWN, || {
                // SAFETY: the hook's signature is the C prototype of the symbol of its name.
                let Some($f) = (unsafe {
                    $crate::ffi::symbols::nv::<
                        unsafe extern "C" fn($($aty),*) -> $crate::ffi::cuda::nvmlReturn_t,
                    >($crate::ffi::symbols::Nv::$name)
                }) else {
                    return $crate::ffi::cuda::NVML_ERROR_FUNCTION_NOT_FOUND;
                };
                if $crate::ffi::config::control_disabled() {
                    // SAFETY: `CUDA_DISABLE_CONTROL=true`: forwarded untouched.
                    return unsafe { $f($($arg),*) };
                }
                let Some(_entered) = $crate::ffi::shim::enter() else {
                    // SAFETY: nested call (NVML calling its own export): forwarded untouched,
                    // with the caller's arguments.
                    return unsafe { $f($($arg),*) };
                };
                $body
            })
        }
    };
}
pub(crate) use hook;
