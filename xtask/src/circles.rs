//! `cargo xtask circles`: no two source files of one crate import each other in a circle
//! (issue 32). Also run by the lint phase of `cargo xtask test` and by this module's
//! `the_workspace_has_no_circle` test.
//!
//! Every crate of the workspace (a folder with a `Cargo.toml` and a `src/`, outside `target/`,
//! `fuzz/`, `vendor/` and hidden folders) is read from each of its roots (`src/lib.rs`,
//! `src/main.rs`, `src/bin/*.rs`) by following its `mod x;` declarations (`x.rs`, `x/mod.rs`
//! or `#[path = "..."]`), which maps every file to its module path. A file A has an edge to a
//! file B (B != A) when A names something through a path, in a `use` (a `pub use` included)
//! or inline (`crate::x::Y`, `super::f()`, also inside macro calls), whose longest module
//! prefix is a module that B holds. A `mod x;` declaration alone is no edge. Paths are
//! resolved from the module they are written in: `crate::`, `self::`, `super::`, a child
//! module's name, or a name that a `use` of that module brought in; other first names
//! (external crates, locals, the prelude) are ignored. A set of files that reach each other
//! (a strongly connected component of two files or more) is a circle.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::Path;

use anyhow::{bail, Context, Result};
use proc_macro2::{Spacing, TokenStream, TokenTree};
use syn::visit::Visit;

/// The files of one crate: path relative to the crate's folder (`src/a/b.rs`, `/`-separated)
/// to source text.
pub type Sources = BTreeMap<String, String>;

/// The edges of one crate: (from file, to file) to the paths that make the edge.
pub type Edges = BTreeMap<(String, String), BTreeSet<String>>;

/// A set of files that import each other in a circle, and the paths that tie them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Circle {
    /// The crate's folder and root file, e.g. `hami-user (src/main.rs)`.
    pub krate: String,
    /// The files of the circle (relative to the crate's folder), sorted.
    pub files: Vec<String>,
    /// Every edge between two files of the circle, with the paths that make it.
    pub edges: Vec<(String, String, Vec<String>)>,
}

impl fmt::Display for Circle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{}: circle between {}",
            self.krate,
            self.files.join(", ")
        )?;
        for (from, to, names) in &self.edges {
            writeln!(f, "    {from} -> {to}: {}", names.join(", "))?;
        }
        Ok(())
    }
}

/// One module of a crate: the file that holds it and the names of its child modules.
#[derive(Debug, Clone, Default)]
struct Module {
    file: String,
    children: BTreeSet<String>,
}

/// A crate's modules by path from the crate root (`[]` is the root).
type Tree = BTreeMap<Vec<String>, Module>;

/// The circles of the crate whose root file is `root` (a key of `sources`); `krate` names
/// the crate in the report.
pub fn crate_circles(krate: &str, sources: &Sources, root: &str) -> Result<Vec<Circle>> {
    let edges = file_edges(sources, root)?;
    Ok(circles(&edges)
        .into_iter()
        .map(|files| {
            let edges = edges
                .iter()
                .filter(|((from, to), _)| files.contains(from) && files.contains(to))
                .map(|((from, to), names)| {
                    (from.clone(), to.clone(), names.iter().cloned().collect())
                })
                .collect();
            Circle {
                krate: krate.to_string(),
                files: files.into_iter().collect(),
                edges,
            }
        })
        .collect())
}

/// The edges between the files of the crate whose root file is `root`.
pub fn file_edges(sources: &Sources, root: &str) -> Result<Edges> {
    let mut tree = Tree::new();
    let mut parsed = BTreeMap::new();
    load_file(sources, root, Vec::new(), true, &mut tree, &mut parsed)?;
    let mut edges = Edges::new();
    for (file, (module, ast)) in &parsed {
        let walker = Walker {
            tree: &tree,
            file,
            edges: &mut edges,
        };
        walker.walk(module, &ast.items);
    }
    Ok(edges)
}

