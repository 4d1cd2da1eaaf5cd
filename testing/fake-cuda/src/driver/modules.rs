//! Modules, libraries, functions and kernels: lazy or eager loading of their globals, and
//! launches.

use super::{loading, Inner, Loading, Module, Owner, R};
use crate::ffi::*;

/// `FAKE_CUDA_RESIDENT_LOG=PATH`: a line `resident globals=N` is appended to PATH each time a
/// module's (or a library copy's) globals are put on a device, so that a test can tell a
/// load refused before the driver from one loaded and unloaded again.
fn note_resident(globals: u64) {
    if let Some(path) = std::env::var_os("FAKE_CUDA_RESIDENT_LOG") {
        use std::io::Write;
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
        {
            let _ = writeln!(f, "resident globals={globals}");
        }
    }
}

impl Inner {
    /// `cuModuleLoad*` (`library == false`, loaded in the current context) and
    /// `cuLibraryLoad*` (context-independent; with eager loading loaded into the current
    /// context if there is one). `globals` bytes arrive now with eager loading, else at the
    /// first function lookup or launch ([`loading`]); `local` is what its kernels need per
    /// thread (grown at launch: [`Inner::limits_at_launch`]).
    pub fn module_load(&mut self, globals: u64, local: u64, library: bool) -> R<u64> {
        let ctx = match self.current() {
            Ok((c, _)) => c,
            Err(e) if !library => return Err(e),
            Err(_) => 0,
        };
        let h = self.handle(if library { 0x31 } else { 0x30 });
        self.modules.insert(
            h,
            Module {
                ctx: if library { 0 } else { ctx },
                phys: 0,
                globals,
                loaded: false,
                library,
                local,
            },
        );
        if loading() == Loading::Eager {
            // A module into its context; a library into every live context (and, later,
            // into each context as it is created: `eager_libraries_into`).
            let r = if library {
                let live: Vec<u64> = self
                    .contexts
                    .iter()
                    .filter(|(_, c)| c.alive)
                    .map(|(&k, _)| k)
                    .collect();
                live.into_iter()
                    .try_for_each(|c| self.library_resident_in(h, c))
            } else {
                self.module_make_resident(h)
            };
            if let Err(e) = r {
                let _ = self.module_unload(h, library);
                return Err(e);
            }
        }
        Ok(h)
    }

    /// With eager loading, a new context gets every loaded library at its creation.
    pub fn eager_libraries_into(&mut self, ctx: u64) -> R<()> {
        if loading() != Loading::Eager {
            return Ok(());
        }
        let libs: Vec<u64> = self
            .modules
            .iter()
            .filter(|(_, m)| m.library)
            .map(|(&k, _)| k)
            .collect();
        libs.into_iter()
            .try_for_each(|l| self.library_resident_in(l, ctx))
    }

    /// Library `h`'s globals put on the device of context `ctx` (once per context).
    fn library_resident_in(&mut self, h: u64, ctx: u64) -> R<()> {
        if self.lib_resident.contains_key(&(h, ctx)) {
            return Ok(());
        }
        let m = *self.modules.get(&h).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        let c = self.ctx(ctx)?;
        self.charge(c.phys, m.globals)?;
        note_resident(m.globals);
        self.lib_resident.insert((h, ctx), c.phys);
        Ok(())
    }

    /// Puts module `h`'s globals on the device of its context, charging them. A library is
    /// loaded into the current context, with globals of its own there (as the driver does:
    /// a library used in two contexts holds its globals twice).
    fn module_make_resident(&mut self, h: u64) -> R<()> {
        let m = *self.modules.get(&h).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        if m.library {
            let (ctx, _) = self.current()?;
            return self.library_resident_in(h, ctx);
        }
        if m.loaded {
            return Ok(());
        }
        let c = self.ctx(m.ctx)?;
        self.charge(c.phys, m.globals)?;
        note_resident(m.globals);
        if let Some(x) = self.modules.get_mut(&h) {
            x.loaded = true;
            x.phys = c.phys;
        }
        Ok(())
    }

    /// `cuModuleUnload` / `cuLibraryUnload`.
    pub fn module_unload(&mut self, h: u64, library: bool) -> R<()> {
        match self.modules.get(&h) {
            Some(m) if m.library == library => {}
            _ => return Err(CUDA_ERROR_INVALID_HANDLE),
        }
        if let Some(m) = self.modules.remove(&h) {
            if m.loaded {
                self.uncharge(m.phys, m.globals);
            }
            let places: Vec<(u64, u64)> = self
                .lib_resident
                .keys()
                .filter(|k| k.0 == h)
                .copied()
                .collect();
            for k in places {
                if let Some(phys) = self.lib_resident.remove(&k) {
                    self.uncharge(phys, m.globals);
                }
            }
        }
        self.functions
            .retain(|_, o| *o != Owner::Function(h) && *o != Owner::Kernel(h));
        Ok(())
    }

