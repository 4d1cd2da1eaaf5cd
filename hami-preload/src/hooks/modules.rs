//! Hooks of modules and libraries (eager and lazy loading), function lookups and kernel
//! launches: module memory is measured where it arrives and charged ([`crate::modules`]).
#![allow(non_snake_case)]
#![allow(clippy::missing_safety_doc)] // Every hook has the documented contract of its driver function.

use super::{backstop_poll, finish, report_denial};
use crate::context::measure::{current_dev_ctx, meter};
use crate::cuda::*;
use crate::modules::Stage;
use crate::policy::ContextCost;
use crate::shim::{enter, hook};
use crate::state::{self, ProcLedger};
use crate::symbols::{self, Cu};
use std::ffi::{c_char, c_int, c_uint, c_void};

fn log_module_cost(what: &str, dev: usize, cost: ContextCost) {
    match cost {
        ContextCost::Unknown => crate::debug!(
            "{what}: device {dev}: module memory not measurable (no reading, or one disturbed); the backstop accounts for it"
        ),
        c if c.bytes() > 0 => {
            crate::info!("{what}: device {dev}: module memory {} bytes ({c:?})", c.bytes())
        }
        _ => {}
    }
}

/// Whether module memory arrives at load: `CUDA_MODULE_LOADING=EAGER`, or a driver older than
/// 12.2 (whose default is eager). Otherwise (lazy loading) nothing is measured at load: the
/// memory arrives at the first lookup or launch, measured there, which spares the NVML
/// readings for the many libraries a framework registers and never uses.
fn eager_loading() -> bool {
    static EAGER: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *EAGER.get_or_init(|| {
        if let Ok(v) = std::env::var("CUDA_MODULE_LOADING") {
            return v.trim().eq_ignore_ascii_case("EAGER");
        }
        // SAFETY: documented type.
        let Some(f) = (unsafe { symbols::cu::<FnDriverGetVersion>(Cu::DriverGetVersion) }) else {
            return true;
        };
        let mut v: c_int = 0;
        // SAFETY: valid out pointer.
        (unsafe { f(&mut v) } != CUDA_SUCCESS) || v < 12020
    })
}

/// A module or library load: measured, charged, unloaded again if it does not fit.
/// `real` loads (the handle lands in `*out`), `unload` undoes it.
fn module_load(
    what: &str,
    out: *mut *mut c_void,
    library: bool,
    real: impl FnOnce() -> CUresult,
    unload: impl FnOnce(u64),
) -> CUresult {
    if out.is_null() {
        return real();
    }
    let cur = current_dev_ctx().ok();
    let l = ProcLedger::current();
    let m = meter();
    // After the current context was read, before the driver call (see `Graveyard`).
    let graves = &l.p.accounts.graveyard;
    let born = graves.stamp();
    let measure = || match cur {
        Some((dev, ctx)) if eager_loading() => {
            let (r, cost) = l.p.contexts.measure(dev, Some(ctx), &m, || match real() {
                CUDA_SUCCESS => Ok(ctx),
                e => Err(e),
            });
            log_module_cost(what, dev, cost);
            // SAFETY: the driver wrote *out on success.
            (r.map(|_| unsafe { *out } as u64), cost.bytes())
        }
        _ => match real() {
            // SAFETY: as above.
            CUDA_SUCCESS => (Ok(unsafe { *out } as u64), 0),
            e => (Err(e), 0),
        },
    };
    let r = l.p.modules.load(
        &l,
        cur.map(|c| c.0),
        cur.map_or(0, |c| c.1),
        library,
        measure,
        unload,
        || cur.is_some_and(|(_, ctx)| graves.destroyed_since(ctx, born)),
    );
    let dev = cur.map_or(0, |c| c.0);
    if r.is_ok() {
        backstop_poll(Some(dev));
    }
    finish(what, &l, dev, r)
}

/// Unloads what a refused load loaded.
fn unload_module(h: u64) {
    // SAFETY: documented type; the handle the driver just returned.
    if let Some(f) = unsafe { symbols::cu::<FnModuleUnload>(Cu::ModuleUnload) } {
        // SAFETY: as above.
        unsafe { f(h as CUmodule) };
    }
}

