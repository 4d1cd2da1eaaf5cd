//! `cargo xtask gpu-bundle`: the folder to carry to the GPU machine (see `gpu/README.md`).
//!
//! Builds, in release, `libhami_preload.so` (`-p hami-preload`) and `hami-agent`
//! (`-p hami-user`, eBPF object embedded; needs `bpf-linker`, which `setup` provides), strips
//! them, and copies them with the acceptance runner (`gpu/run_acceptance.py`, its packages
//! `gpu/acceptance/` and `gpu/runner/`, `gpu/README.md`, `gpu/workloads/`, the two-GPU checks `gpu/multi_gpu_check.py`, `gpu/multi_gpu_container.py` (issue 29) and
//! `gpu/library_two_devices.sh`) and the C test programs (`testing/programs/*.c`, the `*.h` they include and `include/hami_cuda.h`, `include/hami_nvml.h`) into
//! the git-ignored `<root>/gpu-bundle/`:
//!
//! ```text
//! gpu-bundle/
//!   libhami_preload.so  hami-agent  MANIFEST.txt
//!   gpu/run_acceptance.py  gpu/acceptance/...  gpu/runner/...  gpu/README.md  gpu/workloads/...
//!   programs/*.c  programs/*.h
//! ```
//!
//! The GPU machine has no Rust toolchain and no network: everything it needs is in there.
//! Fails if the bundle is over [`MAX_BUNDLE_BYTES`].

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

use crate::util::{cargo, run_checked};

/// The largest bundle we accept (the device tool carries 64 MiB with the working tree).
pub const MAX_BUNDLE_BYTES: u64 = 60 * 1024 * 1024;

/// What goes into the bundle.
#[derive(Debug, Clone)]
pub struct BundleOptions {
    /// Build and include `hami-agent` (needs the eBPF toolchain); off only to test the
    /// bundling itself quickly.
    pub agent: bool,
}

impl Default for BundleOptions {
    fn default() -> Self {
        Self { agent: true }
    }
}

/// Build the full bundle into `<root>/gpu-bundle`; returns its path.
pub fn gpu_bundle(root: &Path) -> Result<PathBuf> {
    gpu_bundle_with(root, &BundleOptions::default())
}

