//! The physical check: what NVML says processes and regions hold on each GPU, against
//! what the regions account and allow.

use super::finding::{human_bytes, reason, Finding, FindingKind, Tolerance};
use super::view::{slot_in, ProcView, RegionView};

/// The physical check of one hooked process: on each device of its region, what NVML says
/// it holds against what its slot accounts there (all kinds), both read at the NVML sample.
pub(super) fn nvml_process_findings(
    p: &ProcView,
    regions: &[RegionView],
    tol: Tolerance,
    out: &mut Vec<Finding>,
) {
    if !p.hooked || p.nvml_devices.is_empty() {
        return;
    }
    let drift =
        |reason, device: Option<u32>, slot: Option<usize>, held: u64, acc: u64, detail| Finding {
            kind: FindingKind::Drift,
            reason,
            pid: Some(p.pid),
            uid: p.creds.as_ref().map(|c| c.fsuid),
            nspid: p.nspid,
            container: p.container.clone(),
            region: p
                .region
                .and_then(|i| regions.get(i))
                .map(|r| r.name.clone()),
            device,
            slot,
            bytes: held.abs_diff(acc),
            observed: Some(held),
            accounted: Some(acc),
            limit: None,
            detail,
        };
    let Some(r) = p.region.and_then(|i| regions.get(i)) else {
        // Hooked, but no usable region: nothing it holds is accounted anywhere.
        let held = crate::nvml::saturating_sum(p.nvml_devices.values());
        if tol.exceeds(held, 0) {
            out.push(drift(
                reason::NVML_ABOVE_ACCOUNTED,
                None,
                None,
                held,
                0,
                format!(
                    "NVML says it holds {} but it has no usable region ({}): none of it is accounted",
                    human_bytes(held),
                    p.region_error.as_deref().unwrap_or("not found")
                ),
            ));
        }
        return;
    };
    // Opened after the latest NVML sample: compared at the next one.
    let Some(n) = &r.nvml else { return };
    let slot = slot_in(&n.snapshot, p);
    for (d, idx) in n.device_index.iter().enumerate() {
        let Some(idx) = *idx else { continue };
        let Some(&held) = p.nvml_devices.get(&idx) else {
            continue;
        };
        let acc = slot.map_or(0, |s| s.device_total(d));
        let allowance = tol.allowance(held, acc);
        let where_ = match slot {
            Some(s) => format!("its slot {} accounts {}", s.index, human_bytes(acc)),
            None => format!("it has no slot in {} (nothing accounted)", r.name),
        };
        if tol.exceeds(held, acc) {
            out.push(drift(
                reason::NVML_ABOVE_ACCOUNTED,
                Some(d as u32),
                slot.map(|s| s.index),
                held,
                acc,
                format!(
                    "device {d} (NVML GPU {idx}): NVML says it holds {}, {where_}: {} the preload did not see (tolerance {})",
                    human_bytes(held),
                    human_bytes(held - acc),
                    human_bytes(allowance)
                ),
            ));
        } else if held > 0 && tol.exceeds(acc, held) {
            // A process NVML does not list at all is not compared this way: NVML and the
            // agent may not name it by the same pid (a driver reporting namespaced pids).
            out.push(drift(
                reason::ACCOUNTED_ABOVE_NVML,
                Some(d as u32),
                slot.map(|s| s.index),
                held,
                acc,
                format!(
                    "device {d} (NVML GPU {idx}): {where_} but NVML says it holds {} (tolerance {})",
                    human_bytes(held),
                    human_bytes(allowance)
                ),
            ));
        }
    }
}

/// The physical check of one region: per device, what NVML says the region's processes
/// (hooked or not) hold together, against the region's limit. `users` are the processes
/// matched to it.
pub(super) fn nvml_region_findings(
    r: &RegionView,
    users: &[&ProcView],
    tol: Tolerance,
    out: &mut Vec<Finding>,
) {
    let Some(n) = &r.nvml else { return };
    for (d, idx) in n.device_index.iter().enumerate() {
        let (Some(idx), Some(limit)) = (*idx, r.snapshot.limit(d)) else {
            continue;
        };
        let held: Vec<(u32, u64)> = users
            .iter()
            .filter_map(|p| p.nvml_devices.get(&idx).map(|&b| (p.pid, b)))
            .filter(|&(_, b)| b > 0)
            .collect();
        let total = crate::nvml::saturating_sum(held.iter().map(|(_, b)| b));
        if !(total > limit && tol.exceeds(total, limit)) {
            continue;
        }
        let unknown: Vec<String> = users
            .iter()
            .filter(|p| !p.nvml_devices.contains_key(&idx))
            .map(|p| p.pid.to_string())
            .collect();
        let list: Vec<String> = held
            .iter()
            .map(|(pid, b)| format!("{pid}: {}", human_bytes(*b)))
            .collect();
        let accounted = n.snapshot.accounted(d);
        out.push(Finding {
            kind: FindingKind::OverLimit,
            reason: reason::NVML_ABOVE_LIMIT,
            pid: None,
            uid: None,
            nspid: None,
            container: r.container.clone(),
            region: Some(r.name.clone()),
            device: Some(d as u32),
            slot: None,
            bytes: total - limit,
            observed: Some(total),
            accounted: Some(accounted),
            limit: Some(limit),
            detail: format!(
                "device {d} (NVML GPU {idx}): the container's processes hold {} according to NVML \
                 ({}), above the limit {}; the region accounts {}{}",
                human_bytes(total),
                list.join(", "),
                human_bytes(limit),
                human_bytes(accounted),
                if unknown.is_empty() {
                    String::new()
                } else {
                    format!(" (no NVML figure for pids {})", unknown.join(","))
                }
            ),
        });
    }
}
