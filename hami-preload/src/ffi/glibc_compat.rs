//! The functions glibc before 2.34 kept in `libdl.so.2` and `libpthread.so.0`, reached without
//! naming those libraries.
//!
//! The preload loads into every program of a container (`/etc/ld.so.preload`) on any glibc from
//! 2.17 on (`docs/deploy.md`, "The glibc floor"). Linked against glibc 2.17, its calls to
//! `dlopen`, `dlvsym`, `dladdr`, the `pthread_key` and `pthread_once` functions and the robust
//! mutex family (ours and std's) would bind to `libdl.so.2` and `libpthread.so.0`, and every
//! exec would load those two libraries too: on glibc 2.34 and later they are empty
//! compatibility libraries, and loading them cost an exec of `/bin/true` about 10 page faults
//! and 0.06 ms of CPU (`docs/benchmarks.md`, "Exec cost of the preload").
//!
//! So the link sends every reference to those functions (`build.rs`: `--wrap=<name>` for each
//! of [`WRAPPED`]) to a wrapper here, which calls the function found at run time in whichever
//! of `libc.so.6` (glibc 2.34 and later), `libpthread.so.0` or `libdl.so.2` (older ones) the
//! process has loaded: a symbol lookup in the loaded objects' own tables ([`lookup`], through
//! `dl_iterate_phdr`, which `libc.so.6` has had since 2.2.5), done once per function at its
//! first call, never at load. On an older glibc a process that uses CUDA or NVML has both
//! libraries loaded (the driver, NVML and every program that calls `dlopen` or creates threads
//! link them); if one is not (yet) loaded, the wrapper answers as the function's failure
//! (`NULL`, `ENOSYS`: the region stays closed, fail closed) and looks again at the next call.
//! `pthread_once` runs the routine itself in that case (std's unwinder setup calls it).

use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};

/// The libraries searched, by file name: glibc 2.34 and later define everything in
/// `libc.so.6`, older ones in the two others.
const HOMES: &[&[u8]] = &[b"libc.so.6", b"libpthread.so.0", b"libdl.so.2"];

/// A symbol found by [`lookup`]: its address.
fn find(name: &CStr) -> Option<usize> {
    struct Search<'a> {
        name: &'a [u8],
        found: Option<usize>,
    }
    unsafe extern "C" fn each(
        info: *mut libc::dl_phdr_info,
        _size: libc::size_t,
        data: *mut c_void,
    ) -> c_int {
        // SAFETY: `data` is the `Search` passed below; `info` is the loader's, valid for the
        // callback.
        let (s, info) = unsafe { (&mut *(data as *mut Search), &*info) };
        if info.dlpi_name.is_null() {
            return 0;
        }
        // SAFETY: the loader's NUL-terminated object name.
        let path = unsafe { CStr::from_ptr(info.dlpi_name) }.to_bytes();
        let file = path.rsplit(|&b| b == b'/').next().unwrap_or(path);
        if !HOMES.contains(&file) {
            return 0;
        }
        // SAFETY: a loaded object's program headers, as the loader reports them.
        match unsafe { lookup(info, s.name) } {
            Some(a) => {
                s.found = Some(a);
                1
            }
            None => 0,
        }
    }
    let mut s = Search {
        name: name.to_bytes(),
        found: None,
    };
    // SAFETY: `each` only reads what the loader hands it; `s` outlives the call.
    unsafe { libc::dl_iterate_phdr(Some(each), (&mut s as *mut Search).cast()) };
    s.found
}

/// `Elf64_Dyn`.
#[repr(C)]
struct Dyn {
    tag: i64,
    val: u64,
}

/// `Elf64_Sym`.
#[repr(C)]
struct Sym {
    name: u32,
    info: u8,
    other: u8,
    shndx: u16,
    value: u64,
    size: u64,
}

const DT_NULL: i64 = 0;
const DT_STRTAB: i64 = 5;
const DT_SYMTAB: i64 = 6;
const DT_GNU_HASH: i64 = 0x6fff_fef5;
const DT_VERSYM: i64 = 0x6fff_fff0;
const STT_FUNC: u8 = 2;
const VERSYM_HIDDEN: u16 = 0x8000;

/// GNU hash of `name` (the loader's `dl_new_hash`).
fn gnu_hash(name: &[u8]) -> u32 {
    name.iter()
        .fold(5381u32, |h, &c| h.wrapping_mul(33).wrapping_add(c as u32))
}

