//! The environment contract: every variable HAMi's device plugin injects and every one of
//! hami-rs's own, read once into typed settings ([`HamiEnv`]) with the parsers of
//! [`crate::config`]. The preload reads its own environment through it, the agent the
//! environment of every GPU process (`/proc/<pid>/environ`), so that both halves read each
//! variable the same way; [`CROSS_READING`] is the table of odd values both are tested
//! against (`hami-preload`'s `config::tests`, `hami-user`'s `procinfo::tests`).
//!
//! What a malformed value falls back to, per variable (the fail-closed side):
//! memory limits fail the device's allocations closed ([`Limit::Invalid`]), a share gives
//! [`SM_LIMIT_FALLBACK`] ([`Share::Malformed`]), a policy `default` (which applies the
//! share), `CUDA_DISABLE_CONTROL` keeps control on, `CUDA_OVERSUBSCRIBE` counts as a
//! request (refused, visibly), region permissions keep the region closed, the others
//! their default. Every one is an [`EnvError`] naming the variable and the value.

use std::string::{String, ToString};
use std::vec::Vec;

use crate::config::*;
use hami_abi::layout::MAX_DEVICES;

/// Every variable of the contract, by name (`_<i>`: one per CUDA ordinal, `0..16`). The
/// variable tables of `README.md` and `docs/preload.md` list exactly these.
pub const VARIABLES: &[&str] = &[
    ENV_LIMIT,
    "CUDA_DEVICE_MEMORY_LIMIT_<i>",
    ENV_SM_LIMIT,
    "CUDA_DEVICE_SM_LIMIT_<i>",
    ENV_CORE_POLICY,
    ENV_DISABLE_CONTROL,
    ENV_TASK_PRIORITY,
    ENV_REGION,
    ENV_REGION_MODE,
    ENV_REGION_GROUP,
    ENV_LOG_LEVEL,
    ENV_CONTEXT_OVERHEAD,
    ENV_BACKSTOP_INTERVAL,
    ENV_LOCK_TIMEOUT,
    ENV_ADMISSION_RESERVE,
    ENV_OVERSUBSCRIBE,
];

/// The variables of [`VARIABLES`] HAMi's device plugin injects (its `Allocate` and admission
/// webhook, v2.4.0 - v2.9.0): `docs/hami.md`'s table of injected variables lists each.
pub const HAMI_INJECTS: &[&str] = &[
    "CUDA_DEVICE_MEMORY_LIMIT_<i>",
    ENV_REGION,
    ENV_SM_LIMIT,
    ENV_CORE_POLICY,
    ENV_TASK_PRIORITY,
    ENV_DISABLE_CONTROL,
    ENV_OVERSUBSCRIBE,
    ENV_LOG_LEVEL,
];

/// Why a variable's value was rejected: what kind of value it should have been.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Reason {
    /// A size ([`parse_size`]).
    #[error("{0}")]
    Size(SizeError),
    /// A region permission ([`parse_region_mode`], [`parse_region_group`]).
    #[error("{0}")]
    Perm(PermError),
    /// A plain number: a share, milliseconds, a log level.
    #[error("{0}")]
    Number(NumberError),
    /// A compute policy ([`parse_core_policy`]).
    #[error("{0}")]
    Policy(PolicyError),
    /// A boolean ([`parse_bool`]).
    #[error("{0}")]
    Bool(BoolError),
}

/// A rejected variable: its name, its value and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {var}={value:?}: {reason}")]
pub struct EnvError {
    /// The variable's name.
    pub var: String,
    /// Its value, as set.
    pub value: String,
    /// Why it was rejected.
    pub reason: Reason,
}

/// One variable as read: `None` when unset, else its value or why it was rejected.
pub type Setting<T> = Option<Result<T, EnvError>>;

/// The memory limit of one device, as both halves act on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    /// No limit: unset, or `0`.
    None,
    /// A limit in bytes (above 0).
    Bytes(u64),
    /// Malformed: the preload fails the device's allocations closed.
    Invalid,
}

/// The compute share of one device, as both halves act on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Share {
    /// No compute limit: unset, `0`, `100`, or the policy `disable`.
    None,
    /// The device is held to this share, `1..=99` percent.
    Percent(u32),
    /// Malformed: the preload holds the device to [`SM_LIMIT_FALLBACK`] and logs it; the
    /// agent does not compare it with the region.
    Malformed,
}

