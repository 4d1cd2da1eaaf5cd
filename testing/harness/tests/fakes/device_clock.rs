//! The fake driver's device clock: kernels take simulated device time on the real clock,
//! events and synchronisation reflect it, several processes share one device (one kernel at a
//! time) and the fake NVML's utilisation comes from the same clock. Timing bounds are wide
//! below (the machine is shared): a lower bound on a wait is exact (nothing completes early);
//! a bound that the host's speed could break (an upper bound, a lower bound on a sum of
//! waits with host time between them, a query expected to find work still queued) allows
//! for what the probe measured of its own scheduling delay: the time its thread was
//! runnable but not running ([`slack`], from `/proc/thread-self/schedstat`), and only that.

use hami_test_harness::{NvmlSnapshot, OpLine, ProbeOutput, TestEnv};

// CUresult codes.
const SUCCESS: i32 = 0;
const INVALID_VALUE: i32 = 1;
const INVALID_HANDLE: i32 = 400;
const NOT_READY: i32 = 600;
// nvmlReturn_t.
const NVML_ERROR_NOT_FOUND: i32 = 6;

const MS: u64 = 1_000_000;

fn env() -> TestEnv {
    TestEnv::new().env("FAKE_CUDA_CTX_OVERHEAD", "0")
}

/// A sandbox whose processes may queue 10 s of work per device before a launch blocks (the
/// default is 2 ms), so that every launch below returns at once.
fn deep() -> TestEnv {
    env().env("FAKE_CUDA_QUEUE_AHEAD", "10s")
}

/// Runs `cudaprobe` with the whitespace-separated arguments `args`, between two `rq` ops
/// (see [`slack`]).
fn run(env: &TestEnv, args: &str) -> ProbeOutput {
    run_args(env, &args.split_ascii_whitespace().collect::<Vec<_>>())
}

/// Runs `cudaprobe` with `args`, between two `rq` ops (see [`slack`]).
fn run_args(env: &TestEnv, args: &[&str]) -> ProbeOutput {
    // (after the options, each `--name value`)
    let opts = args
        .chunks(2)
        .take_while(|c| c[0].starts_with("--"))
        .count()
        * 2;
    let mut all = args[..opts].to_vec();
    all.push("rq");
    all.extend_from_slice(&args[opts..]);
    all.push("rq");
    env.run_probe(&all)
}

/// How long the probe's thread waited on a runqueue (runnable, not running) between its
/// first and last `rq` op, in ns: the most that the machine's load can have delayed its
/// ops, added to every bound that host timing could break. On an idle machine about 0, so
/// the bounds keep their width there.
fn slack(out: &ProbeOutput) -> u64 {
    let rq = out.find("rq");
    assert!(rq.len() >= 2, "no rq ops: {}", out.dump());
    num(rq[rq.len() - 1], "rq_ns") - num(rq[0], "rq_ns")
}

/// `rc` is `want`, unless the probe was delayed for at least `work` ns (then the work it
/// queued may already have completed when it looked).
fn rc_unless_late(out: &ProbeOutput, rc: Option<i32>, want: i32, work: u64) -> bool {
    rc == Some(want) || slack(out) >= work
}

fn num(o: &OpLine, key: &str) -> u64 {
    o.num(key)
        .unwrap_or_else(|| panic!("no {key}= in {}", o.raw))
}

fn float(o: &OpLine, key: &str) -> f64 {
    o.get(key)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {key}= in {}", o.raw))
}

fn rcs_of(out: &ProbeOutput, op: &str) -> Vec<i32> {
    out.find(op).iter().map(|o| o.rc().unwrap_or(-1)).collect()
}

