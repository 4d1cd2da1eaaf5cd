//! Footprint estimate of CUDA arrays (`cuArrayCreate_v2`, `cuArray3DCreate_v2`) and mipmapped
//! arrays (`cuMipmappedArrayCreate`).
//!
//! The driver does not say how much device memory an array takes, so both the preload (which
//! charges it) and the eBPF probes (which observe it) use this same estimate:
//! `width * max(height,1) * max(depth,1) * bytes_per_texel(format, channels)`, rounded up to
//! [`ARRAY_GRANULE`]. Clamps instead of overflowing, never panics, has no loops: it is
//! called from eBPF programs too.

/// Granule the estimate is rounded up to (2 MiB, the driver's large-page size).
pub const ARRAY_GRANULE: u64 = 2 << 20;

/// Bytes one texel of `format` (a `CUarray_format` value) with `channels` channels takes.
///
/// Plain formats: channel size times `channels` (clamped to 1..=4). Formats that fix their own
/// channel count (`CU_AD_FORMAT_UNORM_INT8X2`, ...) ignore `channels`. NV12 counts 2 bytes
/// (it really takes 1.5), block-compressed formats 1 byte (BC1/BC4 really take 0.5): upper
/// bounds. Unknown formats count 16 bytes (the largest texel), also an upper bound.
pub const fn bytes_per_texel(format: u32, channels: u32) -> u64 {
    let ch = if channels == 0 {
        1
    } else if channels > 4 {
        4
    } else {
        channels as u64
    };
    match format {
        // UNSIGNED_INT8, SIGNED_INT8
        0x01 | 0x08 => ch,
        // UNSIGNED_INT16, SIGNED_INT16, HALF
        0x02 | 0x09 | 0x10 => 2 * ch,
        // UNSIGNED_INT32, SIGNED_INT32, FLOAT
        0x03 | 0x0a | 0x20 => 4 * ch,
        // NV12
        0xb0 => 2,
        // UNORM/SNORM INT8 X1, X2, X4
        0xc0 | 0xc6 => 1,
        0xc1 | 0xc7 => 2,
        0xc2 | 0xc8 => 4,
        // UNORM/SNORM INT16 X1, X2, X4
        0xc3 | 0xc9 => 2,
        0xc4 | 0xca => 4,
        0xc5 | 0xcb => 8,
        // BC1..BC7 (block compressed)
        0x91..=0x9e => 1,
        _ => 16,
    }
}

/// Largest dimension counted (2^19). The driver's limits are far below (2^17 for 1D/2D
/// widths, 2^14 for 3D), so valid arrays are never clamped; the clamp keeps the product
/// within 64 bits without an overflow check (the BPF backend cannot lower a 128-bit
/// multiply, which is what LLVM turns an overflow check into).
pub const MAX_DIM: u64 = 1 << 19;

const fn dim(v: u64) -> u64 {
    if v == 0 {
        1
    } else if v > MAX_DIM {
        MAX_DIM
    } else {
        v
    }
}

/// Estimated device-memory footprint of an array, in bytes, rounded up to [`ARRAY_GRANULE`].
///
/// `height` and `depth` of 0 (1D and 2D arrays) count as 1; dimensions above [`MAX_DIM`]
/// count as [`MAX_DIM`]. A `width` of 0 gives 0 (the driver rejects such arrays).
pub const fn array_footprint(
    width: u64,
    height: u64,
    depth: u64,
    format: u32,
    channels: u32,
) -> u64 {
    if width == 0 {
        return 0;
    }
    // At most 2^57 * 16 = 2^61: no overflow.
    let bytes = dim(width)
        .wrapping_mul(dim(height))
        .wrapping_mul(dim(depth))
        .wrapping_mul(bytes_per_texel(format, channels));
    (bytes + ARRAY_GRANULE - 1) & !(ARRAY_GRANULE - 1)
}

/// Most mipmap levels counted: a level beyond the 32nd of any valid array is 1x1x1 (the
/// driver's largest dimension is below 2^17), and counting stops there.
pub const MAX_MIP_LEVELS: u32 = 32;

