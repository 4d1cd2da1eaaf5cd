//! HAMi's REAL device-plugin start, together with hami-rs's procedure, against a scratch root:
//! no write ever lands in a library that a running container maps, and containers allocated
//! afterwards get hami-preload.
//!
//! What runs, unmodified, from `testing/third_party/hami/<tag>/` (sha256-checked first):
//! the postStart command of HAMi's chart (`daemonsetnvidia.yaml`): v2.4.0's
//! `cp -f /k8s-vgpu/lib/nvidia/* /usr/local/vgpu/`, v2.9.0's and v2.10.0's
//! `/k8s-vgpu/bin/vgpu-init.sh /usr/local/vgpu/`, with the image's `/k8s-vgpu` laid out as
//! HAMi's `docker/Dockerfile` lays it out (HAMi-core under the name it gives it, the image's
//! `ld.so.preload`; v2.9.0's chart mounts its ConfigMap's over it). Each start runs in a
//! private mount namespace (`unshare -m`), chrooted into a root whose `/usr` is the host's
//! (read-only), whose `/usr/local/vgpu` is the scratch host folder and whose `/k8s-vgpu` is
//! the scratch image: HAMi's absolute paths, untouched. hami-rs's side is
//! `deploy/hami-swap.sh` and the RUN line of `deploy/hami-device-plugin/Dockerfile` (option
//! B: HAMi's image without its library), run against the image folder the same way.
//!
//! A "container allocated now" is a process started in such a root with what HAMi's device
//! plugin would mount at that moment: the host file `GetLibPath` picks (2.4: `libvgpu.so`;
//! 2.5+: `libvgpu.so.<version>` when it exists, else `libvgpu.so`; HAMi's Go code,
//! `plugin/util.go`, modelled here, not run) bound read-only at `/usr/local/vgpu/libvgpu.so`,
//! and the host's `ld.so.preload` at `/etc/ld.so.preload`. The dynamic loader really preloads
//! the library (the process reads its own `/proc/self/maps` to say which inode it got); the
//! process also maps the file itself (PROT_READ|PROT_EXEC, MAP_PRIVATE, as the loader does),
//! keeps re-reading that mapping (a truncation under it is a SIGBUS) and, when asked, says
//! whether its checksum or the file's mtime ever changed. hami-preload is the real
//! `libhami_preload.so`; HAMi-core a small shared object built here.
//!
//! Two tests show that the check catches what it must: HAMi 2.4's own start rewrites the
//! mapped `libvgpu.so` in place, and the former option B (hami-preload in HAMi's image under
//! HAMi's file name) writes into the mapped HAMi-core library.

use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Output, Stdio};
use std::time::{Duration, Instant};

use hami_test_harness::{compile_c, workspace_root, Artifacts};

mod in_place_writes;
mod safe_starts;
mod scripts;
use scripts::{MAPPER_C, NS_SCRIPT};

/// The fixtures and their sha256 (also in `testing/third_party/hami/README.md`).
const FIXTURES: &[(&str, &str)] = &[
    (
        "LICENSE",
        "cfc7749b96f63bd31c3c42b5c471bf756814053e847c10f3eb003417bc523d30",
    ),
    (
        "NOTICE.txt",
        "c06b0d87a94a5d0c336532eded787aab5846a6c235129f6b8c5d0879b81ee233",
    ),
    (
        "v2.4.0/charts/hami/templates/device-plugin/daemonsetnvidia.yaml",
        "4566c6ce26090dc0214ed6e6b51cfafd99adcf773c338b39d2fc0d61426fcc59",
    ),
    (
        "v2.4.0/docker/Dockerfile",
        "73732235972f954e5b5bea353201e2ce3e8d8e811cf47133d95420c284c0064c",
    ),
    (
        "v2.4.0/lib/nvidia/ld.so.preload",
        "7f84c3904fa949d3908594884c3a9ad2a01f3b917a0f4869b15f9018415f42e5",
    ),
    (
        "v2.9.0/charts/hami/templates/device-plugin/configmap.yaml",
        "d5e9fa4099e6c0ec702ffb91d29257ddfd079c5c7261b3f08b1d964e2f4213bb",
    ),
    (
        "v2.9.0/charts/hami/templates/device-plugin/daemonsetnvidia.yaml",
        "05f4be2df38c60f67fc7d7ab62668ba293d628bd65926fac8d00b98cd64f0a5a",
    ),
    (
        "v2.9.0/docker/Dockerfile",
        "ef9a6ffd7439519b7a1092b82afe9384f921b70d03f35ea046eb9fc7eb0a9910",
    ),
    (
        "v2.9.0/docker/vgpu-init.sh",
        "5c5d11808e17fd4cec4201028cf3291c5aa26f546c52f9b69721a6736448e0c6",
    ),
    (
        "v2.9.0/lib/nvidia/ld.so.preload",
        "7f84c3904fa949d3908594884c3a9ad2a01f3b917a0f4869b15f9018415f42e5",
    ),
    (
        "v2.10.0/charts/hami/templates/device-plugin/daemonsetnvidia.yaml",
        "f021905f74ea0f7ecd791ecf9f4be134186589b38380e1874ec9db8662000143",
    ),
    (
        "v2.10.0/docker/Dockerfile",
        "0fc82d3b9ef8f0908ea5a5bd6687743395a68265fded476fe951bd63512a4391",
    ),
    (
        "v2.10.0/docker/vgpu-init.sh",
        "f0cf550f7d1195dcba7a1b958db90329ffb332ea434979a7ce6329026dc1a0f7",
    ),
    (
        "v2.10.0/lib/nvidia/ld.so.preload",
        "7f84c3904fa949d3908594884c3a9ad2a01f3b917a0f4869b15f9018415f42e5",
    ),
];

