//! Unit tests of the gate on a simulated device: one timeline on which every kernel runs
//! after the previous one (a busy GPU time-slices, so a process's own kernels never
//! overlap in these tests), events that complete when the work recorded before them has,
//! and a clock that sleeping advances.

use super::*;
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, AtomicU64};

const MS: u64 = 1_000_000;

mod submissions;

/// The shared atomics of one device, as the region holds them.
#[derive(Default)]
struct Cells {
    budget: AtomicI64,
    refilled: AtomicU64,
    consumed: AtomicU64,
    throttled: AtomicU64,
    throttled_ns: AtomicU64,
    lock: AtomicU64,
}

impl Cells {
    fn cells(&self) -> ComputeCells<'_> {
        ComputeCells {
            budget_ns: &self.budget,
            refilled_at_ns: &self.refilled,
            consumed_ns: &self.consumed,
            throttled: &self.throttled,
            throttled_ns: &self.throttled_ns,
            submit_lock: &self.lock,
        }
    }
}

/// A simulated device and clock.
#[derive(Default)]
struct Sim {
    now: Cell<u64>,
    /// When the device finishes the work queued so far.
    tail: Cell<u64>,
    /// Device time of every kernel submitted.
    busy: Cell<u64>,
    /// Event -> completion time (None: created, never recorded).
    events: RefCell<HashMap<usize, Option<u64>>>,
    next: Cell<usize>,
    capturing: Cell<bool>,
    records: Cell<u64>,
    queries: Cell<u64>,
    fail_records: Cell<bool>,
    /// CPU time one launch takes.
    launch_cost: u64,
}

impl Sim {
    fn new() -> Sim {
        let s = Sim {
            launch_cost: 5_000,
            ..Sim::default()
        };
        s.now.set(1_000 * MS);
        s
    }

    /// Enqueues a kernel of `ns` device time.
    fn kernel(&self, ns: u64) -> CUresult {
        self.now.set(self.now.get() + self.launch_cost);
        let start = self.tail.get().max(self.now.get());
        self.tail.set(start + ns);
        self.busy.set(self.busy.get() + ns);
        CUDA_SUCCESS
    }

    /// Device time used between `from` and `to` (kernels are back to back from `tail`
    /// backwards only approximately; the tests use long runs where the edge is small).
    fn busy_until(&self, to: u64) -> u64 {
        self.busy.get() - self.tail.get().saturating_sub(to)
    }
}

impl Driver for Sim {
    fn capturing(&self, _: usize, _: bool) -> bool {
        self.capturing.get()
    }
    fn create_event(&self) -> Option<usize> {
        let n = self.next.get() + 1;
        self.next.set(n);
        self.events.borrow_mut().insert(n, None);
        Some(n)
    }
    fn destroy_event(&self, ev: usize) {
        self.events.borrow_mut().remove(&ev);
    }
    fn record(&self, ev: usize, _: usize, _: bool) -> bool {
        if self.fail_records.get() {
            return false;
        }
        self.records.set(self.records.get() + 1);
        let t = self.tail.get().max(self.now.get());
        match self.events.borrow_mut().get_mut(&ev) {
            Some(e) => {
                *e = Some(t);
                true
            }
            None => false,
        }
    }
    fn query(&self, ev: usize) -> Query {
        self.queries.set(self.queries.get() + 1);
        match self.events.borrow().get(&ev) {
            Some(Some(t)) if *t <= self.now.get() => Query::Done,
            Some(Some(_)) => Query::Pending,
            Some(None) => Query::Done,
            None => Query::Failed,
        }
    }
    fn elapsed_ns(&self, a: usize, b: usize) -> Option<u64> {
        let ev = self.events.borrow();
        ev.get(&b)?.as_ref()?.checked_sub(*ev.get(&a)?.as_ref()?)
    }
}

impl Clock for Sim {
    fn now_ns(&self) -> u64 {
        self.now.get()
    }
    fn sleep_ns(&self, ns: u64) {
        self.now.set(self.now.get() + ns);
    }
}

/// The rate of a share of `pct` % (0: no limit), as the hooks pass it.
fn pct_rate(pct: u32) -> impl Fn(u64) -> Option<u32> {
    move |_| (pct != 0).then_some(pct * 100)
}

fn target() -> Target {
    Target {
        dev: 0,
        ctx: 1,
        stream: 0,
        ptsz: false,
        token: 7,
    }
}

