//! Test harness shared by every test of the workspace.
//!
//! * [`Artifacts::get`] builds (once per test binary) the fake driver, the fake NVML and the
//!   preload with the same profile and target dir as the running test, lays the fakes out as
//!   `<target>/<profile>/fake-driver/{libcuda.so.1,libcuda.so,libnvidia-ml.so.1,libnvidia-ml.so}`
//!   and compiles the C programs (`testing/programs/*.c`) into `<target>/<profile>/test-programs/`.
//! * [`TestEnv`] is one test's sandbox: a temp dir with its own fake-driver state file
//!   (`FAKE_CUDA_STATE`) and shared-region path (`CUDA_DEVICE_MEMORY_SHARED_CACHE`), and
//!   builders for commands running `cudaprobe` / `nvmlprobe` against the fakes, with or
//!   without the preload.
//! * [`ProbeOutput`] / [`OpLine`] parse `cudaprobe`'s output (one `op=... rc=...` line per
//!   operation); [`RunningProbe`] drives a probe that is still running (e.g. blocked in `wait`).
//!
//! Everything here is test support: failures to build or spawn panic with a clear message.
#![warn(missing_docs)]

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Output, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::OnceLock;
use std::time::Duration;

/// Environment variable naming the fake driver's state file.
pub const ENV_FAKE_STATE: &str = "FAKE_CUDA_STATE";
/// Environment variable naming the shared region file of the preload.
pub const ENV_REGION: &str = "CUDA_DEVICE_MEMORY_SHARED_CACHE";
/// How long [`RunningProbe`] waits for a line before panicking.
pub const LINE_TIMEOUT: Duration = Duration::from_secs(60);

/// Paths of the built test artifacts.
#[derive(Debug, Clone)]
pub struct Artifacts {
    /// Cargo target dir of the running test.
    pub target_dir: PathBuf,
    /// `<target>/<profile>` (or `<target>/<triple>/<profile>`).
    pub profile_dir: PathBuf,
    /// Directory holding `libcuda.so.1`, `libcuda.so`, `libnvidia-ml.so.1`, `libnvidia-ml.so`.
    pub fake_lib_dir: PathBuf,
    /// The fake `libcuda.so.1` (a copy of the built `libcuda.so`).
    pub fake_libcuda: PathBuf,
    /// The fake `libnvidia-ml.so.1`.
    pub fake_libnvml: PathBuf,
    /// `libhami_preload.so` as built by cargo.
    pub preload_so: PathBuf,
    /// Directory of the compiled C programs.
    pub programs_dir: PathBuf,
    /// The compiled `cudaprobe`.
    pub cudaprobe: PathBuf,
    /// The compiled `nvmlprobe`.
    pub nvmlprobe: PathBuf,
}

/// Root of the workspace (two levels above this crate).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .expect("workspace root above testing/harness")
        .to_path_buf()
}

/// `(target_dir, profile_dir, cargo profile name, target triple if any)` of the running test.
fn locate_target() -> (PathBuf, PathBuf, String, Option<String>) {
    let exe = std::env::current_exe().expect("current_exe");
    // <target>/[<triple>/]<profile>/deps/<test binary>  or  <target>/.../<profile>/<binary>
    let mut dir = exe.parent().expect("exe dir").to_path_buf();
    if dir
        .file_name()
        .is_some_and(|n| n == "deps" || n == "examples")
    {
        dir = dir.parent().expect("profile dir").to_path_buf();
    }
    let profile_dir = dir;
    let dir_name = profile_dir
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("debug")
        .to_string();
    let profile = match dir_name.as_str() {
        "debug" => "dev".to_string(),
        "release" => "release".to_string(),
        other => other.to_string(),
    };
    let parent = profile_dir.parent().expect("target dir").to_path_buf();
    if parent.join("CACHEDIR.TAG").exists()
        || !parent
            .parent()
            .is_some_and(|p| p.join("CACHEDIR.TAG").exists())
    {
        (parent, profile_dir, profile, None)
    } else {
        let triple = parent
            .file_name()
            .and_then(|n| n.to_str())
            .map(str::to_string);
        (
            parent.parent().expect("target root").to_path_buf(),
            profile_dir,
            profile,
            triple,
        )
    }
}

