use super::*;

#[test]
fn blank_lines_and_comments_are_not_code() {
    let text = "//! Module docs.\n\
                \n\
                /// A doc comment.\n\
                pub fn f() -> u32 {\n    \
                    // a comment\n    \
                    let x = 1; // a trailing comment is code\n\
                \n    \
                    x\n\
                }\n";
    assert_eq!(code_lines(text), 4);
    assert_eq!(code_lines(""), 0);
    assert_eq!(code_lines("\n\n   \n// x\n"), 0);
}

#[test]
fn inline_test_modules_are_not_counted_but_what_follows_is() {
    let text = "fn a() {}\n\
                #[cfg(test)]\n\
                mod tests {\n    \
                    use super::*;\n\n    \
                    #[test]\n    \
                    fn t() {\n        \
                        if true {\n        \
                        }\n    \
                    }\n\
                }\n\
                fn b() {}\n";
    assert_eq!(code_lines(text), 2);
    // Attributes between `#[cfg(test)]` and the `mod`, a visibility, a nested module.
    let text = "mod outer {\n    \
                    fn a() {}\n    \
                    #[cfg(test)]\n    \
                    #[allow(dead_code)]\n    \
                    pub(crate) mod tests {\n        \
                        fn t() {}\n    \
                    }\n    \
                    fn b() {}\n\
                }\n";
    assert_eq!(code_lines(text), 4);
    // An empty module on one line.
    assert_eq!(code_lines("#[cfg(test)]\nmod tests {}\nfn a() {}\n"), 1);
}

#[test]
fn test_module_declarations_and_other_cfgs_are_code() {
    // `mod tests;` is a line of its module; its file is a test file of its own.
    assert_eq!(code_lines("#[cfg(test)]\nmod tests;\nfn a() {}\n"), 3);
    // Only `#[cfg(test)]` modules are tests: a `#[cfg(test)]` function is code.
    assert_eq!(code_lines("#[cfg(test)]\nfn helper() {\n}\n"), 3);
    assert_eq!(
        code_lines("#[cfg(feature = \"x\")]\nmod x {\n    fn a() {}\n}\n"),
        4
    );
}

#[test]
fn test_files_are_told_by_name_and_folder() {
    for path in [
        "hami-user/src/procinfo/tests.rs",
        "hami-user/src/findings/tests/nvml.rs",
        "hami-user/src/probes/arch_tests.rs",
        "hami-user/tests/agent/main.rs",
        "hami-preload/tests/preload/regressions/fixtures.rs",
    ] {
        assert!(is_test_file(path), "{path}");
    }
    for path in [
        "hami-user/src/procinfo.rs",
        "hami-user/src/tests_helper.rs",
        "xtask/src/test.rs",
        "testing/harness/src/lib.rs",
        "fuzz/fuzz_targets/region.rs",
    ] {
        assert!(!is_test_file(path), "{path}");
    }
}

#[test]
fn files_over_their_limit_are_named() {
    let dir = tempfile_dir();
    let write = |rel: &str, text: String| {
        let p = dir.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    };
    let code = |n: usize| "fn f() {}\n".repeat(n);
    write("a/src/small.rs", code(MAX_CODE_LINES));
    write("a/src/big.rs", code(MAX_CODE_LINES + 1));
    // Comments, blank lines and inline tests do not count.
    write(
        "a/src/commented.rs",
        format!(
            "{}{}\n\n#[cfg(test)]\nmod tests {{\n{}}}\n",
            "// x\n".repeat(100),
            code(MAX_CODE_LINES),
            "    fn t() {}\n".repeat(100)
        ),
    );
    write("a/src/m/tests.rs", "\n".repeat(MAX_TEST_LINES));
    write("a/tests/it.rs", "\n".repeat(MAX_TEST_LINES + 1));
    write("a/target/debug/huge.rs", code(10 * MAX_CODE_LINES));
    write(".hidden/huge.rs", code(10 * MAX_CODE_LINES));
    write("testing/third_party/huge.rs", code(10 * MAX_CODE_LINES));
    let found = oversized(&dir).unwrap();
    assert_eq!(
        found,
        [
            Oversized {
                path: "a/src/big.rs".into(),
                test: false,
                lines: MAX_CODE_LINES + 1
            },
            Oversized {
                path: "a/tests/it.rs".into(),
                test: true,
                lines: MAX_TEST_LINES + 1
            },
        ]
    );
    let err = check(&dir).unwrap_err().to_string();
    assert!(err.contains("2 file(s)"), "{err}");
    assert!(err.contains("a/src/big.rs: 601 lines of code"), "{err}");
    assert!(err.contains("a/tests/it.rs: 801 lines"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A fresh folder under the system's temporary folder.
fn tempfile_dir() -> PathBuf {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let dir = std::env::temp_dir().join(format!("xtask-sizes-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn the_workspace_has_no_file_over_its_size() {
    if let Err(e) = check(&crate::util::project_root()) {
        panic!("{e}");
    }
}
