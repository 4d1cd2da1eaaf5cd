//! eBPF programs of hami-agent: uprobes and uretprobes on libcuda's allocation, free and
//! context functions, plus the `sched_process_exit` raw tracepoint.
//!
//! Every probed function has an entry program (named after the symbol) that saves the
//! arguments it needs under `(thread id, function slot)`, and a return program (`<symbol>_ret`)
//! that takes them back, checks that the call returned `CUDA_SUCCESS`, reads the out-parameter
//! (pointer, handle, context) from user memory and sends a [`CudaEvent`] through the `EVENTS`
//! ring buffer. A full ring buffer increments the `DROPPED` counter: nothing is lost silently.
//!
//! User space sets the global `HAMI_AGENT_TGID` so that the agent's own calls are ignored.
//!
//! Built for `bpfel-unknown-none` by `aya-build` from `hami-user/build.rs`; a host build
//! (e.g. `cargo build --workspace`) compiles the same code into an empty `main`.
#![cfg_attr(target_arch = "bpf", no_std)]
#![cfg_attr(target_arch = "bpf", no_main)]
// Program names are the libcuda symbol names, so that user space can attach by name.
#![allow(non_snake_case)]
#![warn(missing_docs)]

use aya_ebpf::{
    helpers::{bpf_get_current_pid_tgid, bpf_ktime_get_ns, bpf_probe_read_user},
    macros::{map, raw_tracepoint, uprobe, uretprobe},
    maps::{LruHashMap, PerCpuArray, RingBuf},
    programs::{ProbeContext, RawTracePointContext, RetProbeContext},
};
use hami_abi::{
    array::{array_footprint, mipmap_footprint},
    event::{counter, CudaEvent, EventKind},
    intercept::{self, Shape},
};

/// TGID whose calls are ignored (the agent itself); set by user space at load time.
#[no_mangle]
static HAMI_AGENT_TGID: u32 = 0;

/// Events to user space. Default 4 MiB (64 Ki events); user space may resize it.
#[map]
static EVENTS: RingBuf = RingBuf::with_byte_size(4 << 20, 0);

/// Per-CPU counters indexed by [`counter`] values.
#[map]
static COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(counter::COUNT, 0);

/// Arguments saved at entry, keyed by `tid << 8 | slot`.
#[map]
static PENDING: LruHashMap<u64, Pending> = LruHashMap::with_max_entries(16384, 0);

/// Per thread: how many probed calls are in flight on it (see [`Depth`]).
#[map]
static DEPTH: LruHashMap<u32, Depth> = LruHashMap::with_max_entries(16384, 0);

/// Each thread's current context (as set by `cuCtxSetCurrent` or a context creation).
#[map]
static CURRENT_CTX: LruHashMap<u32, u64> = LruHashMap::with_max_entries(16384, 0);

/// Arguments of one in-flight call. Meaning depends on the function (see the entry helpers).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Pending {
    a: u64,
    b: u64,
    c: u64,
}

/// Probed calls in flight on one thread. Only the outermost call is reported: a driver whose
/// exported function calls another exported one (`cuArrayCreate` -> `cuMemAlloc_v2`,
/// `cuDevicePrimaryCtxRelease` -> `_v2`, an interposer calling the real function, ...) would
/// otherwise report one allocation twice, possibly under two keys that never meet.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Depth {
    depth: u32,
    _pad: u32,
    /// `bpf_ktime_get_ns()` at the outermost entry.
    ts: u64,
}

/// An outermost call older than this is taken to have lost its return (so that a missed
/// return cannot silence a thread for good).
const STALE_NS: u64 = 5_000_000_000;

/// `CUDA_ARRAY_DESCRIPTOR` (`_v2`).
#[repr(C)]
#[derive(Clone, Copy)]
struct ArrayDesc {
    width: u64,
    height: u64,
    format: u32,
    channels: u32,
}

/// `CUDA_ARRAY3D_DESCRIPTOR` (`_v2`).
#[repr(C)]
#[derive(Clone, Copy)]
struct Array3dDesc {
    width: u64,
    height: u64,
    depth: u64,
    format: u32,
    channels: u32,
    flags: u32,
}

