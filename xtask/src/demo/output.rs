//! How the demo prints: step headers, checks, sizes, output lines.

use hami_test_harness::ProbeOutput;

/// One MiB.
pub(super) const MIB: u64 = 1 << 20;

pub(super) fn print_lines(lines: &[String]) {
    for l in lines {
        println!("    {l}");
    }
}

pub(super) fn print_stderr(out: &ProbeOutput) {
    if !out.stderr.trim().is_empty() {
        println!("\nthe preload's log (stderr, LIBCUDA_LOG_LEVEL=3):");
    }
    for l in out.stderr.lines() {
        println!("    {l}");
    }
}

pub(super) fn human(b: u64) -> String {
    if b >= 1 << 30 && b & ((1 << 28) - 1) == 0 {
        format!("{} GiB", b as f64 / (1u64 << 30) as f64)
    } else if b >= MIB {
        format!("{:.0} MiB", b as f64 / MIB as f64)
    } else {
        format!("{b} B")
    }
}

pub(super) fn header(n: &str, title: &str) {
    println!(
        "\n=== {n}  {title} {}",
        "=".repeat(60usize.saturating_sub(title.len()))
    );
}

pub(super) fn check(what: &str) {
    println!("  ok: {what}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn human_sizes() {
        assert_eq!(human(1 << 30), "1 GiB");
        assert_eq!(human(5 * 256 * MIB), "1.25 GiB");
        assert_eq!(human(384 * MIB), "384 MiB");
        assert_eq!(human(12), "12 B");
    }
}
