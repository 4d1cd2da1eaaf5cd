//! Hooks of modules and libraries (eager and lazy loading) and function lookups, and the
//! first-launch measurement the launch hooks (`launch.rs`) call: module memory is measured
//! where it arrives and charged ([`crate::objects::module_memory`]).
#![allow(non_snake_case)]
#![allow(clippy::missing_safety_doc)] // Every hook has the documented contract of its driver function.

use super::shared::{backstop_poll, finish, report_denial};
use crate::ffi::cuda::*;
use crate::ffi::shim::{enter, hook};
use crate::ffi::symbols::{self, Cu};
use crate::ledger::policy::ContextCost;
use crate::measure::{current_dev_ctx, meter};
use crate::objects::images::{self, EstimateError};
use crate::objects::module_memory::{Claim, Estimate, Stage};
use crate::state::{self, ProcLedger};
use hami_image::Statics;
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
        let Some(f) = (unsafe { symbols::cu::<FnDriverGetVersion>(Cu::cuDriverGetVersion) }) else {
            return true;
        };
        let mut v: c_int = 0;
        // SAFETY: valid out pointer.
        (unsafe { f(&mut v) } != CUDA_SUCCESS) || v < 12020
    })
}

/// The compute capability of CUDA ordinal `dev` (0: the driver does not say).
fn device_sm(dev: usize) -> u32 {
    images::device_sm(dev, |attr| {
        // SAFETY: documented type.
        let f = unsafe { symbols::cu::<FnDeviceGetAttribute>(Cu::cuDeviceGetAttribute) }?;
        let mut v: c_int = 0;
        // SAFETY: valid out pointer; `dev` is an ordinal of this process.
        (unsafe { f(&mut v, attr, dev as CUdevice) } == CUDA_SUCCESS).then_some(v)
    })
}

/// What the image's statics need on `dev`'s compute capability, through `read` (0: not
/// known; left to measurement): with eager loading data and code (every kernel is placed at
/// the load), otherwise the data (globals, constant banks: placed at the first use; a
/// kernel's code comes with its own first use and is measured).
fn estimate(
    what: &str,
    dev: usize,
    eager: bool,
    read: impl FnOnce(u32) -> Result<Option<Statics>, EstimateError>,
) -> u64 {
    match read(device_sm(dev)) {
        Ok(Some(s)) => {
            let b = if eager { s.total() } else { s.data };
            crate::debug!(
                "{what}: the image's statics need {b} bytes (data {}, code {}, {})",
                s.data,
                s.code,
                if eager { "eager" } else { "lazy: data" }
            );
            b
        }
        Ok(None) => 0,
        Err(e) => {
            crate::debug!("{what}: image not estimated ({e}); its memory is measured");
            0
        }
    }
}

/// The image a load is given.
#[derive(Clone, Copy)]
enum Image {
    /// In memory (wrapper, fatbin, cubin, PTX).
    Memory(*const c_void),
    /// A file's path.
    File(*const c_char),
}

/// What the load of `image` admits: its statics' estimate (with eager loading, admitted at
/// the load). With lazy loading an in-memory image in a loaded object's static data is read
/// at the first use instead (a framework registers many libraries it never uses).
fn load_estimate(what: &str, dev: usize, image: Image) -> Estimate {
    let at_load = eager_loading();
    match image {
        // SAFETY: the image the application passes the driver.
        Image::Memory(p) if !at_load && unsafe { images::is_static(p) } => Estimate {
            bytes: 0,
            at_load,
            deferred: p as u64,
        },
        Image::Memory(p) => Estimate {
            // SAFETY: as above.
            bytes: estimate(what, dev, at_load, |sm| unsafe { images::of_memory(p, sm) }),
            at_load,
            deferred: 0,
        },
        Image::File(f) => Estimate {
            // SAFETY: the path the application passes the driver.
            bytes: estimate(what, dev, at_load, |sm| unsafe { images::of_file(f, sm) }),
            at_load,
            deferred: 0,
        },
    }
}

