//! What the agent learns about a host process from `/proc`: its container, its pid inside the
//! container, its start time, whether the preload is mapped, which region it uses and which
//! limits its environment asks for.
//!
//! Every function takes a `proc_root` (normally `/proc`) so that tests can use a fake tree.
//! The parsing itself is done by pure functions over the file contents.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use hami_abi::layout::MAX_DEVICES;
use hami_common::env::{HamiEnv, Share};
use procfs::FromRead;

use crate::access::Creds;

pub use hami_common::config::{
    DEFAULT_REGION_PATH, ENV_LIMIT as LIMIT_ENV, ENV_REGION as REGION_ENV,
};
/// File-name prefix of the preload library.
pub const PRELOAD_NAME: &str = "libhami_preload";

/// Errors reading `/proc/<pid>/...`.
#[derive(Debug, thiserror::Error)]
pub enum ProcError {
    /// A file under `/proc/<pid>` could not be read (usually: the process exited).
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A file under `/proc/<pid>` did not have the expected format.
    #[error("cannot parse {path}")]
    Parse {
        /// The file.
        path: PathBuf,
    },
    /// The process is exiting: a zombie, or its memory map already released (`maps` empty
    /// or unreadable while `stat` still reads). What it mapped (the preload or not) can no
    /// longer be told, so it is not classified.
    #[error("process {pid} is exiting: its memory map is gone")]
    Exiting {
        /// The host pid.
        pid: u32,
    },
}

/// One limit variable as the environment sets it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EnvLimit {
    /// A valid size in bytes (0 = unlimited).
    Bytes(u64),
    /// Set but unparsable: the preload marks the device invalid (fails closed).
    Invalid,
}

/// Limits requested by a process's environment, as the environment contract reads them
/// (`hami_common::env`: the preload's own reading).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EnvLimits {
    /// `CUDA_DEVICE_MEMORY_LIMIT` (all devices), if set.
    pub all: Option<EnvLimit>,
    /// `CUDA_DEVICE_MEMORY_LIMIT_<i>`, per device ordinal.
    pub per_device: BTreeMap<u32, EnvLimit>,
    /// Variables that were set but could not be parsed (name=value).
    pub invalid: Vec<String>,
    /// The compute share (`CUDA_DEVICE_SM_LIMIT(_<i>)`, `GPU_CORE_UTILIZATION_POLICY`,
    /// `CUDA_DISABLE_CONTROL`).
    pub compute: EnvCompute,
}

/// The compute share a process's environment asks for on each device, as the environment
/// contract reads it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EnvCompute {
    /// Per CUDA ordinal.
    pub shares: [Share; MAX_DEVICES],
    /// `CUDA_DISABLE_CONTROL` turns the preload off (it then uses no region).
    pub control_disabled: bool,
}

impl Default for EnvCompute {
    fn default() -> Self {
        EnvCompute::from_env(&HamiEnv::from_lookup(|_| None))
    }
}

impl EnvCompute {
    /// The compute settings of an environment read by the contract.
    pub fn from_env(env: &HamiEnv) -> EnvCompute {
        EnvCompute {
            shares: core::array::from_fn(|d| env.share(d)),
            control_disabled: env.control_disabled(),
        }
    }

    /// The share the preload holds `device` to by this environment ([`Share`]).
    pub fn share(&self, device: u32) -> Share {
        self.shares
            .get(device as usize)
            .copied()
            .unwrap_or(Share::None)
    }

    /// The share the preload holds `device` to by this environment, in percent:
    /// `Some(Some(1..=99))` a limit, `Some(None)` none (unset, `0`, `100`, policy `disable`),
    /// `None` when it cannot be said exactly (a malformed share, or control turned off, when
    /// the preload does not use the region at all).
    pub fn share_for(&self, device: u32) -> Option<Option<u32>> {
        if self.control_disabled {
            return None;
        }
        match self.share(device) {
            Share::None => Some(None),
            Share::Percent(p) => Some(Some(p)),
            Share::Malformed => None,
        }
    }
}