/// HAMi's hook path (its chart's `global.gpuHookPath` default).
const HOOK: &str = "/usr/local";
/// Where HAMi mounts the library in a container (and what `ld.so.preload` names).
const CTR_LIB: &str = "/usr/local/vgpu/libvgpu.so";

fn third_party() -> PathBuf {
    workspace_root().join("testing/third_party/hami")
}

/// Every fixture is byte for byte what the README says it is.
fn verify_fixtures() {
    for (rel, want) in FIXTURES {
        let p = third_party().join(rel);
        let out = Command::new("sha256sum")
            .arg(&p)
            .output()
            .unwrap_or_else(|e| panic!("sha256sum (coreutils) for {}: {e}", p.display()));
        assert!(out.status.success(), "sha256sum {}: {out:?}", p.display());
        let got = String::from_utf8_lossy(&out.stdout);
        let got = got.split_whitespace().next().unwrap_or("");
        assert_eq!(
            got,
            *want,
            "{} is not HAMi's file (sha256 differs): the fixtures under testing/third_party/hami \
             must stay unmodified (README.md there)",
            p.display()
        );
    }
}

/// One HAMi release, as its fixtures describe it.
struct Release {
    tag: &'static str,
}

impl Release {
    fn file(&self, rel: &str) -> PathBuf {
        third_party().join(self.tag).join(rel)
    }

    fn text(&self, rel: &str) -> String {
        let p = self.file(rel);
        fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
    }

    /// The device plugin's postStart command from HAMi's chart, rendered for [`HOOK`].
    fn post_start(&self) -> String {
        let t = self.text("charts/hami/templates/device-plugin/daemonsetnvidia.yaml");
        let i = t
            .find("postStart:")
            .expect("the chart has a postStart hook");
        let line = t[i..]
            .lines()
            .find(|l| l.trim_start().starts_with("command:"))
            .expect("postStart has a command");
        let fmt = line
            .split("printf \"")
            .nth(1)
            .and_then(|s| s.split("\" .Values.global.gpuHookPath").next())
            .unwrap_or_else(|| panic!("unexpected postStart command: {line}"));
        assert_eq!(fmt.matches("%s").count(), 1, "{line}");
        fmt.replace("%s", HOOK)
    }

    /// The name HAMi's Dockerfile gives HAMi-core under `/k8s-vgpu/lib/nvidia/`.
    fn image_lib_name(&self) -> String {
        let t = self.text("docker/Dockerfile");
        let line = t
            .lines()
            .find(|l| l.starts_with("COPY --from=nvbuild /libvgpu/build/libvgpu.so "))
            .expect("HAMi's Dockerfile copies libvgpu.so into the image");
        let dst = line.rsplit(' ').next().unwrap();
        let name = dst
            .strip_prefix("/k8s-vgpu/lib/nvidia/")
            .unwrap_or_else(|| panic!("unexpected destination: {line}"));
        match name {
            "" => "libvgpu.so".into(),
            "libvgpu.so.\"$VERSION\"" => format!("libvgpu.so.{}", self.tag),
            other => panic!("unexpected library name in HAMi's Dockerfile: {other}"),
        }
    }