/// Runs one process launching `kernel_ns` kernels back to back for `secs` simulated
/// seconds at `pct` %, and returns the device's busy fraction over the run.
fn run_alone(pct: u32, kernel_ns: u64, secs: u64) -> f64 {
    let sim = Sim::new();
    let cells = Cells::default();
    let gate = Gate::default();
    let t0 = sim.now.get();
    let end = t0 + secs * 1_000 * MS;
    while sim.now.get() < end {
        submit(
            &gate,
            &sim,
            &sim,
            |_| Some(cells.cells()),
            pct_rate(pct),
            target(),
            || sim.kernel(kernel_ns),
        );
    }
    let busy = sim.busy_until(end);
    // Only what ran is debited (and the gap between the start event and the kernel, when
    // the device was idle: launch costs, counted against the process).
    let launches = sim.records.get() / 2;
    assert!(
        cells.consumed.load(Ordering::Relaxed) <= sim.busy.get() + launches * sim.launch_cost,
        "more debited than ran"
    );
    busy as f64 / (end - t0) as f64
}

#[test]
fn one_process_gets_its_share() {
    for pct in [30, 50, 70] {
        for kernel in [MS, 50_000, 20 * MS] {
            let got = run_alone(pct, kernel, 20);
            let want = f64::from(pct) / 100.0;
            assert!(
                (got - want).abs() < 0.01,
                "{pct} % with {kernel} ns kernels: device busy {got:.4}"
            );
        }
    }
}

/// Two processes of one container (two gates, one budget) interleaving their launches
/// get the container's share together, not each.
#[test]
fn two_processes_share_one_budget() {
    let sim = Sim::new();
    let cells = Cells::default();
    let (a, b) = (Gate::default(), Gate::default());
    let t0 = sim.now.get();
    let end = t0 + 20_000 * MS;
    let (mut na, mut nb) = (0u64, 0u64);
    while sim.now.get() < end {
        for (g, n) in [(&a, &mut na), (&b, &mut nb)] {
            submit(
                g,
                &sim,
                &sim,
                |_| Some(cells.cells()),
                pct_rate(50),
                target(),
                || sim.kernel(MS),
            );
            *n += 1;
        }
    }
    let got = sim.busy_until(end) as f64 / (end - t0) as f64;
    assert!((got - 0.5).abs() < 0.01, "together {got:.4}");
    assert_eq!(na, nb);
    assert!(cells.throttled.load(Ordering::Relaxed) > 0);
    assert!(cells.throttled_ns.load(Ordering::Relaxed) > 5_000 * MS);
}

/// A kernel longer than the bucket cannot be split: it runs, the budget goes into debt
/// and the next submission waits until the debt is repaid at the share's rate.
#[test]
fn a_kernel_longer_than_the_window_puts_the_budget_into_debt() {
    let sim = Sim::new();
    let cells = Cells::default();
    let gate = Gate::default();
    let pct = 30;
    submit(
        &gate,
        &sim,
        &sim,
        |_| Some(cells.cells()),
        pct_rate(pct),
        target(),
        || sim.kernel(1_000 * MS),
    );
    // Once it has completed and is debited, the budget is 1000 ms minus the 30 ms burst in
    // debt; the next submission refills the 1001 ms since (300 ms) and waits for the rest
    // to be repaid at 30 %: 670 ms / 0.3 = 2.23 s.
    sim.sleep_ns(1_001 * MS);
    gate.harvest(&sim, |_| Some(cells.cells()));
    let b = cells.budget.load(Ordering::Relaxed);
    assert!(
        (-(971 * MS as i64)..=-(969 * MS as i64)).contains(&b),
        "budget {} ms",
        b / MS as i64
    );
    let before = sim.now.get();
    submit(
        &gate,
        &sim,
        &sim,
        |_| Some(cells.cells()),
        pct_rate(pct),
        target(),
        || sim.kernel(MS),
    );
    let waited = sim.now.get() - before;
    assert!(
        (2_200 * MS..2_300 * MS).contains(&waited),
        "waited {} ms",
        waited / MS
    );
    assert!(cells.consumed.load(Ordering::Relaxed) >= 1_000 * MS);
    assert_eq!(cells.throttled.load(Ordering::Relaxed), 1);
    // Long run: still the share.
    let got = run_alone(pct, 400 * MS, 60);
    assert!((got - 0.3).abs() < 0.02, "{got:.4}");
}

#[test]
fn capturing_launches_are_neither_throttled_nor_metered() {
    let sim = Sim::new();
    let cells = Cells::default();
    cells
        .budget
        .store(-((10_000 * MS) as i64), Ordering::Relaxed);
    cells.refilled.store(u64::MAX, Ordering::Relaxed);
    let gate = Gate::default();
    sim.capturing.set(true);
    let before = sim.now.get();
    let r = submit(
        &gate,
        &sim,
        &sim,
        |_| Some(cells.cells()),
        pct_rate(30),
        target(),
        || CUDA_SUCCESS,
    );
    assert_eq!(r, CUDA_SUCCESS);
    assert_eq!(sim.now.get(), before, "no sleep");
    assert_eq!(sim.records.get(), 0, "no event recorded into the capture");
    assert_eq!(gate.in_flight(0), 0);
}

