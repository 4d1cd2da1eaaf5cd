"""CuPy workload for the acceptance runner (protocol: wlproto.py).

Uses CuPy's default memory pool (cudaMalloc -> cuMemAlloc_v2).
Usage: python3 cupy_alloc.py meminfo hold enforce
"""

import sys

import wlproto


class CupyBackend(wlproto.Backend):
    def __init__(self):
        import cupy  # imported here: the runner itself never imports cupy

        self.cp = cupy
        cupy.cuda.Device(0).use()
        self.pool = cupy.get_default_memory_pool()
        wlproto.emit("FRAMEWORK", name="cupy", version=cupy.__version__)

    def meminfo(self):
        free, total = self.cp.cuda.runtime.memGetInfo()
        return free, total

    def alloc(self, nbytes):
        return self.cp.empty(nbytes, dtype=self.cp.uint8)

    def free(self, handles):
        handles.clear()
        self.cp.cuda.Device(0).synchronize()
        self.pool.free_all_blocks()

    def figure(self):
        return self.pool.total_bytes()

    def is_oom(self, exc):
        return isinstance(exc, self.cp.cuda.memory.OutOfMemoryError)

    def compute(self):
        cp = self.cp
        a = cp.ones((1024, 1024), dtype=cp.float32)
        b = cp.full((1024, 1024), 2.0, dtype=cp.float32)
        c = a @ b
        cp.cuda.Device(0).synchronize()
        ok = bool((c == 2048.0).all())
        del a, b, c
        return ok


if __name__ == "__main__":
    sys.exit(wlproto.main(CupyBackend))
