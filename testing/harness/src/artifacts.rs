//! The built test artifacts: the fake driver and NVML, the preload and the C probes, built
//! once per test binary with the running test's profile and target dir ([`Artifacts::get`]).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use crate::locate::locate_target;
pub use crate::locate::{workspace_root, ENV_TEST_TARGET};
use crate::programs::{cc, compile};

/// Paths of the built test artifacts.
#[derive(Debug, Clone)]
pub struct Artifacts {
    /// Cargo target dir of the running test.
    pub target_dir: PathBuf,
    /// `<target>/<profile>` (or `<target>/<triple>/<profile>`).
    pub profile_dir: PathBuf,
    /// Directory holding `libcuda.so.1`, `libcuda.so`, `libnvidia-ml.so.1`, `libnvidia-ml.so`.
    pub fake_lib_dir: PathBuf,
    /// The fake `libcuda.so.1` (a copy of the built `libcuda.so`).
    pub fake_libcuda: PathBuf,
    /// The fake `libnvidia-ml.so.1`.
    pub fake_libnvml: PathBuf,
    /// `libhami_preload.so` as built by cargo.
    pub preload_so: PathBuf,
    /// Directory of the compiled C programs.
    pub programs_dir: PathBuf,
    /// The compiled `cudaprobe`.
    pub cudaprobe: PathBuf,
    /// The compiled `nvmlprobe`.
    pub nvmlprobe: PathBuf,
}

/// Puts `from` at `to` atomically (a temp name in the same dir, then rename), so that
/// concurrent test binaries never see a half-written file. A hard link where the two are on
/// one file system, else a copy: a copy holds the new file open for writing, and a process
/// that another test thread forks meanwhile inherits that descriptor until it execs, so that
/// running the new file can fail with `ETXTBSY` ("Text file busy"; seen in
/// `multiuser::a_malformed_region_mode_fails_closed_naming_the_variable`).
pub(crate) fn install(from: &Path, to: &Path) {
    let tmp = to.with_extension(format!("tmp{}", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    if std::fs::hard_link(from, &tmp).is_err() {
        std::fs::copy(from, &tmp)
            .unwrap_or_else(|e| panic!("copy {} -> {}: {e}", from.display(), tmp.display()));
    }
    std::fs::rename(&tmp, to).unwrap_or_else(|e| panic!("rename to {}: {e}", to.display()));
}

/// Points `link` at `target` (a relative symlink), replacing what was there, atomically.
pub(crate) fn symlink(target: &str, link: &Path) {
    let tmp = link.with_extension(format!("tmp{}", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(target, &tmp)
        .unwrap_or_else(|e| panic!("symlink {}: {e}", tmp.display()));
    std::fs::rename(&tmp, link).unwrap_or_else(|e| panic!("rename to {}: {e}", link.display()));
}

impl Artifacts {
    /// Builds everything once per test binary (see the crate doc) and returns the paths.
    pub fn get() -> &'static Artifacts {
        static A: OnceLock<Artifacts> = OnceLock::new();
        A.get_or_init(Artifacts::build)
    }

    fn build() -> Artifacts {
        let (target_dir, profile_dir, profile, triple) = locate_target();
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_string());
        let mut cmd = Command::new(&cargo);
        cmd.args([
            "build",
            "-p",
            "fake-cuda",
            "-p",
            "fake-nvml",
            "-p",
            "hami-preload",
            "--profile",
            &profile,
        ])
        .env("CARGO_TARGET_DIR", &target_dir)
        .current_dir(workspace_root());
        if let Some(t) = &triple {
            cmd.args(["--target", t]);
        }
        let out = cmd
            .output()
            .unwrap_or_else(|e| panic!("running {cargo} build: {e}"));
        assert!(
            out.status.success(),
            "building fake-cuda, fake-nvml and hami-preload failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let fake_lib_dir = profile_dir.join("fake-driver");
        std::fs::create_dir_all(&fake_lib_dir).expect("create fake-driver dir");
        let fake_libcuda = fake_lib_dir.join("libcuda.so.1");
        let fake_libnvml = fake_lib_dir.join("libnvidia-ml.so.1");
        install(&profile_dir.join("libcuda.so"), &fake_libcuda);
        install(&profile_dir.join("libnvidia_ml.so"), &fake_libnvml);
        symlink("libcuda.so.1", &fake_lib_dir.join("libcuda.so"));
        symlink("libnvidia-ml.so.1", &fake_lib_dir.join("libnvidia-ml.so"));
        // Programs for an old glibc (built by zig) apart from the host's.
        let programs_dir = profile_dir.join(match crate::glibc::requested() {
            Some(_) => "test-programs-old-glibc",
            None => "test-programs",
        });
        std::fs::create_dir_all(&programs_dir).expect("create test-programs dir");
        let libdir = format!("-L{}", fake_lib_dir.display());
        let cudaprobe = compile(
            "cudaprobe",
            &programs_dir,
            &[&libdir, "-lcuda", "-ldl", "-lpthread"],
        );
        let nvmlprobe = compile("nvmlprobe", &programs_dir, &["-ldl"]);
        Artifacts {
            preload_so: profile_dir.join("libhami_preload.so"),
            target_dir,
            profile_dir,
            fake_lib_dir,
            fake_libcuda,
            fake_libnvml,
            programs_dir,
            cudaprobe,
            nvmlprobe,
        }
    }
}

impl Artifacts {
    /// Compiles the C program `src` (one outside `testing/programs`, e.g. a crate's own test
    /// program) into [`Artifacts::programs_dir`] under `name`, linked against the fake driver
    /// like `cudaprobe` (`-O2 -Wall -L<fake_lib_dir> -lcuda -ldl -lpthread`), and returns its
    /// path.
    pub fn compile_against_fake(&self, src: &Path, name: &str) -> PathBuf {
        self.compile_against_fake_with(src, name, &[])
    }

    /// [`Artifacts::compile_against_fake`] with `extra` compiler arguments before the
    /// libraries (e.g. `-I<dir>` for a generated header).
    pub fn compile_against_fake_with(&self, src: &Path, name: &str, extra: &[&str]) -> PathBuf {
        let out = self.programs_dir.join(name);
        let libdir = format!("-L{}", self.fake_lib_dir.display());
        let mut args = vec!["-O2", "-Wall"];
        args.extend_from_slice(extra);
        args.extend([libdir.as_str(), "-lcuda", "-ldl", "-lpthread"]);
        cc(src, &out, &args);
        out
    }
}
