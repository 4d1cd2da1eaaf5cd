//! The configuration contract shared by the preload (which obeys it) and the agent (which
//! reads it from `/proc/<pid>/environ` to detect tampering): variable names, the default
//! region path and the size syntax. One parser, so both halves can never disagree about what
//! `CUDA_DEVICE_MEMORY_LIMIT=4g` means.

use core::fmt;

/// Limit for every device.
pub const ENV_LIMIT: &str = "CUDA_DEVICE_MEMORY_LIMIT";
/// Region file path.
pub const ENV_REGION: &str = "CUDA_DEVICE_MEMORY_SHARED_CACHE";
/// Log level of the preload.
pub const ENV_LOG_LEVEL: &str = "LIBCUDA_LOG_LEVEL";
/// Fixed context overhead in bytes (skips the measurement).
pub const ENV_CONTEXT_OVERHEAD: &str = "HAMI_CONTEXT_OVERHEAD";
/// Region file used when [`ENV_REGION`] is unset or empty.
pub const DEFAULT_REGION_PATH: &str = "/tmp/cudevshr.cache";

/// Why a size value was rejected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SizeError {
    /// Empty or whitespace only.
    Empty,
    /// A minus sign.
    Negative,
    /// Not digits with an optional K/M/G/T suffix.
    Malformed,
    /// Does not fit in 64 bits.
    Overflow,
}

impl fmt::Display for SizeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SizeError::Empty => "empty value",
            SizeError::Negative => "negative value",
            SizeError::Malformed => "not a number of bytes with an optional K/M/G/T suffix",
            SizeError::Overflow => "value overflows 64 bits",
        })
    }
}

impl core::error::Error for SizeError {}

/// Parses a size: decimal digits with an optional single suffix K, M, G or T (either case,
/// powers of 1024). Surrounding whitespace is ignored. `0` is a valid value (no limit).
pub fn parse_size(value: &str) -> Result<u64, SizeError> {
    let v = value.trim();
    if v.is_empty() {
        return Err(SizeError::Empty);
    }
    if v.starts_with('-') {
        return Err(SizeError::Negative);
    }
    let (digits, shift) = match v.as_bytes()[v.len() - 1] {
        b'k' | b'K' => (&v[..v.len() - 1], 10),
        b'm' | b'M' => (&v[..v.len() - 1], 20),
        b'g' | b'G' => (&v[..v.len() - 1], 30),
        b't' | b'T' => (&v[..v.len() - 1], 40),
        _ => (v, 0),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(SizeError::Malformed);
    }
    let n: u64 = digits.parse().map_err(|_| SizeError::Overflow)?;
    n.checked_mul(1u64 << shift).ok_or(SizeError::Overflow)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("0"), Ok(0));
        assert_eq!(parse_size("1024"), Ok(1024));
        assert_eq!(parse_size("1k"), Ok(1024));
        assert_eq!(parse_size("1K"), Ok(1024));
        assert_eq!(parse_size("3m"), Ok(3 << 20));
        assert_eq!(parse_size("2G"), Ok(2 << 30));
        assert_eq!(parse_size(" 5t "), Ok(5 << 40));
        assert_eq!(parse_size(""), Err(SizeError::Empty));
        assert_eq!(parse_size("  "), Err(SizeError::Empty));
        assert_eq!(parse_size("-1"), Err(SizeError::Negative));
        assert_eq!(parse_size("-1G"), Err(SizeError::Negative));
        assert_eq!(parse_size("1.5G"), Err(SizeError::Malformed));
        assert_eq!(parse_size("G"), Err(SizeError::Malformed));
        assert_eq!(parse_size("12x"), Err(SizeError::Malformed));
        assert_eq!(parse_size("1GB"), Err(SizeError::Malformed));
        assert_eq!(parse_size("2GiB"), Err(SizeError::Malformed));
        assert_eq!(parse_size("+5"), Err(SizeError::Malformed));
        assert_eq!(parse_size("0x10"), Err(SizeError::Malformed));
        assert_eq!(parse_size("18446744073709551616"), Err(SizeError::Overflow));
        assert_eq!(parse_size("18446744073709551615"), Ok(u64::MAX));
        assert_eq!(parse_size("16777216T"), Err(SizeError::Overflow));
        assert_eq!(parse_size("16777215T"), Ok(16777215u64 << 40));
    }
}
