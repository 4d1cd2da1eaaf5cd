//! Scheduling work on a device's clock through the [`Shared`] state (see [`crate::clock`]):
//! submissions placed on the timeline, waits, and the busy time of processes over a window.

use std::sync::atomic::Ordering;

use crate::clock::*;
use crate::{Shared, MAX_DEVICES};

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
            if !crate::clock::running(child.id()) {
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