impl EnvLimits {
    /// What the environment asks for on `device` (the per-device variable wins over the
    /// global one, valid or not, as in the preload).
    pub fn for_device(&self, device: u32) -> Option<EnvLimit> {
        self.per_device.get(&device).copied().or(self.all)
    }

    /// The valid byte limit for `device`, if any.
    pub fn bytes_for_device(&self, device: u32) -> Option<u64> {
        match self.for_device(device)? {
            EnvLimit::Bytes(b) => Some(b),
            EnvLimit::Invalid => None,
        }
    }

    /// Whether the environment sets any limit at all.
    pub fn is_empty(&self) -> bool {
        self.all.is_none() && self.per_device.is_empty() && self.invalid.is_empty()
    }

    /// The limits of an environment read by the contract.
    pub fn from_env(env: &HamiEnv) -> EnvLimits {
        let mut invalid = Vec::new();
        let mut limit = |s: &hami_common::env::Setting<u64>| {
            Some(match s.as_ref()? {
                Ok(n) => EnvLimit::Bytes(*n),
                Err(e) => {
                    invalid.push(format!("{}={}", e.var, e.value));
                    EnvLimit::Invalid
                }
            })
        };
        let all = limit(&env.memory_limit);
        let per_device = (0..MAX_DEVICES)
            .filter_map(|d| Some((d as u32, limit(&env.device_memory_limits[d])?)))
            .collect();
        EnvLimits {
            all,
            per_device,
            invalid,
            compute: EnvCompute::from_env(env),
        }
    }
}

/// Everything the agent knows about one host process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcInfo {
    /// Host pid.
    pub pid: u32,
    /// Start time in clock ticks since boot (`/proc/<pid>/stat` field 22).
    pub start_time: u64,
    /// `comm` (short command name).
    pub comm: String,
    /// Pid inside the process's own pid namespace (last `NSpid` entry).
    pub nspid: Option<u32>,
    /// Inode of the process's pid namespace (`/proc/<pid>/ns/pid`), when readable.
    pub pidns: Option<u64>,
    /// The cgroup path (v2 unified entry, else the first v1 entry).
    pub cgroup: String,
    /// Container id when the cgroup path names one, else the cgroup path (`host` for `/`).
    pub container: String,
    /// Whether `libhami_preload*.so` is mapped.
    pub hooked: bool,
    /// Whether a `libcuda.so*` file is mapped.
    pub uses_libcuda: bool,
    /// Whether HAMi-core's `libvgpu.so*` is mapped (a file of that name without
    /// hami-preload's marker; filled in by the agent, which reads the file).
    pub hami_core: bool,
    /// `CUDA_DISABLE_CONTROL` is true in the environment (HAMi's opt-out: its device plugin
    /// then mounts no `ld.so.preload`).
    pub disable_control: bool,
    /// `CUDA_OVERSUBSCRIBE` asks for oversubscription, which hami-preload refuses.
    pub oversubscribe: bool,
    /// Region path as the process sees it (env or default).
    pub region_path: String,
    /// Whether the region path came from the environment (false: default path).
    pub region_from_env: bool,
    /// The same path opened from the host: `<proc_root>/<pid>/root/<region_path>`.
    pub region_host_path: PathBuf,
    /// Limits from the environment.
    pub env_limits: EnvLimits,
    /// Credentials from `/proc/<pid>/status` (who the kernel checks file access for).
    pub creds: Option<Creds>,
    /// `CUDA_VISIBLE_DEVICES` in its environment (`None`: unset): how its CUDA ordinals map
    /// to the container's devices (`hami_common::visible`).
    pub visible_devices: Option<String>,
}

