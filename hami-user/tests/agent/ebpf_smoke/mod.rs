//! eBPF smoke tests: load the real probes into the kernel, attach them to a libcuda file,
//! run a process that calls it, and check the events. Needs root (CI runs as root); never
//! skipped: without root these tests fail and say why.
//!
//! `mini_driver_*` use a tiny C `libcuda.so.1` compiled here and a program that calls it,
//! both generated from the table ([`mini`]): the driver defines every probed row of
//! [`intercept::INTERCEPTS`] by its [`intercept::Shape`] ([`mini::shape_c`]: it writes the
//! object the program announced to its out-parameter and returns the result announced), and
//! the program calls each with known arguments ([`mini::Scenario`]), so that each probe's
//! arguments, out-parameters, event kind and the "only successful calls" rule are checked
//! exactly, with no line per function: a new row of an existing shape is tested as it is.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use hami_abi::event::EventKind;
use hami_abi::intercept::{self, PROBED_NAMES};
use hami_user::probes::{DiscoveryOptions, ProbeError, ProbeOptions, Probes};

use crate::common::require_root;
use hami_test_harness::serial;

mod mini;

use mini::{
    build_mini, build_mini_driver, defined_functions, events_of, expected_events, kind,
    left_out_row, mini_driver, scenario, Fields, Thread,
};

#[test]
fn the_mini_driver_defines_every_probed_row_once() {
    assert_eq!(defined_functions(&mini_driver(None)), PROBED_NAMES);
    let partial = mini_driver(Some(left_out_row()));
    let want: Vec<&str> = PROBED_NAMES
        .into_iter()
        .filter(|s| *s != left_out_row())
        .collect();
    assert_eq!(defined_functions(&partial), want);
}

/// Every probed row is called at least once successfully, sending an event of its row's kind,
/// and once refused by the driver; the other thread's calls are one run.
#[test]
fn the_scenario_calls_every_probed_row() {
    let calls = scenario();
    let events = expected_events(&calls);
    for name in PROBED_NAMES {
        let row = intercept::find(name).unwrap();
        assert!(
            calls.iter().any(|c| c.row.name == name && c.fails),
            "{name} never refused"
        );
        assert!(
            events
                .iter()
                .any(|(_, f, n)| *n == name && Some(f.kind) == row.kind()),
            "{name} sends no event"
        );
    }
    assert!(events.iter().any(|(t, ..)| *t == Thread::Other));
}

