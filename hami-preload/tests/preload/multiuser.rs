//! One container, several users (issue 13): every process of a container shares its quota
//! whatever its uid. Needs root (the processes switch to other uids with `setuid`/`setgid`).
//!
//! The sandboxes are shared with every user ([`TestEnv::shared_with_all_users`]): a 1777
//! directory like `/tmp`, and copies of the preload, the fakes and the probes that any uid can
//! read.

use hami_common::region::Region;
use hami_test_harness::{ProbeOutput, RunningProbe, TestEnv};
use std::io::{BufRead, BufReader, Read};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::process::{ChildStdout, Stdio};

const MIB: u64 = 1 << 20;
/// `CUDA_ERROR_OUT_OF_MEMORY`.
const OOM: i32 = 2;
const NOBODY: u32 = 65534;
/// A second unprivileged user (no name needed: only numbers matter to the kernel).
const OTHER: u32 = 65533;

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// A sandbox shared with every user: limit 1 GiB, context overhead fixed at 0 (only data
/// counts), preload on.
fn sandbox() -> TestEnv {
    assert!(is_root(), "these tests switch uids: run them as root");
    TestEnv::new()
        .env("CUDA_DEVICE_MEMORY_LIMIT", "1G")
        .env("HAMI_CONTEXT_OVERHEAD", "0")
        .env("FAKE_CUDA_TOTAL_MEM", "16G")
        .preload(true)
        .shared_with_all_users()
}

/// `cudaprobe ARGS` as `uid` (group `uid` too, no supplementary groups; root stays root).
fn cudaprobe_as(env: &TestEnv, uid: u32, args: &[&str]) -> std::process::Command {
    let mut c = env.cudaprobe_cmd(args);
    if uid != 0 {
        c.uid(uid).gid(uid);
    }
    c
}

fn run_as(env: &TestEnv, uid: u32, args: &[&str]) -> ProbeOutput {
    ProbeOutput::from_output(
        cudaprobe_as(env, uid, args)
            .output()
            .expect("run cudaprobe"),
    )
}

/// Starts a probe as `uid` that allocates `size` and then holds it until resumed.
fn holder(env: &TestEnv, uid: u32, size: &str) -> RunningProbe {
    let mut c = cudaprobe_as(env, uid, &["init", "ctx", "alloc", size, "wait"]);
    c.stdin(Stdio::piped());
    let mut p = RunningProbe::start(c);
    let a = p.wait_for("alloc");
    assert!(
        a.ok(),
        "the first process ({uid}) may allocate {size}: {a:?}"
    );
    p
}

fn used(env: &TestEnv) -> u64 {
    Region::open_existing(env.region_path(), false)
        .expect("region exists")
        .used(0)
}

fn mode_and_owner(env: &TestEnv) -> (u32, u32, u32) {
    let md = std::fs::metadata(env.region_path()).expect("region exists");
    (md.permissions().mode() & 0o7777, md.uid(), md.gid())
}

/// Allocation rcs of a probe output (`alloc` lines only).
fn alloc_rcs(out: &ProbeOutput) -> Vec<Option<i32>> {
    out.find("alloc").iter().map(|o| o.rc()).collect()
}

#[test]
fn root_creates_the_region_then_nobody_allocates_within_the_same_quota() {
    let env = sandbox();
    let first = holder(&env, 0, "600M");
    assert_eq!(mode_and_owner(&env), (0o666, 0, 0));
    // 600 + 300 fits in 1 GiB, a further 300 does not: one quota for both users.
    let second = run_as(
        &env,
        NOBODY,
        &["init", "ctx", "alloc", "300M", "alloc", "300M"],
    );
    assert_eq!(
        alloc_rcs(&second),
        vec![Some(0), Some(OOM)],
        "{}",
        second.dump()
    );
    let u = used(&env);
    assert!(u <= 1024 * MIB, "together {u} bytes > the 1 GiB quota");
    assert_eq!(u, 600 * MIB, "nobody's 300 MiB were released at its exit");
    let out = first.finish();
    assert!(out.status.success(), "{}", out.dump());
    assert_eq!(used(&env), 0);
}

#[test]
fn nobody_creates_the_region_then_root_and_another_user_allocate_within_the_same_quota() {
    let env = sandbox();
    let first = holder(&env, NOBODY, "600M");
    assert_eq!(mode_and_owner(&env), (0o666, NOBODY, NOBODY));
    let root = run_as(&env, 0, &["init", "ctx", "alloc", "300M", "alloc", "300M"]);
    assert_eq!(
        alloc_rcs(&root),
        vec![Some(0), Some(OOM)],
        "{}",
        root.dump()
    );
    // A third user, neither the creator nor root.
    let other = run_as(
        &env,
        OTHER,
        &["init", "ctx", "alloc", "400M", "alloc", "500M"],
    );
    assert_eq!(
        alloc_rcs(&other),
        vec![Some(0), Some(OOM)],
        "{}",
        other.dump()
    );
    assert!(used(&env) <= 1024 * MIB);
    let out = first.finish();
    assert!(out.status.success(), "{}", out.dump());
    assert_eq!(used(&env), 0);
}

