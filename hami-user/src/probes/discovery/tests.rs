//! Unit tests of libcuda discovery: ld.so.cache parsing, driver recognition, maps scans.
use super::*;
use object::elf;
use object::read::elf::{FileHeader, SectionHeader};
use object::read::ReadCache;
use object::Endianness;
use std::collections::HashMap;

/// A fake `/proc/<pid>` whose maps show `libs` (path, inode) executable, each file
/// present inside the process's root.
fn fake_mapper(root: &Path, pid: u32, start_time: u64, libs: &[(&str, u64)]) {
    let dir = root.join(pid.to_string());
    if !dir.exists() {
        crate::procinfo::tests::fake_proc(root, pid, start_time, &[pid], 1, "0::/\n", &[], &[]);
    }
    let stat = crate::procinfo::tests::stat_line(pid, "p", 'S', 1, start_time);
    fs::write(dir.join("stat"), stat).unwrap();
    let mut maps = String::new();
    for (path, ino) in libs {
        maps.push_str(&format!(
            "7f0000000000-7f0000001000 r-xp 00000000 08:01 {ino}    {path}\n"
        ));
        let f = rooted(&dir.join("root"), Path::new(path));
        fs::create_dir_all(f.parent().unwrap()).unwrap();
        fs::write(&f, b"").unwrap();
    }
    fs::write(dir.join("maps"), maps).unwrap();
}

fn inodes(c: &[Candidate]) -> Vec<u64> {
    let mut v: Vec<u64> = c
        .iter()
        .filter_map(|c| Some(c.maps_id.as_ref()?.1))
        .collect();
    v.sort_unstable();
    v
}

#[test]
fn a_process_with_a_driver_is_read_again_only_on_full_scans() {
    let t = tempfile::tempdir().unwrap();
    let root = t.path();
    fake_mapper(root, 100, 5, &[("/lib/libcuda.so.1", 1)]);
    fake_mapper(root, 200, 5, &[("/lib/libc.so.6", 9)]);
    fake_mapper(root, 300, 5, &[("/lib/libcuda.so.1", 1)]);
    let mut c = Classifier::default();
    assert_eq!(inodes(&scan_proc_maps_with(root, &mut c)), [1]);
    // Each process now maps a new driver.
    fake_mapper(
        root,
        100,
        5,
        &[("/lib/libcuda.so.1", 1), ("/opt/libcuda.so.2", 2)],
    );
    fake_mapper(
        root,
        200,
        5,
        &[("/lib/libc.so.6", 9), ("/x/libcuda.so.1", 3)],
    );
    // 300 exited and its pid was reused (another start time): a new process, read.
    fake_mapper(root, 300, 6, &[("/y/libcuda.so.1", 4)]);
    // 200 had no driver: read at every scan. 100 had one: skipped until a full scan.
    assert_eq!(inodes(&scan_proc_maps_with(root, &mut c)), [3, 4]);
    for _ in 2..FULL_SCAN_EVERY {
        assert_eq!(
            inodes(&scan_proc_maps_with(root, &mut c)),
            Vec::<u64>::new()
        );
    }
    assert_eq!(inodes(&scan_proc_maps_with(root, &mut c)), [1, 2, 3, 4]);
    // A fresh classifier (a one-shot scan) reads everything.
    assert_eq!(
        inodes(&scan_proc_maps_with(root, &mut Classifier::default())),
        [1, 2, 3, 4]
    );
}

