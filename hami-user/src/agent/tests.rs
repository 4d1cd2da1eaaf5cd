//! Unit tests of the agent core: synthetic events, a fake `/proc` tree, real region files.
#![allow(clippy::cloned_ref_to_slice_refs, clippy::field_reassign_with_default)]
use super::regions::monotonic_ns;
use super::*;
use crate::findings::FindingKind;
use crate::procinfo::tests::fake_proc;
use crate::state::tests::ev;
use hami_common::layout::{RegionHeader, UsageKind, MAX_DEVICES};
use hami_common::region::RegionConfig;
use hami_common::region::{ProcessId, Region, SlotId};
use std::os::unix::fs::FileExt;
use std::os::unix::fs::MetadataExt;

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

#[test]
fn lost_events_rebuild_from_the_region_and_count_again_after_a_quiet_moment() {
    let w = World::new();
    w.spawn(100, 7, true, "1g");
    let r = w.region(100, 1 << 30, &[]);
    let s = register(&r, 100, 7, 64 * MIB);
    // The free of 0x8000 was dropped: a phantom 32 MiB in the agent's books.
    let evs = [
        ev(EventKind::MemAlloc, 100, 64 * MIB, 0x7000, 0),
        ev(EventKind::MemAlloc, 100, 32 * MIB, 0x8000, 0),
    ];
    // Control: without the drop count, the phantom is a bypass.
    let mut blind = w.agent(false);
    for e in &evs {
        blind.on_event(e);
    }
    assert_eq!(
        kinds(&blind.tick(Instant::now()).raised),
        vec![(
            FindingKind::Bypass,
            findings::reason::OBSERVED_ABOVE_ACCOUNTED
        )]
    );
    let mut a = w.agent(false);
    for e in &evs {
        a.on_event(e);
    }
    assert!(a.note_dropped(5));
    assert!(!a.note_dropped(5), "same total: nothing new");
    let out = a.tick(Instant::now());
    assert!(out.raised.is_empty(), "{:?}", out.raised);
    let row = &a.process_rows()[0];
    assert_eq!(row.observed, 64 * MIB, "rebuilt from the region");
    assert_eq!(row.accounted, Some(64 * MIB));
    assert!(row
        .events_lost
        .as_deref()
        .is_some_and(|n| n.contains("events lost")));
    // Quiet moment: the process frees everything; the region says 0 data.
    r.uncharge(s, 0, UsageKind::Data, 64 * MIB);
    assert!(a.tick(Instant::now()).raised.is_empty());
    let row = &a.process_rows()[0];
    assert_eq!(row.events_lost, None);
    assert_eq!(row.observed, 0);
    // A stale queued event (stamped before the rebuild) is ignored; new ones count.
    a.on_event(&ev(EventKind::MemAlloc, 100, 8 * MIB, 0x9000, 0));
    assert_eq!(a.process_rows()[0].observed, 0);
    a.on_event(&ev_now(EventKind::MemAlloc, 100, 16 * MIB, 0xa000));
    let out = a.tick(Instant::now());
    assert_eq!(
        kinds(&out.raised),
        vec![(
            FindingKind::Bypass,
            findings::reason::OBSERVED_ABOVE_ACCOUNTED
        )]
    );
}

#[test]
fn process_learned_after_drops_that_started_before_is_marked() {
    let w = World::new();
    w.spawn(100, 7, true, "1g");
    let r = w.region(100, 1 << 30, &[]);
    register(&r, 100, 7, 64 * MIB);
    let mut a = w.agent(false);
    // The fake processes started at tick 5100, long before "now".
    a.note_dropped(1);
    a.on_event(&ev(EventKind::MemAlloc, 100, 96 * MIB, 0x7000, 0));
    assert!(a.tick(Instant::now()).raised.is_empty());
    assert!(a.process_rows()[0].events_lost.is_some());
}

#[test]
fn process_whose_every_event_was_dropped_is_found_after_the_drops() {
    let w = World::new();
    w.spawn(100, 7, false, "1g");
    let mut a = w.agent(false);
    a.started_at = Some(1); // it started after the agent
    assert!(a.tick(Instant::now()).raised.is_empty());
    assert!(a.process_rows().is_empty(), "no event: unknown");
    a.note_dropped(10);
    let out = a.tick(Instant::now());
    assert_eq!(
        kinds(&out.raised),
        vec![(FindingKind::Bypass, findings::reason::NO_PRELOAD)]
    );
    let rows = a.process_rows();
    assert_eq!(rows.len(), 1);
    assert!(rows[0].events_lost.is_some());
    assert!(rows[0]
        .baseline
        .as_deref()
        .is_some_and(|b| b.contains("attached late")));
}

#[test]
fn truncated_region_is_left_out_with_its_reason_and_reads_again_when_restored() {
    let w = World::new();
    w.spawn(100, 7, true, "1g");
    let r = w.region(100, 1 << 30, &[]);
    register(&r, 100, 7, 64 * MIB);
    let mut a = w.agent(false);
    a.on_event(&ev(EventKind::MemAlloc, 100, 64 * MIB, 0x7000, 0));
    assert!(a.tick(Instant::now()).raised.is_empty());
    let path = w.root.join("100/root/hami/r.cache");
    let good = std::fs::read(&path).unwrap();
    drop(r);
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(good.len() as u64 / 2)
        .unwrap();
    let out = a.tick(Instant::now());
    assert_eq!(
        kinds(&out.raised),
        vec![(FindingKind::Bypass, findings::reason::NO_REGION)]
    );
    assert!(
        out.raised[0].detail.contains("truncated"),
        "{}",
        out.raised[0].detail
    );
    let rows = a.region_rows();
    assert!(rows[0]
        .error
        .as_deref()
        .is_some_and(|e| e.contains("truncated")));
    assert!(rows[0].limits.is_empty());
    std::fs::write(&path, &good).unwrap();
    let out = a.tick(Instant::now());
    assert_eq!(out.cleared.len(), 1, "{:?}", out);
    assert_eq!(a.region_rows()[0].error, None);
}

#[test]
fn region_path_that_is_a_fifo_is_refused_without_blocking() {
    let w = World::new();
    w.spawn(100, 7, true, "1g");
    let dir = w.root.join("100/root/hami");
    std::fs::create_dir_all(&dir).unwrap();
    let c = std::ffi::CString::new(dir.join("r.cache").to_str().unwrap()).unwrap();
    // SAFETY: valid C string.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let mut a = w.agent(false);
    a.on_event(&ev(EventKind::MemAlloc, 100, 64 * MIB, 0x7000, 0));
    let out = a.tick(Instant::now());
    assert_eq!(
        kinds(&out.raised),
        vec![(FindingKind::Bypass, findings::reason::NO_REGION)]
    );
    assert!(
        out.raised[0].detail.contains("FIFO"),
        "{}",
        out.raised[0].detail
    );
}

