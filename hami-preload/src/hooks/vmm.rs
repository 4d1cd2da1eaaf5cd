//! Hooks of the virtual memory management calls that decide when a `cuMemCreate` handle's
//! memory is really given back ([`crate::objects::vmm`]): `cuMemMap`, `cuMemUnmap`,
//! `cuMemAddressFree` and `cuMemRetainAllocationHandle`; `cuMemRelease` (in [`super::alloc`])
//! goes through [`mem_release`]. None of them charges anything: the charge was taken by
//! `cuMemCreate`, and these only decide when it goes.
#![allow(non_snake_case)]
#![allow(clippy::missing_safety_doc)] // Every hook has the documented contract of its driver function.

use super::shared::release;
use crate::ffi::cuda::*;
use crate::ffi::shim::hook;
use crate::ledger::accounting::KeySpace;
use crate::objects::vmm::Released;
use crate::state::ProcLedger;
use std::ffi::c_void;

/// Uncharges handles whose memory the driver has given back (the driver already did).
fn uncharge_gone(l: &ProcLedger, gone: Vec<u64>) {
    for h in gone {
        l.p.accounts.free(l, KeySpace::Handle, h, || CUDA_SUCCESS);
    }
}

/// `cuMemRelease(handle)`: a handle that is mapped (or retained) keeps its charge until the
/// memory is really gone; any other goes the ordinary way ([`release`]).
pub(crate) fn mem_release(
    space: KeySpace,
    handle: u64,
    real: impl FnOnce() -> CUresult,
) -> CUresult {
    let l = ProcLedger::current();
    if !l.p.mappings.holds(handle) {
        return release(space, handle, real);
    }
    let r = real();
    if r == CUDA_SUCCESS && l.p.mappings.released(handle) == Released::Gone {
        uncharge_gone(&l, vec![handle]);
    }
    r
}

/// After a successful unmap of `[ptr, ptr + size)`.
fn unmapped(ptr: CUdeviceptr, size: usize) {
    let l = ProcLedger::current();
    let gone = l.p.mappings.unmapped(ptr, size as u64);
    uncharge_gone(&l, gone);
}

hook! {
    /// Hook of `cuMemMap`: a tracked handle mapped here outlives its release.
    fn cuMemMap(
        ptr: CUdeviceptr,
        size: usize,
        offset: usize,
        handle: CUmemGenericAllocationHandle,
        flags: u64,
    ) -> CUresult;
    |f| {
        // SAFETY: forwarded arguments.
        let r = unsafe { f(ptr, size, offset, handle, flags) };
        if r == CUDA_SUCCESS {
            let l = ProcLedger::current();
            if l.p.accounts.get(KeySpace::Handle, handle).is_some() {
                l.p.mappings.mapped(ptr, size as u64, handle);
            }
        }
        r
    }
}

hook! {
    /// Hook of `cuMemUnmap`: the last mapping of a released handle takes its charge.
    fn cuMemUnmap(ptr: CUdeviceptr, size: usize) -> CUresult;
    |f| {
        // SAFETY: forwarded arguments.
        let r = unsafe { f(ptr, size) };
        if r == CUDA_SUCCESS {
            unmapped(ptr, size);
        }
        r
    }
}

hook! {
    /// Hook of `cuMemAddressFree`: mappings left in the range go with it.
    fn cuMemAddressFree(ptr: CUdeviceptr, size: usize) -> CUresult;
    |f| {
        // SAFETY: forwarded arguments.
        let r = unsafe { f(ptr, size) };
        if r == CUDA_SUCCESS {
            unmapped(ptr, size);
        }
        r
    }
}

hook! {
    /// Hook of `cuMemRetainAllocationHandle`: one more reference that a release must drop.
    fn cuMemRetainAllocationHandle(
        handle: *mut CUmemGenericAllocationHandle,
        addr: *mut c_void,
    ) -> CUresult;
    |f| {
        // SAFETY: forwarded arguments.
        let r = unsafe { f(handle, addr) };
        if r == CUDA_SUCCESS && !handle.is_null() {
            // SAFETY: non-null, written by the driver on success.
            let h = unsafe { *handle };
            ProcLedger::current().p.mappings.retained(h);
        }
        r
    }
}