#[test]
fn a_watched_file_is_reported_mapped_or_not_by_full_scans_only() {
    let t = tempfile::tempdir().unwrap();
    let root = t.path();
    let id = |ino: u64| ("08:01".to_string(), ino);
    fake_mapper(root, 100, 5, &[("/lib/libcuda.so.1", 1)]);
    // A deleted file is still mapped by its inode.
    fake_mapper(root, 200, 5, &[("/old/libcuda.so.1 (deleted)", 7)]);
    let mut c = Classifier::default();
    c.watch([id(7), id(8)]);
    scan_proc_maps_with(root, &mut c);
    let r = c.take_watched().expect("the first scan is a full one");
    assert_eq!(r.watched, [id(7), id(8)].into_iter().collect());
    assert_eq!(r.mapped, [id(7)].into_iter().collect());
    assert_eq!(c.take_watched(), None, "taken once");
    // Between full scans nothing is said (100 is not read again).
    fake_mapper(root, 200, 5, &[("/lib/libc.so.6", 9)]);
    for _ in 1..FULL_SCAN_EVERY {
        scan_proc_maps_with(root, &mut c);
        assert_eq!(c.take_watched(), None);
    }
    scan_proc_maps_with(root, &mut c);
    assert_eq!(c.take_watched().unwrap().mapped, HashSet::new());
    // A live process whose maps cannot be read: nobody can be said not to map it.
    fs::remove_file(root.join("200/maps")).unwrap();
    fs::create_dir(root.join("200/maps")).unwrap();
    for _ in 0..FULL_SCAN_EVERY {
        scan_proc_maps_with(root, &mut c);
        assert_eq!(c.take_watched(), None);
    }
    // Nothing watched: nothing reported.
    fs::remove_dir(root.join("200/maps")).unwrap();
    c.watch([]);
    for _ in 0..FULL_SCAN_EVERY {
        scan_proc_maps_with(root, &mut c);
        assert_eq!(c.take_watched(), None);
    }
}

fn cache_with(paths: &[&str]) -> Vec<u8> {
    let mut strings = Vec::new();
    let header = 48 + 24 * paths.len();
    let mut entries = Vec::new();
    for p in paths {
        let off = (header + strings.len()) as u32;
        strings.extend_from_slice(p.as_bytes());
        strings.push(0);
        entries.extend_from_slice(&1i32.to_le_bytes());
        entries.extend_from_slice(&off.to_le_bytes());
        entries.extend_from_slice(&off.to_le_bytes());
        entries.extend_from_slice(&0u32.to_le_bytes());
        entries.extend_from_slice(&0u64.to_le_bytes());
    }
    let mut d = NEW_MAGIC.to_vec();
    d.extend_from_slice(&(paths.len() as u32).to_le_bytes());
    d.extend_from_slice(&(strings.len() as u32).to_le_bytes());
    d.extend_from_slice(&[0u8; 4]);
    d.extend_from_slice(&[0u8; 16]);
    assert_eq!(d.len(), 48);
    d.extend(entries);
    d.extend(strings);
    d
}

#[test]
fn parses_synthetic_cache() {
    let d = cache_with(&["/usr/lib/libcuda.so.1", "/lib/libc.so.6"]);
    assert_eq!(
        parse_ld_so_cache(&d),
        vec![
            "/usr/lib/libcuda.so.1".to_string(),
            "/lib/libc.so.6".to_string()
        ]
    );
    // Truncated data does not panic.
    for n in 0..d.len() {
        let _ = parse_ld_so_cache(&d[..n]);
    }
    assert!(parse_ld_so_cache(b"garbage").is_empty());
}

#[test]
fn parses_host_cache_like_ldconfig() {
    // The machine's own cache: every path `ldconfig -p` prints must be found.
    let Ok(data) = fs::read("/etc/ld.so.cache") else {
        panic!("/etc/ld.so.cache missing on this machine");
    };
    let ours: HashSet<String> = parse_ld_so_cache(&data).into_iter().collect();
    let out = std::process::Command::new("ldconfig")
        .arg("-p")
        .output()
        .or_else(|_| {
            std::process::Command::new("/sbin/ldconfig")
                .arg("-p")
                .output()
        })
        .expect("ldconfig -p");
    let text = String::from_utf8_lossy(&out.stdout);
    let theirs: Vec<&str> = text
        .lines()
        .filter_map(|l| l.split(" => ").nth(1))
        .collect();
    assert!(!theirs.is_empty());
    for p in theirs {
        assert!(ours.contains(p.trim()), "{p} missing from our parse");
    }
}

