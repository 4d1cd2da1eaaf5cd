//! The device memory a CUDA module image's statics need, read from the image before the
//! driver loads it.
//!
//! An image handed to `cuModuleLoadData(Ex)`, `cuModuleLoadFatBinary`, `cuLibraryLoadData`
//! (or read from the file of `cuModuleLoad` / `cuLibraryLoadFromFile`) is one of:
//!
//! * a **fatbin wrapper** (`__fatBinC_Wrapper_t`, magic `0x466243B1`: `{i32 magic, i32
//!   version, const u64 *data, void *filename_or_fatbins}`), what the CUDA runtime registers:
//!   its `data` points at a fatbin ([`Extent::Wrapper`]);
//! * a **fatbin** (magic `0xBA55ED50`, a 16-byte header `{u32 magic, u16 version, u16 header
//!   size, u64 size of the entries}`), entries back to back, each a header (64 bytes or more:
//!   kind @0 (1 PTX, 2 ELF), header size @4, payload size @8, compressed size @0x10, arch
//!   @0x1c (`80`, `90`), flags @0x28 (`0x2000` LZ4, `0x8000` zstd), decompressed size @0x38)
//!   and its payload. A `.nv_fatbin` section (and a file holding one) may hold several
//!   fatbins back to back: a byte slice is read to its end;
//! * an **ELF cubin** (64-bit little-endian);
//! * anything else (PTX text): no estimate, [`statics`] returns `None`.
//!
//! What a module's statics take ([`elf_statics`], a [`Statics`]): its `SHF_ALLOC` sections,
//! each rounded up to its alignment, except on-chip and per-thread ones, in two parts:
//!
//! * **data**, placed when the module is loaded (eagerly, or lazily at its first use):
//!   `.nv.global` (NOBITS, zero-initialised `__device__` data), `.nv.global.init`
//!   (initialised) and the module's constant banks (`.nv.constant<N>`: `__constant__` data,
//!   compiler constants);
//! * **code**, per kernel: `.text.<kernel>` and its parameter bank `.nv.constant0.<kernel>`.
//!   With lazy loading the driver places a kernel's code only when that kernel is first used,
//!   so a caller admitting a lazily loaded module's first use counts [`Statics::data`] only;
//!   an eager load places every kernel ([`Statics::total`]).
//!
//! Left out: `.nv.shared.*` and `.nv.reservedSmem*` (shared memory is on the chip) and
//! `.nv.local.*` (local memory is per thread, sized at launch from the context's stack
//! limit). It is what the module's image asks the driver to place; the driver's own rounding
//! (pages) comes on top and is left to measurement.
//!
//! Every read is bounded by a size the caller can trust: a slice's length, a fatbin header's
//! size, an ELF's section table ([`extent`] says how many bytes of an application's pointer
//! to read, in steps, capped at [`MAX_IMAGE`]). Compressed entries are decompressed into at
//! most their declared size, capped at [`MAX_ENTRY`]. Garbage gives an [`ImageError`], never
//! a panic.

#![forbid(unsafe_code)]

mod bytes;
mod elf;
mod fatbin;
mod types;

use bytes::{u16_at, u32_at, u64_at};
pub use elf::{elf_extent, elf_statics};
pub use fatbin::{entries, fatbin_statics, payload, Entry};
pub use types::*;

/// What an image's first bytes say it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// `__fatBinC_Wrapper_t`.
    Wrapper,
    /// Fatbin.
    Fatbin,
    /// ELF cubin.
    Elf,
    /// Anything else: PTX text, or not an image at all.
    Other,
}

/// What an image's first bytes say it is (fewer than 4 bytes: [`Format::Other`]).
pub fn format(head: &[u8]) -> Format {
    match u32_at(head, 0) {
        Some(FATBIN_MAGIC) => Format::Fatbin,
        Some(WRAPPER_MAGIC) => Format::Wrapper,
        Some(0x464c_457f) => Format::Elf,
        _ => Format::Other,
    }
}

/// How much of an image that starts with `head` can be read: call with the first 16 bytes,
/// then again with as many as [`Extent::Need`] says, until it says [`Extent::Whole`]. Sizes
/// over [`MAX_IMAGE`] are an error.
pub fn extent(head: &[u8]) -> Result<Extent, ImageError> {
    match format(head) {
        Format::Other => Ok(Extent::Unsized),
        Format::Wrapper => match u64_at(head, 8) {
            None => Ok(Extent::Need(16)),
            Some(0) => Err(ImageError::Fatbin {
                at: 0,
                why: "wrapper's data pointer is NULL",
            }),
            Some(p) => Ok(Extent::Wrapper(p)),
        },
        Format::Fatbin => {
            let (Some(hs), Some(size)) = (u16_at(head, 6), u64_at(head, 8)) else {
                return Ok(Extent::Need(16));
            };
            let total = u64::from(hs).saturating_add(size);
            if total > MAX_IMAGE {
                return Err(ImageError::TooLarge {
                    what: "fatbin",
                    size: total,
                    cap: MAX_IMAGE,
                });
            }
            Ok(Extent::Whole(total))
        }
        Format::Elf => elf_extent(head),
    }
}

/// The device memory the statics of `image` need on a device of compute capability `sm`
/// (major * 10 + minor: `90` for 9.0). `None`: the image carries no cubin to read (PTX text,
/// or a fatbin with PTX only; the driver compiles it at load). A fatbin: the ELF entry for
/// `sm` (the first one), else the largest estimate (by total) among its ELF entries; fatbins
/// back to back are summed.
pub fn statics(image: &[u8], sm: u32) -> Result<Option<Statics>, ImageError> {
    match format(image) {
        Format::Other => Ok(None),
        Format::Wrapper => Err(ImageError::Wrapper),
        Format::Elf => elf_statics(image).map(Some),
        Format::Fatbin => fatbin_statics(image, sm),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn format_and_extent_of_headers() {
        assert_eq!(format(b""), Format::Other);
        assert_eq!(format(b".version 8.0"), Format::Other);
        assert_eq!(extent(b"//\n.version").unwrap(), Extent::Unsized);
        let mut w = Vec::new();
        w.extend_from_slice(&WRAPPER_MAGIC.to_le_bytes());
        w.extend_from_slice(&1u32.to_le_bytes());
        assert_eq!(extent(&w).unwrap(), Extent::Need(16));
        w.extend_from_slice(&0x1234_5678u64.to_le_bytes());
        assert_eq!(extent(&w).unwrap(), Extent::Wrapper(0x1234_5678));
        assert_eq!(statics(&w, 90), Err(ImageError::Wrapper));
        let mut f = Vec::new();
        f.extend_from_slice(&FATBIN_MAGIC.to_le_bytes());
        f.extend_from_slice(&1u16.to_le_bytes());
        f.extend_from_slice(&16u16.to_le_bytes());
        assert_eq!(extent(&f).unwrap(), Extent::Need(16));
        f.extend_from_slice(&(MAX_IMAGE).to_le_bytes());
        assert!(matches!(extent(&f), Err(ImageError::TooLarge { .. })));
    }
}