/// The sets of files (two or more) that reach each other through `edges`, each sorted.
pub fn circles(edges: &Edges) -> Vec<BTreeSet<String>> {
    let mut graph: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (from, to) in edges.keys() {
        graph.entry(from).or_default().push(to);
        graph.entry(to).or_default();
    }
    // Tarjan's strongly connected components (the graphs are a few dozen files: recursion
    // is fine).
    struct Tarjan<'g> {
        graph: &'g BTreeMap<&'g str, Vec<&'g str>>,
        index: BTreeMap<&'g str, usize>,
        low: BTreeMap<&'g str, usize>,
        stack: Vec<&'g str>,
        on_stack: BTreeSet<&'g str>,
        found: Vec<BTreeSet<String>>,
    }
    impl<'g> Tarjan<'g> {
        fn visit(&mut self, v: &'g str) {
            let i = self.index.len();
            self.index.insert(v, i);
            self.low.insert(v, i);
            self.stack.push(v);
            self.on_stack.insert(v);
            for &w in &self.graph[v] {
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let low = self.low[v].min(self.low[w]);
                    self.low.insert(v, low);
                } else if self.on_stack.contains(w) {
                    let low = self.low[v].min(self.index[w]);
                    self.low.insert(v, low);
                }
            }
            if self.low[v] == self.index[v] {
                let mut component = BTreeSet::new();
                while let Some(w) = self.stack.pop() {
                    self.on_stack.remove(w);
                    component.insert(w.to_string());
                    if w == v {
                        break;
                    }
                }
                if component.len() > 1 {
                    self.found.push(component);
                }
            }
        }
    }
    let mut t = Tarjan {
        graph: &graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        found: Vec::new(),
    };
    for &v in graph.keys() {
        if !t.index.contains_key(v) {
            t.visit(v);
        }
    }
    t.found.sort();
    t.found
}

/// Parse `file` as module `module` and every file its `mod x;` declarations load.
fn load_file(
    sources: &Sources,
    file: &str,
    module: Vec<String>,
    mod_rs: bool,
    tree: &mut Tree,
    parsed: &mut BTreeMap<String, (Vec<String>, syn::File)>,
) -> Result<()> {
    if parsed.contains_key(file) {
        return Ok(());
    }
    let text = sources
        .get(file)
        .with_context(|| format!("no file {file}"))?;
    let ast = syn::parse_file(text).with_context(|| format!("could not parse {file}"))?;
    let file_dir = parent(file);
    // Where `mod x;` looks for `x.rs`: beside a mod-rs file (lib.rs, main.rs, mod.rs), in the
    // folder named after any other file.
    let dir = if mod_rs {
        file_dir.clone()
    } else {
        join(&file_dir, file_stem(file))
    };
    tree.entry(module.clone()).or_default().file = file.to_string();
    let mut loads = Vec::new();
    declare_modules(
        &ast.items, &module, &dir, &file_dir, false, file, tree, &mut loads,
    );
    parsed.insert(file.to_string(), (module, ast));
    // A declaration whose file is missing (`x.rs` where `x/mod.rs` is used) is left to the
    // compiler.
    for (path, module, mod_rs) in loads {
        if sources.contains_key(&path) {
            load_file(sources, &path, module, mod_rs, tree, parsed)?;
        }
    }
    Ok(())
}

/// Record the modules declared in `items` (of module `module`, held by `file`); the files of
/// `mod x;` declarations go to `loads` as (path, module, is mod-rs).
#[allow(clippy::too_many_arguments)]
fn declare_modules(
    items: &[syn::Item],
    module: &[String],
    dir: &str,
    file_dir: &str,
    inline: bool,
    file: &str,
    tree: &mut Tree,
    loads: &mut Vec<(String, Vec<String>, bool)>,
) {
    for item in items {
        let syn::Item::Mod(m) = item else { continue };
        let name = ident(&m.ident);
        tree.entry(module.to_vec())
            .or_default()
            .children
            .insert(name.clone());
        let mut child = module.to_vec();
        child.push(name.clone());
        let path_attr = m.attrs.iter().find_map(|a| match &a.meta {
            syn::Meta::NameValue(nv) if nv.path.is_ident("path") => match &nv.value {
                syn::Expr::Lit(syn::ExprLit {
                    lit: syn::Lit::Str(s),
                    ..
                }) => Some(s.value()),
                _ => None,
            },
            _ => None,
        });
        match &m.content {
            Some((_, inner)) => {
                tree.entry(child.clone()).or_default().file = file.to_string();
                let inner_dir = join(dir, &name);
                declare_modules(inner, &child, &inner_dir, file_dir, true, file, tree, loads);
            }
            None => {
                let candidates = match path_attr {
                    // Relative to the file's folder, or to an inline module's folder.
                    Some(p) => vec![(join(if inline { dir } else { file_dir }, &p), true)],
                    None => vec![
                        (join(dir, &format!("{name}.rs")), false),
                        (join(dir, &format!("{name}/mod.rs")), true),
                    ],
                };
                for (path, mod_rs) in candidates {
                    loads.push((path, child.clone(), mod_rs));
                }
            }
        }
    }
}

