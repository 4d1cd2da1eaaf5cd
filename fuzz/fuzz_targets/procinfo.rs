//! The agent's `/proc` parsers: `stat`, `status` (`NSpid`), `cgroup`, `maps` lines, namespace
//! links, `environ`, and the `ld.so.cache` reader of libcuda discovery.
#![no_main]

use hami_user::probes::discovery;
use hami_user::procinfo;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let s = String::from_utf8_lossy(data);
    if let Some(st) = procinfo::parse_stat(&s) {
        let _ = st.is_dead();
    }
    let _ = procinfo::parse_nspid(&s);
    let cg = procinfo::parse_cgroup(&s);
    let _ = (procinfo::container_id(&cg), procinfo::container_name(&cg));
    let _ = (procinfo::container_id(&s), procinfo::container_name(&s));
    let _ = procinfo::maps_has_preload(&s);
    let _ = procinfo::maps_has_libcuda(&s);
    let ids = std::collections::HashSet::from([("/usr/lib/libcuda.so.1".to_string(), 7u64)]);
    let _ = procinfo::maps_has_ids(&s, &ids);
    let _ = procinfo::mapped_files(&s).count();
    let _ = procinfo::maps_entries(&s).count();
    let _ = procinfo::parse_ns_link(&s);
    let _ = discovery::exec_mappings(&s);
    let _ = discovery::parse_ld_so_cache(data);
    let _ = procinfo::parse_environ(data);
});