/// The mini program runs against the mini driver without probes: every call returned the
/// result and wrote the object announced (the C sources agree with [`scenario`]).
#[test]
fn the_mini_program_runs_against_the_mini_driver() {
    let tmp = tempfile::tempdir().unwrap();
    let (_, prog) = build_mini(tmp.path());
    let out = Command::new(&prog).output().unwrap();
    assert!(
        out.status.success(),
        "{:?}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A libcuda without one of the probed rows (left out of the mini driver on purpose): that
/// one is listed as missing, every other one attached.
#[test]
fn a_probed_row_the_driver_lacks_is_listed_missing() {
    require_root();
    let _g = serial();
    let tmp = tempfile::tempdir().unwrap();
    let lib = build_mini_driver(tmp.path(), Some(left_out_row()));
    let mut probes = Probes::load(&ProbeOptions::default()).expect("loading the eBPF programs");
    let outcome = probes.attach_libcuda(&lib).expect("attaching");
    assert_eq!(outcome.missing, [left_out_row()], "{outcome:?}");
    let mut attached = outcome.attached.clone();
    attached.sort_unstable();
    let mut want: Vec<&str> = PROBED_NAMES
        .into_iter()
        .filter(|s| *s != left_out_row())
        .collect();
    want.sort_unstable();
    assert_eq!(attached, want, "{outcome:?}");
}

/// A stop requested (the agent's SIGTERM, [`Probes::stop_on`]): no attach starts, the
/// probes already in stay until [`Probes::take_links`], which takes them all.
#[test]
fn a_requested_stop_refuses_further_attaches() {
    use std::sync::atomic::{AtomicBool, Ordering};
    require_root();
    let _g = serial();
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (lib_a, lib_b) = (
        build_mini_driver(a.path(), None),
        build_mini_driver(b.path(), None),
    );
    let mut probes = Probes::load(&ProbeOptions::default()).expect("loading the eBPF programs");
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    probes.stop_on(stop.clone());
    let first = probes
        .attach_libcuda(&lib_a)
        .expect("attaching before the stop");
    assert!(first.missing.is_empty(), "{first:?}");
    stop.store(true, Ordering::SeqCst);
    let t = std::time::Instant::now();
    let e = probes.attach_libcuda(&lib_b).unwrap_err();
    assert!(matches!(e, ProbeError::Closed), "{e}");
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    assert_eq!(probes.attached().len(), 1);
    // Every probe of the first library (a uprobe and a uretprobe per row) and the
    // process-exit tracepoint; none of the second.
    assert_eq!(probes.take_links().len(), 2 * first.attached.len() + 1);
}

#[tokio::test]
async fn mini_driver_every_probe() {
    require_root();
    let _g = serial();
    let tmp = tempfile::tempdir().unwrap();
    let (lib, prog) = build_mini(tmp.path());

    let mut probes = Probes::load(&ProbeOptions::default()).expect("loading the eBPF programs");
    let outcome = probes
        .attach_libcuda(&lib)
        .expect("attaching to the mini libcuda");
    assert!(!outcome.already_attached);
    // The mini driver defines every probed row: all attached, none missing.
    let mut attached = outcome.attached.clone();
    attached.sort_unstable();
    let mut all = PROBED_NAMES.to_vec();
    all.sort_unstable();
    assert_eq!(attached, all, "{outcome:?}");
    assert!(outcome.missing.is_empty(), "{outcome:?}");
    // Same file through another path (a symlink): deduped by device and inode.
    let link = tmp.path().join("libcuda-link.so");
    std::os::unix::fs::symlink(&lib, &link).unwrap();
    let again = probes.attach_libcuda(&link).unwrap();
    assert!(again.already_attached);
    assert_eq!(again.file_id, outcome.file_id);
    assert_eq!(probes.attached().len(), 1);

    let before = probes.counters();
    let (mut rx, handle) = probes
        .spawn(DiscoveryOptions {
            interval: None,
            ..Default::default()
        })
        .expect("starting the event stream");

    let child = Command::new(&prog)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "program failed: {:?} {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let evs = events_of(&mut rx, pid).await;
    let (exit, evs) = evs.split_last().unwrap();
    assert_eq!(exit.kind, EventKind::ProcessExit);
    // Each call's event, in order: its row's kind and the fields its shape promises; none
    // for the refused calls.
    let want = expected_events(&scenario());
    let other_tid = evs
        .iter()
        .find(|e| e.tid != pid)
        .map(|e| e.tid)
        .expect("no event from the program's second thread");
    let mut last_ts = 0;
    for (i, (e, (thread, f, name))) in evs.iter().zip(&want).enumerate() {
        let got = Fields {
            kind: e.kind,
            addr: e.addr,
            size: e.size,
            ctx: e.ctx,
            extra: e.extra,
        };
        assert_eq!(got, *f, "event {i}, of {name} ({thread:?}): {e:?}");
        let tid = match thread {
            Thread::Main => pid,
            Thread::Other => other_tid,
        };
        assert_eq!((e.tgid, e.tid, e.result), (pid, tid, 0), "event {i}: {e:?}");
        assert!(e.ts_ns >= last_ts && e.ts_ns > 0, "event {i}: {e:?}");
        last_ts = e.ts_ns;
    }
    assert_eq!(evs.len(), want.len(), "events: {evs:#?}");

    let c = handle.counters();
    assert_eq!(c.dropped, 0, "{c:?}");
    assert_eq!(c.malformed, 0, "{c:?}");
    // The libcuda events and the exit; other processes may add exits.
    let n = want.len() as u64 + 1;
    assert!(c.sent >= before.sent + n, "{c:?}");
    assert!(c.received >= n, "{c:?}");
}

#[tokio::test]
async fn own_tgid_is_ignored() {
    require_root();
    let _g = serial();
    let tmp = tempfile::tempdir().unwrap();
    let (lib, prog) = build_mini(tmp.path());
    // Ignore the program's pid: impossible to know before it starts, so ignore a process
    // that runs it through a shell that execs it (exec keeps the pid).
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(format!("read x; exec {}", prog.display()))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id();
    let mut probes = Probes::load(&ProbeOptions {
        ignore_tgid: Some(pid),
        ..Default::default()
    })
    .unwrap();
    probes.attach_libcuda(&lib).unwrap();
    let (mut rx, handle) = probes
        .spawn(DiscoveryOptions {
            interval: None,
            ..Default::default()
        })
        .unwrap();
    {
        use std::io::Write;
        child.stdin.take().unwrap().write_all(b"go\n").unwrap();
    }
    assert!(child.wait().unwrap().success());
    // Run it once more, not ignored, as a marker that the probes work.
    let marker = Command::new(&prog)
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mpid = marker.id();
    marker.wait_with_output().unwrap();
    let evs = events_of(&mut rx, mpid).await;
    assert!(evs.iter().any(|e| kind(e) == EventKind::MemAlloc));
    // Nothing at all from the ignored pid (not even its exit).
    while let Ok(ev) = rx.try_recv() {
        assert_ne!(ev.tgid, pid, "event from the ignored process: {ev:?}");
    }
    assert_eq!(handle.counters().unpaired, 0);
}

#[tokio::test]
async fn discovery_finds_a_running_process_libcuda() {
    require_root();
    let _g = serial();
    let tmp = tempfile::tempdir().unwrap();
    let (lib, prog) = build_mini(tmp.path());
    // A process that maps the library (through LD_PRELOAD of `sleep`), found in its maps.
    let mut sleeper = Command::new("sleep")
        .arg("30")
        .env("LD_PRELOAD", &lib)
        .spawn()
        .unwrap();
    let want = PathBuf::from(format!("/proc/{}/root{}", sleeper.id(), lib.display()));
    // Poll: the loader maps the library shortly after the spawn.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let found = hami_user::probes::discover_libcuda(Path::new("/proc"));
        if found.contains(&want) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{want:?} not in {found:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }

    let probes = Probes::load(&ProbeOptions::default()).unwrap();
    let (mut rx, handle) = probes
        .spawn(DiscoveryOptions {
            interval: Some(Duration::from_millis(100)),
            ..Default::default()
        })
        .unwrap();
    // The background discovery attaches it.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let meta = std::fs::metadata(&lib).unwrap();
    use std::os::unix::fs::MetadataExt;
    while !handle
        .attached()
        .iter()
        .any(|l| l.file_id == (meta.dev(), meta.ino()))
    {
        assert!(
            std::time::Instant::now() < deadline,
            "not attached: {:?}",
            handle.attached()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _ = sleeper.kill();
    let _ = sleeper.wait();
    let child = Command::new(&prog)
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id();
    child.wait_with_output().unwrap();
    let evs = events_of(&mut rx, pid).await;
    // Every event of the program (and its exit).
    let kinds: Vec<EventKind> = evs.iter().map(kind).collect();
    let mut want: Vec<EventKind> = expected_events(&scenario())
        .iter()
        .map(|(_, f, _)| f.kind)
        .collect();
    want.push(EventKind::ProcessExit);
    assert_eq!(kinds, want);
}

#[test]
fn not_libcuda_is_rejected() {
    require_root();
    let _g = serial();
    let mut probes = Probes::load(&ProbeOptions::default()).unwrap();
    // /bin/sh is an ELF file exporting none of the probed functions.
    let sh = std::fs::canonicalize("/bin/sh").unwrap();
    match probes.attach_libcuda(&sh) {
        Err(ProbeError::NotLibcuda(p)) => assert_eq!(p, sh),
        other => panic!("expected NotLibcuda, got {other:?}"),
    }
    match probes.attach_libcuda(Path::new("/nonexistent/libcuda.so.1")) {
        Err(ProbeError::File { .. }) => {}
        other => panic!("expected File error, got {other:?}"),
    }
}

/// The workspace's fake driver (`testing/fake-cuda`, soname `libcuda.so.1`) driven by
/// `cudaprobe`, through the three ways programs reach the driver: the probes see
/// `cuMemAlloc_v2` with its size and returned pointer, the free, and the context (with its
/// device ordinal) the allocation was made in.
#[tokio::test]
async fn fake_driver_alloc_free_three_ways() {
    use hami_test_harness::{Artifacts, TestEnv};
    require_root();
    let _g = serial();
    let env = TestEnv::new();
    let art = Artifacts::get();
    let mut probes = Probes::load(&ProbeOptions::default()).expect("loading the eBPF programs");
    let outcome = probes
        .attach_libcuda(&art.fake_libcuda)
        .expect("attaching to the fake libcuda.so.1");
    assert!(outcome.attached.contains(&"cuMemAlloc_v2"), "{outcome:?}");
    assert!(outcome.attached.contains(&"cuMemFree_v2"), "{outcome:?}");
    let (mut rx, handle) = probes
        .spawn(DiscoveryOptions {
            interval: None,
            ..Default::default()
        })
        .unwrap();
    for via in ["direct", "dlsym", "procaddr"] {
        let out = env.run_probe(&[
            "--via", via, "--device", "1", "init", "ctx", "alloc", "1M", "free", "last",
        ]);
        assert!(
            out.status.success(),
            "cudaprobe --via {via}: {}",
            out.stdout
        );
        let pid = out.pid.expect("cudaprobe prints its pid");
        let ctx = out.find("ctx")[0].num("ctx").expect("ctx pointer");
        let ptr = out.find("alloc")[0].ptr().expect("allocated pointer");
        let evs = events_of(&mut rx, pid).await;
        let alloc = evs
            .iter()
            .position(|e| kind(e) == EventKind::MemAlloc)
            .unwrap_or_else(|| panic!("--via {via}: no MemAlloc in {evs:#?}"));
        let e = evs[alloc];
        assert_eq!(
            (e.size, e.addr, e.ctx),
            (1 << 20, ptr, ctx),
            "--via {via}: {e:?}"
        );
        assert!(
            evs[alloc..]
                .iter()
                .any(|e| kind(e) == EventKind::MemFree && e.addr == ptr),
            "--via {via}: no MemFree of {ptr:#x} after the alloc: {evs:#?}"
        );
        assert!(
            evs.iter()
                .any(|e| kind(e) == EventKind::PrimaryCtxRetain && e.addr == ctx && e.extra == 1),
            "--via {via}: no primary retain of device 1: {evs:#?}"
        );
    }
    // Created contexts (procaddr resolves cuCtxCreate to its newest version): the device
    // ordinal is read from the right argument, and the allocation carries the new context.
    for via in ["direct", "procaddr"] {
        let out = env.run_probe(&[
            "--via",
            via,
            "--device",
            "1",
            "init",
            "ctxcreate",
            "alloc",
            "64K",
        ]);
        assert!(
            out.status.success(),
            "cudaprobe --via {via}: {}",
            out.stdout
        );
        let pid = out.pid.unwrap();
        let ctx = out.find("ctxcreate")[0].num("ctx").unwrap();
        let ptr = out.find("alloc")[0].ptr().unwrap();
        let evs = events_of(&mut rx, pid).await;
        assert!(
            evs.iter()
                .any(|e| kind(e) == EventKind::CtxCreate && e.addr == ctx && e.extra == 1),
            "--via {via}: no CtxCreate on device 1: {evs:#?}"
        );
        assert!(
            evs.iter().any(|e| kind(e) == EventKind::MemAlloc
                && e.addr == ptr
                && e.size == 64 << 10
                && e.ctx == ctx),
            "--via {via}: allocation not attributed to the created context: {evs:#?}"
        );
    }
    // A failed call sends nothing: an allocation larger than the fake device.
    let out = env.run_probe(&["init", "ctx", "alloc", "100T"]);
    let pid = out.pid.unwrap();
    assert!(!out.find("alloc")[0].ok(), "{}", out.stdout);
    let evs = events_of(&mut rx, pid).await;
    assert!(
        !evs.iter().any(|e| kind(e) == EventKind::MemAlloc),
        "failed allocation reported: {evs:#?}"
    );
    let c = handle.counters();
    assert_eq!((c.dropped, c.malformed), (0, 0), "{c:?}");
}

/// A "container": a process in its own mount namespace loads a libcuda that exists only
/// there (a private tmpfs over a directory that is empty on the host). Background discovery
/// finds it in the process's maps, attaches through `/proc/<pid>/root/...`, and the probes
/// see the process's allocation.
#[tokio::test]
async fn container_libcuda_found_through_proc_root() {
    use hami_test_harness::{Artifacts, RunningProbe, TestEnv};
    require_root();
    let _g = serial();
    let env = TestEnv::new();
    let art = Artifacts::get();
    let nsdir = tempfile::tempdir().unwrap();
    let d = nsdir.path().display().to_string();
    let script = format!(
        "mount -t tmpfs hami-test {d} && cp {lib} {d}/libcuda.so.1 && \
         exec {probe} init ctx wait alloc 2M free last",
        lib = art.fake_libcuda.display(),
        probe = art.cudaprobe.display(),
    );
    let mut cmd = env.command(Path::new("unshare"));
    cmd.args(["--mount", "--propagation", "private", "sh", "-c", &script])
        .env("LD_LIBRARY_PATH", nsdir.path())
        .stdin(std::process::Stdio::piped());
    let mut rp = RunningProbe::start(cmd);
    rp.wait_for("wait");
    let pid = rp.pid;
    assert!(
        !nsdir.path().join("libcuda.so.1").exists(),
        "the library must be visible only inside the namespace"
    );

    let probes = Probes::load(&ProbeOptions::default()).unwrap();
    let (mut rx, handle) = probes
        .spawn(DiscoveryOptions {
            interval: Some(Duration::from_millis(100)),
            ..Default::default()
        })
        .unwrap();
    let want = PathBuf::from(format!("/proc/{pid}/root{d}/libcuda.so.1"));
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !handle.attached().iter().any(|l| l.path == want) {
        assert!(
            std::time::Instant::now() < deadline,
            "{want:?} not attached: {:?}",
            handle.attached()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    rp.resume();
    let out = rp.finish();
    assert!(out.status.success(), "{}", out.dump());
    let ptr = out.find("alloc")[0].ptr().unwrap();
    let evs = events_of(&mut rx, pid).await;
    assert!(
        evs.iter()
            .any(|e| kind(e) == EventKind::MemAlloc && e.addr == ptr && e.size == 2 << 20),
        "{evs:#?}"
    );
    assert!(
        evs.iter()
            .any(|e| kind(e) == EventKind::MemFree && e.addr == ptr),
        "{evs:#?}"
    );
}

/// Runs the mini program once and returns how many events the probes sent meanwhile.
fn sent_by_one_run(probes: &Probes, prog: &Path) -> u64 {
    let before = probes.counters().sent;
    let st = Command::new(prog)
        .stdout(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(st.success());
    probes.counters().sent - before
}

#[test]
fn links_handed_to_a_keeper_process_are_detached_without_waiting() {
    require_root();
    let _g = serial();
    let tmp = tempfile::tempdir().unwrap();
    let (lib, prog) = build_mini(tmp.path());
    let mut probes = Probes::load(&ProbeOptions::default()).unwrap();
    let outcome = probes.attach_libcuda(&lib).unwrap();
    assert!(
        sent_by_one_run(&probes, &prog) > 0,
        "the probes do not fire"
    );
    let links = probes.take_links();
    // Entry and return probe per symbol, plus the process-exit tracepoint.
    assert_eq!(links.len(), 2 * outcome.attached.len() + 1);
    assert!(matches!(
        probes.attach_libcuda(&lib),
        Err(ProbeError::Closed)
    ));
    let t = std::time::Instant::now();
    assert!(links.detach_in_background(), "not handed off");
    // Detaching here takes about 0.1 s per link (4-5 s); handing off takes milliseconds.
    assert!(
        t.elapsed() < Duration::from_secs(1),
        "hand-off took {:?}",
        t.elapsed()
    );
    // The keeper detaches them in the background: the probes stop firing.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while sent_by_one_run(&probes, &prog) > 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "probes still attached 60 s after the hand-off"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}
