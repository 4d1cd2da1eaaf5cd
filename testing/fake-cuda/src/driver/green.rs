//! Green contexts (CUDA 12.4+): a device's SM resource, resource descriptors, and green
//! contexts that take device memory of their own at creation (about 5 MiB each on the H200,
//! `FAKE_CUDA_GREEN_CTX_OVERHEAD`), given back at `cuGreenCtxDestroy`: their knob and state
//! (the calls are in `context.rs`).

use std::collections::HashMap;

/// Bytes a green context takes (`FAKE_CUDA_GREEN_CTX_OVERHEAD`, default 5 MiB as on the H200).
pub fn green_overhead() -> u64 {
    std::env::var("FAKE_CUDA_GREEN_CTX_OVERHEAD")
        .ok()
        .and_then(|v| fake_state::parse_size(&v))
        .unwrap_or(5 << 20)
}

/// Process-local green context state.
#[derive(Default, Debug)]
pub struct Greens {
    /// Resource descriptors: handle -> CUDA ordinal.
    pub(super) descs: HashMap<u64, usize>,
    /// Green contexts: handle -> (physical device, bytes charged).
    pub(super) ctxs: HashMap<u64, (usize, u64)>,
}
