//! The image a module or library load hands the driver, read to estimate what its statics
//! need ([`hami_image`]) before the driver takes the memory.
//!
//! An in-memory image (`cuModuleLoadData(Ex)`, `cuModuleLoadFatBinary`,
//! `cuLibraryLoadData`) has no length: it is read in steps that its own headers bound
//! ([`hami_image::extent`]: a fatbin's header gives its size, an ELF its section table, a
//! wrapper a pointer to its fatbin), at most [`hami_image::MAX_IMAGE`] bytes, which the driver
//! reads as well. PTX text is not read past its first bytes. A file (`cuModuleLoad`,
//! `cuLibraryLoadFromFile`) is read whole if it is at most that long.

use hami_image::{extent, Extent, ImageError, Statics, MAX_IMAGE};
use std::ffi::{c_char, c_void, CStr};
use std::io::Read;
use std::sync::atomic::{AtomicU32, Ordering};

/// Why an image could not be estimated (the load goes on; its memory is measured).
#[derive(Debug, thiserror::Error)]
pub enum EstimateError {
    /// The image does not hold together.
    #[error("{0}")]
    Image(#[from] ImageError),
    /// A wrapper pointing at another wrapper, or a header asking for no more bytes than
    /// it had.
    #[error("image headers do not progress ({0})")]
    Loop(&'static str),
    /// The file could not be read.
    #[error("file {path}: {err}")]
    File {
        /// The path.
        path: String,
        /// What failed.
        err: std::io::Error,
    },
    /// The file is longer than [`MAX_IMAGE`].
    #[error("file {path} of {len} bytes is over the cap of {MAX_IMAGE}")]
    FileTooLarge {
        /// The path.
        path: String,
        /// Its length.
        len: u64,
    },
}

/// Finds the bytes of the image at `addr` through `read(addr, len)` (which returns `len`
/// bytes from `addr`): `None` for PTX text or anything without a size.
pub fn walk<'a>(
    addr: u64,
    read: &dyn Fn(u64, usize) -> &'a [u8],
) -> Result<Option<&'a [u8]>, EstimateError> {
    let mut addr = addr;
    let mut followed = false;
    'image: loop {
        // The magic, one byte at a time: a short PTX string ends before 4 bytes (no magic
        // holds a NUL).
        for i in 0..4 {
            if read(addr + i, 1)[0] == 0 {
                return Ok(None);
            }
        }
        if hami_image::format(read(addr, 4)) == hami_image::Format::Other {
            return Ok(None);
        }
        let mut n: u64 = 16;
        loop {
            match extent(read(addr, n as usize))? {
                Extent::Need(m) if m > n && m <= MAX_IMAGE => n = m,
                Extent::Need(_) => return Err(EstimateError::Loop("a header asks for no more")),
                Extent::Whole(w) => return Ok(Some(read(addr, w as usize))),
                Extent::Unsized => return Ok(None),
                Extent::Wrapper(p) => {
                    if followed {
                        return Err(EstimateError::Loop("a wrapper of a wrapper"));
                    }
                    followed = true;
                    addr = p;
                    continue 'image;
                }
            }
        }
    }
}

/// The statics of the in-memory image at `image` for SM `sm` (`None`: not known: PTX).
///
/// # Safety
/// `image` is what the application passes the driver as an image: a readable fatbin,
/// wrapper, ELF cubin or NUL-terminated PTX string, whose headers tell its size.
pub unsafe fn of_memory(image: *const c_void, sm: u32) -> Result<Option<Statics>, EstimateError> {
    if image.is_null() {
        return Ok(None);
    }
    let read = |a: u64, n: usize| -> &[u8] {
        // SAFETY: per this function's contract: the image's own headers bound every read
        // (`walk`), and the driver reads those bytes too.
        unsafe { std::slice::from_raw_parts(a as *const u8, n) }
    };
    match walk(image as u64, &read)? {
        Some(b) => Ok(hami_image::statics(b, sm)?),
        None => Ok(None),
    }
}

