use super::*;
use std::fs;

/// The pids whose `/proc/<pid>/stat` this thread read since the last call.
pub(crate) fn take_stat_reads() -> Vec<u32> {
    STAT_READS.with(|r| std::mem::take(&mut *r.borrow_mut()))
}

/// A `/proc/<pid>/stat` line as the kernel writes it (52 fields): `comm`, the state
/// letter, the thread count (field 20) and the start time (field 22) as given.
pub(crate) fn stat_line(pid: u32, comm: &str, state: char, threads: u64, start: u64) -> String {
    let mut s = format!("{pid} ({comm}) {state}");
    for i in 4..=52u64 {
        let v = match i {
            20 => threads,
            22 => start,
            _ => i,
        };
        s.push_str(&format!(" {v}"));
    }
    s.push('\n');
    s
}

/// A `/proc/<pid>/status` text as the kernel writes it, with this `NSpid` list.
pub(crate) fn status_text(pid: u32, nspid: &[u32]) -> String {
    let ns: Vec<String> = nspid.iter().map(|p| p.to_string()).collect();
    format!(
        "Name:\tprog\nUmask:\t0022\nState:\tS (sleeping)\nTgid:\t{pid}\nNgid:\t0\n\
         Pid:\t{pid}\nPPid:\t1\nTracerPid:\t0\nUid:\t0\t0\t0\t0\nGid:\t0\t0\t0\t0\n\
         FDSize:\t64\nGroups:\t\nNStgid:\t{ns}\nNSpid:\t{ns}\nVmRSS:\t1 kB\n\
         Threads:\t1\nSigQ:\t0/1000\nSigPnd:\t0000000000000000\n\
         ShdPnd:\t0000000000000000\nSigBlk:\t0000000000000000\n\
         SigIgn:\t0000000000000000\nSigCgt:\t0000000000000000\n\
         CapInh:\t0000000000000000\nCapPrm:\t0000000000000000\n\
         CapEff:\t0000000000000000\n",
        ns = ns.join("\t")
    )
}

/// Build a fake `/proc/<pid>` directory.
#[allow(clippy::too_many_arguments)]
pub(crate) fn fake_proc(
    root: &Path,
    pid: u32,
    start_time: u64,
    nspid: &[u32],
    pidns: u64,
    cgroup: &str,
    maps: &[&str],
    env: &[(&str, &str)],
) {
    let dir = root.join(pid.to_string());
    fs::create_dir_all(dir.join("ns")).unwrap();
    fs::create_dir_all(dir.join("root")).unwrap();
    fs::write(
        dir.join("stat"),
        stat_line(pid, "my prog", 'S', 1, start_time),
    )
    .unwrap();
    fs::write(dir.join("status"), status_text(pid, nspid)).unwrap();
    fs::write(dir.join("cgroup"), cgroup).unwrap();
    let maps: String = maps
        .iter()
        .map(|p| format!("7f0000000000-7f0000001000 r-xp 00000000 08:01 1234    {p}\n"))
        .collect();
    fs::write(dir.join("maps"), maps).unwrap();
    let mut environ = Vec::new();
    for (k, v) in env {
        environ.extend_from_slice(format!("{k}={v}").as_bytes());
        environ.push(0);
    }
    fs::write(dir.join("environ"), environ).unwrap();
    std::os::unix::fs::symlink(format!("pid:[{pidns}]"), dir.join("ns/pid")).unwrap();
}

/// The agent's half of the cross-reading test: every row of the shared table
/// (`hami_common::env::CROSS_READING`; the preload's half is `hami-preload`'s
/// `config::tests::cross_reading_the_preload_acts_as_the_shared_table_says`), written
/// to a fake `/proc/<pid>/environ` and read back from what the agent derives from it
/// ([`read_proc`]): what it compares with the region and what it reports.
#[test]
fn cross_reading_the_agent_reads_as_the_shared_table_says() {
    use hami_common::env::{Limit, Reading, CROSS_READING};
    let tmp = tempfile::tempdir().unwrap();
    for (i, c) in CROSS_READING.iter().enumerate() {
        let pid = 1000 + i as u32;
        fake_proc(
            tmp.path(),
            pid,
            1,
            &[pid],
            1,
            "0::/\n",
            &["/usr/lib/libcuda.so.1"],
            c.env,
        );
        let p = read_proc(tmp.path(), pid).unwrap();
        let d = c.device as u32;
        let limit = match p.env_limits.for_device(d) {
            None | Some(EnvLimit::Bytes(0)) => Limit::None,
            Some(EnvLimit::Bytes(n)) => Limit::Bytes(n),
            Some(EnvLimit::Invalid) => Limit::Invalid,
        };
        let reading = Reading {
            control_disabled: p.disable_control,
            limit,
            share: p.env_limits.compute.share(d),
            oversubscribe: p.oversubscribe,
        };
        assert_eq!(reading, c.reading, "{:?} on device {d}", c.env);
        assert_eq!(p.region_path, c.region, "{:?}", c.env);
        assert_eq!(
            p.env_limits.compute.control_disabled, p.disable_control,
            "{:?}",
            c.env
        );
    }
}