/// Head of `CUmemAllocationProp`: `type`, `requestedHandleTypes`, then `CUmemLocation`
/// (`type`, `id`).
#[repr(C)]
#[derive(Clone, Copy)]
struct AllocPropHead {
    alloc_type: u32,
    handle_types: u32,
    location_type: u32,
    location_id: i32,
}

/// `CU_MEM_LOCATION_TYPE_DEVICE`.
const LOCATION_DEVICE: u32 = 1;
/// Sent in `extra` when a device ordinal is unknown.
const NO_DEVICE: u64 = u64::MAX;

#[inline(always)]
fn bump(index: u32) {
    if let Some(p) = COUNTERS.get_ptr_mut(index) {
        // SAFETY: `p` points to this CPU's u64 slot of the per-CPU array, valid for the
        // program's run. The BPF target has no atomic read-modify-write in Rust; per-CPU
        // slots make a plain increment exact unless two programs preempt each other on the
        // same CPU (rare; a counter may then miss one).
        unsafe { *p += 1 };
    }
}

#[inline(always)]
fn ignored(pid_tgid: u64) -> bool {
    // SAFETY: a plain read of a global that user space may have rewritten before load;
    // volatile so the compiler does not fold the initial value.
    let agent = unsafe { core::ptr::read_volatile(&HAMI_AGENT_TGID) };
    agent != 0 && (pid_tgid >> 32) as u32 == agent
}

#[inline(always)]
fn key(pid_tgid: u64, slot: u64) -> u64 {
    ((pid_tgid & 0xffff_ffff) << 8) | slot
}

#[inline(always)]
fn save(slot: u64, a: u64, b: u64, c: u64) {
    let pid_tgid = bpf_get_current_pid_tgid();
    if ignored(pid_tgid) {
        return;
    }
    let tid = pid_tgid as u32;
    // SAFETY: helper without preconditions.
    let now = unsafe { bpf_ktime_get_ns() };
    if let Some(d) = DEPTH.get_ptr_mut(tid) {
        // SAFETY: `d` points to this thread's entry (only this thread writes it), valid for
        // the program's run.
        unsafe {
            if (*d).depth > 0 && now.wrapping_sub((*d).ts) < STALE_NS {
                // Nested in another probed call of this thread: that one is reported.
                (*d).depth += 1;
                return;
            }
        }
    }
    let _ = DEPTH.insert(
        tid,
        Depth {
            depth: 1,
            _pad: 0,
            ts: now,
        },
        0,
    );
    let _ = PENDING.insert(key(pid_tgid, slot), Pending { a, b, c }, 0);
}

/// Take the saved arguments of this thread's call; `None` if the call failed (or was not
/// seen at entry, which is counted as unpaired).
#[inline(always)]
fn take(ctx: &RetProbeContext, slot: u64) -> Option<(u64, Pending)> {
    let pid_tgid = bpf_get_current_pid_tgid();
    if ignored(pid_tgid) {
        return None;
    }
    let tid = pid_tgid as u32;
    if let Some(d) = DEPTH.get_ptr_mut(tid) {
        // SAFETY: as in `save`.
        unsafe {
            if (*d).depth > 1 {
                // The return of a nested call: the outer call reports.
                (*d).depth -= 1;
                return None;
            }
        }
        let _ = DEPTH.remove(tid);
    }
    let k = key(pid_tgid, slot);
    // SAFETY: the value is copied out at once; the entry belongs to this thread only.
    let saved = match unsafe { PENDING.get(k) } {
        Some(p) => *p,
        None => {
            bump(counter::UNPAIRED);
            return None;
        }
    };
    let _ = PENDING.remove(k);
    let rc: u64 = ctx.ret();
    if rc as u32 != 0 {
        return None;
    }
    Some((pid_tgid, saved))
}

#[inline(always)]
fn current_ctx(pid_tgid: u64) -> u64 {
    let tid = pid_tgid as u32;
    // SAFETY: copied out at once.
    unsafe { CURRENT_CTX.get(tid) }.copied().unwrap_or(0)
}

#[inline(always)]
fn read_u64(addr: u64) -> u64 {
    // SAFETY: bpf_probe_read_user checks the address; a fault gives an error, mapped to 0.
    unsafe { bpf_probe_read_user(addr as *const u64) }.unwrap_or(0)
}

