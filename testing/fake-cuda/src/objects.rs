//! Exports for stream-ordered pools (attributes, trimming, current pool), mipmapped arrays,
//! modules and libraries with `__device__` globals, kernel launches, events and stream
//! capture (begin, end, query). Semantics in `driver/`; see `docs/fake-driver.md`.

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};

use crate::driver::{image_globals, image_kernel_time, inited, submit, wait_until, KernelTime, R};
use crate::ffi::*;
use crate::{nonnull, put, run};

/// `CUmipmappedArray`, `CUmodule`, `CUlibrary`, `CUfunction`, `CUkernel`, `CUevent`: opaque.
type Handle = *mut c_void;

// ---------------------------------------------------------------------------------------------
// Pools

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetMemPool(pool: *mut CUmemoryPool, dev: CUdevice) -> CUresult {
    run(|| {
        let mut g = inited()?;
        nonnull(pool)?;
        let h = g.current_pool(dev)?;
        // SAFETY: checked non-NULL; C contract.
        unsafe { put(pool, h as CUmemoryPool) };
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceSetMemPool(dev: CUdevice, pool: CUmemoryPool) -> CUresult {
    run(|| inited()?.set_current_pool(dev, pool as u64))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemPoolTrimTo(pool: CUmemoryPool, min_bytes_to_keep: usize) -> CUresult {
    run(|| inited()?.pool_trim(pool as u64, min_bytes_to_keep as u64))
}

/// Attributes 1-3 are `int`, 4-8 `cuuint64_t`.
fn attr_is_int(attr: c_int) -> bool {
    (1..=3).contains(&attr)
}

#[no_mangle]
pub unsafe extern "C" fn cuMemPoolGetAttribute(
    pool: CUmemoryPool,
    attr: c_int,
    value: *mut c_void,
) -> CUresult {
    run(|| {
        let g = inited()?;
        nonnull(value)?;
        let v = g.pool_get_attr(pool as u64, attr)?;
        // SAFETY: checked non-NULL; the attribute's documented type (C contract).
        unsafe {
            if attr_is_int(attr) {
                put(value as *mut c_int, v as c_int);
            } else {
                put(value as *mut u64, v);
            }
        }
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemPoolSetAttribute(
    pool: CUmemoryPool,
    attr: c_int,
    value: *mut c_void,
) -> CUresult {
    run(|| {
        let mut g = inited()?;
        nonnull(value)?;
        // SAFETY: checked non-NULL; the attribute's documented type (C contract).
        let v = unsafe {
            if attr_is_int(attr) {
                (value as *const c_int).read_unaligned() as u64
            } else {
                (value as *const u64).read_unaligned()
            }
        };
        g.pool_set_attr(pool as u64, attr, v)
    })
}

// ---------------------------------------------------------------------------------------------
// Mipmapped arrays

/// Bytes of every level of a mipmapped array (each level halves every dimension, down to 1;
/// the layers of a layered array stay). Sparse and deferred-mapping arrays have no memory
/// of their own.
fn mipmap_bytes(d: &CUDA_ARRAY3D_DESCRIPTOR, levels: c_uint) -> R<u64> {
    let per = format_bytes(d.format).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    if d.width == 0 || !matches!(d.num_channels, 1 | 2 | 4) || levels == 0 || levels > 32 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let mut total: u64 = 0;
    for l in 0..levels {
        let dim = |v: usize| ((v as u64) >> l).max(1);
        // CUDA_ARRAY3D_LAYERED: the depth is a layer count, the same at every level.
        let depth = if d.flags & 1 != 0 {
            (d.depth as u64).max(1)
        } else {
            dim(d.depth)
        };
        let level = dim(d.width)
            .checked_mul(dim(d.height))
            .and_then(|x| x.checked_mul(depth))
            .and_then(|x| x.checked_mul(per * d.num_channels as u64))
            .ok_or(CUDA_ERROR_OUT_OF_MEMORY)?;
        total = total.checked_add(level).ok_or(CUDA_ERROR_OUT_OF_MEMORY)?;
    }
    Ok(total)
}

#[no_mangle]
pub unsafe extern "C" fn cuMipmappedArrayCreate(
    handle: *mut Handle,
    desc: *const CUDA_ARRAY3D_DESCRIPTOR,
    num_levels: c_uint,
) -> CUresult {
    run(|| {
        let mut g = inited()?;
        nonnull(handle)?;
        nonnull(desc)?;
        // SAFETY: checked non-NULL; C contract.
        let d = unsafe { desc.read_unaligned() };
        if d.depth > 0 && d.height == 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let mut bytes = mipmap_bytes(&d, num_levels)?;
        if d.flags & (0x40 | 0x80) != 0 {
            bytes = 0;
        }
        let h = g.mipmap_create(bytes)?;
        // SAFETY: checked non-NULL; C contract.
        unsafe { put(handle, h as Handle) };
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMipmappedArrayDestroy(h: Handle) -> CUresult {
    run(|| {
        crate::driver::release_delay();
        inited()?.mipmap_destroy(h as u64)
    })
}

// ---------------------------------------------------------------------------------------------
// Modules and libraries

/// The bytes of an in-memory image, up to its first NUL (at most 4 KiB: enough for the
/// fake's `FAKECUBIN` header; real images are binary and have no globals here).
///
/// # Safety
/// `p` points to a readable image (C contract), NUL-terminated or at least 4 KiB long.
unsafe fn image_prefix(p: *const c_void) -> Vec<u8> {
    let mut out = Vec::new();
    let b = p as *const u8;
    for i in 0..4096 {
        // SAFETY: per this function's contract.
        let c = unsafe { *b.add(i) };
        if c == 0 {
            break;
        }
        out.push(c);
    }
    out
}

/// Globals declared by an in-memory image.
///
/// # Safety
/// As [`image_prefix`].
unsafe fn globals_of_image(image: *const c_void) -> R<u64> {
    nonnull(image)?;
    // SAFETY: forwarded contract.
    image_globals(&unsafe { image_prefix(image) }).ok_or(CUDA_ERROR_INVALID_IMAGE)
}

/// Globals declared by an image file.
fn globals_of_file(fname: *const c_char) -> R<u64> {
    nonnull(fname)?;
    // SAFETY: checked non-NULL; a NUL-terminated path (C contract).
    let path = unsafe { CStr::from_ptr(fname) }
        .to_string_lossy()
        .into_owned();
    let bytes = std::fs::read(&path).map_err(|_| CUDA_ERROR_FILE_NOT_FOUND)?;
    let head = &bytes[..bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len())];
    image_globals(head).ok_or(CUDA_ERROR_INVALID_IMAGE)
}

/// Kernel duration declared by an in-memory image (its `ns=` key).
///
/// # Safety
/// As [`image_prefix`].
unsafe fn time_of_image(image: *const c_void) -> R<KernelTime> {
    nonnull(image)?;
    // SAFETY: forwarded contract.
    image_kernel_time(&unsafe { image_prefix(image) }).ok_or(CUDA_ERROR_INVALID_IMAGE)
}

/// Kernel duration declared by an image file (its `ns=` key).
fn time_of_file(fname: *const c_char) -> R<KernelTime> {
    nonnull(fname)?;
    // SAFETY: checked non-NULL; a NUL-terminated path (C contract).
    let path = unsafe { CStr::from_ptr(fname) }
        .to_string_lossy()
        .into_owned();
    let bytes = std::fs::read(&path).map_err(|_| CUDA_ERROR_FILE_NOT_FOUND)?;
    let head = &bytes[..bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len())];
    image_kernel_time(head).ok_or(CUDA_ERROR_INVALID_IMAGE)
}

fn load(
    out: *mut Handle,
    globals: impl FnOnce() -> R<u64>,
    time: impl FnOnce() -> R<KernelTime>,
    library: bool,
) -> CUresult {
    run(|| {
        let mut g = inited()?;
        nonnull(out)?;
        let globals = globals()?;
        let time = time()?;
        let h = g.module_load(globals, library)?;
        g.set_module_time(h, time);
        // SAFETY: checked non-NULL; C contract.
        unsafe { put(out, h as Handle) };
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuModuleLoad(module: *mut Handle, fname: *const c_char) -> CUresult {
    load(
        module,
        || globals_of_file(fname),
        || time_of_file(fname),
        false,
    )
}

#[no_mangle]
pub unsafe extern "C" fn cuModuleLoadData(module: *mut Handle, image: *const c_void) -> CUresult {
    // SAFETY: C contract.
    load(
        module,
        || unsafe { globals_of_image(image) },
        // SAFETY: C contract.
        || unsafe { time_of_image(image) },
        false,
    )
}

#[no_mangle]
pub unsafe extern "C" fn cuModuleLoadDataEx(
    module: *mut Handle,
    image: *const c_void,
    num_options: c_uint,
    options: *mut c_int,
    values: *mut *mut c_void,
) -> CUresult {
    if num_options > 0 && (options.is_null() || values.is_null()) {
        return run(|| {
            drop(inited()?);
            Err(CUDA_ERROR_INVALID_VALUE)
        });
    }
    // SAFETY: C contract.
    load(
        module,
        || unsafe { globals_of_image(image) },
        // SAFETY: C contract.
        || unsafe { time_of_image(image) },
        false,
    )
}

#[no_mangle]
pub unsafe extern "C" fn cuModuleLoadFatBinary(
    module: *mut Handle,
    fat_cubin: *const c_void,
) -> CUresult {
    // SAFETY: C contract.
    load(
        module,
        || unsafe { globals_of_image(fat_cubin) },
        // SAFETY: C contract.
        || unsafe { time_of_image(fat_cubin) },
        false,
    )
}

#[no_mangle]
pub unsafe extern "C" fn cuModuleUnload(module: Handle) -> CUresult {
    run(|| {
        crate::driver::release_delay();
        inited()?.module_unload(module as u64, false)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuModuleGetFunction(
    hfunc: *mut Handle,
    module: Handle,
    name: *const c_char,
) -> CUresult {
    run(|| {
        let mut g = inited()?;
        nonnull(hfunc)?;
        nonnull(name)?;
        let f = g.module_get_function(module as u64)?;
        // SAFETY: checked non-NULL; C contract.
        unsafe { put(hfunc, f as Handle) };
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuLibraryLoadData(
    library: *mut Handle,
    code: *const c_void,
    _jit_options: *mut c_int,
    _jit_values: *mut *mut c_void,
    _num_jit: c_uint,
    _lib_options: *mut c_int,
    _lib_values: *mut *mut c_void,
    _num_lib: c_uint,
) -> CUresult {
    // SAFETY: C contract.
    load(
        library,
        || unsafe { globals_of_image(code) },
        // SAFETY: C contract.
        || unsafe { time_of_image(code) },
        true,
    )
}

#[no_mangle]
pub unsafe extern "C" fn cuLibraryLoadFromFile(
    library: *mut Handle,
    fname: *const c_char,
    _jit_options: *mut c_int,
    _jit_values: *mut *mut c_void,
    _num_jit: c_uint,
    _lib_options: *mut c_int,
    _lib_values: *mut *mut c_void,
    _num_lib: c_uint,
) -> CUresult {
    load(
        library,
        || globals_of_file(fname),
        || time_of_file(fname),
        true,
    )
}

#[no_mangle]
pub unsafe extern "C" fn cuLibraryUnload(library: Handle) -> CUresult {
    run(|| {
        crate::driver::release_delay();
        inited()?.module_unload(library as u64, true)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuLibraryGetKernel(
    kernel: *mut Handle,
    library: Handle,
    name: *const c_char,
) -> CUresult {
    run(|| {
        let mut g = inited()?;
        nonnull(kernel)?;
        nonnull(name)?;
        let k = g.library_get_kernel(library as u64)?;
        // SAFETY: checked non-NULL; C contract.
        unsafe { put(kernel, k as Handle) };
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuKernelGetFunction(func: *mut Handle, kernel: Handle) -> CUresult {
    run(|| {
        let mut g = inited()?;
        nonnull(func)?;
        let f = g.kernel_get_function(kernel as u64)?;
        // SAFETY: checked non-NULL; C contract.
        unsafe { put(func, f as Handle) };
        Ok(())
    })
}

/// `CU_LAUNCH_PARAM_BUFFER_POINTER` in a launch's `extra` list.
const CU_LAUNCH_PARAM_BUFFER_POINTER: usize = 1;
/// `CU_LAUNCH_PARAM_END`.
const CU_LAUNCH_PARAM_END: usize = 0;

/// The first kernel parameter of a launch read as a `u64`: `*params[0]`, or the first 8 bytes
/// of the `CU_LAUNCH_PARAM_BUFFER_POINTER` buffer of `extra`. `None` if neither is given.
///
/// # Safety
/// `params` and `extra` follow `cuLaunchKernel`'s contract: NULL, or `params[0]` points to
/// the first argument (at least 8 readable bytes for an `ns=param` kernel), and `extra` is a
/// `CU_LAUNCH_PARAM_END`-terminated list of (key, value) pointers.
unsafe fn first_param_u64(params: *mut *mut c_void, extra: *mut *mut c_void) -> Option<u64> {
    if !params.is_null() {
        // SAFETY: per this function's contract.
        let p0 = unsafe { *params };
        // SAFETY: per this function's contract.
        return (!p0.is_null()).then(|| unsafe { (p0 as *const u64).read_unaligned() });
    }
    if extra.is_null() {
        return None;
    }
    for i in (0..64).step_by(2) {
        // SAFETY: a terminated (key, value) list (contract); at most 32 pairs are read.
        let key = unsafe { *extra.add(i) } as usize;
        if key == CU_LAUNCH_PARAM_END {
            return None;
        }
        if key == CU_LAUNCH_PARAM_BUFFER_POINTER {
            // SAFETY: as above; the value is the argument buffer.
            let buf = unsafe { *extra.add(i + 1) };
            // SAFETY: the buffer holds the arguments (contract).
            return (!buf.is_null()).then(|| unsafe { (buf as *const u64).read_unaligned() });
        }
    }
    None
}

/// Every kernel launch: the function's module is loaded if needed, then the kernel takes its
/// duration (`ns=` of its image, or `FAKE_CUDA_KERNEL_NS`) on the device clock, queued on
/// `stream` (`ptsz`: reached through a `_ptsz` entry point).
fn launch(
    f: Handle,
    stream: CUstream,
    ptsz: bool,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    run(|| {
        let mut g = inited()?;
        g.check_stream(stream as u64)?;
        g.launch(f as u64)?;
        // SAFETY: the launch's C contract (see first_param_u64).
        let ns = g.kernel_ns(f as u64, || unsafe { first_param_u64(params, extra) });
        submit(g, stream as u64, ptsz, ns)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuLaunchKernel(
    f: Handle,
    _gx: c_uint,
    _gy: c_uint,
    _gz: c_uint,
    _bx: c_uint,
    _by: c_uint,
    _bz: c_uint,
    _shared: c_uint,
    stream: CUstream,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    launch(f, stream, false, params, extra)
}

#[no_mangle]
pub unsafe extern "C" fn cuLaunchKernel_ptsz(
    f: Handle,
    _gx: c_uint,
    _gy: c_uint,
    _gz: c_uint,
    _bx: c_uint,
    _by: c_uint,
    _bz: c_uint,
    _shared: c_uint,
    stream: CUstream,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    launch(f, stream, true, params, extra)
}

#[no_mangle]
pub unsafe extern "C" fn cuLaunchCooperativeKernel(
    f: Handle,
    _gx: c_uint,
    _gy: c_uint,
    _gz: c_uint,
    _bx: c_uint,
    _by: c_uint,
    _bz: c_uint,
    _shared: c_uint,
    stream: CUstream,
    params: *mut *mut c_void,
) -> CUresult {
    launch(f, stream, false, params, std::ptr::null_mut())
}

#[no_mangle]
pub unsafe extern "C" fn cuLaunchCooperativeKernel_ptsz(
    f: Handle,
    _gx: c_uint,
    _gy: c_uint,
    _gz: c_uint,
    _bx: c_uint,
    _by: c_uint,
    _bz: c_uint,
    _shared: c_uint,
    stream: CUstream,
    params: *mut *mut c_void,
) -> CUresult {
    launch(f, stream, true, params, std::ptr::null_mut())
}

/// Leading fields of `CUlaunchConfig` (grid, block, shared memory, stream).
#[repr(C)]
pub struct CUlaunchConfigHead {
    /// gridDimX..blockDimZ, sharedMemBytes.
    pub dims: [c_uint; 7],
    /// hStream.
    pub stream: CUstream,
}

fn launch_ex(
    config: *const CUlaunchConfigHead,
    f: Handle,
    ptsz: bool,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    if config.is_null() {
        return run(|| {
            drop(inited()?);
            Err(CUDA_ERROR_INVALID_VALUE)
        });
    }
    // SAFETY: checked non-NULL; C contract.
    let stream = unsafe { (*config).stream };
    launch(f, stream, ptsz, params, extra)
}

#[no_mangle]
pub unsafe extern "C" fn cuLaunchKernelEx(
    config: *const CUlaunchConfigHead,
    f: Handle,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    launch_ex(config, f, false, params, extra)
}

#[no_mangle]
pub unsafe extern "C" fn cuLaunchKernelEx_ptsz(
    config: *const CUlaunchConfigHead,
    f: Handle,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    launch_ex(config, f, true, params, extra)
}

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