#[test]
fn environ_keeps_the_first_of_duplicate_entries_as_getenv_does() {
    let env = parse_environ(b"A=1\0B\0A=2\0C=x=y\0=z\0");
    assert_eq!(env.get("A").map(String::as_str), Some("1"));
    assert_eq!(env.get("C").map(String::as_str), Some("x=y"));
    assert_eq!(env.get("B"), None, "no '=': not an entry");
    assert_eq!(env.len(), 3, "{env:?}");
}

#[test]
fn env_compute_share_parsed_like_the_preload() {
    let share = |raw: &[u8], dev: u32| env_limits(&parse_environ(raw)).compute.share_for(dev);
    let env = b"CUDA_DEVICE_SM_LIMIT=30\0CUDA_DEVICE_SM_LIMIT_1= 50 \0\
                CUDA_DEVICE_SM_LIMIT_2=100\0CUDA_DEVICE_SM_LIMIT_3=0\0\
                CUDA_DEVICE_SM_LIMIT_4=30%\0CUDA_DEVICE_SM_LIMIT_5=101\0\
                CUDA_DEVICE_SM_LIMIT_X=7\0";
    assert_eq!(share(env, 0), Some(Some(30)), "the global share");
    assert_eq!(share(env, 1), Some(Some(50)), "per device, trimmed");
    assert_eq!(share(env, 2), Some(None), "100: the whole device");
    assert_eq!(share(env, 3), Some(None), "0: no limit");
    assert_eq!(share(env, 4), None, "malformed: not known exactly");
    assert_eq!(share(env, 5), None, "out of range");
    assert_eq!(share(b"PATH=/bin\0", 0), Some(None), "unset");
    assert_eq!(
        share(
            b"CUDA_DEVICE_SM_LIMIT=30\0GPU_CORE_UTILIZATION_POLICY=Disable\0",
            0
        ),
        Some(None),
        "policy disable"
    );
    assert_eq!(
        share(
            b"CUDA_DEVICE_SM_LIMIT=30\0GPU_CORE_UTILIZATION_POLICY=force\0",
            0
        ),
        Some(Some(30))
    );
    assert_eq!(
        share(b"CUDA_DEVICE_SM_LIMIT=30\0CUDA_DISABLE_CONTROL=true\0", 0),
        None,
        "control off: the preload does not use the region"
    );
}

#[test]
fn env_limits_default_and_per_device() {
    let env = parse_environ(
        b"PATH=/bin\0CUDA_DEVICE_MEMORY_LIMIT=1g\0CUDA_DEVICE_MEMORY_LIMIT_1=512m\0\
          CUDA_DEVICE_MEMORY_LIMIT_2=bogus\0CUDA_DEVICE_MEMORY_LIMIT_X=1\0\
          CUDA_DEVICE_MEMORY_SHARED_CACHE=/hami/r.cache\0",
    );
    let l = env_limits(&env);
    assert_eq!(l.all, Some(EnvLimit::Bytes(1 << 30)));
    assert_eq!(l.bytes_for_device(0), Some(1 << 30));
    assert_eq!(l.bytes_for_device(1), Some(512 << 20));
    // An invalid per-device value wins over the valid global one (device fails closed).
    assert_eq!(l.for_device(2), Some(EnvLimit::Invalid));
    assert_eq!(l.bytes_for_device(2), None);
    assert_eq!(
        l.invalid,
        vec!["CUDA_DEVICE_MEMORY_LIMIT_2=bogus".to_string()]
    );
    assert_eq!(region_path(&env), ("/hami/r.cache".to_string(), true));
    let empty = BTreeMap::new();
    assert_eq!(
        region_path(&empty),
        (DEFAULT_REGION_PATH.to_string(), false)
    );
    assert!(env_limits(&empty).is_empty());
}

