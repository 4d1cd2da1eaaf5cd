use super::*;
use crate::ffi::cuda::{CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_UNSUPPORTED_LIMIT};
use crate::ledger::accounting::MemLedger;
use std::cell::{Cell, RefCell};

const MB: u64 = 1 << 20;
const RESIDENT: u64 = 132 * 2048;

/// A driver model: the H200's stack/heap/FIFO defaults, one context.
struct Model {
    limits: RefCell<[u64; 5]>,
    locals: HashMap<u64, u64>,
    sets: Cell<u32>,
    local_reads: Cell<u32>,
    set_result: Cell<CUresult>,
}

impl Model {
    fn new() -> Model {
        Model {
            limits: RefCell::new([1024, 8_650_752, 8 * MB, 0, 2048]),
            locals: HashMap::from([(0xf1, 24 << 10), (0xf2, 512), (0xf3, 0)]),
            sets: Cell::new(0),
            local_reads: Cell::new(0),
            set_result: Cell::new(CUDA_SUCCESS),
        }
    }
}

impl LimitDriver for Model {
    fn get_limit(&self, limit: i32) -> Result<u64, CUresult> {
        let l = usize::try_from(limit).map_err(|_| CUDA_ERROR_INVALID_VALUE)?;
        self.limits
            .borrow()
            .get(l)
            .copied()
            .ok_or(CUDA_ERROR_UNSUPPORTED_LIMIT)
    }
    fn set_limit(&self, limit: i32, value: u64) -> CUresult {
        self.sets.set(self.sets.get() + 1);
        if self.set_result.get() != CUDA_SUCCESS {
            return self.set_result.get();
        }
        match self.limits.borrow_mut().get_mut(limit as usize) {
            Some(v) => {
                // The driver caps the printf FIFO at 2 GiB (H100, driver 580).
                *v = if limit == 1 {
                    value.min(2048 * MB)
                } else {
                    value
                };
                CUDA_SUCCESS
            }
            None => CUDA_ERROR_UNSUPPORTED_LIMIT,
        }
    }
    fn resident_threads(&self, _dev: usize) -> Option<u64> {
        Some(RESIDENT)
    }
    fn local_size(&self, func: u64, _dev: usize) -> Option<u64> {
        self.local_reads.set(self.local_reads.get() + 1);
        self.locals.get(&func).copied()
    }
}

const CTX: usize = 0xc0;
fn cur() -> Option<(usize, usize)> {
    Some((0, CTX))
}

#[test]
fn sizing_follows_the_documented_limits() {
    assert_eq!(sizing(0), Sizing::PerThread);
    assert_eq!(sizing(1), Sizing::Fifo);
    assert_eq!(sizing(2), Sizing::Heap);
    assert_eq!(sizing(3), Sizing::Measured);
    assert_eq!(sizing(4), Sizing::Measured);
    assert_eq!(sizing(5), Sizing::None);
    assert_eq!(sizing(-1), Sizing::None);
}

#[test]
fn changes_are_sized_as_the_h200_takes_them() {
    // Measured: stack 1024 -> 8192 took 1848 MiB; a 24 KiB local array 6072 MiB.
    assert_eq!(
        limit_change(Sizing::PerThread, 1024, 8192, RESIDENT),
        1848 << 20
    );
    assert_eq!(
        limit_change(Sizing::PerThread, 8192, 1024, RESIDENT),
        -(1848 << 20)
    );
    assert_eq!(local_growth(24 << 10, 1024, RESIDENT), 6072 << 20);
    assert_eq!(local_growth(512, 1024, RESIDENT), 0);
    // The heap: its size and a page, the default charged nothing (H100, driver 580: 1 GiB
    // +1026 MiB at the first launch of a kernel calling malloc).
    assert_eq!(
        limit_change(Sizing::Heap, 8 * MB, 2048 * MB, RESIDENT),
        i128::from(2050 * MB)
    );
    assert_eq!(heap_bytes(DEFAULT_HEAP), 0);
    assert_eq!(heap_bytes(1024 * MB), 1026 * MB);
    assert_eq!(
        heap_bytes(4 * MB),
        6 * MB,
        "below the default: what the driver takes"
    );
    assert_eq!(
        limit_change(Sizing::Heap, 1024 * MB, 8 * MB, RESIDENT),
        -i128::from(1026 * MB)
    );
    assert_eq!(limit_change(Sizing::Measured, 0, 100, RESIDENT), 0);
    assert_eq!(
        limit_change(Sizing::PerThread, 0, u64::MAX, u64::MAX),
        i128::MAX
    );
    assert_eq!(resident_threads(132, 2048), Some(RESIDENT));
    assert_eq!(resident_threads(0, 2048), None);
    assert_eq!(resident_threads(132, -1), None);
}

