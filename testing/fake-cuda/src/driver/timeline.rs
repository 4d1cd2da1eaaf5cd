//! The clock's process-local state ([`Timeline`]: stream and context tails, events, the
//! bounded launch queue, captured graphs' durations), kernel durations ([`KernelTime`]) and
//! the clock's knobs (`FAKE_CUDA_KERNEL_NS`, `FAKE_CUDA_QUEUE_DEPTH`, `FAKE_CUDA_QUEUE_AHEAD`,
//! `FAKE_CUDA_STREAM_LANES`). The model that moves it is in `clock.rs`.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

use fake_state::{now_ns, parse_duration_ns};

/// How long the kernels of a module take (its image's `ns=` key).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KernelTime {
    /// No `ns=` key: `FAKE_CUDA_KERNEL_NS`.
    Default,
    /// `ns=<duration>`: every launch takes that long.
    Fixed(u64),
    /// `ns=param`: the launch's first kernel parameter, a `u64` of nanoseconds.
    Param,
}

/// Parses the `ns=` key of a `FAKECUBIN` image (`FAKECUBIN globals=0 ns=2ms`, `ns=param`).
/// `None`: the key is there but malformed (the load fails with `CUDA_ERROR_INVALID_IMAGE`).
pub fn image_kernel_time(image: &[u8]) -> Option<KernelTime> {
    let Some(rest) = image.strip_prefix(b"FAKECUBIN") else {
        return Some(KernelTime::Default);
    };
    let text = std::str::from_utf8(rest).ok()?;
    let mut t = KernelTime::Default;
    for word in text.split_ascii_whitespace() {
        if let Some(v) = word.strip_prefix("ns=") {
            t = if v == "param" {
                KernelTime::Param
            } else {
                KernelTime::Fixed(parse_duration_ns(v)?)
            };
        }
    }
    Some(t)
}

/// `FAKE_CUDA_KERNEL_NS`: the duration of a launch whose module has no `ns=` key (default 0:
/// kernels complete at once).
pub fn default_kernel_ns() -> u64 {
    static V: OnceLock<u64> = OnceLock::new();
    *V.get_or_init(|| {
        std::env::var("FAKE_CUDA_KERNEL_NS")
            .ok()
            .and_then(|v| parse_duration_ns(&v))
            .unwrap_or(0)
    })
}

/// `FAKE_CUDA_QUEUE_DEPTH`: how many submissions of non-zero length a process holds queued on
/// a device (all its streams together) before a launch blocks until the oldest completes
/// (default 1024, about the real driver's push buffer; at least 1).
pub fn queue_depth() -> usize {
    static V: OnceLock<usize> = OnceLock::new();
    *V.get_or_init(|| {
        std::env::var("FAKE_CUDA_QUEUE_DEPTH")
            .ok()
            .and_then(|v| v.trim().parse::<usize>().ok())
            .filter(|&n| n > 0)
            .unwrap_or(1024)
    })
}

/// `FAKE_CUDA_QUEUE_AHEAD`: how far ahead of now a process's queued work on a device may
/// reach before its next launch blocks until it reaches only that far (default 2 ms, about
/// a time slice of the real GPU; a
/// duration as `FAKE_CUDA_KERNEL_NS`). The device is a FIFO: without this a back-to-back
/// launcher would book it for seconds ahead and every other process's kernel would wait
/// behind all of it, where the real GPU time-slices between processes. With it, a kernel of
/// another process waits at most about this long per busy process.
pub fn queue_ahead_ns() -> u64 {
    static V: OnceLock<u64> = OnceLock::new();
    *V.get_or_init(|| {
        std::env::var("FAKE_CUDA_QUEUE_AHEAD")
            .ok()
            .and_then(|v| parse_duration_ns(&v))
            .unwrap_or(2_000_000)
    })
}

/// `FAKE_CUDA_STREAM_LANES`: how many of this process's submissions (on different streams) a
/// device runs at the same time (default 1: one at a time; at most
/// [`fake_state::MAX_LANES`]). As kernels that each fill a part of the GPU's SMs: work of
/// several streams overlaps, while another process's work still waits for all of it (the
/// GPU time-slices between contexts).
pub fn stream_lanes() -> usize {
    static V: OnceLock<usize> = OnceLock::new();
    *V.get_or_init(|| {
        std::env::var("FAKE_CUDA_STREAM_LANES")
            .ok()
            .and_then(|v| v.trim().parse::<usize>().ok())
            .unwrap_or(1)
            .clamp(1, fake_state::MAX_LANES)
    })
}

/// Sleeps (never spins) until `CLOCK_MONOTONIC` reaches `t` ns.
pub fn sleep_until(t: u64) {
    loop {
        let now = now_ns();
        if now >= t {
            return;
        }
        std::thread::sleep(std::time::Duration::from_nanos(t - now));
    }
}

/// A stream as the clock knows it: `(context, stream handle or 0 / CU_STREAM_PER_THREAD,
/// thread for the per-thread stream)`.
pub type StreamKey = (u64, u64, u64);

/// A stream's queue.
#[derive(Debug, Default)]
pub(super) struct StreamClock {
    /// End of its last submission.
    pub(super) tail: u64,
    /// Its last operation was a submission (not an event record).
    pub(super) after_submission: bool,
}

/// An event's timing state.
#[derive(Clone, Copy, Debug, Default)]
pub struct EventClock {
    /// `cuEventCreate` flags.
    pub flags: u32,
    /// When it completes (ns), once known.
    pub at: Option<u64>,
    /// Recorded behind queued work: the stream and the earliest instant it can complete. It
    /// completes there, unless the stream's next submission is made before that instant (or
    /// within [`queue_ahead_ns`] after it, or after waiting for room): then at that
    /// submission's start (the device reaches the marker when it turns to this
    /// stream's work, as a time-slicing GPU runs a marker and the kernel after it together).
    pub open: Option<(StreamKey, u64)>,
}

/// The process-local part of the clock.
#[derive(Debug, Default)]
pub struct Timeline {
    pub(super) streams: HashMap<StreamKey, StreamClock>,
    /// Per context: the end of its last submission on any stream.
    pub(super) ctx_tail: HashMap<u64, u64>,
    /// Per physical device: end times of this process's submissions not yet seen completed
    /// (bounded by [`queue_depth`]).
    pub(super) pending: HashMap<usize, VecDeque<u64>>,
    /// Event handle -> timing.
    pub(super) events: HashMap<u64, EventClock>,
    /// Events recorded on a stream and still open (see [`EventClock::open`]).
    pub(super) markers: HashMap<StreamKey, Vec<u64>>,
    /// Module or library handle -> its kernels' duration.
    pub(super) modules: HashMap<u64, KernelTime>,
    /// Stream being captured -> ns captured so far.
    pub(super) capture: HashMap<u64, u64>,
    /// Graph -> total ns of its captured work.
    pub(super) graphs: HashMap<u64, u64>,
    /// Executable graph -> total ns.
    pub(super) execs: HashMap<u64, u64>,
}

pub(super) fn thread_id() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    thread_local! {
        static ID: u64 = NEXT.fetch_add(1, Ordering::Relaxed);
    }
    ID.with(|i| *i)
}
