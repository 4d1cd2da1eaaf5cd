//! Optional NVML queries (device count, UUIDs, memory totals, per-process used memory).
//!
//! NVML is loaded at run time from `libnvidia-ml.so.1` (the driver's soname; the unversioned
//! `libnvidia-ml.so` only exists with development packages). When it cannot be loaded the
//! agent runs without it and says so.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsStr;

use nvml_wrapper::enums::device::UsedGpuMemory;
use serde::Serialize;

/// The library the agent loads.
pub const NVML_LIB: &str = "libnvidia-ml.so.1";

/// Errors loading NVML.
#[derive(Debug, thiserror::Error)]
pub enum NvmlError {
    /// The library could not be loaded or initialised.
    #[error("NVML unavailable ({NVML_LIB}): {0}")]
    Unavailable(#[from] nvml_wrapper::error::NvmlError),
}

/// One GPU as NVML reports it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct GpuInfo {
    /// NVML index.
    pub index: u32,
    /// UUID string (`GPU-...`), if NVML returned one.
    pub uuid: Option<String>,
    /// Total memory in bytes.
    pub total: Option<u64>,
    /// Used memory in bytes.
    pub used: Option<u64>,
}

/// One NVML query: devices and per-process used memory.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct NvmlSnapshot {
    /// Devices by index.
    pub devices: Vec<GpuInfo>,
    /// Host pid -> used bytes, summed over devices (compute and graphics processes).
    pub processes: BTreeMap<u32, u64>,
    /// Host pid -> device index -> used bytes.
    pub per_device: BTreeMap<u32, BTreeMap<u32, u64>>,
    /// Devices whose compute process list was read: on these, a pid that is not listed holds
    /// nothing. On the others nothing is known.
    pub queried: BTreeSet<u32>,
    /// Pids listed as compute processes (on any device).
    pub compute: BTreeSet<u32>,
    /// Pid -> devices where it is listed without a used-memory figure (NVML says
    /// "not available", e.g. without the privilege to read it): unknown there.
    pub unreported: BTreeMap<u32, BTreeSet<u32>>,
}

impl NvmlSnapshot {
    /// Records one entry of a device's process list (`used` = `None` when NVML gives no
    /// figure). A pid listed twice on a device (compute and graphics) counts once, with the
    /// larger figure.
    pub fn add_process(&mut self, device: u32, pid: u32, used: Option<u64>, compute: bool) {
        if compute {
            self.compute.insert(pid);
        }
        match used {
            Some(bytes) => {
                let e = self
                    .per_device
                    .entry(pid)
                    .or_default()
                    .entry(device)
                    .or_insert(0);
                *e = (*e).max(bytes);
            }
            None => {
                self.unreported.entry(pid).or_default().insert(device);
            }
        }
    }

    /// Fills [`NvmlSnapshot::processes`] (per-pid totals) from the per-device figures.
    pub fn finish(&mut self) {
        self.processes = self
            .per_device
            .iter()
            .map(|(pid, per)| (*pid, saturating_sum(per.values())))
            .collect();
    }

    /// What `pid` holds on device `index`: `None` when unknown (that device's process list
    /// could not be read, or NVML lists the pid there without a figure), `Some(0)` when the
    /// device was read and the pid is not listed.
    pub fn used_on(&self, pid: u32, index: u32) -> Option<u64> {
        if !self.queried.contains(&index)
            || self
                .unreported
                .get(&pid)
                .is_some_and(|d| d.contains(&index))
        {
            return None;
        }
        Some(
            self.per_device
                .get(&pid)
                .and_then(|p| p.get(&index))
                .copied()
                .unwrap_or(0),
        )
    }

    /// What `pid` holds on every device whose figure is known (see [`NvmlSnapshot::used_on`],
    /// zeros included): a device absent from the map is unknown. `None` when nothing is known.
    pub fn used_by(&self, pid: u32) -> Option<BTreeMap<u32, u64>> {
        let known: BTreeMap<u32, u64> = self
            .queried
            .iter()
            .filter_map(|&d| self.used_on(pid, d).map(|b| (d, b)))
            .collect();
        (!known.is_empty()).then_some(known)
    }

    /// Total of `pid` over the devices whose figure is known; `None` when nothing is known.
    pub fn total_of(&self, pid: u32) -> Option<u64> {
        self.used_by(pid).map(|m| saturating_sum(m.values()))
    }

    /// The NVML index of the GPU with this raw CUDA UUID (as the region records it), if
    /// NVML lists it. All-zero (unknown) UUIDs match nothing.
    pub fn index_of_uuid(&self, raw: &[u8; 16]) -> Option<u32> {
        let want = uuid_string(raw)?;
        self.devices
            .iter()
            .find(|d| {
                d.uuid
                    .as_deref()
                    .is_some_and(|u| u.eq_ignore_ascii_case(&want))
            })
            .map(|d| d.index)
    }
}

/// Sum that stops at `u64::MAX` (NVML figures come from a library: never trust them not to
/// overflow).
pub fn saturating_sum<'a>(v: impl IntoIterator<Item = &'a u64>) -> u64 {
    v.into_iter().fold(0u64, |a, &b| a.saturating_add(b))
}

