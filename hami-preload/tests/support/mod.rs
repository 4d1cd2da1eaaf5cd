//! Test support: builds the preload and the fake driver, compiles `hprobe.c`, runs it in a
//! temp dir with its own region and fake-driver state.
#![allow(dead_code)]

use hami_common::region::Region;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

/// Built artifacts.
pub struct Artifacts {
    /// `libhami_preload.so`.
    pub preload: PathBuf,
    /// Directory holding `libcuda.so.1` and `libnvidia-ml.so.1` (the fakes).
    pub libdir: PathBuf,
    /// The compiled probe.
    pub probe: PathBuf,
    /// `testing/programs/nvmlprobe.c`, compiled.
    pub nvmlprobe: PathBuf,
}

fn target_profile_dir() -> PathBuf {
    // <target>/<profile>/deps/<test binary>
    let exe = std::env::current_exe().expect("current_exe");
    exe.parent()
        .and_then(Path::parent)
        .expect("profile dir")
        .to_path_buf()
}

/// Builds everything once per test binary.
pub fn artifacts() -> &'static Artifacts {
    static A: OnceLock<Artifacts> = OnceLock::new();
    A.get_or_init(|| {
        let prof = target_profile_dir();
        let target = prof.parent().expect("target dir");
        let release = prof.file_name().is_some_and(|n| n == "release");
        let mut cmd = Command::new(env!("CARGO"));
        cmd.args([
            "build",
            "-p",
            "hami-preload",
            "-p",
            "fake-cuda",
            "-p",
            "fake-nvml",
        ])
        .env("CARGO_TARGET_DIR", target)
        .current_dir(env!("CARGO_MANIFEST_DIR"));
        if release {
            cmd.arg("--release");
        }
        let st = cmd.status().expect("cargo build");
        assert!(
            st.success(),
            "building the preload and the fake driver failed"
        );
        let libdir = prof.join("hprobe-libs");
        std::fs::create_dir_all(&libdir).unwrap();
        for (from, to) in [
            ("libcuda.so", "libcuda.so.1"),
            ("libnvidia_ml.so", "libnvidia-ml.so.1"),
        ] {
            let dst = libdir.join(to);
            let _ = std::fs::remove_file(&dst);
            std::fs::copy(prof.join(from), &dst).unwrap();
        }
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/programs/hprobe.c");
        let probe = prof.join("hprobe");
        let st = Command::new("cc")
            .arg("-O1")
            .arg("-o")
            .arg(&probe)
            .arg(&src)
            .arg("-L")
            .arg(&libdir)
            .arg("-l:libcuda.so.1")
            .arg("-ldl")
            .status()
            .expect("cc");
        assert!(st.success(), "compiling hprobe.c failed");
        let nvsrc = Path::new(env!("CARGO_MANIFEST_DIR")).join("../testing/programs/nvmlprobe.c");
        let nvmlprobe = prof.join("hami-nvmlprobe");
        let st = Command::new("cc")
            .arg("-O1")
            .arg("-o")
            .arg(&nvmlprobe)
            .arg(&nvsrc)
            .arg("-ldl")
            .status()
            .expect("cc");
        assert!(st.success(), "compiling nvmlprobe.c failed");
        Artifacts {
            preload: prof.join("libhami_preload.so"),
            libdir,
            probe,
            nvmlprobe,
        }
    })
}

/// A temp dir with a region path and a fake-driver state.
pub struct Env {
    /// The directory.
    pub dir: PathBuf,
    /// Extra environment for every process.
    pub vars: HashMap<String, String>,
}

impl Env {
    /// A fresh environment named after the test.
    pub fn new(name: &str) -> Env {
        let dir =
            std::env::temp_dir().join(format!("hami-preload-it-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let mut vars = HashMap::new();
        vars.insert(
            "FAKE_CUDA_STATE".into(),
            dir.join("fake.state").display().to_string(),
        );
        vars.insert("FAKE_CUDA_TOTAL_MEM".into(), "16G".into());
        vars.insert(
            "CUDA_DEVICE_MEMORY_SHARED_CACHE".into(),
            dir.join("region").display().to_string(),
        );
        Env { dir, vars }
    }

    /// Sets a variable for every process.
    pub fn set(mut self, k: &str, v: &str) -> Env {
        self.vars.insert(k.into(), v.into());
        self
    }

    /// The region file.
    pub fn region_path(&self) -> PathBuf {
        self.dir.join("region")
    }

    /// Opens the region read-only.
    pub fn region(&self) -> Region {
        Region::open_existing(&self.region_path(), false).expect("region exists")
    }

    /// A command running `prog` with the preload (if `preload`) and this environment.
    pub fn command(&self, prog: &Path, preload: bool) -> Command {
        let a = artifacts();
        let mut c = Command::new(prog);
        c.env("LD_LIBRARY_PATH", &a.libdir);
        for (k, v) in &self.vars {
            c.env(k, v);
        }
        if preload {
            c.env("LD_PRELOAD", &a.preload);
        }
        c
    }

    /// Runs hprobe with the preload.
    pub fn probe(&self, args: &[&str]) -> Probe {
        let out = self
            .command(&artifacts().probe, true)
            .args(args)
            .output()
            .expect("run hprobe");
        Probe::from(out)
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
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
