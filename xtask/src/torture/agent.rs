//! Agent faults (long profile, root): the agent killed and restarted mid-workload, its
//! eBPF programs checked gone, its ring buffer overflowed on purpose.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use hami_test_harness::{Artifacts, TestEnv};

use super::profile::{Profile, LINE_WAIT};
use super::report::Report;
use super::sandbox::sandbox;
use super::worker::{settle_and_check, Worker};

/// The eBPF program ids the process holds (`prog_id:` in `/proc/<pid>/fdinfo/*`: program
/// and link descriptors).
pub(super) fn bpf_prog_ids(pid: u32) -> Vec<u32> {
    let mut ids = Vec::new();
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/fdinfo")) else {
        return ids;
    };
    for e in dir.flatten() {
        if let Ok(t) = std::fs::read_to_string(e.path()) {
            for l in t.lines() {
                if let Some(v) = l.strip_prefix("prog_id:") {
                    if let Ok(id) = v.trim().parse() {
                        ids.push(id);
                    }
                }
            }
        }
    }
    ids.sort_unstable();
    ids.dedup();
    ids
}

/// Whether the kernel still has eBPF program `id` (`BPF_PROG_GET_FD_BY_ID`). A uprobe left
/// behind by a dead agent would keep its program alive.
pub(super) fn bpf_prog_exists(id: u32) -> bool {
    const BPF_PROG_GET_FD_BY_ID: libc::c_long = 13;
    // union bpf_attr for this command: prog_id, next_id, open_flags.
    let attr: [u32; 3] = [id, 0, 0];
    // SAFETY: the attr buffer is valid for its size; the command only reads it.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_PROG_GET_FD_BY_ID,
            attr.as_ptr(),
            std::mem::size_of_val(&attr) as libc::c_uint,
        )
    };
    if fd >= 0 {
        // SAFETY: a descriptor the kernel just gave us.
        unsafe { libc::close(fd as libc::c_int) };
        return true;
    }
    false
}

