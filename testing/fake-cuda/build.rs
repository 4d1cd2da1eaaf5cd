//! Gives the library the soname of the real driver, and binds its own references to its own
//! functions (`-Bsymbolic-functions`): `cuGetProcAddress` returns the driver's own entry points
//! even when a preloaded library interposes the exported symbols, as the real driver does.
fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libcuda.so.1");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-Bsymbolic-functions");
    println!("cargo:rerun-if-changed=build.rs");
}
