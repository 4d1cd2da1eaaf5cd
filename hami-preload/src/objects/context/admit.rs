//! Admission of a context before the driver creates it: the plain policy.
//!
//! A context is admitted with its device's *footprint* (what one context took there, as a
//! process of the region last measured it, kept in the region's `context_footprint`) before
//! the driver is called, so that a context that does not fit the quota is refused with
//! `CUDA_ERROR_OUT_OF_MEMORY`, as a full GPU refuses it, instead of being created and charged
//! beyond the quota. After the creation the measurement replaces the admitted figure
//! ([`settle`]) and, when it is a reliable figure for a new process's context, becomes the
//! device's footprint for the next context of any process of the container.

use crate::ledger::policy::ContextCost;

/// What a context creation is admitted with before the driver is called.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Footprint {
    /// `HAMI_CONTEXT_OVERHEAD`: the configured figure is the footprint.
    Configured(u64),
    /// Measured earlier on this device by a process of the region.
    Measured(u64),
    /// Not measured yet: the container's first context on the device. The creator takes
    /// the region's context-creation lock, so that other processes starting at the same
    /// moment wait until it is measured and then admit it.
    Unknown,
}

impl Footprint {
    /// Bytes admitted before the creation (nothing when unknown).
    pub fn bytes(self) -> u64 {
        match self {
            Footprint::Configured(b) | Footprint::Measured(b) => b,
            Footprint::Unknown => 0,
        }
    }
}

/// The footprint to admit: the configured overhead if set, else the region's figure for the
/// device (`stored`, 0 = not measured yet).
pub fn footprint(configured: Option<u64>, stored: u64) -> Footprint {
    match (configured, stored) {
        (Some(b), _) => Footprint::Configured(b),
        (None, 0) => Footprint::Unknown,
        (None, b) => Footprint::Measured(b),
    }
}

/// What a created context stays charged, and what the region learns from it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Settled {
    /// Bytes the context is charged from now on (the difference from what was admitted is
    /// charged, beyond the quota if need be since the driver already holds it, or given back).
    pub charged: u64,
    /// The device's new footprint, to store in the region (`None`: keep what it holds).
    pub store: Option<u64>,
}

/// After a creation admitted with `admitted` bytes and measured as `cost`: the measurement
/// replaces the admitted figure; a measurement that failed keeps it (the best figure known).
/// The region's footprint is replaced only by a figure that is one context of a new process:
/// this process's first context on the device (`first_in_process`; a further context of a
/// process may cost less, as per-process driver state is shared), measured by a method that
/// other processes cannot disturb (per process, or a device delta under the context-creation
/// lock; not the driver-only residual, which counts other containers' memory). The
/// configured overhead is not a measurement and is never stored; neither is a measured 0
/// (0 means "not measured").
pub fn settle(admitted: u64, cost: ContextCost, first_in_process: bool) -> Settled {
    let reliable = match cost {
        ContextCost::PerProcess(_) => true,
        ContextCost::DeviceDelta { serialized, .. } => serialized,
        // Driver-only: a process's first context is the residual (device used minus what the
        // region accounts), which counts other containers' memory on a shared GPU; a further
        // context's delta is not a new process's footprint. Charged, never stored.
        ContextCost::Driver { .. } => false,
        ContextCost::Configured(_) | ContextCost::Unknown => false,
    };
    let charged = match cost {
        ContextCost::Unknown => admitted,
        c => c.bytes(),
    };
    Settled {
        charged,
        store: (reliable && first_in_process && charged > 0).then_some(charged),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MB: u64 = 1 << 20;

    #[test]
    fn the_configured_overhead_wins_and_zero_means_not_measured() {
        assert_eq!(
            footprint(Some(64 * MB), 518 * MB),
            Footprint::Configured(64 * MB)
        );
        assert_eq!(footprint(Some(0), 0), Footprint::Configured(0));
        assert_eq!(footprint(None, 0), Footprint::Unknown);
        assert_eq!(footprint(None, 518 * MB), Footprint::Measured(518 * MB));
        assert_eq!(Footprint::Unknown.bytes(), 0);
        assert_eq!(Footprint::Measured(3).bytes(), 3);
    }

    #[test]
    fn the_measurement_replaces_the_admitted_figure() {
        // Measured more than admitted: charged what the driver took.
        let s = settle(300 * MB, ContextCost::PerProcess(518 * MB), true);
        assert_eq!(s.charged, 518 * MB);
        assert_eq!(s.store, Some(518 * MB));
        // Less: the difference goes back.
        let s = settle(518 * MB, ContextCost::PerProcess(300 * MB), true);
        assert_eq!(s.charged, 300 * MB);
        assert_eq!(s.store, Some(300 * MB));
        // Not measurable: the admitted footprint stays, the region keeps its figure.
        let s = settle(518 * MB, ContextCost::Unknown, true);
        assert_eq!(
            s,
            Settled {
                charged: 518 * MB,
                store: None
            }
        );
        // The first context of the container, unknown and unmeasurable: nothing.
        assert_eq!(settle(0, ContextCost::Unknown, true).charged, 0);
    }

    #[test]
    fn only_reliable_figures_of_a_processs_first_context_are_stored() {
        let serialized = ContextCost::DeviceDelta {
            bytes: 500 * MB,
            serialized: true,
        };
        let unserialized = ContextCost::DeviceDelta {
            bytes: 1000 * MB,
            serialized: false,
        };
        let driver = ContextCost::Driver {
            bytes: 300 * MB,
            first: true,
            serialized: true,
        };
        let driver_free = ContextCost::Driver {
            bytes: 300 * MB,
            first: true,
            serialized: false,
        };
        assert_eq!(settle(0, serialized, true).store, Some(500 * MB));
        // The driver-only residual may count other containers' memory: charged, not stored.
        assert_eq!(
            settle(0, driver, true),
            Settled {
                charged: 300 * MB,
                store: None
            }
        );
        // May include another process's context created meanwhile.
        assert_eq!(
            settle(0, unserialized, true),
            Settled {
                charged: 1000 * MB,
                store: None
            }
        );
        assert_eq!(settle(0, driver_free, true).store, None);
        // A further context of a process that has one on the device.
        assert_eq!(
            settle(518 * MB, ContextCost::PerProcess(64 * MB), false),
            Settled {
                charged: 64 * MB,
                store: None
            }
        );
        // Configured: charged as configured, not a measurement.
        assert_eq!(
            settle(64 * MB, ContextCost::Configured(64 * MB), true),
            Settled {
                charged: 64 * MB,
                store: None
            }
        );
        // A measured 0 would read as "not measured".
        assert_eq!(settle(0, ContextCost::PerProcess(0), true).store, None);
    }
}