/// Copies `from` to `to` atomically (copy to a temp name in the same dir, then rename), so
/// that concurrent test binaries never see a half-written file.
fn install(from: &Path, to: &Path) {
    let tmp = to.with_extension(format!("tmp{}", std::process::id()));
    std::fs::copy(from, &tmp)
        .unwrap_or_else(|e| panic!("copy {} -> {}: {e}", from.display(), tmp.display()));
    std::fs::rename(&tmp, to).unwrap_or_else(|e| panic!("rename to {}: {e}", to.display()));
}

/// Points `link` at `target` (a relative symlink), replacing what was there, atomically.
fn symlink(target: &str, link: &Path) {
    let tmp = link.with_extension(format!("tmp{}", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(target, &tmp)
        .unwrap_or_else(|e| panic!("symlink {}: {e}", tmp.display()));
    std::fs::rename(&tmp, link).unwrap_or_else(|e| panic!("rename to {}: {e}", link.display()));
}

/// Compiles `testing/programs/<name>.c` into `out_dir/<name>`.
fn compile(name: &str, out_dir: &Path, extra: &[&str]) -> PathBuf {
    let src = workspace_root()
        .join("testing/programs")
        .join(format!("{name}.c"));
    let out = out_dir.join(name);
    let mut args = vec!["-O2", "-Wall"];
    args.extend_from_slice(extra);
    cc(&src, &out, &args);
    out
}

/// Compiles `src` into `out` with the C compiler (`$CC`, else `gcc`): the command line is
/// `$CC -o <tmp> <src> ARGS...` (so `-l...` in `args` come after the source). The output is
/// written under a temp name and renamed into place, so concurrent test binaries never run a
/// half-written program. Panics with the compiler's output if it fails.
pub fn cc(src: &Path, out: &Path, args: &[&str]) {
    let name = out.file_name().and_then(|n| n.to_str()).unwrap_or("out");
    let tmp = out.with_file_name(format!(".{name}.tmp{}", std::process::id()));
    let cc = std::env::var("CC").unwrap_or_else(|_| "gcc".to_string());
    let o = Command::new(&cc)
        .arg("-o")
        .arg(&tmp)
        .arg(src)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("running {cc} (needed to build {}): {e}", src.display()));
    assert!(
        o.status.success(),
        "compiling {}: {}\n{}",
        src.display(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    std::fs::rename(&tmp, out).unwrap_or_else(|e| panic!("rename to {}: {e}", out.display()));
}

impl Artifacts {
    /// Builds everything once per test binary (see the crate doc) and returns the paths.
    pub fn get() -> &'static Artifacts {
        static A: OnceLock<Artifacts> = OnceLock::new();
        A.get_or_init(Artifacts::build)
    }

    /// Compiles the C program `src` (one outside `testing/programs`, e.g. a crate's own test
    /// program) into [`Artifacts::programs_dir`] under `name`, linked against the fake driver
    /// like `cudaprobe` (`-O2 -Wall -L<fake_lib_dir> -lcuda -ldl -lpthread`), and returns its
    /// path.
    pub fn compile_against_fake(&self, src: &Path, name: &str) -> PathBuf {
        let out = self.programs_dir.join(name);
        let libdir = format!("-L{}", self.fake_lib_dir.display());
        cc(
            src,
            &out,
            &["-O2", "-Wall", &libdir, "-lcuda", "-ldl", "-lpthread"],
        );
        out
    }

    fn build() -> Artifacts {
        let (target_dir, profile_dir, profile, triple) = locate_target();
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_string());
        let mut cmd = Command::new(&cargo);
        cmd.args([
            "build",
            "-p",
            "fake-cuda",
            "-p",
            "fake-nvml",
            "-p",
            "hami-preload",
            "--profile",
            &profile,
        ])
        .env("CARGO_TARGET_DIR", &target_dir)
        .current_dir(workspace_root());
        if let Some(t) = &triple {
            cmd.args(["--target", t]);
        }
        let out = cmd
            .output()
            .unwrap_or_else(|e| panic!("running {cargo} build: {e}"));
        assert!(
            out.status.success(),
            "building fake-cuda, fake-nvml and hami-preload failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let fake_lib_dir = profile_dir.join("fake-driver");
        std::fs::create_dir_all(&fake_lib_dir).expect("create fake-driver dir");
        let fake_libcuda = fake_lib_dir.join("libcuda.so.1");
        let fake_libnvml = fake_lib_dir.join("libnvidia-ml.so.1");
        install(&profile_dir.join("libcuda.so"), &fake_libcuda);
        install(&profile_dir.join("libnvidia_ml.so"), &fake_libnvml);
        symlink("libcuda.so.1", &fake_lib_dir.join("libcuda.so"));
        symlink("libnvidia-ml.so.1", &fake_lib_dir.join("libnvidia-ml.so"));
        let programs_dir = profile_dir.join("test-programs");
        std::fs::create_dir_all(&programs_dir).expect("create test-programs dir");
        let libdir = format!("-L{}", fake_lib_dir.display());
        let cudaprobe = compile(
            "cudaprobe",
            &programs_dir,
            &[&libdir, "-lcuda", "-ldl", "-lpthread"],
        );
        let nvmlprobe = compile("nvmlprobe", &programs_dir, &["-ldl"]);
        Artifacts {
            preload_so: profile_dir.join("libhami_preload.so"),
            target_dir,
            profile_dir,
            fake_lib_dir,
            fake_libcuda,
            fake_libnvml,
            programs_dir,
            cudaprobe,
            nvmlprobe,
        }
    }
}

/// Copies of the artifacts inside a sandbox, readable by every uid (see
/// [`TestEnv::shared_with_all_users`]).
#[derive(Debug, Clone)]
pub struct SharedCopies {
    /// Directory with the fake `libcuda.so.1` / `libnvidia-ml.so.1` (and their `.so` names).
    pub lib_dir: PathBuf,
    /// The copied `libhami_preload.so`.
    pub preload_so: PathBuf,
    /// The copied `cudaprobe`.
    pub cudaprobe: PathBuf,
    /// The copied `nvmlprobe`.
    pub nvmlprobe: PathBuf,
}

/// One test's sandbox: temp dir, fake-driver state, region path, environment.
pub struct TestEnv {
    dir: tempfile::TempDir,
    state_path: PathBuf,
    region_path: PathBuf,
    vars: BTreeMap<String, String>,
    preload: bool,
    shared: Option<SharedCopies>,
}

impl Default for TestEnv {
    fn default() -> Self {
        TestEnv::new()
    }
}

impl TestEnv {
    /// A fresh sandbox (builds the artifacts on first use). Defaults: no preload, fake driver
    /// defaults (2 devices of 16 GiB, 300 MiB per context) unless set with [`TestEnv::env`].
    pub fn new() -> TestEnv {
        Artifacts::get();
        let dir = tempfile::Builder::new()
            .prefix("hami-test-")
            .tempdir()
            .expect("temp dir");
        let state_path = dir.path().join("fake-cuda.state");
        let region_path = dir.path().join("hami-region.cache");
        let mut vars = BTreeMap::new();
        vars.insert(ENV_FAKE_STATE.to_string(), state_path.display().to_string());
        vars.insert(ENV_REGION.to_string(), region_path.display().to_string());
        TestEnv {
            dir,
            state_path,
            region_path,
            vars,
            preload: false,
            shared: None,
        }
    }

    /// Makes the sandbox usable by processes of any uid (tests that run some processes as
    /// another user, e.g. `Command::uid(65534)`): the temp dir becomes mode 1777 like `/tmp`
    /// (so the region is created there by whichever process comes first), and the preload,
    /// the fakes and the probes are copied into `<dir>/bin` (mode 0755), since the target dir
    /// may sit under a path other users cannot traverse. Commands built afterwards use the
    /// copies.
    pub fn shared_with_all_users(mut self) -> TestEnv {
        use std::os::unix::fs::PermissionsExt;
        let a = Artifacts::get();
        let bin = self.dir.path().join("bin");
        std::fs::create_dir_all(&bin).expect("create bin dir");
        let copy = |from: &Path, name: &str| -> PathBuf {
            let to = bin.join(name);
            install(from, &to);
            std::fs::set_permissions(&to, std::fs::Permissions::from_mode(0o755))
                .unwrap_or_else(|e| panic!("chmod {}: {e}", to.display()));
            to
        };
        let shared = SharedCopies {
            preload_so: copy(&a.preload_so, "libhami_preload.so"),
            cudaprobe: copy(&a.cudaprobe, "cudaprobe"),
            nvmlprobe: copy(&a.nvmlprobe, "nvmlprobe"),
            lib_dir: bin.clone(),
        };
        copy(&a.fake_libcuda, "libcuda.so.1");
        copy(&a.fake_libnvml, "libnvidia-ml.so.1");
        symlink("libcuda.so.1", &bin.join("libcuda.so"));
        symlink("libnvidia-ml.so.1", &bin.join("libnvidia-ml.so"));
        for (d, mode) in [(&bin, 0o755), (&self.dir.path().to_path_buf(), 0o1777)] {
            std::fs::set_permissions(d, std::fs::Permissions::from_mode(mode))
                .unwrap_or_else(|e| panic!("chmod {}: {e}", d.display()));
        }
        self.shared = Some(shared);
        self
    }

    /// The copies made by [`TestEnv::shared_with_all_users`], if it was called.
    pub fn shared(&self) -> Option<&SharedCopies> {
        self.shared.as_ref()
    }

    /// Copies `program` into the sandbox's shared `bin` dir (mode 0755) and returns the copy
    /// (for programs other than the harness's probes). Panics unless
    /// [`TestEnv::shared_with_all_users`] was called.
    pub fn share_program(&self, program: &Path) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let s = self
            .shared
            .as_ref()
            .expect("share_program needs shared_with_all_users");
        let name = program.file_name().expect("program file name");
        let to = s.lib_dir.join(name);
        install(program, &to);
        std::fs::set_permissions(&to, std::fs::Permissions::from_mode(0o755))
            .unwrap_or_else(|e| panic!("chmod {}: {e}", to.display()));
        to
    }

    /// The temp dir (removed when the `TestEnv` drops).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The fake driver's state file of this sandbox.
    pub fn state_path(&self) -> &Path {
        &self.state_path
    }

    /// The shared region path (`CUDA_DEVICE_MEMORY_SHARED_CACHE`) of this sandbox.
    pub fn region_path(&self) -> &Path {
        &self.region_path
    }

    /// Sets an environment variable for every process started from this sandbox
    /// (e.g. `FAKE_CUDA_TOTAL_MEM`, `CUDA_DEVICE_MEMORY_LIMIT`, `CUDA_VISIBLE_DEVICES`).
    pub fn env(mut self, key: &str, value: &str) -> TestEnv {
        self.vars.insert(key.to_string(), value.to_string());
        self
    }

    /// Removes a variable set with [`TestEnv::env`] (including the defaults).
    pub fn unset(mut self, key: &str) -> TestEnv {
        self.vars.remove(key);
        self
    }

    /// Sets a variable on an existing sandbox.
    pub fn set_env(&mut self, key: &str, value: &str) {
        self.vars.insert(key.to_string(), value.to_string());
    }

    /// Whether processes get `LD_PRELOAD=<libhami_preload.so>`.
    pub fn preload(mut self, on: bool) -> TestEnv {
        self.preload = on;
        self
    }

    /// The environment given to processes (without `LD_LIBRARY_PATH` / `LD_PRELOAD`).
    pub fn vars(&self) -> &BTreeMap<String, String> {
        &self.vars
    }

    /// A command running `program` against the fakes: `LD_LIBRARY_PATH` = the fake lib dir,
    /// the sandbox environment, `LD_PRELOAD` if enabled; stdin null, stdout/stderr piped.
    pub fn command(&self, program: &Path) -> Command {
        let a = Artifacts::get();
        let (lib_dir, preload_so) = match &self.shared {
            Some(s) => (&s.lib_dir, &s.preload_so),
            None => (&a.fake_lib_dir, &a.preload_so),
        };
        let mut c = Command::new(program);
        c.env("LD_LIBRARY_PATH", lib_dir);
        c.env_remove("LD_PRELOAD");
        for (k, v) in &self.vars {
            c.env(k, v);
        }
        if self.preload {
            c.env("LD_PRELOAD", preload_so);
        }
        c.current_dir(self.dir.path());
        c.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        c
    }

    /// A command running `cudaprobe ARGS...` (see [`TestEnv::command`]).
    pub fn cudaprobe_cmd(&self, args: &[&str]) -> Command {
        let prog = self
            .shared
            .as_ref()
            .map_or(&Artifacts::get().cudaprobe, |s| &s.cudaprobe);
        let mut c = self.command(prog);
        c.args(args);
        c
    }

    /// Runs `cudaprobe ARGS...` to completion and parses its output.
    pub fn run_probe(&self, args: &[&str]) -> ProbeOutput {
        let out = self.cudaprobe_cmd(args).output().expect("spawn cudaprobe");
        ProbeOutput::from_output(out)
    }

    /// Starts `cudaprobe ARGS...` with stdin piped (for `wait`), returning a handle that reads
    /// its lines as they come.
    pub fn spawn_probe(&self, args: &[&str]) -> RunningProbe {
        let mut c = self.cudaprobe_cmd(args);
        c.stdin(Stdio::piped());
        RunningProbe::start(c)
    }

    /// A command running `nvmlprobe` (see [`TestEnv::command`]).
    pub fn nvmlprobe_cmd(&self) -> Command {
        let prog = self
            .shared
            .as_ref()
            .map_or(&Artifacts::get().nvmlprobe, |s| &s.nvmlprobe);
        self.command(prog)
    }

    /// Runs `nvmlprobe` and parses what it reports.
    pub fn nvml(&self) -> NvmlSnapshot {
        let out = self.nvmlprobe_cmd().output().expect("spawn nvmlprobe");
        NvmlSnapshot::parse(&String::from_utf8_lossy(&out.stdout))
    }
}

/// One output line of `cudaprobe`: `op=NAME key=value ... rc=N name=CUDA_...`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpLine {
    /// The `op` field.
    pub op: String,
    /// All `key=value` fields (including `op`, `rc`, `name`).
    pub fields: BTreeMap<String, String>,
    /// The raw line.
    pub raw: String,
}