/// A raw CUDA UUID as NVML prints it (`GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`), or `None`
/// when all zero (unknown).
pub fn uuid_string(u: &[u8; 16]) -> Option<String> {
    if u.iter().all(|&b| b == 0) {
        return None;
    }
    let h: String = u.iter().map(|b| format!("{b:02x}")).collect();
    Some(format!(
        "GPU-{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    ))
}

/// A loaded NVML.
pub struct Nvml {
    inner: nvml_wrapper::Nvml,
}

impl std::fmt::Debug for Nvml {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Nvml")
    }
}

impl Nvml {
    /// Loads and initialises `libnvidia-ml.so.1` (found through the normal library search
    /// path, so `LD_LIBRARY_PATH` selects a fake one in tests).
    pub fn load() -> Result<Nvml, NvmlError> {
        let inner = nvml_wrapper::Nvml::builder()
            .lib_path(OsStr::new(NVML_LIB))
            .init()?;
        Ok(Nvml { inner })
    }

    /// The driver version, if NVML reports it.
    pub fn driver_version(&self) -> Option<String> {
        self.inner.sys_driver_version().ok()
    }

    /// Queries every device. Individual failures leave fields empty instead of failing.
    pub fn snapshot(&self) -> NvmlSnapshot {
        let mut snap = NvmlSnapshot::default();
        let count = self.inner.device_count().unwrap_or(0);
        for index in 0..count {
            let Ok(dev) = self.inner.device_by_index(index) else {
                snap.devices.push(GpuInfo {
                    index,
                    uuid: None,
                    total: None,
                    used: None,
                });
                continue;
            };
            let mem = dev.memory_info().ok();
            snap.devices.push(GpuInfo {
                index,
                uuid: dev.uuid().ok(),
                total: mem.as_ref().map(|m| m.total),
                used: mem.as_ref().map(|m| m.used),
            });
            // Without the compute list nothing is known about this device's processes.
            let Ok(compute) = dev.running_compute_processes() else {
                continue;
            };
            snap.queried.insert(index);
            let used = |m: UsedGpuMemory| match m {
                UsedGpuMemory::Used(b) => Some(b),
                UsedGpuMemory::Unavailable => None,
            };
            for p in compute {
                snap.add_process(index, p.pid, used(p.used_gpu_memory), true);
            }
            // Graphics contexts are rare on compute nodes; a failure there is not an error.
            for p in dev.running_graphics_processes().unwrap_or_default() {
                snap.add_process(index, p.pid, used(p.used_gpu_memory), false);
            }
        }
        snap.finish();
        snap
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_device_figures_distinguish_nothing_from_unknown() {
        let mut s = NvmlSnapshot::default();
        s.queried.insert(0);
        s.add_process(0, 10, Some(300), true);
        s.add_process(0, 10, Some(200), false); // also a graphics process: counted once
        s.add_process(0, 11, None, true);
        s.add_process(1, 10, Some(50), true); // device 1 was not read completely
        s.finish();
        assert_eq!(s.processes[&10], 350);
        assert_eq!(s.used_on(10, 0), Some(300));
        assert_eq!(
            s.used_on(12, 0),
            Some(0),
            "not listed on a read device: nothing"
        );
        assert_eq!(s.used_on(11, 0), None, "listed without a figure: unknown");
        assert_eq!(s.used_on(10, 1), None, "device not read: unknown");
        assert_eq!(s.used_by(10), Some([(0, 300)].into_iter().collect()));
        assert_eq!(s.used_by(12), Some([(0, 0)].into_iter().collect()));
        assert_eq!(s.used_by(11), None);
        assert_eq!(s.total_of(12), Some(0));
        assert!(s.compute.contains(&10) && s.compute.contains(&11));
        assert_eq!(NvmlSnapshot::default().total_of(10), None);
        // Absurd figures saturate instead of overflowing.
        s.queried.insert(1);
        s.add_process(0, 20, Some(u64::MAX), true);
        s.add_process(1, 20, Some(u64::MAX), true);
        s.finish();
        assert_eq!(s.processes[&20], u64::MAX);
        assert_eq!(s.total_of(20), Some(u64::MAX));
    }

    #[test]
    fn uuid_lookup_matches_the_region_bytes() {
        let mut raw = [0u8; 16];
        raw[0] = 0xfa;
        raw[15] = 0x01;
        let s = NvmlSnapshot {
            devices: vec![GpuInfo {
                index: 3,
                uuid: Some("GPU-FA000000-0000-0000-0000-000000000001".into()),
                total: None,
                used: None,
            }],
            ..Default::default()
        };
        assert_eq!(s.index_of_uuid(&raw), Some(3));
        assert_eq!(s.index_of_uuid(&[0; 16]), None);
        raw[1] = 1;
        assert_eq!(s.index_of_uuid(&raw), None);
    }

    #[test]
    fn error_names_the_library() {
        let e = NvmlError::from(nvml_wrapper::error::NvmlError::Uninitialized);
        assert!(e.to_string().contains(NVML_LIB), "{e}");
    }
}
