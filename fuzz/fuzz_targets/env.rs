//! The size parser shared by the preload and the agent (`hami_common::config::parse_size`)
//! and the agent's reading of a process's environment (`procinfo::parse_environ`,
//! `env_limits`, `region_path`), checked against the environment contract's reading
//! (`hami_common::env::HamiEnv`, the preload's) of the same entries.
#![no_main]

use hami_common::config::parse_size;
use hami_common::env::{HamiEnv, Limit};
use hami_user::procinfo;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let s = String::from_utf8_lossy(data);
    let r = parse_size(&s);
    if let Ok(n) = r {
        // What was accepted is digits with at most one K/M/G/T suffix, around whitespace.
        let t = s.trim();
        let digits = t.trim_end_matches(['k', 'K', 'm', 'M', 'g', 'G', 't', 'T']);
        assert!(t.len() - digits.len() <= 1, "{t:?}");
        assert!(
            !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()),
            "{t:?}"
        );
        // Its canonical form parses back to the same value.
        assert_eq!(parse_size(&n.to_string()), Ok(n));
    }
    let env = procinfo::parse_environ(data);
    let limits = procinfo::env_limits(&env);
    // The preload's reading: `getenv` over the same entries (the first of a name counts).
    let contract = HamiEnv::from_lookup(|k| {
        data.split(|b| *b == 0).find_map(|e| {
            let e = String::from_utf8_lossy(e);
            let (name, value) = e.split_once('=')?;
            (name == k).then(|| value.to_string())
        })
    });
    for d in 0..17u32 {
        let agent = match limits.for_device(d) {
            None | Some(procinfo::EnvLimit::Bytes(0)) => Limit::None,
            Some(procinfo::EnvLimit::Bytes(n)) => Limit::Bytes(n),
            Some(procinfo::EnvLimit::Invalid) => Limit::Invalid,
        };
        assert_eq!(agent, contract.limit(d as usize), "device {d}");
        assert_eq!(
            limits.compute.share(d),
            contract.share(d as usize),
            "device {d}"
        );
        let _ = limits.bytes_for_device(d);
    }
    let _ = limits.is_empty();
    let (path, from_env) = procinfo::region_path(&env);
    assert!(!path.is_empty() || from_env);
});
