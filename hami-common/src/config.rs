//! The configuration contract shared by the preload (which obeys it) and the agent (which
//! reads it from `/proc/<pid>/environ` to detect tampering): every variable's name, the
//! defaults, and the parser of each kind of value (sizes, shares, policies, booleans, log
//! levels, milliseconds, region permissions). One parser per kind, so both halves can never
//! disagree about what `CUDA_DEVICE_MEMORY_LIMIT=4g` or `CUDA_DISABLE_CONTROL=tRue` means.
//! Reading a whole environment with these parsers is `hami_common::env`.
//!
//! The reading of odd values, one rule for every variable (`docs/preload.md`,
//! "Environment variables"):
//! * numbers (sizes, shares, levels, milliseconds, group ids) are decimal digits with
//!   surrounding whitespace ignored; a sign, `0x10`, `1e3`, a fraction or an empty value is
//!   malformed (HAMi-core's `strtoul(.., 0)` would read `0x10` as 16 and `010` as 8; HAMi's
//!   device plugin writes plain decimals);
//! * booleans are read exactly as HAMi's device plugin reads `CUDA_DISABLE_CONTROL` (Go's
//!   `strconv.ParseBool`: `1 t T TRUE true True` / `0 f F FALSE false False`, no
//!   whitespace): the plugin decides from that reading whether the library is mounted at
//!   all, so a value it reads as "control on" (`tRue`, ` 1 `, `yes`) must not turn the
//!   preload off;
//! * names (`default`, `force`, `disable`) are any case, whitespace ignored;
//! * a malformed value is an error naming the variable and the value, and each variable
//!   has its fail-closed fallback (`hami_common::env`).

use core::fmt;

use hami_abi::layout::{COMPUTE_POLICY_DEFAULT, COMPUTE_POLICY_DISABLE, COMPUTE_POLICY_FORCE};

/// Limit for every device.
pub const ENV_LIMIT: &str = "CUDA_DEVICE_MEMORY_LIMIT";
/// Region file path.
pub const ENV_REGION: &str = "CUDA_DEVICE_MEMORY_SHARED_CACHE";
/// HAMi's device plugin sets it to `true` when its `deviceMemoryScaling` is above 1 (device
/// memory beyond the physical, backed by host memory). hami-preload does not implement that:
/// a value that asks for it (`hami_common::env::HamiEnv::oversubscribe_requested`) is refused with a warning at the
/// first CUDA call, and every quota stays what `CUDA_DEVICE_MEMORY_LIMIT[_<i>]` says, within
/// the GPU's physical memory (`docs/hami.md`). The agent reports such processes.
pub const ENV_OVERSUBSCRIBE: &str = "CUDA_OVERSUBSCRIBE";

/// Log level of the preload, on HAMi-core's scale ([`parse_log_level`]).
pub const ENV_LOG_LEVEL: &str = "LIBCUDA_LOG_LEVEL";
/// Compute share of every device in percent of the device (`nvidia.com/gpucores`):
/// `1..=99` limits, `0` and `100` mean no limit ([`share_percent`]). `_<i>` per device.
pub const ENV_SM_LIMIT: &str = "CUDA_DEVICE_SM_LIMIT";
/// HAMi's compute policy: `default`, `force` or `disable` ([`CorePolicy`]).
pub const ENV_CORE_POLICY: &str = "GPU_CORE_UTILIZATION_POLICY";
/// A boolean ([`parse_bool`]): `true` turns the preload off (every call passes through,
/// memory included, no region). HAMi's device plugin then mounts no `ld.so.preload`.
pub const ENV_DISABLE_CONTROL: &str = "CUDA_DISABLE_CONTROL";
/// HAMi's task priority ([`parse_task_priority`]): `0` is the highest, HAMi's default `1`
/// ([`DEFAULT_TASK_PRIORITY`]). Recorded in the region by its creator; the node agent's
/// arbiter holds a container back while one of a higher priority is busy on the same GPU.
pub const ENV_TASK_PRIORITY: &str = "CUDA_TASK_PRIORITY";
/// [`ENV_TASK_PRIORITY`] when unset or malformed: HAMi's default (its `nvidia.com/priority`
/// `1`, the low one).
pub const DEFAULT_TASK_PRIORITY: u32 = 1;
/// Largest accepted [`ENV_TASK_PRIORITY`] (HAMi uses 0 and 1).
pub const MAX_TASK_PRIORITY: u32 = 99;
/// Milliseconds between two refreshes of the preload's backstop per device; `0` = off.
pub const ENV_BACKSTOP_INTERVAL: &str = "HAMI_BACKSTOP_INTERVAL_MS";
/// Default of [`ENV_BACKSTOP_INTERVAL`] (off when [`ENV_CONTEXT_OVERHEAD`] is set).
pub const DEFAULT_BACKSTOP_INTERVAL_MS: u64 = 1000;
/// Longest wait of one CUDA call for the region's lock, in milliseconds (at most
/// [`MAX_LOCK_TIMEOUT_MS`]).
pub const ENV_LOCK_TIMEOUT: &str = "HAMI_LOCK_TIMEOUT_MS";
/// Default of [`ENV_LOCK_TIMEOUT`].
pub const DEFAULT_LOCK_TIMEOUT_MS: u64 = 2000;
/// Largest accepted [`ENV_LOCK_TIMEOUT`]: an hour.
pub const MAX_LOCK_TIMEOUT_MS: u64 = 3_600_000;
/// Bytes of quota per device a process keeps admitted ahead of its allocations (a size).
pub const ENV_ADMISSION_RESERVE: &str = "HAMI_ADMISSION_RESERVE";
/// Default of [`ENV_ADMISSION_RESERVE`].
pub const DEFAULT_ADMISSION_RESERVE: u64 = 64 << 20;
/// The share (percent) a device gets when its [`ENV_SM_LIMIT`] value is malformed: the
/// smallest one, so that a configuration error never hands out the whole device.
pub const SM_LIMIT_FALLBACK: u32 = 1;

