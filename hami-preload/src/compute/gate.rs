//! The launch gate: holds a container's use of each device at its compute share
//! (`CUDA_DEVICE_SM_LIMIT`), measured from what the GPU did. See `docs/preload.md`,
//! "Compute share".
//!
//! * **One budget per device, shared by the container** ([`ComputeCells`] in the region): a
//!   token bucket of device nanoseconds, refilled at the device's *rate* (lock-free: a
//!   compare-and-swap advances `refilled_at_ns`, the winner adds the elapsed time's worth),
//!   capped at [`WINDOW_NS`] x rate. The rate, in basis points of the GPU's time, is the
//!   share, or what the node agent's arbiter grants under `default` (more when it lends idle
//!   time, 0 while a higher priority is busy: `hami_common::arbiter::rate_bp`), read again
//!   at every check.
//! * **Debited with the driver's own timing**: every metered submission is bracketed by two
//!   events recorded on its stream; when the second has completed (checked with
//!   `cuEventQuery` at later submissions and at synchronisations) `cuEventElapsedTime` is
//!   debited from the budget and added to `consumed_ns`: the **union** of the process's
//!   intervals ([`union_add`]), so that kernels of several streams that overlap on the device
//!   are charged once for the wall time they occupy. Each interval is placed on the device's
//!   timeline by its end event's distance from the latest end seen (the *horizon*, an event
//!   kept per context); what overlaps intervals already charged within the last
//!   [`UNION_KEEP_NS`] is not charged again, everything else is (conservative: what the
//!   gate no longer remembers, or cannot place, is charged in full). Work of several
//!   processes is not merged (their events cannot be compared): each pays its own.
//! * **Waiting sleeps**: a submission that finds the budget negative sleeps for the deficit
//!   at the refill rate (at most [`MAX_SLEEP_NS`] at a time) and checks again.
//! * **Bounded queue**: at most [`inflight_limit`] metered submissions per stream (and
//!   [`MAX_INFLIGHT`] per device) and process are in flight (not yet debited): about [`QUEUE_AHEAD_NS`] of device time, one
//!   kernel when kernels are long, so that a kernel is never preempted half done by the
//!   GPU's time slicing between processes (its event pair would then count the other
//!   process's slice); past it the submission polls the oldest with `cuEventQuery` and short
//!   sleeps.
//! * **Nothing is held**: the budget is only ever debited for work that completed, so a
//!   process that dies or is stopped holds nothing; one stopped between advancing
//!   `refilled_at_ns` and adding the refill loses at most one burst of the container's
//!   budget, and the others keep refilling from there.
//! * **One submission at a time per container and device**: an advisory lock in the region
//!   ([`lock_submissions`]) is held from the start event to the end event, so that another
//!   process's kernel does not land inside this pair (taken over after [`LOCK_STEAL_NS`]).
//! * A launch into a capturing stream is not executed: it is neither throttled nor metered
//!   (the graph is, at `cuGraphLaunch`).
//!
//! The policy ([`before`] / [`after`], [`submit`]) is plain Rust over two traits,
//! [`Driver`] (events, capture) and [`Clock`], so that it unit-tests without a driver and
//! with simulated time; the FFI side ([`RealGateDriver`], [`RealClock`]) is thin. The hooks'
//! way in (the process-wide switch, one atomic load without a share, and the gate around a
//! submission with this process's [`Gate`]) is `crate::hooks::launch`.

use crate::ffi::cuda::*;
use hami_abi::layout::MAX_DEVICES;
use hami_common::arbiter::Turn;
use hami_common::region::ComputeCells;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