/// Build the bundle with `opts` into `<root>/gpu-bundle`; returns its path.
pub fn gpu_bundle_with(root: &Path, opts: &BundleOptions) -> Result<PathBuf> {
    let target = target_dir(root);
    let release = target.join("release");

    eprintln!("==> gpu-bundle: cargo build --release -p hami-preload");
    run_checked(cargo(root).args(["build", "--release", "-p", "hami-preload"]))?;
    if opts.agent {
        crate::setup::setup().context("setup (bpf-linker for the eBPF half) failed")?;
        eprintln!("==> gpu-bundle: cargo build --release -p hami-user (eBPF embedded)");
        run_checked(cargo(root).args(["build", "--release", "-p", "hami-user"]))?;
    }

    let out = root.join("gpu-bundle");
    if out.exists() {
        fs::remove_dir_all(&out).with_context(|| format!("removing old {}", out.display()))?;
    }
    fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;

    let mut binaries = vec![("libhami_preload.so", release.join("libhami_preload.so"))];
    if opts.agent {
        binaries.push(("hami-agent", release.join("hami-agent")));
    }
    for (name, src) in &binaries {
        let dst = out.join(name);
        copy_file(src, &dst)?;
        strip(&dst)?;
    }

    let gpu = root.join("gpu");
    copy_file(
        &gpu.join("run_acceptance.py"),
        &out.join("gpu/run_acceptance.py"),
    )?;
    copy_file(&gpu.join("README.md"), &out.join("gpu/README.md"))?;
    // The library checks (two contexts on one GPU; two GPUs), the multi-GPU check and
    // nvidia-smi inside a container.
    for name in [
        "multi_gpu_check.py",
        "multi_gpu_container.py",
        "library_two_devices.sh",
        "library_two_contexts.sh",
        "nvsmi_container.sh",
        "agent_cost.sh",
        "issue31_check.sh",
        "oldglibc_check.sh",
        "limit_footprint.sh",
    ] {
        copy_file(&gpu.join(name), &out.join("gpu").join(name))?;
    }
    copy_tree(&gpu.join("workloads"), &out.join("gpu/workloads"))?;
    // The runner's packages: the pure evaluation code and the phases.
    copy_tree(&gpu.join("acceptance"), &out.join("gpu/acceptance"))?;
    copy_tree(&gpu.join("runner"), &out.join("gpu/runner"))?;
    let programs = root.join("testing").join("programs");
    let mut n_programs = 0;
    if programs.is_dir() {
        for entry in sorted_entries(&programs)? {
            if entry.extension().is_some_and(|e| e == "c" || e == "h") {
                copy_file(&entry, &out.join("programs").join(file_name(&entry)?))?;
                n_programs += 1;
            }
        }
        // `hami_cuda.h` and `hami_nvml.h`, beside the programs that include them (a quoted
        // `#include` finds them there first).
        let include = programs.join("include");
        if include.is_dir() {
            for entry in sorted_entries(&include)? {
                if entry.extension().is_some_and(|e| e == "h") {
                    copy_file(&entry, &out.join("programs").join(file_name(&entry)?))?;
                }
            }
        }
    }
    old_glibc(root, &out)?;
    if n_programs == 0 {
        eprintln!("gpu-bundle: warning: no C programs in testing/programs (cudaprobe.c)");
    }

    let mut manifest = String::from(
        "hami-rs GPU bundle. On the GPU machine (carry this folder):\n\
         \x20 python3 gpu-bundle/gpu/run_acceptance.py --out $OUT\n\n",
    );
    manifest += &format!("commit: {}\n", git_describe(root));
    for (name, _) in &binaries {
        let bytes = fs::read(out.join(name))?;
        manifest += &format!(
            "{name}: {} bytes, needs glibc {}\n",
            bytes.len(),
            glibc_needed(&bytes).unwrap_or_else(|| "(none)".into())
        );
    }
    let files = list_files(&out)?;
    manifest += "files:\n";
    for (p, size) in &files {
        manifest += &format!(
            "  {size:>10}  {}\n",
            p.strip_prefix(&out).unwrap_or(p).display()
        );
    }
    fs::write(out.join("MANIFEST.txt"), &manifest)?;

    let total = bundle_size(&out)?;
    print!("{manifest}");
    println!(
        "gpu-bundle: {} ({:.1} MiB in {} files)",
        out.display(),
        total as f64 / (1024.0 * 1024.0),
        files.len() + 1
    );
    check_size(total)?;
    Ok(out)
}

/// `CARGO_TARGET_DIR` (relative to `root` if relative), else `<root>/target`.
pub(crate) fn target_dir(root: &Path) -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(d) if !d.is_empty() => {
            let d = PathBuf::from(d);
            if d.is_absolute() {
                d
            } else {
                root.join(d)
            }
        }
        _ => root.join("target"),
    }
}

/// Fail if `total` bytes is over [`MAX_BUNDLE_BYTES`].
fn check_size(total: u64) -> Result<()> {
    if total > MAX_BUNDLE_BYTES {
        bail!(
            "bundle is {:.1} MiB, over the {} MiB limit",
            total as f64 / (1024.0 * 1024.0),
            MAX_BUNDLE_BYTES / (1024 * 1024)
        );
    }
    Ok(())
}

fn file_name(p: &Path) -> Result<&std::ffi::OsStr> {
    p.file_name()
        .with_context(|| format!("{} has no file name", p.display()))
}

pub(crate) fn copy_file(src: &Path, dst: &Path) -> Result<()> {
    if let Some(parent) = dst.parent() {
        fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
    }
    fs::copy(src, dst)
        .with_context(|| format!("copying {} to {}", src.display(), dst.display()))?;
    Ok(())
}

fn sorted_entries(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut v = Vec::new();
    for e in fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        v.push(e?.path());
    }
    v.sort();
    Ok(v)
}

/// Copy a folder's files recursively, leaving out Python caches.
pub(crate) fn copy_tree(src: &Path, dst: &Path) -> Result<()> {
    for entry in sorted_entries(src)? {
        let name = file_name(&entry)?;
        if name == "__pycache__" || entry.extension().is_some_and(|e| e == "pyc") {
            continue;
        }
        if entry.is_dir() {
            copy_tree(&entry, &dst.join(name))?;
        } else {
            copy_file(&entry, &dst.join(name))?;
        }
    }
    Ok(())
}