/// Every variable of the contract, read once ([`HamiEnv::from_lookup`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HamiEnv {
    /// [`ENV_LIMIT`].
    pub memory_limit: Setting<u64>,
    /// [`ENV_LIMIT`]`_<i>`, per CUDA ordinal (the name exactly: `_0`, never `_00`).
    pub device_memory_limits: [Setting<u64>; MAX_DEVICES],
    /// [`ENV_SM_LIMIT`], in percent `0..=100`.
    pub sm_limit: Setting<u32>,
    /// [`ENV_SM_LIMIT`]`_<i>`, per CUDA ordinal.
    pub device_sm_limits: [Setting<u32>; MAX_DEVICES],
    /// [`ENV_CORE_POLICY`].
    pub core_policy: Setting<CorePolicy>,
    /// [`ENV_DISABLE_CONTROL`].
    pub disable_control: Setting<bool>,
    /// [`ENV_OVERSUBSCRIBE`].
    pub oversubscribe: Setting<bool>,
    /// [`ENV_TASK_PRIORITY`] ([`HamiEnv::priority`]).
    pub task_priority: Setting<u32>,
    /// [`ENV_REGION`], as set (see [`HamiEnv::region_path`]).
    pub region: Option<String>,
    /// [`ENV_REGION_MODE`].
    pub region_mode: Setting<u32>,
    /// [`ENV_REGION_GROUP`].
    pub region_group: Setting<u32>,
    /// [`ENV_LOG_LEVEL`].
    pub log_level: Setting<LogLevel>,
    /// [`ENV_CONTEXT_OVERHEAD`], bytes.
    pub context_overhead: Setting<u64>,
    /// [`ENV_BACKSTOP_INTERVAL`], milliseconds.
    pub backstop_interval_ms: Setting<u64>,
    /// [`ENV_LOCK_TIMEOUT`], milliseconds (at most [`MAX_LOCK_TIMEOUT_MS`]).
    pub lock_timeout_ms: Setting<u64>,
    /// [`ENV_ADMISSION_RESERVE`], bytes.
    pub admission_reserve: Setting<u64>,
}

/// Reads `var` through `get` and parses it.
fn setting<T, E>(
    get: &impl Fn(&str) -> Option<String>,
    var: &str,
    parse: impl FnOnce(&str) -> Result<T, E>,
    reason: impl FnOnce(E) -> Reason,
) -> Setting<T> {
    let value = get(var)?;
    Some(parse(&value).map_err(|e| EnvError {
        var: var.to_string(),
        value,
        reason: reason(e),
    }))
}

/// The process's environment as the contract reads it: a variable's value, lossily
/// converted when it is not UTF-8 (then malformed, not unset: a limit fails closed).
pub fn getenv(var: &str) -> Option<String> {
    std::env::var_os(var).map(|v| v.to_string_lossy().into_owned())
}

/// [`ENV_DISABLE_CONTROL`] alone, through `get` (what the preload reads before anything
/// else, on its hot path's first call).
pub fn read_disable_control(get: impl Fn(&str) -> Option<String>) -> Setting<bool> {
    setting(&get, ENV_DISABLE_CONTROL, parse_bool, Reason::Bool)
}

/// [`ENV_LOG_LEVEL`] alone, through `get`.
pub fn read_log_level(get: impl Fn(&str) -> Option<String>) -> Setting<LogLevel> {
    setting(&get, ENV_LOG_LEVEL, parse_log_level, Reason::Number)
}