/// Programs of `ids` still loaded after up to 20 s (the kernel frees them asynchronously
/// once the last descriptor is closed; several seconds on a loaded machine).
pub(super) fn lingering(ids: &[u32]) -> Vec<u32> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let left: Vec<u32> = ids
            .iter()
            .copied()
            .filter(|&i| bpf_prog_exists(i))
            .collect();
        if left.is_empty() || Instant::now() > deadline {
            return left;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Starts `hami-agent run` on the fake driver of `env` (the demo's [`crate::demo::Agent`],
/// the harness's `AgentProcess` underneath) and waits for it to be ready.
pub(super) fn start_agent(
    bin: &Path,
    art: &Artifacts,
    env: &TestEnv,
) -> Result<crate::demo::Agent> {
    let mut c = Command::new(bin);
    c.args([
        "run",
        "--json-log",
        "--metrics-addr",
        "127.0.0.1:0",
        "--libcuda",
    ])
    .arg(&art.fake_libcuda)
    .env_remove("LD_PRELOAD")
    .env("LD_LIBRARY_PATH", &art.fake_lib_dir)
    .envs(env.vars());
    crate::demo::Agent::spawn(c, false)
}

pub(super) fn agent_faults(p: &Profile, load: &Path, r: &mut Report) -> Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("the agent loads eBPF programs: run as root");
    }
    let (art, bin) = crate::demo::build(&hami_test_harness::workspace_root())?;
    let env = sandbox(1 << 40);
    // Paced (1 ms between calls): a debug agent on a loaded machine keeps up, so a finding
    // is a false one, not the effect of lost events.
    let mut workers = Vec::new();
    for i in 0..3 {
        workers.push(Worker::spawn(
            &env,
            load,
            &["storm", "1", "4", &(200 + i).to_string(), "1000"],
        )?);
    }
    for w in &workers {
        w.expect("ready", LINE_WAIT)?;
    }
    let mine: Vec<u64> = workers.iter().map(|w| w.pid as u64).collect();
    let restarts = if p.every_header_byte { 5 } else { 1 };
    let (mut false_findings, mut stale, mut progs) = (0usize, 0usize, 0usize);
    for round in 0..restarts {
        let agent = start_agent(&bin, art, &env)?;
        std::thread::sleep(Duration::from_millis(1000));
        let ids = bpf_prog_ids(agent.pid());
        progs = progs.max(ids.len());
        r.check(!ids.is_empty(), || {
            format!("agent round {round}: the running agent holds no eBPF program")
        });
        // SIGKILL mid-workload: no exit path runs.
        agent_signal(agent.pid(), libc::SIGKILL);
        drop(agent);
        let left = lingering(&ids);
        stale += left.len();
        r.check(left.is_empty(), || {
            format!("agent round {round}: after SIGKILL of the agent, its eBPF programs {left:?} are still loaded (stale probes)")
        });
        // Restarted mid-workload: the running processes are old news, not bypasses.
        let mut agent = start_agent(&bin, art, &env)?;
        let m0 = agent.metrics()?;
        let d0 = crate::demo::metric(&m0, "hami_events_dropped_total", &[]).unwrap_or(0);
        std::thread::sleep(Duration::from_secs(3));
        agent.drain();
        let m1 = agent.metrics()?;
        let d1 = crate::demo::metric(&m1, "hami_events_dropped_total", &[]).unwrap_or(0);
        let f = ours(&agent, &mine, env.region_path());
        false_findings += f.len();
        // For whoever debugs it: the events the agent consumed, by kind.
        let events: Vec<&str> = m1
            .lines()
            .filter(|l| l.starts_with("hami_events_total{"))
            .collect();
        r.check(f.is_empty() || d1 > d0, || {
            format!("agent round {round}: findings after a restart with only hooked processes within quota (no event dropped): {f:?}; events consumed: {events:?}")
        });
        if round + 1 == restarts {
            // Overflow the ring buffer: stop the consumer while unpaced processes churn.
            let mut fast = Vec::new();
            for i in 0..2 {
                fast.push(Worker::spawn(
                    &env,
                    load,
                    &["storm", "2", "4", &(300 + i).to_string()],
                )?);
            }
            for w in &fast {
                w.expect("ready", LINE_WAIT)?;
            }
            let all: Vec<u64> = mine
                .iter()
                .copied()
                .chain(fast.iter().map(|w| w.pid as u64))
                .collect();
            let before = ours(&agent, &all, env.region_path()).len();
            let m0 = agent.metrics()?;
            let d0 = crate::demo::metric(&m0, "hami_events_dropped_total", &[]).unwrap_or(0);
            agent_signal(agent.pid(), libc::SIGSTOP);
            std::thread::sleep(Duration::from_secs(3));
            agent_signal(agent.pid(), libc::SIGCONT);
            std::thread::sleep(Duration::from_secs(3));
            let m1 = agent.metrics()?;
            let d1 = crate::demo::metric(&m1, "hami_events_dropped_total", &[]).unwrap_or(0);
            agent.drain();
            let after = ours(&agent, &all, env.region_path());
            r.figure(
                "agent: events dropped while the agent was stopped 3 s",
                d1 - d0,
            );
            r.figure(
                "agent: FINDING: false findings raised after the overflow (hooked processes within quota)",
                after.len() - before,
            );
            for f in after.iter().skip(before).take(3) {
                println!("      {f}");
            }
            r.check(d1 > d0, || {
                "agent: stopping the consumer 3 s under load dropped no event (ring not overflowed, or drops not counted)".into()
            });
            workers.extend(fast);
        }
        let ids = bpf_prog_ids(agent.pid());
        agent.stop()?;
        let left = lingering(&ids);
        r.check(left.is_empty(), || {
            format!("agent round {round}: after the agent stopped, eBPF programs {left:?} are still loaded")
        });
    }
    r.figure("agent: SIGKILLs + restarts mid-workload", restarts);
    r.figure("agent: eBPF programs held by the agent", progs);
    r.figure(
        "agent: programs left loaded after SIGKILL (stale probes)",
        stale,
    );
    r.figure("agent: false findings after restart", false_findings);
    let (lost, _) = settle_and_check("agent faults", &env, workers, r)?;
    r.figure("agent: bytes lost or leaked (region)", lost);
    Ok(())
}

/// Findings raised about this scenario's processes or region (the machine may run others).
pub(super) fn ours(agent: &crate::demo::Agent, pids: &[u64], region: &Path) -> Vec<String> {
    let region = region.display().to_string();
    agent
        .findings()
        .into_iter()
        .filter(|v| v["message"] != "finding cleared")
        .filter(|v| {
            v["pid"].as_u64().is_some_and(|p| pids.contains(&p))
                || v["region"].as_str().is_some_and(|r| r.contains(&region))
        })
        .map(crate::demo::describe)
        .collect()
}

pub(super) fn agent_signal(pid: u32, sig: libc::c_int) {
    // SAFETY: kill(2) on the agent we started.
    unsafe { libc::kill(pid as libc::pid_t, sig) };
}