#[test]
fn maps_lines() {
    let text = "\
7f0000000000-7f0000001000 r--p 00000000 fd:01 1234     /usr/lib/x86_64-linux-gnu/libcuda.so.580.1\n\
7f0000001000-7f0000002000 r-xp 00001000 fd:01 1234     /usr/lib/x86_64-linux-gnu/libcuda.so.580.1\n\
7f0000003000-7f0000004000 r-xp 00001000 00:2a 99       /tmp/x/libcuda.so.1 (deleted)\n\
7f0000005000-7f0000006000 r-xp 00001000 00:2a 77       /opt/libcudart.so.12\n\
7f0000007000-7f0000008000 r-xp 00001000 00:2b 5        /opt/fake/libcuda.so.1\n";
    // The filter discovery uses for libcuda names, over the shared maps walker.
    let got = file_mappings(text, |m| {
        Path::new(m.path)
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(is_libcuda_name)
    });
    assert_eq!(
        got,
        vec![
            (
                "fd:01".into(),
                1234,
                "/usr/lib/x86_64-linux-gnu/libcuda.so.580.1".into()
            ),
            ("00:2b".into(), 5, "/opt/fake/libcuda.so.1".into()),
        ]
    );
}

#[test]
fn exec_mappings_and_elf_symbols_of_this_process() {
    use std::os::unix::fs::MetadataExt;
    let maps = exec_mappings(&fs::read_to_string("/proc/self/maps").unwrap());
    let (dev, ino, libc) = maps
        .iter()
        .find(|(_, _, p)| p.contains("libc.so") || p.contains("libc-"))
        .cloned()
        .expect("libc mapped");
    let found = elf_defined_symbols(Path::new(&libc), &["malloc", "cuInit", "free"]).unwrap();
    assert_eq!(found.len(), 2, "{found:?}");
    assert!(found.contains(&"malloc".to_string()));
    assert!(!elf_defines_driver_symbols(Path::new(&libc)));
    assert!(elf_defined_symbols(Path::new("/proc/self/maps"), &["malloc"]).is_none());
    let m = fs::metadata(&libc).unwrap();
    assert_eq!(m.ino(), ino);
    assert_eq!(crate::probes::maps_dev(m.dev()), dev);
    let mut c = Classifier::default();
    assert!(!c.is_driver(&(dev.clone(), ino), Path::new(&libc), "libc.so.6"));
    assert!(c.is_driver(
        &("00:00".into(), 1),
        Path::new("/nonexistent"),
        "libcuda.so.1"
    ));
    let ids = [(dev, ino)].into_iter().collect();
    let text = fs::read_to_string("/proc/self/maps").unwrap();
    assert!(crate::procinfo::maps_has_ids(&text, &ids));
    assert!(!crate::procinfo::maps_has_ids(&text, &Default::default()));
}

/// The fake driver's bytes (a real ELF64 shared object defining `cuInit`).
fn fake_driver_bytes() -> Vec<u8> {
    let a = hami_test_harness::Artifacts::get();
    fs::read(&a.fake_libcuda).expect("read the fake libcuda.so.1")
}

/// Offset in the file of the `.dynsym` section header of `data`.
fn dynsym_header_offset(data: &[u8]) -> usize {
    let h = elf::FileHeader64::<Endianness>::parse(data).unwrap();
    let e = h.endian().unwrap();
    let sections = h.sections(e, data).unwrap();
    let (i, _) = sections
        .enumerate()
        .find(|(_, s)| s.sh_type(e) == elf::SHT_DYNSYM)
        .unwrap();
    h.e_shoff(e) as usize + i.0 * std::mem::size_of::<elf::SectionHeader64<Endianness>>()
}

