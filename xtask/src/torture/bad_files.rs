//! Bad inputs on the file system (root): the region file read-only, owned by another user,
//! on a full file system (`cargo xtask torture`'s bad-input scenario, [`super::bad_inputs`]).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};
use hami_test_harness::TestEnv;

use super::probe::{run_ops_as, run_probe};
use super::profile::CASE_TIMEOUT;
use super::report::Report;
use super::sandbox::sandbox;

pub(super) fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// `nobody`: the workload's uid where root's `CAP_DAC_OVERRIDE` would write anything.
const NOBODY: u32 = 65534;
/// Another unprivileged uid (`daemon`), the owner of a region nobody may not write.
const OTHER_OWNER: u32 = 1;

/// Undoes a mount or an attribute when a case ends, even on an error.
struct Undo(Vec<(&'static str, Vec<String>)>);

impl Drop for Undo {
    fn drop(&mut self) {
        for (cmd, args) in self.0.iter().rev() {
            let _ = Command::new(cmd)
                .args(args)
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .status();
        }
    }
}

/// Runs `cmd args...`; Ok(false) if it ran and failed (not supported here).
fn sh(cmd: &str, args: &[&str]) -> Result<bool> {
    let out = Command::new(cmd)
        .args(args)
        .output()
        .with_context(|| format!("running {cmd}"))?;
    if !out.status.success() {
        println!(
            "    ({cmd} {}: {})",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(out.status.success())
}

fn chmod(path: &Path, mode: u32) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .with_context(|| format!("chmod {mode:o} {}", path.display()))
}

/// One file-system case: the 2 MiB allocation of `cudaprobe` (as `uid`) with the region at
/// `path` (a copy of `bytes` there before, None: no file) must give `rc`, stderr must name
/// the problem (`says`), the process must exit normally, and the file must be unchanged.
#[allow(clippy::too_many_arguments)]
fn fs_case(
    r: &mut Report,
    counts: &mut (usize, usize),
    name: &str,
    env: &mut TestEnv,
    uid: Option<u32>,
    path: &Path,
    bytes: Option<&[u8]>,
    rc: i32,
    says: &[&str],
) {
    counts.1 += 1;
    env.set_env(
        "CUDA_DEVICE_MEMORY_SHARED_CACHE",
        &path.display().to_string(),
    );
    let out = match run_ops_as(env, &["init", "ctx", "alloc", "2M"], CASE_TIMEOUT, uid) {
        Ok(o) => o,
        Err(e) => {
            r.check(false, || format!("bad input {name}: {e:#}"));
            return;
        }
    };
    let err = out.stderr.to_lowercase();
    let named = says.iter().all(|w| err.contains(&w.to_lowercase()));
    let kept = bytes.is_none_or(|b| std::fs::read(path).is_ok_and(|now| now == b));
    let good = out.exited_cleanly && out.rc == Some(rc) && named && kept;
    if good {
        counts.0 += 1;
        let line = out
            .stderr
            .lines()
            .find(|l| l.to_lowercase().contains(&says[0].to_lowercase()))
            .unwrap_or("")
            .trim()
            .to_string();
        println!("    ok: {name}: rc={rc}: {line}");
    }
    r.check(good, || {
        format!(
            "bad input {name}: want rc={rc} and a log line with {says:?}, file untouched; got rc={:?}, exit ok={}, file kept={kept}\n      stdout: {}\n      stderr: {}",
            out.rc,
            out.exited_cleanly,
            out.stdout.trim(),
            out.stderr.trim()
        )
    });
}

/// The region file read-only (mode 0444 for `nobody`, a read-only bind mount and `chattr +i`
/// for root), owned by another user with a mode `nobody` cannot write, and on a full file
/// system (a small tmpfs, new and existing regions). Each: the allocation is refused with
/// `CUDA_ERROR_OUT_OF_MEMORY` (fail closed) and stderr says why, or, for an existing region on
/// a full file system, it works (its blocks are allocated); the file is left as it was.
pub(super) fn file_system_cases(valid: &[u8], r: &mut Report) -> Result<()> {
    let mut counts = (0usize, 0usize);
    let mut skipped = Vec::new();
    // One sandbox any uid can use (mode 1777, copies of the binaries); the fake driver's
    // state file is created by a first run as root and opened to everyone.
    let mut env = sandbox(1 << 30).shared_with_all_users();
    let first = run_probe(&env, &[], CASE_TIMEOUT)?;
    if first.rc != Some(0) {
        bail!("the shared sandbox's first run failed: {}", first.stderr);
    }
    chmod(env.state_path(), 0o666)?;
    let dir = env.dir().to_path_buf();
    let mut n = 0;
    let mut fresh = |mode: u32, owner: Option<u32>| -> Result<PathBuf> {
        n += 1;
        let p = dir.join(format!("region-{n}"));
        std::fs::write(&p, valid)?;
        if let Some(o) = owner {
            std::os::unix::fs::chown(&p, Some(o), Some(o))?;
        }
        chmod(&p, mode)?;
        Ok(p)
    };

    let p = fresh(0o444, None)?;
    fs_case(
        r,
        &mut counts,
        "region mode 0444, process uid nobody",
        &mut env,
        Some(NOBODY),
        &p,
        Some(valid),
        2,
        &["not writable", "permission denied"],
    );
    let p = fresh(0o600, Some(OTHER_OWNER))?;
    fs_case(
        r,
        &mut counts,
        "region owned by uid 1 mode 0600, process uid nobody",
        &mut env,
        Some(NOBODY),
        &p,
        Some(valid),
        2,
        &["not writable", "permission denied"],
    );
    let p = fresh(0o644, Some(OTHER_OWNER))?;
    fs_case(
        r,
        &mut counts,
        "region owned by uid 1 mode 0644 (readable), process uid nobody",
        &mut env,
        Some(NOBODY),
        &p,
        Some(valid),
        2,
        &["not writable", "permission denied"],
    );

    // A read-only bind mount of a directory holding a valid region (root).
    let src = dir.join("bind-src");
    let ro = dir.join("bind-ro");
    std::fs::create_dir(&src)?;
    std::fs::create_dir(&ro)?;
    std::fs::write(src.join("region"), valid)?;
    let (s, o) = (src.display().to_string(), ro.display().to_string());
    {
        let mut undo = Undo(vec![]);
        if sh("mount", &["--bind", &s, &o])? {
            undo.0.push(("umount", vec![o.clone()]));
            if sh("mount", &["-o", "remount,bind,ro", &o])? {
                fs_case(
                    r,
                    &mut counts,
                    "region on a read-only bind mount, process uid 0",
                    &mut env,
                    None,
                    &ro.join("region"),
                    Some(valid),
                    2,
                    &["not writable", "read-only file system"],
                );
            } else {
                skipped.push("read-only bind mount (remount ro refused)");
            }
        } else {
            skipped.push("read-only bind mount (mount --bind refused)");
        }
    }

    // chattr +i (root): even root may not open it for writing.
    let p = fresh(0o644, None)?;
    let ps = p.display().to_string();
    {
        let mut undo = Undo(vec![]);
        if sh("chattr", &["+i", &ps]).unwrap_or(false) {
            undo.0.push(("chattr", vec!["-i".into(), ps.clone()]));
            fs_case(
                r,
                &mut counts,
                "region immutable (chattr +i), process uid 0",
                &mut env,
                None,
                &p,
                Some(valid),
                2,
                &["not writable", "operation not permitted"],
            );
        } else {
            skipped.push("chattr +i (not supported by this file system)");
        }
    }

    // A full file system: a tmpfs of a few region sizes, an existing region copied in, then
    // filled up to ENOSPC.
    let mnt = dir.join("full-tmpfs");
    std::fs::create_dir(&mnt)?;
    chmod(&mnt, 0o1777)?;
    let m = mnt.display().to_string();
    let size = (valid.len() * 3).next_multiple_of(4096);
    {
        let mut undo = Undo(vec![]);
        if sh(
            "mount",
            &[
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size},mode=1777"),
                "tmpfs",
                &m,
            ],
        )? {
            undo.0.push(("umount", vec![m.clone()]));
            let existing = mnt.join("existing-region");
            std::fs::write(&existing, valid)?;
            let filler = mnt.join("filler");
            let mut f = std::fs::File::create(&filler)?;
            let block = vec![0u8; 4096];
            let mut filled = 0u64;
            loop {
                match std::io::Write::write(&mut f, &block) {
                    Ok(0) => break,
                    Ok(k) => filled += k as u64,
                    Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => break,
                    Err(e) => return Err(e).context("filling the tmpfs"),
                }
            }
            drop(f);
            println!("    tmpfs of {size} bytes, filled with {filled} bytes");
            fs_case(
                r,
                &mut counts,
                "new region on a full file system, process uid 0",
                &mut env,
                None,
                &mnt.join("new-region"),
                None,
                2,
                &["no space left on device", "new-region"],
            );
            fs_case(
                r,
                &mut counts,
                "new region on a full file system, process uid nobody",
                &mut env,
                Some(NOBODY),
                &mnt.join("new-region-2"),
                None,
                2,
                &["no space left on device", "new-region-2"],
            );
            // Its blocks are allocated: it keeps working (rc 0), no crash (SIGBUS).
            let before = std::fs::read(&existing)?;
            fs_case(
                r,
                &mut counts,
                "existing region on a full file system, process uid 0 (works)",
                &mut env,
                None,
                &existing,
                None,
                0,
                &[""],
            );
            let after = std::fs::read(&existing)?;
            r.check(before.len() == after.len(), || {
                format!(
                    "bad input: the existing region on the full file system changed size: {} -> {}",
                    before.len(),
                    after.len()
                )
            });
        } else {
            skipped.push("full file system (mount -t tmpfs refused)");
        }
    }
    r.figure(
        "bad inputs: read-only / other owner / full file system: cases passed",
        format!("{} / {}", counts.0, counts.1),
    );
    if !skipped.is_empty() {
        r.figure("bad inputs: skipped here", skipped.join(", "));
    }
    Ok(())
}
