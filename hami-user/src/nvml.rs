//! Optional NVML queries (device count, UUIDs, memory totals, per-process used memory,
//! per-process SM utilisation).
//!
//! NVML is loaded at run time from `libnvidia-ml.so.1` (the driver's soname; the unversioned
//! `libnvidia-ml.so` only exists with development packages). When it cannot be loaded the
//! agent runs without it, says so, and tries again with a backoff ([`retry`]).

pub mod retry;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ffi::{c_uint, c_ulonglong, c_void, OsStr};
use std::os::unix::ffi::OsStrExt as _;
use std::path::PathBuf;
use std::sync::Mutex;

use cuda_abi::nvml::{NVML_ERROR_INSUFFICIENT_SIZE, NVML_ERROR_NOT_FOUND, NVML_SUCCESS};
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
    /// Devices whose per-process utilisation was read at this sample
    /// (`nvmlDeviceGetProcessUtilization` answered, `NVML_ERROR_NOT_FOUND` included: no
    /// process used the device since the previous sample). On the others it is unknown.
    pub util_queried: BTreeSet<u32>,
    /// Pid -> NVML device -> SM utilisation in percent of the device (0..=100) over the
    /// time since the previous sample (the mean of NVML's samples for that pid).
    pub sm_util: BTreeMap<u32, BTreeMap<u32, u32>>,
    /// NVML device -> utilisation of the whole device in percent
    /// (`nvmlDeviceGetUtilizationRates`, `gpu`), when NVML gave it.
    pub gpu_util: BTreeMap<u32, u32>,
    /// NVML device -> utilisation of its memory controller in percent
    /// (`nvmlDeviceGetUtilizationRates`, `memory`: the time device memory was read or
    /// written), when NVML gave it.
    pub mem_util: BTreeMap<u32, u32>,
    /// NVML device -> product name (`nvmlDeviceGetName`), when NVML gave it.
    pub names: BTreeMap<u32, String>,
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

    /// NVML indexes of the devices whose process list names `pid` (with a used-memory figure
    /// or without one), sorted: where it holds a context. Empty when it is listed nowhere.
    pub fn devices_of(&self, pid: u32) -> Vec<u32> {
        let mut d: Vec<u32> = self
            .per_device
            .get(&pid)
            .into_iter()
            .flat_map(|m| m.keys().copied())
            .chain(self.unreported.get(&pid).into_iter().flatten().copied())
            .collect();
        d.sort_unstable();
        d.dedup();
        d
    }

    /// Total of `pid` over the devices whose figure is known; `None` when nothing is known.
    pub fn total_of(&self, pid: u32) -> Option<u64> {
        self.used_by(pid).map(|m| saturating_sum(m.values()))
    }

    /// Records what `nvmlDeviceGetProcessUtilization` returned for `device`: the device
    /// becomes known (a pid without a sample used none of its SMs), and each pid's SM
    /// utilisation is the mean of its samples (NVML may return several per pid, one per
    /// sample period since the last one seen), capped at 100.
    pub fn add_utilization(&mut self, device: u32, samples: &[ProcessUtilizationSample]) {
        self.util_queried.insert(device);
        let mut per_pid: BTreeMap<u32, (u64, u64)> = BTreeMap::new();
        for s in samples {
            let e = per_pid.entry(s.pid).or_default();
            e.0 += u64::from(s.sm_util.min(100));
            e.1 += 1;
        }
        for (pid, (sum, n)) in per_pid {
            let mean = (sum as f64 / n as f64).round() as u32;
            self.sm_util.entry(pid).or_default().insert(device, mean);
        }
    }

    /// SM utilisation of `pid` on NVML device `index` since the previous sample: `None`
    /// when the device's utilisation was not read, `Some(0)` when it was and NVML has no
    /// sample for the pid.
    pub fn sm_on(&self, pid: u32, index: u32) -> Option<u32> {
        if !self.util_queried.contains(&index) {
            return None;
        }
        Some(
            self.sm_util
                .get(&pid)
                .and_then(|d| d.get(&index))
                .copied()
                .unwrap_or(0),
        )
    }

    /// SM utilisation of `pid` on every device whose utilisation was read (zeros included).
    pub fn sm_by(&self, pid: u32) -> BTreeMap<u32, u32> {
        self.util_queried
            .iter()
            .filter_map(|&d| self.sm_on(pid, d).map(|u| (d, u)))
            .collect()
    }

    /// The NVML index of the GPU with this raw CUDA UUID (as the region records it), if
    /// NVML lists it. All-zero (unknown) UUIDs match nothing.
    pub fn index_of_uuid(&self, raw: &[u8; 16]) -> Option<u32> {
        let want = hami_abi::uuid::format_known(raw)?;
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

/// `nvmlProcessUtilizationSample_t` (nvml.h), as `cuda-abi` declares it.
pub type ProcessUtilizationSample = cuda_abi::nvml::nvmlProcessUtilizationSample_t;

/// Buffer sizes tried before giving up on a process list that keeps growing between calls.
const UTIL_ATTEMPTS: usize = 4;

/// Errors reading per-process utilisation.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UtilizationError {
    /// NVML returned another error code (e.g. `NVML_ERROR_NOT_SUPPORTED` = 3).
    #[error("nvmlDeviceGetProcessUtilization returned {0}")]
    Nvml(u32),
    /// The number of samples grew at every attempt.
    #[error("nvmlDeviceGetProcessUtilization: the sample count kept growing ({0} last)")]
    KeepsGrowing(u32),
}

