//! The mini driver and the mini program: a C `libcuda.so.1` defining every probed row of
//! [`INTERCEPTS`] by its [`Shape`], the program that calls each with known
//! arguments ([`Scenario`]), the events each call must produce, and their build.

use std::path::{Path, PathBuf};
use std::time::Duration;

use hami_abi::array::{array_footprint, mipmap_footprint};
use hami_abi::event::{Event, EventKind};
use hami_abi::intercept::{Intercept, Shape, INTERCEPTS, PROBED_NAMES};

use crate::common::compile_c;

/// The CUDA types both the mini driver and the mini program use (prepended to each), and
/// `mini_next`, which the program calls before each driver call to say what the call writes
/// to its out-parameter and returns.
pub(super) const MINI_TYPES: &str = r#"
#include <stddef.h>
typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef struct CUctx_st *CUcontext;
typedef struct CUarray_st *CUarray;
typedef struct CUmipmappedArray_st *CUmipmappedArray;
typedef int CUdevice;
typedef unsigned long long CUmemGenericAllocationHandle;
typedef struct { size_t Width, Height; unsigned Format, NumChannels; } CUDA_ARRAY_DESCRIPTOR;
typedef struct { size_t Width, Height, Depth; unsigned Format, NumChannels, Flags; } CUDA_ARRAY3D_DESCRIPTOR;
typedef struct { unsigned type, requestedHandleTypes; struct { unsigned type; int id; } location; void *win32; unsigned char flags[8]; } CUmemAllocationProp;
void mini_next(unsigned long long out, CUresult rc);
"#;

/// The mini driver's state: what the next call writes and returns (set by `mini_next`).
pub(super) const MINI_NEXT: &str = r#"
static unsigned long long next_out;
static CUresult next_rc;
void mini_next(unsigned long long out, CUresult rc) { next_out = out; next_rc = rc; }
"#;

/// `Array2d`'s descriptor: width, height, format, channels (float4, 1024 x 1024).
pub(super) const DESC_2D: (u64, u64, u32, u32) = (1024, 1024, 0x20, 4);
/// `Array3d`'s descriptor: width, height, depth, format, channels (half2, 100^3).
pub(super) const DESC_3D: (u64, u64, u64, u32, u32) = (100, 100, 100, 0x02, 2);
/// `Mipmapped`'s descriptor and level count (2D float4, 256 x 128, 3 levels).
pub(super) const DESC_MIP: (u64, u64, u64, u32, u32, u32) = (256, 128, 0, 0x20, 4, 3);
/// `Pitch`'s width, height and element size; the mini driver rounds the pitch up to 512.
pub(super) const PITCH_ARGS: (u64, u64, u32) = (1000, 10, 4);
/// The pitch the mini driver returns for [`PITCH_ARGS`].
pub(super) const PITCH: u64 = (PITCH_ARGS.0 + 511) & !511;

/// A function of `shape` in C: its parameters (the driver's definition and the program's
/// declaration share them) and the driver's body, which writes the object announced by
/// `mini_next` to the out-parameter (whether the call succeeds or not, so that a probe that
/// ignored the result would report it) and returns the result announced.
pub(super) fn shape_c(shape: Shape) -> (String, &'static str) {
    match shape {
        Shape::OutSize => (
            "CUdeviceptr *out, size_t size".into(),
            "*out = next_out; return next_rc;",
        ),
        Shape::Pitch => (
            "CUdeviceptr *out, size_t *pitch, size_t width, size_t height, unsigned elem".into(),
            "*pitch = (width + 511) & ~(size_t)511; *out = next_out; return next_rc;",
        ),
        Shape::MemCreate => (
            "CUmemGenericAllocationHandle *out, size_t size, const CUmemAllocationProp *prop, \
             unsigned long long flags"
                .into(),
            "*out = next_out; return next_rc;",
        ),
        Shape::Array2d => (
            "CUarray *out, const CUDA_ARRAY_DESCRIPTOR *desc".into(),
            "*out = (CUarray)next_out; return next_rc;",
        ),
        Shape::Array3d => (
            "CUarray *out, const CUDA_ARRAY3D_DESCRIPTOR *desc".into(),
            "*out = (CUarray)next_out; return next_rc;",
        ),
        Shape::Mipmapped => (
            "CUmipmappedArray *out, const CUDA_ARRAY3D_DESCRIPTOR *desc, unsigned levels".into(),
            "*out = (CUmipmappedArray)next_out; return next_rc;",
        ),
        Shape::Value => ("unsigned long long value".into(), "return next_rc;"),
        Shape::CtxOut { dev_arg } => {
            let fillers: String = (1..dev_arg)
                .map(|i| format!(", unsigned long long a{i}"))
                .collect();
            (
                format!("CUcontext *out{fillers}, CUdevice dev"),
                "*out = (CUcontext)next_out; return next_rc;",
            )
        }
    }
}

