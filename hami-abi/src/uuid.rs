//! GPU UUIDs as NVIDIA's tools spell them: `GPU-` and the 16 bytes in lowercase hex, grouped
//! 8-4-4-4-12 (`GPU-0a1b2c3d-0000-1111-2222-333344445555`): what `nvmlDeviceGetUUID` returns,
//! `nvidia-smi -L` prints, dcgm-exporter puts in its `UUID` label and `CUDA_VISIBLE_DEVICES`
//! accepts. The raw form is what `cuDeviceGetUuid` and the region header hold (16 bytes).
//!
//! The one formatter of the workspace: the preload (matching CUDA devices to NVML's) and the
//! agent (its reports, metrics and NVML matching) use it. The fake driver keeps a copy of its
//! own: it stands in for NVIDIA's driver and depends on nothing of hami's.

use core::fmt;

/// Length of a formatted UUID: `GPU-`, 32 hex digits and 4 dashes.
pub const LEN: usize = 40;

/// A raw GPU UUID (16 bytes), shown as `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`. Needs no
/// allocation: `no_std` callers write it with `write!`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GpuUuid(pub [u8; 16]);

impl GpuUuid {
    /// All 16 bytes zero: the UUID is unknown (a region no process has described yet, a
    /// driver that did not say).
    pub fn is_unknown(&self) -> bool {
        self.0.iter().all(|&b| b == 0)
    }
}

impl fmt::Display for GpuUuid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("GPU-")?;
        for (i, b) in self.0.iter().enumerate() {
            // Dashes before bytes 4, 6, 8 and 10: 8-4-4-4-12 hex digits.
            if matches!(i, 4 | 6 | 8 | 10) {
                f.write_str("-")?;
            }
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

use alloc::string::String;

/// `raw` formatted (`GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`), all-zero bytes included.
pub fn format(raw: &[u8; 16]) -> String {
    use core::fmt::Write as _;
    let mut s = String::with_capacity(LEN);
    // Writing to a String cannot fail.
    let _ = write!(s, "{}", GpuUuid(*raw));
    s
}

/// [`format`], or `None` when `raw` is all zero (unknown: see [`GpuUuid::is_unknown`]).
pub fn format_known(raw: &[u8; 16]) -> Option<String> {
    (!GpuUuid(*raw).is_unknown()).then(|| format(raw))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_lowercase_hex_grouped_8_4_4_4_12() {
        let raw = [
            0x0a, 0x1b, 0x2c, 0x3d, 0x00, 0x00, 0x11, 0x11, 0x22, 0x22, 0x33, 0x33, 0x44, 0x44,
            0x55, 0x55,
        ];
        assert_eq!(format(&raw), "GPU-0a1b2c3d-0000-1111-2222-333344445555");
        let raw: [u8; 16] = core::array::from_fn(|i| (i * 17) as u8);
        let s = format(&raw);
        assert_eq!(s, "GPU-00112233-4455-6677-8899-aabbccddeeff");
        assert_eq!(s.len(), LEN);
        assert_eq!(
            format(&[0xAB; 16]),
            "GPU-abababab-abab-abab-abab-abababababab"
        );
    }

    #[test]
    fn all_zero_is_unknown_and_formats_only_when_asked() {
        assert!(GpuUuid([0; 16]).is_unknown());
        assert_eq!(format_known(&[0; 16]), None);
        assert_eq!(format(&[0; 16]), "GPU-00000000-0000-0000-0000-000000000000");
        let mut raw = [0; 16];
        raw[15] = 1;
        assert!(!GpuUuid(raw).is_unknown());
        assert_eq!(
            format_known(&raw).as_deref(),
            Some("GPU-00000000-0000-0000-0000-000000000001")
        );
    }

    #[test]
    fn display_writes_without_allocating() {
        // A fixed buffer, as a `no_std` caller would use.
        struct Buf([u8; LEN], usize);
        impl fmt::Write for Buf {
            fn write_str(&mut self, s: &str) -> fmt::Result {
                let end = self.1 + s.len();
                self.0
                    .get_mut(self.1..end)
                    .ok_or(fmt::Error)?
                    .copy_from_slice(s.as_bytes());
                self.1 = end;
                Ok(())
            }
        }
        let mut b = Buf([0; LEN], 0);
        fmt::Write::write_fmt(&mut b, format_args!("{}", GpuUuid([0xff; 16]))).unwrap();
        assert_eq!(b.1, LEN);
        assert_eq!(&b.0[..], b"GPU-ffffffff-ffff-ffff-ffff-ffffffffffff");
    }
}