#[test]
fn no_share_is_a_plain_call() {
    let sim = Sim::new();
    let cells = Cells::default();
    let gate = Gate::default();
    let r = submit(
        &gate,
        &sim,
        &sim,
        |_| Some(cells.cells()),
        pct_rate(0),
        target(),
        || sim.kernel(MS),
    );
    assert_eq!(r, CUDA_SUCCESS);
    assert_eq!(sim.records.get(), 0);
    assert_eq!(cells.consumed.load(Ordering::Relaxed), 0);
}

/// A process that dies with work in flight, or stops between advancing `refilled_at` and
/// adding the refill, holds nothing: the other process keeps its share.
#[test]
fn a_dead_or_stopped_process_never_starves_the_others() {
    let sim = Sim::new();
    let cells = Cells::default();
    let dead = Gate::default();
    for _ in 0..MAX_INFLIGHT {
        submit(
            &dead,
            &sim,
            &sim,
            |_| Some(cells.cells()),
            pct_rate(50),
            target(),
            || sim.kernel(10 * MS),
        );
    }
    drop(dead); // never harvested: its work is simply not debited
                // A stopped refiller: refilled_at advanced to now, the refill never added.
    cells.refilled.store(sim.now.get(), Ordering::Relaxed);
    let live = Gate::default();
    let t0 = sim.now.get();
    let busy0 = sim.busy.get();
    let end = t0 + 20_000 * MS;
    while sim.now.get() < end {
        submit(
            &live,
            &sim,
            &sim,
            |_| Some(cells.cells()),
            pct_rate(50),
            target(),
            || sim.kernel(MS),
        );
    }
    let got = (sim.busy_until(end) - busy0) as f64 / (end - t0) as f64;
    assert!((got - 0.5).abs() < 0.02, "{got:.4}");
}

#[test]
fn the_work_in_flight_is_bounded() {
    let sim = Sim::new();
    let cells = Cells::default();
    cells.budget.store(i64::MAX / 4, Ordering::Relaxed); // never short of budget
    cells.refilled.store(u64::MAX, Ordering::Relaxed);
    let gate = Gate::default();
    let mut most = 0;
    for _ in 0..200 {
        submit(
            &gate,
            &sim,
            &sim,
            |_| Some(cells.cells()),
            pct_rate(90),
            target(),
            || sim.kernel(MS),
        );
        most = most.max(gate.in_flight(0));
    }
    let limit = inflight_limit(9000, MS);
    assert!(most <= limit, "{most} in flight, limit {limit}");
    assert!(most >= limit - 1, "{most} in flight, limit {limit}");
    // A kernel that never completes holds the gate at most INFLIGHT_WAIT_NS.
    let stuck = Gate::default();
    for _ in 0..MAX_INFLIGHT {
        submit(
            &stuck,
            &sim,
            &sim,
            |_| Some(cells.cells()),
            pct_rate(90),
            target(),
            || sim.kernel(1 << 50),
        );
    }
    let t = sim.now.get();
    submit(
        &stuck,
        &sim,
        &sim,
        |_| Some(cells.cells()),
        pct_rate(90),
        target(),
        || CUDA_SUCCESS,
    );
    let waited = sim.now.get() - t;
    assert!(
        (INFLIGHT_WAIT_NS..INFLIGHT_WAIT_NS + 10 * MS).contains(&waited),
        "{waited}"
    );
}

#[test]
fn a_failed_record_submits_unmetered() {
    let sim = Sim::new();
    let cells = Cells::default();
    let gate = Gate::default();
    sim.fail_records.set(true);
    let r = submit(
        &gate,
        &sim,
        &sim,
        |_| Some(cells.cells()),
        pct_rate(30),
        target(),
        || sim.kernel(MS),
    );
    assert_eq!(r, CUDA_SUCCESS);
    assert_eq!(gate.in_flight(0), 0);
    // The launch's own error is returned, and nothing stays in flight.
    sim.fail_records.set(false);
    let r = submit(
        &gate,
        &sim,
        &sim,
        |_| Some(cells.cells()),
        pct_rate(30),
        target(),
        || CUDA_ERROR_INVALID_VALUE,
    );
    assert_eq!(r, CUDA_ERROR_INVALID_VALUE);
    assert_eq!(gate.in_flight(0), 0);
}

