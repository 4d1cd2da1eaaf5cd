//! `cargo xtask <task>`: project tasks (see README).
//!
//! * `setup`: make a bare machine ready (nightly rust-src, bpf-linker, Debian packages).
//! * `test`: setup + build everything + every test (eBPF tests included; needs root).
//! * `bench`: benchmarks that print figures (`bench exec`: only the per-exec cost of the preload).
//! * `demo`: the end-to-end story on the fake (or real) driver.
//! * `gpu-bundle`: binaries + acceptance scripts for the GPU machine.
//! * `dist`: release agent, preload, dashboards, rules, chart, systemd unit, Dockerfile.
//! * `torture`: kill storms, stopped lock holders, races to the limit, bad inputs (figures).
//! * `fuzz`: the cargo-fuzz targets of `fuzz/`, each for a bounded time.
//! * `circles`: no two files of a crate import each other in a circle (`circles.rs`), no import
//!   up a layer of hami-preload (`layers.rs`), no file over its size (`sizes.rs`).

mod bench;
mod bench_exec;
mod bundle;
mod circles;
mod cross;
mod demo;
mod dist;
mod dist_arch;
mod fuzz;
mod layers;
mod setup;
mod sizes;
mod test;
mod test_aarch64;
mod test_old_glibc;
mod torture;
mod util;

use anyhow::Result;
use clap::{Parser, Subcommand};

/// Project tasks of hami-rs (`cargo xtask <task>`).
#[derive(Debug, Parser)]
#[command(name = "xtask", bin_name = "cargo xtask")]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Debug, Subcommand)]
enum Task {
    /// Make this machine ready (idempotent): nightly rust-src, bpf-linker, Debian packages.
    Setup,
    /// Setup + fmt + clippy + build everything + run every test + the short torture profile
    /// (root, for the eBPF tests).
    Test {
        /// Skip `cargo xtask circles` and `cargo clippy --workspace --all-targets -- -D warnings`.
        #[arg(long)]
        no_lint: bool,
        /// Instead: cross-build for this architecture and run its test subset under
        /// qemu-user (`xtask/src/test_aarch64.rs`).
        #[arg(long, value_enum)]
        target: Option<cross::CrossTarget>,
        /// Extra arguments for `cargo test --workspace` (after `--`).
        #[arg(last = true)]
        cargo_args: Vec<String>,
    },
    /// Benchmarks (prints figures; root, except `bench exec`).
    Bench {
        /// Run only this benchmark.
        #[arg(value_enum)]
        only: Option<bench::Only>,
        /// Another preload library to exec with in the same rounds as the release one (e.g.
        /// an older build), repeatable.
        #[arg(long, value_name = "SO")]
        compare: Vec<std::path::PathBuf>,
    },
    /// The whole story on the fake (or real) driver (root).
    Demo,
    /// Build the folder to carry to the GPU machine (`gpu-bundle/`).
    GpuBundle,
    /// Release agent + preload + dashboards + rules + chart + unit + Dockerfile.
    Dist,
    /// Kill storm, stopped lock holders, race to the limit, bad inputs (short profile about a
    /// minute, also run by `test`).
    Torture {
        /// The release profile (32 processes, >= 1000 kills, agent faults, fuzzing).
        #[arg(long)]
        long: bool,
        /// Run only this scenario.
        #[arg(long, value_enum)]
        only: Option<torture::Scenario>,
    },
    /// Every cargo-fuzz target for a bounded time (installs cargo-fuzz).
    Fuzz {
        /// Seconds per target.
        #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..))]
        seconds: u64,
    },
    /// Fail on two (or more) files of a crate that import each other in a circle, an import
    /// up a layer of hami-preload, or a source file over its size.
    Circles,
}

fn main() {
    let cli = Cli::parse();
    if let Err(e) = run(cli.task) {
        eprintln!("xtask: error: {e:#}");
        std::process::exit(1);
    }
}

