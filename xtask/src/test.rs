//! `cargo xtask test`: setup (if needed), build everything, run every test, the preload's
//! integration tests a second time under glibc 2.31 (`test_old_glibc.rs`), then the short
//! profile of `cargo xtask torture`.
//!
//! The eBPF tests load programs into the kernel and need root (CI runs as root); they are
//! never skipped: without root they fail with an error that says so.

use std::path::Path;

use anyhow::{Context, Result};

use crate::util::{cargo, project_root, run_checked};

/// Options of `cargo xtask test`.
#[derive(Debug, Default)]
pub struct TestOptions {
    /// Skip `cargo xtask circles` and `cargo clippy --workspace --all-targets -- -D warnings`
    /// (run by default).
    pub no_lint: bool,
    /// Extra arguments passed to `cargo test` (after `--workspace`).
    pub cargo_args: Vec<String>,
}

/// Run the whole test suite.
/// Runs everything CI runs: formatting, the build, the circle, layer and size checks, clippy, the
/// workspace's tests, the preload's under an old glibc, the short torture profile and the
/// GPU runner's unit tests.
pub fn test(opts: &TestOptions) -> Result<()> {
    let root = project_root();
    crate::setup::setup().context("setup failed")?;

    step("cargo fmt --check");
    run_checked(cargo(&root).args(["fmt", "--all", "--", "--check"]))
        .context("formatting differs: run `cargo fmt --all`")?;

    step("build (workspace, eBPF included)");
    run_checked(cargo(&root).args(["build", "--workspace", "--all-targets"]))?;

    if !opts.no_lint {
        step("no circle between the files of a crate (cargo xtask circles)");
        crate::circles::check(&root)?;
        step("no import up a layer of hami-preload (cargo xtask circles)");
        crate::layers::check(&root)?;
        step("no source file over its size (cargo xtask circles)");
        crate::sizes::check(&root)?;

        step("cargo clippy");
        run_checked(cargo(&root).args([
            "clippy",
            "--workspace",
            "--all-targets",
            "--",
            "-D",
            "warnings",
        ]))?;
    }

    if opts.cargo_args.is_empty() {
        // The compute-share tests time a fake device against the wall clock: they run in a
        // pass of their own, as when they were a test binary of their own, not beside the
        // other tests of the preload's one binary (which load the 2 cores with processes).
        step("cargo test (workspace, all but the compute-share tests)");
        run_checked(cargo(&root).args([
            "test",
            "--workspace",
            "--",
            "--skip",
            crate::util::COMPUTE_TESTS,
        ]))?;
        step("cargo test (workspace, the compute-share tests alone)");
        run_checked(cargo(&root).args(["test", "--workspace", "--", crate::util::COMPUTE_TESTS]))?;
    } else {
        step("cargo test (workspace)");
        let mut cmd = cargo(&root);
        cmd.args(["test", "--workspace"]).args(&opts.cargo_args);
        run_checked(&mut cmd)?;
    }

    step("the preload's integration tests under glibc 2.31");
    crate::test_old_glibc::test(&root)?;

    step("cargo xtask torture (short profile)");
    crate::torture::torture(&crate::torture::TortureOptions::default())
        .context("the torture scenarios failed")?;

    python_tests(&root)?;
    step("all tests passed");
    Ok(())
}

/// The GPU runner's own unit tests (pure Python, no GPU needed).
fn python_tests(root: &Path) -> Result<()> {
    let tests = root.join("gpu").join("test_runner.py");
    if !tests.exists() {
        return Ok(());
    }
    step("python3 -m unittest gpu/test_runner.py");
    let mut cmd = std::process::Command::new("python3");
    cmd.current_dir(root.join("gpu"))
        .args(["-m", "unittest", "-v", "test_runner"]);
    run_checked(&mut cmd).context("the GPU runner's unit tests failed (python3 needed)")
}

fn step(what: &str) {
    eprintln!("\n==> xtask test: {what}");
}
