//! Helpers of `regressions.rs`, beside it.

use super::*;
use std::path::Path;
use std::process::Child;
use std::time::{Duration, Instant};

/// Starts `n` preloaded probes at the same moment (each retains its primary context at
/// start, which the fake makes take `FAKE_CUDA_CTX_CREATE_DELAY_MS`), runs `ops` in each and
/// returns their outputs.
pub(super) fn concurrent_probes(env: &Env, n: usize, ops: &[&str]) -> Vec<Probe> {
    outputs(spawn_probes(env, n, |_| owned(ops), &[]))
}

/// As [`concurrent_probes`], each probe then holding (`touch`, `waitfile`) until all `n` have
/// run `ops`, then running `then`: each probe's lines are `ops`'s, `touch`'s, `waitfile`'s and
/// `then`'s. What each measured in `ops` was measured with the others alive, and what they
/// hold after `ops` they hold at once, however late one of them started (a fixed sleep instead
/// let a probe started late under qemu find the others gone).
pub(super) fn concurrent_probes_held(
    env: &Env,
    n: usize,
    ops: &[&str],
    then: &[&str],
) -> Vec<Probe> {
    let go = env.dir().join("held-go");
    let held = |i: usize| env.dir().join(format!("held-{i}"));
    let mut kids = spawn_probes(
        env,
        n,
        |i| {
            let mut a = owned(ops);
            a.extend(["touch".into(), path_arg(&held(i))]);
            a.extend(["waitfile".into(), path_arg(&go)]);
            a.extend(owned(then));
            a
        },
        &[],
    );
    let all = wait_for_probes(&mut kids, || (0..n).all(|i| held(i).exists()));
    std::fs::write(&go, b"").unwrap();
    let outs = outputs(kids);
    assert!(all, "the probes did not all run {ops:?}: {}", dumps(&outs));
    outs
}

/// As [`concurrent_probes`], their context creations (at start) held inside the fake driver
/// at its gate (`FAKE_CUDA_CTX_CREATE_GATE`) until all `n` are in there at once (or one of
/// them ended, or 60 s passed), then let go. Returns their outputs and how many of the
/// processes were inside the driver's context creation when the gate opened: `n` shows that
/// the creations overlapped, fewer that something outside the driver (a lock) kept them apart.
pub(super) fn concurrent_probes_gated(env: &Env, n: usize, ops: &[&str]) -> (Vec<Probe>, usize) {
    let gate = env.dir().join("ctx-gate");
    let inside = env.dir().join("ctx-gate.inside");
    // One line per creation inside, its pid: the processes in there.
    let count = || {
        std::fs::read_to_string(&inside)
            .map(|s| s.lines().collect::<std::collections::HashSet<_>>().len())
            .unwrap_or(0)
    };
    let mut kids = spawn_probes(
        env,
        n,
        |_| owned(ops),
        &[("FAKE_CUDA_CTX_CREATE_GATE", &gate)],
    );
    wait_for_probes(&mut kids, || count() >= n);
    let at_once = count();
    std::fs::write(env.dir().join("ctx-gate.go"), b"").unwrap();
    (outputs(kids), at_once)
}

/// Starts `n` preloaded probes at the same moment, the `i`-th running `ops(i)` with `vars` set
/// besides the sandbox's (and `LIBCUDA_LOG_LEVEL=3`).
fn spawn_probes(
    env: &Env,
    n: usize,
    ops: impl Fn(usize) -> Vec<String>,
    vars: &[(&str, &Path)],
) -> Vec<Child> {
    (0..n)
        .map(|i| {
            let mut c = env.command(hprobe(), true);
            c.args(ops(i))
                .env("LIBCUDA_LOG_LEVEL", "3")
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped());
            for (k, v) in vars {
                c.env(k, v);
            }
            c.spawn().expect("spawn hprobe")
        })
        .collect()
}

