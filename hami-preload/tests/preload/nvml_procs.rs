//! NVML's process lists inside a container (issue 20, HAMi issues #235, #1339-#1341): under
//! container A's preload, every version of the compute, graphics and MPS lists (and
//! `nvmlDeviceGetRunningProcessDetailList` in each mode) shows A's
//! processes only, with their pids as A sees them and their usage from A's region, never
//! container B's; with `nvml.h`'s `*infoCount` protocol and each version's struct size.
//! Two "containers" are two regions on one fake GPU; the pid-namespace case runs A inside
//! `unshare --pid --fork --mount` with its own `/proc` (the fake NVML reports host pids,
//! like the real driver, through `FAKE_CUDA_HOST_PROC`).

use crate::support::*;
use hami_test_harness::RunningProbe;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

/// `tests/programs/nvmlprocs.c`, compiled once per binary.
fn nvmlprocs() -> &'static PathBuf {
    static P: OnceLock<PathBuf> = OnceLock::new();
    P.get_or_init(|| {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/programs/nvmlprocs.c");
        let out = Artifacts::get().programs_dir.join("nvmlprocs");
        hami_test_harness::cc(&src, &out, &["-O2", "-Wall", "-ldl"]);
        out
    })
}

/// Every list function `nvmlprocs` calls.
const FNS: [&str; 12] = [
    "compute_v1",
    "compute_v2",
    "compute_v3",
    "graphics_v1",
    "graphics_v2",
    "graphics_v3",
    "mps_v1",
    "mps_v2",
    "mps_v3",
    "detail_compute",
    "detail_graphics",
    "detail_mps",
];

/// Every list reports the device's processes in the fake NVML.
const ALL_LISTS: (&str, &str) = ("FAKE_NVML_PROCESS_LISTS", "compute,graphics,mps");

/// Container A's and B's environments: one fake GPU (A's state file), two regions, 4 GiB
/// quotas, contexts charged 0 in the regions (the fake driver still takes 300 MiB for each:
/// the driver's per-process figure is the region's + 300 MiB).
fn containers() -> (Env, Env) {
    let a = Env::new()
        .set("CUDA_DEVICE_MEMORY_LIMIT", "4G")
        .set("HAMI_CONTEXT_OVERHEAD", "0");
    let state = a.dir().join("fake-cuda.state");
    let b = Env::new()
        .set("FAKE_CUDA_STATE", state.to_str().unwrap())
        .set("CUDA_DEVICE_MEMORY_LIMIT", "4G")
        .set("HAMI_CONTEXT_OVERHEAD", "0");
    (a, b)
}

/// A cudaprobe under `env`'s preload that allocates `size` and waits (until killed).
fn holder(env: &Env, size: &str) -> RunningProbe {
    let mut c = env.command(&Artifacts::get().cudaprobe, true);
    c.args(["init", "ctx", "alloc", size, "wait"])
        .stdin(Stdio::piped());
    let mut p = RunningProbe::start(c);
    let a = p.wait_for("alloc");
    assert!(a.ok(), "alloc {size}: {:?}", p.seen);
    p.wait_for("wait");
    p
}

/// What `nvmlprocs` printed: per function, its lines.
struct Lists(Probe);

impl Lists {
    fn of(out: std::process::Output) -> Lists {
        let p = Probe::from(out);
        assert!(
            p.lines.iter().any(|(h, f)| h == "init" && f["rc"] == "0"),
            "{}",
            p.dump()
        );
        Lists(p)
    }

    fn line(&self, head: &str, func: &str) -> &std::collections::BTreeMap<String, String> {
        self.0
            .lines
            .iter()
            .find(|(h, f)| h == head && f.get("fn").map(String::as_str) == Some(func))
            .map(|(_, f)| f)
            .unwrap_or_else(|| panic!("no {head} line for {func}: {}", self.0.dump()))
    }

    /// `(pid, used)` of every entry `func` returned.
    fn procs(&self, func: &str) -> BTreeSet<(u32, u64)> {
        self.0
            .lines
            .iter()
            .filter(|(h, f)| h == "proc" && f["fn"] == func)
            .map(|(_, f)| (f["pid"].parse().unwrap(), f["used"].parse().unwrap()))
            .collect()
    }