/// The buffer negotiation of `nvmlDeviceGetProcessUtilization` (nvml.h): `call(buffer,
/// &mut count)` is one call with the caller's `lastSeenTimeStamp`. First with a null buffer
/// to learn the count (NVML answers `NVML_ERROR_INSUFFICIENT_SIZE` or `NVML_SUCCESS` with
/// the count set), then with a buffer of that size plus room for a few more; a list that
/// grew in between (`NVML_ERROR_INSUFFICIENT_SIZE` again) is read again with a larger one.
/// `NVML_ERROR_NOT_FOUND` (no sample since `lastSeenTimeStamp`, or none yet) is an empty
/// list, not an error.
pub fn read_process_utilization(
    mut call: impl FnMut(*mut ProcessUtilizationSample, &mut u32) -> u32,
) -> Result<Vec<ProcessUtilizationSample>, UtilizationError> {
    let mut count = 0u32;
    match call(std::ptr::null_mut(), &mut count) {
        NVML_ERROR_NOT_FOUND => return Ok(Vec::new()),
        NVML_SUCCESS | NVML_ERROR_INSUFFICIENT_SIZE => {}
        e => return Err(UtilizationError::Nvml(e)),
    }
    if count == 0 {
        return Ok(Vec::new());
    }
    for _ in 0..UTIL_ATTEMPTS {
        let cap = count.saturating_add(8).min(1 << 20);
        let mut buf = vec![ProcessUtilizationSample::default(); cap as usize];
        let mut n = cap;
        match call(buf.as_mut_ptr(), &mut n) {
            NVML_SUCCESS => {
                buf.truncate(n.min(cap) as usize);
                return Ok(buf);
            }
            NVML_ERROR_NOT_FOUND => return Ok(Vec::new()),
            NVML_ERROR_INSUFFICIENT_SIZE => count = n.max(cap.saturating_mul(2)),
            e => return Err(UtilizationError::Nvml(e)),
        }
    }
    Err(UtilizationError::KeepsGrowing(count))
}

/// `nvmlDeviceGetProcessUtilization(device, utilization, processSamplesCount,
/// lastSeenTimeStamp)`.
type ProcessUtilizationFn = unsafe extern "C" fn(
    *mut c_void,
    *mut ProcessUtilizationSample,
    *mut c_uint,
    c_ulonglong,
) -> u32;

/// `nvmlDeviceGetProcessUtilization` from the NVML that nvml-wrapper loaded, if it has it.
fn process_utilization_fn() -> Option<ProcessUtilizationFn> {
    let lib = std::ffi::CString::new(NVML_LIB).ok()?;
    // SAFETY: RTLD_NOLOAD only returns a handle to a library already loaded (nvml-wrapper's
    // NVML: no initialiser runs); the reference it takes is kept for the process's life.
    let h = unsafe { libc::dlopen(lib.as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD) };
    if h.is_null() {
        return None;
    }
    // SAFETY: a symbol lookup in a valid handle with a NUL-terminated name.
    let sym = unsafe { libc::dlsym(h, c"nvmlDeviceGetProcessUtilization".as_ptr()) };
    if sym.is_null() {
        return None;
    }
    // SAFETY: the symbol is NVML's function with nvml.h's signature (ProcessUtilizationFn).
    Some(unsafe { std::mem::transmute::<*mut c_void, ProcessUtilizationFn>(sym) })
}

