//! [`TestEnv`], one test's sandbox: a temp dir with its own fake-driver state file and
//! shared-region path, the environment given to every process started from it, and the
//! commands that run the probes against the fakes (with or without the preload).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use hami_common::config::ENV_REGION;
use hami_common::region::Region;

use crate::artifacts::{install, symlink, Artifacts};
use crate::nvml::NvmlSnapshot;
use crate::probe::{ProbeOutput, RunningProbe};

/// Environment variable naming the fake driver's state file.
pub const ENV_FAKE_STATE: &str = "FAKE_CUDA_STATE";

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

    /// Opens this sandbox's region read-only (panics if no process has created it yet).
    pub fn region(&self) -> Region {
        Region::open_existing(&self.region_path, false)
            .unwrap_or_else(|e| panic!("open region {}: {e}", self.region_path.display()))
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
    /// Under an old glibc ([`crate::glibc::requested`]): that glibc's loader runs `program`
    /// with its libraries and the fake lib dir as library path and the preload as
    /// `--preload`.
    pub fn command(&self, program: &Path) -> Command {
        self.command_with_preload(program, self.preload)
    }

    /// [`TestEnv::command`] with the preload on or off whatever the sandbox says.
    fn command_with_preload(&self, program: &Path, preload: bool) -> Command {
        let a = Artifacts::get();
        let (lib_dir, preload_so) = match &self.shared {
            Some(s) => (&s.lib_dir, &s.preload_so),
            None => (&a.fake_lib_dir, &a.preload_so),
        };
        let mut c = match crate::glibc::requested() {
            // Under the old glibc's loader, with the preload through its `--preload` (what
            // `/etc/ld.so.preload` does for a container's programs).
            // `--library-path` outranks `LD_LIBRARY_PATH`: a sandbox's own (a test that hides
            // the fake NVML) takes the fake lib dir's place.
            Some(g) => {
                let own: Option<Vec<PathBuf>> = self
                    .vars
                    .get("LD_LIBRARY_PATH")
                    .map(|p| std::env::split_paths(p).collect());
                let libs: Vec<&Path> = match &own {
                    Some(dirs) => dirs.iter().map(PathBuf::as_path).collect(),
                    None => vec![lib_dir.as_path()],
                };
                g.command(program, &libs, preload.then_some(&**preload_so))
            }
            None => {
                let mut c = Command::new(program);
                c.env("LD_LIBRARY_PATH", lib_dir);
                c.env_remove("LD_PRELOAD");
                if preload {
                    c.env("LD_PRELOAD", preload_so);
                }
                c
            }
        };
        for (k, v) in &self.vars {
            c.env(k, v);
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

    /// How many times device `dev` went from one process's work to another's inside
    /// `[from, to)` (see `fake_state::Shared::switches_between`).
    pub fn device_switches(&self, dev: usize, from: u64, to: u64) -> u64 {
        if !self.state_path.exists() {
            return 0;
        }
        let sh = fake_state::Shared::open(&self.state_path, fake_state::Config::from_env)
            .unwrap_or_else(|e| panic!("open {}: {e}", self.state_path.display()));
        sh.switches_between(dev, from, to)
    }

    /// The fake device clock's ground truth: the busy ns of physical device `dev` per pid
    /// inside `[from, to)` (ns of `CLOCK_MONOTONIC`, as [`crate::device_clock_now_ns`] and
    /// `cudaprobe launch-for`'s `start_ns=`/`end_ns=`), read from this sandbox's state file
    /// (an empty window if no fake process created it yet).
    pub fn device_busy(&self, dev: usize, from: u64, to: u64) -> fake_state::BusyWindow {
        if !self.state_path.exists() {
            return fake_state::BusyWindow {
                from,
                to,
                covered_from: from,
                ..Default::default()
            };
        }
        let sh = fake_state::Shared::open(&self.state_path, fake_state::Config::from_env)
            .unwrap_or_else(|e| panic!("open {}: {e}", self.state_path.display()));
        sh.busy_between(dev, from, to)
    }

    /// Runs `nvmlprobe` and parses what it reports: the driver's own figures, as the agent
    /// sees them, always without the preload (whose NVML hooks show the container's view:
    /// its quota and its processes with their region usage; run [`TestEnv::nvmlprobe_cmd`]
    /// for that).
    pub fn nvml(&self) -> NvmlSnapshot {
        let prog = self
            .shared
            .as_ref()
            .map_or(&Artifacts::get().nvmlprobe, |s| &s.nvmlprobe);
        let out = self
            .command_with_preload(prog, false)
            .output()
            .expect("spawn nvmlprobe");
        NvmlSnapshot::parse(&String::from_utf8_lossy(&out.stdout))
    }
}
