//! Unit tests of the agent core: synthetic events, a fake `/proc` tree, real region files.
#![allow(clippy::cloned_ref_to_slice_refs, clippy::field_reassign_with_default)]
use super::regions::monotonic_ns;
use super::*;
use crate::findings::{FindingKind, SlotLiveness};
use crate::nvml::NvmlSnapshot;
use crate::procinfo::tests::fake_proc;
use crate::state::tests::ev;
use hami_abi::layout::{RegionHeader, UsageKind, MAX_DEVICES};
use hami_common::region::RegionConfig;
use hami_common::region::{ProcessId, Region, SlotId};
use std::os::unix::fs::FileExt;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::time::Duration;

mod compute;
mod drops;
mod exited;
mod hooks;
mod nvml;
mod pidfd;
mod region_series;
mod verdicts;

const MIB: u64 = 1 << 20;
const NS: u64 = 4026599999;
const CID: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

struct World {
    _tmp: tempfile::TempDir,
    root: PathBuf,
}

impl World {
    fn new() -> World {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("proc");
        std::fs::create_dir_all(&root).unwrap();
        World { _tmp: tmp, root }
    }

    /// A container process; `hooked` maps the preload; its region is
    /// `/hami/r.cache` under its root.
    fn spawn(&self, pid: u32, nspid: u32, hooked: bool, limit: &str) {
        self.spawn_in(CID, pid, nspid, hooked, limit);
    }

    /// [`World::spawn`] in the container with id `cid`.
    fn spawn_in(&self, cid: &str, pid: u32, nspid: u32, hooked: bool, limit: &str) {
        let mut maps = vec!["/usr/lib/x86_64-linux-gnu/libcuda.so.1"];
        if hooked {
            maps.push("/usr/local/vgpu/libhami_preload.so");
        }
        fake_proc(
            &self.root,
            pid,
            5000 + pid as u64,
            &[pid, nspid],
            NS,
            &format!("0::/kubepods/besteffort/podx/{cid}\n"),
            &maps,
            &[
                ("CUDA_DEVICE_MEMORY_LIMIT", limit),
                ("CUDA_DEVICE_MEMORY_SHARED_CACHE", "/hami/r.cache"),
            ],
        );
    }

    fn kill(&self, pid: u32) {
        std::fs::remove_dir_all(self.root.join(pid.to_string())).unwrap();
    }

    /// Creates the region as the preload would, inside `pid`'s root, and hard-links it
    /// into the other roots (one file shared by the container).
    fn region(&self, pid: u32, limit: u64, others: &[u32]) -> Region {
        let path = self.root.join(format!("{pid}/root/hami/r.cache"));
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        let mut cfg = RegionConfig::default();
        cfg.limits[0] = limit;
        cfg.device_count = 1;
        let (r, _) = Region::open_or_create(&path, &cfg).unwrap();
        for o in others {
            let p = self.root.join(format!("{o}/root/hami/r.cache"));
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::hard_link(&path, &p).unwrap();
        }
        r
    }

    fn agent(&self, reclaim: bool) -> Agent {
        Agent::new(AgentOptions {
            proc_root: self.root.clone(),
            settle: Duration::from_millis(0),
            reclaim,
            ..Default::default()
        })
    }
}

fn register(r: &Region, pid: u32, nspid: u32, data: u64) -> SlotId {
    let who = ProcessId {
        pid: nspid,
        start_time: 5000 + pid as u64,
    };
    let s = r.register(who).unwrap();
    r.force_charge(s, 0, UsageKind::Context, 10 * MIB);
    if data > 0 {
        r.try_charge(s, 0, UsageKind::Data, data).unwrap();
    }
    s
}

fn kinds(fs: &[Finding]) -> Vec<(FindingKind, &'static str)> {
    let mut v: Vec<_> = fs.iter().map(|f| (f.kind, f.reason)).collect();
    v.sort();
    v
}

/// An event stamped now (`CLOCK_MONOTONIC`, like the probes').
fn ev_now(kind: EventKind, pid: u32, size: u64, addr: u64) -> Event {
    let mut e = ev(kind, pid, size, addr, 0);
    e.ts_ns = monotonic_ns();
    e
}

/// An NVML sample of one GPU (index 0, no UUID) listing `procs` as compute processes.
fn nvml_sample(procs: &[(u32, u64)]) -> NvmlSnapshot {
    let mut n = NvmlSnapshot {
        devices: vec![crate::nvml::GpuInfo {
            index: 0,
            uuid: None,
            total: Some(16 << 30),
            used: None,
        }],
        ..Default::default()
    };
    n.queried.insert(0);
    for &(pid, bytes) in procs {
        n.add_process(0, pid, Some(bytes), true);
    }
    n.finish();
    n
}
