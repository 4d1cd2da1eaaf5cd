//! File sizes (issue 32): no production source file over [`MAX_CODE_LINES`] lines of code,
//! no test file over [`MAX_TEST_LINES`] lines. Run by `cargo xtask circles`, the lint phase of
//! `cargo xtask test` and this module's `the_workspace_has_no_file_over_its_size` test.
//!
//! Every `.rs` file of the workspace is looked at (not under `target/`, `third_party/`,
//! `vendor/`, `node_modules/` or a hidden folder). A *test file* is one named `tests.rs` or
//! `*_tests.rs`, or under a folder named `tests` (a crate's integration tests, a module's
//! `<module>/tests/`); its every line counts. In any other file, a line of code is a line that
//! is neither blank nor a comment (`//`, `///`, `//!`), outside the inline test modules
//! (`#[cfg(test)] mod x { ... }`, which end at the first line that closes them at the
//! indentation of their `mod`, as rustfmt writes them). A production file that grows past
//! the limit is split by what its parts hold; an inline test module that grows is moved
//! beside its module (`<module>/tests.rs`), and a test file into submodules by topic.

use std::fmt;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

/// Lines of code a production file may hold.
pub const MAX_CODE_LINES: usize = 600;

/// Lines a test file may hold.
pub const MAX_TEST_LINES: usize = 800;

/// A file over its limit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Oversized {
    /// The file, relative to the workspace root (`/`-separated).
    pub path: String,
    /// Whether it is a test file (see [`is_test_file`]).
    pub test: bool,
    /// Its lines of code (production) or lines (test).
    pub lines: usize,
}

impl fmt::Display for Oversized {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.test {
            write!(
                f,
                "{}: {} lines, over {MAX_TEST_LINES} for a test file (split it into submodules \
                 by topic)",
                self.path, self.lines
            )
        } else {
            write!(
                f,
                "{}: {} lines of code, over {MAX_CODE_LINES} (split it by what its parts hold; \
                 inline tests are not counted)",
                self.path, self.lines
            )
        }
    }
}

/// Whether the file at `path` (relative, `/`-separated) is a test file: named `tests.rs` or
/// `*_tests.rs`, or under a folder named `tests`.
pub fn is_test_file(path: &str) -> bool {
    let mut parts: Vec<&str> = path.split('/').collect();
    let name = parts.pop().unwrap_or_default();
    let stem = name.strip_suffix(".rs").unwrap_or(name);
    stem == "tests" || stem.ends_with("_tests") || parts.contains(&"tests")
}

/// The lines of code of a production file's `text`: neither blank nor a `//` comment, and
/// outside its inline `#[cfg(test)]` modules.
pub fn code_lines(text: &str) -> usize {
    let lines: Vec<&str> = text.lines().collect();
    let mut count = 0;
    let mut i = 0;
    while i < lines.len() {
        if let Some(end) = inline_test_module_end(&lines, i) {
            i = end + 1;
            continue;
        }
        let t = lines[i].trim();
        if !t.is_empty() && !t.starts_with("//") {
            count += 1;
        }
        i += 1;
    }
    count
}

/// If `lines[i]` is the `#[cfg(test)]` of an inline module (other attributes may stand
/// between it and the `mod` line), the index of the module's last line.
fn inline_test_module_end(lines: &[&str], i: usize) -> Option<usize> {
    if lines[i].trim() != "#[cfg(test)]" {
        return None;
    }
    let mut j = i + 1;
    while j < lines.len() && lines[j].trim_start().starts_with("#[") {
        j += 1;
    }
    let line = *lines.get(j)?;
    let t = line.trim();
    let decl = t
        .strip_prefix("pub ")
        .or_else(|| t.strip_prefix("pub(crate) "))
        .or_else(|| t.strip_prefix("pub(super) "))
        .unwrap_or(t);
    if !decl.starts_with("mod ") {
        return None;
    }
    if decl.ends_with("{}") {
        return Some(j);
    }
    if !decl.ends_with('{') {
        return None; // `mod tests;`: its file is a test file of its own
    }
    let close = format!("{}}}", &line[..line.len() - line.trim_start().len()]);
    lines[j + 1..]
        .iter()
        .position(|l| l.trim_end() == close)
        .map(|k| j + 1 + k)
}

/// Every file of the workspace at `root` over its limit, sorted by path.
pub fn oversized(root: &Path) -> Result<Vec<Oversized>> {
    let mut files = Vec::new();
    rust_files(root, &mut files)?;
    let mut found = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).with_context(|| file.display().to_string())?;
        let path = file
            .strip_prefix(root)
            .unwrap_or(&file)
            .to_string_lossy()
            .replace('\\', "/");
        let test = is_test_file(&path);
        let (lines, max) = if test {
            (text.lines().count(), MAX_TEST_LINES)
        } else {
            (code_lines(&text), MAX_CODE_LINES)
        };
        if lines > max {
            found.push(Oversized { path, test, lines });
        }
    }
    found.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(found)
}

/// Fail, naming them, if the workspace at `root` has files over their limits.
pub fn check(root: &Path) -> Result<()> {
    let found = oversized(root)?;
    if !found.is_empty() {
        let mut msg = format!(
            "{} file(s) over their size (xtask/src/sizes.rs):\n",
            found.len()
        );
        msg.extend(found.iter().map(|o| format!("    {o}\n")));
        bail!("{msg}");
    }
    Ok(())
}

/// Every `.rs` file under `dir` (not under `target/`, `third_party/`, `vendor/`,
/// `node_modules/` or a hidden folder).
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    for entry in std::fs::read_dir(dir).with_context(|| format!("{}", dir.display()))? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().to_string();
        let kind = entry.file_type()?;
        if kind.is_dir() {
            let skip = name.starts_with('.')
                || matches!(
                    name.as_str(),
                    "target" | "third_party" | "vendor" | "node_modules"
                );
            if !skip {
                rust_files(&entry.path(), out)?;
            }
        } else if kind.is_file() && name.ends_with(".rs") {
            out.push(entry.path());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
