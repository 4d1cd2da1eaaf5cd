//! The errors of the probe subsystem ([`ProbeError`]): loading the eBPF object, attaching
//! its probes to a libcuda file, reading that file.

use std::io;
use std::path::PathBuf;

use aya::programs::ProgramError;

use super::discovery;

/// Errors of the probe subsystem.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    /// Loading eBPF programs needs root (CAP_BPF + CAP_PERFMON at least).
    #[error("loading eBPF programs needs root (running as uid {euid})")]
    NotRoot {
        /// Effective uid of this process.
        euid: u32,
    },
    /// The kernel has no BTF (`/sys/kernel/btf/vmlinux`) and the object failed to load.
    #[error("the kernel exposes no BTF (/sys/kernel/btf/vmlinux) and loading failed: {0}")]
    NoBtf(String),
    /// The agent was built with `AYA_BUILD_SKIP=1`: it carries no eBPF object.
    #[error("this hami-agent was built without its eBPF programs (AYA_BUILD_SKIP)")]
    NoObject,
    /// The kernel refused the object or one of its maps.
    #[error("loading the eBPF object failed: {0}")]
    Load(#[source] Box<aya::EbpfError>),
    /// The kernel refused a program (verifier log in the source).
    #[error("loading eBPF program `{name}` failed: {source}")]
    Program {
        /// Program name.
        name: String,
        /// The error.
        #[source]
        source: Box<ProgramError>,
    },
    /// A program or map is missing from the object (build mismatch).
    #[error("the eBPF object has no {0}")]
    Missing(String),
    /// A map could not be opened as the expected type.
    #[error("eBPF map `{name}`: {source}")]
    Map {
        /// Map name.
        name: &'static str,
        /// The error.
        #[source]
        source: Box<aya::maps::MapError>,
    },
    /// Attaching a probe failed for a reason other than the symbol being absent.
    #[error("attaching {symbol} in {path}: {source}")]
    Attach {
        /// Symbol (or tracepoint) name.
        symbol: String,
        /// Library path.
        path: PathBuf,
        /// The error.
        #[source]
        source: Box<ProgramError>,
    },
    /// The library file cannot be read.
    #[error("{path}: {source}")]
    File {
        /// Path.
        path: PathBuf,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// The library's symbols could not be read (malformed, or bigger than the agent reads).
    #[error("{path}: cannot read its symbols: {source}")]
    Elf {
        /// Path.
        path: PathBuf,
        /// The error.
        #[source]
        source: discovery::ElfError,
    },
    /// The file exports none of the probed functions (not a CUDA driver library).
    #[error("{0} exports none of the probed libcuda functions")]
    NotLibcuda(PathBuf),
    /// Registering the ring buffer with tokio failed (no runtime, or epoll refused it).
    #[error("registering the event ring buffer with tokio: {0}")]
    Runtime(#[source] io::Error),
    /// The probes were shut down ([`Probes::take_links`](super::Probes::take_links)): nothing
    /// more is attached.
    #[error("the probes are shut down")]
    Closed,
}