#[test]
fn real_elf_files_read_through_object() {
    let a = hami_test_harness::Artifacts::get();
    assert!(elf_defines_driver_symbols(&a.fake_libcuda));
    // Found by its symbols under a name that is not libcuda.so*.
    let dir = tempfile::tempdir().unwrap();
    let renamed = dir.path().join("libweird_driver.so");
    fs::copy(&a.fake_libcuda, &renamed).unwrap();
    assert!(elf_defines_driver_symbols(&renamed));
    let mut c = Classifier::default();
    assert!(c.is_driver(&("00:00".into(), 2), &renamed, "libweird_driver.so"));
    // The preload defines the same names as hooks: not a driver.
    assert!(!c.is_driver(&("00:00".into(), 3), &a.preload_so, "libhami_preload.so"));
    // This test binary: an ELF64 executable that parses, and is not a driver.
    let exe = Path::new("/proc/self/exe");
    assert!(is_elf(exe).unwrap());
    assert!(elf_defined_symbols(exe, &["cuInit"]).is_some());
    assert!(!elf_defines_driver_symbols(exe));
    assert!(!is_elf(Path::new("/proc/self/maps")).unwrap());
    assert!(is_elf(&dir.path().join("missing")).is_err());
}

#[test]
fn truncated_or_garbage_elf_is_not_a_driver_and_never_panics() {
    let data = fake_driver_bytes();
    let wanted = ["cuInit", "cuMemAlloc_v2"];
    let whole = dynamic_symbols_defined(&data[..], &wanted, MAX_ELF_READ).unwrap();
    assert_eq!(whole.len(), 2, "{whole:?}");
    // Every prefix short of the tables (the section headers sit at the end): an error,
    // never a panic and never the driver's symbols.
    let shoff = elf::FileHeader64::<Endianness>::parse(&data[..])
        .unwrap()
        .e_shoff(Endianness::Little) as usize;
    let cuts =
        (0..256)
            .chain((256..data.len()).step_by(997))
            .chain([shoff, shoff + 1, data.len() - 1]);
    for n in cuts {
        let got = dynamic_symbols_defined(&data[..n], &wanted, MAX_ELF_READ);
        assert!(got.is_err(), "prefix of {n} bytes gave {got:?}");
    }
    // Random bytes flipped in the header, the section headers and the .dynsym header.
    let dynsym_hdr = dynsym_header_offset(&data);
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut d = data.clone();
    for round in 0..3000 {
        // Flipped in place, put back after the parse (no 3000 copies of the file).
        let mut flipped = Vec::new();
        for _ in 0..1 + round % 4 {
            let at = match next() % 3 {
                0 => (next() % 64) as usize,
                1 => dynsym_hdr + (next() % 64) as usize,
                _ => shoff + (next() as usize % (data.len() - shoff)),
            };
            flipped.push(at);
            d[at] = next() as u8;
        }
        let _ = dynamic_symbols_defined(&d[..], &wanted, MAX_ELF_READ);
        for at in flipped {
            d[at] = data[at];
        }
    }
    // Plain garbage.
    let mut elfish = b"\x7fELF\x02\x01\x01".to_vec();
    elfish.resize(4096, 0xff);
    for g in [&b""[..], b"garbage", b"\x7fELF", &elfish] {
        assert!(dynamic_symbols_defined(g, &wanted, MAX_ELF_READ).is_err());
    }
    // The same through a file: `None`, and `is_elf` still says what the bytes are.
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("libcuda_cut.so");
    fs::write(&f, &data[..shoff]).unwrap();
    assert!(is_elf(&f).unwrap());
    assert_eq!(elf_defined_symbols(&f, &wanted), None);
    assert!(!elf_defines_driver_symbols(&f));
}

