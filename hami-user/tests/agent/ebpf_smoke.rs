//! eBPF smoke tests: load the real probes into the kernel, attach them to a libcuda file,
//! run a process that calls it, and check the events. Needs root (CI runs as root); never
//! skipped: without root these tests fail and say why.
//!
//! `mini_driver_*` use a tiny C `libcuda.so.1` compiled here and a program that calls it,
//! both generated from the table: the driver defines every probed row of
//! [`intercept::INTERCEPTS`] by its [`Shape`] ([`shape_c`]: it writes the object the program
//! announced to its out-parameter and returns the result announced), and the program calls
//! each with known arguments ([`Scenario`]), so that each probe's arguments, out-parameters,
//! event kind and the "only successful calls" rule are checked exactly, with no line per
//! function: a new row of an existing shape is tested as it is.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use hami_common::array::{array_footprint, mipmap_footprint};
use hami_common::event::{Event, EventKind};
use hami_common::intercept::{self, Intercept, Shape, INTERCEPTS, PROBED_NAMES};
use hami_user::probes::{DiscoveryOptions, ProbeError, ProbeOptions, Probes};

use crate::common::{compile_c, require_root};
use hami_test_harness::serial;

/// The CUDA types both the mini driver and the mini program use (prepended to each), and
/// `mini_next`, which the program calls before each driver call to say what the call writes
/// to its out-parameter and returns.
const MINI_TYPES: &str = r#"
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
const MINI_NEXT: &str = r#"
static unsigned long long next_out;
static CUresult next_rc;
void mini_next(unsigned long long out, CUresult rc) { next_out = out; next_rc = rc; }
"#;

/// `Array2d`'s descriptor: width, height, format, channels (float4, 1024 x 1024).
const DESC_2D: (u64, u64, u32, u32) = (1024, 1024, 0x20, 4);
/// `Array3d`'s descriptor: width, height, depth, format, channels (half2, 100^3).
const DESC_3D: (u64, u64, u64, u32, u32) = (100, 100, 100, 0x02, 2);
/// `Mipmapped`'s descriptor and level count (2D float4, 256 x 128, 3 levels).
const DESC_MIP: (u64, u64, u64, u32, u32, u32) = (256, 128, 0, 0x20, 4, 3);
/// `Pitch`'s width, height and element size; the mini driver rounds the pitch up to 512.
const PITCH_ARGS: (u64, u64, u32) = (1000, 10, 4);
/// The pitch the mini driver returns for [`PITCH_ARGS`].
const PITCH: u64 = (PITCH_ARGS.0 + 511) & !511;

