//! Optional NVML queries (device count, UUIDs, memory totals, per-process used memory).
//!
//! NVML is loaded at run time from `libnvidia-ml.so.1` (the driver's soname; the unversioned
//! `libnvidia-ml.so` only exists with development packages). When it cannot be loaded the
//! agent runs without it and says so.

use std::collections::BTreeMap;
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
            // Graphics contexts are rare on compute nodes; a failure there is not an error.
            let procs = dev
                .running_compute_processes()
                .unwrap_or_default()
                .into_iter()
                .chain(dev.running_graphics_processes().unwrap_or_default());
            for p in procs {
                if let UsedGpuMemory::Used(bytes) = p.used_gpu_memory {
                    let per = snap.per_device.entry(p.pid).or_default();
                    // A process listed as both compute and graphics is counted once.
                    let e = per.entry(index).or_insert(0);
                    *e = (*e).max(bytes);
                }
            }
        }
        for (pid, per) in &snap.per_device {
            snap.processes.insert(*pid, per.values().sum());
        }
        snap
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_names_the_library() {
        let e = NvmlError::from(nvml_wrapper::error::NvmlError::Uninitialized);
        assert!(e.to_string().contains(NVML_LIB), "{e}");
    }
}