#[test]
fn kernels_take_their_time_and_synchronisation_waits_for_the_tail() {
    let env = deep();
    let out = run(&env, "init ctx kernel launch-ns 20ms 5 streamquery streamsync-t streamquery launch-ns 30ms 2 ctxsync-t streamquery");
    assert!(out.status.success(), "{}", out.dump());
    let launches = out.find("launch-ns");
    assert!(launches.iter().all(|o| o.ok()), "{}", out.dump());
    let late = slack(&out);
    // Launches are asynchronous: five 20 ms kernels are queued in far less than 100 ms.
    assert!(
        num(launches[0], "host_ns") < 60 * MS + late,
        "{}",
        out.dump()
    );
    let q = rcs_of(&out, "streamquery");
    assert!(
        rc_unless_late(&out, Some(q[0]), NOT_READY, 100 * MS) && q[1..] == [SUCCESS, SUCCESS],
        "{}",
        out.dump()
    );
    let host = num(launches[0], "host_ns");
    let wait = num(out.last("streamsync-t"), "wait_ns");
    assert!(
        wait + host + late >= 100 * MS && wait < 100 * MS + 400 * MS + late,
        "stream sync waited {wait} ns after {host} ns of launching: {}",
        out.dump()
    );
    let wait = num(out.last("ctxsync-t"), "wait_ns");
    assert!(
        wait + late >= 40 * MS && wait < 460 * MS + late,
        "context sync waited {wait} ns for 60 ms of kernels: {}",
        out.dump()
    );
}

#[test]
fn kernel_durations_come_from_the_environment_the_image_or_the_launch() {
    // Default: FAKE_CUDA_KERNEL_NS unset, kernels are instantaneous (nothing existing changes).
    let out = run(
        &env(),
        "init ctx modload 0 getfunc launch streamquery ctxsync-t",
    );
    assert!(out.all_ok(), "{}", out.dump());
    assert!(
        num(out.last("ctxsync-t"), "wait_ns") < 20 * MS + slack(&out),
        "{}",
        out.dump()
    );
    // FAKE_CUDA_KERNEL_NS applies to modules without an ns= key.
    let out = run(
        &env().env("FAKE_CUDA_KERNEL_NS", "50ms"),
        "init ctx modload 0 getfunc launch streamquery ctxsync-t",
    );
    assert!(
        rc_unless_late(&out, out.last("streamquery").rc(), NOT_READY, 50 * MS),
        "{}",
        out.dump()
    );
    assert!(
        num(out.last("ctxsync-t"), "wait_ns") + slack(&out) >= 40 * MS,
        "{}",
        out.dump()
    );
    // The image's ns= key (here "FAKECUBIN globals=0 ns=40ms") overrides it.
    let out = run_args(
        &deep().env("FAKE_CUDA_KERNEL_NS", "1s"),
        &[
            "init",
            "ctx",
            "modload",
            "0 ns=40ms",
            "getfunc",
            "launch",
            "launch",
            "ctxsync-t",
        ],
    );
    assert!(out.all_ok(), "{}", out.dump());
    let wait = num(out.last("ctxsync-t"), "wait_ns");
    let late = slack(&out);
    assert!(
        wait + late >= 60 * MS && wait < 500 * MS + late,
        "{}",
        out.dump()
    );
    // A malformed ns= is an invalid image.
    let out = env().run_probe(&["init", "ctx", "modload", "0 ns=soon"]);
    assert_eq!(out.last("modload").rc(), Some(200), "{}", out.dump());
}

