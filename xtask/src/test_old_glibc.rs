//! The preload's integration tests a second time under an older glibc (Debian 11's 2.31,
//! unpacked by `cargo xtask setup` into `.tools/glibc-2.31`): every process the tests start
//! through the harness runs under that glibc's loader and libraries, with the preload through
//! the loader's `--preload` (what `/etc/ld.so.preload` does in a container), the fakes and the
//! preload as built (glibc 2.17 floor) and the C programs built against glibc 2.17 by zig
//! (`hami_test_harness::glibc`). A library that needs a newer glibc fails every one of them at
//! load. x86-64 only (Debian's amd64 packages).

use std::path::Path;

use anyhow::{Context, Result};
use hami_test_harness::glibc;

use crate::util::{cargo, run_checked};

/// Tests that cannot run under another glibc's loader, as `(name filter, reason)`.
pub const SKIPPED: &[(&str, &str)] = &[(
    "nvml_procs::in_a_pid_namespace_the_lists_show_the_containers_pids_and_none_of_anothers",
    "starts the host's `unshare` (linked against the host's glibc) through the sandbox's \
     command, which then execs the probes itself: the old loader cannot run the host's \
     program, and the probes it execs would run under the host's loader anyway",
)];

/// Runs the preload's integration tests under the old glibc of `.tools/glibc-2.31`.
pub fn test(root: &Path) -> Result<()> {
    if std::env::consts::ARCH != "x86_64" {
        println!("xtask: not x86-64: no run under an old glibc");
        return Ok(());
    }
    let dir = root.join(glibc::OLD_GLIBC_DIR);
    glibc::OldGlibc::at(&dir)
        .with_context(|| format!("no old glibc in {} (cargo xtask setup)", dir.display()))?;
    // The compute-share tests in a pass of their own (see `util::COMPUTE_TESTS`).
    for compute in [false, true] {
        let mut cmd = cargo(root);
        cmd.env(glibc::ENV_OLD_GLIBC, &dir).args([
            "test",
            "-p",
            "hami-preload",
            "--test",
            "preload",
            "--",
        ]);
        if compute {
            cmd.arg(crate::util::COMPUTE_TESTS);
        } else {
            cmd.args(["--skip", crate::util::COMPUTE_TESTS]);
        }
        for (name, _) in SKIPPED {
            cmd.args(["--skip", name]);
        }
        run_pass(&mut cmd, &dir)?;
    }
    Ok(())
}

/// Runs one pass of the preload's tests under the old glibc at `dir`.
fn run_pass(cmd: &mut std::process::Command, dir: &Path) -> Result<()> {
    run_checked(cmd).with_context(|| {
        format!(
            "the preload's integration tests failed under glibc {} ({})",
            glibc::OLD_GLIBC_SUITE.1,
            dir.display()
        )
    })
}
