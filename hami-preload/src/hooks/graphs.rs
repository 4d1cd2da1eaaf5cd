//! Hooks of graphs with memory nodes ([`crate::objects::graph_memory`]): instantiation and update read
//! the graph's allocation nodes, uploads and launches admit the growth of the device's graph
//! pool before the driver maps it, trims and destroyed executable graphs let the charge
//! follow the pool.
#![allow(non_snake_case)]
#![allow(clippy::missing_safety_doc)] // Every hook has the documented contract of its driver function.

use super::shared::report_denial;
use crate::ffi::cuda::*;
use crate::ffi::shim::hook;
use crate::ffi::symbols::{self, Cu};
use crate::ledger::accounting::KeySpace;
use crate::objects::graph_memory::{ExecNeed, GraphReading, Refused};
use crate::state::{self, ProcLedger};
use hami_abi::layout::MAX_DEVICES;
use std::ffi::{c_char, c_int, c_void};

/// The allocation nodes of `graph` (`flags`: its instantiation flags), read through the
/// driver's node queries. `None` when the graph cannot be read (a driver without the
/// queries, a bad handle: the driver's own call then answers).
fn read_need(graph: CUgraph, flags: u64) -> Option<ExecNeed> {
    // SAFETY: documented types.
    let (get_nodes, get_type, alloc_params, free_params) = unsafe {
        (
            symbols::cu::<FnGraphGetNodes>(Cu::cuGraphGetNodes)?,
            symbols::cu::<FnGraphNodeGetType>(Cu::cuGraphNodeGetType)?,
            symbols::cu::<FnGraphMemAllocNodeGetParams>(Cu::cuGraphMemAllocNodeGetParams)?,
            symbols::cu::<FnGraphMemFreeNodeGetParams>(Cu::cuGraphMemFreeNodeGetParams)?,
        )
    };
    let mut n: usize = 0;
    // SAFETY: a NULL array asks for the count; valid out pointer.
    if unsafe { get_nodes(graph, std::ptr::null_mut(), &mut n) } != CUDA_SUCCESS {
        return None;
    }
    let mut nodes: Vec<CUgraphNode> = vec![std::ptr::null_mut(); n];
    if n > 0 {
        // SAFETY: an array of `n` entries.
        if unsafe { get_nodes(graph, nodes.as_mut_ptr(), &mut n) } != CUDA_SUCCESS {
            return None;
        }
        nodes.truncate(n);
    }
    let accounts = &state::holdings().accounts;
    let mut need = ExecNeed {
        auto_free: flags & CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH != 0,
        ..ExecNeed::default()
    };
    let mut allocs: Vec<(usize, u64, u64)> = Vec::new();
    let mut frees: Vec<u64> = Vec::new();
    for node in nodes.into_iter().filter(|n| !n.is_null()) {
        let mut ty: c_int = -1;
        // SAFETY: a node of the graph and a valid out pointer.
        if unsafe { get_type(node, &mut ty) } != CUDA_SUCCESS {
            continue;
        }
        if ty == CU_GRAPH_NODE_TYPE_MEM_ALLOC {
            // SAFETY: all-zero is a valid value of this plain C struct.
            let mut p: CUDA_MEM_ALLOC_NODE_PARAMS = unsafe { std::mem::zeroed() };
            // SAFETY: an allocation node and a valid out pointer.
            if unsafe { alloc_params(node, &mut p) } != CUDA_SUCCESS {
                continue;
            }
            let loc = p.pool_props.location;
            if loc.type_ != CU_MEM_LOCATION_TYPE_DEVICE || loc.id < 0 {
                continue; // host memory: no device memory to charge
            }
            allocs.push((loc.id as usize, p.dptr, p.bytesize as u64));
        } else if ty == CU_GRAPH_NODE_TYPE_MEM_FREE {
            let mut d: CUdeviceptr = 0;
            // SAFETY: a free node and a valid out pointer.
            if unsafe { free_params(node, &mut d) } == CUDA_SUCCESS {
                frees.push(d);
            }
        }
    }
    for (dev, dptr, bytes) in allocs {
        if dev >= MAX_DEVICES {
            // Beyond what the region can account (as for every allocation there): left to
            // the driver.
            continue;
        } else if accounts.get(KeySpace::Pointer, dptr).is_some() {
            // Captured from cuMemAllocAsync: charged as data at capture.
            need.captured.push((dev, dptr, bytes));
        } else {
            ExecNeed::add(&mut need.per_dev, dev, bytes);
            if !frees.contains(&dptr) {
                ExecNeed::add(&mut need.unfreed, dev, bytes);
            }
        }
    }
    Some(need)
}