/// The C locals and arguments of a call of a function of `shape` with `a` (`o` is the
/// out-parameter, declared by [`c_call`]).
pub(super) fn shape_call(shape: Shape, a: &Args) -> (String, String) {
    match shape {
        Shape::OutSize => (String::new(), format!("(void *)&o, {}", a.size)),
        Shape::Pitch => {
            let (w, h, e) = PITCH_ARGS;
            (
                " size_t pitch = 0;".into(),
                format!("(void *)&o, &pitch, {w}, {h}, {e}"),
            )
        }
        Shape::MemCreate => (
            format!(
                " CUmemAllocationProp prop = {{ 1, 0, {{ 1, {} }}, 0, {{0}} }};",
                a.dev
            ),
            format!("(void *)&o, {}, &prop, 0", a.size),
        ),
        Shape::Array2d => {
            let (w, h, f, c) = DESC_2D;
            (
                format!(" CUDA_ARRAY_DESCRIPTOR d = {{ {w}, {h}, {f}, {c} }};"),
                "(void *)&o, &d".into(),
            )
        }
        Shape::Array3d => {
            let (w, h, d, f, c) = DESC_3D;
            (
                format!(" CUDA_ARRAY3D_DESCRIPTOR d = {{ {w}, {h}, {d}, {f}, {c}, 0 }};"),
                "(void *)&o, &d".into(),
            )
        }
        Shape::Mipmapped => {
            let (w, h, d, f, c, levels) = DESC_MIP;
            (
                format!(" CUDA_ARRAY3D_DESCRIPTOR d = {{ {w}, {h}, {d}, {f}, {c}, 0 }};"),
                format!("(void *)&o, &d, {levels}"),
            )
        }
        Shape::Value => (String::new(), format!("{:#x}ULL", a.value)),
        Shape::CtxOut { dev_arg } => {
            // Arguments other than the device differ from it, so a probe that read another
            // position would send another device.
            let fillers: String = (1..dev_arg)
                .map(|i| format!(", {:#x}ULL", 0xdead_0000_u64 + u64::from(i)))
                .collect();
            (String::new(), format!("(void *)&o{fillers}, {}", a.dev))
        }
    }
}

/// The known arguments of one call; each shape uses those it takes.
#[derive(Clone, Copy, Debug)]
pub(super) struct Args {
    /// What the driver writes to the out-parameter: the object made.
    obj: u64,
    /// The size argument (`OutSize`, `MemCreate`).
    size: u64,
    /// The `CUdevice` (`CtxOut`), or the location of `MemCreate`'s properties.
    dev: u32,
    /// The by-value argument (`Value`).
    value: u64,
}

/// The thread of the mini program a call runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Thread {
    /// The main thread (its tid is the pid).
    Main,
    /// A second thread, started and joined once by the main thread.
    Other,
}

/// One call of the mini program.
#[derive(Clone, Copy, Debug)]
pub(super) struct Call {
    pub(super) row: &'static Intercept,
    args: Args,
    /// The driver refuses the call (returns 1): no event.
    pub(super) fails: bool,
    thread: Thread,
}

/// The fields of the event a call's probe must send.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Fields {
    pub(super) kind: EventKind,
    pub(super) addr: u64,
    pub(super) size: u64,
    pub(super) ctx: u64,
    pub(super) extra: u64,
}