/// Finds the edges of one file.
struct Walker<'a> {
    tree: &'a Tree,
    file: &'a str,
    edges: &'a mut Edges,
}

impl Walker<'_> {
    /// Walk the items of module `module`: nested inline modules are walked with their own
    /// path; every other item's paths are resolved from `module`.
    fn walk(mut self, module: &[String], items: &[syn::Item]) -> Self {
        let mut aliases = BTreeMap::new();
        for item in items {
            if let syn::Item::Use(u) = item {
                if u.leading_colon.is_none() {
                    let mut found = Vec::new();
                    expand_use(&u.tree, &mut Vec::new(), &mut found);
                    for (path, alias) in found {
                        if let Some(alias) = alias {
                            aliases.insert(alias, path);
                        }
                    }
                }
            }
        }
        let mut collector = Collector::default();
        for item in items {
            match item {
                syn::Item::Mod(m) => {
                    if let Some((_, inner)) = &m.content {
                        let mut child = module.to_vec();
                        child.push(ident(&m.ident));
                        self = self.walk(&child, inner);
                    }
                }
                _ => collector.visit_item(item),
            }
        }
        let scope = Scope {
            tree: self.tree,
            module,
            aliases: &aliases,
        };
        for path in collector.paths {
            let Some(resolved) = scope.resolve(&path, 0) else {
                continue;
            };
            let to = self.tree.file_of(&resolved);
            if to != self.file {
                self.edges
                    .entry((self.file.to_string(), to.to_string()))
                    .or_default()
                    .insert(path.join("::"));
            }
        }
        self
    }
}

trait FileOf {
    fn file_of(&self, path: &[String]) -> &str;
}

impl FileOf for Tree {
    /// The file of the longest module prefix of `path` (the crate root at least).
    fn file_of(&self, path: &[String]) -> &str {
        (0..=path.len())
            .rev()
            .find_map(|n| self.get(&path[..n]))
            .map(|m| m.file.as_str())
            .unwrap_or_default()
    }
}

/// Where the paths of one module are resolved.
struct Scope<'a> {
    tree: &'a Tree,
    module: &'a [String],
    aliases: &'a BTreeMap<String, Vec<String>>,
}

impl Scope<'_> {
    /// `path` as seen from this module, from the crate root; `None` when it starts outside
    /// the crate (an external crate, a local, the prelude).
    fn resolve(&self, path: &[String], depth: usize) -> Option<Vec<String>> {
        let first = path.first()?;
        let mut rest = &path[1..];
        let mut base = match first.as_str() {
            "crate" | "$crate" => Vec::new(),
            "self" => self.module.to_vec(),
            "super" => {
                let mut m = self.module.to_vec();
                m.pop()?;
                m
            }
            name => {
                let here = self.tree.get(self.module)?;
                if here.children.contains(name) {
                    let mut m = self.module.to_vec();
                    m.push(name.to_string());
                    m
                } else if let Some(target) = self.aliases.get(name) {
                    if depth > 8 || target.first().map(String::as_str) == Some(name) {
                        return None;
                    }
                    self.resolve(target, depth + 1)?
                } else {
                    return None;
                }
            }
        };
        while let Some(next) = rest.first() {
            match next.as_str() {
                "super" => {
                    base.pop()?;
                }
                "self" => {}
                _ => break,
            }
            rest = &rest[1..];
        }
        base.extend(rest.iter().cloned());
        Some(base)
    }
}

/// Every path named by some items: `use` trees (expanded), inline paths, paths in macro
/// calls.
#[derive(Default)]
struct Collector {
    paths: Vec<Vec<String>>,
}

impl<'ast> Visit<'ast> for Collector {
    fn visit_path(&mut self, p: &'ast syn::Path) {
        // One segment (`x`, `Foo`) is a local, a type in scope or a name a `use` brought in
        // (that `use` is the edge).
        if p.leading_colon.is_none() && p.segments.len() > 1 {
            self.paths
                .push(p.segments.iter().map(|s| ident(&s.ident)).collect());
        }
        syn::visit::visit_path(self, p);
    }

    fn visit_item_use(&mut self, u: &'ast syn::ItemUse) {
        if u.leading_colon.is_none() {
            let mut found = Vec::new();
            expand_use(&u.tree, &mut Vec::new(), &mut found);
            self.paths.extend(found.into_iter().map(|(path, _)| path));
        }
    }

