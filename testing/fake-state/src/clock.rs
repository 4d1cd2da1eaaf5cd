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

use crate::{proc_stat, Shared, MAX_DEVICES};

/// Busy segments remembered per device (older ones are overwritten: a window reaching further
/// back is clipped to what the ring still covers, see [`BusyWindow::covered_from`]).
pub const RING: usize = 8192;
/// Most lanes (concurrent submissions of one process) a device runs.
pub const MAX_LANES: usize = 8;
/// Longest segment length (2^40 ns, about 18 minutes); a longer submission takes several.
const LEN_MASK: u64 = (1 << 40) - 1;
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

struct ClockGuard<'a>(&'a DeviceClock);

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
fn running(pid: u32) -> bool {
    match proc_stat(pid) {
        Some((state, _)) => !matches!(state, b'Z' | b'X' | b'T' | b't'),
        None => false,
    }
}

impl DeviceClock {
    fn lock(&self) -> ClockGuard<'_> {
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

    fn push(&self, pid: u32, start: u64, len: u64) {
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

impl Shared {
    fn clock(&self, dev: usize) -> Option<&DeviceClock> {
        self.device(dev).map(|d| &d.clock)
    }

    /// Schedules `dur` ns of work of this process on device `dev`, not starting before
    /// `earliest`: it starts at `max(earliest, device tail)` and the tail moves to its end.
    /// The interval is recorded for utilisation and added to `slot`'s busy total. Returns
    /// `(start, end)`; an unknown device schedules nothing (`(earliest, earliest + dur)`).
    /// Work of zero length takes no lock and records nothing.
    pub fn schedule(&self, dev: usize, slot: Option<usize>, earliest: u64, dur: u64) -> (u64, u64) {
        self.schedule_lanes(dev, slot, earliest, dur, 1)
    }

    /// [`Shared::schedule`] for a process whose submissions may run `lanes` at a time
    /// (`1..=`[`MAX_LANES`]; 1 = one at a time, as [`Shared::schedule`]). While this process
    /// made the device's latest bookings (its *group*, begun when another process's work or a
    /// serial booking was the latest), a submission starts at `max(earliest, the group's
    /// floor, the end of the earliest-free lane)`, so that up to `lanes` of its submissions
    /// overlap; once another process books, that one waits for the whole group and a new
    /// group begins after it (processes time-slice, never overlap).
    pub fn schedule_lanes(
        &self,
        dev: usize,
        slot: Option<usize>,
        earliest: u64,
        dur: u64,
        lanes: usize,
    ) -> (u64, u64) {
        let Some(c) = self.clock(dev) else {
            return (earliest, earliest.saturating_add(dur));
        };
        if dur == 0 {
            let start = earliest.max(c.tail.load(Ordering::Acquire));
            return (start, start);
        }
        let pid = std::process::id();
        let lanes = lanes.clamp(1, MAX_LANES);
        let (start, end) = {
            // A stopped or killed holder is taken over (`DeviceClock::lock`).
            let _g = c.lock();
            let tail = c.tail.load(Ordering::Acquire);
            let start = if lanes == 1 {
                c.group_pid.store(0, Ordering::Relaxed);
                earliest.max(tail)
            } else {
                if c.group_pid.load(Ordering::Relaxed) != pid {
                    c.group_pid.store(pid, Ordering::Relaxed);
                    c.group_floor.store(tail, Ordering::Relaxed);
                    for l in &c.lane_end {
                        l.store(tail, Ordering::Relaxed);
                    }
                }
                let (i, free) = c.lane_end[..lanes]
                    .iter()
                    .map(|l| l.load(Ordering::Relaxed))
                    .enumerate()
                    .min_by_key(|x| x.1)
                    .unwrap_or((0, tail));
                let start = earliest
                    .max(c.group_floor.load(Ordering::Relaxed))
                    .max(free);
                c.lane_end[i].store(start.saturating_add(dur), Ordering::Relaxed);
                start
            };
            let end = start.saturating_add(dur);
            c.tail.store(tail.max(end), Ordering::Release);
            let mut at = start;
            while at < end {
                let len = (end - at).min(LEN_MASK);
                c.push(pid, at, len);
                at += len;
            }
            (start, end)
        };
        c.busy_total.fetch_add(dur, Ordering::AcqRel);
        if let Some(s) = slot.filter(|&s| s < self.file().procs.len()) {
            if dev < MAX_DEVICES {
                self.file().procs[s].busy_ns[dev].fetch_add(dur, Ordering::AcqRel);
            }
        }
        (start, end)
    }

    /// The instant device `dev` is busy until (ns, `CLOCK_MONOTONIC`); 0 if unknown.
    pub fn device_tail(&self, dev: usize) -> u64 {
        self.clock(dev)
            .map(|c| c.tail.load(Ordering::Acquire))
            .unwrap_or(0)
    }

    /// Busy ns ever submitted on device `dev` (including work still queued).
    pub fn device_busy_total(&self, dev: usize) -> u64 {
        self.clock(dev)
            .map(|c| c.busy_total.load(Ordering::Acquire))
            .unwrap_or(0)
    }

    /// Busy ns ever submitted by process slot `slot` on device `dev` (including queued work).
    pub fn slot_busy_total(&self, slot: usize, dev: usize) -> u64 {
        match (self.file().procs.get(slot), dev < MAX_DEVICES) {
            (Some(s), true) => s.busy_ns[dev].load(Ordering::Acquire),
            _ => 0,
        }
    }

    /// The busy time of device `dev` inside `[from, to)` (ns, `CLOCK_MONOTONIC`), per process:
    /// the recorded intervals clipped to the window (work queued beyond `to` does not count).
    /// Processes record their intervals in the ring in about time order (not exactly: two
    /// submissions racing may land in either order), so the whole ring is read.
    pub fn busy_between(&self, dev: usize, from: u64, to: u64) -> BusyWindow {
        let mut w = BusyWindow {
            from,
            to,
            covered_from: from,
            ..Default::default()
        };
        let Some(c) = self.clock(dev) else {
            return w;
        };
        if to <= from {
            return w;
        }
        let mut acc: Vec<(u32, u64)> = Vec::new();
        {
            let _g = c.lock();
            let head = c.head.load(Ordering::Relaxed);
            let oldest = head.saturating_sub(RING as u64);
            let mut oldest_start = u64::MAX;
            for i in oldest..head {
                let seg = &c.ring[(i % RING as u64) as usize];
                let s = seg.start.load(Ordering::Relaxed);
                let word = seg.word.load(Ordering::Relaxed);
                let e = s.saturating_add(word & LEN_MASK);
                oldest_start = oldest_start.min(s);
                if e <= from || s >= to {
                    continue;
                }
                let (a, b) = (s.max(from), e.min(to));
                if b > a {
                    let pid = (word >> 40) as u32;
                    match acc.iter_mut().find(|(p, _)| *p == pid) {
                        Some(x) => x.1 += b - a,
                        None => acc.push((pid, b - a)),
                    }
                }
            }
            if head > RING as u64 {
                w.covered_from = w.covered_from.max(oldest_start);
            }
        }
        acc.sort_unstable();
        w.device = acc.iter().map(|x| x.1).sum();
        w.per_pid = acc;
        w
    }

    /// How many times device `dev` went from one process's work to another's inside
    /// `[from, to)`: the busy segments there in time order, counted where the pid changes (on
    /// a real GPU each is a context switch; the arbiter's turns make them rare).
    pub fn switches_between(&self, dev: usize, from: u64, to: u64) -> u64 {
        let Some(c) = self.clock(dev) else {
            return 0;
        };
        let mut segs: Vec<(u64, u32)> = Vec::new();
        {
            let _g = c.lock();
            let head = c.head.load(Ordering::Relaxed);
            for i in head.saturating_sub(RING as u64)..head {
                let seg = &c.ring[(i % RING as u64) as usize];
                let s = seg.start.load(Ordering::Relaxed);
                let word = seg.word.load(Ordering::Relaxed);
                let e = s.saturating_add(word & LEN_MASK);
                if e > from && s < to && word & LEN_MASK > 0 {
                    segs.push((s, (word >> 40) as u32));
                }
            }
        }
        segs.sort_unstable();
        segs.windows(2).filter(|w| w[0].1 != w[1].1).count() as u64
    }
}

#[cfg(test)]
mod tests {
    use crate::{Config, Shared};

    fn open(name: &str) -> (Shared, std::path::PathBuf) {
        let p = std::env::temp_dir().join(format!("fake-clock-{name}-{}", std::process::id()));
        let _ = std::fs::remove_file(&p);
        let cfg = Config {
            device_count: 2,
            total_mem: vec![1 << 30],
            ctx_overhead: 0,
            names: vec!["X".into()],
        };
        (Shared::open(&p, || Ok(cfg)).unwrap(), p)
    }

    #[test]
    fn durations_parse() {
        use super::parse_duration_ns as p;
        assert_eq!(p("0"), Some(0));
        assert_eq!(p("1500"), Some(1500));
        assert_eq!(p("2ms"), Some(2_000_000));
        assert_eq!(p("1.5ms"), Some(1_500_000));
        assert_eq!(p("500us"), Some(500_000));
        assert_eq!(p("3s"), Some(3_000_000_000));
        assert_eq!(p("7ns"), Some(7));
        assert_eq!(p("ms"), None);
        assert_eq!(p("-1"), None);
        assert_eq!(p("2 parsecs"), None);
        assert_eq!(p("1e3"), None);
    }

    #[test]
    fn work_runs_one_at_a_time_and_is_counted_per_process() {
        let (sh, p) = open("serial");
        let slot = sh.slot_for(std::process::id());
        let t = 1_000_000_000_000u64;
        assert_eq!(sh.schedule(0, slot, t, 100), (t, t + 100));
        // Queued behind the first: starts at the tail even though it may start earlier.
        assert_eq!(sh.schedule(0, slot, t + 10, 50), (t + 100, t + 150));
        // After a gap: starts when asked.
        assert_eq!(sh.schedule(0, slot, t + 1000, 10), (t + 1000, t + 1010));
        // Zero-length work occupies nothing.
        assert_eq!(sh.schedule(0, slot, t + 1005, 0), (t + 1010, t + 1010));
        assert_eq!(sh.device_tail(0), t + 1010);
        assert_eq!(sh.device_tail(1), 0);
        assert_eq!(sh.device_busy_total(0), 160);
        assert_eq!(sh.slot_busy_total(slot.unwrap(), 0), 160);
        let me = std::process::id();
        let w = sh.busy_between(0, t, t + 2000);
        assert_eq!(w.per_pid, vec![(me, 160)]);
        assert_eq!(w.device, 160);
        // Clipped to the window.
        let w = sh.busy_between(0, t + 120, t + 1005);
        assert_eq!(w.per_pid, vec![(me, 30 + 5)]);
        assert_eq!(sh.busy_between(0, t + 1010, t + 5000).per_pid, vec![]);
        assert_eq!(sh.busy_between(1, t, t + 2000).device, 0);
        drop(sh);
        let _ = std::fs::remove_file(&p);
    }

    #[test]
    fn lanes_overlap_one_process_and_time_slice_between_processes() {
        let (sh, p) = open("lanes");
        let slot = sh.slot_for(std::process::id());
        let t = 1_000_000_000_000u64;
        // Four lanes: four submissions at once, the fifth when the first lane frees.
        for i in 0..4 {
            assert_eq!(
                sh.schedule_lanes(0, slot, t + i, 100, 4),
                (t + i, t + i + 100)
            );
        }
        assert_eq!(sh.schedule_lanes(0, slot, t, 100, 4), (t + 100, t + 200));
        assert_eq!(sh.device_tail(0), t + 200);
        // The busy time is their union, not their sum.
        let me = std::process::id();
        assert_eq!(sh.busy_between(0, t, t + 1000).per_pid, vec![(me, 200)]);
        assert_eq!(sh.device_busy_total(0), 500);
        // Another process's (serial) booking waits for the whole group ...
        let c = &sh.file().devices[0].clock;
        c.group_pid.store(0, std::sync::atomic::Ordering::Relaxed);
        assert_eq!(sh.schedule(0, slot, t, 50), (t + 200, t + 250));
        // ... and a new group starts after it, even on a lane that was free earlier.
        assert_eq!(sh.schedule_lanes(0, slot, t, 10, 4), (t + 250, t + 260));
        assert_eq!(sh.schedule_lanes(0, slot, t, 10, 4), (t + 250, t + 260));
        // One lane is the serial model.
        assert_eq!(sh.schedule_lanes(0, slot, t, 10, 1), (t + 260, t + 270));
        assert_eq!(sh.schedule_lanes(0, slot, t, 10, 1), (t + 270, t + 280));
        drop(sh);
        let _ = std::fs::remove_file(&p);
    }

    #[test]
    fn intervals_of_several_processes_are_told_apart() {
        let (sh, p) = open("pids");
        let c = &sh.file().devices[0].clock;
        // Back-to-back work of one pid merges into one segment.
        c.push(7, 100, 10);
        c.push(7, 110, 10);
        c.push(9, 120, 30);
        c.push(7, 150, 5);
        assert_eq!(c.head.load(std::sync::atomic::Ordering::Relaxed), 3);
        let w = sh.busy_between(0, 0, 1000);
        assert_eq!(w.per_pid, vec![(7, 25), (9, 30)]);
        assert_eq!(w.device, 55);
        assert_eq!(sh.busy_between(0, 115, 130).per_pid, vec![(7, 5), (9, 10)]);
        drop(sh);
        let _ = std::fs::remove_file(&p);
    }

    #[test]
    fn a_lock_left_by_a_gone_process_is_taken_over() {
        let (sh, p) = open("stale");
        let c = &sh.file().devices[0].clock;
        // A pid that does not exist holds the ring's lock since long ago.
        c.lock
            .store(999_999_999, std::sync::atomic::Ordering::Release);
        c.locked_at.store(1, std::sync::atomic::Ordering::Release);
        let t = super::now_ns();
        assert_eq!(sh.schedule(0, None, t, 10), (t, t + 10));
        assert_eq!(c.lock.load(std::sync::atomic::Ordering::Acquire), 0);
        assert_eq!(sh.busy_between(0, t, t + 10).device, 10);
        drop(sh);
        let _ = std::fs::remove_file(&p);
    }

    #[test]
    fn a_lock_held_by_a_stopped_process_is_taken_over() {
        let (sh, p) = open("stopped");
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        // SAFETY: signalling the child we just spawned.
        unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGSTOP) };
        // Wait until /proc shows it stopped.
        for _ in 0..200 {
            if !super::running(child.id()) {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let c = &sh.file().devices[0].clock;
        c.lock
            .store(child.id(), std::sync::atomic::Ordering::Release);
        c.locked_at
            .store(super::now_ns(), std::sync::atomic::Ordering::Release);
        let t = super::now_ns();
        assert_eq!(sh.schedule(0, None, t, 10), (t, t + 10));
        assert_eq!(sh.busy_between(0, t, t + 10).device, 10);
        let _ = child.kill();
        let _ = child.wait();
        drop(sh);
        let _ = std::fs::remove_file(&p);
    }

    #[test]
    fn a_full_ring_reports_how_far_back_it_covers() {
        let (sh, p) = open("ring");
        let c = &sh.file().devices[0].clock;
        for i in 0..(super::RING as u64 + 10) {
            c.push(if i % 2 == 0 { 1 } else { 2 }, i * 10, 5);
        }
        let w = sh.busy_between(0, 0, u64::MAX / 2);
        assert_eq!(w.covered_from, 100);
        assert_eq!(w.device, super::RING as u64 * 5);
        drop(sh);
        let _ = std::fs::remove_file(&p);
    }
}