/// `bpf_ringbuf_query` flag: bytes submitted and not yet consumed.
const RB_AVAIL_DATA: u64 = 0;
/// `bpf_ringbuf_query` flag: the ring's size in bytes.
const RB_RING_SIZE: u64 = 1;
/// `bpf_ringbuf_submit` flag: do not wake the reader.
const RB_NO_WAKEUP: u64 = 1;
/// `bpf_ringbuf_submit` flag: wake the reader.
const RB_FORCE_WAKEUP: u64 = 2;

/// How a record is submitted: without waking user space (which polls the ring every few
/// milliseconds, `hami-user`'s `probes::stream::POLL`), unless a quarter of the ring is
/// pending. A wakeup per record cost the traced call its share of waking the agent (on the
/// H200: a 1 MiB alloc+free pair +13.8 µs with the agent, against about +7 µs for its four
/// traps); the quarter keeps a burst from filling the ring between two polls.
#[inline(always)]
fn wakeup_flag() -> u64 {
    let pending = EVENTS.query(RB_AVAIL_DATA);
    let size = EVENTS.query(RB_RING_SIZE);
    if pending.saturating_mul(4) >= size {
        RB_FORCE_WAKEUP
    } else {
        RB_NO_WAKEUP
    }
}

#[inline(always)]
fn emit(kind: EventKind, pid_tgid: u64, size: u64, addr: u64, ctx: u64, extra: u64) {
    match EVENTS.reserve::<CudaEvent>(0) {
        Some(mut entry) => {
            entry.write(CudaEvent {
                kind: kind as u32,
                tgid: (pid_tgid >> 32) as u32,
                tid: pid_tgid as u32,
                result: 0,
                // SAFETY: helper without preconditions.
                ts_ns: unsafe { bpf_ktime_get_ns() },
                size,
                addr,
                ctx,
                extra,
            });
            entry.submit(wakeup_flag());
            bump(counter::SENT);
        }
        None => bump(counter::DROPPED),
    }
}

#[inline(always)]
fn arg(ctx: &ProbeContext, n: usize) -> u64 {
    ctx.arg::<u64>(n).unwrap_or(0)
}

// ---- entry helpers ------------------------------------------------------------------------

/// `(T* out, size_t size, ...)`: a = out, b = size.
#[inline(always)]
fn entry_out_size(ctx: &ProbeContext, slot: u64) {
    save(slot, arg(ctx, 0), arg(ctx, 1), 0);
}

/// `cuMemCreate(handle*, size, const CUmemAllocationProp*, flags)`: c = device ordinal.
#[inline(always)]
fn entry_mem_create(ctx: &ProbeContext, slot: u64) {
    let prop = arg(ctx, 2);
    // SAFETY: checked user-memory read.
    let dev = match unsafe { bpf_probe_read_user(prop as *const AllocPropHead) } {
        Ok(h) if h.location_type == LOCATION_DEVICE && h.location_id >= 0 => h.location_id as u64,
        _ => NO_DEVICE,
    };
    save(slot, arg(ctx, 0), arg(ctx, 1), dev);
}

/// `cuMemAllocPitch_v2(dptr*, size_t* pitch, width, height, elemsize)`: a = out,
/// b = pitch pointer, c = height.
#[inline(always)]
fn entry_pitch(ctx: &ProbeContext, slot: u64) {
    save(slot, arg(ctx, 0), arg(ctx, 1), arg(ctx, 3));
}

/// `cuArrayCreate_v2(CUarray*, const CUDA_ARRAY_DESCRIPTOR*)`: a = out, b = footprint.
#[inline(always)]
fn entry_array2d(ctx: &ProbeContext, slot: u64) {
    // SAFETY: checked user-memory read.
    let size = match unsafe { bpf_probe_read_user(arg(ctx, 1) as *const ArrayDesc) } {
        Ok(d) => array_footprint(d.width, d.height, 0, d.format, d.channels),
        Err(_) => 0,
    };
    save(slot, arg(ctx, 0), size, 0);
}

/// `cuArray3DCreate_v2(CUarray*, const CUDA_ARRAY3D_DESCRIPTOR*)`: a = out, b = footprint.
#[inline(always)]
fn entry_array3d(ctx: &ProbeContext, slot: u64) {
    // SAFETY: checked user-memory read.
    let size = match unsafe { bpf_probe_read_user(arg(ctx, 1) as *const Array3dDesc) } {
        Ok(d) => array_footprint(d.width, d.height, d.depth, d.format, d.channels),
        Err(_) => 0,
    };
    save(slot, arg(ctx, 0), size, 0);
}

