//! Short-lived bypasses (`--only short`, also in `--long`; root; issue 31): the agent test
//! `short_lived::` (`hami-user/tests/agent/short_lived.rs`) with [`PROCS`] unhooked
//! processes instead of the regular test's 50 (`HAMI_SHORT_LIVED_PROCS`): each allocates
//! 64 MiB and exits 200 ms later, a hooked one after every five; at least 99 % must be in
//! the audit as `bypass` / `no_preload` with their pid, and no hooked one. The same checks
//! as the regular test, run by the test itself; its figure line is reported here.

use std::process::Command;

use anyhow::{bail, Context, Result};

use super::report::Report;

/// Unhooked short-lived processes (the figure).
pub const PROCS: usize = 1000;

pub(super) fn short_lived(r: &mut Report) -> Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("the agent loads eBPF programs: run as root");
    }
    let out = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .current_dir(hami_test_harness::workspace_root())
        .args([
            "test",
            "-p",
            "hami-user",
            "--test",
            "agent",
            "short_lived::",
            "--",
            "--nocapture",
        ])
        .env("HAMI_SHORT_LIVED_PROCS", PROCS.to_string())
        .output()
        .context("running cargo test")?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let figure = text
        .lines()
        .find(|l| l.contains("unhooked processes reported"))
        .map(|l| l.split(" (missed").next().unwrap_or(l).to_string());
    if let Some(f) = &figure {
        r.figure(
            "short-lived unhooked processes reported as bypass",
            f.clone(),
        );
    }
    r.check(out.status.success(), || {
        let tail: Vec<&str> = text.lines().rev().take(30).collect();
        format!(
            "short-lived bypasses: the test failed ({}):\n{}",
            out.status,
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        )
    });
    Ok(())
}
