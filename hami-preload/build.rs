//! Link flags for the preload library.
fn main() {
    // The library registers `pthread_atfork` and `atexit` handlers: it must never be unloaded,
    // even when a program `dlopen`s and `dlclose`s it.
    println!("cargo:rustc-cdylib-link-arg=-Wl,-z,nodelete");
    println!("cargo:rerun-if-changed=build.rs");
}
