//! Regressions of issue 12 found by the agent faults of `cargo xtask torture --long --only
//! agent`: an agent (re)started while the workload runs (the order its probes go in), and a
//! libcuda replaced on disk or rewritten in place while attached (driver upgrades).

use super::*;

/// Loads `libcuda.so.1` by name, takes the primary context, prints `ready`, then allocates
/// and frees (pitch + free, array + destroy, plain + free) in a paced loop until `argv[1]`
/// exists; prints what it did and holds nothing from then on.
const CHURN_PROGRAM: &str = r#"
#include <dlfcn.h>
#include <stdio.h>
#include <stddef.h>
#include <unistd.h>
#define HAMI_CUDA_ABI_NAMES
#include "hami_cuda.h"
int main(int argc, char **argv) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    if (!h) { fprintf(stderr, "dlopen: %s\n", dlerror()); return 2; }
    __typeof__(&cuInit) init = dlsym(h, "cuInit");
    __typeof__(&cuDeviceGet) get = dlsym(h, "cuDeviceGet");
    __typeof__(&cuDevicePrimaryCtxRetain) retain = dlsym(h, "cuDevicePrimaryCtxRetain");
    __typeof__(&cuCtxSetCurrent) setcur = dlsym(h, "cuCtxSetCurrent");
    __typeof__(&cuMemAlloc_v2) alloc = dlsym(h, "cuMemAlloc_v2");
    __typeof__(&cuMemAllocPitch_v2) pitch = dlsym(h, "cuMemAllocPitch_v2");
    __typeof__(&cuMemFree_v2) mfree = dlsym(h, "cuMemFree_v2");
    __typeof__(&cuArrayCreate_v2) acreate = dlsym(h, "cuArrayCreate_v2");
    __typeof__(&cuArrayDestroy) adestroy = dlsym(h, "cuArrayDestroy");
    CUdevice dev = 0; CUcontext c = 0;
    int rc = init(0) | get(&dev, 0) | retain(&c, dev) | setcur(c);
    printf("ready rc=%d\n", rc); fflush(stdout);
    unsigned long n = 0;
    while (access(argv[1], F_OK) != 0) {
        CUdeviceptr p = 0; size_t pp = 0; CUarray a = 0;
        CUDA_ARRAY_DESCRIPTOR d = { 1024, 256, CU_AD_FORMAT_FLOAT, 1 };
        rc |= pitch(&p, &pp, 4096, 256, 4); rc |= mfree(p);
        rc |= acreate(&a, &d); rc |= adestroy(a);
        rc |= alloc(&p, 1 << 20); rc |= mfree(p);
        n++;
        usleep(500);
    }
    printf("stopped n=%lu rc=%d\n", n, rc); fflush(stdout);
    pause();
    return 0;
}
"#;

