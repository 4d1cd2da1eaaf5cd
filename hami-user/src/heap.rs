//! The agent's heap (issue 31: memory flat under driver-copy churn). glibc's malloc keeps
//! what the agent frees: a large buffer freed after an `mmap`-served allocation raises the
//! threshold under which later ones come from the heap (so reading a driver's symbol table for
//! each fresh copy leaves the heap grown), and freed heap memory below the top is not given
//! back. The agent pins the threshold at start ([`pin_mmap_threshold`]) and gives free pages
//! back after each full discovery scan ([`give_back`]). Other C libraries: nothing is done.

/// Allocations of at least this many bytes are always served by `mmap` (and unmapped when
/// freed).
pub const MMAP_THRESHOLD: i32 = 256 << 10;

/// Pins glibc's `mmap` threshold at [`MMAP_THRESHOLD`] (setting it turns the dynamic
/// threshold off). Call once, before the agent's threads start.
pub fn pin_mmap_threshold() {
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt only changes allocator parameters; called before other threads exist.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD);
    }
}

/// Gives the heap's free pages back to the kernel (`malloc_trim(0)`).
pub fn give_back() {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim is thread-safe (it takes the arenas' locks).
    unsafe {
        libc::malloc_trim(0);
    }
}
