//! Parsers for `hami-agent`'s flag values: sizes in the preload's syntax, bounded
//! durations and the node's name. clap prefixes each error with the flag and the value it
//! was given.

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

/// `--hami-version`: the HAMi release whose monitor's label sets the HAMi families follow
/// (`2.9`, `2.10`, `v2.10.0`, ...).
pub fn parse_hami_version(s: &str) -> Result<crate::metrics::HamiVersion, String> {
    s.parse()
        .map_err(|e: crate::metrics::HamiVersionError| e.to_string())
}

/// The environment variable the node's name is read from when `--node-name` is not given
/// (the chart sets it from the pod's `spec.nodeName`).
pub const NODE_NAME_ENV: &str = "NODE_NAME";

/// The longest node name accepted: a Kubernetes node name is a DNS subdomain (253).
pub const MAX_NODE_NAME: usize = 253;

/// `--node-name` (and `NODE_NAME`): the `node` label of the agent's metrics. Not empty, at
/// most [`MAX_NODE_NAME`] bytes, no whitespace or control character.
pub fn parse_node_name(s: &str) -> Result<String, String> {
    if s.is_empty() {
        return Err("empty: the node's name labels every metric".into());
    }
    if s.len() > MAX_NODE_NAME {
        return Err(format!(
            "too long: at most {MAX_NODE_NAME} bytes (a Kubernetes node name)"
        ));
    }
    if s.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err("contains whitespace or a control character".into());
    }
    Ok(s.to_string())
}

/// The node's name: `flag` (`--node-name`, already checked), else `env` (the value of
/// [`NODE_NAME_ENV`], checked here; empty counts as unset), else `host` (the host name).
pub fn node_name(
    flag: Option<String>,
    env: Option<String>,
    host: impl FnOnce() -> Option<String>,
) -> Result<String, String> {
    if let Some(f) = flag {
        return Ok(f);
    }
    if let Some(e) = env.filter(|e| !e.is_empty()) {
        return parse_node_name(&e).map_err(|why| format!("{NODE_NAME_ENV}={e:?}: {why}"));
    }
    host()
        .map(|h| h.trim().to_string())
        .filter(|h| parse_node_name(h).is_ok())
        .ok_or_else(|| {
            format!(
                "no node name: give --node-name or {NODE_NAME_ENV} (the host name is unreadable)"
            )
        })
}

/// The host name (`/proc/sys/kernel/hostname`: the UTS namespace's), if readable.
pub fn host_name() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_string())
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

    #[test]
    fn node_name_comes_from_the_flag_then_the_environment_then_the_host() {
        let host = || Some("host-a\n".to_string());
        assert_eq!(
            node_name(Some("gpu-1".into()), Some("gpu-2".into()), host),
            Ok("gpu-1".into())
        );
        assert_eq!(
            node_name(None, Some("gpu-2".into()), host),
            Ok("gpu-2".into())
        );
        assert_eq!(node_name(None, None, host), Ok("host-a".into()));
        assert_eq!(
            node_name(None, Some(String::new()), host),
            Ok("host-a".into())
        );
        let e = node_name(None, Some("gpu 2".into()), host).unwrap_err();
        assert!(e.contains("NODE_NAME") && e.contains("whitespace"), "{e}");
        let e = node_name(None, None, || None).unwrap_err();
        assert!(e.contains("--node-name"), "{e}");
        assert!(node_name(None, None, || Some("  ".into())).is_err());
    }

    #[test]
    fn hami_versions_name_a_release_with_known_label_sets() {
        use crate::metrics::HamiVersion;
        for (s, v) in [
            ("2.9", HamiVersion::V2_9),
            ("v2.9.0", HamiVersion::V2_9),
            ("2.9.3", HamiVersion::V2_9),
            ("2.10", HamiVersion::V2_10),
            (" v2.10.0 ", HamiVersion::V2_10),
            ("2.10.1", HamiVersion::V2_10),
        ] {
            assert_eq!(parse_hami_version(s), Ok(v), "{s:?}");
            assert_eq!(parse_hami_version(v.as_str()), Ok(v));
        }
        for bad in [
            "", "2", "2.8", "2.1", "2.100", "3.10", "2.10.", "2.10.x", "2.10.0.1", "latest",
            "vv2.9",
        ] {
            let e = parse_hami_version(bad).unwrap_err();
            assert!(e.contains("2.9 or 2.10"), "{bad:?}: {e}");
        }
    }

    #[test]
    fn node_names_are_refused_when_empty_or_odd() {
        assert_eq!(
            parse_node_name("ip-10-0-1-7.ec2.internal"),
            Ok("ip-10-0-1-7.ec2.internal".into())
        );
        assert!(parse_node_name("").unwrap_err().contains("empty"));
        assert!(parse_node_name("a b").unwrap_err().contains("whitespace"));
        assert!(parse_node_name("a\u{7}").unwrap_err().contains("control"));
        assert!(parse_node_name(&"n".repeat(254))
            .unwrap_err()
            .contains("too long"));
        assert!(parse_node_name(&"n".repeat(253)).is_ok());
    }
}
