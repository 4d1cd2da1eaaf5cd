//! The helpers these tests share, all from the workspace's harness (`hami-test-harness`);
//! each module of the test binary uses part of it.
#![allow(unused_imports)]

pub use hami_test_harness::{compile_c, forward_lines, require_root, wait_for_group_gone};

/// The agent binary under test.
pub const AGENT: &str = env!("CARGO_BIN_EXE_hami-agent");