    fn pids(&self, func: &str) -> BTreeSet<u32> {
        self.procs(func).into_iter().map(|(p, _)| p).collect()
    }

    /// `nvml.h`'s protocol for a list of `n` entries: the size query (`*infoCount` 0, NULL
    /// array) says `NVML_ERROR_INSUFFICIENT_SIZE` with `n` (`NVML_SUCCESS` with 0 when empty),
    /// a buffer one short says the same, a NULL `infoCount` is `NVML_ERROR_INVALID_ARGUMENT`,
    /// and the full call writes exactly `n` entries of the version's size (no byte beyond).
    fn check_protocol(&self, func: &str, n: usize) {
        let d = self.0.dump();
        let q = self.line("query", func);
        let expect_rc = if n == 0 { "0" } else { "7" };
        assert_eq!(q["rc"], expect_rc, "{func} size query: {d}");
        assert_eq!(q["count"], n.to_string(), "{func} size query: {d}");
        if n > 0 {
            let s = self.line("small", func);
            assert_eq!(s["rc"], "7", "{func} one short: {d}");
            assert_eq!(s["count"], n.to_string(), "{func} one short: {d}");
        }
        assert_eq!(self.line("nullcount", func)["rc"], "2", "{func}: {d}");
        let l = self.line("list", func);
        assert_eq!(l["rc"], "0", "{func}: {d}");
        assert_eq!(l["count"], n.to_string(), "{func}: {d}");
        assert_eq!(l["guard"], "1", "{func} wrote past its entries: {d}");
        if !func.ends_with("_v1") {
            for (_, f) in self
                .0
                .lines
                .iter()
                .filter(|(h, f)| h == "proc" && f["fn"] == func)
            {
                assert_eq!(f["gi"], u32::MAX.to_string(), "{func}: {d}");
                assert_eq!(f["ci"], u32::MAX.to_string(), "{func}: {d}");
            }
        }
    }
}

/// Runs `nvmlprocs --index 0` under `env` (with its preload if `preload`), every list on.
fn list(env: &Env, preload: bool) -> Lists {
    let out = env
        .command(nvmlprocs(), preload)
        .env(ALL_LISTS.0, ALL_LISTS.1)
        .args(["--index", "0"])
        .output()
        .expect("run nvmlprocs");
    Lists::of(out)
}

#[test]
fn the_process_lists_show_only_the_containers_processes_with_their_region_usage() {
    let (a, b) = containers();
    let a1 = holder(&a, "256M");
    let a2 = holder(&a, "512M");
    let b1 = holder(&b, "768M");
    let ctx = 300 * MB;

    // Without the preload: the driver's view, every process with its context.
    let plain = list(&a, false);
    for f in FNS {
        assert_eq!(
            plain.procs(f),
            BTreeSet::from([
                (a1.pid, 256 * MB + ctx),
                (a2.pid, 512 * MB + ctx),
                (b1.pid, 768 * MB + ctx)
            ]),
            "{f}: {}",
            plain.0.dump()
        );
        plain.check_protocol(f, 3);
    }

    // Under A's preload: A's two processes, with what A's region holds for each.
    let in_a = list(&a, true);
    for f in FNS {
        assert_eq!(
            in_a.procs(f),
            BTreeSet::from([(a1.pid, 256 * MB), (a2.pid, 512 * MB)]),
            "{f}: {}",
            in_a.0.dump()
        );
        in_a.check_protocol(f, 2);
    }
    // Under B's: B's one.
    let in_b = list(&b, true);
    for f in FNS {
        assert_eq!(in_b.procs(f), BTreeSet::from([(b1.pid, 768 * MB)]), "{f}");
        in_b.check_protocol(f, 1);
    }
    // Each slot recorded its host pid (here the same as its pid: no pid namespace).
    let r = a.region();
    let mut hp: Vec<u32> = r
        .snapshot()
        .slots
        .iter()
        .map(|s| r.host_pid(s.index))
        .collect();
    hp.sort_unstable();
    let mut want = vec![a1.pid, a2.pid];
    want.sort_unstable();
    assert_eq!(hp, want);

    // A container without a quota: the preload is transparent.
    let free = Env::new().set(
        "FAKE_CUDA_STATE",
        a.dir().join("fake-cuda.state").to_str().unwrap(),
    );
    let open = list(&free, true);
    for f in FNS {
        assert_eq!(open.procs(f), plain.procs(f), "{f}: {}", open.0.dump());
    }
    for p in [a1, a2, b1] {
        p.kill();
    }
}

