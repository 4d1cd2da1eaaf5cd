"""What the acceptance run runs and what passes: workloads, checks, rows, quotas, tolerances.

Pure data (no I/O). gpu/README.md documents every figure here; the evaluation
(acceptance.evaluate, acceptance.physical, acceptance.lockstop) and the report
(acceptance.report) read them, and so does the runner (run_acceptance.py).
"""

MIB = 1 << 20
GIB = 1 << 30

# Observed-bytes tolerance (documented in gpu/README.md): the agent's observed data bytes for a
# process may differ from the framework's own figure by max(64 MiB, 5 %).
TOL_MIN_BYTES = 64 * MIB
TOL_FRACTION = 0.05
# A bypass must be reported within this many seconds of the first allocation.
BYPASS_LATENCY_S = 1.0

# Workload name -> how to run it. "kind" selects the command; "env" is added to the environment.
WORKLOADS = [
    {"name": "torch-default", "kind": "torch", "env": {}, "oom": "OutOfMemoryError"},
    {
        "name": "torch-expandable",
        "kind": "torch",
        "env": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"},
        "oom": "OutOfMemoryError",
    },
    {
        "name": "torch-async",
        "kind": "torch",
        "env": {"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"},
        "oom": "OutOfMemoryError",
    },
    {"name": "cupy", "kind": "cupy", "env": {}, "oom": "OutOfMemoryError"},
    {"name": "nvcc-static", "kind": "cuda_static", "env": {}, "oom": "cudaErrorMemoryAllocation"},
    {"name": "nvcc-shared", "kind": "cuda_shared", "env": {}, "oom": "cudaErrorMemoryAllocation"},
]
CHECKS = ["enforced", "virtualised", "observed", "bypass"]
CHECK_TITLES = {
    "native": "native",
    "enforced": "enforced",
    "virtualised": "virtualised",
    "observed": "observed",
    "bypass": "bypass caught",
}

# The "physical" group (issue 8, `--only physical`): device memory that arrives by paths other
# than the plain allocation calls. Rows are escape paths, columns what must catch them.
PHYS_ROWS = ["pool", "mipmap", "module-lazy", "module-eager", "pre-existing"]
PHYS_ROW_TITLES = {
    "pool": "torch cudaMallocAsync pool, 2 processes, 4 GiB",
    "mipmap": "cuMipmappedArrayCreate 2 GiB, quota 1 GiB",
    "module-lazy": "1.5 GiB __device__ global (lazy loading), quota 1 GiB",
    "module-eager": "same, CUDA_MODULE_LOADING=EAGER",
    "pre-existing": "unpreloaded torch holding 1.5 GiB before the audit",
}
PHYS_CHECKS = ["preload", "agent-none", "agent-blind", "audit"]
PHYS_CHECK_TITLES = {
    "preload": "preload refuses or charges",
    "agent-none": "agent flags it, no preload (bypass)",
    "agent-blind": "agent flags it, blind preload (over_limit/drift)",
    "audit": "audit exits with findings (bypass)",
}
# Which cells each row has (the others are "-" in the table).
PHYS_CELLS = {
    "pool": ["preload", "agent-none", "agent-blind"],
    "mipmap": ["preload", "agent-none", "agent-blind"],
    "module-lazy": ["preload", "agent-none", "agent-blind"],
    "module-eager": ["preload"],
    "pre-existing": ["audit"],
}
PHYS_POOL_QUOTA_MB = 4096
PHYS_POOL_GRAB_MB = 2560
PHYS_SMALL_QUOTA_MB = 1024
PHYS_PREEXISTING_MB = 1536
# After the workload holds, the agent gets this long before its audit is stopped (evaluation
# every 250 ms, findings settle 300 ms, NVML is refreshed at a bounded rate).
PHYS_AGENT_SETTLE_S = 3.0
# Upper bound of a physical-group audit; it is ended with SIGINT once the workload holds.
PHYS_AUDIT_MAX_S = 90