/// Unloads what a refused library load loaded.
fn unload_library(h: u64) {
    // SAFETY: documented type; the handle the driver just returned.
    if let Some(f) = unsafe { symbols::cu::<FnLibraryUnload>(Cu::LibraryUnload) } {
        // SAFETY: as above.
        unsafe { f(h as CUlibrary) };
    }
}

/// The first lookup or launch of `owner`'s functions (of a module; of a library, in each
/// context): measured around `real` and charged
/// ([`crate::modules::ModuleTable::charge_stage`]); every later one just calls `real`.
fn first_use(what: &str, owner: u64, stage: Stage, real: impl FnOnce() -> CUresult) -> CUresult {
    let l = ProcLedger::current();
    let Ok((dev, ctx)) = current_dev_ctx() else {
        return real();
    };
    if !l.p.modules.claim(owner, stage, ctx) {
        return real();
    }
    let graves = &l.p.accounts.graveyard;
    let born = graves.stamp();
    let (r, cost) =
        l.p.contexts
            .measure(dev, Some(ctx), &meter(), || match real() {
                CUDA_SUCCESS => Ok(ctx),
                e => Err(e),
            });
    if let Err(e) = r {
        return e;
    }
    log_module_cost(what, dev, cost);
    match l
        .p
        .modules
        .charge_stage(&l, owner, stage, ctx, dev, cost.bytes(), || {
            graves.destroyed_since(ctx, born)
        }) {
        Ok(()) => {
            if cost.bytes() > 0 {
                backstop_poll(Some(dev));
            }
            CUDA_SUCCESS
        }
        Err(d) => {
            report_denial(what, l.p, dev, &d);
            CUDA_ERROR_OUT_OF_MEMORY
        }
    }
}

hook! {
    /// Hook of `cuModuleLoad`.
    fn cuModuleLoad(module: *mut CUmodule, fname: *const c_char) = Cu::ModuleLoad as FnModuleLoad;
    |f| {
        // SAFETY: forwarded arguments.
        module_load(
            "cuModuleLoad",
            module,
            false,
            || unsafe { f(module, fname) },
            unload_module,
        )
    }
}

hook! {
    /// Hook of `cuModuleLoadData`.
    fn cuModuleLoadData(
        module: *mut CUmodule,
        image: *const c_void,
    ) = Cu::ModuleLoadData as FnModuleLoadData;
    |f| {
        // SAFETY: forwarded arguments.
        module_load(
            "cuModuleLoadData",
            module,
            false,
            || unsafe { f(module, image) },
            unload_module,
        )
    }
}

hook! {
    /// Hook of `cuModuleLoadDataEx`.
    fn cuModuleLoadDataEx(
        module: *mut CUmodule,
        image: *const c_void,
        num_options: c_uint,
        options: *mut c_int,
        values: *mut *mut c_void,
    ) = Cu::ModuleLoadDataEx as FnModuleLoadDataEx;
    |f| {
        module_load(
            "cuModuleLoadDataEx",
            module,
            false,
            // SAFETY: forwarded arguments.
            || unsafe { f(module, image, num_options, options, values) },
            unload_module,
        )
    }
}

hook! {
    /// Hook of `cuModuleLoadFatBinary`.
    fn cuModuleLoadFatBinary(
        module: *mut CUmodule,
        fat_cubin: *const c_void,
    ) = Cu::ModuleLoadFatBinary as FnModuleLoadData;
    |f| {
        module_load(
            "cuModuleLoadFatBinary",
            module,
            false,
            // SAFETY: forwarded arguments.
            || unsafe { f(module, fat_cubin) },
            unload_module,
        )
    }
}

hook! {
    /// Hook of `cuModuleUnload`.
    fn cuModuleUnload(module: CUmodule) = Cu::ModuleUnload as FnModuleUnload;
    |f| {
        let l = ProcLedger::current();
        // SAFETY: forwarded argument.
        l.p.modules
            .unload(&l, module as u64, || unsafe { f(module) })
    }
}

