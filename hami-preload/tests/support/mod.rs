//! Test support over the workspace's test harness (`hami-test-harness`): its artifacts (the
//! preload, the fake driver and NVML, `cudaprobe`, `nvmlprobe`, built once per test binary)
//! and its sandboxes ([`TestEnv`]), plus what is this crate's own: `tests/programs/hprobe.c`
//! (operations `cudaprobe` has no equivalent for: `hostcreate`, `fork`, `loop`, the
//! null-pointer and unknown-pointer calls, `info` with free and total on one line) and a
//! parser for its `OP key=value ...` lines (`nvmlprobe` prints the same shape).
#![allow(dead_code)]

use hami_common::region::Region;
pub use hami_test_harness::{Artifacts, TestEnv};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

/// `tests/programs/hprobe.c`, compiled against the harness's fake driver (once per binary).
pub fn hprobe() -> &'static PathBuf {
    static P: OnceLock<PathBuf> = OnceLock::new();
    P.get_or_init(|| {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/programs/hprobe.c");
        Artifacts::get().compile_against_fake(&src, "hprobe")
    })
}

/// A harness sandbox (temp dir, fake-driver state, region path) with the fake's memory fixed
/// at 16 GiB per device.
pub struct Env {
    env: TestEnv,
}

impl Env {
    /// A fresh sandbox.
    pub fn new() -> Env {
        Env {
            env: TestEnv::new().env("FAKE_CUDA_TOTAL_MEM", "16G"),
        }
    }

    /// Sets a variable for every process.
    pub fn set(self, k: &str, v: &str) -> Env {
        Env {
            env: self.env.env(k, v),
        }
    }

    /// The sandbox's directory.
    pub fn dir(&self) -> &Path {
        self.env.dir()
    }

    /// The region file.
    pub fn region_path(&self) -> PathBuf {
        self.env.region_path().to_path_buf()
    }

    /// Opens the region read-only.
    pub fn region(&self) -> Region {
        Region::open_existing(self.env.region_path(), false).expect("region exists")
    }

    /// A command running `prog` against the fakes with this environment, with the preload
    /// if `preload` (stdout and stderr piped, see [`TestEnv::command`]).
    pub fn command(&self, prog: &Path, preload: bool) -> Command {
        let mut c = self.env.command(prog);
        if preload {
            c.env("LD_PRELOAD", &Artifacts::get().preload_so);
        }
        c
    }

    /// Runs hprobe with the preload.
    pub fn probe(&self, args: &[&str]) -> Probe {
        let out = self
            .command(hprobe(), true)
            .args(args)
            .output()
            .expect("run hprobe");
        Probe::from(out)
    }
}

/// hprobe's output.
pub struct Probe {
    /// Raw output.
    pub out: Output,
    /// `(op, fields)` per line.
    pub lines: Vec<(String, HashMap<String, String>)>,
}

impl From<Output> for Probe {
    fn from(out: Output) -> Probe {
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let lines = text
            .lines()
            .filter_map(|l| {
                let mut it = l.split_whitespace();
                let op = it.next()?.to_string();
                let f = it
                    .filter_map(|kv| {
                        kv.split_once('=')
                            .map(|(k, v)| (k.to_string(), v.to_string()))
                    })
                    .collect();
                Some((op, f))
            })
            .collect();
        Probe { out, lines }
    }
}

impl Probe {
    /// Field `key` of the `n`-th line.
    pub fn field(&self, n: usize, key: &str) -> String {
        self.lines
            .get(n)
            .and_then(|(_, f)| f.get(key).cloned())
            .unwrap_or_else(|| panic!("line {n} has no {key}: {}", self.dump()))
    }

    /// The rc of the `n`-th line.
    pub fn rc(&self, n: usize) -> i64 {
        self.field(n, "rc").parse().unwrap()
    }

    /// Every rc, in order.
    pub fn rcs(&self) -> Vec<i64> {
        (0..self.lines.len()).map(|n| self.rc(n)).collect()
    }

    /// stdout and stderr, for assertion messages.
    pub fn dump(&self) -> String {
        format!(
            "status {:?}\nstdout:\n{}\nstderr:\n{}",
            self.out.status,
            String::from_utf8_lossy(&self.out.stdout),
            String::from_utf8_lossy(&self.out.stderr)
        )
    }

    /// stderr.
    pub fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.out.stderr).into_owned()
    }

    /// Exit status success.
    pub fn ok(&self) -> bool {
        self.out.status.success()
    }
}

pub const MB: u64 = 1 << 20;
pub const GB: u64 = 1 << 30;
pub const OOM: i64 = 2;