#[test]
fn read_stat_reads_small_and_buffer_sized_files_whole() {
    let t = tempfile::tempdir().unwrap();
    fake_proc(t.path(), 7, 4242, &[7], 1, "0::/\n", &[], &[]);
    let st = read_stat(t.path(), 7).unwrap();
    assert_eq!((st.comm.as_str(), st.start_time), ("my prog", 4242));
    // Longer than the one-read buffer (not procfs, but a fake tree may be): read whole.
    for len in [4096 - 150, 4096, 9000] {
        let stat = stat_line(8, &"c".repeat(len), 'S', 1, 777);
        fs::create_dir_all(t.path().join("8")).unwrap();
        fs::write(t.path().join("8/stat"), &stat).unwrap();
        let st = read_stat(t.path(), 8).unwrap();
        assert_eq!(
            (st.comm.len(), st.start_time),
            (len, 777),
            "comm of {len} bytes"
        );
    }
    assert!(matches!(
        read_stat(t.path(), 9),
        Err(ProcError::Read { .. })
    ));
}

#[test]
fn stat_field_22_with_spaces_and_parens_in_comm() {
    let s = stat_line(42, "a ) b", 'R', 20, 987654);
    let st = parse_stat(&s).unwrap();
    assert_eq!(st.comm, "a ) b");
    assert_eq!(st.state, 'R');
    assert_eq!(st.num_threads, 20);
    assert_eq!(st.start_time, 987654);
    assert!(!st.is_dead());
    assert_eq!(parse_stat("42 (x) R 1 2"), None);
    assert!(parse_stat(&stat_line(42, "x", 'Z', 1, 1))
        .unwrap()
        .is_dead());
    assert!(!parse_stat(&stat_line(42, "x", 'Z', 2, 1))
        .unwrap()
        .is_dead());
    // Texts the kernel never writes (procfs's parser would panic on them): refused.
    let full = stat_line(42, "x", 'R', 1, 1);
    for bad in [
        full.replace("42 (", "("),
        full.replace("42 (", "42("),
        full.replace(") R", ")R"),
        "42 (x)".to_string(),
        "42 )x( R".to_string(),
        "42é(x) R".to_string(),
    ] {
        assert_eq!(parse_stat(&bad), None, "{bad:?}");
    }
    // A comm that is not UTF-8 (read lossily) parses.
    let st = parse_stat(&String::from_utf8_lossy(
        &[
            b"42 (a".as_slice(),
            &[0xff, 0xfe],
            full.strip_prefix("42 (x").unwrap().as_bytes(),
        ]
        .concat(),
    ))
    .unwrap();
    assert_eq!(st.comm, "a\u{fffd}\u{fffd}");
}

#[test]
fn nspid_is_innermost() {
    assert_eq!(parse_nspid(&status_text(4242, &[4242, 17])), Some(17));
    assert_eq!(parse_nspid(&status_text(4242, &[4242])), Some(4242));
    assert_eq!(
        parse_nspid("Name:\tx\nNSpid:\t4242\n"),
        None,
        "not a whole status"
    );
    let no_nspid = status_text(1, &[1]).replace("NSpid:\t1\n", "");
    assert_eq!(parse_nspid(&no_nspid), None);
    // The tenant's comm in `Name:` cannot hide the rest: not UTF-8 (read lossily), or
    // with a colon or an escaped newline.
    let raw = status_text(4242, &[4242, 17]).into_bytes();
    let name = b"Name:\tprog";
    let at = raw.windows(name.len()).position(|w| w == name).unwrap() + name.len();
    for comm in [&b"\xff\xfe"[..], b":x", b"\\nNSpid:\t1"] {
        let mut t = raw[..at].to_vec();
        t.extend_from_slice(comm);
        t.extend_from_slice(&raw[at..]);
        assert_eq!(
            parse_nspid(&String::from_utf8_lossy(&t)),
            Some(17),
            "{comm:?}"
        );
    }
    let me = read_status(Path::new("/proc"), std::process::id()).unwrap();
    assert_eq!(status_nspid(&me), Some(std::process::id()));
}

