//! `hprobe_fns.h`, hprobe's function tables, generated from the intercept table
//! (`hami_abi::intercept::INTERCEPTS`) and written next to the compiled program each time
//! a test binary compiles it: one entry per CUDA function the preload hooks, with the name
//! `dlsym` takes, the base name and flags `cuGetProcAddress` takes, the row's probe `Shape`,
//! memory effect and key space (what hprobe's generic `call` op reads), and the direct call
//! (the symbol itself, linked against the fake driver).

use std::fmt::Write as _;
use std::path::Path;

use hami_abi::intercept::{Intercept, KeySpace, Library, Memory, Shape, INTERCEPTS};

/// The header's file name (`#include "hprobe_fns.h"` in `hprobe.c`).
pub const HPROBE_HEADER: &str = "hprobe_fns.h";

/// hprobe's functions: the hooked CUDA rows, in table order.
pub fn hprobe_rows() -> impl Iterator<Item = &'static Intercept> {
    INTERCEPTS
        .iter()
        .filter(|r| r.hooked && r.lib == Library::Cuda)
}

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

/// The C name of a shape. A new [`Shape`] fails to compile here: hprobe's `call` needs to
/// learn how to pass its arguments (`call_row` in `hprobe.c`), and its name goes in
/// [`SHAPES`].
fn shape_c(shape: Option<Shape>) -> &'static str {
    match shape {
        None => "HP_SHAPE_NONE",
        Some(Shape::OutSize) => "HP_SHAPE_OUT_SIZE",
        Some(Shape::Pitch) => "HP_SHAPE_PITCH",
        Some(Shape::MemCreate) => "HP_SHAPE_MEM_CREATE",
        Some(Shape::Array2d) => "HP_SHAPE_ARRAY2D",
        Some(Shape::Array3d) => "HP_SHAPE_ARRAY3D",
        Some(Shape::Mipmapped) => "HP_SHAPE_MIPMAPPED",
        Some(Shape::Value) => "HP_SHAPE_VALUE",
        Some(Shape::CtxOut { .. }) => "HP_SHAPE_CTX_OUT",
    }
}

/// Every C shape name, in the order of the C enum.
const SHAPES: [&str; 9] = [
    "HP_SHAPE_NONE",
    "HP_SHAPE_OUT_SIZE",
    "HP_SHAPE_PITCH",
    "HP_SHAPE_MEM_CREATE",
    "HP_SHAPE_ARRAY2D",
    "HP_SHAPE_ARRAY3D",
    "HP_SHAPE_MIPMAPPED",
    "HP_SHAPE_VALUE",
    "HP_SHAPE_CTX_OUT",
];

/// The C name of a key space (its value is the Rust discriminant).
fn space_c(space: KeySpace) -> &'static str {
    match space {
        KeySpace::Pointer => "HP_SPACE_POINTER",
        KeySpace::Handle => "HP_SPACE_HANDLE",
        KeySpace::Array => "HP_SPACE_ARRAY",
        KeySpace::Mipmap => "HP_SPACE_MIPMAP",
    }
}

/// Every key space.
const SPACES: [KeySpace; 4] = [
    KeySpace::Pointer,
    KeySpace::Handle,
    KeySpace::Array,
    KeySpace::Mipmap,
];

/// The text of `hprobe_fns.h`.
pub fn hprobe_header() -> String {
    let mut h = String::new();
    h.push_str(
        "/* hprobe_fns.h: hprobe's function tables, one entry per CUDA function the preload\n \
         * hooks (the rows of hami_abi::intercept::INTERCEPTS with hooked: true), generated\n \
         * by hami-preload/tests/preload/support/header.rs each time the tests compile\n \
         * hprobe: do not edit. */\n#ifndef HPROBE_FNS_H\n#define HPROBE_FNS_H\n\n",
    );
    h.push_str("/* A row's probe Shape (how `call` passes its arguments; NONE: not probed). */\nenum hp_shape {");
    for (i, s) in SHAPES.iter().enumerate() {
        let _ = write!(h, "{}{s}", if i == 0 { " " } else { ", " });
    }
    h.push_str(" };\n/* What it does to tracked memory. */\n");
    h.push_str("enum hp_memory { HP_MEM_NONE, HP_MEM_ALLOCATES, HP_MEM_RELEASES };\n");
    h.push_str("/* The key space of the object it makes or releases (NONE: neither). */\n");
    h.push_str("enum hp_space { HP_SPACE_NONE = -1");
    let mut nspaces = 0;
    for s in SPACES {
        let _ = write!(h, ", {} = {}", space_c(s), s as u8);
        nspaces = nspaces.max(s as u8 + 1);
    }
    let _ = writeln!(h, ", HP_NSPACES = {nspaces} }};\n");
    h.push_str("/* Function indices. */\nenum {\n");
    for r in hprobe_rows() {
        let _ = writeln!(h, "    F_{},", r.name);
    }
    h.push_str("    NFN\n};\n\n");
    h.push_str(
        "struct hp_fn {\n    const char *name;             /* the export: dlsym, the direct call */\n    \
         const char *pa_name;          /* the base name cuGetProcAddress takes */\n    \
         unsigned long long pa_flags;  /* 2 (PER_THREAD_DEFAULT_STREAM) for _ptsz */\n    \
         int shape, memory, space;\n};\n\nstatic const struct hp_fn hp_fns[NFN] = {\n",
    );
    for r in hprobe_rows() {
        let (base, ptsz) = procaddr_base(r.name);
        let (memory, space) = match r.memory {
            None => ("HP_MEM_NONE", "HP_SPACE_NONE"),
            Some(Memory::Allocates(s)) => ("HP_MEM_ALLOCATES", space_c(s)),
            Some(Memory::Releases(s)) => ("HP_MEM_RELEASES", space_c(s)),
        };
        let _ = writeln!(
            h,
            "    [F_{name}] = {{\"{name}\", \"{base}\", {flags}, {shape}, {memory}, {space}}},",
            name = r.name,
            flags = if ptsz { 2 } else { 0 },
            shape = shape_c(r.probe.map(|p| p.shape)),
        );
    }
    h.push_str("};\n\n");
    h.push_str(
        "/* The direct calls: each symbol declared under a C name of its own (an asm label), so\n \
         * that hprobe's prototypes of the same functions do not clash; the dynamic linker\n \
         * resolves them (the preload's exports win over the fake driver's). */\n",
    );
    for r in hprobe_rows() {
        let _ = writeln!(h, "void hp_direct_{0}(void) __asm__(\"{0}\");", r.name);
    }
    h.push_str("static void (*const hp_direct[NFN])(void) = {\n");
    for r in hprobe_rows() {
        let _ = writeln!(h, "    [F_{0}] = hp_direct_{0},", r.name);
    }
    h.push_str("};\n\n#endif\n");
    h
}

/// Writes [`hprobe_header`] into `dir` (under a temp name, then renamed: test binaries that
/// compile hprobe at once never read half a header).
pub fn write_hprobe_header(dir: &Path) {
    let to = dir.join(HPROBE_HEADER);
    let tmp = dir.join(format!(".{HPROBE_HEADER}.tmp{}", std::process::id()));
    std::fs::write(&tmp, hprobe_header())
        .unwrap_or_else(|e| panic!("write {}: {e}", tmp.display()));
    std::fs::rename(&tmp, &to).unwrap_or_else(|e| panic!("rename to {}: {e}", to.display()));
}
