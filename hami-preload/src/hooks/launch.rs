//! Hooks of the launches: `cuLaunchKernel(Ex)`, the cooperative launches and the graph
//! launches. A launch of a module's function (`cuLaunchKernel*`, a cooperative launch) takes
//! one path ([`launch`]: local memory admitted, the module's first launch admitted and
//! measured, the gate). A graph launch goes through the launch gate only (`gated`).
//!
//! Below the hooks: the launch gate's way in for every submission and synchronisation hook
//! (`gate_enter` / `gate_leave`, `gated`, `gate_on_sync`), over this process's
//! [`crate::compute::gate::Gate`] and the region's compute cells, behind a process-wide switch.
#![allow(non_snake_case)]
#![allow(clippy::missing_safety_doc)] // Every hook has the documented contract of its driver function.

use crate::compute::arming::ARMING;
use crate::compute::gate;
use crate::ffi::cuda::*;
use crate::ffi::shim::hook;
use crate::state;
use hami_common::region::{ComputeCells, Region};
use std::ffi::{c_uint, c_void};

/// A launch of `func` (a `CUfunction` or a `CUkernel`) on `stream` (`ptsz`: of a
/// per-thread-stream entry point): local memory the kernel needs beyond what the context
/// holds is admitted first ([`super::limits::before_launch`]; refused: the launch does not
/// happen); then the launch gate ([`crate::compute::gate::enter`] / [`crate::compute::gate::leave`]: one atomic
/// load without a compute share; its waits happen before any measurement starts) around the
/// first-launch measurement of each module's kernels
/// ([`super::modules::launch_measured`]).
pub(crate) fn launch(
    what: &str,
    func: CUfunction,
    stream: CUstream,
    ptsz: bool,
    real: impl FnOnce() -> CUresult,
) -> CUresult {
    if let Some(refused) = super::limits::before_launch(what, func) {
        return refused;
    }
    let real = super::limits::after_launch(real);
    let ticket = gate_enter(stream, ptsz);
    let r = super::modules::launch_measured(what, func, real);
    gate_leave(ticket, r)
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
    fn cuLaunchKernel / cuLaunchKernel_ptsz(
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
    ) -> CUresult;
    |f, name, ptsz| {
        // SAFETY: forwarded arguments (every call below).
        let call = || unsafe { f(func, gx, gy, gz, bx, by, bz, shared, stream, params, extra) };
        launch(name, func, stream, ptsz, call)
    }
}

hook! {
    /// Hook of `cuLaunchKernelEx`.
    fn cuLaunchKernelEx / cuLaunchKernelEx_ptsz(
        config: *const c_void,
        func: CUfunction,
        params: *mut *mut c_void,
        extra: *mut *mut c_void,
    ) -> CUresult;
    |f, name, ptsz| {
        // SAFETY: forwarded arguments (every call below).
        let call = || unsafe { f(config, func, params, extra) };
        launch(name, func, ex_stream(config), ptsz, call)
    }
}

hook! {
    /// Hook of `cuLaunchCooperativeKernel`.
    fn cuLaunchCooperativeKernel / cuLaunchCooperativeKernel_ptsz(
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
    ) -> CUresult;
    |f, name, ptsz| {
        // SAFETY: forwarded arguments.
        launch(name, func, stream, ptsz, || unsafe {
            f(func, gx, gy, gz, bx, by, bz, shared, stream, params)
        })
    }
}

hook! {
    /// Hook of `cuGraphLaunch`: the graph pool's growth its memory nodes may cause is
    /// admitted first ([`super::graphs::with_graph_memory`]); the whole graph is metered as
    /// one submission.
    fn cuGraphLaunch / cuGraphLaunch_ptsz(exec: CUgraphExec, stream: CUstream) -> CUresult;
    |f, name, ptsz| {
        super::graphs::with_graph_memory(name, exec, true, || {
            // SAFETY: forwarded arguments.
            gated(stream, ptsz, || unsafe { f(exec, stream) })
        })
    }
}

