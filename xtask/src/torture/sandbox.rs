//! [`sandbox`]: the sandbox every scenario runs in.

use hami_test_harness::TestEnv;

/// A sandbox of one scenario: its own region and fake-driver state, the preload on, one
/// device of 1 TiB (the limit is the region's), no context memory (so that `used` is data
/// only and never legitimately above the limit).
pub(super) fn sandbox(limit: u64) -> TestEnv {
    TestEnv::new()
        .preload(true)
        .env("CUDA_DEVICE_MEMORY_LIMIT", &limit.to_string())
        .env("FAKE_CUDA_DEVICE_COUNT", "1")
        .env("FAKE_CUDA_TOTAL_MEM", "1T")
        .env("FAKE_CUDA_CTX_OVERHEAD", "0")
        .env("HAMI_CONTEXT_OVERHEAD", "0")
        .env("LIBCUDA_LOG_LEVEL", "0")
}
