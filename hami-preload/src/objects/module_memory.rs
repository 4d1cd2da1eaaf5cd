//! Module and library memory (`cuModuleLoad*`, `cuLibraryLoad*`): code and `__device__`
//! globals, charged as [`UsageKind::Module`].
//!
//! The driver does not say how much a module takes, so it is measured the way contexts are
//! (this process's NVML figure before and after, see [`crate::objects::context::ContextMeter`]). With lazy
//! loading (the default since CUDA 12.2) the memory arrives later, when a function of the
//! module is first looked up (`cuModuleGetFunction`, `cuKernelGetFunction`) or a kernel of it
//! first launched (`cuLaunchKernel(Ex)`, also with a `CUkernel`): each module is measured at
//! most three times (load, first lookup, first launch), never again, so launches cost one
//! atomic load once every module has been launched.
//!
//! * A load whose memory does not fit is unloaded and `CUDA_ERROR_OUT_OF_MEMORY` returned.
//! * A first lookup whose memory does not fit returns `CUDA_ERROR_OUT_OF_MEMORY`; the memory
//!   is charged anyway (the driver holds it) until the module is unloaded.
//! * A first launch cannot be taken back: its memory is charged beyond the limit if need be
//!   (the next allocation is refused).
//! * A library (`cuLibraryLoad*`) is context-independent: the driver loads it into every
//!   context it is used in (with lazy loading, at the first lookup or launch there; with eager
//!   loading, into every context at once), each copy with its own code and `__device__`
//!   globals. It is tracked per (library, context) instance, so a library used on two devices
//!   is charged on both, and a destroyed context takes only its own instance with it.
//!
//! * **Statics from the image.** Each load remembers what the image's statics need
//!   ([`hami_image`]: `.nv.global`, initialised globals, constant banks, code), its
//!   *estimate*. It is admitted **before** the driver takes the memory: at the load when
//!   loading is eager ([`Estimate::at_load`]), otherwise at the first lookup or launch (of a
//!   library: in each context), before the real call ([`ModuleTable::claim_admit`]). Refused:
//!   `CUDA_ERROR_OUT_OF_MEMORY` without calling the driver; a refused first use is tried (and
//!   admitted) again at the next one. The measurement after the call corrects the charge
//!   upwards: a module is charged the larger of its estimate and what its stages measured
//!   (the estimate is the image's own sizes, a floor of what the driver places; a smaller
//!   reading means the memory has not all arrived yet, as at a lookup before the first
//!   launch, or the reading missed it), never both.
//!
//! Plain Rust over a [`Ledger`]; the driver calls and measurements are closures.

use crate::ffi::cuda::{CUresult, CUDA_SUCCESS};
use crate::ledger::accounting::{AllocError, Deny, Ledger};
use hami_abi::layout::UsageKind;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

/// When a module's memory is measured.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    /// First function or kernel lookup.
    Lookup,
    /// First launch of one of its kernels.
    Launch,
}

/// One loaded module, or one library's instance in one context (or, with `ctx` 0, a
/// library's own record: what [`ModuleTable::get`] sums its instances into).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ModEntry {
    /// Device charged (`None`: not yet known, e.g. an instance not yet measured).
    pub dev: Option<usize>,
    /// Context it lives in (0: a library's own record, not tied to one).
    pub ctx: usize,
    /// Bytes charged.
    pub charged: u64,
    /// `cuLibraryLoad*` rather than `cuModuleLoad*`.
    pub library: bool,
    /// First lookup measured.
    pub looked_up: bool,
    /// First launch measured.
    pub launched: bool,
    /// Bytes the image's statics need (0: not known), for one copy: a library's own record
    /// holds it for all its instances.
    pub estimate: u64,
    /// Bytes its load and stages measured so far.
    pub measured: u64,
    /// Address of an in-memory image whose reading was put off to the first use (0: none;
    /// see [`Estimate::deferred`]).
    pub deferred: u64,
}

/// What a load's image says its statics need, and when to admit it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Estimate {
    /// Bytes (0: not known: PTX, an unreadable image).
    pub bytes: u64,
    /// The memory arrives at the load (eager loading): admit it before the load, not at
    /// the first use.
    pub at_load: bool,
    /// Lazy loading of an image that stays readable as long as the module can be used (the
    /// static data of a loaded object, what the runtime registers): its address, read at the
    /// first use ([`Claim::Read`], [`ModuleTable::set_estimate`]) on that context's device,
    /// so a library never used costs no reading (0: `bytes` is the estimate).
    pub deferred: u64,
}

