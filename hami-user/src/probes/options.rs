//! What the caller chooses: the options of loading the probes ([`ProbeOptions`]) and of the
//! background discovery that attaches them ([`DiscoveryOptions`]).

use std::path::PathBuf;
use std::time::Duration;

/// Options for [`Probes::load`](super::Probes::load).
#[derive(Debug, Clone)]
pub struct ProbeOptions {
    /// TGID whose calls are ignored; default: this process.
    pub ignore_tgid: Option<u32>,
    /// Ring buffer size in bytes (power of two, multiple of the page size); default 4 MiB
    /// (64 Ki events of 64 bytes).
    pub ring_bytes: u32,
}

impl Default for ProbeOptions {
    fn default() -> Self {
        ProbeOptions {
            ignore_tgid: None,
            ring_bytes: 4 << 20,
        }
    }
}

/// Options for the background work started by [`Probes::spawn`](super::Probes::spawn).
#[derive(Debug, Clone)]
pub struct DiscoveryOptions {
    /// Where `/proc` is (tests may point elsewhere).
    pub proc_root: PathBuf,
    /// Period of libcuda discovery; `None` disables the background discovery (attach by hand
    /// with [`ProbeHandle::attach_libcuda`](super::ProbeHandle::attach_libcuda)).
    pub interval: Option<Duration>,
    /// Extra library files to attach at start (e.g. from the command line).
    pub extra: Vec<PathBuf>,
    /// Capacity of the event channel.
    pub channel_capacity: usize,
}

impl Default for DiscoveryOptions {
    fn default() -> Self {
        DiscoveryOptions {
            proc_root: PathBuf::from("/proc"),
            interval: Some(Duration::from_millis(500)),
            extra: Vec::new(),
            channel_capacity: 1 << 16,
        }
    }
}
