//! `cargo xtask dist`: what the chart, the systemd unit and the agent image install, in the
//! git-ignored `<root>/dist/hami-rs-<version>/` and a `.tar.gz` of it:
//!
//! ```text
//! hami-rs-<version>/
//!   bin/hami-agent                     (release, eBPF embedded, stripped)
//!   lib/libhami_preload.so             (release, stripped)
//!   dashboards/hami.json               (Grafana)
//!   rules/hami-agent.rules.yml         (Prometheus recording and alert rules)
//!   docs/runbooks.md                   (the alerts' runbooks)
//!   helm/hami-agent/                   (the chart)
//!   systemd/hami-agent.service
//!   Dockerfile                         (`docker build .` in this folder: the agent image)
//!   hami-swap.sh                       (hami-preload in HAMi's place: the chart's hamiSwap)
//!   MANIFEST.txt
//! ```

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result};

use crate::bundle::{copy_file, copy_tree, git_describe, strip, target_dir};
use crate::util::{cargo, run_checked};

/// Builds the release folder and tarball; returns the folder.
pub fn dist(root: &Path) -> Result<PathBuf> {
    crate::setup::setup().context("setup (bpf-linker for the eBPF half) failed")?;
    eprintln!("==> dist: cargo build --release -p hami-user -p hami-preload");
    run_checked(cargo(root).args([
        "build",
        "--release",
        "-p",
        "hami-user",
        "-p",
        "hami-preload",
    ]))?;
    let release = target_dir(root).join("release");
    let version = env!("CARGO_PKG_VERSION");
    let name = format!("hami-rs-{version}");
    let base = root.join("dist");
    let out = base.join(&name);
    if out.exists() {
        fs::remove_dir_all(&out).with_context(|| format!("removing old {}", out.display()))?;
    }
    let files = [
        (release.join("hami-agent"), "bin/hami-agent", true),
        (
            release.join("libhami_preload.so"),
            "lib/libhami_preload.so",
            true,
        ),
        (
            root.join("dashboards/hami.json"),
            "dashboards/hami.json",
            false,
        ),
        (
            root.join("deploy/helm/hami-agent/files/hami-agent.rules.yml"),
            "rules/hami-agent.rules.yml",
            false,
        ),
        (
            root.join("deploy/systemd/hami-agent.service"),
            "systemd/hami-agent.service",
            false,
        ),
        (root.join("deploy/Dockerfile"), "Dockerfile", false),
        (root.join("deploy/hami-swap.sh"), "hami-swap.sh", false),
        // The alerts' runbook_url names its sections (docs/runbooks.md#<alert>).
        (root.join("docs/runbooks.md"), "docs/runbooks.md", false),
    ];
    let mut manifest = format!("hami-rs {version}, commit {}\n", git_describe(root));
    for (src, rel, is_binary) in &files {
        let dst = out.join(rel);
        copy_file(src, &dst)?;
        if *is_binary {
            strip(&dst)?;
        }
        manifest += &format!("{rel}: {} bytes\n", fs::metadata(&dst)?.len());
    }
    copy_tree(
        &root.join("deploy/helm/hami-agent"),
        &out.join("helm/hami-agent"),
    )?;
    manifest += "helm/hami-agent/: the chart (docs/deploy.md)\n";
    fs::write(out.join("MANIFEST.txt"), &manifest)?;
    let tarball = base.join(format!("{name}.tar.gz"));
    run_checked(
        Command::new("tar")
            .arg("-czf")
            .arg(&tarball)
            .arg("-C")
            .arg(&base)
            .arg(&name),
    )?;
    println!(
        "{manifest}dist: {} and {}",
        out.display(),
        tarball.display()
    );
    Ok(out)
}
