//! A tenant cannot blind, kill or mislead the node agent (issue 9). Each test is one row of
//! the table, run as a hostile tenant would (root, eBPF, the fake driver):
//!
//! * a region path that is a FIFO: nothing blocks (`/metrics`, other bypasses, SIGTERM);
//!   `inspect` on a FIFO fails at once;
//! * a region path that is a symlink, inside a container root, to a host file or a host
//!   device node: the agent opens neither;
//! * the watched region truncated to half, then to 0: the agent lives on;
//! * events dropped (agent stopped while a workload churns): no false finding, the process
//!   marked and its figures rebuilt from the region;
//! * 1- and 2-GPU nodes without NVML: the region says the real device count, the
//!   single-GPU attribution rule applies on one GPU only;
//! * a closed stdout: no panic.
//! * a libcuda candidate truncated and rewritten (same inode) while the agent attaches to
//!   it: the agent skips it or attaches, never dies (aya used to `mmap` the file to
//!   resolve each symbol: SIGBUS); this and the other driver files a tenant controls are
//!   in [`driver_files`].

use std::io::Read;
use std::os::fd::FromRawFd;
use std::path::Path;
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use hami_test_harness::{
    audit_findings as findings, audit_process as process, finding_line, get_metrics, parse_audit,
    serial, AgentCommand, AgentProcess, Artifacts, RunningProbe, TestEnv,
};
use serde_json::Value;

use crate::common::{require_root, AGENT};

const MIB: u64 = 1 << 20;

mod driver_files;

fn mkfifo(p: &Path) {
    let c = std::ffi::CString::new(p.to_str().unwrap()).unwrap();
    // SAFETY: valid C string.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o666) }, 0, "mkfifo");
}

/// Whether process `pid` has `fifo` open, or one of its threads waits in a FIFO open.
fn holds_fifo(pid: i32, fifo: &Path) -> bool {
    let dir = format!("/proc/{pid}");
    let fds = std::fs::read_dir(format!("{dir}/fd"))
        .into_iter()
        .flatten()
        .flatten();
    let open = fds
        .filter_map(|e| std::fs::read_link(e.path()).ok())
        .any(|t| t == fifo);
    let tasks = std::fs::read_dir(format!("{dir}/task"))
        .into_iter()
        .flatten()
        .flatten();
    let waiting = tasks
        .filter_map(|t| std::fs::read_to_string(t.path().join("wchan")).ok())
        .any(|w| w.contains("fifo") || w.contains("wait_for_partner"));
    open || waiting
}

/// Whether some process has `fifo` open for reading (or waits to): a non-blocking open
/// for writing fails with ENXIO when none has. Opening it also releases such a waiter
/// (an old agent elsewhere on the node, blocked on this test's FIFO).
fn fifo_has_reader(fifo: &Path) -> bool {
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: valid C string; the fd is closed at once.
    let fd = unsafe { libc::open(c.as_ptr(), libc::O_WRONLY | libc::O_NONBLOCK) };
    if fd >= 0 {
        // SAFETY: fd just opened.
        unsafe { libc::close(fd) };
        return true;
    }
    false
}

