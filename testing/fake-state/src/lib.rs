//! Cross-process state of the fake CUDA driver (`libcuda.so.1`) and the fake NVML
//! (`libnvidia-ml.so.1`).
//!
//! Both libraries map the same file (path from `FAKE_CUDA_STATE`, default
//! [`DEFAULT_STATE_PATH`]) so that several fake-CUDA processes really share each fake device
//! (the device fills up) and the fake NVML, in yet another process, reports what the drivers
//! charged. See `docs/fake-driver.md` for the configuration variables and the layout.
//!
//! The file is created and initialised under an exclusive `flock`, by whichever process opens
//! it first; its configuration (device count, memory, names, context overhead) comes from that
//! process's environment. Afterwards every counter is an atomic updated lock-free. Each device
//! also has a clock (`clock.rs`): the simulated time its kernels take, shared by all processes.
#![warn(missing_docs)]

use std::ffi::CStr;
use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

mod clock;
mod procfs;
mod schedule;
pub use clock::{
    now_ns, parse_duration_ns, realtime_offset_ns, BusyWindow, DeviceClock, Segment, MAX_LANES,
    RING,
};
pub use procfs::{host_pid, process_alive, process_name, process_start_time, ENV_HOST_PROC};

/// First bytes of a state file.
pub const MAGIC: [u8; 8] = *b"FAKECUDA";
/// Layout version; bumped on any incompatible change (an old file is re-initialised).
pub const VERSION: u32 = 4;
/// Maximum number of fake devices.
pub const MAX_DEVICES: usize = 16;
/// Number of per-process slots.
pub const MAX_PROCS: usize = 512;
/// Bytes for a device name (NUL-terminated).
pub const NAME_LEN: usize = 64;
/// Default path of the state file.
pub const DEFAULT_STATE_PATH: &str = "/tmp/fake-cuda-state";
/// Default number of devices.
pub const DEFAULT_DEVICE_COUNT: u32 = 2;
/// Default total memory per device (16 GiB).
pub const DEFAULT_TOTAL_MEM: u64 = 16 << 30;
/// Default memory taken by each context (300 MiB).
pub const DEFAULT_CTX_OVERHEAD: u64 = 300 << 20;
/// Default device name.
pub const DEFAULT_DEVICE_NAME: &str = "Fake NVIDIA GPU";
/// `ProcSlot::pid` value while a dead process's slot is being reclaimed.
const RECLAIMING: u32 = u32::MAX;

/// Errors of this crate.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// The state file could not be opened, locked, sized or mapped.
    #[error("fake CUDA state file {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// A configuration variable has a value that cannot be used.
    #[error("invalid {var}={value:?}: {why}")]
    Config {
        /// The variable.
        var: &'static str,
        /// Its value.
        value: String,
        /// What is wrong.
        why: &'static str,
    },
}

/// Header of the state file.
#[repr(C)]
pub struct Header {
    /// [`MAGIC`].
    pub magic: [u8; 8],
    /// [`VERSION`].
    pub version: u32,
    /// Number of devices in use (<= [`MAX_DEVICES`]).
    pub device_count: u32,
    /// Bytes charged on a device for each live context on it.
    pub ctx_overhead: u64,
    /// `size_of::<StateFile>()` as written by the creator.
    pub file_size: u64,
}

/// One fake device.
#[repr(C)]
pub struct DeviceState {
    /// Total memory in bytes.
    pub total: u64,
    /// Bytes in use by all processes (allocations and context overhead).
    pub used: AtomicU64,
    /// Next offset handed out as a device address (bump allocator, wraps at 16 TiB).
    pub next_addr: AtomicU64,
    /// UUID bytes (as `cuDeviceGetUuid` returns them).
    pub uuid: [u8; 16],
    /// NUL-terminated name.
    pub name: [u8; NAME_LEN],
    /// The device clock: its schedule tail and recent busy intervals (`clock.rs`).
    pub clock: DeviceClock,
}

