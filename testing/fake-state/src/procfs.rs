//! What the fake reads of processes in the host's `/proc`: pids, names, states and start
//! times.

use std::path::PathBuf;

/// Test knob: a `/proc` of the host's pid namespace visible inside a pid namespace (a bind
/// mount made before mounting the namespace's own `/proc`). Unset: `/proc`.
pub const ENV_HOST_PROC: &str = "FAKE_CUDA_HOST_PROC";

/// The `/proc` whose pids the fake records and reports: `$FAKE_CUDA_HOST_PROC`, else `/proc`.
/// The real driver reports pids of the host's pid namespace whatever namespace the caller
/// runs in; a process in a container with its own pid namespace and `/proc` cannot learn
/// them, so the tests that model that give the fake the host's `/proc` this way.
fn host_proc() -> Option<PathBuf> {
    std::env::var_os(ENV_HOST_PROC)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

/// The calling process's pid as the host's pid namespace numbers it (`<host proc>/self`),
/// what the fake records in its slot and NVML lists: `getpid()` unless
/// [`ENV_HOST_PROC`] names another `/proc`.
pub fn host_pid() -> u32 {
    let own = std::process::id();
    let Some(dir) = host_proc() else { return own };
    std::fs::read_link(dir.join("self"))
        .ok()
        .and_then(|l| l.to_str().and_then(|s| s.parse().ok()))
        .unwrap_or(own)
}

/// The name NVML gives host pid `pid`: the path of its executable (`<host proc>/<pid>/exe`,
/// see [`host_pid`]), else its `comm`, else empty (the real driver's name field of a process
/// it cannot name).
pub fn process_name(pid: u32) -> String {
    let dir = host_proc().unwrap_or_else(|| "/proc".into());
    if let Ok(l) = std::fs::read_link(dir.join(format!("{pid}/exe"))) {
        return l.to_string_lossy().into_owned();
    }
    std::fs::read_to_string(dir.join(format!("{pid}/comm")))
        .map(|s| s.trim_end().to_string())
        .unwrap_or_default()
}

/// `(state, start_time)` of a process from `/proc/<pid>/stat` (the host's `/proc`, see
/// [`host_pid`]).
pub(crate) fn proc_stat(pid: u32) -> Option<(u8, u64)> {
    // Through `task/<pid>/stat` (the main thread's, the same fields): qemu-user answers a
    // process's own `/proc/<pid>/stat` with the calling thread's start time, so a process
    // whose driver calls come from a second thread would look like another process.
    let dir = host_proc().unwrap_or_else(|| "/proc".into());
    let s = std::fs::read(dir.join(format!("{pid}/task/{pid}/stat")))
        .or_else(|_| std::fs::read(dir.join(format!("{pid}/stat"))))
        .ok()?;
    let close = s.iter().rposition(|&b| b == b')')?;
    let rest = std::str::from_utf8(&s[close + 1..]).ok()?;
    let mut fields = rest.split_ascii_whitespace();
    let state = fields.next()?.as_bytes().first().copied()?;
    // Fields after ')' start at field 3 (state); start time is field 22.
    let start = fields.nth(18)?.parse().ok()?;
    Some((state, start))
}

/// Start time of `pid` (clock ticks since boot), if it runs.
pub fn process_start_time(pid: u32) -> Option<u64> {
    proc_stat(pid).map(|(_, t)| t)
}

/// Whether `pid` runs (not a zombie) and, if `start` is known, is the same process.
pub fn process_alive(pid: u32, start: u64) -> bool {
    match proc_stat(pid) {
        // The host's /proc given and the pid absent from it: gone (kill(2) would look the
        // pid up in the caller's namespace, where host pids mean other processes).
        None if host_proc().is_some() => false,
        None => {
            // No /proc entry: fall back to kill(0) (e.g. /proc not mounted).
            // SAFETY: signal 0 only checks for existence.
            let r = unsafe { libc::kill(pid as libc::pid_t, 0) };
            r == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
        }
        Some((state, t)) => state != b'Z' && state != b'X' && (start == 0 || start == t),
    }
}
