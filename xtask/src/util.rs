//! Small helpers shared by the tasks.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;

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
