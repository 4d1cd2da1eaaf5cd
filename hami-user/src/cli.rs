//! Parsers for `hami-agent`'s flag values: sizes in the preload's syntax and bounded
//! durations. clap prefixes each error with the flag and the value it was given.

use std::time::Duration;

/// The longest `audit --seconds` accepted: one week.
pub const MAX_AUDIT_SECONDS: f64 = 7.0 * 24.0 * 3600.0;

/// The longest millisecond period or settle time accepted (`--interval`, `--settle-ms`,
/// `--nvml-interval`, `--nvml-settle-ms`): one hour.
pub const MAX_MILLIS: u64 = 3_600_000;

/// A size flag (`--tolerance-bytes`, `--nvml-tolerance-bytes`): bytes, or a number with a
/// K, M, G or T suffix (either case, powers of 1024), as the preload reads its limits
/// ([`hami_common::config::parse_size`]).
pub fn parse_size_flag(s: &str) -> Result<u64, String> {
    use hami_common::config::SizeError;
    hami_common::config::parse_size(s).map_err(|e| match e {
        SizeError::Malformed => {
            "not a number of bytes with an optional K/M/G/T suffix (powers of 1024, e.g. 2M)"
                .to_string()
        }
        e => format!("{e}: expected bytes or a number with a K/M/G/T suffix, e.g. 2M"),
    })
}

/// `audit --seconds`: a finite number of seconds from 0 to [`MAX_AUDIT_SECONDS`].
pub fn parse_seconds(s: &str) -> Result<Duration, String> {
    let v: f64 = s
        .trim()
        .parse()
        .map_err(|_| "not a number of seconds".to_string())?;
    if !v.is_finite() {
        return Err("not a finite number of seconds".into());
    }
    if v < 0.0 {
        return Err("negative: a duration is 0 seconds or more".into());
    }
    if v > MAX_AUDIT_SECONDS {
        return Err(format!(
            "too long: at most {MAX_AUDIT_SECONDS} seconds (one week)"
        ));
    }
    Ok(Duration::from_secs_f64(v))
}

/// A period in milliseconds: whole milliseconds from 0 to [`MAX_MILLIS`].
pub fn parse_millis(s: &str) -> Result<u64, String> {
    let t = s.trim();
    if t.starts_with('-') {
        return Err("negative: a duration is 0 milliseconds or more".into());
    }
    let v: u64 = t
        .parse()
        .map_err(|_| "not a whole number of milliseconds".to_string())?;
    if v > MAX_MILLIS {
        return Err(format!(
            "too long: at most {MAX_MILLIS} milliseconds (one hour)"
        ));
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_take_the_preload_syntax() {
        assert_eq!(parse_size_flag("2M"), Ok(2 << 20));
        assert_eq!(parse_size_flag("2m"), Ok(2 << 20));
        assert_eq!(parse_size_flag("64K"), Ok(64 << 10));
        assert_eq!(parse_size_flag("1g"), Ok(1 << 30));
        assert_eq!(parse_size_flag("1T"), Ok(1 << 40));
        assert_eq!(parse_size_flag("4096"), Ok(4096));
        assert_eq!(parse_size_flag("0"), Ok(0));
        for bad in ["", "-1", "2X", "M", "1.5G", "99999999999T"] {
            let e = parse_size_flag(bad).unwrap_err();
            assert!(e.contains("K/M/G/T"), "{bad:?}: {e}");
        }
        assert!(parse_size_flag("-1").unwrap_err().contains("negative"));
        assert!(parse_size_flag("99999999999T")
            .unwrap_err()
            .contains("overflows"));
    }

    #[test]
    fn seconds_are_refused_when_negative_or_absurd() {
        assert_eq!(parse_seconds("0"), Ok(Duration::ZERO));
        assert_eq!(parse_seconds("0.25"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_seconds("604800"), Ok(Duration::from_secs(604_800)));
        assert!(parse_seconds("-1").unwrap_err().contains("negative"));
        assert!(parse_seconds("-0.001").unwrap_err().contains("negative"));
        assert!(parse_seconds("1e12").unwrap_err().contains("too long"));
        assert!(parse_seconds("604801").unwrap_err().contains("too long"));
        assert!(parse_seconds("1e300").is_err());
        assert!(parse_seconds("NaN").unwrap_err().contains("finite"));
        assert!(parse_seconds("inf").unwrap_err().contains("finite"));
        assert!(parse_seconds("soon").is_err());
    }

    #[test]
    fn millis_are_refused_when_negative_or_absurd() {
        assert_eq!(parse_millis("250"), Ok(250));
        assert_eq!(parse_millis("0"), Ok(0));
        assert_eq!(parse_millis("3600000"), Ok(3_600_000));
        assert!(parse_millis("-1").unwrap_err().contains("negative"));
        assert!(parse_millis("3600001").unwrap_err().contains("too long"));
        assert!(parse_millis("1000000000000")
            .unwrap_err()
            .contains("too long"));
        assert!(parse_millis("1.5").is_err());
        assert!(parse_millis("").is_err());
    }
}