#[test]
fn hooked_process_within_quota_has_no_finding() {
    let w = World::new();
    w.spawn(100, 7, true, "1g");
    let r = w.region(100, 1 << 30, &[]);
    register(&r, 100, 7, 64 * MIB);
    let mut a = w.agent(false);
    a.on_event(&ev(EventKind::MemAlloc, 100, 64 * MIB, 0x7000, 0));
    let out = a.tick(Instant::now());
    assert!(out.raised.is_empty(), "{:?}", out.raised);
    let rows = a.process_rows();
    assert_eq!(rows.len(), 1);
    let row = &rows[0];
    assert_eq!(row.container, CID);
    assert_eq!(row.nspid, Some(7));
    assert_eq!(row.hooked, Some(true));
    assert_eq!(row.region.as_deref(), Some("/hami/r.cache"));
    assert_eq!(row.accounted, Some(64 * MIB));
    assert_eq!(row.observed, 64 * MIB);
    assert_eq!(row.accounted_total, Some(74 * MIB));
    assert_eq!(row.limit, Some(1 << 30));
    assert_eq!(row.verdict, "ok");
    let u = a.usage();
    assert_eq!(u[0].observed, 64 * MIB);
    assert_eq!(u[0].accounted_data, 64 * MIB);
}

#[test]
fn unhooked_process_is_bypass_and_container_over_limit() {
    let w = World::new();
    w.spawn(100, 7, true, "100m");
    w.spawn(101, 8, false, "100m");
    let r = w.region(100, 100 * MIB, &[101]);
    register(&r, 100, 7, 60 * MIB);
    let mut a = w.agent(false);
    a.on_event(&ev(EventKind::MemAlloc, 100, 60 * MIB, 0x7000, 0));
    a.on_event(&ev(EventKind::MemAlloc, 101, 80 * MIB, 0x9000, 0));
    let out = a.tick(Instant::now());
    assert_eq!(
        kinds(&out.raised),
        vec![
            (FindingKind::Bypass, findings::reason::NO_PRELOAD),
            (
                FindingKind::OverLimit,
                findings::reason::OBSERVED_ABOVE_LIMIT
            ),
        ]
    );
    let b = out
        .raised
        .iter()
        .find(|f| f.kind == FindingKind::Bypass)
        .unwrap();
    assert_eq!(b.pid, Some(101));
    assert_eq!(b.bytes, 80 * MIB);
    assert_eq!(b.container, CID);
    // Standing findings are raised once; freeing clears the bypass's bytes but the
    // process stays a bypass (it allocated without the preload).
    assert!(a.tick(Instant::now()).raised.is_empty());
    a.on_event(&ev(EventKind::MemFree, 101, 0, 0x9000, 0));
    let out = a.tick(Instant::now());
    assert_eq!(
        kinds(&out.cleared),
        vec![(
            FindingKind::OverLimit,
            findings::reason::OBSERVED_ABOVE_LIMIT
        )]
    );
    let rows = a.process_rows();
    let r101 = rows.iter().find(|r| r.pid == 101).unwrap();
    assert_eq!(r101.verdict, "bypass");
    assert_eq!(r101.hooked, Some(false));
    // Exit drops it.
    a.on_event(&ev(EventKind::ProcessExit, 101, 0, 0, 0));
    assert_eq!(a.process_count(), 1);
    let out = a.tick(Instant::now());
    assert_eq!(
        kinds(&out.cleared),
        vec![(FindingKind::Bypass, findings::reason::NO_PRELOAD)]
    );
    assert_eq!(a.history().len(), 2);
}

/// Regression: a container whose region variable names a FIFO stalled the agent for
/// good (a read-only `open` of a FIFO waits for a writer; with `--reclaim` the writable
/// open failed and the read-only fallback blocked).
#[test]
fn region_path_at_a_fifo_is_an_error_not_a_hang() {
    let w = World::new();
    w.spawn(100, 7, true, "1g");
    let path = w.root.join("100/root/hami/r.cache");
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let c = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: c is a valid C string.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let d = std::sync::Arc::clone(&done);
    std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(20));
        if !d.load(std::sync::atomic::Ordering::SeqCst) {
            eprintln!("the agent's tick hung on a FIFO region path");
            std::process::abort();
        }
    });
    for reclaim in [false, true] {
        let mut a = w.agent(reclaim);
        a.on_event(&ev(EventKind::MemAlloc, 100, 64 * MIB, 0x7000, 0));
        a.tick(Instant::now());
        assert!(a.region_rows().is_empty());
        assert_eq!(a.process_count(), 1);
    }
    done.store(true, std::sync::atomic::Ordering::SeqCst);
}

#[test]
fn killed_process_leaks_its_slot_and_reclaim_frees_it() {
    let w = World::new();
    w.spawn(100, 7, true, "1g");
    let r = w.region(100, 1 << 30, &[]);
    register(&r, 100, 7, 512 * MIB);
    let mut a = w.agent(true);
    a.on_event(&ev(EventKind::MemAlloc, 100, 512 * MIB, 0x7000, 0));
    assert!(a.tick(Instant::now()).raised.is_empty());
    // SIGKILL: no exit handler ran; the slot still holds the memory.
    w.kill(100);
    let out = a.tick(Instant::now());
    assert_eq!(
        kinds(&out.raised),
        vec![(FindingKind::LeakedSlot, findings::reason::PROCESS_DEAD)]
    );
    assert_eq!(out.raised[0].bytes, 522 * MIB);
    assert_eq!(out.raised[0].nspid, Some(7));
    assert_eq!(out.reclaimed.len(), 1);
    assert_eq!(out.reclaimed[0].bytes, 522 * MIB);
    let snap = r.snapshot();
    assert!(snap.slots.is_empty());
    assert_eq!(snap.used[0], 0);
    // A new process can use the whole quota.
    w.spawn(102, 9, true, "1g");
    let s = register(&r, 102, 9, 0);
    r.try_charge(s, 0, UsageKind::Data, (1 << 30) - 10 * MIB)
        .unwrap();
    assert!(a.tick(Instant::now()).raised.is_empty());
    assert_eq!(a.reclaimed().len(), 1);
}

/// Each standing finding carries its workload's names (for `hami_finding`): a process's from
/// its container (the kubelet's log link), a leaked slot's (its process is gone) from its
/// region's; a finding that clears leaves the list.
#[test]
fn standing_findings_carry_their_workloads_names() {
    let w = World::new();
    let logs = w._tmp.path().join("var-log/containers");
    std::fs::create_dir_all(&logs).unwrap();
    std::fs::write(logs.join(format!("trainer-0_ml_main-{CID}.log")), "").unwrap();
    w.spawn(100, 7, true, "1g");
    w.spawn(101, 8, false, "1g");
    let r = w.region(100, 1 << 30, &[101]);
    register(&r, 100, 7, 64 * MIB);
    let mut a = Agent::new(AgentOptions {
        proc_root: w.root.clone(),
        settle: Duration::from_millis(0),
        log_root: w._tmp.path().join("var-log"),
        ..Default::default()
    });
    a.on_event(&ev(EventKind::MemAlloc, 100, 64 * MIB, 0x7000, 0));
    a.on_event(&ev(EventKind::MemAlloc, 101, 16 * MIB, 0x9000, 0));
    a.tick(Instant::now());
    // SIGKILL: the slot leaks; its finding has no live process, only the region.
    w.kill(100);
    let out = a.tick(Instant::now());
    let leak = out
        .raised
        .iter()
        .find(|f| f.kind == FindingKind::LeakedSlot)
        .expect("leaked slot");
    assert_eq!(leak.pid, None);
    let names = |a: &Agent| {
        let mut v: Vec<_> = a
            .finding_series()
            .into_iter()
            .map(|f| {
                let i = f.identity;
                (f.kind, f.reason, i.namespace, i.pod, i.container)
            })
            .collect();
        v.sort();
        v
    };
    let ml = |k, r: &'static str| {
        (
            k,
            r,
            "ml".to_string(),
            "trainer-0".to_string(),
            "main".to_string(),
        )
    };
    assert_eq!(
        names(&a),
        vec![
            ml(FindingKind::Bypass, findings::reason::NO_PRELOAD),
            ml(FindingKind::LeakedSlot, findings::reason::PROCESS_DEAD),
        ]
    );
    // The bypass exits: only the leak stands.
    a.on_event(&ev(EventKind::ProcessExit, 101, 0, 0, 0));
    a.tick(Instant::now());
    assert_eq!(
        names(&a),
        vec![ml(FindingKind::LeakedSlot, findings::reason::PROCESS_DEAD)]
    );
}