/// Estimated device-memory footprint of a mipmapped array of `levels` levels, in bytes,
/// rounded up to [`ARRAY_GRANULE`]: the sum over levels `l` of
/// `max(width >> l, 1) * max(height >> l, 1) * max(depth >> l, 1) * bytes_per_texel` (a
/// dimension of 0 stays 0, i.e. counts as 1, at every level), granule-rounded once. `levels`
/// of 0 counts as 1 and above [`MAX_MIP_LEVELS`] as [`MAX_MIP_LEVELS`]. The level-0 term is
/// [`array_footprint`]'s; each level adds at most an eighth (3D) to a quarter (2D) of it, so
/// the sum stays below 2x level 0: no overflow. A `layered` array (`CUDA_ARRAY3D_LAYERED`)
/// keeps its `depth` (the layer count) at every level.
pub const fn mipmap_footprint(
    width: u64,
    height: u64,
    depth: u64,
    format: u32,
    channels: u32,
    levels: u32,
    layered: bool,
) -> u64 {
    if width == 0 {
        return 0;
    }
    let levels = if levels == 0 {
        1
    } else if levels > MAX_MIP_LEVELS {
        MAX_MIP_LEVELS
    } else {
        levels
    };
    let texel = bytes_per_texel(format, channels);
    let (w, h, d) = (dim(width), dim(height), dim(depth));
    let mut sum: u64 = 0;
    let mut l = 0;
    while l < levels {
        let lw = if (w >> l) == 0 { 1 } else { w >> l };
        let lh = if (h >> l) == 0 { 1 } else { h >> l };
        let ld = if layered {
            d
        } else if (d >> l) == 0 {
            1
        } else {
            d >> l
        };
        sum = sum.saturating_add(lw.wrapping_mul(lh).wrapping_mul(ld).wrapping_mul(texel));
        l += 1;
    }
    sum.saturating_add(ARRAY_GRANULE - 1) & !(ARRAY_GRANULE - 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounds_up_to_granule() {
        // 1024 x 1024 float4 = 16 MiB exactly.
        assert_eq!(array_footprint(1024, 1024, 0, 0x20, 4), 16 << 20);
        // A 1-byte array still takes a granule.
        assert_eq!(array_footprint(1, 0, 0, 0x01, 1), ARRAY_GRANULE);
        // 3D: 100 x 100 x 100 x u16 x 2 = 4,000,000 bytes -> 4 MiB (2 granules).
        assert_eq!(array_footprint(100, 100, 100, 0x02, 2), 4 << 20);
        assert_eq!(array_footprint(0, 10, 10, 0x20, 1), 0);
    }

    #[test]
    fn formats() {
        assert_eq!(bytes_per_texel(0x10, 2), 4);
        assert_eq!(bytes_per_texel(0x03, 9), 16);
        assert_eq!(bytes_per_texel(0xc5, 1), 8);
        assert_eq!(bytes_per_texel(0x95, 4), 1);
        assert_eq!(bytes_per_texel(0x7777, 1), 16);
    }

    #[test]
    fn mipmaps() {
        // The H200 measurement: 16384 x 16384, 2 x float32, 1 level = 2048 MiB.
        assert_eq!(
            mipmap_footprint(16384, 16384, 0, 0x20, 2, 1, false),
            2048 << 20
        );
        assert_eq!(
            mipmap_footprint(16384, 16384, 0, 0x20, 2, 0, false),
            array_footprint(16384, 16384, 0, 0x20, 2)
        );
        // 1024 x 1024 float, all 11 levels: 4 MiB * (1 + 1/4 + 1/16 + ...) + the 1x1 tail.
        let full = mipmap_footprint(1024, 1024, 0, 0x20, 1, 11, false);
        let exact: u64 = (0..11).map(|l| (1024u64 >> l) * (1024u64 >> l) * 4).sum();
        assert_eq!(full, (exact + ARRAY_GRANULE - 1) & !(ARRAY_GRANULE - 1));
        assert!(full > 4 << 20 && full <= 6 << 20);
        // 3D: each level an eighth of the previous one; more levels than halvings.
        let m3 = mipmap_footprint(256, 256, 256, 0x20, 1, 40, false);
        assert!((64 << 20..=74 << 20).contains(&m3), "{m3}");
        // Layered: 8 layers of 1024 x 1024 float at every level.
        assert_eq!(
            mipmap_footprint(1024, 1024, 8, 0x20, 1, 2, true),
            8 * (4 << 20) + 8 * (1 << 20)
        );
        assert_eq!(mipmap_footprint(0, 5, 5, 0x20, 1, 3, false), 0);
        // Hostile values: clamped, no overflow, still a granule multiple.
        let max = mipmap_footprint(u64::MAX, u64::MAX, u64::MAX, 0x7777, 9, u32::MAX, true);
        assert_eq!(max % ARRAY_GRANULE, 0);
        assert!(max >= array_footprint(u64::MAX, u64::MAX, u64::MAX, 0x7777, 9));
    }

    #[test]
    fn clamps() {
        let max = array_footprint(u64::MAX, u64::MAX, u64::MAX, 0x20, 4);
        assert_eq!(max, MAX_DIM * MAX_DIM * MAX_DIM * 16);
        assert_eq!(max % ARRAY_GRANULE, 0);
        // The real driver limits are far from the clamp.
        assert_eq!(array_footprint(1 << 17, 1 << 16, 0, 0x01, 1), 1 << 33);
    }
}
