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

/// Whether the kernel still has eBPF program `id` (`BPF_PROG_GET_FD_BY_ID`): a probe left
/// attached keeps its program alive.
pub(super) fn bpf_prog_exists(id: u32) -> bool {
    const BPF_PROG_GET_FD_BY_ID: libc::c_long = 13;
    // union bpf_attr for this command: prog_id, next_id, open_flags.
    let attr: [u32; 3] = [id, 0, 0];
    // SAFETY: the attr buffer is valid for its size; the command only reads it.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_PROG_GET_FD_BY_ID,
            attr.as_ptr(),
            std::mem::size_of_val(&attr) as libc::c_uint,
        )
    };
    if fd >= 0 {
        // SAFETY: a descriptor the kernel just gave us.
        unsafe { libc::close(fd as libc::c_int) };
    }
    fd >= 0
}

/// Writes `sm_limit` into device 0's compute record of a region file (the share the launch
/// gate holds the container to; a region created with `CUDA_DEVICE_SM_LIMIT` has it).
pub(super) fn set_sm_limit(region: &Path, percent: u32) {
    use core::mem::offset_of;
    use hami_common::layout::{DeviceCompute, Region};
    let off = (offset_of!(Region, compute) + offset_of!(DeviceCompute, sm_limit)) as u64;
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(region)
        .expect("open region");
    std::os::unix::fs::FileExt::write_all_at(&f, &percent.to_le_bytes(), off).unwrap();
}