/// The file the loaded `libnvidia-ml.so.1` came from (as the dynamic loader found it), if
/// the loader says.
fn loaded_library_path() -> Option<PathBuf> {
    let lib = std::ffi::CString::new(NVML_LIB).ok()?;
    // SAFETY: RTLD_NOLOAD only returns a handle to a library already loaded (no initialiser
    // runs); the reference it takes is released below.
    let h = unsafe { libc::dlopen(lib.as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD) };
    if h.is_null() {
        return None;
    }
    // SAFETY: a symbol lookup in a valid handle with a NUL-terminated name.
    let sym = unsafe { libc::dlsym(h, c"nvmlInit_v2".as_ptr()) };
    let mut info = std::mem::MaybeUninit::<libc::Dl_info>::zeroed();
    // SAFETY: `info` is valid for writes of one Dl_info; dladdr only reads the address.
    let found = !sym.is_null() && unsafe { libc::dladdr(sym, info.as_mut_ptr()) } != 0;
    let path = if found {
        // SAFETY: dladdr succeeded, so it filled `info` (zeroed before: null fields stay null).
        let info = unsafe { info.assume_init() };
        (!info.dli_fname.is_null()).then(|| {
            // SAFETY: dli_fname is a NUL-terminated string owned by the loader, valid while
            // the library stays loaded (it does: `h` and nvml-wrapper hold it).
            let name = unsafe { std::ffi::CStr::from_ptr(info.dli_fname) };
            PathBuf::from(std::ffi::OsStr::from_bytes(name.to_bytes()))
        })
    } else {
        None
    };
    // SAFETY: releases the reference RTLD_NOLOAD took; nvml-wrapper keeps its own.
    unsafe { libc::dlclose(h) };
    path
}