/// The address of the function `name` that the object of `info` defines, through its GNU hash
/// table: its default version when it has several (`name@@VERSION` over compatibility ones),
/// else the first. Only plain functions (`STT_FUNC`): an indirect function would need its
/// resolver run, and none of [`WRAPPED`] is one.
///
/// # Safety
/// `info` describes an object the loader has mapped.
unsafe fn lookup(info: &libc::dl_phdr_info, name: &[u8]) -> Option<usize> {
    let base = info.dlpi_addr as usize;
    // SAFETY: the loader's program headers, `dlpi_phnum` of them.
    let phdrs = unsafe { std::slice::from_raw_parts(info.dlpi_phdr, info.dlpi_phnum as usize) };
    let dynamic = phdrs.iter().find(|p| p.p_type == libc::PT_DYNAMIC)?;
    let mut dynp = (base + dynamic.p_vaddr as usize) as *const Dyn;
    // The loader relocates these entries in place on x86-64 and arm64; an unrelocated one
    // (below the load address) is an offset.
    let addr = |v: u64| -> usize {
        let v = v as usize;
        if v < base {
            base + v
        } else {
            v
        }
    };
    let (mut strtab, mut symtab, mut gnu, mut versym) = (0usize, 0usize, 0usize, 0usize);
    loop {
        // SAFETY: the object's dynamic section, terminated by DT_NULL.
        let d = unsafe { &*dynp };
        match d.tag {
            DT_NULL => break,
            DT_STRTAB => strtab = addr(d.val),
            DT_SYMTAB => symtab = addr(d.val),
            DT_GNU_HASH => gnu = addr(d.val),
            DT_VERSYM => versym = addr(d.val),
            _ => {}
        }
        // SAFETY: not past DT_NULL.
        dynp = unsafe { dynp.add(1) };
    }
    if strtab == 0 || symtab == 0 || gnu == 0 {
        return None;
    }
    let h = gnu_hash(name);
    let words = gnu as *const u32;
    // SAFETY: the GNU hash table's header: nbuckets, symoffset, bloom size, bloom shift.
    let (nbuckets, symoffset, bloom_size) =
        unsafe { (*words, *words.add(1), *words.add(2) as usize) };
    if nbuckets == 0 {
        return None;
    }
    // Buckets follow the bloom filter (64-bit words), the chain follows the buckets.
    let buckets = (gnu + 16 + bloom_size * 8) as *const u32;
    // SAFETY: `nbuckets` buckets.
    let mut ix = unsafe { *buckets.add((h % nbuckets) as usize) };
    if ix < symoffset {
        return None;
    }
    // SAFETY: the chain array follows the buckets.
    let chain = unsafe { buckets.add(nbuckets as usize) };
    let mut fallback = None;
    loop {
        // SAFETY: chain entries exist for every symbol from `symoffset` on, up to the one
        // with the end bit.
        let h2 = unsafe { *chain.add((ix - symoffset) as usize) };
        if (h | 1) == (h2 | 1) {
            // SAFETY: symbol `ix` of the object's symbol table.
            let sym = unsafe { &*(symtab as *const Sym).add(ix as usize) };
            // SAFETY: the symbol's NUL-terminated name in the string table.
            let sname = unsafe { CStr::from_ptr((strtab + sym.name as usize) as *const c_char) };
            if sname.to_bytes() == name
                && sym.shndx != 0
                && sym.value != 0
                && sym.info & 0xf == STT_FUNC
            {
                let at = base + sym.value as usize;
                let hidden = versym != 0
                    // SAFETY: one version entry per symbol.
                    && unsafe { *(versym as *const u16).add(ix as usize) } & VERSYM_HIDDEN != 0;
                if !hidden {
                    return Some(at);
                }
                fallback.get_or_insert(at);
            }
        }
        if h2 & 1 != 0 {
            return fallback;
        }
        ix += 1;
    }
}

/// One wrapped function: its name and the address found (0: not yet).
struct Real {
    name: &'static CStr,
    addr: AtomicUsize,
}

impl Real {
    const fn new(name: &'static CStr) -> Real {
        Real {
            name,
            addr: AtomicUsize::new(0),
        }
    }

    /// The function, found once; `None` while no loaded library defines it.
    fn get<F: Copy>(&self) -> Option<F> {
        const { assert!(std::mem::size_of::<F>() == std::mem::size_of::<usize>()) };
        let mut a = self.addr.load(Ordering::Acquire);
        if a == 0 {
            a = find(self.name)?;
            self.addr.store(a, Ordering::Release);
        }
        // SAFETY: `a` is the address of the C function `name`, whose type `F` is (each
        // wrapper below names the prototype of its function).
        Some(unsafe { std::mem::transmute_copy::<usize, F>(&a) })
    }
}

