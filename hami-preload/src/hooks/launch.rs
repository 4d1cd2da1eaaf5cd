//! Hooks of the cooperative launches and graph launches. A cooperative launch is a launch of a
//! module's function like `cuLaunchKernel`: it takes the same path
//! ([`super::modules::launch`]: local memory admitted, the module's first launch admitted and
//! measured, the gate). A graph launch goes through the launch gate only
//! ([`crate::gate::launch`]).
#![allow(non_snake_case)]
#![allow(clippy::missing_safety_doc)] // Every hook has the documented contract of its driver function.

use crate::cuda::*;
use crate::gate;
use crate::shim::hook;
use std::ffi::{c_uint, c_void};

hook! {
    /// Hook of `cuLaunchCooperativeKernel`.
    fn cuLaunchCooperativeKernel(
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
    |f| {
        // SAFETY: forwarded arguments.
        super::modules::launch("cuLaunchCooperativeKernel", func, stream, false, || unsafe {
            f(func, gx, gy, gz, bx, by, bz, shared, stream, params)
        })
    }
}

hook! {
    /// Hook of `cuLaunchCooperativeKernel_ptsz`.
    fn cuLaunchCooperativeKernel_ptsz(
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
    |f| {
        // SAFETY: forwarded arguments.
        super::modules::launch("cuLaunchCooperativeKernel_ptsz", func, stream, true, || unsafe {
            f(func, gx, gy, gz, bx, by, bz, shared, stream, params)
        })
    }
}

hook! {
    /// Hook of `cuGraphLaunch`: the whole graph is metered as one submission.
    fn cuGraphLaunch(exec: CUgraphExec, stream: CUstream) -> CUresult;
    |f| {
        // SAFETY: forwarded arguments.
        gate::launch(stream, false, || unsafe { f(exec, stream) })
    }
}

hook! {
    /// Hook of `cuGraphLaunch_ptsz`.
    fn cuGraphLaunch_ptsz(exec: CUgraphExec, stream: CUstream) -> CUresult;
    |f| {
        // SAFETY: forwarded arguments.
        gate::launch(stream, true, || unsafe { f(exec, stream) })
    }
}