/// A module or library load: its image's statics admitted before the driver call when
/// loading is eager (else remembered for the first use), measured, charged, unloaded again
/// if it does not fit. `real` loads (the handle lands in `*out`), `unload` undoes it.
fn module_load(
    what: &str,
    out: *mut *mut c_void,
    library: bool,
    image: Image,
    real: impl FnOnce() -> CUresult,
    unload: impl FnOnce(u64),
) -> CUresult {
    if out.is_null() {
        return real();
    }
    let cur = current_dev_ctx().ok();
    let est = load_estimate(what, cur.map_or(0, |c| c.0), image);
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
        est,
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
    if let Some(f) = unsafe { symbols::cu::<FnModuleUnload>(Cu::cuModuleUnload) } {
        // SAFETY: as above.
        unsafe { f(h as CUmodule) };
    }
}

/// Unloads what a refused library load loaded.
fn unload_library(h: u64) {
    // SAFETY: documented type; the handle the driver just returned.
    if let Some(f) = unsafe { symbols::cu::<FnLibraryUnload>(Cu::cuLibraryUnload) } {
        // SAFETY: as above.
        unsafe { f(h as CUlibrary) };
    }
}

/// The first lookup or launch of `owner`'s functions (of a module; of a library, in each
/// context): what its image's statics need admitted first (refused:
/// `CUDA_ERROR_OUT_OF_MEMORY`, `real` not called), then measured around `real` and charged
/// ([`crate::objects::module_memory::ModuleTable::charge_stage`]); every later one just calls `real`.
fn first_use(what: &str, owner: u64, stage: Stage, real: impl FnOnce() -> CUresult) -> CUresult {
    let l = ProcLedger::current();
    let Ok((dev, ctx)) = current_dev_ctx() else {
        return real();
    };
    let mut claim = l.p.modules.claim_admit(&l, owner, stage, ctx, dev);
    if let Claim::Read(p) = claim {
        // SAFETY: a deferred image lies in a loaded object's static data (`images::is_static`).
        let bytes = estimate(what, dev, false, |sm| unsafe {
            images::of_memory(p as *const c_void, sm)
        });
        l.p.modules.set_estimate(owner, bytes);
        claim = l.p.modules.claim_admit(&l, owner, stage, ctx, dev);
    }
    let admitted = match claim {
        Claim::Done | Claim::Read(_) => return real(),
        Claim::Refused(d) => {
            report_denial(what, l.p, dev, &d);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        Claim::Todo { admitted } => admitted,
    };
    let graves = &l.p.accounts.graveyard;
    let born = graves.stamp();
    let (r, cost) =
        l.p.contexts
            .measure(dev, Some(ctx), &meter(), || match real() {
                CUDA_SUCCESS => Ok(ctx),
                e => Err(e),
            });
    if let Err(e) = r {
        l.p.modules.stage_failed(&l, owner, stage, ctx, admitted);
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
    fn cuModuleLoad(module: *mut CUmodule, fname: *const c_char) -> CUresult;
    |f| {
        // SAFETY: forwarded arguments.
        module_load(
            "cuModuleLoad",
            module,
            false,
            Image::File(fname),
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
    ) -> CUresult;
    |f| {
        // SAFETY: forwarded arguments.
        module_load(
            "cuModuleLoadData",
            module,
            false,
            Image::Memory(image),
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
    ) -> CUresult;
    |f| {
        module_load(
            "cuModuleLoadDataEx",
            module,
            false,
            Image::Memory(image),
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
    ) -> CUresult;
    |f| {
        module_load(
            "cuModuleLoadFatBinary",
            module,
            false,
            Image::Memory(fat_cubin),
            // SAFETY: forwarded arguments.
            || unsafe { f(module, fat_cubin) },
            unload_module,
        )
    }
}

hook! {
    /// Hook of `cuModuleUnload`.
    fn cuModuleUnload(module: CUmodule) -> CUresult;
    |f| {
        let l = ProcLedger::current();
        // Its functions' handles may be reused: their local sizes are read again.
        l.p.limits.forget_functions();
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
    ) -> CUresult;
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
        let image = Image::Memory(code);
        module_load("cuLibraryLoadData", library, true, image, call, unload_library)
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
    ) -> CUresult;
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
        let image = Image::File(fname);
        module_load("cuLibraryLoadFromFile", library, true, image, call, unload_library)
    }
}

hook! {
    /// Hook of `cuLibraryUnload`.
    fn cuLibraryUnload(library: CUlibrary) -> CUresult;
    |f| {
        let l = ProcLedger::current();
        // Its functions' handles may be reused: their local sizes are read again.
        l.p.limits.forget_functions();
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
    ) -> CUresult;
    |f| {
        let owner = module as u64;
        // SAFETY: forwarded arguments.
        let r = first_use("cuModuleGetFunction", owner, Stage::Lookup, || unsafe {
            f(func, module, name)
        });
        if r == CUDA_SUCCESS && !func.is_null() {
            // SAFETY: written by the driver on success.
            let h = unsafe { *func } as u64;
            state::holdings().modules.note_function(h, owner);
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
    ) -> CUresult;
    observe |f| {
        // SAFETY: forwarded arguments.
        let r = unsafe { f(kernel, library, name) };
        if r == CUDA_SUCCESS && !kernel.is_null() && enter().is_some() {
            // SAFETY: written by the driver on success.
            let k = unsafe { *kernel } as u64;
            state::holdings().modules.note_function(k, library as u64);
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
    ) -> CUresult;
    |f| {
        let p = state::holdings();
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

hook! {
    /// Hook of `cuModuleGetGlobal_v2`: a lazily loaded module is loaded here (the driver
    /// places it to give the global's address): a first use like a function lookup.
    fn cuModuleGetGlobal_v2(
        dptr: *mut CUdeviceptr,
        bytes: *mut usize,
        module: CUmodule,
        name: *const c_char,
    ) -> CUresult;
    |f| {
        // SAFETY: forwarded arguments.
        first_use("cuModuleGetGlobal_v2", module as u64, Stage::Lookup, || unsafe {
            f(dptr, bytes, module, name)
        })
    }
}

hook! {
    /// Hook of `cuLibraryGetGlobal`: the library is loaded into the current context here.
    fn cuLibraryGetGlobal(
        dptr: *mut CUdeviceptr,
        bytes: *mut usize,
        library: CUlibrary,
        name: *const c_char,
    ) -> CUresult;
    |f| {
        // SAFETY: forwarded arguments.
        first_use("cuLibraryGetGlobal", library as u64, Stage::Lookup, || unsafe {
            f(dptr, bytes, library, name)
        })
    }
}

hook! {
    /// Hook of `cuLibraryGetModule`: the library is loaded into the current context here.
    fn cuLibraryGetModule(
        module: *mut CUmodule,
        library: CUlibrary,
    ) -> CUresult;
    |f| {
        // SAFETY: forwarded arguments.
        first_use("cuLibraryGetModule", library as u64, Stage::Lookup, || unsafe {
            f(module, library)
        })
    }
}

/// A launch (`super::launch::launch`, the launch hooks' one path) without the local-memory
/// check and the gate: the first launch of each module's kernels is measured; otherwise (the
/// usual case) one atomic load and the call.
pub(crate) fn launch_measured(
    what: &str,
    func: CUfunction,
    real: impl FnOnce() -> CUresult,
) -> CUresult {
    let p = state::holdings();
    if !p.modules.any_unlaunched() {
        return real();
    }
    match p.modules.owner_of(func as u64) {
        Some(owner) => first_use(what, owner, Stage::Launch, real),
        None => real(),
    }
}