/// The event the probe of `c` sends, if any, from its row's shape and kind; `cur` is the
/// current context of the call's thread, updated as the probes track it. Each arm is what
/// the shape's eBPF helpers promise (`hami-ebpf/src/main.rs`, `ret_of`): a new shape or a
/// new shape and kind pair needs its arm here, a new row of an existing pair nothing.
pub(super) fn expected_event(c: &Call, cur: &mut u64) -> Option<Fields> {
    if c.fails {
        return None;
    }
    let probe = c.row.probe.expect("a probed row");
    let (kind, a) = (probe.kind, c.args);
    let (addr, size, ctx, extra) = match (probe.shape, kind) {
        (Shape::OutSize, k) if k.is_alloc() => (a.obj, a.size, *cur, 0),
        // The pitch the driver returned times the height; extra = the pitch.
        (Shape::Pitch, k) if k.is_alloc() => (a.obj, PITCH * PITCH_ARGS.1, *cur, PITCH),
        // extra = the device of the allocation properties' location.
        (Shape::MemCreate, k) if k.is_alloc() => (a.obj, a.size, *cur, u64::from(a.dev)),
        (Shape::Array2d, k) if k.is_alloc() => {
            let (w, h, f, ch) = DESC_2D;
            (a.obj, array_footprint(w, h, 0, f, ch), *cur, 0)
        }
        (Shape::Array3d, k) if k.is_alloc() => {
            let (w, h, d, f, ch) = DESC_3D;
            (a.obj, array_footprint(w, h, d, f, ch), *cur, 0)
        }
        (Shape::Mipmapped, k) if k.is_alloc() => {
            let (w, h, d, f, ch, levels) = DESC_MIP;
            let size = mipmap_footprint(w, h, d, f, ch, levels, false);
            (a.obj, size, *cur, 0)
        }
        (Shape::Value, k) if k.is_free() => (a.value, 0, *cur, 0),
        // A created context becomes the thread's current one.
        (Shape::CtxOut { .. }, EventKind::CtxCreate) => {
            *cur = a.obj;
            (a.obj, 0, a.obj, u64::from(a.dev))
        }
        (Shape::CtxOut { .. }, EventKind::PrimaryCtxRetain) => (a.obj, 0, *cur, u64::from(a.dev)),
        // Destroying the current context leaves none current.
        (Shape::Value, EventKind::CtxDestroy) => {
            let was = *cur;
            if was == a.value {
                *cur = 0;
            }
            (a.value, 0, was, 0)
        }
        // extra = the device (a `CUdevice`: the low 32 bits of the argument).
        (Shape::Value, EventKind::PrimaryCtxRelease) => (0, 0, *cur, a.value as u32 as u64),
        // Setting the context that is already current sends nothing.
        (Shape::Value, EventKind::CtxSetCurrent) if a.value == *cur => return None,
        (Shape::Value, EventKind::CtxSetCurrent) => {
            *cur = a.value;
            (a.value, 0, a.value, 0)
        }
        (shape, kind) => panic!(
            "{}: no expected event for shape {shape:?} and kind {kind:?}: add one here with \
             its eBPF helpers",
            c.row.name
        ),
    };
    Some(Fields {
        kind,
        addr,
        size,
        ctx,
        extra,
    })
}

/// The calls of the mini program, with distinct known arguments.
#[derive(Default)]
pub(super) struct Scenario {
    calls: Vec<Call>,
    n: u64,
}

impl Scenario {
    /// Adds a call of `row` on `thread` with fresh arguments (adjusted by `set`); returns
    /// them.
    fn call(
        &mut self,
        thread: Thread,
        row: &'static Intercept,
        set: impl FnOnce(&mut Args),
    ) -> Args {
        self.push(thread, row, false, set)
    }

    /// Adds a call of `row` that the driver refuses.
    fn fail(&mut self, thread: Thread, row: &'static Intercept) {
        self.push(thread, row, true, |_| ());
    }

    fn push(
        &mut self,
        thread: Thread,
        row: &'static Intercept,
        fails: bool,
        set: impl FnOnce(&mut Args),
    ) -> Args {
        self.n += 1;
        let n = self.n;
        // Objects and values are distinct, with high bits set (a `CUdevice` taken from a
        // value keeps only the low 32 bits) and low bits set; devices are never 0 unless
        // chosen.
        let mut args = Args {
            obj: 0x7f10_0000_0000 | n << 16,
            size: n << 12,
            dev: 1 + (n % 7) as u32,
            value: 0x7f20_0000_0000 | n << 16,
        };
        set(&mut args);
        self.calls.push(Call {
            row,
            args,
            fails,
            thread,
        });
        args
    }
}

