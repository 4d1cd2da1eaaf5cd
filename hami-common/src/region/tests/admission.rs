//! Admission: exact charging under threads and forked processes, with and without reserves.

use super::*;

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
