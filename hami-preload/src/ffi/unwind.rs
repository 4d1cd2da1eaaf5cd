//! The unwinder the panic guard needs, without `libgcc_s`.
//!
//! Every hook runs inside the panic guard (`shim::guard`): a panic becomes an error code,
//! never an unwind across FFI and never an abort of the application. That takes an unwinder.
//! Rust's std on `*-linux-gnu` links the shared `libgcc_s.so.1` for it, and with the preload
//! in `/etc/ld.so.preload` every exec of the container (shells, `ls`, probes) would map it
//! and run its constructor (`__cpu_indicator_init`: CPUID, which traps on a virtual machine):
//! about as much as all the rest of the preload costs an exec (`docs/benchmarks.md`, "Exec
//! cost of the preload").
//!
//! On x86_64 `build.rs` therefore links GCC's static unwinder (`libgcc_eh.a`, the same code as
//! `libgcc_s`, GCC runtime library exception) into the library; `-lgcc_s` is then unneeded and
//! dropped (`--as-needed`), its symbols stay local (the version script exports only ours).
//! GCC 12 and later find a frame's unwind tables with glibc's `_dl_find_object`, which exists
//! only since glibc 2.35; `libgcc_s` resolves it at run time, a static copy would make it a
//! link-time requirement of the preload (whose floor is glibc 2.34: RHEL 9 / UBI 9 images).
//! The link wraps it (`--wrap=_dl_find_object`) into [`find_object`]: glibc's function when
//! the running glibc has it (looked up on the first unwind, with `dlvsym`), else the same
//! answer computed from `dl_iterate_phdr`. Nothing of it runs at load.

use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};

/// glibc's `struct dl_find_object` (`<dlfcn.h>`, glibc 2.35) on targets without
/// `DLFO_STRUCT_HAS_EH_DBASE` (x86_64, aarch64).
#[repr(C)]
#[derive(Debug)]
pub struct DlFindObject {
    /// `dlfo_flags`: 0.
    pub flags: u64,
    /// `dlfo_map_start`: the start of the object's mapping.
    pub map_start: *mut c_void,
    /// `dlfo_map_end`: one past its end.
    pub map_end: *mut c_void,
    /// `dlfo_link_map` (null from the fallback: the unwinder does not read it).
    pub link_map: *mut c_void,
    /// `dlfo_eh_frame`: the object's `PT_GNU_EH_FRAME` segment (null if it has none).
    pub eh_frame: *mut c_void,
    reserved: [u64; 7],
}

impl Default for DlFindObject {
    fn default() -> Self {
        DlFindObject {
            flags: 0,
            map_start: std::ptr::null_mut(),
            map_end: std::ptr::null_mut(),
            link_map: std::ptr::null_mut(),
            eh_frame: std::ptr::null_mut(),
            reserved: [0; 7],
        }
    }
}

type FnFindObject = unsafe extern "C" fn(*mut c_void, *mut DlFindObject) -> c_int;

/// glibc's `_dl_find_object`: 0 = not looked up yet, 1 = the running glibc has none.
static REAL: AtomicUsize = AtomicUsize::new(0);

/// glibc's `_dl_find_object` if the running glibc (2.35 or later) has it.
pub fn real_find_object() -> Option<FnFindObject> {
    let mut p = REAL.load(Ordering::Acquire);
    if p == 0 {
        // SAFETY: dlvsym with a pseudo-handle and C strings; we do not export dlvsym.
        let f = unsafe {
            libc::dlvsym(
                libc::RTLD_DEFAULT,
                c"_dl_find_object".as_ptr(),
                c"GLIBC_2.35".as_ptr(),
            )
        };
        p = if f.is_null() { 1 } else { f as usize };
        REAL.store(p, Ordering::Release);
    }
    // SAFETY: any value above 1 is glibc's `_dl_find_object`, of type `FnFindObject`.
    (p > 1).then(|| unsafe { std::mem::transmute::<usize, FnFindObject>(p) })
}

/// What the static unwinder calls for `_dl_find_object` (see the module documentation):
/// fills `out` for the object mapped at `pc` and returns 0, or returns -1 if none is.
///
/// # Safety
/// `out` is valid for writes.
pub unsafe extern "C" fn find_object(pc: *mut c_void, out: *mut DlFindObject) -> c_int {
    match real_find_object() {
        // SAFETY: glibc's function, with the caller's arguments.
        Some(f) => unsafe { f(pc, out) },
        // SAFETY: as promised by the caller.
        None => unsafe { find_object_phdr(pc, out) },
    }
}

/// [`find_object`] from `dl_iterate_phdr`: the loaded object one of whose `PT_LOAD` segments
/// holds `pc`.
///
/// # Safety
/// `out` is valid for writes.
pub unsafe fn find_object_phdr(pc: *mut c_void, out: *mut DlFindObject) -> c_int {
    let mut s = Search {
        pc: pc as usize,
        found: None,
    };
    // SAFETY: the callback only reads the headers glibc passes and writes `s`, which outlives
    // the call.
    unsafe { libc::dl_iterate_phdr(Some(search_cb), (&mut s as *mut Search).cast()) };
    let Some(found) = s.found else {
        return -1;
    };
    // SAFETY: valid for writes (caller).
    unsafe { out.write(found) };
    0
}