#[test]
fn fifo_region_path_blocks_neither_metrics_nor_other_findings_nor_sigterm() {
    let _g = serial();
    let env = TestEnv::new().env("FAKE_CUDA_DEVICE_COUNT", "1");
    let fifo = env.dir().join("ff");
    mkfifo(&fifo);
    let mut agent = AgentProcess::start(
        AGENT,
        &env,
        &["run", "--json-log", "--metrics-addr", "127.0.0.1:0"],
    );
    let addr = agent.metrics_addr();
    // The hostile tenant: unhooked, its region path a FIFO.
    let mut hostile_env = TestEnv::new().env("FAKE_CUDA_DEVICE_COUNT", "1");
    hostile_env.set_env("FAKE_CUDA_STATE", env.state_path().to_str().unwrap());
    hostile_env.set_env("CUDA_DEVICE_MEMORY_SHARED_CACHE", fifo.to_str().unwrap());
    let mut hostile = hostile_env.spawn_probe(&["init", "ctx", "alloc", "16M", "wait"]);
    assert!(hostile.wait_for("alloc").ok());
    let hp = hostile.pid;
    agent.wait_line(Duration::from_secs(5), |l| {
        finding_line(l, "bypass", hp).is_some()
    });
    // A second, ordinary bypass is still reported promptly.
    let mut other = env.spawn_probe(&["init", "ctx", "alloc", "32M", "wait"]);
    assert!(other.wait_for("alloc").ok());
    let op = other.pid;
    let t0 = Instant::now();
    let line = agent.wait_line(Duration::from_secs(5), |l| {
        finding_line(l, "bypass", op).is_some()
    });
    // (At least its 32 MiB: if other load on the node overflowed the ring buffer, the
    // process is found by the scan after the drops and NVML's figure, with its context,
    // is the larger one.)
    let bytes = finding_line(&line, "bypass", op).unwrap()["bytes"]
        .as_u64()
        .unwrap();
    assert!(bytes >= 32 * MIB, "{line}");
    assert!(t0.elapsed() < Duration::from_secs(3), "{:?}", t0.elapsed());
    // /metrics answers.
    let m = get_metrics(addr, Duration::from_secs(3)).expect("/metrics answers");
    assert!(m.starts_with("HTTP/1.") && m.contains(" 200"), "{m}");
    // The FIFO was never opened (nobody reads it).
    assert!(
        !holds_fifo(agent.pid(), &fifo),
        "the agent holds the FIFO open"
    );
    let (st, _, log) = agent.terminate(Duration::from_secs(15));
    fifo_has_reader(&fifo); // releases an old agent elsewhere blocked on it, if any
    assert!(st.success(), "{st:?}\n{}", log.join("\n"));
    hostile.resume();
    other.resume();
}

#[test]
fn inspect_on_a_fifo_fails_at_once_naming_the_problem() {
    let tmp = tempfile::tempdir().unwrap();
    let fifo = tmp.path().join("ff");
    mkfifo(&fifo);
    let out = AgentCommand::new(AGENT)
        .args(["inspect", "--json"])
        .arg(&fifo)
        .output_within(Duration::from_secs(5));
    let err = out.stderr_text();
    assert_eq!(out.code(), Some(1), "{err}");
    assert!(err.contains("FIFO"), "{err}");
    assert!(err.contains(fifo.to_str().unwrap()), "{err}");
    fifo_has_reader(&fifo);
}

/// A fanotify watch for opens of `paths`, with the pid of each opener (other agents may
/// run on the node: only this test's agent matters).
struct OpenWatch(std::fs::File);

impl OpenWatch {
    fn new(paths: &[&Path]) -> OpenWatch {
        // SAFETY: plain syscall (root: CAP_SYS_ADMIN).
        let fd = unsafe {
            libc::fanotify_init(
                libc::FAN_CLASS_NOTIF | libc::FAN_NONBLOCK | libc::FAN_CLOEXEC,
                libc::O_RDONLY as u32,
            )
        };
        assert!(
            fd >= 0,
            "fanotify_init: {}",
            std::io::Error::last_os_error()
        );
        for p in paths {
            let c = std::ffi::CString::new(p.to_str().unwrap()).unwrap();
            // SAFETY: valid fd and C string.
            let rc = unsafe {
                libc::fanotify_mark(
                    fd,
                    libc::FAN_MARK_ADD,
                    libc::FAN_OPEN,
                    libc::AT_FDCWD,
                    c.as_ptr(),
                )
            };
            assert_eq!(rc, 0, "fanotify_mark {}", p.display());
        }
        // SAFETY: fd just created, owned here.
        OpenWatch(unsafe { std::fs::File::from_raw_fd(fd) })
    }

    /// Pids that opened a watched path since.
    fn openers(&mut self) -> Vec<i32> {
        let mut out = Vec::new();
        let mut b = [0u8; 8192];
        let meta = std::mem::size_of::<libc::fanotify_event_metadata>();
        while let Ok(n) = self.0.read(&mut b) {
            if n == 0 {
                break;
            }
            let mut off = 0;
            while off + meta <= n {
                // SAFETY: the kernel wrote whole records; read unaligned from the buffer.
                let m: libc::fanotify_event_metadata =
                    unsafe { std::ptr::read_unaligned(b[off..].as_ptr().cast()) };
                if m.fd >= 0 {
                    // SAFETY: the event's fd is ours to close.
                    unsafe { libc::close(m.fd) };
                }
                out.push(m.pid);
                off += (m.event_len as usize).max(meta);
            }
        }
        out
    }
}

