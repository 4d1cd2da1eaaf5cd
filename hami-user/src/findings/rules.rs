//! The rules that compare the probes with the regions: per process (bypass, observed
//! over accounted, unreadable region, limits that differ from the environment, ...) and per
//! region (over limit, leaked slots, tampered header, writable by a tenant).

use hami_abi::layout::MAX_DEVICES;

use crate::access::write_denied;
use crate::procinfo::EnvLimit;

use super::finding::{human_bytes, human_or_unlimited, reason, Finding, FindingKind, Tolerance};
use super::view::{
    nvml_note, observed_on, slot_data, slot_probe_ceiling, ProcView, RegionView, SlotLiveness,
};

/// Findings about one process against its region (the probes' figures, its environment).
pub(super) fn process_findings(
    p: &ProcView,
    regions: &[RegionView],
    tol: Tolerance,
    out: &mut Vec<Finding>,
) {
    let observed = p.observed_total();
    let region = p.region.and_then(|i| regions.get(i));
    let base = |kind, reason, bytes, detail: String| Finding {
        kind,
        reason,
        pid: Some(p.pid),
        uid: p.creds.as_ref().map(|c| c.fsuid),
        nspid: p.nspid,
        container: p.container.clone(),
        region: region.map(|r| r.name.clone()),
        device: None,
        slot: None,
        bytes,
        observed: Some(observed),
        accounted: None,
        limit: None,
        detail,
    };
    // SM time NVML says it used at the latest sample (percent of a device, summed).
    let sm = p.sm_total();
    // `CUDA_DISABLE_CONTROL=true` turns hami-preload itself off (it forwards every call and
    // opens no region): mapped but holding no slot, it is unhooked by request.
    let turned_off = p.hooked
        && p.unhooked_by_request == Some(reason::DISABLE_CONTROL)
        && region.and_then(|r| r.slot_of(p)).is_none();
    if !p.hooked || turned_off {
        // A node being migrated (HAMi-core still mapped) and processes unhooked on purpose
        // are reported under their own kinds, never as a bypass.
        let (kind, why, note) = if p.hami_core {
            (
                FindingKind::HamiCore,
                reason::HAMI_CORE_MAPPED,
                " (HAMi-core's libvgpu.so is mapped: not migrated yet)".to_string(),
            )
        } else if let Some(r) = p.unhooked_by_request {
            let what = if r == reason::DISABLE_CONTROL {
                "CUDA_DISABLE_CONTROL=true in its environment"
            } else {
                "its namespace is allowlisted"
            };
            (
                FindingKind::Unhooked,
                r,
                format!(" (unhooked by request: {what})"),
            )
        } else {
            (FindingKind::Bypass, reason::NO_PRELOAD, String::new())
        };
        let unhooked = |bytes, detail: String| base(kind, why, bytes, format!("{detail}{note}"));
        let nvml = p.nvml_bytes.unwrap_or(0);
        if p.alloc_events > 0 {
            out.push(unhooked(
                observed,
                format!(
                    "allocating through libcuda without libhami_preload.so: {} live (peak {}, {} allocations seen){}",
                    human_bytes(observed),
                    human_bytes(p.peak_bytes),
                    p.alloc_events,
                    nvml_note(p)
                ),
            ));
        } else if (nvml > 0 || sm > 0) && !p.attached_late {
            // NVML is the physical truth: an unhooked process holding device memory is a
            // bypass whenever it started. When it started is context, not an excuse.
            let context = if p.pre_existing {
                "it was running before the agent attached (pre-existing), so its allocations \
                 were not observed, but nothing of it is accounted"
            } else if p.seen_by_events {
                "no allocation through the probed functions was seen (context, module, pool or \
                 other memory the probes do not cover)"
            } else {
                "the probes saw none of its calls"
            };
            out.push(unhooked(
                nvml.max(observed),
                format!(
                    "{} according to NVML without libhami_preload.so; {context}",
                    match (nvml > 0, sm > 0) {
                        (true, false) => format!("holds {} of device memory", human_bytes(nvml)),
                        (true, true) => format!(
                            "holds {} of device memory and uses {sm} % of a GPU's SM time",
                            human_bytes(nvml)
                        ),
                        _ => format!("uses {sm} % of a GPU's SM time (no compute share meters it)"),
                    },
                ),
            ));
        } else if p.attached_late {
            // It loaded a libcuda the agent had not probed yet, after the agent started:
            // an unhooked CUDA process whose first allocations could not be seen. Report it
            // (it is not a process that was running before the agent).
            let bytes = observed.max(p.nvml_bytes.unwrap_or(0));
            out.push(unhooked(
                bytes,
                format!(
                    "uses libcuda without libhami_preload.so; its libcuda was probed only after it \
                     was loaded, so allocations before then were not observed ({} observed since, NVML {})",
                    human_bytes(observed),
                    p.nvml_bytes.map_or("unavailable".to_string(), human_bytes)
                ),
            ));
        }
        return;
    }
    // A hooked process without a slot is neither accounted nor metered by its container's
    // launch gate: its SM time is a bypass of the compute share as its memory is of the quota.
    let sm_note = if sm > 0 {
        format!("; it uses {sm} % of a GPU's SM time according to NVML, unmetered")
    } else {
        String::new()
    };
    let Some(r) = region else {
        if (p.alloc_events > 0 && observed > 0) || sm > 0 {
            out.push(base(
                FindingKind::Bypass,
                reason::NO_REGION,
                observed,
                format!(
                    "preload mapped but no usable region ({}): {} unaccounted{sm_note}",
                    p.region_error.as_deref().unwrap_or("not found"),
                    human_bytes(observed)
                ),
            ));
        }
        return;
    };
    let Some(slot) = r.slot_of(p) else {
        // No slot: if it cannot write the region, it never will have one.
        if let Some(why) = r
            .file
            .as_ref()
            .zip(p.creds.as_ref())
            .and_then(|(f, c)| write_denied(f, c))
        {
            out.push(base(
                FindingKind::LockedOut,
                reason::REGION_UNWRITABLE,
                0,
                format!(
                    "cannot write region {}: {why}; every allocation of this process is refused",
                    r.name
                ),
            ));
        }
        if (p.alloc_events > 0 && observed > 0) || sm > 0 {
            out.push(base(
                FindingKind::Bypass,
                reason::NO_SLOT,
                observed,
                format!(
                    "preload mapped but no slot for pid {} in {}: {} unaccounted{sm_note}",
                    p.slot_pid(),
                    r.name,
                    human_bytes(observed)
                ),
            ));
        }
        return;
    };
    let accounted = slot_data(slot);
    // Above: compared with data + pool (async allocations are charged to their pool).
    // Below: with data alone (a pool may legitimately hold more than its live allocations).
    let ceiling = slot_probe_ceiling(slot);
    let with_numbers = |mut f: Finding| {
        f.accounted = Some(accounted);
        f.slot = Some(slot.index);
        f
    };
    if tol.exceeds(observed, ceiling) {
        out.push(with_numbers(base(
            FindingKind::Bypass,
            reason::OBSERVED_ABOVE_ACCOUNTED,
            observed - ceiling,
            format!(
                "observed {} but the region accounts {} of data and pools (tolerance {})",
                human_bytes(observed),
                human_bytes(ceiling),
                human_bytes(tol.allowance(observed, ceiling))
            ),
        )));
        return;
    }
    // Accounted above observed: only meaningful when the agent saw the whole life.
    if p.pre_existing || !p.seen_by_events {
        return;
    }
    if tol.exceeds(accounted, observed) {
        if observed == 0 {
            out.push(with_numbers(base(
                FindingKind::LeakedSlot,
                reason::USAGE_WITHOUT_ALLOCATIONS,
                accounted,
                format!(
                    "slot {} accounts {} of data but the process holds no allocations",
                    slot.index,
                    human_bytes(accounted)
                ),
            )));
        } else {
            out.push(with_numbers(base(
                FindingKind::Drift,
                reason::ACCOUNTED_ABOVE_OBSERVED,
                accounted - observed,
                format!(
                    "accounted {} but observed {} (tolerance {})",
                    human_bytes(accounted),
                    human_bytes(observed),
                    human_bytes(tol.allowance(observed, accounted))
                ),
            )));
        }
    }
}

