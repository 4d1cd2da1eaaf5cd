//! The GPU's arbiter of compute shares (issue 30): what each container may use of each GPU,
//! decided by the node agent at most every [`PERIOD_NS`] and written into the container's
//! region (`RegionHeader::grants`, `arbiter_at_ns`), and the rule the launch gate applies to
//! it ([`rate_bp`]). See `docs/preload.md`, "Compute share", and `docs/shared-region.md`,
//! "The arbiter's fields".
//!
//! * **`default` is work-conserving**: a container is guaranteed its share; while several
//!   are busy on a GPU, the time no one is guaranteed is lent to the busy ones in proportion
//!   to their shares (30 % and 50 % both busy: 37.5 % and 62.5 %; one alone: the whole GPU).
//! * **`force` is a hard cap**: never more than the share (a grant can only lower it, for a
//!   priority). **`disable`** and no share: never limited, never granted.
//! * **Priorities with HAMi's meanings** (`CUDA_TASK_PRIORITY`, 0 the highest, 1 HAMi's
//!   default): while a container of a higher priority is busy on the GPU, every container of a
//!   lower one there is **suspended** (granted 0: its submissions wait at the gate), as HAMi's
//!   monitor blocks them; they resume at the first decision after it went idle.
//! * **Without an arbiter** (no decision, or the latest older than [`GRANT_TTL_NS`]): the
//!   share, as `force`.
//! * **Turns** ([`Turn`]): while two or more containers with a share contend for a GPU (each
//!   waited at its gate and used at least [`HOT_FRACTION`] of its grant within
//!   [`BUSY_WINDOW_NS`], and no busy container there runs without a share), each is given a window of every [`TURN_PERIOD_NS`] as long as its
//!   grant's part of it, one after the other. The gate submits only inside its window, so
//!   that the GPU switches between them twice a period instead of at every kernel, and no
//!   container's kernel is preempted by another's time slice (on the H100, two busy 50 %
//!   containers lost 12 % of the GPU to those switches: 44.1 % each).
//!
//! [`decide`] is the pure decision for one GPU; [`Arbiter`] keeps what it needs between
//! decisions (who was busy, what it wrote) and turns observations of regions into grant
//! words; the agent reads and writes the regions.

use std::collections::HashMap;
use std::vec::Vec;

use crate::config::{share_percent, CorePolicy};

/// Most often the arbiter decides (ns): every 100 ms.
pub const PERIOD_NS: u64 = 100_000_000;
/// A decision older than this (ns of `CLOCK_MONOTONIC`) is ignored by the gate: a killed or
/// stopped arbiter leaves every container at its share (as `force`) within this much after
/// its last decision.
pub const GRANT_TTL_NS: u64 = 500_000_000;
/// A decision stamped further than this in the future is not believed (a torn or
/// hand-written stamp).
pub const FUTURE_SLACK_NS: u64 = 1_000_000_000;
/// A container that used device time (or waited at the gate) within this long is busy.
pub const BUSY_WINDOW_NS: u64 = 300_000_000;
/// The whole GPU, in basis points (1/100 of a percent).
pub const FULL_BP: u32 = 10_000;
/// The period turns divide (ns of `CLOCK_MONOTONIC`, the same clock in every container of a
/// node): 40 ms, so that the two switches a period between two contending containers
/// (about 100-130 us each on the H100 and the H200) cost under 1 % of the GPU.
pub const TURN_PERIOD_NS: u64 = 40_000_000;
/// Units a turn's start and length are given in: a 250th of [`TURN_PERIOD_NS`] (160 us).
pub const TURN_UNITS: u32 = 250;

/// A container's window of every [`TURN_PERIOD_NS`] on one GPU: from `start` to
/// `start + len` units of [`TURN_UNITS`] after each multiple of the period.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Turn {
    /// Start, in units (`0..TURN_UNITS`).
    pub start: u8,
    /// Length, in units (`1..=TURN_UNITS - start`).
    pub len: u8,
}

impl Turn {
    /// ns of `CLOCK_MONOTONIC` per unit.
    pub const UNIT_NS: u64 = TURN_PERIOD_NS / TURN_UNITS as u64;