#[test]
fn a_stack_raise_over_the_limit_is_refused_without_the_driver() {
    let l = MemLedger::with_limit(0, 1024 * MB);
    let d = Model::new();
    let t = Limits::default();
    let e = t.set_limit(&l, &d, 0, CTX, 0, 8192).unwrap_err();
    assert_eq!(e.code(), CUDA_ERROR_OUT_OF_MEMORY);
    assert_eq!(d.sets.get(), 0, "the driver is not called");
    assert_eq!(d.get_limit(0), Ok(1024));
    assert_eq!(l.total(0), 0);
}

#[test]
fn a_stack_raise_is_charged_and_its_lowering_gives_it_back() {
    let l = MemLedger::with_limit(0, 4096 * MB);
    let d = Model::new();
    let t = Limits::default();
    t.set_limit(&l, &d, 0, CTX, 0, 8192).unwrap();
    assert_eq!(l.used(0, UsageKind::Context), 1848 * MB);
    assert_eq!(t.charges(CTX).unwrap().reserved, 8192);
    // Lowering below the first-seen value gives back only what was charged.
    t.set_limit(&l, &d, 0, CTX, 0, 512).unwrap();
    assert_eq!(l.used(0, UsageKind::Context), 0);
    assert_eq!(t.charges(CTX).unwrap().stack, 0);
}

#[test]
fn a_refused_driver_call_keeps_nothing_charged() {
    let l = MemLedger::with_limit(0, 4096 * MB);
    let d = Model::new();
    d.set_result.set(CUDA_ERROR_INVALID_VALUE);
    let t = Limits::default();
    let e = t.set_limit(&l, &d, 0, CTX, 2, 512 * MB).unwrap_err();
    assert_eq!(e, LimitError::Driver(CUDA_ERROR_INVALID_VALUE));
    assert_eq!(l.total(0), 0);
}

#[test]
fn heap_raises_are_charged_by_their_size_fifo_raises_by_the_driver_s_footprint() {
    let l = MemLedger::with_limit(0, 1024 * MB);
    let d = Model::new();
    let t = Limits::default();
    let e = t.set_limit(&l, &d, 0, CTX, 2, 2048 * MB).unwrap_err();
    assert!(matches!(
        e,
        LimitError::Denied {
            what: "malloc heap",
            ..
        }
    ));
    assert_eq!(d.sets.get(), 0);
    t.set_limit(&l, &d, 0, CTX, 2, 264 * MB).unwrap();
    // 100 MiB of FIFO beyond the default: 1/512 of it, one 2 MiB page.
    t.set_limit(&l, &d, 0, CTX, 1, 8_650_752 + 100 * MB)
        .unwrap();
    assert_eq!(l.used(0, UsageKind::Context), 266 * MB + 2 * MB);
    t.set_limit(&l, &d, 0, CTX, 2, 8 * MB).unwrap();
    assert_eq!(l.used(0, UsageKind::Context), 2 * MB);
    // Device-runtime and other limits pass through, uncharged.
    t.set_limit(&l, &d, 0, CTX, 4, 4096).unwrap();
    assert_eq!(l.used(0, UsageKind::Context), 2 * MB);
    t.drop_context(&l, CTX);
    assert_eq!(l.total(0), 0);
    assert_eq!(t.charges(CTX), None);
}

#[test]
fn the_fifo_footprint_follows_the_measured_driver() {
    assert_eq!(fifo_bytes(0), 0);
    assert_eq!(fifo_bytes(DEFAULT_PRINTF_FIFO), 0);
    assert_eq!(fifo_bytes(64 * MB), 2 * MB, "rounded up to a page");
    // H100, driver 580: a 1 GiB FIFO +2 MiB, a 2 GiB one +4 MiB.
    assert_eq!(fifo_bytes(1024 * MB), 2 * MB);
    assert_eq!(fifo_bytes(2048 * MB), 4 * MB);
    assert_eq!(
        fifo_bytes(u64::MAX),
        (u64::MAX / 512).div_ceil(2 * MB) * 2 * MB
    );
}

