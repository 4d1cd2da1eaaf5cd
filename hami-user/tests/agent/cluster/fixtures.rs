//! The cluster tests' fixtures: the tools `cargo xtask setup` installs, plain HTTP, a
//! Kubernetes-shaped cgroup for the workload, and exposition lines.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::Duration;

use hami_test_harness::workspace_root;

/// The workload container's id (containerd's 64 hex digits), in its cgroup and log names.
pub(super) const CID: &str = "5e1f0c2b3a4d59687a8b9c0d1e2f30415263748596a7b8c9d0e1f20314253647";

/// The workload pod's uid, in its cgroup's name.
const POD_UID: &str = "0d7c3a52-9b1e-4f60-8a2d-6e5f4c3b2a19";

/// `name` found on PATH; panics naming `cargo xtask setup` without it.
pub(super) fn tool(name: &str) -> PathBuf {
    for dir in std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()) {
        let p = dir.join(name);
        if p.is_file() {
            return p;
        }
    }
    panic!("`{name}` not found on PATH: run `cargo xtask setup` (installs Debian's prometheus package)");
}

/// The setup venv's python (with prometheus-client, kubernetes-validate, helm-python-sdk).
pub(super) fn venv_python() -> PathBuf {
    let p = workspace_root().join(".tools/venv/bin/python3");
    assert!(
        p.is_file(),
        "{} missing: run `cargo xtask setup` (creates the venv with prometheus-client, kubernetes-validate, helm-python-sdk)",
        p.display()
    );
    p
}

/// A local TCP port free at the time of asking.
pub(super) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A plain HTTP/1.1 GET (test side only): status and body.
pub(super) fn http_get(addr: SocketAddr, path_and_query: &str) -> std::io::Result<(u16, String)> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(
        s,
        "GET {path_and_query} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)?;
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(body)
    } else {
        body.to_string()
    };
    Ok((status, body))
}

/// A chunked transfer-encoded body, decoded.
fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some((len, rest)) = s.split_once("\r\n") {
        let n = usize::from_str_radix(len.trim(), 16).unwrap_or(0);
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        s = rest[n..].trim_start_matches("\r\n");
    }
    out
}

/// `s` percent-encoded for a query string.
pub(super) fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The value of the first sample of `family` in an exposition whose line contains every
/// one of `having`, with that line.
pub(super) fn sample<'a>(text: &'a str, family: &str, having: &[&str]) -> Option<(&'a str, f64)> {
    text.lines()
        .filter(|l| l.starts_with(&format!("{family}{{")))
        .find(|l| having.iter().all(|h| l.contains(h)))
        .and_then(|l| Some((l, l.rsplit(' ').next()?.parse().ok()?)))
}

/// The value of a label in an exposition line.
pub(super) fn label_of<'a>(line: &'a str, label: &str) -> Option<&'a str> {
    let at = [format!("{{{label}=\""), format!(",{label}=\"")]
        .iter()
        .find_map(|p| line.find(p.as_str()))?;
    let start = at + label.len() + 3;
    let len = line[start..].find('"')?;
    Some(&line[start..start + len])
}

/// A child process, sent SIGTERM and reaped on drop.
pub(super) struct Killed(pub(super) Child);
impl Drop for Killed {
    fn drop(&mut self) {
        // SAFETY: kill(2) on a child we spawned and have not reaped.
        unsafe { libc::kill(self.0.id() as libc::pid_t, libc::SIGTERM) };
        let _ = self.0.wait();
    }
}

/// A cgroup that looks like a Kubernetes container's (containerd, systemd driver) in the
/// unified hierarchy; removed on drop.
pub(super) struct PodCgroup {
    dirs: Vec<PathBuf>,
}

impl PodCgroup {
    pub(super) fn create() -> PodCgroup {
        let root = if Path::new("/sys/fs/cgroup/cgroup.controllers").exists() {
            PathBuf::from("/sys/fs/cgroup")
        } else {
            PathBuf::from("/sys/fs/cgroup/unified")
        };
        let uid_ = POD_UID.replace('-', "_");
        let rel = [
            "kubepods.slice".to_string(),
            "kubepods-besteffort.slice".to_string(),
            format!("kubepods-besteffort-pod{uid_}.slice"),
            format!("cri-containerd-{CID}.scope"),
        ];
        let mut dirs = Vec::new();
        let mut p = root.clone();
        for r in rel {
            p = p.join(r);
            std::fs::create_dir_all(&p)
                .unwrap_or_else(|e| panic!("cannot create the test cgroup {}: {e}", p.display()));
            dirs.push(p.clone());
        }
        PodCgroup { dirs }
    }

    pub(super) fn procs(&self) -> PathBuf {
        self.dirs.last().unwrap().join("cgroup.procs")
    }
}

impl Drop for PodCgroup {
    fn drop(&mut self) {
        for d in self.dirs.iter().rev() {
            let _ = std::fs::remove_dir(d);
        }
    }
}