/// Parse `/proc/<pid>/environ` contents (NUL-separated `KEY=VALUE`, converted lossily).
/// Of duplicate entries the first is kept, as `getenv` (the preload's reading) does.
pub fn parse_environ(raw: &[u8]) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for e in raw.split(|b| *b == 0).filter(|e| !e.is_empty()) {
        let e = String::from_utf8_lossy(e);
        if let Some((k, v)) = e.split_once('=') {
            out.entry(k.to_string()).or_insert_with(|| v.to_string());
        }
    }
    out
}

/// A process's environment as the environment contract reads it (the preload's reading).
pub fn env_contract(env: &BTreeMap<String, String>) -> HamiEnv {
    HamiEnv::from_lookup(|k| env.get(k).cloned())
}

/// Extract the limits from an environment.
pub fn env_limits(env: &BTreeMap<String, String>) -> EnvLimits {
    EnvLimits::from_env(&env_contract(env))
}

/// Region path from an environment: `CUDA_DEVICE_MEMORY_SHARED_CACHE` or the default.
/// The bool says whether it came from the environment.
pub fn region_path(env: &BTreeMap<String, String>) -> (String, bool) {
    let contract = env_contract(env);
    let (p, from_env) = contract.region_path();
    (p.to_string(), from_env)
}

/// The fields of `/proc/<pid>/stat` the agent uses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stat {
    /// `comm` (field 2).
    pub comm: String,
    /// State letter (field 3): `R`, `S`, `Z`, ...
    pub state: char,
    /// Number of threads (field 20).
    pub num_threads: u64,
    /// Start time in clock ticks after boot (field 22).
    pub start_time: u64,
}

impl Stat {
    /// Whether the process is gone in all but name (a zombie with no live thread): its GPU
    /// memory is already released. The rule is the region's ([`hami_common::procfs`]).
    pub fn is_dead(&self) -> bool {
        hami_common::procfs::is_dead(u8::try_from(self.state).unwrap_or(b'?'), self.num_threads)
    }
}

/// Parse `/proc/<pid>/stat` with the project's one reader ([`hami_common::procfs`]; the
/// comm, the tenant's, may contain spaces and parentheses: the fields are counted from the
/// last `)`). A text that does not read `<pid> (<comm>) <fields>` as the kernel writes it (a
/// fake tree may not) is refused.
pub fn parse_stat(stat: &str) -> Option<Stat> {
    parse_stat_bytes(stat.trim().as_bytes())
}

/// [`parse_stat`] of the bytes as read (a `comm` that is not UTF-8 is converted lossily).
pub fn parse_stat_bytes(b: &[u8]) -> Option<Stat> {
    let b = b.trim_ascii();
    let s = hami_common::procfs::parse_stat(b)?;
    // The kernel's shape around the comm: `<pid> (` before it, `) ` after it.
    let (open, close) = (s.comm.0 - 1, s.comm.1);
    if open == 0
        || b[open - 1] != b' '
        || b.get(close + 1) != Some(&b' ')
        || hami_common::procfs::parse_u64(&b[..open - 1]).is_none()
    {
        return None;
    }
    Some(Stat {
        comm: String::from_utf8_lossy(&b[s.comm.0..s.comm.1]).into_owned(),
        state: char::from(s.state),
        num_threads: s.num_threads,
        start_time: s.start_time,
    })
}

/// Parse `/proc/<pid>/status` with procfs's parser. Its reader fails the whole file on a
/// line that is not UTF-8; `Name:` is the tenant's comm, any bytes, so callers hand it text
/// already converted (lossily: the other fields are the kernel's ASCII). procfs reads
/// `Groups:` as `i32`: a process with a supplementary gid above `i32::MAX` parses as `None`
/// (no creds, no `NSpid`: its slots are then matched by host pid).
pub fn parse_status(status: &str) -> Option<procfs::process::Status> {
    procfs::process::Status::from_read(status.as_bytes()).ok()
}

