//! The architectures `cargo xtask dist` ships: the aarch64 release build (cross, std from
//! source), stripping with each architecture's binutils, the ELF machine check of every
//! shipped binary, and the check that the Dockerfile's per-architecture `COPY` sources exist.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{anyhow, bail, Context, Result};
use object::Object;

use crate::bundle::target_dir;
use crate::cross::{nightly_cargo, CrossTarget};
use crate::util::run_checked;

/// An architecture of the image, named as Docker's `TARGETARCH` names it (and as the dist
/// folder's per-architecture directories are named).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DockerArch {
    /// `linux/amd64`: x86-64.
    Amd64,
    /// `linux/arm64`: aarch64.
    Arm64,
}

impl DockerArch {
    /// Every architecture the dist folder and the image carry.
    pub const ALL: [DockerArch; 2] = [DockerArch::Amd64, DockerArch::Arm64];

    /// `TARGETARCH`'s value.
    pub const fn name(self) -> &'static str {
        match self {
            DockerArch::Amd64 => "amd64",
            DockerArch::Arm64 => "arm64",
        }
    }

    /// The ELF machine of its binaries.
    fn machine(self) -> object::Architecture {
        match self {
            DockerArch::Amd64 => object::Architecture::X86_64,
            DockerArch::Arm64 => object::Architecture::Aarch64,
        }
    }

    /// What `file` says about its binaries.
    pub const fn file_says(self) -> &'static str {
        match self {
            DockerArch::Amd64 => "x86-64",
            DockerArch::Arm64 => CrossTarget::Aarch64.file_says(),
        }
    }

    /// The architecture of a dist path (`amd64/...`, `arm64/...`).
    pub fn of_dist_path(rel: &str) -> Result<DockerArch> {
        let first = rel.split('/').next().unwrap_or("");
        DockerArch::ALL
            .into_iter()
            .find(|a| a.name() == first)
            .ok_or_else(|| anyhow!("{rel}: a binary outside the per-architecture folders"))
    }
}

/// `cargo build --release -p hami-user -p hami-preload` for `t` (nightly, std from source);
/// returns `<target>/<triple>/release`.
pub fn build_cross_release(root: &Path, t: CrossTarget) -> Result<PathBuf> {
    eprintln!(
        "==> dist: cross build for {} (release, std from source)",
        t.triple()
    );
    let mut c = nightly_cargo(root, t, "build")?;
    c.args(["--release", "-p", "hami-user", "-p", "hami-preload"]);
    run_checked(&mut c)?;
    Ok(target_dir(root).join(t.triple()).join("release"))
}

/// `strip --strip-unneeded` with the binutils of `a` (the host's `strip` does not read
/// aarch64 objects).
pub fn strip_for(a: DockerArch, p: &Path) -> Result<()> {
    match a {
        DockerArch::Amd64 => crate::bundle::strip(p),
        DockerArch::Arm64 => run_checked(
            Command::new("aarch64-linux-gnu-strip")
                .arg("--strip-unneeded")
                .arg(p),
        )
        .with_context(|| {
            format!(
                "stripping {} (binutils-aarch64-linux-gnu comes with gcc-aarch64-linux-gnu)",
                p.display()
            )
        }),
    }
}

/// Fails unless `p` is an ELF file for `a`'s machine.
pub fn check_machine(p: &Path, a: DockerArch) -> Result<()> {
    let data = fs::read(p).with_context(|| format!("reading {}", p.display()))?;
    let file =
        object::File::parse(&*data).with_context(|| format!("{} is not ELF", p.display()))?;
    if file.architecture() != a.machine() {
        bail!(
            "{} is {:?}, expected {:?} ({})",
            p.display(),
            file.architecture(),
            a.machine(),
            a.name()
        );
    }
    Ok(())
}

/// The sources of the Dockerfile's `COPY` lines, with `${TARGETARCH}` replaced by `a`.
fn copy_sources(dockerfile: &str, a: DockerArch) -> Vec<String> {
    let mut out = Vec::new();
    for line in dockerfile.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        if words.first() != Some(&"COPY") || words.len() < 3 {
            continue;
        }
        for src in &words[1..words.len() - 1] {
            if !src.starts_with("--") {
                out.push(src.replace("${TARGETARCH}", a.name()));
            }
        }
    }
    out
}

/// Fails unless every `COPY` source of the Dockerfile exists in `dir` for every architecture
/// (and the per-architecture binaries really are per architecture).
pub fn check_dockerfile_sources(dockerfile: &str, dir: &Path) -> Result<()> {
    if !dockerfile.contains("${TARGETARCH}") {
        bail!("the Dockerfile does not copy per-architecture files (${{TARGETARCH}})");
    }
    for a in DockerArch::ALL {
        for src in copy_sources(dockerfile, a) {
            if !dir.join(&src).exists() {
                bail!(
                    "the Dockerfile copies {src} for {} but {} has no such file",
                    a.name(),
                    dir.display()
                );
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dockerfile_copy_sources_are_per_architecture() {
        let df = fs::read_to_string(crate::util::project_root().join("deploy/Dockerfile"))
            .expect("deploy/Dockerfile");
        let amd = copy_sources(&df, DockerArch::Amd64);
        let arm = copy_sources(&df, DockerArch::Arm64);
        assert!(amd.contains(&"amd64/bin/hami-agent".to_string()), "{amd:?}");
        assert!(arm.contains(&"arm64/bin/hami-agent".to_string()), "{arm:?}");
        assert!(arm.contains(&"arm64/lib/libhami_preload.so".to_string()));
        assert!(arm.iter().all(|s| !s.contains("amd64")), "{arm:?}");
    }

    #[test]
    fn a_missing_architecture_is_refused() {
        let d = std::env::temp_dir().join(format!("hami-dist-arch-{}", std::process::id()));
        fs::create_dir_all(d.join("amd64/bin")).unwrap();
        fs::write(d.join("amd64/bin/hami-agent"), b"x").unwrap();
        let df = "FROM x\nARG TARGETARCH\nCOPY ${TARGETARCH}/bin/hami-agent /usr/bin/\n";
        let err = check_dockerfile_sources(df, &d).unwrap_err().to_string();
        assert!(err.contains("arm64/bin/hami-agent"), "{err}");
        fs::create_dir_all(d.join("arm64/bin")).unwrap();
        fs::write(d.join("arm64/bin/hami-agent"), b"x").unwrap();
        check_dockerfile_sources(df, &d).unwrap();
        assert!(check_dockerfile_sources("FROM x\nCOPY bin/a /a\n", &d).is_err());
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn the_machine_check_tells_the_architectures_apart() {
        // This xtask binary is an x86-64 (or aarch64) ELF file.
        let me = std::env::current_exe().unwrap();
        let (mine, other) = if cfg!(target_arch = "aarch64") {
            (DockerArch::Arm64, DockerArch::Amd64)
        } else {
            (DockerArch::Amd64, DockerArch::Arm64)
        };
        check_machine(&me, mine).unwrap();
        assert!(check_machine(&me, other).is_err());
        assert_eq!(
            DockerArch::of_dist_path("arm64/lib/x.so").unwrap(),
            DockerArch::Arm64
        );
        assert!(DockerArch::of_dist_path("bin/hami-agent").is_err());
    }
}
