//! `deploy/hami-swap.sh` against fake host folders laid out as HAMi 2.4, 2.5-2.9 and 2.10
//! leave them, with HAMi's behaviour as the reference (read from its sources, v2.4.0, v2.5.0,
//! v2.9.0, v2.10.0; docs/hami.md). This file EMULATES the device plugin's start; the real
//! start scripts run in `hami_swap_interop.rs`.
//!
//! * which host file the device plugin mounts at `<hook>/vgpu/libvgpu.so` in a container:
//!   2.4 always `<vgpu>/libvgpu.so`; 2.5+ `<vgpu>/libvgpu.so.<version>` when it exists, else
//!   `<vgpu>/libvgpu.so`;
//! * what a device-plugin (re)start does to the folder: 2.4's postStart copies every image
//!   file over the host's (`cp -f`, in place); 2.5+'s `vgpu-init.sh` copies each image file
//!   whose content differs (in place too when the file exists); 2.10's skips the image's
//!   `ld.so.preload` and rewrites the host's in place at every start (`<vgpu>/libvgpu.so`);
//! * HAMi 2.4 is emulated with the image of option B (no library: what hami-swap.sh requires
//!   there, `--device-plugin-without-lib`).

use std::fs;
use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use hami_test_harness::workspace_root;

const HAMI_CORE_V24: &[u8] = b"\x7fELF fake HAMi-core libvgpu.so built for v2.4.0\n";
const HAMI_CORE_V29: &[u8] = b"\x7fELF fake HAMi-core libvgpu.so built for v2.9.0\n";
const HAMI_CORE_V210: &[u8] = b"\x7fELF fake HAMi-core libvgpu.so built for v2.10.0\n";
const HAMI_CORE_V29_NEWER: &[u8] = b"\x7fELF fake HAMi-core libvgpu.so v2.9.0, rebuilt\n";
const OURS: &[u8] = b"\x7fELF fake libhami_preload.so defines hami_preload_marker, build 2\n";
const OURS_OLD: &[u8] = b"\x7fELF fake libhami_preload.so defines hami_preload_marker, build 1\n";
/// What HAMi's image ships as ld.so.preload (its hook path /usr/local).
const PRELOAD_LINE: &str = "/usr/local/vgpu/libvgpu.so";

/// One HAMi device plugin, as far as the library goes.
struct Hami {
    /// `None`: 2.4 (no versioned name); `Some("v2.9.0")`: 2.5 and later.
    version: Option<&'static str>,
    /// The image's `/k8s-vgpu/lib/nvidia/libvgpu.so[.<version>]`; `None`: the image of
    /// option B (`deploy/hami-device-plugin/Dockerfile`), which has none.
    lib: Option<&'static [u8]>,
    /// 2.10: `vgpu-init.sh` skips the image's `ld.so.preload` and rewrites the host's in
    /// place at every start.
    regenerates_preload: bool,
}

impl Hami {
    fn v24() -> Hami {
        Hami {
            version: None,
            lib: Some(HAMI_CORE_V24),
            regenerates_preload: false,
        }
    }

    fn v29() -> Hami {
        Hami {
            version: Some("v2.9.0"),
            lib: Some(HAMI_CORE_V29),
            regenerates_preload: false,
        }
    }

    fn v210() -> Hami {
        Hami {
            version: Some("v2.10.0"),
            lib: Some(HAMI_CORE_V210),
            regenerates_preload: true,
        }
    }

    /// The same device plugin from the image of option B (no library).
    fn without_lib(self) -> Hami {
        Hami { lib: None, ..self }
    }

