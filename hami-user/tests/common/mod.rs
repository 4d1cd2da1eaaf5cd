//! Helpers shared by the integration tests (each test target includes this module and uses
//! only part of it).
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::sync::mpsc::{channel, Receiver};

/// Fails (never skips) unless running as root: the tests load eBPF programs.
pub fn require_root() {
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(
        euid, 0,
        "these tests load eBPF programs into the kernel and must run as root (CI does)"
    );
}

/// Writes `source` as `<out>.c` and compiles it into `out` with the harness's
/// [`hami_test_harness::cc`] (`-O0 <args>`; panics with the compiler's output on failure).
/// `-O0`: no identical-code folding (two symbols at one address would fire both probes).
pub fn compile_c(source: &str, out: &Path, args: &[&str]) {
    let src = out.with_extension("c");
    std::fs::write(&src, source).unwrap();
    let args: Vec<&str> = std::iter::once("-O0").chain(args.iter().copied()).collect();
    hami_test_harness::cc(&src, out, &args);
}

/// Forwards the lines of `r` (a child's stderr) to a channel from a thread; ends at EOF, at
/// an unreadable line, or when the receiver is gone.
pub fn forward_lines(r: impl Read + Send + 'static) -> Receiver<String> {
    let (tx, rx) = channel();
    std::thread::spawn(move || {
        for l in BufReader::new(r).lines().map_while(Result::ok) {
            if tx.send(l).is_err() {
                break;
            }
        }
    });
    rx
}

/// Waits (at most 60 s) until no process of process group `pgid` is left. An agent's probe
/// keeper (`hami-detach`, forked on exit, same group) takes seconds to detach its uprobes,
/// during which attaching probes elsewhere is slow: a test that started an agent in its own
/// group calls this so the next test does not inherit that.
#[allow(dead_code)]
pub fn wait_for_group_gone(pgid: i32) {
    let end = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while std::time::Instant::now() < end {
        let alive = std::fs::read_dir("/proc")
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| std::fs::read_to_string(e.path().join("stat")).ok())
            .filter_map(|st| {
                // pgrp is the 3rd field after the `(comm)`.
                let rest = &st[st.rfind(')')? + 1..];
                rest.split_whitespace().nth(2)?.parse::<i32>().ok()
            })
            .any(|g| g == pgid);
        if !alive {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}
