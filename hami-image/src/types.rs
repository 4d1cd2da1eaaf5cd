//! The crate's values: its limits and magic numbers, [`ImageError`], [`Extent`] and
//! [`Statics`].

/// Longest image read through an application's pointer (a fatbin of `libcublasLt` is some
/// hundred MiB; anything claiming more is refused as implausible).
pub const MAX_IMAGE: u64 = 1 << 30;

/// Largest decompressed fatbin entry.
pub const MAX_ENTRY: u64 = 512 << 20;

/// Fatbin magic.
pub const FATBIN_MAGIC: u32 = 0xBA55_ED50;

/// `__fatBinC_Wrapper_t` magic.
pub const WRAPPER_MAGIC: u32 = 0x4662_43B1;

/// What was wrong with an image.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ImageError {
    /// A structure runs past the bytes there are.
    #[error("image truncated: {what} needs {need} bytes, only {have} there")]
    Truncated {
        /// The structure.
        what: &'static str,
        /// Bytes it needs (from the start of its container).
        need: u64,
        /// Bytes there are.
        have: u64,
    },
    /// A fatbin header that does not hold together.
    #[error("fatbin at offset {at}: {why}")]
    Fatbin {
        /// Offset of the fatbin in the image.
        at: usize,
        /// What was wrong.
        why: &'static str,
    },
    /// A fatbin entry header that does not hold together.
    #[error("fatbin entry at offset {at}: {why}")]
    Entry {
        /// Offset of the entry in its fatbin.
        at: usize,
        /// What was wrong.
        why: &'static str,
    },
    /// A compressed entry that does not decompress to its declared size.
    #[error("{codec} entry at offset {at}: {why}")]
    Decompress {
        /// `LZ4` or `zstd`.
        codec: &'static str,
        /// Offset of the entry in its fatbin.
        at: usize,
        /// What was wrong.
        why: String,
    },
    /// A size over a cap.
    #[error("{what} of {size} bytes is over the cap of {cap}")]
    TooLarge {
        /// What is that large.
        what: &'static str,
        /// Its size.
        size: u64,
        /// The cap.
        cap: u64,
    },
    /// An ELF cubin that does not hold together.
    #[error("ELF: {0}")]
    Elf(String),
    /// A wrapper's bytes were given where its fatbin was needed (follow
    /// [`Extent::Wrapper`]'s pointer).
    #[error("a fatbin wrapper holds a pointer, not the fatbin itself")]
    Wrapper,
}

/// How much of an image behind a pointer may be read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Extent {
    /// Read this many bytes from the start and ask again.
    Need(u64),
    /// The image is this many bytes long.
    Whole(u64),
    /// A wrapper: the fatbin is at this address (as the wrapper's `data` field says).
    Wrapper(u64),
    /// Not a format with a size (PTX text): nothing to read.
    Unsized,
}

/// What a module image's statics take, in bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Statics {
    /// Placed when the module is loaded: globals and the module's constant banks.
    pub data: u64,
    /// Placed per kernel (at its first use with lazy loading): code and parameter banks.
    pub code: u64,
}

impl Statics {
    /// Data and code.
    pub fn total(&self) -> u64 {
        self.data.saturating_add(self.code)
    }

    /// Both parts added (saturating).
    pub fn plus(self, o: Statics) -> Statics {
        Statics {
            data: self.data.saturating_add(o.data),
            code: self.code.saturating_add(o.code),
        }
    }
}
