//! hami-preload: `libhami_preload.so`, loaded into CUDA applications with `LD_PRELOAD` (or
//! `/etc/ld.so.preload`), holds every process of a container to the container's GPU memory
//! quota, recorded in a shared region file (see `hami_common::region`).
//!
//! Nothing happens at load time; the first hooked call resolves the real driver, reads the
//! configuration (`docs/preload.md`) and opens the region. The driver is reached three ways,
//! all of them intercepted:
//! * exported functions with the driver's names ([`hooks`]);
//! * our `dlsym` ([`dlsym`]), which hands out the hooks for driver handles and keeps
//!   glibc's `RTLD_NEXT` semantics for everything else;
//! * `cuGetProcAddress(_v2)` ([`hooks::procaddr::cuGetProcAddress_v2`]), whose results are
//!   rewritten by address.
//!
//! The hooks ([`hooks`], one file per family) are thin, all defined with one prelude
//! ([`ffi::shim`]); the decisions live in plain Rust, in layers, each a folder named for what
//! it holds and importing only from its own layer or those below (no import runs up a layer:
//! `cargo xtask circles` checks it, `xtask/src/layers.rs`). Bottom to top:
//! * [`ffi`]: the foreign interface and the environment: [`ffi::cuda`] (the driver's and
//!   NVML's types, the `cuda-abi` crate's), [`ffi::symbols`] (the real functions, by name) over [`ffi::real`] (the
//!   real libraries and the real `dlsym`), [`ffi::shim`] (the hook prelude), [`ffi::unwind`]
//!   (the panic guard's unwinder, linked in so that no exec pays for `libgcc_s`:
//!   `docs/preload.md`, "At load"), [`ffi::log`], [`ffi::config`] (`docs/preload.md`),
//!   [`ffi::glibc_compat`] (what glibc before 2.34 kept in `libdl` and `libpthread`, found at
//!   run time);
//! * [`driver`]: the real driver's and NVML's answers, read or rewritten, with no table of
//!   ours: [`driver::devmap`] (which container device each CUDA ordinal is),
//!   [`driver::proclist`] (NVML's process lists inside the container), [`driver::export_table`]
//!   (NVML's private export table), [`driver::hostpid`] (this process's host pid);
//! * [`ledger`]: what the process is charged: [`ledger::accounting`] (charge / call /
//!   record) with its key map, its shards' lock ([`ledger::spin`]) and its context → device
//!   cache ([`ledger::ctx_devices`]), [`ledger::backstop`] (what no hook saw),
//!   [`ledger::refusals`], [`ledger::policy`] (views and estimates);
//! * [`objects`]: the driver's objects we keep track of: [`objects::context`] (contexts),
//!   [`objects::green`], [`objects::module_memory`] (module and library memory) with
//!   [`objects::images`], [`objects::pool_reservations`] (what stream-ordered pools hold
//!   reserved), [`objects::graph_memory`], [`objects::vmm`], [`objects::lmem`] (context limits
//!   and local memory);
//! * [`compute`]: the compute share: [`compute::gate`] and its process-wide switch
//!   ([`compute::arming`]);
//! * [`state`]: the configuration, the region and this process's [`state::Holdings`] (every
//!   table above);
//! * [`measure`]: the real driver's and NVML's readings combined with the process's tables
//!   (the context meter, the current context's device);
//! * the exports: [`hooks`] (with [`hooks::table`], our hooks' addresses) and [`dlsym`].

#[macro_use]
pub mod ffi;
pub mod compute;
pub mod dlsym;
pub mod driver;
pub mod hooks;
pub mod ledger;
pub mod measure;
pub mod objects;
pub mod state;

/// Exported marker: lets `hami-agent` recognise this library by content whatever its file
/// name, e.g. when installed as HAMi-core's `/usr/local/vgpu/libvgpu.so` so that HAMi's device
/// plugin mounts it (`docs/deploy.md`). The value is the marker's own version.
#[no_mangle]
pub static hami_preload_marker: u32 = 1;