#[test]
fn events_measure_the_kernels_between_them() {
    let env = deep();
    let out = run(&env, "init ctx kernel evcreate evcreate evcreate 2 evcreate launch-ns 5ms 2 evrecord 0 launch-ns 10ms 3 evrecord 1 evquery 1 elapsed 0 1 evsync 1 evquery 1 elapsed 0 1 elapsed 1 0 evrecord 2 elapsed 0 2 elapsed 0 3 evquery 3 evsync 3 evcreate 8 evcreate 4");
    let el = out.find("elapsed");
    let rcs = el.iter().map(|o| o.rc().unwrap()).collect::<Vec<_>>();
    assert!(
        rc_unless_late(&out, Some(rcs[0]), NOT_READY, 40 * MS)
            && rcs[1..] == [SUCCESS, SUCCESS, INVALID_HANDLE, INVALID_HANDLE],
        "{}",
        out.dump()
    );
    // The three 10 ms kernels exactly (the device time, not the host's).
    let ms = float(el[1], "ms");
    assert!((ms - 30.0).abs() < 0.01, "{}", out.dump());
    assert!((float(el[2], "ms") + 30.0).abs() < 0.01, "{}", out.dump());
    let q = rcs_of(&out, "evquery");
    assert!(
        rc_unless_late(&out, Some(q[0]), NOT_READY, 40 * MS) && q[1..] == [SUCCESS, SUCCESS],
        "{}",
        out.dump()
    );
    let syncs = out.find("evsync");
    assert!(syncs.iter().all(|o| o.ok()), "{}", out.dump());
    // The first sync waited for the 40 ms queued (less what launching took).
    let late = slack(&out);
    assert!(num(syncs[0], "wait_ns") + late >= 20 * MS, "{}", out.dump());
    assert!(num(syncs[1], "wait_ns") < 20 * MS + late, "{}", out.dump());
    assert_eq!(
        rcs_of(&out, "evcreate"),
        vec![
            SUCCESS,
            SUCCESS,
            SUCCESS,
            SUCCESS,
            INVALID_VALUE,
            INVALID_VALUE
        ],
        "{}",
        out.dump()
    );
}

#[test]
fn graphs_take_the_sum_of_their_captured_kernels() {
    let env = deep();
    let out = run(&env, "init ctx kernel streamnew graph-capture 10ms 3 streamquery evcreate evcreate evrecord 1 graph-launch 2 evrecord 2 streamquery streamsync-t elapsed 1 2 graphdestroy last graph-launch 1 0");
    assert_eq!(out.last("graph-capture").get("stage"), Some("instantiate"));
    assert!(out.last("graph-capture").ok(), "{}", out.dump());
    // Capturing ran nothing; launching twice queued 60 ms.
    let q = rcs_of(&out, "streamquery");
    assert!(
        q[0] == SUCCESS && rc_unless_late(&out, Some(q[1]), NOT_READY, 60 * MS),
        "{}",
        out.dump()
    );
    let late = slack(&out);
    assert!(
        num(out.last("streamsync-t"), "wait_ns") + late >= 40 * MS,
        "{}",
        out.dump()
    );
    // From the first event (recorded on an idle stream: at once) to the end of both graph
    // launches: 60 ms plus the host's time between the record and the first launch.
    let ms = float(out.last("elapsed"), "ms");
    assert!(
        ms >= 59.99 && ms < 65.0 + late as f64 / 1e6,
        "{}",
        out.dump()
    );
    assert!(out.last("graphdestroy").ok(), "{}", out.dump());
    // A destroyed executable graph: CUDA_ERROR_INVALID_VALUE, as documented for cuGraphLaunch.
    assert_eq!(
        out.last("graph-launch").rc(),
        Some(INVALID_VALUE),
        "{}",
        out.dump()
    );
}

