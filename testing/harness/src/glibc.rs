//! glibc versions: what a built library needs of the C library (read from its ELF version
//! sections with `object`), the zig that makes glibc 2.17 stubs for the preload's link
//! (`hami-preload/build/glibc_floor.rs`), and an older glibc userland (Debian 11's glibc
//! 2.31) to run programs under, both installed in `.tools` by `cargo xtask setup`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use object::read::elf::ElfFile64;
use object::{Object, ObjectSymbol};

/// The oldest glibc the preload must load on (HAMi's floor; the same on x86-64 and arm64).
pub const FLOOR: Version = Version(2, 17, 0);

/// PyPI's `ziglang` release that `cargo xtask setup` installs into [`ZIG_DIR`].
pub const ZIG_VERSION: &str = "0.17.1";

/// Where `cargo xtask setup` installs `ziglang` (`pip install --target`), relative to the
/// workspace root; the binary is `<dir>/ziglang/zig`.
pub const ZIG_DIR: &str = ".tools/zig";

/// The Debian release whose glibc the old-glibc runs use, and that glibc's version.
pub const OLD_GLIBC_SUITE: (&str, Version) = ("bullseye", Version(2, 31, 0));

/// Where `cargo xtask setup` unpacks [`OLD_GLIBC_SUITE`]'s `libc6`, `libc-bin` and `libgcc-s1`
/// (x86-64),
/// relative to the workspace root.
pub const OLD_GLIBC_DIR: &str = ".tools/glibc-2.31";

/// Environment variable that makes every command a [`crate::TestEnv`] builds run under the
/// old glibc of [`OldGlibc`] (its loader, its libraries, the preload through the loader's
/// `--preload`), with the C programs built against glibc 2.17 by zig: `cargo xtask test`
/// runs the preload's integration tests a second time that way. Its value is the userland's
/// root ([`OLD_GLIBC_DIR`]).
pub const ENV_OLD_GLIBC: &str = "HAMI_TEST_OLD_GLIBC";

/// A glibc symbol version, `GLIBC_<major>.<minor>[.<patch>]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Version(pub u32, pub u32, pub u32);

impl Version {
    /// Parses `GLIBC_2.2.5` (`None` for `GLIBC_PRIVATE` and anything else).
    pub fn parse(name: &str) -> Option<Version> {
        let rest = name.strip_prefix("GLIBC_")?;
        let mut parts = rest.split('.').map(|p| p.parse::<u32>().ok());
        let major = parts.next()??;
        let minor = parts.next()??;
        let patch = parts.next().unwrap_or(Some(0))?;
        if parts.next().is_some() {
            return None;
        }
        Some(Version(major, minor, patch))
    }
}

impl std::fmt::Display for Version {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.2 {
            0 => write!(f, "GLIBC_{}.{}", self.0, self.1),
            p => write!(f, "GLIBC_{}.{}.{p}", self.0, self.1),
        }
    }
}

/// What a shared object needs of the C library at load.
#[derive(Debug, Default)]
pub struct Needs {
    /// Every version it requires (`.gnu.version_r`), by library file, with the symbols bound
    /// to it: `libc.so.6` → `GLIBC_2.2.5` → `[dlopen, ...]`.
    pub versions: BTreeMap<String, BTreeMap<String, Vec<String>>>,
    /// Undefined, non-weak dynamic symbols with no version: bound to whatever the running
    /// libraries define by that name, and a fatal loader error (with `-z now`) where none does
    /// (`gettid` before glibc 2.30).
    pub unversioned_strong: Vec<String>,
}

impl Needs {
    /// Reads `data`, a 64-bit ELF shared object.
    pub fn read(data: &[u8]) -> Result<Needs, String> {
        let elf = ElfFile64::<object::Endianness>::parse(data).map_err(|e| e.to_string())?;
        let endian = elf.endian();
        let table = elf
            .elf_section_table()
            .versions(endian, data)
            .map_err(|e| e.to_string())?
            .ok_or("no symbol version sections")?;
        let mut needs = Needs::default();
        for sym in elf.dynamic_symbols() {
            if !sym.is_undefined() {
                continue;
            }
            let name = sym.name().map_err(|e| e.to_string())?.to_string();
            if name.is_empty() {
                continue;
            }
            let raw = sym.elf_symbol();
            let weak = raw.st_bind() == object::elf::STB_WEAK;
            let index = table.version_index(endian, sym.index());
            match table.version(index).map_err(|e| e.to_string())? {
                Some(v) => {
                    let file = String::from_utf8_lossy(v.file().unwrap_or(b"?")).into_owned();
                    let version = String::from_utf8_lossy(v.name()).into_owned();
                    needs
                        .versions
                        .entry(file)
                        .or_default()
                        .entry(version)
                        .or_default()
                        .push(name);
                }
                None if !weak => needs.unversioned_strong.push(name),
                None => {}
            }
        }
        Ok(needs)
    }

