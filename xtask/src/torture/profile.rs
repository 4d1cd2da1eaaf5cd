//! The profiles of `cargo xtask torture` (the short default and `--long`) and the bounds the
//! scenarios check against and wait for.

use std::time::Duration;

/// No call of a running (not stopped) process may take longer than this, in the kill storm.
pub const BLOCK_BOUND: Duration = Duration::from_secs(5);
/// After a stopped lock holder is continued or killed, every process must make progress
/// again within this.
pub const RESUME_BOUND: Duration = Duration::from_secs(2);
/// How long a command may wait for one line of a workload before the scenario fails.
pub(super) const LINE_WAIT: Duration = Duration::from_secs(30);
/// Per-case limit of the bad-input cases.
pub(super) const CASE_TIMEOUT: Duration = Duration::from_secs(15);
/// Per-case limit of a case that is a known hang (reported as a finding).
pub(super) const FINDING_TIMEOUT: Duration = Duration::from_secs(3);
pub(super) const MIB: u64 = 1 << 20;

/// One profile's sizes.
#[derive(Debug, Clone)]
pub(super) struct Profile {
    pub(super) name: &'static str,
    pub(super) storm_procs: usize,
    pub(super) storm_threads: usize,
    pub(super) storm_secs: u64,
    pub(super) min_kills: u64,
    pub(super) kill_gap_ms: u64,
    pub(super) stops: usize,
    pub(super) hold_secs: u64,
    pub(super) race_procs: usize,
    pub(super) race_rounds: usize,
    pub(super) every_header_byte: bool,
    /// How long the ptrace-stopped holder holds the lock, and the paged-out process runs.
    pub(super) variant_ms: u64,
    /// Run the starved-holder variant (CPU hogs on every core: long profile only).
    pub(super) starved: bool,
    /// Region files of the scale scenario.
    pub(super) scale_regions: usize,
    /// Processes of the scale scenario (spread evenly over the regions).
    pub(super) scale_procs: usize,
    /// Seconds the running agent is measured for, per size.
    pub(super) scale_window_secs: u64,
    /// Bound on the growth of the tick's cost per process from a fifth of the fleet to all of
    /// it (linear: about 1).
    pub(super) scale_max_ratio: f64,
}

pub(super) const SHORT: Profile = Profile {
    name: "short",
    storm_procs: 8,
    storm_threads: 3,
    storm_secs: 15,
    min_kills: 100,
    kill_gap_ms: 50,
    stops: 4,
    hold_secs: 2,
    race_procs: 4,
    race_rounds: 30,
    every_header_byte: false,
    variant_ms: 2000,
    starved: false,
    scale_regions: 100,
    scale_procs: 500,
    scale_window_secs: 5,
    scale_max_ratio: 2.0,
};

pub(super) const LONG: Profile = Profile {
    name: "long",
    storm_procs: 32,
    storm_threads: 4,
    storm_secs: 60,
    min_kills: 1000,
    kill_gap_ms: 80,
    stops: 20,
    hold_secs: 5,
    race_procs: 32,
    race_rounds: 100,
    every_header_byte: true,
    variant_ms: 3000,
    starved: true,
    scale_regions: 1000,
    scale_procs: 5000,
    scale_window_secs: 10,
    scale_max_ratio: 2.0,
};

// The sizes issue 12 asks for.
const _: () = assert!(LONG.min_kills >= 1000 && LONG.storm_procs == 32 && SHORT.storm_procs == 8);
const _: () = assert!(LONG.race_procs == 32 && LONG.race_rounds == 100);
const _: () = assert!(LONG.scale_regions == 1000 && LONG.scale_procs == 5000);