/// `CUDA_ARRAY3D_LAYERED`: `depth` is a layer count, kept at every mipmap level.
const ARRAY3D_LAYERED: u32 = 0x01;
/// `CUDA_ARRAY3D_SPARSE | CUDA_ARRAY3D_DEFERRED_MAPPING`: no memory at creation (the preload
/// charges such a mipmapped array nothing either).
const ARRAY3D_NO_BACKING: u32 = 0x40 | 0x80;

/// `cuMipmappedArrayCreate(CUmipmappedArray*, const CUDA_ARRAY3D_DESCRIPTOR*, levels)`:
/// a = out, b = footprint of all levels (the level count is clamped inside
/// `mipmap_footprint`, so its loop is bounded).
#[inline(always)]
fn entry_mipmapped(ctx: &ProbeContext, slot: u64) {
    let levels = arg(ctx, 2) as u32;
    // SAFETY: checked user-memory read.
    let size = match unsafe { bpf_probe_read_user(arg(ctx, 1) as *const Array3dDesc) } {
        Ok(d) if d.flags & ARRAY3D_NO_BACKING != 0 => 0,
        Ok(d) => mipmap_footprint(
            d.width,
            d.height,
            d.depth,
            d.format,
            d.channels,
            levels,
            d.flags & ARRAY3D_LAYERED != 0,
        ),
        Err(_) => 0,
    };
    save(slot, arg(ctx, 0), size, 0);
}

/// One by-value argument (pointer to free, handle, context, device): a = arg0.
#[inline(always)]
fn entry_value(ctx: &ProbeContext, slot: u64) {
    save(slot, arg(ctx, 0), 0, 0);
}

/// `(CUcontext* out, ..., CUdevice dev at dev_arg)`: a = out, c = device.
#[inline(always)]
fn entry_ctx_out(ctx: &ProbeContext, slot: u64, dev_arg: usize) {
    save(slot, arg(ctx, 0), 0, arg(ctx, dev_arg) as u32 as u64);
}

// ---- return helpers -----------------------------------------------------------------------

#[inline(always)]
fn ret_alloc(ctx: &RetProbeContext, slot: u64, kind: EventKind) {
    if let Some((pt, p)) = take(ctx, slot) {
        emit(kind, pt, p.b, read_u64(p.a), current_ctx(pt), 0);
    }
}

#[inline(always)]
fn ret_mem_create(ctx: &RetProbeContext, slot: u64, kind: EventKind) {
    if let Some((pt, p)) = take(ctx, slot) {
        emit(kind, pt, p.b, read_u64(p.a), current_ctx(pt), p.c);
    }
}

#[inline(always)]
fn ret_pitch(ctx: &RetProbeContext, slot: u64, kind: EventKind) {
    if let Some((pt, p)) = take(ctx, slot) {
        let pitch = read_u64(p.b);
        // Clamped so the product needs no overflow check (no 128-bit multiply in BPF);
        // real pitches and heights are far below 2^32.
        let size = pitch.min(1 << 32).wrapping_mul(p.c.min(1 << 32));
        emit(kind, pt, size, read_u64(p.a), current_ctx(pt), pitch);
    }
}

#[inline(always)]
fn ret_free(ctx: &RetProbeContext, slot: u64, kind: EventKind) {
    if let Some((pt, p)) = take(ctx, slot) {
        emit(kind, pt, 0, p.a, current_ctx(pt), 0);
    }
}

#[inline(always)]
fn ret_ctx_create(ctx: &RetProbeContext, slot: u64, kind: EventKind) {
    if let Some((pt, p)) = take(ctx, slot) {
        let new_ctx = read_u64(p.a);
        let _ = CURRENT_CTX.insert(pt as u32, new_ctx, 0);
        emit(kind, pt, 0, new_ctx, new_ctx, p.c);
    }
}