#[test]
fn cooperative_launches_and_entry_points_through_get_proc_address() {
    let env = deep();
    let out = run(&env, "--via procaddr --cuda-version 12080 init ctx coop-ns 15ms 2 streamquery ctxsync-t launch-for 0.1 1ms");
    assert!(out.status.success(), "{}", out.dump());
    assert!(out.last("coop-ns").ok(), "{}", out.dump());
    assert!(out.last("launch-for").ok(), "{}", out.dump());
    assert!(
        num(out.last("ctxsync-t"), "wait_ns") + slack(&out) >= 20 * MS,
        "{}",
        out.dump()
    );
    assert!(
        rc_unless_late(&out, out.last("streamquery").rc(), NOT_READY, 30 * MS),
        "{}",
        out.dump()
    );
    let sym = |name: &str, ver: &str, flags: &str| {
        let o = env.run_probe(&["getproc", name, ver, flags]);
        o.last("getproc").get("sym").unwrap_or("").to_string()
    };
    assert_eq!(
        sym("cuEventElapsedTime", "12000", "0"),
        "cuEventElapsedTime"
    );
    assert_eq!(
        sym("cuEventElapsedTime", "12080", "0"),
        "cuEventElapsedTime_v2"
    );
    assert_eq!(sym("cuEventRecord", "12000", "2"), "cuEventRecord_ptsz");
    assert_eq!(sym("cuEventQuery", "12000", "0"), "cuEventQuery");
    assert_eq!(
        sym("cuStreamWaitEvent", "12000", "2"),
        "cuStreamWaitEvent_ptsz"
    );
    assert_eq!(
        sym("cuEventRecordWithFlags", "12000", "0"),
        "cuEventRecordWithFlags"
    );
    assert_eq!(sym("cuStreamQuery", "12000", "2"), "cuStreamQuery_ptsz");
    assert_eq!(
        sym("cuLaunchCooperativeKernel", "12000", "2"),
        "cuLaunchCooperativeKernel_ptsz"
    );
    assert_eq!(
        sym("cuGraphInstantiate", "11000", "0"),
        "cuGraphInstantiate_v2"
    );
    assert_eq!(
        sym("cuGraphInstantiate", "12000", "0"),
        "cuGraphInstantiateWithFlags"
    );
    assert_eq!(sym("cuGraphLaunch", "12000", "2"), "cuGraphLaunch_ptsz");
    assert_eq!(
        sym("cuGraphExecDestroy", "12000", "0"),
        "cuGraphExecDestroy"
    );
    assert_eq!(sym("cuGraphDestroy", "12000", "0"), "cuGraphDestroy");
}

#[test]
fn a_full_launch_queue_blocks_the_launch_until_room_is_made() {
    // By default a process's queued work reaches at most 2 ms ahead: each launch of 20 ms
    // kernels after the first waits until the work ahead ends within 2 ms (18, 38, 58, 78 ms),
    // whatever stream it is on.
    let out = run(
        &env(),
        "init ctx kernel streamnew launch-ns 20ms 2 streamnew launch-ns 20ms 3 streamsync-t",
    );
    assert!(out.all_ok(), "{}", out.dump());
    let launches = out.find("launch-ns");
    let host = num(launches[0], "host_ns") + num(launches[1], "host_ns");
    assert!(host >= 70 * MS, "{}", out.dump());
    let wait = num(out.last("streamsync-t"), "wait_ns");
    // The device's 100 ms end after the first launch whenever the host woke up (the time
    // between the ops is not counted: a little under 100 ms).
    assert!(host + wait + slack(&out) >= 95 * MS, "{}", out.dump());
    // FAKE_CUDA_QUEUE_DEPTH bounds the number of kernels queued: the 3rd, 4th and 5th wait
    // for the oldest (the 5th for the 3rd, which ends at 60 ms).
    let out = run(
        &deep().env("FAKE_CUDA_QUEUE_DEPTH", "2"),
        "init ctx kernel launch-ns 20ms 5 streamsync-t",
    );
    assert!(out.all_ok(), "{}", out.dump());
    let host = num(out.last("launch-ns"), "host_ns");
    assert!(host >= 55 * MS, "{}", out.dump());
    // Neither bound reached: all five launches return at once.
    let out = run(&deep(), "init ctx kernel launch-ns 20ms 5 streamsync-t");
    assert!(out.all_ok(), "{}", out.dump());
    let host = num(out.last("launch-ns"), "host_ns");
    let wait = num(out.last("streamsync-t"), "wait_ns");
    let late = slack(&out);
    assert!(
        host < 20 * MS + late && host + wait + late >= 95 * MS,
        "{}",
        out.dump()
    );
}

fn busy_share(o: &OpLine) -> f64 {
    num(o, "busy_ns") as f64 / num(o, "wall_ns") as f64
}