/// Runs `cudaprobe OPS` chrooted into `root` (in a private mount namespace where the system
/// directories, the fake driver and cudaprobe are bind-mounted), unhooked, with `vars`.
fn spawn_in_root(root: &Path, vars: &[(&str, &str)], ops: &[&str]) -> RunningProbe {
    let a = Artifacts::get();
    let mut binds: Vec<String> = ["/usr", "/lib", "/lib64", "/bin", "/sbin", "/etc"]
        .iter()
        .filter(|d| Path::new(d).exists() && !Path::new(d).is_symlink())
        .map(|d| d.to_string())
        .collect();
    for d in [
        a.fake_lib_dir.clone(),
        a.cudaprobe.parent().unwrap().to_path_buf(),
    ] {
        binds.push(d.display().to_string());
    }
    let mut script = String::from("set -e\n");
    for d in &binds {
        script.push_str(&format!(
            "mkdir -p '{r}{d}' && mount --bind '{d}' '{r}{d}'\n",
            r = root.display()
        ));
    }
    // Symlinked top-level dirs (usrmerge): the same links inside the root.
    for d in ["/lib", "/lib64", "/bin", "/sbin"] {
        if let Ok(t) = std::fs::read_link(d) {
            script.push_str(&format!(
                "[ -e '{r}{d}' ] || ln -s '{t}' '{r}{d}'\n",
                r = root.display(),
                t = t.display()
            ));
        }
    }
    script.push_str(&format!("exec chroot '{}' /usr/bin/env", root.display()));
    script.push_str(&format!(" LD_LIBRARY_PATH='{}'", a.fake_lib_dir.display()));
    for (k, v) in vars {
        script.push_str(&format!(" {k}='{v}'"));
    }
    script.push_str(&format!(" '{}'", a.cudaprobe.display()));
    for o in ops {
        script.push_str(&format!(" {o}"));
    }
    script.push('\n');
    let mut c = Command::new("unshare");
    c.args(["-m", "--propagation", "private", "sh", "-c", &script])
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    RunningProbe::start(c)
}

#[test]
fn region_symlinked_out_of_the_container_to_a_host_file_or_device_is_not_opened() {
    use hami_common::region::{Region, RegionConfig};
    let _g = serial();
    let env = TestEnv::new().env("FAKE_CUDA_DEVICE_COUNT", "1");
    let tmp = tempfile::tempdir().unwrap();
    // On the host: a valid region file and a device node (a copy of /dev/null's numbers).
    let secret = tmp.path().join("host-secret.cache");
    let mut cfg = RegionConfig::default();
    cfg.limits[0] = 1 << 30;
    drop(Region::open_or_create(&secret, &cfg).unwrap());
    let dev = tmp.path().join("host-dev");
    let c = std::ffi::CString::new(dev.to_str().unwrap()).unwrap();
    // SAFETY: valid C string; we are root.
    let rc = unsafe { libc::mknod(c.as_ptr(), libc::S_IFCHR | 0o666, libc::makedev(1, 3)) };
    assert_eq!(rc, 0, "mknod");
    // The container's root: /tmp/link and /tmp/devlink point at the host paths, absolute.
    let root = tmp.path().join("root");
    std::fs::create_dir_all(root.join("tmp")).unwrap();
    std::os::unix::fs::symlink(&secret, root.join("tmp/link")).unwrap();
    std::os::unix::fs::symlink(&dev, root.join("tmp/devlink")).unwrap();
    let mut watch = OpenWatch::new(&[&secret, &dev]);

    let agent = AgentProcess::start(AGENT, &env, &["audit", "--json", "--seconds", "3"]);
    let agent_pid = agent.pid();
    let mut probes = Vec::new();
    for link in ["/tmp/link", "/tmp/devlink"] {
        let mut p = spawn_in_root(
            &root,
            &[
                ("FAKE_CUDA_STATE", "/tmp/state"),
                ("FAKE_CUDA_DEVICE_COUNT", "1"),
                ("CUDA_DEVICE_MEMORY_SHARED_CACHE", link),
            ],
            &["init", "ctx", "alloc", "16M", "sleep", "10"],
        );
        let l = p.wait_for("alloc");
        assert!(l.ok(), "{l:?}");
        probes.push(p);
    }
    let (_, out, log) = agent.finish_within(Duration::from_secs(30));
    let audit = parse_audit(&out, &log);
    for p in &probes {
        // Seen (an unhooked bypass), but its region path did not lead out of its root.
        let row = process(&audit, p.pid);
        assert_eq!(row["hooked"], false, "{row:#}");
        let region = row["region"].as_str().unwrap_or("");
        assert!(region.contains("no such file"), "{row:#}");
    }
    // (Other processes on the node may have regions of their own.)
    let leaked: Vec<&Value> = audit["regions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| {
            let n = r["name"].as_str().unwrap_or("");
            n == "/tmp/link" || n == "/tmp/devlink"
        })
        .collect();
    assert!(leaked.is_empty(), "opened through the links: {leaked:#?}");
    let openers = watch.openers();
    assert!(
        !openers.contains(&agent_pid),
        "the agent ({agent_pid}) opened the host file or device: {openers:?}"
    );
    for p in probes {
        p.kill();
    }
}

