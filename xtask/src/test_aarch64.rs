//! `cargo xtask test --target aarch64`: the aarch64 builds of the preload, the fake driver and
//! NVML, the C test programs and the agent, and a subset of their tests run under qemu-user
//! (see [`crate::cross`] for the toolchain and the emulator). `.ci/run` calls it after
//! `cargo xtask test`; it takes about 8 minutes from clean on 2 cores (docs/contributing.md).
//!
//! What runs, in order (each step printed with its time):
//!
//! 1. a C hello world for aarch64 started directly (binfmt_misc works, `char` is unsigned);
//! 2. the cross build (std from source): hami-common, the preload, the fakes, the agent
//!    (its `build.rs` builds the eBPF object with `bpf_target_arch = "aarch64"`);
//! 3. hami-common's unit tests (the region layout's offset tests among them), the preload's
//!    unit tests, the preload's multi-process tests ([`PRELOAD_TESTS`]), the agent's unit
//!    tests, each under qemu, minus [`SKIPPED`] (every skip has its reason);
//! 4. the short torture profile's preload scenarios ([`TORTURE_SCENARIOS`]): the host's
//!    xtask drives aarch64 workloads, preload and fake driver (through binfmt_misc) and
//!    checks their regions natively, which also proves that an x86-64 reader and an aarch64
//!    writer agree on every byte of the layout.

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result};

use crate::cross::{check_emulation, cross_env, nightly_cargo, nightly_cargo_path, CrossTarget};
use crate::torture::Scenario;
use crate::util::{project_root, run_checked};

/// The preload's integration tests run under qemu (the multi-process ones: region sharing
/// between processes, the hooks through `dlsym`/`cuGetProcAddress`, limits, configuration).
pub const PRELOAD_TESTS: &[&str] = &[
    "processes",
    "multiuser",
    "hooks",
    "limits",
    "alloc_path",
    "config",
    "refusals",
    "bad_inputs",
];

/// Tests not run under qemu, as `(crate, name filter, reason)`.
pub const SKIPPED: &[(&str, &str, &str)] = &[
    (
        "hami-common",
        "region::tests::sigkill_while_holding_the_lock_is_recovered_exactly",
        "qemu-user does not implement set_robust_list: the kernel never marks a dead \
         holder's robust mutex owner-died (real arm64 kernels do; the preload's stale-lock \
         break, which these tests leave off, still recovers, see the torture kill storm)",
    ),
    (
        "hami-common",
        "region::tests::processes_sigkilled_in_a_loop_never_block_others_and_are_reclaimed",
        "same: relies on the kernel's robust-futex owner-died mark",
    ),
    (
        "hami-preload",
        "gate::tests::",
        "the launch gate's simulations are architecture-neutral arithmetic and take minutes \
         under emulation (they run natively in `cargo xtask test`)",
    ),
];

/// The torture scenarios run with aarch64 workloads (the short profile's preload side).
pub const TORTURE_SCENARIOS: &[Scenario] = &[
    Scenario::Storm,
    Scenario::Stops,
    Scenario::Race,
    Scenario::Bad,
];

/// Run the aarch64 pass.
pub fn test(t: CrossTarget) -> Result<()> {
    let root = project_root();
    let start = Instant::now();
    crate::setup::setup().context("setup failed")?;

    timed("an aarch64 hello world under qemu-user (binfmt_misc)", || {
        check_emulation(t, &crate::bundle::target_dir(&root).join("cross-check"))
    })?;

    let crates = ["hami-common", "hami-preload", "fake-cuda", "fake-nvml", "hami-user"];
    timed("cross build (std from source, eBPF for aarch64)", || {
        let mut c = nightly_cargo(&root, t, "build")?;
        for p in crates {
            c.args(["-p", p]);
        }
        c.args(["--features", "hami-common/std", "--lib", "--bins"]);
        run_checked(&mut c)
    })?;

    timed("hami-common unit tests (region layout offsets) under qemu", || {
        cargo_test(&root, t, "hami-common", &["--features", "std", "--lib"])
    })?;
    timed("hami-preload unit tests under qemu", || {
        cargo_test(&root, t, "hami-preload", &["--lib"])
    })?;
    timed("hami-preload multi-process tests under qemu", || {
        let mut args = Vec::new();
        for name in PRELOAD_TESTS {
            args.extend(["--test", name]);
        }
        cargo_test(&root, t, "hami-preload", &args)
    })?;
    timed("hami-user (agent) unit tests under qemu", || {
        cargo_test(&root, t, "hami-user", &["--lib"])
    })?;
    timed("torture (short profile, preload scenarios) with aarch64 workloads", || {
        torture(&root, t)
    })?;
    eprintln!(
        "\n==> xtask test --target {}: all passed in {:.0} s",
        t.triple(),
        start.elapsed().as_secs_f64()
    );
    Ok(())
}

fn timed(what: &str, f: impl FnOnce() -> Result<()>) -> Result<()> {
    eprintln!("\n==> xtask test --target aarch64: {what}");
    let t0 = Instant::now();
    f().with_context(|| format!("aarch64: {what}"))?;
    eprintln!("==> {what}: {:.0} s", t0.elapsed().as_secs_f64());
    Ok(())
}

/// `cargo test -p <krate> <args> -- --skip ...` for the target (run under qemu by cargo's
/// runner).
fn cargo_test(root: &Path, t: CrossTarget, krate: &str, args: &[&str]) -> Result<()> {
    let mut c = nightly_cargo(root, t, "test")?;
    c.args(["-p", krate]).args(args).arg("--");
    for (k, filter, _) in SKIPPED {
        if *k == krate {
            c.args(["--skip", filter]);
        }
    }
    run_checked(&mut c)
}

/// The host's xtask running the torture scenarios against the aarch64 artifacts
/// (`HAMI_TEST_TARGET`): the harness builds them with the nightly cargo and the cross
/// environment, and their processes run under qemu through binfmt_misc.
fn torture(root: &Path, t: CrossTarget) -> Result<()> {
    let me = std::env::current_exe().context("the running xtask's path")?;
    for s in TORTURE_SCENARIOS {
        let name = clap::ValueEnum::to_possible_value(s)
            .map(|v| v.get_name().to_string())
            .context("scenario name")?;
        let mut c = Command::new(&me);
        c.current_dir(root)
            .args(["torture", "--only", &name])
            .env(
                hami_test_harness::artifacts::ENV_TEST_TARGET,
                t.triple(),
            )
            .env("CARGO", nightly_cargo_path()?)
            .env("PATH", crate::util::tools_path(root));
        for (k, v) in cross_env(t) {
            c.env(k, v);
        }
        run_checked(&mut c)?;
    }
    Ok(())
}
