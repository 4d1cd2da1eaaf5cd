//! Where the running test's artifacts go: the workspace root, and the target dir, profile and
//! triple of the running binary (`locate_target`), used by the artifacts' build
//! (`artifacts.rs`) and the C compiler's choice (`programs.rs`).

use std::path::{Path, PathBuf};

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
