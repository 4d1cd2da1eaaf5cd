//! One submission at a time: the split form the launch hook uses (`before` / `after`), the
//! submission lock, busy intervals charged once, the arbiter's turns, and the queries of a
//! stream's work in flight.

use super::*;

/// The split form the launch hook uses: the waits and the start event in `before`, the
/// submission's own result through `after`, and nothing metered for a failed submission.
#[test]
fn before_and_after_bracket_one_submission() {
    let sim = Sim::new();
    let cells = Cells::default();
    let gate = Gate::default();
    assert!(before(
        &gate,
        &sim,
        &sim,
        |_| Some(cells.cells()),
        pct_rate(0),
        target()
    )
    .is_none());
    assert!(before(&gate, &sim, &sim, |_| None, pct_rate(30), target()).is_none());
    assert_eq!(
        after(None, &sim, CUDA_ERROR_INVALID_VALUE),
        CUDA_ERROR_INVALID_VALUE
    );
    let t = before(
        &gate,
        &sim,
        &sim,
        |_| Some(cells.cells()),
        pct_rate(30),
        target(),
    );
    assert!(t.is_some());
    assert_eq!(sim.records.get(), 1, "the start event");
    sim.kernel(MS);
    assert_eq!(after(t, &sim, CUDA_SUCCESS), CUDA_SUCCESS);
    assert_eq!(gate.in_flight(0), 1);
    let t = before(
        &gate,
        &sim,
        &sim,
        |_| Some(cells.cells()),
        pct_rate(30),
        target(),
    );
    assert_eq!(
        after(t, &sim, CUDA_ERROR_INVALID_VALUE),
        CUDA_ERROR_INVALID_VALUE
    );
    // One in flight before a duration is known: the second waited for the first (harvested
    // meanwhile), and a failed submission is not metered.
    assert_eq!(gate.in_flight(0), 0, "a failed submission is not metered");
    sim.sleep_ns(2 * MS);
    gate.harvest(&sim, |_| Some(cells.cells()));
    assert_eq!(gate.in_flight(0), 0);
    assert_eq!(cells.consumed.load(Ordering::Relaxed), MS + sim.launch_cost);
}

/// The submission lock is held from the start event to the end event and released after;
/// one left by a stopped or dead holder is taken over after `LOCK_STEAL_NS`.
#[test]
fn the_submission_lock_brackets_the_pair_and_a_stale_one_is_taken_over() {
    let sim = Sim::new();
    let cells = Cells::default();
    let gate = Gate::default();
    let t = before(
        &gate,
        &sim,
        &sim,
        |_| Some(cells.cells()),
        pct_rate(30),
        target(),
    );
    assert_eq!(
        cells.lock.load(Ordering::Relaxed),
        7,
        "held across the launch"
    );
    sim.kernel(MS);
    after(t, &sim, CUDA_SUCCESS);
    assert_eq!(cells.lock.load(Ordering::Relaxed), 0, "released");
    // Let the kernel complete, so that the next submission waits only for the lock.
    sim.sleep_ns(2 * MS);
    gate.harvest(&sim, |_| Some(cells.cells()));
    cells.lock.store(99, Ordering::Relaxed); // a holder that never comes back
    let at = sim.now.get();
    let t = before(
        &gate,
        &sim,
        &sim,
        |_| Some(cells.cells()),
        pct_rate(30),
        target(),
    );
    let waited = sim.now.get() - at;
    assert!(
        (LOCK_STEAL_NS..LOCK_STEAL_NS + MS).contains(&waited),
        "{waited}"
    );
    assert_eq!(cells.lock.load(Ordering::Relaxed), 7);
    after(t, &sim, CUDA_SUCCESS);
    // The old holder's late release does not release someone else's lock.
    cells.lock.store(7, Ordering::Relaxed);
    unlock_submissions(&cells.lock, 99);
    assert_eq!(cells.lock.load(Ordering::Relaxed), 7);
}

#[test]
fn overlapping_intervals_are_charged_once() {
    let (mut busy, mut known) = (Vec::new(), i64::MIN);
    // The first interval: all new; the horizon moves to its end.
    assert_eq!(union_add(&mut busy, &mut known, -1000, 0), 1000);
    // Four streams' kernels that ran together: each adds only what lies beyond the others.
    assert_eq!(union_add(&mut busy, &mut known, -995, 5), 5);
    assert_eq!(union_add(&mut busy, &mut known, -1000, 3), 3);
    assert_eq!(busy, vec![(-1008, 0)]);
    // Inside what was charged: nothing.
    assert_eq!(union_add(&mut busy, &mut known, -500, -100), 0);
    // A gap below the horizon is filled exactly once.
    assert_eq!(union_add(&mut busy, &mut known, 100, 200), 100);
    assert_eq!(busy, vec![(-1208, -200), (-100, 0)]);
    assert_eq!(union_add(&mut busy, &mut known, -250, -50), 100 - 50 + 50);
    assert_eq!(busy, vec![(-1208, 0)]);
    // Empty intervals add nothing.
    assert_eq!(union_add(&mut busy, &mut known, 10, 10), 0);
}