#[inline(always)]
fn ret_ctx_destroy(ctx: &RetProbeContext, slot: u64, kind: EventKind) {
    if let Some((pt, p)) = take(ctx, slot) {
        let cur = current_ctx(pt);
        if cur == p.a {
            let _ = CURRENT_CTX.remove(pt as u32);
        }
        emit(kind, pt, 0, p.a, cur, 0);
    }
}

#[inline(always)]
fn ret_primary_retain(ctx: &RetProbeContext, slot: u64, kind: EventKind) {
    if let Some((pt, p)) = take(ctx, slot) {
        emit(kind, pt, 0, read_u64(p.a), current_ctx(pt), p.c);
    }
}

#[inline(always)]
fn ret_primary_release(ctx: &RetProbeContext, slot: u64, kind: EventKind) {
    if let Some((pt, p)) = take(ctx, slot) {
        emit(kind, pt, 0, 0, current_ctx(pt), p.a as u32 as u64);
    }
}

#[inline(always)]
fn ret_set_current(ctx: &RetProbeContext, slot: u64, kind: EventKind) {
    if let Some((pt, p)) = take(ctx, slot) {
        let cur = current_ctx(pt);
        if cur == p.a {
            // Unchanged: the runtime sets the same context over and over.
            return;
        }
        if p.a == 0 {
            let _ = CURRENT_CTX.remove(pt as u32);
        } else {
            let _ = CURRENT_CTX.insert(pt as u32, p.a, 0);
        }
        emit(kind, pt, 0, p.a, p.a, 0);
    }
}

// ---- dispatch by the row's probe shape -----------------------------------------------------

/// The return helper of a probed row, from its [`Shape`] and [`EventKind`].
#[derive(Clone, Copy)]
enum Ret {
    Alloc,
    Pitch,
    MemCreate,
    Free,
    CtxCreate,
    CtxDestroy,
    PrimaryRetain,
    PrimaryRelease,
    SetCurrent,
}

/// Which return helper a row with `shape` and `kind` needs.
///
/// # Panics
/// At compile time (it is only evaluated in constants), for a combination no helper
/// implements: a new shape or kind in the table needs its helpers here.
const fn ret_of(shape: Shape, kind: EventKind) -> Ret {
    match (shape, kind) {
        (Shape::Pitch, k) if k.is_alloc() => Ret::Pitch,
        (Shape::MemCreate, k) if k.is_alloc() => Ret::MemCreate,
        (Shape::OutSize | Shape::Array2d | Shape::Array3d | Shape::Mipmapped, k)
            if k.is_alloc() =>
        {
            Ret::Alloc
        }
        (Shape::Value, k) if k.is_free() => Ret::Free,
        (Shape::CtxOut { .. }, EventKind::CtxCreate) => Ret::CtxCreate,
        (Shape::CtxOut { .. }, EventKind::PrimaryCtxRetain) => Ret::PrimaryRetain,
        (Shape::Value, EventKind::CtxDestroy) => Ret::CtxDestroy,
        (Shape::Value, EventKind::PrimaryCtxRelease) => Ret::PrimaryRelease,
        (Shape::Value, EventKind::CtxSetCurrent) => Ret::SetCurrent,
        _ => panic!("no eBPF return helper for this probe shape and event kind"),
    }
}

/// The entry program's body for a row of `shape` (a constant: the match folds away).
#[inline(always)]
fn entry(ctx: &ProbeContext, slot: u64, shape: Shape) {
    match shape {
        Shape::OutSize => entry_out_size(ctx, slot),
        Shape::Pitch => entry_pitch(ctx, slot),
        Shape::MemCreate => entry_mem_create(ctx, slot),
        Shape::Array2d => entry_array2d(ctx, slot),
        Shape::Array3d => entry_array3d(ctx, slot),
        Shape::Mipmapped => entry_mipmapped(ctx, slot),
        Shape::Value => entry_value(ctx, slot),
        Shape::CtxOut { dev_arg } => entry_ctx_out(ctx, slot, dev_arg as usize),
    }
}