/// Guards issue 12 (`cargo xtask torture --long --only agent`; 8ef3acf): an agent started while
/// a workload allocates and frees in a loop attached the allocation probes first and the
/// release probes (`cuMemFree_v2`, `cuArrayDestroy`, ...) up to seconds later (each attach
/// is slow, slower still while a killed agent's probes are being detached), and each entry
/// probe before its return probe. Allocations made in that window were seen and their
/// releases were not, with no drop counted: the process kept phantom live bytes, reported
/// as observed above accounted. The release probes now go in first, and each return probe
/// before its entry probe: every allocation seen has its release seen.
#[test]
fn agent_attached_mid_workload_sees_the_release_of_every_allocation_it_saw() {
    use hami_test_harness::TestEnv;
    require_root();
    let _g = serial();
    let env = TestEnv::new()
        .env("FAKE_CUDA_DEVICE_COUNT", "1")
        .env("CUDA_DEVICE_MEMORY_LIMIT", "4g")
        .preload(true);
    let prog = env.dir().join("churn");
    compile_c(CHURN_PROGRAM, &prog, &["-ldl"]);
    let stop = env.dir().join("stop");
    let mut p = env.command(&prog).arg(&stop).spawn().expect("spawn churn");
    let pid = p.id();
    let mut out = BufReader::new(p.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "ready rc=0");
    // The probes go in while it churns ("ready" comes once they are all in).
    let agent = fake_audit(&env, "3").start();
    let pgid = agent.pid();
    // Some fully probed rounds, then it stops holding anything.
    std::thread::sleep(Duration::from_millis(500));
    std::fs::write(&stop, b"").unwrap();
    line.clear();
    out.read_line(&mut line).unwrap();
    assert!(
        line.starts_with("stopped") && line.trim().ends_with("rc=0"),
        "churn: {line}"
    );
    let (st, audit, _) = agent.finish_audit();
    let _ = p.kill();
    let _ = p.wait();
    wait_for_group_gone(pgid);
    // Lost events would excuse missing releases: there must be none for this to mean anything.
    assert_eq!(audit["probes"]["dropped"], 0, "{:#}", audit["probes"]);
    let row = audit_process(&audit, pid);
    assert!(
        row["alloc_events"].as_u64().unwrap() >= 3,
        "the probed rounds were seen: {row:#}"
    );
    assert_eq!(
        row["observed"], 0,
        "it holds nothing: every release of what was seen allocated must have been seen \
         ({} allocations, {} releases seen){row:#}",
        row["alloc_events"], row["free_events"]
    );
    assert_eq!(row["live_allocations"], 0, "{row:#}");
    let mine = audit_findings_for(&audit, pid);
    assert!(mine.is_empty(), "false findings: {mine:#?}");
    // Other processes on the machine may be found: only that it reported is checked.
    assert!(st.code().is_some(), "{st:?}");
}

/// Guards issue 12 (agent faults: driver upgrade; 14f561c): a driver package renames a new
/// `libcuda.so.1` over the attached one. Discovery remembered the path as handled, so the new
/// file was attached only once a process mapped it (up to a discovery period after it had
/// started allocating: its first allocations unseen, the process "attached late"). The
/// discovery now looks again when the file a path names changes, so the new file is attached
/// before processes load it; the old file's probes stay for the processes still running it.
#[test]
fn driver_replaced_on_disk_while_attached_is_attached_again_before_processes_load_it() {
    use hami_test_harness::{Artifacts, RunningProbe, TestEnv};
    require_root();
    let _g = serial();
    let a = Artifacts::get();
    let env = TestEnv::new().env("FAKE_CUDA_DEVICE_COUNT", "1");
    let drv = env.dir().join("drv");
    std::fs::create_dir_all(&drv).unwrap();
    let lib = drv.join("libcuda.so.1");
    std::fs::copy(&a.fake_libcuda, &lib).unwrap();
    let libpath = format!("{}:{}", drv.display(), a.fake_lib_dir.display());
    let spawn = |ops: &[&str]| {
        let mut c = env.cudaprobe_cmd(ops);
        c.env("LD_LIBRARY_PATH", &libpath).stdin(Stdio::piped());
        RunningProbe::start(c)
    };
    let mut before = spawn(&["init", "ctx", "alloc", "16M", "wait", "alloc", "8M", "wait"]);
    before.wait_for("wait");
    let mut agent = fake_audit(&env, "60")
        .libcuda(&lib)
        .ld_library_path(&libpath)
        .start();
    let pgid = agent.pid();
    // The upgrade: a new file renamed over the attached one.
    let new = drv.join("libcuda.so.1.new");
    std::fs::copy(&a.fake_libcuda, &new).unwrap();
    std::fs::rename(&new, &lib).unwrap();
    // Discovery attaches every driver on the node: only this one's line counts.
    let ours = lib.display().to_string();
    if let Err(e) = agent.try_wait_line(Duration::from_secs(20), |l| {
        l.contains("attached libcuda probes") && l.contains(&ours)
    }) {
        before.signal(libc::SIGKILL);
        panic!(
            "the replaced libcuda was not attached again within 20 s ({e}); log:\n{}",
            agent.log().join("\n")
        )
    }
    // A process started on the new file (a moment later: start times count in clock ticks,
    // and one started in the tick the attach ended in is taken to have raced it), and one
    // still running the old file.
    std::thread::sleep(Duration::from_millis(200));
    let mut after = spawn(&["init", "ctx", "alloc", "32M", "wait"]);
    after.wait_for("wait");
    before.resume();
    before.wait_for("wait");
    std::thread::sleep(Duration::from_millis(500));
    let (_, audit, _) = agent.interrupt_audit(REPORT_TIMEOUT);
    for p in [&mut before, &mut after] {
        p.resume();
        p.signal(libc::SIGKILL);
    }
    wait_for_group_gone(pgid);
    let row = |pid: u32| audit_process(&audit, pid);
    let new_row = row(after.pid);
    assert_eq!(new_row["observed"], 32 * MIB, "{new_row:#}");
    assert_eq!(new_row["alloc_events"], 1, "{new_row:#}");
    assert!(
        new_row["baseline"].is_null(),
        "observed from its start: {new_row:#}"
    );
    // The old file's probes stay for the process that still runs it.
    let old_row = row(before.pid);
    assert_eq!(old_row["observed"], 8 * MIB, "{old_row:#}");
    // Only this test's files count: the agent attaches to every driver copy on the host,
    // and another test run's `drv/` copy (another checkout's tests on a shared machine) was
    // seen in the list.
    let attached = audit["probes"]["attached"].as_array().unwrap();
    let own = lib.display().to_string();
    assert!(
        attached
            .iter()
            .filter(|p| p.as_str().is_some_and(|p| p.ends_with(own.as_str())))
            .count()
            == 2,
        "both files attached: {attached:?}"
    );
}