#[test]
fn refill_caps_and_ignores_a_clock_behind() {
    let c = Cells::default();
    let cells = c.cells();
    refill(&cells, 3000, 5_000 * MS);
    assert_eq!(
        c.budget.load(Ordering::Relaxed),
        burst_ns(3000),
        "a fresh region fills up"
    );
    assert_eq!(burst_ns(3000), 30 * MS as i64);
    debit(&cells, 40 * MS);
    assert_eq!(c.budget.load(Ordering::Relaxed), -(10 * MS as i64));
    assert_eq!(c.consumed.load(Ordering::Relaxed), 40 * MS);
    refill(&cells, 3000, 4_000 * MS);
    assert_eq!(
        c.budget.load(Ordering::Relaxed),
        -(10 * MS as i64),
        "clock behind"
    );
    refill(&cells, 3000, 5_010 * MS);
    assert_eq!(
        c.budget.load(Ordering::Relaxed),
        -(7 * MS as i64),
        "10 ms at 30 %"
    );
    assert_eq!(
        wait_needed(&cells, Some(3000), 5_010 * MS),
        Some(7 * MS * 10_000 / 3000)
    );
    refill(&cells, 3000, 9_000 * MS);
    assert_eq!(
        c.budget.load(Ordering::Relaxed),
        burst_ns(3000),
        "never above the cap"
    );
    debit(&cells, 1_000 * MS);
    refill(&cells, 3000, 10_000 * MS);
    assert_eq!(
        c.budget.load(Ordering::Relaxed),
        -(670 * MS as i64),
        "a debt is repaid in full: 1 s at 30 %"
    );
    assert_eq!(
        wait_needed(&cells, Some(3000), 10_000 * MS),
        Some(MAX_SLEEP_NS),
        "capped sleep"
    );
    assert_eq!(
        wait_needed(&cells, None, 10_000 * MS),
        None,
        "no share: never"
    );
    assert_eq!(
        wait_needed(&cells, Some(0), 10_000 * MS),
        Some(MAX_SLEEP_NS),
        "held for a higher priority: sleep and look again"
    );
    assert_eq!(wait_needed(&cells, Some(3000), 13_000 * MS), None, "repaid");
}

/// Concurrent refills from many threads add exactly the elapsed time's worth once.
#[test]
fn concurrent_refills_add_each_interval_once() {
    let c = Cells::default();
    c.budget.store(-(1i64 << 50), Ordering::Relaxed); // far from the cap
    c.refilled.store(1_000, Ordering::Relaxed);
    let clock = AtomicU64::new(1_000);
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| {
                for _ in 0..20_000 {
                    let now = clock.fetch_add(100, Ordering::Relaxed) + 100;
                    refill(&c.cells(), 5000, now);
                }
            });
        }
    });
    let last = c.refilled.load(Ordering::Relaxed);
    let added = c.budget.load(Ordering::Relaxed) + (1i64 << 50);
    assert_eq!(last, clock.load(Ordering::Relaxed));
    assert_eq!(
        added as u64,
        (last - 1_000) / 2,
        "every interval once, none twice"
    );
}

#[test]
fn shares_and_limits() {
    use hami_abi::layout::{COMPUTE_POLICY_DEFAULT, COMPUTE_POLICY_DISABLE, COMPUTE_POLICY_FORCE};
    assert_eq!(effective_share(30, COMPUTE_POLICY_DEFAULT), 30);
    assert_eq!(effective_share(30, COMPUTE_POLICY_FORCE), 30);
    assert_eq!(effective_share(30, COMPUTE_POLICY_DISABLE), 0);
    assert_eq!(effective_share(0, COMPUTE_POLICY_FORCE), 0);
    assert_eq!(effective_share(100, COMPUTE_POLICY_FORCE), 0);
    assert_eq!(
        inflight_limit(3000, 0),
        MIN_INFLIGHT,
        "one until a duration is known"
    );
    assert_eq!(
        inflight_limit(3000, MS),
        1,
        "long kernels at a small share: one in flight"
    );
    assert_eq!(inflight_limit(5000, 100 * MS), MIN_INFLIGHT);
    assert_eq!(inflight_limit(5000, 50_000), 5, "250 us of short kernels");
    assert_eq!(inflight_limit(3000, 1_000), MAX_INFLIGHT);
    assert_eq!(
        inflight_limit(7000, 4 * MS),
        4,
        "above half: a quarter of the burst"
    );
    assert_eq!(inflight_limit(9000, 100 * MS), MIN_INFLIGHT);
}
