//! Lock-free copies of a region: `RegionSnapshot` from a mapping or, for files tenants
//! control, from `pread` (`read_snapshot`).

use core::sync::atomic::{fence, Ordering};
use std::io;
use std::path::Path;

use super::file::*;
use super::handle::*;
use super::liveness::*;
use super::types::*;
use hami_abi::layout::{
    self, DeviceCompute, RegionHeader, LIMIT_FLAG_INVALID, MAX_DEVICES, MAX_SLOTS, REGION_SIZE,
    SLOT_ACTIVE, USAGE_KINDS,
};

/// One device's compute record ([`DeviceCompute`]) in a [`RegionSnapshot`]. The launch gate
/// changes these fields lock-free (atomics, outside the seqlock), so a copy is a set of
/// individually atomic reads, not one instant: each counter is exact, their relation is not.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ComputeSnapshot {
    /// Share of the device in percent (1..=100); 0 = no compute limit.
    pub sm_limit: u32,
    /// `COMPUTE_POLICY_*` as the region's creator configured it.
    pub policy: u32,
    /// The launch gate's budget (ns of device time; negative = debt).
    pub budget_ns: i64,
    /// `CLOCK_MONOTONIC` time (ns) up to which the budget has been refilled.
    pub refilled_at_ns: u64,
    /// Device time (ns) the container's metered work has used in total (only grows).
    pub consumed_ns: u64,
    /// Times a process of the container waited at the gate.
    pub throttled: u64,
    /// Total time (ns) the container's processes waited at the gate.
    pub throttled_ns: u64,
    /// Memory requests the preload refused on this device (`DeviceCompute::refusals`).
    pub refusals: u64,
}

impl ComputeSnapshot {
    /// The share the container is held to on this device, in percent: `Some(1..=99)` when a
    /// limit applies; `None` without one (`sm_limit` 0 or 100, an out-of-range value, or
    /// the policy `disable`): the share rule, [`crate::config::share_percent`].
    pub fn limit_percent(&self) -> Option<u32> {
        crate::config::share_percent(self.sm_limit, self.policy)
    }
}

/// One active slot in a [`RegionSnapshot`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlotSnapshot {
    /// Slot index.
    pub index: usize,
    /// Pid (in the process's pid namespace).
    pub pid: u32,
    /// Process start time (clock ticks after boot).
    pub start_time: u64,
    /// Usage `[device][UsageKind::index()]` in bytes.
    pub usage: [[u64; USAGE_KINDS]; MAX_DEVICES],
    /// Per device: what the slot has added to the header's `used` (usage plus reserve).
    pub charged: [u64; MAX_DEVICES],
    /// Per device: admitted bytes no allocation holds yet (see `docs/shared-region.md`).
    pub reserve: [u64; MAX_DEVICES],
}

impl SlotSnapshot {
    /// The slot's process identity.
    pub fn process(&self) -> ProcessId {
        ProcessId {
            pid: self.pid,
            start_time: self.start_time,
        }
    }

    /// Bytes on `dev`, all kinds.
    pub fn device_total(&self, dev: usize) -> u64 {
        self.usage
            .get(dev)
            .map(|k| k.iter().fold(0u64, |a, &b| a.saturating_add(b)))
            .unwrap_or(0)
    }

    /// Bytes on all devices, all kinds.
    pub fn total(&self) -> u64 {
        (0..MAX_DEVICES).fold(0u64, |a, d| a.saturating_add(self.device_total(d)))
    }
}

