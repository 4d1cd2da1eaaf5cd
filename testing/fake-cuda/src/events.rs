//! Exports for graphs (instantiate, launch, destroy), events and stream capture (begin, end,
//! query), on the fake device clock. Semantics in `driver/`; see `docs/fake-driver.md`.

use std::ffi::{c_char, c_int, c_uint, c_void};

use crate::driver::clock::{submit, wait_until};
use crate::driver::{graph_mem, inited};
use crate::ffi::*;

/// `CUgraph`, `CUgraphExec`, `CUevent`, `CUgraphNode`: opaque.
type Handle = *mut c_void;

// ---------------------------------------------------------------------------------------------
// Graphs (captured launches; a launch of the executable graph takes their total time)

fn graph_instantiate(exec: *mut Handle, graph: Handle, flags: u64) -> CUresult {
    run(|| {
        let mut g = inited()?;
        nonnull(exec)?;
        if flags & graph_mem::FLAG_UPLOAD != 0 {
            // Only cuGraphInstantiateWithParams takes the upload flag.
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let h = g.graph_instantiate(graph as u64, flags)?;
        // SAFETY: checked non-NULL; C contract.
        unsafe { put(exec, h as Handle) };
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphInstantiateWithFlags(
    exec: *mut Handle,
    graph: Handle,
    flags: u64,
) -> CUresult {
    graph_instantiate(exec, graph, flags)
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphInstantiate_v2(
    exec: *mut Handle,
    graph: Handle,
    _error_node: *mut Handle,
    _log: *mut c_char,
    _log_size: usize,
) -> CUresult {
    graph_instantiate(exec, graph, 0)
}

fn instantiate_with_params(
    exec: *mut Handle,
    graph: Handle,
    params: *mut CUDA_GRAPH_INSTANTIATE_PARAMS,
) -> CUresult {
    run(|| {
        let mut g = inited()?;
        nonnull(exec)?;
        nonnull(params)?;
        // SAFETY: checked non-NULL; C contract.
        let p = unsafe { &mut *params };
        let flags = p.flags;
        let h = g.graph_instantiate(graph as u64, flags & !graph_mem::FLAG_UPLOAD)?;
        if flags & graph_mem::FLAG_UPLOAD != 0 {
            g.check_stream(p.h_upload_stream as u64)?;
            if let Err(e) = g.graph_upload(h) {
                let _ = g.graph_exec_destroy(h);
                p.result_out = 1; // CUDA_GRAPH_INSTANTIATE_ERROR
                return Err(e);
            }
        }
        p.result_out = 0; // CUDA_GRAPH_INSTANTIATE_SUCCESS
        p.h_err_node_out = std::ptr::null_mut();
        // SAFETY: checked non-NULL; C contract.
        unsafe { put(exec, h as Handle) };
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphInstantiateWithParams(
    exec: *mut Handle,
    graph: Handle,
    params: *mut CUDA_GRAPH_INSTANTIATE_PARAMS,
) -> CUresult {
    instantiate_with_params(exec, graph, params)
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphInstantiateWithParams_ptsz(
    exec: *mut Handle,
    graph: Handle,
    params: *mut CUDA_GRAPH_INSTANTIATE_PARAMS,
) -> CUresult {
    instantiate_with_params(exec, graph, params)
}

fn graph_launch(exec: Handle, stream: CUstream, ptsz: bool) -> CUresult {
    run(|| {
        let mut g = inited()?;
        let ns = g.graph_exec_ns(exec as u64)?;
        g.check_stream(stream as u64)?;
        g.graph_launch_mem(exec as u64)?;
        submit(g, stream as u64, ptsz, ns)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphLaunch(exec: Handle, stream: CUstream) -> CUresult {
    graph_launch(exec, stream, false)
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphLaunch_ptsz(exec: Handle, stream: CUstream) -> CUresult {
    graph_launch(exec, stream, true)
}

fn graph_upload(exec: Handle, stream: CUstream) -> CUresult {
    run(|| {
        let mut g = inited()?;
        g.graph_exec_ns(exec as u64)?;
        g.check_stream(stream as u64)?;
        g.graph_upload(exec as u64)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphUpload(exec: Handle, stream: CUstream) -> CUresult {
    graph_upload(exec, stream)
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphUpload_ptsz(exec: Handle, stream: CUstream) -> CUresult {
    graph_upload(exec, stream)
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphExecUpdate_v2(
    exec: Handle,
    graph: Handle,
    info: *mut CUgraphExecUpdateResultInfo,
) -> CUresult {
    run(|| {
        let mut g = inited()?;
        nonnull(info)?;
        g.graph_exec_ns(exec as u64)?;
        let ok = g.graph_exec_update(exec as u64, graph as u64)?;
        // SAFETY: checked non-NULL; C contract.
        let info = unsafe { &mut *info };
        info.error_node = std::ptr::null_mut();
        info.error_from_node = std::ptr::null_mut();
        match ok {
            Ok(()) => {
                info.result = 0; // CU_GRAPH_EXEC_UPDATE_SUCCESS
                Ok(())
            }
            Err(()) => {
                info.result = 2; // CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED
                Err(CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE)
            }
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphCreate(graph: *mut Handle, flags: c_uint) -> CUresult {
    run(|| {
        let mut g = inited()?;
        nonnull(graph)?;
        let h = g.graph_create(flags)?;
        // SAFETY: checked non-NULL; C contract.
        unsafe { put(graph, h as Handle) };
        Ok(())
    })
}

/// The dependency list of a node addition (`CUDA_ERROR_INVALID_VALUE` for NULL with a count).
fn deps_of(deps: *const Handle, n: usize) -> R<Vec<u64>> {
    if n == 0 {
        return Ok(Vec::new());
    }
    nonnull(deps)?;
    // SAFETY: checked non-NULL; the caller's array of `n` nodes (C contract).
    let s = unsafe { std::slice::from_raw_parts(deps, n) };
    Ok(s.iter().map(|&h| h as u64).collect())
}

fn add_alloc(
    g: &mut crate::driver::Inner,
    graph: Handle,
    deps: &[u64],
    p: &mut CUDA_MEM_ALLOC_NODE_PARAMS,
) -> R<u64> {
    let (node, dptr) = g.graph_add_alloc(
        graph as u64,
        deps,
        p.pool_props.alloc_type,
        p.pool_props.location,
        p.bytesize as u64,
    )?;
    p.dptr = dptr;
    Ok(node)
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphAddMemAllocNode(
    node: *mut Handle,
    graph: Handle,
    deps: *const Handle,
    ndeps: usize,
    params: *mut CUDA_MEM_ALLOC_NODE_PARAMS,
) -> CUresult {
    run(|| {
        let mut g = inited()?;
        nonnull(node)?;
        nonnull(params)?;
        let deps = deps_of(deps, ndeps)?;
        // SAFETY: checked non-NULL; C contract.
        let n = add_alloc(&mut g, graph, &deps, unsafe { &mut *params })?;
        // SAFETY: checked non-NULL; C contract.
        unsafe { put(node, n as Handle) };
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphAddMemFreeNode(
    node: *mut Handle,
    graph: Handle,
    deps: *const Handle,
    ndeps: usize,
    dptr: CUdeviceptr,
) -> CUresult {
    run(|| {
        let mut g = inited()?;
        nonnull(node)?;
        let deps = deps_of(deps, ndeps)?;
        let n = g.graph_add_free(graph as u64, &deps, dptr)?;
        // SAFETY: checked non-NULL; C contract.
        unsafe { put(node, n as Handle) };
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphAddEmptyNode(
    node: *mut Handle,
    graph: Handle,
    deps: *const Handle,
    ndeps: usize,
) -> CUresult {
    run(|| {
        let mut g = inited()?;
        nonnull(node)?;
        let deps = deps_of(deps, ndeps)?;
        let n = g.graph_add_empty(graph as u64, &deps)?;
        // SAFETY: checked non-NULL; C contract.
        unsafe { put(node, n as Handle) };
        Ok(())
    })
}

/// `cuGraphAddNode` (CUDA 12.2): memory allocation, free and empty nodes.
#[no_mangle]
pub unsafe extern "C" fn cuGraphAddNode(
    node: *mut Handle,
    graph: Handle,
    deps: *const Handle,
    ndeps: usize,
    params: *mut CUgraphNodeParams,
) -> CUresult {
    run(|| {
        let mut g = inited()?;
        nonnull(node)?;
        nonnull(params)?;
        let deps = deps_of(deps, ndeps)?;
        // SAFETY: checked non-NULL; C contract.
        let p = unsafe { &mut *params };
        let n = match p.type_ {
            graph_mem::NODE_MEM_ALLOC => {
                // SAFETY: the union holds CUDA_MEM_ALLOC_NODE_PARAMS_v2 (120 of its 232
                // bytes) for this type; the union is 8-aligned like the struct.
                let a = unsafe { &mut *(p.union.as_mut_ptr() as *mut CUDA_MEM_ALLOC_NODE_PARAMS) };
                add_alloc(&mut g, graph, &deps, a)?
            }
            graph_mem::NODE_MEM_FREE => g.graph_add_free(graph as u64, &deps, p.union[0])?,
            graph_mem::NODE_EMPTY => g.graph_add_empty(graph as u64, &deps)?,
            _ => return Err(CUDA_ERROR_INVALID_VALUE),
        };
        // SAFETY: checked non-NULL; C contract.
        unsafe { put(node, n as Handle) };
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphGetNodes(
    graph: Handle,
    nodes: *mut Handle,
    count: *mut usize,
) -> CUresult {
    run(|| {
        let g = inited()?;
        nonnull(count)?;
        let all = g.graph_get_nodes(graph as u64)?;
        if nodes.is_null() {
            // SAFETY: checked non-NULL; C contract.
            unsafe { put(count, all.len()) };
            return Ok(());
        }
        // SAFETY: checked non-NULL; C contract.
        let room = unsafe { *count };
        for i in 0..room {
            let v = all.get(i).map_or(std::ptr::null_mut(), |&h| h as Handle);
            // SAFETY: the caller's array holds `room` entries (C contract).
            unsafe { put(nodes.add(i), v) };
        }
        // SAFETY: checked non-NULL; C contract.
        unsafe { put(count, room.min(all.len())) };
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphNodeGetType(node: Handle, ty: *mut c_int) -> CUresult {
    run(|| {
        let g = inited()?;
        nonnull(ty)?;
        let t = match g.graph_node(node as u64)? {
            graph_mem::Node::Other(t) => t,
            graph_mem::Node::Alloc { .. } => graph_mem::NODE_MEM_ALLOC,
            graph_mem::Node::Free { .. } => graph_mem::NODE_MEM_FREE,
        };
        // SAFETY: checked non-NULL; C contract.
        unsafe { put(ty, t) };
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphMemAllocNodeGetParams(
    node: Handle,
    out: *mut CUDA_MEM_ALLOC_NODE_PARAMS,
) -> CUresult {
    run(|| {
        let g = inited()?;
        nonnull(out)?;
        let graph_mem::Node::Alloc {
            ordinal,
            size,
            dptr,
        } = g.graph_node(node as u64)?
        else {
            return Err(CUDA_ERROR_INVALID_VALUE);
        };
        let p = CUDA_MEM_ALLOC_NODE_PARAMS {
            pool_props: CUmemPoolProps {
                alloc_type: CU_MEM_ALLOCATION_TYPE_PINNED,
                handle_types: 0,
                location: CUmemLocation {
                    type_: CU_MEM_LOCATION_TYPE_DEVICE,
                    id: ordinal as c_int,
                },
                win32_security_attributes: std::ptr::null_mut(),
                max_size: 0,
                usage: 0,
                reserved: [0; 54],
            },
            access_descs: std::ptr::null(),
            access_desc_count: 0,
            bytesize: size as usize,
            dptr,
        };
        // SAFETY: checked non-NULL; C contract.
        unsafe { put(out, p) };
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphMemFreeNodeGetParams(
    node: Handle,
    out: *mut CUdeviceptr,
) -> CUresult {
    run(|| {
        let g = inited()?;
        nonnull(out)?;
        let graph_mem::Node::Free { dptr } = g.graph_node(node as u64)? else {
            return Err(CUDA_ERROR_INVALID_VALUE);
        };
        // SAFETY: checked non-NULL; C contract.
        unsafe { put(out, dptr) };
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetGraphMemAttribute(
    dev: CUdevice,
    attr: c_int,
    value: *mut c_void,
) -> CUresult {
    run(|| {
        let mut g = inited()?;
        nonnull(value)?;
        let v = g.graph_mem_attr(dev, attr)?;
        // SAFETY: checked non-NULL; a cuuint64_t (C contract).
        unsafe { put(value as *mut u64, v) };
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceSetGraphMemAttribute(
    dev: CUdevice,
    attr: c_int,
    value: *mut c_void,
) -> CUresult {
    run(|| {
        let mut g = inited()?;
        nonnull(value)?;
        // SAFETY: checked non-NULL; a cuuint64_t (C contract).
        let v = unsafe { (value as *const u64).read_unaligned() };
        g.graph_mem_set_attr(dev, attr, v)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGraphMemTrim(dev: CUdevice) -> CUresult {
    run(|| inited()?.graph_mem_trim(dev))
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphExecDestroy(exec: Handle) -> CUresult {
    run(|| inited()?.graph_exec_destroy(exec as u64))
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphDestroy(graph: Handle) -> CUresult {
    run(|| inited()?.graph_destroy(graph as u64))
}

// ---------------------------------------------------------------------------------------------
// Events and capture

#[no_mangle]
pub unsafe extern "C" fn cuEventCreate(event: *mut Handle, flags: c_uint) -> CUresult {
    run(|| {
        let mut g = inited()?;
        nonnull(event)?;
        crate::driver::Inner::check_event_flags(flags)?;
        let h = g.event_create()?;
        g.event_created(h, flags);
        // SAFETY: checked non-NULL; C contract.
        unsafe { put(event, h as Handle) };
        Ok(())
    })
}

fn event_record(event: Handle, stream: CUstream, ptsz: bool) -> CUresult {
    run(|| inited()?.event_record(event as u64, stream as u64, ptsz))
}

#[no_mangle]
pub unsafe extern "C" fn cuEventRecord(event: Handle, stream: CUstream) -> CUresult {
    event_record(event, stream, false)
}

#[no_mangle]
pub unsafe extern "C" fn cuEventRecord_ptsz(event: Handle, stream: CUstream) -> CUresult {
    event_record(event, stream, true)
}

fn event_record_flags(event: Handle, stream: CUstream, flags: c_uint, ptsz: bool) -> CUresult {
    if flags & !CU_EVENT_RECORD_EXTERNAL != 0 {
        return run(|| {
            drop(inited()?);
            Err(CUDA_ERROR_INVALID_VALUE)
        });
    }
    event_record(event, stream, ptsz)
}

#[no_mangle]
pub unsafe extern "C" fn cuEventRecordWithFlags(
    event: Handle,
    stream: CUstream,
    flags: c_uint,
) -> CUresult {
    event_record_flags(event, stream, flags, false)
}

#[no_mangle]
pub unsafe extern "C" fn cuEventRecordWithFlags_ptsz(
    event: Handle,
    stream: CUstream,
    flags: c_uint,
) -> CUresult {
    event_record_flags(event, stream, flags, true)
}

fn stream_wait_event(stream: CUstream, event: Handle, flags: c_uint, ptsz: bool) -> CUresult {
    run(|| {
        let mut g = inited()?;
        if flags & !CU_EVENT_WAIT_EXTERNAL != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        g.stream_wait_event(stream as u64, event as u64, ptsz)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamWaitEvent(
    stream: CUstream,
    event: Handle,
    flags: c_uint,
) -> CUresult {
    stream_wait_event(stream, event, flags, false)
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamWaitEvent_ptsz(
    stream: CUstream,
    event: Handle,
    flags: c_uint,
) -> CUresult {
    stream_wait_event(stream, event, flags, true)
}

#[no_mangle]
pub unsafe extern "C" fn cuEventQuery(event: Handle) -> CUresult {
    run(|| {
        let mut g = inited()?;
        match g.event_done_at(event as u64)? {
            Some(t) if t > fake_state::now_ns() => Err(CUDA_ERROR_NOT_READY),
            _ => Ok(()),
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuEventSynchronize(event: Handle) -> CUresult {
    run(|| {
        let mut g = inited()?;
        // An open event's instant can only move later while we sleep: wait until it holds.
        while let Some(t) = g.event_done_at(event as u64)? {
            if t <= fake_state::now_ns() {
                break;
            }
            g = wait_until(g, Some(t))?;
        }
        g.pools_release_at_sync();
        Ok(())
    })
}

fn event_elapsed(ms: *mut f32, start: Handle, end: Handle) -> CUresult {
    run(|| {
        let mut g = inited()?;
        nonnull(ms)?;
        let v = g.event_elapsed_ms(start as u64, end as u64)?;
        // SAFETY: checked non-NULL; C contract.
        unsafe { put(ms, v) };
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuEventElapsedTime(ms: *mut f32, start: Handle, end: Handle) -> CUresult {
    event_elapsed(ms, start, end)
}

#[no_mangle]
pub unsafe extern "C" fn cuEventElapsedTime_v2(
    ms: *mut f32,
    start: Handle,
    end: Handle,
) -> CUresult {
    event_elapsed(ms, start, end)
}

#[no_mangle]
pub unsafe extern "C" fn cuEventDestroy_v2(event: Handle) -> CUresult {
    run(|| {
        let mut g = inited()?;
        g.event_destroy(event as u64)?;
        g.clock_event_destroyed(event as u64);
        Ok(())
    })
}

fn is_capturing(stream: CUstream, status: *mut c_int) -> CUresult {
    run(|| {
        let g = inited()?;
        nonnull(status)?;
        g.check_stream(stream as u64)?;
        // CU_STREAM_CAPTURE_STATUS_ACTIVE (1) or _NONE (0).
        let st = g.is_capturing(stream as u64) as c_int;
        // SAFETY: checked non-NULL; C contract.
        unsafe { put(status, st) };
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamBeginCapture_v2(stream: CUstream, mode: c_int) -> CUresult {
    run(|| {
        let mut g = inited()?;
        if !(0..=2).contains(&mode) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        g.begin_capture(stream as u64)?;
        g.clock_capture_began(stream as u64);
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamEndCapture(stream: CUstream, graph: *mut Handle) -> CUresult {
    run(|| {
        let mut g = inited()?;
        nonnull(graph)?;
        let h = g.end_capture(stream as u64)?;
        g.clock_capture_ended(stream as u64, h);
        // SAFETY: checked non-NULL; C contract.
        unsafe { put(graph, h as Handle) };
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamIsCapturing(stream: CUstream, status: *mut c_int) -> CUresult {
    is_capturing(stream, status)
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamIsCapturing_ptsz(
    stream: CUstream,
    status: *mut c_int,
) -> CUresult {
    is_capturing(stream, status)
}
