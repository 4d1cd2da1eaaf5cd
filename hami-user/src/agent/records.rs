//! The state the [`Agent`](super::Agent) keeps for its arbiter ([`ArbiterState`]) and for
//! the compute shares it measures ([`ComputeRecord`]).

use std::collections::HashMap;
use std::time::Instant;

use hami_common::arbiter::Decision;

use crate::compute::ShareHistory;

/// The arbiter's state in the agent.
#[derive(Debug, Default)]
pub(super) struct ArbiterState {
    pub(super) arbiter: hami_common::arbiter::Arbiter,
    /// When it last decided (`CLOCK_MONOTONIC` ns).
    pub(super) at: Option<u64>,
    /// The latest decision per (region key, device).
    pub(super) latest: HashMap<(u64, usize), Decision>,
    /// Grant words found changed by someone else, in total.
    pub(super) tampered: u64,
}

/// A region file (device, inode) and one of its devices.
pub(super) type RegionDevice = ((u64, u64), usize);

/// The measured share over time (from the container's first busy sample: the idle time
/// before its first kernel, context creation and loading, is not averaged in), and the
/// busy processes (pid, SM %) at the latest sample.
pub(super) type Measured = (Option<ShareHistory>, Vec<(u32, u32)>);

/// Per region file and region device: what was measured.
#[derive(Debug, Default)]
pub(super) struct ComputeRecord {
    pub(super) histories: HashMap<RegionDevice, Measured>,
    /// When the latest NVML sample was observed: the windows end there.
    pub(super) at: Option<Instant>,
    /// The same instant in ns of `CLOCK_MONOTONIC` (shown, so that others can measure the
    /// same window).
    pub(super) at_ns: Option<u64>,
}
