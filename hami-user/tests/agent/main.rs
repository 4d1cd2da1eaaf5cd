//! hami-user's integration tests, one test binary (`cargo test -p hami-user --test agent
//! [FILTER]`; a module's tests with `agent_e2e::`, `hostile_tenant::`, ...): one link instead
//! of one per file, and one process, so the tests that start an agent or load eBPF probes
//! share one lock ([`hami_test_harness::serial`]) and never overlap.
//!
//! * [`agent_e2e`]: the real `hami-agent` against the fake driver, with and without the
//!   preload.
//! * [`cli`]: the command line as scripts and log collectors see it.
//! * [`cluster`]: a real Prometheus scraping the agent, the chart's rules and the Helm chart.
//! * [`ebpf_smoke`]: the probes loaded into the kernel, each row's event checked.
//! * [`hami_swap`]: `deploy/hami-swap.sh` on fake host folders.
//! * [`hami_swap_interop`]: HAMi's real device-plugin start scripts (v2.4.0, v2.9.0,
//!   v2.10.0) with hami-rs's procedure, in a scratch root, under mapped libraries.
//! * [`hostile_tenant`]: a tenant cannot blind, kill or mislead the agent (issue 9).
//! * [`regressions`]: one test per bug fixed, each naming the bug it guards.
//! * [`short_lived`]: every short-lived unhooked process reported (issue 31).
//!
//! Needs root (CI runs as root) and the agent built with its eBPF object; without them the
//! root tests fail and say why, never skip.

mod common;

mod agent_e2e;
mod cli;
mod cluster;
mod ebpf_smoke;
mod hami_swap;
mod hami_swap_interop;
mod hostile_tenant;
mod regressions;
mod short_lived;