/// Whether the in-memory image at `image` (a wrapper: it and its fatbin) lies in the static
/// data of a loaded object (`dladdr`): what the CUDA runtime registers, readable as long as
/// the object is loaded (the runtime unloads its modules before the object goes). Such an
/// image can be read at the module's first use rather than at its load.
///
/// # Safety
/// As [`of_memory`].
pub unsafe fn is_static(image: *const c_void) -> bool {
    let loaded = |p: *const c_void| {
        // SAFETY: an all-zero `Dl_info` is a valid out value.
        let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
        // SAFETY: dladdr only compares the address with the loaded objects' mappings.
        !p.is_null() && unsafe { libc::dladdr(p, &mut info) } != 0
    };
    if !loaded(image) {
        return false;
    }
    let read = |a: u64, n: usize| -> &[u8] {
        // SAFETY: per this function's contract (the image's first bytes, and a wrapper's 16).
        unsafe { std::slice::from_raw_parts(a as *const u8, n) }
    };
    let a = image as u64;
    if (0..4).any(|i| read(a + i, 1)[0] == 0) {
        return true;
    }
    match extent(read(a, 4)) {
        Ok(Extent::Need(_)) if hami_image::format(read(a, 4)) == hami_image::Format::Wrapper => {
            match extent(read(a, 16)) {
                Ok(Extent::Wrapper(fb)) => loaded(fb as *const c_void),
                _ => false,
            }
        }
        _ => true,
    }
}

/// The statics of the image file `fname` for SM `sm`.
///
/// # Safety
/// `fname` is NULL or a NUL-terminated path (the C contract of the load).
pub unsafe fn of_file(fname: *const c_char, sm: u32) -> Result<Option<Statics>, EstimateError> {
    if fname.is_null() {
        return Ok(None);
    }
    // SAFETY: checked non-NULL; NUL-terminated per this function's contract.
    let path = unsafe { CStr::from_ptr(fname) }
        .to_string_lossy()
        .into_owned();
    let file_err = |err| EstimateError::File {
        path: path.clone(),
        err,
    };
    let f = std::fs::File::open(&path).map_err(file_err)?;
    let len = f.metadata().map_err(file_err)?.len();
    if len > MAX_IMAGE {
        return Err(EstimateError::FileTooLarge { path, len });
    }
    let mut b = Vec::with_capacity(len as usize);
    f.take(MAX_IMAGE).read_to_end(&mut b).map_err(file_err)?;
    Ok(hami_image::statics(&b, sm)?)
}

/// Compute capability of each device (major * 10 + minor; 0: not read yet).
static SM: [AtomicU32; hami_abi::layout::MAX_DEVICES] =
    [const { AtomicU32::new(0) }; hami_abi::layout::MAX_DEVICES];

