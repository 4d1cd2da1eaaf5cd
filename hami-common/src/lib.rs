//! The `std` side both halves of hami-rs share: the protocol of the shared region and the
//! environment contract. The bytes themselves (region layout, eBPF events, the intercept
//! table, UUIDs, the array estimate) are `hami_abi`'s, `no_std`.
//!
//! * [`region`]: opening, creating, locking and updating a region (the layout:
//!   `hami_abi::layout`, documented in `docs/shared-region.md`).
//! * [`config`]: environment variable names and the parser of each kind of value.
//! * [`env`]: the environment contract, every variable read once, typed.
//! * [`visible`]: `CUDA_VISIBLE_DEVICES` as the driver reads it, and which of the container's
//!   devices a process's CUDA ordinal is.
//! * [`arbiter`]: the node agent's decision of what each container may use of each GPU, and
//!   the rule the launch gate applies to it.
//! * [`procfs`]: the one reader of the `/proc/<pid>/stat` and `NSpid` fields both halves use.
#![warn(missing_docs)]

pub mod arbiter;
pub mod config;
pub mod env;
pub mod procfs;
pub mod region;
pub mod visible;