/// A loaded NVML.
pub struct Nvml {
    inner: nvml_wrapper::Nvml,
    /// The file it was loaded from.
    path: Option<PathBuf>,
    /// `nvmlDeviceGetProcessUtilization`, when the library has it.
    process_utilization: Option<ProcessUtilizationFn>,
    /// NVML device -> newest sample timestamp seen (`lastSeenTimeStamp` of the next call).
    last_seen: Mutex<HashMap<u32, u64>>,
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
        let process_utilization = process_utilization_fn();
        if process_utilization.is_none() {
            tracing::info!(
                "NVML has no nvmlDeviceGetProcessUtilization: no compute shares measured"
            );
        }
        Ok(Nvml {
            inner,
            path: loaded_library_path(),
            process_utilization,
            last_seen: Mutex::new(HashMap::new()),
        })
    }

    /// The file NVML was loaded from (the dynamic loader's name for it), if known.
    pub fn library_path(&self) -> Option<&std::path::Path> {
        self.path.as_deref()
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
            if let Ok(u) = dev.utilization_rates() {
                snap.gpu_util.insert(index, u.gpu.min(100));
                snap.mem_util.insert(index, u.memory.min(100));
            }
            if let Ok(name) = dev.name() {
                snap.names.insert(index, name);
            }
            self.sample_utilization(&mut snap, index, &dev);
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

    /// Per-process SM utilisation of one device since the previous call (with
    /// `lastSeenTimeStamp` = the newest sample seen then), into `snap`.
    fn sample_utilization(&self, snap: &mut NvmlSnapshot, index: u32, dev: &nvml_wrapper::Device) {
        let Some(f) = self.process_utilization else {
            return;
        };
        let mut last_seen = self.last_seen.lock().unwrap_or_else(|e| e.into_inner());
        let last = last_seen.get(&index).copied().unwrap_or(0);
        // SAFETY: the raw handle of a device of this initialised NVML, used for this call.
        let handle = unsafe { dev.handle() } as *mut c_void;
        let got = read_process_utilization(|buf, count| {
            // SAFETY: `buf` is null or holds `*count` samples (read_process_utilization's
            // contract); `count` is a valid pointer for the call.
            unsafe { f(handle, buf, count, last) }
        });
        match got {
            Ok(samples) => {
                if let Some(newest) = samples.iter().map(|s| s.time_stamp).max() {
                    if newest > last {
                        last_seen.insert(index, newest);
                    }
                }
                snap.add_utilization(index, &samples);
            }
            Err(e) => tracing::debug!(device = index, error = %e, "no per-process utilisation"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_of_lists_where_nvml_names_the_pid_with_or_without_a_figure() {
        let mut n = NvmlSnapshot::default();
        n.queried.extend([0, 1, 2]);
        n.add_process(2, 10, Some(5), true);
        n.add_process(0, 10, None, true);
        n.add_process(1, 11, Some(0), true);
        n.finish();
        assert_eq!(n.devices_of(10), vec![0, 2]);
        assert_eq!(n.devices_of(11), vec![1]);
        assert!(n.devices_of(12).is_empty());
    }

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

    /// A stand-in for NVML's side of the buffer protocol: `samples` is what it holds; it
    /// answers like nvml.h documents (count on a null buffer, INSUFFICIENT_SIZE when the
    /// buffer is too small).
    fn nvml_like(
        samples: &[ProcessUtilizationSample],
        null_answer: u32,
    ) -> impl FnMut(*mut ProcessUtilizationSample, &mut u32) -> u32 + '_ {
        move |buf, count| {
            let n = samples.len() as u32;
            if n == 0 {
                return NVML_ERROR_NOT_FOUND;
            }
            if buf.is_null() {
                *count = n;
                return null_answer;
            }
            if *count < n {
                *count = n;
                return NVML_ERROR_INSUFFICIENT_SIZE;
            }
            for (i, s) in samples.iter().enumerate() {
                // SAFETY: the caller's buffer holds *count >= n samples.
                unsafe { buf.add(i).write(*s) };
            }
            *count = n;
            NVML_SUCCESS
        }
    }

    fn sample(pid: u32, ts: u64, sm: u32) -> ProcessUtilizationSample {
        ProcessUtilizationSample {
            pid,
            time_stamp: ts,
            sm_util: sm,
            ..Default::default()
        }
    }

    #[test]
    fn process_utilization_buffer_protocol() {
        let two = [sample(10, 5, 40), sample(11, 6, 60)];
        // Null buffer answered with INSUFFICIENT_SIZE (as drivers do) or SUCCESS.
        for null_answer in [NVML_ERROR_INSUFFICIENT_SIZE, NVML_SUCCESS] {
            assert_eq!(
                read_process_utilization(nvml_like(&two, null_answer)).unwrap(),
                two.to_vec()
            );
        }
        // No sample yet / none since lastSeenTimeStamp: empty, not an error.
        assert_eq!(
            read_process_utilization(nvml_like(&[], NVML_SUCCESS)),
            Ok(vec![])
        );
        // Another error is reported with its code.
        assert_eq!(
            read_process_utilization(|_, _| 3),
            Err(UtilizationError::Nvml(3))
        );
        // The list grows between the two calls: read again with a larger buffer.
        let many: Vec<_> = (0..40).map(|i| sample(100 + i, 9, 1)).collect();
        let mut calls = 0;
        let mut grows = nvml_like(&many, NVML_ERROR_INSUFFICIENT_SIZE);
        let got = read_process_utilization(|buf, count| {
            calls += 1;
            if buf.is_null() {
                *count = 2; // two processes when asked...
                return NVML_ERROR_INSUFFICIENT_SIZE;
            }
            grows(buf, count) // ...forty by the time the buffer comes
        })
        .unwrap();
        assert_eq!(got, many);
        assert_eq!(calls, 3, "null, too small, large enough");
        // A count that keeps growing ends with an error, not a loop.
        let mut n = 1u32;
        let e = read_process_utilization(|_, count| {
            n = n.saturating_mul(16);
            *count = n;
            NVML_ERROR_INSUFFICIENT_SIZE
        });
        assert!(matches!(e, Err(UtilizationError::KeepsGrowing(_))), "{e:?}");
    }

    #[test]
    fn utilization_per_pid_is_the_mean_of_its_samples_and_unknown_devices_stay_unknown() {
        let mut s = NvmlSnapshot::default();
        s.add_utilization(
            0,
            &[sample(10, 1, 30), sample(10, 2, 50), sample(11, 1, 250)],
        );
        s.add_utilization(2, &[]); // read: nobody busy
        assert_eq!(s.sm_on(10, 0), Some(40), "mean of its two samples");
        assert_eq!(s.sm_on(11, 0), Some(100), "capped at the whole device");
        assert_eq!(s.sm_on(12, 0), Some(0), "no sample on a read device: idle");
        assert_eq!(s.sm_on(10, 2), Some(0));
        assert_eq!(s.sm_on(10, 1), None, "device not read: unknown");
        assert_eq!(s.sm_by(10), [(0, 40), (2, 0)].into_iter().collect());
    }

    #[test]
    fn error_names_the_library() {
        let e = NvmlError::from(nvml_wrapper::error::NvmlError::Uninitialized);
        assert!(e.to_string().contains(NVML_LIB), "{e}");
    }
}
