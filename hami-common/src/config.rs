//! The configuration contract shared by the preload (which obeys it) and the agent (which
//! reads it from `/proc/<pid>/environ` to detect tampering): variable names, the default
//! region path and the size syntax. One parser, so both halves can never disagree about what
//! `CUDA_DEVICE_MEMORY_LIMIT=4g` means.

use core::fmt;

/// Limit for every device.
pub const ENV_LIMIT: &str = "CUDA_DEVICE_MEMORY_LIMIT";
/// Region file path.
pub const ENV_REGION: &str = "CUDA_DEVICE_MEMORY_SHARED_CACHE";
/// HAMi's device plugin sets it to `true` when its `deviceMemoryScaling` is above 1 (device
/// memory beyond the physical, backed by host memory). hami-preload does not implement that:
/// a value that asks for it ([`oversubscribe_requested`]) is refused with a warning at the
/// first CUDA call, and every quota stays what `CUDA_DEVICE_MEMORY_LIMIT[_<i>]` says, within
/// the GPU's physical memory (`docs/hami.md`). The agent reports such processes.
pub const ENV_OVERSUBSCRIBE: &str = "CUDA_OVERSUBSCRIBE";

/// Whether a [`ENV_OVERSUBSCRIBE`] value asks for oversubscription: anything but an empty
/// value, `false`, `0`, `no` or `off` (any case).
pub fn oversubscribe_requested(value: &str) -> bool {
    let v = value.trim();
    !(v.is_empty()
        || ["false", "0", "no", "off"]
            .iter()
            .any(|o| v.eq_ignore_ascii_case(o)))
}

/// Log level of the preload.
pub const ENV_LOG_LEVEL: &str = "LIBCUDA_LOG_LEVEL";
/// Fixed context overhead in bytes (skips the measurement).
pub const ENV_CONTEXT_OVERHEAD: &str = "HAMI_CONTEXT_OVERHEAD";
/// Permission bits of a region file this process creates (octal, e.g. `0660`); default
/// [`DEFAULT_REGION_MODE`]. See `docs/shared-region.md` (trust model).
pub const ENV_REGION_MODE: &str = "HAMI_REGION_MODE";
/// Numeric group id given to a region file this process creates (default: the creator's).
pub const ENV_REGION_GROUP: &str = "HAMI_REGION_GROUP";
/// Mode of a created region: every process of the container can use it, whatever its uid
/// (the container is one trust domain sharing one quota; HAMi-core uses the same).
pub const DEFAULT_REGION_MODE: u32 = 0o666;
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

/// Why a [`ENV_REGION_MODE`] or [`ENV_REGION_GROUP`] value was rejected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PermError {
    /// Empty or whitespace only.
    Empty,
    /// Not octal digits (mode) or not decimal digits (group).
    Malformed,
    /// A mode with bits outside `0666` (execute, setuid, setgid, sticky, or > `07777`).
    ExtraBits,
    /// A mode without read and write for the owner (the creator itself could not reopen it).
    OwnerCannotWrite,
    /// A group id that does not fit in 32 bits, or the reserved `4294967295` (`-1`).
    GroupOutOfRange,
}

impl fmt::Display for PermError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PermError::Empty => "empty value",
            PermError::Malformed => "not a number (octal mode such as 0660, or numeric group id)",
            PermError::ExtraBits => "mode may only hold read/write bits (at most 0666)",
            PermError::OwnerCannotWrite => {
                "mode must give the owner read and write (0600 at least)"
            }
            PermError::GroupOutOfRange => "group id out of range",
        })
    }
}

impl core::error::Error for PermError {}

/// Parses a region mode: octal digits with an optional `0`/`0o` prefix (`666`, `0660`,
/// `0o600`), surrounding whitespace ignored. Only read/write bits are allowed, and the owner
/// must have both.
pub fn parse_region_mode(value: &str) -> Result<u32, PermError> {
    let v = value.trim();
    if v.is_empty() {
        return Err(PermError::Empty);
    }
    let digits = v.strip_prefix("0o").unwrap_or(v);
    if digits.is_empty() || digits.len() > 5 || !digits.bytes().all(|b| (b'0'..=b'7').contains(&b))
    {
        return Err(PermError::Malformed);
    }
    let mode = digits.bytes().fold(0u32, |m, b| m * 8 + (b - b'0') as u32);
    if mode & !0o666 != 0 {
        return Err(PermError::ExtraBits);
    }
    if mode & 0o600 != 0o600 {
        return Err(PermError::OwnerCannotWrite);
    }
    Ok(mode)
}

/// Parses a region group: a decimal group id (names are not resolved: the preload must not
/// load NSS modules inside an application).
pub fn parse_region_group(value: &str) -> Result<u32, PermError> {
    let v = value.trim();
    if v.is_empty() {
        return Err(PermError::Empty);
    }
    if !v.bytes().all(|b| b.is_ascii_digit()) {
        return Err(PermError::Malformed);
    }
    match v.parse::<u32>() {
        Ok(g) if g != u32::MAX => Ok(g),
        _ => Err(PermError::GroupOutOfRange),
    }
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

    #[test]
    fn region_modes() {
        assert_eq!(parse_region_mode("0666"), Ok(0o666));
        assert_eq!(parse_region_mode("660"), Ok(0o660));
        assert_eq!(parse_region_mode(" 0o600 "), Ok(0o600));
        assert_eq!(parse_region_mode("00640"), Ok(0o640));
        assert_eq!(parse_region_mode(""), Err(PermError::Empty));
        assert_eq!(parse_region_mode("rw-rw----"), Err(PermError::Malformed));
        assert_eq!(parse_region_mode("0668"), Err(PermError::Malformed));
        assert_eq!(parse_region_mode("-660"), Err(PermError::Malformed));
        assert_eq!(parse_region_mode("0o"), Err(PermError::Malformed));
        assert_eq!(parse_region_mode("0777"), Err(PermError::ExtraBits));
        assert_eq!(parse_region_mode("4666"), Err(PermError::ExtraBits));
        assert_eq!(parse_region_mode("1666"), Err(PermError::ExtraBits));
        assert_eq!(parse_region_mode("0466"), Err(PermError::OwnerCannotWrite));
        assert_eq!(parse_region_mode("0"), Err(PermError::OwnerCannotWrite));
        assert_eq!(parse_region_mode("1000000"), Err(PermError::Malformed));
    }

    #[test]
    fn region_groups() {
        assert_eq!(parse_region_group("0"), Ok(0));
        assert_eq!(parse_region_group(" 44 "), Ok(44));
        assert_eq!(parse_region_group("4294967294"), Ok(4294967294));
        assert_eq!(
            parse_region_group("4294967295"),
            Err(PermError::GroupOutOfRange)
        );
        assert_eq!(
            parse_region_group("99999999999"),
            Err(PermError::GroupOutOfRange)
        );
        assert_eq!(parse_region_group("video"), Err(PermError::Malformed));
        assert_eq!(parse_region_group("-1"), Err(PermError::Malformed));
        assert_eq!(parse_region_group(""), Err(PermError::Empty));
    }
}