    /// The image's library (HAMi-core): what a rollback must give back.
    fn core(&self) -> &'static [u8] {
        self.lib.expect("an image with HAMi-core")
    }

    fn image_lib_name(&self) -> String {
        match self.version {
            None => "libvgpu.so".into(),
            Some(v) => format!("libvgpu.so.{v}"),
        }
    }

    /// The device plugin's (re)start: its image's files land in the host folder.
    fn start(&self, vgpu: &Path) {
        let mut files: Vec<(String, &[u8])> = Vec::new();
        if let Some(lib) = self.lib {
            files.push((self.image_lib_name(), lib));
        }
        if !self.regenerates_preload {
            files.push(("ld.so.preload".into(), PRELOAD_LINE.as_bytes()));
        }
        for (name, body) in files {
            let dst = vgpu.join(&name);
            let copy = match self.version {
                // cp -f: always.
                None => true,
                // vgpu-init.sh: when missing or when the content differs.
                Some(_) => fs::read(&dst).map(|b| b != body).unwrap_or(true),
            };
            if copy {
                // In place, as cp does onto an existing file: same inode, truncated.
                fs::OpenOptions::new()
                    .create(true)
                    .write(true)
                    .truncate(true)
                    .open(&dst)
                    .unwrap()
                    .write_all(body)
                    .unwrap();
            }
        }
        if self.regenerates_preload {
            // printf '%s/libvgpu.so\n' "$DEST_DIR" > "$DEST_DIR/ld.so.preload": in place.
            fs::OpenOptions::new()
                .create(true)
                .write(true)
                .truncate(true)
                .open(vgpu.join("ld.so.preload"))
                .unwrap()
                .write_all(format!("{PRELOAD_LINE}\n").as_bytes())
                .unwrap();
        }
    }

    /// The host file the device plugin mounts into a container allocated now.
    fn mounted(&self, vgpu: &Path) -> PathBuf {
        if let Some(v) = self.version {
            let p = vgpu.join(format!("libvgpu.so.{v}"));
            if p.exists() {
                return p;
            }
        }
        vgpu.join("libvgpu.so")
    }
}

struct Node {
    _dir: tempfile::TempDir,
    vgpu: PathBuf,
    lib: PathBuf,
    /// Given to every hami-swap.sh run (`--device-plugin-without-lib` on 2.4 nodes).
    flags: Vec<&'static str>,
}

impl Node {
    fn new(hami: &Hami) -> Node {
        let dir = tempfile::tempdir().unwrap();
        let vgpu = dir.path().join("usr-local-vgpu");
        fs::create_dir_all(vgpu.join("containers")).unwrap();
        let lib = dir.path().join("libhami_preload.so");
        fs::write(&lib, OURS).unwrap();
        hami.start(&vgpu);
        Node {
            _dir: dir,
            vgpu,
            lib,
            flags: Vec::new(),
        }
    }

    /// A node that ran `hami` and now runs its device plugin from the image of option B:
    /// hami-swap.sh gets `--device-plugin-without-lib`.
    fn option_b(hami: &Hami) -> Node {
        let mut n = Node::new(hami);
        n.flags.push("--device-plugin-without-lib");
        n
    }

    fn swap(&self, mode: &str) -> Output {
        self.swap_args(&[mode])
    }

    fn swap_args(&self, args: &[&str]) -> Output {
        let out = Command::new("sh")
            .arg(workspace_root().join("deploy/hami-swap.sh"))
            .args(args)
            .arg("--vgpu-dir")
            .arg(&self.vgpu)
            .arg("--lib")
            .arg(&self.lib)
            .args(&self.flags)
            .output()
            .unwrap();
        out
    }

    fn ok(&self, mode: &str) -> String {
        let out = self.swap(mode);
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "hami-swap.sh {mode}:\n{text}");
        text
    }

    /// Every entry of the folder (recursively): name, inode, content.
    fn snapshot(&self) -> Vec<(String, u64, Vec<u8>)> {
        fn walk(base: &Path, d: &Path, out: &mut Vec<(String, u64, Vec<u8>)>) {
            for e in fs::read_dir(d).unwrap() {
                let e = e.unwrap();
                let p = e.path();
                let rel = p.strip_prefix(base).unwrap().display().to_string();
                let md = fs::metadata(&p).unwrap();
                if md.is_dir() {
                    out.push((rel, md.ino(), Vec::new()));
                    walk(base, &p, out);
                } else {
                    out.push((rel, md.ino(), fs::read(&p).unwrap()));
                }
            }
        }
        let mut v = Vec::new();
        walk(&self.vgpu, &self.vgpu, &mut v);
        v.sort();
        v
    }
}