    /// How long (ns) a submission expected to occupy the GPU for `need_ns` (with what is
    /// already queued) must wait at `now_ns` for this turn: 0 when the turn is open and has
    /// that much left, else until the turn next opens. A need above half the turn is taken
    /// as half (work longer than a turn starts in its first half and overruns it).
    pub fn wait_ns(&self, now_ns: u64, need_ns: u64) -> u64 {
        let s = u64::from(self.start) * Self::UNIT_NS;
        let len = u64::from(self.len) * Self::UNIT_NS;
        let e = s + len;
        let need = need_ns.min(len / 2);
        let phase = now_ns % TURN_PERIOD_NS;
        if phase >= s && phase.saturating_add(need) <= e {
            0
        } else if phase < s {
            s - phase
        } else {
            TURN_PERIOD_NS - phase + s
        }
    }
}

/// A turn as the region holds it (`RegionHeader::turns`): the low half `start | len << 8`,
/// the high half its complement; `None` is 0.
pub fn encode_turn(t: Option<Turn>) -> u32 {
    match t {
        None => 0,
        Some(t) => {
            let lo = u32::from(t.start) | u32::from(t.len) << 8;
            lo | ((!lo & 0xffff) << 16)
        }
    }
}

/// The turn a region's word holds: `None` for 0 (no turn), a torn or hand-made word, an
/// empty turn or one reaching past the period.
pub fn decode_turn(word: u32) -> Option<Turn> {
    let lo = word & 0xffff;
    if word >> 16 != !lo & 0xffff {
        return None;
    }
    let t = Turn {
        start: (lo & 0xff) as u8,
        len: (lo >> 8) as u8,
    };
    (t.len > 0 && u32::from(t.start) + u32::from(t.len) <= TURN_UNITS).then_some(t)
}

/// The turns of one GPU's contenders, in order, from their grants (basis points): each as
/// long as its grant's part of the period (rounded down, at least one unit), one after the
/// other from the period's start. When the grants add up to the whole GPU (the arbiter lent
/// the idle time, or `force` shares that fill it) the units rounding leaves over go one each
/// to the largest remainders, so that no part of the period is no one's. `None` for all when
/// fewer than two contend or a grant is 0 (a held container submits nothing: no turn is
/// needed).
pub fn assign_turns(grants_bp: &[u32]) -> Vec<Option<Turn>> {
    if grants_bp.len() < 2 || grants_bp.contains(&0) {
        return vec![None; grants_bp.len()];
    }
    let bps: Vec<u64> = grants_bp
        .iter()
        .map(|&b| u64::from(b.min(FULL_BP)))
        .collect();
    let total: u64 = bps.iter().sum();
    // Oversubscribed (force shares above the whole GPU): scaled to fit the period.
    let scale = total.max(u64::from(FULL_BP));
    let units = u64::from(TURN_UNITS);
    let mut lens: Vec<u64> = bps.iter().map(|&b| (b * units / scale).max(1)).collect();
    if total >= u64::from(FULL_BP) {
        // Each length lost less than a unit: fewer units are left than contenders.
        let left = units.saturating_sub(lens.iter().sum()) as usize;
        let mut order: Vec<usize> = (0..bps.len()).collect();
        // Largest remainder first; ties to the earlier container.
        order.sort_by_key(|&k| std::cmp::Reverse(bps[k] * units % scale));
        for &k in order.iter().take(left) {
            lens[k] += 1;
        }
    }
    let mut at = 0u32;
    lens.iter()
        .map(|&len| {
            let len = (len as u32).min(TURN_UNITS.saturating_sub(at));
            if len == 0 {
                return None;
            }
            let t = Turn {
                start: at as u8,
                len: len as u8,
            };
            at += len;
            Some(t)
        })
        .collect()
}

/// The turn the gate keeps to at `now_ns`: the word's, while the decision stamped `at_ns` is
/// fresh ([`fresh`]); `None` (submit at any time) otherwise.
pub fn turn_at(word: u32, at_ns: u64, now_ns: u64) -> Option<Turn> {
    fresh(at_ns, now_ns).then(|| decode_turn(word)).flatten()
}