    fn visit_macro(&mut self, m: &'ast syn::Macro) {
        self.visit_path(&m.path);
        macro_paths(m.tokens.clone(), &mut self.paths);
    }

    // A module inside a function body: not followed (none in the workspace).
    fn visit_item_mod(&mut self, _: &'ast syn::ItemMod) {}
}

/// The paths of a `use` tree, each with the name it brings in (none for a glob or `as _`).
fn expand_use(
    tree: &syn::UseTree,
    prefix: &mut Vec<String>,
    out: &mut Vec<(Vec<String>, Option<String>)>,
) {
    match tree {
        syn::UseTree::Path(p) => {
            prefix.push(ident(&p.ident));
            expand_use(&p.tree, prefix, out);
            prefix.pop();
        }
        syn::UseTree::Name(n) => {
            let (path, name) = named(prefix, ident(&n.ident));
            out.push((path, name));
        }
        syn::UseTree::Rename(r) => {
            let (path, _) = named(prefix, ident(&r.ident));
            let rename = ident(&r.rename);
            out.push((path, (rename != "_").then_some(rename)));
        }
        syn::UseTree::Glob(_) => out.push((prefix.clone(), None)),
        syn::UseTree::Group(g) => {
            for t in &g.items {
                expand_use(t, prefix, out);
            }
        }
    }
}

/// `prefix::name` and the name it brings in (`a::b::{self}` is `a::b`, bringing in `b`).
fn named(prefix: &[String], name: String) -> (Vec<String>, Option<String>) {
    if name == "self" {
        (prefix.to_vec(), prefix.last().cloned())
    } else {
        let mut path = prefix.to_vec();
        path.push(name.clone());
        (path, Some(name))
    }
}

/// The paths of two segments or more (`a::b`, `$crate::a`) in a macro's tokens; a path
/// after `::` (global) or `$` (a metavariable) is skipped.
fn macro_paths(tokens: TokenStream, out: &mut Vec<Vec<String>>) {
    let toks: Vec<TokenTree> = tokens.into_iter().collect();
    let is_punct =
        |i: usize, c: char| matches!(toks.get(i), Some(TokenTree::Punct(p)) if p.as_char() == c);
    let colon2 = |i: usize| {
        matches!(toks.get(i), Some(TokenTree::Punct(p)) if p.as_char() == ':' && p.spacing() == Spacing::Joint)
            && is_punct(i + 1, ':')
    };
    let mut i = 0;
    while i < toks.len() {
        let start = match &toks[i] {
            TokenTree::Group(g) => {
                macro_paths(g.stream(), out);
                None
            }
            TokenTree::Punct(p) if p.as_char() == '$' => match toks.get(i + 1) {
                Some(TokenTree::Ident(id)) if id == "crate" => Some(("$crate".to_string(), i + 2)),
                // A metavariable (`$x::y`): skip its name.
                Some(TokenTree::Ident(_)) => {
                    i += 2;
                    continue;
                }
                _ => None,
            },
            TokenTree::Ident(id) if !(i >= 2 && colon2(i - 2)) => Some((ident(id), i + 1)),
            _ => None,
        };
        let Some((first, mut j)) = start else {
            i += 1;
            continue;
        };
        let mut path = vec![first];
        while colon2(j) {
            match toks.get(j + 2) {
                Some(TokenTree::Ident(id)) => {
                    path.push(ident(id));
                    j += 3;
                }
                _ => break,
            }
        }
        if path.len() > 1 {
            out.push(path);
        }
        i = j;
    }
}

/// An identifier without its `r#`.
fn ident(id: &proc_macro2::Ident) -> String {
    let s = id.to_string();
    s.strip_prefix("r#").map(str::to_string).unwrap_or(s)
}

/// The folder of a `/`-separated path (`""` at the top).
fn parent(path: &str) -> String {
    path.rsplit_once('/')
        .map(|(d, _)| d.to_string())
        .unwrap_or_default()
}

/// The file name of a `/`-separated path without its `.rs`.
fn file_stem(path: &str) -> &str {
    let name = path.rsplit_once('/').map_or(path, |(_, n)| n);
    name.strip_suffix(".rs").unwrap_or(name)
}

/// `dir/rel`, with `.` and `..` resolved.
fn join(dir: &str, rel: &str) -> String {
    let mut parts: Vec<&str> = dir.split('/').filter(|s| !s.is_empty()).collect();
    for part in rel.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            p => parts.push(p),
        }
    }
    parts.join("/")
}

