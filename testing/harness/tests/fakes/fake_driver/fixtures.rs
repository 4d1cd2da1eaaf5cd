//! Helpers and constants of `fake_driver.rs`, beside it.

use hami_test_harness::{OpLine, ProbeOutput, TestEnv};

pub(super) const MIB: u64 = 1 << 20;
pub(super) const GIB: u64 = 1 << 30;

// CUresult codes.
pub(super) const SUCCESS: i32 = 0;
pub(super) const INVALID_VALUE: i32 = 1;
pub(super) const OUT_OF_MEMORY: i32 = 2;
pub(super) const NOT_INITIALIZED: i32 = 3;
pub(super) const NO_DEVICE: i32 = 100;
pub(super) const INVALID_DEVICE: i32 = 101;
pub(super) const INVALID_CONTEXT: i32 = 201;
pub(super) const NOT_FOUND: i32 = 500;
pub(super) const CONTEXT_IS_DESTROYED: i32 = 709;

pub(super) fn env() -> TestEnv {
    TestEnv::new().env("FAKE_CUDA_CTX_OVERHEAD", "0")
}

pub(super) fn rc_of(out: &ProbeOutput, i: usize) -> i32 {
    out.op(i)
        .rc()
        .unwrap_or_else(|| panic!("no rc on line {i}:\n{}", out.dump()))
}

pub(super) fn meminfo_free(o: &OpLine) -> u64 {
    assert!(o.ok(), "{}", o.raw);
    o.num("free").expect("free")
}

/// The CUDA versions the real driver's `cuGetProcAddress` table was measured at.
pub(super) const PROCADDR_VERSIONS: [i32; 18] = [
    0, 1000, 2000, 3000, 3020, 4000, 6000, 7000, 10020, 11000, 11020, 11030, 11040, 12000, 12050,
    13000, 13010, 99000,
];

/// 32-bit legacy variants the fake does not export (it reports VERSION_NOT_SUFFICIENT).
pub(super) const LEGACY_32BIT: [&str; 9] = [
    "cuDeviceTotalMem",
    "cuMemAlloc",
    "cuMemFree",
    "cuMemGetInfo",
    "cuMemAllocPitch",
    "cuMemGetAddressRange",
    "cuArrayCreate",
    "cuArray3DCreate",
    "cuMemAllocHost",
];

/// Real functions the fake does not implement at all.
pub(super) const ABSENT: [&str; 3] = ["cuMemHostAlloc", "cuMemAllocHost", "cuMemcpyHtoD"];

/// One `cuGetProcAddress` case of the real driver's table: symbol, CUDA version, flags, the
/// function the real driver returned (`NULL`, `UNTOUCHED`), its result and status.
pub(super) type ProcAddrCase = (String, i32, u64, String, i32, i32);

/// The cases of the table measured on the real driver 580 (`real-procaddr-580.txt`), with
/// what the fake must answer where it exports less, and the `cudaprobe` arguments asking
/// them all.
pub(super) fn real_procaddr_cases() -> (Vec<String>, Vec<ProcAddrCase>) {
    let table = include_str!("../../../../fake-cuda/tests/data/real-procaddr-580.txt");
    let (versions, legacy, absent) = (PROCADDR_VERSIONS, LEGACY_32BIT, ABSENT);
    let mut args: Vec<String> = Vec::new();
    let mut expect: Vec<ProcAddrCase> = Vec::new();
    for line in table
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
    {
        let mut it = line.split_whitespace();
        let name = it.next().unwrap().to_string();
        let flags: u64 = it.next().unwrap().parse().unwrap();
        let trans: Vec<(i32, String, i32, i32)> = it
            .map(|t| {
                let (v, rest) = t.split_once(':').unwrap();
                let p: Vec<&str> = rest.split('/').collect();
                (
                    v.parse().unwrap(),
                    p[0].to_string(),
                    p[1].parse().unwrap(),
                    p[2].parse().unwrap(),
                )
            })
            .collect();
        if name == "<empty>" {
            continue;
        }
        for &v in &versions {
            let (_, sym, rc, status) = trans.iter().rev().find(|t| t.0 <= v).unwrap().clone();
            let (sym, status) = if absent.contains(&name.as_str()) && rc == 0 {
                ("NULL".to_string(), 1)
            } else if legacy.contains(&name.as_str())
                && !sym.ends_with("_v2")
                && sym != "NULL"
                && sym != "UNTOUCHED"
            {
                ("NULL".to_string(), 2)
            } else {
                (sym, status)
            };
            args.extend([
                "getproc".to_string(),
                name.clone(),
                v.to_string(),
                flags.to_string(),
            ]);
            expect.push((name.clone(), v, flags, sym, rc, status));
        }
    }
    (args, expect)
}
