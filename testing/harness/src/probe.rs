//! `cudaprobe`'s output: [`OpLine`] (one `op=NAME key=value ... rc=N` line per operation),
//! [`ProbeOutput`] (a finished probe) and [`RunningProbe`] (a probe still running, e.g.
//! blocked in `wait`, read line by line).

use std::collections::BTreeMap;
use std::io::Write;
use std::process::{Child, ChildStdin, Command, ExitStatus, Output, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::Duration;

use crate::lines::{parse_num, KvLine};
use crate::process::forward_lines;

/// How long [`RunningProbe`] waits for a line before panicking.
pub const LINE_TIMEOUT: Duration = Duration::from_secs(60);

/// One output line of `cudaprobe`: `op=NAME key=value ... rc=N name=CUDA_...`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpLine {
    /// The `op` field.
    pub op: String,
    /// All `key=value` fields (including `op`, `rc`, `name`).
    pub fields: BTreeMap<String, String>,
    /// The raw line.
    pub raw: String,
}

impl OpLine {
    /// Parses a `key=value ...` line; `None` if it has no `op` field.
    pub fn parse(line: &str) -> Option<OpLine> {
        let KvLine { fields, raw, .. } = KvLine::parse(line)?;
        let op = fields.get("op")?.clone();
        Some(OpLine { op, fields, raw })
    }

    /// A field's text.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.fields.get(key).map(String::as_str)
    }

    /// A numeric field (decimal or `0x` hex).
    pub fn num(&self, key: &str) -> Option<u64> {
        parse_num(self.get(key)?)
    }

    /// The CUresult (`rc`), if the line has one.
    pub fn rc(&self) -> Option<i32> {
        self.get("rc").and_then(|v| v.parse().ok())
    }

    /// The CUresult's name (`name`, e.g. `CUDA_ERROR_OUT_OF_MEMORY`).
    pub fn name(&self) -> Option<&str> {
        self.get("name")
    }

    /// Whether `rc` is 0.
    pub fn ok(&self) -> bool {
        self.rc() == Some(0)
    }

    /// The `ptr` field.
    pub fn ptr(&self) -> Option<u64> {
        self.num("ptr")
    }

    /// The record index (`idx`) an allocation got, for later `free IDX`.
    pub fn idx(&self) -> Option<usize> {
        self.num("idx").map(|v| v as usize)
    }
}

/// Parsed output of a finished `cudaprobe`.
#[derive(Debug, Clone)]
pub struct ProbeOutput {
    /// The probe's pid (first line), if printed.
    pub pid: Option<u32>,
    /// The op lines, in order.
    pub ops: Vec<OpLine>,
    /// Exit status.
    pub status: ExitStatus,
    /// Full stdout.
    pub stdout: String,
    /// Full stderr.
    pub stderr: String,
}

/// Parses the `pid=` header and the op lines of `cudaprobe` output.
pub fn parse_probe_lines(stdout: &str) -> (Option<u32>, Vec<OpLine>) {
    let mut pid = None;
    let mut ops = Vec::new();
    for line in stdout.lines() {
        if let Some(o) = OpLine::parse(line) {
            ops.push(o);
        } else if let Some(rest) = line.strip_prefix("pid=") {
            pid = rest.split_whitespace().next().and_then(|p| p.parse().ok());
        }
    }
    (pid, ops)
}

impl ProbeOutput {
    /// From a finished process's output.
    pub fn from_output(out: Output) -> ProbeOutput {
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        let (pid, ops) = parse_probe_lines(&stdout);
        ProbeOutput {
            pid,
            ops,
            status: out.status,
            stdout,
            stderr,
        }
    }

    /// The `i`-th op line (panics with the whole output if missing).
    pub fn op(&self, i: usize) -> &OpLine {
        self.ops
            .get(i)
            .unwrap_or_else(|| panic!("no op line {i} in:\n{}", self.dump()))
    }

    /// All lines of op `name`.
    pub fn find(&self, name: &str) -> Vec<&OpLine> {
        self.ops.iter().filter(|o| o.op == name).collect()
    }

    /// The last line of op `name` (panics if none).
    pub fn last(&self, name: &str) -> &OpLine {
        self.ops
            .iter()
            .rev()
            .find(|o| o.op == name)
            .unwrap_or_else(|| panic!("no op={name} line in:\n{}", self.dump()))
    }

    /// The `rc` of every line that has one, in order.
    pub fn rcs(&self) -> Vec<i32> {
        self.ops.iter().filter_map(OpLine::rc).collect()
    }

    /// Whether the process exited with 0 and every op succeeded.
    pub fn all_ok(&self) -> bool {
        self.status.success() && self.ops.iter().all(|o| o.rc().is_none_or(|r| r == 0))
    }

