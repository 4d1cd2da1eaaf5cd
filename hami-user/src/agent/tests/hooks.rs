//! How a process is hooked: HAMi's libvgpu, HAMi-core, unhooked by request or allowlist.

use super::*;

pub(super) fn libvgpu_process(w: &World, pid: u32, marker: bool) {
    libvgpu_process_env(w, pid, marker, &[("CUDA_DEVICE_MEMORY_LIMIT", "1g")]);
}

fn libvgpu_process_env(w: &World, pid: u32, marker: bool, env: &[(&str, &str)]) {
    fake_proc(
        &w.root,
        pid,
        5000 + pid as u64,
        &[pid, 7],
        NS,
        &format!("0::/kubepods/besteffort/podx/{CID}\n"),
        &[
            "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
            "/usr/local/vgpu/libvgpu.so",
        ],
        env,
    );
    let lib = w.root.join(format!("{pid}/root/usr/local/vgpu/libvgpu.so"));
    std::fs::create_dir_all(lib.parent().unwrap()).unwrap();
    let src = lib.with_extension("c");
    let body = if marker {
        "unsigned int hami_preload_marker = 1; int cuInit(unsigned f) { return f; }\n"
    } else {
        "int cuInit(unsigned f) { return f; }\n"
    };
    std::fs::write(&src, body).unwrap();
    hami_test_harness::cc(&src, &lib, &["-shared", "-fPIC"]);
}

#[test]
fn preload_installed_as_hamis_libvgpu_counts_as_hooked() {
    let w = World::new();
    libvgpu_process(&w, 100, true);
    let mut a = w.agent(false);
    a.on_event(&ev(EventKind::MemAlloc, 100, MIB, 0x7000, 0));
    assert_eq!(a.process_rows()[0].hooked, Some(true));
    // HAMi-core's own libvgpu.so (no marker) is not hami-preload.
    let w = World::new();
    libvgpu_process(&w, 101, false);
    let mut a = w.agent(false);
    a.on_event(&ev(EventKind::MemAlloc, 101, MIB, 0x7000, 0));
    assert_eq!(a.process_rows()[0].hooked, Some(false));
}

/// Issue 19: a node half migrated. A process on HAMi-core's libvgpu.so is reported as
/// `hami_core`, one asking to be unhooked (`CUDA_DISABLE_CONTROL=true`, HAMi's opt-out) or
/// in an allowlisted namespace as `unhooked`: never `bypass` (the critical alert), still in
/// the audit, and counted per hook for the migration panel.
#[test]
fn hami_core_and_unhooked_by_request_are_not_bypass_and_are_counted_by_hook() {
    let w = World::new();
    libvgpu_process(&w, 101, false); // HAMi-core
    libvgpu_process(&w, 102, true); // hami-preload as libvgpu.so
                                    // Another file than 101's (the fake maps give every file one inode).
    let maps = w.root.join("102/maps");
    let m = std::fs::read_to_string(&maps).unwrap();
    std::fs::write(&maps, m.replace(" 1234 ", " 5678 ")).unwrap();
    w.spawn(103, 9, false, "1g"); // no preload at all
    fake_proc(
        &w.root,
        104,
        5104,
        &[104, 11],
        NS,
        &format!("0::/kubepods/besteffort/podx/{CID}\n"),
        &["/usr/lib/x86_64-linux-gnu/libcuda.so.1"],
        &[
            ("CUDA_DISABLE_CONTROL", "true"),
            ("CUDA_OVERSUBSCRIBE", "true"),
        ],
    );
    let mut a = w.agent(false);
    for pid in [101, 102, 103, 104] {
        a.on_event(&ev(EventKind::MemAlloc, pid, MIB, 0x7000 + pid as u64, 0));
    }
    let out = a.tick(Instant::now());
    let mut got: Vec<(u32, FindingKind, &str)> = out
        .raised
        .iter()
        .filter(|f| f.pid != Some(102))
        .map(|f| (f.pid.unwrap(), f.kind, f.reason))
        .collect();
    got.sort();
    assert_eq!(
        got,
        vec![
            (
                101,
                FindingKind::HamiCore,
                findings::reason::HAMI_CORE_MAPPED
            ),
            (103, FindingKind::Bypass, findings::reason::NO_PRELOAD),
            (
                104,
                FindingKind::Unhooked,
                findings::reason::DISABLE_CONTROL
            ),
        ],
        "{:#?}",
        out.raised
    );
    let hc = out.raised.iter().find(|f| f.pid == Some(101)).unwrap();
    assert!(hc.detail.contains("HAMi-core"), "{}", hc.detail);
    assert!(!FindingKind::HamiCore.is_failure() && !FindingKind::Unhooked.is_failure());
    assert_eq!(
        a.hook_counts(),
        crate::metrics::HookCounts {
            hami_rs: 1,
            hami_core: 1,
            none: 2,
            oversubscribe: 1,
        }
    );
    // The rows of the audit still show each one.
    assert_eq!(a.process_rows().len(), 4);
}

#[test]
fn an_allowlisted_namespace_makes_an_unhooked_process_unhooked_not_bypass() {
    let w = World::new();
    w.spawn(103, 9, false, "1g");
    let logs = w._tmp.path().join("var-log/containers");
    std::fs::create_dir_all(&logs).unwrap();
    std::fs::write(logs.join(format!("infer-0_gpu-raw_main-{CID}.log")), "").unwrap();
    let mut a = Agent::new(AgentOptions {
        proc_root: w.root.clone(),
        settle: Duration::from_millis(0),
        log_root: w._tmp.path().join("var-log"),
        allow_unhooked_namespaces: vec!["gpu-raw".into()],
        ..Default::default()
    });
    a.on_event(&ev(EventKind::MemAlloc, 103, MIB, 0x7000, 0));
    let out = a.tick(Instant::now());
    assert_eq!(
        kinds(&out.raised),
        vec![(
            FindingKind::Unhooked,
            findings::reason::NAMESPACE_ALLOWLISTED
        )],
        "{:#?}",
        out.raised
    );
    // Another namespace: a bypass.
    let mut a = Agent::new(AgentOptions {
        proc_root: w.root.clone(),
        settle: Duration::from_millis(0),
        log_root: w._tmp.path().join("var-log"),
        allow_unhooked_namespaces: vec!["other".into()],
        ..Default::default()
    });
    a.on_event(&ev(EventKind::MemAlloc, 103, MIB, 0x7000, 0));
    let out = a.tick(Instant::now());
    assert_eq!(
        kinds(&out.raised),
        vec![(FindingKind::Bypass, findings::reason::NO_PRELOAD)]
    );
}