/// Defines, for each function, its [`Real`], a wrapper with the function's C prototype that
/// calls it (or answers `$missing` when no loaded library defines it), and the hidden symbol
/// `__wrap_<name>` that the link's `--wrap=<name>` sends every reference to.
macro_rules! wrapped {
    ($($name:ident: fn($($arg:ident: $ty:ty),*) -> $ret:ty = $missing:expr;)*) => {
        /// The functions whose references the link sends here (`build.rs` passes
        /// `--wrap=<name>` for each; `tests/preload/load.rs` checks that the library imports
        /// none).
        pub const WRAPPED: &[&str] = &[$(stringify!($name)),*];

        mod reals {
            use super::Real;
            $(
                #[allow(non_upper_case_globals)]
                pub(super) static $name: Real = Real::new(
                    match std::ffi::CStr::from_bytes_with_nul(
                        concat!(stringify!($name), "\0").as_bytes(),
                    ) {
                        Ok(c) => c,
                        Err(_) => panic!("a C name"),
                    },
                );
            )*
        }

        /// The wrappers (`__wrap_<name>` jumps to each).
        pub mod wrappers {
            #[allow(unused_imports)]
            use super::*;
            $(
                #[doc = concat!("`", stringify!($name), "`, found at run time.")]
                ///
                /// # Safety
                /// The C function's contract.
                pub unsafe extern "C" fn $name($($arg: $ty),*) -> $ret {
                    match super::reals::$name.get::<unsafe extern "C" fn($($ty),*) -> $ret>() {
                        // SAFETY: forwarded arguments, the caller's contract.
                        Some(f) => unsafe { f($($arg),*) },
                        None => $missing,
                    }
                }
            )*
        }

        $(
            #[cfg(target_arch = "x86_64")]
            core::arch::global_asm!(
                concat!(".globl __wrap_", stringify!($name)),
                concat!(".hidden __wrap_", stringify!($name)),
                concat!(".type __wrap_", stringify!($name), ",@function"),
                concat!("__wrap_", stringify!($name), ":"),
                "jmp {f}",
                f = sym wrappers::$name,
            );
            #[cfg(target_arch = "aarch64")]
            core::arch::global_asm!(
                concat!(".globl __wrap_", stringify!($name)),
                concat!(".hidden __wrap_", stringify!($name)),
                concat!(".type __wrap_", stringify!($name), ",%function"),
                concat!("__wrap_", stringify!($name), ":"),
                "b {f}",
                f = sym wrappers::$name,
            );
        )*
    };
}

use libc::{pthread_key_t, pthread_mutex_t, pthread_mutexattr_t, pthread_once_t, timespec};

type Dtor = Option<unsafe extern "C" fn(*mut c_void)>;
type Init = Option<unsafe extern "C" fn()>;

wrapped! {
    dlopen: fn(file: *const c_char, mode: c_int) -> *mut c_void = std::ptr::null_mut();
    dlvsym: fn(handle: *mut c_void, name: *const c_char, version: *const c_char) -> *mut c_void
        = std::ptr::null_mut();
    dladdr: fn(addr: *const c_void, info: *mut libc::Dl_info) -> c_int = 0;
    pthread_key_create: fn(key: *mut pthread_key_t, dtor: Dtor) -> c_int = libc::EAGAIN;
    __pthread_key_create: fn(key: *mut pthread_key_t, dtor: Dtor) -> c_int = libc::EAGAIN;
    pthread_key_delete: fn(key: pthread_key_t) -> c_int = libc::EINVAL;
    pthread_setspecific: fn(key: pthread_key_t, value: *const c_void) -> c_int = libc::EINVAL;
    pthread_once: fn(once: *mut pthread_once_t, init: Init) -> c_int
        // SAFETY: the caller's control word, as for `pthread_once`.
        = unsafe { once_without_libpthread(once, init) };
    pthread_mutex_consistent: fn(m: *mut pthread_mutex_t) -> c_int = libc::ENOSYS;
    pthread_mutex_timedlock: fn(m: *mut pthread_mutex_t, t: *const timespec) -> c_int
        = libc::ENOSYS;
    pthread_mutex_trylock: fn(m: *mut pthread_mutex_t) -> c_int = libc::ENOSYS;
    pthread_mutexattr_init: fn(a: *mut pthread_mutexattr_t) -> c_int = libc::ENOSYS;
    pthread_mutexattr_destroy: fn(a: *mut pthread_mutexattr_t) -> c_int = libc::ENOSYS;
    pthread_mutexattr_setpshared: fn(a: *mut pthread_mutexattr_t, shared: c_int) -> c_int
        = libc::ENOSYS;
    pthread_mutexattr_setrobust: fn(a: *mut pthread_mutexattr_t, robust: c_int) -> c_int
        = libc::ENOSYS;
}