/// `strip --strip-unneeded` (keeps the dynamic symbols the preload exports).
pub(crate) fn strip(p: &Path) -> Result<()> {
    let status = Command::new("strip")
        .arg("--strip-unneeded")
        .arg(p)
        .status();
    match status {
        Ok(s) if s.success() => Ok(()),
        Ok(s) => bail!("strip {} failed with {s}", p.display()),
        Err(e) => {
            eprintln!(
                "gpu-bundle: warning: cannot run strip ({e}); {} left unstripped",
                p.display()
            );
            Ok(())
        }
    }
}

fn list_files(dir: &Path) -> Result<Vec<(PathBuf, u64)>> {
    let mut out = Vec::new();
    for entry in sorted_entries(dir)? {
        // Links are listed as links (the old glibc's loader and sonames are links, some of
        // them absolute: followed here they would name the host's files, or nothing).
        let meta =
            fs::symlink_metadata(&entry).with_context(|| format!("reading {}", entry.display()))?;
        if meta.is_dir() {
            out.extend(list_files(&entry)?);
        } else {
            out.push((entry, meta.len()));
        }
    }
    Ok(out)
}

fn bundle_size(dir: &Path) -> Result<u64> {
    Ok(list_files(dir)?.iter().map(|(_, s)| s).sum())
}

/// The glibc an ELF binary needs at least: the highest `GLIBC_2.N` among the versions its
/// `.gnu.version_r` section requires (what the dynamic loader checks). Strings elsewhere in
/// the file do not count: the preload's read-only data names `GLIBC_2.35` in a message
/// (`_dl_find_object`) that it does not need.
fn glibc_needed(bytes: &[u8]) -> Option<String> {
    use object::read::elf::{ElfFile64, FileHeader};
    let elf = ElfFile64::<object::Endianness>::parse(bytes).ok()?;
    let endian = elf.endian();
    let header = elf.elf_header();
    let sections = header.sections(endian, bytes).ok()?;
    let (mut needs, link) = sections.gnu_verneed(endian, bytes).ok()??;
    let strings = sections.strings(endian, bytes, link).ok()?;
    let mut names = Vec::new();
    while let Ok(Some((_, mut aux))) = needs.next() {
        while let Ok(Some(a)) = aux.next() {
            if let Ok(name) = a.name(endian, strings) {
                names.extend_from_slice(name);
                names.push(0);
            }
        }
    }
    max_glibc(&names)
}

/// The highest `GLIBC_2.N` version named in `bytes` (NUL-separated version names).
fn max_glibc(bytes: &[u8]) -> Option<String> {
    const PAT: &[u8] = b"GLIBC_2.";
    let mut best: Option<(u32, u32)> = None;
    let mut i = 0;
    while i + PAT.len() < bytes.len() {
        if &bytes[i..i + PAT.len()] == PAT {
            let rest = &bytes[i + PAT.len()..];
            let minor = leading_number(rest);
            if let Some((minor, used)) = minor {
                let patch = if rest.get(used) == Some(&b'.') {
                    leading_number(&rest[used + 1..]).map_or(0, |(p, _)| p)
                } else {
                    0
                };
                if best.is_none_or(|b| (minor, patch) > b) {
                    best = Some((minor, patch));
                }
            }
            i += PAT.len();
        } else {
            i += 1;
        }
    }
    best.map(|(m, p)| {
        if p == 0 {
            format!("2.{m}")
        } else {
            format!("2.{m}.{p}")
        }
    })
}

fn leading_number(b: &[u8]) -> Option<(u32, usize)> {
    let n = b.iter().take_while(|c| c.is_ascii_digit()).count();
    if n == 0 || n > 4 {
        return None;
    }
    std::str::from_utf8(&b[..n])
        .ok()?
        .parse()
        .ok()
        .map(|v| (v, n))
}

pub(crate) fn git_describe(root: &Path) -> String {
    let out = Command::new("git")
        .args(["describe", "--always", "--dirty"])
        .current_dir(root)
        .output();
    match out {
        Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout).trim().to_string(),
        _ => "unknown".into(),
    }
}

