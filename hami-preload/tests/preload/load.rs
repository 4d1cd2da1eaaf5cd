//! What the built `libhami_preload.so` costs every exec that loads it (HAMi puts it in
//! `/etc/ld.so.preload`: every program of the container, CUDA or not): the libraries it pulls
//! in, the symbols the loader must look up, and the code that runs at load
//! (`docs/preload.md`, "At load"). The figures themselves: `cargo xtask bench exec`.

use crate::support::Artifacts;
use hami_test_harness::glibc;
use hami_test_harness::programs::compile_c;
use object::read::elf::{Dyn as _, ElfFile64};
#[cfg(target_arch = "x86_64")]
use object::ObjectSection;
use object::{Object, ObjectSymbol, RelocationTarget};
use std::process::Command;

fn library() -> Vec<u8> {
    let p = &Artifacts::get().preload_so;
    std::fs::read(p).unwrap_or_else(|e| panic!("read {}: {e}", p.display()))
}

/// `DT_NEEDED` entries of the library.
fn needed(data: &[u8]) -> Vec<String> {
    let elf = ElfFile64::<object::Endianness>::parse(data).unwrap();
    let endian = elf.endian();
    let dynamic = elf
        .elf_section_table()
        .dynamic(endian, data)
        .unwrap()
        .expect("a dynamic section");
    let (entries, strings_index) = dynamic;
    let strings = elf
        .elf_section_table()
        .strings(endian, data, strings_index)
        .unwrap();
    entries
        .iter()
        .filter(|d| d.d_tag(endian) == object::elf::DT_NEEDED)
        .map(|d| String::from_utf8_lossy(d.string(endian, strings).unwrap()).into_owned())
        .collect()
}

#[test]
fn the_library_needs_only_libc_and_the_loader() {
    // On the base commit: libgcc_s.so.1 too on x86-64 (std's shared unwinder), whose
    // constructor (`__cpu_indicator_init`, CPUID) ran in every exec. With the glibc 2.17 floor
    // the link would also name libdl.so.2 and libpthread.so.0 (dlopen and the pthread_key
    // family lived there before glibc 2.34; since, they are empty and only cost an exec 10
    // page faults): `src/ffi/glibc_compat.rs` reaches those functions at run time instead.
    // On arm64 the library keeps libgcc_s.so.1 (the static unwinder is x86-64's).
    let mut allowed = vec!["libc.so.6"];
    if cfg!(not(target_arch = "x86_64")) {
        allowed.push("libgcc_s.so.1");
    }
    let needed = needed(&library());
    for n in &needed {
        assert!(
            allowed.contains(&n.as_str()) || n.starts_with("ld-linux"),
            "DT_NEEDED {n} (all: {needed:?})"
        );
    }
    assert!(needed.iter().any(|n| n == "libc.so.6"), "{needed:?}");
    // No version is required of any other library either.
    let needs = glibc::Needs::read(&library()).unwrap();
    for file in needs.versions.keys() {
        assert!(
            file == "libc.so.6" || file.starts_with("ld-linux") || file == "libgcc_s.so.1",
            "versions required of {file}: {:?}",
            needs.versions[file]
        );
    }
}

#[test]
fn every_glibc_version_the_library_needs_is_2_17_or_older() {
    // Regression (issue 28): linked against the build machine's glibc 2.36, the library
    // needed GLIBC_2.34 (dlopen, dladdr, dlvsym, the pthread_mutex and pthread_key families,
    // pthread_once) and GLIBC_2.33 (stat64, fstat64): every program of a container on an
    // older glibc (Ubuntu 20.04, Debian 11, UBI 8) failed to start with the library in
    // /etc/ld.so.preload. HAMi's own floor is glibc 2.17, on x86-64 and arm64 alike.
    let needs = glibc::Needs::read(&library()).unwrap();
    let above = needs.above(glibc::FLOOR);
    assert!(
        above.is_empty(),
        "versions above {}: {above:#?}",
        glibc::FLOOR
    );
    assert!(
        needs.newest().is_some(),
        "no glibc version at all: {:?}",
        needs.versions
    );
}

