//! Contexts: creating, destroying and making current (regular and primary), the charge
//! each one costs, and the memory query (`cuMemGetInfo`).

use super::{ctx_create_delay, with_stack, Ctx, Inner, Owner, R};
use crate::ffi::*;

impl Inner {
    fn activate_context(&mut self, h: u64, ordinal: usize, phys: usize, primary: bool) -> R<()> {
        self.charge(phys, self.shared().ctx_overhead())?;
        self.shared().count_context(phys, self.slot, 1);
        let delay = ctx_create_delay();
        if !delay.is_zero() {
            std::thread::sleep(delay);
        }
        self.contexts.insert(
            h,
            Ctx {
                ordinal,
                phys,
                primary,
                alive: true,
                limits: Default::default(),
            },
        );
        // Eager loading: the loaded libraries come into the new context now (one that does
        // not fit stays out; it is loaded at its first use there, or fails then).
        let _ = self.eager_libraries_into(h);
        Ok(())
    }

    /// Frees everything a context owns (allocations, arrays, streams, modules, what its
    /// limits hold; the limits go back to their defaults).
    fn free_context_resources(&mut self, h: u64) {
        self.limits_release(h);
        let dead: Vec<u64> = self
            .allocs
            .iter()
            .filter(|(_, a)| a.ctx == h)
            .map(|(&p, _)| p)
            .collect();
        for p in dead {
            let _ = self.free(p);
        }
        let dead: Vec<u64> = self
            .mipmaps
            .iter()
            .filter(|(_, a)| a.ctx == h)
            .map(|(&p, _)| p)
            .collect();
        for p in dead {
            if let Some(a) = self.mipmaps.remove(&p) {
                self.uncharge(a.phys, a.charged);
            }
        }
        let dead: Vec<u64> = self
            .arrays
            .iter()
            .filter(|(_, a)| a.ctx == h)
            .map(|(&p, _)| p)
            .collect();
        for p in dead {
            if let Some(a) = self.arrays.remove(&p) {
                self.uncharge(a.phys, a.charged);
            }
        }
        self.streams.retain(|_, c| *c != h);
        self.events.retain(|_, c| *c != h);
        let dead: Vec<u64> = self
            .modules
            .iter()
            .filter(|(_, m)| m.ctx == h)
            .map(|(&k, _)| k)
            .collect();
        for k in dead {
            let m = self.modules[&k];
            if m.library {
                continue;
            }
            if m.loaded {
                self.uncharge(m.phys, m.globals);
            }
            self.modules.remove(&k);
            self.functions.retain(|_, o| *o != Owner::Function(k));
        }
        // A library outlives the context: its globals there go (loaded again at its next
        // use in a context).
        let places: Vec<(u64, u64)> = self
            .lib_resident
            .keys()
            .filter(|k| k.1 == h)
            .copied()
            .collect();
        for k in places {
            if let Some(phys) = self.lib_resident.remove(&k) {
                let globals = self.modules.get(&k.0).map_or(0, |m| m.globals);
                self.uncharge(phys, globals);
            }
        }
    }

    fn deactivate_context(&mut self, h: u64) {
        self.free_context_resources(h);
        if let Some(c) = self.contexts.get_mut(&h) {
            if c.alive {
                c.alive = false;
                let phys = c.phys;
                self.uncharge(phys, self.shared().ctx_overhead());
                self.shared().count_context(phys, self.slot, -1);
            }
        }
    }

    /// `cuCtxCreate*`: creates a context and pushes it on the calling thread's stack.
    pub fn ctx_create(&mut self, dev: CUdevice) -> R<u64> {
        let phys = self.phys_of(dev)?;
        let h = self.handle(0xc0);
        self.activate_context(h, dev as usize, phys, false)?;
        with_stack(|s| s.push(h));
        Ok(h)
    }

