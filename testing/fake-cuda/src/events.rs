//! Exports for graphs (instantiate, launch, destroy), events and stream capture (begin, end,
//! query), on the fake device clock. Semantics in `driver/`; see `docs/fake-driver.md`.

use std::ffi::{c_char, c_int, c_uint, c_void};

use crate::driver::{inited, submit, wait_until};
use crate::ffi::*;
use crate::{nonnull, put, run};

/// `CUgraph`, `CUgraphExec`, `CUevent`, `CUgraphNode`: opaque.
type Handle = *mut c_void;

// ---------------------------------------------------------------------------------------------
// Graphs (captured launches; a launch of the executable graph takes their total time)

fn graph_instantiate(exec: *mut Handle, graph: Handle) -> CUresult {
    run(|| {
        let mut g = inited()?;
        nonnull(exec)?;
        let h = g.graph_instantiate(graph as u64)?;
        // SAFETY: checked non-NULL; C contract.
        unsafe { put(exec, h as Handle) };
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphInstantiateWithFlags(
    exec: *mut Handle,
    graph: Handle,
    _flags: u64,
) -> CUresult {
    graph_instantiate(exec, graph)
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphInstantiate_v2(
    exec: *mut Handle,
    graph: Handle,
    _error_node: *mut Handle,
    _log: *mut c_char,
    _log_size: usize,
) -> CUresult {
    graph_instantiate(exec, graph)
}

fn graph_launch(exec: Handle, stream: CUstream, ptsz: bool) -> CUresult {
    run(|| {
        let g = inited()?;
        let ns = g.graph_exec_ns(exec as u64)?;
        g.check_stream(stream as u64)?;
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

/// `CU_EVENT_RECORD_EXTERNAL`, the one flag of `cuEventRecordWithFlags`.
const CU_EVENT_RECORD_EXTERNAL: c_uint = 1;

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

/// `CU_EVENT_WAIT_EXTERNAL`, the one flag of `cuStreamWaitEvent`.
const CU_EVENT_WAIT_EXTERNAL: c_uint = 1;

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
