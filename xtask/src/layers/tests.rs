//! The layer check on small in-memory crates, and on `hami-preload`.

use super::*;

const LAYERS: &[Layer] = &[
    ("low", &["src/low/"]),
    ("high", &["src/high/", "src/lib.rs"]),
];

fn crate_of(files: &[(&str, &str)]) -> Sources {
    files
        .iter()
        .map(|(p, t)| (p.to_string(), t.to_string()))
        .collect()
}

#[test]
fn an_import_up_a_layer_is_named_with_both_layers() {
    let files = [
        ("src/lib.rs", "mod low;\nmod high;\n"),
        ("src/low/mod.rs", "pub mod a;\n"),
        (
            "src/low/a.rs",
            "use crate::high::b::Thing;\npub fn f() {}\n",
        ),
        ("src/high/mod.rs", "pub mod b;\n"),
        (
            "src/high/b.rs",
            "pub struct Thing;\npub fn g() { crate::low::a::f(); }\n",
        ),
    ];
    let found = violations(&crate_of(&files), "src/lib.rs", LAYERS).unwrap();
    assert_eq!(
        found,
        [Violation {
            from: "src/low/a.rs".into(),
            from_layer: "low",
            to: "src/high/b.rs".into(),
            to_layer: "high",
            paths: vec!["crate::high::b::Thing".into()],
        }]
    );
    assert_eq!(
        found[0].to_string(),
        "src/low/a.rs (layer low) imports crate::high::b::Thing from src/high/b.rs \
         (layer high, above low)"
    );
}

#[test]
fn an_inline_path_up_a_layer_counts_too() {
    let files = [
        ("src/lib.rs", "mod low;\nmod high;\n"),
        ("src/low/mod.rs", "pub fn f() { super::high::g(); }\n"),
        ("src/high/mod.rs", "pub fn g() {}\n"),
    ];
    let found = violations(&crate_of(&files), "src/lib.rs", LAYERS).unwrap();
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].paths, ["super::high::g"]);
}

#[test]
fn imports_down_or_within_a_layer_pass() {
    let files = [
        ("src/lib.rs", "mod low;\nmod high;\npub use high::g;\n"),
        ("src/low/mod.rs", "pub mod a;\npub fn f() { a::h(); }\n"),
        ("src/low/a.rs", "pub fn h() { super::f(); }\n"),
        (
            "src/high/mod.rs",
            "use crate::low::f;\npub fn g() { f() }\n",
        ),
    ];
    assert_eq!(
        violations(&crate_of(&files), "src/lib.rs", LAYERS).unwrap(),
        []
    );
}

#[test]
fn an_exported_macro_is_an_import_of_the_file_that_defines_it() {
    let files = [
        ("src/lib.rs", "mod low;\nmod high;\n"),
        (
            "src/low/mod.rs",
            "pub fn f() { crate::note!(); }\n#[macro_export]\nmacro_rules! low_note { () => {} }\n",
        ),
        (
            "src/high/mod.rs",
            "#[macro_export]\nmacro_rules! note { () => {} }\npub fn g() { crate::low_note!(); }\n",
        ),
    ];
    let found = violations(&crate_of(&files), "src/lib.rs", LAYERS).unwrap();
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(
        found[0].to_string(),
        "src/low/mod.rs (layer low) imports crate::note from src/high/mod.rs (layer high, above low)"
    );
}

#[test]
fn a_file_in_no_layer_is_an_error() {
    let files = [
        ("src/lib.rs", "mod stray;\n"),
        ("src/stray.rs", "pub fn f() {}\n"),
    ];
    let e = violations(&crate_of(&files), "src/lib.rs", LAYERS).unwrap_err();
    assert!(e.to_string().contains("src/stray.rs"), "{e}");
}

#[test]
fn hami_preload_imports_no_higher_layer() {
    if let Err(e) = check(&crate::util::project_root()) {
        panic!("{e:#}");
    }
}
