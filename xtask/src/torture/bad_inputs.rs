//! Bad inputs: malformed region files and environment values, and hook arguments the CUDA
//! documentation gives a result for.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use hami_abi::layout::{RegionHeader, REGION_SIZE};
use hami_test_harness::OpLine;

use super::bad_files::{file_system_cases, is_root};
use super::probe::{run_ops, run_probe};
use super::profile::{Profile, CASE_TIMEOUT, FINDING_TIMEOUT};
use super::report::Report;
use super::rng::Rng;
use super::sandbox::sandbox;
use super::worker::field;

/// One bad-input case: what the region path points at, or the environment.
pub(super) struct Case {
    name: String,
    /// Extra environment (on top of a 1 GiB limit).
    env: Vec<(String, String)>,
    /// Contents of the region file (None: leave the path as prepared by `prepare`).
    file: Option<Vec<u8>>,
    /// Runs before the probe (make a directory, a FIFO...), given the region path.
    prepare: Option<fn(&Path) -> std::io::Result<()>>,
    /// Expected result of the 2 MiB allocation.
    rc: i32,
    /// Text the preload's stderr must contain (case-insensitive).
    says: &'static str,
    /// A known design finding (docs/torture.md): a hang is reported as this finding, with a
    /// short timeout, instead of failing the run.
    finding: Option<&'static str>,
}