struct Search {
    pc: usize,
    found: Option<DlFindObject>,
}

unsafe extern "C" fn search_cb(
    info: *mut libc::dl_phdr_info,
    _size: usize,
    data: *mut c_void,
) -> c_int {
    // SAFETY: glibc passes a valid `dl_phdr_info` and our `Search` back.
    let (info, s) = unsafe { (&*info, &mut *data.cast::<Search>()) };
    if info.dlpi_phdr.is_null() {
        return 0;
    }
    // SAFETY: glibc's program headers of this object, `dlpi_phnum` of them.
    let phdrs = unsafe { std::slice::from_raw_parts(info.dlpi_phdr, usize::from(info.dlpi_phnum)) };
    let base = info.dlpi_addr as usize;
    let (mut lo, mut hi, mut eh, mut hit) = (usize::MAX, 0usize, 0usize, false);
    for ph in phdrs {
        let start = base.wrapping_add(ph.p_vaddr as usize);
        if ph.p_type == libc::PT_LOAD {
            let end = start.wrapping_add(ph.p_memsz as usize);
            lo = lo.min(start);
            hi = hi.max(end);
            hit |= (start..end).contains(&s.pc);
        } else if ph.p_type == libc::PT_GNU_EH_FRAME {
            eh = start;
        }
    }
    if !hit {
        return 0;
    }
    s.found = Some(DlFindObject {
        map_start: lo as *mut c_void,
        map_end: hi as *mut c_void,
        eh_frame: eh as *mut c_void,
        ..DlFindObject::default()
    });
    1
}

// The name the link's `--wrap=_dl_find_object` sends the static unwinder to: a hidden alias
// of `find_object`, so that it is not exported (the version script lists only our exports).
#[cfg(target_arch = "x86_64")]
core::arch::global_asm!(
    ".globl __wrap__dl_find_object",
    ".hidden __wrap__dl_find_object",
    ".type __wrap__dl_find_object,@function",
    "__wrap__dl_find_object:",
    "jmp {f}",
    f = sym find_object,
);

/// Exported self-check: runs the hooks' panic guard around a deliberate panic and returns 1
/// if the panic was caught (the library's unwinder found its frames), so a test or an
/// operator can check the panic guard in a given process and image. The library never calls
/// it. The panic is reported on stderr like one in a hook.
#[no_mangle]
pub extern "C" fn hami_preload_check_unwind() -> c_int {
    crate::ffi::shim::guard(1, || -> c_int {
        panic!("deliberate panic (hami_preload_check_unwind)");
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fallback's answer for `pc`, and glibc's when the running glibc has the function.
    fn both(pc: usize) -> ((c_int, DlFindObject), Option<(c_int, DlFindObject)>) {
        let mut b = DlFindObject::default();
        // SAFETY: valid out pointer.
        let rb = unsafe { find_object_phdr(pc as *mut c_void, &mut b) };
        let real = real_find_object().map(|real| {
            let mut a = DlFindObject::default();
            // SAFETY: valid out pointer.
            let ra = unsafe { real(pc as *mut c_void, &mut a) };
            (ra, a)
        });
        ((rb, b), real)
    }

    #[test]
    fn the_fallback_finds_what_glibc_finds() {
        let here = the_fallback_finds_what_glibc_finds as fn() as usize;
        let libc_fn = libc::getpid as unsafe extern "C" fn() -> libc::pid_t as usize;
        for pc in [here, here + 1, libc_fn] {
            let ((rb, b), real) = both(pc);
            assert_eq!(rb, 0, "pc {pc:#x}");
            assert!(!b.eh_frame.is_null(), "pc {pc:#x}");
            assert!(
                (b.map_start as usize) <= pc && pc < b.map_end as usize,
                "pc {pc:#x}: {b:?}"
            );
            // glibc 2.35+ (the build hosts' and CI's): the same unwind tables.
            if let Some((ra, a)) = real {
                assert_eq!(ra, 0, "pc {pc:#x}");
                assert_eq!(a.eh_frame, b.eh_frame, "pc {pc:#x}");
                assert!((a.map_start as usize) <= pc && pc < a.map_end as usize);
            }
        }
        // Two objects: two different answers.
        assert_ne!(both(here).0 .1.eh_frame, both(libc_fn).0 .1.eh_frame);
    }

    #[test]
    fn an_address_outside_every_object_is_not_found() {
        let heap = Box::new(0u64);
        let pc = &*heap as *const u64 as usize;
        let ((rb, b), real) = both(pc);
        assert_eq!(rb, -1);
        assert!(b.eh_frame.is_null());
        if let Some((ra, _)) = real {
            assert_eq!(ra, -1);
        }
    }

    #[test]
    fn the_self_check_catches_its_panic() {
        assert_eq!(hami_preload_check_unwind(), 1);
    }
}
