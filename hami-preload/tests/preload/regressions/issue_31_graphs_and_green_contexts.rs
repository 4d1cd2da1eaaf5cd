//! Regressions of issue 31: graph memory nodes admitted before the driver maps them, green
//! contexts admitted and charged.

use super::*;

// ---- issue 31: graph memory nodes admitted before the driver maps them ----

/// Guards issue 31 (92866cf): `cudaGraphAddMemAllocNode` of 1.5 GiB (not freed in the graph),
/// instantiate, launch, in a 1 GiB container: every call succeeded and the driver held the 1.5
/// GiB (2056 MiB with the context on the H100). The launch, where the driver maps the graph's
/// memory, is refused with `CUDA_ERROR_OUT_OF_MEMORY` before the driver is called; the program
/// goes on.
#[test]
fn graph_alloc_node_over_the_quota_is_refused_at_launch_issue_31() {
    for via in ["direct", "dlsym", "procaddr"] {
        let env = graph_env();
        let p = run_graph_ops(
            &env,
            &[
                "--via",
                via,
                "init",
                "ctx",
                "streamnew",
                "gmem-alloc",
                "1536M",
                "gmem-inst",
                "graph-launch",
                "1",
                "streamsync",
                "gmem-attr",
                "alloc",
                "900M",
            ],
        );
        assert_eq!(p.last("gmem-alloc").rc(), Some(0), "{via}: {}", p.dump());
        assert_eq!(p.last("gmem-inst").rc(), Some(0), "{via}: {}", p.dump());
        assert_eq!(
            p.last("graph-launch").rc(),
            Some(GOOM),
            "{via}: {}",
            p.dump()
        );
        assert_eq!(
            p.last("gmem-attr").num("reserved"),
            Some(0),
            "{via}: the driver mapped nothing: {}",
            p.dump()
        );
        // The program can go on with its quota.
        assert_eq!(p.last("alloc").rc(), Some(0), "{via}: {}", p.dump());
    }
}

/// Guards issue 31 (92866cf): graph memory that fits is charged while the graph pool holds it
/// (a second allocation that would take the container over is refused), and given back by
/// `cuMemFree` of the graph allocation + `cuDeviceGraphMemTrim`.
#[test]
fn graph_memory_is_charged_while_the_graph_pool_holds_it_issue_31() {
    let env = graph_env();
    let p = run_graph_ops(
        &env,
        &[
            "init",
            "ctx",
            "streamnew",
            "gmem-alloc",
            "600M",
            "gmem-inst",
            "graph-launch",
            "1",
            "streamsync",
            "gmem-attr",
            "alloc",
            "600M",
            "gmem-memfree",
            "gmem-attr",
            "alloc",
            "600M",
            "gmem-trim",
            "gmem-attr",
            "alloc",
            "600M",
        ],
    );
    assert_eq!(p.last("graph-launch").rc(), Some(0), "{}", p.dump());
    let attrs = p.find("gmem-attr");
    assert_eq!(attrs[0].num("reserved"), Some(600 * MB), "{}", p.dump());
    let allocs = p.find("alloc");
    assert_eq!(
        allocs[0].rc(),
        Some(GOOM),
        "graph memory counts: {}",
        p.dump()
    );
    // Freed, the memory stays in the driver's graph pool: still charged.
    assert_eq!(attrs[1].num("reserved"), Some(600 * MB), "{}", p.dump());
    assert_eq!(
        allocs[1].rc(),
        Some(GOOM),
        "the pool still holds it: {}",
        p.dump()
    );
    // Trimmed: given back.
    assert_eq!(attrs[2].num("reserved"), Some(0), "{}", p.dump());
    assert_eq!(allocs[2].rc(), Some(0), "{}", p.dump());
}

