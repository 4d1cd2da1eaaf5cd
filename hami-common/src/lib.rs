//! Shared definitions for both halves of hami-rs.
//!
//! * [`layout`]: the on-disk / in-memory layout of the shared region file (one per container),
//!   documented in `docs/shared-region.md`.
//! * [`config`]: environment variable names and the parser of each kind of value.
//! * `env` (feature `std`): the environment contract, every variable read once, typed.
//! * [`array`]: the CUDA array footprint estimate shared by the preload and the probes.
//! * [`event`]: the structs the eBPF programs send to user space.
//! * [`intercept`]: the one list of functions the preload hooks and the agent probes.
//! * [`procfs`]: the one reader of the `/proc/<pid>/stat` and `NSpid` fields both halves use.
//! * [`uuid`]: the one GPU UUID formatter (`GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`).
//! * `region` (feature `std`): opening, creating, locking and updating a region.
//! * [`visible`]: `CUDA_VISIBLE_DEVICES` as the driver reads it, and which of the container's
//!   devices a process's CUDA ordinal is.
//! * `arbiter` (feature `std`): the node agent's decision of what each container may use of
//!   each GPU, and the rule the launch gate applies to it.
#![cfg_attr(not(feature = "std"), no_std)]
#![warn(missing_docs)]

pub mod array;
pub mod config;
pub mod event;
pub mod intercept;
#[cfg(not(target_arch = "bpf"))]
pub mod procfs;
// The BPF target has no 32-bit atomics, and the eBPF programs do not need the region layout.
#[cfg(not(target_arch = "bpf"))]
pub mod layout;

#[cfg(feature = "std")]
pub mod arbiter;
#[cfg(feature = "std")]
pub mod env;
#[cfg(feature = "std")]
pub mod region;
// Formatting code the eBPF programs have no use for.
#[cfg(not(target_arch = "bpf"))]
pub mod uuid;
#[cfg(not(target_arch = "bpf"))]
pub mod visible;
