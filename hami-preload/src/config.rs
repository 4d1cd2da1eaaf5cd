//! Configuration from the environment (see `docs/preload.md`).
//!
//! Everything here is pure: [`Config::from_lookup`] takes the environment as a function so
//! that it unit-tests without touching the process environment.

use hami_common::layout::{
    COMPUTE_POLICY_DEFAULT, COMPUTE_POLICY_DISABLE, COMPUTE_POLICY_FORCE, LIMIT_FLAG_INVALID,
    MAX_DEVICES,
};
use std::sync::atomic::{AtomicU8, Ordering};

pub use hami_common::config::{
    parse_region_group, parse_region_mode, parse_size, PermError, SizeError, DEFAULT_REGION_MODE,
    DEFAULT_REGION_PATH, ENV_CONTEXT_OVERHEAD, ENV_LIMIT, ENV_LOG_LEVEL, ENV_REGION,
    ENV_REGION_GROUP, ENV_REGION_MODE,
};
// HAMi's oversubscription switch, refused (docs/hami.md).
pub use hami_common::config::{oversubscribe_requested, ENV_OVERSUBSCRIBE};

/// Why a variable's value was rejected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Reason {
    /// A size (limits, context overhead).
    #[error("{0}")]
    Size(SizeError),
    /// A region permission setting ([`ENV_REGION_MODE`], [`ENV_REGION_GROUP`]).
    #[error("{0}")]
    Perm(PermError),
    /// A compute setting ([`ENV_SM_LIMIT`], [`ENV_CORE_POLICY`], [`ENV_DISABLE_CONTROL`]).
    #[error("{0}")]
    Compute(ComputeError),
}

/// Why a compute setting was rejected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ComputeError {
    /// [`ENV_SM_LIMIT`]: not a whole number (a sign, a `%`, a fraction, empty).
    #[error("not a whole percentage 0-100")]
    NotAPercent,
    /// [`ENV_SM_LIMIT`]: above 100.
    #[error("{0} is above 100 (percent of one device)")]
    OutOfRange(u64),
    /// [`ENV_CORE_POLICY`]: not one of the three policies.
    #[error("not one of default, force, disable")]
    UnknownPolicy,
    /// [`ENV_DISABLE_CONTROL`]: not a boolean.
    #[error("not a boolean (true/false, 1/0, t/f)")]
    NotABool,
}

/// Compute share of every device in percent of the device (`nvidia.com/gpucores`):
/// `1..=99` limits, `0` and `100` mean no limit. HAMi-core reads the same variable.
pub const ENV_SM_LIMIT: &str = "CUDA_DEVICE_SM_LIMIT";
/// HAMi's compute policy: `default`, `force` or `disable` (see `docs/preload.md`).
pub const ENV_CORE_POLICY: &str = "GPU_CORE_UTILIZATION_POLICY";
/// `true`: the preload changes nothing (every call passes through, memory included).
pub const ENV_DISABLE_CONTROL: &str = "CUDA_DISABLE_CONTROL";
/// HAMi's task priority; read and reported as ignored (`docs/preload.md`).
pub const ENV_TASK_PRIORITY: &str = "CUDA_TASK_PRIORITY";
/// The share (percent) a device gets when its [`ENV_SM_LIMIT`] value is malformed: the
/// smallest one, so that a configuration error never hands out the whole device (the
/// application keeps running, slowly, and the error is logged).
pub const SM_LIMIT_FALLBACK: u32 = 1;

/// Parses a compute share: decimal digits (surrounding whitespace allowed), `0..=100`.
pub fn parse_sm_limit(value: &str) -> Result<u32, ComputeError> {
    let v = value.trim();
    if v.is_empty() || !v.bytes().all(|b| b.is_ascii_digit()) {
        return Err(ComputeError::NotAPercent);
    }
    match v.parse::<u64>() {
        Ok(n) if n <= 100 => Ok(n as u32),
        Ok(n) => Err(ComputeError::OutOfRange(n)),
        Err(_) => Err(ComputeError::OutOfRange(u64::MAX)),
    }
}