pub(super) fn bad_inputs(p: &Profile, rng: &mut Rng, r: &mut Report) -> Result<()> {
    // A valid region to corrupt.
    let env = sandbox(1 << 30);
    let out = run_probe(&env, &[], CASE_TIMEOUT)?;
    if out.rc != Some(0) {
        bail!("the reference run failed: {}\n{}", out.stdout, out.stderr);
    }
    let valid = std::fs::read(env.region_path()).context("reading the reference region")?;
    if valid.len() != REGION_SIZE {
        bail!("the reference region is {} bytes", valid.len());
    }
    let hs = std::mem::size_of::<RegionHeader>();
    let mut cases = Vec::new();
    let mut cuts: Vec<usize> = if p.every_header_byte {
        (1..=hs).collect()
    } else {
        let mut v = vec![1, 7, 8, 9, 12, 15, 16, 20, 24, 31, 32, 40, 48];
        v.extend([hs / 4, hs / 2, hs - 8, hs - 1, hs, hs + 1]);
        v
    };
    cuts.extend([REGION_SIZE / 2, REGION_SIZE - 1]);
    for cut in cuts {
        cases.push(Case {
            name: format!("truncated to {cut} bytes"),
            env: vec![],
            file: Some(valid[..cut].to_vec()),
            prepare: None,
            rc: 2,
            says: "truncated",
            finding: None,
        });
    }
    let random: Vec<u8> = (0..REGION_SIZE).map(|_| rng.next() as u8).collect();
    cases.push(case_file("random bytes, region size", random, "bad magic"));
    let random_short: Vec<u8> = (0..100).map(|_| rng.next() as u8 | 1).collect();
    cases.push(case_file("random bytes, 100", random_short, "bad magic"));
    let mut m = valid.clone();
    m[0] ^= 0xff;
    cases.push(case_file("wrong magic", m, "bad magic"));
    let off = core::mem::offset_of!(RegionHeader, version);
    let mut m = valid.clone();
    let next = hami_abi::layout::VERSION + 1;
    m[off..off + 4].copy_from_slice(&next.to_le_bytes());
    cases.push(case_file(
        &format!("layout version {next} (the next one)"),
        m,
        "layout version",
    ));
    let mut m = valid.clone();
    m[off..off + 4].copy_from_slice(&u32::MAX.to_le_bytes());
    cases.push(case_file("layout version u32::MAX", m, "layout version"));
    let off = core::mem::offset_of!(RegionHeader, header_size);
    let mut m = valid.clone();
    m[off..off + 4].copy_from_slice(&8u32.to_le_bytes());
    cases.push(case_file("header_size 8", m, "header_size"));
    let off = core::mem::offset_of!(RegionHeader, total_size);
    let mut m = valid.clone();
    m[off..off + 8].copy_from_slice(&u64::MAX.to_le_bytes());
    cases.push(case_file("total_size u64::MAX", m, "total_size"));
    let mut m = valid.clone();
    m.extend_from_slice(&[0u8; 4096]);
    cases.push(case_file("file 4 KiB too long", m, "file size"));
    cases.push(Case {
        name: "a directory".into(),
        env: vec![],
        file: None,
        prepare: Some(|p| std::fs::create_dir(p)),
        rc: 2,
        says: "directory",
        finding: None,
    });
    cases.push(Case {
        name: "a FIFO".into(),
        env: vec![],
        file: None,
        prepare: Some(|p| {
            let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes())
                .map_err(std::io::Error::other)?;
            // SAFETY: c is a valid C string.
            if unsafe { libc::mkfifo(c.as_ptr(), 0o600) } != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        }),
        rc: 2,
        says: "not a regular file",
        finding: None,
    });
    cases.push(Case {
        name: "in a missing directory".into(),
        env: vec![(
            "CUDA_DEVICE_MEMORY_SHARED_CACHE".into(),
            "/nonexistent-hami-torture/dir/region".into(),
        )],
        file: None,
        prepare: None,
        rc: 2,
        says: "/nonexistent-hami-torture/dir/region",
        finding: None,
    });
    for v in [
        "lots",
        "1.5G",
        "-1",
        "",
        "   ",
        "0x10",
        "4GB",
        "1 G",
        "+5",
        "G",
        "1e9",
        "١٢",
        "1G\t2",
        "18446744073709551616",
        "16777216T",
    ] {
        cases.push(Case {
            name: format!("CUDA_DEVICE_MEMORY_LIMIT={v:?}"),
            env: vec![("CUDA_DEVICE_MEMORY_LIMIT".into(), v.into())],
            file: None,
            prepare: None,
            rc: 2,
            says: "invalid CUDA_DEVICE_MEMORY_LIMIT",
            finding: None,
        });
    }
    for v in ["x", "-3", "99999999999999999999"] {
        cases.push(Case {
            name: format!("CUDA_DEVICE_MEMORY_LIMIT_0={v:?}"),
            env: vec![("CUDA_DEVICE_MEMORY_LIMIT_0".into(), v.into())],
            file: None,
            prepare: None,
            rc: 2,
            says: "invalid CUDA_DEVICE_MEMORY_LIMIT_0",
            finding: None,
        });
    }
    cases.push(Case {
        name: "HAMI_CONTEXT_OVERHEAD=\"lots\" (reported, then measured)".into(),
        env: vec![("HAMI_CONTEXT_OVERHEAD".into(), "lots".into())],
        file: None,
        prepare: None,
        rc: 0,
        says: "invalid HAMI_CONTEXT_OVERHEAD",
        finding: None,
    });
    cases.push(Case {
        name: "LIBCUDA_LOG_LEVEL=\"loud\" (warned, 2 used)".into(),
        env: vec![("LIBCUDA_LOG_LEVEL".into(), "loud".into())],
        file: None,
        prepare: None,
        rc: 0,
        says: "LIBCUDA_LOG_LEVEL",
        finding: None,
    });
    // The lock word names a thread that does not exist (and no owner-died mark): what a
    // holder leaves when the kernel could not walk its robust list, or a copied file.
    let mut t = Command::new("true").spawn().context("starting true")?;
    let gone = t.id();
    t.wait()?;
    let mut m = valid.clone();
    let off = core::mem::offset_of!(RegionHeader, lock);
    m[off..off + 4].copy_from_slice(&gone.to_le_bytes());
    // Fixed: the preload marks such a word owner-died after 500 ms and recovers the region.
    cases.push(Case {
        name: "lock word held by a thread that does not exist (recovered)".into(),
        env: vec![],
        file: Some(m),
        prepare: None,
        rc: 0,
        says: "",
        finding: None,
    });

    let (mut passed, mut findings, mut slowest) = (0usize, 0usize, Duration::ZERO);
    let n = cases.len();
    for c in cases {
        let mut env = sandbox(1 << 30);
        for (k, v) in &c.env {
            env.set_env(k, v);
        }
        let path = env
            .vars()
            .get("CUDA_DEVICE_MEMORY_SHARED_CACHE")
            .map(PathBuf::from)
            .unwrap_or_default();
        if let Some(bytes) = &c.file {
            std::fs::write(&path, bytes)?;
        }
        if let Some(prep) = c.prepare {
            prep(&path).with_context(|| format!("preparing {}", c.name))?;
        }
        let t = Instant::now();
        let wait = if c.finding.is_some() {
            FINDING_TIMEOUT
        } else {
            CASE_TIMEOUT
        };
        let out = run_probe(&env, &[], wait);
        let took = t.elapsed();
        let out = match (out, c.finding) {
            (Ok(o), _) => o,
            (Err(e), Some(f)) => {
                findings += 1;
                r.figure(
                    &format!("bad inputs: FINDING ({})", c.name),
                    format!("{f}: {e:#}"),
                );
                continue;
            }
            (Err(e), None) => {
                r.check(false, || format!("bad input {}: {e:#}", c.name));
                continue;
            }
        };
        slowest = slowest.max(took);
        let says = out.stderr.to_lowercase().contains(&c.says.to_lowercase());
        // A refused file is never modified; one the process may use (rc 0) is, by its use.
        let kept = c.rc == 0
            || c.file
                .as_ref()
                .is_none_or(|b| std::fs::read(&path).is_ok_and(|now| &now == b));
        let good = out.exited_cleanly && out.rc == Some(c.rc) && says && kept;
        if good {
            passed += 1;
        }
        r.check(good, || {
            format!(
                "bad input {}: want rc={} and a log line with {:?}, file untouched; got rc={:?}, exit ok={}, file kept={kept}\n      stdout: {}\n      stderr: {}",
                c.name,
                c.rc,
                c.says,
                out.rc,
                out.exited_cleanly,
                out.stdout.trim(),
                out.stderr.trim()
            )
        });
    }
    // Hook arguments the CUDA documentation gives a result for (1 GiB limit). The
    // expected codes, in order, of the listed ops' lines.
    let arg_cases: [ArgCase; 7] = [
        ("cuMemAlloc_v2 of 0 bytes", &["alloc", "0"], &[("alloc", 1)]),
        (
            "cuMemAlloc_v2 into NULL",
            &["alloc-null"],
            &[("alloc-null", 1)],
        ),
        (
            "cuMemAlloc_v2 of SIZE_MAX, then the whole quota",
            &["alloc", "18446744073709551615", "alloc", "1G"],
            &[("alloc", 2), ("alloc", 0)],
        ),
        (
            "cuMemCreate of a size that is not a multiple of the granularity",
            &["create", "1"],
            &[("create", 1)],
        ),
        ("cuMemFree_v2(0)", &["free-raw", "0"], &[("free-raw", 0)]),
        (
            "cuMemFree_v2 of an unknown pointer, then the whole quota",
            &["free-raw", "0x1234", "alloc", "1G"],
            &[("free-raw", 1), ("alloc", 0)],
        ),
        (
            "free everything twice, then the whole quota",
            &["alloc", "512M", "free", "all", "free", "all", "alloc", "1G"],
            &[("alloc", 0), ("alloc", 0)],
        ),
    ];
    let mut arg_passed = 0;
    for (name, ops, want) in arg_cases {
        let env = sandbox(1 << 30);
        let mut all = vec!["init", "ctx"];
        all.extend_from_slice(ops);
        let out = match run_ops(&env, &all, CASE_TIMEOUT) {
            Ok(o) => o,
            Err(e) => {
                r.check(false, || format!("hook arguments, {name}: {e:#}"));
                continue;
            }
        };
        let lines: Vec<(String, Option<u64>)> = out
            .stdout
            .lines()
            .filter_map(OpLine::parse)
            .map(|o| (o.op.clone(), o.num("rc")))
            .collect();
        let mut got = Vec::new();
        let mut it = lines.iter();
        for (op, _) in want {
            got.push(it.find(|(o, _)| o == op).and_then(|(_, rc)| *rc));
        }
        let ok = out.exited_cleanly
            && got
                .iter()
                .zip(want.iter())
                .all(|(g, (_, w))| *g == Some(*w as u64));
        if ok {
            arg_passed += 1;
        }
        r.check(ok, || {
            format!(
                "hook arguments, {name}: want {want:?}, got {got:?}\n      stdout: {}\n      stderr: {}",
                out.stdout.trim(),
                out.stderr.trim()
            )
        });
    }
    r.figure(
        "hook arguments: cases passed",
        format!("{arg_passed} / {}", arg_cases.len()),
    );
    r.figure(
        "bad inputs: cases passed / known findings",
        format!("{passed} / {n} (findings: {findings})"),
    );
    r.figure(
        "bad inputs: slowest case (ms)",
        format!("{:.0}", slowest.as_secs_f64() * 1e3),
    );
    if is_root() {
        file_system_cases(&valid, r)?;
    } else {
        r.figure(
            "bad inputs: read-only, other owner, full file system",
            "skipped (needs root)",
        );
    }
    cross_thread_free(if p.every_header_byte { 20_000 } else { 2_000 }, r)?;
    Ok(())
}