impl HamiEnv {
    /// Reads every variable through `get`, which returns a variable's value or `None` when
    /// it is unset (the process's environment in the preload; a process's
    /// `/proc/<pid>/environ` in the agent: the first of duplicate entries, as `getenv`).
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> HamiEnv {
        let size = |var: &str| setting(&get, var, parse_size, Reason::Size);
        let share = |var: &str| setting(&get, var, parse_sm_limit, Reason::Number);
        HamiEnv {
            memory_limit: size(ENV_LIMIT),
            device_memory_limits: core::array::from_fn(|d| size(&std::format!("{ENV_LIMIT}_{d}"))),
            sm_limit: share(ENV_SM_LIMIT),
            device_sm_limits: core::array::from_fn(|d| share(&std::format!("{ENV_SM_LIMIT}_{d}"))),
            core_policy: setting(&get, ENV_CORE_POLICY, parse_core_policy, Reason::Policy),
            disable_control: read_disable_control(&get),
            oversubscribe: setting(&get, ENV_OVERSUBSCRIBE, parse_bool, Reason::Bool),
            task_priority: setting(&get, ENV_TASK_PRIORITY, parse_task_priority, Reason::Number),
            region: get(ENV_REGION),
            region_mode: setting(&get, ENV_REGION_MODE, parse_region_mode, Reason::Perm),
            region_group: setting(&get, ENV_REGION_GROUP, parse_region_group, Reason::Perm),
            log_level: read_log_level(&get),
            context_overhead: size(ENV_CONTEXT_OVERHEAD),
            backstop_interval_ms: setting(
                &get,
                ENV_BACKSTOP_INTERVAL,
                |v| parse_millis(v, u64::MAX),
                Reason::Number,
            ),
            lock_timeout_ms: setting(
                &get,
                ENV_LOCK_TIMEOUT,
                |v| parse_millis(v, MAX_LOCK_TIMEOUT_MS),
                Reason::Number,
            ),
            admission_reserve: size(ENV_ADMISSION_RESERVE),
        }
    }

    /// The memory limit variable that governs device `dev`: the per-device one when set
    /// (valid or not), else the global one.
    pub fn memory_limit_for(&self, dev: usize) -> Option<Result<u64, &EnvError>> {
        self.device_memory_limits
            .get(dev)
            .and_then(Option::as_ref)
            .or(self.memory_limit.as_ref())
            .map(Result::as_ref)
            .map(|r| r.copied())
    }

    /// The memory limit device `dev` is held to ([`Limit`]).
    pub fn limit(&self, dev: usize) -> Limit {
        match self.memory_limit_for(dev) {
            None | Some(Ok(0)) => Limit::None,
            Some(Ok(n)) => Limit::Bytes(n),
            Some(Err(_)) => Limit::Invalid,
        }
    }

    /// The compute share variable that governs device `dev`: the per-device one when set
    /// (valid or not), else the global one.
    pub fn sm_limit_for(&self, dev: usize) -> Option<Result<u32, &EnvError>> {
        self.device_sm_limits
            .get(dev)
            .and_then(Option::as_ref)
            .or(self.sm_limit.as_ref())
            .map(Result::as_ref)
            .map(|r| r.copied())
    }

    /// The compute share device `dev` is recorded with in a region this process creates:
    /// the value as set (`0..=100`), [`SM_LIMIT_FALLBACK`] when malformed, 0 when unset.
    pub fn recorded_sm_limit(&self, dev: usize) -> u32 {
        match self.sm_limit_for(dev) {
            None => 0,
            Some(Ok(n)) => n,
            Some(Err(_)) => SM_LIMIT_FALLBACK,
        }
    }

    /// The task priority the container is recorded with: as set, or
    /// [`DEFAULT_TASK_PRIORITY`] (HAMi's default, the low one) when unset or malformed (a
    /// malformed value never raises a container above the others).
    pub fn priority(&self) -> u32 {
        match self.task_priority {
            Some(Ok(p)) => p,
            _ => DEFAULT_TASK_PRIORITY,
        }
    }

    /// The policy in force: as set, or `default` when unset or malformed.
    pub fn policy(&self) -> CorePolicy {
        match self.core_policy {
            Some(Ok(p)) => p,
            _ => CorePolicy::Default,
        }
    }

    /// The compute share device `dev` is held to ([`Share`]; the share rule is
    /// [`share_percent`]). Whether control is on is a separate question
    /// ([`HamiEnv::control_disabled`]).
    pub fn share(&self, dev: usize) -> Share {
        let policy = self.policy();
        match self.sm_limit_for(dev) {
            _ if policy == CorePolicy::Disable => Share::None,
            None => Share::None,
            Some(Err(_)) => Share::Malformed,
            Some(Ok(n)) => share_percent(n, policy as u32).map_or(Share::None, Share::Percent),
        }
    }

    /// Whether [`ENV_DISABLE_CONTROL`] turns the preload off (a malformed value does not).
    pub fn control_disabled(&self) -> bool {
        matches!(self.disable_control, Some(Ok(true)))
    }

    /// Whether [`ENV_OVERSUBSCRIBE`] asks for oversubscription, which hami-preload refuses:
    /// a true value, or a malformed one (counted as a request, so that it is seen).
    pub fn oversubscribe_requested(&self) -> bool {
        matches!(self.oversubscribe, Some(Ok(true)) | Some(Err(_)))
    }