/// `oldglibc/`: Debian 11's glibc 2.31 (from `.tools/glibc-2.31`, `cargo xtask setup`) and
/// `cudaprobe` built for glibc 2.17 by zig, for `gpu/oldglibc_check.sh`: the released preload
/// and the real driver in a process of an older glibc (a container on an older base image).
fn old_glibc(root: &Path, out: &Path) -> Result<()> {
    use hami_test_harness::glibc;
    let src = root.join(glibc::OLD_GLIBC_DIR);
    anyhow::ensure!(
        glibc::OldGlibc::at(&src).is_some(),
        "no glibc 2.31 userland in {} (cargo xtask setup)",
        src.display()
    );
    let dst = out.join("oldglibc");
    // `cp -a`: the userland's symlinks (the loader, the libraries' sonames) stay links.
    fs::create_dir_all(&dst)?;
    run_checked(
        std::process::Command::new("cp")
            .arg("-a")
            .arg(&src)
            .arg(dst.join("root")),
    )?;
    eprintln!("==> gpu-bundle: cargo build --release -p fake-cuda (to link cudaprobe against)");
    run_checked(cargo(root).args(["build", "--release", "-p", "fake-cuda"]))?;
    let lib = target_dir(root).join("release");
    run_checked(
        std::process::Command::new(glibc::zig(root))
            .args(["cc", "-target", "x86_64-linux-gnu.2.17", "-O2", "-I"])
            .arg(root.join("testing/programs/include"))
            .arg("-o")
            .arg(dst.join("cudaprobe"))
            .arg(root.join("testing/programs/cudaprobe.c"))
            .arg(format!("-L{}", lib.display()))
            .args(["-lcuda", "-ldl", "-lpthread"]),
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn glibc_requirement_is_the_highest_version() {
        let bin = b"\0GLIBC_2.2.5\0GLIBC_2.34\0GLIBC_2.17\0GLIBC_PRIVATE\0GLIBC_2.3.4\0";
        assert_eq!(max_glibc(bin).as_deref(), Some("2.34"));
        assert_eq!(
            max_glibc(b"x GLIBC_2.2.5 y GLIBC_2.2.6").as_deref(),
            Some("2.2.6")
        );
        assert_eq!(max_glibc(b"no versions here"), None);
    }

    #[test]
    fn glibc_needed_reads_the_version_needs_not_strings() {
        // This test binary is an ELF that requires some GLIBC_2.x version, and it names a
        // higher one in a string that must not count.
        let me = fs::read(std::env::current_exe().unwrap()).unwrap();
        let needed = glibc_needed(&me).expect("a glibc version need");
        let marker = "GLIBC_2.99";
        assert!(me.windows(marker.len()).any(|w| w == marker.as_bytes()));
        assert_ne!(needed, "2.99");
        assert_eq!(
            max_glibc(&me).as_deref(),
            Some("2.99"),
            "the raw scan would say 2.99"
        );
        assert!(glibc_needed(b"not an ELF file").is_none());
    }

    #[test]
    fn size_limit() {
        assert!(check_size(MAX_BUNDLE_BYTES).is_ok());
        let e = check_size(MAX_BUNDLE_BYTES + 1).unwrap_err().to_string();
        assert!(e.contains("over the 60 MiB limit"), "{e}");
    }

    #[test]
    fn copy_tree_skips_python_caches() {
        let base = std::env::temp_dir().join(format!("hami-bundle-test-{}", std::process::id()));
        let src = base.join("src");
        fs::create_dir_all(src.join("__pycache__")).unwrap();
        fs::create_dir_all(src.join("sub")).unwrap();
        fs::write(src.join("a.py"), "x").unwrap();
        fs::write(src.join("a.pyc"), "x").unwrap();
        fs::write(src.join("__pycache__/a.cpython-312.pyc"), "x").unwrap();
        fs::write(src.join("sub/b.cu"), "yy").unwrap();
        let dst = base.join("dst");
        copy_tree(&src, &dst).unwrap();
        let files: Vec<String> = list_files(&dst)
            .unwrap()
            .into_iter()
            .map(|(p, _)| p.strip_prefix(&dst).unwrap().display().to_string())
            .collect();
        assert_eq!(files, vec!["a.py", "sub/b.cu"]);
        assert_eq!(bundle_size(&dst).unwrap(), 3);
        fs::remove_dir_all(&base).unwrap();
    }
}