impl OpLine {
    /// Parses a `key=value ...` line; `None` if it has no `op` field.
    pub fn parse(line: &str) -> Option<OpLine> {
        let fields: BTreeMap<String, String> = line
            .split_whitespace()
            .filter_map(|kv| {
                kv.split_once('=')
                    .map(|(k, v)| (k.to_string(), v.to_string()))
            })
            .collect();
        let op = fields.get("op")?.clone();
        Some(OpLine {
            op,
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
        let v = self.get(key)?;
        match v.strip_prefix("0x") {
            Some(h) => u64::from_str_radix(h, 16).ok(),
            None => v.parse().ok(),
        }
    }

    /// The CUresult (`rc`), if the line has one.
    pub fn rc(&self) -> Option<i32> {
        self.get("rc").and_then(|v| v.parse().ok())
    }

    /// The CUresult's name (`name`, e.g. `CUDA_ERROR_OUT_OF_MEMORY`).
    pub fn name(&self) -> Option<&str> {
        self.get("name")
    }

    /// Whether `rc` is 0.
    pub fn ok(&self) -> bool {
        self.rc() == Some(0)
    }

    /// The `ptr` field.
    pub fn ptr(&self) -> Option<u64> {
        self.num("ptr")
    }

    /// The record index (`idx`) an allocation got, for later `free IDX`.
    pub fn idx(&self) -> Option<usize> {
        self.num("idx").map(|v| v as usize)
    }
}

/// Parsed output of a finished `cudaprobe`.
#[derive(Debug, Clone)]
pub struct ProbeOutput {
    /// The probe's pid (first line), if printed.
    pub pid: Option<u32>,
    /// The op lines, in order.
    pub ops: Vec<OpLine>,
    /// Exit status.
    pub status: ExitStatus,
    /// Full stdout.
    pub stdout: String,
    /// Full stderr.
    pub stderr: String,
}

/// Parses the `pid=` header and the op lines of `cudaprobe` output.
pub fn parse_probe_lines(stdout: &str) -> (Option<u32>, Vec<OpLine>) {
    let mut pid = None;
    let mut ops = Vec::new();
    for line in stdout.lines() {
        if let Some(o) = OpLine::parse(line) {
            ops.push(o);
        } else if let Some(rest) = line.strip_prefix("pid=") {
            pid = rest.split_whitespace().next().and_then(|p| p.parse().ok());
        }
    }
    (pid, ops)
}

impl ProbeOutput {
    /// From a finished process's output.
    pub fn from_output(out: Output) -> ProbeOutput {
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        let (pid, ops) = parse_probe_lines(&stdout);
        ProbeOutput {
            pid,
            ops,
            status: out.status,
            stdout,
            stderr,
        }
    }

    /// The `i`-th op line (panics with the whole output if missing).
    pub fn op(&self, i: usize) -> &OpLine {
        self.ops
            .get(i)
            .unwrap_or_else(|| panic!("no op line {i} in:\n{}", self.dump()))
    }

    /// All lines of op `name`.
    pub fn find(&self, name: &str) -> Vec<&OpLine> {
        self.ops.iter().filter(|o| o.op == name).collect()
    }

    /// The last line of op `name` (panics if none).
    pub fn last(&self, name: &str) -> &OpLine {
        self.ops
            .iter()
            .rev()
            .find(|o| o.op == name)
            .unwrap_or_else(|| panic!("no op={name} line in:\n{}", self.dump()))
    }

    /// The `rc` of every line that has one, in order.
    pub fn rcs(&self) -> Vec<i32> {
        self.ops.iter().filter_map(OpLine::rc).collect()
    }

    /// Whether the process exited with 0 and every op succeeded.
    pub fn all_ok(&self) -> bool {
        self.status.success() && self.ops.iter().all(|o| o.rc().is_none_or(|r| r == 0))
    }

    /// stdout and stderr, for assertion messages.
    pub fn dump(&self) -> String {
        format!(
            "status: {}\n--- stdout\n{}--- stderr\n{}",
            self.status, self.stdout, self.stderr
        )
    }
}

/// A `cudaprobe` that is still running; its stdout is read line by line in the background.
pub struct RunningProbe {
    child: Child,
    stdin: Option<ChildStdin>,
    rx: Receiver<String>,
    /// Pid of the process.
    pub pid: u32,
    /// Every line read so far (raw).
    pub seen: Vec<String>,
}

impl RunningProbe {
    /// Spawns `cmd` (stdout must be piped; stdin piped if `wait` is used).
    pub fn start(mut cmd: Command) -> RunningProbe {
        cmd.stdout(Stdio::piped());
        let mut child = cmd.spawn().expect("spawn probe");
        let stdout = child.stdout.take().expect("piped stdout");
        let stdin = child.stdin.take();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(l) = line else { break };
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        let pid = child.id();
        RunningProbe {
            child,
            stdin,
            rx,
            pid,
            seen: Vec::new(),
        }
    }

    /// The next line, or `None` at end of output; panics after [`LINE_TIMEOUT`].
    pub fn next_line(&mut self) -> Option<String> {
        match self.rx.recv_timeout(LINE_TIMEOUT) {
            Ok(l) => {
                self.seen.push(l.clone());
                Some(l)
            }
            Err(RecvTimeoutError::Disconnected) => None,
            Err(RecvTimeoutError::Timeout) => {
                panic!(
                    "probe {} printed nothing for {LINE_TIMEOUT:?}; so far:\n{}",
                    self.pid,
                    self.seen.join("\n")
                )
            }
        }
    }

    /// Reads lines until an op line for `op` comes (returns it); panics if the output ends.
    pub fn wait_for(&mut self, op: &str) -> OpLine {
        while let Some(l) = self.next_line() {
            if let Some(o) = OpLine::parse(&l) {
                if o.op == op {
                    return o;
                }
            }
        }
        let err = self.stderr_now();
        panic!(
            "probe {} ended before op={op}; output:\n{}\nstderr:\n{err}",
            self.pid,
            self.seen.join("\n")
        )
    }

    /// Lets a probe blocked in `wait` continue (writes a line to its stdin).
    pub fn resume(&mut self) {
        if let Some(s) = self.stdin.as_mut() {
            let _ = s.write_all(b"go\n");
            let _ = s.flush();
        }
    }

    /// Sends `signal` to the process.
    pub fn signal(&self, signal: i32) {
        // SAFETY: kill(2) on a pid we spawned (and have not reaped).
        unsafe { libc::kill(self.pid as libc::pid_t, signal) };
    }

    /// SIGKILLs the process and reaps it.
    pub fn kill(mut self) -> ExitStatus {
        let _ = self.child.kill();
        self.child.wait().expect("wait probe")
    }

    fn stderr_now(&mut self) -> String {
        let mut s = String::new();
        if let Ok(Some(_)) = self.child.try_wait() {
            if let Some(mut e) = self.child.stderr.take() {
                let _ = std::io::Read::read_to_string(&mut e, &mut s);
            }
        }
        s
    }

    /// Closes stdin, waits for the exit and returns everything it printed.
    pub fn finish(mut self) -> ProbeOutput {
        drop(self.stdin.take());
        while self.next_line().is_some() {}
        let mut stderr = String::new();
        if let Some(mut e) = self.child.stderr.take() {
            let _ = std::io::Read::read_to_string(&mut e, &mut stderr);
        }
        let status = self.child.wait().expect("wait probe");
        let stdout = self
            .seen
            .iter()
            .map(|l| format!("{l}\n"))
            .collect::<String>();
        let (pid, ops) = parse_probe_lines(&stdout);
        ProbeOutput {
            pid,
            ops,
            status,
            stdout,
            stderr,
        }
    }
}

impl Drop for RunningProbe {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// One device as `nvmlprobe` reports it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NvmlDevice {
    /// NVML (physical) index.
    pub index: u32,
    /// `GPU-...` UUID.
    pub uuid: String,
    /// Name (spaces replaced by `_`).
    pub name: String,
    /// `nvmlDeviceGetMemoryInfo`: total, used, free.
    pub total: u64,
    /// Used bytes (v1).
    pub used: u64,
    /// Free bytes (v1).
    pub free: u64,
    /// `nvmlDeviceGetMemoryInfo_v2` used bytes.
    pub used_v2: u64,
    /// Running compute processes: (pid, used bytes).
    pub processes: Vec<(u32, u64)>,
}

/// What `nvmlprobe` printed.
#[derive(Debug, Clone, Default)]
pub struct NvmlSnapshot {
    /// `nvmlInit_v2` result.
    pub init_rc: i32,
    /// Devices by index.
    pub devices: Vec<NvmlDevice>,
    /// Raw output.
    pub raw: String,
}

impl NvmlSnapshot {
    /// Parses `nvmlprobe` output.
    pub fn parse(text: &str) -> NvmlSnapshot {
        let mut s = NvmlSnapshot {
            init_rc: -1,
            raw: text.to_string(),
            ..Default::default()
        };
        for line in text.lines() {
            let mut it = line.split_whitespace();
            let kind = it.next().unwrap_or("");
            let f: BTreeMap<&str, &str> = it.filter_map(|kv| kv.split_once('=')).collect();
            let n = |k: &str| f.get(k).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
            let idx = n("index") as u32;
            let dev = |s: &mut NvmlSnapshot| -> usize {
                if let Some(p) = s.devices.iter().position(|d| d.index == idx) {
                    p
                } else {
                    s.devices.push(NvmlDevice {
                        index: idx,
                        ..Default::default()
                    });
                    s.devices.len() - 1
                }
            };
            match kind {
                "init" => s.init_rc = n("rc") as i32,
                "device" => {
                    let d = dev(&mut s);
                    s.devices[d].uuid = f.get("uuid").unwrap_or(&"").to_string();
                    s.devices[d].name = f.get("name").unwrap_or(&"").to_string();
                }
                "memory" => {
                    let d = dev(&mut s);
                    s.devices[d].total = n("total");
                    s.devices[d].used = n("used");
                    s.devices[d].free = n("free");
                }
                "memory_v2" => {
                    let d = dev(&mut s);
                    s.devices[d].used_v2 = n("used");
                }
                "process" => {
                    let d = dev(&mut s);
                    s.devices[d].processes.push((n("pid") as u32, n("used")));
                }
                _ => {}
            }
        }
        s
    }

    /// Device `index` (panics with the raw output if absent).
    pub fn device(&self, index: u32) -> &NvmlDevice {
        self.devices
            .iter()
            .find(|d| d.index == index)
            .unwrap_or_else(|| panic!("no NVML device {index} in:\n{}", self.raw))
    }

    /// Bytes NVML attributes to `pid` on device `index` (0 if not listed).
    pub fn process_used(&self, index: u32, pid: u32) -> u64 {
        self.device(index)
            .processes
            .iter()
            .find(|p| p.0 == pid)
            .map(|p| p.1)
            .unwrap_or(0)
    }
}

/// Parses a size with an optional binary suffix (`512K`, `300M`, `16G`).
pub fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let end = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let n: u64 = s[..end].parse().ok()?;
    let shift = match s[end..]
        .to_ascii_uppercase()
        .trim_end_matches("IB")
        .trim_end_matches('B')
    {
        "" => 0,
        "K" => 10,
        "M" => 20,
        "G" => 30,
        "T" => 40,
        _ => return None,
    };
    n.checked_mul(1 << shift)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_op_lines() {
        let text = "pid=42 via=direct device=0\nop=alloc size=1048576 idx=3 ptr=0x100000000000 rc=0 name=CUDA_SUCCESS\nop=alloc size=1 rc=2 name=CUDA_ERROR_OUT_OF_MEMORY\n";
        let (pid, ops) = parse_probe_lines(text);
        assert_eq!(pid, Some(42));
        assert_eq!(ops.len(), 2);
        assert_eq!(ops[0].ptr(), Some(0x1000_0000_0000));
        assert_eq!(ops[0].idx(), Some(3));
        assert!(ops[0].ok());
        assert_eq!(ops[1].rc(), Some(2));
        assert_eq!(ops[1].name(), Some("CUDA_ERROR_OUT_OF_MEMORY"));
    }

    #[test]
    fn parses_nvml() {
        let s = NvmlSnapshot::parse(
            "init rc=0 error=Success\ncount rc=0 count=1\ndevice index=0 uuid=GPU-x name=N rc=0\nmemory index=0 rc=0 total=10 used=4 free=6\nmemory_v2 index=0 rc=0 version=0x2000028 total=10 reserved=0 used=4 free=6\nprocess index=0 pid=7 used=4\nprocesses index=0 rc=0 count=1\n",
        );
        assert_eq!(s.init_rc, 0);
        assert_eq!(s.device(0).used, 4);
        assert_eq!(s.device(0).used_v2, 4);
        assert_eq!(s.process_used(0, 7), 4);
        assert_eq!(s.process_used(0, 8), 0);
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("16G"), Some(16 << 30));
        assert_eq!(parse_size("3MiB"), Some(3 << 20));
        assert_eq!(parse_size("12"), Some(12));
        assert_eq!(parse_size("1X"), None);
    }
}
