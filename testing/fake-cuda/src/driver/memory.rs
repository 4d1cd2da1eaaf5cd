//! Device memory: linear, pitched and managed allocations, arrays and mipmapped arrays,
//! and the virtual memory management calls (create, reserve, map, unmap, release).

use super::{managed_charges, Alloc, Inner, Kind, PhysMem, GRANULARITY, R};
use crate::ffi::*;

impl Inner {
    /// Allocates `size` bytes (charging `charged`) on the current context's device, or on
    /// `ordinal` if given (pools).
    pub fn alloc(&mut self, size: u64, charged: u64, kind: Kind, ordinal: Option<usize>) -> R<u64> {
        let (h, c) = self.current()?;
        let phys = match ordinal {
            Some(o) => self.visible[o],
            None => c.phys,
        };
        self.charge(phys, charged)?;
        let ptr = self.shared().next_address(phys, size);
        self.allocs.insert(
            ptr,
            Alloc {
                phys,
                ctx: h,
                size,
                charged,
                kind,
                pool: None,
            },
        );
        Ok(ptr)
    }

    /// Charged bytes of a managed allocation.
    pub fn managed_charge(size: u64) -> u64 {
        if managed_charges() {
            size
        } else {
            0
        }
    }

    /// `cuMemFree_v2` / `cuMemFreeAsync`.
    pub fn free(&mut self, ptr: u64) -> R<()> {
        if ptr == 0 {
            return Ok(());
        }
        match self.allocs.remove(&ptr) {
            Some(a) => {
                self.uncharge(a.phys, a.charged);
                if let Some(h) = a.pool {
                    self.pool_give_back(h, a.size);
                }
                Ok(())
            }
            // A graph allocation: its memory goes back to the graph pool.
            None if self.graph_free_live(ptr) => Ok(()),
            None => Err(CUDA_ERROR_INVALID_VALUE),
        }
    }

    /// `cuMemGetAddressRange_v2`: (base, size) of the allocation containing `ptr`.
    pub fn address_range(&self, ptr: u64) -> R<(u64, u64)> {
        if let Some((&base, a)) = self.allocs.range(..=ptr).next_back() {
            if ptr < base + a.size.max(1) {
                return Ok((base, a.size));
            }
        }
        if let Some((&va, &(size, _))) = self.mappings.range(..=ptr).next_back() {
            if ptr < va + size {
                return Ok((va, size));
            }
        }
        Err(CUDA_ERROR_NOT_FOUND)
    }

    /// `cuArrayCreate_v2` / `cuArray3DCreate_v2`: `bytes` is the array's footprint.
    pub fn array_create(&mut self, bytes: u64) -> R<u64> {
        let (h, c) = self.current()?;
        let charged = bytes.div_ceil(GRANULARITY) * GRANULARITY;
        self.charge(c.phys, charged)?;
        let a = self.handle(0xa0);
        self.arrays.insert(
            a,
            Alloc {
                phys: c.phys,
                ctx: h,
                size: bytes,
                charged,
                kind: Kind::Linear,
                pool: None,
            },
        );
        Ok(a)
    }

    /// `cuMipmappedArrayCreate`: `bytes` is the footprint of every level.
    pub fn mipmap_create(&mut self, bytes: u64) -> R<u64> {
        let (h, c) = self.current()?;
        let charged = bytes.div_ceil(GRANULARITY) * GRANULARITY;
        self.charge(c.phys, charged)?;
        let a = self.handle(0xa1);
        self.mipmaps.insert(
            a,
            Alloc {
                phys: c.phys,
                ctx: h,
                size: bytes,
                charged,
                kind: Kind::Linear,
                pool: None,
            },
        );
        Ok(a)
    }

    /// `cuMipmappedArrayDestroy`.
    pub fn mipmap_destroy(&mut self, a: u64) -> R<()> {
        match self.mipmaps.remove(&a) {
            Some(x) => {
                self.uncharge(x.phys, x.charged);
                Ok(())
            }
            None => Err(CUDA_ERROR_INVALID_HANDLE),
        }
    }

    /// `cuArrayDestroy`.
    pub fn array_destroy(&mut self, a: u64) -> R<()> {
        match self.arrays.remove(&a) {
            Some(x) => {
                self.uncharge(x.phys, x.charged);
                Ok(())
            }
            None => Err(CUDA_ERROR_INVALID_HANDLE),
        }
    }

    /// `cuMemCreate`.
    pub fn mem_create(&mut self, size: u64, ordinal: CUdevice) -> R<u64> {
        let phys = self.phys_of(ordinal)?;
        if size == 0 || size & (GRANULARITY - 1) != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        self.charge(phys, size)?;
        let h = self.handle(0xe0);
        self.phys_mem.insert(
            h,
            PhysMem {
                phys,
                size,
                refs: 1,
                maps: 0,
            },
        );
        Ok(h)
    }

