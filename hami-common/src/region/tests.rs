//! Unit tests of the region: run with `cargo test -p hami-common --features std`.
//! Several tests fork: children only touch the region and then `_exit`.

// `is_multiple_of` is newer than the workspace's rust-version.
#![allow(clippy::manual_is_multiple_of)]

use super::file::*;
use super::*;
use crate::layout::{Slot, LIMIT_FLAG_INVALID, MAX_SLOTS};
use core::mem::{offset_of, size_of};
use std::collections::HashSet;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::atomic::AtomicUsize;
use std::sync::Mutex;
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;

/// A temporary directory removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> TempDir {
        static N: AtomicUsize = AtomicUsize::new(0);
        let p = std::env::temp_dir().join(format!(
            "hami-region-test-{}-{}-{}",
            std::process::id(),
            name,
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }

    fn file(&self) -> PathBuf {
        self.0.join("region.cache")
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn cfg(limit: u64) -> RegionConfig {
    RegionConfig {
        limits: [limit; MAX_DEVICES],
        device_count: 2,
        ..RegionConfig::default()
    }
}

fn create(path: &Path, limit: u64) -> Region {
    let (r, out) = Region::open_or_create(path, &cfg(limit)).unwrap();
    assert_eq!(out, OpenOutcome::Created);
    r
}

/// Liveness from a set the test controls.
#[derive(Default)]
struct FakeProbe(Mutex<HashSet<ProcessId>>);

impl FakeProbe {
    fn set_alive(&self, who: ProcessId, alive: bool) {
        let mut s = self.0.lock().unwrap();
        if alive {
            s.insert(who);
        } else {
            s.remove(&who);
        }
    }
}

impl LivenessProbe for FakeProbe {
    fn liveness(&self, who: ProcessId) -> Liveness {
        if self.0.lock().unwrap().contains(&who) {
            Liveness::Alive
        } else {
            Liveness::Dead
        }
    }
}

fn fake(pid: u32, start_time: u64) -> ProcessId {
    ProcessId { pid, start_time }
}

/// Forks; the child runs `f` and `_exit`s with its return value (101 on panic).
fn fork_child(f: impl FnOnce() -> i32) -> libc::pid_t {
    // SAFETY: fork; the child only runs `f` (region operations) and then _exit.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        let code = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or(101);
        // SAFETY: ends the child without running the parent's atexit handlers or test harness.
        unsafe { libc::_exit(code) };
    }
    pid
}

/// Waits for `pid` up to `timeout`; returns the raw wait status, or None on timeout (the
/// child is then killed, so that it cannot hold the test's output open).
fn wait_timeout(pid: libc::pid_t, timeout: Duration) -> Option<i32> {
    let deadline = Instant::now() + timeout;
    loop {
        let mut status = 0;
        // SAFETY: waits for our own child.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if r == pid {
            return Some(status);
        }
        assert!(r == 0, "waitpid failed");
        if Instant::now() > deadline {
            // SAFETY: kills and reaps our own child.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, &mut status, 0);
            }
            return None;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

fn exit_code(status: i32) -> i32 {
    if libc::WIFEXITED(status) {
        libc::WEXITSTATUS(status)
    } else {
        -libc::WTERMSIG(status)
    }
}

/// A pipe: (read end, write end).
fn pipe() -> (libc::c_int, libc::c_int) {
    let mut fds = [0; 2];
    // SAFETY: fds is a valid out array.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    (fds[0], fds[1])
}

fn write_u64(fd: libc::c_int, v: u64) {
    let b = v.to_le_bytes();
    // SAFETY: writes 8 bytes from a live buffer.
    let n = unsafe { libc::write(fd, b.as_ptr().cast(), 8) };
    assert_eq!(n, 8);
}

fn read_u64(fd: libc::c_int) -> Option<u64> {
    let mut b = [0u8; 8];
    let mut got = 0;
    while got < 8 {
        // SAFETY: reads into a live buffer.
        let n = unsafe { libc::read(fd, b[got..].as_mut_ptr().cast(), 8 - got) };
        if n <= 0 {
            return None;
        }
        got += n as usize;
    }
    Some(u64::from_le_bytes(b))
}

fn close(fd: libc::c_int) {
    // SAFETY: closes an fd we own.
    unsafe { libc::close(fd) };
}

fn patch(path: &Path, offset: u64, bytes: &[u8]) {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.write_all_at(bytes, offset).unwrap();
}

/// A tuning with a 1 MiB admission reserve (1/32 of the tests' smallest limits or less).
fn reserves() -> Tuning {
    Tuning {
        reserve: MIB,
        ..Tuning::default()
    }
}

fn sum_slots(s: &RegionSnapshot, dev: usize) -> u64 {
    s.accounted(dev)
}

// ---------------------------------------------------------------- layout

/// The offsets and sizes documented in docs/shared-region.md.
#[test]
fn layout_matches_documentation() {
    use crate::layout::RegionHeader as H;
    assert_eq!(offset_of!(H, magic), 0);
    assert_eq!(offset_of!(H, version), 8);
    assert_eq!(offset_of!(H, header_size), 12);
    assert_eq!(offset_of!(H, total_size), 16);
    assert_eq!(offset_of!(H, init_state), 24);
    assert_eq!(offset_of!(H, device_count), 28);
    assert_eq!(offset_of!(H, creator_pid), 32);
    assert_eq!(offset_of!(H, created_unix), 40);
    assert_eq!(offset_of!(H, lock), 48);
    assert_eq!(offset_of!(H, generation), 112);
    assert_eq!(offset_of!(H, owner_died_recoveries), 120);
    assert_eq!(offset_of!(H, reclaimed_slots), 128);
    assert_eq!(offset_of!(H, limits), 136);
    assert_eq!(offset_of!(H, limit_flags), 264);
    assert_eq!(offset_of!(H, uuids), 328);
    assert_eq!(offset_of!(H, used), 584);
    assert_eq!(offset_of!(H, boot_id), 712);
    assert_eq!(offset_of!(H, slot_high_water), 728);
    assert_eq!(offset_of!(H, stale_lock_breaks), 736);
    assert_eq!(offset_of!(H, reserve_reclaims), 744);
    assert_eq!(offset_of!(H, context_footprint), 752);
    assert_eq!(offset_of!(H, _reserved), 880);
    assert_eq!(size_of::<H>(), 1024);
    assert_eq!(offset_of!(Slot, pid), 0);
    assert_eq!(offset_of!(Slot, status), 4);
    assert_eq!(offset_of!(Slot, start_time), 8);
    assert_eq!(offset_of!(Slot, usage), 16);
    assert_eq!(offset_of!(Slot, charged), 656);
    assert_eq!(offset_of!(Slot, reserve), 784);
    assert_eq!(offset_of!(Slot, host_pid), 912);
    assert_eq!(size_of::<Slot>(), 1024);
    assert_eq!(offset_of!(crate::layout::Region, slots), 1024);
    use crate::layout::DeviceCompute as C;
    assert_eq!(
        offset_of!(crate::layout::Region, compute),
        1024 + 1024 * 1024
    );
    assert_eq!(offset_of!(C, sm_limit), 0);
    assert_eq!(offset_of!(C, policy), 4);
    assert_eq!(offset_of!(C, budget_ns), 8);
    assert_eq!(offset_of!(C, refilled_at_ns), 16);
    assert_eq!(offset_of!(C, consumed_ns), 24);
    assert_eq!(offset_of!(C, throttled), 32);
    assert_eq!(offset_of!(C, throttled_ns), 40);
    assert_eq!(offset_of!(C, submit_lock), 48);
    assert_eq!(offset_of!(C, refusals), 56);
    assert_eq!(size_of::<C>(), 64);
    assert_eq!(REGION_SIZE, 1024 + 1024 * 1024 + 16 * 64);
    assert_eq!(REGION_SIZE, 1_050_624);
    const { assert!(MAX_SLOTS >= 1024 && MAX_DEVICES >= 16) };
}

// ---------------------------------------------------------------- create / open / validate

#[test]
fn create_then_open_existing_keeps_region_limits() {
    let d = TempDir::new("create");
    let p = d.file();
    let mut c = cfg(8 * MIB);
    c.limits[1] = 4 * MIB;
    let (r, out) = Region::open_or_create(&p, &c).unwrap();
    assert_eq!(out, OpenOutcome::Created);
    let md = std::fs::metadata(&p).unwrap();
    assert_eq!(md.len(), REGION_SIZE as u64);
    assert_eq!(md.permissions().mode() & 0o777, 0o666);
    assert_eq!(r.limit(0), 8 * MIB);
    assert_eq!(r.limit(1), 4 * MIB);
    assert_eq!(r.device_count(), 2);
    assert_eq!(r.path(), p.as_path());

    // Same configuration: no differences.
    let (_r2, out) = Region::open_or_create(&p, &c).unwrap();
    assert_eq!(out, OpenOutcome::Existing { differs: vec![] });

    // Different configuration: the region's values stay, the differences are reported.
    let mut c2 = c.clone();
    c2.limits[1] = 6 * MIB;
    c2.limit_flags[3] = LIMIT_FLAG_INVALID;
    let (r3, out) = Region::open_or_create(&p, &c2).unwrap();
    assert_eq!(
        out,
        OpenOutcome::Existing {
            differs: vec![
                LimitDifference {
                    dev: 1,
                    region_limit: 4 * MIB,
                    region_flags: 0,
                    requested_limit: 6 * MIB,
                    requested_flags: 0,
                },
                LimitDifference {
                    dev: 3,
                    region_limit: 8 * MIB,
                    region_flags: 0,
                    requested_limit: 8 * MIB,
                    requested_flags: LIMIT_FLAG_INVALID,
                },
            ]
        }
    );
    assert_eq!(r3.limit(1), 4 * MIB);
    assert_eq!(r3.limit_flags(3), 0);
}

/// Serialises the tests that change the process-wide umask.
static UMASK: Mutex<()> = Mutex::new(());

/// Runs `f` with umask `mask` (restored afterwards).
fn with_umask<T>(mask: libc::mode_t, f: impl FnOnce() -> T) -> T {
    let _g = UMASK.lock().unwrap_or_else(|e| e.into_inner());
    // SAFETY: umask has no preconditions.
    let old = unsafe { libc::umask(mask) };
    let out = f();
    // SAFETY: as above.
    unsafe { libc::umask(old) };
    out
}

/// Names in `dir` other than the region itself (temporary publish names must not stay).
fn leftovers(d: &TempDir) -> Vec<String> {
    std::fs::read_dir(&d.0)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n != "region.cache")
        .collect()
}

#[test]
fn default_mode_is_0666_despite_umask() {
    let d = TempDir::new("mode");
    let p = d.file();
    let _r = with_umask(0o077, || Region::open_or_create(&p, &cfg(0)).unwrap());
    let md = std::fs::metadata(&p).unwrap();
    assert_eq!(md.permissions().mode() & 0o7777, 0o666);
    assert_eq!(leftovers(&d), Vec::<String>::new());
}

#[test]
fn configured_mode_and_group_are_applied() {
    use std::os::unix::fs::MetadataExt;
    let d = TempDir::new("group");
    let p = d.file();
    // SAFETY: getgid/geteuid have no preconditions.
    let (gid, root) = unsafe { (libc::getgid(), libc::geteuid() == 0) };
    // Root may give the file any group; anyone else only one of their own.
    let group = if root { 54321 } else { gid };
    let c = RegionConfig {
        mode: 0o660,
        group: Some(group),
        ..cfg(0)
    };
    let _r = with_umask(0o022, || Region::open_or_create(&p, &c).unwrap());
    let md = std::fs::metadata(&p).unwrap();
    assert_eq!(md.permissions().mode() & 0o7777, 0o660);
    assert_eq!(md.gid(), group);
    assert_eq!(leftovers(&d), Vec::<String>::new());
}

/// Asking for a group the creator may not give (group 0, as a user outside it) is a clear
/// error, and nothing appears under the region's name.
#[test]
fn a_group_that_cannot_be_set_is_a_clear_error_and_leaves_nothing() {
    let d = TempDir::new("badgroup");
    std::fs::set_permissions(&d.0, std::fs::Permissions::from_mode(0o777)).unwrap();
    let p = d.file();
    let attempt = |p: &Path| -> Result<(), String> {
        let c = RegionConfig {
            group: Some(0),
            ..cfg(0)
        };
        match Region::open_or_create(p, &c) {
            Err(e) if e.to_string().contains("set group 0") => Ok(()),
            Err(e) => Err(format!("unexpected error: {e}")),
            Ok(_) => Err("created".into()),
        }
    };
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        attempt(&p).unwrap();
    } else {
        // Root may set any group: try as uid/gid 65534 in a child.
        // SAFETY: fork; the child only drops privileges, runs the region code and `_exit`s.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            // SAFETY: dropping privileges in the child.
            let dropped = unsafe {
                libc::setgroups(0, std::ptr::null()) == 0
                    && libc::setgid(65534) == 0
                    && libc::setuid(65534) == 0
            };
            let code = match (dropped, attempt(&p)) {
                (false, _) => 3,
                (true, Ok(())) => 0,
                (true, Err(_)) => 4,
            };
            // SAFETY: child exit.
            unsafe { libc::_exit(code) };
        }
        let mut st = 0;
        // SAFETY: waiting for our child.
        unsafe { libc::waitpid(pid, &mut st, 0) };
        assert!(libc::WIFEXITED(st));
        assert_eq!(
            libc::WEXITSTATUS(st),
            0,
            "child status (3: setuid failed, 4: other result)"
        );
    }
    assert!(!p.exists(), "the region must not appear");
    assert_eq!(leftovers(&d), Vec::<String>::new());
}