/// A plain owned copy of a region, taken without the lock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RegionSnapshot {
    /// Layout version.
    pub version: u32,
    /// Header size recorded by the creator.
    pub header_size: u32,
    /// Total size recorded by the creator.
    pub total_size: u64,
    /// Initialisation state.
    pub init_state: u32,
    /// Devices the creator saw.
    pub device_count: u32,
    /// Creator pid.
    pub creator_pid: u32,
    /// Creation time (Unix seconds).
    pub created_unix: u64,
    /// Boot id of the boot that created the region (zero if unknown).
    pub boot_id: [u8; 16],
    /// Sequence counter at the time of the copy.
    pub generation: u64,
    /// Lock-holder deaths recovered.
    pub owner_died_recoveries: u64,
    /// Slots reclaimed from dead processes.
    pub reclaimed_slots: u64,
    /// Per-device limits (0 = unlimited).
    pub limits: [u64; MAX_DEVICES],
    /// Per-device flags.
    pub limit_flags: [u32; MAX_DEVICES],
    /// Per-device UUIDs (zero = unknown).
    pub uuids: [[u8; 16]; MAX_DEVICES],
    /// Per-device admitted totals (header): usage plus reserves.
    pub used: [u64; MAX_DEVICES],
    /// Stale lock words marked owner-died by a waiter.
    pub stale_lock_breaks: u64,
    /// Admissions that took other slots' reserves back because the device was full.
    pub reserve_reclaims: u64,
    /// Per-device footprint of one CUDA context as last measured (0 = not measured yet).
    pub context_footprint: [u64; MAX_DEVICES],
    /// Active slots, by index.
    pub slots: Vec<SlotSnapshot>,
    /// Per-device compute records (share limit, policy, the gate's budget and consumption).
    pub compute: [ComputeSnapshot; MAX_DEVICES],
    /// The container's priority and the arbiter's latest decision (issue 30).
    pub arbiter: ArbiterSnapshot,
    /// Whether the copy is from one instant (no writer was mid-update). When writers are
    /// very busy, a copy after several retries may not be; then `used` and the slots may
    /// disagree by in-flight updates.
    pub consistent: bool,
}

/// The header's priority and arbiter fields, as copied.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ArbiterSnapshot {
    /// The container's `CUDA_TASK_PRIORITY` ([`super::task_priority_of`] applied).
    pub task_priority: u32,
    /// `CLOCK_MONOTONIC` ns of the arbiter's latest decision (0: never).
    pub at_ns: u64,
    /// Per device, the grant word ([`crate::arbiter::decode_grant`]).
    pub grants: [u32; MAX_DEVICES],
    /// Per device, the turn word ([`crate::arbiter::decode_turn`]).
    pub turns: [u32; MAX_DEVICES],
}

impl RegionSnapshot {
    /// Sum over active slots of their usage on `dev` (all kinds).
    pub fn accounted(&self, dev: usize) -> u64 {
        self.slots
            .iter()
            .fold(0u64, |a, s| a.saturating_add(s.device_total(dev)))
    }

    /// Unused reserves of the active slots on `dev` (admitted, not held by allocations).
    pub fn reserved(&self, dev: usize) -> u64 {
        self.slots.iter().fold(0u64, |a, s| {
            a.saturating_add(s.reserve.get(dev).copied().unwrap_or(0))
        })
    }

    /// Sum over active slots of what they have added to the header's `used` on `dev`
    /// (equal to [`RegionSnapshot::device_used`] in a consistent copy).
    pub fn charged(&self, dev: usize) -> u64 {
        self.slots.iter().fold(0u64, |a, s| {
            a.saturating_add(s.charged.get(dev).copied().unwrap_or(0))
        })
    }

    /// The header's admitted total on `dev`.
    pub fn device_used(&self, dev: usize) -> u64 {
        self.used.get(dev).copied().unwrap_or(0)
    }

    /// Total usage (all devices, all kinds) of the slot at `index`, 0 if not active.
    pub fn slot_total(&self, index: usize) -> u64 {
        self.slot(index).map(|s| s.total()).unwrap_or(0)
    }

    /// The active slot at `index`.
    pub fn slot(&self, index: usize) -> Option<&SlotSnapshot> {
        self.slots.iter().find(|s| s.index == index)
    }

    /// Active slots holding `pid`.
    pub fn slots_of_pid(&self, pid: u32) -> impl Iterator<Item = &SlotSnapshot> {
        self.slots.iter().filter(move |s| s.pid == pid)
    }

    /// The device's limit, `None` when unlimited.
    pub fn limit(&self, dev: usize) -> Option<u64> {
        self.limits.get(dev).copied().filter(|&l| l != 0)
    }

    /// Whether the device's configuration was invalid (fail closed).
    pub fn config_invalid(&self, dev: usize) -> bool {
        self.limit_flags
            .get(dev)
            .map(|f| f & LIMIT_FLAG_INVALID != 0)
            .unwrap_or(false)
    }
}

impl Region {
    // ---- snapshot ----

    /// A lock-free, owned copy of the region (works on a read-only mapping). Retries a few
    /// times to get a copy from one instant; see [`RegionSnapshot::consistent`].
    pub fn snapshot(&self) -> RegionSnapshot {
        let mut last = None;
        for _ in 0..16 {
            let gen = self.h_generation();
            let g1 = gen.load(Ordering::Acquire);
            let mut snap = self.copy_once();
            fence(Ordering::Acquire);
            let g2 = gen.load(Ordering::Relaxed);
            snap.generation = g1;
            if g1 & 1 == 0 && g1 == g2 {
                snap.consistent = true;
                return snap;
            }
            last = Some(snap);
            std::thread::yield_now();
        }
        last.unwrap_or_else(|| self.copy_once())
    }