/// Sets the length of `path` (truncate(2)).
fn truncate(path: &Path, len: u64) {
    std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .unwrap()
        .set_len(len)
        .unwrap();
}

#[test]
fn region_truncated_to_half_then_to_zero_while_watched_does_not_kill_the_agent() {
    let _g = serial();
    let env = TestEnv::new()
        .preload(true)
        .env("CUDA_DEVICE_MEMORY_LIMIT", "1g")
        .env("FAKE_CUDA_DEVICE_COUNT", "1");
    let mut agent = AgentProcess::start(
        AGENT,
        &env,
        &["run", "--json-log", "--metrics-addr", "127.0.0.1:0"],
    );
    let addr = agent.metrics_addr();
    let mut probe = env.spawn_probe(&["init", "ctx", "alloc", "64M", "wait"]);
    assert!(probe.wait_for("alloc").ok());
    // Watched: a few ticks with the region open.
    std::thread::sleep(Duration::from_millis(1000));
    let len = std::fs::metadata(env.region_path()).unwrap().len();
    truncate(env.region_path(), len / 2);
    agent.wait_line(Duration::from_secs(5), |l| {
        l.contains("region unreadable") && l.contains("truncated")
    });
    assert!(agent.alive(), "agent died after truncation to half");
    truncate(env.region_path(), 0);
    std::thread::sleep(Duration::from_millis(1000));
    assert!(agent.alive(), "agent died after truncation to 0");
    // Everything else still works: /metrics, a new bypass, SIGTERM.
    let m = get_metrics(addr, Duration::from_secs(3)).expect("/metrics answers");
    assert!(m.contains(" 200"), "{m}");
    let mut plain = TestEnv::new().env("FAKE_CUDA_DEVICE_COUNT", "1");
    plain.set_env("FAKE_CUDA_STATE", env.state_path().to_str().unwrap());
    let mut other = plain.spawn_probe(&["init", "ctx", "alloc", "8M", "wait"]);
    assert!(other.wait_for("alloc").ok());
    let op = other.pid;
    agent.wait_line(Duration::from_secs(5), |l| {
        finding_line(l, "bypass", op).is_some()
    });
    let (st, _, log) = agent.terminate(Duration::from_secs(15));
    assert!(st.success(), "{st:?}\n{}", log.join("\n"));
    other.resume();
    let _ = probe.kill();
}

/// Reads `cudaprobe` lines until one starts with `op=<op>` and is not a `state=` line.
fn wait_done(p: &mut RunningProbe, op: &str) -> String {
    loop {
        let l = p
            .next_line()
            .unwrap_or_else(|| panic!("cudaprobe ended before op={op}"));
        if l.starts_with(&format!("op={op} ")) && !l.contains("state=") {
            return l;
        }
    }
}