/// The bucket holds at most this much wall time's worth of the share (100 ms x share):
/// how far a container that was idle may burst above its share.
pub const WINDOW_NS: u64 = 100_000_000;
/// Longest single sleep at the gate before the budget is checked again.
pub const MAX_SLEEP_NS: u64 = 50_000_000;
/// Shortest sleep at the gate.
pub const MIN_SLEEP_NS: u64 = 20_000;
/// Most metered submissions one process keeps in flight per device.
pub const MAX_INFLIGHT: usize = 16;
/// Fewest: one, so that a kernel of its own is the only work a process has queued when the
/// device switches to another process's time slice (see [`inflight_limit`]).
pub const MIN_INFLIGHT: usize = 1;
/// Device time (ns) of metered work one process may keep queued per device beyond the
/// submission running: [`inflight_limit`].
pub const QUEUE_AHEAD_NS: u64 = 250_000;
/// Longest wait for the oldest submission in flight; past it the submission goes ahead
/// (a kernel that never finishes must not hang the gate forever).
pub const INFLIGHT_WAIT_NS: u64 = 2_000_000_000;
/// How far back (ns of device time before the latest end seen) the gate remembers the
/// intervals it charged, to charge an overlapping one only for what is new; an interval
/// reaching further back is charged in full for that part.
pub const UNION_KEEP_NS: i64 = 100_000_000;
/// Most disjoint intervals remembered per context (the oldest are forgotten first).
pub const UNION_MAX_INTERVALS: usize = 64;
/// Events kept for reuse per process.
const POOL_MAX: usize = 64;
/// A submission lock held longer than this is taken over (its holder is stopped or dead;
/// holding it takes microseconds: two event records and a launch).
pub const LOCK_STEAL_NS: u64 = 2_000_000;

/// Basis points (1/100 of a percent) of the GPU: the whole of it.
pub const FULL_BP: u32 = hami_common::arbiter::FULL_BP;

/// What the gate holds a device to at an instant: a rate, and the turn the arbiter gives the
/// container while several contend for the GPU (`hami_common::arbiter::Turn`: submissions
/// go only inside it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pace {
    /// Basis points of the GPU's time (0: held).
    pub bp: u32,
    /// The container's window of every `TURN_PERIOD_NS`; `None`: any time.
    pub turn: Option<Turn>,
}

/// What a `rate` callback of [`before`] may answer: a rate alone (`Option<u32>`, basis
/// points) or a [`Pace`]; `None`: no limit.
pub trait AsPace {
    /// As a pace.
    fn pace(self) -> Option<Pace>;
}

impl AsPace for Option<u32> {
    fn pace(self) -> Option<Pace> {
        self.map(|bp| Pace { bp, turn: None })
    }
}

impl AsPace for Option<Pace> {
    fn pace(self) -> Option<Pace> {
        self
    }
}

/// The cap of the bucket at a rate of `bp` basis points.
pub fn burst_ns(bp: u32) -> i64 {
    (WINDOW_NS * u64::from(bp.min(FULL_BP)) / u64::from(FULL_BP)) as i64
}

/// Refills the shared bucket up to `now_ns` at `bp` basis points of wall time; the result
/// is capped at [`burst_ns`] (a debt is repaid in full). Lock-free: the process whose compare-and-swap advances `refilled_at_ns`
/// adds the elapsed interval's worth; the others see no interval left. A clock behind the
/// recorded instant adds nothing.
pub fn refill(c: &ComputeCells<'_>, bp: u32, now_ns: u64) {
    let cap = burst_ns(bp);
    let mut last = c.refilled_at_ns.load(Ordering::Acquire);
    loop {
        if now_ns <= last {
            return;
        }
        match c.refilled_at_ns.compare_exchange_weak(
            last,
            now_ns,
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            Ok(_) => break,
            Err(seen) => last = seen,
        }
    }
    // The cap bounds what is saved up, not what repays a debt.
    let add = (u128::from(now_ns - last) * u128::from(bp) / u128::from(FULL_BP))
        .min(i64::MAX as u128) as i64;
    let _ = c
        .budget_ns
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |b| {
            Some(if b >= cap {
                b
            } else {
                b.saturating_add(add).min(cap)
            })
        });
}

/// Debits `ns` of measured device time: the budget (which may go into debt) and the
/// container's total.
pub fn debit(c: &ComputeCells<'_>, ns: u64) {
    let d = i64::try_from(ns).unwrap_or(i64::MAX);
    let _ = c
        .budget_ns
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |b| {
            Some(b.saturating_sub(d))
        });
    c.consumed_ns.fetch_add(ns, Ordering::Relaxed);
}