pub(super) fn case_file(name: &str, bytes: Vec<u8>, says: &'static str) -> Case {
    Case {
        name: name.into(),
        env: vec![],
        file: Some(bytes),
        prepare: None,
        rc: 2,
        says,
        finding: None,
    }
}

/// A hook-argument case: name, cudaprobe ops (after `init ctx`), expected `(op, rc)` in order.
pub(super) type ArgCase = (
    &'static str,
    &'static [&'static str],
    &'static [(&'static str, i32)],
);

/// `testing/programs/crossfree.c`: one thread allocates (four families) while another frees
/// what it allocated. The accounting must stay exact: the process's `cuMemGetInfo` and its
/// region slot both equal what it still holds, and 0 once it freed the rest.
fn cross_thread_free(rounds: u32, r: &mut Report) -> Result<()> {
    let tag = "bad inputs (free from another thread while allocating)";
    let prog = hami_test_harness::Artifacts::get().compile_against_fake(
        &hami_test_harness::workspace_root().join("testing/programs/crossfree.c"),
        "crossfree",
    );
    let env = sandbox(1 << 30);
    let w = super::worker::Worker::spawn(&env, &prog, &[&rounds.to_string()])?;
    let t0 = Instant::now();
    let l = w.expect("held ", CASE_TIMEOUT * 4)?;
    let took = t0.elapsed();
    let held = field(&l, "bytes");
    let info = field(&l, "info_used");
    let region = super::worker::open_region(env.region_path(), false)?;
    let snap = super::worker::consistent_snapshot(&region)?;
    let slot: u64 = snap.slots_of_pid(w.pid).map(|s| s.device_total(0)).sum();
    r.figure(
        &format!("{tag}: {rounds} rounds"),
        format!(
            "{l} (region slot {slot}), {:.0} ms",
            took.as_secs_f64() * 1e3
        ),
    );
    r.check(
        field(&l, "errors") == Some(0)
            && field(&l, "allocs").unwrap_or(0) > 0
            && held.is_some()
            && info == held
            && Some(slot) == held,
        || {
            format!(
                "{tag}: want no error and held = cuMemGetInfo used = region slot; got {l}, slot {slot}, errors {:?}",
                w.errors()
            )
        },
    );
    let mut w = w;
    w.send("free")?;
    let f = w.expect("freed ", CASE_TIMEOUT)?;
    let snap = super::worker::consistent_snapshot(&region)?;
    let slot_after: u64 = snap.slots_of_pid(w.pid).map(|s| s.device_total(0)).sum();
    r.check(
        field(&f, "errors") == Some(0) && field(&f, "info_used") == Some(0) && slot_after == 0,
        || format!("{tag}: after freeing the rest: {f}, region slot {slot_after}"),
    );
    let ok = w.finish(CASE_TIMEOUT)?;
    r.check(ok, || format!("{tag}: the process exited with an error"));
    Ok(())
}