/// The [`Creds`] of `/proc/<pid>/status` text; `None` if it does not parse.
pub fn parse_creds(status: &str) -> Option<Creds> {
    parse_status(status).map(|s| Creds::from_status(&s))
}

/// The last `NSpid` entry of a parsed `/proc/<pid>/status` (the pid in the innermost
/// namespace).
pub fn status_nspid(status: &procfs::process::Status) -> Option<u32> {
    status
        .nspid
        .as_ref()?
        .last()
        .and_then(|&p| u32::try_from(p).ok())
}

/// Parse the last `NSpid` entry of `/proc/<pid>/status` text.
pub fn parse_nspid(status: &str) -> Option<u32> {
    status_nspid(&parse_status(status)?)
}

/// Pick the cgroup path from `/proc/<pid>/cgroup` (parsed by procfs): the v2 `0::` entry,
/// else the first v1 entry that names a memory or pids controller, else the first entry.
/// The text is the kernel's, but cgroup names below a delegated cgroup are the tenant's
/// (any bytes but `/` and newline): callers hand it converted to UTF-8 (procfs's reader
/// fails on a line that is not).
pub fn parse_cgroup(contents: &str) -> String {
    let Ok(procfs::ProcessCGroups(groups)) = procfs::ProcessCGroups::from_read(contents.as_bytes())
    else {
        return "/".to_string();
    };
    if let Some(v2) = groups
        .iter()
        .find(|g| g.hierarchy == 0 && g.controllers.is_empty())
    {
        return v2.pathname.clone();
    }
    groups
        .iter()
        .find(|g| g.controllers.iter().any(|c| c == "memory" || c == "pids"))
        .or(groups.first())
        .map_or_else(|| "/".to_string(), |g| g.pathname.clone())
}

fn is_container_id(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Container id from a cgroup path (docker, containerd, cri-o, podman, kubepods layouts), or
/// `None` when the path names no container.
///
/// Recognised shapes include `/docker/<id>`, `/system.slice/docker-<id>.scope`,
/// `/kubepods/burstable/pod<uid>/<id>`,
/// `/kubepods.slice/.../cri-containerd-<id>.scope`, `crio-<id>.scope`, `libpod-<id>.scope`,
/// `<slice>:cri-containerd:<id>`, and the same under a sub-cgroup (`.../<id>/init`).
pub fn container_id(cgroup: &str) -> Option<String> {
    const PREFIXES: [&str; 6] = [
        "docker-",
        "cri-containerd-",
        "crio-",
        "libpod-",
        "containerd-",
        "cri-o-",
    ];
    for comp in cgroup.rsplit('/') {
        let c = comp.strip_suffix(".scope").unwrap_or(comp);
        // containerd with the systemd driver: `<slice>:cri-containerd:<id>`.
        let c = c.rsplit(':').next().unwrap_or(c);
        if c.starts_with("crio-conmon-") || c.starts_with("libpod-conmon-") {
            continue;
        }
        let c = PREFIXES.iter().find_map(|p| c.strip_prefix(p)).unwrap_or(c);
        if is_container_id(c) {
            return Some(c.to_string());
        }
    }
    None
}

/// The name the agent uses for a process's container: its id, else its cgroup path
/// (`host` for the root cgroup).
pub fn container_name(cgroup: &str) -> String {
    match container_id(cgroup) {
        Some(id) => id,
        None if cgroup.is_empty() || cgroup == "/" => "host".to_string(),
        None => cgroup.to_string(),
    }
}

/// Whether `/proc/<pid>/maps` contents show the preload library mapped.
pub fn maps_has_preload(maps: &str) -> bool {
    mapped_files(maps).any(|p| file_name(p).starts_with(PRELOAD_NAME))
}

/// Whether `/proc/<pid>/maps` contents show a `libcuda.so*` mapped.
pub fn maps_has_libcuda(maps: &str) -> bool {
    mapped_files(maps).any(|p| file_name(p).starts_with("libcuda.so"))
}

/// Whether `/proc/<pid>/maps` contents map a file whose `(device, inode)` (as the maps write
/// them, e.g. `("fd:01", 1234)`) is in `ids`.
pub fn maps_has_ids(maps: &str, ids: &std::collections::HashSet<(String, u64)>) -> bool {
    !ids.is_empty()
        && maps_entries(maps).any(|m| m.inode != 0 && ids.contains(&(m.dev.to_string(), m.inode)))
}

/// The file paths in `/proc/<pid>/maps` contents (the sixth column, when it is a path;
/// a ` (deleted)` suffix removed).
pub fn mapped_files(maps: &str) -> impl Iterator<Item = &str> {
    maps_entries(maps).filter_map(|m| {
        let p = m.path.strip_suffix(" (deleted)").unwrap_or(m.path);
        p.starts_with('/').then_some(p)
    })
}

/// One line of `/proc/<pid>/maps`: `address perms offset dev inode [path]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MapsEntry<'a> {
    /// Address range as the maps write it (`7f0000000000-7f0000001000`).
    pub range: &'a str,
    /// Permissions (`r-xp`).
    pub perms: &'a str,
    /// Device as the maps write it (`fd:01`).
    pub dev: &'a str,
    /// Inode (0 for anonymous mappings).
    pub inode: u64,
    /// The path column, leading padding removed (empty, `[heap]`, `/x (deleted)`, ...).
    pub path: &'a str,
}

