//! The circle check on small in-memory crates, and on the real workspace.

use super::*;

/// A crate from (path, text) pairs.
fn crate_of(files: &[(&str, &str)]) -> Sources {
    files
        .iter()
        .map(|(p, t)| (p.to_string(), t.to_string()))
        .collect()
}

/// The edges as `from -> to` strings.
fn edge_list(files: &[(&str, &str)]) -> Vec<String> {
    file_edges(&crate_of(files), "src/lib.rs")
        .unwrap()
        .keys()
        .map(|(from, to)| format!("{from} -> {to}"))
        .collect()
}

/// The circles as sorted file lists.
fn circle_files(files: &[(&str, &str)]) -> Vec<Vec<String>> {
    crate_circles("t", &crate_of(files), "src/lib.rs")
        .unwrap()
        .into_iter()
        .map(|c| c.files)
        .collect()
}

#[test]
fn a_circle_is_found_with_the_names_that_tie_it() {
    let files = [
        ("src/lib.rs", "mod a;\nmod b;\n"),
        (
            "src/a.rs",
            "use crate::b::Thing;\npub fn f() -> Thing { Thing }\n",
        ),
        (
            "src/b.rs",
            "pub struct Thing;\npub fn g() { crate::a::f(); }\n",
        ),
    ];
    let found = crate_circles("t", &crate_of(&files), "src/lib.rs").unwrap();
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].files, ["src/a.rs", "src/b.rs"]);
    assert_eq!(
        found[0].edges,
        [
            (
                "src/a.rs".to_string(),
                "src/b.rs".to_string(),
                vec!["crate::b::Thing".to_string()]
            ),
            (
                "src/b.rs".to_string(),
                "src/a.rs".to_string(),
                vec!["crate::a::f".to_string()]
            ),
        ]
    );
    let shown = found[0].to_string();
    assert!(
        shown.contains("src/b.rs -> src/a.rs: crate::a::f"),
        "{shown}"
    );
}

#[test]
fn a_chain_is_not_a_circle_and_mod_declarations_are_no_edges() {
    let files = [
        ("src/lib.rs", "mod a;\nmod b;\nmod c;\n"),
        ("src/a.rs", "use crate::b::X;\n"),
        ("src/b.rs", "pub use crate::c::X;\n"),
        ("src/c.rs", "pub struct X;\n"),
    ];
    assert_eq!(
        edge_list(&files),
        ["src/a.rs -> src/b.rs", "src/b.rs -> src/c.rs"]
    );
    assert!(circle_files(&files).is_empty());
}

#[test]
fn a_longer_circle_is_one_circle() {
    let files = [
        ("src/lib.rs", "mod a;\nmod b;\nmod c;\nmod d;\n"),
        ("src/a.rs", "use crate::b::X;\n"),
        ("src/b.rs", "use crate::c::Y;\n"),
        ("src/c.rs", "fn f() { crate::a::g(); crate::d::h(); }\n"),
        ("src/d.rs", "pub fn h() {}\n"),
    ];
    assert_eq!(circle_files(&files), [["src/a.rs", "src/b.rs", "src/c.rs"]]);
}

#[test]
fn super_self_and_crate_paths_resolve_to_the_right_files() {
    let files = [
        ("src/lib.rs", "pub mod hooks;\npub struct Root;\n"),
        (
            "src/hooks/mod.rs",
            "mod launch;\nmod modules;\npub fn gate() {}\nfn f() { self::launch::go(); }\n",
        ),
        (
            "src/hooks/launch.rs",
            "use super::modules::Table;\nuse crate::Root;\npub fn go() { super::gate(); }\n",
        ),
        ("src/hooks/modules.rs", "pub struct Table;\n"),
    ];
    assert_eq!(
        edge_list(&files),
        [
            "src/hooks/launch.rs -> src/hooks/mod.rs",
            "src/hooks/launch.rs -> src/hooks/modules.rs",
            "src/hooks/launch.rs -> src/lib.rs",
            "src/hooks/mod.rs -> src/hooks/launch.rs",
        ]
    );
    assert_eq!(
        circle_files(&files),
        [["src/hooks/launch.rs", "src/hooks/mod.rs"]]
    );
}

#[test]
fn non_mod_rs_files_hold_their_children_and_super_super_climbs() {
    let files = [
        ("src/lib.rs", "mod agent;\nmod util;\n"),
        ("src/agent.rs", "mod regions;\n"),
        ("src/agent/regions.rs", "use super::super::util::x;\n"),
        ("src/util.rs", "pub fn x() {}\n"),
    ];
    assert_eq!(edge_list(&files), ["src/agent/regions.rs -> src/util.rs"]);
}

