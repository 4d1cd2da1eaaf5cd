//! Configuration errors, region problems, and programs that never use CUDA.

use crate::support::*;

#[test]
fn malformed_limits_fail_closed_with_the_variable_named() {
    for (var, value) in [
        ("CUDA_DEVICE_MEMORY_LIMIT", "lots"),
        ("CUDA_DEVICE_MEMORY_LIMIT", "-1"),
        ("CUDA_DEVICE_MEMORY_LIMIT", "-2G"),
        ("CUDA_DEVICE_MEMORY_LIMIT", "1.5G"),
        ("CUDA_DEVICE_MEMORY_LIMIT", "4GB"),
        ("CUDA_DEVICE_MEMORY_LIMIT", "99999999999999999999"),
        ("CUDA_DEVICE_MEMORY_LIMIT", "99999999T"),
        ("CUDA_DEVICE_MEMORY_LIMIT", ""),
        ("CUDA_DEVICE_MEMORY_LIMIT_0", "12q"),
    ] {
        let env = Env::new().set(var, value);
        let p = env.probe(&["alloc", "1M", "info", "alloc", "1M"]);
        assert!(p.ok(), "the application must not crash: {}", p.dump());
        assert_eq!(p.rcs(), vec![OOM, 0, OOM], "{var}={value:?}: {}", p.dump());
        assert_eq!(p.field(1, "free"), "0", "{var}={value:?}: nothing is free");
        let err = p.stderr();
        assert!(
            err.contains(&format!("{var}={value:?}")) && err.contains("ERROR"),
            "{var}={value:?}: the error names the variable and value: {err}"
        );
        assert!(
            err.contains("CUDA_ERROR_OUT_OF_MEMORY"),
            "the refusal's reason is logged: {err}"
        );
    }
}

#[test]
fn a_valid_per_device_limit_overrides_a_malformed_global_one() {
    let env = Env::new()
        .set("CUDA_DEVICE_MEMORY_LIMIT", "junk")
        .set("CUDA_DEVICE_MEMORY_LIMIT_0", "1g")
        .set("HAMI_CONTEXT_OVERHEAD", "0");
    let p = env.probe(&["alloc", "512M", "alloc", "600M"]);
    assert_eq!(p.rcs(), vec![0, OOM], "{}", p.dump());
    assert!(p.stderr().contains("CUDA_DEVICE_MEMORY_LIMIT=\"junk\""));
}

#[test]
fn later_process_keeps_the_regions_limits_and_warns() {
    let env = Env::new()
        .set("CUDA_DEVICE_MEMORY_LIMIT", "1G")
        .set("HAMI_CONTEXT_OVERHEAD", "0");
    assert_eq!(env.probe(&["info"]).rcs(), vec![0]);
    let env = env.set("CUDA_DEVICE_MEMORY_LIMIT", "4G");
    let p = env.probe(&["info", "alloc", "2G"]);
    assert_eq!(p.field(0, "total"), GB.to_string(), "{}", p.dump());
    assert_eq!(p.rc(1), OOM);
    assert!(
        p.stderr().contains("WARN") && p.stderr().contains("differs"),
        "{}",
        p.stderr()
    );
}

#[test]
fn corrupt_truncated_or_foreign_region_fails_closed_without_crashing() {
    let full = hami_abi::layout::REGION_SIZE;
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("garbage", vec![0xab; full]),
        ("truncated", b"HAMIRSv\x01short".to_vec()),
        ("text", b"hello, not a region\n".to_vec()),
    ];
    for (what, bytes) in cases {
        let env = Env::new().set("CUDA_DEVICE_MEMORY_LIMIT", "1G");
        std::fs::write(env.region_path(), &bytes).unwrap();
        let p = env.probe(&["alloc", "1M", "info", "alloc", "1M", "free"]);
        assert!(p.ok(), "{what}: {}", p.dump());
        assert_eq!(p.rc(0), OOM, "{what}: {}", p.dump());
        assert_eq!(p.rc(2), OOM, "{what}: {}", p.dump());
        assert_eq!(p.field(1, "free"), "0");
        let err = p.stderr();
        assert!(
            err.contains("ERROR") && err.contains("shared region"),
            "{what}: {err}"
        );
        // The file is left alone for the operator to look at.
        assert_eq!(std::fs::read(env.region_path()).unwrap(), bytes, "{what}");
    }
}