fn read(p: &Path) -> Vec<u8> {
    fs::read(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

#[test]
fn hami_24_mounts_hami_preload_after_install_and_hami_core_after_rollback() {
    let h = Hami::v24();
    let mut n = Node::new(&h);
    assert_eq!(read(&h.mounted(&n.vgpu)), HAMI_CORE_V24);
    // HAMi 2.4's own image: refused (its next start would cp HAMi-core into ours), nothing
    // changed.
    let before = n.snapshot();
    let out = n.swap("install");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("--device-plugin-without-lib") && err.contains("option B"),
        "{err}"
    );
    assert_eq!(n.snapshot(), before);
    // The device plugin restarts from the image of option B: it copies ld.so.preload only.
    let b = Hami::v24().without_lib();
    b.start(&n.vgpu);
    assert_eq!(read(&b.mounted(&n.vgpu)), HAMI_CORE_V24);
    n.flags.push("--device-plugin-without-lib");
    let log = n.ok("install");
    assert!(log.contains("layout 2.4"), "{log}");
    assert_eq!(read(&h.mounted(&n.vgpu)), OURS, "{log}");
    assert_eq!(read(&n.vgpu.join("hami-rs-orig/libvgpu.so")), HAMI_CORE_V24);
    assert_eq!(
        fs::read_to_string(n.vgpu.join("ld.so.preload")).unwrap(),
        PRELOAD_LINE,
        "HAMi's ld.so.preload was right and stays untouched"
    );
    let st = n.swap("status");
    assert_eq!(st.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&st.stdout).contains("hami-preload"));
    // Its restarts never touch the library.
    let ours = fs::metadata(n.vgpu.join("libvgpu.so")).unwrap();
    b.start(&n.vgpu);
    let after = fs::metadata(n.vgpu.join("libvgpu.so")).unwrap();
    assert_eq!(
        (after.ino(), after.mtime_nsec()),
        (ours.ino(), ours.mtime_nsec())
    );
    assert_eq!(n.ok("install"), "");

    let log = n.ok("rollback");
    assert_eq!(read(&h.mounted(&n.vgpu)), HAMI_CORE_V24, "{log}");
    assert!(!n.vgpu.join("hami-rs-orig").exists(), "{log}");
    let st = n.swap("status");
    assert_eq!(st.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&st.stdout).contains("HAMi-core"));
}

#[test]
fn hami_29_falls_back_to_libvgpu_so_and_a_restart_never_writes_into_ours() {
    let h = Hami::v29();
    let n = Node::new(&h);
    // A fresh 2.9 node: only the versioned name exists, and it is what HAMi mounts.
    assert!(!n.vgpu.join("libvgpu.so").exists());
    assert_eq!(h.mounted(&n.vgpu), n.vgpu.join("libvgpu.so.v2.9.0"));
    let log = n.ok("install");
    assert!(log.contains("layout 2.5+"), "{log}");
    // The versioned file went aside, so the device plugin falls back to libvgpu.so: ours.
    assert_eq!(h.mounted(&n.vgpu), n.vgpu.join("libvgpu.so"), "{log}");
    assert_eq!(read(&h.mounted(&n.vgpu)), OURS);
    assert_eq!(
        read(&n.vgpu.join("hami-rs-orig/libvgpu.so.v2.9.0")),
        HAMI_CORE_V29
    );
    let ours = fs::metadata(n.vgpu.join("libvgpu.so")).unwrap().ino();

    // The device plugin restarts with a rebuilt image: vgpu-init.sh writes a new
    // libvgpu.so.v2.9.0, not into the file containers of hami-preload map.
    let h2 = Hami {
        lib: Some(HAMI_CORE_V29_NEWER),
        ..Hami::v29()
    };
    h2.start(&n.vgpu);
    let md = fs::metadata(n.vgpu.join("libvgpu.so")).unwrap();
    assert_eq!(md.ino(), ours);
    assert_eq!(read(&n.vgpu.join("libvgpu.so")), OURS);
    assert_eq!(read(&h2.mounted(&n.vgpu)), HAMI_CORE_V29_NEWER);
    // One more pass (what `watch` runs every interval) puts it right and keeps the newer
    // HAMi-core for a rollback.
    n.ok("install");
    assert_eq!(read(&h2.mounted(&n.vgpu)), OURS);
    assert_eq!(
        read(&n.vgpu.join("hami-rs-orig/libvgpu.so.v2.9.0")),
        HAMI_CORE_V29_NEWER
    );

    // Rollback: HAMi mounts its own versioned file again; libvgpu.so, which HAMi 2.9 never
    // had here, is gone.
    let log = n.ok("rollback");
    assert_eq!(
        h2.mounted(&n.vgpu),
        n.vgpu.join("libvgpu.so.v2.9.0"),
        "{log}"
    );
    assert_eq!(read(&h2.mounted(&n.vgpu)), HAMI_CORE_V29_NEWER);
    assert!(!n.vgpu.join("libvgpu.so").exists(), "{log}");
    assert!(!n.vgpu.join("hami-rs-orig").exists());
    assert_eq!(
        fs::read_to_string(n.vgpu.join("ld.so.preload")).unwrap(),
        PRELOAD_LINE
    );
}

