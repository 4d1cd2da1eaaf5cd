//! Context limits (`cuCtxSetLimit` / `cuCtxGetLimit`) and the device memory they take, as
//! measured on the H200 (driver 580):
//!
//! * the stack (`CU_LIMIT_STACK_SIZE`) is reserved for every thread the device can hold
//!   resident ([`RESIDENT_THREADS`]): raising it takes `(new - old) x resident threads` at the
//!   set call, lowering it gives that back at once;
//! * a launch of a kernel that needs more local memory per thread than the stack limit raises
//!   the limit to it and takes the growth (kept afterwards);
//! * the malloc heap and the printf FIFO take nothing at the set call: a raised size is put on
//!   the device at the next launch, and once a launch happened they cannot be changed
//!   (`CUDA_ERROR_INVALID_VALUE`). The heap takes its size and a 2 MiB page
//!   ([`heap_bytes`]); the FIFO takes 1/512 of its
//!   size in whole 2 MiB pages, rounded down ([`fifo_bytes`]), and is capped at
//!   2 GiB (a larger set succeeds and reads back 2 GiB). Measured on the H100 (driver 580):
//!   the real driver takes both at the first launch of a kernel that calls `malloc` /
//!   `printf`; the fake, which has no such kernels, at the next launch of any.
//!
//! The defaults are what a fresh H200 context reports; the memory of the defaults is part of
//! the context's overhead, so only what a limit holds beyond its default is charged.

use crate::ffi::*;

/// `CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT` of the fake device (an H200).
pub const MULTIPROCESSORS: u64 = 132;
/// `CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR` of the fake device.
pub const THREADS_PER_MULTIPROCESSOR: u64 = 2048;
/// Threads the device can hold resident: what the stack / local memory is reserved for.
pub const RESIDENT_THREADS: u64 = MULTIPROCESSORS * THREADS_PER_MULTIPROCESSOR;

/// `CU_LIMIT_STACK_SIZE`.
pub const LIMIT_STACK_SIZE: i32 = 0;
/// `CU_LIMIT_PRINTF_FIFO_SIZE`.
pub const LIMIT_PRINTF_FIFO_SIZE: i32 = 1;
/// `CU_LIMIT_MALLOC_HEAP_SIZE`.
pub const LIMIT_MALLOC_HEAP_SIZE: i32 = 2;
/// Limits the fake stores without modelling memory: `CU_LIMIT_DEV_RUNTIME_SYNC_DEPTH` (3),
/// `CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT` (4), `CU_LIMIT_MAX_L2_FETCH_GRANULARITY` (5),
/// `CU_LIMIT_PERSISTING_L2_CACHE_SIZE` (6).
const STORED: std::ops::RangeInclusive<i32> = 3..=6;
/// Documented limits the fake device does not support (`CUDA_ERROR_UNSUPPORTED_LIMIT`):
/// `CU_LIMIT_SHMEM_SIZE` (7), `CU_LIMIT_CIG_ENABLED` (8),
/// `CU_LIMIT_CIG_SHMEM_FALLBACK_ENABLED` (9).
const UNSUPPORTED: std::ops::RangeInclusive<i32> = 7..=9;

/// Default `CU_LIMIT_STACK_SIZE` (bytes per thread).
pub const DEFAULT_STACK: u64 = 1024;
/// Default `CU_LIMIT_PRINTF_FIFO_SIZE`.
pub const DEFAULT_PRINTF_FIFO: u64 = 8_650_752;
/// Default `CU_LIMIT_MALLOC_HEAP_SIZE`.
pub const DEFAULT_HEAP: u64 = 8 << 20;
/// Defaults of limits 3..=6.
const DEFAULT_STORED: [u64; 4] = [0, 2048, 0, 0];

/// One context's limits.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// `CU_LIMIT_STACK_SIZE` (bytes per thread): also the local memory reserved.
    pub stack: u64,
    /// `CU_LIMIT_PRINTF_FIFO_SIZE` as set.
    pub printf_fifo: u64,
    /// `CU_LIMIT_MALLOC_HEAP_SIZE` as set.
    pub heap: u64,
    /// The FIFO size on the device (the default until a launch after a raise).
    pub(super) printf_resident: u64,
    /// The heap size on the device (likewise).
    pub(super) heap_resident: u64,
    /// Limits 3..=6.
    pub(super) stored: [u64; 4],
    /// A kernel was launched in the context: heap and FIFO are fixed.
    pub(super) launched: bool,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            stack: DEFAULT_STACK,
            printf_fifo: DEFAULT_PRINTF_FIFO,
            heap: DEFAULT_HEAP,
            printf_resident: DEFAULT_PRINTF_FIFO,
            heap_resident: DEFAULT_HEAP,
            stored: DEFAULT_STORED,
            launched: false,
        }
    }
}