/// What [`ModuleTable::claim_admit`] decided for a first lookup or launch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Claim {
    /// Nothing to do: not ours, or that stage already claimed. Call the driver.
    Done,
    /// Claimed: call the driver and measure. `admitted` bytes of the estimate were charged
    /// before the call (given back by [`ModuleTable::stage_failed`] if the call fails).
    Todo {
        /// Bytes charged ahead of the call.
        admitted: u64,
    },
    /// The estimate does not fit: `CUDA_ERROR_OUT_OF_MEMORY`, the driver not called, the
    /// stage left to claim again.
    Refused(Deny),
    /// The image at this address is still to be read: estimate it, give the figure to
    /// [`ModuleTable::set_estimate`] and claim again. Nothing claimed.
    Read(u64),
}

#[derive(Default)]
struct Inner {
    /// Modules, and libraries' own records (their charges are in `insts`).
    mods: HashMap<u64, ModEntry>,
    /// Library instances: (library, context) -> what that context holds of it.
    insts: HashMap<(u64, usize), ModEntry>,
    /// Contexts known to be alive (announced at creation or seen in use): a library gets an
    /// instance to measure in each, so that the launch hooks' fast path
    /// ([`ModuleTable::any_unlaunched`]) stays off until every one was measured.
    ctxs: HashSet<usize>,
    /// Function and kernel handles -> their module or library.
    funcs: HashMap<u64, u64>,
}

/// A library instance in context `ctx`, not measured yet.
fn fresh_instance(ctx: usize) -> ModEntry {
    ModEntry {
        dev: None,
        ctx,
        charged: 0,
        library: true,
        looked_up: false,
        launched: false,
        estimate: 0,
        measured: 0,
        deferred: 0,
    }
}

/// This process's modules and libraries.
#[derive(Default)]
pub struct ModuleTable {
    inner: Mutex<Inner>,
    /// Modules whose first launch is not yet measured: the launch hooks do nothing else
    /// while it is 0.
    unlaunched: AtomicUsize,
}

impl ModuleTable {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn recount(&self, g: &Inner) {
        let n = g.mods.values().filter(|m| !m.launched).count()
            + g.insts.values().filter(|m| !m.launched).count();
        self.unlaunched.store(n, Ordering::Relaxed);
    }

    /// Removes every instance of library `lib` (`ctx` None) or every library instance in
    /// context `ctx` (`lib` None), uncharging each.
    fn drop_instances<L: Ledger + ?Sized>(
        g: &mut Inner,
        ledger: &L,
        lib: Option<u64>,
        ctx: Option<usize>,
    ) {
        let keys: Vec<(u64, usize)> = g
            .insts
            .keys()
            .filter(|k| lib.is_none_or(|l| k.0 == l) && ctx.is_none_or(|c| k.1 == c))
            .copied()
            .collect();
        for k in keys {
            if let Some(m) = g.insts.remove(&k) {
                if let Some(d) = m.dev {
                    ledger.uncharge(d, UsageKind::Module, m.charged);
                }
            }
        }
    }

    /// Context `ctx` was created (or a primary context retained): every loaded library gets
    /// an instance in it to measure at its first use there.
    pub fn context_created(&self, ctx: usize) {
        if ctx == 0 {
            return;
        }
        let mut g = self.lock();
        if !g.ctxs.insert(ctx) {
            return;
        }
        let libs: Vec<u64> = g
            .mods
            .iter()
            .filter(|(_, m)| m.library)
            .map(|(&h, _)| h)
            .collect();
        for l in libs {
            g.insts
                .entry((l, ctx))
                .or_insert_with(|| fresh_instance(ctx));
        }
        self.recount(&g);
    }

    /// Whether some module's first launch is still to be measured.
    #[inline]
    pub fn any_unlaunched(&self) -> bool {
        self.unlaunched.load(Ordering::Relaxed) != 0
    }

    /// The entry of module or library `h` (a library's: the sum of its instances' charges).
    pub fn get(&self, h: u64) -> Option<ModEntry> {
        let g = self.lock();
        let mut m = *g.mods.get(&h)?;
        if m.library {
            m.charged = g
                .insts
                .iter()
                .filter(|(k, _)| k.0 == h)
                .map(|(_, i)| i.charged)
                .sum();
        }
        Some(m)
    }