#[test]
fn reclaim_never_touches_a_live_process() {
    let w = World::new();
    w.spawn(100, 7, true, "1g");
    let r = w.region(100, 1 << 30, &[]);
    register(&r, 100, 7, 64 * MIB);
    let mut a = w.agent(true);
    // The agent sees no allocation: a fully observed live process with usage but no
    // allocations is reported, but never reclaimed.
    a.on_event(&ev(EventKind::CtxSetCurrent, 100, 0, 0xc, 0));
    let out = a.tick(Instant::now());
    assert_eq!(
        kinds(&out.raised),
        vec![(
            FindingKind::LeakedSlot,
            findings::reason::USAGE_WITHOUT_ALLOCATIONS
        )]
    );
    assert!(out.reclaimed.is_empty());
    assert_eq!(r.snapshot().slots.len(), 1);
}

#[test]
fn hand_edited_limit_is_tamper() {
    let w = World::new();
    w.spawn(100, 7, true, "1g");
    let r = w.region(100, 1 << 30, &[]);
    register(&r, 100, 7, 0);
    let mut a = w.agent(false);
    a.on_event(&ev(EventKind::CtxSetCurrent, 100, 0, 0xc, 0));
    assert!(a.tick(Instant::now()).raised.is_empty());
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(w.root.join("100/root/hami/r.cache"))
        .unwrap();
    let off = core::mem::offset_of!(RegionHeader, limits) as u64;
    f.write_all_at(&(8u64 << 30).to_le_bytes(), off).unwrap();
    let out = a.tick(Instant::now());
    assert_eq!(
        kinds(&out.raised),
        vec![(
            FindingKind::Tamper,
            findings::reason::LIMIT_DIFFERS_FROM_ENV
        )]
    );
    assert_eq!(out.raised[0].limit, Some(8 << 30));
    assert_eq!(out.raised[0].device, Some(0));
    let _ = MAX_DEVICES;
}

#[test]
fn process_running_before_the_agent_is_baselined_not_bypass() {
    let w = World::new();
    w.spawn(100, 7, true, "1g");
    let r = w.region(100, 1 << 30, &[]);
    register(&r, 100, 7, 500 * MIB);
    let mut a = w.agent(false);
    assert_eq!(a.baseline_scan(), vec![100]);
    // It allocates 10 MiB more after the agent attached, and frees an old buffer.
    a.on_event(&ev(EventKind::MemAlloc, 100, 10 * MIB, 0x7000, 0));
    a.on_event(&ev(EventKind::MemFree, 100, 0, 0x1000, 0));
    let out = a.tick(Instant::now());
    assert!(out.raised.is_empty(), "{:?}", out.raised);
    let row = &a.process_rows()[0];
    assert_eq!(
        row.baseline.as_deref(),
        Some("pre-existing, not observed from start")
    );
    assert_eq!(row.unmatched_frees, 1);
    assert_eq!(row.verdict, "ok");
}

fn libvgpu_process(w: &World, pid: u32, marker: bool) {
    libvgpu_process_env(w, pid, marker, &[("CUDA_DEVICE_MEMORY_LIMIT", "1g")]);
}

fn libvgpu_process_env(w: &World, pid: u32, marker: bool, env: &[(&str, &str)]) {
    fake_proc(
        &w.root,
        pid,
        5000 + pid as u64,
        &[pid, 7],
        NS,
        &format!("0::/kubepods/besteffort/podx/{CID}\n"),
        &[
            "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
            "/usr/local/vgpu/libvgpu.so",
        ],
        env,
    );
    let lib = w.root.join(format!("{pid}/root/usr/local/vgpu/libvgpu.so"));
    std::fs::create_dir_all(lib.parent().unwrap()).unwrap();
    let src = lib.with_extension("c");
    let body = if marker {
        "unsigned int hami_preload_marker = 1; int cuInit(unsigned f) { return f; }\n"
    } else {
        "int cuInit(unsigned f) { return f; }\n"
    };
    std::fs::write(&src, body).unwrap();
    hami_test_harness::cc(&src, &lib, &["-shared", "-fPIC"]);
}

#[test]
fn preload_installed_as_hamis_libvgpu_counts_as_hooked() {
    let w = World::new();
    libvgpu_process(&w, 100, true);
    let mut a = w.agent(false);
    a.on_event(&ev(EventKind::MemAlloc, 100, MIB, 0x7000, 0));
    assert_eq!(a.process_rows()[0].hooked, Some(true));
    // HAMi-core's own libvgpu.so (no marker) is not hami-preload.
    let w = World::new();
    libvgpu_process(&w, 101, false);
    let mut a = w.agent(false);
    a.on_event(&ev(EventKind::MemAlloc, 101, MIB, 0x7000, 0));
    assert_eq!(a.process_rows()[0].hooked, Some(false));
}

