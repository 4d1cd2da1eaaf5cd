//! The per-device compute records ([`hami_abi::layout::DeviceCompute`]): the container's
//! compute share (set at creation) and the launch gate's shared budget, all lock-free.
//!
//! The budget's algorithm (refill, debit) lives in the preload's gate; this module only
//! hands out the atomics, so that the preload, the agent and `inspect` read the same fields.

use core::ptr::addr_of;
use core::sync::atomic::{AtomicI64, AtomicU32, AtomicU64, Ordering};

use super::handle::*;
use super::types::*;
use hami_abi::layout::{COMPUTE_POLICY_DEFAULT, MAX_DEVICES};

/// The launch gate's shared atomics of one device (references into the mapping, or into
/// any other storage: unit tests build them from local atomics).
#[derive(Clone, Copy, Debug)]
pub struct ComputeCells<'a> {
    /// Device time (ns) the container may still use; negative = debt.
    pub budget_ns: &'a AtomicI64,
    /// `CLOCK_MONOTONIC` ns up to which the budget has been refilled.
    pub refilled_at_ns: &'a AtomicU64,
    /// Total metered device time (ns).
    pub consumed_ns: &'a AtomicU64,
    /// Number of submissions that waited at the gate.
    pub throttled: &'a AtomicU64,
    /// Total time (ns) spent waiting at the gate.
    pub throttled_ns: &'a AtomicU64,
    /// The advisory submission lock (`DeviceCompute::submit_lock`).
    pub submit_lock: &'a AtomicU64,
}

/// A device whose compute configuration in the caller's environment differs from the
/// region's (the region's applies; the caller logs a warning).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ComputeDifference {
    /// Device ordinal.
    pub dev: usize,
    /// Share in force (percent, 0 = none).
    pub region_sm_limit: u32,
    /// Policy in force (`COMPUTE_POLICY_*`).
    pub region_policy: u32,
    /// Share the caller asked for.
    pub requested_sm_limit: u32,
    /// Policy the caller asked for.
    pub requested_policy: u32,
}

/// The task priority a region's `task_priority` field holds (the value + 1; 0: HAMi's
/// default).
pub fn task_priority_of(raw: u32) -> u32 {
    raw.checked_sub(1)
        .unwrap_or(crate::config::DEFAULT_TASK_PRIORITY)
}

/// One device's words of an arbiter decision: (device, grant word
/// ([`crate::arbiter::encode_grant`]), turn word ([`crate::arbiter::encode_turn`])).
pub type ArbiterWords = (usize, u32, u32);

/// Writes an arbiter decision into the region open as `file` with `pwrite` (the agent's way:
/// no mapping, no lock): each device's grant and turn words (4 aligned bytes each), then the
/// stamp. A word torn by a concurrent reader's view decodes as no grant (the share applies
/// for that instant) or no turn; see `docs/shared-region.md`, "The arbiter's fields".
pub fn write_arbiter(
    file: &std::fs::File,
    words: &[ArbiterWords],
    at_ns: u64,
) -> std::io::Result<()> {
    use core::mem::offset_of;
    use hami_abi::layout::RegionHeader;
    use std::os::unix::fs::FileExt;
    // Never grow a file that is no (longer a) region: a truncated one stays truncated.
    if file.metadata()?.len() != hami_abi::layout::REGION_SIZE as u64 {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "not a region's size: not written",
        ));
    }
    for &(d, g, t) in words {
        if d < MAX_DEVICES {
            let off = offset_of!(RegionHeader, grants) + 4 * d;
            file.write_all_at(&g.to_le_bytes(), off as u64)?;
            let off = offset_of!(RegionHeader, turns) + 4 * d;
            file.write_all_at(&t.to_le_bytes(), off as u64)?;
        }
    }
    file.write_all_at(
        &at_ns.to_le_bytes(),
        offset_of!(RegionHeader, arbiter_at_ns) as u64,
    )
}

