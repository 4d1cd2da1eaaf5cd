//! The driver's and NVML's C ABI, from the `cuda-abi` crate (types, constants, structs and the
//! function-pointer types of the real functions, as `cuda.h` / `nvml.h` declare them: a new
//! one goes there), and the NVML UUID text form the preload reads and writes.

pub use cuda_abi::nvml::*;
pub use cuda_abi::*;

/// Parses an NVML UUID string (`GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`) into its 16 bytes.
/// Any prefix before the first hex group (e.g. `GPU-`) is accepted only if it is `GPU-`.
pub fn parse_uuid(s: &str) -> Option<[u8; 16]> {
    let hex = s.strip_prefix("GPU-").unwrap_or(s);
    let digits: Vec<u8> = hex.bytes().filter(|&b| b != b'-').collect();
    if digits.len() != 32 || hex.bytes().filter(|&b| b == b'-').count() != 4 {
        return None;
    }
    let mut out = [0u8; 16];
    for (i, pair) in digits.chunks(2).enumerate() {
        let hi = (pair[0] as char).to_digit(16)?;
        let lo = (pair[1] as char).to_digit(16)?;
        out[i] = (hi * 16 + lo) as u8;
    }
    Some(out)
}

/// Formats 16 UUID bytes the way NVML does (`GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`): the
/// workspace's one formatter, [`hami_abi::uuid::format`].
pub use hami_abi::uuid::format as format_uuid;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuid_round_trip() {
        let b: [u8; 16] = core::array::from_fn(|i| (i * 17) as u8);
        let s = format_uuid(&b);
        assert_eq!(s.len(), 40);
        assert_eq!(parse_uuid(&s), Some(b));
        assert_eq!(parse_uuid("GPU-xyz"), None);
        assert_eq!(parse_uuid("MIG-00000000-0000-0000-0000-000000000000"), None);
    }
}
