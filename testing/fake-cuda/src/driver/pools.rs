//! Stream-ordered memory pools: default, current and created pools, their reserve, trim
//! and attributes, and allocations from them.

use super::{pool_granule, Alloc, Inner, Kind, Pool, R};
use crate::ffi::*;

impl Inner {
    /// `cuMemPoolCreate`.
    pub fn pool_create(&mut self, ordinal: CUdevice) -> R<u64> {
        let phys = self.phys_of(ordinal)?;
        let h = self.handle(0xb0);
        self.pools.insert(h, Pool::new(ordinal as usize, phys));
        Ok(h)
    }

    /// `cuMemPoolDestroy`: unused memory goes back at once, the rest when its allocations
    /// are freed. A device whose current pool it was uses its default pool again.
    pub fn pool_destroy(&mut self, h: u64) -> R<()> {
        if self.default_pools.values().any(|&p| p == h) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        match self.pools.get(&h) {
            Some(p) if !p.destroyed => {}
            _ => return Err(CUDA_ERROR_INVALID_VALUE),
        }
        self.current_pools.retain(|_, p| *p != h);
        self.pool_shrink(h, 0);
        let gone = match self.pools.get_mut(&h) {
            Some(p) if p.used == 0 => true,
            Some(p) => {
                p.destroyed = true;
                false
            }
            None => false,
        };
        if gone {
            self.pools.remove(&h);
        }
        Ok(())
    }

    /// `cuDeviceGetDefaultMemPool`.
    pub fn default_pool(&mut self, ordinal: CUdevice) -> R<u64> {
        let phys = self.phys_of(ordinal)?;
        let o = ordinal as usize;
        if let Some(&h) = self.default_pools.get(&o) {
            return Ok(h);
        }
        let h = self.handle(0xb1);
        self.pools.insert(h, Pool::new(o, phys));
        self.default_pools.insert(o, h);
        Ok(h)
    }

    /// `cuDeviceGetMemPool`: the current pool of a device.
    pub fn current_pool(&mut self, ordinal: CUdevice) -> R<u64> {
        self.phys_of(ordinal)?;
        match self.current_pools.get(&(ordinal as usize)) {
            Some(&h) => Ok(h),
            None => self.default_pool(ordinal),
        }
    }

    /// `cuDeviceSetMemPool`: the pool must be located on that device.
    pub fn set_current_pool(&mut self, ordinal: CUdevice, h: u64) -> R<()> {
        self.phys_of(ordinal)?;
        match self.pools.get(&h) {
            Some(p) if !p.destroyed && p.ordinal == ordinal as usize => {
                self.current_pools.insert(ordinal as usize, h);
                Ok(())
            }
            _ => Err(CUDA_ERROR_INVALID_VALUE),
        }
    }

    /// Ordinal of a (live) pool.
    pub fn pool_ordinal(&self, h: u64) -> R<usize> {
        match self.pools.get(&h) {
            Some(p) if !p.destroyed => Ok(p.ordinal),
            _ => Err(CUDA_ERROR_INVALID_VALUE),
        }
    }

    /// A stream-ordered allocation of `size` bytes from pool `h`: the pool grows by what its
    /// unused reserve lacks, rounded up to [`pool_granule`]; only the growth is charged.
    pub fn pool_alloc(&mut self, h: u64, size: u64) -> R<u64> {
        let (ctx, _) = self.current()?;
        let p = *self.pools.get(&h).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        let free = p.reserved.saturating_sub(p.used);
        let mut growth = 0;
        if size > free {
            let g = pool_granule();
            growth = (size - free)
                .checked_next_multiple_of(g)
                .ok_or(CUDA_ERROR_OUT_OF_MEMORY)?;
            if self.charge(p.phys, growth).is_err() {
                // As the real driver, give back what other pools keep unused, then retry.
                let others: Vec<u64> = self.pools.keys().copied().filter(|&k| k != h).collect();
                for k in others {
                    self.pool_shrink(k, 0);
                }
                self.charge(p.phys, growth)?;
            }
        }
        let ptr = self.shared().next_address(p.phys, size);
        if let Some(p) = self.pools.get_mut(&h) {
            p.reserved += growth;
            p.used += size;
            p.reserved_high = p.reserved_high.max(p.reserved);
            p.used_high = p.used_high.max(p.used);
        }
        self.allocs.insert(
            ptr,
            Alloc {
                phys: p.phys,
                ctx,
                size,
                charged: 0,
                kind: Kind::Async,
                pool: Some(h),
            },
        );
        Ok(ptr)
    }

