//! The eBPF event decoder (`probes::decode_event`, the one place a raw record becomes a
//! typed `Event`) and the agent's per-process state fed with what it decodes
//! (`state::Processes::apply`).
#![no_main]

use hami_abi::event::{CudaEvent, EventKind};
use hami_user::probes::decode_event;
use hami_user::state::Processes;
use libfuzzer_sys::fuzz_target;

const N: usize = core::mem::size_of::<CudaEvent>();

/// The raw kind of a record (its first field, native-endian `u32`).
fn raw_kind(chunk: &[u8]) -> u32 {
    u32::from_ne_bytes([chunk[0], chunk[1], chunk[2], chunk[3]])
}

fuzz_target!(|data: &[u8]| {
    // A record of the wrong length is refused, never read past its end.
    assert!(data.len() == N || decode_event(data).is_none());
    let mut procs = Processes::new();
    for chunk in data.chunks(N) {
        let Some(mut ev) = decode_event(chunk) else {
            // Wrong length, or a kind no EventKind has.
            assert!(chunk.len() != N || EventKind::from_u32(raw_kind(chunk)).is_none());
            continue;
        };
        assert_eq!(ev.kind as u32, raw_kind(chunk));
        // Few pids, so that allocations and frees of one process meet.
        ev.tgid %= 4;
        let _ = (ev.kind.name(), ev.kind.is_alloc(), ev.kind.is_free());
        if ev.tgid == 3 && ev.tid == 0 {
            procs.baseline(ev.tgid, Some(ev.size));
        }
        let _ = procs.apply(&ev);
    }
    for p in procs.iter() {
        let _ = (p.by_device(), p.live_count());
    }
    let _ = procs.len();
});
