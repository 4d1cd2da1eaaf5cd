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
//! ([`shim`]); the decisions live in plain Rust: [`accounting`] (charge / call / record),
//! [`context`] (contexts), [`pool_reservations`] (what stream-ordered pools hold reserved),
//! [`module_memory`] (module and library memory), [`lmem`] (context limits and local
//! memory), [`backstop`] (what no hook saw), [`gate`] (the compute share), [`policy`] (views
//! and estimates), [`proclist`] (NVML's process lists inside the container) with [`hostpid`]
//! (this process's host pid), [`config`]. [`glibc_compat`]: what glibc before 2.34 kept in
//! `libdl` and `libpthread`, found at run time. [`unwind`]: the panic guard's unwinder, linked in
//! so that no exec pays for `libgcc_s` (`docs/preload.md`, "At load").
//!
//! The modules form layers, each using only those below it (no cycle):
//! * [`hooks`] (with [`hooks::table`], our hooks' addresses) and [`dlsym`], the exports;
//! * [`measure`]: the real driver's and NVML's readings, the current context's device;
//! * [`state`]: the configuration, the region and this process's [`state::Holdings`];
//! * the tables they hold ([`accounting`], [`context`], [`pool_reservations`],
//!   [`module_memory`], [`lmem`], [`backstop`], [`gate`], [`hostpid`], [`devmap`]: which
//!   container device each CUDA ordinal is) and the plain helpers
//!   ([`ctx_devices`], `keymap`, [`spin`], [`policy`], [`proclist`], [`images`], [`config`],
//!   [`log`], [`refusals`], [`export_table`]);
//! * [`shim`], [`symbols`] (the real functions, by name) over [`real`], and [`cuda`] (the
//!   driver's types).

pub mod accounting;
pub mod backstop;
pub mod config;
pub mod context;
pub mod ctx_devices;
pub mod cuda;
pub mod devmap;
pub mod dlsym;
pub mod export_table;
pub mod gate;
pub mod glibc_compat;
pub mod graph_memory;
pub mod green;
pub mod hooks;
pub mod hostpid;
pub mod images;
pub(crate) mod keymap;
pub mod lmem;
#[macro_use]
pub mod log;
pub mod measure;
pub mod module_memory;
pub mod policy;
pub mod pool_reservations;
pub mod proclist;
pub mod real;
pub mod refusals;
pub mod shim;
pub mod spin;
pub mod state;
pub mod symbols;
pub mod unwind;
pub mod vmm;

/// Exported marker: lets `hami-agent` recognise this library by content whatever its file
/// name, e.g. when installed as HAMi-core's `/usr/local/vgpu/libvgpu.so` so that HAMi's device
/// plugin mounts it (`docs/deploy.md`). The value is the marker's own version.
#[no_mangle]
pub static hami_preload_marker: u32 = 1;