/// Adds the interval `[a, b)` (ns relative to the horizon, the latest end charged so far; `b`
/// may lie beyond it) to `busy`, the disjoint, sorted intervals already charged since
/// `known_from`, and returns the ns of it not charged before: its length less its overlap
/// with `busy` (what lies before `known_from` is not remembered and counts as new: the
/// conservative direction). When `b > 0` the horizon moves to `b` (everything is shifted by
/// `-b`); intervals ending more than [`UNION_KEEP_NS`] before the horizon, and past
/// [`UNION_MAX_INTERVALS`] the oldest, are forgotten (`known_from` moves up).
pub fn union_add(busy: &mut Vec<(i64, i64)>, known_from: &mut i64, a: i64, b: i64) -> u64 {
    if b <= a {
        return 0;
    }
    let covered: i64 = busy
        .iter()
        .map(|&(x, y)| (y.min(b) - x.max(a).max(*known_from)).max(0))
        .sum();
    let new = ((b - a) - covered).max(0) as u64;
    // Insert and merge.
    let (mut lo, mut hi) = (a, b);
    busy.retain(|&(x, y)| {
        if y < lo || x > hi {
            true
        } else {
            lo = lo.min(x);
            hi = hi.max(y);
            false
        }
    });
    let at = busy.partition_point(|&(x, _)| x < lo);
    busy.insert(at, (lo, hi));
    if b > 0 {
        for iv in busy.iter_mut() {
            *iv = (iv.0 - b, iv.1 - b);
        }
        *known_from = known_from.saturating_sub(b);
    }
    let keep_from = -UNION_KEEP_NS;
    if *known_from < keep_from {
        *known_from = keep_from;
    }
    busy.retain(|&(_, y)| y > *known_from);
    while busy.len() > UNION_MAX_INTERVALS {
        let (_, y) = busy.remove(0);
        *known_from = (*known_from).max(y);
    }
    new
}

/// After a refill at `bp` basis points: how long a submission must sleep before checking
/// again (`None`: go). The deficit is repaid at that rate; the sleep is that long, within
/// [`MIN_SLEEP_NS`]..=[`MAX_SLEEP_NS`]. `None`: no limit. A rate of 0 (suspended by the
/// arbiter for a higher priority) sleeps [`MAX_SLEEP_NS`] and checks again.
pub fn wait_needed(c: &ComputeCells<'_>, bp: Option<u32>, now_ns: u64) -> Option<u64> {
    let bp = bp?;
    refill(c, bp, now_ns);
    if bp == 0 {
        return Some(MAX_SLEEP_NS);
    }
    let b = c.budget_ns.load(Ordering::Acquire);
    if b >= 0 {
        return None;
    }
    let repay = u128::from(b.unsigned_abs()) * u128::from(FULL_BP) / u128::from(bp);
    Some((repay.min(u128::from(MAX_SLEEP_NS)) as u64).max(MIN_SLEEP_NS))
}

/// Metered submissions a process may keep in flight on one stream of a device, from its
/// rate (basis points) and the average measured duration of its submissions there
/// ([`MIN_INFLIGHT`] before anything was measured):
/// * a rate of at most 50 %: about [`QUEUE_AHEAD_NS`] (250 us) of device time, one kernel
///   when kernels are long;
/// * above 50 %: about a quarter of the bucket's burst (a 70 % share and 4 ms kernels: 4),
///   within [`MIN_INFLIGHT`]..=[`MAX_INFLIGHT`].
///
/// Why: the GPU time-slices between processes (contexts), and a process whose queue never
/// runs dry is preempted at the end of each of its slices with a kernel half done, so that
/// kernel's event pair spans the other process's slice and its time is debited too. On the
/// H200 a queue of 12 one-millisecond kernels debited a 30 % container beside a 70 % one for
/// more than it ran (it got 24 %), and two processes of one 50 % container got 41 %. With one
/// long kernel in flight the process's channel is idle when its kernel ends, the device
/// switches to the other process then, and each kernel runs whole inside one slice (30 %
/// beside 70 %: 31 %; two of one 50 % container: 52 %). But every kernel then costs a switch
/// between the processes, about 100 us on the H200, so that a share above one half cannot be
/// reached beside another busy process (70 % beside 30 %: 59 %): those keep a queue, and pay
/// for it only the other process's slices that land inside their pairs.
pub fn inflight_limit(bp: u32, avg_ns: u64) -> usize {
    if avg_ns == 0 {
        return MIN_INFLIGHT;
    }
    let n = if bp > FULL_BP / 2 {
        burst_ns(bp) as u64 / 4 / avg_ns
    } else {
        QUEUE_AHEAD_NS / avg_ns
    };
    (n as usize).clamp(MIN_INFLIGHT, MAX_INFLIGHT)
}

