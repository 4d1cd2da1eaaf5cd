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
//!
//! It also generates the hooked section of the symbol tables from the intercept table
//! (`build/hooked_rows.rs`).
use std::path::PathBuf;
use std::process::Command;

#[path = "build/hooked_rows.rs"]
mod hooked_rows;

fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-z,nodelete");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-Bsymbolic");
    static_unwinder();
    hooked_rows::generate();
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=CC");
    println!("cargo:rerun-if-env-changed=RUSTC_LINKER");
}

/// Links `libgcc_eh.a` (whole: std's `-lgcc_s` comes first on the command line, and is then
/// dropped by `--as-needed`) and wraps its `_dl_find_object` (glibc 2.35) into
/// `hami_preload::unwind::find_object` (see `src/unwind.rs`). Only for x86_64 Linux GNU
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
