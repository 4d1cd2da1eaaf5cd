//! Events sent by the `hami-ebpf` programs to `hami-agent` through a ring buffer.

/// Defines [`EventKind`] from one line per kind (`Variant = value => "name",` under its doc
/// comment), so that each kind's value and name are typed once: `from_u32`, `ALL` and
/// `name` are generated from the same list.
macro_rules! event_kinds {
    ($($(#[$doc:meta])* $variant:ident = $value:literal => $name:literal,)*) => {
        /// What a [`CudaEvent`] reports. Values are stable (they cross the kernel/user
        /// boundary): allocations below 16, releases 16..32, context events 32..64.
        #[repr(u32)]
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum EventKind {
            $($(#[$doc])* $variant = $value,)*
        }

        impl EventKind {
            /// Decode a raw kind value.
            pub const fn from_u32(v: u32) -> Option<EventKind> {
                match v {
                    $($value => Some(EventKind::$variant),)*
                    _ => None,
                }
            }

            /// Every kind, in the order of the list (value order, checked by a test).
            pub const ALL: [EventKind; [$($value),*].len()] = [$(EventKind::$variant),*];

            /// Stable lower-case name (logs, metric labels).
            pub const fn name(self) -> &'static str {
                match self {
                    $(EventKind::$variant => $name,)*
                }
            }
        }
    };
}

event_kinds! {
    /// `cuMemAlloc_v2` returned `CUDA_SUCCESS`; `addr` = device pointer, `size` = bytes.
    MemAlloc = 1 => "mem_alloc",
    /// `cuMemAllocPitch_v2`; `size` = pitch * height actually returned, `extra` = pitch.
    MemAllocPitch = 2 => "mem_alloc_pitch",
    /// `cuMemAllocManaged`.
    MemAllocManaged = 3 => "mem_alloc_managed",
    /// `cuMemAllocAsync` / `cuMemAllocAsync_ptsz`.
    MemAllocAsync = 4 => "mem_alloc_async",
    /// `cuMemAllocFromPoolAsync` / `_ptsz`.
    MemAllocFromPool = 5 => "mem_alloc_from_pool",
    /// `cuMemCreate`; `addr` = the `CUmemGenericAllocationHandle`, `extra` = the device
    /// ordinal from `prop->location.id` (`u64::MAX` if the location is not a device).
    MemCreate = 6 => "mem_create",
    /// `cuArrayCreate_v2`; `addr` = the `CUarray`, `size` = estimated footprint
    /// ([`crate::array::array_footprint`]).
    ArrayCreate = 7 => "array_create",
    /// `cuArray3DCreate_v2`.
    Array3DCreate = 8 => "array_3d_create",
    /// `cuMipmappedArrayCreate`; `addr` = the `CUmipmappedArray`, `size` = estimated
    /// footprint of all levels ([`crate::array::mipmap_footprint`]).
    MipmappedArrayCreate = 9 => "mipmapped_array_create",
    /// `cuMemFree_v2` succeeded; `addr` = pointer.
    MemFree = 16 => "mem_free",
    /// `cuMemFreeAsync` / `_ptsz` succeeded.
    MemFreeAsync = 17 => "mem_free_async",
    /// `cuMemRelease` succeeded; `addr` = handle.
    MemRelease = 18 => "mem_release",
    /// `cuArrayDestroy` succeeded; `addr` = array.
    ArrayDestroy = 19 => "array_destroy",
    /// `cuMipmappedArrayDestroy` succeeded; `addr` = the mipmapped array.
    MipmappedArrayDestroy = 20 => "mipmapped_array_destroy",
    /// `cuCtxCreate_v2/v3/v4` succeeded; `addr` = `ctx` = new context (it becomes the
    /// thread's current one), `extra` = device ordinal.
    CtxCreate = 32 => "ctx_create",
    /// `cuCtxDestroy_v2` succeeded; `addr` = context.
    CtxDestroy = 33 => "ctx_destroy",
    /// `cuDevicePrimaryCtxRetain` succeeded; `addr` = context, `extra` = device ordinal.
    PrimaryCtxRetain = 34 => "primary_ctx_retain",
    /// `cuDevicePrimaryCtxRelease(_v2)` succeeded; `extra` = device ordinal.
    PrimaryCtxRelease = 35 => "primary_ctx_release",
    /// `cuCtxSetCurrent` succeeded with a context different from the thread's current one;
    /// `addr` = `ctx` = the context (0 = none).
    CtxSetCurrent = 36 => "ctx_set_current",
    /// The process (thread group leader) exited.
    ProcessExit = 64 => "process_exit",
}

impl EventKind {
    /// Whether the event adds memory.
    pub const fn is_alloc(self) -> bool {
        (self as u32) < 16
    }

    /// Whether the event releases memory.
    pub const fn is_free(self) -> bool {
        let v = self as u32;
        v >= 16 && v < 32
    }
}

/// One observation from a libcuda probe (or the process-exit tracepoint).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CudaEvent {
    /// [`EventKind`] as `u32`.
    pub kind: u32,
    /// Process id (host namespace).
    pub tgid: u32,
    /// Thread id (host namespace).
    pub tid: u32,
    /// `CUresult` the call returned (only successful calls are sent today, so 0).
    pub result: i32,
    /// `bpf_ktime_get_ns()` at return.
    pub ts_ns: u64,
    /// Bytes (0 for frees: the agent looks the size up by `addr`).
    pub size: u64,
    /// Device pointer, allocation handle, array or context.
    pub addr: u64,
    /// The thread's current context as last seen by `cuCtxSetCurrent` / creation, or 0.
    pub ctx: u64,
    /// Kind-specific extra value (pitch, device ordinal).
    pub extra: u64,
}

/// A [`CudaEvent`] decoded once, at the ring-buffer edge: its kind checked and typed, so
/// that everything after (metrics, the agent, the live allocations) matches on
/// [`EventKind`] and never sees a raw kind value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Event {
    /// What happened.
    pub kind: EventKind,
    /// Process id (host namespace).
    pub tgid: u32,
    /// Thread id (host namespace).
    pub tid: u32,
    /// `CUresult` the call returned (only successful calls are sent today, so 0).
    pub result: i32,
    /// `bpf_ktime_get_ns()` at return (`CLOCK_MONOTONIC`).
    pub ts_ns: u64,
    /// Bytes (0 for frees).
    pub size: u64,
    /// Device pointer, allocation handle, array or context.
    pub addr: u64,
    /// The thread's current context as the probes saw it, or 0.
    pub ctx: u64,
    /// Kind-specific extra value (pitch, device ordinal).
    pub extra: u64,
}

impl Event {
    /// Decodes a raw record; `None` if its kind is not a known [`EventKind`].
    pub const fn decode(raw: &CudaEvent) -> Option<Event> {
        let Some(kind) = EventKind::from_u32(raw.kind) else {
            return None;
        };
        Some(Event {
            kind,
            tgid: raw.tgid,
            tid: raw.tid,
            result: raw.result,
            ts_ns: raw.ts_ns,
            size: raw.size,
            addr: raw.addr,
            ctx: raw.ctx,
            extra: raw.extra,
        })
    }

    /// An event of `kind` with every other field zero (tests, replays).
    pub const fn new(kind: EventKind) -> Event {
        Event {
            kind,
            tgid: 0,
            tid: 0,
            result: 0,
            ts_ns: 0,
            size: 0,
            addr: 0,
            ctx: 0,
            extra: 0,
        }
    }
}

/// Counters shared through a per-CPU array map, indexed by these values.
pub mod counter {
    /// Events written to the ring buffer.
    pub const SENT: u32 = 0;
    /// Events dropped because the ring buffer was full.
    pub const DROPPED: u32 = 1;
    /// Returns without a matching entry (should stay 0).
    pub const UNPAIRED: u32 = 2;
    /// Number of counters.
    pub const COUNT: u32 = 3;
}

// SAFETY: CudaEvent is repr(C), Copy, made only of integers, with no padding holes.
#[cfg(feature = "user")]
unsafe impl aya::Pod for CudaEvent {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_decodes_from_its_value_and_has_a_unique_name() {
        for (i, k) in EventKind::ALL.iter().enumerate() {
            assert_eq!(EventKind::from_u32(*k as u32), Some(*k), "{k:?}");
            for other in &EventKind::ALL[i + 1..] {
                assert_ne!(k.name(), other.name());
                assert!((*k as u32) < (*other as u32), "ALL is in value order");
            }
        }
        assert_eq!(EventKind::from_u32(0), None);
        assert_eq!(EventKind::ALL.len(), 20);
        assert_eq!(EventKind::MemAlloc.name(), "mem_alloc");
        assert_eq!(EventKind::Array3DCreate.name(), "array_3d_create");
    }

    #[test]
    fn records_decode_to_typed_events_or_not_at_all() {
        let raw = CudaEvent {
            kind: EventKind::MemCreate as u32,
            tgid: 7,
            tid: 8,
            result: 0,
            ts_ns: 9,
            size: 10,
            addr: 11,
            ctx: 12,
            extra: 13,
        };
        let ev = Event::decode(&raw).expect("a known kind");
        assert_eq!(ev.kind, EventKind::MemCreate);
        assert_eq!(
            (ev.tgid, ev.tid, ev.ts_ns, ev.size, ev.addr, ev.ctx, ev.extra),
            (7, 8, 9, 10, 11, 12, 13)
        );
        for bad in [0, 10, 15, 21, 37, 63, 65, u32::MAX] {
            let raw = CudaEvent { kind: bad, ..raw };
            assert_eq!(Event::decode(&raw), None, "kind {bad}");
        }
    }
}
