//! Real module images (what nvcc builds): the globals the fake driver places for them.
//!
//! Test infrastructure, written apart from the preload's reader (`hami-image`): ELF through
//! the `object` crate, LZ4 through `lz4_flex`, zstd through `ruzstd`. A module's globals are
//! its cubin's allocated sections (`.nv.global`, `.nv.global.init`, constant banks, code),
//! without the on-chip and per-thread ones (`.nv.shared*`, `.nv.reservedSmem*`,
//! `.nv.local*`), the total rounded up to the allocation granularity (2 MiB) as the driver
//! places them in pages. A fatbin gives its `sm_90` cubin (the fake device's compute
//! capability), else its first one; PTX only gives nothing (nothing JIT-compiled here).
//! Fatbins back to back (a file holding a whole `.nv_fatbin` section) are all loaded.

use object::read::elf::{ElfFile64, SectionHeader};
use object::{LittleEndian, Object, ObjectSection};

use crate::driver::GRANULARITY;

const FATBIN: u32 = 0xBA55_ED50;
const WRAPPER: u32 = 0x4662_43B1;
const ELF: u32 = 0x464c_457f;
/// The fake device's compute capability.
const SM: u32 = 90;

fn le32(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn le64(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

/// Whether `b` starts like a real image (fatbin, wrapper, ELF).
pub fn is_real(b: &[u8]) -> bool {
    matches!(le32(b, 0), Some(FATBIN | WRAPPER | ELF))
}

/// Globals of an ELF cubin, not rounded (`None`: not a readable ELF).
fn elf_globals(b: &[u8]) -> Option<u64> {
    let f = ElfFile64::<LittleEndian>::parse(b).ok()?;
    let e = f.endian();
    let mut total = 0u64;
    for s in f.sections() {
        let sh = s.elf_section_header();
        if sh.sh_flags(e) & u64::from(object::elf::SHF_ALLOC) == 0 {
            continue;
        }
        let name = s.name_bytes().ok()?;
        if name.starts_with(b".nv.shared")
            || name.starts_with(b".nv.reservedSmem")
            || name.starts_with(b".nv.local")
        {
            continue;
        }
        let align = sh.sh_addralign(e).clamp(1, 4096);
        total = total.checked_add(sh.sh_size(e).div_ceil(align) * align)?;
    }
    Some(total)
}

/// One fatbin (`fb` starts with its header): (its length, the globals of its chosen cubin).
fn one_fatbin(fb: &[u8]) -> Option<(usize, u64)> {
    let hs = usize::from(u16::from_le_bytes(fb.get(6..8)?.try_into().ok()?));
    let len = hs.checked_add(usize::try_from(le64(fb, 8)?).ok()?)?;
    let body = fb.get(..len)?;
    let mut at = hs;
    let mut cubins: Vec<(u32, Vec<u8>)> = Vec::new();
    while at < len {
        let kind = u16::from_le_bytes(body.get(at..at + 2)?.try_into().ok()?);
        let ehs = usize::try_from(le32(body, at + 4)?).ok()?;
        let psize = usize::try_from(le64(body, at + 8)?).ok()?;
        let payload = body.get(at + ehs..(at + ehs).checked_add(psize)?)?;
        if kind == 2 {
            let arch = le32(body, at + 0x1c)?;
            let flags = le64(body, at + 0x28)?;
            let csize = le32(body, at + 0x10)? as usize;
            let dsize = usize::try_from(le64(body, at + 0x38)?).ok()?;
            let elf = if flags & 0x2000 != 0 {
                lz4_flex::block::decompress(payload.get(..csize)?, dsize).ok()?
            } else if flags & 0x8000 != 0 {
                let mut out = Vec::with_capacity(dsize);
                ruzstd::decoding::FrameDecoder::new()
                    .decode_all_to_vec(payload.get(..csize)?, &mut out)
                    .ok()?;
                out
            } else {
                payload.to_vec()
            };
            cubins.push((arch, elf));
        }
        at += ehs + psize;
    }
    let chosen = cubins
        .iter()
        .find(|(a, _)| *a == SM)
        .or_else(|| cubins.first());
    let globals = match chosen {
        Some((_, elf)) => elf_globals(elf)?,
        None => 0,
    };
    Some((len, globals))
}

/// The globals the fake places for the real image `b` of known length (`None`: an image
/// that does not parse: `CUDA_ERROR_INVALID_IMAGE`).
pub fn globals(b: &[u8]) -> Option<u64> {
    let raw = match le32(b, 0)? {
        ELF => elf_globals(b)?,
        FATBIN => {
            let mut at = 0;
            let mut total = 0u64;
            while le32(b, at) == Some(FATBIN) {
                let (len, g) = one_fatbin(&b[at..])?;
                total = total.checked_add(g)?;
                at += len.max(16);
            }
            total
        }
        _ => return None,
    };
    Some(raw.div_ceil(GRANULARITY) * GRANULARITY)
}

/// The globals of the real image in memory at `p` (`None`: not a real image, by its first
/// bytes; `Some(None)`: one that does not parse).
///
/// # Safety
/// `p` points to a readable image: NUL-terminated text, or a fatbin, wrapper or ELF whose
/// headers tell its length truthfully.
pub unsafe fn of_memory(p: *const u8) -> Option<Option<u64>> {
    let mut head = [0u8; 4];
    for (i, h) in head.iter_mut().enumerate() {
        // SAFETY: per this function's contract; stops at a NUL.
        *h = unsafe { *p.add(i) };
        if *h == 0 {
            return None;
        }
    }
    if !is_real(&head) {
        return None;
    }
    // SAFETY: per this function's contract, through the headers.
    let bytes = |len: usize| unsafe { std::slice::from_raw_parts(p, len) };
    Some(match le32(&head, 0) {
        Some(WRAPPER) => {
            let fb = le64(bytes(16), 8);
            match fb {
                Some(fb) if fb != 0 => {
                    // SAFETY: the wrapper's data field points at its fatbin.
                    unsafe { of_memory(fb as *const u8) }.unwrap_or(None)
                }
                _ => None,
            }
        }
        Some(FATBIN) => {
            let h = bytes(16);
            let len =
                usize::from(u16::from_le_bytes([h[6], h[7]])) + le64(h, 8).unwrap_or(0) as usize;
            // One fatbin: the runtime registers each by itself.
            one_fatbin(bytes(len)).map(|(_, g)| g.div_ceil(GRANULARITY) * GRANULARITY)
        }
        _ => {
            // ELF: header, section table, then the furthest section end.
            let h = bytes(64);
            let shoff = le64(h, 0x28).unwrap_or(0) as usize;
            let shnum = usize::from(u16::from_le_bytes([h[0x3c], h[0x3d]]));
            let table = bytes(shoff + shnum * 64);
            let phoff = le64(h, 0x20).unwrap_or(0) as usize;
            let phsize = usize::from(u16::from_le_bytes([h[0x36], h[0x37]]))
                * usize::from(u16::from_le_bytes([h[0x38], h[0x39]]));
            let mut end = (shoff + shnum * 64).max(phoff + phsize);
            for i in 0..shnum {
                let s = &table[shoff + i * 64..shoff + i * 64 + 64];
                if le32(s, 4) != Some(8) {
                    let off = le64(s, 0x18).unwrap_or(0) as usize;
                    let size = le64(s, 0x20).unwrap_or(0) as usize;
                    end = end.max(off + size);
                }
            }
            globals(bytes(end))
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(name: &str) -> Vec<u8> {
        std::fs::read(format!(
            "{}/../../hami-image/tests/data/{name}",
            env!("CARGO_MANIFEST_DIR")
        ))
        .unwrap()
    }

    #[test]
    fn every_container_gives_the_cubin_s_globals_in_pages() {
        // 1.5 GiB + 4 KiB + 16 KiB + code and parameter banks: 769 pages of 2 MiB.
        for name in [
            "g.cubin",
            "g_default.fatbin",
            "g_comp.fatbin",
            "g_size.fatbin",
            "g_speed_all.fatbin",
        ] {
            assert_eq!(globals(&data(name)), Some(1538 << 20), "{name}");
        }
        let f = data("g_comp.fatbin");
        // SAFETY: a whole fatbin in memory.
        let r = unsafe { of_memory(f.as_ptr()) };
        // The first fatbin alone (sm_80 and sm_90 cubins of cudart's stub): nothing.
        assert_eq!(r, Some(Some(0)));
        // SAFETY: the second fatbin, whole.
        let r = unsafe { of_memory(f[1248..].as_ptr()) };
        assert_eq!(r, Some(Some(1538 << 20)));
        assert_eq!(globals(&f[..100]), None);
        let c = data("g.cubin");
        // SAFETY: a whole cubin in memory.
        assert_eq!(unsafe { of_memory(c.as_ptr()) }, Some(Some(1538 << 20)));
        // SAFETY: a NUL-terminated string.
        assert_eq!(unsafe { of_memory(c"FAKECUBIN".as_ptr().cast()) }, None);
    }
}
