//! `cargo xtask <task>`: project tasks (see README).
//!
//! * `setup`: make a bare machine ready (nightly rust-src, bpf-linker, Debian packages).
//! * `test`: setup + build everything + every test (eBPF tests included; needs root).
//! * `bench`: benchmarks that print figures.
//! * `demo`: the end-to-end story on the fake (or real) driver.
//! * `gpu-bundle`: binaries + acceptance scripts for the GPU machine.

mod setup;

use anyhow::{bail, Result};

fn main() {
    if let Err(e) = run() {
        eprintln!("xtask: error: {e:#}");
        std::process::exit(1);
    }
}

fn run() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(task) = args.first() else {
        bail!("usage: cargo xtask <setup|test|bench|demo|gpu-bundle> [args]");
    };
    match task.as_str() {
        "setup" => setup::setup().map(|_| ()),
        other => bail!("unknown task {other:?}; expected setup, test, bench, demo or gpu-bundle"),
    }
}
