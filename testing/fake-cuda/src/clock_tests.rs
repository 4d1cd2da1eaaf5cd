//! In-process tests of the device clock through the exported C functions: the per-thread
//! stream of the `_ptsz` entry points, launch parameters given through `extra`, and the
//! events' error codes. (One test: the driver's state is per process.)

use std::ffi::c_void;
use std::ptr::null_mut;
use std::time::Instant;

use crate::ffi::*;
use crate::*;

fn ok(rc: CUresult) {
    assert_eq!(rc, CUDA_SUCCESS);
}

/// Makes the primary context of device 0 current on this thread.
unsafe fn ctx() {
    let mut c: CUcontext = null_mut();
    // SAFETY: valid out-pointer.
    ok(unsafe { cuDevicePrimaryCtxRetain(&mut c, 0) });
    // SAFETY: a context handle from the driver.
    ok(unsafe { cuCtxSetCurrent(c) });
}

#[test]
fn per_thread_streams_extra_parameters_and_event_errors() {
    let dir = std::env::temp_dir().join(format!("fake-cuda-clock-{}", std::process::id()));
    std::env::set_var("FAKE_CUDA_STATE", &dir);
    std::env::set_var("FAKE_CUDA_CTX_OVERHEAD", "0");
    // SAFETY: every call below follows the C contract (valid out-pointers, driver handles).
    unsafe {
        ok(cuInit(0));
        ctx();
        let image = c"FAKECUBIN globals=0 ns=param";
        let mut m = null_mut();
        ok(cuModuleLoadData(&mut m, image.as_ptr() as *const c_void));
        let mut f = null_mut();
        ok(cuModuleGetFunction(&mut f, m, c"spin".as_ptr()));

        // 40 ms on this thread's per-thread stream (the NULL stream of a _ptsz call).
        let mut ns: u64 = 40_000_000;
        let mut args = [&mut ns as *mut u64 as *mut c_void];
        ok(cuLaunchKernel_ptsz(
            f,
            1,
            1,
            1,
            1,
            1,
            1,
            0,
            null_mut(),
            args.as_mut_ptr(),
            null_mut(),
        ));
        assert_eq!(cuStreamQuery_ptsz(null_mut()), CUDA_ERROR_NOT_READY);
        // The legacy NULL stream synchronises with the whole context.
        assert_eq!(cuStreamQuery(null_mut()), CUDA_ERROR_NOT_READY);
        // Another thread's per-thread stream has nothing queued.
        let other = std::thread::spawn(|| {
            ctx();
            cuStreamQuery_ptsz(CU_STREAM_PER_THREAD as CUstream)
        });
        assert_eq!(other.join().unwrap(), CUDA_SUCCESS);
        let t = Instant::now();
        ok(cuStreamSynchronize_ptsz(null_mut()));
        assert!(t.elapsed().as_millis() >= 30, "{:?}", t.elapsed());
        ok(cuStreamQuery(null_mut()));

        // The parameter through extra's CU_LAUNCH_PARAM_BUFFER_POINTER, on a created stream.
        let mut s: CUstream = null_mut();
        ok(cuStreamCreate(&mut s, 0));
        let mut buf: u64 = 30_000_000;
        let mut size: usize = 8;
        let mut extra = [
            std::ptr::without_provenance_mut(1), // CU_LAUNCH_PARAM_BUFFER_POINTER
            &mut buf as *mut u64 as *mut c_void,
            std::ptr::without_provenance_mut(2), // CU_LAUNCH_PARAM_BUFFER_SIZE
            &mut size as *mut usize as *mut c_void,
            null_mut(),
        ];
        let (mut e0, mut e1, mut nt) = (null_mut(), null_mut(), null_mut());
        ok(cuEventCreate(&mut e0, 0));
        ok(cuEventCreate(&mut e1, 1));
        ok(cuEventCreate(&mut nt, 2));
        ok(cuLaunchKernel(
            f,
            1,
            1,
            1,
            1,
            1,
            1,
            0,
            s,
            null_mut(),
            extra.as_mut_ptr(),
        ));
        ok(cuEventRecord(e0, s));
        ok(cuLaunchCooperativeKernel(
            f,
            1,
            1,
            1,
            1,
            1,
            1,
            0,
            s,
            args.as_mut_ptr(),
        ));
        ok(cuEventRecord(e1, s));
        ok(cuEventRecord(nt, s));
        let mut ms = 0f32;
        assert_eq!(cuEventElapsedTime(&mut ms, e0, e1), CUDA_ERROR_NOT_READY);
        assert_eq!(cuEventQuery(e1), CUDA_ERROR_NOT_READY);
        ok(cuEventSynchronize(e1));
        ok(cuEventElapsedTime_v2(&mut ms, e0, e1));
        assert!((ms - 40.0).abs() < 0.001, "{ms}");
        assert_eq!(
            cuEventElapsedTime(null_mut(), e0, e1),
            CUDA_ERROR_INVALID_VALUE
        );
        assert_eq!(
            cuEventElapsedTime(&mut ms, e0, nt),
            CUDA_ERROR_INVALID_HANDLE
        );
        assert_eq!(
            cuEventElapsedTime(&mut ms, e0, 0x1234 as *mut c_void),
            CUDA_ERROR_INVALID_HANDLE
        );
        assert_eq!(
            cuEventQuery(0x1234 as *mut c_void),
            CUDA_ERROR_INVALID_HANDLE
        );
        ok(cuEventDestroy_v2(e0));
        assert_eq!(
            cuEventElapsedTime(&mut ms, e0, e1),
            CUDA_ERROR_INVALID_HANDLE
        );
        ok(cuStreamQuery(s));
        ok(cuCtxSynchronize());

        // Markers: the device runs one thing at a time, other streams' work included.
        let mut s2: CUstream = null_mut();
        ok(cuStreamCreate(&mut s2, 0));
        let launch = |stream: CUstream, ms: u64| {
            let mut ns = ms * 1_000_000;
            let mut a = [&mut ns as *mut u64 as *mut c_void];
            ok(cuLaunchKernel(
                f,
                1,
                1,
                1,
                1,
                1,
                1,
                0,
                stream,
                a.as_mut_ptr(),
                null_mut(),
            ));
        };
        let elapsed = |a: *mut c_void, b: *mut c_void| {
            let mut ms = 0f32;
            ok(cuEventElapsedTime(&mut ms, a, b));
            ms
        };
        let (mut a, mut b, mut c) = (null_mut(), null_mut(), null_mut());
        ok(cuEventCreate(&mut a, 0));
        ok(cuEventCreate(&mut b, 0));
        ok(cuEventCreate(&mut c, 0));
        // An event recorded right after a kernel completes with it, even when the device
        // then runs other work (s2's 20 ms, queued behind it).
        ok(cuEventRecord(a, s));
        launch(s, 10);
        launch(s2, 20);
        ok(cuEventRecord(b, s));
        ok(cuEventSynchronize(b));
        // (a was recorded on an idle device: at once; the kernel started a moment later)
        let ms = elapsed(a, b);
        assert!((10.0..10.5).contains(&ms), "{ms}");
        // An event recorded before a kernel, on a stream with nothing queued, completes when
        // the device turns to that kernel: work submitted between the record and the launch
        // (s2's 5 ms) is not in the pair's time.
        launch(s2, 15);
        ok(cuEventRecord(a, s));
        launch(s2, 5);
        launch(s, 10);
        ok(cuEventRecord(b, s));
        ok(cuEventSynchronize(b));
        assert!((elapsed(a, b) - 10.0).abs() < 0.01, "{}", elapsed(a, b));
        // Consecutive events with another stream's kernel between: its time is included.
        launch(s, 10);
        ok(cuEventRecord(a, s));
        launch(s2, 5);
        launch(s, 10);
        ok(cuEventRecord(c, s));
        ok(cuCtxSynchronize());
        assert!((elapsed(a, c) - 15.0).abs() < 0.01, "{}", elapsed(a, c));

        // Re-recording events behind another stream's work, never launching after them,
        // keeps only the open ones listed.
        launch(s2, 30);
        for _ in 0..100 {
            ok(cuEventRecord(a, s));
            ok(cuEventRecord(b, s));
        }
        assert_eq!(crate::driver::inited().unwrap().open_marker_count(), 2);
        // Once fixed (b, synchronised) they drop out at the next open record; at most one
        // entry per event stays (a, never observed, and c).
        ok(cuEventSynchronize(b));
        launch(s2, 10);
        ok(cuEventRecord(c, s));
        assert_eq!(crate::driver::inited().unwrap().open_marker_count(), 2);
        ok(cuCtxSynchronize());

        // cuStreamWaitEvent: s waits for s2's 20 ms kernel; flags other than
        // CU_EVENT_WAIT_EXTERNAL are invalid, as are record flags other than
        // CU_EVENT_RECORD_EXTERNAL.
        launch(s2, 20);
        ok(cuEventRecordWithFlags(a, s2, 1));
        assert_eq!(cuEventRecordWithFlags(a, s2, 2), CUDA_ERROR_INVALID_VALUE);
        assert_eq!(cuStreamWaitEvent(s, a, 2), CUDA_ERROR_INVALID_VALUE);
        ok(cuStreamWaitEvent(s, a, 0));
        assert_eq!(cuStreamQuery(s), CUDA_ERROR_NOT_READY);
        let t = Instant::now();
        ok(cuStreamSynchronize(s));
        assert!(t.elapsed().as_millis() >= 15, "{:?}", t.elapsed());
    }
    let _ = std::fs::remove_file(&dir);
}