/// Per-process accounting slot.
#[repr(C)]
pub struct ProcSlot {
    /// Owning pid; 0 = free.
    pub pid: AtomicU32,
    _pad: u32,
    /// Start time of the owner (field 22 of `/proc/<pid>/stat`), to detect pid reuse; 0 = unknown.
    pub start_time: AtomicU64,
    /// Bytes charged by this process per device.
    pub used: [AtomicU64; MAX_DEVICES],
    /// Live contexts of this process per device.
    pub contexts: [AtomicU32; MAX_DEVICES],
    /// Device busy ns submitted by this process per device (kernels and graphs, queued
    /// work included; the intervals themselves are in each device's clock ring).
    pub busy_ns: [AtomicU64; MAX_DEVICES],
}

/// The whole file.
#[repr(C)]
pub struct StateFile {
    /// Header.
    pub header: Header,
    /// Devices (only `header.device_count` are meaningful).
    pub devices: [DeviceState; MAX_DEVICES],
    /// Process slots.
    pub procs: [ProcSlot; MAX_PROCS],
}

/// Configuration used when a state file is created.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// Number of devices.
    pub device_count: u32,
    /// Total memory per device.
    pub total_mem: Vec<u64>,
    /// Context overhead in bytes.
    pub ctx_overhead: u64,
    /// Device names.
    pub names: Vec<String>,
}

/// Parses a size such as `1048576`, `512K`, `300M`, `16G`, `1T`, `2GiB` (binary units).
pub fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let digits_end = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    if digits_end == 0 {
        return None;
    }
    let n: u64 = s[..digits_end].parse().ok()?;
    let unit = s[digits_end..].trim().to_ascii_lowercase();
    let shift = match unit.as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        _ => return None,
    };
    n.checked_mul(1u64 << shift)
}

impl Config {
    /// Reads `FAKE_CUDA_DEVICE_COUNT`, `FAKE_CUDA_TOTAL_MEM`, `FAKE_CUDA_CTX_OVERHEAD` and
    /// `FAKE_CUDA_DEVICE_NAME` from the environment (see `docs/fake-driver.md`).
    pub fn from_env() -> Result<Config, StateError> {
        let var = |name: &'static str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
        let device_count = match var("FAKE_CUDA_DEVICE_COUNT") {
            None => DEFAULT_DEVICE_COUNT,
            Some(v) => match v.trim().parse::<u32>() {
                Ok(n) if n as usize <= MAX_DEVICES => n,
                _ => {
                    return Err(StateError::Config {
                        var: "FAKE_CUDA_DEVICE_COUNT",
                        value: v,
                        why: "expected an integer from 0 to 16",
                    })
                }
            },
        };
        let total_mem = match var("FAKE_CUDA_TOTAL_MEM") {
            None => vec![DEFAULT_TOTAL_MEM],
            Some(v) => {
                let parsed: Option<Vec<u64>> = v.split(',').map(parse_size).collect();
                match parsed {
                    Some(list) if !list.is_empty() => list,
                    _ => {
                        return Err(StateError::Config {
                            var: "FAKE_CUDA_TOTAL_MEM",
                            value: v,
                            why: "expected sizes like 16G or 1073741824, comma separated",
                        })
                    }
                }
            }
        };
        let ctx_overhead = match var("FAKE_CUDA_CTX_OVERHEAD") {
            None => DEFAULT_CTX_OVERHEAD,
            Some(v) => parse_size(&v).ok_or(StateError::Config {
                var: "FAKE_CUDA_CTX_OVERHEAD",
                value: v.clone(),
                why: "expected a size like 300M or 0",
            })?,
        };
        let names = match var("FAKE_CUDA_DEVICE_NAME") {
            None => vec![DEFAULT_DEVICE_NAME.to_string()],
            Some(v) => v.split(',').map(|s| s.trim().to_string()).collect(),
        };
        Ok(Config {
            device_count,
            total_mem,
            ctx_overhead,
            names,
        })
    }

    /// Total memory of device `i` (the last list entry repeats).
    pub fn total_of(&self, i: usize) -> u64 {
        let l = &self.total_mem;
        l.get(i).or(l.last()).copied().unwrap_or(DEFAULT_TOTAL_MEM)
    }

    /// Name of device `i` (the last list entry repeats).
    pub fn name_of(&self, i: usize) -> &str {
        let l = &self.names;
        l.get(i)
            .or(l.last())
            .map(String::as_str)
            .unwrap_or(DEFAULT_DEVICE_NAME)
    }
}