/// Guards issue 12 (its closing note of 2026-12-01, "after a driver upgrade the old file's probes are
/// kept"): when a new libcuda was renamed over an attached one, the old file's probes stayed
/// attached for ever, even once no process ran it any more: kernel uprobes and an `attached`
/// list that grew with every upgrade (or with a tenant replacing its libcuda again and
/// again). They are now detached, in the background, once the old file is unlinked and no
/// live process maps it; the new file's probes stay and keep observing.
#[test]
fn replaced_driver_probes_are_detached_once_no_process_maps_the_old_file() {
    use hami_test_harness::{Artifacts, RunningProbe, TestEnv};
    require_root();
    let _g = serial();
    let a = Artifacts::get();
    let env = TestEnv::new().env("FAKE_CUDA_DEVICE_COUNT", "1");
    let drv = env.dir().join("drv");
    std::fs::create_dir_all(&drv).unwrap();
    let lib = drv.join("libcuda.so.1");
    std::fs::copy(&a.fake_libcuda, &lib).unwrap();
    let libpath = format!("{}:{}", drv.display(), a.fake_lib_dir.display());
    let spawn = |ops: &[&str]| {
        let mut c = env.cudaprobe_cmd(ops);
        c.env("LD_LIBRARY_PATH", &libpath).stdin(Stdio::piped());
        RunningProbe::start(c)
    };
    let mut before = spawn(&["init", "ctx", "alloc", "16M", "wait"]);
    before.wait_for("wait");
    let mut agent = fake_audit(&env, "120")
        .libcuda(&lib)
        .ld_library_path(&libpath)
        .start();
    let agent_pid = agent.pid() as u32;
    let ours = lib.display().to_string();
    // The agent probes every driver on the machine (other tests' and other checkouts' too,
    // which come and go): only the probes on a file in this test's `drv` directory count.
    let drv_dir = drv.display().to_string();
    let links = || -> HashSet<u32> {
        uprobe_links_of(agent_pid)
            .into_iter()
            .filter(|(_, file)| {
                // The agent attaches through a descriptor it holds (`/proc/self/fd/N`).
                let real = match file.strip_prefix("/proc/self/fd/") {
                    Some(n) => std::fs::read_link(format!("/proc/{agent_pid}/fd/{n}"))
                        .map(|p| p.display().to_string())
                        .unwrap_or_default(),
                    None => file.clone(),
                };
                real.starts_with(&drv_dir)
            })
            .map(|(id, _)| id)
            .collect()
    };
    // The old file's probes: those present before the upgrade.
    let before_upgrade = links();
    assert!(
        !before_upgrade.is_empty(),
        "no probe on {ours} before the upgrade: {:?}",
        uprobe_links_of(agent_pid)
            .iter()
            .map(|(_, f)| f)
            .collect::<HashSet<_>>()
    );
    // The upgrade: a new file renamed over the attached one.
    let new = drv.join("libcuda.so.1.new");
    std::fs::copy(&a.fake_libcuda, &new).unwrap();
    std::fs::rename(&new, &lib).unwrap();
    agent.wait_line(Duration::from_secs(30), |l| {
        l.contains("attached libcuda probes") && l.contains(&ours)
    });
    let per_file = links().difference(&before_upgrade).count();
    assert!(per_file >= 2, "the new file's probes: {per_file}");
    // A probe is gone when its link is (whatever the agent's descriptors show).
    let all_links = || -> HashSet<u32> {
        uprobe_links_of(agent_pid)
            .into_iter()
            .map(|(id, _)| id)
            .collect()
    };
    let lost = || before_upgrade.difference(&all_links()).count();
    // The old file's probes stay while a process runs it.
    std::thread::sleep(Duration::from_millis(1500));
    assert!(
        lost() < per_file,
        "{} of the probes there before the upgrade gone while the old file runs",
        lost()
    );
    // Its last process exits: the old file is unlinked and mapped by nobody. A full maps
    // scan (every 5 s) finds it so; detaching takes about 0.1 s per probe.
    let _ = before.kill();
    let t0 = Instant::now();
    while lost() < per_file && t0.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(200));
    }
    let gone = lost();
    if gone < per_file {
        panic!(
            "{gone} of the {} probes present before the upgrade gone {:?} after the old file's \
             last process exited, want at least its {per_file}",
            before_upgrade.len(),
            t0.elapsed()
        );
    }
    eprintln!("old file's probes gone after {:?}", t0.elapsed());
    // The new file is still observed: a process started now is seen from its start.
    std::thread::sleep(Duration::from_millis(200));
    let mut after = spawn(&["init", "ctx", "alloc", "32M", "wait"]);
    after.wait_for("wait");
    std::thread::sleep(Duration::from_millis(500));
    let audit = stop_audit(agent);
    let after_pid = after.pid;
    after.resume();
    let _ = after.kill();
    let row = audit_process(&audit, after_pid);
    assert_eq!(row["observed"], 32 * MIB, "{row:#}");
    assert_eq!(row["alloc_events"], 1, "{row:#}");
    assert!(
        row["baseline"].is_null(),
        "observed from its start: {row:#}"
    );
    let attached: Vec<&str> = audit["probes"]["attached"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .filter(|p| p.contains(&ours))
        .collect();
    assert_eq!(
        attached,
        [ours.as_str()],
        "the old file is no longer listed"
    );
}

