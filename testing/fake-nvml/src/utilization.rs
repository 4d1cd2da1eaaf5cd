//! Utilisation from the fake device clock: `nvmlDeviceGetProcessUtilization`,
//! `nvmlDeviceGetProcessesUtilizationInfo` and `nvmlDeviceGetUtilizationRates`.
//!
//! A process's `smUtil` is its share of the device's time (busy intervals recorded by the
//! fake driver, `fake_state::Shared::busy_between`) over the window from `lastSeenTimeStamp`
//! (or the last [`DEFAULT_WINDOW_NS`] when it is 0) to now, in percent. Timestamps are
//! `CLOCK_REALTIME` microseconds, as NVML's. See `docs/fake-driver.md`.

use std::ffi::{c_uint, c_void};

use fake_state::{now_ns, process_alive, realtime_offset_ns, BusyWindow, Shared};

use crate::processes::{hide_processes, HIDDEN_PID_OFFSET};
use crate::returns::{
    nonnull, run, NvmlReturn, NVML_ERROR_ARGUMENT_VERSION_MISMATCH, NVML_ERROR_INSUFFICIENT_SIZE,
    NVML_ERROR_INVALID_ARGUMENT, NVML_ERROR_NOT_FOUND,
};
use crate::state::device_of;

/// The window when `lastSeenTimeStamp` is 0, and of `nvmlDeviceGetUtilizationRates` (1 s).
pub const DEFAULT_WINDOW_NS: u64 = 1_000_000_000;

/// `nvmlProcessUtilizationSample_t`, as `cuda-abi` declares it.
pub type ProcessUtilizationSample = cuda_abi::nvml::nvmlProcessUtilizationSample_t;

/// `nvmlProcessUtilizationInfo_v1_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProcessUtilizationInfoV1 {
    /// CPU timestamp in microseconds.
    pub time_stamp: u64,
    /// Pid.
    pub pid: c_uint,
    /// SM utilisation, percent.
    pub sm_util: c_uint,
    /// Memory utilisation (0).
    pub mem_util: c_uint,
    /// Encoder (0).
    pub enc_util: c_uint,
    /// Decoder (0).
    pub dec_util: c_uint,
    /// JPEG (0).
    pub jpg_util: c_uint,
    /// OFA (0).
    pub ofa_util: c_uint,
}

/// `nvmlProcessesUtilizationInfo_v1_t`.
#[repr(C)]
pub struct ProcessesUtilizationInfoV1 {
    /// Must be [`PROCESSES_UTILIZATION_INFO_V1`].
    pub version: c_uint,
    /// In: entries `proc_util_array` holds; out: entries written (or needed).
    pub process_samples_count: c_uint,
    /// Only samples newer than this (µs) are returned.
    pub last_seen_time_stamp: u64,
    /// Caller's array.
    pub proc_util_array: *mut ProcessUtilizationInfoV1,
}

/// `nvmlProcessesUtilizationInfo_v1`: `sizeof | 1 << 24` (0x1000018).
pub const PROCESSES_UTILIZATION_INFO_V1: c_uint =
    (std::mem::size_of::<ProcessesUtilizationInfoV1>() as c_uint) | (1 << 24);

/// `nvmlUtilization_t`.
#[repr(C)]
pub struct Utilization {
    /// Percent of the window the device was busy.
    pub gpu: c_uint,
    /// Memory controller busy (0 here).
    pub memory: c_uint,
}

/// One process's utilisation over a window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProcSample {
    /// Pid (as NVML reports it).
    pub pid: u32,
    /// Percent of the window, 0..=100.
    pub sm: u32,
    /// Timestamp (µs, `CLOCK_REALTIME`).
    pub ts_us: u64,
}

/// Percent of `len` that `busy` is, rounded, at most 100.
pub fn percent(busy: u64, len: u64) -> u32 {
    if len == 0 {
        return 0;
    }
    ((busy as u128 * 100 + len as u128 / 2) / len as u128).min(100) as u32
}

/// The samples of a window: one per process with busy time in it, `ts_us` the window's end.
pub fn samples_of(w: &BusyWindow, ts_us: u64, alive: impl Fn(u32) -> bool) -> Vec<ProcSample> {
    let len = w.to.saturating_sub(w.from.max(w.covered_from));
    w.per_pid
        .iter()
        .filter(|(pid, busy)| *busy > 0 && alive(*pid))
        .map(|&(pid, busy)| ProcSample {
            pid,
            sm: percent(busy, len),
            ts_us,
        })
        .collect()
}

/// The samples of device `dev` since `last_seen_us` (0: the last second), now.
fn process_samples(sh: &Shared, dev: usize, last_seen_us: u64) -> Vec<ProcSample> {
    let now = now_ns();
    let off = realtime_offset_ns();
    let ts_us = ((now as i128 + off) / 1000).max(0) as u64;
    let from = if last_seen_us == 0 {
        now.saturating_sub(DEFAULT_WINDOW_NS)
    } else {
        let mono = last_seen_us as i128 * 1000 - off;
        if mono >= now as i128 {
            return Vec::new();
        }
        mono.max(0) as u64
    };
    let w = sh.busy_between(dev, from, now);
    let mut list = samples_of(&w, ts_us, |pid| process_alive(pid, 0));
    if hide_processes() {
        for s in &mut list {
            s.pid = s.pid.wrapping_add(HIDDEN_PID_OFFSET);
        }
    }
    list
}