    /// The region's path as the process sees it, and whether it came from [`ENV_REGION`]
    /// (an unset, empty or blank value gives [`DEFAULT_REGION_PATH`]).
    pub fn region_path(&self) -> (&str, bool) {
        match &self.region {
            Some(p) if !p.trim().is_empty() => (p, true),
            _ => (DEFAULT_REGION_PATH, false),
        }
    }

    /// What this environment means on device `dev`, in the terms both halves act on.
    pub fn reading(&self, dev: usize) -> Reading {
        Reading {
            control_disabled: self.control_disabled(),
            limit: self.limit(dev),
            share: self.share(dev),
            oversubscribe: self.oversubscribe_requested(),
        }
    }

    /// Every rejected variable, in the order of the fields.
    pub fn errors(&self) -> Vec<&EnvError> {
        fn err<T>(s: &Setting<T>) -> Option<&EnvError> {
            s.as_ref().and_then(|r| r.as_ref().err())
        }
        let mut out = Vec::new();
        out.extend(err(&self.memory_limit));
        out.extend(self.device_memory_limits.iter().filter_map(err));
        out.extend(err(&self.sm_limit));
        out.extend(self.device_sm_limits.iter().filter_map(err));
        out.extend(err(&self.core_policy));
        out.extend(err(&self.disable_control));
        out.extend(err(&self.oversubscribe));
        out.extend(err(&self.task_priority));
        out.extend(err(&self.region_mode));
        out.extend(err(&self.region_group));
        out.extend(err(&self.log_level));
        out.extend(err(&self.context_overhead));
        out.extend(err(&self.backstop_interval_ms));
        out.extend(err(&self.lock_timeout_ms));
        out.extend(err(&self.admission_reserve));
        out
    }
}

/// What an environment means on one device, in the terms both halves act on: the
/// preload's enforcement and the agent's comparison with the region must agree on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reading {
    /// [`ENV_DISABLE_CONTROL`] turns the preload off.
    pub control_disabled: bool,
    /// The device's memory limit.
    pub limit: Limit,
    /// The device's compute share.
    pub share: Share,
    /// [`ENV_OVERSUBSCRIBE`] is refused (and counted by the agent).
    pub oversubscribe: bool,
}

/// One row of [`CROSS_READING`]: a process's environment (entries in order, duplicates
/// allowed: the first one counts, as for `getenv`), and what it must mean on `device`.
#[derive(Debug, Clone, Copy)]
pub struct Case {
    /// The environment's entries, in order.
    pub env: &'static [(&'static str, &'static str)],
    /// The CUDA ordinal read.
    pub device: usize,
    /// What both halves must read there.
    pub reading: Reading,
    /// The region path both halves must use.
    pub region: &'static str,
}

const ON: Reading = Reading {
    control_disabled: false,
    limit: Limit::None,
    share: Share::None,
    oversubscribe: false,
};
const OFF: Reading = Reading {
    control_disabled: true,
    ..ON
};
const fn limit(l: Limit) -> Reading {
    Reading { limit: l, ..ON }
}
const fn share(s: Share) -> Reading {
    Reading { share: s, ..ON }
}
const fn oversubscribe(o: bool) -> Reading {
    Reading {
        oversubscribe: o,
        ..ON
    }
}
const fn case(env: &'static [(&'static str, &'static str)], reading: Reading) -> Case {
    Case {
        env,
        device: 0,
        reading,
        region: DEFAULT_REGION_PATH,
    }
}
const GIB: u64 = 1 << 30;

