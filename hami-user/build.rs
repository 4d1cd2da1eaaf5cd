//! Builds the eBPF programs (`hami-ebpf`) for `bpf{el,eb}-unknown-none` with the nightly
//! toolchain and `bpf-linker` (see `cargo xtask setup`), the aya-template way. The object
//! lands in `$OUT_DIR/hami-ebpf` and is embedded in the agent with `include_bytes_aligned!`.

use std::path::Path;

use anyhow::{bail, Context as _};

fn main() -> anyhow::Result<()> {
    let manifest_dir = env!("CARGO_MANIFEST_DIR");
    let root = Path::new(manifest_dir)
        .parent()
        .context("hami-user has no parent directory")?;
    let ebpf_dir = root.join("hami-ebpf");
    let abi_dir = root.join("hami-abi");
    // aya-build watches hami-ebpf; the programs also include hami-abi's event structs, array
    // estimate and intercept table.
    println!("cargo:rerun-if-changed={}", abi_dir.join("src").display());
    println!(
        "cargo:rerun-if-changed={}",
        abi_dir.join("Cargo.toml").display()
    );
    println!("cargo:rerun-if-env-changed=PATH");

    let skip =
        std::env::var("AYA_BUILD_SKIP").is_ok_and(|v| v == "1" || v.eq_ignore_ascii_case("true"));
    if skip {
        // `AYA_BUILD_SKIP=1` (e.g. a quick `cargo clippy` without nightly): embed an empty
        // object; loading the probes then fails with a clear error.
        let out = std::env::var_os("OUT_DIR").context("OUT_DIR not set")?;
        let obj = Path::new(&out).join("hami-ebpf");
        if !obj.exists() {
            std::fs::write(&obj, b"").with_context(|| format!("writing {}", obj.display()))?;
        }
    } else if which("bpf-linker").is_none() {
        // `cargo xtask setup` installs it in the project's `.tools/bin`: use it from there, so
        // that a plain `cargo build --release -p hami-user` works without editing PATH.
        let tools_bin = root.join(".tools").join("bin");
        if !tools_bin.join("bpf-linker").is_file() {
            bail!(
                "bpf-linker not found on PATH nor in {}: run `cargo xtask setup`",
                tools_bin.display()
            );
        }
        let mut paths = vec![tools_bin];
        if let Some(old) = std::env::var_os("PATH") {
            paths.extend(std::env::split_paths(&old));
        }
        let joined = std::env::join_paths(paths).context("PATH with .tools/bin")?;
        // The eBPF build (aya-build's cargo and rustc's linker call) inherits it. A build
        // script is single-threaded here, before anything else reads the environment.
        std::env::set_var("PATH", joined);
    }
    let ebpf_dir = ebpf_dir
        .to_str()
        .context("the hami-ebpf path is not UTF-8")?
        .to_owned();
    let out = std::path::PathBuf::from(std::env::var_os("OUT_DIR").context("OUT_DIR not set")?);
    let stage = share_ebpf_target(&out)?;
    if let Some(stage) = &stage {
        // aya-build reads its output folder from OUT_DIR (see `share_ebpf_target`); the
        // build script is single-threaded here.
        std::env::set_var("OUT_DIR", stage);
    }
    let built = aya_build::build_ebpf(
        [aya_build::Package {
            name: "hami-ebpf",
            root_dir: &ebpf_dir,
            ..Default::default()
        }],
        aya_build::Toolchain::default(),
    );
    if let Some(stage) = &stage {
        std::env::set_var("OUT_DIR", &out);
        built?;
        let from = stage.join("hami-ebpf");
        if from.exists() {
            std::fs::rename(&from, out.join("hami-ebpf"))
                .with_context(|| format!("moving {} into {}", from.display(), out.display()))?;
        }
        return Ok(());
    }
    built
}

/// One eBPF build for every profile that runs this script (dev, clippy's check, release):
/// aya-build builds in `$OUT_DIR/aya-build/target`, which differs per profile, so each
/// would build the programs and `core` for the BPF target again (about 50 s). Returns a
/// private staging folder whose `aya-build` links to `<target>/hami-ebpf-build/<arch>`:
/// aya-build's cargo shares its target folder there (and its lock serialises two scripts
/// that run at once), while the object it copies out lands in the stage, this script's own.
/// `None` (build in `OUT_DIR` as aya-build does) when `OUT_DIR` is not
/// `<target>/<profile>/build/<unit>/out`.
fn share_ebpf_target(out: &Path) -> anyhow::Result<Option<std::path::PathBuf>> {
    let layout_known = out.file_name().is_some_and(|n| n == "out")
        && out
            .ancestors()
            .nth(2)
            .and_then(Path::file_name)
            .is_some_and(|n| n == "build");
    let Some(target) = out.ancestors().nth(4).filter(|_| layout_known) else {
        return Ok(None);
    };
    let arch = std::env::var("CARGO_CFG_TARGET_ARCH").context("CARGO_CFG_TARGET_ARCH not set")?;
    let endian =
        std::env::var("CARGO_CFG_TARGET_ENDIAN").context("CARGO_CFG_TARGET_ENDIAN not set")?;
    let shared = target
        .join("hami-ebpf-build")
        .join(format!("{arch}-{endian}"));
    std::fs::create_dir_all(&shared).with_context(|| format!("creating {}", shared.display()))?;
    let stage = out.join("ebpf-stage");
    std::fs::create_dir_all(&stage).with_context(|| format!("creating {}", stage.display()))?;
    let link = stage.join("aya-build");
    if std::fs::read_link(&link).ok().as_deref() != Some(shared.as_path()) {
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&shared, &link)
            .with_context(|| format!("linking {} to {}", link.display(), shared.display()))?;
    }
    Ok(Some(stage))
}

fn which(program: &str) -> Option<std::path::PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(program))
        .find(|p| p.is_file())
}