/// One `cuuint64_t` graph-memory attribute of `dev`.
fn graph_attr(dev: usize, attr: c_int) -> Option<u64> {
    // SAFETY: documented type.
    let get =
        unsafe { symbols::cu::<FnDeviceGetGraphMemAttribute>(Cu::cuDeviceGetGraphMemAttribute) }?;
    let mut v: u64 = 0;
    // SAFETY: a `cuuint64_t` attribute and a valid out pointer.
    let r = unsafe { get(dev as CUdevice, attr, (&mut v as *mut u64).cast()) };
    (r == CUDA_SUCCESS).then_some(v)
}

/// Reserved and used bytes of `dev`'s graph pool.
fn read_pool(dev: usize) -> Option<GraphReading> {
    Some(GraphReading {
        reserved: graph_attr(dev, CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT)?,
        used: graph_attr(dev, CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT)?,
    })
}

/// Whether captured allocation `dptr` is still charged as data.
fn captured_live(dptr: u64) -> bool {
    state::holdings()
        .accounts
        .get(KeySpace::Pointer, dptr)
        .is_some()
}

/// An upload or launch of `exec` (`launch`: a launch): the graph pool's growth admitted
/// first ([`crate::objects::graph_memory::GraphTable::run`]); refused: `CUDA_ERROR_OUT_OF_MEMORY`, the
/// driver not called.
pub(crate) fn with_graph_memory(
    what: &str,
    exec: CUgraphExec,
    launch: bool,
    real: impl FnOnce() -> CUresult,
) -> CUresult {
    let p = state::holdings();
    if !p.graphs.any() {
        return real();
    }
    let l = ProcLedger::current();
    match p
        .graphs
        .run(&l, exec as u64, launch, &read_pool, &captured_live, real)
    {
        Ok(r) => r,
        Err(Refused { dev, deny }) => {
            report_denial(what, l.p, dev, &deny);
            CUDA_ERROR_OUT_OF_MEMORY
        }
    }
}

/// After a successful instantiation of `graph` as `*exec`: records its memory nodes.
fn note_instantiated(r: CUresult, exec: *mut CUgraphExec, need: Option<ExecNeed>) -> CUresult {
    if r == CUDA_SUCCESS && !exec.is_null() {
        if let Some(need) = need {
            // SAFETY: non-null, written by the driver on success.
            let x = unsafe { *exec } as u64;
            state::holdings().graphs.note_exec(x, need);
        }
    }
    r
}

hook! {
    /// Hook of `cuGraphInstantiateWithFlags`: the graph's memory nodes are recorded (no memory
    /// is taken at instantiation).
    fn cuGraphInstantiateWithFlags(
        exec: *mut CUgraphExec,
        graph: CUgraph,
        flags: u64,
    ) -> CUresult;
    |f| {
        let need = read_need(graph, flags);
        // SAFETY: forwarded arguments.
        note_instantiated(unsafe { f(exec, graph, flags) }, exec, need)
    }
}

hook! {
    /// Hook of `cuGraphInstantiate_v2` (no flags).
    fn cuGraphInstantiate_v2(
        exec: *mut CUgraphExec,
        graph: CUgraph,
        error_node: *mut CUgraphNode,
        log: *mut c_char,
        log_size: usize,
    ) -> CUresult;
    |f| {
        let need = read_need(graph, 0);
        // SAFETY: forwarded arguments.
        let r = unsafe { f(exec, graph, error_node, log, log_size) };
        note_instantiated(r, exec, need)
    }
}

