//! Modules, libraries, functions and kernels: lazy or eager loading of their globals, and
//! launches.

use super::{loading, Inner, Loading, Module, Owner, R};
use crate::ffi::*;

impl Inner {
    /// `cuModuleLoad*` (`library == false`, loaded in the current context) and
    /// `cuLibraryLoad*` (context-independent; with eager loading loaded into the current
    /// context if there is one). `globals` bytes arrive now with eager loading, else at the
    /// first function lookup or launch ([`loading`]).
    pub fn module_load(&mut self, globals: u64, library: bool) -> R<u64> {
        let ctx = match self.current() {
            Ok((c, _)) => c,
            Err(e) if !library => return Err(e),
            Err(_) => 0,
        };
        let h = self.handle(if library { 0x31 } else { 0x30 });
        self.modules.insert(
            h,
            Module {
                ctx,
                phys: 0,
                globals,
                loaded: false,
                library,
            },
        );
        if loading() == Loading::Eager && ctx != 0 {
            if let Err(e) = self.module_make_resident(h) {
                self.modules.remove(&h);
                return Err(e);
            }
        }
        Ok(h)
    }

    /// Puts module `h`'s globals on the device of its context (a library: of the current
    /// context), charging them.
    fn module_make_resident(&mut self, h: u64) -> R<()> {
        let m = *self.modules.get(&h).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        if m.loaded {
            return Ok(());
        }
        let (ctx, c) = if m.library {
            self.current()?
        } else {
            (m.ctx, self.ctx(m.ctx)?)
        };
        self.charge(c.phys, m.globals)?;
        if let Some(x) = self.modules.get_mut(&h) {
            x.loaded = true;
            x.phys = c.phys;
            x.ctx = ctx;
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

    /// `cuLaunchKernel(Ex)` of a function or a kernel handle: its module is loaded first if
    /// it is not yet (a failure to load is the launch's error).
    pub fn launch(&mut self, f: u64) -> R<()> {
        let owner = match self.functions.get(&f) {
            Some(Owner::Function(m)) | Some(Owner::Kernel(m)) => *m,
            None => return Err(CUDA_ERROR_INVALID_HANDLE),
        };
        self.current()?;
        self.module_make_resident(owner)
    }
}
