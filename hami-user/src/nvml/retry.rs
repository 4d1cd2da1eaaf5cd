//! Loading NVML again until it is there.
//!
//! An agent started before the NVIDIA toolkit is ready (a DaemonSet scheduled on a node
//! whose driver container is still installing) finds no `libnvidia-ml.so.1`, or one whose
//! initialisation fails. Instead of running without NVML until restarted, the agent tries
//! again from its periodic tick: the first retry [`FIRST_RETRY`] after the failure at start,
//! each later one twice as long after the previous failure, at most [`MAX_RETRY`]
//! ([`Backoff`]). Each attempt runs on a thread of its own ([`Retry`]), so the tick never
//! waits for the dynamic loader or `nvmlInit`; one attempt at a time, so a load that hangs
//! holds one thread, not one per tick.

use std::fmt::Display;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Delay between the failure at start and the first retry.
pub const FIRST_RETRY: Duration = Duration::from_secs(1);

/// Longest delay between two attempts (the doubling stops there).
pub const MAX_RETRY: Duration = Duration::from_secs(60);

/// The retry schedule: when the next attempt is due, and how many were made.
///
/// Time is passed in (`now`), never read, so that the schedule is tested with any clock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Backoff {
    max: Duration,
    delay: Duration,
    next: Instant,
    attempts: u32,
}

impl Backoff {
    /// The schedule after the first attempt (at start) failed at `now`: the next one is due
    /// `first` later, and each failure after that doubles the delay, up to `max` (a `max`
    /// below `first` is taken as `first`).
    pub fn after_failure(first: Duration, max: Duration, now: Instant) -> Backoff {
        Backoff {
            max: max.max(first),
            delay: first,
            next: now + first,
            attempts: 1,
        }
    }

    /// Whether the next attempt is due at `now`.
    pub fn due(&self, now: Instant) -> bool {
        now >= self.next
    }

    /// When the next attempt is due.
    pub fn next_at(&self) -> Instant {
        self.next
    }

    /// The delay the next attempt was (or will be, after the current one fails) scheduled
    /// with.
    pub fn delay(&self) -> Duration {
        self.delay
    }

    /// Attempts made so far, the one at start included.
    pub fn attempts(&self) -> u32 {
        self.attempts
    }

    /// An attempt starts.
    pub fn started(&mut self) {
        self.attempts = self.attempts.saturating_add(1);
    }

    /// The attempt that started last failed at `now`: the next one is due twice the last
    /// delay later (at most the maximum).
    pub fn failed(&mut self, now: Instant) {
        self.delay = self.delay.saturating_mul(2).min(self.max);
        self.next = now + self.delay;
    }
}

/// What [`Retry::poll`] found.
#[derive(Debug)]
pub enum Poll<T> {
    /// Nothing new: no attempt due, or one still running (it may have just started).
    Waiting,
    /// An attempt failed; the next is due in `next_in`.
    Failed {
        /// Why it failed.
        error: String,
        /// Attempts made so far, the one at start included.
        attempts: u32,
        /// Delay until the next attempt.
        next_in: Duration,
    },
    /// An attempt succeeded.
    Loaded {
        /// What it loaded.
        value: T,
        /// Attempts made, the one at start and the successful one included.
        attempts: u32,
    },
}

/// Something that loads a `T`, called on a helper thread.
pub type Loader<T, E> = Arc<dyn Fn() -> Result<T, E> + Send + Sync>;

/// Loads a `T` again, on a helper thread, each time the [`Backoff`] says, until it loads.
pub struct Retry<T, E> {
    backoff: Backoff,
    loader: Loader<T, E>,
    pending: Option<JoinHandle<Result<T, E>>>,
}

impl<T, E> std::fmt::Debug for Retry<T, E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Retry")
            .field("backoff", &self.backoff)
            .field("pending", &self.pending.is_some())
            .finish()
    }
}