#[test]
fn container_ids_from_cgroup_layouts() {
    let id = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
    for path in [
        format!("/docker/{id}"),
        format!("/system.slice/docker-{id}.scope"),
        format!("/kubepods/burstable/pod1234-5678/{id}"),
        format!(
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-podab_cd.slice/cri-containerd-{id}.scope"
        ),
        format!("/kubepods.slice/kubepods-pod1.slice/crio-{id}.scope"),
        format!("/machine.slice/libpod-{id}.scope/container"),
        format!("/system.slice/containerd.service/kubepods-besteffort-pod1.slice:cri-containerd:{id}"),
    ] {
        assert_eq!(container_id(&path).as_deref(), Some(id), "{path}");
    }
    assert_eq!(
        container_id("/user.slice/user-0.slice/session-1.scope"),
        None
    );
    assert_eq!(
        container_id(&format!("/kubepods.slice/crio-conmon-{id}.scope")),
        None
    );
    assert_eq!(container_name("/"), "host");
    assert_eq!(container_name("/user.slice"), "/user.slice");
    assert_eq!(container_name(&format!("/docker/{id}")), id);
}

#[test]
fn cgroup_v2_preferred_over_v1() {
    assert_eq!(
        parse_cgroup("12:memory:/docker/aa\n0::/kubepods/x\n"),
        "/kubepods/x"
    );
    assert_eq!(parse_cgroup("12:cpu,cpuacct:/a\n11:memory:/b\n"), "/b");
    assert_eq!(parse_cgroup("12:cpu,cpuacct:/a\n11:devices:/b\n"), "/a");
    assert_eq!(parse_cgroup("1:name=systemd:/s\n0::/x:y:z\n"), "/x:y:z");
    assert_eq!(parse_cgroup(""), "/");
}

#[test]
fn maps_detection() {
    let maps = "7f00-7f01 r-xp 00000000 08:01 12 /usr/lib/libc.so.6\n\
                7f02-7f03 r-xp 00000000 08:01 13 /opt/hami/libhami_preload.so (deleted)\n\
                7f04-7f05 r-xp 00000000 00:00 0 \n\
                7f06-7f07 r-xp 00000000 08:01 14 /usr/lib/x86_64-linux-gnu/libcuda.so.580.1\n\
                7f08-7f09 rw-p 00000000 00:00 0 [heap]\n";
    assert!(maps_has_preload(maps));
    assert!(maps_has_libcuda(maps));
    assert!(!maps_has_preload(
        "7f00-7f01 r-xp 0 08:01 12 /x/libcuda.so.1\n"
    ));
    assert!(!maps_has_libcuda(
        "7f00-7f01 r-xp 0 08:01 12 /x/libcudart.so.12\n"
    ));
}

/// Why [`maps_entries`] is not procfs's `MemoryMaps` parser: tenant-chosen file names
/// make it panic, hide a file, or fail the whole file. If this fails, procfs changed:
/// see whether it can be used now.
#[test]
fn procfs_maps_parser_is_unfit_for_tenant_maps() {
    let line = |path: &str| format!("7f00-7f01 r-xp 00000000 08:01 12 {path}\n");
    let libc = line("/usr/lib/libc.so.6");
    let procfs_parse = |text: String| {
        std::panic::catch_unwind(move || {
            procfs::process::MemoryMaps::from_read(text.as_bytes()).map(|m| m.0)
        })
    };
    let short_sysv = format!("{libc}{}", line("/SYSVx"));
    assert!(procfs_parse(short_sysv.clone()).is_err(), "procfs panics");
    assert_eq!(mapped_files(&short_sysv).last(), Some("/SYSVx"));
    let named = format!("{libc}{}", line("/SYSV0000000g/libcuda.so.1"));
    assert!(
        matches!(procfs_parse(named.clone()), Ok(Err(_))),
        "whole file fails"
    );
    assert!(maps_has_libcuda(&named));
    let sysv = line("/SYSV00000000");
    let parsed = procfs_parse(sysv.clone()).unwrap().unwrap();
    assert!(!matches!(
        parsed[0].pathname,
        procfs::process::MMapPath::Path(_)
    ));
    assert_eq!(mapped_files(&sysv).next(), Some("/SYSV00000000"));
}

