//! The tests' lists checked against the intercept table
//! (`hami_abi::intercept::INTERCEPTS`): the fake driver hands out every CUDA row through
//! `cuGetProcAddress`, hprobe (whose function tables are generated from the table,
//! `support/header.rs`) reaches every hooked row the three ways, and `hook_tests!` covers
//! every allocating row.

use std::ffi::{c_char, c_int, c_void, CString};

use crate::support::{hprobe_header, hprobe_rows, procaddr_base, Env};
use hami_abi::intercept::{Library, Memory, INTERCEPTS};
use hami_test_harness::Artifacts;

#[test]
fn procaddr_base_names() {
    assert_eq!(procaddr_base("cuMemAlloc_v2"), ("cuMemAlloc", false));
    assert_eq!(
        procaddr_base("cuMemAllocAsync_ptsz"),
        ("cuMemAllocAsync", true)
    );
    assert_eq!(procaddr_base("cuCtxCreate_v4"), ("cuCtxCreate", false));
    assert_eq!(procaddr_base("cuMemCreate"), ("cuMemCreate", false));
    assert_eq!(
        procaddr_base("cuGetProcAddress_v2"),
        ("cuGetProcAddress", false)
    );
}

type GetProcAddressV2 =
    unsafe extern "C" fn(*const c_char, *mut *mut c_void, c_int, u64, *mut c_int) -> c_int;

/// Every CUDA row of the table is exported by the fake driver and handed out by its
/// `cuGetProcAddress_v2` for the row's base name at some CUDA version up to the fake's 13000
/// (with the per-thread-default-stream flag for `_ptsz` rows). The fake's table is derived
/// from its exports (`testing/fake-cuda/build.rs`), so this fails only for a row the fake
/// does not export, or one its hand list (`procaddr-unmeasured.txt`) maps wrongly.
#[test]
fn the_fake_driver_hands_out_every_cuda_row_through_cu_get_proc_address() {
    let lib = CString::new(Artifacts::get().fake_libcuda.to_str().unwrap()).unwrap();
    // SAFETY: a valid path; the fake driver's constructors have no preconditions. The
    // handle is never closed (the test process keeps the library).
    let h = unsafe { libc::dlopen(lib.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    assert!(!h.is_null(), "dlopen of the fake driver failed");
    let sym = |name: &str| {
        let c = CString::new(name).unwrap();
        // SAFETY: a live handle and a NUL-terminated name.
        unsafe { libc::dlsym(h, c.as_ptr()) }
    };
    let gpa = sym("cuGetProcAddress_v2");
    assert!(!gpa.is_null());
    // SAFETY: the documented signature of cuGetProcAddress_v2.
    let gpa: GetProcAddressV2 = unsafe { std::mem::transmute(gpa) };
    let mut missing = Vec::new();
    for row in INTERCEPTS.iter().filter(|r| r.lib == Library::Cuda) {
        let exported = sym(row.name);
        if exported.is_null() {
            missing.push(format!("{}: not exported by the fake", row.name));
            continue;
        }
        let (base, ptsz) = procaddr_base(row.name);
        let base_c = CString::new(base).unwrap();
        let flags = if ptsz { 2 } else { 0 };
        let found = (1000..=13000).step_by(10).any(|v: c_int| {
            let mut pfn = std::ptr::null_mut();
            let mut status = 0;
            // SAFETY: valid out pointers and a NUL-terminated name.
            let rc = unsafe { gpa(base_c.as_ptr(), &mut pfn, v, flags, &mut status) };
            rc == 0 && pfn == exported
        });
        if !found {
            missing.push(format!(
                "{}: cuGetProcAddress_v2(\"{base}\", flags {flags}) never returns it",
                row.name
            ));
        }
    }
    assert!(missing.is_empty(), "{missing:#?}");
}

/// hprobe reaches every hooked CUDA row each of the three ways (direct linking, `dlsym`,
/// `cuGetProcAddress` of its base name and flags, `hprobe_fns.h`) and gets the preload's hook
/// of that name, the same function each way.
#[test]
fn hprobe_reaches_every_hooked_row_the_three_ways() {
    let rows: Vec<&str> = hprobe_rows().map(|r| r.name).collect();
    assert!(rows.len() > 40, "{rows:?}");
    for name in &rows {
        assert!(
            hprobe_header().contains(&format!("[F_{name}] = {{\"{name}\"")),
            "{name} not in hprobe_fns.h"
        );
    }
    let env = Env::new();
    // Offsets in the preload (each process maps it elsewhere).
    let mut addrs: Vec<Vec<String>> = Vec::new();
    for via in super::VIAS {
        let p = env.probe(&["--via", via, "fns"]);
        assert!(p.ok(), "{via}: {}", p.dump());
        let fns: Vec<_> = p.lines.iter().filter(|(op, _)| op == "fn").collect();
        let names: Vec<&str> = fns.iter().map(|(_, f)| f["name"].as_str()).collect();
        assert_eq!(
            names, rows,
            "{via}: hprobe's functions are the hooked CUDA rows"
        );
        for (_, f) in &fns {
            let name = &f["name"];
            assert_eq!(f["rc"], "0", "{via}: {name} not reached: {}", p.dump());
            assert_eq!(&f["sym"], name, "{via}: {name} reached as {}", f["sym"]);
            assert!(
                f["lib"].ends_with("libhami_preload.so"),
                "{via}: {name} is not the preload's hook but {}",
                f["lib"]
            );
        }
        addrs.push(fns.iter().map(|(_, f)| f["off"].clone()).collect());
    }
    assert_eq!(addrs[0], addrs[1], "direct and dlsym");
    assert_eq!(addrs[0], addrs[2], "direct and cuGetProcAddress");
}

/// Hook-tested elsewhere: allocating rows `hook_tests!` does not run, with the test that
/// covers each (none: hprobe's `call` reaches every shape of allocation).
const TESTED_ELSEWHERE: &[(&str, &str)] = &[];

/// Every hooked CUDA row that allocates has a `hook_tests!` line (or is listed in
/// [`TESTED_ELSEWHERE`]), and every `hook_tests!` line names a hooked allocating row and a
/// hooked release of its key space.
#[test]
fn every_allocating_row_has_a_hook_test() {
    let tested = super::HOOK_TESTED;
    let row = |name: &str| {
        hami_abi::intercept::find(name)
            .filter(|r| r.hooked && r.lib == Library::Cuda)
            .unwrap_or_else(|| panic!("hook_tests! names {name}, not a hooked CUDA row"))
    };
    for (alloc, release) in tested {
        let Some(Memory::Allocates(space)) = row(alloc).memory else {
            panic!("hook_tests! names {alloc}, which does not allocate");
        };
        assert_eq!(
            row(release).memory,
            Some(Memory::Releases(space)),
            "hook_tests! releases {alloc} with {release}, not a release of {space:?}"
        );
    }
    for row in INTERCEPTS.iter().filter(|r| {
        r.hooked && r.lib == Library::Cuda && matches!(r.memory, Some(Memory::Allocates(_)))
    }) {
        assert!(
            tested.iter().any(|(n, _)| *n == row.name)
                || TESTED_ELSEWHERE.iter().any(|(n, _)| *n == row.name),
            "{} allocates but has no line in hook_tests! (hami-preload/tests/preload/hooks.rs)",
            row.name
        );
    }
}
