//! This crate's part of the test support; the rest is the workspace's harness
//! (`hami-test-harness`), re-exported here. Its own: `tests/programs/hprobe.c` (operations
//! `cudaprobe` has no equivalent for: `hostcreate`, `fork`, `loop`, the null-pointer and
//! unknown-pointer calls, `info` with free and total on one line, `call` of any hooked row by
//! its shape), compiled against the fake driver with its function tables generated from the
//! intercept table ([`header`]), and [`Env`], a sandbox with the fake's memory fixed at 16 GiB
//! per device.

use hami_common::region::Region;
pub use hami_test_harness::{
    Artifacts, KvOutput as Probe, TestEnv, CUDA_ERROR_OUT_OF_MEMORY as OOM, GB, MB,
};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

pub mod header;
pub use header::{hprobe_header, hprobe_rows, procaddr_base};

/// `tests/programs/hprobe.c`, compiled against the harness's fake driver (once per binary),
/// with its `hprobe_fns.h` generated into the programs' directory ([`header`]).
pub fn hprobe() -> &'static PathBuf {
    static P: OnceLock<PathBuf> = OnceLock::new();
    P.get_or_init(|| {
        let a = Artifacts::get();
        header::write_hprobe_header(&a.programs_dir);
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/programs/hprobe.c");
        let include = format!("-I{}", a.programs_dir.display());
        a.compile_against_fake_with(&src, "hprobe", &[&include])
    })
}

/// A harness sandbox with the fake's memory fixed at 16 GiB per device, the preload chosen
/// per command.
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
        self.env.region()
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
