//! Loading the `hami-ebpf` programs, attaching them to every libcuda file, and streaming
//! their events, decoded once ([`Event`]), to tokio.
//!
//! ```no_run
//! # async fn demo() -> Result<(), hami_user::probes::ProbeError> {
//! use hami_user::probes::{DiscoveryOptions, ProbeOptions, Probes};
//! let probes = Probes::load(&ProbeOptions::default())?;
//! let (mut events, handle) = probes.spawn(DiscoveryOptions::default())?;
//! while let Some(ev) = events.recv().await {
//!     println!("{ev:?} counters={:?}", handle.counters());
//! }
//! # Ok(()) }
//! ```

#[cfg(test)]
mod arch_tests;
mod attach;
pub mod discovery;
mod error;
mod handle;
mod options;
mod stamp;
mod stream;
mod teardown;

pub use attach::*;
pub use discovery::mapped::maps_dev;
pub use discovery::{discover_libcuda, parse_ld_so_cache};
pub use error::ProbeError;
pub use handle::{DiscoveryMemory, ProbeHandle, MEMORY_LOG_TARGET};
pub use options::{DiscoveryOptions, ProbeOptions};
pub use stream::{decode_event, ProbeCounters};
pub use teardown::ProbeLinks;
