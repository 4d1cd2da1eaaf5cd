//! The region's binary layout against docs/shared-region.md.

use super::*;

/// The offsets and sizes documented in docs/shared-region.md.
#[test]
fn layout_matches_documentation() {
    use hami_abi::layout::RegionHeader as H;
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
    assert_eq!(offset_of!(H, task_priority), 880);
    assert_eq!(offset_of!(H, arbiter_at_ns), 888);
    assert_eq!(offset_of!(H, grants), 896);
    assert_eq!(offset_of!(H, turns), 960);
    assert_eq!(size_of::<H>(), 1024);
    assert_eq!(offset_of!(Slot, pid), 0);
    assert_eq!(offset_of!(Slot, status), 4);
    assert_eq!(offset_of!(Slot, start_time), 8);
    assert_eq!(offset_of!(Slot, usage), 16);
    assert_eq!(offset_of!(Slot, charged), 656);
    assert_eq!(offset_of!(Slot, reserve), 784);
    assert_eq!(offset_of!(Slot, host_pid), 912);
    assert_eq!(size_of::<Slot>(), 1024);
    assert_eq!(offset_of!(hami_abi::layout::RegionLayout, slots), 1024);
    use hami_abi::layout::DeviceCompute as C;
    assert_eq!(
        offset_of!(hami_abi::layout::RegionLayout, compute),
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

/// The arbiter's words written with `pwrite` (the agent's way) are what a mapping reads, and
/// a file that is not a region's size is never written (nor grown).
#[test]
fn arbiter_words_written_with_pwrite_reach_the_mapping() {
    use crate::arbiter::{decode_grant, encode_grant, Grant};
    let dir = std::env::temp_dir().join(format!("hami-arbiter-pwrite-{}", std::process::id()));
    let _ = std::fs::remove_file(&dir);
    let cfg = RegionConfig {
        sm_limits: [30; MAX_DEVICES],
        task_priority: 0,
        ..RegionConfig::default()
    };
    let (r, _) = Region::open_or_create(&dir, &cfg).unwrap();
    assert_eq!(r.task_priority(), 0);
    assert_eq!(r.arbiter_grant(1), 0);
    let g = Grant {
        bp: 6250,
        held: false,
        lent: true,
    };
    let f = std::fs::OpenOptions::new().write(true).open(&dir).unwrap();
    let turn = crate::arbiter::Turn {
        start: 93,
        len: 156,
    };
    crate::region::write_arbiter(
        &f,
        &[(1, encode_grant(g), crate::arbiter::encode_turn(Some(turn)))],
        123,
    )
    .unwrap();
    assert_eq!(decode_grant(r.arbiter_grant(1)), Some(g));
    assert_eq!(r.compute_turn(1, 123), Some(turn));
    assert_eq!(r.compute_turn(0, 123), None, "no turn written for device 0");
    assert_eq!(
        r.compute_turn(1, 123 + crate::arbiter::GRANT_TTL_NS + 1),
        None,
        "a stale decision's turn is not kept"
    );
    assert_eq!(r.arbiter_at_ns(), 123);
    assert_eq!(r.compute_rate_bp(1, 123), Some(6250));
    assert_eq!(
        r.compute_rate_bp(1, 123 + crate::arbiter::GRANT_TTL_NS + 1),
        Some(3000)
    );
    let s = r.snapshot();
    assert_eq!((s.arbiter.task_priority, s.arbiter.at_ns), (0, 123));
    assert_eq!(s.arbiter.grants[1], encode_grant(g));
    assert_eq!(s.arbiter.turns[1], crate::arbiter::encode_turn(Some(turn)));
    drop(r);
    let short = dir.with_extension("short");
    std::fs::write(&short, b"HAMIRSv\x01").unwrap();
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&short)
        .unwrap();
    assert!(crate::region::write_arbiter(&f, &[(0, 1, 0)], 1).is_err());
    assert_eq!(std::fs::metadata(&short).unwrap().len(), 8);
    let _ = std::fs::remove_file(&dir);
    let _ = std::fs::remove_file(&short);
}
