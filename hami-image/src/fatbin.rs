//! Fatbins: header, entries, the entry for a device, decompression.

use crate::bytes::{u16_at, u32_at, u64_at};
use crate::elf::elf_statics;
use crate::types::{ImageError, Statics, FATBIN_MAGIC, MAX_ENTRY};
use std::borrow::Cow;

const HEADER: usize = 16;
const ENTRY: usize = 64;
/// Largest entry header believed (PTX entries have 0x50).
const MAX_ENTRY_HEADER: u32 = 4096;
const KIND_PTX: u16 = 1;
const KIND_ELF: u16 = 2;
const FLAG_LZ4: u64 = 0x2000;
const FLAG_ZSTD: u64 = 0x8000;

/// One fatbin entry's header fields.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry {
    /// Offset of the entry's header in its fatbin.
    pub at: usize,
    /// 1 PTX, 2 ELF.
    pub kind: u16,
    /// SM it was built for (`90`).
    pub arch: u32,
    /// Flags (`0x2000` LZ4, `0x8000` zstd).
    pub flags: u64,
    /// Offset of the payload in the fatbin, and its length.
    pub payload: (usize, usize),
    /// Compressed bytes of the payload (compressed entries).
    pub compressed: u64,
    /// Decompressed size (compressed entries).
    pub decompressed: u64,
}

impl Entry {
    /// Whether it is an ELF cubin.
    pub fn is_elf(&self) -> bool {
        self.kind == KIND_ELF
    }

    /// Whether it is PTX.
    pub fn is_ptx(&self) -> bool {
        self.kind == KIND_PTX
    }
}

/// The entries of the fatbin `fb` (exactly one fatbin: header and entries).
pub fn entries(fb: &[u8]) -> Result<Vec<Entry>, ImageError> {
    if u32_at(fb, 0) != Some(FATBIN_MAGIC) {
        return Err(ImageError::Fatbin {
            at: 0,
            why: "bad magic",
        });
    }
    let hs = u16_at(fb, 6).ok_or(ImageError::Truncated {
        what: "fatbin header",
        need: HEADER as u64,
        have: fb.len() as u64,
    })?;
    let size = u64_at(fb, 8).ok_or(ImageError::Truncated {
        what: "fatbin header",
        need: HEADER as u64,
        have: fb.len() as u64,
    })?;
    if usize::from(hs) < HEADER {
        return Err(ImageError::Fatbin {
            at: 0,
            why: "header size below 16",
        });
    }
    let end = u64::from(hs).saturating_add(size);
    if end > fb.len() as u64 {
        return Err(ImageError::Truncated {
            what: "fatbin",
            need: end,
            have: fb.len() as u64,
        });
    }
    let end = end as usize;
    let mut out = Vec::new();
    let mut at = usize::from(hs);
    while at < end {
        let e = &fb[at..end];
        if e.len() < ENTRY {
            return Err(ImageError::Truncated {
                what: "fatbin entry header",
                need: (at + ENTRY) as u64,
                have: end as u64,
            });
        }
        let bad = |why| ImageError::Entry { at, why };
        let kind = u16_at(e, 0).ok_or(bad("header"))?;
        let ehs = u32_at(e, 4).ok_or(bad("header"))?;
        let psize = u64_at(e, 8).ok_or(bad("header"))?;
        if !(ENTRY as u32..=MAX_ENTRY_HEADER).contains(&ehs) {
            return Err(bad("entry header size out of range"));
        }
        let pstart = at + ehs as usize;
        let pend = (pstart as u64).saturating_add(psize);
        if pend > end as u64 {
            return Err(ImageError::Truncated {
                what: "fatbin entry payload",
                need: pend,
                have: end as u64,
            });
        }
        out.push(Entry {
            at,
            kind,
            arch: u32_at(e, 0x1c).ok_or(bad("header"))?,
            flags: u64_at(e, 0x28).ok_or(bad("header"))?,
            payload: (pstart, psize as usize),
            compressed: u64::from(u32_at(e, 0x10).ok_or(bad("header"))?),
            decompressed: u64_at(e, 0x38).ok_or(bad("header"))?,
        });
        at = pend as usize;
    }
    Ok(out)
}

/// The payload of `e` (in fatbin `fb`), decompressed if it is compressed.
pub fn payload<'a>(fb: &'a [u8], e: &Entry) -> Result<Cow<'a, [u8]>, ImageError> {
    let raw = &fb[e.payload.0..e.payload.0 + e.payload.1];
    let codec = match (e.flags & FLAG_LZ4 != 0, e.flags & FLAG_ZSTD != 0) {
        (false, false) => return Ok(Cow::Borrowed(raw)),
        (true, true) => {
            return Err(ImageError::Entry {
                at: e.at,
                why: "both LZ4 and zstd flags",
            })
        }
        (true, false) => "LZ4",
        (false, true) => "zstd",
    };
    if e.decompressed > MAX_ENTRY {
        return Err(ImageError::TooLarge {
            what: "decompressed entry",
            size: e.decompressed,
            cap: MAX_ENTRY,
        });
    }
    let n = if e.compressed == 0 {
        raw.len()
    } else {
        usize::try_from(e.compressed).unwrap_or(usize::MAX)
    };
    let src = raw.get(..n).ok_or(ImageError::Entry {
        at: e.at,
        why: "compressed size larger than the payload",
    })?;
    let cap = e.decompressed as usize;
    let fail = |why: String| ImageError::Decompress {
        codec,
        at: e.at,
        why,
    };
    let out = if codec == "LZ4" {
        lz4_block(src, cap).map_err(fail)?
    } else {
        zstd(src, cap).map_err(fail)?
    };
    if out.len() as u64 != e.decompressed {
        return Err(fail(format!(
            "decompressed to {} bytes, {} declared",
            out.len(),
            e.decompressed
        )));
    }
    Ok(Cow::Owned(out))
}