#[test]
fn ring_buffer_overflow_leaves_no_false_finding_and_rebuilds_from_the_region() {
    let _g = serial();
    let env = TestEnv::new()
        .preload(true)
        .env("CUDA_DEVICE_MEMORY_LIMIT", "1g")
        .env("FAKE_CUDA_DEVICE_COUNT", "1");
    let agent = AgentProcess::start(AGENT, &env, &["audit", "--json", "--seconds", "11"]);
    // stdin /dev/null: bench-for runs for its SECONDS at once; sleep keeps the 64 MiB.
    let mut c = env.cudaprobe_cmd(&[
        "init",
        "ctx",
        "alloc",
        "64M",
        "bench-for",
        "5",
        "1M",
        "sleep",
        "30",
    ]);
    c.stdin(Stdio::null());
    let mut probe = RunningProbe::start(c);
    let pid = probe.pid;
    let l = wait_done(&mut probe, "alloc");
    assert!(l.contains("rc=0"), "{l}");
    // Starve the agent while the workload churns: the ring buffer (65,536 events)
    // overflows. Two unhooked churners in the same seconds make sure of it on a slow
    // machine (their own findings are theirs).
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(agent.pid(), libc::SIGSTOP) };
    let mut plain = TestEnv::new();
    plain.set_env("FAKE_CUDA_STATE", env.state_path().to_str().unwrap());
    let helpers: Vec<_> = (0..2)
        .map(|_| {
            let mut c = plain.cudaprobe_cmd(&["init", "ctx", "bench-for", "4", "1M"]);
            c.stdin(Stdio::null());
            c.spawn().unwrap()
        })
        .collect();
    let bench = wait_done(&mut probe, "bench-for");
    for h in helpers {
        let _ = h.wait_with_output();
    }
    // SAFETY: as above.
    unsafe { libc::kill(agent.pid(), libc::SIGCONT) };
    assert!(bench.contains("failures=0"), "{bench}");
    let (_, out, log) = agent.finish_within(Duration::from_secs(30));
    let audit = parse_audit(&out, &log);
    assert!(
        audit["probes"]["dropped"].as_u64().unwrap() > 0,
        "the ring buffer did not overflow: {}",
        audit["probes"]
    );
    let row = process(&audit, pid);
    assert_eq!(row["accounted"], 64 * MIB, "{row:#}");
    assert_eq!(row["observed"], 64 * MIB, "{row:#}");
    assert!(
        row["events_lost"]
            .as_str()
            .is_some_and(|s| s.contains("events lost")),
        "{row:#}"
    );
    let mine: Vec<&Value> = findings(&audit)
        .iter()
        .filter(|f| f["pid"] == pid)
        .collect();
    assert!(mine.is_empty(), "false findings: {mine:#?}\n{row:#}");
    let _ = probe.kill();
}

/// Region row of `audit` for `name`.
fn region_row<'a>(audit: &'a Value, name: &Path) -> &'a Value {
    audit["regions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == name.display().to_string())
        .unwrap_or_else(|| panic!("region {} not in audit: {audit:#}", name.display()))
}

fn inspect_json(path: &Path) -> Value {
    hami_test_harness::inspect_json(AGENT, path)
}

/// A hooked process that registers in the region, and an unhooked one on the same region
/// whose context predates the agent, allocating `unhooked_alloc` after the agent started.
fn node_without_nvml(devices: &str, unhooked_alloc: &str) -> (TestEnv, Value, u32) {
    let env = TestEnv::new()
        .preload(true)
        .env("CUDA_DEVICE_MEMORY_LIMIT", "1g")
        .env("FAKE_CUDA_DEVICE_COUNT", devices);
    let mut hooked = env.spawn_probe(&["init", "ctx", "alloc", "64M", "wait"]);
    assert!(hooked.wait_for("alloc").ok());
    let mut plain = TestEnv::new().env("FAKE_CUDA_DEVICE_COUNT", devices);
    plain.set_env("FAKE_CUDA_STATE", env.state_path().to_str().unwrap());
    plain.set_env(
        "CUDA_DEVICE_MEMORY_SHARED_CACHE",
        env.region_path().to_str().unwrap(),
    );
    plain.set_env("CUDA_DEVICE_MEMORY_LIMIT", "1g");
    let mut unhooked = plain.spawn_probe(&["init", "ctx", "wait", "alloc", unhooked_alloc, "wait"]);
    unhooked.wait_for("wait");
    let agent =
        AgentProcess::start_with_libs(AGENT, &env, &["audit", "--json", "--seconds", "2"], None);
    unhooked.resume();
    assert!(unhooked.wait_for("alloc").ok());
    let (_, out, log) = agent.finish_within(Duration::from_secs(30));
    let audit = parse_audit(&out, &log);
    let pid = unhooked.pid;
    hooked.resume();
    unhooked.resume();
    (env, audit, pid)
}