/// The shell script run as pid 1 of a new pid namespace: A's `/proc` is the namespace's own,
/// the host's stays visible to the fake at `$HOSTPROC`; A's two holders start one after the
/// other (each finds its host pid from the driver's list around its context creation), then
/// `nvmlprocs` runs with and without A's preload. Exiting kills the namespace's processes.
const NAMESPACE_SCRIPT: &str = r#"
set -e
mkdir -p "$HOSTPROC"
mount --bind /proc "$HOSTPROC"
mount -t proc proc /proc
export FAKE_CUDA_HOST_PROC="$HOSTPROC"
started() {
  i=0
  until grep -q '^op=alloc' "$1"; do
    i=$((i+1)); [ $i -lt 600 ] || { echo "timeout file=$1"; cat "$1"; exit 3; }
    sleep 0.05
  done
}
LD_PRELOAD="$PRELOAD" "$CUDAPROBE" init ctx alloc 256M sleep 600 > "$WORK/a1.out" 2>&1 &
started "$WORK/a1.out"
LD_PRELOAD="$PRELOAD" "$CUDAPROBE" init ctx alloc 512M sleep 600 > "$WORK/a2.out" 2>&1 &
started "$WORK/a2.out"
echo "member name=a1 pid=$(sed -n 's/^pid=\([0-9]*\).*/\1/p' "$WORK/a1.out" | head -1)"
echo "member name=a2 pid=$(sed -n 's/^pid=\([0-9]*\).*/\1/p' "$WORK/a2.out" | head -1)"
echo "phase name=preload"
LD_PRELOAD="$PRELOAD" "$NVMLPROCS" --index 0
echo "phase name=plain"
"$NVMLPROCS" --index 0
echo "phase name=end"
"#;

#[test]
fn in_a_pid_namespace_the_lists_show_the_containers_pids_and_none_of_anothers() {
    hami_test_harness::require_root();
    let (a, b) = containers();
    // B runs on the host, outside A's namespace.
    let b1 = holder(&b, "768M");
    let work = a.dir().to_path_buf();
    let mut c: Command = a.command(Path::new("unshare"), false);
    c.args([
        "--pid",
        "--fork",
        "--mount",
        "--propagation",
        "private",
        "sh",
        "-c",
        NAMESPACE_SCRIPT,
    ])
    .env("HOSTPROC", work.join("hostproc"))
    .env("WORK", &work)
    .env("PRELOAD", &Artifacts::get().preload_so)
    .env("CUDAPROBE", &Artifacts::get().cudaprobe)
    .env("NVMLPROCS", nvmlprocs())
    .env(ALL_LISTS.0, ALL_LISTS.1);
    let out = c.output().expect("run unshare");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        out.status.success(),
        "namespace script failed ({:?}):\n{text}\n{err}",
        out.status
    );
    let part = |from: &str, to: &str| -> Lists {
        let s = text.split(from).nth(1).and_then(|t| t.split(to).next());
        let s = s.unwrap_or_else(|| panic!("no {from} in:\n{text}\n{err}"));
        Lists::of(std::process::Output {
            status: out.status,
            stdout: s.as_bytes().to_vec(),
            stderr: Vec::new(),
        })
    };
    let member = |name: &str| -> u32 {
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("member name={name} pid=")))
            .and_then(|p| p.trim().parse().ok())
            .unwrap_or_else(|| panic!("no pid for {name}:\n{text}"))
    };
    let (a1, a2) = (member("a1"), member("a2"));
    let in_a = part("phase name=preload", "phase name=plain");
    let plain = part("phase name=plain", "phase name=end");
    // The driver (the fake, like the real one) lists host pids: B's, and A's host pids,
    // which are not the pids A's processes have in their namespace.
    for f in FNS {
        let pids = plain.pids(f);
        assert_eq!(pids.len(), 3, "{f}: {}", plain.0.dump());
        assert!(pids.contains(&b1.pid), "{f}: {}", plain.0.dump());
        assert!(!pids.contains(&a1) && !pids.contains(&a2), "{f}: {text}");
    }
    // Under A's preload: A's processes by their namespace pids, with the region's usage.
    for f in FNS {
        assert_eq!(
            in_a.procs(f),
            BTreeSet::from([(a1, 256 * MB), (a2, 512 * MB)]),
            "{f}: {text}\n{err}"
        );
        in_a.check_protocol(f, 2);
    }
    // Each of A's slots found its host pid (one of the driver's pids, not B's).
    let r = a.region();
    let host: BTreeSet<u32> = r
        .snapshot()
        .slots
        .iter()
        .map(|s| r.host_pid(s.index))
        .collect();
    let mut want = plain.pids("compute_v3");
    want.remove(&b1.pid);
    assert_eq!(host, want, "{text}");
    b1.kill();
}

