//! Small helpers shared by the tasks (running commands, the one `apt-get install` step).

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{bail, Context, Result};

/// The workspace root (the parent of `xtask/`).
pub fn project_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives one level below the workspace root")
        .to_path_buf()
}

/// `PATH` with the project's tools dir (`.tools/bin`, where setup installs bpf-linker) first.
pub fn tools_path(root: &Path) -> OsString {
    let mut paths = vec![root.join(".tools").join("bin")];
    if let Some(old) = std::env::var_os("PATH") {
        paths.extend(std::env::split_paths(&old));
    }
    std::env::join_paths(paths).unwrap_or_else(|_| std::env::var_os("PATH").unwrap_or_default())
}

/// A `cargo` command run in the workspace root with the tools dir on `PATH`.
pub fn cargo(root: &Path) -> Command {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(root).env("PATH", tools_path(root));
    cmd
}

/// Run a command, inheriting stdio; fail with the command line if it fails.
pub fn run_checked(cmd: &mut Command) -> Result<()> {
    let shown = format!("{cmd:?}");
    let status = cmd
        .status()
        .with_context(|| format!("could not start {shown}"))?;
    if !status.success() {
        bail!("{shown} failed with {status}");
    }
    Ok(())
}

/// Run a command, echoing it; fail with its name if it cannot start or fails.
pub fn run_echo(cmd: &mut Command, what: &str) -> Result<()> {
    println!("setup:   $ {}", show(cmd));
    let status = cmd.status().with_context(|| {
        format!(
            "cannot run `{}` ({what})",
            cmd.get_program().to_string_lossy()
        )
    })?;
    if !status.success() {
        bail!("`{}` failed with {status} ({what})", show(cmd));
    }
    Ok(())
}

/// Run a command quietly and return its trimmed stdout if it succeeded.
pub fn output_of(cmd: &mut Command) -> Option<String> {
    let out = cmd
        .stderr(Stdio::null())
        .stdin(Stdio::null())
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// A command line as a shell would show it (its set environment variables first).
fn show(cmd: &Command) -> String {
    let mut s = String::new();
    for (k, v) in cmd.get_envs() {
        if let Some(v) = v {
            s.push_str(&format!("{}={} ", k.to_string_lossy(), v.to_string_lossy()));
        }
    }
    s.push_str(&cmd.get_program().to_string_lossy());
    for a in cmd.get_args() {
        s.push(' ');
        s.push_str(&a.to_string_lossy());
    }
    s
}

/// `apt-get install` of `pkgs` (after one `apt-get update`), or a clear error off Debian: the
/// one install step of every `setup` step that needs Debian packages (the cross toolchain's
/// in `cross.rs` too).
pub fn apt_install(pkgs: &[&str], why: &str) -> Result<()> {
    if output_of(Command::new("apt-get").arg("--version")).is_none() {
        bail!(
            "{} missing and this is not a Debian/Ubuntu system (no apt-get): install them ({why})",
            pkgs.join(", ")
        );
    }
    println!(
        "setup:   installing {} with apt-get ({why})",
        pkgs.join(" ")
    );
    run_echo(
        Command::new("apt-get").arg("update").arg("-q"),
        "refreshing the apt package lists",
    )?;
    run_echo(
        Command::new("apt-get")
            .env("DEBIAN_FRONTEND", "noninteractive")
            .args(["install", "-y", "-q", "--no-install-recommends"])
            .args(pkgs),
        why,
    )
}

/// The test-name filter of the compute-share tests (`hami-preload`'s `compute::` module of its
/// test binary; the other crates' `compute::` tests come along, cheaply): run in a pass of
/// their own by `cargo xtask test` and its glibc 2.31 pass.
pub const COMPUTE_TESTS: &str = "compute::";
