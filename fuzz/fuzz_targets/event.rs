//! The eBPF event decoder (`probes::decode_event`, `EventKind::from_u32`) and the agent's
//! per-process state fed with what it decodes (`state::Processes::apply`).
#![no_main]

use hami_common::event::{CudaEvent, EventKind};
use hami_user::probes::decode_event;
use hami_user::state::Processes;
use libfuzzer_sys::fuzz_target;

const N: usize = core::mem::size_of::<CudaEvent>();

fuzz_target!(|data: &[u8]| {
    // A record of the wrong length is refused, never read past its end.
    assert!(data.len() == N || decode_event(data).is_none());
    let mut procs = Processes::new();
    for chunk in data.chunks(N) {
        let Some(mut ev) = decode_event(chunk) else {
            assert_ne!(chunk.len(), N);
            continue;
        };
        // Few pids, so that allocations and frees of one process meet.
        ev.tgid %= 4;
        if let Some(k) = EventKind::from_u32(ev.kind) {
            assert_eq!(k as u32, ev.kind);
            let _ = (k.name(), k.is_alloc(), k.is_free());
        }
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