    /// Library `h`'s instance in context `ctx`.
    pub fn instance(&self, h: u64, ctx: usize) -> Option<ModEntry> {
        self.lock().insts.get(&(h, ctx)).copied()
    }

    /// A load on `dev` (`None`: no current context) in `ctx` of an image whose statics need
    /// `est` (admitted before `measure` when [`Estimate::at_load`]: refused, the driver is not
    /// called). `measure` loads and returns the handle and the bytes it took (0: nothing
    /// measured); `unload` undoes a load that does not fit. `gone`
    /// says (asked under the table's lock) whether `ctx` was destroyed since before the load
    /// ([`crate::ledger::accounting::Graveyard`]): its memory went with the context, whose sweep
    /// ([`ModuleTable::drop_context`]) came before this record; a module is then not
    /// recorded, a library recorded with nothing charged (measured again at its next use).
    #[allow(clippy::too_many_arguments)]
    pub fn load<L: Ledger + ?Sized>(
        &self,
        ledger: &L,
        dev: Option<usize>,
        ctx: usize,
        library: bool,
        est: Estimate,
        measure: impl FnOnce() -> (Result<u64, CUresult>, u64),
        unload: impl FnOnce(u64),
        gone: impl FnOnce() -> bool,
    ) -> Result<(), AllocError> {
        let pre = match dev {
            Some(d) if est.at_load && est.bytes > 0 => {
                ledger
                    .try_charge(d, UsageKind::Module, est.bytes)
                    .map_err(AllocError::Denied)?;
                est.bytes
            }
            _ => 0,
        };
        let give_back = |bytes: u64| {
            if let (Some(d), true) = (dev, bytes > 0) {
                ledger.uncharge(d, UsageKind::Module, bytes);
            }
        };
        let (r, cost) = measure();
        let h = match r {
            Ok(h) => h,
            Err(e) => {
                give_back(pre);
                return Err(AllocError::Driver(e));
            }
        };
        // The larger of the estimate admitted and the measurement.
        let mut charged = pre;
        if let Some(d) = dev {
            let extra = cost.saturating_sub(pre);
            if extra > 0 {
                if let Err(e) = ledger.try_charge(d, UsageKind::Module, extra) {
                    unload(h);
                    give_back(pre);
                    return Err(AllocError::Denied(e));
                }
                charged += extra;
            }
        }
        let mut g = self.lock();
        let gone = gone();
        if gone {
            if let (Some(d), true) = (dev, charged > 0) {
                ledger.uncharge(d, UsageKind::Module, charged);
            }
            if !library {
                return Ok(());
            }
            charged = 0;
        }
        let entry = if library {
            // The library's own record; what the load brought is its instance's.
            ModEntry {
                dev: None,
                ctx: 0,
                charged: 0,
                library,
                looked_up: true,
                launched: true,
                estimate: est.bytes,
                measured: 0,
                deferred: est.deferred,
            }
        } else {
            ModEntry {
                dev,
                ctx,
                charged,
                library,
                looked_up: false,
                launched: false,
                estimate: est.bytes,
                measured: cost,
                deferred: est.deferred,
            }
        };
        if let Some(old) = g.mods.insert(h, entry) {
            // A handle we still tracked: that module went away by a path we did not see.
            if let Some(d) = old.dev {
                ledger.uncharge(d, UsageKind::Module, old.charged);
            }
            Self::drop_instances(&mut g, ledger, Some(h), None);
        }
        if library {
            if ctx != 0 && !gone {
                g.ctxs.insert(ctx);
                g.insts.insert(
                    (h, ctx),
                    ModEntry {
                        dev: dev.filter(|_| charged > 0),
                        charged,
                        measured: if charged > 0 { cost } else { 0 },
                        ..fresh_instance(ctx)
                    },
                );
            }
            let others: Vec<usize> = g.ctxs.iter().copied().collect();
            for c in others {
                g.insts.entry((h, c)).or_insert_with(|| fresh_instance(c));
            }
        }
        self.recount(&g);
        Ok(())
    }

    /// Records that `func` (a `CUfunction` or `CUkernel`) belongs to module or library
    /// `owner`, if that is one this process loaded.
    pub fn note_function(&self, func: u64, owner: u64) {
        let mut g = self.lock();
        if g.mods.contains_key(&owner) {
            g.funcs.insert(func, owner);
        }
    }

    /// The module or library of a function or kernel handle.
    pub fn owner_of(&self, func: u64) -> Option<u64> {
        self.lock().funcs.get(&func).copied()
    }

