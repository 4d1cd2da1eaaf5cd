//! Slots and reclaim: registration, reuse, dead-slot reclaim, forks, UUIDs.

use super::*;

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
