//! [`AgentCommand`] and [`AgentProcess`]: the one way the agent's tests (and `cargo xtask
//! demo` / `torture`) run `hami-agent`. [`AgentCommand`] puts a command line together (the
//! sandbox's fake driver, extra arguments and environment, its own process group, another
//! user) and starts it ([`AgentProcess`]: wait for its `ready` line, read its log lines,
//! findings among them, its `/metrics` and its `audit --json` report, stop it) or runs it to
//! its end ([`AgentOutput`]: `inspect`, usage errors, a short `audit`). Plus [`serial`], the
//! one lock that keeps agent tests from running at the same time, and the parsers of what
//! the agent prints ([`finding_line`], [`parse_audit`], [`audit_process`],
//! [`audit_findings_for`], [`inspect_json`]).
//!
//! The agent's binary is the caller's to name (`env!("CARGO_BIN_EXE_hami-agent")` in
//! hami-user's tests, the one xtask built): the harness does not build it.

use std::ffi::OsStr;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::{Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::artifacts::Artifacts;
use crate::process::{forward_lines, require_root};
use crate::sandbox::{TestEnv, ENV_FAKE_STATE};

/// What went wrong driving an agent, for callers that report instead of panicking
/// (`cargo xtask demo` / `torture`); the tests' methods panic with the log instead.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// The binary could not be started.
    #[error("starting {program}: {source}")]
    Spawn {
        /// The program started.
        program: String,
        /// Why it failed.
        #[source]
        source: std::io::Error,
    },
    /// No line came before the deadline.
    #[error("timed out waiting for the agent")]
    Timeout,
    /// The agent exited (stderr closed) before the expected line.
    #[error("hami-agent exited ({0:?})")]
    Exited(Option<ExitStatus>),
    /// The agent was still running when it should have exited.
    #[error("hami-agent did not exit within {0:?}")]
    NoExit(Duration),
    /// Waiting for the agent's status failed.
    #[error("waiting for hami-agent: {0}")]
    Wait(#[source] std::io::Error),
}

/// The line the agent logs once its probes are attached and it is watching.
pub const READY_LINE: &str = "hami-agent: ready";
/// How long [`AgentProcess::spawn`] waits for [`READY_LINE`].
pub const READY_TIMEOUT: Duration = Duration::from_secs(60);

static SERIAL: Mutex<()> = Mutex::new(());

/// Held while a test runs an agent or loads eBPF probes (see [`serial`]).
pub struct Serial {
    _lock: MutexGuard<'static, ()>,
}

/// Takes the one lock of this test binary: every agent sees every process that calls the
/// fake libcuda, and attaching probes is slow while another agent's keeper detaches its own,
/// so the tests that start agents or load probes run one at a time. A test that panicked
/// while holding it does not poison it for the others.
pub fn serial() -> Serial {
    Serial {
        _lock: SERIAL.lock().unwrap_or_else(|e| e.into_inner()),
    }
}

/// A running `hami-agent`: its stderr read line by line (kept in [`AgentProcess::log`]), its
/// stdout read to the end by a thread (the `audit` report, returned by
/// [`AgentProcess::finish`]). Dropping it kills the agent if it still runs.
pub struct AgentProcess {
    child: Child,
    stderr: Receiver<String>,
    stdout: Option<JoinHandle<String>>,
    log: Vec<String>,
}

/// A `hami-agent` command line being put together, then started ([`AgentCommand::start`]:
/// waits for its `ready` line; [`AgentCommand::spawn`]: does not) or run to its end
/// ([`AgentCommand::output`], [`AgentCommand::output_within`]: `inspect`, usage errors, a
/// short `audit`). Every agent the tests start goes through it, so what each one inherits is
/// decided here: never `LD_PRELOAD`, stdin null, stdout and stderr piped (stdout may be set
/// with [`AgentCommand::stdout`]); the rest of the test's environment is inherited unless
/// changed.
pub struct AgentCommand {
    cmd: Command,
    libcuda: Option<PathBuf>,
    stdout: Option<Stdio>,
}

impl AgentCommand {
    /// `bin` with no arguments yet.
    pub fn new(bin: impl AsRef<Path>) -> AgentCommand {
        AgentCommand {
            cmd: Command::new(bin.as_ref()),
            libcuda: None,
            stdout: None,
        }
    }

    /// `bin audit --json --seconds SECONDS`.
    pub fn audit_json(bin: impl AsRef<Path>, seconds: &str) -> AgentCommand {
        AgentCommand::new(bin).args(["audit", "--json", "--seconds", seconds])
    }

    /// `bin run --json-log --metrics-addr 127.0.0.1:0` (the address it took is
    /// [`AgentProcess::metrics_addr`]).
    pub fn run_json(bin: impl AsRef<Path>) -> AgentCommand {
        AgentCommand::new(bin).args(["run", "--json-log", "--metrics-addr", "127.0.0.1:0"])
    }

    /// One more argument.
    pub fn arg(mut self, a: impl AsRef<OsStr>) -> AgentCommand {
        self.cmd.arg(a);
        self
    }

    /// More arguments.
    pub fn args<S: AsRef<OsStr>>(mut self, a: impl IntoIterator<Item = S>) -> AgentCommand {
        self.cmd.args(a);
        self
    }

    /// Sets an environment variable (the last setting of a name wins).
    pub fn env(mut self, key: impl AsRef<OsStr>, value: impl AsRef<OsStr>) -> AgentCommand {
        self.cmd.env(key, value);
        self
    }

    /// Removes an environment variable the test's own environment has.
    pub fn env_remove(mut self, key: impl AsRef<OsStr>) -> AgentCommand {
        self.cmd.env_remove(key);
        self
    }

    /// Against the sandbox's fake driver: its state file (`FAKE_CUDA_STATE`), `--libcuda`
    /// naming the fake libcuda (the sandbox's own copy when it is shared with other users)
    /// and the fake NVML found on `LD_LIBRARY_PATH`.
    pub fn fake_driver(self, env: &TestEnv) -> AgentCommand {
        let a = Artifacts::get();
        let libcuda = env
            .shared()
            .map_or(a.fake_libcuda.clone(), |s| s.lib_dir.join("libcuda.so.1"));
        self.state(env)
            .libcuda(libcuda)
            .ld_library_path(&a.fake_lib_dir)
    }

    /// The sandbox's fake-driver state file only (`FAKE_CUDA_STATE`): no `--libcuda`, and
    /// `LD_LIBRARY_PATH` left as it is.
    pub fn state(self, env: &TestEnv) -> AgentCommand {
        self.env(ENV_FAKE_STATE, env.state_path())
    }

    /// `--libcuda PATH`, given after every other argument (replaces an earlier one).
    pub fn libcuda(mut self, path: impl Into<PathBuf>) -> AgentCommand {
        self.libcuda = Some(path.into());
        self
    }

    /// No `--libcuda` (the driver found by discovery only), even after
    /// [`AgentCommand::fake_driver`].
    pub fn no_libcuda(mut self) -> AgentCommand {
        self.libcuda = None;
        self
    }

    /// `LD_LIBRARY_PATH=value`: where it finds NVML (a `:` list).
    pub fn ld_library_path(self, value: impl AsRef<OsStr>) -> AgentCommand {
        self.env("LD_LIBRARY_PATH", value)
    }

    /// No `LD_LIBRARY_PATH` (a node without NVML where none is installed system-wide).
    pub fn without_ld_library_path(self) -> AgentCommand {
        self.env_remove("LD_LIBRARY_PATH")
    }

    /// In a process group of its own, which the probe keeper it forks on exit
    /// (`hami-detach`) inherits: [`wait_for_group_gone`](crate::wait_for_group_gone) with
    /// the agent's pid then waits for the keeper too.
    pub fn own_group(mut self) -> AgentCommand {
        self.cmd.process_group(0);
        self
    }

    /// Runs as `uid`/`gid` with no supplementary groups (the test runs as root).
    pub fn user(mut self, uid: u32, gid: u32) -> AgentCommand {
        self.cmd.uid(uid).gid(gid);
        self
    }

    /// Its stdout (piped and read by the harness otherwise), e.g. a pipe whose reader is gone.
    pub fn stdout(mut self, s: Stdio) -> AgentCommand {
        self.stdout = Some(s);
        self
    }

    /// The command as it runs (`--libcuda` appended, `LD_PRELOAD` removed, stdin null,
    /// stdout and stderr piped or as set), and a name for messages.
    fn into_command(self) -> (Command, String) {
        let mut cmd = self.cmd;
        if let Some(l) = &self.libcuda {
            cmd.arg("--libcuda").arg(l);
        }
        cmd.env_remove("LD_PRELOAD")
            .stdin(Stdio::null())
            .stdout(self.stdout.unwrap_or_else(Stdio::piped))
            .stderr(Stdio::piped());
        let name = std::iter::once(cmd.get_program())
            .chain(cmd.get_args())
            .map(|a| a.to_string_lossy().into_owned())
            .collect::<Vec<_>>()
            .join(" ");
        (cmd, name)
    }

    /// Starts it and waits (at most [`READY_TIMEOUT`]) for its `ready` line; panics with the
    /// log if it exits or is not ready in time. Needs root (the probes).
    pub fn start(self) -> AgentProcess {
        require_root();
        let mut agent = self.spawn();
        agent.wait_line(READY_TIMEOUT, |l| l.contains(READY_LINE));
        agent
    }

    /// Starts it without waiting for anything (read its lines with
    /// [`AgentProcess::next_line`] or [`AgentProcess::wait_line`]).
    pub fn spawn(self) -> AgentProcess {
        let (cmd, _) = self.into_command();
        AgentProcess::spawn_only(cmd).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Runs it to its end, however long that takes: its status and everything it printed.
    pub fn output(self) -> AgentOutput {
        self.run_to_end(None)
    }

    /// [`AgentCommand::output`] bounded by `timeout`: still running then, it is killed and
    /// the test panics with what it printed on stderr.
    pub fn output_within(self, timeout: Duration) -> AgentOutput {
        self.run_to_end(Some(timeout))
    }

    fn run_to_end(self, timeout: Option<Duration>) -> AgentOutput {
        let (mut cmd, name) = self.into_command();
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("starting {name}: {e}"));
        // Each stream read to its end by a thread (a child it left may hold it open).
        let read_all = |r: Option<Box<dyn Read + Send>>| {
            let (tx, rx) = std::sync::mpsc::channel();
            std::thread::spawn(move || {
                let mut v = Vec::new();
                if let Some(mut r) = r {
                    let _ = r.read_to_end(&mut v);
                }
                let _ = tx.send(v);
            });
            rx
        };
        let stdout = read_all(child.stdout.take().map(|o| Box::new(o) as _));
        let stderr = read_all(child.stderr.take().map(|e| Box::new(e) as _));
        let end = timeout.map(|t| Instant::now() + t);
        let status = loop {
            match child.try_wait() {
                Ok(Some(st)) => break st,
                Ok(None) => {}
                Err(e) => panic!("waiting for {name}: {e}"),
            }
            if end.is_some_and(|end| Instant::now() > end) {
                let _ = child.kill();
                let _ = child.wait();
                let err = stderr
                    .recv_timeout(Duration::from_secs(2))
                    .unwrap_or_default();
                panic!(
                    "{name}: still running after {:?}; stderr:\n{}",
                    timeout.unwrap_or_default(),
                    String::from_utf8_lossy(&err)
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        AgentOutput {
            pid: child.id() as i32,
            status,
            stdout: stdout.recv().unwrap_or_default(),
            stderr: stderr.recv().unwrap_or_default(),
        }
    }
}

/// What a `hami-agent` run to its end ([`AgentCommand::output`]) left: like
/// [`std::process::Output`], with its pid (its process group's id after
/// [`AgentCommand::own_group`]); shown with stdout and stderr as text.
pub struct AgentOutput {
    /// The agent's pid.
    pub pid: i32,
    /// Its exit status.
    pub status: ExitStatus,
    /// Everything it wrote on stdout (empty when stdout was not piped).
    pub stdout: Vec<u8>,
    /// Everything it wrote on stderr.
    pub stderr: Vec<u8>,
}

impl AgentOutput {
    /// The exit code (`None` when killed by a signal).
    pub fn code(&self) -> Option<i32> {
        self.status.code()
    }

    /// stdout as text (lossy).
    pub fn stdout_text(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }

    /// stderr as text (lossy).
    pub fn stderr_text(&self) -> String {
        String::from_utf8_lossy(&self.stderr).into_owned()
    }
}

impl std::fmt::Debug for AgentOutput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentOutput")
            .field("pid", &self.pid)
            .field("status", &self.status)
            .field("stdout", &self.stdout_text())
            .field("stderr", &self.stderr_text())
            .finish()
    }
}

/// `bin inspect --json PATH`, parsed; panics with its stderr unless it exits 0 with JSON.
pub fn inspect_json(bin: impl AsRef<Path>, path: &Path) -> Value {
    let out = AgentCommand::new(bin)
        .args(["inspect", "--json"])
        .arg(path)
        .output_within(Duration::from_secs(30));
    assert!(out.status.success(), "inspect {}: {out:?}", path.display());
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("inspect {}: not JSON ({e}): {out:?}", path.display()))
}

impl AgentProcess {
    /// Starts `bin ARGS... --libcuda <fake>` against the sandbox's fake driver (see
    /// [`AgentCommand::fake_driver`]) and waits for its `ready` line. Needs root.
    pub fn start(bin: impl AsRef<Path>, env: &TestEnv, args: &[&str]) -> AgentProcess {
        AgentCommand::new(bin).args(args).fake_driver(env).start()
    }

    /// [`AgentProcess::start`] with `LD_LIBRARY_PATH=lib_dir` (where it finds NVML, or not);
    /// `None` removes `LD_LIBRARY_PATH` (a node without NVML).
    pub fn start_with_libs(
        bin: impl AsRef<Path>,
        env: &TestEnv,
        args: &[&str],
        lib_dir: Option<&Path>,
    ) -> AgentProcess {
        let c = AgentCommand::new(bin).args(args).fake_driver(env);
        match lib_dir {
            Some(d) => c.ld_library_path(d),
            None => c.without_ld_library_path(),
        }
        .start()
    }

    /// `bin audit --json --seconds SECONDS EXTRA...` against the sandbox's fake driver,
    /// ready (see [`AgentProcess::start`]); [`AgentProcess::finish_audit`] reads its report.
    pub fn audit(
        bin: impl AsRef<Path>,
        env: &TestEnv,
        seconds: &str,
        extra: &[&str],
    ) -> AgentProcess {
        AgentCommand::audit_json(bin, seconds)
            .args(extra)
            .fake_driver(env)
            .start()
    }

    /// `bin run --json-log --metrics-addr 127.0.0.1:0 EXTRA...` against the sandbox's fake
    /// driver, ready (see [`AgentProcess::start`]).
    pub fn run_json(bin: impl AsRef<Path>, env: &TestEnv, extra: &[&str]) -> AgentProcess {
        AgentCommand::run_json(bin)
            .args(extra)
            .fake_driver(env)
            .start()
    }

    /// Spawns a prepared agent command (its arguments and environment set by the caller;
    /// `LD_PRELOAD` removed, stdin null, stdout and stderr piped here) and waits for its
    /// `ready` line. For callers that build their own [`Command`] (`cargo xtask demo`);
    /// tests use [`AgentCommand`].
    pub fn spawn(mut cmd: Command) -> AgentProcess {
        cmd.env_remove("LD_PRELOAD")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut agent = AgentProcess::spawn_only(cmd).unwrap_or_else(|e| panic!("{e}"));
        agent.wait_line(READY_TIMEOUT, |l| l.contains(READY_LINE));
        agent
    }

    /// [`AgentProcess::spawn`] that reports instead of panicking, showing `on_line` every
    /// line logged before `ready` (the ready line included).
    pub fn try_spawn(cmd: Command, on_line: impl FnMut(&str)) -> Result<AgentProcess, AgentError> {
        AgentProcess::try_spawn_within(cmd, READY_TIMEOUT, on_line)
    }

    /// [`AgentProcess::try_spawn`] with its own deadline for the `ready` line, for an agent
    /// with much to attach and baseline first (`cargo xtask torture`'s scale scenario).
    pub fn try_spawn_within(
        mut cmd: Command,
        ready_timeout: Duration,
        mut on_line: impl FnMut(&str),
    ) -> Result<AgentProcess, AgentError> {
        cmd.env_remove("LD_PRELOAD")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut agent = AgentProcess::spawn_only(cmd)?;
        let deadline = Instant::now() + ready_timeout;
        loop {
            let l = agent.next_line(deadline)?;
            on_line(&l);
            if l.contains(READY_LINE) {
                return Ok(agent);
            }
        }
    }

    /// Starts a command whose stdio is already set (stderr piped), its stderr forwarded and
    /// its stdout, when piped, read by a thread.
    fn spawn_only(mut cmd: Command) -> Result<AgentProcess, AgentError> {
        let mut child = cmd.spawn().map_err(|source| AgentError::Spawn {
            program: cmd.get_program().to_string_lossy().into_owned(),
            source,
        })?;
        let stderr = forward_lines(child.stderr.take().expect("stderr"));
        let stdout = child.stdout.take().map(|mut out| {
            std::thread::spawn(move || {
                let mut s = String::new();
                let _ = out.read_to_string(&mut s);
                s
            })
        });
        Ok(AgentProcess {
            child,
            stderr,
            stdout,
            log: Vec::new(),
        })
    }

    /// The next stderr line (also kept in the log), or why none came before `deadline`.
    pub fn next_line(&mut self, deadline: Instant) -> Result<String, AgentError> {
        match self
            .stderr
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
        {
            Ok(l) => {
                self.log.push(l.clone());
                Ok(l)
            }
            Err(RecvTimeoutError::Timeout) => Err(AgentError::Timeout),
            Err(RecvTimeoutError::Disconnected) => Err(AgentError::Exited(self.child.wait().ok())),
        }
    }

    /// The agent's pid.
    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// The stderr lines read so far.
    pub fn log(&self) -> &[String] {
        &self.log
    }

    /// Sends signal `sig` to the agent.
    pub fn signal(&self, sig: i32) {
        // SAFETY: kill(2) on our own child, not yet reaped (we hold it).
        unsafe { libc::kill(self.pid(), sig) };
    }

    /// Reads stderr until `pred` matches a line (returned); panics with the log on timeout
    /// or if the agent exits first.
    pub fn wait_line(&mut self, timeout: Duration, pred: impl Fn(&str) -> bool) -> String {
        match self.try_wait_line(timeout, pred) {
            Ok(l) => l,
            Err(AgentError::Exited(st)) => panic!(
                "hami-agent exited ({st:?}) before a matching line; log:\n{}",
                self.log.join("\n")
            ),
            Err(_) => panic!(
                "hami-agent: no matching line within {timeout:?}; log:\n{}",
                self.log.join("\n")
            ),
        }
    }

    /// [`AgentProcess::wait_line`] that reports instead of panicking (the lines read are in
    /// [`AgentProcess::log`]), for a test that has something to clean up first.
    pub fn try_wait_line(
        &mut self,
        timeout: Duration,
        pred: impl Fn(&str) -> bool,
    ) -> Result<String, AgentError> {
        let end = Instant::now() + timeout;
        loop {
            let l = self.next_line(end)?;
            if pred(&l) {
                return Ok(l);
            }
        }
    }

    /// Takes in the log lines that came so far.
    pub fn drain(&mut self) {
        while let Ok(l) = self.stderr.try_recv() {
            self.log.push(l);
        }
    }

    /// Still running (not killed by a signal, not exited)?
    pub fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Waits for the exit (an `audit` that ends by itself) however long it takes; returns
    /// the exit status, stdout and the whole log.
    pub fn finish(mut self) -> (ExitStatus, String, Vec<String>) {
        let st = self.child.wait().expect("wait agent");
        self.collect(st)
    }

    /// Waits for the exit, at most `timeout` (then SIGKILL and panic with the log).
    pub fn finish_within(self, timeout: Duration) -> (ExitStatus, String, Vec<String>) {
        match self.try_finish_within(timeout) {
            Ok(r) => r,
            Err((e, log)) => panic!("{e}; log:\n{}", log.join("\n")),
        }
    }

    /// [`AgentProcess::finish_within`] that reports instead of panicking: the error and the
    /// log, once the agent is killed.
    #[allow(clippy::type_complexity)]
    pub fn try_finish_within(
        mut self,
        timeout: Duration,
    ) -> Result<(ExitStatus, String, Vec<String>), (AgentError, Vec<String>)> {
        let end = Instant::now() + timeout;
        let st = loop {
            match self.child.try_wait() {
                Ok(Some(st)) => break st,
                Ok(None) => {}
                Err(e) => return Err((AgentError::Wait(e), self.kill_and_log())),
            }
            if Instant::now() > end {
                return Err((AgentError::NoExit(timeout), self.kill_and_log()));
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        Ok(self.collect(st))
    }

    /// [`AgentProcess::try_finish_within`] that also returns what the agent used, as
    /// `wait4(2)` reports it (CPU time, peak RSS): for the benchmarks of `cargo xtask
    /// torture`.
    #[allow(clippy::type_complexity)]
    pub fn try_finish_measured_within(
        mut self,
        timeout: Duration,
    ) -> Result<(ExitStatus, String, Vec<String>, libc::rusage), (AgentError, Vec<String>)> {
        use std::os::unix::process::ExitStatusExt;
        let end = Instant::now() + timeout;
        let pid = self.pid();
        loop {
            let mut status = 0;
            // SAFETY: an all-zero rusage is a valid value for wait4 to overwrite.
            let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
            // SAFETY: our own child, not reaped yet (the `Child` has not been waited for
            // since it exited: try_wait/wait are only called on the other paths); valid
            // out pointers. Once reaped here, the `Child`'s own waits fail with ECHILD,
            // which `Drop` takes for "not running".
            let r = unsafe { libc::wait4(pid, &mut status, libc::WNOHANG, &mut ru) };
            if r == pid {
                let (st, out, log) = self.collect(ExitStatus::from_raw(status));
                return Ok((st, out, log, ru));
            }
            if r < 0 {
                let e = std::io::Error::last_os_error();
                return Err((AgentError::Wait(e), self.kill_and_log()));
            }
            if Instant::now() > end {
                return Err((AgentError::NoExit(timeout), self.kill_and_log()));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// SIGKILL, reap, and the whole log.
    fn kill_and_log(&mut self) -> Vec<String> {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.drain();
        std::mem::take(&mut self.log)
    }

    /// stdout to its end and the rest of stderr, once the agent has exited with `st`.
    fn collect(&mut self, st: ExitStatus) -> (ExitStatus, String, Vec<String>) {
        let out = self
            .stdout
            .take()
            .map(|h| h.join().unwrap_or_default())
            .unwrap_or_default();
        while let Ok(l) = self.stderr.recv_timeout(Duration::from_millis(200)) {
            self.log.push(l);
        }
        (st, out, std::mem::take(&mut self.log))
    }

    /// SIGTERM, then the exit within `timeout` (see [`AgentProcess::finish_within`]).
    pub fn terminate(self, timeout: Duration) -> (ExitStatus, String, Vec<String>) {
        self.signal(libc::SIGTERM);
        self.finish_within(timeout)
    }

    /// SIGINT (an `audit` reports then, as at the end of its window), then the exit within
    /// `timeout` (see [`AgentProcess::finish_within`]).
    pub fn interrupt(self, timeout: Duration) -> (ExitStatus, String, Vec<String>) {
        self.signal(libc::SIGINT);
        self.finish_within(timeout)
    }

    /// [`AgentProcess::finish`] of an `audit --json`: its exit status, its report (panics
    /// with the log if it is not JSON) and the whole log.
    pub fn finish_audit(self) -> (ExitStatus, Value, Vec<String>) {
        let (st, out, log) = self.finish();
        (st, parse_audit(&out, &log), log)
    }

    /// [`AgentProcess::interrupt`] of an `audit --json`: its report as
    /// [`AgentProcess::finish_audit`] gives it.
    pub fn interrupt_audit(self, timeout: Duration) -> (ExitStatus, Value, Vec<String>) {
        let (st, out, log) = self.interrupt(timeout);
        (st, parse_audit(&out, &log), log)
    }

    /// SIGTERM and wait, ignoring what it printed.
    pub fn stop(mut self) {
        self.signal(libc::SIGTERM);
        let _ = self.child.wait();
    }

    /// The `/metrics` address from the `serving /metrics` log line (`--json-log`).
    pub fn metrics_addr(&mut self) -> SocketAddr {
        let l = match self.log.iter().find(|l| l.contains("serving /metrics")) {
            Some(l) => l.clone(),
            None => self.wait_line(Duration::from_secs(10), |l| l.contains("serving /metrics")),
        };
        let v: Value = serde_json::from_str(&l).expect("JSON log line");
        v["fields"]["addr"]
            .as_str()
            .expect("addr field")
            .parse()
            .expect("socket address")
    }
}

impl Drop for AgentProcess {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            // It may be stopped: continue it first.
            self.signal(libc::SIGCONT);
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// A JSON log line's fields, if it is a finding of `kind` for `pid`.
pub fn finding_line(l: &str, kind: &str, pid: u32) -> Option<Value> {
    let v: Value = serde_json::from_str(l).ok()?;
    let f = v.get("fields")?;
    (f.get("kind")?.as_str()? == kind && f.get("pid")?.as_u64()? == u64::from(pid))
        .then(|| f.clone())
}

/// An `audit --json` report; panics with it and the agent's `log` if it is not JSON.
pub fn parse_audit(out: &str, log: &[String]) -> Value {
    serde_json::from_str(out).unwrap_or_else(|e| {
        panic!(
            "audit --json output is not JSON ({e}):\n{out}\nlog:\n{}",
            log.join("\n")
        )
    })
}

/// The report's row of process `pid` (panics with the report if missing).
pub fn audit_process(audit: &Value, pid: u32) -> &Value {
    audit["processes"]
        .as_array()
        .expect("processes")
        .iter()
        .find(|p| p["pid"] == pid)
        .unwrap_or_else(|| panic!("pid {pid} not in audit:\n{audit:#}"))
}

/// Every finding of the report.
pub fn audit_findings(audit: &Value) -> &Vec<Value> {
    audit["findings"].as_array().expect("findings")
}

/// The report's findings about process `pid`.
pub fn audit_findings_for(audit: &Value, pid: u32) -> Vec<&Value> {
    audit_findings(audit)
        .iter()
        .filter(|f| f["pid"] == pid)
        .collect()
}

/// `GET /metrics` at `addr` within `timeout`: the whole HTTP/1.0 response (status line,
/// headers, body), or what failed.
pub fn get_metrics(addr: SocketAddr, timeout: Duration) -> Result<String, String> {
    let mut s = TcpStream::connect_timeout(&addr, timeout).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(timeout))
        .map_err(|e| e.to_string())?;
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n")
        .map_err(|e| e.to_string())?;
    let mut out = String::new();
    s.read_to_string(&mut out).map_err(|e| e.to_string())?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finding_lines_match_kind_and_pid_only() {
        let l = r#"{"fields":{"kind":"bypass","pid":42,"bytes":7}}"#;
        assert_eq!(finding_line(l, "bypass", 42).unwrap()["bytes"], 7);
        assert!(finding_line(l, "bypass", 43).is_none());
        assert!(finding_line(l, "tamper", 42).is_none());
        assert!(finding_line("hami-agent: ready", "bypass", 42).is_none());
    }

    #[test]
    fn audit_rows_and_findings_by_pid() {
        let a: Value = serde_json::from_str(
            r#"{"processes":[{"pid":1,"verdict":"ok"},{"pid":2,"verdict":"bypass"}],
                "findings":[{"pid":2,"kind":"bypass"},{"pid":3,"kind":"tamper"}]}"#,
        )
        .unwrap();
        assert_eq!(audit_process(&a, 2)["verdict"], "bypass");
        assert_eq!(audit_findings(&a).len(), 2);
        assert_eq!(audit_findings_for(&a, 2)[0]["kind"], "bypass");
        assert!(audit_findings_for(&a, 1).is_empty());
    }

    /// `/bin/sh -c SCRIPT` standing in for the agent.
    fn sh(script: &str) -> AgentCommand {
        AgentCommand::new("/bin/sh").args(["-c", script, "sh"])
    }

    #[test]
    fn a_command_runs_to_its_end_with_libcuda_last_and_no_ld_preload() {
        let out = sh(r#"echo "$*"; echo "${LD_PRELOAD-unset} $X"; echo err >&2; exit 3"#)
            .libcuda("/drv/libcuda.so.1")
            .arg("a")
            .env("LD_PRELOAD", "/nonexistent/libx.so")
            .env("X", "1")
            .env("Y", "2")
            .env_remove("Y")
            .output();
        assert_eq!(out.code(), Some(3), "{out:?}");
        assert_eq!(
            out.stdout_text(),
            "a --libcuda /drv/libcuda.so.1\nunset 1\n",
            "{out:?}"
        );
        assert_eq!(out.stderr_text(), "err\n");
        assert!(format!("{out:?}").contains("stderr: \"err\\n\""), "{out:?}");
        // A `--libcuda` taken back, a group of its own.
        let out = sh(r#"echo "$*"; ps -o pgid= -p $$"#)
            .libcuda("/x")
            .no_libcuda()
            .own_group()
            .output();
        let text = out.stdout_text();
        let mut lines = text.lines();
        assert_eq!(lines.next(), Some(""), "{out:?}");
        assert_eq!(
            lines.next().map(str::trim),
            Some(out.pid.to_string().as_str())
        );
    }

    #[test]
    #[should_panic(expected = "still running after")]
    fn a_command_still_running_past_its_bound_panics() {
        // `sleep` keeps stderr open after `sh` is killed: the panic does not wait for it.
        sh("echo started >&2; sleep 20; true").output_within(Duration::from_millis(300));
    }

    #[test]
    fn a_spawned_command_is_read_line_by_line() {
        let mut p = sh("echo one >&2; echo hami-agent: ready >&2; echo report").spawn();
        let l = p.wait_line(Duration::from_secs(10), |l| l.contains(READY_LINE));
        assert_eq!(l, READY_LINE);
        assert_eq!(p.log(), ["one", READY_LINE]);
        let (st, out, log) = p.finish_within(Duration::from_secs(10));
        assert!(st.success());
        assert_eq!(out, "report\n");
        assert_eq!(log, ["one", READY_LINE]);
        let mut p = sh("echo one >&2").spawn();
        assert!(matches!(
            p.try_wait_line(Duration::from_secs(10), |l| l == "two"),
            Err(AgentError::Exited(_))
        ));
    }

    #[test]
    fn a_measured_finish_gives_the_status_the_report_and_the_cpu_used() {
        let mut c = Command::new("/bin/sh");
        // Busy for a while after ready, so its CPU time cannot be 0.
        c.args([
            "-c",
            "echo one >&2; echo hami-agent: ready >&2; i=0; \
             while [ $i -lt 200000 ]; do i=$((i+1)); done; echo report; exit 2",
        ]);
        let mut seen = Vec::new();
        let p = AgentProcess::try_spawn_within(c, Duration::from_secs(10), |l| {
            seen.push(l.to_string())
        })
        .unwrap();
        assert_eq!(seen, ["one", READY_LINE]);
        let (st, out, log, ru) = p
            .try_finish_measured_within(Duration::from_secs(60))
            .unwrap_or_else(|(e, log)| panic!("{e}: {log:?}"));
        assert_eq!(st.code(), Some(2));
        assert_eq!(out, "report\n");
        assert_eq!(log, ["one", READY_LINE]);
        let cpu = ru.ru_utime.tv_sec * 1_000_000 + ru.ru_utime.tv_usec;
        assert!(cpu > 0, "no CPU time reported");
        assert!(ru.ru_maxrss > 0);
        // One that does not end in time is killed and reported.
        let mut c = Command::new("/bin/sh");
        c.args(["-c", "echo hami-agent: ready >&2; exec sleep 30"]);
        let p = AgentProcess::try_spawn_within(c, Duration::from_secs(10), |_| {}).unwrap();
        let t = Instant::now();
        let e = p.try_finish_measured_within(Duration::from_millis(200));
        assert!(matches!(e, Err((AgentError::NoExit(_), _))));
        assert!(t.elapsed() < Duration::from_secs(20));
    }

    #[test]
    #[should_panic(expected = "not JSON")]
    fn a_report_that_is_not_json_panics_naming_it() {
        parse_audit("oops", &["log line".into()]);
    }
}