    /// Whether `stage` of `owner` is still to be measured in context `ctx` (the current one)
    /// and marks it as done: one thread measures it. A module is measured once (it lives in
    /// one context); a library once per context.
    pub fn claim(&self, owner: u64, stage: Stage, ctx: usize) -> bool {
        struct Never;
        impl Ledger for Never {
            fn try_charge(&self, _: usize, _: UsageKind, _: u64) -> Result<(), Deny> {
                unreachable!("claim admits nothing")
            }
            fn force_charge(&self, _: usize, _: UsageKind, _: u64) {}
            fn uncharge(&self, _: usize, _: UsageKind, _: u64) {}
        }
        matches!(
            self.claim_inner(None::<(&Never, usize)>, owner, stage, ctx),
            Claim::Todo { .. }
        )
    }

    /// [`ModuleTable::claim`], and the part of the image's estimate that the module (or the
    /// library's instance in `ctx`) has not yet been charged is admitted on its device
    /// (`dev`, the current one, for an instance not yet placed) before the driver call.
    /// Refused: nothing charged and the stage left to claim again, so that the next try is
    /// admitted (and refused) the same way.
    pub fn claim_admit<L: Ledger + ?Sized>(
        &self,
        ledger: &L,
        owner: u64,
        stage: Stage,
        ctx: usize,
        dev: usize,
    ) -> Claim {
        self.claim_inner(Some((ledger, dev)), owner, stage, ctx)
    }

    fn claim_inner<L: Ledger + ?Sized>(
        &self,
        admit: Option<(&L, usize)>,
        owner: u64,
        stage: Stage,
        ctx: usize,
    ) -> Claim {
        let mut g = self.lock();
        let Some(&own) = g.mods.get(&owner) else {
            return Claim::Done;
        };
        let m = if own.library {
            if ctx == 0 {
                return Claim::Done;
            }
            g.ctxs.insert(ctx);
            g.insts
                .entry((owner, ctx))
                .or_insert_with(|| fresh_instance(ctx))
        } else {
            match g.mods.get_mut(&owner) {
                Some(m) => m,
                None => return Claim::Done,
            }
        };
        let flag = match stage {
            Stage::Lookup => &mut m.looked_up,
            Stage::Launch => &mut m.launched,
        };
        if *flag {
            return Claim::Done;
        }
        if admit.is_some() && own.deferred != 0 {
            // (A library's instance may have just been made: counted as unlaunched.)
            self.recount(&g);
            return Claim::Read(own.deferred);
        }
        let mut admitted = 0;
        if let Some((ledger, dev)) = admit {
            let pre = own.estimate.saturating_sub(m.charged);
            if pre > 0 {
                let d = *m.dev.get_or_insert(dev);
                if let Err(e) = ledger.try_charge(d, UsageKind::Module, pre) {
                    if m.charged == 0 && own.library {
                        m.dev = None;
                    }
                    self.recount(&g);
                    return Claim::Refused(e);
                }
                m.charged += pre;
                admitted = pre;
            }
        }
        let flag = match stage {
            Stage::Lookup => &mut m.looked_up,
            Stage::Launch => &mut m.launched,
        };
        *flag = true;
        self.recount(&g);
        Claim::Todo { admitted }
    }

    /// The estimate of `owner`'s image whose reading was deferred ([`Claim::Read`]): `bytes`
    /// (0: not known). Set once; a later call (another thread read it too) changes nothing.
    pub fn set_estimate(&self, owner: u64, bytes: u64) {
        if let Some(m) = self.lock().mods.get_mut(&owner) {
            if m.deferred != 0 {
                m.deferred = 0;
                m.estimate = bytes;
            }
        }
    }

    /// The driver call of a stage claimed with [`ModuleTable::claim_admit`] failed: what was
    /// admitted for it is given back and the stage is left to claim again.
    pub fn stage_failed<L: Ledger + ?Sized>(
        &self,
        ledger: &L,
        owner: u64,
        stage: Stage,
        ctx: usize,
        admitted: u64,
    ) {
        let mut g = self.lock();
        let library = match g.mods.get(&owner) {
            Some(m) => m.library,
            None => return,
        };
        let m = if library {
            g.insts.get_mut(&(owner, ctx))
        } else {
            g.mods.get_mut(&owner)
        };
        let Some(m) = m else {
            return;
        };
        match stage {
            Stage::Lookup => m.looked_up = false,
            Stage::Launch => m.launched = false,
        }
        let back = admitted.min(m.charged);
        if let (Some(d), true) = (m.dev, back > 0) {
            m.charged -= back;
            ledger.uncharge(d, UsageKind::Module, back);
        }
        self.recount(&g);
    }