/// Issue 19: a node half migrated. A process on HAMi-core's libvgpu.so is reported as
/// `hami_core`, one asking to be unhooked (`CUDA_DISABLE_CONTROL=true`, HAMi's opt-out) or
/// in an allowlisted namespace as `unhooked`: never `bypass` (the critical alert), still in
/// the audit, and counted per hook for the migration panel.
#[test]
fn hami_core_and_unhooked_by_request_are_not_bypass_and_are_counted_by_hook() {
    let w = World::new();
    libvgpu_process(&w, 101, false); // HAMi-core
    libvgpu_process(&w, 102, true); // hami-preload as libvgpu.so
                                    // Another file than 101's (the fake maps give every file one inode).
    let maps = w.root.join("102/maps");
    let m = std::fs::read_to_string(&maps).unwrap();
    std::fs::write(&maps, m.replace(" 1234 ", " 5678 ")).unwrap();
    w.spawn(103, 9, false, "1g"); // no preload at all
    fake_proc(
        &w.root,
        104,
        5104,
        &[104, 11],
        NS,
        &format!("0::/kubepods/besteffort/podx/{CID}\n"),
        &["/usr/lib/x86_64-linux-gnu/libcuda.so.1"],
        &[
            ("CUDA_DISABLE_CONTROL", "true"),
            ("CUDA_OVERSUBSCRIBE", "true"),
        ],
    );
    let mut a = w.agent(false);
    for pid in [101, 102, 103, 104] {
        a.on_event(&ev(EventKind::MemAlloc, pid, MIB, 0x7000 + pid as u64, 0));
    }
    let out = a.tick(Instant::now());
    let mut got: Vec<(u32, FindingKind, &str)> = out
        .raised
        .iter()
        .filter(|f| f.pid != Some(102))
        .map(|f| (f.pid.unwrap(), f.kind, f.reason))
        .collect();
    got.sort();
    assert_eq!(
        got,
        vec![
            (
                101,
                FindingKind::HamiCore,
                findings::reason::HAMI_CORE_MAPPED
            ),
            (103, FindingKind::Bypass, findings::reason::NO_PRELOAD),
            (
                104,
                FindingKind::Unhooked,
                findings::reason::DISABLE_CONTROL
            ),
        ],
        "{:#?}",
        out.raised
    );
    let hc = out.raised.iter().find(|f| f.pid == Some(101)).unwrap();
    assert!(hc.detail.contains("HAMi-core"), "{}", hc.detail);
    assert!(!FindingKind::HamiCore.is_failure() && !FindingKind::Unhooked.is_failure());
    assert_eq!(
        a.hook_counts(),
        crate::metrics::HookCounts {
            hami_rs: 1,
            hami_core: 1,
            none: 2,
            oversubscribe: 1,
        }
    );
    // The rows of the audit still show each one.
    assert_eq!(a.process_rows().len(), 4);
}

#[test]
fn an_allowlisted_namespace_makes_an_unhooked_process_unhooked_not_bypass() {
    let w = World::new();
    w.spawn(103, 9, false, "1g");
    let logs = w._tmp.path().join("var-log/containers");
    std::fs::create_dir_all(&logs).unwrap();
    std::fs::write(logs.join(format!("infer-0_gpu-raw_main-{CID}.log")), "").unwrap();
    let mut a = Agent::new(AgentOptions {
        proc_root: w.root.clone(),
        settle: Duration::from_millis(0),
        log_root: w._tmp.path().join("var-log"),
        allow_unhooked_namespaces: vec!["gpu-raw".into()],
        ..Default::default()
    });
    a.on_event(&ev(EventKind::MemAlloc, 103, MIB, 0x7000, 0));
    let out = a.tick(Instant::now());
    assert_eq!(
        kinds(&out.raised),
        vec![(
            FindingKind::Unhooked,
            findings::reason::NAMESPACE_ALLOWLISTED
        )],
        "{:#?}",
        out.raised
    );
    // Another namespace: a bypass.
    let mut a = Agent::new(AgentOptions {
        proc_root: w.root.clone(),
        settle: Duration::from_millis(0),
        log_root: w._tmp.path().join("var-log"),
        allow_unhooked_namespaces: vec!["other".into()],
        ..Default::default()
    });
    a.on_event(&ev(EventKind::MemAlloc, 103, MIB, 0x7000, 0));
    let out = a.tick(Instant::now());
    assert_eq!(
        kinds(&out.raised),
        vec![(FindingKind::Bypass, findings::reason::NO_PRELOAD)]
    );
}