/// A function of `shape` in C: its parameters (the driver's definition and the program's
/// declaration share them) and the driver's body, which writes the object announced by
/// `mini_next` to the out-parameter (whether the call succeeds or not, so that a probe that
/// ignored the result would report it) and returns the result announced.
fn shape_c(shape: Shape) -> (String, &'static str) {
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
fn shape_call(shape: Shape, a: &Args) -> (String, String) {
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
struct Args {
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
enum Thread {
    /// The main thread (its tid is the pid).
    Main,
    /// A second thread, started and joined once by the main thread.
    Other,
}

/// One call of the mini program.
#[derive(Clone, Copy, Debug)]
struct Call {
    row: &'static Intercept,
    args: Args,
    /// The driver refuses the call (returns 1): no event.
    fails: bool,
    thread: Thread,
}

/// The fields of the event a call's probe must send.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Fields {
    kind: EventKind,
    addr: u64,
    size: u64,
    ctx: u64,
    extra: u64,
}

/// The event the probe of `c` sends, if any, from its row's shape and kind; `cur` is the
/// current context of the call's thread, updated as the probes track it. Each arm is what
/// the shape's eBPF helpers promise (`hami-ebpf/src/main.rs`, `ret_of`): a new shape or a
/// new shape and kind pair needs its arm here, a new row of an existing pair nothing.
fn expected_event(c: &Call, cur: &mut u64) -> Option<Fields> {
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
struct Scenario {
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
fn first_probed(what: &str, pick: impl Fn(&Intercept) -> bool) -> &'static Intercept {
    INTERCEPTS
        .iter()
        .find(|r| r.is_probed() && pick(r))
        .unwrap_or_else(|| panic!("no probed row {what} in INTERCEPTS"))
}

/// The first probed row of `kind`.
fn of_kind(kind: EventKind) -> &'static Intercept {
    first_probed(&format!("of kind {kind:?}"), |r| r.kind() == Some(kind))
}

/// What the mini program calls, in order.
fn scenario() -> Vec<Call> {
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
fn expected_events(calls: &[Call]) -> Vec<(Thread, Fields, &'static str)> {
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
fn mini_driver(left_out: Option<&str>) -> String {
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
fn c_call(i: usize, c: &Call) -> String {
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
fn mini_program(calls: &[Call]) -> String {
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
fn build_mini_driver(dir: &Path, left_out: Option<&str>) -> PathBuf {
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
fn build_mini(tmp: &Path) -> (PathBuf, PathBuf) {
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
async fn events_of(rx: &mut tokio::sync::mpsc::Receiver<Event>, pid: u32) -> Vec<Event> {
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

fn kind(ev: &Event) -> EventKind {
    ev.kind
}

/// The functions a C source defines (`CUresult name(...) {` at the start of a line).
fn defined_functions(c: &str) -> Vec<&str> {
    c.lines()
        .filter(|l| l.trim_end().ends_with('}'))
        .filter_map(|l| l.strip_prefix("CUresult "))
        .filter_map(|l| l.split_once('(').map(|(name, _)| name.trim()))
        .collect()
}

/// The probed row the partial mini driver leaves out (one in the middle of the table).
fn left_out_row() -> &'static str {
    PROBED_NAMES[PROBED_NAMES.len() / 2]
}

#[test]
fn the_mini_driver_defines_every_probed_row_once() {
    assert_eq!(defined_functions(&mini_driver(None)), PROBED_NAMES);
    let partial = mini_driver(Some(left_out_row()));
    let want: Vec<&str> = PROBED_NAMES
        .into_iter()
        .filter(|s| *s != left_out_row())
        .collect();
    assert_eq!(defined_functions(&partial), want);
}

/// Every probed row is called at least once successfully, sending an event of its row's kind,
/// and once refused by the driver; the other thread's calls are one run.
#[test]
fn the_scenario_calls_every_probed_row() {
    let calls = scenario();
    let events = expected_events(&calls);
    for name in PROBED_NAMES {
        let row = intercept::find(name).unwrap();
        assert!(
            calls.iter().any(|c| c.row.name == name && c.fails),
            "{name} never refused"
        );
        assert!(
            events
                .iter()
                .any(|(_, f, n)| *n == name && Some(f.kind) == row.kind()),
            "{name} sends no event"
        );
    }
    assert!(events.iter().any(|(t, ..)| *t == Thread::Other));
}

/// The mini program runs against the mini driver without probes: every call returned the
/// result and wrote the object announced (the C sources agree with [`scenario`]).
#[test]
fn the_mini_program_runs_against_the_mini_driver() {
    let tmp = tempfile::tempdir().unwrap();
    let (_, prog) = build_mini(tmp.path());
    let out = Command::new(&prog).output().unwrap();
    assert!(
        out.status.success(),
        "{:?}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A libcuda without one of the probed rows (left out of the mini driver on purpose): that
/// one is listed as missing, every other one attached.
#[test]
fn a_probed_row_the_driver_lacks_is_listed_missing() {
    require_root();
    let _g = serial();
    let tmp = tempfile::tempdir().unwrap();
    let lib = build_mini_driver(tmp.path(), Some(left_out_row()));
    let mut probes = Probes::load(&ProbeOptions::default()).expect("loading the eBPF programs");
    let outcome = probes.attach_libcuda(&lib).expect("attaching");
    assert_eq!(outcome.missing, [left_out_row()], "{outcome:?}");
    let mut attached = outcome.attached.clone();
    attached.sort_unstable();
    let mut want: Vec<&str> = PROBED_NAMES
        .into_iter()
        .filter(|s| *s != left_out_row())
        .collect();
    want.sort_unstable();
    assert_eq!(attached, want, "{outcome:?}");
}

/// A stop requested (the agent's SIGTERM, [`Probes::stop_on`]): no attach starts, the
/// probes already in stay until [`Probes::take_links`], which takes them all.
#[test]
fn a_requested_stop_refuses_further_attaches() {
    use std::sync::atomic::{AtomicBool, Ordering};
    require_root();
    let _g = serial();
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (lib_a, lib_b) = (
        build_mini_driver(a.path(), None),
        build_mini_driver(b.path(), None),
    );
    let mut probes = Probes::load(&ProbeOptions::default()).expect("loading the eBPF programs");
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    probes.stop_on(stop.clone());
    let first = probes
        .attach_libcuda(&lib_a)
        .expect("attaching before the stop");
    assert!(first.missing.is_empty(), "{first:?}");
    stop.store(true, Ordering::SeqCst);
    let t = std::time::Instant::now();
    let e = probes.attach_libcuda(&lib_b).unwrap_err();
    assert!(matches!(e, ProbeError::Closed), "{e}");
    assert!(
        t.elapsed() < Duration::from_millis(100),
        "{:?}",
        t.elapsed()
    );
    assert_eq!(probes.attached().len(), 1);
    // Every probe of the first library (a uprobe and a uretprobe per row) and the
    // process-exit tracepoint; none of the second.
    assert_eq!(probes.take_links().len(), 2 * first.attached.len() + 1);
}

#[tokio::test]
async fn mini_driver_every_probe() {
    require_root();
    let _g = serial();
    let tmp = tempfile::tempdir().unwrap();
    let (lib, prog) = build_mini(tmp.path());

    let mut probes = Probes::load(&ProbeOptions::default()).expect("loading the eBPF programs");
    let outcome = probes
        .attach_libcuda(&lib)
        .expect("attaching to the mini libcuda");
    assert!(!outcome.already_attached);
    // The mini driver defines every probed row: all attached, none missing.
    let mut attached = outcome.attached.clone();
    attached.sort_unstable();
    let mut all = PROBED_NAMES.to_vec();
    all.sort_unstable();
    assert_eq!(attached, all, "{outcome:?}");
    assert!(outcome.missing.is_empty(), "{outcome:?}");
    // Same file through another path (a symlink): deduped by device and inode.
    let link = tmp.path().join("libcuda-link.so");
    std::os::unix::fs::symlink(&lib, &link).unwrap();
    let again = probes.attach_libcuda(&link).unwrap();
    assert!(again.already_attached);
    assert_eq!(again.file_id, outcome.file_id);
    assert_eq!(probes.attached().len(), 1);

    let before = probes.counters();
    let (mut rx, handle) = probes
        .spawn(DiscoveryOptions {
            interval: None,
            ..Default::default()
        })
        .expect("starting the event stream");

    let child = Command::new(&prog)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "program failed: {:?} {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let evs = events_of(&mut rx, pid).await;
    let (exit, evs) = evs.split_last().unwrap();
    assert_eq!(exit.kind, EventKind::ProcessExit);
    // Each call's event, in order: its row's kind and the fields its shape promises; none
    // for the refused calls.
    let want = expected_events(&scenario());
    let other_tid = evs
        .iter()
        .find(|e| e.tid != pid)
        .map(|e| e.tid)
        .expect("no event from the program's second thread");
    let mut last_ts = 0;
    for (i, (e, (thread, f, name))) in evs.iter().zip(&want).enumerate() {
        let got = Fields {
            kind: e.kind,
            addr: e.addr,
            size: e.size,
            ctx: e.ctx,
            extra: e.extra,
        };
        assert_eq!(got, *f, "event {i}, of {name} ({thread:?}): {e:?}");
        let tid = match thread {
            Thread::Main => pid,
            Thread::Other => other_tid,
        };
        assert_eq!((e.tgid, e.tid, e.result), (pid, tid, 0), "event {i}: {e:?}");
        assert!(e.ts_ns >= last_ts && e.ts_ns > 0, "event {i}: {e:?}");
        last_ts = e.ts_ns;
    }
    assert_eq!(evs.len(), want.len(), "events: {evs:#?}");

    let c = handle.counters();
    assert_eq!(c.dropped, 0, "{c:?}");
    assert_eq!(c.malformed, 0, "{c:?}");
    // The libcuda events and the exit; other processes may add exits.
    let n = want.len() as u64 + 1;
    assert!(c.sent >= before.sent + n, "{c:?}");
    assert!(c.received >= n, "{c:?}");
}

#[tokio::test]
async fn own_tgid_is_ignored() {
    require_root();
    let _g = serial();
    let tmp = tempfile::tempdir().unwrap();
    let (lib, prog) = build_mini(tmp.path());
    // Ignore the program's pid: impossible to know before it starts, so ignore a process
    // that runs it through a shell that execs it (exec keeps the pid).
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(format!("read x; exec {}", prog.display()))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id();
    let mut probes = Probes::load(&ProbeOptions {
        ignore_tgid: Some(pid),
        ..Default::default()
    })
    .unwrap();
    probes.attach_libcuda(&lib).unwrap();
    let (mut rx, handle) = probes
        .spawn(DiscoveryOptions {
            interval: None,
            ..Default::default()
        })
        .unwrap();
    {
        use std::io::Write;
        child.stdin.take().unwrap().write_all(b"go\n").unwrap();
    }
    assert!(child.wait().unwrap().success());
    // Run it once more, not ignored, as a marker that the probes work.
    let marker = Command::new(&prog)
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mpid = marker.id();
    marker.wait_with_output().unwrap();
    let evs = events_of(&mut rx, mpid).await;
    assert!(evs.iter().any(|e| kind(e) == EventKind::MemAlloc));
    // Nothing at all from the ignored pid (not even its exit).
    while let Ok(ev) = rx.try_recv() {
        assert_ne!(ev.tgid, pid, "event from the ignored process: {ev:?}");
    }
    assert_eq!(handle.counters().unpaired, 0);
}

#[tokio::test]
async fn discovery_finds_a_running_process_libcuda() {
    require_root();
    let _g = serial();
    let tmp = tempfile::tempdir().unwrap();
    let (lib, prog) = build_mini(tmp.path());
    // A process that maps the library (through LD_PRELOAD of `sleep`), found in its maps.
    let mut sleeper = Command::new("sleep")
        .arg("30")
        .env("LD_PRELOAD", &lib)
        .spawn()
        .unwrap();
    let want = PathBuf::from(format!("/proc/{}/root{}", sleeper.id(), lib.display()));
    // Poll: the loader maps the library shortly after the spawn.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let found = hami_user::probes::discover_libcuda(Path::new("/proc"));
        if found.contains(&want) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{want:?} not in {found:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }

    let probes = Probes::load(&ProbeOptions::default()).unwrap();
    let (mut rx, handle) = probes
        .spawn(DiscoveryOptions {
            interval: Some(Duration::from_millis(100)),
            ..Default::default()
        })
        .unwrap();
    // The background discovery attaches it.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let meta = std::fs::metadata(&lib).unwrap();
    use std::os::unix::fs::MetadataExt;
    while !handle
        .attached()
        .iter()
        .any(|l| l.file_id == (meta.dev(), meta.ino()))
    {
        assert!(
            std::time::Instant::now() < deadline,
            "not attached: {:?}",
            handle.attached()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _ = sleeper.kill();
    let _ = sleeper.wait();
    let child = Command::new(&prog)
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id();
    child.wait_with_output().unwrap();
    let evs = events_of(&mut rx, pid).await;
    // Every event of the program (and its exit).
    let kinds: Vec<EventKind> = evs.iter().map(kind).collect();
    let mut want: Vec<EventKind> = expected_events(&scenario())
        .iter()
        .map(|(_, f, _)| f.kind)
        .collect();
    want.push(EventKind::ProcessExit);
    assert_eq!(kinds, want);
}

#[test]
fn not_libcuda_is_rejected() {
    require_root();
    let _g = serial();
    let mut probes = Probes::load(&ProbeOptions::default()).unwrap();
    // /bin/sh is an ELF file exporting none of the probed functions.
    let sh = std::fs::canonicalize("/bin/sh").unwrap();
    match probes.attach_libcuda(&sh) {
        Err(ProbeError::NotLibcuda(p)) => assert_eq!(p, sh),
        other => panic!("expected NotLibcuda, got {other:?}"),
    }
    match probes.attach_libcuda(Path::new("/nonexistent/libcuda.so.1")) {
        Err(ProbeError::File { .. }) => {}
        other => panic!("expected File error, got {other:?}"),
    }
}

/// The workspace's fake driver (`testing/fake-cuda`, soname `libcuda.so.1`) driven by
/// `cudaprobe`, through the three ways programs reach the driver: the probes see
/// `cuMemAlloc_v2` with its size and returned pointer, the free, and the context (with its
/// device ordinal) the allocation was made in.
#[tokio::test]
async fn fake_driver_alloc_free_three_ways() {
    use hami_test_harness::{Artifacts, TestEnv};
    require_root();
    let _g = serial();
    let env = TestEnv::new();
    let art = Artifacts::get();
    let mut probes = Probes::load(&ProbeOptions::default()).expect("loading the eBPF programs");
    let outcome = probes
        .attach_libcuda(&art.fake_libcuda)
        .expect("attaching to the fake libcuda.so.1");
    assert!(outcome.attached.contains(&"cuMemAlloc_v2"), "{outcome:?}");
    assert!(outcome.attached.contains(&"cuMemFree_v2"), "{outcome:?}");
    let (mut rx, handle) = probes
        .spawn(DiscoveryOptions {
            interval: None,
            ..Default::default()
        })
        .unwrap();
    for via in ["direct", "dlsym", "procaddr"] {
        let out = env.run_probe(&[
            "--via", via, "--device", "1", "init", "ctx", "alloc", "1M", "free", "last",
        ]);
        assert!(
            out.status.success(),
            "cudaprobe --via {via}: {}",
            out.stdout
        );
        let pid = out.pid.expect("cudaprobe prints its pid");
        let ctx = out.find("ctx")[0].num("ctx").expect("ctx pointer");
        let ptr = out.find("alloc")[0].ptr().expect("allocated pointer");
        let evs = events_of(&mut rx, pid).await;
        let alloc = evs
            .iter()
            .position(|e| kind(e) == EventKind::MemAlloc)
            .unwrap_or_else(|| panic!("--via {via}: no MemAlloc in {evs:#?}"));
        let e = evs[alloc];
        assert_eq!(
            (e.size, e.addr, e.ctx),
            (1 << 20, ptr, ctx),
            "--via {via}: {e:?}"
        );
        assert!(
            evs[alloc..]
                .iter()
                .any(|e| kind(e) == EventKind::MemFree && e.addr == ptr),
            "--via {via}: no MemFree of {ptr:#x} after the alloc: {evs:#?}"
        );
        assert!(
            evs.iter()
                .any(|e| kind(e) == EventKind::PrimaryCtxRetain && e.addr == ctx && e.extra == 1),
            "--via {via}: no primary retain of device 1: {evs:#?}"
        );
    }
    // Created contexts (procaddr resolves cuCtxCreate to its newest version): the device
    // ordinal is read from the right argument, and the allocation carries the new context.
    for via in ["direct", "procaddr"] {
        let out = env.run_probe(&[
            "--via",
            via,
            "--device",
            "1",
            "init",
            "ctxcreate",
            "alloc",
            "64K",
        ]);
        assert!(
            out.status.success(),
            "cudaprobe --via {via}: {}",
            out.stdout
        );
        let pid = out.pid.unwrap();
        let ctx = out.find("ctxcreate")[0].num("ctx").unwrap();
        let ptr = out.find("alloc")[0].ptr().unwrap();
        let evs = events_of(&mut rx, pid).await;
        assert!(
            evs.iter()
                .any(|e| kind(e) == EventKind::CtxCreate && e.addr == ctx && e.extra == 1),
            "--via {via}: no CtxCreate on device 1: {evs:#?}"
        );
        assert!(
            evs.iter().any(|e| kind(e) == EventKind::MemAlloc
                && e.addr == ptr
                && e.size == 64 << 10
                && e.ctx == ctx),
            "--via {via}: allocation not attributed to the created context: {evs:#?}"
        );
    }
    // A failed call sends nothing: an allocation larger than the fake device.
    let out = env.run_probe(&["init", "ctx", "alloc", "100T"]);
    let pid = out.pid.unwrap();
    assert!(!out.find("alloc")[0].ok(), "{}", out.stdout);
    let evs = events_of(&mut rx, pid).await;
    assert!(
        !evs.iter().any(|e| kind(e) == EventKind::MemAlloc),
        "failed allocation reported: {evs:#?}"
    );
    let c = handle.counters();
    assert_eq!((c.dropped, c.malformed), (0, 0), "{c:?}");
}

/// A "container": a process in its own mount namespace loads a libcuda that exists only
/// there (a private tmpfs over a directory that is empty on the host). Background discovery
/// finds it in the process's maps, attaches through `/proc/<pid>/root/...`, and the probes
/// see the process's allocation.
#[tokio::test]
async fn container_libcuda_found_through_proc_root() {
    use hami_test_harness::{Artifacts, RunningProbe, TestEnv};
    require_root();
    let _g = serial();
    let env = TestEnv::new();
    let art = Artifacts::get();
    let nsdir = tempfile::tempdir().unwrap();
    let d = nsdir.path().display().to_string();
    let script = format!(
        "mount -t tmpfs hami-test {d} && cp {lib} {d}/libcuda.so.1 && \
         exec {probe} init ctx wait alloc 2M free last",
        lib = art.fake_libcuda.display(),
        probe = art.cudaprobe.display(),
    );
    let mut cmd = env.command(Path::new("unshare"));
    cmd.args(["--mount", "--propagation", "private", "sh", "-c", &script])
        .env("LD_LIBRARY_PATH", nsdir.path())
        .stdin(std::process::Stdio::piped());
    let mut rp = RunningProbe::start(cmd);
    rp.wait_for("wait");
    let pid = rp.pid;
    assert!(
        !nsdir.path().join("libcuda.so.1").exists(),
        "the library must be visible only inside the namespace"
    );

    let probes = Probes::load(&ProbeOptions::default()).unwrap();
    let (mut rx, handle) = probes
        .spawn(DiscoveryOptions {
            interval: Some(Duration::from_millis(100)),
            ..Default::default()
        })
        .unwrap();
    let want = PathBuf::from(format!("/proc/{pid}/root{d}/libcuda.so.1"));
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !handle.attached().iter().any(|l| l.path == want) {
        assert!(
            std::time::Instant::now() < deadline,
            "{want:?} not attached: {:?}",
            handle.attached()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    rp.resume();
    let out = rp.finish();
    assert!(out.status.success(), "{}", out.dump());
    let ptr = out.find("alloc")[0].ptr().unwrap();
    let evs = events_of(&mut rx, pid).await;
    assert!(
        evs.iter()
            .any(|e| kind(e) == EventKind::MemAlloc && e.addr == ptr && e.size == 2 << 20),
        "{evs:#?}"
    );
    assert!(
        evs.iter()
            .any(|e| kind(e) == EventKind::MemFree && e.addr == ptr),
        "{evs:#?}"
    );
}

/// Runs the mini program once and returns how many events the probes sent meanwhile.
fn sent_by_one_run(probes: &Probes, prog: &Path) -> u64 {
    let before = probes.counters().sent;
    let st = Command::new(prog)
        .stdout(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(st.success());
    probes.counters().sent - before
}

#[test]
fn links_handed_to_a_keeper_process_are_detached_without_waiting() {
    require_root();
    let _g = serial();
    let tmp = tempfile::tempdir().unwrap();
    let (lib, prog) = build_mini(tmp.path());
    let mut probes = Probes::load(&ProbeOptions::default()).unwrap();
    let outcome = probes.attach_libcuda(&lib).unwrap();
    assert!(
        sent_by_one_run(&probes, &prog) > 0,
        "the probes do not fire"
    );
    let links = probes.take_links();
    // Entry and return probe per symbol, plus the process-exit tracepoint.
    assert_eq!(links.len(), 2 * outcome.attached.len() + 1);
    assert!(matches!(
        probes.attach_libcuda(&lib),
        Err(ProbeError::Closed)
    ));
    let t = std::time::Instant::now();
    assert!(links.detach_in_background(), "not handed off");
    // Detaching here takes about 0.1 s per link (4-5 s); handing off takes milliseconds.
    assert!(
        t.elapsed() < Duration::from_secs(1),
        "hand-off took {:?}",
        t.elapsed()
    );
    // The keeper detaches them in the background: the probes stop firing.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while sent_by_one_run(&probes, &prog) > 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "probes still attached 60 s after the hand-off"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}
