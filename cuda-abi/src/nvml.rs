//! The slice of NVML's ABI (`nvml.h`) hami-rs uses: result codes, handles, the memory and
//! process structs, and function-pointer types.

use core::ffi::{c_char, c_uint, c_void};

/// `nvmlReturn_t` (`typedef enum nvmlReturn_enum {...} nvmlReturn_t;`): unsigned, as for
/// `CUresult`.
pub type nvmlReturn_t = c_uint;
/// `nvmlDevice_t` (`struct nvmlDevice_st *`).
pub type nvmlDevice_t = *mut c_void;

/// `NVML_SUCCESS`.
pub const NVML_SUCCESS: nvmlReturn_t = 0;
/// `NVML_ERROR_UNINITIALIZED`.
pub const NVML_ERROR_UNINITIALIZED: nvmlReturn_t = 1;
/// `NVML_ERROR_INVALID_ARGUMENT`.
pub const NVML_ERROR_INVALID_ARGUMENT: nvmlReturn_t = 2;
/// `NVML_ERROR_NOT_SUPPORTED`.
pub const NVML_ERROR_NOT_SUPPORTED: nvmlReturn_t = 3;
/// `NVML_ERROR_NOT_FOUND`.
pub const NVML_ERROR_NOT_FOUND: nvmlReturn_t = 6;
/// `NVML_ERROR_INSUFFICIENT_SIZE`.
pub const NVML_ERROR_INSUFFICIENT_SIZE: nvmlReturn_t = 7;
/// `NVML_ERROR_FUNCTION_NOT_FOUND`.
pub const NVML_ERROR_FUNCTION_NOT_FOUND: nvmlReturn_t = 13;
/// `NVML_ERROR_ARGUMENT_VERSION_MISMATCH`.
pub const NVML_ERROR_ARGUMENT_VERSION_MISMATCH: nvmlReturn_t = 25;
/// `NVML_ERROR_UNKNOWN`.
pub const NVML_ERROR_UNKNOWN: nvmlReturn_t = 999;

/// `NVML_VALUE_NOT_AVAILABLE` (`-1` as `unsigned long long`): a process's `usedGpuMemory`
/// NVML cannot report.
pub const NVML_VALUE_NOT_AVAILABLE: u64 = u64::MAX;

/// `nvmlMemory_t` (`nvmlDeviceGetMemoryInfo`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct nvmlMemory_t {
    /// `total`: installed memory.
    pub total: u64,
    /// `free`: unallocated memory.
    pub free: u64,
    /// `used`: allocated memory.
    pub used: u64,
}

/// `nvmlMemory_v2_t` (`nvmlDeviceGetMemoryInfo_v2`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct nvmlMemory_v2_t {
    /// `version`, set by the caller: [`NVML_MEMORY_V2`].
    pub version: c_uint,
    /// `total`.
    pub total: u64,
    /// `reserved`: held by the driver and firmware.
    pub reserved: u64,
    /// `free`.
    pub free: u64,
    /// `used`.
    pub used: u64,
}

/// `nvmlMemory_v2` (`NVML_STRUCT_VERSION(Memory, 2)`: `sizeof(nvmlMemory_v2_t) | 2 << 24`).
pub const NVML_MEMORY_V2: c_uint = (core::mem::size_of::<nvmlMemory_v2_t>() as c_uint) | (2 << 24);

/// `nvmlProcessInfo_v1_t` (entries of `nvmlDeviceGetComputeRunningProcesses`, the v1 name).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct nvmlProcessInfo_v1_t {
    /// `pid` (as the host's pid namespace numbers it).
    pub pid: c_uint,
    /// `usedGpuMemory`, or [`NVML_VALUE_NOT_AVAILABLE`].
    pub used_gpu_memory: u64,
}

/// `nvmlProcessInfo_v2_t`, also `nvmlProcessInfo_t` (entries of
/// `nvmlDeviceGetComputeRunningProcesses_v2` and `_v3`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct nvmlProcessInfo_v2_t {
    /// `pid` (as the host's pid namespace numbers it).
    pub pid: c_uint,
    /// `usedGpuMemory`, or [`NVML_VALUE_NOT_AVAILABLE`].
    pub used_gpu_memory: u64,
    /// `gpuInstanceId` (MIG), `0xFFFFFFFF` if none.
    pub gpu_instance_id: c_uint,
    /// `computeInstanceId` (MIG), `0xFFFFFFFF` if none.
    pub compute_instance_id: c_uint,
}