#[test]
fn concurrent_creators_share_one_region_and_leave_no_temporaries() {
    let d = TempDir::new("race");
    let p = d.file();
    let created = AtomicUsize::new(0);
    std::thread::scope(|s| {
        for _ in 0..8 {
            s.spawn(|| {
                let (r, out) = Region::open_or_create(&p, &cfg(MIB)).unwrap();
                if out == OpenOutcome::Created {
                    created.fetch_add(1, Ordering::Relaxed);
                }
                assert_eq!(r.limit(0), MIB);
            });
        }
    });
    assert_eq!(created.load(Ordering::Relaxed), 1);
    assert_eq!(leftovers(&d), Vec::<String>::new());
}

/// An existing file is opened without `O_CREAT`, so a region owned by another user in a
/// sticky directory is usable under `fs.protected_regular` (which refuses `O_CREAT` there),
/// and its owner's permissions are never changed by a later opener.
#[test]
fn an_existing_region_keeps_its_mode() {
    let d = TempDir::new("keep");
    let p = d.file();
    let c = RegionConfig {
        mode: 0o640,
        ..cfg(MIB)
    };
    drop(Region::open_or_create(&p, &c).unwrap());
    let (_r, out) = Region::open_or_create(&p, &cfg(MIB)).unwrap();
    assert!(matches!(out, OpenOutcome::Existing { .. }));
    let md = std::fs::metadata(&p).unwrap();
    assert_eq!(md.permissions().mode() & 0o7777, 0o640);
}

#[test]
fn bad_magic_is_rejected_and_named() {
    let d = TempDir::new("magic");
    let p = d.file();
    std::fs::write(&p, vec![0xabu8; REGION_SIZE]).unwrap();
    let err = Region::open_or_create(&p, &cfg(0)).unwrap_err();
    assert!(matches!(err, RegionError::BadMagic { found, .. } if found == [0xab; 8]));
    let msg = err.to_string();
    assert!(msg.contains(p.to_str().unwrap()), "{msg}");
    assert!(msg.contains("bad magic"), "{msg}");
    assert!(matches!(
        Region::open_existing(&p, false).unwrap_err(),
        RegionError::BadMagic { .. }
    ));
    // The file is left untouched.
    assert!(std::fs::read(&p).unwrap().iter().all(|&b| b == 0xab));
}