#[test]
fn oversized_tables_are_refused_before_reading() {
    let mut data = fake_driver_bytes();
    let h = dynsym_header_offset(&data);
    // A .dynsym claiming 1 GiB inside a 2 GiB sparse file: refused unread.
    data[h + 0x18..h + 0x20].copy_from_slice(&(1u64 << 20).to_le_bytes());
    data[h + 0x20..h + 0x28].copy_from_slice(&(1u64 << 30).to_le_bytes());
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("libsparse.so");
    fs::write(&p, &data).unwrap();
    fs::OpenOptions::new()
        .write(true)
        .open(&p)
        .unwrap()
        .set_len(2 << 30)
        .unwrap();
    let cache = ReadCache::new(fs::File::open(&p).unwrap());
    match dynamic_symbols_defined(&cache, &["cuInit"], MAX_ELF_READ) {
        Err(ElfError::TooLarge { what, .. }) => assert_eq!(what, ".dynsym"),
        other => panic!("expected TooLarge, got {other:?}"),
    }
    assert_eq!(elf_defined_symbols(&p, &["cuInit"]), None);
    // The limit counts every table: the real driver does not fit in 256 bytes.
    let real = fake_driver_bytes();
    assert!(matches!(
        dynamic_symbols_defined(&real[..], &["cuInit"], 256),
        Err(ElfError::TooLarge { .. })
    ));
}

#[test]
fn a_fifo_is_not_opened_for_reading_forever() {
    use std::os::unix::ffi::OsStrExt;
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("libcuda_fifo.so");
    let c = std::ffi::CString::new(p.as_os_str().as_bytes()).unwrap();
    // SAFETY: mkfifo reads a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let (tx, rx) = std::sync::mpsc::channel();
    let q = p.clone();
    std::thread::spawn(move || {
        let r = (elf_defined_symbols(&q, &["cuInit"]), is_elf(&q).ok());
        let _ = tx.send(r);
    });
    let got = rx
        .recv_timeout(std::time::Duration::from_secs(10))
        .expect("reading a FIFO blocked");
    assert_eq!(got, (None, Some(false)));
}

#[test]
fn rooted_paths() {
    assert_eq!(
        rooted(
            Path::new("/proc/12/root"),
            Path::new("/usr/lib/libcuda.so.1")
        ),
        PathBuf::from("/proc/12/root/usr/lib/libcuda.so.1")
    );
    assert_eq!(rooted(Path::new(""), Path::new("/a")), PathBuf::from("/a"));
}

/// `(name, file offset)` of every defined dynamic symbol of `path` among `wanted`, derived
/// from `readelf` alone: `st_value - sh_addr + sh_offset` of the symbol's section.
fn readelf_offsets(path: &Path, wanted: &[&str]) -> Vec<(String, u64)> {
    let run = |args: &[&str]| {
        let o = std::process::Command::new("readelf")
            .args(args)
            .arg(path)
            .output()
            .expect("readelf");
        assert!(o.status.success());
        String::from_utf8(o.stdout).unwrap()
    };
    let hex = |s: &str| u64::from_str_radix(s, 16).unwrap();
    // "  [12] .text  PROGBITS  0000000000001040 001040 000123 ..."
    let mut sections: HashMap<u64, (u64, u64)> = HashMap::new();
    for line in run(&["-W", "-S"]).lines() {
        let Some(rest) = line.trim_start().strip_prefix('[') else {
            continue;
        };
        let Some((nr, rest)) = rest.split_once(']') else {
            continue;
        };
        let Ok(nr) = nr.trim().parse::<u64>() else {
            continue;
        };
        let f: Vec<&str> = rest.split_whitespace().collect();
        if f.len() >= 4 && nr > 0 {
            sections.insert(nr, (hex(f[2]), hex(f[3])));
        }
    }
    let mut out = Vec::new();
    // "   12: 0000000000001139    11 FUNC    GLOBAL DEFAULT   14 cuInit"
    for line in run(&["-W", "--dyn-syms"]).lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 8 || !f[0].ends_with(':') {
            continue;
        }
        let name = f[7].split('@').next().unwrap();
        let Ok(ndx) = f[6].parse::<u64>() else {
            continue; // UND, ABS
        };
        if !wanted.contains(&name) || out.iter().any(|(n, _)| n == name) {
            continue;
        }
        let (addr, off) = sections[&ndx];
        out.push((name.to_string(), hex(f[1]) - addr + off));
    }
    out.sort();
    out
}

