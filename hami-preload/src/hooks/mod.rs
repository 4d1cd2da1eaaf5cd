//! The exported driver and NVML functions, each a thin shim defined with
//! `hook!` ([`crate::ffi::shim`]): the prelude (panic guard, real function, re-entry check),
//! then the raw arguments checked and converted, one call into plain-Rust policy
//! ([`crate::ledger::accounting`], [`crate::objects::context`], [`crate::objects::pool_reservations`],
//! [`crate::objects::module_memory`], [`crate::ledger::backstop`], [`crate::ledger::policy`]) with closures over the
//! real driver, and the result converted back. This file re-exports every hook ([`table`],
//! the hook addresses `dlsym` and `cuGetProcAddress` hand out, finds them here); the glue
//! they share (allocate-and-charge, release, refusal logging, the backstop's refresh and what
//! a destroyed context takes with it) is in [`shared`].
//!
//! * [`alloc`] — allocations and releases (pointers, handles, arrays, mipmapped arrays);
//! * [`pools`] — stream-ordered pools and synchronisations;
//! * [`modules`] — modules, libraries, lookups and launches;
//! * [`launch`] — the `cuLaunchKernel*`, cooperative and graph launches, and the launch
//!   gate's way in (its switch is [`crate::compute::arming`]);
//! * [`green`] — green contexts, admitted and charged as context memory;
//! * [`graphs`] — graphs with memory nodes: instantiation, upload, launch admission, trims;
//! * [`limits`] — context limits (`cuCtxSetLimit`) and the local memory launches reserve;
//! * [`context`] — context creation and destruction (and the host pid found around it);
//! * [`views`] — memory queries answered with the quota;
//! * [`nvml_procs`] — NVML's process lists narrowed to the container's processes;
//! * [`nvml_export`] — NVML's export table, whose process-list slots nvidia-smi reads, likewise;
//! * [`vmm`] — mapping, unmapping and retaining `cuMemCreate` handles;
//! * [`procaddr`] — `cuGetProcAddress(_v2)`;
//! * [`table`] — our hooks' addresses, generated from the hooked rows of the intercept table;
//! * [`shared`] — what several hooks share.
#![allow(non_snake_case)]

pub mod alloc;
pub mod context;
pub mod graphs;
pub mod green;
pub mod launch;
pub mod limits;
pub mod modules;
pub mod nvml_export;
pub mod nvml_procs;
pub mod pools;
pub mod procaddr;
pub mod shared;
pub mod table;
pub mod views;
pub mod vmm;

pub use alloc::*;
pub use context::*;
pub use graphs::*;
pub use green::*;
pub use launch::*;
pub use limits::*;
pub use modules::*;
pub use nvml_export::*;
pub use nvml_procs::*;
pub use pools::*;
pub use procaddr::*;
pub use views::*;
pub use vmm::*;
