//! The region validator and reader used by the agent and `hami-agent inspect`:
//! `Region::open_existing` (header checks before mapping), `snapshot`, the inspect report, and
//! (writable) `reclaim_dead_with` over garbage slots.
//!
//! Input: a file-length selector, then patches `(offset: u32 LE, len: u8, bytes)` applied to a
//! valid region (so the fuzzer reaches past the magic check and into the slot table). The
//! lock bytes are never patched here: a garbage lock word makes lockers wait forever, a known
//! finding of `cargo xtask torture` (docs/torture.md), not something to rediscover each run.
#![no_main]

use std::path::PathBuf;
use std::sync::OnceLock;

use hami_abi::layout::{RegionHeader, LOCK_BYTES, MAX_DEVICES, REGION_SIZE};
use hami_common::region::{Liveness, LivenessProbe, ProcessId, Region, RegionConfig};
use libfuzzer_sys::fuzz_target;

struct AllDead;

impl LivenessProbe for AllDead {
    fn liveness(&self, _who: ProcessId) -> Liveness {
        Liveness::Dead
    }
}

struct Paths {
    template: Vec<u8>,
    file: PathBuf,
}

fn paths() -> &'static Paths {
    static P: OnceLock<Paths> = OnceLock::new();
    P.get_or_init(|| {
        let base = if std::path::Path::new("/dev/shm").is_dir() {
            PathBuf::from("/dev/shm")
        } else {
            std::env::temp_dir()
        };
        let dir = base.join(format!("hami-fuzz-region-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let good = dir.join("template");
        let mut cfg = RegionConfig::default();
        cfg.device_count = 2;
        cfg.limits[0] = 1 << 30;
        let (r, _) = Region::open_or_create(&good, &cfg).expect("template region");
        drop(r);
        let template = std::fs::read(&good).expect("read template");
        Paths {
            template,
            file: dir.join("region"),
        }
    })
}

fuzz_target!(|data: &[u8]| {
    let p = paths();
    let Some((&sel, mut rest)) = data.split_first() else {
        return;
    };
    let mut bytes = p.template.clone();
    let lock = core::mem::offset_of!(RegionHeader, lock);
    while rest.len() >= 5 {
        let off = u32::from_le_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize % REGION_SIZE;
        let len = (rest[4] as usize).min(rest.len() - 5);
        let patch = &rest[5..5 + len];
        for (i, &b) in patch.iter().enumerate() {
            let at = off + i;
            if at < REGION_SIZE && !(lock..lock + LOCK_BYTES).contains(&at) {
                bytes[at] = b;
            }
        }
        rest = &rest[5 + len..];
    }
    match sel % 4 {
        0 => {}
        1 => bytes.truncate((u16::from_le_bytes([sel, sel.rotate_left(3)]) as usize) % 1024),
        2 => bytes.truncate(REGION_SIZE - 1 - sel as usize),
        _ => bytes.extend_from_slice(&[sel; 64]),
    }
    std::fs::write(&p.file, &bytes).expect("write region");
    let name = p.file.display().to_string();
    if let Ok(r) = Region::open_existing(&p.file, false) {
        let s = r.snapshot();
        for d in 0..MAX_DEVICES {
            let _ = (
                s.accounted(d),
                s.device_used(d),
                s.limit(d),
                s.config_invalid(d),
            );
        }
        assert!(s.limit(MAX_DEVICES).is_none() && s.device_used(MAX_DEVICES) == 0);
        for sl in &s.slots {
            let _ = (s.slot_total(sl.index), sl.total(), sl.process());
        }
        let _ = hami_user::report::inspect_text(&name, &s);
        let _ = hami_user::report::inspect_json(&name, &s);
        let _ = (r.limit(0), r.used(0), r.device_count(), r.uuid(0));
    }
    if sel & 4 != 0 {
        if let Ok(r) = Region::open_existing(&p.file, true) {
            let freed = r.reclaim_dead_with(&AllDead);
            let s = r.snapshot();
            // Every active slot belonged to a "dead" process: none may be left.
            assert!(
                s.slots.is_empty(),
                "{} slots left after reclaiming all",
                s.slots.len()
            );
            for f in freed {
                let _ = f.total();
            }
        }
    }
});
