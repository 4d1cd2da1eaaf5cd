use super::*;
use hami_abi::layout::{COMPUTE_POLICY_DEFAULT, COMPUTE_POLICY_DISABLE, COMPUTE_POLICY_FORCE};
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
    // True values, and malformed ones: counted as a request, refused visibly.
    for v in ["true", "TRUE", "1", "yes", "on", "2", "tRue"] {
        let c = cfg(&[
            ("CUDA_OVERSUBSCRIBE", v),
            ("CUDA_DEVICE_MEMORY_LIMIT", "1g"),
        ]);
        assert_eq!(c.oversubscribe_refused.as_deref(), Some(v), "{v}");
        // The quota is untouched.
        assert_eq!(c.limits[0], 1 << 30);
        assert!(c.errors.is_empty());
    }
    for v in ["false", "False", "0", "f"] {
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
    assert_eq!(c.task_priority, DEFAULT_TASK_PRIORITY);
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
        assert!(matches!(c.errors[0].reason, Reason::Number(_)));
        assert_eq!(
            consequence(&c.errors[0]).as_deref(),
            Some("the affected devices' compute share is 1 %")
        );
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
    let c = cfg(&[("CUDA_TASK_PRIORITY", "0")]);
    assert_eq!(c.task_priority, 0);
    let c = cfg(&[("CUDA_TASK_PRIORITY", "-1")]);
    assert_eq!(c.task_priority, DEFAULT_TASK_PRIORITY);
    assert!(
        c.errors.iter().any(|e| e.var == "CUDA_TASK_PRIORITY"),
        "reported"
    );
}

#[test]
fn disable_control_values() {
    let get = |v: &'static str| move |k: &str| (k == "CUDA_DISABLE_CONTROL").then(|| v.to_string());
    for v in ["true", "TRUE", "True", "1", "t"] {
        assert_eq!(disable_control_from(get(v)), (true, None), "{v:?}");
    }
    for v in ["false", "0", "F"] {
        assert_eq!(disable_control_from(get(v)), (false, None), "{v:?}");
    }
    assert_eq!(disable_control_from(|_| None), (false, None));
    // What HAMi's device plugin (Go's strconv.ParseBool) does not read as true: it
    // mounted the library, so control stays on.
    for v in ["yes", "", "on", "tRue", " True ", " 1 "] {
        let (off, err) = disable_control_from(get(v));
        assert!(!off, "{v:?}: a malformed value keeps control on");
        let msg = err.expect("an error").to_string();
        assert!(msg.contains("CUDA_DISABLE_CONTROL"), "{msg}");
    }
}

/// The preload's half of the cross-reading test: every row of the shared table
/// (`hami_common::env::CROSS_READING`; the agent's half is `hami-user`'s
/// `procinfo::tests::cross_reading_the_agent_reads_as_the_shared_table_says`), read back
/// from what the preload acts on: the limits and flags it records, the share the launch
/// gate applies (the contract's share rule, which `crate::compute::gate::effective_share`
/// applies: the config sits below the gate), whether control is off, whether
/// oversubscription is refused.
#[test]
fn cross_reading_the_preload_acts_as_the_shared_table_says() {
    use hami_common::env::{Limit, Reading, Share, CROSS_READING};
    for c in CROSS_READING {
        // As `getenv`: the first entry of a name counts.
        let get = |k: &str| {
            c.env
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        };
        let cfg = Config::from_lookup(get);
        let d = c.device;
        let limit = if cfg.limit_flags[d] & LIMIT_FLAG_INVALID != 0 {
            Limit::Invalid
        } else if cfg.limits[d] == 0 {
            Limit::None
        } else {
            Limit::Bytes(cfg.limits[d])
        };
        let per_device = format!("{ENV_SM_LIMIT}_{d}");
        let governing = if get(&per_device).is_some() {
            per_device.as_str()
        } else {
            ENV_SM_LIMIT
        };
        let share = match hami_common::config::share_percent(cfg.sm_limits[d], cfg.compute_policy)
            .unwrap_or(0)
        {
            0 => Share::None,
            p if cfg.errors.iter().any(|e| e.var == governing) => {
                assert_eq!(p, SM_LIMIT_FALLBACK, "{:?}", c.env);
                Share::Malformed
            }
            p => Share::Percent(p),
        };
        let reading = Reading {
            control_disabled: disable_control_from(get).0,
            limit,
            share,
            oversubscribe: cfg.oversubscribe_refused.is_some(),
        };
        assert_eq!(reading, c.reading, "{:?} on device {d}", c.env);
        assert_eq!(cfg.region_path, c.region, "{:?}", c.env);
    }
}
