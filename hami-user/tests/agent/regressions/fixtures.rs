//! The regressions' fixtures: the nested driver and its program (C), the audits they run
//! and the helpers that read what the agent and the kernel hold.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use hami_test_harness::{AgentCommand, AgentProcess};
use serde_json::Value;

use crate::common::{compile_c, wait_for_group_gone, AGENT};

/// One MiB.
pub(super) const MIB: u64 = 1 << 20;

/// A driver whose exported functions call other exported ones: `cuMemAllocPitch_v2` and
/// `cuArrayCreate_v2` allocate through `cuMemAlloc_v2`, `cuArrayDestroy` frees through
/// `cuMemFree_v2`, `cuDevicePrimaryCtxRelease` is `cuDevicePrimaryCtxRelease_v2`. Each
/// nested call would be a second event for the same memory if the probes reported it.
pub(super) const NESTED_DRIVER: &str = r#"
#include <stddef.h>
#include <stdlib.h>
#define HAMI_CUDA_ABI_NAMES
#include "hami_cuda.h"
struct CUarray_st { CUdeviceptr mem; };
static unsigned long long next_ptr = 0x7f2000000000ULL;
static int refs[8];

CUresult cuInit(unsigned flags) { return 0; }
CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n) {
    if (!p || n == 0) return 1;
    *p = next_ptr; next_ptr += (n + 0xfffff) & ~0xfffffULL; return 0;
}
CUresult cuMemFree_v2(CUdeviceptr p) { return p ? 0 : 1; }
CUresult cuMemAllocPitch_v2(CUdeviceptr *p, size_t *pitch, size_t w, size_t h, unsigned e) {
    *pitch = (w + 511) & ~511ULL;
    return cuMemAlloc_v2(p, *pitch * h);
}
CUresult cuArrayCreate_v2(CUarray *a, const CUDA_ARRAY_DESCRIPTOR *d) {
    struct CUarray_st *x = malloc(sizeof *x);
    size_t bytes = d->Width * (d->Height ? d->Height : 1) * d->NumChannels * 4;
    CUresult rc = cuMemAlloc_v2(&x->mem, bytes);
    if (rc) { free(x); return rc; }
    *a = x; return 0;
}
CUresult cuArrayDestroy(CUarray a) { CUresult rc = cuMemFree_v2(a->mem); free(a); return rc; }
CUresult cuDevicePrimaryCtxRetain(CUcontext *c, CUdevice d) {
    refs[d & 7]++; *c = (CUcontext)(0xc0000ULL + d); return 0;
}
CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d) { if (refs[d & 7] > 0) refs[d & 7]--; return 0; }
CUresult cuDevicePrimaryCtxRelease(CUdevice d) { return cuDevicePrimaryCtxRelease_v2(d); }
CUresult cuCtxSetCurrent(CUcontext c) { return 0; }
"#;

/// Loads `libcuda.so.1` by name (LD_LIBRARY_PATH), allocates 64 MiB at once (before any
/// probe can be on the new driver), waits for `argv[1]` to exist, then allocates through the
/// nested functions and prints what it holds.
pub(super) const NESTED_PROGRAM: &str = r#"
#include <dlfcn.h>
#include <stdio.h>
#include <stddef.h>
#include <unistd.h>
#define HAMI_CUDA_ABI_NAMES
#include "hami_cuda.h"
int main(int argc, char **argv) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    if (!h) { fprintf(stderr, "dlopen: %s\n", dlerror()); return 2; }
    __typeof__(&cuInit) init = dlsym(h, "cuInit");
    __typeof__(&cuMemAlloc_v2) alloc = dlsym(h, "cuMemAlloc_v2");
    __typeof__(&cuMemAllocPitch_v2) pitch = dlsym(h, "cuMemAllocPitch_v2");
    __typeof__(&cuArrayCreate_v2) array = dlsym(h, "cuArrayCreate_v2");
    __typeof__(&cuDevicePrimaryCtxRetain) retain = dlsym(h, "cuDevicePrimaryCtxRetain");
    __typeof__(&cuDevicePrimaryCtxRelease) release = dlsym(h, "cuDevicePrimaryCtxRelease");
    __typeof__(&cuCtxSetCurrent) setcur = dlsym(h, "cuCtxSetCurrent");
    CUdeviceptr early = 0, p = 0, a = 0; size_t pp = 0; CUarray arr = 0; CUcontext c = 0;
    int rc = init(0) | alloc(&early, 64 << 20);
    printf("early\n"); fflush(stdout);
    while (access(argv[1], F_OK) != 0) usleep(10000);
    rc |= retain(&c, 0) | retain(&c, 0) | setcur(c);
    rc |= pitch(&p, &pp, 1000, 1000, 4);
    CUDA_ARRAY_DESCRIPTOR d = { 1024, 1024, CU_AD_FORMAT_FLOAT, 4 };
    rc |= array(&arr, &d);
    rc |= alloc(&a, 32 << 20);
    /* One of the two references goes: the context (and its memory) stays. */
    rc |= release(0);
    printf("pitch=%zu\ndone rc=%d\n", pp, rc); fflush(stdout);
    pause();
    return 0;
}
"#;

/// The driver as `<dir>/drv/libweird_driver.so` with a `libcuda.so.1` symlink to it (the
/// maps then name `libweird_driver.so`), and the program.
pub(super) fn build_nested(dir: &Path) -> (PathBuf, PathBuf) {
    let drv = dir.join("drv");
    std::fs::create_dir_all(&drv).unwrap();
    compile_c(
        NESTED_DRIVER,
        &drv.join("libweird_driver.so"),
        &["-shared", "-fPIC"],
    );
    std::os::unix::fs::symlink("libweird_driver.so", drv.join("libcuda.so.1")).unwrap();
    let prog = dir.join("prog");
    compile_c(NESTED_PROGRAM, &prog, &["-ldl"]);
    (drv, prog)
}