/// Inside a turn of its own the container has the GPU alone (the others wait for theirs), so
/// nothing preempts its kernels and a second one may wait queued behind the running one (the
/// device does not idle between them while the gate polls): at least 2 per stream.
pub fn in_turn_limit(limit: usize, turn: bool) -> usize {
    if turn {
        limit.max(2)
    } else {
        limit
    }
}

/// The effective share of a device from the region's record: `1..=99` with any policy but
/// `disable`; anything else is no limit (0). The share rule is the contract's
/// ([`hami_common::config::share_percent`]).
pub fn effective_share(sm_limit: u32, policy: u32) -> u32 {
    hami_common::config::share_percent(sm_limit, policy).unwrap_or(0)
}

/// A stream as the gate tells them apart: the handle as passed, and for the per-thread
/// default stream (`CU_STREAM_PER_THREAD`, or NULL through a `_ptsz` entry point) the
/// thread's token.
type StreamKey = (usize, u64);

fn stream_key(t: &Target) -> StreamKey {
    if t.stream == CU_STREAM_PER_THREAD || (t.ptsz && t.stream == 0) {
        (CU_STREAM_PER_THREAD, t.token)
    } else {
        (t.stream, 0)
    }
}

/// One metered submission, not yet debited.
#[derive(Clone, Copy, Debug)]
struct Pending {
    dev: usize,
    ctx: usize,
    stream: StreamKey,
    start: usize,
    end: usize,
}

/// What this process charged on one device in one context: the intervals, relative to the
/// horizon event (the latest end charged), see [`union_add`].
struct Union {
    dev: usize,
    ctx: usize,
    horizon: usize,
    busy: Vec<(i64, i64)>,
    known_from: i64,
}

/// The position of event `x` relative to event `h` (ns, negative when `x` completed first).
/// Asked forwards, then (if that is not positive) backwards, so that a driver that reports
/// no negative distances places `x` right.
pub fn offset_ns<D: Driver>(d: &D, h: usize, x: usize) -> Option<i64> {
    let fwd = d.elapsed_signed_ns(h, x);
    if let Some(v) = fwd.filter(|&v| v > 0) {
        return Some(v);
    }
    match d.elapsed_signed_ns(x, h) {
        Some(back) => Some(-back.max(0)),
        None => fwd,
    }
}

/// A process's metering state: submissions in flight and spare events.
#[derive(Default)]
struct GateMeter {
    pending: VecDeque<Pending>,
    unions: Vec<Union>,
    /// Spare events and the context each was created in.
    pool: Vec<(usize, usize)>,
    /// Average measured duration of a submission, per device (ns; 0 = none yet).
    avg_ns: [u64; MAX_DEVICES],
}

impl GateMeter {
    fn in_flight(&self, dev: usize) -> usize {
        self.pending.iter().filter(|p| p.dev == dev).count()
    }

    fn in_flight_on(&self, dev: usize, stream: StreamKey) -> usize {
        self.pending
            .iter()
            .filter(|p| p.dev == dev && p.stream == stream)
            .count()
    }