/// What one container may use of one GPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Grant {
    /// Basis points of the GPU's time, `0..=FULL_BP` (0: suspended).
    pub bp: u32,
    /// Held back (suspended) because a container of a higher priority is busy.
    pub held: bool,
    /// Above the container's share: idle time lent to it.
    pub lent: bool,
}

const HELD_BIT: u32 = 1 << 14;
const LENT_BIT: u32 = 1 << 15;
const BP_MASK: u32 = (1 << 14) - 1;

/// A grant as the region holds it: the low half carries the basis points and the flags, the
/// high half their complement, so that a torn write, a zero or a hand-made value decodes as
/// no grant ([`decode_grant`]).
pub fn encode_grant(g: Grant) -> u32 {
    let lo =
        g.bp.min(FULL_BP) | if g.held { HELD_BIT } else { 0 } | if g.lent { LENT_BIT } else { 0 };
    lo | ((!lo & 0xffff) << 16)
}

/// The grant a region's word holds, `None` when it holds none (0) or an inconsistent value.
pub fn decode_grant(word: u32) -> Option<Grant> {
    let lo = word & 0xffff;
    if word >> 16 != !lo & 0xffff || lo & BP_MASK > FULL_BP {
        return None;
    }
    Some(Grant {
        bp: lo & BP_MASK,
        held: lo & HELD_BIT != 0,
        lent: lo & LENT_BIT != 0,
    })
}

/// Whether a decision stamped `at_ns` holds at `now_ns` (both `CLOCK_MONOTONIC`): not
/// older than [`GRANT_TTL_NS`], not further ahead than [`FUTURE_SLACK_NS`].
pub fn fresh(at_ns: u64, now_ns: u64) -> bool {
    at_ns != 0
        && at_ns <= now_ns.saturating_add(FUTURE_SLACK_NS)
        && now_ns.saturating_sub(at_ns) <= GRANT_TTL_NS
}

/// The rate (basis points of the GPU's time) the launch gate holds a device to, from the
/// region's share (`sm_limit`), policy, grant word and decision stamp; `None`: no limit.
/// Without a fresh, well-formed grant: the share. `force`: the share, or less if granted
/// less (a priority). `default`: the grant (more than the share when lent, 0 when held).
pub fn rate_bp(sm_limit: u32, policy: u32, grant: u32, at_ns: u64, now_ns: u64) -> Option<u32> {
    let share = share_percent(sm_limit, policy)? * 100;
    let g = fresh(at_ns, now_ns).then(|| decode_grant(grant)).flatten();
    Some(match g {
        None => share,
        Some(g) if policy == CorePolicy::Force as u32 => share.min(g.bp),
        Some(g) => g.bp,
    })
}

/// One container on one GPU, as the arbiter sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tenant {
    /// The share it is held to (percent, `1..=99`), `None` without one (no limit, or
    /// `disable`).
    pub share: Option<u32>,
    /// Its `COMPUTE_POLICY_*`.
    pub policy: u32,
    /// Its `CUDA_TASK_PRIORITY` (0 the highest).
    pub priority: u32,
    /// Whether it used the GPU recently ([`BUSY_WINDOW_NS`]).
    pub busy: bool,
}

/// The decision for one GPU: per tenant, in order, its grant (`None`: none, it has no share).
///
/// * The *top* priority is the highest (numerically lowest) of the busy tenants; tenants of a
///   lower priority are held (0), busy or not, so that one starting meanwhile does not run
///   either.
/// * `force` tenants at the top get their share (a hard cap).
/// * Busy `default` tenants at the top share what the busy `force` ones there leave, in
///   proportion to their shares, and never less than their share.
/// * Idle tenants at the top get their share: guaranteed the moment they start (the others
///   are brought back to theirs at the next decision).
pub fn decide(tenants: &[Tenant]) -> Vec<Option<Grant>> {
    let top = tenants.iter().filter(|t| t.busy).map(|t| t.priority).min();
    let runs = |t: &Tenant| top.is_none_or(|p| t.priority <= p);
    let force = CorePolicy::Force as u32;
    let forced: u32 = tenants
        .iter()
        .filter(|t| t.busy && runs(t) && t.policy == force)
        .filter_map(|t| t.share)
        .map(|s| s * 100)
        .sum();
    let weights: u32 = tenants
        .iter()
        .filter(|t| t.busy && runs(t) && t.policy != force)
        .filter_map(|t| t.share)
        .sum();
    let spare = FULL_BP.saturating_sub(forced);
    tenants
        .iter()
        .map(|t| {
            let own = t.share? * 100;
            Some(if !runs(t) {
                Grant {
                    bp: 0,
                    held: true,
                    lent: false,
                }
            } else if t.policy != force && t.busy && weights > 0 {
                let bp = (u64::from(spare) * u64::from(own / 100) / u64::from(weights)) as u32;
                let bp = bp.max(own).min(FULL_BP);
                Grant {
                    bp,
                    held: false,
                    lent: bp > own,
                }
            } else {
                Grant {
                    bp: own,
                    held: false,
                    lent: false,
                }
            })
        })
        .collect()
}