/// `pthread_once` where no loaded library has it (an older glibc, a program without
/// threads): runs `init` once, other callers wait for it to finish. The control word is
/// `PTHREAD_ONCE_INIT` (0) until then; 1 while running, 2 when done.
///
/// # Safety
/// `once` is a valid `pthread_once_t` initialised to `PTHREAD_ONCE_INIT`.
unsafe fn once_without_libpthread(once: *mut pthread_once_t, init: Init) -> c_int {
    if once.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: `pthread_once_t` is a C `int` on glibc, aligned for an atomic u32.
    let word = unsafe { &*(once as *const AtomicU32) };
    loop {
        match word.compare_exchange(0, 1, Ordering::Acquire, Ordering::Acquire) {
            Ok(_) => {
                if let Some(f) = init {
                    // SAFETY: the caller's routine.
                    unsafe { f() };
                }
                word.store(2, Ordering::Release);
                return 0;
            }
            Err(2) => return 0,
            Err(_) => std::thread::yield_now(),
        }
    }
}

// The names `build.rs` passes to `--wrap` (`WRAPPED_BY_LINK`).
include!(concat!(env!("OUT_DIR"), "/glibc_wrapped.rs"));

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lookup_finds_what_the_loader_finds() {
        // Through the loader (`dlsym`, this test binary's own libc) and through our table
        // lookup: the same function.
        for name in [
            c"pthread_key_create",
            c"pthread_mutex_trylock",
            c"dlopen",
            c"dladdr",
        ] {
            // SAFETY: a C string; RTLD_DEFAULT.
            let by_loader = unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) } as usize;
            assert_ne!(by_loader, 0, "{name:?}");
            assert_eq!(find(name), Some(by_loader), "{name:?}");
        }
        assert_eq!(find(c"hami_no_such_function"), None);
    }

    #[test]
    fn the_wrappers_call_the_real_functions() {
        let mut key: pthread_key_t = 0;
        // SAFETY: a valid key out-parameter, no destructor.
        assert_eq!(unsafe { wrappers::pthread_key_create(&mut key, None) }, 0);
        // SAFETY: the key just created.
        let set = unsafe { wrappers::pthread_setspecific(key, 7 as *const c_void) };
        assert_eq!(set, 0);
        // SAFETY: read back through libc itself.
        assert_eq!(unsafe { libc::pthread_getspecific(key) } as usize, 7);
        // SAFETY: the key just created.
        assert_eq!(unsafe { wrappers::pthread_key_delete(key) }, 0);
        // SAFETY: `Dl_info` is plain C data (pointers), valid when zeroed.
        let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
        let here = gnu_hash as *const c_void;
        // SAFETY: an address of this binary, a valid out-parameter.
        assert_ne!(unsafe { wrappers::dladdr(here, &mut info) }, 0);
        assert!(!info.dli_fname.is_null());
    }

    #[test]
    fn once_without_libpthread_runs_the_routine_once() {
        static RUNS: AtomicU32 = AtomicU32::new(0);
        unsafe extern "C" fn init() {
            RUNS.fetch_add(1, Ordering::SeqCst);
        }
        let mut once: pthread_once_t = libc::PTHREAD_ONCE_INIT;
        let p = &mut once as *mut pthread_once_t as usize;
        let threads: Vec<_> = (0..4)
            .map(|_| {
                std::thread::spawn(move || {
                    // SAFETY: a valid control word that outlives the threads (joined below).
                    unsafe { once_without_libpthread(p as *mut pthread_once_t, Some(init)) }
                })
            })
            .collect();
        for t in threads {
            assert_eq!(t.join().unwrap(), 0);
        }
        assert_eq!(RUNS.load(Ordering::SeqCst), 1);
        assert_eq!(once, 2);
    }

    #[test]
    fn the_link_wraps_exactly_the_wrapped_functions() {
        let mut by_link = WRAPPED_BY_LINK.to_vec();
        let mut here = WRAPPED.to_vec();
        by_link.sort_unstable();
        here.sort_unstable();
        assert_eq!(by_link, here);
    }

    #[test]
    fn gnu_hash_is_the_loaders() {
        // Values of the GNU hash function from its specification's examples.
        assert_eq!(gnu_hash(b""), 5381);
        assert_eq!(gnu_hash(b"printf"), 0x156b_2bb8);
    }
}
