//! The audit rules: a pure function from what the agent knows about processes and regions to
//! findings. Nothing here reads files or clocks; see `docs/agent.md` for the rules in prose.

mod against_nvml;
mod compute;
mod finding;
mod rules;
#[cfg(test)]
pub(crate) mod tests;
mod view;

use hami_abi::layout::MAX_DEVICES;
use serde::Serialize;

use crate::compute::ComputeOptions;

use against_nvml::{nvml_process_findings, nvml_region_findings};
use compute::compute_region_findings;
use rules::{process_findings, region_findings};

pub use finding::*;
pub use view::*;

/// Computes every finding, comparing with NVML within [`Tolerance::NVML_DEFAULT`]. See
/// [`evaluate_with_nvml`].
pub fn evaluate(procs: &[ProcView], regions: &[RegionView], tol: Tolerance) -> Vec<Finding> {
    evaluate_with_nvml(procs, regions, tol, Tolerance::NVML_DEFAULT)
}

/// Computes every finding, judging compute shares with [`ComputeOptions::default`]. See
/// [`evaluate_all`].
pub fn evaluate_with_nvml(
    procs: &[ProcView],
    regions: &[RegionView],
    tol: Tolerance,
    nvml_tol: Tolerance,
) -> Vec<Finding> {
    evaluate_all(procs, regions, tol, nvml_tol, &ComputeOptions::default())
}

/// Computes every finding. `procs[i].region` indexes `regions`. `tol` is the tolerance
/// between the probes' figures and the region's, `nvml_tol` the one between NVML's and the
/// region's (or the limit), `compute` how compute shares are judged.
pub fn evaluate_all(
    procs: &[ProcView],
    regions: &[RegionView],
    tol: Tolerance,
    nvml_tol: Tolerance,
    compute: &ComputeOptions,
) -> Vec<Finding> {
    let mut out = Vec::new();
    // Each region's processes, grouped once (regions x processes was the tick's cost at
    // 1000 regions and 5000 processes).
    let mut users: Vec<Vec<&ProcView>> = vec![Vec::new(); regions.len()];
    for p in procs {
        process_findings(p, regions, tol, &mut out);
        nvml_process_findings(p, regions, nvml_tol, &mut out);
        if let Some(u) = p.region.and_then(|ri| users.get_mut(ri)) {
            u.push(p);
        }
    }
    for (r, users) in regions.iter().zip(&users) {
        region_findings(r, users, tol, &mut out);
        nvml_region_findings(r, users, nvml_tol, &mut out);
        compute_region_findings(r, compute, &mut out);
    }
    out
}

/// Per (region, device) figures for metrics and the table.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct RegionUsage {
    /// Container.
    pub container: String,
    /// Region name.
    pub region: String,
    /// Device ordinal.
    pub device: u32,
    /// Limit (0 = unlimited).
    pub limit: u64,
    /// Accounted, all kinds (what counts against the limit).
    pub accounted: u64,
    /// Accounted data only (comparable with observed).
    pub accounted_data: u64,
    /// Observed data of the region's users.
    pub observed: u64,
}

/// Limit / accounted / observed per region and device: devices with usage, plus devices
/// below the region's device count that exist on the node (NVML's count, when known).
pub fn region_usage(procs: &[ProcView], regions: &[RegionView]) -> Vec<RegionUsage> {
    let mut out = Vec::new();
    // Each region's users, grouped once (not a pass over every process per region and device).
    let mut users: Vec<Vec<&ProcView>> = vec![Vec::new(); regions.len()];
    for p in procs {
        if let Some(u) = p.region.and_then(|i| users.get_mut(i)) {
            u.push(p);
        }
    }
    for (ri, r) in regions.iter().enumerate() {
        let single = r.single_device;
        for d in 0..MAX_DEVICES {
            let observed: u64 = users[ri].iter().map(|p| observed_on(p, d, single)).sum();
            let accounted = r.snapshot.accounted(d);
            let limit = r.snapshot.limits[d];
            let visible = r.node_devices.unwrap_or(r.devices()).max(1);
            if observed == 0 && accounted == 0 && (d >= visible || (d >= r.devices() && limit == 0))
            {
                continue;
            }
            out.push(RegionUsage {
                container: r.container.clone(),
                region: r.name.clone(),
                device: d as u32,
                limit,
                accounted,
                accounted_data: r.snapshot.slots.iter().map(|s| slot_data_on(s, d)).sum(),
                observed,
            });
        }
    }
    out
}