    fn drop_phys_if_done(&mut self, h: u64) {
        if let Some(m) = self.phys_mem.get(&h).copied() {
            if m.refs == 0 && m.maps == 0 {
                self.phys_mem.remove(&h);
                self.uncharge(m.phys, m.size);
            }
        }
    }

    /// `cuMemRelease`: one reference fewer; the memory goes back once no reference is left
    /// and it is unmapped everywhere.
    pub fn mem_release(&mut self, h: u64) -> R<()> {
        match self.phys_mem.get_mut(&h) {
            Some(m) if m.refs > 0 => m.refs -= 1,
            _ => return Err(CUDA_ERROR_INVALID_VALUE),
        }
        self.drop_phys_if_done(h);
        Ok(())
    }

    /// `cuMemRetainAllocationHandle`: the handle mapped at `addr` (the same value
    /// `cuMemMap` was given), with one more reference, which a `cuMemRelease` must drop.
    pub fn retain_allocation_handle(&mut self, addr: u64) -> R<u64> {
        let h = self
            .mappings
            .range(..=addr)
            .next_back()
            .filter(|(&va, &(s, _))| addr < va + s)
            .map(|(_, &(_, h))| h)
            .ok_or(CUDA_ERROR_INVALID_VALUE)?;
        match self.phys_mem.get_mut(&h) {
            Some(m) => m.refs += 1,
            None => return Err(CUDA_ERROR_INVALID_VALUE),
        }
        Ok(h)
    }

    /// `cuMemAddressReserve`.
    pub fn address_reserve(&mut self, size: u64, align: u64) -> R<u64> {
        if size == 0 || size & (GRANULARITY - 1) != 0 || (align != 0 && !align.is_power_of_two()) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let align = align.max(GRANULARITY);
        let base = (0x7e00_0000_0000u64 + self.next_va).div_ceil(align) * align;
        self.next_va = base + size - 0x7e00_0000_0000 + GRANULARITY;
        self.reservations.insert(base, size);
        Ok(base)
    }

    fn in_reservation(&self, ptr: u64, size: u64) -> bool {
        self.reservations
            .range(..=ptr)
            .next_back()
            .is_some_and(|(&b, &s)| ptr >= b && ptr.saturating_add(size) <= b + s)
    }

    fn unmap_range(&mut self, ptr: u64, size: u64) {
        let hit: Vec<u64> = self
            .mappings
            .range(ptr..ptr.saturating_add(size))
            .map(|(&va, _)| va)
            .collect();
        for va in hit {
            if let Some((_, h)) = self.mappings.remove(&va) {
                if let Some(m) = self.phys_mem.get_mut(&h) {
                    m.maps = m.maps.saturating_sub(1);
                }
                self.drop_phys_if_done(h);
            }
        }
    }

    /// `cuMemAddressFree` (mappings left in the range are unmapped).
    pub fn address_free(&mut self, ptr: u64, size: u64) -> R<()> {
        match self.reservations.get(&ptr) {
            Some(&s) if s == size => {}
            _ => return Err(CUDA_ERROR_INVALID_VALUE),
        }
        self.unmap_range(ptr, size);
        self.reservations.remove(&ptr);
        Ok(())
    }

    /// `cuMemMap`.
    pub fn mem_map(&mut self, ptr: u64, size: u64, offset: u64, h: u64) -> R<()> {
        let m = match self.phys_mem.get(&h) {
            Some(m) if m.refs > 0 => *m,
            _ => return Err(CUDA_ERROR_INVALID_VALUE),
        };
        if size == 0
            || size & (GRANULARITY - 1) != 0
            || offset & (GRANULARITY - 1) != 0
            || offset.saturating_add(size) > m.size
            || !self.in_reservation(ptr, size)
        {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let overlaps_before = self
            .mappings
            .range(..=ptr)
            .next_back()
            .is_some_and(|(&va, &(s, _))| va + s > ptr);
        let overlaps_after = self.mappings.range(ptr..ptr + size).next().is_some();
        if overlaps_before || overlaps_after {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        self.mappings.insert(ptr, (size, h));
        if let Some(m) = self.phys_mem.get_mut(&h) {
            m.maps += 1;
        }
        Ok(())
    }

    /// `cuMemUnmap` (unmapping an unmapped range of a reservation succeeds, as measured).
    pub fn mem_unmap(&mut self, ptr: u64, size: u64) -> R<()> {
        if size == 0 || !self.in_reservation(ptr, size) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        self.unmap_range(ptr, size);
        Ok(())
    }

    /// `cuMemSetAccess`: the range must be reserved.
    pub fn set_access(&self, ptr: u64, size: u64, ordinals: &[i32]) -> R<()> {
        if size == 0 || !self.in_reservation(ptr, size) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        for &o in ordinals {
            self.phys_of(o)?;
        }
        Ok(())
    }
}
