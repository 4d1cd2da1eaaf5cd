//! The launch gate's FFI side: the real driver's events and capture state
//! ([`RealGateDriver`], the gate's [`Driver`]) and `CLOCK_MONOTONIC` ([`RealClock`]).

use super::driver::{Clock, Driver, Query};
use crate::ffi::cuda::*;
use crate::ffi::symbols::{self, Cu};
use std::ffi::c_int;

/// The real driver's events and capture state.
pub struct RealGateDriver;

impl Driver for RealGateDriver {
    fn capturing(&self, stream: usize, ptsz: bool) -> bool {
        let sym = if ptsz {
            Cu::cuStreamIsCapturing_ptsz
        } else {
            Cu::cuStreamIsCapturing
        };
        // SAFETY: documented type.
        let Some(f) = (unsafe { symbols::cu::<FnStreamIsCapturing>(sym) }) else {
            return false;
        };
        let mut status: c_int = 0;
        // SAFETY: the application's stream; valid out pointer.
        (unsafe { f(stream as CUstream, &mut status) }) == CUDA_SUCCESS && status != 0
    }

    fn create_event(&self) -> Option<usize> {
        // SAFETY: documented type.
        let f = unsafe { symbols::cu::<FnEventCreate>(Cu::cuEventCreate) }?;
        let mut ev: CUevent = std::ptr::null_mut();
        // SAFETY: valid out pointer.
        (unsafe { f(&mut ev, CU_EVENT_DEFAULT) } == CUDA_SUCCESS && !ev.is_null())
            .then_some(ev as usize)
    }

    fn destroy_event(&self, ev: usize) {
        // SAFETY: documented type; an event this gate created.
        if let Some(f) = unsafe { symbols::cu::<FnEventDestroy>(Cu::cuEventDestroy_v2) } {
            // SAFETY: as above.
            unsafe { f(ev as CUevent) };
        }
    }

    fn record(&self, ev: usize, stream: usize, ptsz: bool) -> bool {
        let sym = if ptsz {
            Cu::cuEventRecord_ptsz
        } else {
            Cu::cuEventRecord
        };
        // SAFETY: documented type.
        let Some(f) = (unsafe { symbols::cu::<FnEventRecord>(sym) }) else {
            return false;
        };
        // SAFETY: an event this gate created; the application's stream.
        unsafe { f(ev as CUevent, stream as CUstream) == CUDA_SUCCESS }
    }

    fn query(&self, ev: usize) -> Query {
        // SAFETY: documented type.
        let Some(f) = (unsafe { symbols::cu::<FnEventQuery>(Cu::cuEventQuery) }) else {
            return Query::Failed;
        };
        // SAFETY: an event this gate created.
        match unsafe { f(ev as CUevent) } {
            CUDA_SUCCESS => Query::Done,
            CUDA_ERROR_NOT_READY => Query::Pending,
            _ => Query::Failed,
        }
    }

    fn elapsed_ns(&self, start: usize, end: usize) -> Option<u64> {
        // SAFETY: documented type (both versions have it).
        let f = unsafe { symbols::cu::<FnEventElapsedTime>(Cu::cuEventElapsedTime_v2) }
            // SAFETY: as above.
            .or_else(|| unsafe { symbols::cu::<FnEventElapsedTime>(Cu::cuEventElapsedTime) })?;
        let mut ms: f32 = 0.0;
        // SAFETY: events this gate created; valid out pointer.
        if unsafe { f(&mut ms, start as CUevent, end as CUevent) } != CUDA_SUCCESS {
            return None;
        }
        (ms.is_finite() && ms >= 0.0).then(|| (f64::from(ms) * 1e6) as u64)
    }

    fn elapsed_signed_ns(&self, start: usize, end: usize) -> Option<i64> {
        // SAFETY: documented type (both versions have it).
        let f = unsafe { symbols::cu::<FnEventElapsedTime>(Cu::cuEventElapsedTime_v2) }
            // SAFETY: as above.
            .or_else(|| unsafe { symbols::cu::<FnEventElapsedTime>(Cu::cuEventElapsedTime) })?;
        let mut ms: f32 = 0.0;
        // SAFETY: events this gate created; valid out pointer.
        if unsafe { f(&mut ms, start as CUevent, end as CUevent) } != CUDA_SUCCESS {
            return None;
        }
        ms.is_finite().then(|| (f64::from(ms) * 1e6) as i64)
    }

    fn relaxed(&self, f: &mut dyn FnMut()) {
        // SAFETY: documented type.
        let Some(x) = (unsafe {
            symbols::cu::<FnThreadExchangeStreamCaptureMode>(Cu::cuThreadExchangeStreamCaptureMode)
        }) else {
            return f();
        };
        let mut mode = CU_STREAM_CAPTURE_MODE_RELAXED;
        // SAFETY: valid in/out pointer.
        let swapped = unsafe { x(&mut mode) } == CUDA_SUCCESS;
        f();
        if swapped {
            // SAFETY: as above; restores the thread's previous mode.
            unsafe { x(&mut mode) };
        }
    }
}

/// `CLOCK_MONOTONIC` and `nanosleep`.
pub struct RealClock;

impl Clock for RealClock {
    fn now_ns(&self) -> u64 {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: valid out pointer.
        unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
        ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
    }

    fn sleep_ns(&self, ns: u64) {
        std::thread::sleep(std::time::Duration::from_nanos(ns));
    }
}