/// Two users racing to create the region: whoever wins, both end up in one quota.
#[test]
fn two_users_starting_together_share_one_quota() {
    for _ in 0..3 {
        let env = sandbox();
        let spawn = |uid| {
            cudaprobe_as(&env, uid, &["init", "ctx", "alloc", "400M", "wait"])
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("spawn")
        };
        let mut kids = [spawn(0), spawn(NOBODY), spawn(OTHER)];
        // Each holds its allocation until all three have allocated (cudaprobe's `wait` reads
        // stdin), so the count is what they held at once. With a fixed 0.3 s hold, a process
        // started late under qemu found the others gone: three granted.
        let heads: Vec<(String, BufReader<ChildStdout>)> = kids
            .iter_mut()
            .map(|k| {
                let mut r = BufReader::new(k.stdout.take().expect("piped stdout"));
                let mut head = String::new();
                loop {
                    let mut line = String::new();
                    if r.read_line(&mut line).unwrap() == 0 {
                        break; // ended before its wait: judged below
                    }
                    head.push_str(&line);
                    if line.contains("op=wait state=waiting") {
                        break;
                    }
                }
                (head, r)
            })
            .collect();
        let outs: Vec<ProbeOutput> = kids
            .into_iter()
            .zip(heads)
            .map(|(mut k, (head, mut r))| {
                drop(k.stdin.take()); // end of input: the wait returns
                let mut rest = String::new();
                r.read_to_string(&mut rest).unwrap();
                let mut out = k.wait_with_output().unwrap();
                out.stdout = (head + &rest).into_bytes();
                ProbeOutput::from_output(out)
            })
            .collect();
        let granted = outs.iter().filter(|o| o.find("alloc")[0].ok()).count();
        // 3 x 400 MiB > 1 GiB: exactly two fit, and nobody is refused for permissions.
        assert_eq!(
            granted,
            2,
            "{}",
            outs.iter().map(|o| o.dump()).collect::<Vec<_>>().join("\n")
        );
        for o in &outs {
            assert!(!o.stderr.contains("not writable"), "{}", o.dump());
        }
        assert_eq!(mode_and_owner(&env).0, 0o666);
    }
}

/// An `nvidia-smi`-style health check as root (NVML only, under the preload) creates the
/// region like a CUDA process would: the application user can use it afterwards.
#[test]
fn an_nvml_only_health_check_as_root_creates_a_region_every_user_can_use() {
    let env = sandbox();
    let out = env.nvmlprobe_cmd().output().expect("run nvmlprobe");
    assert!(out.status.success(), "{out:?}");
    assert_eq!(mode_and_owner(&env), (0o666, 0, 0));
    let app = run_as(&env, NOBODY, &["init", "ctx", "alloc", "512M"]);
    assert_eq!(alloc_rcs(&app), vec![Some(0)], "{}", app.dump());
}

/// An operator who asks for a stricter mode gets it; a user it leaves out fails closed with
/// the error naming the region.
#[test]
fn a_stricter_mode_and_a_group_are_applied_and_fail_closed_for_others() {
    let env = sandbox()
        .env("HAMI_REGION_MODE", "0660")
        .env("HAMI_REGION_GROUP", &NOBODY.to_string());
    let first = holder(&env, 0, "100M");
    assert_eq!(mode_and_owner(&env), (0o660, 0, NOBODY));
    // In the group: allowed.
    let member = run_as(&env, NOBODY, &["init", "ctx", "alloc", "100M"]);
    assert_eq!(alloc_rcs(&member), vec![Some(0)], "{}", member.dump());
    // Not in the group: refused, with today's clear error.
    let outsider = run_as(&env, OTHER, &["init", "ctx", "alloc", "100M"]);
    assert_eq!(alloc_rcs(&outsider), vec![Some(OOM)], "{}", outsider.dump());
    let region = env.region_path().display().to_string();
    assert!(
        outsider.stderr.contains("not writable") && outsider.stderr.contains(&region),
        "{}",
        outsider.dump()
    );
    drop(first.finish());
}

#[test]
fn a_malformed_region_mode_fails_closed_naming_the_variable() {
    for (var, value) in [("HAMI_REGION_MODE", "0777"), ("HAMI_REGION_GROUP", "video")] {
        let env = sandbox().env(var, value);
        let out = run_as(&env, 0, &["init", "ctx", "alloc", "1M"]);
        assert_eq!(alloc_rcs(&out), vec![Some(OOM)], "{}", out.dump());
        assert!(
            out.stderr.contains(var) && out.stderr.contains(value),
            "{}",
            out.dump()
        );
        assert!(
            !env.region_path().exists(),
            "no region may be created with a rejected {var}"
        );
    }
}

/// The directory is the container's: a user who may not create in it fails closed with an
/// error naming the directory, until a process allowed to create the region does so; from
/// then on that user shares the quota.
#[test]
fn a_directory_only_root_can_write_waits_for_root_to_create_the_region() {
    let env = sandbox();
    let dir = env.dir().join("root-only");
    std::fs::create_dir(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let region = dir.join("r.cache");
    let env = env.env("CUDA_DEVICE_MEMORY_SHARED_CACHE", region.to_str().unwrap());
    let early = run_as(&env, NOBODY, &["init", "ctx", "alloc", "1M"]);
    assert_eq!(alloc_rcs(&early), vec![Some(OOM)], "{}", early.dump());
    let want = format!("create in directory {}", dir.display());
    assert!(early.stderr.contains(&want), "{}", early.dump());
    assert!(!region.exists());
    let root = run_as(&env, 0, &["init", "ctx", "alloc", "1M"]);
    assert_eq!(alloc_rcs(&root), vec![Some(0)], "{}", root.dump());
    let later = run_as(&env, NOBODY, &["init", "ctx", "alloc", "1M"]);
    assert_eq!(alloc_rcs(&later), vec![Some(0)], "{}", later.dump());
}