impl<T: Send + 'static, E: Display + Send + 'static> Retry<T, E> {
    /// Retries `loader` on the schedule `backoff` (which counts the failed attempt at start).
    pub fn new(loader: Loader<T, E>, backoff: Backoff) -> Retry<T, E> {
        Retry {
            backoff,
            loader,
            pending: None,
        }
    }

    /// The schedule.
    pub fn backoff(&self) -> &Backoff {
        &self.backoff
    }

    /// Whether an attempt is running.
    pub fn is_pending(&self) -> bool {
        self.pending.is_some()
    }

    /// Never blocks: collects the running attempt if it has finished, else starts one if it
    /// is due at `now` (and none is running).
    pub fn poll(&mut self, now: Instant) -> Poll<T> {
        if let Some(h) = &self.pending {
            if !h.is_finished() {
                return Poll::Waiting;
            }
            let Some(h) = self.pending.take() else {
                return Poll::Waiting;
            };
            let error = match h.join() {
                Ok(Ok(value)) => {
                    return Poll::Loaded {
                        value,
                        attempts: self.backoff.attempts(),
                    }
                }
                Ok(Err(e)) => e.to_string(),
                Err(_) => "the load attempt panicked".to_string(),
            };
            return self.fail(error, now);
        }
        if !self.backoff.due(now) {
            return Poll::Waiting;
        }
        self.backoff.started();
        let loader = Arc::clone(&self.loader);
        match std::thread::Builder::new()
            .name("hami-nvml-load".into())
            .spawn(move || loader())
        {
            Ok(h) => {
                self.pending = Some(h);
                Poll::Waiting
            }
            Err(e) => self.fail(format!("cannot start the load thread: {e}"), now),
        }
    }