    /// Charges `cost` bytes that `stage` of `owner` brought onto `dev` in context `ctx`
    /// (claimed with [`ModuleTable::claim`]), as far as the module's measurements exceed its
    /// estimate (already admitted): it is charged the larger of the two. A lookup over the
    /// limit is refused (the bytes stay charged); a launch is charged regardless. Nothing is
    /// charged when `gone` (asked
    /// under the table's lock) says the context the stage ran in was destroyed since before
    /// it: the bytes went with it (a library's instance there goes too).
    #[allow(clippy::too_many_arguments)]
    pub fn charge_stage<L: Ledger + ?Sized>(
        &self,
        ledger: &L,
        owner: u64,
        stage: Stage,
        ctx: usize,
        dev: usize,
        cost: u64,
        gone: impl FnOnce() -> bool,
    ) -> Result<(), Deny> {
        if cost == 0 {
            return Ok(());
        }
        let mut g = self.lock();
        let Some(&own) = g.mods.get(&owner) else {
            return Ok(());
        };
        if gone() {
            if own.library {
                if let Some(m) = g.insts.remove(&(owner, ctx)) {
                    // Re-created by the claim after the context's sweep: it goes with it,
                    // and so does what was admitted for it.
                    if let Some(d) = m.dev {
                        ledger.uncharge(d, UsageKind::Module, m.charged);
                    }
                    g.ctxs.remove(&ctx);
                    self.recount(&g);
                }
            }
            return Ok(());
        }
        let m = if own.library {
            match g.insts.get_mut(&(owner, ctx)) {
                Some(m) => m,
                None => return Ok(()),
            }
        } else {
            match g.mods.get_mut(&owner) {
                Some(m) => m,
                None => return Ok(()),
            }
        };
        let dev = *m.dev.get_or_insert(dev);
        m.measured = m.measured.saturating_add(cost);
        let cost = own.estimate.max(m.measured).saturating_sub(m.charged);
        if cost == 0 {
            return Ok(());
        }
        m.charged = m.charged.saturating_add(cost);
        let r = match stage {
            Stage::Lookup => ledger.try_charge(dev, UsageKind::Module, cost),
            Stage::Launch => {
                ledger.force_charge(dev, UsageKind::Module, cost);
                return Ok(());
            }
        };
        if r.is_err() {
            // The driver holds it anyway.
            ledger.force_charge(dev, UsageKind::Module, cost);
        }
        r
    }

    /// `cuModuleUnload` / `cuLibraryUnload` of `h`: uncharged when the driver succeeds. An
    /// unknown handle goes to the driver untouched.
    pub fn unload<L: Ledger + ?Sized>(
        &self,
        ledger: &L,
        h: u64,
        call: impl FnOnce() -> CUresult,
    ) -> CUresult {
        let mut g = self.lock();
        let r = call();
        if r == CUDA_SUCCESS {
            if let Some(m) = g.mods.remove(&h) {
                if let Some(d) = m.dev {
                    ledger.uncharge(d, UsageKind::Module, m.charged);
                }
                if m.library {
                    Self::drop_instances(&mut g, ledger, Some(h), None);
                }
                g.funcs.retain(|_, o| *o != h);
            }
            self.recount(&g);
        }
        r
    }

    /// Context `ctx` was destroyed: its modules are gone, and so are the libraries'
    /// instances in it (their instances in other contexts stay charged).
    pub fn drop_context<L: Ledger + ?Sized>(&self, ledger: &L, ctx: usize) {
        if ctx == 0 {
            return;
        }
        let mut g = self.lock();
        let gone: Vec<u64> = g
            .mods
            .iter()
            .filter(|(_, m)| !m.library && m.ctx == ctx)
            .map(|(&h, _)| h)
            .collect();
        for h in gone {
            if let Some(m) = g.mods.remove(&h) {
                if let Some(d) = m.dev {
                    ledger.uncharge(d, UsageKind::Module, m.charged);
                }
            }
            g.funcs.retain(|_, o| *o != h);
        }
        Self::drop_instances(&mut g, ledger, None, Some(ctx));
        g.ctxs.remove(&ctx);
        self.recount(&g);
    }
}

#[cfg(test)]
mod tests;