hook! {
    /// Hook of `cuLibraryLoadData`.
    fn cuLibraryLoadData(
        library: *mut CUlibrary,
        code: *const c_void,
        jit_options: *mut c_int,
        jit_values: *mut *mut c_void,
        num_jit: c_uint,
        lib_options: *mut c_int,
        lib_values: *mut *mut c_void,
        num_lib: c_uint,
    ) = Cu::LibraryLoadData as FnLibraryLoadData;
    |f| {
        // SAFETY: forwarded arguments (every call below).
        let call = || unsafe {
            f(
                library,
                code,
                jit_options,
                jit_values,
                num_jit,
                lib_options,
                lib_values,
                num_lib,
            )
        };
        module_load("cuLibraryLoadData", library, true, call, unload_library)
    }
}

hook! {
    /// Hook of `cuLibraryLoadFromFile`.
    fn cuLibraryLoadFromFile(
        library: *mut CUlibrary,
        fname: *const c_char,
        jit_options: *mut c_int,
        jit_values: *mut *mut c_void,
        num_jit: c_uint,
        lib_options: *mut c_int,
        lib_values: *mut *mut c_void,
        num_lib: c_uint,
    ) = Cu::LibraryLoadFromFile as FnLibraryLoadFromFile;
    |f| {
        // SAFETY: forwarded arguments (every call below).
        let call = || unsafe {
            f(
                library,
                fname,
                jit_options,
                jit_values,
                num_jit,
                lib_options,
                lib_values,
                num_lib,
            )
        };
        module_load("cuLibraryLoadFromFile", library, true, call, unload_library)
    }
}

hook! {
    /// Hook of `cuLibraryUnload`.
    fn cuLibraryUnload(library: CUlibrary) = Cu::LibraryUnload as FnLibraryUnload;
    |f| {
        let l = ProcLedger::current();
        // SAFETY: forwarded argument.
        l.p.modules
            .unload(&l, library as u64, || unsafe { f(library) })
    }
}

hook! {
    /// Hook of `cuModuleGetFunction`: a lazily loaded module's memory may arrive here.
    fn cuModuleGetFunction(
        func: *mut CUfunction,
        module: CUmodule,
        name: *const c_char,
    ) = Cu::ModuleGetFunction as FnModuleGetFunction;
    |f| {
        let owner = module as u64;
        // SAFETY: forwarded arguments.
        let r = first_use("cuModuleGetFunction", owner, Stage::Lookup, || unsafe {
            f(func, module, name)
        });
        if r == CUDA_SUCCESS && !func.is_null() {
            // SAFETY: written by the driver on success.
            let h = unsafe { *func } as u64;
            state::proc_state().modules.note_function(h, owner);
        }
        r
    }
}

hook! {
    /// Hook of `cuLibraryGetKernel`: nothing is loaded; the kernel is remembered as the
    /// library's (it may be launched directly).
    fn cuLibraryGetKernel(
        kernel: *mut CUkernel,
        library: CUlibrary,
        name: *const c_char,
    ) = Cu::LibraryGetKernel as FnLibraryGetKernel;
    observe |f| {
        // SAFETY: forwarded arguments.
        let r = unsafe { f(kernel, library, name) };
        if r == CUDA_SUCCESS && !kernel.is_null() && enter().is_some() {
            // SAFETY: written by the driver on success.
            let k = unsafe { *kernel } as u64;
            state::proc_state().modules.note_function(k, library as u64);
        }
        r
    }
}

hook! {
    /// Hook of `cuKernelGetFunction`: the library is loaded into the current context here
    /// (lazily loaded memory may arrive).
    fn cuKernelGetFunction(
        func: *mut CUfunction,
        kernel: CUkernel,
    ) = Cu::KernelGetFunction as FnKernelGetFunction;
    |f| {
        let p = state::proc_state();
        let Some(owner) = p.modules.owner_of(kernel as u64) else {
            // SAFETY: forwarded arguments.
            return unsafe { f(func, kernel) };
        };
        // SAFETY: forwarded arguments.
        let r = first_use("cuKernelGetFunction", owner, Stage::Lookup, || unsafe {
            f(func, kernel)
        });
        if r == CUDA_SUCCESS && !func.is_null() {
            // SAFETY: written by the driver on success.
            p.modules.note_function(unsafe { *func } as u64, owner);
        }
        r
    }
}

