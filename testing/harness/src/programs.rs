//! Compiling C test programs: [`cc`] is the one compiler invocation; the harness's own
//! programs (`testing/programs/*.c`), a crate's programs linked against the fake driver
//! ([`crate::Artifacts::compile_against_fake`]) and programs written by a test
//! ([`compile_c`]) all go through it.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::locate::{locate_target, workspace_root};

/// The C compiler for the artifacts' target: `$CC_<triple>` (cc-rs's convention, the
/// triple's `-` as `_`, e.g. `CC_aarch64_unknown_linux_gnu`) when the artifacts are built for
/// a target triple, else `$CC`, else `gcc`.
pub fn c_compiler() -> String {
    let (_, _, _, triple) = locate_target();
    triple
        .and_then(|t| std::env::var(format!("CC_{}", t.replace('-', "_"))).ok())
        .or_else(|| std::env::var("CC").ok())
        .filter(|c| !c.is_empty())
        .unwrap_or_else(|| "gcc".to_string())
}

/// Where `hami_cuda.h` and `hami_nvml.h` are, relative to the workspace root: the CUDA driver
/// API and NVML as the C programs use them, declared once (the system's `<cuda.h>` /
/// `<nvml.h>` where there is one, else a checked subset).
pub const CUDA_INCLUDE_DIR: &str = "testing/programs/include";

/// Compiles `src` into `out` with the C compiler ([`c_compiler`]): the command line is
/// `$CC -I<CUDA_INCLUDE_DIR> -o <tmp> <src> ARGS...` (so `-l...` in `args` come after the
/// source; every program can `#include "hami_cuda.h"` and `"hami_nvml.h"`). The output is
/// written under a temp name and renamed into place, so concurrent test binaries never run a
/// half-written program. Panics with the compiler's output if it fails.
///
/// Under an old glibc ([`crate::glibc::requested`]) the compiler is zig's (`zig cc -target
/// <arch>-linux-gnu.2.17`), so that the program runs on that glibc: one linked against the
/// host's needs its versions (`__libc_start_main@GLIBC_2.34`).
pub fn cc(src: &Path, out: &Path, args: &[&str]) {
    let name = out.file_name().and_then(|n| n.to_str()).unwrap_or("out");
    let tmp = out.with_file_name(format!(".{name}.tmp{}", std::process::id()));
    let (cc, prefix) = match crate::glibc::requested() {
        Some(_) => (
            crate::glibc::zig(&workspace_root()).display().to_string(),
            vec![
                "cc".to_string(),
                "-target".to_string(),
                format!(
                    "{}-linux-gnu.{}.{}",
                    std::env::consts::ARCH,
                    crate::glibc::FLOOR.0,
                    crate::glibc::FLOOR.1
                ),
            ],
        ),
        None => (c_compiler(), Vec::new()),
    };
    let o = Command::new(&cc)
        .args(&prefix)
        .arg("-I")
        .arg(workspace_root().join(CUDA_INCLUDE_DIR))
        .arg("-o")
        .arg(&tmp)
        .arg(src)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("running {cc} (needed to build {}): {e}", src.display()));
    assert!(
        o.status.success(),
        "compiling {}: {}\n{}",
        src.display(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    std::fs::rename(&tmp, out).unwrap_or_else(|e| panic!("rename to {}: {e}", out.display()));
}

/// Writes `source` as `<out>.c` and compiles it into `out` with [`cc`] (`-O0 <args>`; panics
/// with the compiler's output on failure). `-O0`: no identical-code folding (two symbols at
/// one address would fire both of the agent's probes).
pub fn compile_c(source: &str, out: &Path, args: &[&str]) {
    let src = out.with_extension("c");
    std::fs::write(&src, source).unwrap_or_else(|e| panic!("write {}: {e}", src.display()));
    let args: Vec<&str> = std::iter::once("-O0").chain(args.iter().copied()).collect();
    cc(&src, out, &args);
}

/// Compiles `testing/programs/<name>.c` into `out_dir/<name>` (`-O2 -Wall EXTRA...`).
pub(crate) fn compile(name: &str, out_dir: &Path, extra: &[&str]) -> PathBuf {
    let src = workspace_root()
        .join("testing/programs")
        .join(format!("{name}.c"));
    let out = out_dir.join(name);
    let mut args = vec!["-O2", "-Wall"];
    args.extend_from_slice(extra);
    cc(&src, &out, &args);
    out
}