# The two out-of-memory codes: the driver API's and the runtime's (both 2).
OOM_NAMES = ("CUDA_ERROR_OUT_OF_MEMORY", "cudaErrorMemoryAllocation")
# `hami-agent audit`'s exit status when it raised a bypass or over-limit finding
# (hami-user/src/report.rs EXIT_FINDINGS; gpu/test_acceptance.py checks it still is).
AUDIT_EXIT_FINDINGS = 2
# The label of the nvidia-smi sample taken just after pool process A dropped its tensor.
POOL_DROPPED_LABEL = "A dropped its tensor"

# The "physical2" group (issue 17, `--only physical2`): memory the driver takes for a context's
# limits, a kernel's local memory, lazily loaded module statics, and contexts that do not fit.
# Each row is run natively (the driver's figure without us), preloaded at its quota (the
# judge), with an agent audit alongside the preloaded runs (no finding for them), and
# preloaded at a quota large enough for it (same results as natively).
P2_ROWS = ["heap", "stack", "local", "module-lazy", "module-eager", "ctx-second", "ctx-race"]
P2_ROW_TITLES = {
    "heap": "cudaDeviceSetLimit(MallocHeapSize, 2 GiB), then a kernel calling malloc",
    "stack": "cudaDeviceSetLimit(StackSize, 8 KiB), then a small launch",
    "local": "one launch, 24 KiB local array, 132 x 256 threads",
    "module-lazy": "1.5 GiB __device__ global, lazy loading",
    "module-eager": "same, CUDA_MODULE_LOADING=EAGER",
    "ctx-second": "2 torch processes, 3 GiB: A fills, then B initialises CUDA",
    "ctx-race": "2 torch processes filling one 3 GiB container at once",
}
P2_CHECKS = ["native", "agent-none", "preload", "agent", "within"]
P2_CHECK_TITLES = {
    "native": "native (driver's MiB)",
    "agent-none": "agent flags the native run (bypass)",
    "preload": "preload: refused, driver within quota",
    "agent": "no agent finding (preloaded)",
    "within": "within a large quota: same results",
}
# The C rows: program, mode argument, extra environment, the stages where the refusal may
# come (the call that would take the memory) and the stage that shows the program goes on.
P2_C_ROWS = {
    # Issue 17: a limit's growth is admitted at cuCtxSetLimit itself.
    "heap": {"prog": "limits_probe", "args": ["heap"], "env": {},
             "refuse_at": ["SETLIMIT"], "goes_on": "AFTER"},
    "stack": {"prog": "limits_probe", "args": ["stack"], "env": {},
              "refuse_at": ["SETLIMIT"], "goes_on": "AFTER"},
    "local": {"prog": "limits_probe", "args": ["local"], "env": {},
              "refuse_at": ["LAUNCH", "SYNC"], "goes_on": "AFTER"},
    "module-lazy": {"prog": "module_global", "args": [], "env": {},
                    "refuse_at": ["LAUNCH", "SYNC"], "goes_on": "NEXT"},
    "module-eager": {"prog": "module_global", "args": [],
                     "env": {"CUDA_MODULE_LOADING": "EAGER"},
                     "refuse_at": ["INIT", "LAUNCH", "SYNC"], "goes_on": "NEXT"},
}
# The stage lines of each program, in order (limits_probe.cu, module_global.cu).
P2_STAGES = {
    "limits_probe": ["INIT", "PRE", "OUTBUF", "SETLIMIT", "LAUNCH", "SYNC", "AFTER"],
    "module_global": ["INIT", "PRE", "OUTBUF", "LAUNCH", "SYNC", "NEXT"],
}
P2_QUOTA_MB = 1024          # the C rows
P2_CTX_QUOTA_MB = 3072      # the two torch rows
P2_WITHIN_QUOTA_MB = 16384  # "programs within quota see no difference"
P2_CHUNK_MB = 128           # torch fill chunks
P2_SECOND_GRAB_MB = 64      # ctx-second: B's first allocation
# Fill caps: natively (and within the large quota) each process stops here; preloaded at the
# 3 GiB quota the cap is quota + 2 GiB, so that only a refusal stops it.
P2_FILL_NATIVE_MB = {"ctx-second": 2560, "ctx-race": 1536}
P2_AUDIT_MAX_S = 300
# A preloaded run holds this long after its nvidia-smi reading, so that the audit alongside
# (evaluation every 250 ms, findings settle 300 ms) could flag it if it were over the quota.
P2_AGENT_HOLD_S = 1.5

