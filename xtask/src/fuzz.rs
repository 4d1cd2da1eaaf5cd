//! `cargo xtask fuzz [--seconds N]`: runs every cargo-fuzz target of `fuzz/` (libFuzzer,
//! nightly, AddressSanitizer) for N seconds each (default 60) and prints executions and
//! crashes. Installs `cargo-fuzz` if it is missing (`cargo install cargo-fuzz --locked`, a few
//! minutes once). Not part of `cargo xtask test`; `cargo xtask torture --long` runs it.
//!
//! Targets (`fuzz/fuzz_targets/`): `region` (the region validator and reader of the agent and
//! `inspect`), `env` (the size parser and the agent's reading of an environment), `procinfo`
//! (the agent's `/proc` parsers), `event` (the eBPF event decoder and the per-process state it
//! feeds), `http` (the agent's metrics endpoint: raw bytes on one connection through
//! hyper's parser, the router and the handlers), `image` (the module image reader of
//! `hami-image`: fatbins, cubins, compressed entries). Seeds are committed in `fuzz/corpus/<target>/seed-*`; what libFuzzer adds there is
//! ignored by git. A crash leaves its input in `fuzz/artifacts/<target>/`.

use std::path::Path;
use std::process::{Command, Stdio};

use anyhow::{bail, Context, Result};

use crate::util::{project_root, tools_path};

/// The targets, in the order they run.
pub const TARGETS: [&str; 6] = ["region", "env", "procinfo", "event", "http", "image"];

/// One target's result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FuzzResult {
    /// Target name.
    pub target: String,
    /// Inputs executed.
    pub execs: u64,
    /// Crashes (0 or 1: libFuzzer stops at the first).
    pub crashes: u64,
    /// Seconds it ran.
    pub seconds: u64,
    /// Where the crashing input was written, if any.
    pub artifact: Option<String>,
}

/// Run every target for `seconds` each; fails if any crashed.
pub fn fuzz(seconds: u64) -> Result<Vec<FuzzResult>> {
    let root = project_root();
    ensure_cargo_fuzz(&root)?;
    let mut results = Vec::new();
    for t in TARGETS {
        println!("\n==> xtask fuzz: {t} ({seconds} s)");
        results.push(run_target(&root, t, seconds)?);
    }
    println!("\n| target | executions | crashes |\n|---|---|---|");
    for r in &results {
        println!("| {} | {} | {} |", r.target, r.execs, r.crashes);
    }
    let crashed: Vec<String> = results
        .iter()
        .filter(|r| r.crashes > 0)
        .map(|r| {
            format!(
                "{}: input {}",
                r.target,
                r.artifact.as_deref().unwrap_or("(not found)")
            )
        })
        .collect();
    if !crashed.is_empty() {
        bail!("fuzz targets crashed:\n  {}", crashed.join("\n  "));
    }
    Ok(results)
}

fn nightly_cargo(root: &Path) -> Command {
    let mut c = Command::new("rustup");
    c.args(["run", "nightly", "cargo"])
        .current_dir(root.join("fuzz"))
        .env("PATH", tools_path(root))
        // The agent's eBPF object is not needed by the parsers: embed an empty one.
        .env("AYA_BUILD_SKIP", "1")
        .env("CARGO_TARGET_DIR", root.join("target").join("fuzz"));
    c
}

fn ensure_cargo_fuzz(root: &Path) -> Result<()> {
    let ok = nightly_cargo(root)
        .args(["fuzz", "--version"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if ok {
        return Ok(());
    }
    println!("installing cargo-fuzz (cargo install cargo-fuzz --locked; once, a few minutes)");
    let st = Command::new("cargo")
        .args(["install", "cargo-fuzz", "--locked"])
        .env("PATH", tools_path(root))
        .status()
        .context("running cargo install cargo-fuzz (is rustup's cargo on PATH?)")?;
    if !st.success() {
        bail!("cargo install cargo-fuzz --locked failed with {st}");
    }
    Ok(())
}

fn run_target(root: &Path, target: &str, seconds: u64) -> Result<FuzzResult> {
    let out = nightly_cargo(root)
        .args(["fuzz", "run", "-O", target, "--"])
        .arg(format!("-max_total_time={seconds}"))
        .args(["-print_final_stats=1", "-rss_limit_mb=2048", "-timeout=10"])
        .stdout(Stdio::inherit())
        .stderr(Stdio::piped())
        .output()
        .with_context(|| format!("running cargo fuzz run {target}"))?;
    let log = String::from_utf8_lossy(&out.stderr);
    let mut r = parse_log(target, &log);
    if !out.status.success() && r.crashes == 0 {
        // Not a crash libFuzzer reported: a build failure or similar. Show the end.
        let tail: Vec<&str> = log.lines().rev().take(40).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        bail!(
            "cargo fuzz run {target} failed with {}:\n{}",
            out.status,
            tail.join("\n")
        );
    }
    if r.crashes > 0 {
        eprintln!("{log}");
    }
    r.seconds = seconds;
    println!(
        "    {target}: {} executions, {} crashes",
        r.execs, r.crashes
    );
    Ok(r)
}

/// Reads libFuzzer's final statistics and crash report.
pub fn parse_log(target: &str, log: &str) -> FuzzResult {
    let mut r = FuzzResult {
        target: target.to_string(),
        execs: 0,
        crashes: 0,
        seconds: 0,
        artifact: None,
    };
    for l in log.lines() {
        if let Some(v) = l.strip_prefix("stat::number_of_executed_units:") {
            r.execs = v.trim().parse().unwrap_or(r.execs);
        } else if let Some(rest) = l.strip_prefix("Done ") {
            // "Done 12345 runs in 60 second(s)"
            if let Some(n) = rest.split_whitespace().next().and_then(|n| n.parse().ok()) {
                r.execs = r.execs.max(n);
            }
        }
        if l.contains("ERROR: libFuzzer:") || l.contains("ERROR: AddressSanitizer") {
            r.crashes = 1;
        }
        if let Some(i) = l.find("Test unit written to ") {
            r.crashes = 1;
            r.artifact = Some(l[i + "Test unit written to ".len()..].trim().to_string());
        }
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn final_stats_and_crashes_are_read() {
        let ok = "#2\tINITED cov: 10\nDone 123456 runs in 60 second(s)\n\
                  stat::number_of_executed_units: 123457\nstat::peak_rss_mb: 40\n";
        let r = parse_log("env", ok);
        assert_eq!((r.execs, r.crashes, r.artifact), (123457, 0, None));
        let bad = "==1== ERROR: libFuzzer: deadly signal\n\
                   artifact_prefix='/x/'; Test unit written to /x/crash-abc\n\
                   stat::number_of_executed_units: 99\n";
        let r = parse_log("region", bad);
        assert_eq!(r.execs, 99);
        assert_eq!(r.crashes, 1);
        assert_eq!(r.artifact.as_deref(), Some("/x/crash-abc"));
    }
}