/// Why a boolean was rejected: not one of Go's `strconv.ParseBool` spellings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BoolError;

impl fmt::Display for BoolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(
            "not a boolean as HAMi's device plugin reads it (1, t, T, TRUE, true, True; \
             0, f, F, FALSE, false, False)",
        )
    }
}

impl core::error::Error for BoolError {}

/// Parses a boolean exactly as HAMi's device plugin parses `CUDA_DISABLE_CONTROL` (Go's
/// `strconv.ParseBool`): case and whitespace matter, so `tRue` and ` 1 ` are malformed.
pub fn parse_bool(value: &str) -> Result<bool, BoolError> {
    match value {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Ok(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Ok(false),
        _ => Err(BoolError),
    }
}

/// Decimal digits with surrounding whitespace removed, as a number; an error when empty,
/// not all digits, or above `u64::MAX`.
fn decimal(value: &str) -> Result<u64, NumberError> {
    let v = value.trim();
    if v.is_empty() {
        return Err(NumberError::Empty);
    }
    if !v.bytes().all(|b| b.is_ascii_digit()) {
        return Err(NumberError::NotDigits);
    }
    v.parse().map_err(|_| NumberError::Overflow)
}

/// Why a plain number (a share, milliseconds, a log level) was rejected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NumberError {
    /// Empty or whitespace only.
    Empty,
    /// Not decimal digits (a sign, `0x10`, `1e3`, a fraction, a unit, a word).
    NotDigits,
    /// Above `u64::MAX`.
    Overflow,
    /// A number above the variable's largest value (the bound).
    Above(u64),
}

impl fmt::Display for NumberError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NumberError::Empty => f.write_str("empty value"),
            NumberError::NotDigits => f.write_str("not a whole decimal number"),
            NumberError::Overflow => f.write_str("value overflows 64 bits"),
            NumberError::Above(max) => write!(f, "above the largest value, {max}"),
        }
    }
}

impl core::error::Error for NumberError {}

/// Parses a compute share ([`ENV_SM_LIMIT`]): a whole percentage `0..=100` (decimal,
/// surrounding whitespace allowed). What the share means is [`share_percent`].
pub fn parse_sm_limit(value: &str) -> Result<u32, NumberError> {
    match decimal(value) {
        Ok(n) if n <= 100 => Ok(n as u32),
        Ok(_) | Err(NumberError::Overflow) => Err(NumberError::Above(100)),
        Err(e) => Err(e),
    }
}

/// Parses a task priority ([`ENV_TASK_PRIORITY`]): decimal, at most [`MAX_TASK_PRIORITY`]
/// (a sign, as HAMi-core's `atoi` would read `-1`, is malformed).
pub fn parse_task_priority(value: &str) -> Result<u32, NumberError> {
    match decimal(value) {
        Ok(n) if n <= u64::from(MAX_TASK_PRIORITY) => Ok(n as u32),
        Ok(_) | Err(NumberError::Overflow) => Err(NumberError::Above(u64::from(MAX_TASK_PRIORITY))),
        Err(e) => Err(e),
    }
}

