//! The event stream: the probes' counters (kernel and user side), decoding of ring-buffer
//! records, and the task that pumps them into a channel.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use aya::maps::{IterableMap, Map, MapData, PerCpuArray, RingBuf};
use hami_abi::event::{counter, CudaEvent, Event};
use tokio::io::unix::AsyncFd;
use tokio::sync::mpsc;

/// Counters of the probes, summed over CPUs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProbeCounters {
    /// Events written to the ring buffer by the programs.
    pub sent: u64,
    /// Events lost because the ring buffer was full.
    pub dropped: u64,
    /// Returns seen without their entry (probe attached mid-call, or map pressure).
    pub unpaired: u64,
    /// Events read from the ring buffer by user space.
    pub received: u64,
    /// Ring buffer records of the wrong size or of an unknown kind (should stay 0).
    pub malformed: u64,
}

/// Counters kept by user space: records read and records of the wrong size.
#[derive(Default)]
pub(super) struct UserCounters {
    pub(super) received: AtomicU64,
    pub(super) malformed: AtomicU64,
}

/// Another handle on the same counters map (its fd duplicated), `None` if that fails.
pub(super) fn second_handle(c: &PerCpuArray<MapData, u64>) -> Option<PerCpuArray<MapData, u64>> {
    use std::os::fd::AsFd;
    let fd = c.map().fd().as_fd().try_clone_to_owned().ok()?;
    let data = MapData::from_fd(fd).ok()?;
    PerCpuArray::try_from(Map::PerCpuArray(data)).ok()
}

pub(super) fn read_counters(map: &PerCpuArray<MapData, u64>, user: &UserCounters) -> ProbeCounters {
    let sum = |i: u32| -> u64 {
        map.get(&i, 0)
            .map(|vals| vals.iter().copied().fold(0u64, u64::wrapping_add))
            .unwrap_or(0)
    };
    ProbeCounters {
        sent: sum(counter::SENT),
        dropped: sum(counter::DROPPED),
        unpaired: sum(counter::UNPAIRED),
        received: user.received.load(Ordering::Relaxed),
        malformed: user.malformed.load(Ordering::Relaxed),
    }
}

/// Decode one ring-buffer record into a typed [`Event`]: the only place a raw record is
/// read. `None` for a record of the wrong size or of an unknown kind.
pub fn decode_event(bytes: &[u8]) -> Option<Event> {
    if bytes.len() != std::mem::size_of::<CudaEvent>() {
        return None;
    }
    // SAFETY: the length matches; CudaEvent is repr(C) made of integers (any bit pattern is
    // valid), and read_unaligned has no alignment requirement.
    let raw = unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<CudaEvent>()) };
    Event::decode(&raw)
}

/// How often [`pump`] reads the ring without being woken: the probes wake it only once a
/// quarter of the ring is pending (`hami-ebpf`'s `wakeup_flag`), so that a traced call does
/// not pay for waking the agent. Events reach the agent at most this much later.
pub const POLL: std::time::Duration = std::time::Duration::from_millis(10);

pub(super) async fn pump(
    mut afd: AsyncFd<RingBuf<MapData>>,
    tx: mpsc::Sender<Event>,
    user: Arc<UserCounters>,
) {
    let mut batch = Vec::with_capacity(1024);
    loop {
        match tokio::time::timeout(POLL, afd.readable_mut()).await {
            Ok(Ok(mut guard)) => {
                read_batch(guard.get_inner_mut(), &mut batch, &user);
                if batch.len() < BATCH {
                    guard.clear_ready();
                }
            }
            Ok(Err(e)) => {
                tracing::error!(error = %e, "event ring buffer poll failed; events stop");
                return;
            }
            // Not woken (records submitted without a wakeup): read what is there.
            Err(_) => read_batch(afd.get_mut(), &mut batch, &user),
        }
        user.received
            .fetch_add(batch.len() as u64, Ordering::Relaxed);
        for ev in batch.drain(..) {
            if tx.send(ev).await.is_err() {
                return;
            }
        }
    }
}

/// Records [`pump`] reads at most before handing them on.
const BATCH: usize = 4096;

/// Reads up to [`BATCH`] records from the ring into `batch`, counting the malformed ones.
fn read_batch(ring: &mut RingBuf<MapData>, batch: &mut Vec<Event>, user: &UserCounters) {
    while let Some(item) = ring.next() {
        match decode_event(&item) {
            Some(ev) => batch.push(ev),
            None => {
                user.malformed.fetch_add(1, Ordering::Relaxed);
            }
        }
        if batch.len() >= BATCH {
            break;
        }
    }
}