    pub(super) fn copy_once(&self) -> RegionSnapshot {
        let mut limits = [0u64; MAX_DEVICES];
        let mut limit_flags = [0u32; MAX_DEVICES];
        let mut uuids = [[0u8; 16]; MAX_DEVICES];
        let mut used = [0u64; MAX_DEVICES];
        for d in 0..MAX_DEVICES {
            limits[d] = self.h_limit(d).load(Ordering::Relaxed);
            limit_flags[d] = self.h_flags(d).load(Ordering::Relaxed);
            uuids[d] = self.uuid(d);
            used[d] = self.h_used(d).load(Ordering::Relaxed);
        }
        let mut slots = Vec::new();
        for i in 0..MAX_SLOTS {
            if self.s_status(i).load(Ordering::Relaxed) != SLOT_ACTIVE {
                continue;
            }
            let mut usage = [[0u64; USAGE_KINDS]; MAX_DEVICES];
            let mut charged = [0u64; MAX_DEVICES];
            let mut reserve = [0u64; MAX_DEVICES];
            for (d, ud) in usage.iter_mut().enumerate() {
                for (k, uk) in ud.iter_mut().enumerate() {
                    *uk = self.s_usage(i, d, k).load(Ordering::Relaxed);
                }
                charged[d] = self.s_charged(i, d).load(Ordering::Relaxed);
                reserve[d] = self.s_reserve(i, d).load(Ordering::Relaxed);
            }
            slots.push(SlotSnapshot {
                index: i,
                pid: self.s_pid(i).load(Ordering::Relaxed),
                start_time: self.s_start(i).load(Ordering::Relaxed),
                usage,
                charged,
                reserve,
            });
        }
        let mut compute = [ComputeSnapshot::default(); MAX_DEVICES];
        for (d, c) in compute.iter_mut().enumerate() {
            // SAFETY: in-bounds projection of the live mapping (d < MAX_DEVICES); every field
            // of a DeviceCompute is an atomic, so a shared reference to it is sound.
            let rec: &DeviceCompute =
                unsafe { &*core::ptr::addr_of!((*self.map.as_ptr()).compute[d]) };
            *c = ComputeSnapshot {
                sm_limit: rec.sm_limit.load(Ordering::Relaxed),
                policy: rec.policy.load(Ordering::Relaxed),
                budget_ns: rec.budget_ns.load(Ordering::Relaxed),
                refilled_at_ns: rec.refilled_at_ns.load(Ordering::Relaxed),
                consumed_ns: rec.consumed_ns.load(Ordering::Relaxed),
                throttled: rec.throttled.load(Ordering::Relaxed),
                throttled_ns: rec.throttled_ns.load(Ordering::Relaxed),
                refusals: rec.refusals.load(Ordering::Relaxed),
            };
        }
        let (version, header_size, total_size, creator_pid, created_unix, boot_id) =
            self.header_constants();
        RegionSnapshot {
            version,
            header_size,
            total_size,
            init_state: self.h_init_state().load(Ordering::Acquire),
            device_count: self.device_count(),
            creator_pid,
            created_unix,
            boot_id,
            generation: 0,
            owner_died_recoveries: self.h_recoveries().load(Ordering::Relaxed),
            reclaimed_slots: self.h_reclaimed().load(Ordering::Relaxed),
            stale_lock_breaks: self.h_stale_breaks().load(Ordering::Relaxed),
            reserve_reclaims: self.h_reserve_reclaims().load(Ordering::Relaxed),
            context_footprint: core::array::from_fn(|d| self.context_footprint(d)),
            arbiter: ArbiterSnapshot {
                task_priority: self.task_priority(),
                at_ns: self.arbiter_at_ns(),
                grants: core::array::from_fn(|d| self.arbiter_grant(d)),
                turns: core::array::from_fn(|d| self.arbiter_turn(d)),
            },
            limits,
            limit_flags,
            uuids,
            used,
            slots,
            compute,
            consistent: false,
        }
    }
}

/// Attempts [`read_snapshot`] makes to get a copy from one instant.
pub(super) const READ_ATTEMPTS: usize = 16;