/// `nvmlProcessUtilizationSample_t` (entries of `nvmlDeviceGetProcessUtilization`): one
/// process's utilisation of a device over one of NVML's sample periods.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct nvmlProcessUtilizationSample_t {
    /// `pid` (the host's pid namespace).
    pub pid: c_uint,
    /// `timeStamp`: CPU timestamp of the sample, in microseconds (`CLOCK_REALTIME`).
    pub time_stamp: u64,
    /// `smUtil`: SM (3D/compute) utilisation, percent.
    pub sm_util: c_uint,
    /// `memUtil`: frame buffer memory utilisation, percent.
    pub mem_util: c_uint,
    /// `encUtil`: encoder utilisation, percent.
    pub enc_util: c_uint,
    /// `decUtil`: decoder utilisation, percent.
    pub dec_util: c_uint,
}

/// `nvmlProcessDetail_v1_t` (entries of `nvmlDeviceGetRunningProcessDetailList`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct nvmlProcessDetail_v1_t {
    /// `pid` (the host's pid namespace).
    pub pid: c_uint,
    /// `usedGpuMemory`, or [`NVML_VALUE_NOT_AVAILABLE`].
    pub used_gpu_memory: u64,
    /// `gpuInstanceId` (MIG), `0xFFFFFFFF` if none.
    pub gpu_instance_id: c_uint,
    /// `computeInstanceId` (MIG), `0xFFFFFFFF` if none.
    pub compute_instance_id: c_uint,
    /// `usedGpuCcProtectedMemory`: confidential-computing protected memory.
    pub used_gpu_cc_protected_memory: u64,
}

/// `nvmlProcessDetailList_v1_t`, the argument of `nvmlDeviceGetRunningProcessDetailList`.
#[repr(C)]
#[derive(Debug)]
pub struct nvmlProcessDetailList_v1_t {
    /// `version`: [`NVML_PROCESS_DETAIL_LIST_V1`].
    pub version: c_uint,
    /// `mode` (`nvmlProcessMode_t`): 0 compute, 1 graphics, 2 MPS compute.
    pub mode: c_uint,
    /// `numProcArrayEntries`: in, the entries `proc_array` holds; out, those written (or
    /// needed).
    pub num_proc_array_entries: c_uint,
    /// `procArray`: the caller's array.
    pub proc_array: *mut nvmlProcessDetail_v1_t,
}

/// `nvmlProcessDetailList_v1` (`NVML_STRUCT_VERSION(ProcessDetailList, 1)`:
/// `sizeof(nvmlProcessDetailList_v1_t) | 1 << 24`).
pub const NVML_PROCESS_DETAIL_LIST_V1: c_uint =
    (core::mem::size_of::<nvmlProcessDetailList_v1_t>() as c_uint) | (1 << 24);

/// `nvmlReturn_t nvmlInit_v2(void)`.
pub type FnNvmlInit = unsafe extern "C" fn() -> nvmlReturn_t;
/// `nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory)`.
pub type FnNvmlMemInfo = unsafe extern "C" fn(nvmlDevice_t, *mut nvmlMemory_t) -> nvmlReturn_t;
/// `nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length)`.
pub type FnNvmlGetUuid = unsafe extern "C" fn(nvmlDevice_t, *mut c_char, c_uint) -> nvmlReturn_t;
/// `nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device)`.
pub type FnNvmlHandleByUuid =
    unsafe extern "C" fn(*const c_char, *mut nvmlDevice_t) -> nvmlReturn_t;
/// `nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t device, unsigned int
/// *infoCount, nvmlProcessInfo_v1_t *infos)` (v1 entries).
pub type FnNvmlProcsV1 =
    unsafe extern "C" fn(nvmlDevice_t, *mut c_uint, *mut nvmlProcessInfo_v1_t) -> nvmlReturn_t;
/// `nvmlDeviceGetComputeRunningProcesses_v2` / `_v3` (v2 entries).
pub type FnNvmlProcsV2 =
    unsafe extern "C" fn(nvmlDevice_t, *mut c_uint, *mut nvmlProcessInfo_v2_t) -> nvmlReturn_t;
/// `nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *deviceCount)`.
pub type FnNvmlGetCount = unsafe extern "C" fn(*mut c_uint) -> nvmlReturn_t;
/// `nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device)`.
pub type FnNvmlHandleByIndex = unsafe extern "C" fn(c_uint, *mut nvmlDevice_t) -> nvmlReturn_t;
/// `nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length)`.
pub type FnNvmlDriverVersion = unsafe extern "C" fn(*mut c_char, c_uint) -> nvmlReturn_t;