/// Parses milliseconds ([`ENV_BACKSTOP_INTERVAL`], [`ENV_LOCK_TIMEOUT`]): decimal, at most
/// `max`.
pub fn parse_millis(value: &str, max: u64) -> Result<u64, NumberError> {
    match decimal(value) {
        Ok(n) if n <= max => Ok(n),
        Ok(_) => Err(NumberError::Above(max)),
        Err(e) => Err(e),
    }
}

/// HAMi's compute policy ([`ENV_CORE_POLICY`]); the discriminant is what the region
/// records (`hami_abi::layout::DeviceCompute::policy`, the `COMPUTE_POLICY_*` values).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[repr(u32)]
pub enum CorePolicy {
    /// `default`: the share applies (HAMi-core: it may be relaxed when the container is
    /// alone; hami-rs always applies it, `docs/preload.md`).
    #[default]
    Default = COMPUTE_POLICY_DEFAULT,
    /// `force`: the share applies.
    Force = COMPUTE_POLICY_FORCE,
    /// `disable`: no compute limit.
    Disable = COMPUTE_POLICY_DISABLE,
}

impl CorePolicy {
    /// The policy a region records as `policy` (`None` for a value no policy has).
    pub fn from_region(policy: u32) -> Option<CorePolicy> {
        match policy {
            COMPUTE_POLICY_DEFAULT => Some(CorePolicy::Default),
            COMPUTE_POLICY_FORCE => Some(CorePolicy::Force),
            COMPUTE_POLICY_DISABLE => Some(CorePolicy::Disable),
            _ => None,
        }
    }

    /// The name as [`ENV_CORE_POLICY`] spells it.
    pub fn name(self) -> &'static str {
        match self {
            CorePolicy::Default => "default",
            CorePolicy::Force => "force",
            CorePolicy::Disable => "disable",
        }
    }
}

/// Why a [`ENV_CORE_POLICY`] value was rejected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PolicyError;

impl fmt::Display for PolicyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("not one of default, force, disable")
    }
}

impl core::error::Error for PolicyError {}

/// Parses [`ENV_CORE_POLICY`]: `default`, `force` or `disable` in any case, surrounding
/// whitespace allowed; empty is `default` (HAMi's webhook sets the variable only for a
/// policy other than the default).
pub fn parse_core_policy(value: &str) -> Result<CorePolicy, PolicyError> {
    let v = value.trim();
    if v.is_empty() || v.eq_ignore_ascii_case("default") {
        Ok(CorePolicy::Default)
    } else if v.eq_ignore_ascii_case("force") {
        Ok(CorePolicy::Force)
    } else if v.eq_ignore_ascii_case("disable") {
        Ok(CorePolicy::Disable)
    } else {
        Err(PolicyError)
    }
}

/// The share rule, the one place it is written: the share (percent) a device is held to
/// with compute share `sm_limit` (as parsed, or as a region records it) under policy
/// `policy` (a region's `COMPUTE_POLICY_*` value): `Some(1..=99)`, or `None` for no limit
/// (`0`, `100` or more, or the policy `disable`). An unknown policy value applies the share
/// (as `default` does).
pub fn share_percent(sm_limit: u32, policy: u32) -> Option<u32> {
    (policy != CorePolicy::Disable as u32 && (1..100).contains(&sm_limit)).then_some(sm_limit)
}

/// What the preload logs ([`ENV_LOG_LEVEL`]), on HAMi-core's scale: each level shows its
/// own messages and those of every level before it; errors always show.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
#[repr(u8)]
pub enum LogLevel {
    /// `0` or `1`: errors only (HAMi-core shows errors at both).
    Error = 0,
    /// `2` (the default, as in HAMi-core): + warnings.
    Warn = 1,
    /// `3`: + info.
    Info = 2,
    /// `4`: + debug.
    Debug = 3,
    /// `5` and above: + trace (hami-rs's own level past HAMi-core's last, debug; HAMi-core
    /// shows everything it has from 4 on, hami-preload from 5 on).
    Trace = 4,
}

/// [`ENV_LOG_LEVEL`] when unset or malformed: `2`, warnings (HAMi-core's default too).
pub const DEFAULT_LOG_LEVEL: LogLevel = LogLevel::Warn;