// ------------------------------------------------ nvidia-smi's way: NVML's export table

/// The export table's process-list slots (nvidia-smi 580).
const SLOTS: [&str; 3] = ["213", "214", "215"];

/// Another id the fake also serves its table under in some tests (not the preload's).
const ALIAS_ID: &str = "00112233445566778899aabbccddeeff";

/// What `nvmlprobe --export` printed.
struct Export(Probe);

impl Export {
    /// Runs `nvmlprobe --index 0 --export ID` under `env` (with its preload if `preload`),
    /// every list on, with the extra variables `vars`.
    fn run(env: &Env, preload: bool, id: &str, vars: &[(&str, &str)]) -> Export {
        let mut c = env.command(&Artifacts::get().nvmlprobe, preload);
        c.env(ALL_LISTS.0, ALL_LISTS.1)
            .args(["--index", "0", "--export", id]);
        for (k, v) in vars {
            c.env(k, v);
        }
        let p = Probe::from(c.output().expect("run nvmlprobe"));
        assert!(p.ok(), "{}", p.dump());
        Export(p)
    }

    fn line(&self, head: &str, slot: Option<&str>) -> &std::collections::BTreeMap<String, String> {
        self.0
            .lines
            .iter()
            .find(|(h, f)| {
                h == head && slot.is_none_or(|s| f.get("slot").map(String::as_str) == Some(s))
            })
            .map(|(_, f)| f)
            .unwrap_or_else(|| panic!("no {head} line (slot {slot:?}): {}", self.0.dump()))
    }

    /// The `export` line's field `key`.
    fn table(&self, key: &str) -> &str {
        &self.line("export", None)[key]
    }

    /// `(pid, used, name)` of every entry slot `slot` returned.
    fn procs(&self, slot: &str) -> BTreeSet<(u32, u64, String)> {
        let l = self.line("xlist", Some(slot));
        assert_eq!(l["rc"], "0", "slot {slot}: {}", self.0.dump());
        let v: BTreeSet<(u32, u64, String)> = self
            .0
            .lines
            .iter()
            .filter(|(h, f)| h == "xproc" && f["slot"] == slot)
            .map(|(_, f)| {
                (
                    f["pid"].parse().unwrap(),
                    f["used"].parse().unwrap(),
                    f["name"].clone(),
                )
            })
            .collect();
        assert_eq!(
            l["count"],
            v.len().to_string(),
            "slot {slot}: {}",
            self.0.dump()
        );
        v
    }

    /// `(pid, used)` of slot `slot`'s entries.
    fn usage(&self, slot: &str) -> BTreeSet<(u32, u64)> {
        self.procs(slot)
            .into_iter()
            .map(|(p, u, _)| (p, u))
            .collect()
    }

