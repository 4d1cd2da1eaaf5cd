//! Cross builds for aarch64 (`aarch64-unknown-linux-gnu`) on an x86-64 Debian machine, and
//! running what they build under qemu-user.
//!
//! * Toolchain: `rustup target add` is not needed (nor possible offline): nightly's
//!   `rust-src` builds std from source (`-Z build-std`, given to cargo through
//!   `CARGO_UNSTABLE_BUILD_STD` so that the nested builds the test harness makes inherit it).
//!   The linker and C compiler are Debian's `aarch64-linux-gnu-gcc`, the sysroot
//!   `libc6-dev-arm64-cross` (`/usr/aarch64-linux-gnu`).
//! * Running: `qemu-user-static`, registered with binfmt_misc ([`ensure_binfmt`]: Debian's own
//!   registration line, with the `F` flag), so that every aarch64 binary runs transparently,
//!   including the processes the tests spawn with `LD_PRELOAD` of the aarch64 preload. Cargo's
//!   runner for the target is set too, from the environment of the commands built here (never
//!   in a committed `.cargo/config.toml`, which would apply to every host build).
//!
//! Everything is passed through the environment of the commands [`nightly_cargo`] builds.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{bail, Context, Result};

use crate::util::tools_path;

/// The architectures `--target` accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum CrossTarget {
    /// `aarch64-unknown-linux-gnu` (Grace Hopper / Grace Blackwell nodes), run under
    /// qemu-user.
    Aarch64,
}

impl CrossTarget {
    /// The Rust target triple.
    pub const fn triple(self) -> &'static str {
        match self {
            CrossTarget::Aarch64 => "aarch64-unknown-linux-gnu",
        }
    }

    /// The cross C compiler (also cargo's linker for the target).
    pub const fn gcc(self) -> &'static str {
        match self {
            CrossTarget::Aarch64 => "aarch64-linux-gnu-gcc",
        }
    }

    /// The target's sysroot (its `ld-linux` and `libc.so.6`), qemu's `-L` prefix.
    pub const fn sysroot(self) -> &'static str {
        match self {
            CrossTarget::Aarch64 => "/usr/aarch64-linux-gnu",
        }
    }

    /// The qemu-user binary.
    pub const fn qemu(self) -> &'static str {
        match self {
            CrossTarget::Aarch64 => "qemu-aarch64-static",
        }
    }

    /// The binfmt_misc entry name (Debian's).
    pub const fn binfmt_name(self) -> &'static str {
        match self {
            CrossTarget::Aarch64 => "qemu-aarch64",
        }
    }

    /// What `file` says about a binary of this architecture.
    pub const fn file_says(self) -> &'static str {
        match self {
            CrossTarget::Aarch64 => "ARM aarch64",
        }
    }

    /// `CARGO_TARGET_<TRIPLE>_<what>` for cargo's per-target configuration.
    fn cargo_var(self, what: &str) -> String {
        format!(
            "CARGO_TARGET_{}_{what}",
            self.triple().to_uppercase().replace('-', "_")
        )
    }
}

/// Debian 12 packages of the aarch64 cross toolchain and emulator.
pub const DEB_PACKAGES: &[&str] = &[
    "gcc-aarch64-linux-gnu",
    "libc6-dev-arm64-cross",
    "qemu-user-static",
];

/// Where binfmt_misc is mounted.
const BINFMT_DIR: &str = "/proc/sys/fs/binfmt_misc";
/// Debian's registration line for qemu-aarch64 (`qemu-user-static` ships it; registered by
/// systemd-binfmt on a booted system, which CI containers are not).
const DEBIAN_BINFMT_CONF: &str = "/usr/lib/binfmt.d/qemu-aarch64.conf";
/// The same line, used when the file is missing: ELF64 little-endian, `e_machine` 183
/// (EM_AARCH64), flags `F` (the interpreter is opened now, so it works in any mount
/// namespace), `P` (argv[0] preserved), `O` (the binary passed open).
const BINFMT_LINE: &str = ":qemu-aarch64:M::\\x7f\\x45\\x4c\\x46\\x02\\x01\\x01\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x02\\x00\\xb7\\x00:\\xff\\xff\\xff\\xff\\xff\\xff\\xff\\x00\\xff\\xff\\xff\\xff\\xff\\xff\\xff\\xff\\xfe\\xff\\xff\\xff:/usr/bin/qemu-aarch64-static:FPO";
/// Debian's qemu-user-static looks for the guest's loader and libraries under
/// `/etc/qemu-binfmt/<arch>` when `QEMU_LD_PREFIX` is not set: pointed at the sysroot, a
/// process started with a cleared environment still runs.
const QEMU_BINFMT_PREFIX: &str = "/etc/qemu-binfmt/aarch64";

