//! [`Driver`]: the CUDA driver the demo runs against (a real NVIDIA one where
//! `libcuda.so.1` and `nvidia-smi` work, else the fake) and the environment it needs.

use std::path::{Path, PathBuf};
use std::process::Command;

use hami_test_harness::Artifacts;

use super::sandbox::Sandbox;

/// The CUDA driver the demo runs against.
pub(super) struct Driver {
    /// `Some(nvidia-smi's description)` for a real driver.
    pub(super) real: Option<String>,
    /// The `libcuda.so.1` the agent probes.
    pub(super) libcuda: PathBuf,
    /// Environment for every process (agent and workloads).
    pub(super) env: Vec<(String, String)>,
}

impl Driver {
    pub(super) fn detect(art: &Artifacts) -> Driver {
        if let (Some(lib), Some(smi)) = (real_libcuda(), nvidia_smi()) {
            let dir = lib.parent().map(Path::to_path_buf).unwrap_or_default();
            return Driver {
                real: Some(smi),
                libcuda: lib,
                env: vec![("LD_LIBRARY_PATH".into(), dir.display().to_string())],
            };
        }
        Driver {
            real: None,
            libcuda: art.fake_libcuda.clone(),
            env: vec![
                (
                    "LD_LIBRARY_PATH".into(),
                    art.fake_lib_dir.display().to_string(),
                ),
                ("FAKE_CUDA_DEVICE_COUNT".into(), "1".into()),
                ("FAKE_CUDA_TOTAL_MEM".into(), "16G".into()),
            ],
        }
    }

    pub(super) fn short(&self) -> &'static str {
        if self.real.is_some() {
            "real NVIDIA"
        } else {
            "fake"
        }
    }

    pub(super) fn describe(&self) -> String {
        match &self.real {
            Some(smi) => format!(
                "real NVIDIA driver ({smi}), {}",
                self.libcuda.display()
            ),
            None => format!(
                "fake (testing/fake-cuda: 1 device of 16 GiB, 300 MiB per context), {}\n        \
                 (no real NVIDIA driver here: the same command uses one when libcuda.so.1 and nvidia-smi work)",
                self.libcuda.display()
            ),
        }
    }

    /// Applies the driver environment (and the fake's state file in `sandbox`) to `cmd`.
    pub(super) fn apply(&self, cmd: &mut Command, sandbox: &Sandbox) {
        cmd.env_remove("LD_PRELOAD");
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        if self.real.is_none() {
            cmd.env("FAKE_CUDA_STATE", sandbox.path().join("fake-cuda.state"));
        } else {
            cmd.env_remove("FAKE_CUDA_STATE");
        }
    }
}

/// A real `libcuda.so.1` (not our fake): `/usr/local/nvidia/lib64` or the `ld.so` cache.
pub(super) fn real_libcuda() -> Option<PathBuf> {
    let mut candidates = vec![PathBuf::from("/usr/local/nvidia/lib64/libcuda.so.1")];
    for ldconfig in ["ldconfig", "/sbin/ldconfig"] {
        if let Ok(o) = Command::new(ldconfig).arg("-p").output() {
            for line in String::from_utf8_lossy(&o.stdout).lines() {
                if line.trim_start().starts_with("libcuda.so.1 ") {
                    if let Some((_, p)) = line.split_once("=> ") {
                        candidates.push(PathBuf::from(p.trim()));
                    }
                }
            }
            break;
        }
    }
    candidates.into_iter().find(|p| {
        // Our fake names its state file variable; NVIDIA's library does not.
        std::fs::read(p).is_ok_and(|b| !b.windows(15).any(|w| w == b"FAKE_CUDA_STATE"))
    })
}

/// `nvidia-smi`'s first GPU, if it runs.
pub(super) fn nvidia_smi() -> Option<String> {
    let o = Command::new("nvidia-smi")
        .args([
            "--query-gpu=name,memory.total,driver_version",
            "--format=csv,noheader",
        ])
        .output()
        .ok()?;
    if !o.status.success() {
        return None;
    }
    let s = String::from_utf8_lossy(&o.stdout);
    let first = s.lines().next()?.trim();
    (!first.is_empty()).then(|| first.to_string())
}
