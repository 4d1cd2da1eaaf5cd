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

/// The time unit of the test's kernels: 10 ms, coarse against the clock's resolution.
const UNIT: u64 = 10_000_000;

/// A blocker: work queued first so that everything submitted after it lies in the future,
/// on the device's schedule, until the blocker ends. Every outcome asserted below is
/// decided by the device schedule alone as long as the host is never late by this much
/// (a loaded CI machine delays a thread by milliseconds, not by a second), and none
/// depends on how fast the host is otherwise.
const BLOCK: u64 = 100 * UNIT;

#[test]
fn per_thread_streams_extra_parameters_and_event_errors() {
    let dir = std::env::temp_dir().join(format!("fake-cuda-clock-{}", std::process::id()));
    std::env::set_var("FAKE_CUDA_STATE", &dir);
    std::env::set_var("FAKE_CUDA_CTX_OVERHEAD", "0");
    // Every launch below returns at once (the default, 2 ms, would make launches wait for
    // the device and so tie the schedule to the host's timing).
    std::env::set_var("FAKE_CUDA_QUEUE_AHEAD", "10s");
    // SAFETY: every call below follows the C contract (valid out-pointers, driver handles).
    unsafe {
        ok(cuInit(0));
        ctx();
        let image = c"FAKECUBIN globals=0 ns=param";
        let mut m = null_mut();
        ok(cuModuleLoadData(&mut m, image.as_ptr() as *const c_void));
        let mut f = null_mut();
        ok(cuModuleGetFunction(&mut f, m, c"spin".as_ptr()));
        let launch = |stream: CUstream, ns: u64| {
            let mut ns = ns;
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
        let unit_ms = (UNIT / 1_000_000) as f32;

        // A blocker on this thread's per-thread stream (the NULL stream of a _ptsz call).
        let t = Instant::now();
        let mut ns: u64 = BLOCK;
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
        ok(cuStreamSynchronize_ptsz(null_mut()));
        // Nothing completes early: an exact lower bound, whatever the load.
        assert!(t.elapsed().as_nanos() >= BLOCK as u128, "{:?}", t.elapsed());
        ok(cuStreamQuery(null_mut()));

        // The parameter through extra's CU_LAUNCH_PARAM_BUFFER_POINTER, on a created stream,
        // behind a blocker on that stream (e0 completes with the blocker).
        let mut s: CUstream = null_mut();
        ok(cuStreamCreate(&mut s, 0));
        let mut buf: u64 = 3 * UNIT;
        let mut size: usize = 8;
        let mut extra = [
            std::ptr::without_provenance_mut(1), // CU_LAUNCH_PARAM_BUFFER_POINTER
            &mut buf as *mut u64 as *mut c_void,
            std::ptr::without_provenance_mut(2), // CU_LAUNCH_PARAM_BUFFER_SIZE
            &mut size as *mut usize as *mut c_void,
            null_mut(),
        ];
        let (mut e0, mut e1, mut e2, mut nt) = (null_mut(), null_mut(), null_mut(), null_mut());
        ok(cuEventCreate(&mut e0, 0));
        ok(cuEventCreate(&mut e1, 1));
        ok(cuEventCreate(&mut e2, 1));
        ok(cuEventCreate(&mut nt, 2));
        launch(s, BLOCK);
        ok(cuEventRecord(e0, s));
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
        ok(cuEventRecord(e1, s));
        let mut coop_ns: u64 = 4 * UNIT;
        let mut coop_args = [&mut coop_ns as *mut u64 as *mut c_void];
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
            coop_args.as_mut_ptr(),
        ));
        ok(cuEventRecord(e2, s));
        ok(cuEventRecord(nt, s));
        let mut ms = 0f32;
        assert_eq!(cuEventElapsedTime(&mut ms, e0, e2), CUDA_ERROR_NOT_READY);
        assert_eq!(cuEventQuery(e2), CUDA_ERROR_NOT_READY);
        ok(cuEventSynchronize(e2));
        ok(cuEventElapsedTime_v2(&mut ms, e0, e1));
        assert!((ms - 3.0 * unit_ms).abs() < 0.001, "extra: {ms}");
        ok(cuEventElapsedTime_v2(&mut ms, e1, e2));
        assert!((ms - 4.0 * unit_ms).abs() < 0.001, "cooperative: {ms}");
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

        // Markers: the device runs one thing at a time, other streams' work included. All
        // of it is queued behind a blocker on s2, so every instant below is the schedule's.
        let mut s2: CUstream = null_mut();
        ok(cuStreamCreate(&mut s2, 0));
        let mut s3: CUstream = null_mut();
        ok(cuStreamCreate(&mut s3, 0));
        let mut ev = [null_mut(); 6];
        for e in &mut ev {
            ok(cuEventCreate(e, 0));
        }
        let [a, b, a2, b2, a3, c] = ev;
        launch(s2, BLOCK);
        // An event recorded on an idle stream completes when the device turns to the
        // stream's next kernel; one recorded right after a kernel completes with it, even
        // when the device then runs other work (s2's 2 units, queued behind it).
        ok(cuEventRecord(a, s));
        launch(s, UNIT);
        launch(s2, 2 * UNIT);
        ok(cuEventRecord(b, s));
        // An event recorded before a kernel, on a stream with nothing queued, completes when
        // the device turns to that kernel: work submitted between the record and the launch
        // (s2's unit) is not in the pair's time.
        ok(cuEventRecord(a2, s3));
        launch(s2, UNIT);
        launch(s3, UNIT);
        ok(cuEventRecord(b2, s3));
        // Consecutive events with another stream's kernel between: its time is included.
        launch(s, UNIT);
        ok(cuEventRecord(a3, s));
        launch(s2, UNIT / 2);
        launch(s, UNIT);
        ok(cuEventRecord(c, s));
        assert_eq!(cuEventQuery(c), CUDA_ERROR_NOT_READY);
        ok(cuCtxSynchronize());
        let near = |ms: f32, units: f32| (ms - units * unit_ms).abs() < 0.001;
        assert!(near(elapsed(a, b), 1.0), "{}", elapsed(a, b));
        assert!(near(elapsed(a2, b2), 1.0), "{}", elapsed(a2, b2));
        assert!(near(elapsed(a3, c), 1.5), "{}", elapsed(a3, c));

        // Re-recording events behind another stream's work, never launching after them,
        // keeps only the open ones listed.
        launch(s2, BLOCK);
        for _ in 0..100 {
            ok(cuEventRecord(a, s));
            ok(cuEventRecord(b, s));
        }
        assert_eq!(crate::driver::inited().unwrap().open_marker_count(), 2);
        // Once fixed (b, synchronised at the first blocker's end) they drop out at the next
        // open record; at most one entry per event stays (a, re-recorded behind a second
        // blocker and never observed, and c).
        launch(s2, BLOCK);
        ok(cuEventRecord(a, s));
        ok(cuEventSynchronize(b));
        assert_eq!(cuEventQuery(a), CUDA_ERROR_NOT_READY);
        ok(cuEventRecord(c, s));
        assert_eq!(crate::driver::inited().unwrap().open_marker_count(), 2);

        // cuStreamWaitEvent: s waits for s2's 2-unit kernel (queued behind the second
        // blocker); flags other than CU_EVENT_WAIT_EXTERNAL are invalid, as are record
        // flags other than CU_EVENT_RECORD_EXTERNAL.
        let t = Instant::now();
        launch(s2, 2 * UNIT);
        ok(cuEventRecordWithFlags(a, s2, 1));
        assert_eq!(cuEventRecordWithFlags(a, s2, 2), CUDA_ERROR_INVALID_VALUE);
        assert_eq!(cuStreamWaitEvent(s, a, 2), CUDA_ERROR_INVALID_VALUE);
        ok(cuStreamWaitEvent(s, a, 0));
        assert_eq!(cuStreamQuery(s), CUDA_ERROR_NOT_READY);
        ok(cuStreamSynchronize(s));
        // s's work ended with s2's: s2 is done once s is.
        ok(cuStreamQuery(s2));
        assert!(
            t.elapsed().as_nanos() >= 2 * UNIT as u128,
            "{:?}",
            t.elapsed()
        );
        ok(cuCtxSynchronize());
    }
    let _ = std::fs::remove_file(&dir);
}