/// The odd values both halves are tested against (the reading decided in
/// [`crate::config`]'s rules; `docs/preload.md`, "Environment variables"). `hami-preload` checks
/// its `Config` and `CUDA_DISABLE_CONTROL` reading against every row, `hami-user` what it
/// derives from a fake `/proc/<pid>/environ` holding the row's entries.
pub const CROSS_READING: &[Case] = &[
    case(&[], ON),
    // Booleans: Go's strconv.ParseBool, as HAMi's device plugin decides the mount.
    case(&[(ENV_DISABLE_CONTROL, "true")], OFF),
    case(&[(ENV_DISABLE_CONTROL, "True")], OFF),
    case(&[(ENV_DISABLE_CONTROL, "TRUE")], OFF),
    case(&[(ENV_DISABLE_CONTROL, "1")], OFF),
    case(&[(ENV_DISABLE_CONTROL, "t")], OFF),
    case(&[(ENV_DISABLE_CONTROL, "tRue")], ON),
    case(&[(ENV_DISABLE_CONTROL, " 1 ")], ON),
    case(&[(ENV_DISABLE_CONTROL, "yes")], ON),
    case(&[(ENV_DISABLE_CONTROL, "on")], ON),
    case(&[(ENV_DISABLE_CONTROL, "")], ON),
    case(&[(ENV_DISABLE_CONTROL, "false")], ON),
    case(&[(ENV_DISABLE_CONTROL, "0")], ON),
    case(
        &[(ENV_DISABLE_CONTROL, "1"), (ENV_DISABLE_CONTROL, "0")],
        OFF,
    ),
    case(
        &[(ENV_DISABLE_CONTROL, "0"), (ENV_DISABLE_CONTROL, "1")],
        ON,
    ),
    // Sizes.
    case(&[(ENV_LIMIT, "1g")], limit(Limit::Bytes(GIB))),
    case(&[(ENV_LIMIT, "1024M")], limit(Limit::Bytes(GIB))),
    case(&[(ENV_LIMIT, " 1 ")], limit(Limit::Bytes(1))),
    case(&[(ENV_LIMIT, "0")], limit(Limit::None)),
    case(&[(ENV_LIMIT, "0x10")], limit(Limit::Invalid)),
    case(&[(ENV_LIMIT, "1e3")], limit(Limit::Invalid)),
    case(&[(ENV_LIMIT, "")], limit(Limit::Invalid)),
    case(&[(ENV_LIMIT, " ")], limit(Limit::Invalid)),
    case(&[(ENV_LIMIT, "-1")], limit(Limit::Invalid)),
    case(&[(ENV_LIMIT, "+5")], limit(Limit::Invalid)),
    case(&[(ENV_LIMIT, "1.5g")], limit(Limit::Invalid)),
    case(&[(ENV_LIMIT, "2GiB")], limit(Limit::Invalid)),
    case(
        &[(ENV_LIMIT, "18446744073709551616")],
        limit(Limit::Invalid),
    ),
    case(&[(ENV_LIMIT, "16777216T")], limit(Limit::Invalid)),
    case(&[(ENV_LIMIT, "disable")], limit(Limit::Invalid)),
    // Per device: the exact name wins, valid or not; other spellings are other variables.
    case(
        &[(ENV_LIMIT, "1g"), ("CUDA_DEVICE_MEMORY_LIMIT_0", "junk")],
        limit(Limit::Invalid),
    ),
    Case {
        device: 1,
        ..case(
            &[(ENV_LIMIT, "1g"), ("CUDA_DEVICE_MEMORY_LIMIT_0", "junk")],
            limit(Limit::Bytes(GIB)),
        )
    },
    case(
        &[(ENV_LIMIT, "junk"), ("CUDA_DEVICE_MEMORY_LIMIT_0", "2g")],
        limit(Limit::Bytes(2 * GIB)),
    ),
    case(&[("CUDA_DEVICE_MEMORY_LIMIT_00", "1g")], limit(Limit::None)),
    case(&[("CUDA_DEVICE_MEMORY_LIMIT_+0", "1g")], limit(Limit::None)),
    case(&[("CUDA_DEVICE_MEMORY_LIMIT_0 ", "1g")], limit(Limit::None)),
    case(
        &[(ENV_LIMIT, "1g"), (ENV_LIMIT, "2g")],
        limit(Limit::Bytes(GIB)),
    ),
    // Shares and the policy.
    case(&[(ENV_SM_LIMIT, "30")], share(Share::Percent(30))),
    case(&[(ENV_SM_LIMIT, " 30 ")], share(Share::Percent(30))),
    case(&[(ENV_SM_LIMIT, "0")], share(Share::None)),
    case(&[(ENV_SM_LIMIT, "100")], share(Share::None)),
    case(&[(ENV_SM_LIMIT, "101")], share(Share::Malformed)),
    case(&[(ENV_SM_LIMIT, "30%")], share(Share::Malformed)),
    case(&[(ENV_SM_LIMIT, "0x10")], share(Share::Malformed)),
    case(&[(ENV_SM_LIMIT, "1e3")], share(Share::Malformed)),
    case(&[(ENV_SM_LIMIT, "")], share(Share::Malformed)),
    case(&[(ENV_SM_LIMIT, "-5")], share(Share::Malformed)),
    case(
        &[(ENV_SM_LIMIT, "99999999999999999999999")],
        share(Share::Malformed),
    ),
    case(&[(ENV_SM_LIMIT, "disable")], share(Share::Malformed)),
    case(&[(ENV_SM_LIMIT, "DISABLE")], share(Share::Malformed)),
    case(
        &[(ENV_SM_LIMIT, "30"), ("CUDA_DEVICE_SM_LIMIT_0", "50")],
        share(Share::Percent(50)),
    ),
    case(
        &[(ENV_SM_LIMIT, "30"), ("CUDA_DEVICE_SM_LIMIT_0", "x")],
        share(Share::Malformed),
    ),
    case(&[("CUDA_DEVICE_SM_LIMIT_00", "50")], share(Share::None)),
    case(
        &[(ENV_SM_LIMIT, "30"), (ENV_CORE_POLICY, "disable")],
        share(Share::None),
    ),
    case(
        &[(ENV_SM_LIMIT, "30"), (ENV_CORE_POLICY, "DISABLE")],
        share(Share::None),
    ),
    case(
        &[(ENV_SM_LIMIT, "30"), (ENV_CORE_POLICY, " Disable ")],
        share(Share::None),
    ),
    case(
        &[(ENV_SM_LIMIT, "30%"), (ENV_CORE_POLICY, "disable")],
        share(Share::None),
    ),
    case(
        &[(ENV_SM_LIMIT, "30"), (ENV_CORE_POLICY, "force")],
        share(Share::Percent(30)),
    ),
    case(
        &[(ENV_SM_LIMIT, "30"), (ENV_CORE_POLICY, "")],
        share(Share::Percent(30)),
    ),
    case(
        &[(ENV_SM_LIMIT, "30"), (ENV_CORE_POLICY, "strict")],
        share(Share::Percent(30)),
    ),
    case(
        &[(ENV_SM_LIMIT, "30"), (ENV_CORE_POLICY, "0x10")],
        share(Share::Percent(30)),
    ),
    // Oversubscription: refused; a malformed value counts as a request.
    case(&[(ENV_OVERSUBSCRIBE, "true")], oversubscribe(true)),
    case(&[(ENV_OVERSUBSCRIBE, "tRue")], oversubscribe(true)),
    case(&[(ENV_OVERSUBSCRIBE, "yes")], oversubscribe(true)),
    case(&[(ENV_OVERSUBSCRIBE, "")], oversubscribe(true)),
    case(&[(ENV_OVERSUBSCRIBE, "false")], oversubscribe(false)),
    case(&[(ENV_OVERSUBSCRIBE, "0")], oversubscribe(false)),
    // The region's path.
    Case {
        region: "/hami/r.cache",
        ..case(&[(ENV_REGION, "/hami/r.cache")], ON)
    },
    case(&[(ENV_REGION, "")], ON),
    case(&[(ENV_REGION, "  ")], ON),
];

