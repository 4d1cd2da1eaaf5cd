//! `cargo xtask bench exec` (also part of `cargo xtask bench`): what `libhami_preload.so`
//! costs every exec.
//!
//! HAMi mounts the preload into every container through `/etc/ld.so.preload`, so every
//! program a container runs (shells, `ls`, health checks) loads it, CUDA or not. This bench
//! execs `/bin/true` [`DEFAULT_EXECS`] times per round with `LD_PRELOAD` (never
//! `/etc/ld.so.preload`, which would affect the whole machine) set to:
//!
//! * nothing (no preload);
//! * an empty preload: a C library with one function and no constructor of its own, built in
//!   the same run with `cc`;
//! * the same empty preload linked with `libgcc_s` (what that library alone costs an exec);
//! * the release `libhami_preload.so` (built by the bench);
//! * every `--compare` library (e.g. an older build of the preload).
//!
//! Rounds alternate the variants (the order rotates every round); each figure is the median
//! over the rounds of the wall time and of the children's CPU time (`getrusage
//! (RUSAGE_CHILDREN)`, user + system) per exec, with the lowest round's CPU time and the
//! minor page faults per exec (`ru_minflt`, independent of the load). The load average
//! (`/proc/loadavg`) is printed before and after: the figures are only comparable on a
//! quiet host.
//! `HAMI_BENCH_EXECS` (default 300) and `HAMI_BENCH_ROUNDS` (default 9) tune it.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{ensure, Context, Result};

use crate::util::{cargo, run_checked};

/// Execs of `/bin/true` per variant and round.
pub const DEFAULT_EXECS: usize = 300;
/// Rounds (each runs every variant once).
pub const DEFAULT_ROUNDS: usize = 9;

/// The program every round execs.
const PROGRAM: &str = "/bin/true";

/// The empty preload's source: one exported function, no constructor, no data.
const EMPTY_C: &str = "int hami_bench_empty_preload(void) { return 0; }\n";

/// One thing `LD_PRELOAD` is set to.
#[derive(Debug, Clone, PartialEq)]
pub struct Variant {
    /// What the table calls it.
    pub label: String,
    /// The library, or `None` for no preload at all.
    pub preload: Option<PathBuf>,
}

/// Median cost per exec of one variant, in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Cost {
    /// Wall time per exec (spawn to reaped).
    pub wall_ms: f64,
    /// The child's CPU time (user + system) per exec.
    pub cpu_ms: f64,
    /// The lowest CPU time per exec of any round (the least disturbed one: on a loaded host
    /// the median drifts with the load, the minimum much less).
    pub cpu_min_ms: f64,
    /// Minor page faults per exec (`ru_minflt`): independent of the load.
    pub faults: f64,
}

/// What the bench measured.
#[derive(Debug, Clone, PartialEq)]
pub struct ExecFigures {
    /// Execs per variant and round.
    pub execs: usize,
    /// Rounds.
    pub rounds: usize,
    /// `/proc/loadavg`'s first three fields before and after.
    pub load_before: String,
    /// As above, after the last round.
    pub load_after: String,
    /// Every variant with its median cost, in the order of [`variants`].
    pub rows: Vec<(Variant, Cost)>,
}

/// The variants the bench measures: none, empty, empty + libgcc_s, the preload, `compare`.
pub fn variants(
    empty: &Path,
    empty_gcc_s: &Path,
    preload: &Path,
    compare: &[PathBuf],
) -> Vec<Variant> {
    let mut v = vec![
        Variant {
            label: "no preload".into(),
            preload: None,
        },
        Variant {
            label: "empty preload".into(),
            preload: Some(empty.to_path_buf()),
        },
        Variant {
            label: "empty preload + libgcc_s".into(),
            preload: Some(empty_gcc_s.to_path_buf()),
        },
        Variant {
            label: "libhami_preload.so".into(),
            preload: Some(preload.to_path_buf()),
        },
    ];
    v.extend(compare.iter().map(|p| Variant {
        label: format!("compare: {}", p.display()),
        preload: Some(p.clone()),
    }));
    v
}