    /// An allocation of `size` bytes went back to pool `h`.
    pub(super) fn pool_give_back(&mut self, h: u64, size: u64) {
        let Some(p) = self.pools.get_mut(&h) else {
            return;
        };
        p.used = p.used.saturating_sub(size);
        if p.destroyed && p.used == 0 {
            let (phys, reserved) = (p.phys, p.reserved);
            self.pools.remove(&h);
            self.uncharge(phys, reserved);
        }
    }

    /// Releases pool `h`'s unused memory down to `keep` bytes reserved (never below what its
    /// live allocations need, rounded up to the granule). Returns the bytes released.
    fn pool_shrink(&mut self, h: u64, keep: u64) -> u64 {
        let Some(p) = self.pools.get_mut(&h) else {
            return 0;
        };
        let floor = p
            .used
            .checked_next_multiple_of(pool_granule())
            .unwrap_or(p.used)
            .max(keep);
        if p.reserved <= floor {
            return 0;
        }
        let released = p.reserved - floor;
        p.reserved = floor;
        let phys = p.phys;
        self.uncharge(phys, released);
        released
    }

    /// `cuMemPoolTrimTo`.
    pub fn pool_trim(&mut self, h: u64, keep: u64) -> R<()> {
        self.pool_ordinal(h)?;
        self.pool_shrink(h, keep);
        Ok(())
    }

    /// What a stream, event or context synchronisation does to pools: each gives back its
    /// unused memory above its release threshold.
    pub fn pools_release_at_sync(&mut self) {
        let all: Vec<(u64, u64)> = self.pools.iter().map(|(&h, p)| (h, p.threshold)).collect();
        for (h, threshold) in all {
            self.pool_shrink(h, threshold);
        }
    }

    /// `cuMemPoolGetAttribute`: `Ok(value)` (int attributes widened).
    pub fn pool_get_attr(&self, h: u64, attr: i32) -> R<u64> {
        let p = match self.pools.get(&h) {
            Some(p) if !p.destroyed => p,
            _ => return Err(CUDA_ERROR_INVALID_VALUE),
        };
        Ok(match attr {
            1..=3 => p.reuse[attr as usize - 1] as u64,
            4 => p.threshold,
            5 => p.reserved,
            6 => p.reserved_high,
            7 => p.used,
            8 => p.used_high,
            _ => return Err(CUDA_ERROR_INVALID_VALUE),
        })
    }

    /// `cuMemPoolSetAttribute`: the reuse flags, the release threshold, and the high
    /// watermarks (which only accept 0, resetting them to the current value).
    pub fn pool_set_attr(&mut self, h: u64, attr: i32, value: u64) -> R<()> {
        let p = match self.pools.get_mut(&h) {
            Some(p) if !p.destroyed => p,
            _ => return Err(CUDA_ERROR_INVALID_VALUE),
        };
        match attr {
            1..=3 => p.reuse[attr as usize - 1] = (value as u32 != 0) as i32,
            4 => p.threshold = value,
            6 if value == 0 => p.reserved_high = p.reserved,
            8 if value == 0 => p.used_high = p.used,
            _ => return Err(CUDA_ERROR_INVALID_VALUE),
        }
        Ok(())
    }
}
