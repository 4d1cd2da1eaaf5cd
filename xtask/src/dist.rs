//! `cargo xtask dist`: what the chart, the systemd unit and the agent image install, in the
//! git-ignored `<root>/dist/hami-rs-<version>/` and a `.tar.gz` of it:
//!
//! ```text
//! hami-rs-<version>/
//!   amd64/bin/hami-agent               (x86-64 release, eBPF embedded, stripped)
//!   amd64/lib/libhami_preload.so       (x86-64 release, stripped)
//!   arm64/bin/hami-agent               (aarch64 cross build, same)
//!   arm64/lib/libhami_preload.so       (aarch64 cross build, same)
//!   bin/, lib/                         (symlinks to amd64/bin, amd64/lib)
//!   dashboards/hami.json               (Grafana)
//!   rules/hami-agent.rules.yml         (Prometheus recording and alert rules)
//!   docs/runbooks.md                   (the alerts' runbooks)
//!   helm/hami-agent/                   (the chart)
//!   systemd/hami-agent.service
//!   Dockerfile                         (`docker buildx build --platform linux/amd64,linux/arm64 .`
//!                                       in this folder: the multi-arch agent image)
//!   hami-swap.sh                       (hami-preload in HAMi's place: the chart's hamiSwap)
//!   hami-device-plugin/Dockerfile      (option B: HAMi's device-plugin image without its
//!                                       library, `--build-arg HAMI_IMAGE=projecthami/hami:<v>`)
//!   MANIFEST.txt
//! ```

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result};

use crate::bundle::{copy_file, copy_tree, git_describe, target_dir};
use crate::cross::CrossTarget;
use crate::dist_arch;
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
    let arm64_release = dist_arch::build_cross_release(root, CrossTarget::Aarch64)?;
    let release = target_dir(root).join("release");
    let version = env!("CARGO_PKG_VERSION");
    let name = format!("hami-rs-{version}");
    let base = root.join("dist");
    let out = base.join(&name);
    if out.exists() {
        fs::remove_dir_all(&out).with_context(|| format!("removing old {}", out.display()))?;
    }
    let files = [
        (release.join("hami-agent"), "amd64/bin/hami-agent", true),
        (
            release.join("libhami_preload.so"),
            "amd64/lib/libhami_preload.so",
            true,
        ),
        (
            arm64_release.join("hami-agent"),
            "arm64/bin/hami-agent",
            true,
        ),
        (
            arm64_release.join("libhami_preload.so"),
            "arm64/lib/libhami_preload.so",
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
        // Option B (docs/deploy.md): HAMi's image without its library; no COPY, one RUN.
        (
            root.join("deploy/hami-device-plugin/Dockerfile"),
            "hami-device-plugin/Dockerfile",
            false,
        ),
        // The alerts' runbook_url names its sections (docs/runbooks.md#<alert>).
        (root.join("docs/runbooks.md"), "docs/runbooks.md", false),
    ];
    let mut manifest = format!("hami-rs {version}, commit {}\n", git_describe(root));
    for (src, rel, is_binary) in &files {
        let dst = out.join(rel);
        copy_file(src, &dst)?;
        let mut arch = String::new();
        if *is_binary {
            let a = dist_arch::DockerArch::of_dist_path(rel)?;
            dist_arch::strip_for(a, &dst)?;
            dist_arch::check_machine(&dst, a)?;
            arch = format!(", {}", a.file_says());
        }
        manifest += &format!("{rel}: {} bytes{arch}\n", fs::metadata(&dst)?.len());
    }
    // The x86-64 files where earlier releases had them (systemd unit, docs).
    for dir in ["bin", "lib"] {
        std::os::unix::fs::symlink(format!("amd64/{dir}"), out.join(dir))
            .with_context(|| format!("symlinking {dir} -> amd64/{dir}"))?;
    }
    manifest += "bin/, lib/: symlinks to amd64/bin, amd64/lib\n";
    dist_arch::check_dockerfile_sources(&fs::read_to_string(out.join("Dockerfile"))?, &out)?;
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
