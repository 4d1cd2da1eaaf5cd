//! The driver files a tenant controls: a libcuda candidate truncated and rewritten while the
//! agent attaches to it, a driver loaded through a descriptor with no path naming it
//! (unlinked, memfd), and a discovery read stuck on a FIFO.

use super::*;

/// Truncates `path` to 0 and writes `data` back, over and over, until `stop`.
fn flip_file(path: &Path, data: &[u8], stop: &std::sync::atomic::AtomicBool) -> u64 {
    use std::os::unix::fs::FileExt;
    use std::sync::atomic::Ordering;
    let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    let mut flips = 0;
    while !stop.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(2));
        f.set_len(0).unwrap();
        std::thread::sleep(Duration::from_micros(500));
        f.write_all_at(data, 0).unwrap();
        flips += 1;
    }
    flips
}

#[test]
fn libcuda_truncated_while_the_agent_attaches_to_it_is_skipped_not_fatal() {
    use hami_user::probes::{ProbeError, ProbeOptions, Probes};
    use std::sync::atomic::{AtomicBool, Ordering};
    require_root();
    let _g = serial();
    let a = Artifacts::get();
    let data = std::fs::read(&a.fake_libcuda).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut probes = Probes::load(&ProbeOptions::default()).unwrap();
    let (mut ok, mut refused, mut flips) = (0, 0, 0);
    // A fresh inode each round: a file found to export nothing is not read again.
    let t0 = Instant::now();
    for round in 0..20 {
        if round >= 3 && t0.elapsed() > Duration::from_secs(2) {
            break;
        }
        let path = dir.path().join(format!("{round}/libcuda.so.1"));
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, &data).unwrap();
        let stop = AtomicBool::new(false);
        let res = std::thread::scope(|s| {
            let t = s.spawn(|| flip_file(&path, &data, &stop));
            let r = probes.attach_libcuda(&path);
            stop.store(true, Ordering::Relaxed);
            flips += t.join().unwrap();
            r
        });
        match res {
            Ok(o) => {
                assert!(!o.attached.is_empty());
                ok += 1;
            }
            Err(
                e @ (ProbeError::Elf { .. }
                | ProbeError::Attach { .. }
                | ProbeError::File { .. }
                | ProbeError::NotLibcuda(_)),
            ) => {
                eprintln!("round {round}: skipped: {e}");
                refused += 1;
            }
            Err(e) => panic!("round {round}: unexpected error {e}"),
        }
        // Each round's copy goes at once (a probe attached to it keeps only its inode): the
        // test must not fill a small or shared /tmp.
        std::fs::remove_dir_all(path.parent().unwrap()).unwrap();
    }
    eprintln!("attached {ok}, skipped {refused}, {flips} truncations");
    assert!(flips > 0);
    probes.take_links().detach_in_background();
}