#[test]
fn a_1_gib_fifo_fits_a_1_gib_container_that_holds_518_mib() {
    let l = MemLedger::with_limit(0, 1024 * MB);
    l.try_charge(0, UsageKind::Context, 518 * MB).unwrap();
    let d = Model::new();
    let t = Limits::default();
    t.set_limit(&l, &d, 0, CTX, 1, 1024 * MB).unwrap();
    assert_eq!(d.get_limit(1), Ok(1024 * MB));
    assert_eq!(l.used(0, UsageKind::Context), 520 * MB);
    // Asked 16 GiB, the driver sets 2 GiB: charged for what it set (4 MiB), not for 32.
    t.set_limit(&l, &d, 0, CTX, 1, 16384 * MB).unwrap();
    assert_eq!(d.get_limit(1), Ok(2048 * MB));
    assert_eq!(l.used(0, UsageKind::Context), 522 * MB);
    // Lowered to the default: all of it back.
    t.set_limit(&l, &d, 0, CTX, 1, DEFAULT_PRINTF_FIFO).unwrap();
    assert_eq!(l.used(0, UsageKind::Context), 518 * MB);
}

#[test]
fn a_fifo_that_does_not_fit_is_refused_before_the_driver() {
    let l = MemLedger::with_limit(0, 1024 * MB);
    l.try_charge(0, UsageKind::Context, 1021 * MB).unwrap();
    let d = Model::new();
    let t = Limits::default();
    // 2 GiB of FIFO takes 4 MiB: 3 MiB are left.
    let e = t.set_limit(&l, &d, 0, CTX, 1, 2048 * MB).unwrap_err();
    assert!(matches!(
        e,
        LimitError::Denied {
            what: "printf FIFO",
            bytes,
            ..
        } if bytes == 4 * MB
    ));
    assert_eq!(d.sets.get(), 0);
    assert_eq!(d.get_limit(1), Ok(DEFAULT_PRINTF_FIFO));
    // 1 GiB (2 MiB) still fits.
    t.set_limit(&l, &d, 0, CTX, 1, 1024 * MB).unwrap();
    assert_eq!(l.used(0, UsageKind::Context), 1023 * MB);
}

#[test]
fn a_pending_heap_raise_is_realised_by_the_next_launch_only() {
    let l = MemLedger::with_limit(0, 4096 * MB);
    let d = Model::new();
    let t = Limits::default();
    t.after_launch(true, cur);
    assert_eq!(t.on_device(0), 0);
    t.set_limit(&l, &d, 0, CTX, 2, 520 * MB).unwrap();
    t.set_limit(&l, &d, 0, CTX, 2, 264 * MB).unwrap(); // lowered before any launch
    assert_eq!(t.charges(CTX).unwrap().pending, 266 * MB);
    t.after_launch(false, cur); // a failed launch puts nothing there
    assert_eq!(t.on_device(0), 0);
    t.after_launch(true, cur);
    assert_eq!(t.on_device(0), 266 * MB);
    t.after_launch(true, cur);
    assert_eq!(t.on_device(0), 266 * MB, "once");
    assert_eq!(l.used(0, UsageKind::Context), 266 * MB, "still charged");
    // The stack is there at the set; the context's end takes everything away.
    t.set_limit(&l, &d, 0, CTX, 0, 2048).unwrap();
    assert_eq!(t.on_device(0), 266 * MB + 264 * MB);
    t.set_limit(&l, &d, 0, CTX, 0, 1536).unwrap();
    assert_eq!(t.on_device(0), 266 * MB + 132 * MB);
    t.drop_context(&l, CTX);
    assert_eq!(t.on_device(0), 0);
    assert_eq!(l.total(0), 0);
}

#[test]
fn a_launch_needing_local_memory_is_admitted_first_and_set_once() {
    let l = MemLedger::with_limit(0, 8192 * MB);
    let d = Model::new();
    let t = Limits::default();
    t.before_launch(&l, &d, 0xf1, cur).unwrap();
    assert_eq!(l.used(0, UsageKind::Context), 6072 * MB);
    assert_eq!(d.get_limit(0), Ok(24 << 10), "the stack limit was raised");
    assert_eq!(d.sets.get(), 1);
    for _ in 0..10 {
        t.before_launch(&l, &d, 0xf1, cur).unwrap();
        t.before_launch(&l, &d, 0xf2, cur).unwrap();
    }
    assert_eq!(d.sets.get(), 1, "later launches grow nothing");
    assert_eq!(d.local_reads.get(), 2, "local sizes are cached");
    assert_eq!(l.used(0, UsageKind::Context), 6072 * MB);
    // Lowering the limit gives it back; the next launch grows it again.
    t.set_limit(&l, &d, 0, CTX, 0, 1024).unwrap();
    assert_eq!(l.used(0, UsageKind::Context), 0);
    t.before_launch(&l, &d, 0xf1, cur).unwrap();
    assert_eq!(l.used(0, UsageKind::Context), 6072 * MB);
}