/// The first probed row that `pick` accepts (the context story of [`scenario`] needs a row of
/// each context kind and of an allocation and a release).
pub(super) fn first_probed(what: &str, pick: impl Fn(&Intercept) -> bool) -> &'static Intercept {
    INTERCEPTS
        .iter()
        .find(|r| r.is_probed() && pick(r))
        .unwrap_or_else(|| panic!("no probed row {what} in INTERCEPTS"))
}

/// The first probed row of `kind`.
pub(super) fn of_kind(kind: EventKind) -> &'static Intercept {
    first_probed(&format!("of kind {kind:?}"), |r| r.kind() == Some(kind))
}

/// What the mini program calls, in order.
pub(super) fn scenario() -> Vec<Call> {
    use EventKind::*;
    use Thread::{Main, Other};
    let alloc = first_probed("allocating with shape OutSize", |r| {
        r.probe
            .is_some_and(|p| p.shape == Shape::OutSize && p.kind.is_alloc())
    });
    let free = first_probed("releasing with shape Value", |r| {
        r.probe
            .is_some_and(|p| p.shape == Shape::Value && p.kind.is_free())
    });
    let mut s = Scenario::default();
    // A primary context made current: the calls after it carry it.
    let pctx = s.call(Main, of_kind(PrimaryCtxRetain), |a| a.dev = 1).obj;
    s.call(Main, of_kind(CtxSetCurrent), |a| a.value = pctx);
    // Every probed row, by its shape: refused by the driver (no event, although the driver
    // wrote the out-parameter), then successful.
    for row in INTERCEPTS.iter().filter(|r| r.is_probed()) {
        s.fail(Main, row);
        s.call(Main, row, |_| ());
    }
    // Current contexts are per thread: a context created here is current for this thread's
    // next calls ...
    let ctx2 = s.call(Main, of_kind(CtxCreate), |a| a.dev = 0).obj;
    let in2 = s.call(Main, alloc, |_| ()).obj;
    // ... while another thread makes its own primary context current (setting it again
    // sends nothing) ...
    let tctx = s.call(Other, of_kind(PrimaryCtxRetain), |a| a.dev = 0).obj;
    s.call(Other, of_kind(CtxSetCurrent), |a| a.value = tctx);
    s.call(Other, of_kind(CtxSetCurrent), |a| a.value = tctx);
    let tptr = s.call(Other, alloc, |_| ()).obj;
    // ... and this thread still has its own.
    let in3 = s.call(Main, alloc, |_| ()).obj;
    for p in [in3, tptr, in2] {
        s.call(Main, free, |a| a.value = p);
    }
    s.call(Main, of_kind(CtxSetCurrent), |a| a.value = ctx2);
    // Destroying the current context leaves none current.
    s.call(Main, of_kind(CtxDestroy), |a| a.value = ctx2);
    s.call(Main, alloc, |_| ());
    s.call(Main, of_kind(PrimaryCtxRelease), |a| a.value = 1);
    s.calls
}

/// The events the probes must send for `calls`, in order, with the thread of each.
pub(super) fn expected_events(calls: &[Call]) -> Vec<(Thread, Fields, &'static str)> {
    let (mut main_ctx, mut other_ctx) = (0, 0);
    calls
        .iter()
        .filter_map(|c| {
            let cur = match c.thread {
                Thread::Main => &mut main_ctx,
                Thread::Other => &mut other_ctx,
            };
            expected_event(c, cur).map(|f| (c.thread, f, c.row.name))
        })
        .collect()
}

/// The mini driver's C source: every probed row by its shape, but `left_out`.
pub(super) fn mini_driver(left_out: Option<&str>) -> String {
    let mut c = format!("{MINI_TYPES}{MINI_NEXT}");
    for row in INTERCEPTS.iter().filter(|r| r.is_probed()) {
        if Some(row.name) == left_out {
            continue;
        }
        let (params, body) = shape_c(row.probe.unwrap().shape);
        c += &format!("CUresult {}({params}) {{ {body} }}\n", row.name);
    }
    c
}

/// One call in C: announce the object and result, call, and report a result or an
/// out-parameter other than announced (the program then exits with 1).
pub(super) fn c_call(i: usize, c: &Call) -> String {
    let shape = c.row.probe.unwrap().shape;
    let (locals, args) = shape_call(shape, &c.args);
    let rc = u32::from(c.fails);
    let out_check = match shape {
        Shape::Value => String::new(),
        _ => format!(" || o != {:#x}ULL", c.args.obj),
    };
    format!(
        "    {{ unsigned long long o = 0;{locals} mini_next({obj:#x}ULL, {rc}); \
         if ({name}({args}) != {rc}{out_check}) fail(\"call {i}: {name}\"); }}\n",
        obj = c.args.obj,
        name = c.row.name,
    )
}