    /// The device time a completed submission adds to the union of what this process ran
    /// there (`ns`: its own event-measured length). The end event becomes the horizon when
    /// it is the latest; returns whether it did (then it must not go back to the pool).
    fn charge<D: Driver>(&mut self, d: &D, p: &Pending, ns: u64) -> (u64, bool) {
        let len = i64::try_from(ns).unwrap_or(i64::MAX);
        let i = self
            .unions
            .iter()
            .position(|u| u.dev == p.dev && u.ctx == p.ctx);
        let placed = i.and_then(|i| offset_ns(d, self.unions[i].horizon, p.end).map(|b| (i, b)));
        match placed {
            Some((i, b)) => {
                let u = &mut self.unions[i];
                let new = union_add(&mut u.busy, &mut u.known_from, b.saturating_sub(len), b);
                if b > 0 {
                    let old = std::mem::replace(&mut u.horizon, p.end);
                    self.give_event(d, p.ctx, old);
                    (new, true)
                } else {
                    (new, false)
                }
            }
            None => {
                // The first on this context, or the horizon can no longer be compared (its
                // context went): start afresh from this one, charged in full.
                if let Some(i) = i {
                    let u = self.unions.swap_remove(i);
                    d.destroy_event(u.horizon);
                }
                self.unions.push(Union {
                    dev: p.dev,
                    ctx: p.ctx,
                    horizon: p.end,
                    busy: vec![(-len, 0)],
                    known_from: -len,
                });
                (ns, true)
            }
        }
    }

    fn take_event<D: Driver>(&mut self, d: &D, ctx: usize) -> Option<usize> {
        match self.pool.iter().rposition(|&(c, _)| c == ctx) {
            Some(i) => Some(self.pool.swap_remove(i).1),
            None => d.create_event(),
        }
    }

    fn give_event<D: Driver>(&mut self, d: &D, ctx: usize, ev: usize) {
        if self.pool.len() < POOL_MAX {
            self.pool.push((ctx, ev));
        } else {
            d.destroy_event(ev);
        }
    }

    /// Debits every completed submission; drops those whose events failed. A stream runs its
    /// work in order, so once one of its submissions is found not done the later ones on it
    /// are not asked (with 16 short kernels in flight on one stream, one `cuEventQuery`
    /// instead of 16 at every launch).
    fn harvest<'a, D: Driver>(
        &mut self,
        d: &D,
        cells: &impl Fn(usize) -> Option<ComputeCells<'a>>,
    ) {
        if self.pending.is_empty() {
            return;
        }
        let mut keep = VecDeque::with_capacity(self.pending.len());
        let pending = std::mem::take(&mut self.pending);
        // (context, stream) of the streams found with work not done yet.
        let mut busy: Vec<(usize, StreamKey)> = Vec::new();
        d.relaxed(&mut || {
            for p in &pending {
                if busy.contains(&(p.ctx, p.stream)) {
                    keep.push_back(*p);
                    continue;
                }
                match d.query(p.end) {
                    Query::Pending => {
                        busy.push((p.ctx, p.stream));
                        keep.push_back(*p)
                    }
                    Query::Done => {
                        let mut kept_end = false;
                        if let Some(ns) = d.elapsed_ns(p.start, p.end) {
                            let (new, horizon) = self.charge(d, p, ns);
                            kept_end = horizon;
                            if let Some(c) = cells(p.dev) {
                                debit(&c, new);
                            }
                            let a = &mut self.avg_ns[p.dev];
                            *a = if *a == 0 {
                                ns.max(1)
                            } else {
                                (*a * 7 + ns) / 8
                            }
                            .max(1);
                        }
                        self.give_event(d, p.ctx, p.start);
                        if !kept_end {
                            self.give_event(d, p.ctx, p.end);
                        }
                    }
                    Query::Failed => {
                        d.destroy_event(p.start);
                        d.destroy_event(p.end);
                    }
                }
            }
        });
        self.pending = keep;
    }

    /// The oldest submission in flight on `dev` (on `stream`, if given).
    fn oldest(&self, dev: usize, stream: Option<StreamKey>) -> Option<Pending> {
        self.pending
            .iter()
            .find(|p| p.dev == dev && stream.is_none_or(|s| p.stream == s))
            .copied()
    }
}

/// The gate of one process (kept in its `Holdings`).
#[derive(Default)]
pub struct Gate {
    meter: Mutex<GateMeter>,
}

/// Where a submission goes.
#[derive(Clone, Copy, Debug)]
pub struct Target {
    /// Device ordinal (the current context's).
    pub dev: usize,
    /// The current context (events are created in it).
    pub ctx: usize,
    /// The stream (`CUstream`) as the application passed it.
    pub stream: usize,
    /// Whether the entry point is a per-thread-default-stream (`_ptsz`) variant.
    pub ptsz: bool,
    /// This thread's token for the container's submission lock (non-zero).
    pub token: u64,
}