/// Parses [`ENV_CORE_POLICY`] (any case, surrounding whitespace allowed; empty = `default`)
/// into a `COMPUTE_POLICY_*` value.
pub fn parse_core_policy(value: &str) -> Result<u32, ComputeError> {
    let v = value.trim();
    if v.is_empty() || v.eq_ignore_ascii_case("default") {
        Ok(COMPUTE_POLICY_DEFAULT)
    } else if v.eq_ignore_ascii_case("force") {
        Ok(COMPUTE_POLICY_FORCE)
    } else if v.eq_ignore_ascii_case("disable") {
        Ok(COMPUTE_POLICY_DISABLE)
    } else {
        Err(ComputeError::UnknownPolicy)
    }
}

/// Parses a boolean the way HAMi's device plugin reads [`ENV_DISABLE_CONTROL`] (Go's
/// `strconv.ParseBool`: `1 t true 0 f false`, here in any case and trimmed).
pub fn parse_bool(value: &str) -> Result<bool, ComputeError> {
    let v = value.trim();
    if ["1", "t", "true"].iter().any(|t| v.eq_ignore_ascii_case(t)) {
        Ok(true)
    } else if ["0", "f", "false"]
        .iter()
        .any(|t| v.eq_ignore_ascii_case(t))
    {
        Ok(false)
    } else {
        Err(ComputeError::NotABool)
    }
}

/// [`ENV_DISABLE_CONTROL`] from `get`: whether control is off, and the error of a
/// malformed value (then control stays on: the safe side).
pub fn disable_control_from(get: impl Fn(&str) -> Option<String>) -> (bool, Option<ConfigError>) {
    let Some(value) = get(ENV_DISABLE_CONTROL) else {
        return (false, None);
    };
    match parse_bool(&value) {
        Ok(b) => (b, None),
        Err(reason) => (
            false,
            Some(ConfigError {
                var: ENV_DISABLE_CONTROL.to_string(),
                value,
                reason: Reason::Compute(reason),
            }),
        ),
    }
}

const CONTROL_UNKNOWN: u8 = 0;
const CONTROL_ON: u8 = 1;
const CONTROL_OFF: u8 = 2;
static CONTROL: AtomicU8 = AtomicU8::new(CONTROL_UNKNOWN);

/// Whether `CUDA_DISABLE_CONTROL` turned the preload off: then every hook forwards its call
/// untouched and nothing is created (no region, no state). Read from the environment once;
/// afterwards one atomic load.
#[inline]
pub fn control_disabled() -> bool {
    match CONTROL.load(Ordering::Relaxed) {
        CONTROL_ON => false,
        CONTROL_OFF => true,
        _ => control_disabled_slow(),
    }
}

#[cold]
#[inline(never)]
fn control_disabled_slow() -> bool {
    let (off, err) = disable_control_from(|k| std::env::var(k).ok());
    let v = if off { CONTROL_OFF } else { CONTROL_ON };
    if CONTROL
        .compare_exchange(CONTROL_UNKNOWN, v, Ordering::Relaxed, Ordering::Relaxed)
        .is_ok()
    {
        if let Some(e) = err {
            crate::log::write(
                crate::log::Level::Error,
                format_args!("{e}; control stays on"),
            );
        } else if off {
            crate::log::write(
                crate::log::Level::Info,
                format_args!(
                    "{ENV_DISABLE_CONTROL}=true: every CUDA and NVML call passes through unchanged (no limit, no region)"
                ),
            );
        }
    }
    off
}
/// Milliseconds between two refreshes of the backstop (`UsageKind::Other`) per device;
/// `0` turns the backstop off. Unset: [`DEFAULT_BACKSTOP_INTERVAL_MS`], or off when
/// `HAMI_CONTEXT_OVERHEAD` fixes the context figure.
pub const ENV_BACKSTOP_INTERVAL: &str = "HAMI_BACKSTOP_INTERVAL_MS";
/// Default of [`ENV_BACKSTOP_INTERVAL`].
pub const DEFAULT_BACKSTOP_INTERVAL_MS: u64 = 1000;

/// Milliseconds one CUDA call waits for the shared region's lock at most before it gives up
/// (an allocation is then refused with `CUDA_ERROR_OUT_OF_MEMORY`; releases never wait).
pub const ENV_LOCK_TIMEOUT: &str = "HAMI_LOCK_TIMEOUT_MS";
/// Default of [`ENV_LOCK_TIMEOUT`].
pub const DEFAULT_LOCK_TIMEOUT_MS: u64 = 2000;
/// Bytes of quota per device a process keeps admitted ahead of its allocations, so that
/// allocations and releases within it take no lock (a size: `64m`, `0` turns it off; capped
/// at 1/32 of the device's limit).
pub const ENV_ADMISSION_RESERVE: &str = "HAMI_ADMISSION_RESERVE";
/// Default of [`ENV_ADMISSION_RESERVE`].
pub const DEFAULT_ADMISSION_RESERVE: u64 = 64 << 20;