/// Name of a `COMPUTE_POLICY_*` value, as `GPU_CORE_UTILIZATION_POLICY` spells it.
pub fn compute_policy_name(policy: u32) -> &'static str {
    crate::config::CorePolicy::from_region(policy).map_or("unknown", |p| p.name())
}

impl Region {
    fn c_sm_limit(&self, d: usize) -> &AtomicU32 {
        // SAFETY: atomic field of the live mapping; d < MAX_DEVICES (indexing panics
        // otherwise; callers check).
        unsafe { &*addr_of!((*self.map.as_ptr()).compute[d].sm_limit) }
    }

    fn c_policy(&self, d: usize) -> &AtomicU32 {
        // SAFETY: as c_sm_limit.
        unsafe { &*addr_of!((*self.map.as_ptr()).compute[d].policy) }
    }

    /// The compute share of device `dev` in percent (1..=100), 0 = no compute limit (also
    /// for an ordinal the region does not describe).
    pub fn sm_limit(&self, dev: usize) -> u32 {
        if dev >= MAX_DEVICES {
            return 0;
        }
        self.c_sm_limit(dev).load(Ordering::Relaxed)
    }

    /// The `COMPUTE_POLICY_*` of device `dev` as the region's creator configured it
    /// ([`COMPUTE_POLICY_DEFAULT`] for an ordinal the region does not describe).
    pub fn compute_policy(&self, dev: usize) -> u32 {
        if dev >= MAX_DEVICES {
            return COMPUTE_POLICY_DEFAULT;
        }
        self.c_policy(dev).load(Ordering::Relaxed)
    }

