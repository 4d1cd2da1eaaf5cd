//! The simulated device clock: every fake device executes one process's work at a time
//! (processes time-slice), on the real `CLOCK_MONOTONIC`, shared by every process through the
//! state file.
//!
//! A submission of `d` ns that may start at `earliest` starts at `max(earliest, device tail)`
//! and ends `d` later; the device tail moves to its end ([`Shared::schedule`]). A process may
//! ask for up to [`MAX_LANES`] lanes (`FAKE_CUDA_STREAM_LANES`, [`Shared::schedule_lanes`]):
//! then its submissions on different streams run at the same time, on the earliest free lane,
//! as long as no other process booked the device meanwhile (kernels that each fill a part of
//! the GPU's SMs; another process's work still waits for all of them, and theirs for it).
//! Each busy interval is kept in a per-device ring of [`RING`] segments (merged with the
//! previous one when the same process continues back to back or overlaps it), so that the
//! busy time of each process over any recent window can be read ([`Shared::busy_between`]:
//! the union of its intervals, the wall time it occupied the device): that is what the fake
//! NVML reports as per-process and device utilisation. See `docs/fake-driver.md`.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use crate::procfs::proc_stat;

/// Busy segments remembered per device (older ones are overwritten: a window reaching further
/// back is clipped to what the ring still covers, see [`BusyWindow::covered_from`]).
pub const RING: usize = 8192;
/// Most lanes (concurrent submissions of one process) a device runs.
pub const MAX_LANES: usize = 8;
/// Longest segment length (2^40 ns, about 18 minutes); a longer submission takes several.
pub(crate) const LEN_MASK: u64 = (1 << 40) - 1;
/// A `DeviceClock::lock` held longer than this by a process that is gone or stopped is
/// taken over (the lock guards a few instructions).
const STALE_LOCK_NS: u64 = 2_000_000;

/// Parses a duration: a number of nanoseconds, or a number with `ns`, `us`, `ms` or `s`
/// (`2ms`, `500us`, `1.5ms`, `0`). `None` if malformed, negative or beyond `u64` ns.
pub fn parse_duration_ns(s: &str) -> Option<u64> {
    let s = s.trim();
    let end = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(end);
    if num.is_empty() || num.starts_with('.') {
        return None;
    }
    let scale: f64 = match unit.trim() {
        "" | "ns" => 1.0,
        "us" => 1e3,
        "ms" => 1e6,
        "s" => 1e9,
        _ => return None,
    };
    if !num.contains('.') && scale == 1.0 {
        return num.parse().ok();
    }
    let v = num.parse::<f64>().ok()? * scale;
    (v.is_finite() && v >= 0.0 && v < u64::MAX as f64).then(|| v.round() as u64)
}

/// `CLOCK_MONOTONIC` in nanoseconds: the time base of every device clock.
pub fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// `CLOCK_REALTIME` minus `CLOCK_MONOTONIC`, in nanoseconds: converts device-clock instants
/// to the wall-clock microseconds NVML's timestamps are in.
pub fn realtime_offset_ns() -> i128 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut ts) };
    let real = ts.tv_sec as i128 * 1_000_000_000 + ts.tv_nsec as i128;
    real - now_ns() as i128
}

/// One busy interval: `start` (ns, `CLOCK_MONOTONIC`) and `pid << 40 | length`.
#[repr(C)]
pub struct Segment {
    /// Start of the interval.
    pub start: AtomicU64,
    /// Owning pid (bits 40..64) and length in ns (bits 0..40).
    pub word: AtomicU64,
}

/// The clock of one device (inside [`crate::DeviceState`]).
#[repr(C)]
pub struct DeviceClock {
    /// Pid holding the lock of the segment ring (0 = free); held for a few instructions.
    pub lock: AtomicU32,
    _pad: u32,
    /// When the holder took the lock (ns), to take over a lock of a process that died.
    pub locked_at: AtomicU64,
    /// The device is busy until then (ns): end of the last submitted work.
    pub tail: AtomicU64,
    /// Busy ns ever submitted (including work still queued; overlapping submissions of
    /// concurrent lanes each count in full).
    pub busy_total: AtomicU64,
    /// Segments ever written; segment `i` lives at `ring[i % RING]`.
    pub head: AtomicU64,
    /// The process whose concurrent group of submissions is the device's latest booking
    /// (0: none, or the latest booking was serial). Changed under `lock`.
    pub group_pid: AtomicU32,
    _pad2: u32,
    /// The earliest instant the current group's submissions may start (the device's tail
    /// when the group began: whatever another process booked before runs first).
    pub group_floor: AtomicU64,
    /// End of the last submission on each lane of the current group.
    pub lane_end: [AtomicU64; MAX_LANES],
    /// The busy segments, in time order.
    pub ring: [Segment; RING],
}