/// The LZ4 block `src` (the fatbin's `--compress-mode=speed` entries: one raw block, no
/// frame) into at most `cap` bytes. LZ4 expands at most 255 times, so a header claiming more
/// than that costs nothing up front.
fn lz4_block(src: &[u8], cap: usize) -> Result<Vec<u8>, String> {
    let mut out = vec![0u8; cap.min(src.len().saturating_mul(255))];
    // A decoder bug must not take the process down: it is garbage input all the same.
    std::panic::catch_unwind(move || {
        let n = lz4_flex::block::decompress_into(src, &mut out).map_err(|e| e.to_string())?;
        out.truncate(n);
        Ok(out)
    })
    .unwrap_or_else(|_| Err("decoder failed".to_string()))
}

/// zstd frames `src` into at most `cap` bytes (the output grows as it is decoded: a header
/// claiming a large size costs nothing up front).
fn zstd(src: &[u8], cap: usize) -> Result<Vec<u8>, String> {
    use std::io::Read;
    // A decoder bug must not take the process down: it is garbage input all the same.
    std::panic::catch_unwind(|| {
        let mut input = src;
        let mut out = Vec::new();
        while !input.is_empty() {
            let d =
                ruzstd::decoding::StreamingDecoder::new(&mut input).map_err(|e| e.to_string())?;
            let room = (cap - out.len()) as u64 + 1;
            d.take(room)
                .read_to_end(&mut out)
                .map_err(|e| e.to_string())?;
            if out.len() > cap {
                return Err("output larger than declared".to_string());
            }
        }
        Ok(out)
    })
    .unwrap_or_else(|_| Err("decoder failed".to_string()))
}

/// The statics of one fatbin `fb` for SM `sm` (see [`crate::statics`]).
fn one(fb: &[u8], sm: u32) -> Result<Option<Statics>, ImageError> {
    let es = entries(fb)?;
    let elf: Vec<&Entry> = es.iter().filter(|e| e.is_elf()).collect();
    if let Some(e) = elf.iter().find(|e| e.arch == sm) {
        return elf_statics(&payload(fb, e)?).map(Some);
    }
    let mut best: Option<Statics> = None;
    for e in elf {
        let s = elf_statics(&payload(fb, e)?)?;
        best = Some(match best {
            Some(b) if b.total() >= s.total() => b,
            _ => s,
        });
    }
    Ok(best)
}

/// The statics of the fatbins back to back in `image` for SM `sm`: the sum over the fatbins
/// (`None` when none has an ELF entry). Bytes after the last fatbin that do not start another
/// one (section padding) are ignored.
pub fn fatbin_statics(image: &[u8], sm: u32) -> Result<Option<Statics>, ImageError> {
    let mut at = 0;
    let mut total: Option<Statics> = None;
    while u32_at(image, at) == Some(FATBIN_MAGIC) {
        let fb = &image[at..];
        let (Some(hs), Some(size)) = (u16_at(fb, 6), u64_at(fb, 8)) else {
            return Err(ImageError::Truncated {
                what: "fatbin header",
                need: (at + HEADER) as u64,
                have: image.len() as u64,
            });
        };
        let len = u64::from(hs).saturating_add(size);
        let one = one(fb, sm).map_err(|e| match e {
            ImageError::Fatbin { at: a, why } => ImageError::Fatbin { at: at + a, why },
            e => e,
        })?;
        if let Some(s) = one {
            total = Some(total.unwrap_or_default().plus(s));
        }
        // `one` checked that `len` bytes are there.
        at += len as usize;
    }
    if at == 0 {
        return Err(ImageError::Fatbin {
            at: 0,
            why: "bad magic",
        });
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::lz4_block;

    #[test]
    fn lz4_blocks_decode_within_their_cap() {
        // "abc" then a match of offset 3, length 9 ("abcabcabc"), then the literal "!".
        let src = [0x35, b'a', b'b', b'c', 3, 0, 0x10, b'!'];
        assert_eq!(lz4_block(&src, 64).unwrap(), b"abcabcabcabc!");
        assert!(lz4_block(&src, 5).is_err(), "output beyond the cap");
        // Offset 0, an offset past the output, truncations, nothing.
        assert!(lz4_block(&[0x10, b'a', 0, 0], 64).is_err());
        assert!(lz4_block(&[0x10, b'a', 2, 0], 64).is_err());
        for n in 0..src.len() {
            let _ = lz4_block(&src[..n], 64);
        }
        // Extended literal lengths.
        let mut long = vec![0xf0, 0x00];
        long.extend(std::iter::repeat_n(b'x', 15));
        assert_eq!(lz4_block(&long, 15).unwrap().len(), 15);
    }
}
