//! The built test artifacts: the fake driver and NVML, the preload and the C probes, built
//! once per test binary with the running test's profile and target dir ([`Artifacts::get`]).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

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

/// Root of the workspace (two levels above this crate).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .expect("workspace root above testing/harness")
        .to_path_buf()
}

/// Environment variable naming the target triple the artifacts are built for when it is not
/// the running binary's own: `cargo xtask test --target aarch64` runs the torture scenarios
/// from the host's xtask against aarch64 builds of the preload, the fakes and the programs
/// (run under qemu-user through binfmt_misc).
pub const ENV_TEST_TARGET: &str = "HAMI_TEST_TARGET";

/// `(target_dir, profile_dir, cargo profile name, target triple if any)` of the running test.
pub(crate) fn locate_target() -> (PathBuf, PathBuf, String, Option<String>) {
    retarget(
        locate_running_binary(),
        std::env::var(ENV_TEST_TARGET).ok().as_deref(),
    )
}

/// The running binary's `(target_dir, profile_dir, profile, triple)` moved to the triple
/// `want` (`<target>/<want>/<profile dir name>`), when one is asked for and differs.
fn retarget(
    found: (PathBuf, PathBuf, String, Option<String>),
    want: Option<&str>,
) -> (PathBuf, PathBuf, String, Option<String>) {
    let (target_dir, profile_dir, profile, triple) = found;
    match want {
        Some(t) if !t.is_empty() && triple.as_deref() != Some(t) => {
            let name = profile_dir
                .file_name()
                .expect("profile dir name")
                .to_os_string();
            let profile_dir = target_dir.join(t).join(name);
            (target_dir, profile_dir, profile, Some(t.to_string()))
        }
        _ => (target_dir, profile_dir, profile, triple),
    }
}

/// [`locate_target`] of the running binary itself.
fn locate_running_binary() -> (PathBuf, PathBuf, String, Option<String>) {
    locate_binary(&std::env::current_exe().expect("current_exe"))
}

/// [`locate_target`] of the binary at `exe`.
fn locate_binary(exe: &Path) -> (PathBuf, PathBuf, String, Option<String>) {
    // <target>/[<triple>/]<profile>/deps/<test binary>  or  <target>/.../<profile>/<binary>
    let mut dir = exe.parent().expect("exe dir").to_path_buf();
    if dir
        .file_name()
        .is_some_and(|n| n == "deps" || n == "examples")
    {
        dir = dir.parent().expect("profile dir").to_path_buf();
    }
    let profile_dir = dir;
    let dir_name = profile_dir
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("debug")
        .to_string();
    let profile = match dir_name.as_str() {
        "debug" => "dev".to_string(),
        "release" => "release".to_string(),
        other => other.to_string(),
    };
    let parent = profile_dir.parent().expect("target dir").to_path_buf();
    // `<target>/<triple>/<profile>`: the parent is named like a triple and its own parent is
    // a target dir. (Not "the parent has no CACHEDIR.TAG": cargo writes one into a triple's
    // directory too, and a cross test that took its triple's directory for the target dir
    // built the host's fakes and programs into it.)
    let is_triple = |p: &Path| {
        p.file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.matches('-').count() >= 2)
            && p.parent().is_some_and(|t| t.join("CACHEDIR.TAG").exists())
    };
    if !is_triple(&parent) {
        (parent, profile_dir, profile, None)
    } else {
        let triple = parent
            .file_name()
            .and_then(|n| n.to_str())
            .map(str::to_string);
        (
            parent.parent().expect("target root").to_path_buf(),
            profile_dir,
            profile,
            triple,
        )
    }
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
        let cudaprobe = crate::programs::compile(
            "cudaprobe",
            &programs_dir,
            &[&libdir, "-lcuda", "-ldl", "-lpthread"],
        );
        let nvmlprobe = crate::programs::compile("nvmlprobe", &programs_dir, &["-ldl"]);
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

#[cfg(test)]
mod tests {
    /// Regression (issue 22): cargo writes a CACHEDIR.TAG into `<target>/<triple>/` too; a
    /// cross test binary there must still be found to be the triple's, or its fakes and
    /// programs are built for the host into the triple's directory.
    #[test]
    fn a_cross_test_binary_is_located_under_its_triple_even_with_a_cachedir_tag_there() {
        let t = tempfile::tempdir().unwrap();
        let target = t.path().join("target");
        let triple = target.join("aarch64-unknown-linux-gnu");
        std::fs::create_dir_all(triple.join("debug/deps")).unwrap();
        std::fs::create_dir_all(target.join("debug/deps")).unwrap();
        std::fs::write(target.join("CACHEDIR.TAG"), "").unwrap();
        std::fs::write(triple.join("CACHEDIR.TAG"), "").unwrap();
        let (dir, profile_dir, profile, found) =
            super::locate_binary(&triple.join("debug/deps/hooks-0123"));
        assert_eq!(dir, target);
        assert_eq!(profile_dir, triple.join("debug"));
        assert_eq!(profile, "dev");
        assert_eq!(found.as_deref(), Some("aarch64-unknown-linux-gnu"));
        let (dir, profile_dir, _, found) = super::locate_binary(&target.join("debug/deps/x-1"));
        assert_eq!((dir, found), (target.clone(), None));
        assert_eq!(profile_dir, target.join("debug"));
    }

    use super::*;

    fn host(profile_dir: &str) -> (PathBuf, PathBuf, String, Option<String>) {
        (
            PathBuf::from("/t"),
            PathBuf::from(profile_dir),
            "dev".into(),
            None,
        )
    }

    #[test]
    fn another_target_moves_the_artifacts_under_its_triple() {
        let a64 = "aarch64-unknown-linux-gnu";
        let (t, p, prof, triple) = retarget(host("/t/debug"), Some(a64));
        assert_eq!(t, PathBuf::from("/t"));
        assert_eq!(p, PathBuf::from("/t/aarch64-unknown-linux-gnu/debug"));
        assert_eq!(prof, "dev");
        assert_eq!(triple.as_deref(), Some(a64));
        // Unset, empty or the binary's own triple: unchanged.
        assert_eq!(retarget(host("/t/debug"), None), host("/t/debug"));
        assert_eq!(retarget(host("/t/debug"), Some("")), host("/t/debug"));
        let own = (
            PathBuf::from("/t"),
            PathBuf::from("/t/aarch64-unknown-linux-gnu/release"),
            "release".to_string(),
            Some(a64.to_string()),
        );
        assert_eq!(retarget(own.clone(), Some(a64)), own);
    }
}