// ---- the process-wide switch ([`crate::compute::arming`]) ----

/// Whether any device has a compute share: the only check on the launch path without one.
#[inline]
fn armed() -> bool {
    ARMING.armed(|| state::global().region.as_ref().ok())
}

/// The effective share of this process's CUDA ordinal `dev` (0 = none), once [`armed`]: the
/// share of the container's device it is. A device the region does not know has no gate (no
/// other device's budget); in a container with limits nothing can be allocated on it, a
/// context included.
fn share(dev: usize) -> u32 {
    match state::placed(dev) {
        state::Placed::Index(c) => ARMING.share(c),
        _ => 0,
    }
}

/// The shared budget of this process's CUDA ordinal `dev`: the compute record of the
/// container's device it is.
fn cells(region: &Region, dev: usize) -> Option<ComputeCells<'_>> {
    match state::placed(dev) {
        state::Placed::Index(c) => region.compute_cells(c),
        _ => None,
    }
}

/// The pace the gate holds the process's CUDA ordinal `dev` to at `now_ns` (basis points:
/// the share, or the node agent's grant, and the arbiter's turn; `None`: not gated), that of
/// the container's device it is ([`cells`]).
fn pace(region: &Region, dev: usize, now_ns: u64) -> Option<gate::Pace> {
    match state::placed(dev) {
        state::Placed::Index(c) => region.compute_rate_bp(c, now_ns).map(|bp| gate::Pace {
            bp,
            turn: region.compute_turn(c, now_ns),
        }),
        _ => None,
    }
}

// ---- the gate around a submission ----

/// A kernel submission from a hook: through the gate when the current device has a share,
/// otherwise `real` with one atomic load in front.
#[inline]
pub(crate) fn gated(stream: CUstream, ptsz: bool, real: impl FnOnce() -> CUresult) -> CUresult {
    let ticket = gate_enter(stream, ptsz);
    let r = real();
    gate_leave(ticket, r)
}

/// The gate in front of a submission on `stream` (`ptsz`: of a per-thread-stream entry
/// point): one atomic load without a share; with one, [`gate::before`] on the current device.
/// Pass what it returns to [`gate_leave`] with the submission's result.
#[inline]
pub(crate) fn gate_enter(stream: CUstream, ptsz: bool) -> Option<gate::Ticket<'static>> {
    if !armed() {
        return None;
    }
    enter_gated(stream, ptsz)
}

#[inline(never)]
fn enter_gated(stream: CUstream, ptsz: bool) -> Option<gate::Ticket<'static>> {
    let (dev, ctx) = crate::measure::current_dev_ctx().ok()?;
    if share(dev) == 0 {
        return None;
    }
    let region = state::global().region.as_ref().ok()?;
    // SAFETY: the gettid system call has no preconditions. (Not glibc's `gettid`, which
    // exists only since glibc 2.30: the preload's floor is 2.17, `docs/deploy.md`.)
    let token = unsafe { libc::syscall(libc::SYS_gettid) } as u64 + 1;
    let t = gate::Target {
        dev,
        ctx,
        stream: stream as usize,
        ptsz,
        token,
    };
    gate::before(
        &state::holdings().gate,
        &gate::RealGateDriver,
        &gate::RealClock,
        |d| cells(region, d),
        |now| pace(region, dev, now),
        t,
    )
}

/// The gate after a submission that returned `r` (see [`gate_enter`]).
#[inline]
pub(crate) fn gate_leave(ticket: Option<gate::Ticket<'static>>, r: CUresult) -> CUresult {
    match ticket {
        None => r,
        Some(_) => gate::after(ticket, &gate::RealGateDriver, r),
    }
}

/// At a synchronisation: debits this process's submissions that completed.
pub(crate) fn gate_on_sync() {
    if !armed() {
        return;
    }
    if let Ok(region) = &state::global().region {
        state::holdings()
            .gate
            .harvest(&gate::RealGateDriver, |d| cells(region, d));
    }
}