/// Findings about one region: its limits, its slots' liveness, its file. `users` are the
/// processes matched to it.
pub(super) fn region_findings(
    r: &RegionView,
    users: &[&ProcView],
    tol: Tolerance,
    out: &mut Vec<Finding>,
) {
    let snap = &r.snapshot;
    // Leaked slots.
    for s in &snap.slots {
        let (reason, detail) = match r.liveness.get(&s.index) {
            Some(SlotLiveness::Dead) => (
                reason::PROCESS_DEAD,
                format!(
                    "slot {} holds pid {} (start {}), which no longer exists",
                    s.index, s.pid, s.start_time
                ),
            ),
            Some(SlotLiveness::Reused {
                host_pid,
                start_time,
            }) => (
                reason::PID_REUSED,
                format!(
                    "slot {} holds pid {} started at {}, but that pid (host {}) started at {}",
                    s.index, s.pid, s.start_time, host_pid, start_time
                ),
            ),
            _ => continue,
        };
        out.push(Finding {
            kind: FindingKind::LeakedSlot,
            reason,
            pid: None,
            uid: None,
            nspid: Some(s.pid),
            container: r.container.clone(),
            region: Some(r.name.clone()),
            device: None,
            slot: Some(s.index),
            bytes: s.total(),
            observed: None,
            accounted: Some(s.total()),
            limit: None,
            detail: format!("{detail}; {} still accounted", human_bytes(s.total())),
        });
    }
    // Tamper: the region's limit against each live hooked user's environment (the preload
    // is what reads the environment; an unhooked process's variables mean nothing).
    let mut tampered = std::collections::BTreeSet::new();
    for p in users.iter().filter(|p| p.hooked) {
        for d in 0..MAX_DEVICES {
            if d >= r.devices() && !p.env_limits.per_device.contains_key(&(d as u32)) {
                continue;
            }
            if tampered.contains(&d) {
                continue;
            }
            let region_limit = snap.limits[d];
            let invalid = snap.config_invalid(d);
            let (reason, want) = match p.env_limits.for_device(d as u32) {
                Some(EnvLimit::Bytes(b)) if b != region_limit || invalid => {
                    (reason::LIMIT_DIFFERS_FROM_ENV, human_or_unlimited(b))
                }
                Some(EnvLimit::Invalid) if !invalid => (
                    reason::ENV_INVALID_REGION_VALID,
                    "an invalid value".to_string(),
                ),
                _ => continue,
            };
            tampered.insert(d);
            out.push(Finding {
                kind: FindingKind::Tamper,
                reason,
                pid: Some(p.pid),
                uid: p.creds.as_ref().map(|c| c.fsuid),
                nspid: p.nspid,
                container: p.container.clone(),
                region: Some(r.name.clone()),
                device: Some(d as u32),
                slot: None,
                bytes: region_limit,
                observed: None,
                accounted: None,
                limit: Some(region_limit),
                detail: format!(
                    "device {d}: region limit is {}{}, but pid {}'s environment sets {want}",
                    human_or_unlimited(region_limit),
                    if invalid { " (flagged invalid)" } else { "" },
                    p.pid
                ),
            });
        }
    }
    // Tamper, compute: the region's share against each live hooked user's environment,
    // compared as the share the preload holds the device to (a malformed value, or control
    // turned off, is not compared).
    let mut tampered = std::collections::BTreeSet::new();
    for p in users.iter().filter(|p| p.hooked) {
        for d in 0..r.devices() {
            let Some(want) = p.env_limits.compute.share_for(d as u32) else {
                continue;
            };
            let rec = snap.compute[d];
            if want == rec.limit_percent() || !tampered.insert(d) {
                continue;
            }
            let pct =
                |v: Option<u32>| v.map_or("no compute limit".to_string(), |v| format!("{v} %"));
            out.push(Finding {
                kind: FindingKind::Tamper,
                reason: reason::COMPUTE_LIMIT_DIFFERS_FROM_ENV,
                pid: Some(p.pid),
                uid: p.creds.as_ref().map(|c| c.fsuid),
                nspid: p.nspid,
                container: p.container.clone(),
                region: Some(r.name.clone()),
                device: Some(d as u32),
                slot: None,
                bytes: 0,
                observed: None,
                accounted: None,
                limit: Some(u64::from(rec.sm_limit)),
                detail: format!(
                    "device {d}: region compute share is {} (sm_limit {}, policy {}), but pid {}'s \
                     environment sets {}",
                    pct(rec.limit_percent()),
                    rec.sm_limit,
                    rec.policy,
                    p.pid,
                    pct(want)
                ),
            });
        }
    }
    // Over limit: observed data of the region's users per device.
    let single = r.single_device;
    for d in 0..r.devices() {
        let Some(limit) = snap.limit(d) else { continue };
        let observed: u64 = users.iter().map(|p| observed_on(p, d, single)).sum();
        if observed > limit && observed - limit > tol.allowance(observed, limit) {
            let pids: Vec<String> = users
                .iter()
                .filter(|p| observed_on(p, d, single) > 0)
                .map(|p| p.pid.to_string())
                .collect();
            out.push(Finding {
                kind: FindingKind::OverLimit,
                reason: reason::OBSERVED_ABOVE_LIMIT,
                pid: None,
                uid: None,
                nspid: None,
                container: r.container.clone(),
                region: Some(r.name.clone()),
                device: Some(d as u32),
                slot: None,
                bytes: observed - limit,
                observed: Some(observed),
                accounted: Some(snap.accounted(d)),
                limit: Some(limit),
                detail: format!(
                    "device {d}: observed {} above the limit {} (pids {})",
                    human_bytes(observed),
                    human_bytes(limit),
                    pids.join(",")
                ),
            });
        }
    }
}