/// The common body: fills `write(k, sample)` for up to `*count` samples; with a NULL array
/// or one too small, `NVML_ERROR_INSUFFICIENT_SIZE` and `*count` = the number needed.
fn fill(
    list: &[ProcSample],
    count: &mut c_uint,
    array_null: bool,
    mut write: impl FnMut(usize, &ProcSample),
) -> Result<(), NvmlReturn> {
    if list.is_empty() {
        *count = 0;
        return Err(NVML_ERROR_NOT_FOUND);
    }
    let cap = *count as usize;
    *count = list.len() as c_uint;
    if array_null || list.len() > cap {
        return Err(NVML_ERROR_INSUFFICIENT_SIZE);
    }
    for (k, s) in list.iter().enumerate() {
        write(k, s);
    }
    Ok(())
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetProcessUtilization(
    device: *mut c_void,
    utilization: *mut ProcessUtilizationSample,
    process_samples_count: *mut c_uint,
    last_seen_time_stamp: u64,
) -> NvmlReturn {
    run(|| {
        let (sh, i) = device_of(device)?;
        nonnull(process_samples_count)?;
        let list = process_samples(sh, i, last_seen_time_stamp);
        // SAFETY: checked non-NULL; C contract.
        let mut count = unsafe { process_samples_count.read() };
        let r = fill(&list, &mut count, utilization.is_null(), |k, s| {
            // SAFETY: the caller's array holds *count >= k + 1 entries (C contract).
            unsafe {
                utilization.add(k).write(ProcessUtilizationSample {
                    pid: s.pid,
                    time_stamp: s.ts_us,
                    sm_util: s.sm,
                    ..Default::default()
                })
            }
        });
        // SAFETY: checked non-NULL; C contract.
        unsafe { process_samples_count.write(count) };
        r
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetProcessesUtilizationInfo(
    device: *mut c_void,
    info: *mut ProcessesUtilizationInfoV1,
) -> NvmlReturn {
    run(|| {
        let (sh, i) = device_of(device)?;
        nonnull(info)?;
        // SAFETY: checked non-NULL; C contract.
        let inf = unsafe { &mut *info };
        if inf.version != PROCESSES_UTILIZATION_INFO_V1 {
            return Err(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
        }
        let list = process_samples(sh, i, inf.last_seen_time_stamp);
        let arr = inf.proc_util_array;
        let mut count = inf.process_samples_count;
        let r = fill(&list, &mut count, arr.is_null(), |k, s| {
            // SAFETY: the caller's array holds process_samples_count >= k + 1 entries.
            unsafe {
                arr.add(k).write(ProcessUtilizationInfoV1 {
                    time_stamp: s.ts_us,
                    pid: s.pid,
                    sm_util: s.sm,
                    ..Default::default()
                })
            }
        });
        inf.process_samples_count = count;
        r
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetUtilizationRates(
    device: *mut c_void,
    utilization: *mut Utilization,
) -> NvmlReturn {
    run(|| {
        let (sh, i) = device_of(device)?;
        if utilization.is_null() {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        let now = now_ns();
        let w = sh.busy_between(i, now.saturating_sub(DEFAULT_WINDOW_NS), now);
        let len = w.to.saturating_sub(w.from.max(w.covered_from));
        // SAFETY: checked non-NULL; C contract.
        unsafe {
            utilization.write(Utilization {
                gpu: percent(w.device, len),
                memory: 0,
            })
        };
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_are_nvml_h() {
        assert_eq!(std::mem::size_of::<ProcessUtilizationSample>(), 32);
        assert_eq!(std::mem::size_of::<ProcessUtilizationInfoV1>(), 40);
        assert_eq!(PROCESSES_UTILIZATION_INFO_V1, 0x0100_0018);
    }

    #[test]
    fn shares_of_a_window() {
        assert_eq!(percent(500, 1000), 50);
        assert_eq!(percent(1000, 1000), 100);
        assert_eq!(percent(2000, 1000), 100);
        assert_eq!(percent(5, 0), 0);
        let w = BusyWindow {
            from: 1000,
            to: 2000,
            covered_from: 1000,
            per_pid: vec![(7, 300), (9, 600), (11, 100)],
            device: 1000,
        };
        let s = samples_of(&w, 42, |pid| pid != 11);
        assert_eq!(
            s,
            vec![
                ProcSample {
                    pid: 7,
                    sm: 30,
                    ts_us: 42
                },
                ProcSample {
                    pid: 9,
                    sm: 60,
                    ts_us: 42
                }
            ]
        );
        // A window the ring covers only in part is measured over what is covered.
        let w = BusyWindow {
            covered_from: 1500,
            per_pid: vec![(7, 250)],
            ..w
        };
        assert_eq!(samples_of(&w, 1, |_| true)[0].sm, 50);
    }

    #[test]
    fn sizing_and_not_found() {
        let one = [ProcSample {
            pid: 1,
            sm: 5,
            ts_us: 9,
        }];
        let mut n = 0;
        assert_eq!(
            fill(&[], &mut n, true, |_, _| {}),
            Err(NVML_ERROR_NOT_FOUND)
        );
        assert_eq!(
            fill(&one, &mut n, true, |_, _| {}),
            Err(NVML_ERROR_INSUFFICIENT_SIZE)
        );
        assert_eq!(n, 1);
        let mut n = 0;
        assert_eq!(
            fill(&one, &mut n, false, |_, _| {}),
            Err(NVML_ERROR_INSUFFICIENT_SIZE)
        );
        let mut got = Vec::new();
        let mut n = 4;
        assert_eq!(fill(&one, &mut n, false, |k, s| got.push((k, *s))), Ok(()));
        assert_eq!((n, got), (1, vec![(0, one[0])]));
    }
}