#[test]
fn uprobe_offsets_match_readelf_for_the_fake_driver_and_libc() {
    let a = hami_test_harness::Artifacts::get();
    let maps = exec_mappings(&fs::read_to_string("/proc/self/maps").unwrap());
    let libc = maps
        .iter()
        .find(|(_, _, p)| p.contains("libc.so") || p.contains("libc-"))
        .map(|(_, _, p)| PathBuf::from(p))
        .expect("libc mapped");
    let probed = crate::probes::PROBED_SYMBOLS;
    let libc_wanted = ["malloc", "free", "strlen", "cuInit", "memcpy"];
    for (path, wanted) in [(&a.fake_libcuda, probed), (&libc, &libc_wanted[..])] {
        let f = open_driver_file(path).unwrap();
        let mut got = uprobe_offsets(&ReadCache::new(&f), wanted, MAX_ELF_READ).unwrap();
        got.sort();
        let want = readelf_offsets(path, wanted);
        assert!(want.len() >= 3, "{}: {want:?}", path.display());
        assert_eq!(got, want, "{}", path.display());
    }
    // A shared object's functions sit past its headers, inside the file.
    let f = open_driver_file(&a.fake_libcuda).unwrap();
    let len = f.metadata().unwrap().len();
    let got = uprobe_offsets(&ReadCache::new(&f), &["cuInit"], MAX_ELF_READ).unwrap();
    assert!(got[0].1 > 0x40 && got[0].1 < len, "{got:?}");
}

#[test]
fn uprobe_offsets_of_hostile_files_are_errors_not_panics_or_huge_reads() {
    let data = fake_driver_bytes();
    let wanted = ["cuInit", "cuMemAlloc_v2"];
    assert_eq!(
        uprobe_offsets(&data[..], &wanted, MAX_ELF_READ)
            .unwrap()
            .len(),
        2
    );
    // A `.dynsym` that claims a huge size: refused before anything is read.
    let mut huge = data.clone();
    let at = dynsym_header_offset(&huge) + 32; // sh_size of Elf64_Shdr
    huge[at..at + 8].copy_from_slice(&(1u64 << 40).to_le_bytes());
    match uprobe_offsets(&huge[..], &wanted, MAX_ELF_READ) {
        Err(ElfError::TooLarge { .. }) => {}
        other => panic!("expected TooLarge, got {other:?}"),
    }
    // Every prefix: an error or offsets inside what is there, never a panic.
    for n in (0..data.len()).step_by(509) {
        if let Ok(v) = uprobe_offsets(&data[..n], &wanted, MAX_ELF_READ) {
            assert!(v.iter().all(|(_, o)| *o < data.len() as u64), "{n}: {v:?}");
        }
    }
    assert!(matches!(
        uprobe_offsets(&b"not an elf file at all"[..], &wanted, MAX_ELF_READ),
        Err(ElfError::NotElf)
    ));
}

/// Writes `<root>/<pid>/map_files/<range>` (a regular file standing for the kernel's link)
/// and returns the maps line that shows it as `shown`, with its real device and inode.
fn fake_mapping(root: &Path, pid: u32, range: &str, shown: &str) -> String {
    use std::os::unix::fs::MetadataExt;
    let (a, b) = range.split_once('-').unwrap();
    let name = format!(
        "{:x}-{:x}",
        u64::from_str_radix(a, 16).unwrap(),
        u64::from_str_radix(b, 16).unwrap()
    );
    let f = root.join(pid.to_string()).join("map_files").join(name);
    fs::create_dir_all(f.parent().unwrap()).unwrap();
    fs::write(&f, b"").unwrap();
    let m = fs::metadata(&f).unwrap();
    format!(
        "{range} r-xp 00000000 {} {}    {shown}\n",
        crate::probes::maps_dev(m.dev()),
        m.ino()
    )
}