/// A configuration error for one variable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {var}={value:?}: {reason}")]
pub struct ConfigError {
    /// The variable name.
    pub var: String,
    /// Its value.
    pub value: String,
    /// Why it was rejected.
    pub reason: Reason,
}

/// The preload's configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Per-device limit in bytes, 0 = unlimited.
    pub limits: [u64; MAX_DEVICES],
    /// Per-device flags ([`LIMIT_FLAG_INVALID`] when the device's configuration is invalid).
    pub limit_flags: [u32; MAX_DEVICES],
    /// Every rejected variable.
    pub errors: Vec<ConfigError>,
    /// Region file path.
    pub region_path: String,
    /// Fixed context overhead, if configured (`None` = measure).
    pub context_overhead: Option<u64>,
    /// Mode of a region this process creates ([`ENV_REGION_MODE`], default
    /// [`DEFAULT_REGION_MODE`]).
    pub region_mode: u32,
    /// Group of a region this process creates ([`ENV_REGION_GROUP`]; `None`: its own).
    pub region_group: Option<u32>,
    /// Backstop refresh interval in milliseconds (`None` = backstop off).
    pub backstop_interval_ms: Option<u64>,
    /// A malformed [`ENV_BACKSTOP_INTERVAL`] value (the default was used instead).
    pub backstop_invalid: Option<String>,
    /// Longest wait for the region lock, in milliseconds ([`ENV_LOCK_TIMEOUT`]).
    pub lock_timeout_ms: u64,
    /// A malformed [`ENV_LOCK_TIMEOUT`] value (the default was used instead).
    pub lock_timeout_invalid: Option<String>,
    /// Admission reserve per device in bytes ([`ENV_ADMISSION_RESERVE`]).
    pub admission_reserve: u64,
    /// Per-device compute share in percent ([`ENV_SM_LIMIT`]; 0 = none; a malformed value
    /// gives [`SM_LIMIT_FALLBACK`]).
    pub sm_limits: [u32; MAX_DEVICES],
    /// `COMPUTE_POLICY_*` ([`ENV_CORE_POLICY`]; a malformed value gives `default`).
    pub compute_policy: u32,
    /// [`ENV_TASK_PRIORITY`] as set (ignored; reported).
    pub task_priority: Option<String>,
    /// The [`ENV_OVERSUBSCRIBE`] value when it asks for oversubscription (refused).
    pub oversubscribe_refused: Option<String>,
}