#[test]
fn region_leaves_the_metrics_and_is_closed_once_its_last_process_exits() {
    let w = World::new();
    w.spawn(100, 7, true, "1g");
    let r = w.region(100, 1 << 30, &[]);
    let s = register(&r, 100, 7, 64 * MIB);
    let mut a = w.agent(false);
    a.on_event(&ev(EventKind::MemAlloc, 100, 64 * MIB, 0x7000, 0));
    a.tick(Instant::now());
    assert_eq!(a.region_count(), 1);
    let series = a.region_series();
    // A 1-device region: one series, not one per possible device.
    assert_eq!(series.len(), 1, "{series:?}");
    assert_eq!(series[0].device, 0);
    assert_eq!(series[0].identity.container, &CID[..12]);
    let md = std::fs::metadata(w.root.join("100/root/hami/r.cache")).unwrap();
    let file = (md.dev(), md.ino());
    let open_before = fds_open_on(file);
    assert!(open_before >= 1, "the agent holds the region open");
    // The process exits cleanly: its slot is released, its exit event arrives.
    r.unregister(s);
    a.on_event(&ev(EventKind::ProcessExit, 100, 0, 0, 0));
    w.kill(100);
    a.tick(Instant::now());
    assert_eq!(a.region_count(), 0);
    assert!(a.region_series().is_empty());
    assert_eq!(a.released_regions(), 1);
    // Its descriptor is closed (a read on a helper thread may finish just after).
    let t = Instant::now();
    while fds_open_on(file) != open_before - 1 && t.elapsed() < Duration::from_secs(2) {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(fds_open_on(file), open_before - 1);
}

/// Descriptors of this process open on the file `(dev, inode)`.
fn fds_open_on((dev, ino): (u64, u64)) -> usize {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .flatten()
        .filter(|e| std::fs::metadata(e.path()).is_ok_and(|m| m.dev() == dev && m.ino() == ino))
        .count()
}

#[test]
fn region_series_account_every_usage_kind_pool_and_other_included() {
    let w = World::new();
    w.spawn(100, 7, true, "1g");
    let r = w.region(100, 1 << 30, &[]);
    let s = register(&r, 100, 7, 64 * MIB);
    r.force_charge(s, 0, UsageKind::Module, 2 * MIB);
    r.force_charge(s, 0, UsageKind::Pool, 32 * MIB);
    r.force_charge(s, 0, UsageKind::Other, 4 * MIB);
    let mut a = w.agent(false);
    a.on_event(&ev(EventKind::MemAlloc, 100, 64 * MIB, 0x7000, 0));
    a.tick(Instant::now());
    let series = a.region_series();
    assert_eq!(series.len(), 1, "{series:?}");
    // Context 10 + module 2 + data 64 + pool 32 + other 4.
    assert_eq!(series[0].accounted, 112 * MIB);
    assert_eq!(series[0].accounted_data, 64 * MIB);
}

#[test]
fn region_with_a_leaked_slot_stays() {
    let w = World::new();
    w.spawn(100, 7, true, "1g");
    let r = w.region(100, 1 << 30, &[]);
    register(&r, 100, 7, 64 * MIB);
    let mut a = w.agent(false);
    a.on_event(&ev(EventKind::MemAlloc, 100, 64 * MIB, 0x7000, 0));
    a.tick(Instant::now());
    w.kill(100);
    a.tick(Instant::now());
    assert_eq!(a.region_count(), 1);
    assert_eq!(a.region_series().len(), 1);
}

#[test]
fn region_series_cover_only_the_header_devices_and_name_their_uuid() {
    let w = World::new();
    w.spawn(100, 7, true, "1g");
    let path = w.root.join("100/root/hami/r.cache");
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let mut cfg = RegionConfig::default();
    // A global limit: every device slot carries it, but the container sees 2 GPUs.
    cfg.limits = [1 << 30; MAX_DEVICES];
    cfg.device_count = 2;
    let (r, _) = Region::open_or_create(&path, &cfg).unwrap();
    r.set_uuid(1, [0xab; 16]);
    register(&r, 100, 7, MIB);
    let mut a = w.agent(false);
    a.on_event(&ev(EventKind::MemAlloc, 100, MIB, 0x7000, 0));
    a.tick(Instant::now());
    let series = a.region_series();
    assert_eq!(
        series.iter().map(|s| s.device).collect::<Vec<_>>(),
        vec![0, 1]
    );
    assert_eq!(series[0].uuid, "");
    assert_eq!(series[1].uuid, "GPU-abababab-abab-abab-abab-abababababab");
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

#[test]
fn unhooked_process_listed_by_nvml_is_learned_and_reported_at_once() {
    let w = World::new();
    w.spawn(100, 7, true, "1g");
    w.spawn(101, 8, false, "1g");
    let r = w.region(100, 1 << 30, &[101]);
    register(&r, 100, 7, 0);
    let mut a = w.agent(false);
    // A pid NVML names that is not a CUDA process here (no libcuda mapped): left alone.
    fake_proc(&w.root, 102, 5102, &[102], NS, "0::/\n", &[], &[]);
    // No libcuda event, no baseline scan: only NVML knows it holds 512 MiB.
    a.set_nvml(Some(nvml_sample(&[
        (100, 10 * MIB),
        (101, 512 * MIB),
        (102, 64 * MIB),
    ])));
    assert_eq!(a.process_count(), 2);
    let out = a.tick(Instant::now());
    assert_eq!(
        kinds(&out.raised),
        vec![(FindingKind::Bypass, findings::reason::NO_PRELOAD)]
    );
    assert_eq!(out.raised[0].pid, Some(101));
    assert_eq!(out.raised[0].bytes, 512 * MIB);
    assert_eq!(out.raised[0].container, CID);
    let row = a.process_rows().into_iter().find(|r| r.pid == 101).unwrap();
    assert_eq!(row.nvml, Some(512 * MIB));
    assert_eq!(row.verdict, "bypass");
}

#[test]
fn without_nvml_an_unhooked_pre_existing_process_is_unverified() {
    let w = World::new();
    w.spawn(101, 8, false, "1g");
    let mut a = w.agent(false);
    a.set_nvml(None);
    assert_eq!(a.baseline_scan(), vec![101]);
    assert!(a.tick(Instant::now()).raised.is_empty());
    assert_eq!(a.process_rows()[0].verdict, "unverified");
    // With NVML listing nothing for it, it is known to hold nothing.
    a.set_nvml(Some(nvml_sample(&[])));
    a.tick(Instant::now());
    assert_eq!(a.process_rows()[0].verdict, "ok");
}

#[test]
fn nvml_drift_needs_two_samples_and_clears_when_accounted() {
    let w = World::new();
    w.spawn(100, 7, true, "1g");
    let r = w.region(100, 1 << 30, &[]);
    let s = register(&r, 100, 7, 64 * MIB);
    let mut a = w.agent(false);
    a.on_event(&ev(EventKind::MemAlloc, 100, 64 * MIB, 0x7000, 0));
    // The region accounts 10 MiB context + 64 MiB; NVML says 1.5 GiB more.
    let blind = 74 * MIB + 1536 * MIB;
    a.set_nvml(Some(nvml_sample(&[(100, blind)])));
    let t0 = Instant::now();
    assert!(a.tick(t0).raised.is_empty(), "one sample is not enough");
    assert!(a.tick(t0 + Duration::from_secs(1)).raised.is_empty());
    a.set_nvml(Some(nvml_sample(&[(100, blind)])));
    let out = a.tick(t0 + Duration::from_secs(2));
    assert_eq!(
        kinds(&out.raised),
        vec![
            (FindingKind::OverLimit, findings::reason::NVML_ABOVE_LIMIT),
            (FindingKind::Drift, findings::reason::NVML_ABOVE_ACCOUNTED),
        ]
    );
    let d = out
        .raised
        .iter()
        .find(|f| f.kind == FindingKind::Drift)
        .unwrap();
    assert_eq!(d.bytes, 1536 * MIB);
    assert_eq!(d.accounted, Some(74 * MIB));
    let rows = a.process_rows();
    assert_eq!(rows[0].verdict, "drift,over_limit");
    // The preload learns to charge it (as module memory here): the next sample agrees.
    r.force_charge(s, 0, UsageKind::Module, 1536 * MIB);
    a.set_nvml(Some(nvml_sample(&[(100, blind)])));
    let out = a.tick(t0 + Duration::from_secs(3));
    assert_eq!(
        kinds(&out.cleared),
        vec![(FindingKind::Drift, findings::reason::NVML_ABOVE_ACCOUNTED)]
    );
    // A single sample that disagrees again is not reported.
    a.set_nvml(Some(nvml_sample(&[(100, blind + (1 << 30))])));
    let out = a.tick(t0 + Duration::from_secs(4));
    assert!(
        out.raised.iter().all(|f| f.kind != FindingKind::Drift),
        "{:?}",
        out.raised
    );
}

#[test]
fn racy_findings_wait_for_the_settle_time() {
    let w = World::new();
    w.spawn(100, 7, true, "1g");
    let r = w.region(100, 1 << 30, &[]);
    let s = register(&r, 100, 7, 0);
    let mut a = Agent::new(AgentOptions {
        proc_root: w.root.clone(),
        settle: Duration::from_millis(200),
        ..Default::default()
    });
    // The alloc returned before the preload charged: transiently above accounted.
    a.on_event(&ev(EventKind::MemAlloc, 100, 64 * MIB, 0x7000, 0));
    let t0 = Instant::now();
    assert!(a.tick(t0).raised.is_empty());
    r.try_charge(s, 0, UsageKind::Data, 64 * MIB).unwrap();
    assert!(a.tick(t0 + Duration::from_millis(300)).raised.is_empty());
    // A real one persists.
    a.on_event(&ev(EventKind::MemAlloc, 100, 64 * MIB, 0x8000, 0));
    assert!(a.tick(t0 + Duration::from_millis(400)).raised.is_empty());
    let out = a.tick(t0 + Duration::from_millis(700));
    assert_eq!(
        kinds(&out.raised),
        vec![(
            FindingKind::Bypass,
            findings::reason::OBSERVED_ABOVE_ACCOUNTED
        )]
    );
}

/// A process first seen allocating without the preload asks for an early tick (its bypass
/// is reported at once, not at the next periodic tick); a hooked one does not, nor do later
/// allocations of a process already known; the tick clears the request.
#[test]
fn a_new_unhooked_allocating_process_asks_for_an_early_tick() {
    let w = World::new();
    w.spawn(100, 7, true, "1g");
    w.spawn(200, 8, false, "1g");
    let r = w.region(100, 1 << 30, &[]);
    register(&r, 100, 7, 64 * MIB);
    let mut a = w.agent(false);
    a.on_event(&ev(EventKind::MemAlloc, 100, 64 * MIB, 0x7000, 0));
    assert!(!a.wants_early_tick(), "hooked");
    a.on_event(&ev(EventKind::MemAlloc, 200, 8 * MIB, 0x9000, 0));
    assert!(a.wants_early_tick(), "new and unhooked");
    let out = a.tick(Instant::now());
    assert!(!a.wants_early_tick(), "cleared by the tick");
    assert_eq!(
        kinds(&out.raised),
        vec![(FindingKind::Bypass, findings::reason::NO_PRELOAD)]
    );
    a.on_event(&ev(EventKind::MemAlloc, 200, 8 * MIB, 0xa000, 0));
    assert!(!a.wants_early_tick(), "already known");
}

// ---- Liveness through pidfds ----

use std::os::fd::RawFd;
use std::sync::Mutex;

/// The pidfd tests count the test process's pidfds: one at a time.
static PIDFD_TESTS: Mutex<()> = Mutex::new(());

fn pidfd_lock() -> std::sync::MutexGuard<'static, ()> {
    PIDFD_TESTS.lock().unwrap_or_else(|e| e.into_inner())
}

/// Pidfds open in this (test) process.
fn pidfds_open() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .flatten()
        .filter(|e| {
            std::fs::read_link(e.path()).is_ok_and(|l| l.to_string_lossy().contains("pidfd"))
        })
        .count()
}