impl Gate {
    fn meter(&self) -> std::sync::MutexGuard<'_, GateMeter> {
        self.meter.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Debits what completed (at synchronisations).
    pub fn harvest<'a, D: Driver>(&self, d: &D, cells: impl Fn(usize) -> Option<ComputeCells<'a>>) {
        self.meter().harvest(d, &cells);
    }

    /// Submissions of this process in flight on `dev` (not yet debited).
    pub fn in_flight(&self, dev: usize) -> usize {
        self.meter().in_flight(dev)
    }
}

/// Takes the container's advisory submission lock of a device: while one thread records a
/// submission's events around its launch, no other process of the container submits in
/// between (on a device that runs work in submission order, the other's kernel would land
/// inside this pair and be counted twice). Waits yield, then sleep; a holder that keeps it
/// past [`LOCK_STEAL_NS`] (stopped, dead) is taken over. The lock only sharpens the
/// measurement: nothing depends on it for safety.
pub fn lock_submissions<C: Clock>(lock: &AtomicU64, token: u64, clock: &C) {
    let mut seen = (0u64, 0u64); // (holder, since)
    let mut tries = 0u32;
    loop {
        match lock.compare_exchange(0, token, Ordering::Acquire, Ordering::Relaxed) {
            Ok(_) => return,
            Err(holder) => {
                let now = clock.now_ns();
                if holder != seen.0 {
                    seen = (holder, now);
                } else if now.saturating_sub(seen.1) >= LOCK_STEAL_NS
                    && lock
                        .compare_exchange(holder, token, Ordering::Acquire, Ordering::Relaxed)
                        .is_ok()
                {
                    return;
                }
                tries += 1;
                if tries < 16 {
                    std::thread::yield_now();
                } else {
                    clock.sleep_ns(MIN_SLEEP_NS);
                }
            }
        }
    }
}

/// Releases the submission lock if this thread still holds it.
pub fn unlock_submissions(lock: &AtomicU64, token: u64) {
    let _ = lock.compare_exchange(token, 0, Ordering::Release, Ordering::Relaxed);
}

/// A submission let through the gate and being metered: the process's meter (held until
/// [`after`], so that the two events bracket exactly this submission) and the events, the
/// start one already recorded.
pub struct Ticket<'g> {
    meter: std::sync::MutexGuard<'g, GateMeter>,
    t: Target,
    start: usize,
    end: usize,
    /// The container's submission lock, held until [`after`].
    lock: &'g AtomicU64,
}

