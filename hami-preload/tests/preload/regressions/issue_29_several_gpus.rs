//! Regressions of issue 29: containers with several GPUs, `CUDA_VISIBLE_DEVICES` per process.
//!
//! The region and `CUDA_DEVICE_MEMORY_LIMIT_<i>` number the container's devices (the driver's
//! without `CUDA_VISIBLE_DEVICES`); each process's ordinals are mapped to them. Before, each
//! process used its own ordinal: a narrowed process got another device's limit and charged
//! another device's usage, and overwrote the region's UUID list.

use super::*;

/// Guards issue 29 (b6257a8), first case: `CUDA_VISIBLE_DEVICES=1` sees the container's device
/// 1 as its ordinal 0 and must get device 1's limit (1 GiB), not device 0's (256 MiB); its
/// usage is the container's device 1's.
#[test]
fn a_process_narrowed_to_the_second_gpu_gets_that_gpus_limit() {
    let e = two_gpus("256M", "1G");
    let out = probe_seeing(
        &e,
        Some("1"),
        &["init", "count", "ctx", "meminfo", "alloc", "512M", "wait"],
    );
    assert_eq!(out.last("count").num("count"), Some(1), "{}", out.dump());
    assert_eq!(totals(&out), vec![GB], "{}", out.dump());
    assert_eq!(out.last("alloc").rc(), Some(0), "{}", out.dump());
    let mut p = spawn_seeing(&e, Some("1"), &["init", "ctx", "alloc", "512M", "wait"]);
    let r = e.region();
    assert_eq!(r.used(1), 512 * MB, "charged to the container's device 1");
    assert_eq!(r.used(0), 0);
    assert_eq!(
        r.uuid(1),
        parse(UUID_1),
        "the region records device 1's UUID at 1"
    );
    assert_eq!(
        r.uuid(0),
        [0; 16],
        "and nothing at 0 (this process never saw it)"
    );
    p.resume();
    assert!(p.finish().all_ok());
}

/// Guards issue 29 (b6257a8), second case: `CUDA_VISIBLE_DEVICES=1,0` swaps the ordinals, not
/// the limits.
#[test]
fn a_reordered_device_list_keeps_each_gpus_own_limit() {
    let e = two_gpus("256M", "1G");
    let out = probe_seeing(
        &e,
        Some("1,0"),
        &[
            "init", "ctx", "meminfo", "alloc", "512M", "device", "1", "ctx", "meminfo", "alloc",
            "512M",
        ],
    );
    assert_eq!(totals(&out), vec![GB, 256 * MB], "{}", out.dump());
    let allocs = out.find("alloc");
    assert_eq!(
        allocs[0].rc(),
        Some(0),
        "ordinal 0 = device 1: {}",
        out.dump()
    );
    assert_eq!(
        allocs[1].rc(),
        Some(OOM as i32),
        "ordinal 1 = device 0 (256 MiB): {}",
        out.dump()
    );
}

/// Guards issue 29 (b6257a8), third case: process A (`CUDA_VISIBLE_DEVICES=1`) holds 768 MiB on
/// the container's device 1; process B, which sees both, gets 900 MiB on the empty device 0 and
/// is refused 300 MiB more on device 1. Also the UUIDs the region keeps, and the NVML views of
/// a narrowed `nvidia-smi`-like reader (NVML lists every device).
#[test]
fn a_narrowed_process_is_charged_to_its_own_gpu_for_every_process_of_the_container() {
    let e = two_gpus("1G", "1G");
    // B registers first and records both UUIDs; A comes after (before the fix it overwrote
    // device 0's UUID with its own device's).
    let mut b = spawn_seeing(
        &e,
        None,
        &["init", "ctx", "alloc", "1M", "free", "last", "wait"],
    );
    let mut a = spawn_seeing(&e, Some("1"), &["init", "ctx", "alloc", "768M", "wait"]);
    let out = probe_seeing(
        &e,
        None,
        &[
            "init", "ctx", "alloc", "900M", "device", "1", "ctx", "meminfo", "alloc", "300M",
        ],
    );
    let allocs = out.find("alloc");
    assert_eq!(allocs[0].rc(), Some(0), "device 0 is empty: {}", out.dump());
    assert_eq!(
        out.last("meminfo").num("free"),
        Some(256 * MB),
        "device 1 has A's 768 MiB: {}",
        out.dump()
    );
    assert_eq!(allocs[1].rc(), Some(OOM as i32), "{}", out.dump());
    let r = e.region();
    assert_eq!((r.used(0), r.used(1)), (0, 768 * MB));
    assert_eq!((r.uuid(0), r.uuid(1)), (parse(UUID_0), parse(UUID_1)));
    // NVML lists both devices whatever CUDA_VISIBLE_DEVICES says; each shows its own quota
    // and usage, also to a narrowed process.
    let mut c = e.nvmlprobe_cmd();
    c.env("CUDA_VISIBLE_DEVICES", "1");
    let s = NvmlSnapshot::parse(&String::from_utf8_lossy(&c.output().unwrap().stdout));
    assert_eq!(s.devices.len(), 2, "{}", s.raw);
    assert_eq!((s.device(0).total, s.device(0).used), (GB, 0), "{}", s.raw);
    assert_eq!(
        (s.device(1).total, s.device(1).used),
        (GB, 768 * MB),
        "{}",
        s.raw
    );
    a.resume();
    b.resume();
    assert!(a.finish().all_ok());
    assert!(b.finish().all_ok());
}

