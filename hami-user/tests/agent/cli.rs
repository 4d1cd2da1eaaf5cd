//! The command line as scripts and log collectors see it: exit statuses, log format.
//! `audit` loads the probes: root needed (CI runs as root); these fail without it.

use std::process::Stdio;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use hami_test_harness::{process_groups, serial, AgentCommand, AgentOutput, Artifacts};

use crate::common::{require_root, AGENT};

fn agent(args: &[&str]) -> AgentOutput {
    agent_env(args, &[])
}

/// Runs `hami-agent ARGS` to its end with the fake NVML, no log settings of the caller's but
/// `vars`, in its own process group (which the probe keeper it forks on exit, `hami-detach`,
/// inherits: see [`wait_for_detach`]).
fn agent_env(args: &[&str], vars: &[(&str, &str)]) -> AgentOutput {
    let a = Artifacts::get();
    let mut c = AgentCommand::new(AGENT)
        .args(args)
        .ld_library_path(&a.fake_lib_dir)
        .env_remove("RUST_LOG")
        .env_remove("HAMI_AGENT_LOG");
    for (k, v) in vars {
        c = c.env(k, v);
    }
    let out = c.own_group().output();
    AGENT_GROUPS.lock().unwrap().push(out.pid);
    out
}

/// Process groups of the agents started here.
static AGENT_GROUPS: Mutex<Vec<i32>> = Mutex::new(Vec::new());