/// Parses [`ENV_LOG_LEVEL`] on HAMi-core's scale: `0`/`1` errors, `2` + warnings, `3` +
/// info, `4` + debug, `5` and above (however large) + trace. Not a whole non-negative
/// decimal number (`-1`, `debug`, empty) is an error; the caller uses
/// [`DEFAULT_LOG_LEVEL`] and says so (HAMi-core's `atoi` would silently read errors only).
pub fn parse_log_level(value: &str) -> Result<LogLevel, NumberError> {
    let n = match decimal(value) {
        Ok(n) => n,
        Err(NumberError::Overflow) => u64::MAX,
        Err(e) => return Err(e),
    };
    Ok(match n {
        0 | 1 => LogLevel::Error,
        2 => LogLevel::Warn,
        3 => LogLevel::Info,
        4 => LogLevel::Debug,
        _ => LogLevel::Trace,
    })
}
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

    #[test]
    fn booleans_read_as_hamis_device_plugin_reads_them() {
        for v in ["1", "t", "T", "TRUE", "true", "True"] {
            assert_eq!(parse_bool(v), Ok(true), "{v:?}");
        }
        for v in ["0", "f", "F", "FALSE", "false", "False"] {
            assert_eq!(parse_bool(v), Ok(false), "{v:?}");
        }
        for v in [
            "tRue", "TrUe", " 1 ", "1 ", "yes", "on", "no", "off", "", "2", "0x1",
        ] {
            assert_eq!(parse_bool(v), Err(BoolError), "{v:?}");
        }
    }

    #[test]
    fn shares_and_the_share_rule() {
        assert_eq!(parse_sm_limit("30"), Ok(30));
        assert_eq!(parse_sm_limit(" 0 "), Ok(0));
        assert_eq!(parse_sm_limit("100"), Ok(100));
        assert_eq!(parse_sm_limit("101"), Err(NumberError::Above(100)));
        assert_eq!(
            parse_sm_limit("99999999999999999999999"),
            Err(NumberError::Above(100))
        );
        for bad in ["30%", "-5", "+5", "0.5", "0x10", "1e3", "lots"] {
            assert_eq!(parse_sm_limit(bad), Err(NumberError::NotDigits), "{bad:?}");
        }
        assert_eq!(parse_sm_limit(""), Err(NumberError::Empty));
        let (default, force, disable) = (
            CorePolicy::Default as u32,
            CorePolicy::Force as u32,
            CorePolicy::Disable as u32,
        );
        assert_eq!(share_percent(30, default), Some(30));
        assert_eq!(share_percent(1, force), Some(1));
        assert_eq!(
            share_percent(99, 7),
            Some(99),
            "an unknown policy applies it"
        );
        assert_eq!(share_percent(30, disable), None);
        assert_eq!(share_percent(0, force), None);
        assert_eq!(share_percent(100, force), None);
        assert_eq!(share_percent(250, default), None);
    }

    #[test]
    fn policies() {
        for (v, p) in [
            ("default", CorePolicy::Default),
            ("", CorePolicy::Default),
            ("FORCE", CorePolicy::Force),
            (" force ", CorePolicy::Force),
            ("Disable", CorePolicy::Disable),
            ("DISABLE", CorePolicy::Disable),
        ] {
            assert_eq!(parse_core_policy(v), Ok(p), "{v:?}");
        }
        assert_eq!(parse_core_policy("strict"), Err(PolicyError));
        assert_eq!(parse_core_policy("1"), Err(PolicyError));
        for p in [CorePolicy::Default, CorePolicy::Force, CorePolicy::Disable] {
            assert_eq!(CorePolicy::from_region(p as u32), Some(p));
            assert_eq!(parse_core_policy(p.name()), Ok(p));
        }
        assert_eq!(CorePolicy::from_region(3), None);
    }

    #[test]
    fn log_levels_on_hami_cores_scale() {
        for (v, l) in [
            ("0", LogLevel::Error),
            ("1", LogLevel::Error),
            (" 2 ", LogLevel::Warn),
            ("3", LogLevel::Info),
            ("4", LogLevel::Debug),
            ("5", LogLevel::Trace),
            ("99", LogLevel::Trace),
            ("99999999999999999999999", LogLevel::Trace),
        ] {
            assert_eq!(parse_log_level(v), Ok(l), "{v:?}");
        }
        assert_eq!(parse_log_level("-1"), Err(NumberError::NotDigits));
        assert_eq!(parse_log_level("debug"), Err(NumberError::NotDigits));
        assert_eq!(parse_log_level(""), Err(NumberError::Empty));
        assert_eq!(DEFAULT_LOG_LEVEL, LogLevel::Warn);
    }

    #[test]
    fn millis() {
        assert_eq!(parse_millis(" 250 ", 1000), Ok(250));
        assert_eq!(parse_millis("0", 1000), Ok(0));
        assert_eq!(parse_millis("1001", 1000), Err(NumberError::Above(1000)));
        assert_eq!(parse_millis("+5", 1000), Err(NumberError::NotDigits));
        assert_eq!(parse_millis("2s", 1000), Err(NumberError::NotDigits));
        assert_eq!(
            parse_millis("99999999999999999999999", u64::MAX),
            Err(NumberError::Overflow)
        );
    }
}
