//! The lists the tests keep beside the intercept table, checked against it
//! (`hami_common::intercept::INTERCEPTS`): the fake driver's `cuGetProcAddress` table,
//! `hprobe.c`'s name tables and `hook_tests!`.

use std::ffi::{c_char, c_int, c_void, CString};
use std::path::Path;

use hami_common::intercept::{Library, Memory, INTERCEPTS};
use hami_test_harness::Artifacts;

/// The base name `cuGetProcAddress` takes for exported symbol `name`, and whether it is the
/// per-thread-default-stream variant: `cuMemAllocAsync_ptsz` -> (`cuMemAllocAsync`, true),
/// `cuCtxCreate_v3` -> (`cuCtxCreate`, false).
pub fn procaddr_base(name: &str) -> (&str, bool) {
    let (name, ptsz) = match name.strip_suffix("_ptsz") {
        Some(n) => (n, true),
        None => (name, false),
    };
    let base = match name.rsplit_once("_v") {
        Some((b, v)) if !v.is_empty() && v.bytes().all(|c| c.is_ascii_digit()) => b,
        _ => name,
    };
    (base, ptsz)
}

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

/// CUDA versions at which the driver's `cuGetProcAddress` mapping changes
/// (`testing/fake-cuda/tests/data/real-procaddr-580.txt`, plus 9000 and 12050).
const VERSIONS: [c_int; 16] = [
    2000, 3000, 3020, 4000, 6000, 7000, 9000, 10000, 10020, 11000, 11020, 11030, 11040, 12000,
    12050, 13000,
];

/// Every CUDA row of the table is exported by the fake driver and handed out by its
/// `cuGetProcAddress_v2` for the row's base name at some version (with the
/// per-thread-default-stream flag for `_ptsz` rows): the fake's table
/// (`testing/fake-cuda/src/procaddr.rs`) misses no intercepted function, so the
/// `procaddr` way of the hook tests reaches each.
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
        let found = VERSIONS.iter().any(|&v| {
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

/// The identifiers or strings between the braces of the line of `src` that starts with
/// `start`.
fn c_list<'a>(src: &'a str, start: &str) -> Vec<&'a str> {
    let line = src
        .lines()
        .map(str::trim)
        .find(|l| l.starts_with(start))
        .unwrap_or_else(|| panic!("no line starting with {start:?} in hprobe.c"));
    let inner = line.split_once('{').unwrap().1.rsplit_once('}').unwrap().0;
    inner
        .split(',')
        .map(|s| s.trim().trim_matches('"'))
        .filter(|s| !s.is_empty())
        .collect()
}

/// `hprobe.c`'s function tables (the `enum` of indices, `dl_names`, `pa_names`, `pa_flags`
/// and the direct-call `d[]`) agree with each other and with the table: each entry is a
/// hooked CUDA row, reached by the same name through `dlsym`, and by its base name (with
/// the per-thread flag for `_ptsz`) through `cuGetProcAddress`.
#[test]
fn hprobe_function_tables_follow_the_intercept_table() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/programs/hprobe.c");
    let src = std::fs::read_to_string(path).unwrap();
    let ids = c_list(&src, "enum { ALLOC,");
    assert_eq!(ids.last(), Some(&"NFN"));
    let ids = &ids[..ids.len() - 1];
    let dl = c_list(&src, "static const char *dl_names[NFN]");
    let pa = c_list(&src, "static const char *pa_names[NFN]");
    let direct = c_list(&src, "void *d[NFN]");
    let ptsz_ids: Vec<&str> = c_list(&src, "static const unsigned long long pa_flags[NFN]")
        .iter()
        .map(|f| {
            let (id, flag) = f.split_once('=').expect("[ID] = FLAGS");
            assert_eq!(flag.trim(), "2", "{f}");
            id.trim().trim_start_matches('[').trim_end_matches(']')
        })
        .collect();
    assert_eq!(dl.len(), ids.len(), "dl_names: {dl:?}");
    assert_eq!(pa.len(), ids.len(), "pa_names: {pa:?}");
    assert_eq!(direct, dl, "the direct calls are the dlsym names");
    for (i, name) in dl.iter().enumerate() {
        assert!(
            hami_common::intercept::is_hooked(Library::Cuda, name.as_bytes()),
            "{name} is not a hooked CUDA row of INTERCEPTS"
        );
        let (base, ptsz) = procaddr_base(name);
        assert_eq!(pa[i], base, "pa_names[{}] for {name}", ids[i]);
        assert_eq!(
            ptsz_ids.contains(&ids[i]),
            ptsz,
            "pa_flags[{}] for {name}",
            ids[i]
        );
    }
}

/// Hook-tested elsewhere: allocating rows `hook_tests!` does not run, with the test that
/// covers each.
const TESTED_ELSEWHERE: &[(&str, &str)] = &[(
    "cuMipmappedArrayCreate",
    "device_memory.rs (cudaprobe's mipmapped array)",
)];

/// Every hooked CUDA row that allocates has a `hook_tests!` line (or is listed in
/// [`TESTED_ELSEWHERE`]), and every `hook_tests!` line names an allocating row.
#[test]
fn every_allocating_row_has_a_hook_test() {
    let tested = super::HOOK_TESTED;
    for name in tested {
        let row = hami_common::intercept::find(name)
            .unwrap_or_else(|| panic!("hook_tests! names {name}, not a row of INTERCEPTS"));
        assert!(
            row.hooked && matches!(row.memory, Some(Memory::Allocates(_))),
            "hook_tests! names {name}, not a hooked allocating row"
        );
    }
    for row in INTERCEPTS.iter().filter(|r| {
        r.hooked && r.lib == Library::Cuda && matches!(r.memory, Some(Memory::Allocates(_)))
    }) {
        assert!(
            tested.contains(&row.name) || TESTED_ELSEWHERE.iter().any(|(n, _)| *n == row.name),
            "{} allocates but has no line in hook_tests! (hami-preload/tests/hooks.rs)",
            row.name
        );
    }
}