fn quiet_ok(cmd: &mut Command) -> bool {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Whether the cross compiler, the sysroot and qemu are installed.
pub fn cross_tools_present(t: CrossTarget) -> bool {
    quiet_ok(Command::new(t.gcc()).arg("--version"))
        && quiet_ok(Command::new(t.qemu()).arg("--version"))
        && Path::new(t.sysroot()).join("lib/libc.so.6").exists()
}

/// `setup` step: the cross toolchain and qemu-user, from Debian's packages if missing
/// (installed by the one apt step of `setup`, [`crate::util::apt_install`]).
pub fn ensure_cross_tools() -> Result<()> {
    let t = CrossTarget::Aarch64;
    if cross_tools_present(t) {
        return Ok(());
    }
    crate::util::apt_install(
        DEB_PACKAGES,
        "the aarch64 cross build and its tests under qemu-user",
    )?;
    if !cross_tools_present(t) {
        bail!(
            "{} installed but {}, {} or {}/lib/libc.so.6 is still missing",
            DEB_PACKAGES.join(", "),
            t.gcc(),
            t.qemu(),
            t.sysroot()
        );
    }
    Ok(())
}

/// Whether binfmt_misc has an enabled entry for `t`.
fn binfmt_enabled(t: CrossTarget) -> bool {
    fs::read_to_string(Path::new(BINFMT_DIR).join(t.binfmt_name()))
        .is_ok_and(|s| s.lines().next() == Some("enabled"))
}

/// `setup` step: qemu-aarch64 registered with binfmt_misc (mounting binfmt_misc first if it
/// is not), and Debian's qemu prefix pointed at the sysroot. Needs root.
pub fn ensure_binfmt() -> Result<()> {
    let t = CrossTarget::Aarch64;
    let prefix = Path::new(QEMU_BINFMT_PREFIX);
    if fs::symlink_metadata(prefix).is_err() {
        if let Some(parent) = prefix.parent() {
            fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
        }
        std::os::unix::fs::symlink(t.sysroot(), prefix)
            .with_context(|| format!("symlinking {} -> {}", prefix.display(), t.sysroot()))?;
    }
    if binfmt_enabled(t) {
        return Ok(());
    }
    let register = Path::new(BINFMT_DIR).join("register");
    if !register.exists() {
        let ok =
            quiet_ok(Command::new("mount").args(["-t", "binfmt_misc", "binfmt_misc", BINFMT_DIR]));
        if !ok || !register.exists() {
            bail!(
                "binfmt_misc is not mounted at {BINFMT_DIR} and mounting it failed (needs root): \
                 aarch64 test binaries cannot start the aarch64 processes they spawn"
            );
        }
    }
    let line = fs::read_to_string(DEBIAN_BINFMT_CONF)
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with(':')).map(str::to_string))
        .unwrap_or_else(|| BINFMT_LINE.to_string());
    println!("setup:   registering {} with binfmt_misc", t.binfmt_name());
    fs::write(&register, format!("{line}\n"))
        .with_context(|| format!("writing the qemu-aarch64 entry to {}", register.display()))?;
    if !binfmt_enabled(t) {
        bail!("registered qemu-aarch64 with binfmt_misc but the entry is not enabled");
    }
    Ok(())
}