#[test]
fn use_groups_renames_and_self_in_groups() {
    let files = [
        ("src/lib.rs", "mod a;\nmod b;\nmod c;\nmod d;\n"),
        (
            "src/a.rs",
            "use crate::{b, c::{self as cc, Z}};\nfn f() { b::g(); cc::h(); }\n",
        ),
        ("src/b.rs", "pub fn g() {}\n"),
        ("src/c.rs", "pub fn h() {}\npub struct Z;\n"),
        // `d` reaches `a` only through a name brought in by a `use`.
        (
            "src/d.rs",
            "use crate::a as alpha;\nfn f() { alpha::f(); }\n",
        ),
    ];
    assert_eq!(
        edge_list(&files),
        [
            "src/a.rs -> src/b.rs",
            "src/a.rs -> src/c.rs",
            "src/d.rs -> src/a.rs"
        ]
    );
    let edges = file_edges(&crate_of(&files), "src/lib.rs").unwrap();
    let a_c = &edges[&("src/a.rs".to_string(), "src/c.rs".to_string())];
    assert!(
        a_c.contains("crate::c::Z") && a_c.contains("cc::h"),
        "{a_c:?}"
    );
}

#[test]
fn pub_use_re_exports_are_edges_of_the_re_exporting_file() {
    // The parent re-exports its child's item and the child names the parent: a circle.
    let files = [
        ("src/lib.rs", "mod agent;\n"),
        (
            "src/agent.rs",
            "mod regions;\npub use regions::Region;\npub struct Config;\n",
        ),
        (
            "src/agent/regions.rs",
            "use super::Config;\npub struct Region;\n",
        ),
    ];
    assert_eq!(
        circle_files(&files),
        [["src/agent.rs", "src/agent/regions.rs"]]
    );
    // Without the re-export, the child naming its parent is a plain edge.
    let files = [
        ("src/lib.rs", "mod agent;\n"),
        ("src/agent.rs", "pub mod regions;\npub struct Config;\n"),
        (
            "src/agent/regions.rs",
            "use super::Config;\npub struct Region;\n",
        ),
    ];
    assert_eq!(edge_list(&files), ["src/agent/regions.rs -> src/agent.rs"]);
}

#[test]
fn test_children_may_import_their_parent() {
    let files = [
        ("src/lib.rs", "mod a;\n"),
        (
            "src/a.rs",
            "pub fn f() {}\n#[cfg(test)]\nmod tests;\n#[cfg(test)]\nmod inline { use super::*; }\n",
        ),
        (
            "src/a/tests.rs",
            "use super::*;\n#[test]\nfn t() { f(); }\n",
        ),
    ];
    assert_eq!(edge_list(&files), ["src/a/tests.rs -> src/a.rs"]);
    assert!(circle_files(&files).is_empty());
}

#[test]
fn inline_modules_belong_to_their_file() {
    let files = [
        ("src/lib.rs", "mod a;\nmod b;\n"),
        (
            "src/a.rs",
            "pub mod inner { pub struct X; }\nmod deep { fn f() { super::super::b::g(); } }\n",
        ),
        (
            "src/b.rs",
            "pub fn g() {}\nfn h() { let _ = crate::a::inner::X; }\n",
        ),
    ];
    assert_eq!(circle_files(&files), [["src/a.rs", "src/b.rs"]]);
}

#[test]
fn paths_in_macro_calls_and_path_attributes_count() {
    let files = [
        (
            "src/lib.rs",
            "mod a;\n#[path = \"other/b_impl.rs\"]\nmod b;\n",
        ),
        (
            "src/a.rs",
            "pub fn f() {}\nmacro_rules! m { () => { $crate::b::g() }; }\n",
        ),
        (
            "src/other/b_impl.rs",
            "pub fn g() {}\nfn h() { println!(\"{}\", crate::a::f as usize); }\n",
        ),
    ];
    assert_eq!(
        edge_list(&files),
        [
            "src/a.rs -> src/other/b_impl.rs",
            "src/other/b_impl.rs -> src/a.rs"
        ]
    );
}

#[test]
fn comments_strings_external_crates_and_locals_are_not_edges() {
    let files = [
        ("src/lib.rs", "mod a;\nmod b;\n"),
        (
            "src/a.rs",
            "// crate::b::X\n/// see crate::b::g\nfn f() { let s = \"crate::b::g\"; \
             let b = 1; let _ = b; std::mem::drop(s); ::core::mem::drop(1); }\n",
        ),
        ("src/b.rs", "use crate::a;\n"),
    ];
    assert_eq!(edge_list(&files), ["src/b.rs -> src/a.rs"]);
}

#[test]
fn the_workspace_has_no_circle() {
    if let Err(e) = check(&crate::util::project_root()) {
        panic!("{e}");
    }
}

#[test]
fn the_workspace_crates_are_all_read() {
    let dirs: Vec<String> = crate_dirs(&crate::util::project_root())
        .unwrap()
        .iter()
        .map(|d| d.file_name().unwrap().to_string_lossy().to_string())
        .collect();
    for name in [
        "hami-abi",
        "hami-common",
        "hami-ebpf",
        "hami-image",
        "hami-preload",
        "hami-user",
        "xtask",
        "fake-cuda",
        "fake-nvml",
        "fake-state",
        "harness",
    ] {
        assert!(
            dirs.iter().any(|d| d == name),
            "{name} missing from {dirs:?}"
        );
    }
    assert!(!dirs.iter().any(|d| d == "fuzz"), "{dirs:?}");
}