/// Device memory a malloc heap of `size` bytes holds once placed, beyond the context's own:
/// its size and a 2 MiB page (measured: 1 GiB +1026 MiB, 64 MiB +66); the default's is part
/// of the context's overhead.
pub fn heap_bytes(size: u64) -> u64 {
    if size == DEFAULT_HEAP {
        0
    } else {
        size.saturating_add(2 << 20)
    }
}

/// The largest printf FIFO the driver sets (H100, driver 580): a larger request reads back
/// this.
pub const MAX_PRINTF_FIFO: u64 = 2 << 30;

/// Device memory a printf FIFO of `size` bytes holds: 1/512 of it in whole 2 MiB pages
/// (measured: 1 GiB +2 MiB, 2 GiB +4 MiB, 64 MiB and the default nothing).
pub fn fifo_bytes(size: u64) -> u64 {
    let page = 2 << 20;
    size / 512 / page * page
}

/// Device memory a stack limit of `stack` bytes per thread holds beyond the default's.
pub fn stack_bytes(stack: u64) -> u64 {
    stack
        .saturating_sub(DEFAULT_STACK)
        .saturating_mul(RESIDENT_THREADS)
}

impl Limits {
    /// Everything this context's limits hold on the device beyond the defaults.
    pub(super) fn held(&self) -> u64 {
        stack_bytes(self.stack)
            .saturating_add(heap_bytes(self.heap_resident))
            .saturating_add(fifo_bytes(self.printf_resident))
    }

    /// The value of `limit`, or the documented error for an unknown / unsupported one.
    pub fn get(&self, limit: i32) -> R<u64> {
        match limit {
            LIMIT_STACK_SIZE => Ok(self.stack),
            LIMIT_PRINTF_FIFO_SIZE => Ok(self.printf_fifo),
            LIMIT_MALLOC_HEAP_SIZE => Ok(self.heap),
            l if STORED.contains(&l) => Ok(self.stored[(l - 3) as usize]),
            l if UNSUPPORTED.contains(&l) => Err(CUDA_ERROR_UNSUPPORTED_LIMIT),
            _ => Err(CUDA_ERROR_INVALID_VALUE),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stack_bytes_are_the_growth_over_the_default_for_every_resident_thread() {
        assert_eq!(stack_bytes(DEFAULT_STACK), 0);
        assert_eq!(stack_bytes(512), 0);
        // Measured on the H200: 8 KiB -> +1848 MiB, a 24 KiB local array -> +6072 MiB.
        assert_eq!(stack_bytes(8192), 1848 << 20);
        assert_eq!(stack_bytes(24 << 10), 6072 << 20);
    }

    #[test]
    fn limits_report_defaults_and_documented_errors() {
        let l = Limits::default();
        assert_eq!(l.get(LIMIT_STACK_SIZE), Ok(1024));
        assert_eq!(l.get(LIMIT_PRINTF_FIFO_SIZE), Ok(8_650_752));
        assert_eq!(l.get(LIMIT_MALLOC_HEAP_SIZE), Ok(8 << 20));
        assert_eq!(l.get(3), Ok(0));
        assert_eq!(l.get(4), Ok(2048));
        assert_eq!(l.get(7), Err(CUDA_ERROR_UNSUPPORTED_LIMIT));
        assert_eq!(l.get(10), Err(CUDA_ERROR_INVALID_VALUE));
        assert_eq!(l.get(-1), Err(CUDA_ERROR_INVALID_VALUE));
    }

    #[test]
    fn the_fifo_holds_a_512th_of_its_size_in_whole_pages() {
        assert_eq!(fifo_bytes(DEFAULT_PRINTF_FIFO), 0);
        assert_eq!(fifo_bytes(64 << 20), 0);
        assert_eq!(fifo_bytes((1 << 30) - 1), 0);
        assert_eq!(fifo_bytes(1 << 30), 2 << 20);
        assert_eq!(fifo_bytes(MAX_PRINTF_FIFO), 4 << 20);
        assert_eq!(fifo_bytes(4 << 30), 8 << 20);
    }

    #[test]
    fn held_counts_the_resident_heap_not_the_one_only_set() {
        let mut l = Limits {
            heap: 2 << 30,
            ..Limits::default()
        };
        assert_eq!(l.held(), 0);
        l.heap_resident = l.heap;
        assert_eq!(l.held(), (2 << 30) + (2 << 20));
    }
}
