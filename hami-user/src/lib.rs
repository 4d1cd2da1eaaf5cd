//! hami-agent: the node agent that observes every libcuda allocation with eBPF and audits the
//! preload's shared regions against what it saw.
//!
//! The logic lives in plain modules that are tested without root or eBPF:
//! * [`procinfo`]: what `/proc` says about a process (container, `NSpid`, preload, region, env limits);
//! * [`state`]: per-process live allocations built from [`hami_abi::event::Event`]s (decoded once by `probes::decode_event`);
//! * [`access`]: whether a process may write its region file, from metadata only;
//! * [`compute`]: compute shares measured from NVML's per-process SM utilisation;
//! * [`findings`]: the pure rules that turn processes and region snapshots into findings;
//! * [`nvml`]: optional NVML queries (runs without NVML);
//! * [`identity`]: namespace, pod and container names from cgroup paths and kubelet logs;
//! * [`metrics`]: the Prometheus registry;
//! * [`http`]: the `/metrics` and `/healthz` endpoint (axum);
//! * [`agent`]: the event-fed core that ties them together;
//! * [`report`]: audit table / JSON and `inspect` output;
//! * [`cli`]: parsers of the command line's sizes and durations;
//! * [`tenantfs`]: opening and reading files that tenants name or control, safely;
//! * `probes` (eBPF loading, attaching, libcuda discovery, event stream).
#![warn(missing_docs)]

pub mod access;
pub mod agent;
pub mod cli;
pub mod compute;
pub mod findings;
pub mod heap;
pub mod http;
pub mod identity;
pub mod metrics;
pub mod nvml;
pub mod probes;
pub mod procinfo;
pub mod report;
pub mod runner;
pub mod state;
pub mod tenantfs;