/// Reads a region through `file` with `pread` into a private buffer and parses it (the
/// header, then the slot table up to the header's `slot_high_water`): the
/// agent's way of reading regions that tenants can truncate, replace or rewrite at any time
/// (a mapping would die of `SIGBUS` when the file shrinks). Never maps, never locks, never
/// blocks on the region lock or a `flock`.
///
/// The file must be a regular file of exactly [`REGION_SIZE`] bytes with a valid,
/// initialised header (the same checks as [`Region::open_existing`]); a file that shrinks
/// while being read gives [`RegionError::Truncated`]. The copy is taken between two reads of
/// the header's `generation` (the seqlock); when writers keep it moving, the last copy is
/// returned with `consistent == false`, as [`Region::snapshot`] does.
pub fn read_snapshot(file: &std::fs::File, path: &Path) -> Result<RegionSnapshot, RegionError> {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::FileExt;
    let fd = file.as_raw_fd();
    let size = file_size(fd, path)?;
    match check_existing(fd, path, size, &[0; 16])? {
        FileState::NeedsInit => {
            return Err(RegionError::NotInitialised {
                path: path.to_path_buf(),
            })
        }
        FileState::Ready | FileState::OtherBoot => {}
    }
    let gen_off = core::mem::offset_of!(RegionHeader, generation) as u64;
    let read_gen = || -> Result<u64, RegionError> {
        let mut g = [0u8; 8];
        file.read_exact_at(&mut g, gen_off)
            .map_err(|e| short_read(file, path, "read generation", e))?;
        Ok(u64::from_le_bytes(g))
    };
    // Zeroed pages cost nothing until written: only the header and the slots up to the
    // high-water mark are read (a region of a few processes is a few KiB, not 1 MiB).
    let mut buf = vec![0u8; REGION_SIZE];
    let slot_size = core::mem::size_of::<layout::Slot>();
    let slots_off = core::mem::offset_of!(layout::RegionLayout, slots);
    let hw_off = core::mem::offset_of!(RegionHeader, slot_high_water);
    let compute_off = core::mem::offset_of!(layout::RegionLayout, compute);
    let mut filled = REGION_SIZE.min(slots_off);
    let mut last = None;
    for attempt in 0..READ_ATTEMPTS {
        let g1 = read_gen()?;
        file.read_exact_at(&mut buf[..slots_off], 0)
            .map_err(|e| short_read(file, path, "read", e))?;
        let hw = u32::from_le_bytes(buf[hw_off..hw_off + 4].try_into().unwrap_or([0; 4]));
        let end = slots_off + (hw as usize).min(MAX_SLOTS) * slot_size;
        if end < filled {
            buf[end..filled].fill(0);
        }
        filled = end;
        file.read_exact_at(&mut buf[slots_off..end], slots_off as u64)
            .map_err(|e| short_read(file, path, "read", e))?;
        // The compute records (1 KiB after the slot table).
        file.read_exact_at(&mut buf[compute_off..], compute_off as u64)
            .map_err(|e| short_read(file, path, "read", e))?;
        let g2 = read_gen()?;
        let mut snap = parse_snapshot(&buf);
        snap.generation = g1;
        if g1 & 1 == 0 && g1 == g2 {
            snap.consistent = true;
            return Ok(snap);
        }
        last = Some(snap);
        if attempt + 1 < READ_ATTEMPTS {
            std::thread::yield_now();
        }
    }
    Ok(last.expect("at least one attempt"))
}

/// A failed `pread` of a region: [`RegionError::Truncated`] when the file is now shorter
/// than a region (it shrank under the reader), else the I/O error.
pub(super) fn short_read(file: &std::fs::File, path: &Path, op: &str, e: io::Error) -> RegionError {
    match file.metadata() {
        Ok(m) if m.len() < REGION_SIZE as u64 => RegionError::Truncated {
            path: path.to_path_buf(),
            found: m.len(),
            expected: REGION_SIZE as u64,
        },
        _ => io_err(path, op, e),
    }
}