#[cfg(test)]
mod tests {
    use super::*;

    fn lookup(env: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |k| {
            env.iter()
                .find(|(name, _)| *name == k)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn the_contract_reads_every_cross_reading_row_as_the_table_says() {
        for c in CROSS_READING {
            let e = HamiEnv::from_lookup(lookup(c.env));
            assert_eq!(
                e.reading(c.device),
                c.reading,
                "{:?} on {}",
                c.env,
                c.device
            );
            assert_eq!(e.region_path().0, c.region, "{:?}", c.env);
        }
    }

    #[test]
    fn errors_name_the_variable_and_the_value() {
        let e = HamiEnv::from_lookup(lookup(&[
            (ENV_LIMIT, "lots"),
            ("CUDA_DEVICE_SM_LIMIT_3", "30%"),
            (ENV_DISABLE_CONTROL, "tRue"),
            (ENV_LOG_LEVEL, "loud"),
            (ENV_LOCK_TIMEOUT, "2s"),
            (ENV_REGION_MODE, "0777"),
        ]));
        let msgs: Vec<String> = e.errors().iter().map(|e| e.to_string()).collect();
        assert_eq!(msgs.len(), 6, "{msgs:?}");
        for (m, (var, value)) in msgs.iter().zip([
            (ENV_LIMIT, "lots"),
            ("CUDA_DEVICE_SM_LIMIT_3", "30%"),
            (ENV_DISABLE_CONTROL, "tRue"),
            (ENV_REGION_MODE, "0777"),
            (ENV_LOG_LEVEL, "loud"),
            (ENV_LOCK_TIMEOUT, "2s"),
        ]) {
            assert!(
                m.starts_with(&std::format!("invalid {var}={value:?}: ")),
                "{m}"
            );
        }
        assert_eq!(e.recorded_sm_limit(3), SM_LIMIT_FALLBACK);
        assert_eq!(e.recorded_sm_limit(2), 0);
        assert!(!e.control_disabled(), "a malformed value keeps control on");
        assert_eq!(e.log_level.as_ref().map(|r| r.is_err()), Some(true));
    }

    #[test]
    fn settings_have_their_values() {
        let e = HamiEnv::from_lookup(lookup(&[
            (ENV_LIMIT, "1g"),
            ("CUDA_DEVICE_MEMORY_LIMIT_15", "2g"),
            ("CUDA_DEVICE_MEMORY_LIMIT_16", "3g"),
            (ENV_LOG_LEVEL, "3"),
            (ENV_LOCK_TIMEOUT, "3600001"),
            (ENV_BACKSTOP_INTERVAL, "0"),
            (ENV_ADMISSION_RESERVE, "1m"),
            (ENV_TASK_PRIORITY, "1"),
            (ENV_REGION_GROUP, "44"),
        ]));
        assert_eq!(e.limit(15), Limit::Bytes(2 * GIB));
        assert_eq!(
            e.limit(16),
            Limit::Bytes(GIB),
            "no ordinal 16: the global one"
        );
        assert_eq!(e.log_level, Some(Ok(LogLevel::Info)));
        assert!(matches!(
            e.lock_timeout_ms,
            Some(Err(EnvError {
                reason: Reason::Number(NumberError::Above(MAX_LOCK_TIMEOUT_MS)),
                ..
            }))
        ));
        assert_eq!(e.backstop_interval_ms, Some(Ok(0)));
        assert_eq!(e.admission_reserve, Some(Ok(1 << 20)));
        assert_eq!(e.task_priority, Some(Ok(1)));
        assert_eq!(e.priority(), 1);
        for (v, want) in [
            ("0", 0),
            (" 0 ", 0),
            ("-1", 1),
            ("high", 1),
            ("100", 1),
            ("", 1),
        ] {
            let e = HamiEnv::from_lookup(|k: &str| (k == ENV_TASK_PRIORITY).then(|| v.to_string()));
            assert_eq!(e.priority(), want, "{v:?}");
            assert_eq!(
                e.task_priority.as_ref().is_some_and(|r| r.is_err()),
                want == 1
            );
        }
        assert_eq!(
            HamiEnv::from_lookup(lookup(&[])).priority(),
            DEFAULT_TASK_PRIORITY
        );
        assert_eq!(e.region_group, Some(Ok(44)));
        assert_eq!(e.region_path(), (DEFAULT_REGION_PATH, false));
        assert!(e.errors().iter().all(|e| e.var == ENV_LOCK_TIMEOUT));
    }

    /// The variable names in the first column of the table under `heading` in `doc`.
    fn table_variables(doc: &str, heading: &str) -> Vec<String> {
        let section = doc.split(heading).nth(1).expect(heading);
        let section = section.split("\n#").next().unwrap_or(section);
        section
            .lines()
            .filter_map(|l| l.strip_prefix("| `")?.split_once('`'))
            .map(|(name, _)| name.to_string())
            .collect()
    }

    /// README's and `docs/preload.md`'s variable tables list every variable of the
    /// contract and nothing else, and `docs/hami.md`'s table of what HAMi injects has a row
    /// for each variable HAMi sets.
    #[test]
    fn the_docs_list_every_variable_of_the_contract() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let read = |p: &str| std::fs::read_to_string(root.join(p)).unwrap();
        let mut want: Vec<String> = VARIABLES.iter().map(|v| v.to_string()).collect();
        want.sort();
        for (doc, heading) in [
            ("README.md", "## Configuring the preload"),
            ("docs/preload.md", "## Environment variables"),
        ] {
            let mut got = table_variables(&read(doc), heading);
            got.sort();
            assert_eq!(got, want, "{doc}");
        }
        let hami = table_variables(
            &read("docs/hami.md"),
            "## Every variable the device plugin injects",
        );
        for v in HAMI_INJECTS {
            assert!(
                hami.iter().any(|h| h == v),
                "docs/hami.md has no row for {v}: {hami:?}"
            );
        }
    }
}
