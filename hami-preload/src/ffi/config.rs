//! Configuration from the environment (see `docs/preload.md`).
//!
//! Everything here is pure: [`Config::from_lookup`] takes the environment as a function so
//! that it unit-tests without touching the process environment.

use hami_abi::layout::{LIMIT_FLAG_INVALID, MAX_DEVICES};
use hami_common::env::{HamiEnv, Setting};
use std::sync::atomic::{AtomicU8, Ordering};

pub use hami_common::config::{
    parse_region_group, parse_region_mode, parse_size, PermError, SizeError,
    DEFAULT_ADMISSION_RESERVE, DEFAULT_BACKSTOP_INTERVAL_MS, DEFAULT_LOCK_TIMEOUT_MS,
    DEFAULT_REGION_MODE, DEFAULT_REGION_PATH, DEFAULT_TASK_PRIORITY, ENV_ADMISSION_RESERVE,
    ENV_BACKSTOP_INTERVAL, ENV_CONTEXT_OVERHEAD, ENV_CORE_POLICY, ENV_DISABLE_CONTROL, ENV_LIMIT,
    ENV_LOCK_TIMEOUT, ENV_LOG_LEVEL, ENV_OVERSUBSCRIBE, ENV_REGION, ENV_REGION_GROUP,
    ENV_REGION_MODE, ENV_SM_LIMIT, ENV_TASK_PRIORITY, SM_LIMIT_FALLBACK,
};
/// A configuration error for one variable: its name, its value and why
/// (`hami_common::env`, the one reading of the environment).
pub use hami_common::env::{EnvError as ConfigError, Reason};

/// The process's environment as the contract reads it (in `hami_common::env`, which the
/// log reads too).
pub use hami_common::env::getenv;

/// [`ENV_DISABLE_CONTROL`] from `get`: whether control is off, and the error of a
/// malformed value (then control stays on: the safe side, and what HAMi's device plugin,
/// which mounted the library, read too).
pub fn disable_control_from(get: impl Fn(&str) -> Option<String>) -> (bool, Option<ConfigError>) {
    match hami_common::env::read_disable_control(get) {
        None => (false, None),
        Some(Ok(off)) => (off, None),
        Some(Err(e)) => (false, Some(e)),
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
    let (off, err) = disable_control_from(getenv);
    let v = if off { CONTROL_OFF } else { CONTROL_ON };
    if CONTROL
        .compare_exchange(CONTROL_UNKNOWN, v, Ordering::Relaxed, Ordering::Relaxed)
        .is_ok()
    {
        if let Some(e) = err {
            crate::ffi::log::write(
                crate::ffi::log::Level::Error,
                format_args!("{e}; control stays on"),
            );
        } else if off {
            crate::ffi::log::write(
                crate::ffi::log::Level::Info,
                format_args!(
                    "{ENV_DISABLE_CONTROL}=true: every CUDA and NVML call passes through unchanged (no limit, no region)"
                ),
            );
        }
    }
    off
}
/// What the preload does instead of what a malformed variable asked for, for the
/// variables read into [`Config`] whose error is logged with it (`None`: reported where it
/// is read, or the region permissions, which keep the region closed:
/// [`Config::region_error`]).
pub fn consequence(e: &ConfigError) -> Option<String> {
    let var = e.var.as_str();
    let per_device = |name: &str| {
        var.strip_prefix(name)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with('_'))
    };
    Some(if per_device(ENV_LIMIT) {
        "allocations on the affected devices fail with CUDA_ERROR_OUT_OF_MEMORY".to_string()
    } else if per_device(ENV_SM_LIMIT) {
        format!("the affected devices' compute share is {SM_LIMIT_FALLBACK} %")
    } else if var == ENV_CORE_POLICY {
        "the `default` policy applies".to_string()
    } else if var == ENV_CONTEXT_OVERHEAD {
        "each context's memory is measured instead".to_string()
    } else if var == ENV_TASK_PRIORITY {
        format!("the container is recorded with HAMi's default priority, {DEFAULT_TASK_PRIORITY}")
    } else if var == ENV_ADMISSION_RESERVE {
        format!(
            "the default reserve, {} MiB, applies",
            DEFAULT_ADMISSION_RESERVE >> 20
        )
    } else {
        return None;
    })
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
    /// [`ENV_TASK_PRIORITY`] ([`DEFAULT_TASK_PRIORITY`] when unset or malformed), recorded
    /// in a region this process creates.
    pub task_priority: u32,
    /// The [`ENV_OVERSUBSCRIBE`] value when it asks for oversubscription (refused).
    pub oversubscribe_refused: Option<String>,
}

impl Config {
    /// Reads the configuration through `get` (which returns a variable's value, or `None`),
    /// with the environment contract ([`HamiEnv`]).
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Config {
        let env = HamiEnv::from_lookup(&get);
        fn value<T: Copy>(s: &Setting<T>) -> Option<T> {
            s.as_ref().and_then(|r| r.as_ref().ok().copied())
        }
        fn invalid<T>(s: &Setting<T>) -> Option<String> {
            s.as_ref()
                .and_then(|r| r.as_ref().err())
                .map(|e| e.value.clone())
        }
        let mut limits = [0u64; MAX_DEVICES];
        let mut limit_flags = [0u32; MAX_DEVICES];
        for d in 0..MAX_DEVICES {
            match env.memory_limit_for(d) {
                Some(Ok(n)) => limits[d] = n,
                Some(Err(_)) => limit_flags[d] |= LIMIT_FLAG_INVALID,
                None => {}
            }
        }
        let context_overhead = value(&env.context_overhead);
        // A fixed context overhead is the operator's figure for memory the backstop cannot
        // tell apart from context memory: then the backstop is off unless asked for.
        let backstop_interval_ms = match &env.backstop_interval_ms {
            None if context_overhead.is_some() => None,
            None | Some(Err(_)) => Some(DEFAULT_BACKSTOP_INTERVAL_MS),
            Some(Ok(0)) => None,
            Some(Ok(n)) => Some(*n),
        };
        // The errors with a consequence for the quota or the share (`consequence`); the
        // others are reported where they are read, each with its own fallback.
        let errors = env
            .errors()
            .into_iter()
            .filter(|e| consequence(e).is_some() || matches!(e.reason, Reason::Perm(_)))
            .cloned()
            .collect();
        Config {
            limits,
            limit_flags,
            errors,
            region_path: env.region_path().0.to_string(),
            context_overhead,
            region_mode: value(&env.region_mode).unwrap_or(DEFAULT_REGION_MODE),
            region_group: value(&env.region_group),
            backstop_interval_ms,
            backstop_invalid: invalid(&env.backstop_interval_ms),
            lock_timeout_ms: value(&env.lock_timeout_ms).unwrap_or(DEFAULT_LOCK_TIMEOUT_MS),
            lock_timeout_invalid: invalid(&env.lock_timeout_ms),
            admission_reserve: value(&env.admission_reserve).unwrap_or(DEFAULT_ADMISSION_RESERVE),
            sm_limits: core::array::from_fn(|d| env.recorded_sm_limit(d)),
            compute_policy: env.policy() as u32,
            task_priority: env.priority(),
            oversubscribe_refused: if env.oversubscribe_requested() {
                get(ENV_OVERSUBSCRIBE)
            } else {
                None
            },
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
        Config::from_lookup(getenv)
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
mod tests;
