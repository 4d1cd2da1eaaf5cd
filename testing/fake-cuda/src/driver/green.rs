//! Green contexts (CUDA 12.4+): a device's SM resource, resource descriptors, and green
//! contexts that take device memory of their own at creation (about 5 MiB each on the H200,
//! `FAKE_CUDA_GREEN_CTX_OVERHEAD`), given back at `cuGreenCtxDestroy`.

use std::collections::HashMap;

use super::{Inner, R};
use crate::ffi::*;

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
    descs: HashMap<u64, usize>,
    /// Green contexts: handle -> (physical device, bytes charged).
    ctxs: HashMap<u64, (usize, u64)>,
}

impl Inner {
    /// `cuDevResourceGenerateDesc` of resources of `ordinal`.
    pub fn green_desc(&mut self, ordinal: usize) -> u64 {
        let h = self.handle(0x6d);
        self.greens.descs.insert(h, ordinal);
        h
    }

    /// `cuGreenCtxCreate`: `CU_GREEN_CTX_DEFAULT_STREAM` (1) is required; the descriptor must
    /// be one of `dev`.
    pub fn green_create(&mut self, desc: u64, dev: CUdevice, flags: u32) -> R<u64> {
        let phys = self.phys_of(dev)?;
        if flags != 1 || self.greens.descs.get(&desc) != Some(&(dev as usize)) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let bytes = green_overhead();
        self.charge(phys, bytes)?;
        let h = self.handle(0x6e);
        self.greens.ctxs.insert(h, (phys, bytes));
        Ok(h)
    }

    /// `cuGreenCtxDestroy`.
    pub fn green_destroy(&mut self, h: u64) -> R<()> {
        let (phys, bytes) = self
            .greens
            .ctxs
            .remove(&h)
            .ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        self.uncharge(phys, bytes);
        Ok(())
    }
}
