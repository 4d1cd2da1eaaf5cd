//! Stream exports: stream-ordered allocation and memory pools, streams and their
//! synchronisation.

use std::ffi::c_uint;

use crate::driver::clock::wait_until;
use crate::driver::{inited, Kind};
use crate::ffi::*;

// ---------------------------------------------------------------------------------------------
// Stream-ordered allocation and pools

fn alloc_async(
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    pool: Option<CUmemoryPool>,
    stream: CUstream,
) -> CUresult {
    run(|| {
        let mut g = inited()?;
        nonnull(dptr)?;
        let pool = match pool {
            Some(p) => {
                g.pool_ordinal(p as u64)?;
                p as u64
            }
            None => {
                let (_, c) = g.current()?;
                g.current_pool(c.ordinal as CUdevice)?
            }
        };
        g.check_stream(stream as u64)?;
        // A zero-byte stream-ordered allocation succeeds on the real driver. During capture
        // the memory comes from the graph's pool: charged by itself (the H200 showed it
        // allocated at capture), given back at the captured free.
        let p = if bytesize == 0 {
            0
        } else if g.is_capturing(stream as u64) {
            g.alloc(bytesize as u64, bytesize as u64, Kind::Async, None)?
        } else {
            g.pool_alloc(pool, bytesize as u64)?
        };
        // SAFETY: checked non-NULL; C contract.
        unsafe { put(dptr, p) };
        Ok(())
    })
}

fn free_async(dptr: CUdeviceptr, stream: CUstream) -> CUresult {
    run(|| {
        let mut g = inited()?;
        g.check_stream(stream as u64)?;
        g.free(dptr)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAllocAsync(
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    stream: CUstream,
) -> CUresult {
    alloc_async(dptr, bytesize, None, stream)
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAllocAsync_ptsz(
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    stream: CUstream,
) -> CUresult {
    alloc_async(dptr, bytesize, None, stream)
}

#[no_mangle]
pub unsafe extern "C" fn cuMemFreeAsync(dptr: CUdeviceptr, stream: CUstream) -> CUresult {
    free_async(dptr, stream)
}

#[no_mangle]
pub unsafe extern "C" fn cuMemFreeAsync_ptsz(dptr: CUdeviceptr, stream: CUstream) -> CUresult {
    free_async(dptr, stream)
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAllocFromPoolAsync(
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    pool: CUmemoryPool,
    stream: CUstream,
) -> CUresult {
    alloc_async(dptr, bytesize, Some(pool), stream)
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAllocFromPoolAsync_ptsz(
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    pool: CUmemoryPool,
    stream: CUstream,
) -> CUresult {
    alloc_async(dptr, bytesize, Some(pool), stream)
}

pub(crate) fn location_ordinal(loc: &CUmemLocation) -> R<CUdevice> {
    if loc.type_ != CU_MEM_LOCATION_TYPE_DEVICE {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    Ok(loc.id)
}

#[no_mangle]
pub unsafe extern "C" fn cuMemPoolCreate(
    pool: *mut CUmemoryPool,
    props: *const CUmemPoolPropsHead,
) -> CUresult {
    run(|| {
        let mut g = inited()?;
        nonnull(pool)?;
        nonnull(props)?;
        // SAFETY: checked non-NULL; C contract.
        let p = unsafe { props.read_unaligned() };
        if p.alloc_type != CU_MEM_ALLOCATION_TYPE_PINNED {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let ord = location_ordinal(&p.location)?;
        let h = g.pool_create(ord).map_err(|_| CUDA_ERROR_INVALID_VALUE)?;
        // SAFETY: checked non-NULL; C contract.
        unsafe { put(pool, h as CUmemoryPool) };
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemPoolDestroy(pool: CUmemoryPool) -> CUresult {
    run(|| inited()?.pool_destroy(pool as u64))
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetDefaultMemPool(
    pool: *mut CUmemoryPool,
    dev: CUdevice,
) -> CUresult {
    run(|| {
        let mut g = inited()?;
        nonnull(pool)?;
        let h = g.default_pool(dev)?;
        // SAFETY: checked non-NULL; C contract.
        unsafe { put(pool, h as CUmemoryPool) };
        Ok(())
    })
}

// ---------------------------------------------------------------------------------------------
// Streams and modules

#[no_mangle]
pub unsafe extern "C" fn cuStreamCreate(ph: *mut CUstream, flags: c_uint) -> CUresult {
    run(|| {
        let mut g = inited()?;
        nonnull(ph)?;
        if flags > 1 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let s = g.stream_create()?;
        // SAFETY: checked non-NULL; C contract.
        unsafe { put(ph, s as CUstream) };
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamDestroy(h: CUstream) -> CUresult {
    stream_destroy(h)
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamDestroy_v2(h: CUstream) -> CUresult {
    stream_destroy(h)
}

fn stream_destroy(h: CUstream) -> CUresult {
    run(|| {
        let mut g = inited()?;
        g.stream_destroy(h as u64)?;
        g.clock_stream_destroyed(h as u64);
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamSynchronize(h: CUstream) -> CUresult {
    stream_sync(h, false)
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamSynchronize_ptsz(h: CUstream) -> CUresult {
    stream_sync(h, true)
}

/// Sleeps until the stream's work has completed on the device clock.
fn stream_sync(h: CUstream, ptsz: bool) -> CUresult {
    run(|| {
        let g = inited()?;
        g.check_stream(h as u64)?;
        if g.is_capturing(h as u64) {
            return Err(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
        }
        let at = g.stream_done_at(h as u64, ptsz)?;
        let mut g = wait_until(g, Some(at))?;
        g.pools_release_at_sync();
        Ok(())
    })
}

fn stream_query(h: CUstream, ptsz: bool) -> CUresult {
    run(|| {
        let g = inited()?;
        g.check_stream(h as u64)?;
        if g.is_capturing(h as u64) {
            return Err(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
        }
        if g.stream_done_at(h as u64, ptsz)? > fake_state::now_ns() {
            return Err(CUDA_ERROR_NOT_READY);
        }
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamQuery(h: CUstream) -> CUresult {
    stream_query(h, false)
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamQuery_ptsz(h: CUstream) -> CUresult {
    stream_query(h, true)
}
