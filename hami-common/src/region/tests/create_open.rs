//! Creating, opening and validating region files: modes, groups, races, bad headers.

use super::*;

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
                expected: hami_abi::layout::VERSION,
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
