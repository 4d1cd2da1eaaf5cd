"""PyTorch workload for the acceptance runner (protocol: wlproto.py).

The allocator is chosen by the environment, as PyTorch itself reads it:
PYTORCH_CUDA_ALLOC_CONF unset (default caching allocator), `expandable_segments:True`
(cuMemCreate/cuMemMap) or `backend:cudaMallocAsync` (cuMemAllocAsync).
Usage: python3 torch_alloc.py meminfo hold enforce

One step of its own (the "physical" group, issue 8), `drop`: READY step=drop, waits; allocates
WL_GRAB_MB, prints `ALLOC ok=1 bytes=..` (or `ALLOC ok=0 kind=..`), drops the tensor WITHOUT
emptying the cache (a stream-ordered pool keeps the memory reserved), synchronises, prints
`DROPPED reserved=.. allocated=..` and `HOLDING bytes=<reserved>`; waits; RELEASED.

One more (the "physical2" group, issue 17), `fill`: READY step=fill, waits; allocates WL_CHUNK_MB
(128) chunks until refused or WL_FILL_MAX_MB (2560) is reached, prints `FILL granted=<bytes>
oom=0|1 kind=<exception name or none>` and `HOLDING bytes=<granted>`; waits; then goes on with
what it has: frees it, runs the small matmul (`COMPUTE_OK` / `COMPUTE_FAIL err=..`); RELEASED.
"""

import sys
import time

import wlproto


class TorchBackend(wlproto.Backend):
    def __init__(self):
        import torch  # imported here: the runner itself never imports torch

        self.torch = torch
        torch.cuda.init()
        torch.cuda.set_device(0)
        try:
            backend = torch.cuda.get_allocator_backend()
        except Exception:  # noqa: BLE001 - informational only
            backend = "?"
        wlproto.emit("FRAMEWORK", name="torch", version=torch.__version__, backend=backend)

    def meminfo(self):
        free, total = self.torch.cuda.mem_get_info()
        return free, total

    def alloc(self, nbytes):
        return self.torch.empty(nbytes, dtype=self.torch.uint8, device="cuda")

    def free(self, handles):
        handles.clear()
        self.torch.cuda.synchronize()
        self.torch.cuda.empty_cache()

    def figure(self):
        self.torch.cuda.synchronize()
        r = self.torch.cuda.memory_reserved()
        if r == 0:
            # Some backends report no reserved figure; fall back to allocated bytes.
            r = self.torch.cuda.memory_allocated()
        return r

    def is_oom(self, exc):
        return isinstance(exc, self.torch.cuda.OutOfMemoryError)

    def compute(self):
        t = self.torch
        t.manual_seed(0)
        a = t.ones((1024, 1024), device="cuda", dtype=t.float32)
        b = t.full((1024, 1024), 2.0, device="cuda", dtype=t.float32)
        c = a @ b
        t.cuda.synchronize()
        ok = bool((c == 2048.0).all().item())
        del a, b, c
        return ok


def step_drop(b):
    """Allocate, drop the tensor, keep the allocator's cache (see the module docstring)."""
    torch = b.torch
    n = wlproto.env_mb("WL_GRAB_MB", 3072)
    wlproto.wait_signal("drop")
    wlproto.emit("ALLOC_T0", t=f"{time.time():.6f}")
    try:
        t = b.alloc(n)
        torch.cuda.synchronize()
        wlproto.emit("ALLOC", ok=1, bytes=n)
        del t
    except Exception as e:  # noqa: BLE001 - the framework decides what it raises
        if not b.is_oom(e):
            raise
        wlproto.emit("ALLOC", ok=0, kind=type(e).__name__)
    torch.cuda.synchronize()
    try:  # informational: nvidia-smi is the evidence, these figures must not end the step
        reserved, allocated = torch.cuda.memory_reserved(), torch.cuda.memory_allocated()
    except Exception:  # noqa: BLE001
        reserved, allocated = -1, -1
    wlproto.emit("DROPPED", reserved=reserved, allocated=allocated)
    wlproto.emit("HOLDING", bytes=reserved, requested=n, t=f"{time.time():.6f}")
    sys.stdin.readline()
    wlproto.emit("RELEASED")


def step_fill(b):
    """Fill until refused (or the cap), hold, then go on computing (see the module docstring)."""
    cap = wlproto.env_mb("WL_FILL_MAX_MB", 2560)
    chunk = wlproto.env_mb("WL_CHUNK_MB", 128)
    wlproto.wait_signal("fill")
    wlproto.emit("ALLOC_T0", t=f"{time.time():.6f}")
    held, granted, oom = [], 0, None
    while granted + chunk <= cap:
        try:
            held.append(b.alloc(chunk))
            granted += chunk
        except Exception as e:  # noqa: BLE001 - the framework decides what it raises
            if not b.is_oom(e):
                raise
            oom = type(e).__name__
            break
    b.torch.cuda.synchronize()
    wlproto.emit("FILL", granted=granted, oom=1 if oom else 0, kind=oom or "none")
    wlproto.emit("HOLDING", bytes=granted, requested=cap, t=f"{time.time():.6f}")
    sys.stdin.readline()
    b.free(held)
    try:
        ok = b.compute()
        wlproto.emit("COMPUTE_OK" if ok else "COMPUTE_FAIL", err="" if ok else "wrong_result")
    except Exception as e:  # noqa: BLE001
        wlproto.emit("COMPUTE_FAIL", err=wlproto.one_line(e))
    wlproto.emit("RELEASED")


wlproto.STEPS["drop"] = step_drop
wlproto.STEPS["fill"] = step_fill

if __name__ == "__main__":
    sys.exit(wlproto.main(TorchBackend))