impl Config {
    /// Reads the configuration through `get` (which returns a variable's value, or `None`).
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Config {
        let mut errors = Vec::new();
        let mut check = |var: String| -> Option<Result<u64, ()>> {
            let value = get(&var)?;
            Some(parse_size(&value).map_err(|reason| {
                errors.push(ConfigError {
                    var,
                    value,
                    reason: Reason::Size(reason),
                })
            }))
        };
        let global = check(ENV_LIMIT.to_string());
        let mut limits = [0u64; MAX_DEVICES];
        let mut limit_flags = [0u32; MAX_DEVICES];
        for d in 0..MAX_DEVICES {
            let per = check(format!("{ENV_LIMIT}_{d}"));
            match per.or(global) {
                Some(Ok(n)) => limits[d] = n,
                Some(Err(())) => limit_flags[d] |= LIMIT_FLAG_INVALID,
                None => {}
            }
        }
        let region_path = match get(ENV_REGION) {
            Some(p) if !p.trim().is_empty() => p,
            _ => DEFAULT_REGION_PATH.to_string(),
        };
        let context_overhead = get(ENV_CONTEXT_OVERHEAD).and_then(|v| match parse_size(&v) {
            Ok(n) => Some(n),
            Err(reason) => {
                errors.push(ConfigError {
                    var: ENV_CONTEXT_OVERHEAD.to_string(),
                    value: v,
                    reason: Reason::Size(reason),
                });
                None
            }
        });
        let mut perm = |var: &str, parse: fn(&str) -> Result<u32, PermError>| {
            let value = get(var)?;
            parse(&value)
                .map_err(|reason| {
                    errors.push(ConfigError {
                        var: var.to_string(),
                        value,
                        reason: Reason::Perm(reason),
                    })
                })
                .ok()
        };
        let region_mode = perm(ENV_REGION_MODE, parse_region_mode).unwrap_or(DEFAULT_REGION_MODE);
        let region_group = perm(ENV_REGION_GROUP, parse_region_group);
        // A fixed context overhead is the operator's figure for memory the backstop cannot
        // tell apart from context memory: then the backstop is off unless asked for.
        let default_backstop = match context_overhead {
            Some(_) => None,
            None => Some(DEFAULT_BACKSTOP_INTERVAL_MS),
        };
        let (backstop_interval_ms, backstop_invalid) = match get(ENV_BACKSTOP_INTERVAL) {
            None => (default_backstop, None),
            Some(v) => match v.trim().parse::<u64>() {
                Ok(0) => (None, None),
                Ok(n) => (Some(n), None),
                Err(_) => (Some(DEFAULT_BACKSTOP_INTERVAL_MS), Some(v)),
            },
        };
        let (lock_timeout_ms, lock_timeout_invalid) = match get(ENV_LOCK_TIMEOUT) {
            None => (DEFAULT_LOCK_TIMEOUT_MS, None),
            Some(v) => match v.trim().parse::<u64>() {
                Ok(n) if n <= 3_600_000 => (n, None),
                _ => (DEFAULT_LOCK_TIMEOUT_MS, Some(v)),
            },
        };
        let admission_reserve = match get(ENV_ADMISSION_RESERVE) {
            None => DEFAULT_ADMISSION_RESERVE,
            Some(v) => match parse_size(&v) {
                Ok(n) => n,
                Err(reason) => {
                    errors.push(ConfigError {
                        var: ENV_ADMISSION_RESERVE.to_string(),
                        value: v,
                        reason: Reason::Size(reason),
                    });
                    DEFAULT_ADMISSION_RESERVE
                }
            },
        };
        let oversubscribe_refused = get(ENV_OVERSUBSCRIBE).filter(|v| oversubscribe_requested(v));
        let mut compute = |var: String| -> Option<Result<u32, ()>> {
            let value = get(&var)?;
            Some(parse_sm_limit(&value).map_err(|reason| {
                errors.push(ConfigError {
                    var,
                    value,
                    reason: Reason::Compute(reason),
                })
            }))
        };
        let global_sm = compute(ENV_SM_LIMIT.to_string());
        let mut sm_limits = [0u32; MAX_DEVICES];
        for (d, l) in sm_limits.iter_mut().enumerate() {
            match compute(format!("{ENV_SM_LIMIT}_{d}")).or(global_sm) {
                Some(Ok(n)) => *l = n,
                Some(Err(())) => *l = SM_LIMIT_FALLBACK,
                None => {}
            }
        }
        let compute_policy = match get(ENV_CORE_POLICY) {
            None => COMPUTE_POLICY_DEFAULT,
            Some(v) => parse_core_policy(&v).unwrap_or_else(|reason| {
                errors.push(ConfigError {
                    var: ENV_CORE_POLICY.to_string(),
                    value: v,
                    reason: Reason::Compute(reason),
                });
                COMPUTE_POLICY_DEFAULT
            }),
        };
        Config {
            sm_limits,
            compute_policy,
            task_priority: get(ENV_TASK_PRIORITY),
            oversubscribe_refused,
            limits,
            limit_flags,
            errors,
            region_path,
            context_overhead,
            region_mode,
            region_group,
            backstop_interval_ms,
            backstop_invalid,
            lock_timeout_ms,
            lock_timeout_invalid,
            admission_reserve,
        }
    }

    /// The region handle's settings from this configuration: the lock timeout, the
    /// admission reserve, and stale-lock breaking (a process of the container shares the pid
    /// namespace of the region's other users).
    pub fn tuning(&self) -> hami_common::region::Tuning {
        hami_common::region::Tuning {
            lock_timeout: std::time::Duration::from_millis(self.lock_timeout_ms),
            reserve: self.admission_reserve,
            break_stale_locks: true,
        }
    }

    /// The first error in the region's permission settings, if any: the region is then not
    /// opened at all (fail closed), rather than created or used with permissions nobody
    /// asked for.
    pub fn region_error(&self) -> Option<&ConfigError> {
        self.errors
            .iter()
            .find(|e| matches!(e.reason, Reason::Perm(_)))
    }