#[test]
fn a_driver_no_path_names_is_offered_through_its_mapping() {
    let t = tempfile::tempdir().unwrap();
    let root = t.path();
    fake_mapper(root, 100, 5, &[("/lib/libc.so.6", 9)]);
    // Copied, opened, unlinked, then loaded through /proc/self/fd/N; and a memfd copy (its
    // name is not libcuda's: recognised by its symbols, read through the mapping too).
    let deleted = fake_mapping(
        root,
        100,
        "7f0000010000-7f0000011000",
        "/tmp/t/libcuda.so.1 (deleted)",
    );
    let memfd = fake_mapping(root, 100, "00400000-00401000", "/memfd:cuda (deleted)");
    let mfd = root.join("100/map_files/400000-401000");
    fs::write(&mfd, fake_driver_bytes()).unwrap();
    let maps = fs::read_to_string(root.join("100/maps")).unwrap();
    fs::write(root.join("100/maps"), format!("{maps}{deleted}{memfd}")).unwrap();
    let found = scan_proc_maps_with(root, &mut Classifier::default());
    let mut paths: Vec<PathBuf> = found.iter().map(|c| c.path.clone()).collect();
    paths.sort();
    assert_eq!(
        paths,
        [
            root.join("100/map_files/400000-401000"),
            root.join("100/map_files/7f0000010000-7f0000011000"),
        ]
    );
    for c in &found {
        use std::os::unix::fs::MetadataExt;
        let m = fs::metadata(&c.path).unwrap();
        assert_eq!(
            c.maps_id,
            Some((crate::probes::maps_dev(m.dev()), m.ino())),
            "offered under the maps identity"
        );
    }
    // A mapping whose range now holds another file (unmapped and mapped again since the
    // maps were read) is not taken for the driver.
    let line = fake_mapping(
        root,
        100,
        "7f0000020000-7f0000021000",
        "/x/libcuda.so.1 (deleted)",
    );
    let f: Vec<&str> = line.split_whitespace().collect();
    let other = format!(
        "{} {} {} {} 999999 {} {}\n",
        f[0], f[1], f[2], f[3], f[5], f[6]
    );
    fs::write(root.join("100/maps"), &other).unwrap();
    assert!(scan_proc_maps_with(root, &mut Classifier::default()).is_empty());
}

#[test]
fn classified_files_stay_bounded_under_churn_and_a_gone_one_is_read_again() {
    let t = tempfile::tempdir().unwrap();
    let root = t.path();
    let mut c = Classifier::default();
    // 300 short-lived processes, 10 alive at a time, each mapping a library of its own
    // (a container's copy: a new inode), and one long-lived process mapping file 1.
    fake_mapper(root, 1, 5, &[("/lib/libone.so", 1)]);
    let mut most = 0;
    for p in 0..300u32 {
        let pid = 1000 + p;
        fake_mapper(
            root,
            pid,
            5,
            &[(&format!("/lib/lib{p}.so"), 10_000 + p as u64)],
        );
        if p >= 10 {
            fs::remove_dir_all(root.join((pid - 10).to_string())).unwrap();
        }
        scan_proc_maps_with(root, &mut c);
        most = most.max(c.known_len());
    }
    // Without expiry it would hold 301 files; it holds the live ones and those seen since
    // the previous full scan or the one before.
    assert!(
        most <= 1 + 10 + 2 * FULL_SCAN_EVERY as usize,
        "{most} files remembered"
    );
    assert!(
        c.known.peek(&("08:01".into(), 1)).is_some(),
        "the live one stays"
    );
    assert!(
        c.known.peek(&("08:01".into(), 10_000)).is_none(),
        "the first gone one went"
    );
    // The churn stops: after two full scans only the live process's file is remembered.
    for _ in 0..2 * FULL_SCAN_EVERY {
        for p in 290..300u32 {
            let _ = fs::remove_dir_all(root.join((1000 + p).to_string()));
        }
        scan_proc_maps_with(root, &mut c);
    }
    assert_eq!(c.known_len(), 1);
    // A gone file mapped again is classified again (read: here an empty file, not a driver).
    fake_mapper(root, 7, 5, &[("/lib/lib0.so", 10_000)]);
    scan_proc_maps_with(root, &mut c);
    assert_eq!(c.known.peek(&("08:01".into(), 10_000)), Some(&false));
}

