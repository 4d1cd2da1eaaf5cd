//! The launch gate's process-wide switch: one atomic load on the launch path of a process
//! without a compute share. Armed at the first launch from the region's record of each
//! container device (its SM limit and compute policy, [`super::gate::effective_share`]);
//! a process without a region is never armed. The hooks ask it through
//! `hooks/launch.rs` (`gate_enter`, `gate_on_sync`).

use super::gate::effective_share;
use hami_abi::layout::MAX_DEVICES;
use hami_common::region::Region;
use std::sync::atomic::{AtomicU32, AtomicU8, Ordering};

const ARM_UNKNOWN: u8 = 0;
const ARM_OFF: u8 = 1;
const ARM_ON: u8 = 2;

/// Whether any container device has a compute share, and each one's share.
pub struct Arming {
    state: AtomicU8,
    shares: [AtomicU32; MAX_DEVICES],
}

/// The process's switch.
pub static ARMING: Arming = Arming::new();

impl Arming {
    pub const fn new() -> Self {
        Arming {
            state: AtomicU8::new(ARM_UNKNOWN),
            shares: [const { AtomicU32::new(0) }; MAX_DEVICES],
        }
    }

    /// Whether any device has a compute share: the only check on the launch path without
    /// one. The first call reads the shares from `region` (`None`: no region, never armed).
    #[inline]
    pub fn armed<'r>(&self, region: impl FnOnce() -> Option<&'r Region>) -> bool {
        match self.state.load(Ordering::Relaxed) {
            ARM_OFF => false,
            ARM_ON => true,
            _ => self.arm(region()),
        }
    }

    #[cold]
    #[inline(never)]
    fn arm(&self, region: Option<&Region>) -> bool {
        let mut any = false;
        if let Some(region) = region {
            for (d, s) in self.shares.iter().enumerate() {
                let pct = effective_share(region.sm_limit(d), region.compute_policy(d));
                s.store(pct, Ordering::Relaxed);
                any |= pct != 0;
            }
        }
        self.state
            .store(if any { ARM_ON } else { ARM_OFF }, Ordering::Release);
        any
    }

    /// The effective share of container device `c` (0 = none), once [`Arming::armed`].
    pub fn share(&self, c: usize) -> u32 {
        self.shares.get(c).map_or(0, |s| s.load(Ordering::Relaxed))
    }
}

impl Default for Arming {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_a_region_the_switch_stays_off() {
        let a = Arming::new();
        assert!(!a.armed(|| None));
        // Decided once: a later region is not read.
        assert!(!a.armed(|| panic!("read again")));
        assert_eq!(a.share(0), 0);
        assert_eq!(a.share(MAX_DEVICES), 0);
    }
}