#[cfg(test)]
mod tests {
    //! Sizes, alignments, offsets and version words as gcc gives them for NVML 12.6.3's
    //! `nvml.h` on x86_64 Linux (the same LP64 layout on aarch64).

    use super::*;
    use core::mem::{align_of, offset_of, size_of};

    #[test]
    fn memory() {
        assert_eq!(
            (size_of::<nvmlMemory_t>(), align_of::<nvmlMemory_t>()),
            (24, 8)
        );
        assert_eq!(offset_of!(nvmlMemory_t, total), 0);
        assert_eq!(offset_of!(nvmlMemory_t, free), 8);
        assert_eq!(offset_of!(nvmlMemory_t, used), 16);
        assert_eq!(
            (size_of::<nvmlMemory_v2_t>(), align_of::<nvmlMemory_v2_t>()),
            (40, 8)
        );
        assert_eq!(offset_of!(nvmlMemory_v2_t, version), 0);
        assert_eq!(offset_of!(nvmlMemory_v2_t, total), 8);
        assert_eq!(offset_of!(nvmlMemory_v2_t, reserved), 16);
        assert_eq!(offset_of!(nvmlMemory_v2_t, free), 24);
        assert_eq!(offset_of!(nvmlMemory_v2_t, used), 32);
        assert_eq!(NVML_MEMORY_V2, 0x0200_0028);
    }

    #[test]
    fn process_utilization_sample() {
        // `unsigned int pid; unsigned long long timeStamp; unsigned int smUtil, memUtil,
        // encUtil, decUtil;`: 4 bytes of padding after `pid`.
        type S = nvmlProcessUtilizationSample_t;
        assert_eq!((size_of::<S>(), align_of::<S>()), (32, 8));
        assert_eq!(offset_of!(S, pid), 0);
        assert_eq!(offset_of!(S, time_stamp), 8);
        assert_eq!(offset_of!(S, sm_util), 16);
        assert_eq!(offset_of!(S, mem_util), 20);
        assert_eq!(offset_of!(S, enc_util), 24);
        assert_eq!(offset_of!(S, dec_util), 28);
    }

    #[test]
    fn process_info() {
        assert_eq!(
            (
                size_of::<nvmlProcessInfo_v1_t>(),
                align_of::<nvmlProcessInfo_v1_t>()
            ),
            (16, 8)
        );
        assert_eq!(offset_of!(nvmlProcessInfo_v1_t, pid), 0);
        assert_eq!(offset_of!(nvmlProcessInfo_v1_t, used_gpu_memory), 8);
        assert_eq!(
            (
                size_of::<nvmlProcessInfo_v2_t>(),
                align_of::<nvmlProcessInfo_v2_t>()
            ),
            (24, 8)
        );
        assert_eq!(offset_of!(nvmlProcessInfo_v2_t, pid), 0);
        assert_eq!(offset_of!(nvmlProcessInfo_v2_t, used_gpu_memory), 8);
        assert_eq!(offset_of!(nvmlProcessInfo_v2_t, gpu_instance_id), 16);
        assert_eq!(offset_of!(nvmlProcessInfo_v2_t, compute_instance_id), 20);
    }

    #[test]
    fn process_detail() {
        assert_eq!(
            (
                size_of::<nvmlProcessDetail_v1_t>(),
                align_of::<nvmlProcessDetail_v1_t>()
            ),
            (32, 8)
        );
        assert_eq!(offset_of!(nvmlProcessDetail_v1_t, pid), 0);
        assert_eq!(offset_of!(nvmlProcessDetail_v1_t, used_gpu_memory), 8);
        assert_eq!(offset_of!(nvmlProcessDetail_v1_t, gpu_instance_id), 16);
        assert_eq!(offset_of!(nvmlProcessDetail_v1_t, compute_instance_id), 20);
        assert_eq!(
            offset_of!(nvmlProcessDetail_v1_t, used_gpu_cc_protected_memory),
            24
        );
        assert_eq!(
            (
                size_of::<nvmlProcessDetailList_v1_t>(),
                align_of::<nvmlProcessDetailList_v1_t>()
            ),
            (24, 8)
        );
        assert_eq!(offset_of!(nvmlProcessDetailList_v1_t, version), 0);
        assert_eq!(offset_of!(nvmlProcessDetailList_v1_t, mode), 4);
        assert_eq!(
            offset_of!(nvmlProcessDetailList_v1_t, num_proc_array_entries),
            8
        );
        assert_eq!(offset_of!(nvmlProcessDetailList_v1_t, proc_array), 16);
        assert_eq!(NVML_PROCESS_DETAIL_LIST_V1, 0x0100_0018);
    }
}