#[test]
fn unusable_region_path_fails_closed() {
    let env = Env::new().set("CUDA_DEVICE_MEMORY_LIMIT", "1G");
    // A directory where the region file should be: cannot be opened for writing (tests run
    // as root, so file permissions would not stop us).
    std::fs::create_dir(env.region_path()).unwrap();
    let p = env.probe(&["alloc", "1M"]);
    assert!(p.ok(), "{}", p.dump());
    assert_eq!(p.rc(0), OOM, "{}", p.dump());
    assert!(p.stderr().contains("ERROR"), "{}", p.stderr());
}

#[test]
fn non_cuda_programs_are_untouched_and_create_nothing() {
    let env = Env::new().set("CUDA_DEVICE_MEMORY_LIMIT", "1G");
    // Under an old glibc (the second run of these tests, `cargo xtask test`) the programs are
    // that userland's own: the host's need the host's glibc.
    let old = hami_test_harness::glibc::requested();
    let old_progs: Vec<String> = old
        .iter()
        .flat_map(|g| ["usr/bin/getconf", "usr/bin/getent", "usr/bin/iconv"].map(|p| g.program(p)))
        .map(|p| p.display().to_string())
        .collect();
    let mut progs: Vec<Vec<&str>> = match &old {
        Some(_) => vec![
            vec![&old_progs[0], "GNU_LIBC_VERSION"],
            vec![&old_progs[1], "passwd", "root"],
            vec![&old_progs[2], "-l"],
        ],
        None => vec![
            vec!["/bin/true"],
            vec!["/bin/sh", "-c", "echo hi; ls / > /dev/null"],
            vec!["/bin/bash", "-c", "x=$((1+2)); echo $x"],
        ],
    };
    if old.is_none() && std::path::Path::new("/usr/bin/python3").exists() {
        progs.push(vec!["/usr/bin/python3", "-c", "1"]);
        progs.push(vec![
            "/usr/bin/python3",
            "-c",
            "import ctypes; ctypes.CDLL(None).printf",
        ]);
    }
    for prog in progs {
        let out = env
            .command(std::path::Path::new(prog[0]), true)
            .args(&prog[1..])
            .output()
            .unwrap();
        let plain = env
            .command(std::path::Path::new(prog[0]), false)
            .args(&prog[1..])
            .output()
            .unwrap();
        assert!(out.status.success(), "{prog:?}: {out:?}");
        assert_eq!(out.stdout, plain.stdout, "{prog:?}");
        assert_eq!(out.stderr, plain.stderr, "{prog:?}");
        assert!(!env.region_path().exists(), "{prog:?} created the region");
    }
}

/// HAMi's device plugin sets `CUDA_OVERSUBSCRIBE=true` when its memory scaling is above 1;
/// hami-preload refuses it visibly at the default log level and keeps the quota.
#[test]
fn oversubscription_is_refused_with_a_warning_and_the_quota_stays() {
    let env = Env::new()
        .set("CUDA_DEVICE_MEMORY_LIMIT", "1G")
        .set("HAMI_CONTEXT_OVERHEAD", "0")
        .set("CUDA_OVERSUBSCRIBE", "true");
    let p = env.probe(&["info", "alloc", "768M", "alloc", "512M"]);
    assert!(p.ok(), "{}", p.dump());
    assert_eq!(p.field(0, "total"), GB.to_string(), "{}", p.dump());
    assert_eq!(p.rcs(), vec![0, 0, OOM], "{}", p.dump());
    let err = p.stderr();
    let warned: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("WARN") && l.contains("CUDA_OVERSUBSCRIBE=\"true\""))
        .collect();
    assert_eq!(
        warned.len(),
        1,
        "one warning, at the first CUDA call: {err}"
    );
    // Off: not a word.
    let env = env.set("CUDA_OVERSUBSCRIBE", "false");
    let p = env.probe(&["info"]);
    assert!(!p.stderr().contains("CUDA_OVERSUBSCRIBE"), "{}", p.stderr());
}