#[test]
fn what_the_union_forgot_is_charged_in_full() {
    let (mut busy, mut known) = (Vec::new(), i64::MIN);
    assert_eq!(union_add(&mut busy, &mut known, -(MS as i64), 0), MS);
    // 200 ms later: the old interval is forgotten ...
    assert_eq!(
        union_add(&mut busy, &mut known, 199 * MS as i64, 200 * MS as i64),
        MS
    );
    assert_eq!(known, -UNION_KEEP_NS);
    assert_eq!(busy, vec![(-(MS as i64), 0)]);
    // ... so an interval placed where it was is charged again (conservative).
    assert_eq!(
        union_add(&mut busy, &mut known, -201 * MS as i64, -200 * MS as i64),
        MS
    );
    // At most UNION_MAX_INTERVALS disjoint intervals are kept.
    let (mut busy, mut known) = (Vec::new(), i64::MIN);
    for i in 0..(UNION_MAX_INTERVALS as i64 + 10) {
        union_add(&mut busy, &mut known, i * 100, i * 100 + 10);
    }
    assert_eq!(busy.len(), UNION_MAX_INTERVALS);
    // The forgotten ones are charged in full again; a remembered one is not.
    assert_eq!(union_add(&mut busy, &mut known, -100_000, -99_990), 10);
    let last = *busy.last().unwrap();
    assert_eq!(union_add(&mut busy, &mut known, last.0, last.1), 0);
}

/// Issue 30, turns: with the arbiter's turn (the first half of every period), 1 ms kernels at
/// 50 % run only inside it, none reaching more than half a kernel into the next container's
/// turn, and the container still gets its share. A stale turn (`None`)
/// lets them go at any time.
#[test]
fn a_turn_confines_submissions_to_the_containers_window() {
    use hami_common::arbiter::{Turn, TURN_PERIOD_NS, TURN_UNITS};
    let turn = Turn {
        start: 0,
        len: (TURN_UNITS / 2) as u8,
    };
    let end = u64::from(turn.len) * Turn::UNIT_NS;
    let sim = Sim::new();
    let cells = Cells::default();
    let gate = Gate::default();
    let from = sim.now_ns();
    let mut spans = Vec::new();
    while sim.now_ns() < from + 2_000 * MS {
        submit(
            &gate,
            &sim,
            &sim,
            |_| Some(cells.cells()),
            |_| {
                Some(Pace {
                    bp: 5000,
                    turn: Some(turn),
                })
            },
            target(),
            || {
                let start = sim.tail.get().max(sim.now.get() + sim.launch_cost);
                spans.push((start, start + MS));
                sim.kernel(MS)
            },
        );
    }
    let to = sim.now_ns();
    let share = sim.busy_until(to) as f64 / (to - from) as f64;
    assert!((0.45..0.55).contains(&share), "share {share:.3}");
    let outside: Vec<_> = spans
        .iter()
        .filter(|&&(a, b)| {
            // Started in the turn, ended at most half a kernel after it (the gate lets a
            // submission go while its middle falls in the turn).
            let pa = a % TURN_PERIOD_NS;
            pa >= end || pa + (b - a) > end + MS / 2
        })
        .collect();
    assert!(
        outside.is_empty(),
        "{} of {} kernels ran outside the turn (first: {:?})",
        outside.len(),
        spans.len(),
        outside
            .first()
            .map(|(a, b)| (a % TURN_PERIOD_NS, b % TURN_PERIOD_NS))
    );
    assert!(
        cells.throttled.load(Ordering::Relaxed) > 0,
        "waits are counted"
    );

    // Without a turn, the same container's kernels land in every part of the period.
    let sim = Sim::new();
    let cells = Cells::default();
    let gate = Gate::default();
    let from = sim.now_ns();
    let mut late = 0;
    while sim.now_ns() < from + 2_000 * MS {
        submit(
            &gate,
            &sim,
            &sim,
            |_| Some(cells.cells()),
            |_| {
                Some(Pace {
                    bp: 5000,
                    turn: None,
                })
            },
            target(),
            || {
                let start = sim.tail.get().max(sim.now.get() + sim.launch_cost);
                if start % TURN_PERIOD_NS >= end {
                    late += 1;
                }
                sim.kernel(MS)
            },
        );
    }
    assert!(
        late > 100,
        "{late} kernels in the second half without a turn"
    );
}

/// Work on one stream completes in order: with many short submissions in flight there, the
/// gate asks the driver about the oldest only until one is found not done (one
/// `cuEventQuery` per launch in a steady queue, not one per submission in flight).
#[test]
fn a_streams_later_submissions_are_not_queried_while_an_earlier_one_runs() {
    let sim = Sim::new();
    let cells = Cells::default();
    let gate = Gate::default();
    // 70 %: a queue of up to 16 short kernels.
    let launch = |ns| {
        submit(
            &gate,
            &sim,
            &sim,
            |_| Some(cells.cells()),
            pct_rate(70),
            target(),
            || sim.kernel(ns),
        )
    };
    // Learn the average (one kernel), then queue 10 kernels of 1 ms each.
    launch(MS);
    sim.sleep_ns(10 * MS);
    for _ in 0..10 {
        launch(MS);
    }
    let in_flight = gate.in_flight(0);
    assert!(in_flight >= 8, "{in_flight} in flight");
    let q = sim.queries.get();
    launch(MS);
    assert_eq!(
        sim.queries.get() - q,
        1,
        "one query for the oldest of the stream, not one per submission in flight"
    );
}