    fn fail(&mut self, error: String, now: Instant) -> Poll<T> {
        self.backoff.failed(now);
        Poll::Failed {
            error,
            attempts: self.backoff.attempts(),
            next_in: self.backoff.next_at().saturating_duration_since(now),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::mpsc;

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn backoff_doubles_from_one_second_to_a_minute() {
        let t0 = Instant::now();
        let mut b = Backoff::after_failure(FIRST_RETRY, MAX_RETRY, t0);
        assert_eq!(b.attempts(), 1, "the attempt at start counts");
        assert!(!b.due(t0));
        assert!(!b.due(t0 + Duration::from_millis(999)));
        assert!(b.due(t0 + S));
        // Each attempt fails the moment it is due: the delays after each failure.
        let mut now = t0 + S;
        let mut delays = Vec::new();
        for _ in 0..9 {
            b.started();
            b.failed(now);
            delays.push(b.delay().as_secs());
            assert_eq!(b.next_at(), now + b.delay());
            assert!(!b.due(now + b.delay() - Duration::from_millis(1)));
            now = b.next_at();
            assert!(b.due(now));
        }
        assert_eq!(delays, [2, 4, 8, 16, 32, 60, 60, 60, 60]);
        assert_eq!(b.attempts(), 10);
    }

    #[test]
    fn backoff_counts_from_the_failure_not_from_the_start_of_a_slow_attempt() {
        let t0 = Instant::now();
        let mut b = Backoff::after_failure(S, 60 * S, t0);
        b.started();
        // The attempt due at t0 + 1 s took 10 s to fail.
        b.failed(t0 + 11 * S);
        assert!(!b.due(t0 + 12 * S));
        assert!(b.due(t0 + 13 * S));
        // A maximum below the first delay is the first delay.
        let mut c = Backoff::after_failure(5 * S, S, t0);
        c.started();
        c.failed(t0 + 5 * S);
        assert_eq!(c.delay(), 5 * S);
    }

    /// A loader that fails its first `fails` calls, counting them.
    fn flaky(fails: u32) -> (Loader<u32, String>, Arc<AtomicU32>) {
        let calls = Arc::new(AtomicU32::new(0));
        let c = Arc::clone(&calls);
        let loader: Loader<u32, String> = Arc::new(move || {
            let n = c.fetch_add(1, Ordering::SeqCst) + 1;
            if n <= fails {
                Err(format!("not yet ({n})"))
            } else {
                Ok(n)
            }
        });
        (loader, calls)
    }

    /// Polls at `now` until the running attempt (if any) has been collected.
    fn settle(r: &mut Retry<u32, String>, now: Instant) -> Poll<u32> {
        let mut p = r.poll(now);
        let end = Instant::now() + Duration::from_secs(10);
        while matches!(p, Poll::Waiting) && r.is_pending() {
            assert!(Instant::now() < end, "the attempt did not finish");
            std::thread::sleep(Duration::from_millis(1));
            p = r.poll(now);
        }
        p
    }

    #[test]
    fn retry_attempts_only_when_due_and_reports_the_load_with_its_attempt_count() {
        let t0 = Instant::now();
        let (loader, calls) = flaky(2);
        let mut r = Retry::new(loader, Backoff::after_failure(S, 60 * S, t0));
        // Not due: nothing runs.
        assert!(matches!(
            settle(&mut r, t0 + Duration::from_millis(999)),
            Poll::Waiting
        ));
        assert_eq!(calls.load(Ordering::SeqCst), 0);
        // Due at 1 s: fails (2nd attempt overall), next in 2 s.
        match settle(&mut r, t0 + S) {
            Poll::Failed {
                error,
                attempts,
                next_in,
            } => {
                assert_eq!(error, "not yet (1)");
                assert_eq!(attempts, 2);
                assert_eq!(next_in, 2 * S);
            }
            p => panic!("{p:?}"),
        }
        assert!(matches!(settle(&mut r, t0 + 2 * S), Poll::Waiting));
        assert_eq!(calls.load(Ordering::SeqCst), 1, "not due before 3 s");
        match settle(&mut r, t0 + 3 * S) {
            Poll::Failed {
                attempts, next_in, ..
            } => {
                assert_eq!(attempts, 3);
                assert_eq!(next_in, 4 * S);
            }
            p => panic!("{p:?}"),
        }
        assert!(matches!(settle(&mut r, t0 + 6 * S), Poll::Waiting));
        match settle(&mut r, t0 + 7 * S) {
            Poll::Loaded { value, attempts } => {
                assert_eq!(value, 3, "the third call of the loader");
                assert_eq!(attempts, 4, "start + three retries");
            }
            p => panic!("{p:?}"),
        }
        assert_eq!(calls.load(Ordering::SeqCst), 3);
    }

    #[test]
    fn a_hung_attempt_never_blocks_poll_nor_starts_another() {
        let t0 = Instant::now();
        let (release, gate) = mpsc::channel::<()>();
        let gate = std::sync::Mutex::new(gate);
        let calls = Arc::new(AtomicU32::new(0));
        let c = Arc::clone(&calls);
        let loader: Loader<u32, String> = Arc::new(move || {
            c.fetch_add(1, Ordering::SeqCst);
            let _ = gate.lock().unwrap().recv();
            Err("gave up".into())
        });
        let mut r = Retry::new(loader, Backoff::after_failure(S, 60 * S, t0));
        let before = Instant::now();
        for k in 1..50 {
            assert!(matches!(r.poll(t0 + k * 10 * S), Poll::Waiting));
        }
        assert!(
            before.elapsed() < Duration::from_secs(2),
            "poll waited for the attempt"
        );
        let end = Instant::now() + Duration::from_secs(10);
        while calls.load(Ordering::SeqCst) == 0 {
            assert!(Instant::now() < end, "the attempt never started");
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(calls.load(Ordering::SeqCst), 1, "one attempt at a time");
        assert!(r.is_pending());
        release.send(()).unwrap();
        match settle(&mut r, t0 + 600 * S) {
            Poll::Failed {
                error, attempts, ..
            } => {
                assert_eq!(error, "gave up");
                assert_eq!(attempts, 2);
            }
            p => panic!("{p:?}"),
        }
    }
}
