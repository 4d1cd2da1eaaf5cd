//! Link flags for the preload library.
//!
//! Every exec of a container loads the preload (HAMi puts it in `/etc/ld.so.preload`), so the
//! link keeps what the dynamic loader does for it small (`docs/preload.md`, "At load"):
//! * `-z nodelete`: the library registers `pthread_atfork` handlers and a destructor; it must
//!   never be unloaded, even when a program `dlopen`s and `dlclose`s it.
//! * `-Bsymbolic`: the library's own references to its exports (the hook table, the
//!   `cuGetProcAddress` hooks, the marker) are bound at link time, not looked up by name in
//!   every exec (about 70 symbol lookups fewer).
//! * on x86_64, GCC's static unwinder instead of `libgcc_s.so.1` ([`static_unwinder`]).
//! * on x86_64, the code that runs in every exec (at load and at exit) placed together at the
//!   start of the executable segment ([`load_and_exit_code_together`]).
//! * on x86_64, `-z separate-loadable-segments` ([`page_aligned_segments`]).
//!
//! * glibc 2.17's symbol versions: the link takes glibc 2.17 stubs made by zig
//!   ([`glibc_floor`]).
//!
//! It also generates the hooked section of the symbol tables from the intercept table
//! (`build/hooked_rows.rs`).
use std::path::{Path, PathBuf};
use std::process::Command;

#[path = "build/glibc_floor.rs"]
mod glibc_floor;
#[path = "build/hooked_rows.rs"]
mod hooked_rows;

fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-z,nodelete");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-Bsymbolic");
    glibc_floor::apply(&["dl", "pthread"]);
    wrap_libdl_and_libpthread();
    static_unwinder();
    hooked_rows::generate();
    load_and_exit_code_together();
    page_aligned_segments();
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=CC");
    println!("cargo:rerun-if-env-changed=RUSTC_LINKER");
}

/// The functions glibc before 2.34 kept in `libdl.so.2` and `libpthread.so.0` that the
/// library (our code, std, the static unwinder) calls: every reference goes to
/// `__wrap_<name>` (`src/ffi/glibc_compat.rs`), which finds the function at run time, so that the
/// library does not name those two libraries (`DT_NEEDED`) and no exec loads them.
const WRAPPED: &[&str] = &[
    "dlopen",
    "dlvsym",
    "dladdr",
    "pthread_key_create",
    "__pthread_key_create",
    "pthread_key_delete",
    "pthread_setspecific",
    "pthread_once",
    "pthread_mutex_consistent",
    "pthread_mutex_timedlock",
    "pthread_mutex_trylock",
    "pthread_mutexattr_init",
    "pthread_mutexattr_destroy",
    "pthread_mutexattr_setpshared",
    "pthread_mutexattr_setrobust",
];

/// `--wrap=<name>` for each of [`WRAPPED`] (Linux GNU targets), and the list for the crate's
/// check (`$OUT_DIR/glibc_wrapped.rs`).
fn wrap_libdl_and_libpthread() {
    let var = |k: &str| std::env::var(k).unwrap_or_default();
    let out = PathBuf::from(var("OUT_DIR"));
    let gnu = var("CARGO_CFG_TARGET_OS") == "linux" && var("CARGO_CFG_TARGET_ENV") == "gnu";
    let names: &[&str] = if gnu { WRAPPED } else { &[] };
    for n in names {
        println!("cargo:rustc-cdylib-link-arg=-Wl,--wrap={n}");
    }
    let list = format!(
        "/// The names `build.rs` passes to `--wrap`.\n#[allow(dead_code)]\npub const WRAPPED_BY_LINK: &[&str] = &{names:?};\n"
    );
    if let Err(e) = std::fs::write(out.join("glibc_wrapped.rs"), list) {
        panic!("writing {}: {e}", out.join("glibc_wrapped.rs").display());
    }
}

