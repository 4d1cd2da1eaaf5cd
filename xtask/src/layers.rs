//! `hami-preload`'s layers (issue 32): its source folders, bottom to top, each importing only
//! from its own layer or those below. Run by `cargo xtask circles`, the lint phase of `cargo
//! xtask test` and this module's `hami_preload_imports_no_higher_layer` test.
//!
//! The imports are the file edges of [`crate::circles::file_edges`]: a path in a `use` (a `pub
//! use` included) or inline (`crate::x::Y`, `super::f()`, also inside macro calls), resolved
//! to the file that holds its longest module prefix. A `mod x;` declaration is no import, so
//! `lib.rs` and a folder's `mod.rs` may declare the modules of any layer. A `#[macro_export]`
//! macro lives at the crate root whichever file defines it: `crate::debug!` is an import of
//! the file that defines `debug`, not of `lib.rs`.

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;

use anyhow::{bail, Context, Result};

use crate::circles::{file_edges, Sources};

/// One layer: its name and the files it holds, as paths relative to the crate's folder; an
/// entry ending in `/` holds a whole folder. A file belongs to the layer of its longest
/// matching entry.
pub type Layer = (&'static str, &'static [&'static str]);

/// `hami-preload`'s layers, bottom to top (`docs/architecture.md`, `hami-preload/src/lib.rs`).
pub const PRELOAD_LAYERS: &[Layer] = &[
    // The environment and the foreign interface: the driver's types, the real functions by
    // name, the real dlsym, the hook prelude, the panic guard's unwinder, logging, the
    // configuration, glibc's moved functions.
    ("ffi", &["src/ffi/"]),
    // Adapters to the real driver and NVML that hold no table of ours.
    ("driver", &["src/driver/"]),
    // What the process is charged: the allocation table and its key map, refusals, backstop.
    ("ledger", &["src/ledger/"]),
    // The driver's objects we keep track of: contexts, modules, pools, VMM, context limits.
    ("objects", &["src/objects/"]),
    // The compute share: the gate and its arming.
    ("compute", &["src/compute/"]),
    // This process's tables (`Holdings`), the configuration and the region, read once.
    ("state", &["src/state.rs"]),
    // Readings that combine the real driver with the process's tables.
    ("measure", &["src/measure/"]),
    // The exports: the hooks, our dlsym, the crate root.
    ("hooks", &["src/hooks/", "src/dlsym.rs", "src/lib.rs"]),
];

/// A file that imports from a layer above its own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    pub from: String,
    pub from_layer: &'static str,
    pub to: String,
    pub to_layer: &'static str,
    /// The paths that make the import.
    pub paths: Vec<String>,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} (layer {}) imports {} from {} (layer {}, above {})",
            self.from,
            self.from_layer,
            self.paths.join(", "),
            self.to,
            self.to_layer,
            self.from_layer
        )
    }
}

/// The layer (index into `layers`) of `file`: its longest matching entry.
fn layer_of(layers: &[Layer], file: &str) -> Option<usize> {
    layers
        .iter()
        .enumerate()
        .flat_map(|(i, (_, holds))| holds.iter().map(move |h| (i, *h)))
        .filter(|(_, h)| {
            if h.ends_with('/') {
                file.starts_with(h)
            } else {
                file == *h
            }
        })
        .max_by_key(|(_, h)| h.len())
        .map(|(i, _)| i)
}

/// The imports of the crate (`sources`, root `root`) that run up a layer; an error names the
/// files that are in no layer.
pub fn violations(sources: &Sources, root: &str, layers: &[Layer]) -> Result<Vec<Violation>> {
    let homeless: Vec<&str> = sources
        .keys()
        .filter(|f| layer_of(layers, f).is_none())
        .map(String::as_str)
        .collect();
    if !homeless.is_empty() {
        bail!(
            "in no layer (add them to a layer in xtask/src/layers.rs): {}",
            homeless.join(", ")
        );
    }
    let macros = exported_macros(sources)?;
    let mut found = Vec::new();
    for ((from, mut to), mut paths) in file_edges(sources, root)? {
        if to == root {
            // `crate::m` of an exported macro `m`: an import of the file that defines it.
            let (of_macros, rest): (Vec<_>, Vec<_>) = paths.into_iter().partition(|p| {
                let name = p.strip_prefix("$crate::").or(p.strip_prefix("crate::"));
                name.is_some_and(|n| macros.contains_key(n))
            });
            for p in of_macros {
                let name = p.rsplit("::").next().unwrap_or_default();
                let file = &macros[name];
                if let (Some(a), Some(b)) = (layer_of(layers, &from), layer_of(layers, file)) {
                    if b > a {
                        found.push(Violation {
                            from: from.clone(),
                            from_layer: layers[a].0,
                            to: file.clone(),
                            to_layer: layers[b].0,
                            paths: vec![p],
                        });
                    }
                }
            }
            if rest.is_empty() {
                continue;
            }
            paths = rest.into_iter().collect();
            to = root.to_string();
        }
        let (Some(a), Some(b)) = (layer_of(layers, &from), layer_of(layers, &to)) else {
            continue;
        };
        if b > a {
            found.push(Violation {
                from,
                from_layer: layers[a].0,
                to,
                to_layer: layers[b].0,
                paths: paths.into_iter().collect(),
            });
        }
    }
    Ok(found)
}

/// The `#[macro_export]` macros of the crate (at its root, whichever file defines them): name
/// to the file that defines it.
fn exported_macros(sources: &Sources) -> Result<BTreeMap<String, String>> {
    let mut found = BTreeMap::new();
    for (file, text) in sources {
        let ast = syn::parse_file(text).with_context(|| format!("could not parse {file}"))?;
        for item in &ast.items {
            if let syn::Item::Macro(m) = item {
                let exported = m.attrs.iter().any(|a| a.path().is_ident("macro_export"));
                if let (true, Some(name)) = (exported, &m.ident) {
                    found.insert(name.to_string(), file.clone());
                }
            }
        }
    }
    Ok(found)
}

/// Every `.rs` file under `dir` into `out`, keyed by `prefix/...`.
fn read_sources(dir: &Path, prefix: &str, out: &mut Sources) -> Result<()> {
    for entry in std::fs::read_dir(dir).with_context(|| format!("{}", dir.display()))? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().to_string();
        let key = format!("{prefix}/{name}");
        if entry.file_type()?.is_dir() {
            read_sources(&entry.path(), &key, out)?;
        } else if name.ends_with(".rs") {
            let text = std::fs::read_to_string(entry.path())
                .with_context(|| format!("{}", entry.path().display()))?;
            out.insert(key, text);
        }
    }
    Ok(())
}

/// Fail, listing them, if a file of `hami-preload` (in the workspace at `root`) imports from
/// a layer above its own.
pub fn check(root: &Path) -> Result<()> {
    let mut sources = Sources::new();
    read_sources(&root.join("hami-preload/src"), "src", &mut sources)?;
    let found = violations(&sources, "src/lib.rs", PRELOAD_LAYERS).context("hami-preload")?;
    if !found.is_empty() {
        let order: Vec<&str> = PRELOAD_LAYERS.iter().map(|(n, _)| *n).collect();
        let mut msg = format!(
            "hami-preload: {} import(s) up a layer (layers bottom to top: {}; \
             xtask/src/layers.rs):\n",
            found.len(),
            order.join(" < ")
        );
        msg.extend(found.iter().map(|v| format!("    {v}\n")));
        bail!("{msg}");
    }
    Ok(())
}

#[cfg(test)]
mod tests;