#[test]
fn one_process_alone_keeps_the_device_busy() {
    // A queue horizon well above the host's stalls on a loaded machine (the default 2 ms is
    // about a time slice; a host descheduled longer than that lets the device idle).
    let env = env().env("FAKE_CUDA_QUEUE_AHEAD", "50ms");
    let out = run(&env, "init ctx launch-for 1 1ms");
    assert!(out.all_ok(), "{}", out.dump());
    let o = out.last("launch-for");
    // (the device idles only while the host, stalled past the horizon, does not launch)
    let late = slack(&out);
    let share = (num(o, "nominal_ns") + late) as f64 / num(o, "wall_ns") as f64;
    assert!(share > 0.9, "alone: busy share {share}: {}", out.dump());
    // The events measured the kernels' time (plus, when the host was late to launch the
    // next kernel, the idle gap after the event before it, as on a real GPU).
    let (busy, nominal) = (num(o, "busy_ns"), num(o, "nominal_ns"));
    assert!(
        busy + MS >= nominal && busy < nominal + nominal / 20 + late,
        "{}",
        out.dump()
    );
    assert!(num(o, "kernels") > 500, "{}", out.dump());
}

fn nvml_with(env: &TestEnv, last_seen_us: Option<u64>) -> NvmlSnapshot {
    let mut c = env.nvmlprobe_cmd();
    c.args(["--index", "0"]);
    if let Some(t) = last_seen_us {
        c.args(["--last-seen", &t.to_string()]);
    }
    let out = c.output().expect("spawn nvmlprobe");
    NvmlSnapshot::parse(&String::from_utf8_lossy(&out.stdout))
}

#[test]
fn two_processes_share_the_device_and_nvml_reports_each_share() {
    // (a horizon above the host's stalls under load, as above; both keep their queue full)
    let env = env().env("FAKE_CUDA_QUEUE_AHEAD", "20ms");
    // Before any kernel ran: no sample (as the real NVML before its first sample).
    let before = env.nvml();
    assert_eq!(
        before.device(0).process_util_rc,
        Some(NVML_ERROR_NOT_FOUND),
        "{}",
        before.raw
    );
    let args = [
        "init",
        "ctx",
        "kernel",
        "wait",
        "launch-for",
        "3",
        "1ms",
        "wait",
    ];
    let mut a = env.spawn_probe(&args);
    let mut b = env.spawn_probe(&args);
    a.wait_for("wait");
    b.wait_for("wait");
    a.resume();
    b.resume();
    std::thread::sleep(std::time::Duration::from_millis(1800));
    let mid = env.nvml();
    // Only a second's window, and in the future: no sample.
    let future_us = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64
        + 60_000_000;
    let none = nvml_with(&env, Some(future_us));
    let ra = a.wait_for("launch-for");
    let rb = b.wait_for("launch-for");
    // Both are still alive (blocked in their second `wait`) while NVML was read.
    a.resume();
    b.resume();
    let (pa, pb) = (a.pid, b.pid);
    let (oa, ob) = (a.finish(), b.finish());
    assert!(ra.ok() && rb.ok(), "{}\n{}", oa.dump(), ob.dump());
    let (sa, sb) = (busy_share(&ra), busy_share(&rb));
    assert!(
        (0.3..0.7).contains(&sa) && (0.3..0.7).contains(&sb) && (0.8..1.05).contains(&(sa + sb)),
        "shares {sa} + {sb}:\n{}\n{}",
        ra.raw,
        rb.raw
    );
    // Each one's events measured its own kernels, not the other's in between (a pre-kernel
    // event completes when the device reaches it).
    for r in [&ra, &rb] {
        let (busy, nominal) = (num(r, "busy_ns"), num(r, "nominal_ns"));
        assert!(busy.abs_diff(nominal) < nominal / 20, "{}", r.raw);
    }
    // The state file's ground truth over both runs agrees: each pid was busy for its
    // kernels, the device for both.
    let (from, to) = (
        num(&ra, "start_ns").min(num(&rb, "start_ns")),
        num(&ra, "end_ns").max(num(&rb, "end_ns")),
    );
    let truth = env.device_busy(0, from, to + 1);
    let of = |pid: u32| truth.per_pid.iter().find(|x| x.0 == pid).map_or(0, |x| x.1);
    assert_eq!(of(pa), num(&ra, "nominal_ns"), "{truth:?}");
    assert_eq!(of(pb), num(&rb, "nominal_ns"), "{truth:?}");
    assert_eq!(truth.device, of(pa) + of(pb), "{truth:?}");
    let d = mid.device(0);
    assert_eq!(d.process_util_rc, Some(SUCCESS), "{}", mid.raw);
    let (ua, ub) = (
        mid.process_sm(0, pa).unwrap_or(0),
        mid.process_sm(0, pb).unwrap_or(0),
    );
    assert!(
        (30..=70).contains(&ua) && (30..=70).contains(&ub) && (85..=101).contains(&(ua + ub)),
        "NVML smUtil {ua} + {ub}:\n{}",
        mid.raw
    );
    // The newer call reports the same samples.
    assert_eq!(d.processes_util_rc, Some(SUCCESS), "{}", mid.raw);
    let mut a1: Vec<(u32, u32)> = d.process_util.iter().map(|x| (x.0, x.1)).collect();
    let mut a2: Vec<(u32, u32)> = d.processes_util.iter().map(|x| (x.0, x.1)).collect();
    a1.sort_unstable();
    a2.sort_unstable();
    assert_eq!(a1.len(), 2, "{}", mid.raw);
    for (x, y) in a1.iter().zip(&a2) {
        assert!(x.0 == y.0 && x.1.abs_diff(y.1) <= 2, "{}", mid.raw);
    }
    let (_, gpu) = d.gpu_util.expect("utilization line");
    assert!(gpu >= 85, "{}", mid.raw);
    assert_eq!(
        none.device(0).process_util_rc,
        Some(NVML_ERROR_NOT_FOUND),
        "{}",
        none.raw
    );
    assert_eq!(
        none.device(0).processes_util_rc,
        Some(NVML_ERROR_NOT_FOUND),
        "{}",
        none.raw
    );
}