#[test]
fn install_is_idempotent_and_upgrades_an_older_hami_rs_without_keeping_it() {
    for h in [Hami::v24(), Hami::v29(), Hami::v210()] {
        let n = if h.version.is_none() {
            Node::option_b(&h)
        } else {
            Node::new(&h)
        };
        n.ok("install");
        let before = n.snapshot();
        let log = n.ok("install");
        assert_eq!(log, "", "a second install changes nothing and says nothing");
        assert_eq!(n.snapshot(), before);

        // A newer hami-rs replaces the older one; the backup keeps HAMi-core's.
        fs::write(&n.lib, OURS_OLD).unwrap();
        n.ok("install");
        assert_eq!(read(&h.mounted(&n.vgpu)), OURS_OLD);
        fs::write(&n.lib, OURS).unwrap();
        n.ok("install");
        assert_eq!(read(&h.mounted(&n.vgpu)), OURS);
        let kept = n.vgpu.join("hami-rs-orig").join(h.image_lib_name());
        assert_eq!(read(&kept), h.core());
        // Rolling back twice is harmless.
        n.ok("rollback");
        let after = n.snapshot();
        assert!(n.ok("rollback").contains("nothing to roll back"));
        assert_eq!(n.snapshot(), after);
        assert_eq!(read(&h.mounted(&n.vgpu)), h.core());
    }
}

#[test]
fn a_wrong_ld_so_preload_is_rewritten_and_restored_by_the_rollback() {
    let h = Hami::v29();
    let n = Node::new(&h);
    fs::write(n.vgpu.join("ld.so.preload"), "/opt/other/libvgpu.so\n").unwrap();
    let log = n.ok("install");
    assert!(log.contains("wrote"), "{log}");
    assert_eq!(
        fs::read_to_string(n.vgpu.join("ld.so.preload"))
            .unwrap()
            .trim_end(),
        PRELOAD_LINE
    );
    n.ok("rollback");
    assert_eq!(
        fs::read_to_string(n.vgpu.join("ld.so.preload")).unwrap(),
        "/opt/other/libvgpu.so\n"
    );
}

