//! The definitions both halves of hami-rs share byte for byte, `no_std` (also built for the
//! eBPF target, `bpfel-unknown-none`, by the agent's build script):
//!
//! * [`layout`]: the bytes of the shared region file (one per container), documented in
//!   `docs/shared-region.md`. Here because the preload (inside containers) and the agent (on
//!   the host) map the same bytes; the protocol that reads and writes them (locking,
//!   admission, reclaim) is `hami_common::region`. Not built for the BPF target (it has no
//!   32-bit atomics, and the programs do not read regions).
//! * [`event`]: the structs the eBPF programs send to user space. Here because the programs
//!   (`hami-ebpf`, `no_std`) write them and the agent (`hami-user`) reads them; their
//!   `aya::Pod` impls are behind the `user` feature (the agent's side, which has aya).
//! * [`intercept`]: the one list of functions the preload hooks and the agent probes. Here
//!   because it is read by three build graphs: the preload's build script, `hami-ebpf`'s
//!   build script and programs, and the agent.
//! * [`array`]: the CUDA array footprint estimate. Here because the preload charges it and
//!   the eBPF probes observe it: pure `const fn` arithmetic, no loops, callable from BPF.
//! * [`uuid`]: the one GPU UUID formatter (`GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`) of the
//!   16 raw bytes the region header records. Here because both halves write it (the
//!   preload matching CUDA devices to NVML's, the agent's reports and metrics); its
//!   `String` forms use `alloc`. Not built for the BPF target (no use there). The reading of
//!   UUID entries in `CUDA_VISIBLE_DEVICES` is part of the environment contract
//!   (`hami_common::visible`).
//!
//! What is not here is `std`-side protocol and contract, in `hami-common`: the region
//! operations (`region`), the environment variables (`config`, `env`, `visible`), the
//! arbiter's rule (`arbiter`) and the `/proc` reader (`procfs`).
#![no_std]
#![warn(missing_docs)]

// The `String` forms of `uuid` (host targets only: the BPF target builds `core` alone).
#[cfg(not(target_arch = "bpf"))]
extern crate alloc;

pub mod array;
pub mod event;
pub mod intercept;
// The BPF target has no 32-bit atomics, and the eBPF programs do not need the region layout.
#[cfg(not(target_arch = "bpf"))]
pub mod layout;
// Formatting code the eBPF programs have no use for.
#[cfg(not(target_arch = "bpf"))]
pub mod uuid;