/// The busy time of a device over a window, per process.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct BusyWindow {
    /// Window start (ns, `CLOCK_MONOTONIC`) as asked.
    pub from: u64,
    /// Window end (ns).
    pub to: u64,
    /// Earliest instant the ring still covers (`<= from` when the whole window is known).
    pub covered_from: u64,
    /// Busy ns inside the window per pid (pids with none are absent), sorted by pid.
    pub per_pid: Vec<(u32, u64)>,
    /// Busy ns of the device inside the window (the sum of `per_pid`).
    pub device: u64,
}

/// [`DeviceClock::lock`] held: released on drop.
pub(crate) struct ClockGuard<'a>(&'a DeviceClock);

impl Drop for ClockGuard<'_> {
    fn drop(&mut self) {
        // Only our own hold is released: a holder whose lock was taken over (it was stopped
        // past STALE_LOCK_NS) must not release the new holder's.
        let me = std::process::id();
        let _ = self
            .0
            .lock
            .compare_exchange(me, 0, Ordering::Release, Ordering::Relaxed);
    }
}

/// Whether `pid` runs: not gone, not a zombie, not stopped (`SIGSTOP`, a debugger).
pub(crate) fn running(pid: u32) -> bool {
    match proc_stat(pid) {
        Some((state, _)) => !matches!(state, b'Z' | b'X' | b'T' | b't'),
        None => false,
    }
}

impl DeviceClock {
    pub(crate) fn lock(&self) -> ClockGuard<'_> {
        let me = std::process::id();
        let mut spins = 0u32;
        loop {
            if self
                .lock
                .compare_exchange(0, me, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
            {
                self.locked_at.store(now_ns(), Ordering::Relaxed);
                return ClockGuard(self);
            }
            spins += 1;
            if spins < 64 {
                std::hint::spin_loop();
                continue;
            }
            // The holder is preempted, stopped or gone: yield, then sleep a little; take over
            // the lock of a process that died or was stopped holding it.
            let holder = self.lock.load(Ordering::Relaxed);
            let since = self.locked_at.load(Ordering::Relaxed);
            if holder != 0
                && holder != me
                && now_ns().saturating_sub(since) > STALE_LOCK_NS
                && !running(holder)
                && self
                    .lock
                    .compare_exchange(holder, me, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
            {
                self.locked_at.store(now_ns(), Ordering::Relaxed);
                return ClockGuard(self);
            }
            if spins < 256 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(std::time::Duration::from_micros(20));
            }
        }
    }

    pub(crate) fn push(&self, pid: u32, start: u64, len: u64) {
        let head = self.head.load(Ordering::Relaxed);
        if head > 0 {
            let last = &self.ring[((head - 1) % RING as u64) as usize];
            let ls = last.start.load(Ordering::Relaxed);
            let lw = last.word.load(Ordering::Relaxed);
            let (lpid, llen) = ((lw >> 40) as u32, lw & LEN_MASK);
            // Back to back, or overlapping (concurrent lanes): one segment, their union.
            let (le, e) = (ls + llen, start.saturating_add(len));
            if lpid == pid & 0xff_ffff && start >= ls && start <= le && e.max(le) - ls <= LEN_MASK {
                last.word
                    .store(((pid as u64) << 40) | (e.max(le) - ls), Ordering::Relaxed);
                return;
            }
        }
        let seg = &self.ring[(head % RING as u64) as usize];
        seg.start.store(start, Ordering::Relaxed);
        seg.word
            .store(((pid as u64 & 0xff_ffff) << 40) | len, Ordering::Relaxed);
        self.head.store(head + 1, Ordering::Release);
    }
}