/// Runs the bench: builds the release preload and the empty preloads, measures, prints.
pub fn bench_exec(root: &Path, target: &Path, compare: &[PathBuf]) -> Result<ExecFigures> {
    for p in compare {
        ensure!(p.is_file(), "--compare {}: no such file", p.display());
    }
    run_checked(cargo(root).args(["build", "--release", "-p", "hami-preload"]))?;
    let preload = target.join("release").join("libhami_preload.so");
    ensure!(preload.is_file(), "{} was not built", preload.display());

    let dir = std::env::temp_dir().join(format!("hami-bench-exec-{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let _cleanup = RemoveOnDrop(dir.clone());
    let (empty, empty_gcc_s) = build_empty_preloads(&dir)?;

    let execs = env_or("HAMI_BENCH_EXECS", DEFAULT_EXECS).max(1);
    let rounds = env_or("HAMI_BENCH_ROUNDS", DEFAULT_ROUNDS).max(1);
    let vs = variants(&empty, &empty_gcc_s, &preload, compare);
    let load_before = loadavg();
    println!(
        "exec cost: {execs} execs of {PROGRAM} per variant and round, {rounds} rounds, \
         alternated; load average {load_before}"
    );
    // Warm-up: the page cache and the loader's cache, for every library.
    for v in &vs {
        measure(v, 20)?;
    }
    let mut samples: Vec<Vec<Cost>> = vec![Vec::with_capacity(rounds); vs.len()];
    for r in 0..rounds {
        for k in 0..vs.len() {
            let i = (k + r) % vs.len();
            samples[i].push(measure(&vs[i], execs)?);
        }
    }
    let rows: Vec<(Variant, Cost)> = vs
        .into_iter()
        .zip(samples)
        .map(|(v, s)| (v, median_cost(&s)))
        .collect();
    let figures = ExecFigures {
        execs,
        rounds,
        load_before,
        load_after: loadavg(),
        rows,
    };
    print!("{}", figures.table());
    Ok(figures)
}

/// Builds the empty preload and the empty preload linked with `libgcc_s` in `dir`.
fn build_empty_preloads(dir: &Path) -> Result<(PathBuf, PathBuf)> {
    let src = dir.join("empty.c");
    std::fs::write(&src, EMPTY_C).with_context(|| format!("writing {}", src.display()))?;
    let cc = std::env::var_os("CC").unwrap_or_else(|| "cc".into());
    let empty = dir.join("libempty.so");
    let empty_gcc_s = dir.join("libempty_gcc_s.so");
    run_checked(
        Command::new(&cc)
            .args(["-shared", "-fPIC", "-O2", "-o"])
            .arg(&empty)
            .arg(&src),
    )?;
    run_checked(
        Command::new(&cc)
            .args(["-shared", "-fPIC", "-O2", "-o"])
            .arg(&empty_gcc_s)
            .arg(&src)
            .args(["-Wl,--no-as-needed", "-lgcc_s"]),
    )?;
    Ok((empty, empty_gcc_s))
}

/// `n` execs of [`PROGRAM`] with `v`'s preload: wall and child CPU time per exec.
fn measure(v: &Variant, n: usize) -> Result<Cost> {
    let mut cmd = Command::new(PROGRAM);
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    match &v.preload {
        Some(p) => cmd.env("LD_PRELOAD", p),
        None => cmd.env_remove("LD_PRELOAD"),
    };
    let (cpu0, faults0) = children();
    let t0 = Instant::now();
    for _ in 0..n {
        let st = cmd
            .status()
            .with_context(|| format!("exec of {PROGRAM} ({})", v.label))?;
        ensure!(st.success(), "{PROGRAM} with {} failed: {st}", v.label);
    }
    let wall = t0.elapsed().as_secs_f64() * 1000.0;
    let (cpu1, faults1) = children();
    let cpu = (cpu1 - cpu0) / n as f64;
    Ok(Cost {
        wall_ms: wall / n as f64,
        cpu_ms: cpu,
        cpu_min_ms: cpu,
        faults: (faults1 - faults0) as f64 / n as f64,
    })
}

/// CPU time (user + system, ms) and minor page faults of every reaped child so far.
fn children() -> (f64, i64) {
    // SAFETY: an all-zero rusage is a valid value of the plain C struct.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: valid out pointer; RUSAGE_CHILDREN is a valid `who`.
    unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut ru) };
    let ms = |t: libc::timeval| t.tv_sec as f64 * 1000.0 + t.tv_usec as f64 / 1000.0;
    (ms(ru.ru_utime) + ms(ru.ru_stime), ru.ru_minflt)
}

