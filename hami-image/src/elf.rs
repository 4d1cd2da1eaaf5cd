//! ELF cubins (64-bit little-endian): the section table and what its allocated sections take.

use crate::{u16_at, u32_at, u64_at, Extent, ImageError, Statics, MAX_IMAGE};

const EHDR: usize = 64;
const SHDR: usize = 64;
const SHT_NOBITS: u32 = 8;
const SHF_ALLOC: u64 = 0x2;
/// Most sections a cubin may have (a large library's cubin has some thousands).
const MAX_SECTIONS: u64 = 1 << 20;
/// Largest section size believed (a `__device__` array larger than any GPU's memory is
/// garbage).
const MAX_SECTION: u64 = 1 << 40;

/// One section header, as far as it matters here.
struct Shdr {
    name: u32,
    kind: u32,
    flags: u64,
    offset: u64,
    size: u64,
    align: u64,
}

/// The header fields: (section table offset, count, string table index, program header
/// table end).
fn header(b: &[u8]) -> Result<(u64, u64, usize, u64), ImageError> {
    if b.len() < EHDR {
        return Err(ImageError::Truncated {
            what: "ELF header",
            need: EHDR as u64,
            have: b.len() as u64,
        });
    }
    if b[4] != 2 {
        return Err(ImageError::Elf("not a 64-bit ELF"));
    }
    if b[5] != 1 {
        return Err(ImageError::Elf("not little-endian"));
    }
    let field = |at| u64_at(b, at).ok_or(ImageError::Elf("header"));
    let half = |at| u16_at(b, at).ok_or(ImageError::Elf("header"));
    let phoff = field(0x20)?;
    let shoff = field(0x28)?;
    let phentsize = u64::from(half(0x36)?);
    let phnum = u64::from(half(0x38)?);
    let shentsize = half(0x3a)?;
    let shnum = u64::from(half(0x3c)?);
    let shstrndx = usize::from(half(0x3e)?);
    if shnum > 0 && usize::from(shentsize) != SHDR {
        return Err(ImageError::Elf("section header size is not 64"));
    }
    if shnum > MAX_SECTIONS {
        return Err(ImageError::Elf("too many sections"));
    }
    let phend = if phnum == 0 {
        0
    } else {
        phoff
            .checked_add(phnum * phentsize)
            .ok_or(ImageError::Elf("program header table past 2^64"))?
    };
    Ok((shoff, shnum, shstrndx, phend))
}

fn end_of_table(shoff: u64, shnum: u64) -> Result<u64, ImageError> {
    shoff
        .checked_add(shnum * SHDR as u64)
        .ok_or(ImageError::Elf("section table past 2^64"))
}

fn sections(b: &[u8]) -> Result<(Vec<Shdr>, usize), ImageError> {
    let (shoff, shnum, shstrndx, _) = header(b)?;
    let end = end_of_table(shoff, shnum)?;
    if end > b.len() as u64 {
        return Err(ImageError::Truncated {
            what: "ELF section table",
            need: end,
            have: b.len() as u64,
        });
    }
    let mut out = Vec::with_capacity(shnum as usize);
    for i in 0..shnum as usize {
        let at = shoff as usize + i * SHDR;
        let s = &b[at..at + SHDR];
        let r = |o| u64_at(s, o).unwrap_or(0);
        out.push(Shdr {
            name: u32_at(s, 0).unwrap_or(0),
            kind: u32_at(s, 4).unwrap_or(0),
            flags: r(8),
            offset: r(0x18),
            size: r(0x20),
            align: r(0x30),
        });
    }
    if shnum > 0 && shstrndx >= out.len() {
        return Err(ImageError::Elf("section name table index out of range"));
    }
    Ok((out, shstrndx))
}

/// How much of an ELF image starting with `head` can be read (see [`crate::extent`]): the
/// header, then the section table, then the end of the furthest section or table.
pub fn elf_extent(head: &[u8]) -> Result<Extent, ImageError> {
    if head.len() < EHDR {
        return Ok(Extent::Need(EHDR as u64));
    }
    let (shoff, shnum, _, phend) = header(head)?;
    let table = end_of_table(shoff, shnum)?;
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
    if (head.len() as u64) < table {
        return Ok(Extent::Need(cap(table)?));
    }
    let (secs, _) = sections(head)?;
    let mut end = table.max(phend).max(EHDR as u64);
    for s in &secs {
        if s.kind != SHT_NOBITS {
            let e = s
                .offset
                .checked_add(s.size)
                .ok_or(ImageError::Elf("section past 2^64"))?;
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
    let (secs, shstrndx) = sections(b)?;
    let Some(strtab) = secs.get(shstrndx) else {
        return Ok(Statics::default());
    };
    let strs = strtab
        .offset
        .checked_add(strtab.size)
        .and_then(|e| b.get(usize::try_from(strtab.offset).ok()?..usize::try_from(e).ok()?))
        .ok_or(ImageError::Truncated {
            what: "ELF section name table",
            need: strtab.offset.saturating_add(strtab.size),
            have: b.len() as u64,
        })?;
    let mut total = Statics::default();
    for s in &secs {
        if s.flags & SHF_ALLOC == 0 || s.size == 0 {
            continue;
        }
        let name = strs
            .get(s.name as usize..)
            .and_then(|n| n.split(|&c| c == 0).next().filter(|_| n.contains(&0)))
            .ok_or(ImageError::Elf("section name out of the name table"))?;
        if !takes_device_memory(name) {
            continue;
        }
        if s.size > MAX_SECTION {
            return Err(ImageError::Elf("section larger than 1 TiB"));
        }
        let align = s.align.clamp(1, 4096);
        let size = s.size.div_ceil(align) * align;
        if is_code(name) {
            total.code = total.code.saturating_add(size);
        } else {
            total.data = total.data.saturating_add(size);
        }
    }
    Ok(total)
}
