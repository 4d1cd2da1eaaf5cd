//! The glibc floor of the preload: it links against stub libraries of glibc 2.17, so that
//! every versioned symbol it imports is at `GLIBC_2.17` or older and it loads in containers
//! whatever their base image (HAMi names the library in `/etc/ld.so.preload`, so a version
//! the running glibc lacks is a fatal loader error for every program there, `/bin/true`
//! included; docs/deploy.md, "The glibc floor").
//!
//! The stubs come from zig (PyPI's `ziglang`, installed in `.tools/zig` by `cargo xtask
//! setup`): zig knows every glibc release's symbols and versions (its `abilists`) and makes,
//! for a `<arch>-linux-gnu.2.17` target, `libc.so.6`, `libdl.so.2`, `libpthread.so.0`,
//! `libm.so.6`, `libutil.so.1`, the loader's stub, and a `libc_nonshared.a`
//! (the `stat` family and `atexit` wrappers that glibc before 2.33 kept out of `libc.so.6`).
//! Only zig's stubs are used; the link itself stays the usual one (the C compiler and lld
//! that rustc runs, `libgcc_eh.a`, the linker script and options of build.rs), which the
//! load tests and the exec benchmark measure.
//!
//! The stubs go to `$OUT_DIR/glibc-2.17/` with the link names `-lc`, `-ldl`, ... look for,
//! and that directory is searched before the system's for the cdylib only. On glibc 2.34 and
//! later `libdl.so.2` and `libpthread.so.0` are empty compatibility libraries; on older ones
//! they hold `dlopen` and the `pthread_key` / mutex-attribute family. The preload does not
//! name them (loading them would cost every exec): its build passes `dl` and `pthread` as
//! `empty` and reaches those functions at run time (`src/ffi/glibc_compat.rs`); the fakes link
//! them as every program linked on such a glibc does.
//!
//! The fake driver and fake NVML (`testing/fake-cuda`, `testing/fake-nvml`) include this file
//! in their build scripts too, so that the preload's tests can run under an older glibc
//! (`cargo xtask test`, `docs/deploy.md`).
//!
//! `HAMI_ZIG` names the zig binary to use instead of `.tools/zig/ziglang/zig`;
//! `HAMI_GLIBC_FLOOR=host` builds against the host's glibc instead (a warning says so; the
//! library then needs what the host's glibc gives, `tests/preload/load.rs` fails on it).
use std::path::{Path, PathBuf};
use std::process::Command;

/// The oldest glibc the preload supports (HAMi's own floor).
pub const FLOOR: &str = "2.17";

/// Link names and the stub each one takes, as zig names its files.
const STUBS: &[(&str, &str)] = &[
    ("libdl.so", "libdl.so.2"),
    ("libpthread.so", "libpthread.so.0"),
    ("libm.so", "libm.so.6"),
    ("libutil.so", "libutil.so.1"),
];

/// Makes the stubs and puts their directory on the cdylib's library path (see the module
/// documentation). Only for `*-linux-gnu`; a missing zig is a build error naming the fix.
///
/// `empty`: link names (`"pthread"`, `"dl"`) that get an empty archive instead of their stub:
/// the preload reaches those libraries' functions at run time (`src/ffi/glibc_compat.rs`) and
/// must not name them; what glibc 2.17 also has in `libc.so.6` (the `pthread_mutex_lock`
/// family) then binds there.
pub fn apply(empty: &[&str]) {
    println!("cargo:rerun-if-env-changed=HAMI_ZIG");
    println!("cargo:rerun-if-env-changed=HAMI_GLIBC_FLOOR");
    let var = |k: &str| std::env::var(k).unwrap_or_default();
    if var("CARGO_CFG_TARGET_OS") != "linux" || var("CARGO_CFG_TARGET_ENV") != "gnu" {
        return;
    }
    if var("HAMI_GLIBC_FLOOR") == "host" {
        println!(
            "cargo:warning=HAMI_GLIBC_FLOOR=host: the preload links against this machine's \
             glibc and will not load on an older one"
        );
        return;
    }
    let arch = var("CARGO_CFG_TARGET_ARCH");
    let out = PathBuf::from(var("OUT_DIR"));
    if let Err(e) = make_stubs(&arch, &out, empty) {
        panic!(
            "hami-preload links against glibc {FLOOR} stubs made by zig: {e}. Run `cargo xtask \
             setup` (it installs zig into .tools/zig), set HAMI_ZIG to a zig binary, or set \
             HAMI_GLIBC_FLOOR=host to link against this machine's glibc (not for release)"
        );
    }
}

