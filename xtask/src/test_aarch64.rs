//! `cargo xtask test --target aarch64`: the aarch64 builds of the preload, the fake driver and
//! NVML, the C test programs and the agent, and a subset of their tests run under qemu-user
//! (see [`crate::cross`] for the toolchain and the emulator). `.ci/run` calls it after
//! `cargo xtask test`; its time from clean on 2 cores is in docs/deploy.md.
//!
//! What runs, in order (each step printed with its time):
//!
//! 1. a C hello world for aarch64 started directly (binfmt_misc works, `char` is unsigned);
//! 2. the cross build (std from source) of hami-abi, hami-common, the preload and the agent
//!    with their tests (the agent's `build.rs` builds its eBPF object with `bpf_target_arch =
//!    "aarch64"`); the test harness builds the fakes and the C programs for aarch64;
//! 3. under qemu: the unit tests of hami-abi, of hami-common (the region layout's offset
//!    tests among them), of the preload and of the agent (its `arch_tests` check the embedded
//!    eBPF object against arm64's `pt_regs`), minus [`SKIPPED`], then the preload's integration
//!    tests ([`PRELOAD_TEST`]), minus [`PRELOAD_SKIPPED`] (every skip has its reason);
//! 4. the short torture profile's preload scenarios ([`TORTURE_SCENARIOS`]): the host's
//!    xtask drives aarch64 workloads, preload and fake driver (through binfmt_misc) and
//!    checks their regions natively, which also shows that an x86-64 reader and aarch64
//!    writers agree on every byte of the layout.

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use anyhow::{ensure, Context, Result};

use crate::cross::{check_emulation, cross_env, nightly_cargo, nightly_cargo_path, CrossTarget};
use crate::torture::Scenario;
use crate::util::{project_root, run_checked};

/// The crates whose tests run under qemu (the fakes are built by the test harness; `cuda-abi`'s
/// are the layouts of the driver's and NVML's structs, which the preload and the fakes share).
pub const TESTED_CRATES: &[&str] = &[
    "cuda-abi",
    "hami-abi",
    "hami-common",
    "hami-preload",
    "hami-user",
];

/// The preload's integration tests, one binary (`hami-preload/tests/preload`), run under qemu
/// minus [`PRELOAD_SKIPPED`]: the multi-process tests — region sharing between processes and
/// users, the hooks through `dlsym` and `cuGetProcAddress`, limits, contexts, modules — and the
/// regressions (among them `dlsym(RTLD_NEXT)` through the aarch64 trampoline). Run by a second
/// `cargo test` with the preload selected alone: a `--skip` filter matches a substring of every
/// binary's test names, and the preload's `compute::` would skip the agent's `compute::tests::`
/// unit tests too.
pub const PRELOAD_TEST: &str = "preload";

/// The preload's integration tests not run under qemu, as `(name filter, reason)`; the filters
/// start with the module (a file of `hami-preload/tests/preload/`) and apply to
/// [`PRELOAD_TEST`] only.
pub const PRELOAD_SKIPPED: &[(&str, &str)] = &[
    (
        "compute::",
        "every one of its multi-process tests times the device share that a real submitting \
         process reaches against wall time, and under emulation a launch's CPU side is many \
         times slower (0.23-0.40 of the device reached for 0.30-0.50 shares, an unlimited \
         process below its 0.85): they fail or pass by the machine's load, and say nothing \
         about the gate, whose arithmetic runs natively in `cargo xtask test`",
    ),
    (
        "nvml_procs::",
        "never run under qemu: left out of this pass's list of test binaries when each file \
         was its own (before issue 32), with no reason given; kept out until it has been run \
         here (its pid-namespace test starts the host's `unshare`)",
    ),
    (
        "regressions::issue_29_several_gpus::two_processes_on_two_gpus_each_get_their_own_gpus_share",
        "a compute-share test like `compute::`'s (each device's busy fraction against wall \
         time): under emulation the process reached 0.39 of device 0 at a 50 % share once it \
         shared the preload's one test binary with the other regressions (it passed alone); \
         its question, which device a submission is charged to, is answered natively",
    ),
    (
        "config::non_cuda_programs_are_untouched_and_create_nothing",
        "runs the host's own /bin/true (x86-64) with the aarch64 preload in LD_PRELOAD: ld.so \
         refuses the wrong ELF class before the test's question is asked",
    ),
];