#[test]
fn other_version_is_rejected() {
    let d = TempDir::new("version");
    let p = d.file();
    drop(create(&p, 0));
    patch(&p, 8, &1u32.to_le_bytes());
    let err = Region::open_or_create(&p, &cfg(0)).unwrap_err();
    assert!(
        matches!(
            err,
            RegionError::VersionMismatch {
                found: 1,
                expected: crate::layout::VERSION,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("version 4"), "{err}");
    assert!(matches!(
        Region::open_existing(&p, false).unwrap_err(),
        RegionError::VersionMismatch { .. }
    ));
}

#[test]
fn truncated_and_oversized_files_are_rejected() {
    let d = TempDir::new("trunc");
    let p = d.file();
    drop(create(&p, 0));
    let f = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
    f.set_len(REGION_SIZE as u64 / 2).unwrap();
    let err = Region::open_or_create(&p, &cfg(0)).unwrap_err();
    assert!(
        matches!(err, RegionError::Truncated { found, expected, .. }
            if found == REGION_SIZE as u64 / 2 && expected == REGION_SIZE as u64),
        "{err:?}"
    );
    // Shorter than the header.
    f.set_len(100).unwrap();
    assert!(matches!(
        Region::open_existing(&p, false).unwrap_err(),
        RegionError::Truncated { found: 100, .. }
    ));
    // Shorter than the magic.
    f.set_len(5).unwrap();
    assert!(matches!(
        Region::open_or_create(&p, &cfg(0)).unwrap_err(),
        RegionError::Truncated { found: 5, .. }
    ));
    // Longer than a region.
    drop(f);
    std::fs::remove_file(&p).unwrap();
    drop(create(&p, 0));
    let f = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
    f.set_len(REGION_SIZE as u64 + 4096).unwrap();
    let err = Region::open_or_create(&p, &cfg(0)).unwrap_err();
    assert!(
        matches!(
            err,
            RegionError::SizeMismatch {
                what: "file size",
                ..
            }
        ),
        "{err:?}"
    );
}

#[test]
fn header_size_fields_are_checked() {
    let d = TempDir::new("hdrsize");
    let p = d.file();
    drop(create(&p, 0));
    patch(&p, 12, &1000u32.to_le_bytes());
    let err = Region::open_or_create(&p, &cfg(0)).unwrap_err();
    assert!(
        matches!(
            err,
            RegionError::SizeMismatch {
                what: "header_size field",
                found: 1000,
                ..
            }
        ),
        "{err:?}"
    );
    patch(&p, 12, &1024u32.to_le_bytes());
    patch(&p, 16, &12345u64.to_le_bytes());
    let err = Region::open_existing(&p, false).unwrap_err();
    assert!(
        matches!(
            err,
            RegionError::SizeMismatch {
                what: "total_size field",
                found: 12345,
                ..
            }
        ),
        "{err:?}"
    );
}

#[test]
fn empty_or_abandoned_files_are_initialised_by_the_next_creator() {
    let d = TempDir::new("empty");
    let p = d.file();
    // Size 0: a creator died before sizing it.
    std::fs::write(&p, b"").unwrap();
    assert!(matches!(
        Region::open_existing(&p, false).unwrap_err(),
        RegionError::NotInitialised { .. }
    ));
    let (r, out) = Region::open_or_create(&p, &cfg(MIB)).unwrap();
    assert_eq!(out, OpenOutcome::Created);
    assert_eq!(r.limit(0), MIB);
    drop(r);

    // Sized but all zero: died before writing the header.
    std::fs::write(&p, vec![0u8; REGION_SIZE]).unwrap();
    let (r, out) = Region::open_or_create(&p, &cfg(2 * MIB)).unwrap();
    assert_eq!(out, OpenOutcome::Created);
    assert_eq!(r.limit(0), 2 * MIB);
    drop(r);

    // Header written but never published as READY.
    patch(&p, 24, &0u32.to_le_bytes());
    assert!(matches!(
        Region::open_existing(&p, true).unwrap_err(),
        RegionError::NotInitialised { .. }
    ));
    let (r, out) = Region::open_or_create(&p, &cfg(3 * MIB)).unwrap();
    assert_eq!(out, OpenOutcome::Created);
    assert_eq!(r.limit(0), 3 * MIB);
    let me = ProcessId::current();
    let s = r.register(me).unwrap();
    r.try_charge(s, 0, UsageKind::Data, MIB).unwrap();
    assert_eq!(r.used(0), MIB);
}

#[test]
fn region_from_another_boot_is_reinitialised() {
    let d = TempDir::new("boot");
    let p = d.file();
    let r = create(&p, 4 * MIB);
    let s = r.register(fake(77, 1)).unwrap();
    r.try_charge(s, 0, UsageKind::Data, MIB).unwrap();
    drop(r);
    if current_boot_id() == [0; 16] {
        panic!("/proc/sys/kernel/random/boot_id unreadable: cannot test boot detection");
    }
    patch(&p, 712, &[0x5a; 16]);
    let (r, out) = Region::open_or_create(&p, &cfg(4 * MIB)).unwrap();
    assert_eq!(out, OpenOutcome::Created);
    let snap = r.snapshot();
    assert!(snap.slots.is_empty());
    assert_eq!(snap.used[0], 0);
    assert_eq!(snap.boot_id, current_boot_id());
}

#[test]
fn missing_directory_is_an_io_error_naming_the_path() {
    let d = TempDir::new("nodir");
    let p = d.0.join("no/such/dir/region");
    let err = Region::open_or_create(&p, &cfg(0)).unwrap_err();
    assert!(matches!(err, RegionError::Io { .. }), "{err:?}");
    assert!(err.to_string().contains("no/such/dir"), "{err}");
    let err = Region::open_existing(&p, false).unwrap_err();
    assert!(matches!(err, RegionError::Io { .. }), "{err:?}");
}

/// Root ignores file modes, so an immutable file (`chattr +i`) stands in for a region that
/// cannot be written.
#[test]
fn immutable_file_is_reported_read_only() {
    const FS_IOC_GETFLAGS: libc::c_ulong = 0x8008_6601;
    const FS_IOC_SETFLAGS: libc::c_ulong = 0x4008_6602;
    const FS_IMMUTABLE_FL: libc::c_long = 0x10;
    let d = TempDir::new("immutable");
    let p = d.file();
    drop(create(&p, MIB));
    let set_immutable = |on: bool| {
        let f = std::fs::File::open(&p).unwrap();
        use std::os::fd::AsRawFd;
        let mut flags: libc::c_long = 0;
        // SAFETY: ioctl on an open fd with a valid out pointer.
        let rc = unsafe { libc::ioctl(f.as_raw_fd(), FS_IOC_GETFLAGS, &mut flags) };
        assert_eq!(rc, 0, "FS_IOC_GETFLAGS: {}", io::Error::last_os_error());
        if on {
            flags |= FS_IMMUTABLE_FL;
        } else {
            flags &= !FS_IMMUTABLE_FL;
        }
        // SAFETY: as above.
        let rc = unsafe { libc::ioctl(f.as_raw_fd(), FS_IOC_SETFLAGS, &flags) };
        assert_eq!(rc, 0, "FS_IOC_SETFLAGS: {}", io::Error::last_os_error());
    };
    set_immutable(true);
    let res = Region::open_or_create(&p, &cfg(MIB));
    let res2 = Region::open_existing(&p, true);
    let ro = Region::open_existing(&p, false);
    set_immutable(false);
    let err = res.unwrap_err();
    assert!(matches!(err, RegionError::ReadOnly { .. }), "{err:?}");
    assert!(err.to_string().contains("not writable"), "{err}");
    assert!(err.to_string().contains(p.to_str().unwrap()), "{err}");
    assert!(matches!(res2.unwrap_err(), RegionError::ReadOnly { .. }));
    // Read-only access still works.
    assert_eq!(ro.unwrap().snapshot().limits[0], MIB);
}

#[test]
fn read_only_mapping_refuses_every_write() {
    let d = TempDir::new("romap");
    let p = d.file();
    let rw = create(&p, 4 * MIB);
    let s = rw.register(fake(10, 1)).unwrap();
    rw.try_charge(s, 0, UsageKind::Data, MIB).unwrap();
    let ro = Region::open_existing(&p, false).unwrap();
    assert!(!ro.is_writable());
    assert!(matches!(
        ro.register(fake(11, 1)).unwrap_err(),
        RegionError::ReadOnly { .. }
    ));
    let denied = ro.try_charge(s, 0, UsageKind::Data, 1).unwrap_err();
    assert_eq!(denied.reason, DenyReason::ReadOnly);
    assert_eq!(ro.uncharge(s, 0, UsageKind::Data, MIB), 0);
    ro.force_charge(s, 0, UsageKind::Data, MIB);
    ro.unregister(s);
    ro.set_uuid(0, [1; 16]);
    assert!(ro.reclaim_dead().is_empty());
    assert!(ro.reclaim_slot_if(s, fake(10, 1)).is_none());
    let snap = ro.snapshot();
    assert!(snap.consistent);
    assert_eq!(snap.used[0], MIB);
    assert_eq!(snap.slots.len(), 1);
    assert_eq!(snap.slots[0].process(), fake(10, 1));
    assert_eq!(ro.used(0), MIB);
    assert_eq!(ro.uuid(0), [0; 16]);
}

// ---------------------------------------------------------------- admission

#[test]
fn admission_is_exact_and_uncharge_never_wraps() {
    let d = TempDir::new("exact");
    let p = d.file();
    let mut c = cfg(10 * MIB);
    c.limits[1] = 0; // unlimited
    c.limit_flags[2] = LIMIT_FLAG_INVALID;
    let (r, _) = Region::open_or_create(&p, &c).unwrap();
    let s = r.register(fake(100, 5)).unwrap();
    r.try_charge(s, 0, UsageKind::Data, 4 * MIB).unwrap();
    r.try_charge(s, 0, UsageKind::Data, 4 * MIB).unwrap();
    let den = r.try_charge(s, 0, UsageKind::Data, 4 * MIB).unwrap_err();
    assert_eq!(
        den,
        Denied {
            reason: DenyReason::OverLimit,
            dev: 0,
            limit: 10 * MIB,
            used: 8 * MIB,
            requested: 4 * MIB
        }
    );
    assert!(den.to_string().contains("over the limit"));
    // Exactly up to the limit is allowed, one byte more is not.
    r.try_charge(s, 0, UsageKind::Data, 2 * MIB).unwrap();
    assert_eq!(r.used(0), 10 * MIB);
    assert_eq!(
        r.try_charge(s, 0, UsageKind::Data, 1).unwrap_err().reason,
        DenyReason::OverLimit
    );
    r.try_charge(s, 0, UsageKind::Data, 0).unwrap();
    // Overflow is refused, not wrapped.
    r.try_charge(s, 1, UsageKind::Data, u64::MAX).unwrap();
    assert_eq!(
        r.try_charge(s, 1, UsageKind::Data, 1).unwrap_err().reason,
        DenyReason::OverLimit
    );
    assert_eq!(r.uncharge(s, 1, UsageKind::Data, u64::MAX), u64::MAX);
    // Unlimited device.
    r.try_charge(s, 1, UsageKind::Data, 1 << 40).unwrap();
    // Invalid configuration: fail closed.
    assert_eq!(
        r.try_charge(s, 2, UsageKind::Data, 1).unwrap_err().reason,
        DenyReason::ConfigInvalid
    );
    assert_eq!(
        r.try_charge(s, MAX_DEVICES, UsageKind::Data, 1)
            .unwrap_err()
            .reason,
        DenyReason::BadDevice
    );
    // Contexts are counted past the limit.
    r.force_charge(s, 0, UsageKind::Context, 3 * MIB);
    assert_eq!(r.used(0), 13 * MIB);
    assert_eq!(r.slot_usage(s, 0, UsageKind::Context), 3 * MIB);
    // Uncharge saturates at the slot's own usage of that kind.
    assert_eq!(r.uncharge(s, 0, UsageKind::Context, 5 * MIB), 3 * MIB);
    assert_eq!(r.uncharge(s, 0, UsageKind::Module, MIB), 0);
    assert_eq!(r.uncharge(s, 0, UsageKind::Data, 100 * MIB), 10 * MIB);
    assert_eq!(r.uncharge(s, 0, UsageKind::Data, 1), 0);
    assert_eq!(r.used(0), 0);
    // Another slot's uncharge cannot take this slot's usage.
    let s2 = r.register(fake(101, 5)).unwrap();
    r.try_charge(s, 0, UsageKind::Data, MIB).unwrap();
    assert_eq!(r.uncharge(s2, 0, UsageKind::Data, MIB), 0);
    assert_eq!(r.used(0), MIB);
    let snap = r.snapshot();
    assert_eq!(snap.accounted(0), MIB);
    assert_eq!(snap.device_used(0), MIB);
    assert_eq!(snap.slot_total(s.index()), MIB + (1 << 40));
    assert_eq!(snap.limit(1), None);
    assert_eq!(snap.limit(0), Some(10 * MIB));
    assert!(snap.config_invalid(2));
    r.unregister(s);
    r.unregister(s2);
    assert_eq!(r.used(0), 0);
    assert_eq!(r.used(1), 0);
}

#[test]
fn exact_under_threads() {
    exact_under_threads_with(Tuning::default(), "threads");
}

#[test]
fn exact_under_threads_with_reserves() {
    exact_under_threads_with(reserves(), "threads-rsv");
}

fn exact_under_threads_with(tuning: Tuning, dir: &str) {
    let d = TempDir::new(dir);
    let p = d.file();
    let limit = 64 * MIB;
    let r = Arc::new(create(&p, limit).with_tuning(tuning));
    let threads: Vec<_> = (0..8u32)
        .map(|t| {
            let r = Arc::clone(&r);
            std::thread::spawn(move || {
                let s = r.register(fake(1000 + t, 1)).unwrap();
                let mut held: Vec<u64> = Vec::new();
                let mut x = 0x9e37_79b9u64 ^ t as u64;
                for _ in 0..20_000 {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    if x % 3 != 0 || held.is_empty() {
                        let sz = (x >> 8) % (4 * MIB) + 1;
                        if r.try_charge(s, 0, UsageKind::Data, sz).is_ok() {
                            held.push(sz);
                        }
                        assert!(r.used(0) <= limit);
                    } else {
                        let sz = held.swap_remove((x as usize >> 3) % held.len());
                        assert_eq!(r.uncharge(s, 0, UsageKind::Data, sz), sz);
                    }
                }
                let total: u64 = held.iter().sum();
                assert_eq!(r.slot_usage(s, 0, UsageKind::Data), total);
                (s, total)
            })
        })
        .collect();
    let results: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    let snap = r.snapshot();
    let total: u64 = results.iter().map(|(_, t)| t).sum();
    assert!(total <= limit);
    assert_eq!(snap.used[0], snap.charged(0));
    assert_eq!(snap.used[0], total + snap.reserved(0));
    assert_eq!(sum_slots(&snap, 0), total);
    assert_eq!(r.used(0), total);
    for (s, _) in &results {
        r.settle(*s);
    }
    assert_eq!(r.admitted(0), total, "settled: no reserve left");
    for (s, _) in results {
        r.unregister(s);
    }
    assert_eq!(r.used(0), 0);
}

#[test]
fn exact_under_four_forked_processes_racing_to_fill_one_limit() {
    exact_under_four_forked_processes_racing_to_fill_one_limit_with(Tuning::default(), "race4");
}

#[test]
fn exact_under_four_forked_processes_racing_to_fill_one_limit_with_reserves() {
    exact_under_four_forked_processes_racing_to_fill_one_limit_with(reserves(), "race4-rsv");
}

fn exact_under_four_forked_processes_racing_to_fill_one_limit_with(tuning: Tuning, dir: &str) {
    let d = TempDir::new(dir);
    let p = d.file();
    let limit = 256 * MIB;
    let chunk = MIB;
    let r = create(&p, limit);
    let (res_r, res_w) = pipe();
    let (go_r, go_w) = pipe();
    let mut kids = Vec::new();
    for _ in 0..4 {
        let path = p.clone();
        kids.push(fork_child(move || {
            // Each child opens the region itself, as a separate process would.
            let Ok((r, _)) = Region::open_or_create(&path, &cfg(limit)) else {
                return 2;
            };
            let r = r.with_tuning(tuning);
            let Ok(s) = r.register(ProcessId::current()) else {
                return 3;
            };
            let mut granted = 0u64;
            let mut oks = 0u64;
            let mut denials = 0;
            // Charge, and now and then release and re-charge, until refused 50 times.
            while denials < 50 {
                match r.try_charge(s, 0, UsageKind::Data, chunk) {
                    Ok(()) => {
                        granted += chunk;
                        oks += 1;
                        if oks % 16 == 0 {
                            granted -= r.uncharge(s, 0, UsageKind::Data, chunk);
                        }
                    }
                    Err(d) if d.reason == DenyReason::OverLimit => denials += 1,
                    Err(_) => return 4,
                }
                if r.used(0) > limit {
                    return 5;
                }
            }
            close(res_r);
            close(go_w);
            write_u64(res_w, granted);
            // Hold until the parent has checked, then release at exit.
            if read_u64(go_r).is_none() {
                return 6;
            }
            r.unregister(s);
            0
        }));
    }
    close(res_w);
    let mut total = 0;
    for _ in 0..4 {
        total += read_u64(res_r).expect("a child failed before reporting");
    }
    let snap = r.snapshot();
    assert!(total <= limit, "granted {total} > limit {limit}");
    assert_eq!(
        total, limit,
        "the limit is a multiple of the chunk: it must fill exactly"
    );
    assert_eq!(snap.used[0], total);
    assert_eq!(snap.accounted(0), total);
    assert_eq!(snap.slots.len(), 4);
    for _ in 0..4 {
        write_u64(go_w, 1);
    }
    close(go_w);
    for k in kids {
        let st = wait_timeout(k, Duration::from_secs(30)).expect("child hung");
        assert_eq!(exit_code(st), 0);
    }
    close(res_r);
    close(go_r);
    let snap = r.snapshot();
    assert_eq!(snap.used[0], 0);
    assert!(snap.slots.is_empty());
}

// ---------------------------------------------------------------- crashes

#[test]
fn sigkill_while_holding_the_lock_is_recovered_exactly() {
    let d = TempDir::new("ownerdied");
    let p = d.file();
    let r = create(&p, 100 * MIB);
    // A live process (this one, real identity so that the default /proc probe sees it alive)
    // holds 10 MiB on device 0 and 1 MiB of context on device 1.
    let me = ProcessId::current();
    let mine = r.register(me).unwrap();
    r.try_charge(mine, 0, UsageKind::Data, 10 * MIB).unwrap();
    r.force_charge(mine, 1, UsageKind::Context, MIB);
    let (rd, wr) = pipe();
    let path = p.clone();
    let kid = fork_child(move || {
        let Ok(r) = Region::open_existing(&path, true) else {
            return 2;
        };
        let Ok(s) = r.register(ProcessId::current()) else {
            return 3;
        };
        if r.try_charge(s, 0, UsageKind::Data, 20 * MIB).is_err() {
            return 4;
        }
        write_u64(wr, s.index() as u64);
        // Dies with the lock held, in the middle of an update.
        r.__test_die_holding_lock(s, 0, 5 * MIB)
    });
    close(wr);
    let kid_slot = read_u64(rd).unwrap() as usize;
    close(rd);
    let st = wait_timeout(kid, Duration::from_secs(10)).expect("child hung");
    assert_eq!(exit_code(st), -libc::SIGKILL);
    // The lock is held by a dead thread; the next locker recovers.
    let before = r.__test_recoveries();
    assert!(r.is_registered(mine));
    r.try_charge(mine, 0, UsageKind::Data, MIB).unwrap();
    assert_eq!(r.__test_recoveries(), before + 1);
    let snap = r.snapshot();
    assert!(snap.consistent);
    assert!(
        snap.slot(kid_slot).is_none(),
        "dead holder's slot not reclaimed"
    );
    assert_eq!(snap.used[0], 11 * MIB);
    assert_eq!(snap.used[1], MIB);
    assert_eq!(snap.accounted(0), 11 * MIB);
    assert_eq!(snap.reclaimed_slots, 1);
    assert_eq!(snap.owner_died_recoveries, 1);
    assert_eq!(snap.generation & 1, 0);
    // And the lock works normally afterwards.
    r.unregister(mine);
    assert_eq!(r.used(0), 0);
    assert_eq!(r.used(1), 0);
}

#[test]
fn processes_sigkilled_in_a_loop_never_block_others_and_are_reclaimed() {
    processes_sigkilled_in_a_loop_never_block_others_and_are_reclaimed_with(
        Tuning::default(),
        "killloop",
    );
}

#[test]
fn processes_sigkilled_in_a_loop_never_block_others_and_are_reclaimed_with_reserves() {
    processes_sigkilled_in_a_loop_never_block_others_and_are_reclaimed_with(
        reserves(),
        "killloop-rsv",
    );
}

fn processes_sigkilled_in_a_loop_never_block_others_and_are_reclaimed_with(
    tuning: Tuning,
    dir: &str,
) {
    let d = TempDir::new(dir);
    let p = d.file();
    let limit = 64 * MIB;
    let r = create(&p, limit).with_tuning(tuning);
    let deadline_ms = 3000u64;
    // Two workers charge and release continuously and must finish on time.
    let mut workers = Vec::new();
    for w in 0..2 {
        let path = p.clone();
        workers.push(fork_child(move || {
            let Ok(r) = Region::open_existing(&path, true) else {
                return 2;
            };
            let r = r.with_tuning(tuning);
            let Ok(s) = r.register(ProcessId::current()) else {
                return 3;
            };
            let start = Instant::now();
            let mut held = 0u64;
            let mut i = 0u64;
            while start.elapsed() < Duration::from_millis(deadline_ms) {
                i += 1;
                let sz = ((i * 7919 + w) % 64 + 1) * 4096;
                if i % 3 == 0 {
                    held -= r.uncharge(s, 0, UsageKind::Data, sz);
                } else if r.try_charge(s, 0, UsageKind::Data, sz).is_ok() {
                    held += sz;
                }
                if r.used(0) > limit || r.slot_usage(s, 0, UsageKind::Data) != held {
                    return 5;
                }
                if i % 64 == 0 && r.try_charge(s, 0, UsageKind::Data, limit).is_ok() {
                    // Only possible if everything else is free.
                    held += limit;
                    held -= r.uncharge(s, 0, UsageKind::Data, limit);
                }
            }
            r.unregister(s);
            0
        }));
    }
    // Victims: charge and release in a tight loop, killed at random moments.
    let mut victims = 0;
    let (reg_r, reg_w) = pipe();
    let started = Instant::now();
    let mut seed = 12345u64;
    while started.elapsed() < Duration::from_millis(deadline_ms - 500) {
        let path = p.clone();
        let v = fork_child(move || {
            let Ok(r) = Region::open_existing(&path, true) else {
                return 2;
            };
            let r = r.with_tuning(tuning);
            let Ok(s) = r.register(ProcessId::current()) else {
                return 3;
            };
            write_u64(reg_w, s.index() as u64);
            let mut i = 0u64;
            loop {
                i += 1;
                if i % 2 == 0 {
                    r.uncharge(s, 0, UsageKind::Data, 3 * 4096);
                } else {
                    let _ = r.try_charge(s, 0, UsageKind::Data, 5 * 4096);
                }
                if i % 7 == 0 {
                    r.force_charge(s, 1, UsageKind::Context, 4096);
                }
            }
        });
        read_u64(reg_r).expect("victim failed to register");
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        std::thread::sleep(Duration::from_micros(200 + (seed >> 33) % 3000));
        // SAFETY: kills our own child.
        unsafe { libc::kill(v, libc::SIGKILL) };
        let st = wait_timeout(v, Duration::from_secs(10)).expect("victim did not die");
        assert_eq!(exit_code(st), -libc::SIGKILL);
        victims += 1;
        // This process must never block either.
        let t = Instant::now();
        let _ = r.snapshot();
        let s = r.register(ProcessId::current()).unwrap();
        r.unregister(s);
        assert!(t.elapsed() < Duration::from_secs(5));
    }
    close(reg_r);
    close(reg_w);
    for w in workers {
        let st = wait_timeout(w, Duration::from_secs(30)).expect("worker hung");
        assert_eq!(exit_code(st), 0, "worker saw an inconsistency");
    }
    // Every victim is reaped: whatever recovery did not already free, reclaim frees now.
    let freed = r.reclaim_dead();
    let snap = r.snapshot();
    assert!(snap.slots.is_empty(), "{:?}", snap.slots);
    assert_eq!(snap.used, [0; MAX_DEVICES]);
    assert_eq!(
        snap.reclaimed_slots,
        victims,
        "each victim's slot reclaimed exactly once ({} by the final sweep, {} recoveries)",
        freed.len(),
        snap.owner_died_recoveries
    );
    eprintln!(
        "kill loop: {victims} victims, {} owner-died recoveries, {} slots freed by the final sweep",
        snap.owner_died_recoveries,
        freed.len()
    );
    assert!(victims >= 5);
}

// ---------------------------------------------------------------- slots and reclaim

#[test]
fn register_reuses_and_pid_reuse_is_a_different_process() {
    let d = TempDir::new("pidreuse");
    let p = d.file();
    let r = create(&p, 10 * MIB);
    let old = fake(4242, 1000);
    let s = r.register(old).unwrap();
    assert_eq!(r.register(old).unwrap(), s);
    r.try_charge(s, 0, UsageKind::Data, 6 * MIB).unwrap();
    // Same pid, another start time: the old process is gone; its usage is freed.
    let new = fake(4242, 2000);
    let s2 = r.register(new).unwrap();
    assert_ne!(s2, s);
    assert!(!r.is_registered(s));
    assert!(r.is_registered(s2));
    assert_eq!(r.used(0), 0);
    assert_eq!(r.slot_usage(s2, 0, UsageKind::Data), 0);
    r.try_charge(s2, 0, UsageKind::Data, 10 * MIB).unwrap();
    // The stale SlotId can no longer touch the slot.
    assert_eq!(
        r.try_charge(s, 0, UsageKind::Data, 1).unwrap_err().reason,
        DenyReason::SlotLost
    );
    assert_eq!(r.uncharge(s, 0, UsageKind::Data, MIB), 0);
    r.unregister(s);
    assert_eq!(r.used(0), 10 * MIB);
    let snap = r.snapshot();
    assert_eq!(snap.reclaimed_slots, 1);
    assert_eq!(snap.slots.len(), 1);
    assert_eq!(snap.slots[0].process(), new);
    assert_eq!(snap.slots_of_pid(4242).count(), 1);
}

#[test]
fn full_region_reclaims_dead_slots_before_giving_up() {
    let d = TempDir::new("full");
    let p = d.file();
    let probe = Arc::new(FakeProbe::default());
    let r = create(&p, 0).with_probe(probe.clone());
    let mut slots = Vec::new();
    for i in 0..MAX_SLOTS as u32 {
        let who = fake(10_000 + i, 7);
        probe.set_alive(who, true);
        let s = r.register(who).unwrap();
        r.force_charge(s, 0, UsageKind::Data, 1);
        slots.push(s);
    }
    assert_eq!(r.used(0), MAX_SLOTS as u64);
    let extra = fake(99_999, 7);
    probe.set_alive(extra, true);
    let err = r.register(extra).unwrap_err();
    assert!(matches!(err, RegionError::Full { .. }), "{err:?}");
    assert!(err.to_string().contains("1024"));
    probe.set_alive(fake(10_500, 7), false);
    let s = r.register(extra).unwrap();
    assert_eq!(s.index(), 500);
    assert_eq!(r.used(0), MAX_SLOTS as u64 - 1);
}

#[test]
fn reclaim_dead_and_reclaim_slot_if() {
    let d = TempDir::new("reclaim");
    let p = d.file();
    let probe = Arc::new(FakeProbe::default());
    let r = create(&p, 0).with_probe(probe.clone());
    let a = fake(1, 1);
    let b = fake(2, 1);
    let c = fake(3, 1);
    for w in [a, b, c] {
        probe.set_alive(w, true);
    }
    let sa = r.register(a).unwrap();
    let sb = r.register(b).unwrap();
    let sc = r.register(c).unwrap();
    r.try_charge(sa, 0, UsageKind::Data, 100).unwrap();
    r.force_charge(sa, 1, UsageKind::Context, 7);
    r.try_charge(sb, 0, UsageKind::Data, 200).unwrap();
    r.try_charge(sc, 3, UsageKind::Module, 300).unwrap();
    assert!(r.reclaim_dead().is_empty());
    probe.set_alive(a, false);
    let freed = r.reclaim_dead();
    assert_eq!(freed.len(), 1);
    assert_eq!(freed[0].index, sa.index());
    assert_eq!((freed[0].pid, freed[0].start_time), (1, 1));
    assert_eq!(freed[0].usage[0][UsageKind::Data.index()], 100);
    assert_eq!(freed[0].usage[1][UsageKind::Context.index()], 7);
    assert_eq!(freed[0].total(), 107);
    assert_eq!(r.used(0), 200);
    assert_eq!(r.used(1), 0);
    // The agent's reclaim only frees a slot that still holds the expected process.
    assert!(r.reclaim_slot_if(sb, fake(2, 999)).is_none());
    assert!(r.reclaim_slot_if(sa, a).is_none());
    let got = r
        .reclaim_slot_if(SlotId::new(sb.index(), fake(0, 0)), b)
        .unwrap();
    assert_eq!(got.total(), 200);
    assert_eq!(r.used(0), 0);
    assert!(r.is_registered(sc));
    assert_eq!(r.used(3), 300);
    assert!(r
        .reclaim_slot_if(SlotId::new(MAX_SLOTS + 5, c), c)
        .is_none());
    let snap = r.snapshot();
    assert_eq!(snap.reclaimed_slots, 2);
    assert_eq!(snap.slots.len(), 1);
}

#[test]
fn forked_child_gets_its_own_slot() {
    let d = TempDir::new("fork");
    let p = d.file();
    let r = create(&p, 10 * MIB);
    let parent = r.register(ProcessId::current()).unwrap();
    r.try_charge(parent, 0, UsageKind::Data, 3 * MIB).unwrap();
    let (rd, wr) = pipe();
    let r_ref = &r;
    let kid = fork_child(move || {
        // The child uses the inherited mapping.
        let me = ProcessId::current();
        let Ok(s) = r_ref.register(me) else { return 2 };
        if s == parent || r_ref.slot_usage(s, 0, UsageKind::Data) != 0 {
            return 3;
        }
        if r_ref.try_charge(s, 0, UsageKind::Data, 7 * MIB).is_err() {
            return 4;
        }
        if r_ref.try_charge(s, 0, UsageKind::Data, 1).is_ok() {
            return 5;
        }
        write_u64(wr, r_ref.used(0));
        r_ref.unregister(s);
        0
    });
    close(wr);
    assert_eq!(read_u64(rd), Some(10 * MIB));
    close(rd);
    let st = wait_timeout(kid, Duration::from_secs(10)).unwrap();
    assert_eq!(exit_code(st), 0);
    assert_eq!(r.used(0), 3 * MIB);
    assert_eq!(r.slot_usage(parent, 0, UsageKind::Data), 3 * MIB);
}

#[test]
fn uuids_round_trip() {
    let d = TempDir::new("uuid");
    let p = d.file();
    let r = create(&p, 0);
    let u: [u8; 16] = core::array::from_fn(|i| i as u8 * 17);
    r.set_uuid(3, u);
    r.set_uuid(MAX_DEVICES, u);
    assert_eq!(r.uuid(3), u);
    let ro = Region::open_existing(&p, false).unwrap();
    assert_eq!(ro.snapshot().uuids[3], u);
    assert_eq!(ro.snapshot().uuids[2], [0; 16]);
    // The bytes on disk are the raw UUID bytes at the documented offset.
    let raw = std::fs::read(&p).unwrap();
    assert_eq!(&raw[328 + 3 * 16..328 + 4 * 16], &u);
}

// ---------------------------------------------------------------- process identity

#[test]
fn parse_stat_handles_hostile_comm() {
    let line =
        b"1234 (a) b) (c d) S 1 1234 1234 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 3 0 987654 1000 10\n";
    let st = parse_stat(line).unwrap();
    assert_eq!(st.state, b'S');
    assert_eq!(st.num_threads, 3);
    assert_eq!(st.start_time, 987654);
    assert!(parse_stat(b"1234 (x) S 1 2").is_none());
    assert!(parse_stat(b"no paren at all").is_none());
    let mut buf = [0u8; 32];
    assert_eq!(proc_stat_path(0, &mut buf), b"/proc/0/stat\0");
    assert_eq!(proc_stat_path(4194304, &mut buf), b"/proc/4194304/stat\0");
    let mut long = [0u8; 48];
    assert_eq!(
        self_task_stat_path(4194304, &mut long),
        b"/proc/self/task/4194304/stat\0"
    );
}

#[test]
fn process_identity_and_liveness() {
    let me = ProcessId::current();
    assert_eq!(me.pid, std::process::id());
    assert_ne!(me.start_time, 0);
    assert_eq!(ProcessId::of(me.pid), Some(me));
    assert!(is_alive(&me));
    // Same pid, other start time: not the same process.
    assert!(!is_alive(&fake(me.pid, me.start_time + 1)));
    assert_eq!(ProcProbe.liveness(fake(0, 0)), Liveness::Dead);

    // A zombie (exited, not yet reaped) is dead: its memory is gone.
    let kid = fork_child(|| 0);
    let kid_id = loop {
        if let Some(id) = ProcessId::of(kid as u32) {
            break id;
        }
    };
    let t = Instant::now();
    while ProcProbe.liveness(kid_id) != Liveness::Dead {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "child never became a zombie"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    wait_timeout(kid, Duration::from_secs(10)).unwrap();
    // Reaped: no such process.
    assert_eq!(ProcProbe.liveness(kid_id), Liveness::Dead);
    assert!(ProcessId::of(kid as u32).is_none());
}

#[test]
fn read_snapshot_copies_what_the_mapping_shows() {
    let d = TempDir::new("pread");
    let r = create(&d.file(), 1 << 30);
    let s = r.register(fake(41, 7)).unwrap();
    r.try_charge(s, 1, UsageKind::Data, 5 * MIB).unwrap();
    r.set_uuid(1, [9; 16]);
    r.set_device_count(2);
    let f = std::fs::File::open(d.file()).unwrap();
    let copy = read_snapshot(&f, &d.file()).unwrap();
    assert!(copy.consistent);
    assert_eq!(copy, r.snapshot());
    assert_eq!(copy.slots[0].usage[1][UsageKind::Data.index()], 5 * MIB);
}

#[test]
fn snapshots_copy_the_compute_records() {
    use crate::layout::DeviceCompute as C;
    let d = TempDir::new("pread-compute");
    let r = create(&d.file(), 1 << 30);
    r.register(fake(41, 7)).unwrap();
    // What the launch gate keeps for device 2, written into the file.
    let base = (offset_of!(crate::layout::Region, compute) + 2 * size_of::<C>()) as u64;
    patch(
        &d.file(),
        base + offset_of!(C, sm_limit) as u64,
        &30u32.to_le_bytes(),
    );
    patch(
        &d.file(),
        base + offset_of!(C, policy) as u64,
        &1u32.to_le_bytes(),
    );
    patch(
        &d.file(),
        base + offset_of!(C, budget_ns) as u64,
        &(-5i64).to_le_bytes(),
    );
    patch(
        &d.file(),
        base + offset_of!(C, consumed_ns) as u64,
        &7_000_000_000u64.to_le_bytes(),
    );
    patch(
        &d.file(),
        base + offset_of!(C, throttled) as u64,
        &12u64.to_le_bytes(),
    );
    patch(
        &d.file(),
        base + offset_of!(C, throttled_ns) as u64,
        &1_500_000_000u64.to_le_bytes(),
    );
    patch(
        &d.file(),
        base + offset_of!(C, refusals) as u64,
        &9u64.to_le_bytes(),
    );
    let f = std::fs::File::open(d.file()).unwrap();
    let copy = read_snapshot(&f, &d.file()).unwrap();
    assert_eq!(copy, r.snapshot(), "the pread copy and the mapping's agree");
    let c = copy.compute[2];
    assert_eq!(
        (
            c.sm_limit,
            c.policy,
            c.budget_ns,
            c.consumed_ns,
            c.throttled,
            c.throttled_ns
        ),
        (30, 1, -5, 7_000_000_000, 12, 1_500_000_000)
    );
    assert_eq!(c.refusals, 9, "the refusal counter is copied");
    assert_eq!(r.refusals(2), 9);
    assert_eq!(c.limit_percent(), Some(30));
    assert_eq!(copy.compute[0], ComputeSnapshot::default());
    assert_eq!(copy.compute[0].limit_percent(), None, "0: no compute limit");
    let whole = ComputeSnapshot { sm_limit: 100, ..c };
    assert_eq!(whole.limit_percent(), None, "100: the whole device");
    let disabled = ComputeSnapshot {
        policy: crate::layout::COMPUTE_POLICY_DISABLE,
        ..c
    };
    assert_eq!(disabled.limit_percent(), None, "policy disable: no limit");
    let corrupt = ComputeSnapshot { sm_limit: 250, ..c };
    assert_eq!(corrupt.limit_percent(), None, "out of range");
}

#[test]
fn the_creator_maps_the_region_by_its_own_name() {
    let d = TempDir::new("mapsname");
    let r = create(&d.file(), 1 << 30);
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    let want = d.file().display().to_string();
    let lines: Vec<&str> = maps
        .lines()
        .filter(|l| l.contains(d.0.to_str().unwrap()))
        .collect();
    assert!(
        lines.iter().any(|l| l.ends_with(&want)),
        "the mapping is not shown by the region's name: {lines:?}"
    );
    assert!(!lines.iter().any(|l| l.contains("(deleted)")), "{lines:?}");
    drop(r);
}

#[test]
fn read_snapshot_reads_the_slots_up_to_the_high_water_mark() {
    let d = TempDir::new("pread-hw");
    let r = create(&d.file(), 1 << 30);
    let slots: Vec<SlotId> = (0..5)
        .map(|i| r.register(fake(60 + i, 7)).unwrap())
        .collect();
    for s in &slots[..4] {
        r.unregister(*s);
    }
    r.try_charge(slots[4], 0, UsageKind::Data, 3 * MIB).unwrap();
    let f = std::fs::File::open(d.file()).unwrap();
    let copy = read_snapshot(&f, &d.file()).unwrap();
    assert_eq!(copy, r.snapshot());
    assert_eq!(copy.slots.len(), 1);
    assert_eq!(copy.slots[0].index, 4);
    // A corrupt mark beyond the table is clamped: the whole table is read.
    let hw = offset_of!(crate::layout::RegionHeader, slot_high_water) as u64;
    patch(&d.file(), hw, &u32::MAX.to_le_bytes());
    let copy = read_snapshot(&f, &d.file()).unwrap();
    assert_eq!(copy.slots.len(), 1);
    assert_eq!(copy.slots[0].usage[0][UsageKind::Data.index()], 3 * MIB);
}

#[test]
fn read_snapshot_of_a_truncated_file_is_an_error_not_a_signal() {
    let d = TempDir::new("pread-trunc");
    let r = create(&d.file(), 1 << 30);
    let f = std::fs::File::open(d.file()).unwrap();
    for len in [REGION_SIZE as u64 / 2, 100, 0] {
        std::fs::OpenOptions::new()
            .write(true)
            .open(d.file())
            .unwrap()
            .set_len(len)
            .unwrap();
        let e = read_snapshot(&f, &d.file()).unwrap_err();
        let msg = e.to_string();
        assert!(
            matches!(
                e,
                RegionError::Truncated { .. } | RegionError::NotInitialised { .. }
            ),
            "{len}: {msg}"
        );
        assert!(msg.contains(d.file().to_str().unwrap()), "{msg}");
    }
    drop(r);
}

#[test]
fn device_count_is_the_largest_real_count_reported() {
    let d = TempDir::new("devcount");
    let (r, _) = Region::open_or_create(&d.file(), &RegionConfig::default()).unwrap();
    assert_eq!(r.device_count(), 0, "unknown until a process reports it");
    r.set_device_count(1);
    assert_eq!(r.device_count(), 1);
    r.set_device_count(0);
    r.set_device_count(1);
    assert_eq!(r.device_count(), 1);
    r.set_device_count(2);
    assert_eq!(r.device_count(), 2);
    r.set_device_count(1);
    assert_eq!(r.device_count(), 2, "a narrower view does not shrink it");
    r.set_device_count(99);
    assert_eq!(r.device_count(), MAX_DEVICES as u32);
}

// ---------------------------------------------------------------- bounded lock, reserves

/// Waits until process `pid` is in state `T` (stopped).
fn wait_stopped(pid: libc::pid_t) {
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(10) {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        if stat
            .rsplit(')')
            .next()
            .is_some_and(|r| r.trim_start().starts_with('T'))
        {
            return;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    panic!("process {pid} did not stop");
}

#[test]
fn a_stopped_lock_holder_bounds_the_wait_and_never_blocks_releases() {
    let d = TempDir::new("stopped");
    let p = d.file();
    let limit = 64 * MIB;
    let tuning = Tuning {
        lock_timeout: Duration::from_millis(300),
        reserve: MIB,
        ..Tuning::default()
    };
    let r = create(&p, limit).with_tuning(tuning);
    let s = r.register(fake(700, 1)).unwrap();
    r.try_charge(s, 0, UsageKind::Data, 8 * MIB).unwrap();
    assert_eq!(r.snapshot().slot(s.index()).unwrap().reserve[0], MIB);
    let path = p.clone();
    let holder = fork_child(move || {
        let Ok(r) = Region::open_existing(&path, true) else {
            return 2;
        };
        if r.__test_hold_lock_while_stopped() {
            0
        } else {
            3
        }
    });
    wait_stopped(holder);
    // Within the reserve: admitted without the lock.
    let t = Instant::now();
    r.try_charge(s, 0, UsageKind::Data, MIB / 2).unwrap();
    // Releases never wait for the lock; the bytes stay admitted (in the reserve).
    assert_eq!(r.uncharge(s, 0, UsageKind::Data, 4 * MIB), 4 * MIB);
    assert!(
        t.elapsed() < Duration::from_millis(100),
        "{:?}",
        t.elapsed()
    );
    // Past the reserve: refused after the timeout, not an unbounded wait.
    let t = Instant::now();
    let den = r.try_charge(s, 0, UsageKind::Data, 16 * MIB).unwrap_err();
    let waited = t.elapsed();
    assert_eq!(den.reason, DenyReason::LockTimeout);
    assert!(den.to_string().contains("lock timeout"), "{den}");
    assert!(
        waited >= Duration::from_millis(290) && waited < Duration::from_secs(2),
        "{waited:?}"
    );
    // Context memory the driver already took is recorded now and totalled later; right
    // after a timed-out wait this thread does not wait again (one CUDA call that needs the
    // lock twice is bounded by one timeout).
    let t = Instant::now();
    r.force_charge(s, 0, UsageKind::Context, 32 * MIB);
    assert!(
        t.elapsed() < Duration::from_millis(100),
        "{:?}",
        t.elapsed()
    );
    assert_eq!(r.slot_usage(s, 0, UsageKind::Context), 32 * MIB);
    assert_eq!(
        r.try_charge(s, 0, UsageKind::Data, 16 * MIB)
            .unwrap_err()
            .reason,
        DenyReason::LockTimeout
    );
    assert!(
        t.elapsed() < Duration::from_millis(100),
        "{:?}",
        t.elapsed()
    );
    // Another thread waits its own full timeout.
    let t = Instant::now();
    std::thread::scope(|sc| {
        sc.spawn(|| {
            assert_eq!(
                r.try_charge(s, 0, UsageKind::Data, 16 * MIB)
                    .unwrap_err()
                    .reason,
                DenyReason::LockTimeout
            )
        });
    });
    assert!(
        t.elapsed() >= Duration::from_millis(290),
        "{:?}",
        t.elapsed()
    );
    // SAFETY: continues our own stopped child.
    unsafe { libc::kill(holder, libc::SIGCONT) };
    let st = wait_timeout(holder, Duration::from_secs(10)).expect("holder hung");
    assert_eq!(exit_code(st), 0);
    r.try_charge(s, 0, UsageKind::Data, MIB).unwrap();
    r.settle(s);
    let snap = r.snapshot();
    let data = 8 * MIB + MIB / 2 - 4 * MIB + MIB;
    assert_eq!(snap.accounted(0), data + 32 * MIB);
    assert_eq!(
        snap.used[0],
        data + 32 * MIB,
        "pending charge applied, reserve returned"
    );
    r.unregister(s);
    assert_eq!(r.used(0), 0);
}

#[test]
fn a_stale_lock_word_is_marked_owner_died_and_recovered() {
    let d = TempDir::new("stale");
    let p = d.file();
    // A thread id that no longer exists: a child that has exited and been reaped.
    let gone = fork_child(|| 0);
    wait_timeout(gone, Duration::from_secs(10)).expect("child hung");
    let lock_off = offset_of!(crate::layout::RegionHeader, lock) as u64;
    // Without stale-lock breaking (the agent's setting): a bounded wait, then an error
    // naming the holder.
    let r = create(&p, 64 * MIB).with_tuning(Tuning {
        lock_timeout: Duration::from_millis(200),
        ..Tuning::default()
    });
    // This process's real identity: owner-died recovery must see it alive.
    let s = r.register(ProcessId::current()).unwrap();
    patch(&p, lock_off, &(gone as u32).to_le_bytes());
    let t = Instant::now();
    let den = r.try_charge(s, 0, UsageKind::Data, MIB).unwrap_err();
    assert_eq!(den.reason, DenyReason::LockTimeout);
    assert!(t.elapsed() < Duration::from_secs(2));
    match r.register(fake(801, 1)) {
        Err(e @ RegionError::LockTimeout { holder_tid, .. }) => {
            assert_eq!(holder_tid, gone as u32);
            assert!(e.to_string().contains(&format!("thread {gone}")), "{e}");
        }
        other => panic!("{other:?}"),
    }
    // With it (the preload's setting): recovered after STALE_LOCK_AGE (once this thread's
    // back-off after its timed-out wait has passed).
    std::thread::sleep(Duration::from_millis(250));
    let r = r.with_tuning(Tuning {
        lock_timeout: Duration::from_secs(5),
        break_stale_locks: true,
        ..Tuning::default()
    });
    let t = Instant::now();
    r.try_charge(s, 0, UsageKind::Data, MIB).unwrap();
    let took = t.elapsed();
    assert!(
        took >= STALE_LOCK_AGE && took < Duration::from_secs(3),
        "{took:?}"
    );
    let snap = r.snapshot();
    assert_eq!(snap.stale_lock_breaks, 1);
    assert_eq!(snap.owner_died_recoveries, 1);
    assert_eq!(snap.used[0], MIB);
    // A lock word naming a live thread (this one) is never broken: bounded wait instead.
    // SAFETY: gettid has no preconditions.
    let me = unsafe { libc::syscall(libc::SYS_gettid) } as u32;
    patch(&p, lock_off, &me.to_le_bytes());
    let r = r.with_tuning(Tuning {
        lock_timeout: Duration::from_millis(800),
        break_stale_locks: true,
        ..Tuning::default()
    });
    let den = r.try_charge(s, 0, UsageKind::Data, MIB).unwrap_err();
    assert_eq!(den.reason, DenyReason::LockTimeout);
    assert_eq!(r.snapshot().stale_lock_breaks, 1);
    patch(&p, lock_off, &0u32.to_le_bytes());
    r.unregister(s);
    assert_eq!(r.used(0), 0);
}

#[test]
fn reserves_are_taken_back_when_the_device_is_full() {
    let d = TempDir::new("reclaim-reserve");
    let p = d.file();
    let limit = 64 * MIB;
    let r = create(&p, limit).with_tuning(Tuning {
        reserve: 2 * MIB,
        ..Tuning::default()
    });
    let a = r.register(fake(900, 1)).unwrap();
    let b = r.register(fake(901, 1)).unwrap();
    r.try_charge(a, 0, UsageKind::Data, 10 * MIB).unwrap();
    let snap = r.snapshot();
    assert_eq!(snap.slot(a.index()).unwrap().reserve[0], 2 * MIB);
    assert_eq!(snap.used[0], 12 * MIB);
    assert_eq!(r.used(0), 10 * MIB);
    assert_eq!(r.admitted(0), 12 * MIB);
    // B fills the device exactly: A's unused reserve is taken back for it.
    r.try_charge(b, 0, UsageKind::Data, 54 * MIB).unwrap();
    let snap = r.snapshot();
    assert_eq!(snap.slot(a.index()).unwrap().reserve[0], 0);
    assert_eq!(snap.slot(b.index()).unwrap().reserve[0], 0);
    assert_eq!(snap.used[0], limit);
    assert_eq!(snap.accounted(0), limit);
    assert_eq!(snap.reserve_reclaims, 1);
    assert_eq!(
        r.try_charge(a, 0, UsageKind::Data, 1).unwrap_err().reason,
        DenyReason::OverLimit
    );
    // A release goes to the releaser's reserve: it is still admitted, and anyone can get it.
    assert_eq!(r.uncharge(a, 0, UsageKind::Data, 3 * MIB), 3 * MIB);
    assert_eq!(r.admitted(0), limit);
    assert_eq!(r.used(0), limit - 3 * MIB);
    r.try_charge(b, 0, UsageKind::Data, 3 * MIB).unwrap();
    assert_eq!(r.snapshot().accounted(0), limit);
    // A reserve above twice the quantum is trimmed at release.
    assert_eq!(r.uncharge(b, 0, UsageKind::Data, 20 * MIB), 20 * MIB);
    let snap = r.snapshot();
    assert_eq!(snap.slot(b.index()).unwrap().reserve[0], 2 * MIB);
    assert_eq!(snap.used[0], limit - 18 * MIB);
    r.unregister(a);
    r.unregister(b);
    assert_eq!(r.used(0), 0);
}

/// The per-device context footprint: 0 until a process records a measurement, shared by
/// every mapping of the file (read through another mapping and through `pread`), the latest
/// store wins, a read-only mapping cannot write it, bad ordinals read 0 and are ignored.
#[test]
fn context_footprint_is_shared_per_device_and_written_by_writable_mappings_only() {
    let t = TempDir::new("ctxfoot");
    let p = t.file();
    let a = create(&p, 1 << 30);
    let b = Region::open_existing(&p, true).unwrap();
    let ro = Region::open_existing(&p, false).unwrap();
    assert_eq!(a.context_footprint(0), 0, "not measured yet");
    a.set_context_footprint(0, 518 * MIB);
    assert_eq!(b.context_footprint(0), 518 * MIB);
    assert_eq!(ro.context_footprint(0), 518 * MIB);
    assert_eq!(b.context_footprint(1), 0, "per device");
    b.set_context_footprint(0, 300 * MIB);
    assert_eq!(
        a.context_footprint(0),
        300 * MIB,
        "the latest measurement wins"
    );
    ro.set_context_footprint(0, 1);
    assert_eq!(
        a.context_footprint(0),
        300 * MIB,
        "read-only: nothing written"
    );
    a.set_context_footprint(MAX_DEVICES, 5);
    assert_eq!(a.context_footprint(MAX_DEVICES), 0);
    a.set_context_footprint(MAX_DEVICES - 1, 7 * MIB);
    let snap = ro.snapshot();
    assert_eq!(snap.context_footprint[0], 300 * MIB);
    assert_eq!(snap.context_footprint[MAX_DEVICES - 1], 7 * MIB);
    let f = std::fs::File::open(&p).unwrap();
    let read = read_snapshot(&f, &p).unwrap();
    assert_eq!(read.context_footprint, snap.context_footprint);
    // The figure is not usage: it changes no total.
    assert_eq!(a.used(0), 0);
}

/// The creator's compute share and policy are written at creation and kept by later
/// openers, which are told where their own configuration differs; the gate's atomics are
/// shared by every mapping of the file.
#[test]
fn compute_share_is_set_at_creation_and_differences_are_reported() {
    use crate::layout::{COMPUTE_POLICY_DEFAULT, COMPUTE_POLICY_FORCE};
    let d = TempDir::new("compute");
    let p = d.file();
    let mut c = cfg(0);
    c.sm_limits[0] = 30;
    c.sm_limits[2] = 100;
    c.compute_policy = COMPUTE_POLICY_FORCE;
    let r = create(&p, 0);
    drop(r);
    std::fs::remove_file(&p).unwrap();
    let (r, out) = Region::open_or_create(&p, &c).unwrap();
    assert_eq!(out, OpenOutcome::Created);
    assert_eq!((r.sm_limit(0), r.sm_limit(1), r.sm_limit(2)), (30, 0, 100));
    assert_eq!(r.compute_policy(0), COMPUTE_POLICY_FORCE);
    assert_eq!(r.sm_limit(MAX_DEVICES), 0, "past the table: no limit");
    assert!(r.compute_cells(MAX_DEVICES).is_none());
    assert!(r.compute_differences(&c).is_empty());

    let mut later = c.clone();
    later.sm_limits[0] = 50;
    later.compute_policy = COMPUTE_POLICY_DEFAULT;
    let (r2, _) = Region::open_or_create(&p, &later).unwrap();
    let diffs = r2.compute_differences(&later);
    assert_eq!(
        diffs.len(),
        MAX_DEVICES,
        "the policy differs on every device"
    );
    assert_eq!(
        diffs[0],
        ComputeDifference {
            dev: 0,
            region_sm_limit: 30,
            region_policy: COMPUTE_POLICY_FORCE,
            requested_sm_limit: 50,
            requested_policy: COMPUTE_POLICY_DEFAULT,
        }
    );
    assert_eq!(r2.sm_limit(0), 30, "the region's share applies");
    assert_eq!(compute_policy_name(r2.compute_policy(0)), "force");

    // Both mappings see the same budget.
    let a = r.compute_cells(0).unwrap();
    let b = r2.compute_cells(0).unwrap();
    a.budget_ns.store(-5, Ordering::Relaxed);
    a.consumed_ns.fetch_add(7, Ordering::Relaxed);
    assert_eq!(b.budget_ns.load(Ordering::Relaxed), -5);
    assert_eq!(b.consumed_ns.load(Ordering::Relaxed), 7);
    let other = r2.compute_cells(1).unwrap();
    assert_eq!(other.budget_ns.load(Ordering::Relaxed), 0, "per device");
}

#[test]
fn refusals_count_per_device_lock_free() {
    let d = TempDir::new("refusals");
    let r = create(&d.file(), 1 << 30);
    assert_eq!(r.refusals(1), 0, "a new region has refused nothing");
    r.count_refusal(1);
    r.count_refusal(1);
    r.count_refusal(3);
    r.count_refusal(MAX_DEVICES); // beyond the region: ignored, no panic
    assert_eq!((r.refusals(0), r.refusals(1), r.refusals(3)), (0, 2, 1));
    assert_eq!(r.refusals(MAX_DEVICES), 0);
    let s = r.snapshot();
    assert_eq!((s.compute[1].refusals, s.compute[3].refusals), (2, 1));
}

#[test]
fn a_slot_keeps_its_host_pid_until_it_is_freed() {
    let d = TempDir::new("hostpid");
    let r = create(&d.file(), 0);
    let s = r.register(fake(200, 7)).unwrap();
    assert_eq!(r.host_pid(s.index()), 0, "unknown at registration");
    r.set_host_pid(s, 4242).unwrap();
    assert_eq!(r.host_pid(s.index()), 4242);
    // Another identity naming the same slot (reclaimed and reused) records nothing.
    let stale = SlotId::new(s.index(), fake(201, 7));
    r.set_host_pid(stale, 9).unwrap();
    assert_eq!(r.host_pid(s.index()), 4242);
    r.unregister(s);
    assert_eq!(r.host_pid(s.index()), 0, "cleared when freed");
    let s2 = r.register(fake(202, 8)).unwrap();
    assert_eq!(s2.index(), s.index());
    assert_eq!(r.host_pid(s2.index()), 0, "a new owner starts unknown");
    assert_eq!(r.host_pid(MAX_SLOTS), 0);
    let ro = Region::open_existing(&d.file(), false).unwrap();
    assert!(matches!(
        ro.set_host_pid(s2, 1),
        Err(RegionError::ReadOnly { .. })
    ));
}

/// Regression (issue 22, found under qemu-user): qemu answers `/proc/self/stat` with the
/// calling thread's start time, so a process registering from a second thread got another
/// identity than the one its liveness is checked with, and its slot was reclaimed under it
/// (the torture race granted 20 times the limit). Every thread must see one identity, the
/// one `/proc/<pid>/stat` gives.
#[test]
fn the_current_process_has_one_identity_from_every_thread() {
    let main = ProcessId::current();
    std::thread::sleep(Duration::from_millis(30));
    let from_thread = std::thread::spawn(|| {
        std::thread::sleep(Duration::from_millis(30));
        ProcessId::current()
    })
    .join()
    .unwrap();
    assert_eq!(from_thread, main);
    assert_eq!(ProcessId::of(main.pid), Some(main));
    assert_eq!(ProcProbe.liveness(main), Liveness::Alive);
}
