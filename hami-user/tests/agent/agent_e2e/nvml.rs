//! The agent against NVML's per-process figures: a blind preload caught, no flapping while
//! processes start, the fallback to the probes without NVML, NVML loaded once it appears.

use super::*;

/// Issue 8: a preload that does not see some of what the driver holds for a process (a
/// pool's reserve, a module's globals, a mipmapped array...) is caught by comparing with
/// NVML. Here the preload is told contexts cost nothing (`HAMI_CONTEXT_OVERHEAD=0`) while
/// the fake driver takes 1.5 GiB for each: the region says 256 MiB, the probes agree, NVML
/// says 1.75 GiB in a 1 GiB container. The workload cannot find itself in NVML either
/// (`FAKE_NVML_HIDE_PROCESSES=1`), so no NVML-based correction in the preload can make it
/// see the memory. It runs on the second of two GPUs (`CUDA_VISIBLE_DEVICES=1`): its
/// ordinal 0 is the container's device 1 (issue 29), NVML's GPU 1, matched through the UUID
/// the region records there.
#[test]
fn nvml_catches_a_blind_preload_as_drift_and_over_limit() {
    let _g = serial();
    let env = hooked_env("1g")
        .env("FAKE_CUDA_DEVICE_COUNT", "2")
        .env("CUDA_VISIBLE_DEVICES", "1")
        .env("FAKE_CUDA_CTX_OVERHEAD", "1536M")
        .env("HAMI_CONTEXT_OVERHEAD", "0")
        .env("FAKE_NVML_HIDE_PROCESSES", "1");
    let mut probe = spawn_waiting(&env, &["init", "ctx", "alloc", "256M", "wait"]);
    // What the driver holds for it: its context (1.5 GiB) and its 256 MiB.
    let held = 1792 * MIB;
    // Default NVML period and settle time (1 s each): confirmed by the second sample.
    let agent = AgentProcess::audit(AGENT, &env, "2.5", &[]);
    let (st, audit, _) = agent.finish_audit();
    let p = process(&audit, probe.pid);
    assert_eq!(p["nvml"], held, "{p:#}");
    // Started before the agent: the probes saw none of it, NVML's comparison does not care.
    assert_eq!(
        p["baseline"], "pre-existing, not observed from start",
        "{p:#}"
    );
    assert_eq!(p["accounted_total"], 256 * MIB, "{p:#}");
    let drift: Vec<&Value> = findings_for(&audit, probe.pid)
        .into_iter()
        .filter(|f| f["kind"] == "drift")
        .collect();
    assert_eq!(drift.len(), 1, "{audit:#}");
    assert_eq!(drift[0]["reason"], "nvml_above_accounted");
    assert_eq!(drift[0]["bytes"], 1536 * MIB);
    assert_eq!(drift[0]["observed"], held);
    assert_eq!(drift[0]["accounted"], 256 * MIB);
    assert_eq!(
        drift[0]["device"], 1,
        "the container's device, not the ordinal"
    );
    assert!(
        drift[0]["detail"].as_str().unwrap().contains("NVML GPU 1"),
        "{:#}",
        drift[0]
    );
    let region = env.region_path().display().to_string();
    let over: Vec<&Value> = audit["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["kind"] == "over_limit" && f["region"] == region.as_str())
        .collect();
    assert_eq!(over.len(), 1, "{audit:#}");
    assert_eq!(over[0]["reason"], "nvml_above_limit");
    assert_eq!(over[0]["observed"], held);
    assert_eq!(over[0]["limit"], 1024 * MIB);
    assert_eq!(over[0]["bytes"], held - 1024 * MIB);
    // The probes' own comparisons agree with the region: no probe-based finding.
    assert!(
        !findings_for(&audit, probe.pid)
            .iter()
            .any(|f| f["kind"] == "bypass"),
        "{audit:#}"
    );
    assert_eq!(audit["nvml"]["available"], true);
    assert_eq!(st.code(), Some(2), "over_limit fails the audit");
    probe.resume();
}

/// The comparison with NVML does not flap while processes start: a context is in NVML
/// before the preload has measured and charged it (here for 300 ms: the fake driver sleeps
/// after taking the context's memory), and NVML is sampled every 100 ms meanwhile (with
/// `--settle-ms 0 --nvml-settle-ms 0` this test fails: `nvml_above_accounted`, no slot).
#[test]
fn hooked_processes_starting_under_the_agent_raise_no_nvml_finding() {
    let _g = serial();
    let env = hooked_env("2g").env("FAKE_CUDA_CTX_CREATE_DELAY_MS", "300");
    let agent = AgentProcess::audit(
        AGENT,
        &env,
        "3",
        &["--nvml-interval", "100", "--interval", "50"],
    );
    let mut probes = Vec::new();
    for size in ["64M", "128M", "256M"] {
        probes.push(env.spawn_probe(&["init", "ctx", "alloc", size, "wait"]));
        std::thread::sleep(Duration::from_millis(150));
    }
    for p in &mut probes {
        p.wait_for("wait");
    }
    let (st, audit, _) = agent.finish_audit();
    for p in &probes {
        let row = process(&audit, p.pid);
        assert_eq!(row["verdict"], "ok", "{audit:#}");
        assert!(findings_for(&audit, p.pid).is_empty(), "{audit:#}");
    }
    let region = env.region_path().display().to_string();
    assert!(
        !audit["findings"]
            .as_array()
            .unwrap()
            .iter()
            .any(|f| f["region"] == region.as_str()),
        "{audit:#}"
    );
    assert!(audit["nvml"]["samples"].as_u64().unwrap() >= 3, "{audit:#}");
    assert_eq!(st.code(), Some(if audit["failed"] == true { 2 } else { 0 }));
    for mut p in probes {
        p.resume();
    }
}

/// Without NVML the agent says so (log, table) and falls back to the probes: a process
/// that allocates without the preload is still a bypass; an unhooked process that was
/// running before the agent cannot be judged and is marked "unverified".
#[test]
fn without_nvml_the_agent_says_so_and_falls_back_to_the_probes() {
    let _g = serial();
    let env = TestEnv::new().env("FAKE_CUDA_DEVICE_COUNT", "1");
    let mut before = spawn_waiting(&env, &["init", "ctx", "alloc", "32M", "wait"]);
    let no_nvml = tempfile::tempdir().unwrap();
    let agent = AgentProcess::start_with_libs(
        AGENT,
        &env,
        &["audit", "--seconds", "1.5"],
        Some(no_nvml.path()),
    );
    let mut after = spawn_waiting(&env, &["init", "ctx", "alloc", "16M", "wait"]);
    let (st, out, log) = agent.finish();
    let log = log.join("\n");
    assert!(log.contains("running without NVML"), "{log}");
    assert!(log.contains("findings come from the probes only"), "{log}");
    assert!(out.contains("NVML: not available"), "{out}");
    assert!(out.contains("libnvidia-ml.so.1"), "{out}");
    assert!(out.contains("no physical check"), "{out}");
    let row = |pid: u32| {
        out.lines()
            .find(|l| l.split_whitespace().next() == Some(&pid.to_string()))
            .unwrap_or_else(|| panic!("pid {pid} not in the table:\n{out}"))
            .to_string()
    };
    assert!(row(before.pid).contains("unverified"), "{out}");
    assert!(row(after.pid).contains("bypass"), "{out}");
    assert!(
        out.lines().any(|l| l.contains("bypass")
            && l.contains("no_preload")
            && l.contains(&format!("pid={} ", after.pid))),
        "{out}"
    );
    assert!(
        !out.lines()
            .any(|l| l.contains(&format!("pid={} ", before.pid))),
        "{out}"
    );
    assert_eq!(st.code(), Some(2));
    before.resume();
    after.resume();
}

/// Issue 20 (chart): an agent started before the NVIDIA toolkit is ready says it runs
/// without NVML and will retry, retries from its tick, and once `libnvidia-ml.so.1` appears
/// in its library path says where it loaded it from and uses it as if loaded at start: a
/// process that allocated without the preload before the agent started, "unverified" without
/// NVML, is a bypass by NVML's figures. On the base commit NVML is never loaded again.
#[test]
fn nvml_appearing_after_start_is_loaded_by_a_retry_and_used() {
    let _g = serial();
    let env = TestEnv::new().env("FAKE_CUDA_DEVICE_COUNT", "1");
    let mut before = spawn_waiting(&env, &["init", "ctx", "alloc", "32M", "wait"]);
    let libs = tempfile::tempdir().unwrap();
    let mut agent = AgentProcess::start_with_libs(
        AGENT,
        &env,
        &[
            "audit",
            "--json",
            "--seconds",
            "6",
            "--nvml-interval",
            "200",
        ],
        Some(libs.path()),
    );
    let joined = agent.log().join("\n");
    assert!(joined.contains("running without NVML"), "{joined}");
    assert!(joined.contains("retrying in 1s"), "{joined}");
    // The toolkit arrives: the library appears at once (renamed into place).
    let lib = libs.path().join("libnvidia-ml.so.1");
    let tmp = libs.path().join(".libnvidia-ml.so.1.tmp");
    std::fs::copy(
        Artifacts::get().fake_lib_dir.join("libnvidia-ml.so.1"),
        &tmp,
    )
    .unwrap();
    std::fs::rename(&tmp, &lib).unwrap();
    let t0 = Instant::now();
    let line = agent.wait_line(Duration::from_secs(4), |l| l.contains("NVML loaded from"));
    eprintln!(
        "NVML loaded {:?} after the library appeared: {line}",
        t0.elapsed()
    );
    assert!(
        line.contains(&format!("NVML loaded from {} after ", lib.display())),
        "{line}"
    );
    let attempts: u32 = line
        .split(" after ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no attempt count: {line}"));
    assert!(attempts >= 2, "{line}");
    let (st, audit, _) = agent.finish_audit();
    assert_eq!(audit["nvml"]["available"], true, "{audit:#}");
    assert!(audit["nvml"]["error"].is_null(), "{audit:#}");
    assert!(audit["nvml"]["samples"].as_u64().unwrap() >= 2, "{audit:#}");
    assert_eq!(
        audit["nvml"]["devices"].as_array().unwrap().len(),
        1,
        "{audit:#}"
    );
    let bypass = audit["findings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["kind"] == "bypass" && f["pid"] == before.pid)
        .unwrap_or_else(|| panic!("no bypass of pid {}: {audit:#}", before.pid));
    assert_eq!(bypass["reason"], "no_preload", "{bypass:#}");
    assert_eq!(st.code(), Some(2));
    before.resume();
}
