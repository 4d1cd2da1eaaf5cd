//! hami-preload's integration tests, one test binary (`cargo test -p hami-preload --test
//! preload [FILTER]`; a module's tests with `hooks::`, `regressions::`, ...): one link instead
//! of one per file. Every test runs the real preload (`libhami_preload.so`, built once for the
//! binary by [`hami_test_harness::Artifacts`]) in processes of its own, each in its own sandbox
//! (its own region, fake-driver state and directory), so tests of different modules run side by
//! side in one process without sharing anything but the built artifacts.
//!
//! * [`alloc_path`]: the allocation path's context → device cache.
//! * [`bad_inputs`]: bad inputs at the hook boundary (issue 12).
//! * [`compute`]: the compute share and the launch gate against the fake device clock.
//! * [`config`]: configuration errors, region problems, programs that never use CUDA.
//! * [`context_admission`]: a context admitted before it is created (issue 17).
//! * [`device_memory`]: memory that arrives by other paths than plain allocations (issue 8).
//! * [`hooks`]: each hook, reached the three ways, enforces the quota; the tests' lists
//!   checked against the intercept table.
//! * [`limits`]: context limits and local memory (issue 17).
//! * [`load`]: what the built library costs every exec that loads it (dependencies, symbols,
//!   glibc floor).
//! * [`module_statics`]: module and library statics admitted from the image (issue 17).
//! * [`multiuser`]: one container, several users (issue 13; root).
//! * [`nvml_procs`]: NVML's process lists inside a container (issue 20).
//! * [`processes`]: several processes on one region: races, crashes, fork, exit.
//! * [`refusals`]: refusals logged and counted (issue 20).
//! * [`regressions`]: one test per bug fixed, each naming the bug it guards.
//!
//! [`support`] is this crate's part of the test support (hprobe, a 16 GiB sandbox); the rest is
//! the workspace's harness (`hami-test-harness`).

mod support;

mod alloc_path;
mod bad_inputs;
mod compute;
mod config;
mod context_admission;
mod device_memory;
mod hooks;
mod limits;
mod load;
mod module_statics;
mod multiuser;
mod nvml_procs;
mod processes;
mod refusals;
mod regressions;