/// The return program's body (`ret` a constant: the match folds away).
#[inline(always)]
fn ret(ctx: &RetProbeContext, slot: u64, kind: EventKind, ret: Ret) {
    match ret {
        Ret::Alloc => ret_alloc(ctx, slot, kind),
        Ret::Pitch => ret_pitch(ctx, slot, kind),
        Ret::MemCreate => ret_mem_create(ctx, slot, kind),
        Ret::Free => ret_free(ctx, slot, kind),
        Ret::CtxCreate => ret_ctx_create(ctx, slot, kind),
        Ret::CtxDestroy => ret_ctx_destroy(ctx, slot, kind),
        Ret::PrimaryRetain => ret_primary_retain(ctx, slot, kind),
        Ret::PrimaryRelease => ret_primary_release(ctx, slot, kind),
        Ret::SetCurrent => ret_set_current(ctx, slot, kind),
    }
}

// ---- the programs -------------------------------------------------------------------------

/// Define the entry and return programs of libcuda symbols, one line each:
///
/// `symbol / symbol_ret;`
///
/// The lines are not written by hand: `build.rs` writes one per probed row of
/// [`hami_abi::intercept::INTERCEPTS`] into `$OUT_DIR/probes.rs` (an identifier cannot be
/// made from the table's strings by `macro_rules!`, so a build script makes them).
/// Everything else comes from the symbol's row: the slot (it keys the saved arguments of one
/// call, unique per symbol), the event kind and the probe shape, which picks the entry and
/// return helpers ([`entry`], [`ret_of`]; a shape and kind no helper handles does not
/// compile). A symbol that is not a probed row does not compile, and neither does a list that
/// misses a probed row. Program names are the symbol names (user space attaches by name, see
/// `hami_user::probes::PROBED_SYMBOLS`).
///
/// The programs are private: the aya-ebpf attribute macros drop doc comments but keep the
/// visibility, and `#[no_mangle]` (which they add) exports the symbol either way.
macro_rules! probes {
    ($($sym:ident / $ret:ident;)*) => {
        $(
            #[doc = concat!("Entry of `", stringify!($sym), "`.")]
            #[uprobe]
            fn $sym(ctx: ProbeContext) -> u32 {
                const SLOT: u64 = intercept::probe_slot(stringify!($sym));
                const SHAPE: Shape = intercept::probe_shape(stringify!($sym));
                entry(&ctx, SLOT, SHAPE);
                0
            }

            #[doc = concat!("Return of `", stringify!($sym), "`.")]
            #[uretprobe]
            fn $ret(ctx: RetProbeContext) -> u32 {
                const SLOT: u64 = intercept::probe_slot(stringify!($sym));
                const KIND: EventKind = intercept::probe_kind(stringify!($sym));
                const RET: Ret = ret_of(intercept::probe_shape(stringify!($sym)), KIND);
                ret(&ctx, SLOT, KIND, RET);
                0
            }

            const _: () = assert!(
                intercept::str_eq(stringify!($ret), concat!(stringify!($sym), "_ret")),
                "the return program of `symbol` must be named `symbol_ret`"
            );
        )*

        // Every name above is a probed row (or `probe_slot` fails) and appears once (or the
        // functions clash): equal counts mean every probed row has its programs.
        const _: () = assert!(
            [$(stringify!($sym)),*].len() == intercept::PROBED_COUNT,
            "a probed function of hami_abi::intercept::INTERCEPTS has no program here"
        );
    };
}

// One line per probed row of the table, written by `build.rs` (`symbol / symbol_ret;`).
include!(concat!(env!("OUT_DIR"), "/probes.rs"));

/// Raw tracepoint `sched_process_exit` (attached without tracefs): a thread exits. Forget its
/// current context; when it is the thread-group leader, report the process exit.
#[raw_tracepoint(tracepoint = "sched_process_exit")]
fn sched_process_exit(_ctx: RawTracePointContext) -> u32 {
    let pt = bpf_get_current_pid_tgid();
    let tid = pt as u32;
    let _ = CURRENT_CTX.remove(tid);
    let _ = DEPTH.remove(tid);
    if tid == (pt >> 32) as u32 && !ignored(pt) {
        emit(EventKind::ProcessExit, pt, 0, 0, 0, 0);
    }
    0
}

#[cfg(target_arch = "bpf")]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

/// License of the programs (GPL-compatible: needed for `bpf_probe_read_user`).
#[cfg(target_arch = "bpf")]
#[link_section = "license"]
#[no_mangle]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";

/// Host builds (`cargo build --workspace`): nothing to run.
#[cfg(not(target_arch = "bpf"))]
fn main() {}