/// Tests not run under qemu, as `(crate, name filter, reason)`. The filters are module paths
/// that exist in one crate only.
pub const SKIPPED: &[(&str, &str, &str)] = &[
    (
        "hami-common",
        "region::tests::crashes::sigkill_while_holding_the_lock_is_recovered_exactly",
        "qemu-user does not implement set_robust_list: the kernel never marks a dead \
         holder's robust mutex owner-died (real arm64 kernels do; the preload's stale-lock \
         break, which these tests leave off, still recovers, see the torture kill storm)",
    ),
    (
        "hami-common",
        "region::tests::crashes::processes_sigkilled_in_a_loop_never_block_others_and_are_reclaimed",
        "same: relies on the kernel's robust-futex owner-died mark",
    ),
    (
        "hami-user",
        "tenantfs::tests::",
        "qemu 7.2 (Debian 12's qemu-user-static) does not implement openat2(2), which the \
         agent opens every tenant file with (RESOLVE_IN_ROOT); arm64 kernels have it since 5.6",
    ),
    (
        "hami-user",
        "agent::tests::",
        "same: the agent's tick opens regions and libcuda files through openat2",
    ),
    (
        "hami-user",
        "probes::discovery::tests::a_process_with_a_driver_is_read_again_only_on_full_scans",
        "same: reads the fake processes' files through openat2",
    ),
    (
        "hami-user",
        "probes::discovery::tests::a_driver_under_the_preloads_name_is_a_driver_and_the_preload_is_not",
        "same: reads the fake process's mapped files through its root with openat2",
    ),
    (
        "hami-user",
        "probes::discovery::tests::a_maps_file_over_the_limit_is_read_only_up_to_it",
        "same: classifies the driver it finds through the fake process's root with openat2",
    ),
    (
        "hami-preload",
        "gate::tests::",
        "the launch gate's simulations are architecture-neutral arithmetic and take minutes \
         under emulation (they run natively in `cargo xtask test`)",
    ),
];

/// The torture scenarios run with aarch64 workloads (the short profile's preload side).
/// Not [`Scenario::Stops`]: under qemu-user, `MADV_PAGEOUT` does nothing (its paged-out
/// variant checks that the pages left) and a SIGKILLed lock holder gets no kernel owner-died
/// mark (no `set_robust_list`; its check asks for the kernel's recovery).
pub const TORTURE_SCENARIOS: &[Scenario] = &[Scenario::Storm, Scenario::Race, Scenario::Bad];