/// A tenant that loads its own copy of the driver without any path naming it: `unlinked`
/// copies `SRC` to `TMP`, opens it, unlinks it and `dlopen`s `/proc/self/fd/N`; `memfd`
/// copies it into a `memfd_create` file and `dlopen`s that. Then cuInit, the primary
/// context, prints `loaded`, waits for a line on stdin, allocates `BYTES` and prints
/// `allocated rc=RC`, and waits for EOF.
const FD_LOADER: &str = r#"
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#define HAMI_CUDA_ABI_NAMES
#include "hami_cuda.h"
typedef __typeof__(&cuInit) init_t;
typedef __typeof__(&cuDeviceGet) get_t;
typedef __typeof__(&cuDevicePrimaryCtxRetain) retain_t;
typedef __typeof__(&cuCtxSetCurrent) set_t;
typedef __typeof__(&cuMemAlloc_v2) alloc_t;
static void die(const char *m) { fprintf(stderr, "fdload: %s\n", m); exit(1); }
int main(int argc, char **argv) {
  if (argc != 5) die("usage: fdload unlinked|memfd SRC TMP BYTES");
  int src = open(argv[2], O_RDONLY);
  if (src < 0) die("open SRC");
  int fd = !strcmp(argv[1], "memfd") ? memfd_create("cuda", 0)
                                     : open(argv[3], O_RDWR | O_CREAT | O_TRUNC, 0700);
  if (fd < 0) die("create the copy");
  char buf[65536];
  ssize_t n;
  while ((n = read(src, buf, sizeof buf)) > 0)
    if (write(fd, buf, n) != n) die("write");
  close(src);
  if (strcmp(argv[1], "memfd") && unlink(argv[3])) die("unlink");
  char p[64];
  snprintf(p, sizeof p, "/proc/self/fd/%d", fd);
  void *h = dlopen(p, RTLD_NOW | RTLD_LOCAL);
  if (!h) die(dlerror());
  init_t init = (init_t)dlsym(h, "cuInit");
  get_t get = (get_t)dlsym(h, "cuDeviceGet");
  retain_t retain = (retain_t)dlsym(h, "cuDevicePrimaryCtxRetain");
  set_t set = (set_t)dlsym(h, "cuCtxSetCurrent");
  alloc_t alloc = (alloc_t)dlsym(h, "cuMemAlloc_v2");
  if (!init || !get || !retain || !set || !alloc) die("dlsym");
  CUdevice dev;
  CUcontext ctx;
  if (init(0) || get(&dev, 0) || retain(&ctx, dev) || set(ctx)) die("context");
  printf("loaded pid=%d\n", (int)getpid());
  fflush(stdout);
  char line[64];
  if (!fgets(line, sizeof line, stdin)) die("stdin closed");
  CUdeviceptr ptr;
  printf("allocated rc=%d\n", alloc(&ptr, strtoull(argv[4], NULL, 0)));
  fflush(stdout);
  while (fgets(line, sizeof line, stdin)) {}
  return 0;
}
"#;

#[test]
fn a_driver_loaded_through_a_descriptor_unlinked_or_memfd_is_probed() {
    use std::io::{BufRead, Write};
    let _g = serial();
    let a = Artifacts::get();
    let dir = tempfile::tempdir().unwrap();
    let prog = dir.path().join("fdload");
    hami_test_harness::compile_c(FD_LOADER, &prog, &["-ldl"]);
    let env = TestEnv::new();
    // Ended by SIGTERM once both tenants allocated: the report lists them (still running).
    let mut agent = AgentProcess::start(AGENT, &env, &["audit", "--json", "--seconds", "120"]);
    let mut tenants = Vec::new();
    for how in ["unlinked", "memfd"] {
        let copy = dir.path().join(format!("{how}/libcuda.so.1"));
        std::fs::create_dir_all(copy.parent().unwrap()).unwrap();
        let mut c = env.command(&prog);
        c.arg(how)
            .arg(&a.fake_libcuda)
            .arg(&copy)
            .arg((48 * MIB).to_string())
            .stdin(Stdio::piped());
        let mut child = c.spawn().unwrap();
        let mut stdin = child.stdin.take().unwrap();
        let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        assert!(line.starts_with("loaded"), "{how}: {line:?}");
        assert!(!copy.exists(), "{how}: no path names the copy");
        let pid = child.id();
        let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
        let shown = if how == "memfd" {
            "/memfd:cuda (deleted)"
        } else {
            "libcuda.so.1 (deleted)"
        };
        assert!(maps.contains(shown), "{how}: {maps}");
        // Discovery passes every 500 ms: the copy is attached through its mapping. Waited
        // for (at most 30 s) so that the allocation comes after the probes went in.
        let end = Instant::now() + Duration::from_secs(30);
        let mut attached = false;
        while !attached && Instant::now() < end {
            if let Ok(l) = agent.next_line(Instant::now() + Duration::from_millis(200)) {
                attached = l.contains("attached libcuda probes")
                    && l.contains(&format!("/proc/{pid}/map_files/"));
            }
        }
        writeln!(stdin, "go").unwrap();
        line.clear();
        out.read_line(&mut line).unwrap();
        assert_eq!(line.trim(), "allocated rc=0", "{how}");
        tenants.push((how, pid, attached, child, stdin));
    }
    // A few ticks (250 ms) for the events to be applied.
    std::thread::sleep(Duration::from_millis(1500));
    let (st, out, log) = agent.terminate(Duration::from_secs(30));
    assert_eq!(
        st.code(),
        Some(2),
        "a bypass fails the audit\n{}",
        log.join("\n")
    );
    let audit = parse_audit(&out, &log);
    for (how, pid, attached, mut child, stdin) in tenants {
        // The allocation was seen: its 48 MiB observed, and it is a bypass (no preload).
        let row = process(&audit, pid);
        assert_eq!(row["observed"], 48 * MIB, "{how}: {row:#}");
        assert!(
            findings(&audit)
                .iter()
                .any(|f| f["pid"] == pid && f["kind"] == "bypass"),
            "{how}: no bypass: {:#}",
            audit["findings"]
        );
        assert!(
            attached,
            "{how}: seen without the attach line naming map_files"
        );
        drop(stdin);
        assert!(child.wait().unwrap().success(), "{how}");
    }
    // A memfd has no link either (`nlink` 0): once its process is gone, nobody can load it
    // again, and its probes go at the next full scan that finds nobody mapping it.
    let mut agent = AgentProcess::start(
        AGENT,
        &env,
        &["run", "--json-log", "--metrics-addr", "127.0.0.1:0"],
    );
    let mut c = env.command(&prog);
    c.args(["memfd"])
        .arg(&a.fake_libcuda)
        .arg(dir.path().join("unused"))
        .arg("1048576")
        .stdin(Stdio::piped());
    let mut child = c.spawn().unwrap();
    let stdin = child.stdin.take().unwrap();
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    let pid = child.id();
    let map_files = format!("/proc/{pid}/map_files/");
    agent.wait_line(Duration::from_secs(30), |l| {
        l.contains("attached libcuda probes") && l.contains(&map_files)
    });
    drop(stdin);
    let _ = child.wait();
    agent.wait_line(Duration::from_secs(30), |l| {
        l.contains("no longer mapped: probes detached") && l.contains(&map_files)
    });
    let (st, _, log) = agent.terminate(Duration::from_secs(30));
    assert!(st.success(), "{st:?}\n{}", log.join("\n"));
}