# Empty-kernel launch cost, native against preloaded in the same run: the preloaded median may
# exceed the native median by at most max(LAUNCH_TOL_US, LAUNCH_TOL_FRACTION of it).
LAUNCH_TOL_US = 0.3
LAUNCH_TOL_FRACTION = 0.10

# The "compute" group (issue 18, `--only compute`): CUDA_DEVICE_SM_LIMIT. Throughput of a
# kernel that keeps every SM busy ~1 ms (compute_spin.cu), kernels/s; share = preloaded
# throughput / native throughput alone, same run; pass within +-SHARE_TOL_POINTS of the limit.
SHARE_TOL_POINTS = 5.0
SHARE_SECONDS = 3.0
COMPUTE_CELLS = ["nolimit", "alone-30", "alone-50", "alone-70", "pair-30-70", "pair-50-50",
                 "neighbour-30", "two-of-50", "torch-50", "graph-50", "streams4-30",
                 "streams4-50", "default-alone-30", "default-30-50", "arb-pair-30-70",
                 "arb-pair-50-50", "default-borrow-back", "priority-latency",
                 "launch-nolimit", "agent-share", "hami-30", "hami-50"]
COMPUTE_TITLES = {
    "nolimit": "preloaded, no SM limit (expect 100)",
    "alone-30": "force, CUDA_DEVICE_SM_LIMIT=30, alone",
    "alone-50": "force, CUDA_DEVICE_SM_LIMIT=50, alone",
    "alone-70": "force, CUDA_DEVICE_SM_LIMIT=70, alone",
    "pair-30-70": "force: a 30 % container against a 70 % container",
    "pair-50-50": "force: two 50 % containers, no agent: never above the share (turns need the arbiter: arb-pair-50-50)",
    "streams4-30": "4 concurrent streams at 30 % (share of native 4-stream throughput)",
    "streams4-50": "4 concurrent streams at 50 % (share of native 4-stream throughput)",
    "default-alone-30": "default at 30 % alone, agent (arbiter) running: >= 95 % of native",
    "default-30-50": "default 30 % and 50 % both busy, agent running: 37.5 / 62.5 %",
    "arb-pair-30-70": "force 30 % against 70 %, agent running (turns): each +-5",
    "arb-pair-50-50": "force: two 50 % containers, agent running (turns): each +-5",
    "default-borrow-back": "default 30 % lent the GPU, then a busy 50 % neighbour: both at 37.5 / 62.5 within 1 s",
    "priority-latency": "200 us requests at priority 0 beside busy priority-1 training: p99 vs alone",
    "neighbour-30": "30 % against an unlimited native neighbour",
    "two-of-50": "two processes of one 50 % container (sum)",
    "torch-50": "PyTorch training steps/s at 50 %",
    "graph-50": "CUDA-graph replay at 50 %",
    "launch-nolimit": "empty-kernel launch, no limit: us per launch",
    "agent-share": "the agent's measured share at 50 %",
    "hami-30": "HAMi-core, CUDA_DEVICE_SM_LIMIT=30, alone (reference)",
    "hami-50": "HAMi-core, CUDA_DEVICE_SM_LIMIT=50, alone (reference)",
}
COMPUTE_MEM_LIMIT_MB = 16384
# The agent's container compute share on /metrics (issue 18's agent half): the first of these
# names that /metrics carries is read. Change here if the agent names it otherwise.
AGENT_SHARE_METRICS = ("hami_container_compute_share_percent", "hami_compute_share_percent",
                       "hami_container_sm_share_percent")
AGENT_SHARE_SECONDS = 14.0
# hami-agent's share window (hami-user/src/compute.rs, ComputeOptions::default: 10 s): the
# agent's figure is compared only once that window lies wholly inside the run (the first
# H200 runs compared an 8 s run with a 10 s window that still held the idle time before the
# start: agent 42.5-43.8 % against 50.3 %, while nvidia-smi pmon said 47-49 % in steady state).
AGENT_SHARE_WINDOW_SECONDS = 10.0