/// Waits (at most 60 s) until no process of the agents' groups is left: the keepers that
/// detach their probes after they exit take seconds, during which attaching probes
/// elsewhere is slow. The next test binary must not inherit that.
fn wait_for_detach() {
    let groups = AGENT_GROUPS.lock().unwrap().clone();
    let end = Instant::now() + Duration::from_secs(60);
    while Instant::now() < end {
        if !process_groups().iter().any(|g| groups.contains(g)) {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The node's name labels every metric: an empty or odd `--node-name`, or `NODE_NAME`, is a
/// usage error naming where it came from, refused before anything is loaded.
#[test]
fn a_bad_node_name_is_a_usage_error_naming_its_source() {
    for (name, why) in [("", "empty"), ("gpu node", "whitespace")] {
        let out = agent(&["run", "--node-name", name]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{name:?}: {out:?}");
        assert!(
            err.contains("--node-name") && err.contains(why),
            "{name:?}: {err}"
        );
    }
    // `run` that accepted it would run until stopped: bounded here.
    // (Still running after 20 s, it is killed and the test fails saying so.)
    let a = Artifacts::get();
    let out = AgentCommand::new(AGENT)
        .args(["run", "--metrics-addr", "127.0.0.1:0"])
        .ld_library_path(&a.fake_lib_dir)
        .env("NODE_NAME", "gpu\tnode")
        .stdout(Stdio::null())
        .own_group()
        .output_within(Duration::from_secs(20));
    AGENT_GROUPS.lock().unwrap().push(out.pid);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(64), "{out:?}");
    assert!(
        err.contains("NODE_NAME") && err.contains("whitespace"),
        "{err}"
    );
    assert!(!err.contains("ready"), "started anyway: {err}");
}

/// Issue 11: clap's usage errors exited 2, the status `audit` uses for findings.
#[test]
fn usage_errors_exit_64_not_the_findings_status() {
    for args in [
        &["audit", "--no-such-flag"][..],
        &["run", "--metrics-addr", "nonsense"],
        &["run", "--metrics-addr", ":99999"],
        &["audit", "--seconds", "abc"],
        &["frobnicate"],
    ] {
        let out = agent(args);
        assert_eq!(out.status.code(), Some(64), "{args:?}: {out:?}");
        assert!(!out.stderr.is_empty(), "{args:?}: no message");
    }
    let bad = agent(&["run", "--metrics-addr", "nonsense"]);
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("HOST:PORT"),
        "{bad:?}"
    );
    // The compute share's knobs: a window of 0 s or a tolerance outside 0-100 points.
    for args in [
        &["audit", "--compute-window-secs", "0"][..],
        &["audit", "--compute-share-window-secs", "soon"],
        &["run", "--compute-tolerance-points=-5"],
        &["run", "--compute-tolerance-points", "NaN"],
    ] {
        let out = agent(args);
        assert_eq!(out.status.code(), Some(64), "{args:?}: {out:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        let flag = args[1].split('=').next().unwrap_or_default();
        assert!(err.contains(flag), "{args:?}: the flag is not named: {err}");
        assert!(
            !err.contains("unexpected argument"),
            "{args:?}: the flag is unknown: {err}"
        );
    }
    assert_eq!(agent(&["--help"]).status.code(), Some(0));
    assert_eq!(agent(&["--version"]).status.code(), Some(0));
    // An internal error (unreadable region) is 1.
    let out = agent(&["inspect", "/nonexistent/region.cache"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
}

/// Issue 11: logs carried colour escapes into files; `audit --json` logged text lines.
#[test]
fn logs_are_plain_off_a_terminal_and_json_with_audit_json() {
    require_root();
    let _g = serial();
    let a = Artifacts::get();
    let lib = a.fake_libcuda.display().to_string();
    let text = agent(&["audit", "--seconds", "0.2", "--libcuda", &lib]);
    // 0, or 2 when another process on this machine uses a libcuda without the preload.
    assert!(matches!(text.status.code(), Some(0 | 2)), "{text:?}");
    let err = String::from_utf8_lossy(&text.stderr);
    assert!(err.contains("hami-agent: ready"), "{err}");
    assert!(err.contains("INFO"), "{err}");
    assert!(!err.contains('\u{1b}'), "colour escapes in a pipe:\n{err}");

    // RUST_LOG is the filter.
    let quiet = agent_env(
        &["audit", "--seconds", "0.2", "--libcuda", &lib],
        &[("RUST_LOG", "error")],
    );
    let err = String::from_utf8_lossy(&quiet.stderr);
    assert!(!err.contains("INFO"), "RUST_LOG=error ignored:\n{err}");

    let json = agent(&["audit", "--seconds", "0.2", "--json", "--libcuda", &lib]);
    assert!(matches!(json.status.code(), Some(0 | 2)), "{json:?}");
    let report: serde_json::Value =
        serde_json::from_slice(&json.stdout).expect("stdout is one JSON document");
    assert!(report.is_object());
    for l in String::from_utf8_lossy(&json.stderr).lines() {
        if l.starts_with("hami-agent: ready") {
            continue;
        }
        let v: serde_json::Value =
            serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON: {l:?}: {e}"));
        assert!(v["level"].is_string(), "{l}");
    }
    wait_for_detach();
}

/// Issue 20: `--seconds -1` became 0 and huge values were taken; every duration flag is
/// refused out of range with its name; size flags take the preload's syntax.
#[test]
fn durations_out_of_range_and_bad_sizes_are_usage_errors_naming_the_flag() {
    for (args, says) in [
        (&["audit", "--seconds", "-1"][..], "negative"),
        (&["audit", "--seconds=-1"], "negative"),
        (&["audit", "--seconds", "1e12"], "too long"),
        (&["audit", "--seconds", "inf"], "finite"),
        (&["audit", "--interval", "-5"], "negative"),
        (&["run", "--settle-ms", "99999999999"], "too long"),
        (&["run", "--nvml-interval", "-1"], "negative"),
        (&["audit", "--nvml-settle-ms", "4000000"], "too long"),
        (&["audit", "--compute-window-secs", "-3"], ""),
        (&["audit", "--tolerance-bytes", "2X"], "K/M/G/T"),
        (&["audit", "--tolerance-bytes", "-1"], "negative"),
        (&["run", "--nvml-tolerance-bytes", "1.5G"], "K/M/G/T"),
        (&["audit", "-o", "yaml"], "wide"),
    ] {
        let out = agent(args);
        assert_eq!(out.status.code(), Some(64), "{args:?}: {out:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        let flag = args[1].split('=').next().unwrap_or_default();
        let flag = if flag == "-o" { "--output" } else { flag };
        assert!(err.contains(flag), "{args:?}: the flag is not named: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
    }
}

/// Issue 20: size suffixes, `-o json|wide`, the DEVICE column and the pod filters, through
/// the real binary.
#[test]
fn sizes_with_suffixes_output_formats_and_filters() {
    require_root();
    let _g = serial();
    let a = Artifacts::get();
    let lib = a.fake_libcuda.display().to_string();
    let base = ["audit", "--seconds", "0.2", "--libcuda", &lib];
    let run = |extra: &[&str]| {
        let args: Vec<&str> = base.iter().copied().chain(extra.iter().copied()).collect();
        let out = agent(&args);
        // 0, or 2 when another process on this machine uses a libcuda without the preload.
        assert!(
            matches!(out.status.code(), Some(0 | 2)),
            "{args:?}: {out:?}"
        );
        out
    };
    let table = run(&["--tolerance-bytes", "2M", "--nvml-tolerance-bytes", "64m"]);
    let text = String::from_utf8_lossy(&table.stdout);
    assert!(
        text.lines().next().is_some_and(|l| l.contains("DEVICE")),
        "{text}"
    );
    let json = run(&["-o", "json", "--tolerance-bytes", "1G"]);
    let report: serde_json::Value =
        serde_json::from_slice(&json.stdout).expect("-o json: stdout is one JSON document");
    assert!(report["processes"].is_array(), "{report}");
    // --json stays an alias.
    let alias = run(&["--json"]);
    let v: serde_json::Value = serde_json::from_slice(&alias.stdout).expect("--json");
    assert!(v["processes"].is_array());
    let wide = run(&["-o", "wide"]);
    let text = String::from_utf8_lossy(&wide.stdout);
    let header = text.lines().next().unwrap_or_default();
    for c in ["NAMESPACE", "POD", "UID", "DEVICE", "REASONS"] {
        assert!(header.contains(c), "{c}: {text}");
    }
    // A namespace no process is in: nothing is left, and so no finding fails the audit.
    let out = agent(
        &base
            .iter()
            .copied()
            .chain(["-o", "json", "--namespace", "no-such-ns", "--pod", "p"])
            .collect::<Vec<_>>(),
    );
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("filtered JSON");
    assert_eq!(v["processes"], serde_json::json!([]));
    assert_eq!(v["findings"], serde_json::json!([]));
    assert_eq!(v["filter"]["namespace"], "no-such-ns");
    assert_eq!(v["failed"], false);
    wait_for_detach();
}
