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