    /// The launch gate's atomics of device `dev`, or `None` past [`MAX_DEVICES`].
    pub fn compute_cells(&self, dev: usize) -> Option<ComputeCells<'_>> {
        if dev >= MAX_DEVICES {
            return None;
        }
        let c = self.map.as_ptr();
        // SAFETY: atomic fields of the live mapping; dev < MAX_DEVICES.
        unsafe {
            Some(ComputeCells {
                budget_ns: &*addr_of!((*c).compute[dev].budget_ns),
                refilled_at_ns: &*addr_of!((*c).compute[dev].refilled_at_ns),
                consumed_ns: &*addr_of!((*c).compute[dev].consumed_ns),
                throttled: &*addr_of!((*c).compute[dev].throttled),
                throttled_ns: &*addr_of!((*c).compute[dev].throttled_ns),
                submit_lock: &*addr_of!((*c).compute[dev].submit_lock),
            })
        }
    }

    fn h_grant(&self, d: usize) -> &AtomicU32 {
        // SAFETY: atomic field of the live mapping; d < MAX_DEVICES (callers check).
        unsafe { &*addr_of!((*self.map.as_ptr()).header.grants[d]) }
    }

    fn h_turn(&self, d: usize) -> &AtomicU32 {
        // SAFETY: atomic field of the live mapping; d < MAX_DEVICES (callers check).
        unsafe { &*addr_of!((*self.map.as_ptr()).header.turns[d]) }
    }

    /// The arbiter's turn word of device `dev` (0: none; [`crate::arbiter::decode_turn`]).
    pub fn arbiter_turn(&self, dev: usize) -> u32 {
        if dev >= MAX_DEVICES {
            return 0;
        }
        self.h_turn(dev).load(Ordering::Acquire)
    }

    /// The turn the launch gate keeps to on device `dev` at `now_ns`
    /// ([`crate::arbiter::turn_at`]); `None`: submit at any time.
    pub fn compute_turn(&self, dev: usize, now_ns: u64) -> Option<crate::arbiter::Turn> {
        crate::arbiter::turn_at(self.arbiter_turn(dev), self.arbiter_at_ns(), now_ns)
    }

    fn h_arbiter_at(&self) -> &AtomicU64 {
        // SAFETY: atomic field of the live mapping.
        unsafe { &*addr_of!((*self.map.as_ptr()).header.arbiter_at_ns) }
    }

    /// The container's `CUDA_TASK_PRIORITY` as its creator recorded it (HAMi's default,
    /// [`crate::config::DEFAULT_TASK_PRIORITY`], in a file that records none).
    pub fn task_priority(&self) -> u32 {
        // SAFETY: atomic field of the live mapping.
        let raw = unsafe { &*addr_of!((*self.map.as_ptr()).header.task_priority) };
        task_priority_of(raw.load(Ordering::Relaxed))
    }

    /// The arbiter's grant word of device `dev` (0: none; [`crate::arbiter::decode_grant`]).
    pub fn arbiter_grant(&self, dev: usize) -> u32 {
        if dev >= MAX_DEVICES {
            return 0;
        }
        self.h_grant(dev).load(Ordering::Acquire)
    }

    /// `CLOCK_MONOTONIC` ns of the arbiter's latest decision (0: never).
    pub fn arbiter_at_ns(&self) -> u64 {
        self.h_arbiter_at().load(Ordering::Acquire)
    }

    /// The rate (basis points) the launch gate holds device `dev` to at `now_ns`
    /// ([`crate::arbiter::rate_bp`]); `None`: no limit.
    pub fn compute_rate_bp(&self, dev: usize, now_ns: u64) -> Option<u32> {
        if dev >= MAX_DEVICES {
            return None;
        }
        let at = self.arbiter_at_ns();
        crate::arbiter::rate_bp(
            self.sm_limit(dev),
            self.compute_policy(dev),
            self.arbiter_grant(dev),
            at,
            now_ns,
        )
    }

    /// Writes an arbiter decision through this mapping: each device's grant and turn words,
    /// then the decision's stamp (`at_ns`, `CLOCK_MONOTONIC`). Nothing on a read-only
    /// mapping. (The agent, which does not map regions, writes the same words with
    /// [`super::write_arbiter`].)
    pub fn set_arbiter(&self, words: &[ArbiterWords], at_ns: u64) {
        if !self.writable {
            return;
        }
        for &(d, g, t) in words {
            if d < MAX_DEVICES {
                self.h_grant(d).store(g, Ordering::Release);
                self.h_turn(d).store(t, Ordering::Release);
            }
        }
        self.h_arbiter_at().store(at_ns, Ordering::Release);
    }

    fn c_refusals(&self, d: usize) -> &AtomicU64 {
        // SAFETY: as c_sm_limit.
        unsafe { &*addr_of!((*self.map.as_ptr()).compute[d].refusals) }
    }

    /// Counts one memory request refused on device `dev` (`DeviceCompute::refusals`):
    /// one lock-free increment; nothing for an ordinal the region does not describe.
    pub fn count_refusal(&self, dev: usize) {
        if dev < MAX_DEVICES {
            self.c_refusals(dev).fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Memory requests refused on device `dev` so far (0 for an ordinal the region does
    /// not describe).
    pub fn refusals(&self, dev: usize) -> u64 {
        if dev >= MAX_DEVICES {
            return 0;
        }
        self.c_refusals(dev).load(Ordering::Relaxed)
    }

    /// Devices whose compute share or policy in `cfg` differs from the region's.
    pub fn compute_differences(&self, cfg: &RegionConfig) -> Vec<ComputeDifference> {
        (0..MAX_DEVICES)
            .filter_map(|d| {
                let (region_sm_limit, region_policy) = (self.sm_limit(d), self.compute_policy(d));
                let (requested_sm_limit, requested_policy) = (cfg.sm_limits[d], cfg.compute_policy);
                (region_sm_limit != requested_sm_limit || region_policy != requested_policy)
                    .then_some(ComputeDifference {
                        dev: d,
                        region_sm_limit,
                        region_policy,
                        requested_sm_limit,
                        requested_policy,
                    })
            })
            .collect()
    }
}
