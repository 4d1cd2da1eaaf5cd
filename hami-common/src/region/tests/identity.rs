//! Process identity, liveness and snapshots.

use super::*;
use crate::procfs::parse_stat;

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
    use hami_abi::layout::DeviceCompute as C;
    let d = TempDir::new("pread-compute");
    let r = create(&d.file(), 1 << 30);
    r.register(fake(41, 7)).unwrap();
    // What the launch gate keeps for device 2, written into the file.
    let base = (offset_of!(hami_abi::layout::RegionLayout, compute) + 2 * size_of::<C>()) as u64;
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
        policy: hami_abi::layout::COMPUTE_POLICY_DISABLE,
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
    let hw = offset_of!(hami_abi::layout::RegionHeader, slot_high_water) as u64;
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