/// Loads `libcuda.so.1` by name (LD_LIBRARY_PATH), calls `cuInit`, prints `loaded`, waits.
const LOADER_PROGRAM: &str = r#"
#include <dlfcn.h>
#include <stdio.h>
#include <unistd.h>
#include "hami_cuda.h"
int main(void) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    if (!h) { fprintf(stderr, "dlopen: %s\n", dlerror()); return 2; }
    __typeof__(&cuInit) init = dlsym(h, "cuInit");
    printf("loaded rc=%d\n", init(0)); fflush(stdout);
    pause();
    return 0;
}
"#;

/// Guards issue 12 (its closing note of 2026-12-01, "the in-place rewrite path has no
/// test"; 49d396c): a probed libcuda
/// rewritten in place (same inode, other contents: other symbol offsets) must be attached
/// again before a process loads it, or that process runs under probes placed for the old
/// contents (at offsets that are no longer its functions) and its allocations go unseen.
/// The driver here was found only in a process's maps (no `--libcuda`, not in a driver
/// directory), and that process has exited: discovery remembered its maps identity and
/// never looked at the file again (a new process mapping it has the same identity). The
/// agent now watches each attached file through the descriptor it keeps open.
#[test]
fn driver_rewritten_in_place_is_attached_again_before_a_process_loads_it() {
    use hami_test_harness::{Artifacts, RunningProbe, TestEnv};
    use std::io::Write as _;
    use std::os::unix::fs::MetadataExt;
    require_root();
    let _g = serial();
    let a = Artifacts::get();
    let env = TestEnv::new()
        .env("FAKE_CUDA_DEVICE_COUNT", "1")
        .env("CUDA_DEVICE_MEMORY_LIMIT", "1g")
        .preload(true);
    let drv = env.dir().join("drv");
    std::fs::create_dir_all(&drv).unwrap();
    let lib = drv.join("libcuda.so.1");
    // First contents: another driver (its functions elsewhere in the file).
    compile_c(NESTED_DRIVER, &lib, &["-shared", "-fPIC"]);
    let loader = env.dir().join("loader");
    compile_c(LOADER_PROGRAM, &loader, &["-ldl"]);
    // No `--libcuda`: this driver is found in the loader's maps only.
    let mut agent = fake_audit(&env, "120").no_libcuda().start();
    let ours = lib.display().to_string();
    let mut first = Command::new(&loader)
        .env("LD_LIBRARY_PATH", &drv)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(first.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "loaded rc=0");
    agent.wait_line(Duration::from_secs(30), |l| {
        l.contains("attached libcuda probes") && l.contains(&ours)
    });
    let _ = first.kill();
    let _ = first.wait();
    // Rewritten in place: same inode, the fake driver's contents.
    let ino = std::fs::metadata(&lib).unwrap().ino();
    let bytes = std::fs::read(&a.fake_libcuda).unwrap();
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(&lib)
        .unwrap();
    f.write_all(&bytes).unwrap();
    drop(f);
    assert_eq!(std::fs::metadata(&lib).unwrap().ino(), ino);
    // Attached again (soft wait, seconds normally, long on a loaded machine: what follows
    // says what went wrong if it is not).
    let end = Instant::now() + Duration::from_secs(60);
    let (mut rewritten, mut reattached) = (false, false);
    while !reattached {
        match agent.next_line(end) {
            Ok(l) if l.contains(&ours) && l.contains("libcuda rewritten in place") => {
                rewritten = true
            }
            Ok(l) if rewritten && l.contains(&ours) && l.contains("attached libcuda probes") => {
                reattached = true
            }
            Ok(_) => {}
            Err(_) => break,
        }
    }
    // (Shown if the process below dies under probes placed for the old contents.)
    eprintln!("rewrite noticed: {rewritten}, attached again: {reattached}");
    std::thread::sleep(Duration::from_millis(200));
    let mut c = env.cudaprobe_cmd(&["init", "ctx", "alloc", "32M", "wait"]);
    let libpath = format!("{}:{}", drv.display(), a.fake_lib_dir.display());
    c.env("LD_LIBRARY_PATH", &libpath).stdin(Stdio::piped());
    let mut p = RunningProbe::start(c);
    assert!(p.wait_for("alloc").ok(), "{:?}", p.seen);
    p.wait_for("wait");
    let pid = p.pid;
    std::thread::sleep(Duration::from_millis(800));
    let audit = stop_audit(agent);
    p.resume();
    let _ = p.kill();
    let row = audit_process(&audit, pid);
    let why = format!("rewrite noticed: {rewritten}, attached again: {reattached}; {row:#}");
    assert_eq!(row["observed"], 32 * MIB, "{why}");
    assert_eq!(row["alloc_events"], 1, "{why}");
    assert!(row["baseline"].is_null(), "observed from its start: {why}");
    let mine = audit_findings_for(&audit, pid);
    assert!(mine.is_empty(), "false findings: {mine:#?}");
}