/// The lines of `/proc/<pid>/maps` contents; malformed lines are skipped.
///
/// Not procfs's `MemoryMaps` parser: the path column is the tenant's (any file name it
/// maps), and that parser panics on a path `/SYSV` followed by fewer than 8 bytes (it slices
/// `[5..13]` for SysV shared memory), takes a tenant's `/SYSVxxxxxxxx` file for shared
/// memory (no path: a driver so named would go unseen), trims spaces a name may end with,
/// and fails the whole file on one line it cannot parse (all of a process's mappings
/// hidden behind one). The test `procfs_maps_parser_is_unfit_for_tenant_maps` shows it.
pub fn maps_entries(maps: &str) -> impl Iterator<Item = MapsEntry<'_>> {
    maps.lines().filter_map(|l| {
        let mut it = l.splitn(6, ' ');
        let (range, perms, _, dev) = (it.next()?, it.next()?, it.next()?, it.next()?);
        let inode = it.next()?.parse().ok()?;
        let path = it.next().unwrap_or("").trim_start();
        Some(MapsEntry {
            range,
            perms,
            dev,
            inode,
            path,
        })
    })
}

fn file_name(p: &str) -> &str {
    p.rsplit('/').next().unwrap_or(p)
}

/// Parse a namespace link target like `pid:[4026531836]` into its inode.
pub fn parse_ns_link(target: &str) -> Option<u64> {
    target
        .split_once(":[")
        .and_then(|(_, r)| r.strip_suffix(']'))
        .and_then(|n| n.parse().ok())
}

/// Host path of a file as the process sees it: `<proc_root>/<pid>/root/<path>`.
pub fn host_path(proc_root: &Path, pid: u32, path_in_proc: &str) -> PathBuf {
    proc_root
        .join(pid.to_string())
        .join("root")
        .join(path_in_proc.trim_start_matches('/'))
}

fn read_string(path: PathBuf) -> Result<String, ProcError> {
    read_bytes(path).map(|b| String::from_utf8_lossy(&b).into_owned())
}

/// A `/proc/<pid>` file, at most [`crate::tenantfs::MAX_PROC_FILE`] bytes (a process can
/// make its `maps` or `environ` as large as it likes). procfs's `Process` readers read
/// whole files unbounded (and `environ` has no parser in procfs-core): the parsers procfs
/// has are fed these bytes instead ([`FromRead`] over a slice), converted to UTF-8 first.
fn read_bytes(path: PathBuf) -> Result<Vec<u8>, ProcError> {
    use std::io::Read;
    let mut out = Vec::new();
    std::fs::File::open(&path)
        .and_then(|f| f.take(crate::tenantfs::MAX_PROC_FILE).read_to_end(&mut out))
        .map_err(|source| ProcError::Read { path, source })?;
    Ok(out)
}