/// A real child process (`sleep`), killed and reaped when dropped.
struct Kid(std::process::Child);

impl Kid {
    fn spawn() -> Kid {
        Kid(std::process::Command::new("sleep")
            .arg("120")
            .spawn()
            .unwrap())
    }

    fn pid(&self) -> u32 {
        self.0.id()
    }

    /// SIGKILL, then wait until it is a zombie (not reaped: its pid stays taken).
    fn kill_unreaped(&mut self) {
        self.0.kill().unwrap();
        let t0 = Instant::now();
        while !procinfo::read_stat(Path::new("/proc"), self.pid()).is_ok_and(|s| s.is_dead()) {
            assert!(t0.elapsed() < Duration::from_secs(10), "child not dead");
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

impl Drop for Kid {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The runtime whose reactor watches the tests' pidfds (its worker waits in `epoll_wait`
/// when idle, as the agent's do).
fn test_rt() -> &'static tokio::runtime::Runtime {
    static RT: std::sync::OnceLock<tokio::runtime::Runtime> = std::sync::OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_io()
            .build()
            .unwrap()
    })
}

impl Agent {
    /// Tests: watch through pidfds on a fake tree whose pids are real processes.
    fn force_exit_watch(&mut self) -> &mut pidfds::ExitWatch {
        self.exits
            .insert(pidfds::ExitWatch::new(test_rt().handle().clone()))
    }

    fn pidfd_of(&self, pid: u32) -> Option<RawFd> {
        self.entries.get(&pid)?.pidfd.as_ref().map(|p| p.raw())
    }