    /// Reads the configuration from the process environment.
    pub fn from_env() -> Config {
        Config::from_lookup(|k| std::env::var(k).ok())
    }

    /// Number of devices with a limit or a flag (informational).
    pub fn configured_devices(&self) -> u32 {
        (0..MAX_DEVICES)
            .rev()
            .find(|&d| self.limits[d] != 0 || self.limit_flags[d] != 0)
            .map_or(0, |d| d as u32 + 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn cfg(vars: &[(&str, &str)]) -> Config {
        let m: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Config::from_lookup(|k| m.get(k).cloned())
    }

    #[test]
    fn unset_is_unlimited() {
        let c = cfg(&[]);
        assert_eq!(c.limits, [0; MAX_DEVICES]);
        assert_eq!(c.limit_flags, [0; MAX_DEVICES]);
        assert!(c.errors.is_empty());
        assert_eq!(c.region_path, DEFAULT_REGION_PATH);
        assert_eq!(c.context_overhead, None);
        assert_eq!(c.configured_devices(), 0);
        assert_eq!(c.region_mode, 0o666);
        assert_eq!(c.region_group, None);
        assert!(c.region_error().is_none());
    }

    #[test]
    fn region_permissions() {
        let c = cfg(&[("HAMI_REGION_MODE", "0660"), ("HAMI_REGION_GROUP", "44")]);
        assert_eq!(c.region_mode, 0o660);
        assert_eq!(c.region_group, Some(44));
        assert!(c.errors.is_empty());

        for (var, value) in [
            ("HAMI_REGION_MODE", "0777"),
            ("HAMI_REGION_MODE", "rw"),
            ("HAMI_REGION_MODE", "0066"),
            ("HAMI_REGION_GROUP", "video"),
            ("HAMI_REGION_GROUP", ""),
        ] {
            let c = cfg(&[(var, value)]);
            let e = c.region_error().expect("rejected");
            assert_eq!(e.var, var);
            let msg = e.to_string();
            assert!(msg.contains(var) && msg.contains(value), "{msg}");
            // Limits are unaffected; only the region is refused.
            assert_eq!(c.limit_flags, [0; MAX_DEVICES]);
        }
    }

    #[test]
    fn global_and_override() {
        let c = cfg(&[
            ("CUDA_DEVICE_MEMORY_LIMIT", "1g"),
            ("CUDA_DEVICE_MEMORY_LIMIT_2", "512M"),
            ("CUDA_DEVICE_MEMORY_LIMIT_3", "0"),
            ("CUDA_DEVICE_MEMORY_SHARED_CACHE", "/x/y"),
            ("HAMI_CONTEXT_OVERHEAD", "64m"),
        ]);
        assert_eq!(c.limits[0], 1 << 30);
        assert_eq!(c.limits[2], 512 << 20);
        assert_eq!(c.limits[3], 0);
        assert_eq!(c.limits[15], 1 << 30);
        assert_eq!(c.region_path, "/x/y");
        assert_eq!(c.context_overhead, Some(64 << 20));
        assert!(c.errors.is_empty());
        assert_eq!(c.configured_devices(), 16);
    }

    #[test]
    fn malformed_fails_closed() {
        let c = cfg(&[
            ("CUDA_DEVICE_MEMORY_LIMIT", "lots"),
            ("CUDA_DEVICE_MEMORY_LIMIT_1", "2g"),
        ]);
        assert_eq!(c.limit_flags[0], LIMIT_FLAG_INVALID);
        assert_eq!(c.limit_flags[1], 0);
        assert_eq!(c.limits[1], 2 << 30);
        assert_eq!(c.limit_flags[5], LIMIT_FLAG_INVALID);
        assert_eq!(c.errors.len(), 1);
        assert_eq!(c.errors[0].var, "CUDA_DEVICE_MEMORY_LIMIT");
        assert_eq!(c.errors[0].value, "lots");
        let msg = c.errors[0].to_string();
        assert!(
            msg.contains("CUDA_DEVICE_MEMORY_LIMIT") && msg.contains("lots"),
            "{msg}"
        );

        let c = cfg(&[("CUDA_DEVICE_MEMORY_LIMIT_0", "-5")]);
        assert_eq!(c.limit_flags[0], LIMIT_FLAG_INVALID);
        assert_eq!(c.limit_flags[1], 0);
        assert_eq!(c.errors[0].reason, Reason::Size(SizeError::Negative));
        assert_eq!(c.configured_devices(), 1);

        let c = cfg(&[("CUDA_DEVICE_MEMORY_LIMIT_0", "99999999999999999999")]);
        assert_eq!(c.errors[0].reason, Reason::Size(SizeError::Overflow));
        assert_eq!(c.limit_flags[0], LIMIT_FLAG_INVALID);

        let c = cfg(&[("HAMI_CONTEXT_OVERHEAD", "x")]);
        assert_eq!(c.context_overhead, None);
        assert_eq!(c.errors.len(), 1);
    }

    #[test]
    fn lock_timeout_and_admission_reserve() {
        let c = cfg(&[]);
        assert_eq!((c.lock_timeout_ms, c.admission_reserve), (2000, 64 << 20));
        assert!(c.tuning().break_stale_locks);
        let c = cfg(&[
            ("HAMI_LOCK_TIMEOUT_MS", " 250 "),
            ("HAMI_ADMISSION_RESERVE", "0"),
        ]);
        assert_eq!((c.lock_timeout_ms, c.admission_reserve), (250, 0));
        assert_eq!(
            c.tuning().lock_timeout,
            std::time::Duration::from_millis(250)
        );
        let c = cfg(&[
            ("HAMI_LOCK_TIMEOUT_MS", "2s"),
            ("HAMI_ADMISSION_RESERVE", "lots"),
        ]);
        assert_eq!(c.lock_timeout_ms, 2000);
        assert_eq!(c.lock_timeout_invalid.as_deref(), Some("2s"));
        assert_eq!(c.admission_reserve, 64 << 20);
        assert!(c
            .errors
            .iter()
            .any(|e| e.var == "HAMI_ADMISSION_RESERVE" && e.to_string().contains("lots")));
    }

    #[test]
    fn oversubscription_is_recognised_to_be_refused() {
        assert_eq!(cfg(&[]).oversubscribe_refused, None);
        for v in ["true", "TRUE", "1", "yes", "on", "2"] {
            let c = cfg(&[
                ("CUDA_OVERSUBSCRIBE", v),
                ("CUDA_DEVICE_MEMORY_LIMIT", "1g"),
            ]);
            assert_eq!(c.oversubscribe_refused.as_deref(), Some(v), "{v}");
            // The quota is untouched.
            assert_eq!(c.limits[0], 1 << 30);
            assert!(c.errors.is_empty());
        }
        for v in ["", "false", "False", "0", "no", "off", " false "] {
            let c = cfg(&[("CUDA_OVERSUBSCRIBE", v)]);
            assert_eq!(c.oversubscribe_refused, None, "{v:?}");
        }
    }

    #[test]
    fn backstop_interval() {
        assert_eq!(cfg(&[]).backstop_interval_ms, Some(1000));
        // A fixed context overhead turns it off unless it is asked for.
        let fixed = ("HAMI_CONTEXT_OVERHEAD", "0");
        assert_eq!(cfg(&[fixed]).backstop_interval_ms, None);
        let both = cfg(&[fixed, ("HAMI_BACKSTOP_INTERVAL_MS", "20")]);
        assert_eq!(both.backstop_interval_ms, Some(20));
        let c = cfg(&[("HAMI_BACKSTOP_INTERVAL_MS", " 50 ")]);
        assert_eq!(
            (c.backstop_interval_ms, c.backstop_invalid),
            (Some(50), None)
        );
        assert_eq!(
            cfg(&[("HAMI_BACKSTOP_INTERVAL_MS", "0")]).backstop_interval_ms,
            None
        );
        let c = cfg(&[("HAMI_BACKSTOP_INTERVAL_MS", "1s")]);
        assert_eq!(c.backstop_interval_ms, Some(1000));
        assert_eq!(c.backstop_invalid.as_deref(), Some("1s"));
        assert!(
            c.errors.is_empty(),
            "not a quota error: the quota still holds"
        );
    }

    #[test]
    fn compute_share_global_and_per_device() {
        let c = cfg(&[]);
        assert_eq!(c.sm_limits, [0; MAX_DEVICES], "unset: no compute limit");
        assert_eq!(c.compute_policy, COMPUTE_POLICY_DEFAULT);
        assert_eq!(c.task_priority, None);
        let c = cfg(&[
            ("CUDA_DEVICE_SM_LIMIT", " 30 "),
            ("CUDA_DEVICE_SM_LIMIT_1", "50"),
            ("CUDA_DEVICE_SM_LIMIT_2", "0"),
            ("CUDA_DEVICE_SM_LIMIT_3", "100"),
        ]);
        assert_eq!(&c.sm_limits[..5], &[30, 50, 0, 100, 30]);
        assert_eq!(c.sm_limits[15], 30);
        assert!(c.errors.is_empty());
        // Memory limits are untouched by compute settings.
        assert_eq!(c.limit_flags, [0; MAX_DEVICES]);
    }

    #[test]
    fn malformed_compute_share_names_the_variable_and_gets_the_smallest_share() {
        for bad in [
            "30%",
            "-5",
            "0.5",
            "",
            "lots",
            "101",
            "99999999999999999999999",
        ] {
            let c = cfg(&[("CUDA_DEVICE_SM_LIMIT", bad)]);
            assert_eq!(c.sm_limits, [SM_LIMIT_FALLBACK; MAX_DEVICES], "{bad:?}");
            assert_eq!(c.errors.len(), 1, "{bad:?}");
            let msg = c.errors[0].to_string();
            assert!(
                msg.contains("CUDA_DEVICE_SM_LIMIT") && msg.contains(&format!("{bad:?}")),
                "{msg}"
            );
            assert!(matches!(c.errors[0].reason, Reason::Compute(_)));
            assert_eq!(
                c.limit_flags, [0; MAX_DEVICES],
                "memory is not failed closed"
            );
        }
        let c = cfg(&[
            ("CUDA_DEVICE_SM_LIMIT", "40"),
            ("CUDA_DEVICE_SM_LIMIT_1", "x"),
        ]);
        assert_eq!(&c.sm_limits[..3], &[40, SM_LIMIT_FALLBACK, 40]);
        assert_eq!(c.errors[0].var, "CUDA_DEVICE_SM_LIMIT_1");
        assert_eq!(
            parse_sm_limit("101"),
            Err(ComputeError::OutOfRange(101)),
            "above 100 is out of range"
        );
        assert_eq!(parse_sm_limit("+5"), Err(ComputeError::NotAPercent));
    }

    #[test]
    fn core_policy_values() {
        for (v, p) in [
            ("default", COMPUTE_POLICY_DEFAULT),
            ("FORCE", COMPUTE_POLICY_FORCE),
            (" force ", COMPUTE_POLICY_FORCE),
            ("Disable", COMPUTE_POLICY_DISABLE),
            ("", COMPUTE_POLICY_DEFAULT),
        ] {
            let c = cfg(&[("GPU_CORE_UTILIZATION_POLICY", v)]);
            assert_eq!(c.compute_policy, p, "{v:?}");
            assert!(c.errors.is_empty(), "{v:?}");
        }
        let c = cfg(&[("GPU_CORE_UTILIZATION_POLICY", "strict")]);
        assert_eq!(
            c.compute_policy, COMPUTE_POLICY_DEFAULT,
            "fallback: default"
        );
        let msg = c.errors[0].to_string();
        assert!(
            msg.contains("GPU_CORE_UTILIZATION_POLICY") && msg.contains("strict"),
            "{msg}"
        );
        let c = cfg(&[("CUDA_TASK_PRIORITY", "1")]);
        assert_eq!(c.task_priority.as_deref(), Some("1"));
        assert!(c.errors.is_empty(), "an ignored variable is no error");
    }

    #[test]
    fn disable_control_values() {
        let get =
            |v: &'static str| move |k: &str| (k == "CUDA_DISABLE_CONTROL").then(|| v.to_string());
        for v in ["true", "TRUE", "1", "t", " True "] {
            assert_eq!(disable_control_from(get(v)), (true, None), "{v:?}");
        }
        for v in ["false", "0", "F"] {
            assert_eq!(disable_control_from(get(v)), (false, None), "{v:?}");
        }
        assert_eq!(disable_control_from(|_| None), (false, None));
        for v in ["yes", "", "on"] {
            let (off, err) = disable_control_from(get(v));
            assert!(!off, "{v:?}: a malformed value keeps control on");
            let msg = err.expect("an error").to_string();
            assert!(msg.contains("CUDA_DISABLE_CONTROL"), "{msg}");
        }
    }
}