/// The circles of every crate of the workspace at `root`.
pub fn workspace_circles(root: &Path) -> Result<Vec<Circle>> {
    let mut found = Vec::new();
    for dir in crate_dirs(root)? {
        let mut sources = Sources::new();
        read_sources(&dir.join("src"), "src", &mut sources)?;
        let shown = dir.strip_prefix(root).unwrap_or(&dir).display().to_string();
        let roots = sources.keys().filter(|f| {
            matches!(f.as_str(), "src/lib.rs" | "src/main.rs")
                || f.strip_prefix("src/bin/")
                    .is_some_and(|b| !b.contains('/') || b.ends_with("/main.rs"))
        });
        for r in roots {
            let krate = format!("{shown} ({r})");
            found.extend(crate_circles(&krate, &sources, r).with_context(|| krate.clone())?);
        }
    }
    Ok(found)
}

/// The circles left (crate, files), each failing the check once it changes: a new circle
/// fails, and so does one of these once it is gone (remove it here). The one left is in the
/// nature of the thing: `cuGetProcAddress` (hooks/procaddr.rs) hands out the address of
/// every hook, its own included (hooks/table.rs), and the table finds every hook through the
/// re-exports of hooks/mod.rs; breaking it would take a registration at run time, which a
/// call arriving before it would escape. (The others went through a parent module whose
/// children named its items while it named theirs: fixed by moving the shared items into a
/// file of their own.)
pub const KNOWN: &[(&str, &[&str])] = &[(
    "hami-preload (src/lib.rs)",
    &[
        "src/hooks/mod.rs",
        "src/hooks/procaddr.rs",
        "src/hooks/table.rs",
    ],
)];

/// The circles of the workspace at `root` that are not in [`KNOWN`], and the entries of
/// [`KNOWN`] that are no circle any more.
pub fn unexpected(root: &Path) -> Result<(Vec<Circle>, Vec<String>)> {
    let found = workspace_circles(root)?;
    let is_known = |c: &Circle| {
        KNOWN
            .iter()
            .any(|(k, files)| *k == c.krate && c.files.iter().eq(files.iter()))
    };
    let stale = KNOWN
        .iter()
        .filter(|(k, files)| {
            !found
                .iter()
                .any(|c| c.krate == *k && c.files.iter().eq(files.iter()))
        })
        .map(|(k, files)| format!("{k}: {}", files.join(", ")))
        .collect();
    Ok((found.into_iter().filter(|c| !is_known(c)).collect(), stale))
}

/// Fail, listing them, if the workspace at `root` has circles not in [`KNOWN`] (or entries
/// of [`KNOWN`] that are gone).
pub fn check(root: &Path) -> Result<()> {
    let (new, stale) = unexpected(root)?;
    let mut msg = String::new();
    if !new.is_empty() {
        msg += &format!(
            "{} circle(s) between source files (move what ties them; xtask/src/circles.rs):\n",
            new.len()
        );
        msg.extend(new.iter().map(ToString::to_string));
    }
    if !stale.is_empty() {
        msg += "no circle any more (remove from KNOWN in xtask/src/circles.rs):\n";
        msg.extend(stale.iter().map(|s| format!("    {s}\n")));
    }
    if !msg.is_empty() {
        bail!("{msg}");
    }
    Ok(())
}

/// The folders under `root` with a `Cargo.toml` and a `src/` (not under `target/`, `fuzz/`,
/// `vendor/`, `node_modules/` or a hidden folder), sorted.
fn crate_dirs(root: &Path) -> Result<Vec<std::path::PathBuf>> {
    let mut found = Vec::new();
    let mut todo = vec![root.to_path_buf()];
    while let Some(dir) = todo.pop() {
        if dir.join("Cargo.toml").is_file() && dir.join("src").is_dir() {
            found.push(dir.clone());
        }
        for entry in std::fs::read_dir(&dir).with_context(|| format!("{}", dir.display()))? {
            let entry = entry?;
            let name = entry.file_name().to_string_lossy().to_string();
            let skip = name.starts_with('.')
                || matches!(name.as_str(), "target" | "fuzz" | "vendor" | "node_modules");
            if !skip && entry.file_type()?.is_dir() {
                todo.push(entry.path());
            }
        }
    }
    found.sort();
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

#[cfg(test)]
mod tests;