/// How long an interrupted audit may take to print its report and exit.
pub(super) const REPORT_TIMEOUT: Duration = Duration::from_secs(60);

/// `audit --json --seconds SECONDS` with no fake driver (no `--libcuda`, no NVML: the
/// drivers here are found by discovery), in its own process group, ready.
pub(super) fn discovery_audit(seconds: &str) -> AgentProcess {
    AgentCommand::audit_json(AGENT, seconds)
        .without_ld_library_path()
        .own_group()
        .start()
}

/// `audit --json --seconds SECONDS` against the sandbox's fake driver, in its own process
/// group (its probe keeper waited for with [`wait_for_group_gone`]), ready.
pub(super) fn fake_audit(env: &hami_test_harness::TestEnv, seconds: &str) -> AgentCommand {
    AgentCommand::audit_json(AGENT, seconds)
        .fake_driver(env)
        .own_group()
}

/// `inspect --json PATH`: exit code, stdout, stderr.
pub(super) fn inspect(path: &Path) -> (Option<i32>, String, String) {
    let out = AgentCommand::new(AGENT)
        .args(["inspect", "--json"])
        .arg(path)
        .output_within(Duration::from_secs(30));
    (out.code(), out.stdout_text(), out.stderr_text())
}

/// The host pid of the only child of `pid` (waits up to 5 s for it to appear).
pub(super) fn only_child(pid: u32) -> u32 {
    let end = Instant::now() + Duration::from_secs(5);
    loop {
        let c =
            std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
        if let Some(c) = c.split_whitespace().next() {
            return c.parse().unwrap();
        }
        assert!(Instant::now() < end, "no child of {pid}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The uprobe links process `pid` holds, with the file each probes as the kernel names it
/// (the path given at attach: `/proc/self/fd/<n>` for the agent's): the `link_id` of each of
/// its descriptors (`/proc/<pid>/fdinfo`), opened with `BPF_LINK_GET_FD_BY_ID` and read
/// with `BPF_OBJ_GET_INFO_BY_FD` (`struct bpf_link_info`, perf-event links of type uprobe
/// or uretprobe). Only this process's links: other agents on the machine may probe the same
/// files. Raw `bpf(2)`: aya's `loaded_links()` gives a link's type and program but not the
/// uprobe's file name, which needs a buffer handed to the kernel.
pub(super) fn uprobe_links_of(pid: u32) -> Vec<(u32, String)> {
    const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;
    const BPF_LINK_GET_FD_BY_ID: libc::c_long = 30;
    const BPF_LINK_TYPE_PERF_EVENT: u32 = 7;
    const BPF_PERF_EVENT_UPROBE: u32 = 1;
    const BPF_PERF_EVENT_URETPROBE: u32 = 2;
    fn bpf(cmd: libc::c_long, attr: &mut [u64]) -> libc::c_long {
        // SAFETY: `attr` is a valid, writable buffer of the size given; the commands used
        // read it and write back into it only.
        unsafe {
            libc::syscall(
                libc::SYS_bpf,
                cmd,
                attr.as_mut_ptr(),
                std::mem::size_of_val(attr) as libc::c_uint,
            )
        }
    }
    let mut ids: Vec<u32> = std::fs::read_dir(format!("/proc/{pid}/fdinfo"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| std::fs::read_to_string(e.path()).ok())
        .filter_map(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("link_id:")?.trim().parse().ok())
        })
        .collect();
    ids.sort_unstable();
    ids.dedup();
    let mut out = Vec::new();
    for id in ids {
        // union bpf_attr for BPF_LINK_GET_FD_BY_ID: link_id, next_id, open_flags.
        let mut attr = [u64::from(id), 0];
        let fd = bpf(BPF_LINK_GET_FD_BY_ID, &mut attr);
        if fd < 0 {
            continue; // detached meanwhile
        }
        let mut name = vec![0u8; 4096];
        // struct bpf_link_info: type, id, prog_id (u32 each), then at 16 the perf_event
        // member: type (u32), 4 bytes, then uprobe.file_name (u64) at 24, name_len at 32.
        let mut info = [0u64; 32];
        info[3] = name.as_mut_ptr() as u64;
        info[4] = name.len() as u64;
        // BPF_OBJ_GET_INFO_BY_FD: bpf_fd, info_len (u32 each), info (u64).
        let mut get = [fd as u64 | ((std::mem::size_of_val(&info) as u64) << 32), 0];
        get[1] = info.as_mut_ptr() as u64;
        let rc = bpf(BPF_OBJ_GET_INFO_BY_FD, &mut get);
        // SAFETY: a descriptor the kernel just gave us.
        unsafe { libc::close(fd as libc::c_int) };
        let (link_type, perf_type) = (info[0] as u32, info[2] as u32);
        if rc == 0
            && link_type == BPF_LINK_TYPE_PERF_EVENT
            && matches!(perf_type, BPF_PERF_EVENT_UPROBE | BPF_PERF_EVENT_URETPROBE)
        {
            let end = name.iter().position(|&b| b == 0).unwrap_or(name.len());
            out.push((id, String::from_utf8_lossy(&name[..end]).into_owned()));
        }
    }
    out
}

/// SIGINTs an `audit --json` agent and returns its report, once its probe keeper is gone.
pub(super) fn stop_audit(agent: AgentProcess) -> Value {
    let pgid = agent.pid();
    let (_, audit, _) = agent.interrupt_audit(REPORT_TIMEOUT);
    wait_for_group_gone(pgid);
    audit
}
