//! ELF cubins (64-bit little-endian): the section table and what its allocated sections take,
//! read with the `object` crate.

use crate::types::{Extent, ImageError, Statics, MAX_IMAGE};
use object::elf::{FileHeader64, SectionHeader64, SHF_ALLOC, SHT_NOBITS};
use object::read::elf::{FileHeader, SectionHeader};
use object::LittleEndian as LE;

const EHDR: usize = 64;
const SHDR: u64 = 64;
/// Most sections a cubin may have (a large library's cubin has some thousands).
const MAX_SECTIONS: u64 = 1 << 20;
/// Largest section size believed (a `__device__` array larger than any GPU's memory is
/// garbage).
const MAX_SECTION: u64 = 1 << 40;

/// The ELF error `object` gives, as this crate's.
fn elf(e: object::read::Error) -> ImageError {
    ImageError::Elf(e.to_string())
}

/// The file header of `b`, checked to be a 64-bit little-endian ELF.
fn header(b: &[u8]) -> Result<&FileHeader64<LE>, ImageError> {
    if b.len() < EHDR {
        return Err(ImageError::Truncated {
            what: "ELF header",
            need: EHDR as u64,
            have: b.len() as u64,
        });
    }
    // The class and byte order first: `object` would read a 32-bit or big-endian header
    // with other offsets and say less about why it is not one.
    if b[4] != object::elf::ELFCLASS64 {
        return Err(ImageError::Elf("not a 64-bit ELF".into()));
    }
    if b[5] != object::elf::ELFDATA2LSB {
        return Err(ImageError::Elf("not little-endian".into()));
    }
    FileHeader64::<LE>::parse(b).map_err(elf)
}

/// Where the section table ends (the header's offset and count; a count past
/// [`MAX_SECTIONS`] is garbage).
fn end_of_table(h: &FileHeader64<LE>, b: &[u8]) -> Result<u64, ImageError> {
    let shoff = h.e_shoff(LE);
    if shoff == 0 {
        return Ok(0);
    }
    if usize::from(h.e_shentsize(LE)) != SHDR as usize {
        return Err(ImageError::Elf("section header size is not 64".into()));
    }
    // An extended count lives in section 0, which must be there to be read.
    let shnum = match h.e_shnum(LE) {
        0 => {
            let s0 = shoff.saturating_add(SHDR);
            if (b.len() as u64) < s0 {
                return Err(ImageError::Truncated {
                    what: "ELF section 0",
                    need: s0,
                    have: b.len() as u64,
                });
            }
            h.shnum(LE, b).map_err(elf)? as u64
        }
        n => u64::from(n),
    };
    if shnum > MAX_SECTIONS {
        return Err(ImageError::Elf("too many sections".into()));
    }
    shoff
        .checked_add(shnum * SHDR)
        .ok_or(ImageError::Elf("section table past 2^64".into()))
}

/// The end of the program header table (0: none).
fn end_of_programs(h: &FileHeader64<LE>) -> Result<u64, ImageError> {
    let n = u64::from(h.e_phnum(LE));
    if h.e_phoff(LE) == 0 || n == 0 {
        return Ok(0);
    }
    h.e_phoff(LE)
        .checked_add(n * u64::from(h.e_phentsize(LE)))
        .ok_or(ImageError::Elf("program header table past 2^64".into()))
}

/// The section headers of a whole image.
fn sections(b: &[u8]) -> Result<(&FileHeader64<LE>, &[SectionHeader64<LE>]), ImageError> {
    let h = header(b)?;
    let end = end_of_table(h, b)?;
    if end > b.len() as u64 {
        return Err(ImageError::Truncated {
            what: "ELF section table",
            need: end,
            have: b.len() as u64,
        });
    }
    Ok((h, h.section_headers(LE, b).map_err(elf)?))
}

/// How much of an ELF image starting with `head` can be read (see [`crate::extent`]): the
/// header, then the section table, then the end of the furthest section or table.
pub fn elf_extent(head: &[u8]) -> Result<Extent, ImageError> {
    if head.len() < EHDR {
        return Ok(Extent::Need(EHDR as u64));
    }
    let h = header(head)?;
    let cap = |n: u64| {
        if n > MAX_IMAGE {
            Err(ImageError::TooLarge {
                what: "ELF image",
                size: n,
                cap: MAX_IMAGE,
            })
        } else {
            Ok(n)
        }
    };
    // An extended section count needs section 0 first.
    if h.e_shoff(LE) != 0 && h.e_shnum(LE) == 0 {
        let s0 = h.e_shoff(LE).saturating_add(SHDR);
        if (head.len() as u64) < s0 {
            return Ok(Extent::Need(cap(s0)?));
        }
    }
    let table = end_of_table(h, head)?;
    if (head.len() as u64) < table {
        return Ok(Extent::Need(cap(table)?));
    }
    let (_, secs) = sections(head)?;
    let mut end = table.max(end_of_programs(h)?).max(EHDR as u64);
    for s in secs {
        if s.sh_type(LE) != SHT_NOBITS {
            let e = s
                .sh_offset(LE)
                .checked_add(s.sh_size(LE))
                .ok_or(ImageError::Elf("section past 2^64".into()))?;
            end = end.max(e);
        }
    }
    Ok(Extent::Whole(cap(end)?))
}

/// Whether an allocated section of this name takes device memory the module holds (see the
/// crate's documentation).
fn takes_device_memory(name: &[u8]) -> bool {
    !(name.starts_with(b".nv.shared")
        || name.starts_with(b".nv.reservedSmem")
        || name.starts_with(b".nv.local"))
}

/// Whether an allocated section is per-kernel code (`.text.<kernel>`, the parameter bank
/// `.nv.constant0.<kernel>`) rather than module data.
fn is_code(name: &[u8]) -> bool {
    name.starts_with(b".text") || name.starts_with(b".nv.constant0.")
}

/// The device memory an ELF cubin's statics take: its allocated sections (see the crate's
/// documentation), each rounded up to its alignment.
pub fn elf_statics(b: &[u8]) -> Result<Statics, ImageError> {
    let (h, secs) = sections(b)?;
    if secs.is_empty() {
        return Ok(Statics::default());
    }
    let strtab = h.section_strings(LE, b, secs).map_err(elf)?;
    let mut total = Statics::default();
    for s in secs {
        if s.sh_flags(LE) & u64::from(SHF_ALLOC) == 0 || s.sh_size(LE) == 0 {
            continue;
        }
        let name = s.name(LE, strtab).map_err(elf)?;
        if !takes_device_memory(name) {
            continue;
        }
        let size = s.sh_size(LE);
        if size > MAX_SECTION {
            return Err(ImageError::Elf("section larger than 1 TiB".into()));
        }
        let align = s.sh_addralign(LE).clamp(1, 4096);
        let size = size.div_ceil(align) * align;
        if is_code(name) {
            total.code = total.code.saturating_add(size);
        } else {
            total.data = total.data.saturating_add(size);
        }
    }
    Ok(total)
}