fn run(task: Task) -> Result<()> {
    match task {
        Task::Setup => setup::setup().map(|_| ()),
        Task::Test {
            target: Some(t), ..
        } => test_aarch64::test(t),
        Task::Test {
            no_lint,
            cargo_args,
            target: None,
        } => test::test(&test::TestOptions {
            no_lint,
            cargo_args,
        }),
        Task::Bench { only, compare } => bench::bench(only, &compare),
        Task::Demo => demo::demo(),
        Task::Torture { long, only } => torture::torture(&torture::TortureOptions { long, only }),
        Task::Fuzz { seconds } => fuzz::fuzz(seconds).map(|_| ()),
        Task::GpuBundle => bundle::gpu_bundle(&util::project_root()).map(|_| ()),
        Task::Dist => dist::dist(&util::project_root()).map(|_| ()),
        Task::Circles => {
            circles::check(&util::project_root())?;
            layers::check(&util::project_root())?;
            sizes::check(&util::project_root())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn parse(args: &[&str]) -> Result<Task, clap::Error> {
        Cli::try_parse_from(std::iter::once("xtask").chain(args.iter().copied())).map(|c| c.task)
    }

    #[test]
    fn every_task_and_flag_parses() {
        assert!(matches!(parse(&["setup"]), Ok(Task::Setup)));
        assert!(matches!(
            parse(&["bench"]),
            Ok(Task::Bench { only: None, ref compare }) if compare.is_empty()
        ));
        match parse(&["bench", "exec", "--compare", "/a.so", "--compare", "/b.so"]) {
            Ok(Task::Bench { only, compare }) => {
                assert_eq!(only, Some(bench::Only::Exec));
                assert_eq!(compare, [Path::new("/a.so"), Path::new("/b.so")]);
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(parse(&["demo"]), Ok(Task::Demo)));
        assert!(matches!(parse(&["gpu-bundle"]), Ok(Task::GpuBundle)));
        assert!(matches!(parse(&["dist"]), Ok(Task::Dist)));
        match parse(&["test", "--no-lint", "--", "-p", "x", "--nocapture"]) {
            Ok(Task::Test {
                no_lint,
                cargo_args,
                target: None,
            }) => {
                assert!(no_lint);
                assert_eq!(cargo_args, ["-p", "x", "--nocapture"]);
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            parse(&["test", "--target", "aarch64"]),
            Ok(Task::Test {
                target: Some(cross::CrossTarget::Aarch64),
                ..
            })
        ));
        match parse(&["torture", "--long", "--only", "agent"]) {
            Ok(Task::Torture { long, only }) => {
                assert!(long);
                assert_eq!(only, Some(torture::Scenario::Agent));
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            parse(&["torture"]),
            Ok(Task::Torture {
                long: false,
                only: None
            })
        ));
        assert!(matches!(parse(&["fuzz"]), Ok(Task::Fuzz { seconds: 60 })));
        assert!(matches!(parse(&["circles"]), Ok(Task::Circles)));
        assert!(matches!(
            parse(&["fuzz", "--seconds", "5"]),
            Ok(Task::Fuzz { seconds: 5 })
        ));
    }

    #[test]
    fn bad_arguments_are_refused() {
        for args in [
            &[][..],
            &["frobnicate"],
            &["test", "--nocapture"],
            &["torture", "--only", "everything"],
            &["fuzz", "--seconds", "0"],
            &["fuzz", "--seconds", "x"],
            &["bench", "everything"],
            &["bench", "--compare"],
            &["test", "--target", "riscv64"],
        ] {
            assert!(parse(args).is_err(), "{args:?} was accepted");
        }
    }

    #[test]
    fn help_lists_every_task() {
        let help = <Cli as clap::CommandFactory>::command()
            .render_long_help()
            .to_string();
        for t in [
            "setup",
            "test",
            "bench",
            "demo",
            "gpu-bundle",
            "dist",
            "torture",
            "fuzz",
            "circles",
        ] {
            assert!(help.contains(t), "{t} missing from:\n{help}");
        }
        <Cli as clap::CommandFactory>::command().debug_assert();
    }
}
