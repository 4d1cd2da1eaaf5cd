//! Contexts: creating, destroying and making current (regular and primary), the charge
//! each one costs, and the memory query (`cuMemGetInfo`); their limits (`limits.rs`) and
//! green contexts (`green.rs`).

use super::green::green_overhead;
use super::hold::ctx_create_hold;
use super::limits::{
    Limits, LIMIT_MALLOC_HEAP_SIZE, LIMIT_PRINTF_FIFO_SIZE, LIMIT_STACK_SIZE, MAX_PRINTF_FIFO,
};
use super::{with_stack, Ctx, Inner, Owner};
use crate::ffi::*;

impl Inner {
    fn activate_context(&mut self, h: u64, ordinal: usize, phys: usize, primary: bool) -> R<()> {
        self.charge(phys, self.shared().ctx_overhead())?;
        self.shared().count_context(phys, self.slot, 1);
        ctx_create_hold();
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

impl Inner {
    /// `cuCtxGetLimit` in the current context.
    pub fn ctx_get_limit(&self, limit: i32) -> R<u64> {
        let (_, c) = self.current()?;
        c.limits.get(limit)
    }

    /// `cuCtxSetLimit` in the current context: the stack's growth is charged now (refused:
    /// `CUDA_ERROR_OUT_OF_MEMORY`, the limit unchanged), its lowering given back; heap and
    /// FIFO are only recorded (charged at the next launch), and refused with
    /// `CUDA_ERROR_INVALID_VALUE` once a kernel was launched.
    pub fn ctx_set_limit(&mut self, limit: i32, value: u64) -> R<()> {
        let (h, c) = self.current()?;
        let mut l = c.limits;
        l.get(limit)?;
        match limit {
            LIMIT_STACK_SIZE => l.stack = value,
            LIMIT_PRINTF_FIFO_SIZE | LIMIT_MALLOC_HEAP_SIZE => {
                let cur = l.get(limit)?;
                if l.launched && value != cur {
                    return Err(CUDA_ERROR_INVALID_VALUE);
                }
                if limit == LIMIT_MALLOC_HEAP_SIZE {
                    l.heap = value;
                } else {
                    l.printf_fifo = value.min(MAX_PRINTF_FIFO);
                }
            }
            _ => l.stored[(limit - 3) as usize] = value,
        }
        self.limits_apply(h, c.phys, c.limits, l)
    }

    /// A launch in context `h` of a kernel needing `local` bytes per thread: the stack limit
    /// grows to it, a raised heap / FIFO goes on the device, each growth charged (refused:
    /// `CUDA_ERROR_OUT_OF_MEMORY`, nothing changed).
    pub fn limits_at_launch(&mut self, h: u64, local: u64) -> R<()> {
        let c = self.ctx(h)?;
        let mut l = c.limits;
        l.stack = l.stack.max(local);
        l.heap_resident = l.heap;
        l.printf_resident = l.printf_fifo;
        l.launched = true;
        self.limits_apply(h, c.phys, c.limits, l)
    }

    /// Moves context `h` from limits `old` to `new`, charging or giving back the difference
    /// in what they hold.
    fn limits_apply(&mut self, h: u64, phys: usize, old: Limits, new: Limits) -> R<()> {
        let (was, now) = (old.held(), new.held());
        if now > was {
            self.charge(phys, now - was)?;
        } else {
            self.uncharge(phys, was - now);
        }
        if let Some(c) = self.contexts.get_mut(&h) {
            c.limits = new;
        }
        Ok(())
    }

    /// Context `h` is destroyed or reset: what its limits hold goes back, the limits return
    /// to their defaults.
    pub fn limits_release(&mut self, h: u64) {
        let Some(c) = self.contexts.get(&h).copied() else {
            return;
        };
        self.uncharge(c.phys, c.limits.held());
        if let Some(c) = self.contexts.get_mut(&h) {
            c.limits = Limits::default();
        }
    }
}

impl Inner {
    /// `cuDevResourceGenerateDesc` of resources of `ordinal`.
    pub fn green_desc(&mut self, ordinal: usize) -> u64 {
        let h = self.handle(0x6d);
        self.greens.descs.insert(h, ordinal);
        h
    }

    /// `cuGreenCtxCreate`: `CU_GREEN_CTX_DEFAULT_STREAM` (1) is required; the descriptor must
    /// be one of `dev`.
    pub fn green_create(&mut self, desc: u64, dev: CUdevice, flags: u32) -> R<u64> {
        let phys = self.phys_of(dev)?;
        if flags != 1 || self.greens.descs.get(&desc) != Some(&(dev as usize)) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let bytes = green_overhead();
        self.charge(phys, bytes)?;
        let h = self.handle(0x6e);
        self.greens.ctxs.insert(h, (phys, bytes));
        Ok(h)
    }

    /// `cuGreenCtxDestroy`.
    pub fn green_destroy(&mut self, h: u64) -> R<()> {
        let (phys, bytes) = self
            .greens
            .ctxs
            .remove(&h)
            .ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        self.uncharge(phys, bytes);
        Ok(())
    }
}