#[test]
fn a_driver_under_the_preloads_name_is_a_driver_and_the_preload_is_not() {
    let t = tempfile::tempdir().unwrap();
    let root = t.path();
    let a = hami_test_harness::Artifacts::get();
    fake_mapper(root, 100, 5, &[("/tmp/libhami_preload.so", 21)]);
    fs::write(
        root.join("100/root/tmp/libhami_preload.so"),
        fake_driver_bytes(),
    )
    .unwrap();
    fake_mapper(root, 200, 5, &[("/opt/libhami_preload.so", 22)]);
    fs::write(
        root.join("200/root/opt/libhami_preload.so"),
        fs::read(&a.preload_so).unwrap(),
    )
    .unwrap();
    assert_eq!(
        inodes(&scan_proc_maps_with(root, &mut Classifier::default())),
        [21]
    );
}

#[test]
fn well_known_dirs_cover_aarch64_and_the_driver_container() {
    for dir in [
        "/usr/lib/aarch64-linux-gnu",
        "/lib/aarch64-linux-gnu",
        "/run/nvidia/driver/usr/lib/aarch64-linux-gnu",
        "/run/nvidia/driver/usr/lib/x86_64-linux-gnu",
        "/usr/lib/x86_64-linux-gnu",
        "/usr/local/nvidia/lib64",
    ] {
        assert!(WELL_KNOWN_DIRS.contains(&dir), "{dir} is not searched");
    }
    let mut sorted = WELL_KNOWN_DIRS.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    assert_eq!(
        sorted.len(),
        WELL_KNOWN_DIRS.len(),
        "a directory listed twice"
    );
}

#[test]
fn maps_are_read_up_to_the_limit_and_cut_at_a_line() {
    let t = tempfile::tempdir().unwrap();
    let p = t.path().join("maps");
    fs::write(&p, b"a\nbb\nccc\n").unwrap();
    assert_eq!(
        read_maps_bounded(&p, 9).unwrap(),
        (b"a\nbb\nccc\n".to_vec(), false)
    );
    assert_eq!(
        read_maps_bounded(&p, 100).unwrap(),
        (b"a\nbb\nccc\n".to_vec(), false)
    );
    // Cut inside "ccc": the partial line is dropped.
    assert_eq!(
        read_maps_bounded(&p, 6).unwrap(),
        (b"a\nbb\n".to_vec(), true)
    );
    assert_eq!(read_maps_bounded(&p, 1).unwrap(), (Vec::new(), true));
}

#[test]
fn a_maps_file_over_the_limit_is_read_only_up_to_it() {
    let t = tempfile::tempdir().unwrap();
    let root = t.path();
    // Padding: more than the limit of mappings that are no driver.
    let line = "7f0000000000-7f0000001000 r--p 00000000 08:01 9    /lib/libc.so.6\n";
    let pad = line.repeat(crate::tenantfs::MAX_PROC_FILE as usize / line.len() + 1);
    let driver = |ino: u64| {
        format!("7f0000000000-7f0000001000 r-xp 00000000 08:01 {ino}    /lib/libcuda.so.1\n")
    };
    // 100 maps a driver in its first line, 200 only past the limit.
    fake_mapper(root, 100, 5, &[("/lib/libcuda.so.1", 1)]);
    fake_mapper(root, 200, 5, &[("/lib/libcuda.so.1", 2)]);
    fs::write(root.join("100/maps"), driver(1) + &pad).unwrap();
    fs::write(root.join("200/maps"), pad.clone() + &driver(2)).unwrap();
    let mut c = Classifier::default();
    assert_eq!(inodes(&scan_proc_maps_with(root, &mut c)), [1]);
}