    /// Waits until the reactor has seen `pid`'s pidfd readable (moments after the kernel
    /// signalled the exit: the next tick then drops it).
    fn wait_exit_seen(&self, pid: u32) {
        let t0 = Instant::now();
        let p = self.entries[&pid].pidfd.as_ref().expect("watched");
        while p.exited() != Some(true) {
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "exit of {pid} not seen"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

/// An agent on this kernel's `/proc`, made inside [`test_rt`] (as the agent is made inside
/// its runtime).
fn real_agent() -> Agent {
    let _rt = test_rt().enter();
    Agent::new(AgentOptions {
        settle: Duration::from_millis(0),
        ..Default::default()
    })
}

#[test]
fn exit_watch_only_on_the_agents_own_procfs() {
    assert!(pidfds::is_own_procfs(Path::new("/proc")));
    let w = World::new();
    assert!(!pidfds::is_own_procfs(&w.root));
    // A fake tree's pids are not ours to open.
    assert!(w.agent(false).exits.is_none());
    assert!(real_agent().exits.is_some());
    // Outside a runtime: no reactor to watch pidfds, the stat path.
    let outside = Agent::new(AgentOptions::default());
    assert!(outside.exits.is_none());
    // Nor inside a current-thread runtime (its reactor runs only while it awaits).
    let ct = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
        .unwrap();
    let _ct = ct.enter();
    assert!(Agent::new(AgentOptions::default()).exits.is_none());
}

#[test]
fn exited_process_is_dropped_on_the_next_tick_without_a_stat_read_of_the_others() {
    let _g = pidfd_lock();
    let mut kids: Vec<Kid> = (0..3).map(|_| Kid::spawn()).collect();
    let mut a = real_agent();
    for k in &kids {
        a.on_event(&ev(EventKind::MemAlloc, k.pid(), MIB, 0x1000, 0));
        assert!(a.pidfd_of(k.pid()).is_some(), "pid {} watched", k.pid());
    }
    assert_eq!(a.process_count(), 3);
    a.tick(Instant::now());
    assert_eq!(a.process_count(), 3);
    procinfo::tests::take_stat_reads();
    a.tick(Instant::now());
    assert_eq!(
        procinfo::tests::take_stat_reads(),
        Vec::<u32>::new(),
        "a quiet tick reads no /proc/<pid>/stat"
    );
    kids[0].kill_unreaped();
    a.wait_exit_seen(kids[0].pid());
    a.tick(Instant::now());
    let reads = procinfo::tests::take_stat_reads();
    assert_eq!(
        a.process_count(),
        2,
        "the zombie is dropped on the next tick"
    );
    assert!(!a.entries.contains_key(&kids[0].pid()));
    let others = [kids[1].pid(), kids[2].pid()];
    assert!(
        !reads.iter().any(|p| others.contains(p)),
        "live processes' stat read: {reads:?}"
    );
}

#[test]
fn pidfds_are_closed_when_their_processes_go() {
    let _g = pidfd_lock();
    let before = pidfds_open();
    let mut kids: Vec<Kid> = (0..6).map(|_| Kid::spawn()).collect();
    let mut a = real_agent();
    for k in &kids {
        a.on_event(&ev(EventKind::MemAlloc, k.pid(), MIB, 0x1000, 0));
    }
    assert_eq!(pidfds_open(), before + 6, "one pidfd per tracked process");
    // Three exit unseen (the pidfd notices), one through its exit event.
    for k in &mut kids[..3] {
        k.kill_unreaped();
        a.wait_exit_seen(k.pid());
    }
    a.on_event(&ev(EventKind::ProcessExit, kids[3].pid(), 0, 0, 0));
    kids[3].kill_unreaped();
    a.tick(Instant::now());
    assert_eq!(a.process_count(), 2);
    assert_eq!(pidfds_open(), before + 2);
    // Processes coming and going: the count does not grow.
    for _ in 0..5 {
        let mut k = Kid::spawn();
        a.on_event(&ev(EventKind::MemAlloc, k.pid(), MIB, 0x1000, 0));
        a.tick(Instant::now());
        assert_eq!(pidfds_open(), before + 3);
        k.kill_unreaped();
        a.wait_exit_seen(k.pid());
        drop(k);
        a.tick(Instant::now());
        assert_eq!(a.process_count(), 2);
        assert_eq!(pidfds_open(), before + 2);
    }
    drop(a);
    assert_eq!(pidfds_open(), before, "the agent closes its pidfds");
}

#[test]
fn pidfd_of_a_reused_pid_is_refused() {
    let _g = pidfd_lock();
    let kid = Kid::spawn();
    let w = World::new();
    w.spawn(kid.pid(), 7, true, "1g");
    let before = pidfds_open();
    let mut watch = pidfds::ExitWatch::new(test_rt().handle().clone());
    // The facts were read of a process that started at 42: the pid's process now started
    // at another time, so the pidfd names another process.
    assert!(watch.watch(&w.root, kid.pid(), Some(42)).is_none());
    assert_eq!(pidfds_open(), before, "refused pidfd closed");
    let p = watch
        .watch(&w.root, kid.pid(), Some(5000 + kid.pid() as u64))
        .expect("same start time");
    assert_eq!(p.start_time, 5000 + kid.pid() as u64);
    assert_eq!(pidfds_open(), before + 1);
}

#[test]
fn slot_of_an_older_process_with_a_watched_pid_is_reused_not_alive() {
    let _g = pidfd_lock();
    let kid = Kid::spawn();
    let pid = kid.pid();
    let w = World::new();
    w.spawn(pid, 7, true, "1g");
    let r = w.region(pid, 1 << 30, &[]);
    // The slot of an earlier process that had nspid 7 and died without releasing it.
    let old = r
        .register(ProcessId {
            pid: 7,
            start_time: 42,
        })
        .unwrap();
    r.try_charge(old, 0, UsageKind::Data, 64 * MIB).unwrap();
    let mut a = w.agent(false);
    a.force_exit_watch();
    a.on_event(&ev(EventKind::CtxSetCurrent, pid, 0, 0xc, 0));
    assert!(a.pidfd_of(pid).is_some());
    let out = a.tick(Instant::now());
    let l: Vec<SlotLiveness> = a.regions[0].liveness.values().cloned().collect();
    assert_eq!(
        l,
        vec![SlotLiveness::Reused {
            host_pid: pid,
            start_time: 5000 + pid as u64
        }]
    );
    assert!(
        kinds(&out.raised).contains(&(FindingKind::LeakedSlot, findings::reason::PID_REUSED)),
        "{:?}",
        out.raised
    );
}

#[test]
fn slot_of_a_watched_process_is_alive_without_a_stat_read_and_dead_on_the_tick_after_exit() {
    let _g = pidfd_lock();
    let mut kid = Kid::spawn();
    let pid = kid.pid();
    let w = World::new();
    w.spawn(pid, 7, true, "1g");
    let r = w.region(pid, 1 << 30, &[]);
    register(&r, pid, 7, 512 * MIB);
    let mut a = w.agent(false);
    a.force_exit_watch();
    a.on_event(&ev(EventKind::MemAlloc, pid, 512 * MIB, 0x7000, 0));
    assert!(a.pidfd_of(pid).is_some());
    procinfo::tests::take_stat_reads();
    assert!(a.tick(Instant::now()).raised.is_empty());
    assert!(
        !procinfo::tests::take_stat_reads().contains(&pid),
        "watched process's stat read"
    );
    assert_eq!(
        a.regions[0].liveness.values().cloned().collect::<Vec<_>>(),
        vec![SlotLiveness::Alive { host_pid: pid }]
    );
    // SIGKILL: no exit handler ran, no exit event; the slot still holds the memory. Found on
    // the very next tick, as with the stat path.
    kid.kill_unreaped();
    a.wait_exit_seen(pid);
    w.kill(pid);
    let out = a.tick(Instant::now());
    assert!(!a.entries.contains_key(&pid));
    assert_eq!(
        kinds(&out.raised),
        vec![(FindingKind::LeakedSlot, findings::reason::PROCESS_DEAD)]
    );
}

#[test]
fn without_pidfds_processes_keep_the_stat_path() {
    for errno in [libc::EMFILE, libc::ENOSYS, libc::ESRCH] {
        let w = World::new();
        w.spawn(100, 7, false, "1g");
        w.spawn(101, 8, false, "1g");
        let mut a = w.agent(false);
        a.force_exit_watch().fail_open = Some(errno);
        a.on_event(&ev(EventKind::MemAlloc, 100, MIB, 0x1000, 0));
        a.on_event(&ev(EventKind::MemAlloc, 101, MIB, 0x2000, 0));
        assert!(a.pidfd_of(100).is_none() && a.pidfd_of(101).is_none());
        procinfo::tests::take_stat_reads();
        a.tick(Instant::now());
        let mut reads = procinfo::tests::take_stat_reads();
        reads.sort();
        assert_eq!(reads, vec![100, 101], "errno {errno}: stat polled");
        w.kill(100);
        a.tick(Instant::now());
        assert_eq!(a.process_count(), 1, "errno {errno}: gone process dropped");
        assert!(a.entries.contains_key(&101));
    }
}

// ---------------------------------------------------------------- compute shares

/// Writes device `dev`'s compute record into a region file, as the launch gate keeps it.
fn set_compute(path: &Path, dev: usize, sm_limit: u32, consumed_ns: u64, throttled_ns: u64) {
    use core::mem::{offset_of, size_of};
    use hami_common::layout::DeviceCompute as C;
    let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    let base = (offset_of!(hami_common::layout::Region, compute) + dev * size_of::<C>()) as u64;
    f.write_all_at(
        &sm_limit.to_le_bytes(),
        base + offset_of!(C, sm_limit) as u64,
    )
    .unwrap();
    f.write_all_at(
        &consumed_ns.to_le_bytes(),
        base + offset_of!(C, consumed_ns) as u64,
    )
    .unwrap();
    f.write_all_at(&7u64.to_le_bytes(), base + offset_of!(C, throttled) as u64)
        .unwrap();
    f.write_all_at(
        &throttled_ns.to_le_bytes(),
        base + offset_of!(C, throttled_ns) as u64,
    )
    .unwrap();
    f.write_all_at(&5u64.to_le_bytes(), base + offset_of!(C, refusals) as u64)
        .unwrap();
}

/// [`nvml_sample`] with per-process SM utilisation on GPU 0 since the previous sample.
fn util_sample(procs: &[(u32, u64)], sm: &[(u32, u32)]) -> NvmlSnapshot {
    let mut n = nvml_sample(procs);
    let samples: Vec<crate::nvml::ProcessUtilizationSample> = sm
        .iter()
        .map(|&(pid, sm_util)| crate::nvml::ProcessUtilizationSample {
            pid,
            time_stamp: 1,
            sm_util,
            ..Default::default()
        })
        .collect();
    n.add_utilization(0, &samples);
    n.gpu_util.insert(0, 95);
    n
}

fn compute_kinds(fs: &[Finding]) -> Vec<(Option<String>, Option<u32>)> {
    fs.iter()
        .filter(|f| f.kind == FindingKind::ComputeOverLimit)
        .map(|f| (f.region.clone(), f.device))
        .collect()
}

#[test]
fn a_containers_compute_share_is_its_processes_sum_and_over_limit_after_a_whole_window() {
    let w = World::new();
    // Container A: two processes sharing one region held to 30 %; container B: its own
    // region, no compute limit.
    w.spawn(100, 7, true, "1g");
    w.spawn(101, 8, true, "1g");
    let cid_b = CID.replace('0', "b");
    w.spawn_in(&cid_b, 200, 9, true, "1g");
    let ra = w.region(100, 1 << 30, &[101]);
    register(&ra, 100, 7, 0);
    register(&ra, 101, 8, 0);
    let rb = w.region(200, 1 << 30, &[]);
    register(&rb, 200, 9, 0);
    let path_a = w.root.join("100/root/hami/r.cache");
    set_compute(&path_a, 0, 30, 9_000_000_000, 2_500_000_000);
    let mut a = w.agent(false);
    let mem = [(100, 10 * MIB), (101, 10 * MIB), (200, 10 * MIB)];
    let t0 = Instant::now();
    let at = |s: u64| t0 + Duration::from_secs(s);
    // Before their first kernels (contexts, loading): idle, shown as 0 and not averaged in.
    for s in (1..=3u64).rev() {
        let before = t0 - Duration::from_secs(s);
        a.set_nvml_at(Some(util_sample(&mem, &[(200, 50)])), before);
        assert_eq!(compute_kinds(&a.tick(before).raised), vec![]);
    }
    let row = a.process_rows().into_iter().find(|r| r.pid == 100).unwrap();
    assert_eq!(
        (row.compute_share, row.compute_limit),
        (Some(0.0), Some(30))
    );
    // 25 % + 20 % for A (45 %, 15 points over its share), 50 % for B.
    let busy = [(100, 25), (101, 20), (200, 50)];
    for s in 0..30 {
        a.set_nvml_at(Some(util_sample(&mem, &busy)), at(s));
        let out = a.tick(at(s));
        assert_eq!(
            compute_kinds(&out.raised),
            vec![],
            "at {s} s: not a whole window yet"
        );
    }
    assert_eq!(a.process_count(), 3, "learned from NVML");
    // What is shown: A's share and limit in the rows, both regions in the series.
    let row = a.process_rows().into_iter().find(|r| r.pid == 101).unwrap();
    assert_eq!(
        (row.compute_share, row.compute_limit),
        (Some(45.0), Some(30))
    );
    assert_eq!(row.sm_util, Some(20));
    let sample = a
        .process_samples()
        .into_iter()
        .find(|p| p.pid == 100)
        .unwrap();
    assert_eq!(sample.sm_util, Some(25), "the opt-in per-process series");
    let b_row = a.process_rows().into_iter().find(|r| r.pid == 200).unwrap();
    assert_eq!((b_row.compute_share, b_row.compute_limit), (None, None));
    let series = a.region_series();
    let sa = series
        .iter()
        .find(|s| s.region == "/hami/r.cache" && s.compute_limit == 30)
        .unwrap();
    assert_eq!(sa.compute_share, Some(45.0));
    assert_eq!(
        (
            sa.compute_consumed_ns,
            sa.compute_throttled,
            sa.compute_throttled_ns
        ),
        (9_000_000_000, 7, 2_500_000_000)
    );
    assert_eq!(sa.quota_refusals, 5, "the region's refusal counter");
    let sb = series.iter().find(|s| s.compute_limit == 0).unwrap();
    assert_eq!(sb.compute_share, Some(50.0), "B's own processes only");
    assert_eq!(a.gpu_series()[0].utilization, Some(95));
    // 30 s watched: the finding, for A's region and device 0 only.
    a.set_nvml_at(Some(util_sample(&mem, &busy)), at(30));
    let out = a.tick(at(30));
    assert_eq!(
        compute_kinds(&out.raised),
        vec![(Some("/hami/r.cache".to_string()), Some(0))]
    );
    let f = out
        .raised
        .iter()
        .find(|f| f.kind == FindingKind::ComputeOverLimit)
        .unwrap();
    assert_eq!((f.observed, f.limit), (Some(45), Some(30)));
    assert!(f.detail.contains("100: 25 %, 101: 20 %"), "{}", f.detail);
    let row = a.process_rows().into_iter().find(|r| r.pid == 100).unwrap();
    assert!(
        row.verdict.contains("compute_over_limit"),
        "{}",
        row.verdict
    );
    let json = serde_json::to_value(a.region_rows()).unwrap();
    let rec = &json
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["compute"][0]["sm_limit"] == 30)
        .unwrap()["compute"][0];
    assert_eq!(rec["limit"], 30);
    assert_eq!(rec["share"], 45.0);
    assert_eq!(rec["consumed_ns"], 9_000_000_000u64);
    // A comes back to its share (30 %): the mean over 30 s falls within the tolerance and
    // the finding clears, not at the first sample.
    let within = [(100, 15), (101, 15), (200, 50)];
    let mut cleared_at = None;
    for s in 31..60 {
        a.set_nvml_at(Some(util_sample(&mem, &within)), at(s));
        let out = a.tick(at(s));
        if out
            .cleared
            .iter()
            .any(|f| f.kind == FindingKind::ComputeOverLimit)
        {
            cleared_at = Some(s);
            break;
        }
    }
    // Mean of (30 - k) x 45 and k x 30 reaches 40 at k = 10 samples.
    assert_eq!(cleared_at, Some(40));
}

#[test]
fn unhooked_process_nvml_sees_using_sm_time_is_learned_and_a_bypass() {
    let w = World::new();
    w.spawn(300, 10, false, "1g");
    let mut a = w.agent(false);
    // NVML lists no used memory for it, only SM time.
    a.set_nvml(Some(util_sample(&[], &[(300, 40)])));
    assert_eq!(a.process_count(), 1, "learned from its SM time");
    let out = a.tick(Instant::now());
    assert_eq!(
        kinds(&out.raised),
        vec![(FindingKind::Bypass, findings::reason::NO_PRELOAD)]
    );
    assert!(out.raised[0].detail.contains("40 % of a GPU's SM time"));
}

/// Issue 20: `audit` shows the devices a process's memory is on (its slot's usage by
/// device, CUDA ordinals), each once, sorted.
#[test]
fn process_rows_list_the_devices_the_memory_is_on() {
    let w = World::new();
    w.spawn(100, 7, true, "1g");
    let r = w.region(100, 1 << 30, &[]);
    let s = register(&r, 100, 7, 64 * MIB);
    let mut a = w.agent(false);
    a.on_event(&ev(EventKind::MemAlloc, 100, 64 * MIB, 0x7000, 0));
    a.tick(Instant::now());
    assert_eq!(a.process_rows()[0].devices, vec![0]);
    r.force_charge(s, 2, UsageKind::Data, 8 * MIB);
    a.tick(Instant::now());
    let row = &a.process_rows()[0];
    assert_eq!(row.devices, vec![0, 2]);
    // No NVML here: no NVML device either.
    assert!(row.nvml_devices.is_empty());
    let j = serde_json::to_value(row).unwrap();
    assert_eq!(j["devices"], serde_json::json!([0, 2]));
}