#[test]
fn read_proc_from_fake_tree() {
    let tmp = tempfile::tempdir().unwrap();
    let id = "ab".repeat(32);
    fake_proc(
        tmp.path(),
        4242,
        555,
        &[4242, 7],
        4026532000,
        &format!("0::/kubepods/besteffort/podx/{id}\n"),
        &["/usr/lib/libhami_preload.so", "/usr/lib/libcuda.so.1"],
        &[
            ("CUDA_DEVICE_MEMORY_LIMIT_0", "2g"),
            ("CUDA_DEVICE_MEMORY_SHARED_CACHE", "/shared/r.cache"),
        ],
    );
    let p = read_proc(tmp.path(), 4242).unwrap();
    assert_eq!(p.start_time, 555);
    assert_eq!(p.comm, "my prog");
    assert_eq!(p.nspid, Some(7));
    assert_eq!(p.pidns, Some(4026532000));
    assert_eq!(p.container, id);
    assert!(p.hooked);
    assert!(p.uses_libcuda);
    assert_eq!(p.region_path, "/shared/r.cache");
    assert_eq!(
        p.region_host_path,
        tmp.path().join("4242/root/shared/r.cache")
    );
    assert_eq!(p.env_limits.bytes_for_device(0), Some(2 << 30));
    assert_eq!(p.env_limits.for_device(1), None);
    assert_eq!(
        find_by_nspid(tmp.path(), 4026532000, 7).map(|(p, s)| (p, s.start_time)),
        Some((4242, 555))
    );
    assert_eq!(nspid_index(tmp.path()).get(&(4026532000, 7)), Some(&4242));
    assert_eq!(find_by_nspid(tmp.path(), 4026532000, 8), None);
    assert_eq!(find_by_nspid(tmp.path(), 1, 7), None);
    assert!(matches!(
        read_proc(tmp.path(), 1),
        Err(ProcError::Read { .. })
    ));
    assert_eq!(list_pids(tmp.path()), vec![4242]);
}

/// A process caught exiting (its memory map released, or a zombie) is not classified:
/// the churn run found hooked short-lived processes reported as `bypass` because their
/// empty `maps` showed no preload.
#[test]
fn an_exiting_process_is_not_classified_from_its_empty_map() {
    let tmp = tempfile::tempdir().unwrap();
    fake_proc(tmp.path(), 4243, 5, &[4243], 1, "0::/\n", &[], &[]);
    assert!(matches!(
        read_proc(tmp.path(), 4243),
        Err(ProcError::Exiting { pid: 4243 })
    ));
    let maps = ["/usr/lib/libhami_preload.so", "/usr/lib/libcuda.so.1"];
    fake_proc(tmp.path(), 4244, 5, &[4244], 1, "0::/\n", &maps, &[]);
    assert!(read_proc(tmp.path(), 4244).unwrap().hooked);
    fs::write(
        tmp.path().join("4244/stat"),
        tests::stat_line(4244, "cudaprobe", 'Z', 1, 5),
    )
    .unwrap();
    assert!(matches!(
        read_proc(tmp.path(), 4244),
        Err(ProcError::Exiting { pid: 4244 })
    ));
}

#[test]
fn real_proc_self() {
    let me = std::process::id();
    let p = read_proc(Path::new("/proc"), me).unwrap();
    assert!(p.start_time > 0);
    assert!(!p.hooked);
    assert!(p.pidns.is_some());
}

/// A whole `/proc/<pid>/status` (procfs's parser wants every field the kernel writes).
const CREDS_STATUS: &str = "Name:\tcudaprobe\nUmask:\t0022\nState:\tS (sleeping)\nTgid:\t42\n\
    Pid:\t42\nPPid:\t1\nTracerPid:\t0\nUid:\t1000\t1001\t1002\t1003\n\
    Gid:\t2000\t2001\t2002\t2003\nFDSize:\t64\nGroups:\t10 44 \nThreads:\t1\n\
    SigQ:\t0/1000\nSigPnd:\t0000000000000000\nShdPnd:\t0000000000000000\n\
    SigBlk:\t0000000000000000\nSigIgn:\t0000000000000000\nSigCgt:\t0000000000000000\n\
    CapInh:\t0000000000000000\nCapPrm:\t0000000000000000\nCapEff:\t0000000000000000\n";

#[test]
fn parses_the_filesystem_ids_groups_and_capabilities() {
    let c = parse_creds(CREDS_STATUS).unwrap();
    assert_eq!(
        c,
        Creds {
            fsuid: 1003,
            fsgid: 2003,
            groups: vec![10, 44],
            cap_eff: 0
        }
    );
    assert!(!c.dac_override());
    let root = CREDS_STATUS
        .replace("Groups:\t10 44 ", "Groups:\t")
        .replace("CapEff:\t0000000000000000", "CapEff:\t000001ffffffffff");
    let r = parse_creds(&root).unwrap();
    assert!(r.groups.is_empty());
    assert!(r.dac_override());
    assert_eq!(parse_creds("Name:\tx\n"), None);
    assert_eq!(parse_creds(&CREDS_STATUS.replace("1003", "x")), None);
    // procfs reads gids as i32 (see `parse_status`).
    assert_eq!(
        parse_creds(&CREDS_STATUS.replace("10 44", "10 3000000000")),
        None
    );
}