/// The zig binary: `$HAMI_ZIG`, else `<workspace>/.tools/zig/ziglang/zig`.
fn zig() -> Result<PathBuf, String> {
    if let Some(z) = std::env::var_os("HAMI_ZIG").filter(|z| !z.is_empty()) {
        return Ok(PathBuf::from(z));
    }
    // The workspace root: the first directory above the crate with a Cargo.lock (the fake
    // driver's crates include this file too).
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap_or_default());
    let root = manifest
        .ancestors()
        .find(|d| d.join("Cargo.lock").is_file())
        .unwrap_or(&manifest);
    let z = root.join(".tools/zig/ziglang/zig");
    if z.is_file() {
        println!("cargo:rerun-if-changed={}", z.display());
        Ok(z)
    } else {
        Err(format!("no zig at {}", z.display()))
    }
}

fn make_stubs(arch: &str, out: &Path, empty: &[&str]) -> Result<(), String> {
    let zig = zig()?;
    let (zig_arch, loader) = match arch {
        "x86_64" => ("x86_64", "ld-linux-x86-64.so.2"),
        "aarch64" => ("aarch64", "ld-linux-aarch64.so.1"),
        other => return Err(format!("no glibc {FLOOR} loader name known for {other}")),
    };
    let work = out.join("glibc-floor-probe");
    std::fs::create_dir_all(&work).map_err(|e| format!("creating {}: {e}", work.display()))?;
    let src = work.join("empty.c");
    std::fs::write(&src, "int hami_glibc_floor_probe(void) { return 0; }\n")
        .map_err(|e| format!("writing {}: {e}", src.display()))?;
    // Linking any shared object for the target makes zig build the stubs into its cache;
    // `-v` prints the linker's command line, which names them.
    let o = Command::new(&zig)
        .arg("cc")
        .arg("-target")
        .arg(format!("{zig_arch}-linux-gnu.{FLOOR}"))
        .args(["-shared", "-v", "-o"])
        .arg(work.join("probe.so"))
        .arg(&src)
        .args(["-lc", "-ldl", "-lpthread", "-lm", "-lrt", "-lutil"])
        .env("ZIG_GLOBAL_CACHE_DIR", out.join("zig-cache"))
        .env("ZIG_LOCAL_CACHE_DIR", out.join("zig-cache"))
        .output()
        .map_err(|e| format!("running {}: {e}", zig.display()))?;
    let log = String::from_utf8_lossy(&o.stderr).into_owned();
    if !o.status.success() {
        return Err(format!("{} cc failed ({}): {log}", zig.display(), o.status));
    }
    let find = |name: &str| -> Result<PathBuf, String> {
        log.split_whitespace()
            .map(|t| PathBuf::from(t.trim_matches('"')))
            .find(|p| p.file_name().is_some_and(|f| f == name) && p.is_file())
            .ok_or_else(|| format!("zig's link names no {name} (zig cc -v printed: {log})"))
    };
    let dir = out.join(format!("glibc-{FLOOR}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    let copy = |from: &Path, name: &str| -> Result<PathBuf, String> {
        let to = dir.join(name);
        std::fs::copy(from, &to)
            .map_err(|e| format!("copying {} to {}: {e}", from.display(), to.display()))?;
        Ok(to)
    };
    let libc = copy(&find("libc.so.6")?, "libc.so.6")?;
    let nonshared = copy(&find("libc_nonshared.a")?, "libc_nonshared.a")?;
    let ld = copy(&find("libld.so.2")?, loader)?;
    for (link, stub) in STUBS {
        let name = link.trim_start_matches("lib").trim_end_matches(".so");
        if !empty.contains(&name) {
            copy(&find(stub)?, link)?;
        }
    }
    // `-lrt`: nothing. std links it for `clock_gettime` and `clock_nanosleep`, which glibc
    // 2.17 moved into `libc.so.6` (at `GLIBC_2.17`); librt's older copies would make
    // `librt.so.1` one more library every exec loads. Likewise the caller's `empty` ones.
    for name in std::iter::once("rt").chain(empty.iter().copied()) {
        let a = dir.join(format!("lib{name}.a"));
        std::fs::write(&a, "!<arch>\n").map_err(|e| format!("writing {}: {e}", a.display()))?;
    }
    // `-lc`: the stub, the static wrappers, and the loader (for `__tls_get_addr`) only where
    // used, as glibc's own `libc.so` script says.
    let script = format!(
        "/* hami-preload build.rs: glibc {FLOOR} stubs (build/glibc_floor.rs) */\n\
         GROUP ( {} {} AS_NEEDED ( {} ) )\n",
        libc.display(),
        nonshared.display(),
        ld.display()
    );
    std::fs::write(dir.join("libc.so"), script)
        .map_err(|e| format!("writing {}: {e}", dir.join("libc.so").display()))?;
    println!("cargo:rustc-cdylib-link-arg=-L{}", dir.display());
    Ok(())
}