/// The turns of one GPU's tenants (in order) from their grants: given to the tenants that
/// run (not held), have a share and contend (`contending(k)`: waited at the gate recently
/// and used most of their grant, [`HOT_FRACTION`]),
/// when there are at least two of them and no busy tenant there runs without a share (its
/// work would land in the others' turns). `None` for the rest.
pub fn turns_for(
    tenants: &[Tenant],
    grants: &[Option<Grant>],
    contending: impl Fn(usize) -> bool,
) -> Vec<Option<Turn>> {
    let mut out = vec![None; tenants.len()];
    if tenants.iter().any(|t| t.busy && t.share.is_none()) {
        return out;
    }
    let who: Vec<usize> = (0..tenants.len())
        .filter(|&k| {
            grants
                .get(k)
                .copied()
                .flatten()
                .is_some_and(|g| !g.held && g.bp > 0)
                && tenants[k].busy
                && contending(k)
        })
        .collect();
    let bps: Vec<u32> = who
        .iter()
        .filter_map(|&k| grants[k].map(|g| g.bp))
        .collect();
    for (k, t) in who.into_iter().zip(assign_turns(&bps)) {
        out[k] = t;
    }
    out
}

/// One container's device as the agent read it from its region.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Observed {
    /// The region (any key that stays the same while the region is open: its file id).
    pub region: u64,
    /// The region's device ordinal.
    pub dev: usize,
    /// The GPU (its UUID as the region records it; all zero: unknown, not arbitrated).
    pub gpu: [u8; 16],
    /// `DeviceCompute::sm_limit`.
    pub sm_limit: u32,
    /// `DeviceCompute::policy`.
    pub policy: u32,
    /// The container's priority (`Region::task_priority`).
    pub priority: u32,
    /// `DeviceCompute::consumed_ns`.
    pub consumed_ns: u64,
    /// `DeviceCompute::throttled`.
    pub throttled: u64,
    /// The grant word the region holds now.
    pub grant: u32,
}

/// A grant to write into a region.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Decision {
    /// [`Observed::region`].
    pub region: u64,
    /// [`Observed::dev`].
    pub dev: usize,
    /// The decision.
    pub grant: Grant,
    /// The container's share (percent).
    pub share: u32,
    /// Whether it is busy.
    pub busy: bool,
    /// Its turn while several contend for the GPU ([`assign_turns`]); `None`: any time.
    pub turn: Option<Turn>,
    /// The word the region held differed from the one the arbiter wrote last: someone else
    /// wrote it (tampering, undone by this write).
    pub tampered: bool,
}

#[derive(Clone, Copy, Debug, Default)]
struct Activity {
    consumed: u64,
    throttled: u64,
    last_active: Option<u64>,
    /// When it was last seen waiting at its gate.
    last_throttled: Option<u64>,
    /// When it was last seen using most of what it was granted ([`HOT_FRACTION`]).
    hot_at: Option<u64>,
    /// When it was observed last (the start of the interval its use is measured over).
    seen_at: Option<u64>,
}

/// A container that used at least this fraction of its grant since the previous decision
/// wants all it is given: with waits at its gate, it contends for the GPU (turns). A
/// container in turns waits for its turn whatever it wants, so waiting alone does not say
/// it wants more: an inference server between bursts uses far less than its grant and is
/// let out of turns (its requests then do not wait for a window).
pub const HOT_FRACTION: f64 = 0.75;