/// Run the aarch64 pass.
pub fn test(t: CrossTarget) -> Result<()> {
    let root = project_root();
    let start = Instant::now();
    crate::setup::setup().context("setup failed")?;

    timed(
        "an aarch64 hello world under qemu-user (binfmt_misc)",
        || check_emulation(t, &crate::bundle::target_dir(&root).join("cross-check")),
    )?;

    // One package set, one feature set for the build and the run: nothing is built twice.
    let mut args: Vec<&str> = Vec::new();
    for p in TESTED_CRATES {
        args.extend(["-p", p]);
    }
    args.extend(["--lib", "--bins"]);
    // The preload alone, hami-abi with the features the run above gives it (the agent's
    // `user`: not built again).
    let preload_args = [
        "-p",
        "hami-preload",
        "--features",
        "hami-abi/user",
        "--test",
        PRELOAD_TEST,
    ];
    timed(
        "cross build (std from source; the agent's eBPF object for aarch64)",
        || {
            for a in [&args[..], &preload_args[..]] {
                let mut c = nightly_cargo(&root, t, "test")?;
                c.args(a).arg("--no-run");
                run_checked(&mut c)?;
            }
            Ok(())
        },
    )?;
    timed(
        "unit tests of cuda-abi (struct layouts), hami-abi, hami-common (region layout offsets), the \
         preload and the agent, and the preload's multi-process tests, under qemu",
        || {
            // A skip that matches no test (a test renamed or moved to another module) would
            // let that test run and fail here, or hide that it is gone: refused first.
            for (a, skips) in [
                (&args[..], skip_filters(SKIPPED)),
                (
                    &preload_args[..],
                    PRELOAD_SKIPPED.iter().map(|(f, _)| *f).collect(),
                ),
            ] {
                let mut c = nightly_cargo(&root, t, "test")?;
                c.args(a).args(["--", "--list"]);
                let out = c.output().context("listing the aarch64 tests")?;
                ensure!(
                    out.status.success(),
                    "listing the aarch64 tests failed: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
                let stale = unmatched_skips(&String::from_utf8_lossy(&out.stdout), &skips);
                ensure!(
                    stale.is_empty(),
                    "skip filters that match no test (renamed or moved?): {stale:?}"
                );
                let mut c = nightly_cargo(&root, t, "test")?;
                c.args(a).arg("--");
                for filter in skips {
                    c.args(["--skip", filter]);
                }
                run_checked(&mut c)?;
            }
            Ok(())
        },
    )?;
    timed(
        "torture (short profile, preload scenarios) with aarch64 workloads",
        || torture(&root, t),
    )?;
    eprintln!(
        "\n==> xtask test --target {}: all passed in {:.0} s",
        t.triple(),
        start.elapsed().as_secs_f64()
    );
    Ok(())
}

/// The name filters of [`SKIPPED`].
fn skip_filters(skipped: &[(&str, &'static str, &str)]) -> Vec<&'static str> {
    skipped.iter().map(|(_, filter, _)| *filter).collect()
}

/// The `filters` that no test of a `cargo test -- --list` listing contains (the listing's
/// `NAME: test` lines; `--skip` matches a substring of the name).
fn unmatched_skips(listing: &str, filters: &[&'static str]) -> Vec<&'static str> {
    let names: Vec<&str> = listing
        .lines()
        .filter_map(|l| l.strip_suffix(": test"))
        .collect();
    filters
        .iter()
        .copied()
        .filter(|f| !names.iter().any(|n| n.contains(f)))
        .collect()
}

fn timed(what: &str, f: impl FnOnce() -> Result<()>) -> Result<()> {
    eprintln!("\n==> xtask test --target aarch64: {what}");
    let t0 = Instant::now();
    f().with_context(|| format!("aarch64: {what}"))?;
    eprintln!("==> {what}: {:.0} s", t0.elapsed().as_secs_f64());
    Ok(())
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
            .env(hami_test_harness::artifacts::ENV_TEST_TARGET, t.triple())
            .env("CARGO", nightly_cargo_path()?)
            .env("PATH", crate::util::tools_path(root));
        for (k, v) in cross_env(t) {
            c.env(k, v);
        }
        run_checked(&mut c)?;
    }
    Ok(())
}

#[cfg(test)]
mod skip_tests {
    use super::*;

    #[test]
    fn a_skip_matching_no_listed_test_is_reported() {
        // Every filter matched: a listing holding each filter inside a longer name.
        let all: String = SKIPPED
            .iter()
            .map(|(_, f, _)| format!("x::{f}y: test\n"))
            .collect();
        let filters = skip_filters(SKIPPED);
        assert!(unmatched_skips(&all, &filters).is_empty());
        // One test moved into a submodule: its old path no longer matches.
        let moved = all.replace(
            "region::tests::crashes::sigkill_while",
            "region::tests::other::sigkill_while",
        );
        assert_eq!(
            unmatched_skips(&moved, &filters),
            ["region::tests::crashes::sigkill_while_holding_the_lock_is_recovered_exactly"]
        );
        // Only `NAME: test` lines count (not benchmarks or the summary).
        let bench = all.replace(": test\n", ": benchmark\n");
        assert_eq!(unmatched_skips(&bench, &filters).len(), SKIPPED.len());
        // Each preload skip starts with a module of the preload's test binary (`mod NAME;` in
        // its `main.rs`): a module renamed or removed is found here, natively, not only by the
        // aarch64 pass's listing.
        let main = include_str!("../../hami-preload/tests/preload/main.rs");
        let modules: Vec<&str> = main
            .lines()
            .filter_map(|l| l.strip_prefix("mod ")?.strip_suffix(';'))
            .collect();
        assert!(modules.contains(&"compute"), "{modules:?}");
        for (filter, _) in PRELOAD_SKIPPED {
            let module = filter.split("::").next().unwrap_or_default();
            assert!(
                modules.contains(&module),
                "{filter}: no `mod {module};` in tests/{PRELOAD_TEST}/main.rs"
            );
        }
    }
}