/// The deterministic UUID of fake device `index`: `facec0da-0000-4000-8000-0000000000NN`.
pub fn device_uuid(index: usize) -> [u8; 16] {
    let mut u = [
        0xfa, 0xce, 0xc0, 0xda, 0, 0, 0x40, 0, 0x80, 0, 0, 0, 0, 0, 0, 0,
    ];
    u[15] = index as u8;
    u
}

/// Formats UUID bytes the way NVML and `CUDA_VISIBLE_DEVICES` spell them: `GPU-xxxxxxxx-...`.
/// A copy of `hami_abi::uuid::format` on purpose: the fakes stand in for NVIDIA's driver
/// and NVML and depend on nothing of hami's (this crate has no hami dependency), so the
/// preload and the agent are checked against the spelling the real driver uses, not against
/// their own formatter.
pub fn format_uuid(u: &[u8; 16]) -> String {
    let h: Vec<String> = u.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "GPU-{}-{}-{}-{}-{}",
        h[0..4].concat(),
        h[4..6].concat(),
        h[6..8].concat(),
        h[8..10].concat(),
        h[10..16].concat()
    )
}

/// Path of the state file: `$FAKE_CUDA_STATE` or [`DEFAULT_STATE_PATH`].
pub fn state_path() -> PathBuf {
    std::env::var_os("FAKE_CUDA_STATE")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(DEFAULT_STATE_PATH))
}

/// A mapped state file.
pub struct Shared {
    map: *mut StateFile,
    _file: File,
}

// SAFETY: the mapping is shared memory whose mutable fields are all atomics; the raw pointer
// stays valid for the life of `Shared` (the mapping is never unmapped before drop).
unsafe impl Send for Shared {}
// SAFETY: see above: all concurrent mutation goes through atomics.
unsafe impl Sync for Shared {}

/// Outcome of [`Shared::charge`] when the device is full.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutOfMemory;

struct FlockGuard<'a>(&'a File);
impl Drop for FlockGuard<'_> {
    fn drop(&mut self) {
        // SAFETY: flock on a descriptor we own; failure to unlock is harmless (close unlocks).
        unsafe { libc::flock(self.0.as_raw_fd(), libc::LOCK_UN) };
    }
}

impl Shared {
    /// Opens (creating and initialising if needed) the state file at [`state_path`], with the
    /// configuration from the environment.
    pub fn open_default() -> Result<Shared, StateError> {
        let path = state_path();
        Shared::open(&path, Config::from_env)
    }