/// Parses the bytes of a whole region (`buf.len() == REGION_SIZE`, header already checked).
pub(super) fn parse_snapshot(buf: &[u8]) -> RegionSnapshot {
    use core::mem::{offset_of, size_of};
    use layout::Slot;
    let r32 = |o: usize| u32::from_le_bytes(buf[o..o + 4].try_into().unwrap_or([0; 4]));
    let r64 = |o: usize| u64::from_le_bytes(buf[o..o + 8].try_into().unwrap_or([0; 8]));
    let mut limits = [0u64; MAX_DEVICES];
    let mut limit_flags = [0u32; MAX_DEVICES];
    let mut uuids = [[0u8; 16]; MAX_DEVICES];
    let mut used = [0u64; MAX_DEVICES];
    for d in 0..MAX_DEVICES {
        limits[d] = r64(offset_of!(RegionHeader, limits) + 8 * d);
        limit_flags[d] = r32(offset_of!(RegionHeader, limit_flags) + 4 * d);
        let u = offset_of!(RegionHeader, uuids) + 16 * d;
        uuids[d].copy_from_slice(&buf[u..u + 16]);
        used[d] = r64(offset_of!(RegionHeader, used) + 8 * d);
    }
    let slots_off = offset_of!(layout::RegionLayout, slots);
    let mut slots = Vec::new();
    for i in 0..MAX_SLOTS {
        let base = slots_off + i * size_of::<Slot>();
        if r32(base + offset_of!(Slot, status)) != SLOT_ACTIVE {
            continue;
        }
        let mut usage = [[0u64; USAGE_KINDS]; MAX_DEVICES];
        let mut charged = [0u64; MAX_DEVICES];
        let mut reserve = [0u64; MAX_DEVICES];
        for (d, ud) in usage.iter_mut().enumerate() {
            for (k, uk) in ud.iter_mut().enumerate() {
                *uk = r64(base + offset_of!(Slot, usage) + 8 * (d * USAGE_KINDS + k));
            }
            charged[d] = r64(base + offset_of!(Slot, charged) + 8 * d);
            reserve[d] = r64(base + offset_of!(Slot, reserve) + 8 * d);
        }
        slots.push(SlotSnapshot {
            index: i,
            pid: r32(base + offset_of!(Slot, pid)),
            start_time: r64(base + offset_of!(Slot, start_time)),
            usage,
            charged,
            reserve,
        });
    }
    let compute_off = offset_of!(layout::RegionLayout, compute);
    let mut compute = [ComputeSnapshot::default(); MAX_DEVICES];
    for (d, c) in compute.iter_mut().enumerate() {
        let base = compute_off + d * size_of::<DeviceCompute>();
        *c = ComputeSnapshot {
            sm_limit: r32(base + offset_of!(DeviceCompute, sm_limit)),
            policy: r32(base + offset_of!(DeviceCompute, policy)),
            budget_ns: r64(base + offset_of!(DeviceCompute, budget_ns)) as i64,
            refilled_at_ns: r64(base + offset_of!(DeviceCompute, refilled_at_ns)),
            consumed_ns: r64(base + offset_of!(DeviceCompute, consumed_ns)),
            throttled: r64(base + offset_of!(DeviceCompute, throttled)),
            throttled_ns: r64(base + offset_of!(DeviceCompute, throttled_ns)),
            refusals: r64(base + offset_of!(DeviceCompute, refusals)),
        };
    }
    let boot = offset_of!(RegionHeader, boot_id);
    let mut boot_id = [0u8; 16];
    boot_id.copy_from_slice(&buf[boot..boot + 16]);
    RegionSnapshot {
        version: r32(offset_of!(RegionHeader, version)),
        header_size: r32(offset_of!(RegionHeader, header_size)),
        total_size: r64(offset_of!(RegionHeader, total_size)),
        init_state: r32(offset_of!(RegionHeader, init_state)),
        device_count: r32(offset_of!(RegionHeader, device_count)),
        creator_pid: r32(offset_of!(RegionHeader, creator_pid)),
        created_unix: r64(offset_of!(RegionHeader, created_unix)),
        boot_id,
        generation: 0,
        owner_died_recoveries: r64(offset_of!(RegionHeader, owner_died_recoveries)),
        reclaimed_slots: r64(offset_of!(RegionHeader, reclaimed_slots)),
        stale_lock_breaks: r64(offset_of!(RegionHeader, stale_lock_breaks)),
        reserve_reclaims: r64(offset_of!(RegionHeader, reserve_reclaims)),
        context_footprint: core::array::from_fn(|d| {
            r64(offset_of!(RegionHeader, context_footprint) + 8 * d)
        }),
        arbiter: ArbiterSnapshot {
            task_priority: super::compute::task_priority_of(r32(offset_of!(
                RegionHeader,
                task_priority
            ))),
            at_ns: r64(offset_of!(RegionHeader, arbiter_at_ns)),
            grants: core::array::from_fn(|d| r32(offset_of!(RegionHeader, grants) + 4 * d)),
            turns: core::array::from_fn(|d| r32(offset_of!(RegionHeader, turns) + 4 * d)),
        },
        limits,
        limit_flags,
        uuids,
        used,
        slots,
        compute,
        consistent: false,
    }
}