    /// Whether the device plugin mounts `libvgpu.so.<version>` when it exists (2.5+).
    fn versioned(&self) -> bool {
        self.image_lib_name() != "libvgpu.so"
    }

    /// The `/k8s-vgpu/lib/nvidia/ld.so.preload` the device plugin sees: the chart's ConfigMap
    /// where the chart mounts one over the image's (2.9), else the image's.
    fn image_preload(&self) -> Vec<u8> {
        let cm = self.file("charts/hami/templates/device-plugin/configmap.yaml");
        if let Ok(t) = fs::read_to_string(cm) {
            let mut lines = t.lines().skip_while(|l| l.trim() != "ld.so.preload: |");
            if lines.next().is_some() {
                let v = lines
                    .next()
                    .expect("the ConfigMap's ld.so.preload has a line");
                let v = v.trim().replace(
                    "{{ .Values.devicePlugin.libPath }}",
                    &format!("{HOOK}/vgpu"),
                );
                return format!("{v}\n").into_bytes();
            }
        }
        fs::read(self.file("lib/nvidia/ld.so.preload")).unwrap()
    }

    /// The host file a container allocated now gets (`GetLibPath`, modelled).
    fn mounted(&self, vgpu: &Path) -> PathBuf {
        if self.versioned() {
            let p = vgpu.join(self.image_lib_name());
            if p.exists() {
                return p;
            }
        }
        vgpu.join("libvgpu.so")
    }
}

const V240: Release = Release { tag: "v2.4.0" };
const V290: Release = Release { tag: "v2.9.0" };
const V2100: Release = Release { tag: "v2.10.0" };

/// What HAMi's device-plugin image carries under `/k8s-vgpu`.
enum Image<'a> {
    /// HAMi's own: HAMi-core under HAMi's name.
    Stock,
    /// HAMi's, after the RUN line of `deploy/hami-device-plugin/Dockerfile` (option B).
    WithoutLib,
    /// The former option B: hami-preload under HAMi's file name.
    OursUnderHamisName(&'a [u8]),
}

/// HAMi-core, for the test: a shared object the loader preloads, one per release.
fn fake_hami_core(dir: &Path, tag: &str) -> Vec<u8> {
    let out = dir.join(format!("hami-core-{tag}.so"));
    let sym = tag.replace('.', "_");
    compile_c(
        &format!("int fake_hami_core_{sym} = 1;\nconst char *fake_hami_core_tag = \"{tag}\";\n"),
        &out,
        &["-shared", "-fPIC"],
    );
    fs::read(&out).unwrap()
}

fn field<'a>(line: &'a str, key: &str) -> &'a str {
    line.split_whitespace()
        .find_map(|kv| kv.strip_prefix(key).and_then(|v| v.strip_prefix('=')))
        .unwrap_or_else(|| panic!("no {key}= in {line:?}"))
}

/// One process of a container allocated at some point, mapping its library.
struct Mapped {
    what: String,
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
    /// The inode the loader preloaded (and the process mapped).
    ino: u64,
    sum: String,
    mtime: String,
}

impl Mapped {
    /// Asks the process; `Err` says what changed under it (or how it died).
    fn check(&mut self) -> Result<(), String> {
        let asked = self
            .stdin
            .as_mut()
            .map(|s| s.write_all(b"?\n").and_then(|_| s.flush()).is_ok())
            .unwrap_or(false);
        let mut line = String::new();
        if !asked || self.stdout.read_line(&mut line).unwrap_or(0) == 0 {
            let st = self.child.wait().unwrap();
            let how = match st.signal() {
                Some(libc::SIGBUS) => "killed by SIGBUS: its library was truncated under it".into(),
                Some(sig) => format!("killed by signal {sig}"),
                None => format!("exited: {st:?}"),
            };
            return Err(format!("{}: the process died, {how}", self.what));
        }
        let (sum, changes, ino, mtime) = (
            field(&line, "sum"),
            field(&line, "changes"),
            field(&line, "ino"),
            field(&line, "mtime"),
        );
        let mut wrong = Vec::new();
        if sum != self.sum || changes != "0" {
            wrong.push(format!(
                "its mapping's content changed (checksum {} -> {sum}, {changes} changes seen)",
                self.sum
            ));
        }
        if ino != self.ino.to_string() {
            wrong.push(format!("its file is another inode ({} -> {ino})", self.ino));
        }
        if mtime != self.mtime {
            wrong.push(format!(
                "its file was written in place (mtime {} -> {mtime})",
                self.mtime
            ));
        }
        if wrong.is_empty() {
            Ok(())
        } else {
            Err(format!("{}: {}", self.what, wrong.join("; ")))
        }
    }
}