    /// Opens `path`; if the file is new or not a valid state file, initialises it with the
    /// configuration returned by `config` (called only then).
    pub fn open(
        path: &Path,
        config: impl FnOnce() -> Result<Config, StateError>,
    ) -> Result<Shared, StateError> {
        let io = |source| StateError::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o666)
            .open(path)
            .map_err(io)?;
        // The mode is subject to the umask; make it shareable between users anyway.
        // SAFETY: fchmod on a descriptor we own.
        unsafe { libc::fchmod(file.as_raw_fd(), 0o666) };
        // SAFETY: flock on a descriptor we own.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } != 0 {
            return Err(io(std::io::Error::last_os_error()));
        }
        let guard = FlockGuard(&file);
        let size = std::mem::size_of::<StateFile>();
        let len = file.metadata().map_err(io)?.len();
        let mut fresh = false;
        if len != size as u64 {
            file.set_len(0).map_err(io)?;
            file.set_len(size as u64).map_err(io)?;
            fresh = true;
        }
        // SAFETY: mapping `size` bytes of a file that is exactly that long, shared read-write.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                size,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io(std::io::Error::last_os_error()));
        }
        let map = p as *mut StateFile;
        // SAFETY: the mapping is valid for `size` bytes and suitably aligned (page aligned);
        // every bit pattern is a valid StateFile (integers and atomics only).
        let st = unsafe { &mut *map };
        if !fresh && (st.header.magic != MAGIC || st.header.version != VERSION) {
            fresh = true;
        }
        if fresh {
            let cfg = match config() {
                Ok(c) => c,
                Err(e) => {
                    // SAFETY: unmapping the mapping made above, not used afterwards.
                    unsafe { libc::munmap(p, size) };
                    return Err(e);
                }
            };
            // SAFETY: we hold the exclusive flock and the file was just (re)sized: nobody else
            // uses the bytes; all-zero is a valid StateFile.
            unsafe { std::ptr::write_bytes(map as *mut u8, 0, size) };
            st.header.version = VERSION;
            st.header.device_count = cfg.device_count.min(MAX_DEVICES as u32);
            st.header.ctx_overhead = cfg.ctx_overhead;
            st.header.file_size = size as u64;
            for (i, d) in st.devices.iter_mut().enumerate() {
                d.total = cfg.total_of(i);
                d.uuid = device_uuid(i);
                let name = cfg.name_of(i).as_bytes();
                let n = name.len().min(NAME_LEN - 1);
                d.name[..n].copy_from_slice(&name[..n]);
            }
            // Magic last: a reader that checks it (under the flock) sees a complete file.
            st.header.magic = MAGIC;
        }
        drop(guard);
        Ok(Shared { map, _file: file })
    }

    /// The mapped file.
    pub fn file(&self) -> &StateFile {
        // SAFETY: `map` is valid for the life of self; mutation only through atomics.
        unsafe { &*self.map }
    }

    /// Number of devices.
    pub fn device_count(&self) -> usize {
        self.file().header.device_count as usize
    }

    /// Context overhead in bytes.
    pub fn ctx_overhead(&self) -> u64 {
        self.file().header.ctx_overhead
    }

    /// Device `i` (physical index), if it exists.
    pub fn device(&self, i: usize) -> Option<&DeviceState> {
        (i < self.device_count()).then(|| &self.file().devices[i])
    }

    /// Name of device `i`.
    pub fn device_name(&self, i: usize) -> String {
        let d = &self.file().devices[i.min(MAX_DEVICES - 1)];
        let end = d.name.iter().position(|&b| b == 0).unwrap_or(NAME_LEN);
        String::from_utf8_lossy(&d.name[..end]).into_owned()
    }

    /// Hands out a fresh device address for `size` bytes on device `dev` (unique per
    /// allocation until 16 TiB of addresses were handed out on that device).
    pub fn next_address(&self, dev: usize, size: u64) -> u64 {
        const SPAN: u64 = 1 << 44;
        let align: u64 = if size >= (2 << 20) { 2 << 20 } else { 512 };
        let step = size
            .max(1)
            .div_ceil(align)
            .saturating_mul(align)
            .min(SPAN / 4);
        let d = &self.file().devices[dev];
        loop {
            let cur = d.next_addr.load(Ordering::Relaxed);
            let start = cur.div_ceil(align) * align;
            let (start, next) = if start + step > SPAN {
                (0, step)
            } else {
                (start, start + step)
            };
            if d.next_addr
                .compare_exchange(cur, next, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
            {
                return ((dev as u64 + 1) << 44) + start;
            }
        }
    }

    /// The slot of process `pid`, claiming a free one (after reclaiming slots of dead
    /// processes) if needed. `None` if the table is full.
    pub fn slot_for(&self, pid: u32) -> Option<usize> {
        let procs = &self.file().procs;
        if let Some(i) = procs
            .iter()
            .position(|s| s.pid.load(Ordering::Acquire) == pid)
        {
            return Some(i);
        }
        self.reap_dead();
        let start = process_start_time(pid).unwrap_or(0);
        for (i, s) in procs.iter().enumerate() {
            if s.pid
                .compare_exchange(0, pid, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
            {
                s.start_time.store(start, Ordering::Release);
                return Some(i);
            }
        }
        None
    }

    /// Adds `bytes` to device `dev` if they fit, charging them to `slot` too.
    pub fn charge(&self, dev: usize, slot: Option<usize>, bytes: u64) -> Result<(), OutOfMemory> {
        let Some(d) = self.device(dev) else {
            return Err(OutOfMemory);
        };
        let try_add = || {
            d.used
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| {
                    u.checked_add(bytes).filter(|&n| n <= d.total)
                })
                .is_ok()
        };
        if !try_add() {
            // Memory of processes that died without freeing is given back first.
            if self.reap_dead() == 0 || !try_add() {
                return Err(OutOfMemory);
            }
        }
        if let Some(s) = slot {
            self.file().procs[s].used[dev].fetch_add(bytes, Ordering::AcqRel);
        }
        Ok(())
    }

    /// Gives `bytes` back to device `dev` (and `slot`).
    pub fn uncharge(&self, dev: usize, slot: Option<usize>, bytes: u64) {
        let Some(d) = self.device(dev) else { return };
        sub_saturating(&d.used, bytes);
        if let Some(s) = slot {
            sub_saturating(&self.file().procs[s].used[dev], bytes);
        }
    }

    /// Counts a context of `slot` on `dev` (+1 or -1).
    pub fn count_context(&self, dev: usize, slot: Option<usize>, delta: i32) {
        if let (Some(s), true) = (slot, dev < MAX_DEVICES) {
            let c = &self.file().procs[s].contexts[dev];
            if delta >= 0 {
                c.fetch_add(delta as u32, Ordering::AcqRel);
            } else {
                let _ = c.fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| {
                    Some(v.saturating_sub(delta.unsigned_abs()))
                });
            }
        }
    }

    /// Bytes in use on device `dev` (reclaiming dead processes' memory first).
    pub fn used(&self, dev: usize) -> u64 {
        self.reap_dead();
        self.device(dev)
            .map(|d| d.used.load(Ordering::Acquire))
            .unwrap_or(0)
    }

    /// Live processes using device `dev`: `(pid, bytes)`, for NVML.
    pub fn processes_on(&self, dev: usize) -> Vec<(u32, u64)> {
        self.reap_dead();
        if dev >= MAX_DEVICES {
            return Vec::new();
        }
        self.file()
            .procs
            .iter()
            .filter_map(|s| {
                let pid = s.pid.load(Ordering::Acquire);
                let used = s.used[dev].load(Ordering::Acquire);
                let ctxs = s.contexts[dev].load(Ordering::Acquire);
                (pid != 0 && pid != RECLAIMING && (used > 0 || ctxs > 0)).then_some((pid, used))
            })
            .collect()
    }

    /// Gives back the memory charged by processes that no longer run (killed, exited without
    /// freeing, zombies). Returns how many slots were reclaimed.
    pub fn reap_dead(&self) -> usize {
        let mut n = 0;
        let me = host_pid();
        for s in self.file().procs.iter() {
            let pid = s.pid.load(Ordering::Acquire);
            if pid == 0 || pid == RECLAIMING || pid == me {
                continue;
            }
            let start = s.start_time.load(Ordering::Acquire);
            if process_alive(pid, start) {
                continue;
            }
            if s.pid
                .compare_exchange(pid, RECLAIMING, Ordering::AcqRel, Ordering::Relaxed)
                .is_err()
            {
                continue;
            }
            for (dev, u) in s.used.iter().enumerate() {
                let bytes = u.swap(0, Ordering::AcqRel);
                if bytes > 0 && dev < MAX_DEVICES {
                    sub_saturating(&self.file().devices[dev].used, bytes);
                }
            }
            for c in s.contexts.iter() {
                c.store(0, Ordering::Release);
            }
            for b in s.busy_ns.iter() {
                b.store(0, Ordering::Release);
            }
            s.start_time.store(0, Ordering::Release);
            s.pid.store(0, Ordering::Release);
            n += 1;
        }
        n
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        // SAFETY: unmapping our own mapping; no reference into it outlives self.
        unsafe {
            libc::munmap(
                self.map as *mut libc::c_void,
                std::mem::size_of::<StateFile>(),
            )
        };
    }
}

