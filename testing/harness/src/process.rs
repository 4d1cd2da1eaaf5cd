//! Process helpers shared by the tests: root check, reading a child's lines from a thread,
//! waiting for a process group to be gone.

use std::io::{BufRead, BufReader, Read};
use std::sync::mpsc::{channel, Receiver};
use std::time::{Duration, Instant};

/// Fails (never skips) unless running as root: the tests that call it load eBPF programs.
pub fn require_root() {
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(
        euid, 0,
        "these tests load eBPF programs into the kernel and must run as root (CI does)"
    );
}

/// Forwards the lines of `r` (a child's stdout or stderr) to a channel from a thread; ends at
/// EOF, at an unreadable line, or when the receiver is gone.
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

/// The process group of every process in `/proc` (unreadable entries skipped).
pub fn process_groups() -> Vec<i32> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| std::fs::read_to_string(e.path().join("stat")).ok())
        .filter_map(|st| {
            // pgrp is the 3rd field after the `(comm)`.
            let rest = &st[st.rfind(')')? + 1..];
            rest.split_whitespace().nth(2)?.parse::<i32>().ok()
        })
        .collect()
}

/// Waits (at most 60 s) until no process of process group `pgid` is left. An agent's probe
/// keeper (`hami-detach`, forked on exit, same group) takes seconds to detach its uprobes,
/// during which attaching probes elsewhere is slow: a test that started an agent in its own
/// group calls this so the next test does not inherit that.
pub fn wait_for_group_gone(pgid: i32) {
    let end = Instant::now() + Duration::from_secs(60);
    while Instant::now() < end {
        if !process_groups().contains(&pgid) {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sees_own_group() {
        // SAFETY: getpgrp has no preconditions.
        let own = unsafe { libc::getpgrp() };
        assert!(process_groups().contains(&own));
    }

    #[test]
    fn forwards_every_line() {
        let rx = forward_lines(&b"a\nb\n\nc"[..]);
        let got: Vec<String> = rx.iter().collect();
        assert_eq!(got, ["a", "b", "", "c"]);
    }
}