/// The arbiter's memory between decisions: when each container's device was last busy, and
/// the word written last.
#[derive(Debug, Default)]
pub struct Arbiter {
    activity: HashMap<(u64, usize), Activity>,
    written: HashMap<(u64, usize), u32>,
}

impl Arbiter {
    /// A new arbiter (every container idle until seen using the GPU).
    pub fn new() -> Arbiter {
        Arbiter::default()
    }

    /// Decides for every GPU from `obs` (every open region's devices, read at `now_ns`):
    /// the grants to write, with the tampering seen. Forgets regions no longer observed.
    pub fn tick(&mut self, now_ns: u64, obs: &[Observed]) -> Vec<Decision> {
        let mut busy = Vec::with_capacity(obs.len());
        let mut contending = Vec::with_capacity(obs.len());
        let recent = |t: Option<u64>| t.is_some_and(|t| now_ns.saturating_sub(t) <= BUSY_WINDOW_NS);
        for o in obs {
            let key = (o.region, o.dev);
            let granted_bp = self
                .written
                .get(&key)
                .and_then(|&w| decode_grant(w))
                .map(|g| g.bp)
                .or_else(|| share_percent(o.sm_limit, o.policy).map(|s| s * 100));
            let a = self.activity.entry(key).or_insert(Activity {
                consumed: o.consumed_ns,
                throttled: o.throttled,
                last_active: None,
                last_throttled: None,
                hot_at: None,
                seen_at: None,
            });
            if o.consumed_ns != a.consumed || o.throttled != a.throttled {
                a.last_active = Some(now_ns);
            }
            if o.throttled != a.throttled {
                a.last_throttled = Some(now_ns);
            }
            if let (Some(prev), Some(bp)) = (a.seen_at, granted_bp) {
                let dt = now_ns.saturating_sub(prev) as f64;
                let used = o.consumed_ns.saturating_sub(a.consumed) as f64;
                let granted = dt * f64::from(bp) / f64::from(FULL_BP);
                if dt > 0.0 && bp > 0 && used >= HOT_FRACTION * granted {
                    a.hot_at = Some(now_ns);
                }
            }
            a.seen_at = Some(now_ns);
            a.consumed = o.consumed_ns;
            a.throttled = o.throttled;
            busy.push(recent(a.last_active));
            contending.push(recent(a.last_throttled) && recent(a.hot_at));
        }
        let keys: std::collections::HashSet<_> = obs.iter().map(|o| (o.region, o.dev)).collect();
        self.activity.retain(|k, _| keys.contains(k));
        self.written.retain(|k, _| keys.contains(k));
        let mut gpus: Vec<[u8; 16]> = obs
            .iter()
            .map(|o| o.gpu)
            .filter(|g| *g != [0; 16])
            .collect();
        gpus.sort_unstable();
        gpus.dedup();
        let mut out = Vec::new();
        for gpu in gpus {
            let members: Vec<usize> = (0..obs.len()).filter(|&i| obs[i].gpu == gpu).collect();
            let tenants: Vec<Tenant> = members
                .iter()
                .map(|&i| Tenant {
                    share: share_percent(obs[i].sm_limit, obs[i].policy),
                    policy: obs[i].policy,
                    priority: obs[i].priority,
                    busy: busy[i],
                })
                .collect();
            let grants = decide(&tenants);
            let turns = turns_for(&tenants, &grants, |k| contending[members[k]]);
            for (k, g) in grants.into_iter().enumerate() {
                let (o, t) = (&obs[members[k]], &tenants[k]);
                let (Some(grant), Some(share)) = (g, t.share) else {
                    continue;
                };
                let key = (o.region, o.dev);
                let tampered = self.written.get(&key).is_some_and(|&w| w != o.grant);
                self.written.insert(key, encode_grant(grant));
                out.push(Decision {
                    region: o.region,
                    dev: o.dev,
                    grant,
                    share,
                    busy: t.busy,
                    turn: turns[k],
                    tampered,
                });
            }
        }
        out
    }

    /// Forgets what was written into a region's device (it could not be written: the next
    /// word seen there is not taken for tampering).
    pub fn unwritten(&mut self, region: u64, dev: usize) {
        self.written.remove(&(region, dev));
    }
}

#[cfg(test)]
mod tests;