#[test]
fn a_launch_beyond_the_quota_is_refused_and_changes_nothing() {
    let l = MemLedger::with_limit(0, 1024 * MB);
    let d = Model::new();
    let t = Limits::default();
    let e = t.before_launch(&l, &d, 0xf1, cur).unwrap_err();
    assert_eq!(e.code(), CUDA_ERROR_OUT_OF_MEMORY);
    assert_eq!(d.sets.get(), 0);
    assert_eq!(d.get_limit(0), Ok(1024));
    assert_eq!(l.total(0), 0);
    // Small kernels still launch.
    t.before_launch(&l, &d, 0xf2, cur).unwrap();
    t.before_launch(&l, &d, 0xf3, cur).unwrap();
}

#[test]
fn a_driver_out_of_memory_refuses_the_launch_and_uncharges() {
    let l = MemLedger::with_limit(0, 8192 * MB);
    let d = Model::new();
    d.set_result.set(CUDA_ERROR_OUT_OF_MEMORY);
    let t = Limits::default();
    let e = t.before_launch(&l, &d, 0xf1, cur).unwrap_err();
    assert_eq!(e, LimitError::Driver(CUDA_ERROR_OUT_OF_MEMORY));
    assert_eq!(l.total(0), 0);
}

#[test]
fn a_limit_grown_elsewhere_is_not_charged_or_lowered() {
    let l = MemLedger::with_limit(0, 8192 * MB);
    let d = Model::new();
    let t = Limits::default();
    t.before_launch(&l, &d, 0xf2, cur).unwrap(); // records the context at 1024
    d.limits.borrow_mut()[0] = 32 << 10; // an unhooked path grew it
    t.before_launch(&l, &d, 0xf1, cur).unwrap();
    assert_eq!(d.get_limit(0), Ok(32 << 10));
    assert_eq!(l.total(0), 0);
}

#[test]
fn a_measured_limit_is_charged_and_launches_still_grow() {
    let l = MemLedger::with_limit(0, 8192 * MB);
    let d = Model::new();
    let t = Limits::default();
    t.charge_measured(&l, &d, 0, CTX, 64 * MB).unwrap();
    let e = t.charge_measured(&l, &d, 0, CTX, 8192 * MB).unwrap_err();
    assert_eq!(e.code(), CUDA_ERROR_OUT_OF_MEMORY);
    t.before_launch(&l, &d, 0xf1, cur).unwrap();
    assert_eq!(l.used(0, UsageKind::Context), 64 * MB + 6072 * MB);
    t.drop_context(&l, CTX);
    assert_eq!(l.total(0), 0);
}

#[test]
fn forgotten_functions_are_read_again() {
    let l = MemLedger::with_limit(0, 8192 * MB);
    let d = Model::new();
    let t = Limits::default();
    t.before_launch(&l, &d, 0xf3, cur).unwrap();
    t.before_launch(&l, &d, 0xf3, cur).unwrap();
    assert_eq!(d.local_reads.get(), 1);
    t.forget_functions();
    t.before_launch(&l, &d, 0xf3, cur).unwrap();
    assert_eq!(d.local_reads.get(), 2);
}

#[test]
fn concurrent_launches_charge_one_growth() {
    use std::sync::Arc;
    /// A thread-safe model of the stack limit only.
    struct Shared(Mutex<u64>, AtomicU32);
    impl LimitDriver for Shared {
        fn get_limit(&self, _: i32) -> Result<u64, CUresult> {
            Ok(*self.0.lock().unwrap())
        }
        fn set_limit(&self, _: i32, v: u64) -> CUresult {
            self.1.fetch_add(1, Ordering::Relaxed);
            *self.0.lock().unwrap() = v;
            CUDA_SUCCESS
        }
        fn resident_threads(&self, _: usize) -> Option<u64> {
            Some(RESIDENT)
        }
        fn local_size(&self, _: u64, _: usize) -> Option<u64> {
            Some(24 << 10)
        }
    }
    let l = Arc::new(MemLedger::with_limit(0, 8192 * MB));
    let d = Arc::new(Shared(Mutex::new(1024), AtomicU32::new(0)));
    let t = Arc::new(Limits::default());
    let hs: Vec<_> = (0..8)
        .map(|_| {
            let (l, d, t) = (l.clone(), d.clone(), t.clone());
            std::thread::spawn(move || {
                for _ in 0..100 {
                    t.before_launch(&*l, &*d, 0xf1, cur).unwrap();
                }
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
    assert_eq!(l.used(0, UsageKind::Context), 6072 * MB);
    assert_eq!(d.1.load(Ordering::Relaxed), 1);
}