/// The median of each field separately, and the lowest CPU time.
fn median_cost(s: &[Cost]) -> Cost {
    Cost {
        wall_ms: median(s.iter().map(|c| c.wall_ms).collect()),
        cpu_ms: median(s.iter().map(|c| c.cpu_ms).collect()),
        cpu_min_ms: s.iter().map(|c| c.cpu_min_ms).fold(f64::NAN, f64::min),
        faults: median(s.iter().map(|c| c.faults).collect()),
    }
}

/// The median (mean of the middle two for an even count); NaN for none.
fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let m = v.len() / 2;
    if v.len() % 2 == 1 {
        v[m]
    } else {
        (v[m - 1] + v[m]) / 2.0
    }
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|| "?".into())
}

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

impl ExecFigures {
    /// The cost of the variant labelled `label`.
    pub fn cost(&self, label: &str) -> Option<Cost> {
        self.rows
            .iter()
            .find(|(v, _)| v.label == label)
            .map(|(_, c)| *c)
    }

    /// The printed table: every variant, and what it adds to no preload and to the empty one.
    pub fn table(&self) -> String {
        let none = self.cost("no preload");
        let empty = self.cost("empty preload");
        let mut s = String::new();
        let _ = writeln!(
            s,
            "{:<40} {:>8} {:>8} {:>8} {:>7} {:>14} {:>13} {:>13}",
            "per exec (median; ms, faults)",
            "wall",
            "cpu",
            "cpu min",
            "faults",
            "wall vs empty",
            "cpu vs empty",
            "min vs empty"
        );
        for (v, c) in &self.rows {
            let vs = |base: Option<Cost>, f: fn(&Cost) -> f64| {
                base.map_or_else(|| "-".into(), |b| format!("{:+.3}", f(c) - f(&b)))
            };
            let _ = writeln!(
                s,
                "{:<40} {:>8.3} {:>8.3} {:>8.3} {:>7.1} {:>14} {:>13} {:>13}",
                v.label,
                c.wall_ms,
                c.cpu_ms,
                c.cpu_min_ms,
                c.faults,
                vs(empty, |c| c.wall_ms),
                vs(empty, |c| c.cpu_ms),
                vs(empty, |c| c.cpu_min_ms),
            );
        }
        if let (Some(n), Some(e)) = (none, empty) {
            let _ = writeln!(
                s,
                "(the empty preload itself: {:+.3} ms wall, {:+.3} ms cpu over no preload)",
                e.wall_ms - n.wall_ms,
                e.cpu_ms - n.cpu_ms
            );
        }
        let _ = writeln!(
            s,
            "load average {} before, {} after ({} execs x {} rounds per variant)",
            self.load_before, self.load_after, self.execs, self.rounds
        );
        s
    }

    /// The row of `cargo xtask bench`'s summary table.
    pub fn summary_row(&self) -> Option<String> {
        let n = self.cost("no preload")?;
        let e = self.cost("empty preload")?;
        let g = self.cost("empty preload + libgcc_s")?;
        let h = self.cost("libhami_preload.so")?;
        Some(format!(
            "| exec of `{PROGRAM}` with `LD_PRELOAD`, ms per exec (median of {} rounds x {}, alternated; load {} / {}), wall / CPU: no preload {:.3} / {:.3}, empty preload {:.3} / {:.3}, empty + `libgcc_s` {:.3} / {:.3}, `libhami_preload.so` {:.3} / {:.3}; **added vs empty** (lowest round's CPU; page faults) | **{:+.3} / {:+.3} ms** ({:+.3} ms; {:+.1} faults) | within +0.05 ms of an empty preload |\n",
            self.rounds,
            self.execs,
            self.load_before,
            self.load_after,
            n.wall_ms,
            n.cpu_ms,
            e.wall_ms,
            e.cpu_ms,
            g.wall_ms,
            g.cpu_ms,
            h.wall_ms,
            h.cpu_ms,
            h.wall_ms - e.wall_ms,
            h.cpu_ms - e.cpu_ms,
            h.cpu_min_ms - e.cpu_min_ms,
            h.faults - e.faults
        ))
    }
}

struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn figures() -> ExecFigures {
        let vs = variants(
            Path::new("/e.so"),
            Path::new("/g.so"),
            Path::new("/h.so"),
            &[PathBuf::from("/old.so")],
        );
        let costs = [
            (0.5, 0.4),
            (0.55, 0.45),
            (0.6, 0.5),
            (0.58, 0.47),
            (0.75, 0.7),
        ];
        ExecFigures {
            execs: 300,
            rounds: 9,
            load_before: "0.10 0.20 0.30".into(),
            load_after: "0.15 0.20 0.30".into(),
            rows: vs
                .into_iter()
                .zip(costs)
                .map(|(v, (w, c))| {
                    (
                        v,
                        Cost {
                            wall_ms: w,
                            cpu_ms: c,
                            cpu_min_ms: c - 0.1,
                            faults: w * 100.0,
                        },
                    )
                })
                .collect(),
        }
    }

    #[test]
    fn variants_cover_none_empty_gcc_s_preload_and_comparisons() {
        let f = figures();
        let labels: Vec<&str> = f.rows.iter().map(|(v, _)| v.label.as_str()).collect();
        assert_eq!(
            labels,
            [
                "no preload",
                "empty preload",
                "empty preload + libgcc_s",
                "libhami_preload.so",
                "compare: /old.so"
            ]
        );
        assert_eq!(f.rows[0].0.preload, None);
        assert_eq!(f.rows[3].0.preload.as_deref(), Some(Path::new("/h.so")));
    }

    #[test]
    fn table_and_summary_show_the_cost_against_the_empty_preload() {
        let f = figures();
        let t = f.table();
        assert!(t.contains("libhami_preload.so"), "{t}");
        assert!(t.contains("+0.030"), "{t}"); // 0.58 - 0.55 wall
        assert!(t.contains("+0.020"), "{t}"); // 0.47 - 0.45 cpu
        assert!(t.contains("+0.200"), "{t}"); // the comparison's wall
        assert!(t.contains("0.10 0.20 0.30 before"), "{t}");
        let row = f.summary_row().unwrap();
        assert!(
            row.contains("**+0.030 / +0.020 ms** (+0.020 ms; +3.0 faults)"),
            "{row}"
        );
        assert!(row.contains("empty + `libgcc_s` 0.600 / 0.500"), "{row}");
        let mut missing = f.clone();
        missing.rows.retain(|(v, _)| v.label != "empty preload");
        assert_eq!(missing.summary_row(), None);
    }

    #[test]
    fn rounds_combine_into_medians_and_the_lowest_cpu() {
        let c = |w: f64, cpu: f64, f: f64| Cost {
            wall_ms: w,
            cpu_ms: cpu,
            cpu_min_ms: cpu,
            faults: f,
        };
        let m = median_cost(&[c(1.0, 0.5, 60.0), c(3.0, 0.3, 62.0), c(2.0, 0.9, 61.0)]);
        assert_eq!(m, c(2.0, 0.5, 61.0).with_min(0.3));
    }

    impl Cost {
        fn with_min(mut self, m: f64) -> Cost {
            self.cpu_min_ms = m;
            self
        }
    }

    #[test]
    fn median_is_the_middle_value() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0, 2.0, 3.0]), 2.5);
        assert!(median(vec![]).is_nan());
    }

    #[test]
    fn children_cpu_time_grows_with_a_child() {
        let (before, faults) = children();
        let st = Command::new("/bin/sh")
            .args(["-c", "i=0; while [ $i -lt 20000 ]; do i=$((i+1)); done"])
            .status()
            .unwrap();
        assert!(st.success());
        let (after, faults_after) = children();
        assert!(after > before);
        assert!(faults_after > faults);
    }
}