impl Drop for Mapped {
    fn drop(&mut self) {
        self.stdin.take();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A scratch node: HAMi's host folder, its device plugin's image, a root to chroot into.
struct Node {
    /// First: its processes end before the folders go.
    mapped: Vec<Mapped>,
    dir: tempfile::TempDir,
    rel: &'static Release,
    vgpu: PathBuf,
    image: PathBuf,
    root: PathBuf,
    hami_core: Vec<u8>,
    /// The real `libhami_preload.so`.
    ours: Vec<u8>,
    lib: PathBuf,
}

fn require_root_for_namespaces() {
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(
        euid, 0,
        "the HAMi interop tests run HAMi's scripts in a private mount namespace (unshare -m, \
         mount --bind, chroot) and must run as root (CI does)"
    );
}

impl Node {
    fn new(rel: &'static Release) -> Node {
        require_root_for_namespaces();
        verify_fixtures();
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let vgpu = d.join("host-usr-local-vgpu");
        fs::create_dir_all(vgpu.join("containers")).unwrap();
        let image = d.join("image-k8s-vgpu");
        let root = d.join("root");
        for sub in ["usr", "k8s-vgpu", "proc", "dev", "etc", "tmp"] {
            fs::create_dir_all(root.join(sub)).unwrap();
        }
        fs::write(root.join("etc/ld.so.preload"), b"").unwrap();
        for top in ["bin", "sbin", "lib", "lib32", "lib64", "libx32"] {
            let host = Path::new("/").join(top);
            match fs::read_link(&host) {
                Ok(target) => std::os::unix::fs::symlink(target, root.join(top)).unwrap(),
                Err(_) if host.is_dir() => fs::create_dir(root.join(top)).unwrap(),
                Err(_) => {}
            }
        }
        let mapper = root.join("mapper");
        compile_c(MAPPER_C, &mapper, &["-O2", "-Wall"]);
        let hami_core = fake_hami_core(d, rel.tag);
        let ours = fs::read(&Artifacts::get().preload_so).unwrap();
        let lib = d.join("libhami_preload.so");
        fs::write(&lib, &ours).unwrap();
        let n = Node {
            dir,
            rel,
            vgpu,
            image,
            root,
            hami_core,
            ours,
            lib,
            mapped: Vec::new(),
        };
        n.set_image(Image::Stock);
        n
    }

    /// Runs `cmd` in the scratch root for `step` (see [`NS_SCRIPT`]).
    fn in_root(&self, step: &str, envs: &[(&str, &Path)], cmd: &[&str]) -> Command {
        let mut c = Command::new("unshare");
        c.args(["--mount", "--propagation", "private", "--", "/bin/sh", "-c"])
            .arg(NS_SCRIPT)
            .arg("ns")
            .args(cmd)
            .env("STEP", step)
            .env("ROOT", &self.root)
            .env("HOSTV", &self.vgpu)
            .env("IMAGE", &self.image);
        for (k, v) in envs {
            c.env(k, v);
        }
        c
    }

    fn run_ok(&self, what: &str, mut c: Command) -> String {
        let out = c
            .output()
            .unwrap_or_else(|e| panic!("{what}: cannot run unshare (util-linux): {e}"));
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            out.status.success(),
            "{what} failed ({:?}); a private mount namespace, bind mounts and chroot need \
             root with CAP_SYS_ADMIN:\n{text}",
            out.status
        );
        text
    }

    /// Lays out the device plugin's `/k8s-vgpu` as HAMi's Dockerfile does, then what `image`
    /// changes.
    fn set_image(&self, image: Image) {
        if self.image.exists() {
            fs::remove_dir_all(&self.image).unwrap();
        }
        let nv = self.image.join("lib/nvidia");
        fs::create_dir_all(&nv).unwrap();
        fs::create_dir_all(self.image.join("bin")).unwrap();
        fs::write(nv.join("ld.so.preload"), self.rel.image_preload()).unwrap();
        fs::write(nv.join(self.rel.image_lib_name()), &self.hami_core).unwrap();
        let init = self.rel.file("docker/vgpu-init.sh");
        if init.exists() {
            let dst = self.image.join("bin/vgpu-init.sh");
            fs::copy(&init, &dst).unwrap();
            fs::set_permissions(&dst, fs::Permissions::from_mode(0o755)).unwrap();
        }
        match image {
            Image::Stock => {}
            Image::OursUnderHamisName(b) => {
                fs::write(nv.join(self.rel.image_lib_name()), b).unwrap();
            }
            Image::WithoutLib => {
                let df = fs::read_to_string(
                    workspace_root().join("deploy/hami-device-plugin/Dockerfile"),
                )
                .unwrap();
                let runs: Vec<&str> = df.lines().filter_map(|l| l.strip_prefix("RUN ")).collect();
                assert_eq!(
                    runs.len(),
                    1,
                    "deploy/hami-device-plugin/Dockerfile: one RUN"
                );
                let log = self.run_ok(
                    "the RUN line of deploy/hami-device-plugin/Dockerfile",
                    self.in_root("image-build", &[], &["/bin/sh", "-c", runs[0]]),
                );
                let left: Vec<_> = fs::read_dir(&nv)
                    .unwrap()
                    .map(|e| e.unwrap().file_name().into_string().unwrap())
                    .collect();
                assert_eq!(left, ["ld.so.preload"], "{log}");
            }
        }
    }

    /// The device plugin (re)starts: HAMi's postStart command, as its chart has it.
    fn device_plugin_start(&self) -> String {
        let cmd = self.rel.post_start();
        self.run_ok(
            &format!("HAMi {}'s postStart `{cmd}`", self.rel.tag),
            self.in_root("device-plugin", &[], &["/bin/sh", "-c", &cmd]),
        )
    }

    fn swap(&self, args: &[&str]) -> Output {
        Command::new("sh")
            .arg(workspace_root().join("deploy/hami-swap.sh"))
            .args(args)
            .arg("--vgpu-dir")
            .arg(&self.vgpu)
            .arg("--lib")
            .arg(&self.lib)
            .output()
            .unwrap()
    }

    fn swap_ok(&self, args: &[&str]) -> String {
        let out = self.swap(args);
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "hami-swap.sh {args:?}:\n{text}");
        text
    }