    /// The name slot `slot` gave `pid`.
    fn name(&self, slot: &str, pid: u32) -> String {
        self.procs(slot)
            .into_iter()
            .find(|(p, _, _)| *p == pid)
            .map(|(_, _, n)| n)
            .unwrap_or_else(|| panic!("no entry for {pid} in slot {slot}: {}", self.0.dump()))
    }

    /// The object the slot's function lies in.
    fn slot_object(&self, slot: &str) -> &str {
        &self.line("xlist", Some(slot))["slot_obj"]
    }

    /// How many stderr lines contain `text`.
    fn logged(&self, text: &str) -> usize {
        self.0.stderr().lines().filter(|l| l.contains(text)).count()
    }
}

fn file_name(p: &Path) -> String {
    p.file_name().unwrap().to_string_lossy().into_owned()
}

/// nvidia-smi 580 reads its process table through slots 213-215 of the export table, not the
/// public lists: under container A's preload those slots list A's processes only, with
/// their names, pids as A sees them and A's region usage; under B's, B's.
#[test]
fn nvidia_smis_export_table_shows_only_the_containers_processes_with_their_names() {
    let (a, b) = containers();
    let a1 = holder(&a, "256M");
    let a2 = holder(&a, "512M");
    let b1 = holder(&b, "768M");
    let ctx = 300 * MB;
    let nvml = file_name(&Artifacts::get().fake_libnvml);
    let preload = file_name(&Artifacts::get().preload_so);

    // Without the preload: the driver's table, every process with the driver's figure.
    let plain = Export::run(&a, false, "nvsmi", &[]);
    assert_eq!(plain.table("rc"), "0", "{}", plain.0.dump());
    assert_eq!(plain.table("table_obj"), nvml, "{}", plain.0.dump());
    for s in SLOTS {
        assert_eq!(
            plain.usage(s),
            BTreeSet::from([
                (a1.pid, 256 * MB + ctx),
                (a2.pid, 512 * MB + ctx),
                (b1.pid, 768 * MB + ctx)
            ]),
            "slot {s}: {}",
            plain.0.dump()
        );
        assert_eq!(plain.slot_object(s), nvml);
        for p in [a1.pid, a2.pid, b1.pid] {
            assert_ne!(plain.name(s, p), "-", "{}", plain.0.dump());
        }
    }

    // Under A's preload: our copy of the table (the same one each time), whose process
    // slots are ours and list A's two processes, each with the driver's name.
    let in_a = Export::run(&a, true, "nvsmi", &[]);
    assert_eq!(in_a.table("rc"), "0", "{}", in_a.0.dump());
    assert_eq!(in_a.table("table_obj"), "none", "{}", in_a.0.dump());
    assert_eq!(in_a.table("again_same"), "1", "{}", in_a.0.dump());
    assert_eq!(in_a.table("size"), plain.table("size"));
    for s in SLOTS {
        assert_eq!(in_a.slot_object(s), preload, "{}", in_a.0.dump());
        assert_eq!(
            in_a.usage(s),
            BTreeSet::from([(a1.pid, 256 * MB), (a2.pid, 512 * MB)]),
            "slot {s}: {}",
            in_a.0.dump()
        );
        for p in [a1.pid, a2.pid] {
            assert_eq!(in_a.name(s, p), plain.name(s, p), "slot {s}");
        }
    }
    // Under B's: B's one.
    let in_b = Export::run(&b, true, "nvsmi", &[]);
    for s in SLOTS {
        assert_eq!(
            in_b.usage(s),
            BTreeSet::from([(b1.pid, 768 * MB)]),
            "slot {s}: {}",
            in_b.0.dump()
        );
        assert_eq!(in_b.name(s, b1.pid), plain.name(s, b1.pid));
    }
    // A container without a quota: the slots answer as the driver does.
    let free = Env::new().set(
        "FAKE_CUDA_STATE",
        a.dir().join("fake-cuda.state").to_str().unwrap(),
    );
    let open = Export::run(&free, true, "nvsmi", &[]);
    for s in SLOTS {
        assert_eq!(open.procs(s), plain.procs(s), "slot {s}: {}", open.0.dump());
    }
    for p in [a1, a2, b1] {
        p.kill();
    }
}

