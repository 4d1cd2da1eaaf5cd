//! Refusals you can see (issue 20): the rate limiter of the warning logged when the quota
//! refuses a memory request. The first refusal on a device is logged at once; later ones at
//! most once per [`REPORT_INTERVAL_MS`] per device, each line saying how many were refused
//! since the previous one. Refusals are a cold path: two relaxed atomics per device, no lock.

use core::sync::atomic::{AtomicU64, Ordering};
use hami_abi::layout::MAX_DEVICES;

/// Shortest time between two refusal lines of one device, in milliseconds.
pub const REPORT_INTERVAL_MS: u64 = 10_000;

/// What a refusal line reports (returned when one is due).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Report {
    /// Refusals on the device since the previous line, this one included (≥ 1).
    pub refused: u64,
    /// Whether this is the device's first line in this process.
    pub first: bool,
}

/// Per-device rate limiter of refusal lines.
#[derive(Debug)]
pub struct RefusalLog {
    /// Per device: the monotonic ms of the last line, plus 1 (0 = never logged).
    last_ms: [AtomicU64; MAX_DEVICES],
    /// Per device: refusals not yet reported by a line.
    pending: [AtomicU64; MAX_DEVICES],
}

impl Default for RefusalLog {
    fn default() -> Self {
        Self::new()
    }
}

impl RefusalLog {
    /// A limiter that has logged nothing.
    pub const fn new() -> Self {
        Self {
            last_ms: [const { AtomicU64::new(0) }; MAX_DEVICES],
            pending: [const { AtomicU64::new(0) }; MAX_DEVICES],
        }
    }

    /// Records one refusal on `dev` at monotonic time `now_ms`; `Some` when a line is due
    /// (the device's first refusal, or the interval has passed since its last line). Of
    /// threads racing for one due line exactly one gets it. An ordinal past
    /// [`MAX_DEVICES`] is always reported (it cannot be tracked).
    pub fn on_refusal(&self, dev: usize, now_ms: u64) -> Option<Report> {
        let (Some(last), Some(pending)) = (self.last_ms.get(dev), self.pending.get(dev)) else {
            return Some(Report {
                refused: 1,
                first: false,
            });
        };
        pending.fetch_add(1, Ordering::Relaxed);
        let prev = last.load(Ordering::Relaxed);
        if prev != 0 && now_ms.saturating_sub(prev - 1) < REPORT_INTERVAL_MS {
            return None;
        }
        last.compare_exchange(prev, now_ms + 1, Ordering::Relaxed, Ordering::Relaxed)
            .ok()?;
        Some(Report {
            refused: pending.swap(0, Ordering::Relaxed).max(1),
            first: prev == 0,
        })
    }
}

/// The process's limiter.
pub static REFUSAL_LOG: RefusalLog = RefusalLog::new();

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_refusal_is_reported_then_one_line_per_interval() {
        let log = RefusalLog::new();
        let t0 = 5_000;
        assert_eq!(
            log.on_refusal(2, t0),
            Some(Report {
                refused: 1,
                first: true
            })
        );
        // 100 refusals in a row within the interval: no line.
        for i in 0..100 {
            assert_eq!(log.on_refusal(2, t0 + i * 10), None, "refusal {i}");
        }
        assert_eq!(log.on_refusal(2, t0 + REPORT_INTERVAL_MS - 1), None);
        // The interval passed: one line counting everything since the previous one.
        assert_eq!(
            log.on_refusal(2, t0 + REPORT_INTERVAL_MS),
            Some(Report {
                refused: 102,
                first: false
            })
        );
        assert_eq!(log.on_refusal(2, t0 + REPORT_INTERVAL_MS + 1), None);
    }

    #[test]
    fn devices_are_limited_independently() {
        let log = RefusalLog::new();
        assert!(log.on_refusal(0, 1).is_some());
        assert!(log.on_refusal(0, 2).is_none());
        assert_eq!(log.on_refusal(1, 3).map(|r| r.first), Some(true));
        assert!(
            log.on_refusal(MAX_DEVICES, 4).is_some(),
            "untracked: reported"
        );
        assert!(log.on_refusal(MAX_DEVICES, 5).is_some());
    }

    #[test]
    fn clock_at_zero_still_counts_as_logged() {
        let log = RefusalLog::new();
        assert!(log.on_refusal(0, 0).is_some());
        assert!(log.on_refusal(0, 1).is_none());
        assert!(log.on_refusal(0, REPORT_INTERVAL_MS).is_some());
    }

    #[test]
    fn racing_threads_get_one_line() {
        let log = std::sync::Arc::new(RefusalLog::new());
        let lines: u64 = (0..4)
            .map(|_| {
                let log = log.clone();
                std::thread::spawn(move || {
                    (0..1000)
                        .filter(|_| log.on_refusal(3, 777).is_some())
                        .count() as u64
                })
            })
            .map(|h| h.join().unwrap())
            .sum();
        assert_eq!(lines, 1);
    }
}