/// The compute capability of CUDA ordinal `dev` as major * 10 + minor
/// (`CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR` / `_MINOR`, read once), 0 when the driver
/// does not say (then the largest estimate among a fatbin's cubins is taken).
pub fn device_sm(dev: usize, get: impl Fn(i32) -> Option<i32>) -> u32 {
    let Some(slot) = SM.get(dev) else {
        return 0;
    };
    let v = slot.load(Ordering::Relaxed);
    if v != 0 {
        return v;
    }
    let (Some(major), Some(minor)) = (get(75), get(76)) else {
        return 0;
    };
    let v = (major.max(0) as u32) * 10 + minor.max(0) as u32;
    slot.store(v, Ordering::Relaxed);
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(name: &str) -> Vec<u8> {
        std::fs::read(format!(
            "{}/../hami-image/tests/data/{name}",
            env!("CARGO_MANIFEST_DIR")
        ))
        .unwrap()
    }

    /// A fake address space: (base, bytes) regions; reads outside them panic (a test bug).
    fn space(regions: &[(u64, &[u8])]) -> impl Fn(u64, usize) -> &'static [u8] {
        let owned: Vec<(u64, &'static [u8])> = regions
            .iter()
            .map(|&(a, b)| (a, &*Box::leak(b.to_vec().into_boxed_slice())))
            .collect();
        move |a, n| {
            for &(base, b) in &owned {
                if a >= base && a + n as u64 <= base + b.len() as u64 {
                    let o = (a - base) as usize;
                    return &b[o..o + n];
                }
            }
            panic!("read of {n} bytes at {a:#x} outside the image");
        }
    }

    const EXPECTED: u64 = 0x6000_0000 + 0x1000 + 0x4000 + 0x214 + 0x10 + 0x200;

    #[test]
    fn a_wrapper_is_followed_to_its_fatbin_and_reads_stay_inside() {
        let f = data("g_default.fatbin");
        // The second fatbin of the section, alone at its address, as the runtime registers it.
        let fb = &f[1608..];
        let mut w = Vec::new();
        w.extend_from_slice(&0x4662_43B1u32.to_le_bytes());
        w.extend_from_slice(&1u32.to_le_bytes());
        w.extend_from_slice(&0x9000u64.to_le_bytes());
        w.extend_from_slice(&0u64.to_le_bytes());
        let read = space(&[(0x1000, &w), (0x9000, fb)]);
        let b = walk(0x1000, &read).unwrap().unwrap();
        assert_eq!(b.len(), fb.len());
        assert_eq!(
            hami_image::statics(b, 90).unwrap().map(|s| s.total()),
            Some(EXPECTED)
        );
        // A cubin: read to the end of its furthest section or table, no further.
        let c = data("g.cubin");
        let read = space(&[(0x4000, &c)]);
        assert_eq!(walk(0x4000, &read).unwrap().unwrap().len(), c.len());
        // PTX, short strings: only their first bytes.
        let read = space(&[(0x10, b"ab\0")]);
        assert!(walk(0x10, &read).unwrap().is_none());
        let read = space(&[(0x10, b".version 9.0\n\0")]);
        assert!(walk(0x10, &read).unwrap().is_none());
        // A wrapper pointing at a wrapper.
        let mut ww = w.clone();
        ww[8..16].copy_from_slice(&0x1000u64.to_le_bytes());
        let read = space(&[(0x1000, &ww)]);
        assert!(matches!(walk(0x1000, &read), Err(EstimateError::Loop(_))));
    }

    static STATIC_IMAGE: [u8; 16] = *b"//\n.version 9.0\0";

    #[test]
    fn static_data_of_a_loaded_object_is_static_and_the_heap_is_not() {
        // SAFETY: a NUL-terminated string in this test binary's data.
        assert!(unsafe { is_static(STATIC_IMAGE.as_ptr().cast()) });
        let heap = b"//\n.version 9.0\0".to_vec();
        // SAFETY: a NUL-terminated string on the heap.
        assert!(!unsafe { is_static(heap.as_ptr().cast()) });
        // A static wrapper pointing at a heap fatbin is not.
        let f = data("g_comp.fatbin");
        let mut w = Vec::new();
        w.extend_from_slice(&0x4662_43B1u32.to_le_bytes());
        w.extend_from_slice(&1u32.to_le_bytes());
        w.extend_from_slice(&(f.as_ptr() as u64).to_le_bytes());
        w.extend_from_slice(&0u64.to_le_bytes());
        static mut W: [u8; 24] = [0; 24];
        // SAFETY: test-only, one thread writes this static once.
        let wp = unsafe {
            let p = &raw mut W;
            (*p).copy_from_slice(&w);
            p as *const c_void
        };
        // SAFETY: a wrapper in static data, its fatbin on the heap.
        assert!(!unsafe { is_static(wp) });
    }

    #[test]
    fn the_sm_is_read_once_per_device() {
        let calls = std::cell::Cell::new(0);
        let get = |a| {
            calls.set(calls.get() + 1);
            Some(if a == 75 { 9 } else { 0 })
        };
        assert_eq!(device_sm(7, get), 90);
        assert_eq!(device_sm(7, get), 90);
        assert_eq!(calls.get(), 2);
        assert_eq!(device_sm(8, |_| None), 0);
        assert_eq!(device_sm(99, get), 0);
    }
}
