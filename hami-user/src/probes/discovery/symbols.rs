//! Reading a candidate driver file's symbols: opened never blocking and regular files only
//! (the files are a tenant's), read through bounded reads of its tables (never an `mmap`), for
//! the symbols it defines ([`elf_defined_symbols`]) and the uprobe offsets of the probed ones
//! ([`uprobe_offsets`]).

use std::fs;
use std::io;
use std::path::Path;

use object::elf;
use object::read::elf::{FileHeader, SectionHeader, SectionTable, Sym, SymbolTable};
use object::read::{FileKind, ReadCache, ReadRef, StringTable};
use object::Endianness;

/// Bytes the agent reads from one file to find its dynamic symbols (section headers,
/// `.dynsym`, its string table): a file that needs more is "not a driver". A real driver
/// needs well under 1 MiB; the files are tenant-controlled, so nothing larger is read.
pub const MAX_ELF_READ: u64 = 64 << 20;

/// Why a file's dynamic symbols could not be read (the file is then not a driver).
#[derive(Debug, thiserror::Error)]
pub enum ElfError {
    /// Opening or reading the file failed.
    #[error("reading the file: {0}")]
    Io(#[from] io::Error),
    /// Not a regular file (a FIFO, a device, a directory).
    #[error("not a regular file")]
    NotRegular,
    /// Not an ELF64 file, or malformed.
    #[error("malformed or not ELF64: {0}")]
    Parse(#[from] object::read::Error),
    /// Not an ELF file at all.
    #[error("not an ELF file")]
    NotElf,
    /// A table would take the read over [`MAX_ELF_READ`].
    #[error("{what} would take the read to {bytes} bytes, over the limit of {limit}")]
    TooLarge {
        /// The table.
        what: &'static str,
        /// Bytes read with it.
        bytes: u64,
        /// The limit.
        limit: u64,
    },
}

/// Opens a file found through a tenant's view (`/proc/<pid>/root/...`) for reading: never
/// blocks (a FIFO swapped in after the caller's `stat`), and must be a regular file.
fn open_tenant_file(path: &Path) -> Result<fs::File, ElfError> {
    // Through an O_PATH descriptor first: a FIFO is never waited on and a device's driver
    // `open` never runs.
    crate::tenantfs::open_regular(path, false).map_err(|e| match e {
        crate::tenantfs::TenantFsError::NotRegular { .. } => ElfError::NotRegular,
        other => ElfError::Io(io::Error::other(other.to_string())),
    })
}

/// Opens a candidate driver file the way discovery does (never blocking, regular files
/// only), for [`uprobe_offsets`] and for attaching through `/proc/self/fd/<fd>`.
pub fn open_driver_file(path: &Path) -> Result<fs::File, ElfError> {
    open_tenant_file(path)
}

/// Bytes of an ELF file's tables read so far, against a limit: a section header may claim
/// any size up to the file's length, and a sparse file costs its owner nothing.
struct ReadBudget {
    total: u64,
    max: u64,
}

impl ReadBudget {
    fn new(max: u64) -> ReadBudget {
        ReadBudget { total: 0, max }
    }

    /// Counts `bytes` of `what`; [`ElfError::TooLarge`] once the total is over the limit.
    fn take(&mut self, what: &'static str, bytes: u64) -> Result<(), ElfError> {
        self.total = self.total.saturating_add(bytes);
        if self.total > self.max {
            return Err(ElfError::TooLarge {
                what,
                bytes: self.total,
                limit: self.max,
            });
        }
        Ok(())
    }
}

/// The uprobe file offset of each of `wanted` that the ELF file `data` defines, computed as
/// aya 0.14 does for `UProbe::attach(symbol, ...)` (`resolve_symbol`), but through bounded
/// reads (see [`dynamic_symbols_defined`]) instead of an `mmap` of a tenant's file (which
/// the tenant could truncate under the agent: SIGBUS), and without following a
/// `.gnu_debuglink` to another file.
///
/// As aya: the first symbol of that name in `.dynsym`, then in `.symtab`, is the one; in an
/// `ET_DYN` or `ET_EXEC` file its offset is `st_value - sh_addr + sh_offset` of the section
/// it is defined in (`st_shndx`), elsewhere `st_value`. A name whose first symbol is not in
/// a section with file contents (undefined, absolute, `SHT_NOBITS`, an index out of range)
/// is left out, as is one whose address lies before its section (aya would underflow).
pub fn uprobe_offsets<'a, R: ReadRef<'a>>(
    data: R,
    wanted: &[&str],
    max_read: u64,
) -> Result<Vec<(String, u64)>, ElfError> {
    match FileKind::parse(data) {
        Ok(FileKind::Elf64) => {
            uprobe_offsets_in::<elf::FileHeader64<Endianness>, R>(data, wanted, max_read)
        }
        Ok(FileKind::Elf32) => {
            uprobe_offsets_in::<elf::FileHeader32<Endianness>, R>(data, wanted, max_read)
        }
        _ => Err(ElfError::NotElf),
    }
}

/// The ELF header and section table of `data`, the section header table counted against
/// `budget` (both symbol readers start here).
fn parse_sections<'a, Elf: FileHeader<Endian = Endianness>, R: ReadRef<'a>>(
    data: R,
    budget: &mut ReadBudget,
) -> Result<(&'a Elf, Endianness, SectionTable<'a, Elf, R>), ElfError> {
    let header = Elf::parse(data)?;
    let endian = header.endian()?;
    let shnum = header.shnum(endian, data)? as u64;
    budget.take(
        "the section header table",
        shnum.saturating_mul(u64::from(header.e_shentsize(endian))),
    )?;
    let sections = header.sections(endian, data)?;
    Ok((header, endian, sections))
}

fn uprobe_offsets_in<'a, Elf: FileHeader<Endian = Endianness>, R: ReadRef<'a>>(
    data: R,
    wanted: &[&str],
    max_read: u64,
) -> Result<Vec<(String, u64)>, ElfError> {
    let mut budget = ReadBudget::new(max_read);
    let (header, endian, sections) = parse_sections::<Elf, R>(data, &mut budget)?;
    let mut take = |what: &'static str, bytes: u64| budget.take(what, bytes);
    let translate = matches!(header.e_type(endian), elf::ET_DYN | elf::ET_EXEC);
    let mut seen: Vec<&str> = Vec::new();
    let mut out: Vec<(String, u64)> = Vec::new();
    // aya: `dynamic_symbols().chain(symbols())`, each the first table of its type.
    for sh_type in [elf::SHT_DYNSYM, elf::SHT_SYMTAB] {
        let Some((index, table)) = sections
            .enumerate()
            .find(|(_, s)| s.sh_type(endian) == sh_type)
        else {
            continue;
        };
        take("a symbol table", table.sh_size(endian).into())?;
        let strtab = sections.section(table.link(endian))?;
        take("a symbol string table", strtab.sh_size(endian).into())?;
        for s in sections.iter() {
            if s.sh_type(endian) == elf::SHT_SYMTAB_SHNDX && s.link(endian) == index {
                take("a section index table", s.sh_size(endian).into())?;
            }
        }
        let symbols = SymbolTable::parse(endian, data, &sections, index, table)?;
        let strs = strtab.data(endian, data)?;
        let strings = StringTable::new(strs, 0, strs.len() as u64);
        for (i, sym) in symbols.enumerate() {
            let Ok(name) = sym.name(endian, strings) else {
                continue;
            };
            let Ok(n) = std::str::from_utf8(name) else {
                continue;
            };
            let Some(&w) = wanted.iter().find(|w| **w == n) else {
                continue;
            };
            if seen.contains(&w) {
                continue; // aya takes the first match only
            }
            seen.push(w);
            let address: u64 = sym.st_value(endian).into();
            if !translate {
                out.push((w.to_string(), address));
                continue;
            }
            let Ok(Some(si)) = symbols.symbol_section(endian, sym, i) else {
                continue; // not in a section: aya's `NotInSection`
            };
            let Ok(section) = sections.section(si) else {
                continue;
            };
            let Some((file_offset, _)) = section.file_range(endian) else {
                continue; // SHT_NOBITS: aya's `SectionFileRangeNone`
            };
            let sh_addr: u64 = section.sh_addr(endian).into();
            match address
                .checked_sub(sh_addr)
                .and_then(|rel| rel.checked_add(file_offset))
            {
                Some(off) => out.push((w.to_string(), off)),
                None => tracing::debug!(
                    symbol = w,
                    address,
                    sh_addr,
                    "symbol address outside its section: left out"
                ),
            }
        }
    }
    Ok(out)
}

/// Whether the file at `path` starts with an ELF identification (32- or 64-bit). Open and
/// read errors are returned; a short or foreign file is `Ok(false)`.
pub fn is_elf(path: &Path) -> io::Result<bool> {
    let f = match open_tenant_file(path) {
        Ok(f) => f,
        Err(ElfError::Io(e)) => return Err(e),
        Err(_) => return Ok(false),
    };
    let data = ReadCache::new(f);
    Ok(matches!(
        FileKind::parse(&data),
        Ok(FileKind::Elf32 | FileKind::Elf64)
    ))
}

/// Which of `wanted` the ELF64 file at `path` defines (`st_shndx != SHN_UNDEF`) in its
/// `.dynsym`; `None` if it cannot be opened, is not such a file, is malformed, or needs
/// more than [`MAX_ELF_READ`] bytes read (logged at debug level). Reads the header, the
/// section headers, `.dynsym` and its string table only, through `read`, never `mmap`
/// (a tenant could truncate a mapped file under the agent: SIGBUS).
pub fn elf_defined_symbols(path: &Path, wanted: &[&str]) -> Option<Vec<String>> {
    let read = || -> Result<Vec<String>, ElfError> {
        let data = ReadCache::new(open_tenant_file(path)?);
        dynamic_symbols_defined(&data, wanted, MAX_ELF_READ)
    };
    match read() {
        Ok(found) => Some(found),
        Err(error) => {
            tracing::debug!(path = %path.display(), %error, "no dynamic symbols read; not a driver");
            None
        }
    }
}

/// [`elf_defined_symbols`] over any [`ReadRef`] (a file through [`ReadCache`], or bytes).
/// Every table's size is checked against `max_read` before `object` reads it: a section
/// header may claim any size up to the file's length, and a sparse file costs its owner
/// nothing.
pub fn dynamic_symbols_defined<'a, R: ReadRef<'a>>(
    data: R,
    wanted: &[&str],
    max_read: u64,
) -> Result<Vec<String>, ElfError> {
    let mut budget = ReadBudget::new(max_read);
    let (_, endian, sections) =
        parse_sections::<elf::FileHeader64<Endianness>, R>(data, &mut budget)?;
    let mut take = |what: &'static str, bytes: u64| budget.take(what, bytes);
    let Some((index, dynsym)) = sections
        .enumerate()
        .find(|(_, s)| s.sh_type(endian) == elf::SHT_DYNSYM)
    else {
        return Ok(Vec::new());
    };
    take(".dynsym", dynsym.sh_size(endian))?;
    let strtab = sections.section(dynsym.link(endian))?;
    take("the .dynsym string table", strtab.sh_size(endian))?;
    for s in sections.iter() {
        if s.sh_type(endian) == elf::SHT_SYMTAB_SHNDX && s.link(endian) == index {
            take("the .dynsym section index table", s.sh_size(endian))?;
        }
    }
    let symbols = SymbolTable::parse(endian, data, &sections, index, dynsym)?;
    // The whole string table in one read, not one read per name.
    let strs = strtab.data(endian, data)?;
    let strings = StringTable::new(strs, 0, strs.len() as u64);
    let mut found: Vec<String> = Vec::new();
    for sym in symbols.iter() {
        if sym.st_shndx(endian) == elf::SHN_UNDEF {
            continue; // imported, not exported
        }
        let Ok(name) = sym.name(endian, strings) else {
            continue;
        };
        let Ok(n) = std::str::from_utf8(name) else {
            continue;
        };
        if wanted.contains(&n) && !found.iter().any(|f| f == n) {
            found.push(n.to_string());
        }
    }
    Ok(found)
}
