//! [`AgentProcess`]: the one driver of a running `hami-agent` (`run` or `audit`) used by the
//! agent's tests and by `cargo xtask demo` / `torture`: start it against a sandbox's fake
//! driver, wait for its `ready` line, read its log lines (findings among them), its
//! `/metrics` and its `audit --json` report, stop it. Plus [`serial`], the one lock that
//! keeps agent tests from running at the same time, and the parsers of what the agent prints
//! ([`finding_line`], [`parse_audit`], [`audit_process`], [`audit_findings_for`]).
//!
//! The agent's binary is the caller's to name (`env!("CARGO_BIN_EXE_hami-agent")` in
//! hami-user's tests, the one xtask built): the harness does not build it.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::{Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::process::{forward_lines, require_root};
use crate::sandbox::TestEnv;
use crate::Artifacts;

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

impl AgentProcess {
    /// Starts `bin ARGS... --libcuda <fake>` against the sandbox's fake driver (its state
    /// file; its own copy of the fake libcuda when `env` is shared with other users), finding
    /// the fake NVML on `LD_LIBRARY_PATH`, and waits for its `ready` line. Needs root.
    pub fn start(bin: impl AsRef<Path>, env: &TestEnv, args: &[&str]) -> AgentProcess {
        AgentProcess::start_with_libs(bin, env, args, Some(&Artifacts::get().fake_lib_dir))
    }

    /// [`AgentProcess::start`] with `LD_LIBRARY_PATH=lib_dir` (where it finds NVML, or not);
    /// `None` removes `LD_LIBRARY_PATH` (a node without NVML).
    pub fn start_with_libs(
        bin: impl AsRef<Path>,
        env: &TestEnv,
        args: &[&str],
        lib_dir: Option<&Path>,
    ) -> AgentProcess {
        require_root();
        let a = Artifacts::get();
        let libcuda = env
            .shared()
            .map_or(a.fake_libcuda.clone(), |s| s.lib_dir.join("libcuda.so.1"));
        let mut cmd = Command::new(bin.as_ref());
        match lib_dir {
            Some(d) => cmd.env("LD_LIBRARY_PATH", d),
            None => cmd.env_remove("LD_LIBRARY_PATH"),
        };
        cmd.args(args)
            .arg("--libcuda")
            .arg(&libcuda)
            .env("FAKE_CUDA_STATE", env.state_path());
        AgentProcess::spawn(cmd)
    }

    /// Spawns a prepared agent command (its arguments and environment set by the caller;
    /// `LD_PRELOAD` removed, stdin null, stdout and stderr piped here) and waits for its
    /// `ready` line.
    pub fn spawn(cmd: Command) -> AgentProcess {
        let mut agent = AgentProcess::spawn_only(cmd).unwrap_or_else(|e| panic!("{e}"));
        agent.wait_line(READY_TIMEOUT, |l| l.contains(READY_LINE));
        agent
    }

    /// [`AgentProcess::spawn`] that reports instead of panicking, showing `on_line` every
    /// line logged before `ready` (the ready line included).
    pub fn try_spawn(
        cmd: Command,
        mut on_line: impl FnMut(&str),
    ) -> Result<AgentProcess, AgentError> {
        let mut agent = AgentProcess::spawn_only(cmd)?;
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            let l = agent.next_line(deadline)?;
            on_line(&l);
            if l.contains(READY_LINE) {
                return Ok(agent);
            }
        }
    }

    /// Starts the agent, its stderr forwarded and its stdout read by a thread.
    fn spawn_only(mut cmd: Command) -> Result<AgentProcess, AgentError> {
        let mut child = cmd
            .env_remove("LD_PRELOAD")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|source| AgentError::Spawn {
                program: cmd.get_program().to_string_lossy().into_owned(),
                source,
            })?;
        let stderr = forward_lines(child.stderr.take().expect("stderr"));
        let mut out = child.stdout.take().expect("stdout");
        let stdout = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = out.read_to_string(&mut s);
            s
        });
        Ok(AgentProcess {
            child,
            stderr,
            stdout: Some(stdout),
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
        let end = Instant::now() + timeout;
        loop {
            match self.next_line(end) {
                Ok(l) if pred(&l) => return l,
                Ok(_) => {}
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

/// Waits (at most [`READY_TIMEOUT`]) for the `ready` line of an agent whose stderr lines
/// come on `rx`, for callers that drive the [`Child`] themselves; returns the lines read,
/// or kills the agent and panics with them.
pub fn wait_ready(child: &mut Child, rx: &Receiver<String>) -> Vec<String> {
    let end = Instant::now() + READY_TIMEOUT;
    let mut log = Vec::new();
    loop {
        let l = match rx.recv_timeout(end.saturating_duration_since(Instant::now())) {
            Ok(l) => l,
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                panic!("no ready line ({e}); log:\n{}", log.join("\n"));
            }
        };
        let ready = l.contains(READY_LINE);
        log.push(l);
        if ready {
            return log;
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

    #[test]
    #[should_panic(expected = "not JSON")]
    fn a_report_that_is_not_json_panics_naming_it() {
        parse_audit("oops", &["log line".into()]);
    }
}
