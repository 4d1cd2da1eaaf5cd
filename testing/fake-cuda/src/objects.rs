//! Exports for stream-ordered pools (attributes, trimming, current pool), mipmapped arrays,
//! modules and libraries with `__device__` globals, and kernel launches (graphs, events and
//! stream capture are in `events.rs`). Semantics in `driver/`; see `docs/fake-driver.md`.

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};

use crate::driver::clock::submit;
use crate::driver::{image_globals, image_kernel_time, image_local, inited, KernelTime};
use crate::ffi::*;

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

/// Globals declared by an in-memory image: a real one (fatbin, wrapper, ELF cubin:
/// [`crate::image`]) or a `FAKECUBIN` text.
///
/// # Safety
/// As [`image_prefix`], or a real image whose headers tell its length.
unsafe fn globals_of_image(image: *const c_void) -> R<u64> {
    nonnull(image)?;
    // SAFETY: forwarded contract (a real image's headers tell its length).
    if let Some(g) = unsafe { crate::image::of_memory(image.cast()) } {
        return g.ok_or(CUDA_ERROR_INVALID_IMAGE);
    }
    // SAFETY: forwarded contract.
    image_globals(&unsafe { image_prefix(image) }).ok_or(CUDA_ERROR_INVALID_IMAGE)
}

/// Local memory per thread an in-memory image's kernels need (`local=`).
///
/// # Safety
/// As [`image_prefix`].
unsafe fn local_of_image(image: *const c_void) -> R<u64> {
    nonnull(image)?;
    // SAFETY: forwarded contract.
    image_local(&unsafe { image_prefix(image) }).ok_or(CUDA_ERROR_INVALID_IMAGE)
}

/// Globals declared by an image file (real or `FAKECUBIN`).
fn globals_of_file(fname: *const c_char) -> R<u64> {
    nonnull(fname)?;
    // SAFETY: checked non-NULL; a NUL-terminated path (C contract).
    let path = unsafe { CStr::from_ptr(fname) }
        .to_string_lossy()
        .into_owned();
    let bytes = std::fs::read(&path).map_err(|_| CUDA_ERROR_FILE_NOT_FOUND)?;
    if crate::image::is_real(&bytes) {
        return crate::image::globals(&bytes).ok_or(CUDA_ERROR_INVALID_IMAGE);
    }
    let head = &bytes[..bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len())];
    image_globals(head).ok_or(CUDA_ERROR_INVALID_IMAGE)
}

/// Local memory per thread an image file's kernels need (`local=`).
fn local_of_file(fname: *const c_char) -> R<u64> {
    nonnull(fname)?;
    // SAFETY: checked non-NULL; a NUL-terminated path (C contract).
    let path = unsafe { CStr::from_ptr(fname) }
        .to_string_lossy()
        .into_owned();
    let bytes = std::fs::read(&path).map_err(|_| CUDA_ERROR_FILE_NOT_FOUND)?;
    let head = &bytes[..bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len())];
    image_local(head).ok_or(CUDA_ERROR_INVALID_IMAGE)
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
    local: impl FnOnce() -> R<u64>,
    time: impl FnOnce() -> R<KernelTime>,
    library: bool,
) -> CUresult {
    run(|| {
        let mut g = inited()?;
        nonnull(out)?;
        let globals = globals()?;
        let time = time()?;
        let h = g.module_load(globals, local()?, library)?;
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
        || local_of_file(fname),
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
        || unsafe { local_of_image(image) },
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
        || unsafe { local_of_image(image) },
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
        || unsafe { local_of_image(fat_cubin) },
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
pub unsafe extern "C" fn cuModuleGetGlobal_v2(
    dptr: *mut CUdeviceptr,
    bytes: *mut usize,
    module: Handle,
    name: *const c_char,
) -> CUresult {
    run(|| {
        let mut g = inited()?;
        nonnull(name)?;
        let p = g.module_get_global(module as u64)?;
        put_global(dptr, bytes, p);
        Ok(())
    })
}

/// Writes a global's address and size (4 bytes) where asked (either may be NULL).
fn put_global(dptr: *mut CUdeviceptr, bytes: *mut usize, p: u64) {
    if !dptr.is_null() {
        // SAFETY: non-NULL; C contract.
        unsafe { put(dptr, p) };
    }
    if !bytes.is_null() {
        // SAFETY: non-NULL; C contract.
        unsafe { put(bytes, 4) };
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuLibraryGetGlobal(
    dptr: *mut CUdeviceptr,
    bytes: *mut usize,
    library: Handle,
    name: *const c_char,
) -> CUresult {
    run(|| {
        let mut g = inited()?;
        nonnull(name)?;
        let p = g.library_get_global(library as u64)?;
        put_global(dptr, bytes, p);
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuLibraryGetModule(module: *mut Handle, library: Handle) -> CUresult {
    run(|| {
        let mut g = inited()?;
        nonnull(module)?;
        let m = g.library_get_module(library as u64)?;
        // SAFETY: checked non-NULL; C contract.
        unsafe { put(module, m as Handle) };
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
        || unsafe { local_of_image(code) },
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
        || local_of_file(fname),
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

/// `CU_FUNC_ATTRIBUTE_*` values the fake answers for a function or kernel with `local`
/// bytes of local memory per thread (a compute capability 9.0 device); others:
/// `CUDA_ERROR_INVALID_VALUE`.
fn function_attribute(attrib: c_int, local: u64) -> R<c_int> {
    Ok(match attrib {
        0 => 1024,                                         // MAX_THREADS_PER_BLOCK
        1 => 0,                                            // SHARED_SIZE_BYTES
        2 => 0,                                            // CONST_SIZE_BYTES
        3 => c_int::try_from(local).unwrap_or(c_int::MAX), // LOCAL_SIZE_BYTES
        4 => 32,                                           // NUM_REGS
        5 | 6 => 90,                                       // PTX_VERSION, BINARY_VERSION
        7 => 0,                                            // CACHE_MODE_CA
        8 => 49_152,                                       // MAX_DYNAMIC_SHARED_SIZE_BYTES
        9 => -1,                                           // PREFERRED_SHARED_MEMORY_CARVEOUT
        10..=16 => 0, // CLUSTER_SIZE_MUST_BE_SET, REQUIRED_CLUSTER_*, NON_PORTABLE_..., SCHEDULING_POLICY
        _ => return Err(CUDA_ERROR_INVALID_VALUE),
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuFuncGetAttribute(
    pi: *mut c_int,
    attrib: c_int,
    hfunc: Handle,
) -> CUresult {
    run(|| {
        let g = inited()?;
        nonnull(pi)?;
        if g.is_kernel(hfunc as u64) {
            return Err(CUDA_ERROR_INVALID_HANDLE);
        }
        let v = function_attribute(attrib, g.function_local(hfunc as u64)?)?;
        // SAFETY: checked non-NULL; C contract.
        unsafe { put(pi, v) };
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuKernelGetAttribute(
    pi: *mut c_int,
    attrib: c_int,
    kernel: Handle,
    dev: CUdevice,
) -> CUresult {
    run(|| {
        let g = inited()?;
        nonnull(pi)?;
        g.phys_of(dev)?;
        if !g.is_kernel(kernel as u64) {
            return Err(CUDA_ERROR_INVALID_HANDLE);
        }
        let v = function_attribute(attrib, g.function_local(kernel as u64)?)?;
        // SAFETY: checked non-NULL; C contract.
        unsafe { put(pi, v) };
        Ok(())
    })
}

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