    /// `cuModuleGetFunction`: a function handle; lazy modules load here (unless at launch).
    pub fn module_get_function(&mut self, h: u64) -> R<u64> {
        match self.modules.get(&h) {
            Some(m) if !m.library => {}
            _ => return Err(CUDA_ERROR_INVALID_HANDLE),
        }
        if loading() == Loading::AtFunction {
            self.module_make_resident(h)?;
        }
        let f = self.handle(0xf0);
        self.functions.insert(f, Owner::Function(h));
        Ok(f)
    }

    /// `cuLibraryGetKernel`: a context-independent kernel handle (nothing is loaded).
    pub fn library_get_kernel(&mut self, h: u64) -> R<u64> {
        match self.modules.get(&h) {
            Some(m) if m.library => {}
            _ => return Err(CUDA_ERROR_INVALID_HANDLE),
        }
        let k = self.handle(0xf1);
        self.functions.insert(k, Owner::Kernel(h));
        Ok(k)
    }

    /// `cuKernelGetFunction`: the kernel's function in the current context; the library is
    /// loaded into it here (unless at launch).
    pub fn kernel_get_function(&mut self, k: u64) -> R<u64> {
        let Some(&Owner::Kernel(lib)) = self.functions.get(&k) else {
            return Err(CUDA_ERROR_INVALID_HANDLE);
        };
        self.current()?;
        if loading() == Loading::AtFunction {
            self.module_make_resident(lib)?;
        }
        let f = self.handle(0xf0);
        self.functions.insert(f, Owner::Function(lib));
        Ok(f)
    }

    /// `cuModuleGetGlobal_v2`: a global's address; the module is loaded here with lazy
    /// loading (the driver needs it placed to give an address), whatever the stage.
    pub fn module_get_global(&mut self, h: u64) -> R<u64> {
        match self.modules.get(&h) {
            Some(m) if !m.library => {}
            _ => return Err(CUDA_ERROR_INVALID_HANDLE),
        }
        self.module_make_resident(h)?;
        Ok(self.handle(0x90))
    }

    /// `cuLibraryGetGlobal`: a global's address in the current context; the library is
    /// loaded into it here.
    pub fn library_get_global(&mut self, h: u64) -> R<u64> {
        match self.modules.get(&h) {
            Some(m) if m.library => {}
            _ => return Err(CUDA_ERROR_INVALID_HANDLE),
        }
        self.module_make_resident(h)?;
        Ok(self.handle(0x90))
    }

    /// `cuLibraryGetModule`: the library's module in the current context, loaded into it
    /// here. The handle is a module without globals of its own (they are the library's
    /// copy in that context); its functions launch the library's code.
    pub fn library_get_module(&mut self, h: u64) -> R<u64> {
        let local = match self.modules.get(&h) {
            Some(m) if m.library => m.local,
            _ => return Err(CUDA_ERROR_INVALID_HANDLE),
        };
        self.module_make_resident(h)?;
        let (ctx, c) = self.current()?;
        let m = self.handle(0x30);
        self.modules.insert(
            m,
            Module {
                ctx,
                phys: c.phys,
                globals: 0,
                local,
                loaded: true,
                library: false,
            },
        );
        Ok(m)
    }

    /// `cuLaunchKernel(Ex)` of a function or a kernel handle: its module is loaded first if
    /// it is not yet (a failure to load is the launch's error), then the context's local
    /// memory grows to what the kernel needs and a raised heap / printf FIFO is put on the
    /// device ([`Inner::limits_at_launch`]; a failure there is the launch's
    /// `CUDA_ERROR_OUT_OF_MEMORY`, nothing runs).
    pub fn launch(&mut self, f: u64) -> R<()> {
        let owner = self.function_owner(f)?;
        let (ctx, _) = self.current()?;
        self.module_make_resident(owner)?;
        let local = self.modules.get(&owner).map_or(0, |m| m.local);
        self.limits_at_launch(ctx, local)
    }

    /// The module or library a function or kernel handle belongs to.
    pub fn function_owner(&self, f: u64) -> R<u64> {
        match self.functions.get(&f) {
            Some(Owner::Function(m)) | Some(Owner::Kernel(m)) => Ok(*m),
            None => Err(CUDA_ERROR_INVALID_HANDLE),
        }
    }

    /// Whether `f` is a `CUkernel` handle (`cuLibraryGetKernel`), not a `CUfunction`.
    pub fn is_kernel(&self, f: u64) -> bool {
        matches!(self.functions.get(&f), Some(Owner::Kernel(_)))
    }

    /// Local memory per thread the kernels of `f`'s module need.
    pub fn function_local(&self, f: u64) -> R<u64> {
        let m = self.function_owner(f)?;
        Ok(self.modules.get(&m).map_or(0, |m| m.local))
    }
}