/// The mini program's C source: `calls` in order; the calls on [`Thread::Other`] (one run)
/// run on a thread the main thread starts and joins at their place.
pub(super) fn mini_program(calls: &[Call]) -> String {
    let mut c = format!(
        "{MINI_TYPES}#include <stdio.h>\n#include <pthread.h>\n\
         static int failed;\n\
         static void fail(const char *what) {{ fprintf(stderr, \"%s\\n\", what); failed = 1; }}\n"
    );
    for row in INTERCEPTS.iter().filter(|r| r.is_probed()) {
        let (params, _) = shape_c(row.probe.unwrap().shape);
        c += &format!("CUresult {}({params});\n", row.name);
    }
    let (mut main, mut other) = (String::new(), String::new());
    let mut thread_done = false;
    for (i, call) in calls.iter().enumerate() {
        match call.thread {
            Thread::Main => {
                if !other.is_empty() && !thread_done {
                    main += "    { pthread_t th; if (pthread_create(&th, 0, other_thread, 0) \
                             || pthread_join(th, 0)) return 2; }\n";
                    thread_done = true;
                }
                main += &c_call(i, call);
            }
            Thread::Other => {
                assert!(!thread_done, "the other thread's calls are one run");
                other += &c_call(i, call);
            }
        }
    }
    c += &format!("static void *other_thread(void *arg) {{\n{other}    return 0;\n}}\n");
    c += &format!("int main(void) {{\n{main}    return failed;\n}}\n");
    c
}

/// Compile the mini driver (all probed rows but `left_out`) into `dir/lib/libcuda.so.1`.
pub(super) fn build_mini_driver(dir: &Path, left_out: Option<&str>) -> PathBuf {
    let lib_dir = dir.join("lib");
    std::fs::create_dir_all(&lib_dir).unwrap();
    let lib = lib_dir.join("libcuda.so.1");
    compile_c(
        &mini_driver(left_out),
        &lib,
        &["-shared", "-fPIC", "-Wl,-soname,libcuda.so.1"],
    );
    lib
}

/// Build the mini driver and the program of [`scenario`] in a fresh directory; return
/// (libcuda, program).
pub(super) fn build_mini(tmp: &Path) -> (PathBuf, PathBuf) {
    let lib = build_mini_driver(tmp, None);
    let prog = tmp.join("prog");
    compile_c(
        &mini_program(&scenario()),
        &prog,
        &[
            lib.to_str().unwrap(),
            &format!("-Wl,-rpath,{}", lib.parent().unwrap().display()),
            "-pthread",
        ],
    );
    (lib, prog)
}

/// Receive events until the process `pid` exits (its ProcessExit event), or panic after 10 s.
pub(super) async fn events_of(rx: &mut tokio::sync::mpsc::Receiver<Event>, pid: u32) -> Vec<Event> {
    let mut out = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let ev = tokio::time::timeout_at(deadline, rx.recv())
            .await
            .unwrap_or_else(|_| panic!("no ProcessExit for pid {pid} within 10 s; got {out:#?}"))
            .expect("event channel closed");
        if ev.tgid != pid {
            continue;
        }
        let done = ev.kind == EventKind::ProcessExit;
        out.push(ev);
        if done {
            return out;
        }
    }
}

/// An event's kind.
pub(super) fn kind(ev: &Event) -> EventKind {
    ev.kind
}

/// The functions a C source defines (`CUresult name(...) {` at the start of a line).
pub(super) fn defined_functions(c: &str) -> Vec<&str> {
    c.lines()
        .filter(|l| l.trim_end().ends_with('}'))
        .filter_map(|l| l.strip_prefix("CUresult "))
        .filter_map(|l| l.split_once('(').map(|(name, _)| name.trim()))
        .collect()
}

/// The probed row the partial mini driver leaves out (one in the middle of the table).
pub(super) fn left_out_row() -> &'static str {
    PROBED_NAMES[PROBED_NAMES.len() / 2]
}