#[test]
fn no_symbol_is_taken_from_libc_by_name_alone() {
    // A strong undefined symbol without a version binds to whatever defines the name, and
    // with `-z now` its absence is a loader error: the launch gate called glibc's `gettid`,
    // which exists only since glibc 2.30 (now the system call). Weak ones (std's `statx`,
    // `getrandom`, ...) are looked up at run time and may be missing.
    let needs = glibc::Needs::read(&library()).unwrap();
    assert!(
        needs.unversioned_strong.is_empty(),
        "undefined without a version: {:?}",
        needs.unversioned_strong
    );
}

#[test]
fn the_library_binds_its_own_exports_at_link_time() {
    // On the base commit: the hook table's 68 entries and the cuGetProcAddress hooks were
    // symbol relocations, looked up by name in every exec.
    let data = library();
    let elf = object::File::parse(&*data).unwrap();
    let defined: std::collections::HashMap<_, String> = elf
        .dynamic_symbols()
        .filter(|s| s.is_definition())
        .map(|s| (s.index(), s.name().unwrap_or("?").to_string()))
        .collect();
    let mut own = Vec::new();
    for (off, r) in elf.dynamic_relocations().expect("dynamic relocations") {
        if let RelocationTarget::Symbol(i) = r.target() {
            if let Some(name) = defined.get(&i) {
                own.push(format!("{off:#x} {name}"));
            }
        }
    }
    assert!(
        own.is_empty(),
        "relocations against our own exports: {own:?}"
    );
}

#[cfg(target_arch = "x86_64")]
#[test]
fn nothing_of_ours_runs_at_load() {
    // `.init_array` holds only the toolchain's entries: the C runtime's `frame_dummy` and
    // std's argv capture (two stores). A constructor of ours (or of a dependency) would show
    // here; everything the preload does waits for the first CUDA or NVML call.
    let data = library();
    let elf = object::File::parse(&*data).unwrap();
    let init = elf.section_by_name(".init_array").expect(".init_array");
    let (lo, hi) = (init.address(), init.address() + init.size());
    let by_addr: std::collections::HashMap<u64, String> = elf
        .symbols()
        .filter_map(|s| Some((s.address(), s.name().ok()?.to_string())))
        .collect();
    let mut entries = Vec::new();
    for (off, r) in elf.dynamic_relocations().expect("dynamic relocations") {
        if (lo..hi).contains(&off) {
            let target = r.addend() as u64;
            entries.push(
                by_addr
                    .get(&target)
                    .cloned()
                    .unwrap_or(format!("{target:#x}")),
            );
        }
    }
    assert_eq!(entries.len() as u64, init.size() / 8, "{entries:?}");
    for e in &entries {
        assert!(
            e == "frame_dummy" || (e.contains("ARGV_INIT_ARRAY") && e.contains("init_wrapper")),
            "a constructor runs at load: {e} (all: {entries:?})"
        );
    }
}

