//! The test knobs that hold a call inside the driver: a fixed sleep (`FAKE_CUDA_*_DELAY_MS`)
//! or a rendezvous with the test (`FAKE_CUDA_*_GATE`), for the context creations, releases
//! and allocations that a test wants in flight while something else happens.
//!
//! A gate is a path `PATH`: the held call appends a line (its pid) to `PATH.inside` when it
//! starts waiting, then waits until `PATH.go` exists. The test (or the probe) waits for
//! `PATH.inside`, does what must happen while the call is inside the driver, then creates
//! `PATH.go`. Once `PATH.go` exists, later calls held by the same gate go straight through.
//! Nothing waits for ever: past [`GATE_LIMIT`] the call says so on stderr and goes on.

use std::ffi::OsString;
use std::io::Write;
use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// How long a call waits at its gate for `PATH.go` before it goes on alone (the test that
/// set the gate failed to open it: it says so on stderr).
const GATE_LIMIT: Duration = Duration::from_secs(60);

/// How often a call waiting at its gate looks for `PATH.go`.
const GATE_POLL: Duration = Duration::from_millis(2);

/// What holds one kind of call, read once from its two knobs.
#[derive(Debug)]
enum Hold {
    /// Nothing: the call runs straight through.
    None,
    /// `FAKE_CUDA_*_DELAY_MS`: a fixed sleep.
    Sleep(Duration),
    /// `FAKE_CUDA_*_GATE`: a rendezvous at this path (the sleep knob is then ignored).
    Gate(PathBuf),
}

impl Hold {
    /// The hold of the knobs `delay` (milliseconds; unset, empty, malformed or 0: none) and
    /// `gate` (a path; unset or empty: none), the gate first.
    fn from_env(delay: &str, gate: &str) -> Hold {
        if let Some(p) = std::env::var_os(gate).filter(|p| !p.is_empty()) {
            return Hold::Gate(PathBuf::from(p));
        }
        match std::env::var(delay)
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok())
        {
            Some(ms) if ms > 0 => Hold::Sleep(Duration::from_millis(ms)),
            _ => Hold::None,
        }
    }

    /// Holds the calling thread as the knobs say; `gate` names the gate knob for the message
    /// of a gate never opened.
    fn hold(&self, gate: &str) {
        match self {
            Hold::None => {}
            Hold::Sleep(d) => std::thread::sleep(*d),
            Hold::Gate(path) => {
                let inside = with_suffix(path, ".inside");
                let go = with_suffix(path, ".go");
                // One write of one short line with O_APPEND: the lines of several processes
                // do not interleave.
                let line = format!("{}\n", std::process::id());
                let wrote = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&inside)
                    .and_then(|mut f| f.write_all(line.as_bytes()));
                if let Err(e) = wrote {
                    eprintln!(
                        "fake libcuda: {gate}: cannot write {}: {e}",
                        inside.display()
                    );
                }
                let start = Instant::now();
                while !go.exists() {
                    if start.elapsed() >= GATE_LIMIT {
                        eprintln!(
                            "fake libcuda: {gate}: no {} after {} s, going on",
                            go.display(),
                            GATE_LIMIT.as_secs()
                        );
                        return;
                    }
                    std::thread::sleep(GATE_POLL);
                }
            }
        }
    }
}

/// `path` with `suffix` appended to its last component.
fn with_suffix(path: &std::path::Path, suffix: &str) -> PathBuf {
    let mut s = OsString::from(path.as_os_str());
    s.push(suffix);
    PathBuf::from(s)
}

/// Test knobs `FAKE_CUDA_CTX_CREATE_DELAY_MS` / `FAKE_CUDA_CTX_CREATE_GATE`: creating a
/// context (`cuCtxCreate*`, a first `cuDevicePrimaryCtxRetain`) is held after its memory is
/// charged, to make the creations of concurrent processes overlap as they do on a real GPU
/// (the sleep), or to show that they do (the gate: every process started together must be
/// inside at once). Default: no hold.
pub fn ctx_create_hold() {
    static V: OnceLock<Hold> = OnceLock::new();
    const GATE: &str = "FAKE_CUDA_CTX_CREATE_GATE";
    V.get_or_init(|| Hold::from_env("FAKE_CUDA_CTX_CREATE_DELAY_MS", GATE))
        .hold(GATE);
}

/// Test knobs `FAKE_CUDA_RELEASE_DELAY_MS` / `FAKE_CUDA_RELEASE_GATE`: a release
/// (`cuMemFree_v2`, `cuArrayDestroy`, `cuMipmappedArrayDestroy`, `cuMemRelease`,
/// `cuModuleUnload`, `cuLibraryUnload`) is held before it looks at its argument, holding no
/// lock, so that another thread can destroy the object's context while the release is in
/// flight. Default: no hold.
pub fn release_delay() {
    static V: OnceLock<Hold> = OnceLock::new();
    const GATE: &str = "FAKE_CUDA_RELEASE_GATE";
    V.get_or_init(|| Hold::from_env("FAKE_CUDA_RELEASE_DELAY_MS", GATE))
        .hold(GATE);
}

/// Test knobs `FAKE_CUDA_ALLOC_DELAY_MS` / `FAKE_CUDA_ALLOC_GATE`: an allocation
/// (`cuMemAlloc_v2`, `cuMemAllocManaged`, `cuArrayCreate_v2`, `cuArray3DCreate_v2`) that
/// succeeded is held before returning, holding no lock, so that another thread can destroy
/// the context the object was made in before the caller sees it. Default: no hold.
pub fn alloc_delay() {
    static V: OnceLock<Hold> = OnceLock::new();
    const GATE: &str = "FAKE_CUDA_ALLOC_GATE";
    V.get_or_init(|| Hold::from_env("FAKE_CUDA_ALLOC_DELAY_MS", GATE))
        .hold(GATE);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gate_records_the_call_inside_and_lets_it_go_once_opened() {
        let dir = std::env::temp_dir().join(format!("fake-cuda-gate-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("g");
        let gate = Hold::Gate(path.clone());
        let t = std::thread::spawn(move || gate.hold("TEST_GATE"));
        let inside = with_suffix(&path, ".inside");
        let start = Instant::now();
        while !inside.exists() {
            assert!(start.elapsed() < Duration::from_secs(30), "never inside");
            std::thread::sleep(Duration::from_millis(1));
        }
        std::thread::sleep(Duration::from_millis(50));
        assert!(!t.is_finished(), "went on before the gate was opened");
        std::fs::write(with_suffix(&path, ".go"), b"").unwrap();
        t.join().unwrap();
        assert_eq!(
            std::fs::read_to_string(&inside).unwrap(),
            format!("{}\n", std::process::id())
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