/// A discovery pass stuck in a read that never returns (here `<pid>/maps` a FIFO, in a
/// fake /proc given as `--proc-root`; on a node, a hung FUSE file or the like) does not hold
/// the agent's exit: SIGTERM still ends the audit promptly, with its report. (Dropping the
/// tokio runtime would wait for that blocking task for ever; it is shut down with a
/// bounded wait instead.)
#[test]
fn a_discovery_read_stuck_on_a_fifo_does_not_hold_the_exit() {
    let _g = serial();
    let env = TestEnv::new();
    let proc_root = tempfile::tempdir().unwrap();
    let root_arg = proc_root.path().display().to_string();
    let agent = AgentProcess::audit(AGENT, &env, "60", &["--proc-root", &root_arg]);
    // After the first pass (the agent is ready): a "process" whose maps is a FIFO, found by
    // the next periodic pass (every 500 ms).
    let pid_dir = proc_root.path().join("4242");
    std::fs::create_dir(&pid_dir).unwrap();
    let fifo = pid_dir.join("maps");
    mkfifo(&fifo);
    let end = Instant::now() + Duration::from_secs(10);
    while !holds_fifo(agent.pid(), &fifo) {
        assert!(
            Instant::now() < end,
            "discovery never got stuck on the FIFO: {}",
            agent.log().join("\n")
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let t = Instant::now();
    agent.signal(libc::SIGTERM);
    let (st, out, log) = agent.finish_within(Duration::from_secs(20));
    let took = t.elapsed();
    assert!(
        took < Duration::from_secs(5),
        "exit took {took:?}:\n{}",
        log.join("\n")
    );
    assert_eq!(st.code(), Some(0), "{}", log.join("\n"));
    let audit = parse_audit(&out, &log);
    assert_eq!(audit["failed"], false, "{audit:#}");
}
