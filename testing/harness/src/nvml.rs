//! `nvmlprobe`'s output: [`NvmlSnapshot`], what NVML reported per device (memory, v2 memory,
//! compute processes).

use crate::lines::KvLine;

/// One device as `nvmlprobe` reports it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NvmlDevice {
    /// NVML (physical) index.
    pub index: u32,
    /// `GPU-...` UUID.
    pub uuid: String,
    /// Name (spaces replaced by `_`).
    pub name: String,
    /// `nvmlDeviceGetMemoryInfo`: total, used, free.
    pub total: u64,
    /// Used bytes (v1).
    pub used: u64,
    /// Free bytes (v1).
    pub free: u64,
    /// `nvmlDeviceGetMemoryInfo_v2` used bytes.
    pub used_v2: u64,
    /// Running compute processes: (pid, used bytes).
    pub processes: Vec<(u32, u64)>,
    /// `nvmlDeviceGetUtilizationRates`: `(rc, gpu %)`, if the library has it.
    pub gpu_util: Option<(i32, u32)>,
    /// `nvmlDeviceGetProcessUtilization` result code (`None`: the library lacks it); 6 is
    /// `NVML_ERROR_NOT_FOUND` (no sample).
    pub process_util_rc: Option<i32>,
    /// Its samples: (pid, smUtil %, timeStamp µs).
    pub process_util: Vec<(u32, u32, u64)>,
    /// `nvmlDeviceGetProcessesUtilizationInfo` result code (`None`: the library lacks it).
    pub processes_util_rc: Option<i32>,
    /// Its samples: (pid, smUtil %, timeStamp µs).
    pub processes_util: Vec<(u32, u32, u64)>,
}

/// What `nvmlprobe` printed.
#[derive(Debug, Clone, Default)]
pub struct NvmlSnapshot {
    /// `nvmlInit_v2` result.
    pub init_rc: i32,
    /// Devices by index.
    pub devices: Vec<NvmlDevice>,
    /// Raw output.
    pub raw: String,
}

impl NvmlSnapshot {
    /// Parses `nvmlprobe` output.
    pub fn parse(text: &str) -> NvmlSnapshot {
        let mut s = NvmlSnapshot {
            init_rc: -1,
            raw: text.to_string(),
            ..Default::default()
        };
        for line in text.lines().filter_map(KvLine::parse) {
            let kind = line.head.as_str();
            let n = |k: &str| line.get(k).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
            let idx = n("index") as u32;
            let dev = |s: &mut NvmlSnapshot| -> usize {
                if let Some(p) = s.devices.iter().position(|d| d.index == idx) {
                    p
                } else {
                    s.devices.push(NvmlDevice {
                        index: idx,
                        ..Default::default()
                    });
                    s.devices.len() - 1
                }
            };
            match kind {
                "init" => s.init_rc = n("rc") as i32,
                "device" => {
                    let d = dev(&mut s);
                    s.devices[d].uuid = line.get("uuid").unwrap_or("").to_string();
                    s.devices[d].name = line.get("name").unwrap_or("").to_string();
                }
                "memory" => {
                    let d = dev(&mut s);
                    s.devices[d].total = n("total");
                    s.devices[d].used = n("used");
                    s.devices[d].free = n("free");
                }
                "memory_v2" => {
                    let d = dev(&mut s);
                    s.devices[d].used_v2 = n("used");
                }
                "utilization" => {
                    let d = dev(&mut s);
                    s.devices[d].gpu_util = Some((n("rc") as i32, n("gpu") as u32));
                }
                "putil" => {
                    let d = dev(&mut s);
                    let sample = (n("pid") as u32, n("sm") as u32, n("ts"));
                    s.devices[d].process_util.push(sample);
                }
                "putils" => {
                    let d = dev(&mut s);
                    s.devices[d].process_util_rc = Some(n("rc") as i32);
                }
                "putil2" => {
                    let d = dev(&mut s);
                    let sample = (n("pid") as u32, n("sm") as u32, n("ts"));
                    s.devices[d].processes_util.push(sample);
                }
                "putils2" => {
                    let d = dev(&mut s);
                    s.devices[d].processes_util_rc = Some(n("rc") as i32);
                }
                "process" => {
                    let d = dev(&mut s);
                    s.devices[d].processes.push((n("pid") as u32, n("used")));
                }
                _ => {}
            }
        }
        s
    }

    /// Device `index` (panics with the raw output if absent).
    pub fn device(&self, index: u32) -> &NvmlDevice {
        self.devices
            .iter()
            .find(|d| d.index == index)
            .unwrap_or_else(|| panic!("no NVML device {index} in:\n{}", self.raw))
    }

    /// The SM utilisation (%) NVML reports for `pid` on device `index` (`None`: no sample).
    pub fn process_sm(&self, index: u32, pid: u32) -> Option<u32> {
        self.device(index)
            .process_util
            .iter()
            .find(|p| p.0 == pid)
            .map(|p| p.1)
    }

    /// Bytes NVML attributes to `pid` on device `index` (0 if not listed).
    pub fn process_used(&self, index: u32, pid: u32) -> u64 {
        self.device(index)
            .processes
            .iter()
            .find(|p| p.0 == pid)
            .map(|p| p.1)
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_nvml() {
        let s = NvmlSnapshot::parse(
            "init rc=0 error=Success\ncount rc=0 count=1\ndevice index=0 uuid=GPU-x name=N rc=0\nmemory index=0 rc=0 total=10 used=4 free=6\nmemory_v2 index=0 rc=0 version=0x2000028 total=10 reserved=0 used=4 free=6\nprocess index=0 pid=7 used=4\nprocesses index=0 rc=0 count=1\n",
        );
        assert_eq!(s.init_rc, 0);
        assert_eq!(s.device(0).uuid, "GPU-x");
        assert_eq!(s.device(0).used, 4);
        assert_eq!(s.device(0).used_v2, 4);
        assert_eq!(s.process_used(0, 7), 4);
        assert_eq!(s.process_used(0, 8), 0);
        assert_eq!(s.device(0).process_util_rc, None);
        let s = NvmlSnapshot::parse(
            "device index=0 uuid=GPU-x name=N rc=0\nutilization index=0 rc=0 gpu=80 memory=0\nputil index=0 pid=7 sm=30 mem=0 ts=99\nputil index=0 pid=8 sm=50 mem=0 ts=99\nputils index=0 rc=0 count=2 last_seen=0\n",
        );
        assert_eq!(s.device(0).gpu_util, Some((0, 80)));
        assert_eq!(s.device(0).process_util_rc, Some(0));
        assert_eq!(s.process_sm(0, 8), Some(50));
        assert_eq!(s.process_sm(0, 9), None);
    }
}
