//! Helpers of `agent_e2e.rs`, beside it.

use super::*;

pub(super) fn inspect(region: &Path) -> Value {
    inspect_json(AGENT, region)
}

/// The eBPF program ids process `pid` holds (`prog_id:` in `/proc/<pid>/fdinfo/*`: program
/// and link descriptors).
pub(super) fn bpf_prog_ids(pid: u32) -> Vec<u32> {
    let mut ids: Vec<u32> = std::fs::read_dir(format!("/proc/{pid}/fdinfo"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| std::fs::read_to_string(e.path()).ok())
        .flat_map(|t| {
            t.lines()
                .filter_map(|l| l.strip_prefix("prog_id:")?.trim().parse().ok())
                .collect::<Vec<u32>>()
        })
        .collect();
    ids.sort_unstable();
    ids.dedup();
    ids
}

/// Whether the kernel still has eBPF program `id` (aya's listing of the loaded programs): a
/// probe left attached keeps its program alive.
pub(super) fn bpf_prog_exists(id: u32) -> bool {
    aya::programs::loaded_programs()
        .flatten()
        .any(|p| p.id() == id)
}

/// Writes `sm_limit` into device 0's compute record of a region file (the share the launch
/// gate holds the container to; a region created with `CUDA_DEVICE_SM_LIMIT` has it).
pub(super) fn set_sm_limit(region: &Path, percent: u32) {
    use core::mem::offset_of;
    use hami_abi::layout::{DeviceCompute, RegionLayout};
    let off = (offset_of!(RegionLayout, compute) + offset_of!(DeviceCompute, sm_limit)) as u64;
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(region)
        .expect("open region");
    std::os::unix::fs::FileExt::write_all_at(&f, &percent.to_le_bytes(), off).unwrap();
}
