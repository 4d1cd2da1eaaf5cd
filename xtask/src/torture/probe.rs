//! Running `cudaprobe` in a sandbox, killed after a wait ([`run_probe`], [`run_ops`],
//! [`run_ops_as`]): what the bad-input cases and the stopped-holder variants read.

use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use hami_test_harness::TestEnv;

use super::worker::field;

/// What one `cudaprobe` run gave.
pub(super) struct ProbeRun {
    /// rc of the `alloc` op.
    pub(super) rc: Option<i32>,
    pub(super) exited_cleanly: bool,
    pub(super) stdout: String,
    pub(super) stderr: String,
}

/// `cudaprobe init ctx alloc 2M EXTRA...` under `env`, killed after `wait`.
pub(super) fn run_probe(env: &TestEnv, extra: &[&str], wait: Duration) -> Result<ProbeRun> {
    let mut ops = vec!["init", "ctx", "alloc", "2M"];
    ops.extend_from_slice(extra);
    run_ops(env, &ops, wait)
}

/// `cudaprobe OPS...` under `env`, killed after `wait`; `rc` = that of the first `alloc`.
pub(super) fn run_ops(env: &TestEnv, ops: &[&str], wait: Duration) -> Result<ProbeRun> {
    run_ops_as(env, ops, wait, None)
}

/// [`run_ops`] as user and group `uid` (None: as ourselves).
pub(super) fn run_ops_as(
    env: &TestEnv,
    ops: &[&str],
    wait: Duration,
    uid: Option<u32>,
) -> Result<ProbeRun> {
    let mut c: Command = env.cudaprobe_cmd(ops);
    if let Some(u) = uid {
        use std::os::unix::process::CommandExt;
        c.uid(u).gid(u);
    }
    let mut child = c.spawn().context("starting cudaprobe")?;
    let mut so = child.stdout.take().context("stdout")?;
    let mut se = child.stderr.take().context("stderr")?;
    let ho = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut so, &mut s);
        s
    });
    let he = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut se, &mut s);
        s
    });
    let t0 = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait()? {
            break s;
        }
        if t0.elapsed() > wait {
            let _ = child.kill();
            let _ = child.wait();
            bail!("cudaprobe did not finish within {wait:?} (hang)");
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let stdout = ho.join().unwrap_or_default();
    let stderr = he.join().unwrap_or_default();
    let rc = stdout
        .lines()
        .find(|l| l.starts_with("op=alloc "))
        .and_then(|l| field(l, "rc"))
        .map(|v| v as i32);
    Ok(ProbeRun {
        rc,
        exited_cleanly: status.code().is_some(),
        stdout,
        stderr,
    })
}