/// Every table the preload does not know how to read is the driver's, untouched: another
/// id (served by the driver or not), a driver branch whose layout is unknown, a size word
/// that cannot hold the process slots. Each reason is logged once (the probe asks twice).
#[test]
fn tables_the_preload_does_not_know_pass_through_untouched() {
    let (a, b) = containers();
    let a1 = holder(&a, "256M");
    let b1 = holder(&b, "768M");
    let nvml = file_name(&Artifacts::get().fake_libnvml);
    let all = BTreeSet::from([a1.pid, b1.pid]);
    let pids =
        |e: &Export, s: &str| -> BTreeSet<u32> { e.usage(s).into_iter().map(|(p, _)| p).collect() };

    // Another id the driver serves: its table as is, the driver's slots.
    let alias = [("FAKE_NVML_EXPORT_ALIAS", ALIAS_ID)];
    let other = Export::run(&a, true, ALIAS_ID, &alias);
    assert_eq!(other.table("rc"), "0", "{}", other.0.dump());
    assert_eq!(other.table("table_obj"), nvml, "{}", other.0.dump());
    assert_eq!(other.table("again_same"), "1");
    for s in SLOTS {
        assert_eq!(other.slot_object(s), nvml);
        assert_eq!(pids(&other, s), all, "slot {s}: {}", other.0.dump());
    }
    // ... while nvidia-smi's id in the same process is wrapped (the alias changes nothing).
    let same = Export::run(&a, true, "nvsmi", &alias);
    assert_eq!(same.table("table_obj"), "none", "{}", same.0.dump());
    // An id the driver does not serve: the driver's error.
    let none = Export::run(&a, true, "ffeeddccbbaa99887766554433221100", &[]);
    assert_eq!(none.table("rc"), "3", "{}", none.0.dump());

    // A driver of another branch: the layout is not known.
    let branch = Export::run(
        &a,
        true,
        "nvsmi",
        &[("FAKE_NVML_DRIVER_VERSION", "575.57.08")],
    );
    assert_eq!(branch.table("table_obj"), nvml, "{}", branch.0.dump());
    for s in SLOTS {
        assert_eq!(branch.slot_object(s), nvml);
        assert_eq!(pids(&branch, s), all, "slot {s}: {}", branch.0.dump());
    }
    assert_eq!(
        branch.logged("575.57.08 is not of a branch"),
        1,
        "{}",
        branch.0.dump()
    );

    // A size word too small to hold slot 215, and one far too large.
    for size in ["1024", "1048576"] {
        let e = Export::run(&a, true, "nvsmi", &[("FAKE_NVML_EXPORT_SIZE", size)]);
        assert_eq!(e.table("table_obj"), nvml, "{}", e.0.dump());
        assert_eq!(e.table("size"), size);
        assert_eq!(e.logged(&format!("size word {size}")), 1, "{}", e.0.dump());
    }
    a1.kill();
    b1.kill();
}

/// A slot answer the preload does not understand (here a name without its NUL) is left as
/// the driver wrote it, and the preload says so once.
#[test]
fn a_corrupt_answer_is_left_as_the_driver_gave_it() {
    let (a, b) = containers();
    let a1 = holder(&a, "256M");
    let b1 = holder(&b, "768M");
    let corrupt = [("FAKE_NVML_EXPORT_NAMES", "unterminated")];
    let plain = Export::run(&a, false, "nvsmi", &corrupt);
    let in_a = Export::run(&a, true, "nvsmi", &corrupt);
    // The table is wrapped ...
    assert_eq!(in_a.table("table_obj"), "none", "{}", in_a.0.dump());
    for s in SLOTS {
        assert_eq!(in_a.slot_object(s), file_name(&Artifacts::get().preload_so));
        // ... but each answer is the driver's, B's process included.
        assert_eq!(in_a.procs(s), plain.procs(s), "slot {s}: {}", in_a.0.dump());
        assert_eq!(in_a.procs(s).len(), 2);
    }
    assert_eq!(
        in_a.logged("name is not NUL-terminated"),
        1,
        "{}",
        in_a.0.dump()
    );
    a1.kill();
    b1.kill();
}