/// The gate before a submission on `t.dev`, at the pace `rate(now)` gives (basis points of
/// the GPU and the container's turn, read again at every check; `None`: no limit): waits
/// while too much of this process's work is in flight, outside the container's turn (or too
/// near its end for the work queued to finish in it), while the container's budget is in
/// debt or the rate is 0 (held for a higher priority); then records the start event.
/// `cells(dev)` gives a device's shared budget. `None`: submit unmetered (no limit, a
/// capturing stream, no event to be had).
pub fn before<'g, D: Driver, C: Clock, P: AsPace>(
    gate: &'g Gate,
    d: &D,
    clock: &C,
    cells: impl Fn(usize) -> Option<ComputeCells<'g>>,
    rate: impl Fn(u64) -> P,
    t: Target,
) -> Option<Ticket<'g>> {
    let own = cells(t.dev)?;
    if rate(clock.now_ns()).pace().is_none() || d.capturing(t.stream, t.ptsz) {
        return None;
    }
    let mut waited = 0u64;
    let mut inflight_since: Option<u64> = None;
    loop {
        let key = stream_key(&t);
        let now = clock.now_ns();
        let pace = rate(now).pace();
        let turn = pace.and_then(|p| p.turn);
        let bp = pace.map(|p| p.bp);
        let limit_bp = bp.unwrap_or(FULL_BP);
        let (count, avg, oldest) = {
            let mut m = gate.meter();
            m.harvest(d, &cells);
            let avg = m.avg_ns[t.dev];
            let on_stream = m.in_flight_on(t.dev, key);
            if on_stream >= in_turn_limit(inflight_limit(limit_bp, avg), turn.is_some()) {
                (on_stream, avg, m.oldest(t.dev, Some(key)))
            } else {
                let all = m.in_flight(t.dev);
                (
                    all,
                    avg,
                    (all >= MAX_INFLIGHT)
                        .then(|| m.oldest(t.dev, None))
                        .flatten(),
                )
            }
        };
        if oldest.is_some() {
            let since = *inflight_since.get_or_insert(now);
            if now.saturating_sub(since) < INFLIGHT_WAIT_NS {
                // A 32nd of the queue's expected drain time (20 to 50 us), then look again:
                // with one long kernel in flight the device waits about half a step for the
                // next submission (H200, 1 ms kernels: 100 us steps left a 70 % container at
                // 59 % beside a 30 % one). A waiting thread wakes at most 50,000 times a second.
                let step = (avg.saturating_mul(count as u64) / 32).clamp(MIN_SLEEP_NS, 50_000);
                clock.sleep_ns(step);
                waited += step;
                continue;
            }
        }
        if let Some(turn) = turn {
            // What this process has queued there, and this submission up to its middle, must
            // run in the turn (so that on average a turn is neither wasted nor overrun).
            let need = avg.saturating_mul(count as u64).saturating_add(avg / 2);
            let w = turn.wait_ns(now, need);
            if w > 0 {
                let w = w.clamp(MIN_SLEEP_NS, MAX_SLEEP_NS);
                clock.sleep_ns(w);
                waited += w;
                continue;
            }
        }
        match wait_needed(&own, bp, now) {
            Some(ns) => {
                clock.sleep_ns(ns);
                waited += ns;
            }
            None => break,
        }
    }
    if waited > 0 {
        own.throttled.fetch_add(1, Ordering::Relaxed);
        own.throttled_ns.fetch_add(waited, Ordering::Relaxed);
    }
    let mut m = gate.meter();
    let start = m.take_event(d, t.ctx);
    let end = m.take_event(d, t.ctx);
    let (Some(start), Some(end)) = (start, end) else {
        for ev in [start, end].into_iter().flatten() {
            m.give_event(d, t.ctx, ev);
        }
        crate::debug!("launch gate: no timing event; this submission is not metered");
        return None;
    };
    lock_submissions(own.submit_lock, t.token, clock);
    if !d.record(start, t.stream, t.ptsz) {
        // A stale pooled event (its context went): drop it, submit unmetered.
        unlock_submissions(own.submit_lock, t.token);
        d.destroy_event(start);
        m.give_event(d, t.ctx, end);
        return None;
    }
    Some(Ticket {
        meter: m,
        t,
        start,
        end,
        lock: own.submit_lock,
    })
}

/// The gate after the submission returned `r`: records the end event (a submission that
/// failed is not metered) and returns `r`.
pub fn after<D: Driver>(ticket: Option<Ticket<'_>>, d: &D, r: CUresult) -> CUresult {
    let Some(Ticket {
        mut meter,
        t,
        start,
        end,
        lock,
    }) = ticket
    else {
        return r;
    };
    let recorded = r == CUDA_SUCCESS && d.record(end, t.stream, t.ptsz);
    unlock_submissions(lock, t.token);
    if recorded {
        meter.pending.push_back(Pending {
            dev: t.dev,
            ctx: t.ctx,
            stream: stream_key(&t),
            start,
            end,
        });
    } else {
        meter.give_event(d, t.ctx, start);
        meter.give_event(d, t.ctx, end);
    }
    r
}

/// Submits `real` through the gate: [`before`], `real`, [`after`].
pub fn submit<'a, D: Driver, C: Clock, P: AsPace>(
    gate: &'a Gate,
    d: &D,
    clock: &C,
    cells: impl Fn(usize) -> Option<ComputeCells<'a>>,
    rate: impl Fn(u64) -> P,
    t: Target,
    real: impl FnOnce() -> CUresult,
) -> CUresult {
    let ticket = before(gate, d, clock, cells, rate, t);
    let r = real();
    after(ticket, d, r)
}

mod driver;
mod real;
pub use driver::{Clock, Driver, Query};
pub use real::{RealClock, RealGateDriver};

#[cfg(test)]
mod tests;