/// Guards issue 29 (b6257a8): a process that sees one device beside one that sees all, in one
/// region, with a different limit per device: each device keeps its limit for both, and each
/// sees the other's usage of the device they share.
#[test]
fn one_gpu_and_all_gpus_processes_share_each_gpus_own_limit() {
    let e = two_gpus("256M", "1G");
    let mut a = spawn_seeing(
        &e,
        Some("1"),
        &["init", "ctx", "meminfo", "alloc", "600M", "wait"],
    );
    let out = probe_seeing(
        &e,
        None,
        &[
            "init", "ctx", "meminfo", "alloc", "200M", "device", "1", "ctx", "meminfo", "alloc",
            "500M",
        ],
    );
    assert_eq!(totals(&out), vec![256 * MB, GB], "{}", out.dump());
    assert_eq!(
        out.find("meminfo")[1].num("free"),
        Some(GB - 600 * MB),
        "device 1 has A's 600 MiB: {}",
        out.dump()
    );
    let allocs = out.find("alloc");
    assert_eq!(allocs[0].rc(), Some(0), "{}", out.dump());
    assert_eq!(
        allocs[1].rc(),
        Some(OOM as i32),
        "600 + 500 MiB > 1 GiB: {}",
        out.dump()
    );
    a.resume();
    let a = a.finish();
    assert!(a.all_ok(), "{}", a.dump());
    assert_eq!(totals(&a), vec![GB], "{}", a.dump());
}

/// Guards issue 29 (b6257a8): the UUID form of `CUDA_VISIBLE_DEVICES`. Before any process
/// recorded the container's devices the UUID names a device the region does not know: fail
/// closed (with the log line), never device 0's quota; once a process that sees every device
/// ran, the UUID is the container's device 1 with its own limit.
#[test]
fn a_gpu_named_by_uuid_gets_its_own_limit_once_the_region_knows_it() {
    let e = two_gpus("256M", "1G");
    let out = probe_seeing(
        &e,
        Some(UUID_1),
        &["init", "count", "ctx", "meminfo", "alloc", "100M"],
    );
    assert_eq!(out.last("count").num("count"), Some(1), "{}", out.dump());
    assert_eq!(out.last("meminfo").num("free"), Some(0), "{}", out.dump());
    assert_eq!(out.last("alloc").rc(), Some(OOM as i32), "{}", out.dump());
    assert!(
        out.stderr
            .contains("is not a device of the container the shared region knows"),
        "{}",
        out.dump()
    );
    let all = probe_seeing(&e, None, &["init", "ctx", "alloc", "1M"]);
    assert!(all.all_ok(), "{}", all.dump());
    let out = probe_seeing(
        &e,
        Some(UUID_1),
        &["init", "ctx", "meminfo", "alloc", "512M"],
    );
    assert_eq!(totals(&out), vec![GB], "{}", out.dump());
    assert_eq!(out.last("alloc").rc(), Some(0), "{}", out.dump());
}

/// Guards issue 29 (3e2fb47): multi-GPU work under a share: two processes of one container, one
/// on the container's device 0 (sees all), one narrowed to device 1 (`CUDA_VISIBLE_DEVICES=1`),
/// `CUDA_DEVICE_SM_LIMIT=50`. The gate is per device: each gets half of its own device (before,
/// the narrowed one drew on device 0's budget and both got a quarter), each device's record
/// meters its own work, and neither run stalls (each ends its synchronisation in time).
#[test]
fn two_processes_on_two_gpus_each_get_their_own_gpus_share() {
    let e = two_gpus("1G", "1G").env("CUDA_DEVICE_SM_LIMIT", "50");
    let args = ["init", "ctx", "kernel", "launch-for", "3", "1ms"];
    let spawn = |cvd: Option<&str>| {
        let mut c = e.cudaprobe_cmd(&args);
        match cvd {
            Some(v) => c.env("CUDA_VISIBLE_DEVICES", v),
            None => c.env_remove("CUDA_VISIBLE_DEVICES"),
        };
        c.stdin(std::process::Stdio::piped());
        RunningProbe::start(c)
    };
    let (a, b) = (spawn(None), spawn(Some("1")));
    let (a, b) = (a.finish(), b.finish());
    assert!(a.all_ok() && b.all_ok(), "{}\n{}", a.dump(), b.dump());
    let num = |o: &ProbeOutput, k: &str| -> u64 {
        o.last("launch-for")
            .get(k)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or_else(|| panic!("no {k}= in {}", o.dump())) as u64
    };
    for (o, dev) in [(&a, 0usize), (&b, 1)] {
        let (from, to) = (num(o, "start_ns"), num(o, "end_ns"));
        let w = e.device_busy(dev, from, to);
        let pid = o.pid.unwrap();
        let busy = w.per_pid.iter().find(|p| p.0 == pid).map_or(0, |p| p.1);
        let share = busy as f64 / (to - from) as f64;
        assert!(
            (0.40..0.62).contains(&share),
            "physical device {dev}: busy {share:.3} of the run (50 % wanted): {}",
            o.dump()
        );
        assert!(num(o, "wall_ns") < 4_500_000_000, "no stall: {}", o.dump());
    }
    use std::sync::atomic::Ordering::Relaxed;
    let r = e.region();
    let consumed = |d: usize| r.compute_cells(d).unwrap().consumed_ns.load(Relaxed);
    let kernels = |o: &ProbeOutput| num(o, "kernels") * 1_000_000;
    // Metering is conservative (an event pair spans the gap before its kernel too), and under
    // emulation (the aarch64 pass runs this under qemu) those gaps grow: 1.53 s were metered
    // for 1.34 s of kernels there. What this checks is that no device is charged the other's
    // work, which would show as about twice its own: half of that is the bound.
    for (d, o) in [(0, &a), (1, &b)] {
        let (got, ran) = (consumed(d), kernels(o));
        assert!(
            got as f64 > ran as f64 * 0.9 && (got as f64) < ran as f64 * 1.5,
            "device {d}'s record metered {got} ns for {ran} ns of its own kernels"
        );
    }
}