#[test]
fn bad_inputs_are_refused_with_what_was_wrong() {
    let h = Hami::v24();
    let n = Node::new(&h);
    // Not hami-preload: HAMi-core's own library given as --lib.
    fs::write(&n.lib, HAMI_CORE_V24).unwrap();
    let out = n.swap("install");
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("hami_preload_marker"), "{err}");
    assert_eq!(read(&h.mounted(&n.vgpu)), HAMI_CORE_V24, "nothing changed");
    assert!(!n.vgpu.join("hami-rs-orig").exists());
    // A folder that is not there.
    let out = Command::new("sh")
        .arg(workspace_root().join("deploy/hami-swap.sh"))
        .args(["install", "--vgpu-dir", "/nonexistent/vgpu"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/vgpu is not a folder"));
    for args in [
        &["frobnicate"][..],
        &["watch", "--interval", "0"],
        &["install", "--x"],
    ] {
        let out = n.swap_args(args);
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        assert!(!out.stderr.is_empty(), "{args:?}");
    }
}

#[test]
fn watch_puts_hami_preload_back_after_a_device_plugin_restart() {
    let h = Hami::v29();
    let n = Node::new(&h);
    let mut child = Command::new("sh")
        .arg(workspace_root().join("deploy/hami-swap.sh"))
        .args(["watch", "--interval", "1", "--vgpu-dir"])
        .arg(&n.vgpu)
        .arg("--lib")
        .arg(&n.lib)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let wait_ours = |what: &str| {
        let t0 = Instant::now();
        while fs::read(h.mounted(&n.vgpu)).ok().as_deref() != Some(OURS) {
            assert!(t0.elapsed() < Duration::from_secs(10), "{what}");
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    wait_ours("the first pass never installed");
    h.start(&n.vgpu);
    assert_eq!(read(&h.mounted(&n.vgpu)), HAMI_CORE_V29);
    wait_ours("watch never moved the re-copied libvgpu.so.v2.9.0 aside");
    // SIGTERM ends it cleanly (a DaemonSet container being stopped).
    // SAFETY: kill(2) on a child we spawned and have not reaped.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
    let st = child.wait().unwrap();
    assert!(st.success(), "{st:?}");
}

/// HAMi 2.10 (commit 229130af) rewrites `ld.so.preload` in place at every start, with the line
/// hami-preload needs already: install leaves it alone; a restart's re-copied
/// `libvgpu.so.v2.10.0` is moved aside by `watch` within one look (0.5 s by default), not at
/// its 10 s pass.
#[test]
fn hami_210_restart_rewrites_ld_so_preload_and_watch_reacts_within_a_look() {
    let h = Hami::v210();
    let n = Node::new(&h);
    let pre = n.vgpu.join("ld.so.preload");
    assert_eq!(read(&pre), format!("{PRELOAD_LINE}\n").as_bytes());
    let hamis = fs::metadata(&pre).unwrap().ino();
    let log = n.ok("install");
    assert!(!log.contains("wrote"), "HAMi 2.10's line is right: {log}");
    assert_eq!(fs::metadata(&pre).unwrap().ino(), hamis);

    let child = Command::new("sh")
        .arg(workspace_root().join("deploy/hami-swap.sh"))
        .arg("watch")
        .arg("--vgpu-dir")
        .arg(&n.vgpu)
        .arg("--lib")
        .arg(&n.lib)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let lib = n.vgpu.join("libvgpu.so");
    let wait_ours = |what: &str| -> Duration {
        let t0 = Instant::now();
        while h.mounted(&n.vgpu) != lib {
            assert!(t0.elapsed() < Duration::from_secs(15), "{what}");
            std::thread::sleep(Duration::from_millis(5));
        }
        t0.elapsed()
    };
    std::thread::sleep(Duration::from_millis(300));
    for i in 0..3 {
        h.start(&n.vgpu);
        assert_eq!(h.mounted(&n.vgpu), n.vgpu.join("libvgpu.so.v2.10.0"));
        let took = wait_ours("watch never moved the re-copied libvgpu.so.v2.10.0 aside");
        assert!(
            took < Duration::from_millis(1500),
            "restart {i}: HAMi-core was mounted for {took:?}, not one 0.5 s look"
        );
        assert_eq!(read(&lib), OURS);
        assert_eq!(read(&pre), format!("{PRELOAD_LINE}\n").as_bytes());
        std::thread::sleep(Duration::from_millis(170));
    }
    // SAFETY: kill(2) on a child we spawned and have not reaped.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let log = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        log.matches("kept HAMi's libvgpu.so.v2.10.0").count(),
        3,
        "{log}"
    );
    assert!(!log.contains("wrote"), "{log}");
}

/// A refused install (HAMi 2.4's own image) is retried at the full pass, not at every look:
/// one error per `--interval`, and nothing changes.
#[test]
fn watch_on_a_refused_node_retries_at_its_interval_only() {
    let h = Hami::v24();
    let n = Node::new(&h);
    let before = n.snapshot();
    let child = Command::new("sh")
        .arg(workspace_root().join("deploy/hami-swap.sh"))
        .args(["watch", "--interval", "1", "--check-ms", "20", "--vgpu-dir"])
        .arg(&n.vgpu)
        .arg("--lib")
        .arg(&n.lib)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(3500));
    // SAFETY: kill(2) on a child we spawned and have not reaped.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    let refusals = err.matches("not installing").count();
    // One pass at the start and one a second (a slower second under load), not one per
    // 20 ms look (about 170).
    assert!(
        (2..=5).contains(&refusals),
        "{refusals} refusals in 3.5 s:\n{err}"
    );
    assert_eq!(n.snapshot(), before);
}

/// With HAMi's monitor turned off, `--pod-logs` does its folder cleanup: the per-container
/// folder of a pod that left the node (no `<ns>_<name>_<uid>` under the kubelet's
/// `/var/log/pods`) goes once it is old enough; the folders of pods still there, recent
/// ones, and everything when the log folder does not show this pod itself, stay.
#[test]
fn gc_removes_the_folders_of_pods_that_left_and_nothing_when_unsure() {
    let h = Hami::v29();
    let n = Node::new(&h);
    let logs = n._dir.path().join("var-log-pods");
    fs::create_dir_all(logs.join("hami-system_hami-agent-x1_self-uid")).unwrap();
    fs::create_dir_all(logs.join("ml_trainer-0_uid-live")).unwrap();
    let c = n.vgpu.join("containers");
    for d in [
        "uid-live_main",
        "uid-gone_main",
        "uid-gone_side",
        "uid-new_main",
    ] {
        fs::create_dir_all(c.join(d)).unwrap();
        fs::write(c.join(d).join("r.cache"), b"region").unwrap();
    }
    // Old: an hour ago (the folder's own mtime).
    for d in ["uid-live_main", "uid-gone_main", "uid-gone_side"] {
        let st = Command::new("touch")
            .args(["-d", "1 hour ago"])
            .arg(c.join(d))
            .status()
            .unwrap();
        assert!(st.success());
    }
    let gc = |self_uid: &str, logs: &Path| {
        let out = n.swap_args(&[
            "gc",
            "--pod-logs",
            logs.to_str().unwrap(),
            "--self-uid",
            self_uid,
        ]);
        assert!(out.status.success(), "{out:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    // This pod's own log folder is not there: a wrong mount; nothing goes.
    let log = gc("other-uid", &logs);
    assert!(log.contains("not removing"), "{log}");
    let log = gc("self-uid", &n._dir.path().join("nonexistent"));
    assert!(log.contains("not removing"), "{log}");
    assert!(c.join("uid-gone_main").exists());

    let log = gc("self-uid", &logs);
    assert!(!c.join("uid-gone_main").exists(), "{log}");
    assert!(!c.join("uid-gone_side").exists(), "{log}");
    assert!(c.join("uid-live_main/r.cache").exists(), "{log}");
    assert!(c.join("uid-new_main/r.cache").exists(), "too recent: {log}");
    assert!(log.contains("uid-gone"), "{log}");
    // The library and its backups are not touched by it.
    assert_eq!(read(&h.mounted(&n.vgpu)), HAMI_CORE_V29);
}

/// A node upgraded from 2.4 to 2.5: HAMi 2.4's `libvgpu.so` is still there beside 2.5's
/// `libvgpu.so.v2.5.0` (2.5 never removes it). Both go aside, hami-preload is what 2.5
/// mounts, and the rollback gives both back: 2.5 mounts its versioned file again.
#[test]
fn a_node_upgraded_from_24_to_25_keeps_both_originals() {
    let old = Hami::v24();
    let n = Node::new(&old);
    let h = Hami {
        version: Some("v2.5.0"),
        lib: Some(b"\x7fELF fake HAMi-core libvgpu.so built for v2.5.0\n"),
        regenerates_preload: false,
    };
    h.start(&n.vgpu);
    assert_eq!(h.mounted(&n.vgpu), n.vgpu.join("libvgpu.so.v2.5.0"));
    let log = n.ok("install");
    assert!(log.contains("layout 2.5+"), "{log}");
    assert_eq!(h.mounted(&n.vgpu), n.vgpu.join("libvgpu.so"));
    assert_eq!(read(&h.mounted(&n.vgpu)), OURS);
    assert_eq!(read(&n.vgpu.join("hami-rs-orig/libvgpu.so")), HAMI_CORE_V24);
    assert_eq!(
        read(&n.vgpu.join("hami-rs-orig/libvgpu.so.v2.5.0")),
        h.core()
    );
    n.ok("rollback");
    assert_eq!(h.mounted(&n.vgpu), n.vgpu.join("libvgpu.so.v2.5.0"));
    assert_eq!(read(&h.mounted(&n.vgpu)), h.core());
    assert_eq!(read(&n.vgpu.join("libvgpu.so")), HAMI_CORE_V24);
}

/// The real `libhami_preload.so` is recognised as hami-rs by the script (its marker symbol)
/// and is what HAMi 2.9 mounts afterwards, byte for byte.
#[test]
fn the_real_preload_is_installed_and_recognised() {
    let a = hami_test_harness::Artifacts::get();
    let h = Hami::v29();
    let n = Node::new(&h);
    fs::copy(&a.preload_so, &n.lib).unwrap();
    n.ok("install");
    assert_eq!(read(&h.mounted(&n.vgpu)), read(&a.preload_so));
    assert_eq!(n.swap("status").status.code(), Some(0));
    // Installed once more: nothing to do (it is recognised as hami-rs, not kept as HAMi's).
    assert_eq!(n.ok("install"), "");
    assert!(!n.vgpu.join("hami-rs-orig/libvgpu.so").exists());
}