/// `cuGraphInstantiateWithParams(_ptsz)`: with `CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD` the
/// instantiation maps the graph's memory, admitted first (refused: `CUDA_ERROR_OUT_OF_MEMORY`,
/// `result_out` = `CUDA_GRAPH_INSTANTIATE_ERROR`, no executable graph).
fn instantiate_with_params(
    what: &str,
    exec: *mut CUgraphExec,
    graph: CUgraph,
    params: *mut CUDA_GRAPH_INSTANTIATE_PARAMS,
    real: impl FnOnce() -> CUresult,
) -> CUresult {
    if exec.is_null() || params.is_null() {
        return real();
    }
    // SAFETY: non-null, the caller's parameters.
    let flags = unsafe { (*params).flags };
    let Some(need) = read_need(graph, flags) else {
        return real();
    };
    if flags & CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD == 0 || need.per_dev.is_empty() {
        return note_instantiated(real(), exec, Some(need));
    }
    // Admitted under a provisional key (the executable graph does not exist yet), then
    // recorded under the driver's handle.
    const PENDING: u64 = u64::MAX;
    let p = state::holdings();
    p.graphs.note_exec(PENDING, need.clone());
    let r = with_graph_memory(what, PENDING as CUgraphExec, false, real);
    p.graphs.forget_exec(PENDING);
    if r == CUDA_ERROR_OUT_OF_MEMORY {
        // SAFETY: non-null, the caller's parameters.
        unsafe { (*params).result_out = 1 }; // CUDA_GRAPH_INSTANTIATE_ERROR
    }
    note_instantiated(r, exec, Some(need))
}

hook! {
    /// Hook of `cuGraphInstantiateWithParams`.
    fn cuGraphInstantiateWithParams / cuGraphInstantiateWithParams_ptsz(
        exec: *mut CUgraphExec,
        graph: CUgraph,
        params: *mut CUDA_GRAPH_INSTANTIATE_PARAMS,
    ) -> CUresult;
    |f, name, _| {
        // SAFETY: forwarded arguments.
        instantiate_with_params(name, exec, graph, params, || unsafe { f(exec, graph, params) })
    }
}

hook! {
    /// Hook of `cuGraphExecUpdate_v2`: an updated executable graph takes the graph's memory
    /// nodes.
    fn cuGraphExecUpdate_v2(
        exec: CUgraphExec,
        graph: CUgraph,
        info: *mut c_void,
    ) -> CUresult;
    |f| {
        let flags = 0;
        let need = read_need(graph, flags);
        // SAFETY: forwarded arguments.
        let r = unsafe { f(exec, graph, info) };
        if r == CUDA_SUCCESS {
            if let Some(mut need) = need {
                // The instantiation flags stay the executable graph's.
                need.auto_free = state::holdings().graphs.auto_free(exec as u64);
                state::holdings().graphs.note_exec(exec as u64, need);
            }
        }
        r
    }
}

hook! {
    /// Hook of `cuGraphUpload`: the graph's memory is mapped here, admitted first.
    fn cuGraphUpload / cuGraphUpload_ptsz(exec: CUgraphExec, stream: CUstream) -> CUresult;
    |f, name, _| {
        // SAFETY: forwarded arguments.
        with_graph_memory(name, exec, false, || unsafe { f(exec, stream) })
    }
}

hook! {
    /// Hook of `cuGraphExecDestroy`: the executable graph is forgotten and its devices' graph
    /// pools read again (the driver keeps the memory until a trim).
    fn cuGraphExecDestroy(exec: CUgraphExec) -> CUresult;
    |f| {
        // SAFETY: forwarded argument.
        let r = unsafe { f(exec) };
        let p = state::holdings();
        if r == CUDA_SUCCESS && p.graphs.any() {
            let l = ProcLedger::current();
            for dev in p.graphs.forget_exec(exec as u64) {
                p.graphs.refresh(&l, dev, &read_pool, &captured_live);
            }
        }
        r
    }
}

hook! {
    /// Hook of `cuDeviceGraphMemTrim`: the device's graph pool is read again afterwards.
    fn cuDeviceGraphMemTrim(dev: CUdevice) -> CUresult;
    |f| {
        // SAFETY: forwarded argument.
        let r = unsafe { f(dev) };
        if r == CUDA_SUCCESS && (0..MAX_DEVICES as CUdevice).contains(&dev) {
            let l = ProcLedger::current();
            state::holdings()
                .graphs
                .refresh(&l, dev as usize, &read_pool, &captured_live);
        }
        r
    }
}