    /// Every requirement above `floor` (or not a numbered glibc version), one line each:
    /// `libc.so.6 GLIBC_2.34: dlopen, dladdr`.
    pub fn above(&self, floor: Version) -> Vec<String> {
        let mut out = Vec::new();
        for (file, versions) in &self.versions {
            for (version, syms) in versions {
                if !version.starts_with("GLIBC_") {
                    continue;
                }
                if Version::parse(version).is_none_or(|v| v > floor) {
                    out.push(format!("{file} {version}: {}", syms.join(", ")));
                }
            }
        }
        out
    }

    /// The newest numbered glibc version required, if any.
    pub fn newest(&self) -> Option<Version> {
        self.versions
            .values()
            .flat_map(|v| v.keys())
            .filter_map(|v| Version::parse(v))
            .max()
    }
}

/// The zig binary `cargo xtask setup` installed under `root`.
pub fn zig(root: &Path) -> PathBuf {
    root.join(ZIG_DIR).join("ziglang").join("zig")
}

/// An older glibc userland unpacked by `cargo xtask setup` (x86-64 only).
#[derive(Debug, Clone)]
pub struct OldGlibc {
    /// Its root (`.tools/glibc-2.31`).
    pub root: PathBuf,
}

impl OldGlibc {
    /// The userland under `root`, if its loader is there.
    pub fn at(root: &Path) -> Option<OldGlibc> {
        let g = OldGlibc {
            root: root.to_path_buf(),
        };
        g.loader().is_file().then_some(g)
    }

    /// Its libraries' directory.
    pub fn lib_dir(&self) -> PathBuf {
        self.root.join("lib/x86_64-linux-gnu")
    }

    /// Its dynamic loader (run explicitly: `ld.so [--preload LIB] [--library-path DIRS]
    /// PROGRAM ARGS`).
    pub fn loader(&self) -> PathBuf {
        self.lib_dir().join("ld-linux-x86-64.so.2")
    }

    /// A program of the userland (`usr/bin/getconf`).
    pub fn program(&self, rel: &str) -> PathBuf {
        self.root.join(rel)
    }

    /// A command running `program` under this glibc: its loader, its libraries first, then
    /// `extra_libs`, and `preload` through the loader's `--preload` (glibc 2.30 and later).
    pub fn command(
        &self,
        program: &Path,
        extra_libs: &[&Path],
        preload: Option<&Path>,
    ) -> std::process::Command {
        let mut path = self.lib_dir().display().to_string();
        for l in extra_libs {
            path.push(':');
            path.push_str(&l.display().to_string());
        }
        let mut c = std::process::Command::new(self.loader());
        c.arg("--library-path").arg(path);
        if let Some(p) = preload {
            c.arg("--preload").arg(p);
        }
        c.arg(program);
        c.env_remove("LD_PRELOAD").env_remove("LD_LIBRARY_PATH");
        c
    }
}

/// The old glibc the running tests were asked to use ([`ENV_OLD_GLIBC`]), if any; panics
/// when the variable names a directory without a loader (a run that asked for it must not
/// pass on the host's glibc).
pub fn requested() -> Option<OldGlibc> {
    let root = std::env::var_os(ENV_OLD_GLIBC).filter(|v| !v.is_empty())?;
    let root = PathBuf::from(root);
    Some(OldGlibc::at(&root).unwrap_or_else(|| {
        panic!(
            "{ENV_OLD_GLIBC}={} has no loader at lib/x86_64-linux-gnu/ld-linux-x86-64.so.2 \
             (cargo xtask setup unpacks it into {OLD_GLIBC_DIR})",
            root.display()
        )
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_parse_and_order() {
        assert_eq!(Version::parse("GLIBC_2.2.5"), Some(Version(2, 2, 5)));
        assert_eq!(Version::parse("GLIBC_2.17"), Some(Version(2, 17, 0)));
        assert_eq!(Version::parse("GLIBC_PRIVATE"), None);
        assert_eq!(Version::parse("GCC_3.0"), None);
        assert!(Version(2, 34, 0) > FLOOR);
        assert!(Version(2, 3, 4) < FLOOR);
        assert!(Version(2, 17, 0) <= FLOOR);
        assert_eq!(Version(2, 2, 5).to_string(), "GLIBC_2.2.5");
    }

    #[test]
    fn a_host_library_linked_on_this_glibc_is_seen_above_the_floor() {
        // This test binary itself was linked against the host's glibc (2.36 on Debian 12,
        // CI's machine): it needs `__libc_start_main@GLIBC_2.34` at least. The reader must see
        // that, or the preload's floor test could pass on anything.
        let exe = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        let needs = Needs::read(&exe).unwrap();
        let newest = needs.newest().expect("some glibc version");
        assert!(newest > FLOOR, "{newest} {:?}", needs.versions);
        assert!(!needs.above(FLOOR).is_empty());
    }
}
