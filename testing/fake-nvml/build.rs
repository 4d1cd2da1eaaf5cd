//! Gives the library the soname of the real NVML.
/// The same glibc 2.17 floor as the preload, so that the preload's tests can run under an
/// older glibc with the fakes (`hami-preload/build/glibc_floor.rs`).
#[path = "../../hami-preload/build/glibc_floor.rs"]
mod glibc_floor;

fn main() {
    glibc_floor::apply(&[]);
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libnvidia-ml.so.1");
    println!("cargo:rerun-if-changed=build.rs");
}