/// Compiles a small C program for `t` and runs it directly (through binfmt_misc): proves that
/// aarch64 processes start, find their libc and see aarch64's unsigned `char`.
pub fn check_emulation(t: CrossTarget, scratch: &Path) -> Result<()> {
    fs::create_dir_all(scratch).with_context(|| format!("creating {}", scratch.display()))?;
    let src = scratch.join("hello-cross.c");
    let exe = scratch.join("hello-cross");
    fs::write(
        &src,
        "#include <stdio.h>\nint main(void) { char c = (char)-1; printf(\"%d\\n\", (int)c); return 0; }\n",
    )?;
    let out = Command::new(t.gcc())
        .arg("-o")
        .arg(&exe)
        .arg(&src)
        .output()
        .with_context(|| format!("running {}", t.gcc()))?;
    if !out.status.success() {
        bail!(
            "{} cannot build a hello world: {}",
            t.gcc(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let run = Command::new(&exe)
        .env("QEMU_LD_PREFIX", t.sysroot())
        .output()
        .with_context(|| {
            format!(
                "starting {} (an {} binary) directly: is qemu registered with binfmt_misc? \
                 (`cargo xtask setup` as root does it)",
                exe.display(),
                t.triple()
            )
        })?;
    let _ = fs::remove_file(&src);
    let _ = fs::remove_file(&exe);
    let said = String::from_utf8_lossy(&run.stdout).trim().to_string();
    if !run.status.success() || said != "255" {
        bail!(
            "the {} hello world ran with {} and printed {said:?} (expected 255: `char` is \
             unsigned there): {}",
            t.triple(),
            run.status,
            String::from_utf8_lossy(&run.stderr)
        );
    }
    Ok(())
}

/// The nightly toolchain's real `cargo` (not the rustup proxy): what the harness's nested
/// builds run, as `$CARGO`.
pub fn nightly_cargo_path() -> Result<PathBuf> {
    let out = clean(Command::new("rustc"))
        .args(["+nightly", "--print", "sysroot"])
        .output()
        .context("running `rustc +nightly --print sysroot`")?;
    if !out.status.success() {
        bail!("no nightly toolchain (`cargo xtask setup` installs it)");
    }
    let p = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()).join("bin/cargo");
    if !p.is_file() {
        bail!("{} missing", p.display());
    }
    Ok(p)
}

/// Removes the variables that pin the outer `cargo xtask`'s toolchain.
fn clean(mut c: Command) -> Command {
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

/// The environment a build and a run for `t` need, as `(name, value)` pairs: std from
/// source, the cross linker and C compiler (cc-rs's `CC_<triple>`, which the test harness
/// reads too), qemu as cargo's runner and its library prefix.
pub fn cross_env(t: CrossTarget) -> Vec<(String, String)> {
    vec![
        ("CARGO_UNSTABLE_BUILD_STD".into(), "std,panic_unwind".into()),
        (t.cargo_var("LINKER"), t.gcc().into()),
        (
            t.cargo_var("RUNNER"),
            format!("{} -L {}", t.qemu(), t.sysroot()),
        ),
        (
            format!("CC_{}", t.triple().replace('-', "_")),
            t.gcc().into(),
        ),
        ("QEMU_LD_PREFIX".into(), t.sysroot().into()),
        ("RUSTUP_TOOLCHAIN".into(), "nightly".into()),
    ]
}

/// `cargo <subcommand> --target <triple>` with nightly and [`cross_env`], in `root`, with the
/// project's tools on `PATH` (bpf-linker, for the agent's eBPF object).
pub fn nightly_cargo(root: &Path, t: CrossTarget, subcommand: &str) -> Result<Command> {
    let mut c = clean(Command::new(nightly_cargo_path()?));
    c.current_dir(root)
        .env("PATH", tools_path(root))
        .arg(subcommand)
        .args(["--target", t.triple()]);
    for (k, v) in cross_env(t) {
        c.env(k, v);
    }
    Ok(c)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cross_environment_names_the_target_and_its_tools() {
        let env = cross_env(CrossTarget::Aarch64);
        let get = |k: &str| {
            env.iter()
                .find(|(n, _)| n == k)
                .map(|(_, v)| v.as_str())
                .unwrap_or_else(|| panic!("{k} missing from {env:?}"))
        };
        assert_eq!(
            get("CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER"),
            "aarch64-linux-gnu-gcc"
        );
        assert_eq!(
            get("CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER"),
            "qemu-aarch64-static -L /usr/aarch64-linux-gnu"
        );
        assert_eq!(get("CC_aarch64_unknown_linux_gnu"), "aarch64-linux-gnu-gcc");
        assert_eq!(get("CARGO_UNSTABLE_BUILD_STD"), "std,panic_unwind");
        // Nothing that would change a host build: no plain CC, no RUSTFLAGS.
        assert!(env.iter().all(|(k, _)| k != "CC" && k != "RUSTFLAGS"));
    }

    #[test]
    fn the_builtin_binfmt_line_matches_aarch64_elf_headers() {
        // magic/mask fields of the registration line, decoded.
        let fields: Vec<&str> = BINFMT_LINE.split(':').collect();
        let decode = |s: &str| -> Vec<u8> {
            s.split("\\x")
                .filter(|b| !b.is_empty())
                .map(|b| u8::from_str_radix(b, 16).unwrap())
                .collect()
        };
        let (magic, mask) = (decode(fields[4]), decode(fields[5]));
        assert_eq!(magic.len(), 20);
        assert_eq!(mask.len(), 20);
        // ELF, 64-bit, little-endian, e_type EXEC or DYN (mask 0xfe), e_machine 183.
        assert_eq!(&magic[..4], b"\x7fELF");
        assert_eq!((magic[4], magic[5]), (2, 1));
        assert_eq!(u16::from_le_bytes([magic[18], magic[19]]), 183);
        assert_eq!(mask[16], 0xfe);
        assert!(fields[7].contains('F'), "the F flag");
        assert_eq!(fields[6], "/usr/bin/qemu-aarch64-static");
    }
}