/// A launch of `func` (a `CUfunction` or a `CUkernel`) on `stream` (`ptsz`: of a
/// per-thread-stream entry point): the first launch of each module's kernels is measured;
/// otherwise (the usual case) one atomic load and the call. Around it, the launch gate
/// ([`crate::gate::enter`] / [`crate::gate::leave`]: one more atomic load without a compute
/// share; its waits happen before any measurement starts).
fn launch(
    what: &str,
    func: CUfunction,
    stream: CUstream,
    ptsz: bool,
    real: impl FnOnce() -> CUresult,
) -> CUresult {
    let ticket = crate::gate::enter(stream, ptsz);
    let r = launch_measured(what, func, real);
    crate::gate::leave(ticket, r)
}

/// [`launch`] without the gate.
fn launch_measured(what: &str, func: CUfunction, real: impl FnOnce() -> CUresult) -> CUresult {
    let p = state::proc_state();
    if !p.modules.any_unlaunched() {
        return real();
    }
    match p.modules.owner_of(func as u64) {
        Some(owner) => first_use(what, owner, Stage::Launch, real),
        None => real(),
    }
}

/// The stream of a `cuLaunchKernelEx` configuration (null for a null configuration: the
/// driver then refuses the launch itself).
fn ex_stream(config: *const c_void) -> CUstream {
    if config.is_null() {
        return std::ptr::null_mut();
    }
    // SAFETY: a non-null `CUlaunchConfig*` from the caller starts with this head.
    unsafe { (*config.cast::<CUlaunchConfigHead>()).stream }
}

hook! {
    /// Hook of `cuLaunchKernel`.
    fn cuLaunchKernel(
        func: CUfunction,
        gx: c_uint,
        gy: c_uint,
        gz: c_uint,
        bx: c_uint,
        by: c_uint,
        bz: c_uint,
        shared: c_uint,
        stream: CUstream,
        params: *mut *mut c_void,
        extra: *mut *mut c_void,
    ) = Cu::LaunchKernel as FnLaunchKernel;
    |f| {
        // SAFETY: forwarded arguments (every call below).
        let call = || unsafe { f(func, gx, gy, gz, bx, by, bz, shared, stream, params, extra) };
        launch("cuLaunchKernel", func, stream, false, call)
    }
}

hook! {
    /// Hook of `cuLaunchKernel_ptsz`.
    fn cuLaunchKernel_ptsz(
        func: CUfunction,
        gx: c_uint,
        gy: c_uint,
        gz: c_uint,
        bx: c_uint,
        by: c_uint,
        bz: c_uint,
        shared: c_uint,
        stream: CUstream,
        params: *mut *mut c_void,
        extra: *mut *mut c_void,
    ) = Cu::LaunchKernelPtsz as FnLaunchKernel;
    |f| {
        // SAFETY: forwarded arguments (every call below).
        let call = || unsafe { f(func, gx, gy, gz, bx, by, bz, shared, stream, params, extra) };
        launch("cuLaunchKernel_ptsz", func, stream, true, call)
    }
}

hook! {
    /// Hook of `cuLaunchKernelEx`.
    fn cuLaunchKernelEx(
        config: *const c_void,
        func: CUfunction,
        params: *mut *mut c_void,
        extra: *mut *mut c_void,
    ) = Cu::LaunchKernelEx as FnLaunchKernelEx;
    |f| {
        // SAFETY: forwarded arguments (every call below).
        let call = || unsafe { f(config, func, params, extra) };
        launch("cuLaunchKernelEx", func, ex_stream(config), false, call)
    }
}

hook! {
    /// Hook of `cuLaunchKernelEx_ptsz`.
    fn cuLaunchKernelEx_ptsz(
        config: *const c_void,
        func: CUfunction,
        params: *mut *mut c_void,
        extra: *mut *mut c_void,
    ) = Cu::LaunchKernelExPtsz as FnLaunchKernelEx;
    |f| {
        // SAFETY: forwarded arguments (every call below).
        let call = || unsafe { f(config, func, params, extra) };
        launch("cuLaunchKernelEx_ptsz", func, ex_stream(config), true, call)
    }
}
