//! `cargo xtask <task>`: project tasks (see README).
//!
//! * `setup`: make a bare machine ready (nightly rust-src, bpf-linker, Debian packages).
//! * `test`: setup + build everything + every test (eBPF tests included; needs root).
//! * `bench`: benchmarks that print figures.
//! * `demo`: the end-to-end story on the fake (or real) driver.
//! * `gpu-bundle`: binaries + acceptance scripts for the GPU machine.
//! * `dist`: release agent, preload, dashboards, rules, chart, systemd unit, Dockerfile.
//! * `torture`: kill storms, stopped lock holders, races to the limit, bad inputs (figures).
//! * `fuzz`: the cargo-fuzz targets of `fuzz/`, each for a bounded time.

mod bench;
mod bundle;
mod demo;
mod dist;
mod fuzz;
mod setup;
mod test;
mod torture;
mod util;

use anyhow::{bail, Result};

const USAGE: &str = "usage: cargo xtask <task>
tasks:
  setup              make this machine ready (idempotent)
  test [--no-lint] [-- cargo-test-args]
                     setup + fmt + clippy + build everything + run every test (root for eBPF)
  bench              benchmarks (prints figures)
  demo               the whole story on the fake (or real) driver (root)
  gpu-bundle         build the folder to carry to the GPU machine
  dist               release agent + preload + dashboards + rules + chart + unit + Dockerfile
  torture [--long] [--only storm|stops|race|bad|agent|fuzz]
                     kill storm, stopped lock holders, race to the limit, bad inputs
                     (short profile ~1 min, also run by `test`; --long for releases,
                     which also runs `fuzz`)
  fuzz [--seconds N] every cargo-fuzz target for N s (default 60); installs cargo-fuzz";

fn main() {
    if let Err(e) = run() {
        eprintln!("xtask: error: {e:#}");
        std::process::exit(1);
    }
}

fn run() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(task) = args.first() else {
        bail!("{USAGE}");
    };
    let rest = &args[1..];
    match task.as_str() {
        "setup" => setup::setup().map(|_| ()),
        "test" => {
            let mut opts = test::TestOptions::default();
            let mut it = rest.iter();
            while let Some(a) = it.next() {
                match a.as_str() {
                    "--no-lint" => opts.no_lint = true,
                    "--" => opts.cargo_args.extend(it.by_ref().cloned()),
                    other => bail!("unknown option {other:?} for `test`\n{USAGE}"),
                }
            }
            test::test(&opts)
        }
        "bench" => bench::bench(),
        "demo" => demo::demo(),
        "torture" => {
            let mut opts = torture::TortureOptions::default();
            let mut it = rest.iter();
            while let Some(a) = it.next() {
                match a.as_str() {
                    "--long" => opts.long = true,
                    "--only" => opts.only = it.next().cloned(),
                    other => bail!("unknown option {other:?} for `torture`\n{USAGE}"),
                }
            }
            torture::torture(&opts)
        }
        "fuzz" => {
            let mut seconds = 60u64;
            let mut it = rest.iter();
            while let Some(a) = it.next() {
                match a.as_str() {
                    "--seconds" => {
                        seconds = it
                            .next()
                            .and_then(|v| v.parse().ok())
                            .filter(|&n| n > 0)
                            .ok_or_else(|| anyhow::anyhow!("--seconds needs a positive number"))?
                    }
                    other => bail!("unknown option {other:?} for `fuzz`\n{USAGE}"),
                }
            }
            fuzz::fuzz(seconds).map(|_| ())
        }
        "gpu-bundle" => bundle::gpu_bundle(&util::project_root()).map(|_| ()),
        "dist" => dist::dist(&util::project_root()).map(|_| ()),
        "-h" | "--help" | "help" => {
            println!("{USAGE}");
            Ok(())
        }
        other => bail!("unknown task {other:?}\n{USAGE}"),
    }
}