#[test]
fn nvml_utilisation_since_a_timestamp_is_the_share_of_that_window() {
    let env = env();
    let mut p = env.spawn_probe(&[
        "init",
        "ctx",
        "kernel",
        "wait",
        "launch-ns",
        "200ms",
        "1",
        "wait",
    ]);
    p.wait_for("wait");
    let realtime_us = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_micros() as u64
    };
    let t0 = realtime_us();
    p.resume();
    p.wait_for("launch-ns");
    std::thread::sleep(std::time::Duration::from_millis(400));
    // Over the last second: 200 ms of a 1 s window.
    let s = env.nvml();
    let sm = s.process_sm(0, p.pid).expect("a sample");
    assert!((15..=25).contains(&sm), "smUtil {sm}:\n{}", s.raw);
    // Since just before the launch: 200 ms of a window of 400 ms and a little more.
    let since = nvml_with(&env, Some(t0));
    let sm = since.process_sm(0, p.pid).expect("a sample");
    let window_ms = (realtime_us() - t0) / 1000;
    let expect = (200 * 100 / window_ms) as u32;
    assert!(
        // (the window measured here ends after NVML's: `expect` is a little low)
        sm + 2 >= expect && sm <= 52,
        "smUtil {sm} over ~{window_ms} ms:\n{}",
        since.raw
    );
    // Since a timestamp after the kernel ended: nothing.
    let ts = s.device(0).process_util[0].2;
    let later = nvml_with(&env, Some(ts));
    assert_eq!(
        later.device(0).process_util_rc,
        Some(NVML_ERROR_NOT_FOUND),
        "{}",
        later.raw
    );
    p.resume();
    assert!(p.finish().all_ok());
}
