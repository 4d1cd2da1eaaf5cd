//! Events sent by the `hami-ebpf` programs to `hami-agent` through a ring buffer.

/// What a [`CudaEvent`] reports. Values are stable (they cross the kernel/user boundary).
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EventKind {
    /// `cuMemAlloc_v2` returned `CUDA_SUCCESS`; `addr` = device pointer, `size` = bytes.
    MemAlloc = 1,
    /// `cuMemAllocPitch_v2`; `size` = pitch * height actually returned, `extra` = pitch.
    MemAllocPitch = 2,
    /// `cuMemAllocManaged`.
    MemAllocManaged = 3,
    /// `cuMemAllocAsync` / `cuMemAllocAsync_ptsz`.
    MemAllocAsync = 4,
    /// `cuMemAllocFromPoolAsync` / `_ptsz`.
    MemAllocFromPool = 5,
    /// `cuMemCreate`; `addr` = the `CUmemGenericAllocationHandle`, `extra` = the device
    /// ordinal from `prop->location.id` (`u64::MAX` if the location is not a device).
    MemCreate = 6,
    /// `cuArrayCreate_v2`; `addr` = the `CUarray`, `size` = estimated footprint
    /// ([`crate::array::array_footprint`]).
    ArrayCreate = 7,
    /// `cuArray3DCreate_v2`.
    Array3DCreate = 8,
    /// `cuMemFree_v2` succeeded; `addr` = pointer.
    MemFree = 16,
    /// `cuMemFreeAsync` / `_ptsz` succeeded.
    MemFreeAsync = 17,
    /// `cuMemRelease` succeeded; `addr` = handle.
    MemRelease = 18,
    /// `cuArrayDestroy` succeeded; `addr` = array.
    ArrayDestroy = 19,
    /// `cuCtxCreate_v2/v3/v4` succeeded; `addr` = `ctx` = new context (it becomes the
    /// thread's current one), `extra` = device ordinal.
    CtxCreate = 32,
    /// `cuCtxDestroy_v2` succeeded; `addr` = context.
    CtxDestroy = 33,
    /// `cuDevicePrimaryCtxRetain` succeeded; `addr` = context, `extra` = device ordinal.
    PrimaryCtxRetain = 34,
    /// `cuDevicePrimaryCtxRelease(_v2)` succeeded; `extra` = device ordinal.
    PrimaryCtxRelease = 35,
    /// `cuCtxSetCurrent` succeeded with a context different from the thread's current one;
    /// `addr` = `ctx` = the context (0 = none).
    CtxSetCurrent = 36,
    /// The process (thread group leader) exited.
    ProcessExit = 64,
}

impl EventKind {
    /// Decode a raw kind value.
    pub const fn from_u32(v: u32) -> Option<EventKind> {
        Some(match v {
            1 => EventKind::MemAlloc,
            2 => EventKind::MemAllocPitch,
            3 => EventKind::MemAllocManaged,
            4 => EventKind::MemAllocAsync,
            5 => EventKind::MemAllocFromPool,
            6 => EventKind::MemCreate,
            7 => EventKind::ArrayCreate,
            8 => EventKind::Array3DCreate,
            16 => EventKind::MemFree,
            17 => EventKind::MemFreeAsync,
            18 => EventKind::MemRelease,
            19 => EventKind::ArrayDestroy,
            32 => EventKind::CtxCreate,
            33 => EventKind::CtxDestroy,
            34 => EventKind::PrimaryCtxRetain,
            35 => EventKind::PrimaryCtxRelease,
            36 => EventKind::CtxSetCurrent,
            64 => EventKind::ProcessExit,
            _ => return None,
        })
    }

    /// Every kind, in value order.
    pub const ALL: [EventKind; 18] = [
        EventKind::MemAlloc,
        EventKind::MemAllocPitch,
        EventKind::MemAllocManaged,
        EventKind::MemAllocAsync,
        EventKind::MemAllocFromPool,
        EventKind::MemCreate,
        EventKind::ArrayCreate,
        EventKind::Array3DCreate,
        EventKind::MemFree,
        EventKind::MemFreeAsync,
        EventKind::MemRelease,
        EventKind::ArrayDestroy,
        EventKind::CtxCreate,
        EventKind::CtxDestroy,
        EventKind::PrimaryCtxRetain,
        EventKind::PrimaryCtxRelease,
        EventKind::CtxSetCurrent,
        EventKind::ProcessExit,
    ];

    /// Stable lower-case name (logs, metric labels).
    pub const fn name(self) -> &'static str {
        match self {
            EventKind::MemAlloc => "mem_alloc",
            EventKind::MemAllocPitch => "mem_alloc_pitch",
            EventKind::MemAllocManaged => "mem_alloc_managed",
            EventKind::MemAllocAsync => "mem_alloc_async",
            EventKind::MemAllocFromPool => "mem_alloc_from_pool",
            EventKind::MemCreate => "mem_create",
            EventKind::ArrayCreate => "array_create",
            EventKind::Array3DCreate => "array_3d_create",
            EventKind::MemFree => "mem_free",
            EventKind::MemFreeAsync => "mem_free_async",
            EventKind::MemRelease => "mem_release",
            EventKind::ArrayDestroy => "array_destroy",
            EventKind::CtxCreate => "ctx_create",
            EventKind::CtxDestroy => "ctx_destroy",
            EventKind::PrimaryCtxRetain => "primary_ctx_retain",
            EventKind::PrimaryCtxRelease => "primary_ctx_release",
            EventKind::CtxSetCurrent => "ctx_set_current",
            EventKind::ProcessExit => "process_exit",
        }
    }

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
        assert_eq!(EventKind::MemAlloc.name(), "mem_alloc");
        assert_eq!(EventKind::Array3DCreate.name(), "array_3d_create");
    }
}