/// Links `libgcc_eh.a` (whole: std's `-lgcc_s` comes first on the command line, and is then
/// dropped by `--as-needed`) and wraps its `_dl_find_object` (glibc 2.35) into
/// `hami_preload::ffi::unwind::find_object` (see `src/ffi/unwind.rs`). Only for x86_64 Linux GNU
/// targets and only when the C compiler that links knows the archive; otherwise the library
/// keeps `libgcc_s` (a build warning says so).
fn static_unwinder() {
    let var = |k: &str| std::env::var(k).unwrap_or_default();
    if var("CARGO_CFG_TARGET_ARCH") != "x86_64"
        || var("CARGO_CFG_TARGET_OS") != "linux"
        || var("CARGO_CFG_TARGET_ENV") != "gnu"
    {
        return;
    }
    // The compiler driver that links (`RUSTC_LINKER` when one is configured), else `$CC`,
    // else `cc` (rustc's default linker for the target).
    let cc = std::env::var_os("RUSTC_LINKER")
        .or_else(|| std::env::var_os("CC"))
        .unwrap_or_else(|| "cc".into());
    let found = Command::new(&cc)
        .arg("-print-file-name=libgcc_eh.a")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()))
        .filter(|p| p.is_absolute() && p.is_file());
    let Some(archive) = found else {
        println!(
            "cargo:warning={} -print-file-name=libgcc_eh.a found no archive: the preload keeps libgcc_s.so.1",
            cc.to_string_lossy()
        );
        return;
    };
    println!("cargo:rustc-cdylib-link-arg=-Wl,--wrap=_dl_find_object");
    println!("cargo:rustc-cdylib-link-arg=-Wl,--whole-archive");
    println!("cargo:rustc-cdylib-link-arg={}", archive.display());
    println!("cargo:rustc-cdylib-link-arg=-Wl,--no-whole-archive");
}

/// The linker script of [`load_and_exit_code_together`]: an addition to the linker's default
/// layout (`INSERT`), understood by GNU ld and lld.
const AT_LOAD_LD: &str = "\
/* hami-preload build.rs: the code every exec runs, at the start of the executable segment. */
SECTIONS
{
  .plt : { *(.plt) *(.iplt) }
  .text.hami_at_load : {
    *(.text._ZN12hami_preload5state7at_exit*)
    *(.text.*ARGV_INIT_ARRAY*init_wrapper*)
  }
}
INSERT BEFORE .text;
";

/// Every exec runs a few pieces of the library's code: `_init` (`.init`) and the C runtime's
/// `frame_dummy` at load, std's argv capture (`.init_array`), and at exit the C runtime's
/// `__do_global_dtors_aux` (which calls `__cxa_finalize` through the PLT) and
/// `state::at_exit` (`.fini_array`). The kernel maps the file's pages on the first touch of
/// each 64 KiB window (fault-around: up to 16 page-table entries per fault), so four pieces
/// spread over the 750 KiB of code cost four such faults in every exec. This places
/// `.plt`, `at_exit` and the argv capture right after `.init` and before `.text` (whose first
/// input is the C runtime's `crtbeginS.o`): one window. Only on x86_64 (where it is measured
/// and checked by `tests/preload/load.rs`); a pattern that stops matching (a renamed function)
/// leaves the default layout, which the test then reports.
fn load_and_exit_code_together() {
    let var = |k: &str| std::env::var(k).unwrap_or_default();
    if var("CARGO_CFG_TARGET_ARCH") != "x86_64" || var("CARGO_CFG_TARGET_OS") != "linux" {
        return;
    }
    let Some(out) = std::env::var_os("OUT_DIR") else {
        return;
    };
    let script = Path::new(&out).join("at_load.ld");
    if let Err(e) = std::fs::write(&script, AT_LOAD_LD) {
        println!(
            "cargo:warning=writing {}: {e}: the preload keeps the default code layout",
            script.display()
        );
        return;
    }
    println!("cargo:rustc-cdylib-link-arg=-Wl,-T,{}", script.display());
}

/// lld's `-z separate-loadable-segments`: every segment starts on a page of its own in the
/// file. By default lld packs the writable data segment (`.data`, then `.bss`) right after
/// the RELRO segment's last file page, so `.data` (3.4 KiB) straddled two pages and the
/// loader's zeroing of the `.bss` part of the second wrote, and copied, a page that no
/// relocation needs. Page-aligned, `.data` fits in one page and the rest of `.bss` is
/// anonymous memory that an exec does not touch: one copy-on-write fault fewer per exec.
/// GNU ld, whose layout starts the data after RELRO on a page boundary anyway, ignores the
/// option with a warning. Only on x86_64 (measured there).
fn page_aligned_segments() {
    let var = |k: &str| std::env::var(k).unwrap_or_default();
    if var("CARGO_CFG_TARGET_ARCH") != "x86_64" || var("CARGO_CFG_TARGET_OS") != "linux" {
        return;
    }
    println!("cargo:rustc-cdylib-link-arg=-Wl,-z,separate-loadable-segments");
}
