//! The one parser of the test programs' output lines. Every program prints one line per
//! operation, whitespace-separated words, most of them `key=value`: `cudaprobe` puts the
//! operation in a field (`op=alloc size=1 rc=0 name=CUDA_SUCCESS`), `hprobe`, `nvmlprobe` and
//! `tortureload` lead with it as a bare word (`alloc rc=0 ptr=0x7f...`). [`KvLine`] reads both
//! shapes; [`KvOutput`] is a finished program's output read line by line.

use std::collections::BTreeMap;
use std::process::Output;

/// A numeric field's value: decimal, or hex with a `0x` prefix.
pub fn parse_num(v: &str) -> Option<u64> {
    match v.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16).ok(),
        None => v.parse().ok(),
    }
}

/// The text of field `key` in `line` (the first `key=...` word), without building a
/// [`KvLine`] (for hot loops reading a stream of lines).
pub fn field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(key)?.strip_prefix('='))
}

/// One output line: its first word and its `key=value` words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvLine {
    /// The first word (the operation, in the programs that lead with it).
    pub head: String,
    /// Every `key=value` word (the first word too, when it is one). A repeated key keeps the
    /// last value.
    pub fields: BTreeMap<String, String>,
    /// The raw line.
    pub raw: String,
}

impl KvLine {
    /// Parses a line; `None` for a blank one.
    pub fn parse(line: &str) -> Option<KvLine> {
        let head = line.split_whitespace().next()?.to_string();
        let fields = line
            .split_whitespace()
            .filter_map(|kv| {
                kv.split_once('=')
                    .map(|(k, v)| (k.to_string(), v.to_string()))
            })
            .collect();
        Some(KvLine {
            head,
            fields,
            raw: line.to_string(),
        })
    }

    /// A field's text.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.fields.get(key).map(String::as_str)
    }

    /// A numeric field (decimal or `0x` hex).
    pub fn num(&self, key: &str) -> Option<u64> {
        parse_num(self.get(key)?)
    }
}

/// The output of a finished program that prints one `OP key=value ...` line per operation
/// (`hprobe`, `nvmlprobe`).
pub struct KvOutput {
    /// Raw output.
    pub out: Output,
    /// `(op, fields)` per non-blank stdout line, in order.
    pub lines: Vec<(String, BTreeMap<String, String>)>,
}

impl From<Output> for KvOutput {
    fn from(out: Output) -> KvOutput {
        let lines = String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(KvLine::parse)
            .map(|l| (l.head, l.fields))
            .collect();
        KvOutput { out, lines }
    }
}

impl KvOutput {
    /// Field `key` of the `n`-th line (panics with the whole output if missing).
    pub fn field(&self, n: usize, key: &str) -> String {
        self.lines
            .get(n)
            .and_then(|(_, f)| f.get(key).cloned())
            .unwrap_or_else(|| panic!("line {n} has no {key}: {}", self.dump()))
    }

    /// The rc of the `n`-th line.
    pub fn rc(&self, n: usize) -> i64 {
        let rc = self.field(n, "rc");
        rc.parse()
            .unwrap_or_else(|_| panic!("line {n} has rc={rc}, not a number: {}", self.dump()))
    }

    /// Every rc, in order (panics if a line has none).
    pub fn rcs(&self) -> Vec<i64> {
        (0..self.lines.len()).map(|n| self.rc(n)).collect()
    }

    /// stdout and stderr, for assertion messages.
    pub fn dump(&self) -> String {
        format!(
            "status {:?}\nstdout:\n{}\nstderr:\n{}",
            self.out.status,
            String::from_utf8_lossy(&self.out.stdout),
            String::from_utf8_lossy(&self.out.stderr)
        )
    }

    /// stderr.
    pub fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.out.stderr).into_owned()
    }

    /// Whether the process exited with 0.
    pub fn ok(&self) -> bool {
        self.out.status.success()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_shapes() {
        let l = KvLine::parse("op=alloc size=0x10 rc=0").unwrap();
        assert_eq!(l.get("op"), Some("alloc"));
        assert_eq!(l.num("size"), Some(16));
        let l = KvLine::parse("  info rc=0 free=12 total=34").unwrap();
        assert_eq!(l.head, "info");
        assert_eq!(l.num("free"), Some(12));
        assert_eq!(l.get("info"), None);
        assert!(KvLine::parse("   ").is_none());
    }

    #[test]
    fn field_scan_matches_whole_keys() {
        let line = "tick ops=5 op=9 rc=0";
        assert_eq!(field(line, "op"), Some("9"));
        assert_eq!(field(line, "ops"), Some("5"));
        assert_eq!(field(line, "o"), None);
        assert_eq!(parse_num("0xff"), Some(255));
        assert_eq!(parse_num("x"), None);
    }
}