/// Waits until `done()`, or until one of `kids` ended (it will not make `done()` true any
/// more), or 60 s passed; whether `done()`.
fn wait_for_probes(kids: &mut [Child], done: impl Fn() -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if done() {
            return true;
        }
        let ended = kids
            .iter_mut()
            .any(|k| k.try_wait().expect("try_wait").is_some());
        if ended || Instant::now() >= deadline {
            return done();
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Waits for each probe and reads its output.
fn outputs(kids: Vec<Child>) -> Vec<Probe> {
    kids.into_iter()
        .map(|c| Probe::from(c.wait_with_output().expect("wait hprobe")))
        .collect()
}

/// The outputs of `probes`, for an assertion's message.
pub(super) fn dumps(probes: &[Probe]) -> String {
    probes
        .iter()
        .map(Probe::dump)
        .collect::<Vec<_>>()
        .join("\n")
}

fn owned(ops: &[&str]) -> Vec<String> {
    ops.iter().map(|s| s.to_string()).collect()
}

fn path_arg(p: &Path) -> String {
    p.to_str().expect("a UTF-8 sandbox path").to_string()
}

/// Context memory charged to each slot of the region on device 0.
pub(super) fn context_charges(env: &Env) -> Vec<u64> {
    env.region()
        .snapshot()
        .slots
        .iter()
        .map(|s| s.usage[0][hami_abi::layout::UsageKind::Context.index()])
        .collect()
}

/// Runs `cmd` for at most `limit`; kills it (and fails the test) if it takes longer.
pub(super) fn output_within(mut cmd: Command, limit: std::time::Duration) -> std::process::Output {
    let mut child = cmd
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn");
    let start = std::time::Instant::now();
    while child.try_wait().expect("try_wait").is_none() {
        if start.elapsed() > limit {
            let _ = child.kill();
            let out = child.wait_with_output().expect("wait");
            panic!(
                "hung for {limit:?} (killed)\nstdout:\n{}\nstderr:\n{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    child.wait_with_output().expect("wait")
}

/// Builds `minifake.c` (as `libcuda.so.1` with that soname, or as a `libcuda.so` without
/// one) and `minimain.c`, runs it with the preload and checks every step.
pub(super) fn other_driver(soname: bool) {
    let env = Env::new();
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/programs");
    let lib = env.dir().join("lib");
    std::fs::create_dir_all(&lib).unwrap();
    let (file, soname_arg, link) = if soname {
        (
            "libcuda.so.1",
            "-Wl,-soname,libcuda.so.1",
            "-l:libcuda.so.1",
        )
    } else {
        ("libcuda.so", "-Wl,--no-undefined", "-lcuda")
    };
    cc(
        &src.join("minifake.c"),
        &lib.join(file),
        &["-shared", "-fPIC", soname_arg, "-ldl"],
    );
    let main = env.dir().join("minimain");
    let libdir = format!("-L{}", lib.display());
    cc(&src.join("minimain.c"), &main, &[&libdir, link]);
    let mut cmd = Command::new(&main);
    cmd.env("LD_LIBRARY_PATH", &lib)
        .env("LD_PRELOAD", &Artifacts::get().preload_so)
        .env("CUDA_DEVICE_MEMORY_LIMIT", "512M")
        .env("HAMI_CONTEXT_OVERHEAD", "32M")
        .env("CUDA_DEVICE_MEMORY_SHARED_CACHE", env.region_path());
    let p = Probe::from(output_within(cmd, std::time::Duration::from_secs(20)));
    assert!(p.ok(), "{}", p.dump());
    let ops: Vec<&str> = p.lines.iter().map(|(op, _)| op.as_str()).collect();
    assert_eq!(ops.len(), 20, "{}", p.dump());
    // Before cuInit: the driver's own code, not ours.
    assert_eq!(p.rc(0), 3, "{}", p.dump());
    let free_at = |n: usize| p.field(n, "free").parse::<u64>().unwrap();
    assert_eq!(p.field(3, "total"), (512 * MB).to_string(), "{}", p.dump());
    assert_eq!(free_at(3), 480 * MB, "primary context charged once");
    assert_eq!(p.rc(4), 0, "pitch 200 MiB in 480 MiB: {}", p.dump());
    assert_eq!(free_at(5), 280 * MB, "pitch charged once: {}", p.dump());
    // cuGetProcAddress_v2 via dlsym(RTLD_DEFAULT) returned our hook: still enforced, once.
    assert_eq!(p.rc(6), 0);
    assert_eq!(p.rc(7), 0, "usage + request == limit passes: {}", p.dump());
    assert_eq!(p.rc(8), OOM, "one byte more fails: {}", p.dump());
    // Unknown and double frees: the driver's own code (400), nothing uncharged.
    assert_eq!((p.rc(9), p.rc(10), p.rc(11)), (400, 0, 400), "{}", p.dump());
    assert_eq!(free_at(12), 200 * MB, "{}", p.dump());
    assert_eq!(p.rc(13), 0);
    assert_eq!(free_at(14), 480 * MB);
    // The legacy cuCtxCreate / cuCtxDestroy (identical semantics) are hooked too.
    assert_eq!(p.rc(15), 0);
    assert_eq!(
        free_at(16),
        448 * MB,
        "cuCtxCreate (v1) charged: {}",
        p.dump()
    );
    assert_eq!(p.rc(17), 0);
    assert_eq!(free_at(18), 480 * MB, "cuCtxDestroy (v1) uncharged");
    assert_eq!(
        p.rc(19),
        0,
        "primary release (nested cuCtxDestroy_v2) did not hang"
    );
    assert_eq!(env.region().used(0), 0, "{}", p.dump());
}

/// An environment whose library path holds only the fake driver, no libnvidia-ml.so.1 (the
/// sandbox's variables override the harness's LD_LIBRARY_PATH).
pub(super) fn without_nvml(env: Env) -> Env {
    let libdir = env.dir().join("no-nvml");
    std::fs::create_dir_all(&libdir).unwrap();
    std::os::unix::fs::symlink(&Artifacts::get().fake_libcuda, libdir.join("libcuda.so.1"))
        .unwrap();
    let path = libdir.to_str().unwrap().to_string();
    env.set("LD_LIBRARY_PATH", &path)
}

pub(super) const DRIVER_FIRST: &str =
    "context charged 314572800 bytes (measured from cuMemGetInfo (no NVML): device used after";

pub(super) const DRIVER_DELTA: &str =
    "context charged 314572800 bytes (measured from cuMemGetInfo (no NVML): free before";

/// Runs `ctxrace MODE OBJ HOW` then `info` for every object and teardown, each in a fresh
/// sandbox (1 GiB quota, contexts charged nothing), all at the same time. The fake driver's
/// `gate` knob (`FAKE_CUDA_RELEASE_GATE` / `FAKE_CUDA_ALLOC_GATE`) holds the racing thread's
/// call inside the driver until the probe, having seen it there, has torn the context down: a
/// rendezvous, not a sleep, so the order holds however late the thread is (qemu). Returns
/// what is wrong: the teardown or `info` failed, the call was never seen inside the driver
/// (or the gate was never opened), the thread's call succeeded when it must fail or failed
/// when it must succeed (`op_ok`), or something is still charged.
pub(super) fn context_races(mode: &str, gate: &str, op_ok: bool) -> Vec<String> {
    let cases: Vec<(&str, &str)> = ["ptr", "array"]
        .into_iter()
        .flat_map(|o| ["destroy", "release", "reset"].map(|h| (o, h)))
        .collect();
    let outs: Vec<Probe> = std::thread::scope(|s| {
        let hs: Vec<_> = cases
            .iter()
            .map(|&(obj, how)| {
                s.spawn(move || {
                    let env = Env::new()
                        .set("CUDA_DEVICE_MEMORY_LIMIT", "1G")
                        .set("HAMI_CONTEXT_OVERHEAD", "0");
                    let path = env.dir().join("race-gate");
                    let env = env.set(gate, path.to_str().unwrap());
                    env.probe(&["ctxrace", mode, obj, how, "info"])
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut bad = Vec::new();
    for ((obj, how), p) in cases.iter().zip(&outs) {
        if p.rcs() != vec![0, 0]
            || p.field(0, "inside") != "1"
            || p.stderr().contains(gate)
            || (p.field(0, "op") == "0") != op_ok
        {
            bad.push(format!("{obj} {how}: unexpected results: {}", p.dump()));
        } else if p.field(1, "free") != GB.to_string() {
            bad.push(format!(
                "{obj} {how}: the object went with its context but {} bytes stay charged",
                GB - p.field(1, "free").parse::<u64>().unwrap_or(0)
            ));
        }
    }
    bad
}

/// A sandbox with a 1 GiB quota, no context overhead, no backstop (so that only the graph
/// hooks can keep the driver within the quota) and no admission reserve.
/// `CUDA_ERROR_OUT_OF_MEMORY` as `cudaprobe` prints it.
pub(super) const GOOM: i32 = 2;

pub(super) fn graph_env() -> TestEnv {
    TestEnv::new()
        .env("FAKE_CUDA_TOTAL_MEM", "16G")
        .env("FAKE_CUDA_CTX_OVERHEAD", "0")
        .env("HAMI_BACKSTOP_INTERVAL_MS", "0")
        .env("HAMI_ADMISSION_RESERVE", "0")
        .env("CUDA_DEVICE_MEMORY_LIMIT", "1G")
        .preload(true)
}

/// Runs `ops` then `wait`; the driver's per-process figure (fake NVML) must be within 1 GiB.
pub(super) fn run_graph_ops(env: &TestEnv, ops: &[&str]) -> ProbeOutput {
    let mut args = ops.to_vec();
    args.push("wait");
    let mut p = env.spawn_probe(&args);
    p.wait_for("wait");
    let used = env.nvml().process_used(0, p.pid);
    let region_pool: u64 = env
        .region()
        .snapshot()
        .slots
        .iter()
        .map(|s| s.usage[0][hami_abi::layout::UsageKind::Pool.index()])
        .sum();
    p.resume();
    let out = p.finish();
    assert!(
        used <= 1024 * MB,
        "the driver holds {} MiB for the process, over the 1024 MiB quota: {}",
        used / MB,
        out.dump()
    );
    println!("region pool charge at wait: {} MiB", region_pool / MB);
    out
}

pub(super) const UUID_0: &str = "GPU-facec0da-0000-4000-8000-000000000000";

pub(super) const UUID_1: &str = "GPU-facec0da-0000-4000-8000-000000000001";

/// Two fake devices of 4 GiB, no context memory (so every figure is the allocations'),
/// no admission reserves, the preload on.
pub(super) fn two_gpus(limit_0: &str, limit_1: &str) -> TestEnv {
    TestEnv::new()
        .env("FAKE_CUDA_DEVICE_COUNT", "2")
        .env("FAKE_CUDA_TOTAL_MEM", "4G")
        .env("FAKE_CUDA_CTX_OVERHEAD", "0")
        .env("HAMI_CONTEXT_OVERHEAD", "0")
        .env("HAMI_ADMISSION_RESERVE", "0")
        .env("CUDA_DEVICE_MEMORY_LIMIT_0", limit_0)
        .env("CUDA_DEVICE_MEMORY_LIMIT_1", limit_1)
        .preload(true)
}

/// `cudaprobe ARGS` with `CUDA_VISIBLE_DEVICES=cvd` (`None`: unset), run to completion.
pub(super) fn probe_seeing(e: &TestEnv, cvd: Option<&str>, args: &[&str]) -> ProbeOutput {
    let mut c = e.cudaprobe_cmd(args);
    match cvd {
        Some(v) => c.env("CUDA_VISIBLE_DEVICES", v),
        None => c.env_remove("CUDA_VISIBLE_DEVICES"),
    };
    ProbeOutput::from_output(c.output().expect("run cudaprobe"))
}

/// The same, left running at its `wait` op.
pub(super) fn spawn_seeing(e: &TestEnv, cvd: Option<&str>, args: &[&str]) -> RunningProbe {
    let mut c = e.cudaprobe_cmd(args);
    match cvd {
        Some(v) => c.env("CUDA_VISIBLE_DEVICES", v),
        None => c.env_remove("CUDA_VISIBLE_DEVICES"),
    };
    c.stdin(std::process::Stdio::piped());
    let mut p = RunningProbe::start(c);
    p.wait_for("wait");
    p
}

pub(super) fn totals(out: &ProbeOutput) -> Vec<u64> {
    out.find("meminfo")
        .iter()
        .map(|l| l.num("total").expect("total="))
        .collect()
}

pub(super) fn parse(uuid: &str) -> [u8; 16] {
    let hex: String = uuid[4..].chars().filter(|&c| c != '-').collect();
    std::array::from_fn(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap())
}