    /// stdout and stderr, for assertion messages.
    pub fn dump(&self) -> String {
        format!(
            "status: {}\n--- stdout\n{}--- stderr\n{}",
            self.status, self.stdout, self.stderr
        )
    }
}

/// A `cudaprobe` that is still running; its stdout is read line by line in the background.
pub struct RunningProbe {
    child: Child,
    stdin: Option<ChildStdin>,
    rx: Receiver<String>,
    /// Pid of the process.
    pub pid: u32,
    /// Every line read so far (raw).
    pub seen: Vec<String>,
}

impl RunningProbe {
    /// Spawns `cmd` (stdout must be piped; stdin piped if `wait` is used).
    pub fn start(mut cmd: Command) -> RunningProbe {
        cmd.stdout(Stdio::piped());
        let mut child = cmd.spawn().expect("spawn probe");
        let stdout = child.stdout.take().expect("piped stdout");
        let stdin = child.stdin.take();
        let rx = forward_lines(stdout);
        let pid = child.id();
        RunningProbe {
            child,
            stdin,
            rx,
            pid,
            seen: Vec::new(),
        }
    }

    /// The next line, or `None` at end of output; panics after [`LINE_TIMEOUT`].
    pub fn next_line(&mut self) -> Option<String> {
        match self.rx.recv_timeout(LINE_TIMEOUT) {
            Ok(l) => {
                self.seen.push(l.clone());
                Some(l)
            }
            Err(RecvTimeoutError::Disconnected) => None,
            Err(RecvTimeoutError::Timeout) => {
                panic!(
                    "probe {} printed nothing for {LINE_TIMEOUT:?}; so far:\n{}",
                    self.pid,
                    self.seen.join("\n")
                )
            }
        }
    }

    /// Reads lines until an op line for `op` comes (returns it); panics if the output ends.
    pub fn wait_for(&mut self, op: &str) -> OpLine {
        while let Some(l) = self.next_line() {
            if let Some(o) = OpLine::parse(&l) {
                if o.op == op {
                    return o;
                }
            }
        }
        let err = self.stderr_now();
        panic!(
            "probe {} ended before op={op}; output:\n{}\nstderr:\n{err}",
            self.pid,
            self.seen.join("\n")
        )
    }

    /// Lets a probe blocked in `wait` continue (writes a line to its stdin).
    pub fn resume(&mut self) {
        if let Some(s) = self.stdin.as_mut() {
            let _ = s.write_all(b"go\n");
            let _ = s.flush();
        }
    }

    /// Sends `signal` to the process.
    pub fn signal(&self, signal: i32) {
        // SAFETY: kill(2) on a pid we spawned (and have not reaped).
        unsafe { libc::kill(self.pid as libc::pid_t, signal) };
    }

    /// SIGKILLs the process and reaps it.
    pub fn kill(mut self) -> ExitStatus {
        let _ = self.child.kill();
        self.child.wait().expect("wait probe")
    }

    fn stderr_now(&mut self) -> String {
        let mut s = String::new();
        if let Ok(Some(_)) = self.child.try_wait() {
            if let Some(mut e) = self.child.stderr.take() {
                let _ = std::io::Read::read_to_string(&mut e, &mut s);
            }
        }
        s
    }

    /// Closes stdin, waits for the exit and returns everything it printed.
    pub fn finish(mut self) -> ProbeOutput {
        drop(self.stdin.take());
        while self.next_line().is_some() {}
        let mut stderr = String::new();
        if let Some(mut e) = self.child.stderr.take() {
            let _ = std::io::Read::read_to_string(&mut e, &mut stderr);
        }
        let status = self.child.wait().expect("wait probe");
        let stdout = self
            .seen
            .iter()
            .map(|l| format!("{l}\n"))
            .collect::<String>();
        let (pid, ops) = parse_probe_lines(&stdout);
        ProbeOutput {
            pid,
            ops,
            status,
            stdout,
            stderr,
        }
    }
}

impl Drop for RunningProbe {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_op_lines() {
        let text = "pid=42 via=direct device=0\nop=alloc size=1048576 idx=3 ptr=0x100000000000 rc=0 name=CUDA_SUCCESS\nop=alloc size=1 rc=2 name=CUDA_ERROR_OUT_OF_MEMORY\n";
        let (pid, ops) = parse_probe_lines(text);
        assert_eq!(pid, Some(42));
        assert_eq!(ops.len(), 2);
        assert_eq!(ops[0].ptr(), Some(0x1000_0000_0000));
        assert_eq!(ops[0].idx(), Some(3));
        assert!(ops[0].ok());
        assert_eq!(ops[1].rc(), Some(2));
        assert_eq!(ops[1].name(), Some("CUDA_ERROR_OUT_OF_MEMORY"));
    }
}
