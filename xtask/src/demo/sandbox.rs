//! [`Sandbox`]: the demo's temp dir.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

/// The demo's temp dir (region file, fake driver state); removed on drop.
pub(super) struct Sandbox {
    dir: PathBuf,
}

impl Sandbox {
    pub(super) fn new() -> Result<Sandbox> {
        let dir = std::env::temp_dir().join(format!("hami-demo-{}", std::process::id()));
        if dir.exists() {
            std::fs::remove_dir_all(&dir)?;
        }
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        Ok(Sandbox { dir })
    }

    pub(super) fn path(&self) -> &Path {
        &self.dir
    }

    pub(super) fn region(&self) -> PathBuf {
        self.dir.join("region.cache")
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