fn sub_saturating(a: &AtomicU64, bytes: u64) {
    let _ = a.fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| {
        Some(u.saturating_sub(bytes))
    });
}

/// Resolves `CUDA_VISIBLE_DEVICES` (`value`; `None` = unset) against `count` devices whose
/// UUIDs are given, the way the real driver does: a comma list of indices or `GPU-<uuid
/// prefix>` entries, read up to the first invalid, unknown or repeated entry. Returns the
/// physical index of each CUDA ordinal.
pub fn resolve_visible_devices(value: Option<&CStr>, uuids: &[[u8; 16]]) -> Vec<usize> {
    let all: Vec<usize> = (0..uuids.len()).collect();
    let Some(v) = value else { return all };
    let v = v.to_string_lossy();
    let mut out = Vec::new();
    for entry in v.split(',') {
        let e = entry.trim();
        let idx = if let Ok(i) = e.parse::<i64>() {
            if i < 0 || i as usize >= uuids.len() {
                break;
            }
            i as usize
        } else if e.len() > 4 && e[..4].eq_ignore_ascii_case("GPU-") {
            let want = e[4..].to_ascii_lowercase();
            let matches: Vec<usize> = uuids
                .iter()
                .enumerate()
                .filter(|(_, u)| format_uuid(u)[4..].starts_with(&want))
                .map(|(i, _)| i)
                .collect();
            if matches.len() != 1 {
                break;
            }
            matches[0]
        } else {
            break;
        };
        if out.contains(&idx) {
            break;
        }
        out.push(idx);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("16G"), Some(16 << 30));
        assert_eq!(parse_size("300M"), Some(300 << 20));
        assert_eq!(parse_size("2GiB"), Some(2 << 30));
        assert_eq!(parse_size("4096"), Some(4096));
        assert_eq!(parse_size("0"), Some(0));
        assert_eq!(parse_size("x"), None);
        assert_eq!(parse_size("12Q"), None);
    }

    #[test]
    fn uuid_format() {
        assert_eq!(
            format_uuid(&device_uuid(3)),
            "GPU-facec0da-0000-4000-8000-000000000003"
        );
    }

    #[test]
    fn visible_devices() {
        let u: Vec<[u8; 16]> = (0..3).map(device_uuid).collect();
        let r = |s: &str| resolve_visible_devices(Some(&std::ffi::CString::new(s).unwrap()), &u);
        assert_eq!(resolve_visible_devices(None, &u), vec![0, 1, 2]);
        assert_eq!(r("2,0"), vec![2, 0]);
        assert_eq!(r(""), Vec::<usize>::new());
        assert_eq!(r("1,7,0"), vec![1]);
        assert_eq!(r("7,0"), Vec::<usize>::new());
        assert_eq!(r("GPU-facec0da-0000-4000-8000-000000000002,0"), vec![2, 0]);
        // A prefix matching all devices is ambiguous: stops the list.
        assert_eq!(r("GPU-facec0da"), Vec::<usize>::new());
        assert_eq!(r("0,0"), vec![0]);
    }

    #[test]
    fn charge_and_reap() {
        let dir = std::env::temp_dir().join(format!("fake-state-test-{}", std::process::id()));
        let cfg = Config {
            device_count: 2,
            total_mem: vec![1 << 30],
            ctx_overhead: 0,
            names: vec!["X".into()],
        };
        let sh = Shared::open(&dir, || Ok(cfg.clone())).unwrap();
        let me = sh.slot_for(std::process::id());
        assert!(me.is_some());
        sh.charge(0, me, 1 << 29).unwrap();
        assert_eq!(sh.charge(0, me, (1 << 29) + 1), Err(OutOfMemory));
        sh.charge(0, me, 1 << 29).unwrap();
        assert_eq!(sh.used(0), 1 << 30);
        assert_eq!(sh.processes_on(0), vec![(std::process::id(), 1 << 30)]);
        sh.uncharge(0, me, 1 << 30);
        assert_eq!(sh.used(0), 0);
        // A slot of a dead process is reclaimed and its memory given back.
        let dead = &sh.file().procs[MAX_PROCS - 1];
        dead.pid.store(999_999_999, Ordering::Release);
        dead.used[1].store(4096, Ordering::Release);
        sh.file().devices[1].used.fetch_add(4096, Ordering::AcqRel);
        assert_eq!(sh.used(1), 0);
        assert_eq!(dead.pid.load(Ordering::Acquire), 0);
        let a = sh.next_address(0, 100);
        let b = sh.next_address(0, 100);
        assert_ne!(a, b);
        assert_eq!(a % 512, 0);
        let big = sh.next_address(1, 3 << 20);
        assert_eq!(big % (2 << 20), 0);
        drop(sh);
        let _ = std::fs::remove_file(&dir);
    }
}
