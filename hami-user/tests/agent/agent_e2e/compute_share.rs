//! The compute share end to end: the agent's share of each region against the fake device's
//! clock (issue 18), and the agent as the GPU's arbiter lending the idle GPU (issue 30).

use super::*;

/// Issue 18, item 3, end to end: three processes share one fake device whose kernels take
/// simulated time (1 ms each, back to back). Container region A holds two of them, one
/// hooked (held to 30 %) and one without the preload; region B the third. The agent's share
/// of each region (NVML's per-process utilisation from the same device clock, summed, mean
/// over its 3 s window) agrees with the device clock's own busy time of those processes
/// over the last 3 s, A is `compute_over_limit` (half the device or more against 30 %), and
/// the process without the preload is a bypass.
#[test]
fn compute_share_follows_the_device_clock_and_over_limit_is_found() {
    let _g = serial();
    let env = hooked_env("1g").env("CUDA_DEVICE_SM_LIMIT", "30");
    let region_b = env.dir().join("region-b.cache");
    let agent = AgentProcess::audit(
        AGENT,
        &env,
        "7",
        &[
            // Without the arbiter: region A is held to its 30 % share (under `default` the
            // arbiter would lend it the idle device, and over its grant it is not).
            "--no-arbiter",
            "--nvml-interval",
            "200",
            "--compute-share-window-secs",
            "3",
            "--compute-window-secs",
            "3",
        ],
    );
    let run = ["init", "ctx", "kernel", "wait", "launch-for", "9", "1ms"];
    let mut p1 = env.spawn_probe(&run);
    p1.wait_for("wait");
    // The region exists now; the share it holds A to (what CUDA_DEVICE_SM_LIMIT asks).
    set_sm_limit(env.region_path(), 30);
    let mut unhooked = env.cudaprobe_cmd(&run);
    unhooked.env_remove("LD_PRELOAD").stdin(Stdio::piped());
    let mut p2 = RunningProbe::start(unhooked);
    let mut other = env.cudaprobe_cmd(&run);
    other
        .env("CUDA_DEVICE_MEMORY_SHARED_CACHE", &region_b)
        .env_remove("CUDA_DEVICE_SM_LIMIT")
        .stdin(Stdio::piped());
    let mut p3 = RunningProbe::start(other);
    p2.wait_for("wait");
    p3.wait_for("wait");
    for p in [&mut p1, &mut p2, &mut p3] {
        p.resume();
    }
    let (st, audit, _) = agent.finish_audit();
    // The device clock's ground truth over the agent's share window: the 3 s before its
    // latest NVML sample (CLOCK_MONOTONIC, the clock's own time base).
    let to = audit["regions"]
        .as_array()
        .unwrap()
        .iter()
        .find_map(|r| r["compute"][0]["sampled_at_ns"].as_u64())
        .unwrap_or_else(|| panic!("no sample time:\n{audit:#}"));
    let truth = env.device_busy(0, to - 3_000_000_000, to);
    assert!(truth.covered_from <= truth.from, "{truth:?}");
    let busy = |pids: &[u32]| -> f64 {
        let ns: u64 = truth
            .per_pid
            .iter()
            .filter(|(p, _)| pids.contains(p))
            .map(|(_, n)| n)
            .sum();
        100.0 * ns as f64 / (truth.to - truth.from) as f64
    };
    let runs: Vec<_> = [&mut p1, &mut p2, &mut p3]
        .into_iter()
        .map(|p| p.wait_for("launch-for"))
        .collect();
    for (p, r) in [&p1, &p2, &p3].iter().zip(&runs) {
        assert!(r.ok(), "pid {}: {r:?}", p.pid);
    }
    let region_a = env.region_path().display().to_string();
    let region_b = region_b.display().to_string();
    let compute = |name: &str| -> Value {
        audit["regions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["name"] == name)
            .unwrap_or_else(|| panic!("region {name} not in audit:\n{audit:#}"))["compute"][0]
            .clone()
    };
    let (ca, cb) = (compute(&region_a), compute(&region_b));
    let share = |c: &Value| c["share"].as_f64().unwrap_or_else(|| panic!("{c:#}"));
    let sim_a = busy(&[p1.pid, p2.pid]);
    let sim_b = busy(&[p3.pid]);
    eprintln!(
        "agent: A {:.1} % B {:.1} %; device clock: A {sim_a:.1} % B {sim_b:.1} %",
        share(&ca),
        share(&cb)
    );
    for (name, agent_share, sim) in [("A", share(&ca), sim_a), ("B", share(&cb), sim_b)] {
        assert!(
            (agent_share - sim).abs() <= 10.0,
            "region {name}: agent {agent_share:.1} %, simulated {sim:.1} %\n{audit:#}"
        );
    }
    assert!(share(&ca) > 45.0, "two of three processes: {ca:#}");
    assert_eq!(ca["limit"], 30, "{ca:#}");
    assert_eq!(cb["limit"], Value::Null, "{cb:#}");
    // A's share held above 30 % + 10 points for the (3 s) window: the finding, A only.
    let over: Vec<&Value> = audit["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["kind"] == "compute_over_limit")
        .collect();
    assert!(
        over.iter().any(|f| f["region"] == region_a.as_str()
            && f["device"] == 0
            && f["limit"] == 30
            && f["reason"] == "share_above_limit"),
        "{audit:#}"
    );
    assert!(
        over.iter().all(|f| f["region"] != region_b.as_str()),
        "{audit:#}"
    );
    // The process without the preload is a bypass; the audit fails.
    assert!(
        findings_for(&audit, p2.pid)
            .iter()
            .any(|f| f["kind"] == "bypass" && f["reason"] == "no_preload"),
        "{audit:#}"
    );
    assert_eq!(st.code(), Some(2), "{audit:#}");
    // Each process's SM time is in its row; the hooked one's shows its container's share.
    let row = process(&audit, p1.pid);
    assert!(row["sm_util"].as_u64().is_some_and(|u| u > 0), "{row:#}");
    assert_eq!(row["compute_limit"], 30, "{row:#}");
}

/// Issue 30 end to end, the real agent as the GPU's arbiter: a `default` container at 30 %
/// alone on the fake GPU gets (nearly) all of it while `hami-agent run` runs; with the agent
/// stopped (`SIGSTOP`) or killed (`SIGKILL`) it is back at 30 % within the grants' 500 ms
/// lifetime (plus the lent burst).
#[test]
fn the_agent_lends_the_idle_gpu_and_its_loss_falls_back_to_the_share() {
    let _g = serial();
    const MS: u64 = 1_000_000;
    for sig in [libc::SIGSTOP, libc::SIGKILL] {
        let env = hooked_env("1g")
            .env("CUDA_DEVICE_SM_LIMIT", "30")
            .env("GPU_CORE_UTILIZATION_POLICY", "default")
            .env("FAKE_CUDA_CTX_OVERHEAD", "0")
            .env("HAMI_CONTEXT_OVERHEAD", "0");
        let agent = AgentProcess::run_json(AGENT, &env, &[]);
        let p = env.spawn_probe(&["init", "ctx", "kernel", "launch-for", "6", "1ms"]);
        std::thread::sleep(Duration::from_millis(3_000));
        let lost_at = hami_test_harness::device_clock_now_ns();
        agent.signal(sig);
        let out = p.finish();
        agent.signal(libc::SIGKILL);
        drop(agent);
        assert!(out.all_ok(), "{}", out.dump());
        let l = out.last("launch-for");
        let num = |k: &str| l.get(k).and_then(|v| v.parse::<f64>().ok()).unwrap() as u64;
        let (from, to) = (num("start_ns"), num("end_ns"));
        let pid = out.pid.unwrap();
        let share = |a: u64, b: u64| {
            let w = env.device_busy(0, a, b);
            let ns: u64 = w.per_pid.iter().filter(|x| x.0 == pid).map(|x| x.1).sum();
            ns as f64 / (b - a) as f64
        };
        // The agent finds the process and its region at a tick; lent from then on.
        let lent = share(from + 1_500 * MS, lost_at);
        assert!(
            lent > 0.8,
            "signal {sig}: with the agent {lent:.3}: {}",
            out.dump()
        );
        let back = lost_at + 800 * MS;
        assert!(to > back + 1_000 * MS, "{}", out.dump());
        let got = share(back, to);
        assert!(
            (got - 0.3).abs() < 0.07,
            "signal {sig}: agent lost, {got:.3} of the device: {}",
            out.dump()
        );
    }
}
