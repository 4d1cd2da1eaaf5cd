//! Region file operations: create / open / validate, the robust process-shared lock, slot
//! registration, exact admission, and reclaim of dead processes' slots.
//!
//! The protocol and the crash-safety argument are in `docs/shared-region.md`.
//!
//! Hot path ([`Region::try_charge`], [`Region::uncharge`], [`Region::force_charge`]): no
//! system call (an uncontended robust mutex is a user-space compare-and-swap), no allocation,
//! the lock held for a handful of loads and stores.

mod admission;
mod compute;
mod file;
mod handle;
mod liveness;
mod lock;
mod slots;
mod snapshot;
mod types;

pub use compute::*;
pub use handle::*;
pub use liveness::*;
pub use snapshot::*;
pub use types::*;

#[cfg(test)]
mod tests;