#[test]
fn one_gpu_node_without_nvml_shows_one_device_and_attributes_unknown_bytes_to_it() {
    let _g = serial();
    let (env, audit, upid) = node_without_nvml("1", "2g");
    assert_eq!(audit["nvml"]["available"], false, "{:#}", audit["nvml"]);
    let r = region_row(&audit, env.region_path());
    assert_eq!(r["device_count"], 1, "{r:#}");
    assert_eq!(r["limits"].as_array().unwrap().len(), 1, "{r:#}");
    // The unhooked process's context predates the agent: its device is unknown, and on a
    // single-GPU node that is device 0, so the container is over its limit.
    let row = process(&audit, upid);
    assert_eq!(row["unknown_device"], true, "{row:#}");
    let over: Vec<&Value> = findings(&audit)
        .iter()
        .filter(|f| f["kind"] == "over_limit")
        .collect();
    assert_eq!(over.len(), 1, "{audit:#}");
    assert_eq!(over[0]["device"], 0);
    assert_eq!(over[0]["observed"], 2048 * MIB, "{:#}", over[0]);
    assert_eq!(audit["failed"], true);
    let v = inspect_json(env.region_path());
    assert_eq!(v["device_count"], 1, "{v:#}");
    assert_eq!(v["devices"].as_array().unwrap().len(), 1, "{v:#}");
}

#[test]
fn two_gpu_node_without_nvml_shows_two_devices_and_attributes_nothing_to_a_guess() {
    let _g = serial();
    let (env, audit, upid) = node_without_nvml("2", "2g");
    let r = region_row(&audit, env.region_path());
    assert_eq!(r["device_count"], 2, "{r:#}");
    assert_eq!(r["limits"].as_array().unwrap().len(), 2, "{r:#}");
    let row = process(&audit, upid);
    assert_eq!(row["unknown_device"], true, "{row:#}");
    // Two GPUs: bytes of an unknown device are not put on device 0.
    assert!(
        !findings(&audit).iter().any(|f| f["kind"] == "over_limit"),
        "{audit:#}"
    );
    let v = inspect_json(env.region_path());
    assert_eq!(v["device_count"], 2, "{v:#}");
    assert_eq!(v["devices"].as_array().unwrap().len(), 2, "{v:#}");
}

/// A pipe whose read end is already closed: every write to it fails with EPIPE.
fn closed_pipe() -> Stdio {
    let mut fds = [0; 2];
    // SAFETY: valid array of two ints.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    // SAFETY: both fds were just created; the read end is closed, the write end owned.
    unsafe {
        libc::close(fds[0]);
        Stdio::from(std::fs::File::from_raw_fd(fds[1]))
    }
}

fn run_with_closed_stdout(args: &[&str], env: Option<&TestEnv>) -> (ExitStatus, String) {
    let mut c = AgentCommand::new(AGENT).args(args);
    if let Some(env) = env {
        c = c.state(env).libcuda(&Artifacts::get().fake_libcuda);
    }
    let out = c
        .stdout(closed_pipe())
        .output_within(Duration::from_secs(60));
    (out.status, out.stderr_text())
}

#[test]
fn closed_stdout_ends_inspect_and_audit_quietly() {
    use hami_common::region::{Region, RegionConfig};
    let tmp = tempfile::tempdir().unwrap();
    let r = tmp.path().join("r.cache");
    let mut cfg = RegionConfig::default();
    cfg.limits[0] = 1 << 30;
    cfg.device_count = 1;
    drop(Region::open_or_create(&r, &cfg).unwrap());
    let rs = r.to_str().unwrap();
    for args in [vec!["inspect", "--json", rs], vec!["inspect", rs]] {
        let (st, err) = run_with_closed_stdout(&args, None);
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        assert_eq!(st.code(), Some(0), "{args:?}: {st:?} {err}");
    }
    require_root();
    let _g = serial();
    let env = TestEnv::new();
    for args in [
        vec!["audit", "--json", "--seconds", "0.2"],
        vec!["audit", "--seconds", "0.2"],
    ] {
        let (st, err) = run_with_closed_stdout(&args, Some(&env));
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        assert!(
            matches!(st.code(), Some(0) | Some(2)),
            "{args:?}: {st:?} {err}"
        );
    }
}