#[cfg(test)]
thread_local! {
    /// Pids whose `stat` this thread read, in order (see [`tests::take_stat_reads`]).
    static STAT_READS: std::cell::RefCell<Vec<u32>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

/// `/proc/<pid>/stat` of a host pid.
///
/// The agent's hottest read (each tracked process and each region slot every tick, each
/// process every discovery pass): one `read` into a stack buffer, since procfs hands the
/// whole of a file this small (well under 1 KiB: 52 numbers and a 16-byte `comm`) to the
/// first `read`. A file that fills the buffer is read again in full. The bytes go to
/// [`parse_stat_bytes`].
pub fn read_stat(proc_root: &Path, pid: u32) -> Result<Stat, ProcError> {
    use std::io::Read;
    #[cfg(test)]
    STAT_READS.with(|r| r.borrow_mut().push(pid));
    let path = proc_root.join(pid.to_string()).join("stat");
    let mut buf = [0u8; 4096];
    let n = std::fs::File::open(&path)
        .and_then(|mut f| loop {
            match f.read(&mut buf) {
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                r => break r,
            }
        })
        .map_err(|source| ProcError::Read {
            path: path.clone(),
            source,
        })?;
    let parsed = if n < buf.len() {
        parse_stat_bytes(&buf[..n])
    } else {
        parse_stat(&read_string(path.clone())?)
    };
    parsed.ok_or(ProcError::Parse { path })
}

/// Pid namespace inode of a host pid.
pub fn read_pidns(proc_root: &Path, pid: u32) -> Option<u64> {
    let link = std::fs::read_link(proc_root.join(pid.to_string()).join("ns/pid")).ok()?;
    parse_ns_link(&link.to_string_lossy())
}

/// `/proc/<pid>/status` of a host pid, parsed (see [`parse_status`]).
pub fn read_status(proc_root: &Path, pid: u32) -> Option<procfs::process::Status> {
    parse_status(&read_string(proc_root.join(pid.to_string()).join("status")).ok()?)
}

/// `NSpid` (innermost) of a host pid.
pub fn read_nspid(proc_root: &Path, pid: u32) -> Option<u32> {
    status_nspid(&read_status(proc_root, pid)?)
}

/// `/proc/<pid>/maps` contents.
pub fn read_maps(proc_root: &Path, pid: u32) -> Result<String, ProcError> {
    read_string(proc_root.join(pid.to_string()).join("maps"))
}

/// Gather everything about one host pid. Fails if the process is gone (its `stat` is
/// unreadable) or exiting ([`ProcError::Exiting`]: a zombie, or no memory map left, so that
/// whether it maps the preload cannot be told; a process is never judged unhooked from an
/// empty map); other unreadable files leave their fields at defaults.
pub fn read_proc(proc_root: &Path, pid: u32) -> Result<ProcInfo, ProcError> {
    let st = read_stat(proc_root, pid)?;
    if st.is_dead() {
        return Err(ProcError::Exiting { pid });
    }
    let Stat {
        comm, start_time, ..
    } = st;
    let dir = proc_root.join(pid.to_string());
    let cgroup = read_string(dir.join("cgroup"))
        .map(|c| parse_cgroup(&c))
        .unwrap_or_else(|_| "/".to_string());
    let maps = match read_maps(proc_root, pid) {
        // An exiting process's map reads empty (its memory is released before it is a
        // zombie); no user process with a libcuda event has an empty one.
        Ok(m) if m.trim().is_empty() => return Err(ProcError::Exiting { pid }),
        Ok(m) => m,
        // Gone meanwhile, or unreadable (permissions: then everything reads as unhooked,
        // loudly, as before, rather than silently unclassified).
        Err(e) => match read_stat(proc_root, pid) {
            Ok(st) if !st.is_dead() && st.start_time == start_time => {
                tracing::debug!(pid, error = %e, "maps unreadable: classified from nothing");
                String::new()
            }
            _ => return Err(ProcError::Exiting { pid }),
        },
    };
    let environ = read_bytes(dir.join("environ")).map(|raw| parse_environ(&raw));
    let visible_devices = environ.as_ref().ok().and_then(|e| {
        e.get(hami_common::visible::ENV_CUDA_VISIBLE_DEVICES)
            .cloned()
    });
    let env = environ
        .map(|e| env_contract(&e))
        .unwrap_or_else(|_| HamiEnv::from_lookup(|_| None));
    let (region_path, region_from_env) = env.region_path();
    let region_path = region_path.to_string();
    let status = read_status(proc_root, pid);
    Ok(ProcInfo {
        pid,
        start_time,
        comm,
        nspid: status.as_ref().and_then(status_nspid),
        pidns: read_pidns(proc_root, pid),
        container: container_name(&cgroup),
        cgroup,
        hooked: maps_has_preload(&maps),
        uses_libcuda: maps_has_libcuda(&maps),
        hami_core: false,
        disable_control: env.control_disabled(),
        oversubscribe: env.oversubscribe_requested(),
        region_host_path: host_path(proc_root, pid, &region_path),
        region_path,
        region_from_env,
        env_limits: EnvLimits::from_env(&env),
        creds: status.as_ref().map(Creds::from_status),
        visible_devices,
    })
}

/// All numeric entries of `proc_root`.
pub fn list_pids(proc_root: &Path) -> Vec<u32> {
    let Ok(rd) = std::fs::read_dir(proc_root) else {
        return Vec::new();
    };
    let mut v: Vec<u32> = rd
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect();
    v.sort_unstable();
    v
}

/// Find the host pid of the process whose innermost pid is `nspid` in pid namespace `pidns`.
/// Returns the host pid and its stat.
pub fn find_by_nspid(proc_root: &Path, pidns: u64, nspid: u32) -> Option<(u32, Stat)> {
    list_pids(proc_root).into_iter().find_map(|pid| {
        if read_pidns(proc_root, pid)? != pidns || read_nspid(proc_root, pid)? != nspid {
            return None;
        }
        Some((pid, read_stat(proc_root, pid).ok()?))
    })
}

/// Index of every process by (pid namespace inode, innermost pid): host pid.
pub fn nspid_index(proc_root: &Path) -> std::collections::HashMap<(u64, u32), u32> {
    list_pids(proc_root)
        .into_iter()
        .filter_map(|pid| {
            Some((
                (read_pidns(proc_root, pid)?, read_nspid(proc_root, pid)?),
                pid,
            ))
        })
        .collect()
}

/// Clock ticks since boot now (`/proc/uptime` times `_SC_CLK_TCK`), comparable with
/// [`Stat::start_time`].
pub fn now_ticks(proc_root: &Path) -> Option<u64> {
    let secs = procfs::Uptime::from_file(proc_root.join("uptime"))
        .ok()?
        .uptime;
    // SAFETY: sysconf has no preconditions.
    let tck = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    Some((secs * if tck > 0 { tck as f64 } else { 100.0 }) as u64)
}

/// `/proc/<pid>/stat`, read at most once per agent tick (`cache` is cleared when a tick
/// starts).
pub fn tick_stat<'a>(
    cache: &'a mut std::collections::HashMap<u32, Option<Stat>>,
    root: &Path,
    pid: u32,
) -> Option<&'a Stat> {
    cache
        .entry(pid)
        .or_insert_with(|| read_stat(root, pid).ok())
        .as_ref()
}

#[cfg(test)]
pub(crate) mod tests;
