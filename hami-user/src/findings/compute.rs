//! The compute share check: per region and device, the container's share of the GPU as
//! NVML measures it (its processes' SM utilisation, summed, averaged over the window)
//! against the share its region holds it to.

use super::finding::{reason, Finding, FindingKind};
use super::view::RegionView;
use crate::compute::ComputeOptions;

/// `compute_over_limit` for each device of `r` whose mean share over the whole window is
/// above its limit by more than the tolerance (see [`crate::compute::ComputeView::over_limit`]).
/// `observed` and `limit` are percent of the device (rounded), `bytes` is 0.
pub(super) fn compute_region_findings(
    r: &RegionView,
    opts: &ComputeOptions,
    out: &mut Vec<Finding>,
) {
    for c in &r.compute {
        let Some((share, limit)) = c.over_limit(opts) else {
            continue;
        };
        let busy: Vec<String> = c
            .by_pid
            .iter()
            .map(|(pid, u)| format!("{pid}: {u} %"))
            .collect();
        out.push(Finding {
            kind: FindingKind::ComputeOverLimit,
            reason: reason::SHARE_ABOVE_LIMIT,
            pid: None,
            uid: None,
            nspid: None,
            container: r.container.clone(),
            region: Some(r.name.clone()),
            device: Some(c.device),
            slot: None,
            bytes: 0,
            observed: Some(share.round() as u64),
            accounted: None,
            limit: Some(u64::from(limit)),
            detail: format!(
                "device {}: the container used {share:.1} % of the GPU on average over the last \
                 {} s (NVML's SM utilisation of its processes; at the latest sample {}), above \
                 its share of {limit} % by more than {} points; the launch gate counted {:.1} s \
                 of device time and {} waits ({:.1} s)",
                c.device,
                opts.window.as_secs_f64(),
                if busy.is_empty() {
                    "none busy".to_string()
                } else {
                    busy.join(", ")
                },
                opts.tolerance_points,
                c.consumed_ns as f64 / 1e9,
                c.throttled,
                c.throttled_ns as f64 / 1e9,
            ),
        });
    }
}