    /// `cuCtxDestroy_v2`.
    pub fn ctx_destroy(&mut self, h: u64) -> R<()> {
        match self.contexts.get(&h) {
            None => return Err(CUDA_ERROR_INVALID_CONTEXT),
            Some(c) if c.primary => return Err(CUDA_ERROR_INVALID_CONTEXT),
            Some(c) if !c.alive => return Err(CUDA_ERROR_CONTEXT_IS_DESTROYED),
            Some(_) => {}
        }
        self.deactivate_context(h);
        with_stack(|s| s.retain(|&x| x != h));
        Ok(())
    }

    /// `cuDevicePrimaryCtxRetain`.
    pub fn primary_retain(&mut self, dev: CUdevice) -> R<u64> {
        let phys = self.phys_of(dev)?;
        let ord = dev as usize;
        if self.primary[ord].handle == 0 {
            let h = self.handle(0xc1);
            self.primary[ord].handle = h;
            self.contexts.insert(
                h,
                Ctx {
                    ordinal: ord,
                    phys,
                    primary: true,
                    alive: false,
                    limits: Default::default(),
                },
            );
        }
        let h = self.primary[ord].handle;
        if self.primary[ord].refcount == 0 {
            self.activate_context(h, ord, phys, true)?;
        }
        self.primary[ord].refcount += 1;
        Ok(h)
    }

    /// `cuDevicePrimaryCtxRelease(_v2)`.
    pub fn primary_release(&mut self, dev: CUdevice) -> R<()> {
        self.phys_of(dev)?;
        let p = &mut self.primary[dev as usize];
        if p.refcount == 0 {
            return Err(CUDA_ERROR_INVALID_CONTEXT);
        }
        p.refcount -= 1;
        if p.refcount == 0 {
            let h = p.handle;
            self.deactivate_context(h);
        }
        Ok(())
    }

    /// `cuDevicePrimaryCtxReset(_v2)`: frees everything the primary context owns.
    pub fn primary_reset(&mut self, dev: CUdevice) -> R<()> {
        self.phys_of(dev)?;
        let h = self.primary[dev as usize].handle;
        if h != 0 {
            self.free_context_resources(h);
        }
        Ok(())
    }

    /// `cuDevicePrimaryCtxGetState`: (flags, active).
    pub fn primary_state(&self, dev: CUdevice) -> R<(u32, bool)> {
        self.phys_of(dev)?;
        Ok((0, self.primary[dev as usize].refcount > 0))
    }

    /// `cuCtxSetCurrent`.
    pub fn set_current(&self, h: u64) -> R<()> {
        if h != 0 {
            match self.contexts.get(&h) {
                None => return Err(CUDA_ERROR_INVALID_CONTEXT),
                Some(c) if !c.alive && !c.primary => return Err(CUDA_ERROR_CONTEXT_IS_DESTROYED),
                Some(_) => {}
            }
        }
        with_stack(|s| {
            s.pop();
            if h != 0 {
                s.push(h);
            }
        });
        Ok(())
    }

    /// `cuCtxPushCurrent_v2`.
    pub fn push_current(&self, h: u64) -> R<()> {
        match self.contexts.get(&h) {
            None => Err(CUDA_ERROR_INVALID_CONTEXT),
            Some(c) if !c.alive && !c.primary => Err(CUDA_ERROR_CONTEXT_IS_DESTROYED),
            Some(_) => {
                with_stack(|s| s.push(h));
                Ok(())
            }
        }
    }

    /// `cuCtxPopCurrent_v2`.
    pub fn pop_current(&self) -> R<u64> {
        with_stack(|s| s.pop()).ok_or(CUDA_ERROR_INVALID_CONTEXT)
    }

    /// `cuMemGetInfo_v2`: (free, total) of the current context's device.
    pub fn mem_info(&self) -> R<(u64, u64)> {
        let (_, c) = self.current()?;
        let sh = self.shared();
        let total = sh.file().devices[c.phys].total;
        let used = sh.used(c.phys);
        Ok((total.saturating_sub(used), total))
    }
}
