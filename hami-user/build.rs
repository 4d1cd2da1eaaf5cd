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
    aya_build::build_ebpf(
        [aya_build::Package {
            name: "hami-ebpf",
            root_dir: &ebpf_dir,
            ..Default::default()
        }],
        aya_build::Toolchain::default(),
    )
}

fn which(program: &str) -> Option<std::path::PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(program))
        .find(|p| p.is_file())
}
