//! Region lifetimes and the per-region metric series.

use super::*;

#[test]
fn region_leaves_the_metrics_and_is_closed_once_its_last_process_exits() {
    let w = World::new();
    w.spawn(100, 7, true, "1g");
    let r = w.region(100, 1 << 30, &[]);
    let s = register(&r, 100, 7, 64 * MIB);
    let mut a = w.agent(false);
    a.on_event(&ev(EventKind::MemAlloc, 100, 64 * MIB, 0x7000, 0));
    a.tick(Instant::now());
    assert_eq!(a.region_count(), 1);
    let series = a.region_series();
    // A 1-device region: one series, not one per possible device.
    assert_eq!(series.len(), 1, "{series:?}");
    assert_eq!(series[0].device, 0);
    assert_eq!(series[0].identity.container, &CID[..12]);
    let md = std::fs::metadata(w.root.join("100/root/hami/r.cache")).unwrap();
    let file = (md.dev(), md.ino());
    let open_before = fds_open_on(file);
    assert!(open_before >= 1, "the agent holds the region open");
    // The process exits cleanly: its slot is released, its exit event arrives.
    r.unregister(s);
    a.on_event(&ev(EventKind::ProcessExit, 100, 0, 0, 0));
    w.kill(100);
    a.tick(Instant::now());
    assert_eq!(a.region_count(), 0);
    assert!(a.region_series().is_empty());
    assert_eq!(a.released_regions(), 1);
    // Its descriptor is closed (a read on a helper thread may finish just after).
    let t = Instant::now();
    while fds_open_on(file) != open_before - 1 && t.elapsed() < Duration::from_secs(2) {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(fds_open_on(file), open_before - 1);
}

/// Descriptors of this process open on the file `(dev, inode)`.
fn fds_open_on((dev, ino): (u64, u64)) -> usize {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .flatten()
        .filter(|e| std::fs::metadata(e.path()).is_ok_and(|m| m.dev() == dev && m.ino() == ino))
        .count()
}

#[test]
fn region_series_account_every_usage_kind_pool_and_other_included() {
    let w = World::new();
    w.spawn(100, 7, true, "1g");
    let r = w.region(100, 1 << 30, &[]);
    let s = register(&r, 100, 7, 64 * MIB);
    r.force_charge(s, 0, UsageKind::Module, 2 * MIB);
    r.force_charge(s, 0, UsageKind::Pool, 32 * MIB);
    r.force_charge(s, 0, UsageKind::Other, 4 * MIB);
    let mut a = w.agent(false);
    a.on_event(&ev(EventKind::MemAlloc, 100, 64 * MIB, 0x7000, 0));
    a.tick(Instant::now());
    let series = a.region_series();
    assert_eq!(series.len(), 1, "{series:?}");
    // Context 10 + module 2 + data 64 + pool 32 + other 4.
    assert_eq!(series[0].accounted, 112 * MIB);
    assert_eq!(series[0].accounted_data, 64 * MIB);
}

#[test]
fn region_with_a_leaked_slot_stays() {
    let w = World::new();
    w.spawn(100, 7, true, "1g");
    let r = w.region(100, 1 << 30, &[]);
    register(&r, 100, 7, 64 * MIB);
    let mut a = w.agent(false);
    a.on_event(&ev(EventKind::MemAlloc, 100, 64 * MIB, 0x7000, 0));
    a.tick(Instant::now());
    w.kill(100);
    a.tick(Instant::now());
    assert_eq!(a.region_count(), 1);
    assert_eq!(a.region_series().len(), 1);
}

#[test]
fn region_series_cover_only_the_header_devices_and_name_their_uuid() {
    let w = World::new();
    w.spawn(100, 7, true, "1g");
    let path = w.root.join("100/root/hami/r.cache");
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let mut cfg = RegionConfig::default();
    // A global limit: every device slot carries it, but the container sees 2 GPUs.
    cfg.limits = [1 << 30; MAX_DEVICES];
    cfg.device_count = 2;
    let (r, _) = Region::open_or_create(&path, &cfg).unwrap();
    r.set_uuid(1, [0xab; 16]);
    register(&r, 100, 7, MIB);
    let mut a = w.agent(false);
    a.on_event(&ev(EventKind::MemAlloc, 100, MIB, 0x7000, 0));
    a.tick(Instant::now());
    let series = a.region_series();
    assert_eq!(
        series.iter().map(|s| s.device).collect::<Vec<_>>(),
        vec![0, 1]
    );
    assert_eq!(series[0].uuid, "");
    assert_eq!(series[1].uuid, "GPU-abababab-abab-abab-abab-abababababab");
}
