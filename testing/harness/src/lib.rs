//! Test support shared by every test of the workspace (the crates' integration tests, the
//! harness's own tests and `cargo xtask torture`/`demo`): one place for building the test
//! artifacts, compiling C programs, parsing the programs' output and handling processes.
//!
//! * [`artifacts`]: [`Artifacts::get`] builds (once per test binary) the fake driver, the fake
//!   NVML and the preload with the same profile and target dir as the running test, lays the
//!   fakes out as
//!   `<target>/<profile>/fake-driver/{libcuda.so.1,libcuda.so,libnvidia-ml.so.1,libnvidia-ml.so}`
//!   and compiles the C programs (`testing/programs/*.c`) into `<target>/<profile>/test-programs/`.
//! * [`glibc`]: what a built library needs of glibc ([`glibc::Needs`]), the zig whose glibc
//!   2.17 stubs the preload links against, and the older glibc userland ([`glibc::OldGlibc`])
//!   that the preload's tests run under a second time.
//! * [`programs`]: [`cc`], the one C compiler invocation, and its wrappers.
//! * [`sandbox`]: [`TestEnv`], one test's sandbox: a temp dir with its own fake-driver state
//!   file (`FAKE_CUDA_STATE`) and shared-region path (`CUDA_DEVICE_MEMORY_SHARED_CACHE`), and
//!   builders for commands running `cudaprobe` / `nvmlprobe` against the fakes, with or
//!   without the preload.
//! * [`lines`]: the one output-line parser ([`KvLine`], [`KvOutput`] for `hprobe`-style
//!   programs).
//! * [`probe`]: `cudaprobe`'s output ([`ProbeOutput`], [`OpLine`]); [`RunningProbe`] drives a
//!   probe that is still running (e.g. blocked in `wait`).
//! * [`nvml`]: `nvmlprobe`'s output ([`NvmlSnapshot`]).
//! * [`agent`]: [`AgentCommand`], a `hami-agent` command line (started, or run to its end),
//!   [`AgentProcess`], a running `hami-agent` (wait for ready, read its
//!   findings, report and metrics, stop), [`serial`], the one lock of the agent tests, and the
//!   parsers of what the agent prints.
//! * [`process`]: root check, line forwarding, process-group waits.
//!
//! Everything here is test support: failures to build or spawn panic with a clear message.
#![warn(missing_docs)]

pub mod agent;
pub mod artifacts;
pub mod glibc;
pub mod lines;
pub mod locate;
pub mod nvml;
pub mod probe;
pub mod process;
pub mod programs;
pub mod sandbox;

pub use agent::{
    audit_findings, audit_findings_for, audit_process, finding_line, get_metrics, inspect_json,
    parse_audit, serial, AgentCommand, AgentError, AgentOutput, AgentProcess, Serial, READY_LINE,
    READY_TIMEOUT,
};
pub use artifacts::{workspace_root, Artifacts};
pub use fake_state::{now_ns as device_clock_now_ns, BusyWindow};
pub use hami_common::config::ENV_REGION;
pub use lines::{field, parse_num, KvLine, KvOutput};
pub use nvml::{NvmlDevice, NvmlSnapshot};
pub use probe::{parse_probe_lines, OpLine, ProbeOutput, RunningProbe, LINE_TIMEOUT};
pub use process::{forward_lines, process_groups, require_root, wait_for_group_gone};
pub use programs::{cc, compile_c};
pub use sandbox::{SharedCopies, TestEnv, ENV_FAKE_STATE};

/// One MiB.
pub const MB: u64 = 1 << 20;
/// One GiB.
pub const GB: u64 = 1 << 30;
/// `CUDA_ERROR_OUT_OF_MEMORY`, the result of a refused allocation.
pub const CUDA_ERROR_OUT_OF_MEMORY: i64 = 2;