/// Guards issue 31 (92866cf): `cuGraphUpload` and `cuGraphInstantiateWithParams` with
/// `CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD` map the graph's memory too: refused over the quota, and
/// a relaunch of a graph whose memory the pool already holds needs no more room.
#[test]
fn graph_upload_over_the_quota_is_refused_issue_31() {
    let env = graph_env();
    let p = run_graph_ops(
        &env,
        &[
            "init",
            "ctx",
            "streamnew",
            "gmem-alloc",
            "1536M",
            "gmem-inst",
            "gmem-upload",
            "gmem-attr",
            "gmem-alloc",
            "1200M",
            "gmem-inst-upload",
            "gmem-attr",
        ],
    );
    assert_eq!(p.last("gmem-upload").rc(), Some(GOOM), "{}", p.dump());
    assert_eq!(p.last("gmem-inst-upload").rc(), Some(GOOM), "{}", p.dump());
    for a in p.find("gmem-attr") {
        assert_eq!(a.num("reserved"), Some(0), "{}", p.dump());
    }
    let env = graph_env();
    let p = run_graph_ops(
        &env,
        &[
            "init",
            "ctx",
            "streamnew",
            "gmem-alloc",
            "700M",
            "gmem-free",
            "gmem-inst",
            "gmem-upload",
            "graph-launch",
            "3",
            "streamsync",
            "gmem-attr",
            "alloc",
            "200M",
            "alloc",
            "200M",
        ],
    );
    assert_eq!(p.last("gmem-upload").rc(), Some(0), "{}", p.dump());
    assert_eq!(p.last("graph-launch").rc(), Some(0), "{}", p.dump());
    assert_eq!(p.last("gmem-attr").num("used"), Some(0), "{}", p.dump());
    assert_eq!(
        p.last("gmem-attr").num("reserved"),
        Some(700 * MB),
        "{}",
        p.dump()
    );
    let allocs = p.find("alloc");
    assert_eq!(allocs[0].rc(), Some(0), "{}", p.dump());
    assert_eq!(
        allocs[1].rc(),
        Some(GOOM),
        "700 + 200 + 200 > 1024: {}",
        p.dump()
    );
}

// ---- issue 31: green contexts admitted and charged ----

/// Guards issue 31 (9012a4a): green contexts took about 5 MiB each on the H200 and were charged
/// to no one. Each is now admitted before the driver creates it and charged what it measures
/// (context memory), given back at `cuGreenCtxDestroy`; in a full container the creation is
/// refused with `CUDA_ERROR_OUT_OF_MEMORY` and the driver stays within the quota.
#[test]
fn green_contexts_are_admitted_and_charged_issue_31() {
    let env = graph_env();
    let mut ops = vec!["init", "ctx"];
    ops.extend(std::iter::repeat_n("greenctx", 8));
    let mut p = env.spawn_probe(&[ops.as_slice(), &["wait"]].concat());
    p.wait_for("wait");
    let charged: u64 = env
        .region()
        .snapshot()
        .slots
        .iter()
        .map(|s| s.usage[0][hami_abi::layout::UsageKind::Context.index()])
        .sum();
    p.resume();
    let out = p.finish();
    assert!(
        out.find("greenctx").iter().all(|o| o.rc() == Some(0)),
        "{}",
        out.dump()
    );
    assert_eq!(
        charged,
        8 * 5 * MB,
        "8 green contexts of 5 MiB: {}",
        out.dump()
    );

    // A full container: refused before the driver, which stays within the quota.
    let env = graph_env();
    let p = run_graph_ops(
        &env,
        &[
            "init",
            "ctx",
            "alloc",
            "1020M",
            "greenctx",
            "free",
            "last",
            "greenctx",
            "greenctxdestroy",
            "last",
            "alloc",
            "1020M",
        ],
    );
    let g = p.find("greenctx");
    assert_eq!(g[0].rc(), Some(GOOM), "{}", p.dump());
    assert_eq!(g[1].rc(), Some(0), "room again: {}", p.dump());
    assert_eq!(p.last("greenctxdestroy").rc(), Some(0), "{}", p.dump());
    assert_eq!(p.last("alloc").rc(), Some(0), "given back: {}", p.dump());
}