    /// A container allocated now: its process, with what the loader preloaded.
    fn container(&mut self, what: &str) -> u64 {
        let src = self.rel.mounted(&self.vgpu);
        let pre = self.vgpu.join("ld.so.preload");
        let mut c = self.in_root(
            "container",
            &[("LIBSRC", &src), ("PRE", &pre)],
            &["/mapper", CTR_LIB],
        );
        let mut child = c
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("unshare (util-linux)");
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        if !line.starts_with("mapped ") {
            let out = child.wait_with_output().unwrap();
            panic!(
                "{what}: the container process did not start ({:?}): {line}{}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let ino: u64 = field(&line, "ino").parse().unwrap();
        assert_eq!(
            field(&line, "preloaded"),
            ino.to_string(),
            "{what}: the loader did not preload {CTR_LIB} (ld.so.preload: {:?})",
            fs::read_to_string(&pre)
        );
        self.mapped.push(Mapped {
            what: format!("{} (mapping {})", what, src.display()),
            stdin: child.stdin.take(),
            child,
            stdout,
            ino,
            sum: field(&line, "sum").to_string(),
            mtime: field(&line, "mtime").to_string(),
        });
        ino
    }

    /// A container allocated now gets hami-preload (`ours` build) and `ld.so.preload` names it.
    fn container_gets(&mut self, ours: &[u8], what: &str) {
        let ino = self.container(what);
        let lib = self.vgpu.join("libvgpu.so");
        assert_eq!(
            self.rel.mounted(&self.vgpu),
            lib,
            "{what}: HAMi would mount another file"
        );
        assert_eq!(ino, fs::metadata(&lib).unwrap().ino(), "{what}");
        assert!(
            fs::read(&lib).unwrap() == ours,
            "{what}: libvgpu.so is not this hami-preload build"
        );
    }

    /// A container allocated now gets HAMi-core.
    fn container_gets_hami_core(&mut self, what: &str) {
        let ino = self.container(what);
        let src = self.rel.mounted(&self.vgpu);
        assert_eq!(ino, fs::metadata(&src).unwrap().ino(), "{what}");
        assert!(
            fs::read(&src).unwrap() == self.hami_core,
            "{what}: {} is not HAMi-core",
            src.display()
        );
    }

    /// Every container process's mapping is untouched.
    fn all_untouched(&mut self, when: &str) {
        let errs: Vec<String> = self
            .mapped
            .iter_mut()
            .filter_map(|m| m.check().err())
            .collect();
        assert!(errs.is_empty(), "{when}:\n{}", errs.join("\n"));
    }

    fn path(&self, name: &str) -> PathBuf {
        self.vgpu.join(name)
    }

    /// A second hami-preload build (the real one with a tag appended: still a valid ELF).
    fn ours_v2(&self) -> Vec<u8> {
        let mut b = self.ours.clone();
        b.extend_from_slice(b"\0hami-rs test build 2\0");
        b
    }

    fn install_lib(&self, bytes: &[u8]) {
        // A new file renamed over the old: the test's own --lib is no container's file.
        let tmp = self.dir.path().join("lib.tmp");
        fs::write(&tmp, bytes).unwrap();
        fs::rename(&tmp, &self.lib).unwrap();
    }
}

/// The fixtures are HAMi's files, byte for byte (every other test checks it too, first).
#[test]
fn hami_fixtures_are_unmodified() {
    verify_fixtures();
    assert_eq!(V240.image_lib_name(), "libvgpu.so");
    assert_eq!(V2100.image_lib_name(), "libvgpu.so.v2.10.0");
    assert_eq!(
        V240.post_start(),
        "cp -f /k8s-vgpu/lib/nvidia/* /usr/local/vgpu/"
    );
    assert_eq!(
        V2100.post_start(),
        "/k8s-vgpu/bin/vgpu-init.sh /usr/local/vgpu/"
    );
    assert_eq!(V290.image_preload(), b"/usr/local/vgpu/libvgpu.so\n");
    assert_eq!(V2100.image_preload(), b"/usr/local/vgpu/libvgpu.so");
}

/// HAMi 2.10 with its own image and `hami-swap.sh watch` (the chart's container, default
/// settings): how long after a device-plugin restart a container allocated gets HAMi-core.
/// The figure goes to docs/deploy.md.
#[test]
fn hami_v2_10_0_restart_window_under_watch() {
    let n = Node::new(&V2100);
    n.device_plugin_start();
    let mut watch = Command::new("sh")
        .arg(workspace_root().join("deploy/hami-swap.sh"))
        .arg("watch")
        .arg("--vgpu-dir")
        .arg(&n.vgpu)
        .arg("--lib")
        .arg(&n.lib)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let lib = n.path("libvgpu.so");
    let wait_ours = |what: &str| -> Duration {
        let t0 = Instant::now();
        while n.rel.mounted(&n.vgpu) != lib {
            assert!(t0.elapsed() < Duration::from_secs(20), "{what}");
            std::thread::sleep(Duration::from_millis(2));
        }
        t0.elapsed()
    };
    wait_ours("watch never installed");
    // Restarts at spread phases of watch's 0.5 s looks.
    let mut windows = Vec::new();
    for i in 0..10u64 {
        std::thread::sleep(Duration::from_millis(100 + i * 130 % 500));
        n.device_plugin_start();
        windows.push(wait_ours("watch never moved the re-copied library aside"));
    }
    // SAFETY: kill(2) on a child we spawned and have not reaped.
    unsafe { libc::kill(watch.id() as libc::pid_t, libc::SIGTERM) };
    assert!(watch.wait().unwrap().success());
    let ms: Vec<u128> = windows.iter().map(|d| d.as_millis()).collect();
    eprintln!("restart window under watch (ms after vgpu-init.sh returned): {ms:?}");
    let worst = windows.iter().max().unwrap();
    assert!(
        *worst < Duration::from_millis(1500),
        "a container allocated up to {worst:?} after a restart gets HAMi-core ({ms:?} ms): \
         watch should look every 0.5 s, not wait for its 10 s pass"
    );
}