#[cfg(target_arch = "x86_64")]
#[test]
fn the_code_every_exec_runs_lies_in_one_place() {
    // Every exec runs `_init`, `frame_dummy` and std's argv capture at load, and at exit
    // `__do_global_dtors_aux` (through the PLT to `__cxa_finalize`) and `state::at_exit`;
    // the kernel maps the file's code on the first touch of each 64 KiB window. Before
    // build.rs placed them together, they were four windows apart (.init at the start of the
    // code, `at_exit` 90 KiB and the argv capture 650 KiB further, `.plt` at its end).
    let data = library();
    let elf = object::File::parse(&*data).unwrap();
    let init = elf.section_by_name(".init").expect(".init").address();
    let mut places: Vec<(String, u64)> = [".plt"]
        .iter()
        .map(|s| {
            let sec = elf.section_by_name(s).unwrap_or_else(|| panic!("no {s}"));
            (s.to_string(), sec.address() + sec.size())
        })
        .collect();
    type IsIt = fn(&str) -> bool;
    let wanted: [(&str, IsIt); 4] = [
        ("frame_dummy", |n| n == "frame_dummy"),
        ("__do_global_dtors_aux", |n| n == "__do_global_dtors_aux"),
        ("argv capture", |n| {
            n.contains("ARGV_INIT_ARRAY") && n.contains("init_wrapper")
        }),
        ("state::at_exit", |n| {
            n.contains("hami_preload5state7at_exit")
        }),
    ];
    for (what, is) in wanted {
        let s = elf
            .symbols()
            .find(|s| s.name().is_ok_and(is))
            .unwrap_or_else(|| panic!("no symbol for {what}"));
        places.push((what.to_string(), s.address() + s.size()));
    }
    for (what, end) in &places {
        assert!(
            *end >= init && end - init <= 4096,
            "{what} ends {:#x} bytes from .init ({init:#x}): not in the first page of code \
             (all: {places:x?})",
            end.wrapping_sub(init)
        );
    }
}

#[cfg(target_arch = "x86_64")]
#[test]
fn the_data_starts_on_a_page_of_its_own() {
    // The loader zeroes the `.bss` part of the data's last file page, which copies that
    // page. lld packed `.data` (3.4 KiB) right after RELRO's last page, 3 KiB into a page:
    // it straddled two, and the zeroing wrote a second page that no relocation needs (one
    // page fault per exec). build.rs passes `-z separate-loadable-segments` (GNU ld starts
    // the data after RELRO on a page boundary anyway).
    let data = library();
    let elf = object::File::parse(&*data).unwrap();
    let d = elf.section_by_name(".data").expect(".data");
    assert_eq!(
        d.address() % 4096,
        0,
        ".data at {:#x} ({:#x} bytes) shares its first page",
        d.address(),
        d.size()
    );
}

/// A program that execs with the preload (`LD_PRELOAD`, as in a container), calls its
/// self-check (a deliberate panic inside the library, caught by the hooks' panic guard) and
/// reports which objects are loaded.
const CHECK: &str = r#"
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <stdio.h>
#include <string.h>
static int cb(struct dl_phdr_info *i, size_t n, void *d) {
    (void)n;
    if (strstr(i->dlpi_name, "libgcc_s")) *(int *)d = 1;
    return 0;
}
int main(void) {
    int (*check)(void) = (int (*)(void))dlsym(RTLD_DEFAULT, "hami_preload_check_unwind");
    if (!check) { printf("no self-check\n"); return 2; }
    int caught = check();
    int gcc_s = 0;
    dl_iterate_phdr(cb, &gcc_s);
    printf("caught=%d libgcc_s=%d\n", caught, gcc_s);
    return 0;
}
"#;

#[test]
fn a_panic_inside_the_loaded_library_is_caught_by_its_own_unwinder() {
    let a = Artifacts::get();
    let prog = a.programs_dir.join("load_check_unwind");
    compile_c(CHECK, &prog, &[]);
    let o = Command::new(&prog)
        .env("LD_PRELOAD", &a.preload_so)
        .env("LIBCUDA_LOG_LEVEL", "0")
        .env_remove("RUST_BACKTRACE")
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{}: {out}{err}", o.status);
    // The application keeps running (no abort), and the unwinder that caught the panic is
    // the library's own: libgcc_s was never loaded.
    #[cfg(target_arch = "x86_64")]
    assert_eq!(out.trim(), "caught=1 libgcc_s=0", "{err}");
    #[cfg(not(target_arch = "x86_64"))]
    assert!(out.starts_with("caught=1 "), "{out}{err}");
    assert!(err.contains("deliberate panic"), "{err}");
    assert!(err.contains("internal error (panic)"), "{err}");
}
