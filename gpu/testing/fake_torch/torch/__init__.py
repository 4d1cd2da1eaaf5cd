"""A stand-in for PyTorch, for testing run_acceptance.py's torch cells without a GPU.

Only what gpu/workloads/torch_alloc.py's hold, grab, drop and fill steps call (fill's small
matmul check included: `ones`, `full`, `@`, `==`, `.all().item()` on a constant "matrix"). "Device" memory is an
untouched anonymous mapping (the process's virtual size grows, which the fake nvidia-smi
reports). A dropped tensor stays reserved (a caching allocator's pool) until empty_cache().
Under a (fake) hami preload that is not "blind", allocations are refused with OutOfMemoryError
past CUDA_DEVICE_MEMORY_LIMIT, counting what the other fake-torch processes of the same
CUDA_DEVICE_MEMORY_SHARED_CACHE reserve (each writes its figure next to the region file).
Not a model of PyTorch.
"""
import fcntl
import glob
import mmap
import os

__version__ = "0.0+fake"
uint8 = "uint8"
float32 = "float32"
MIB = 1 << 20


class _Version:
    cuda = None


version = _Version()


class OutOfMemoryError(RuntimeError):
    pass


def _enforced():
    pre = os.environ.get("LD_PRELOAD", "")
    return "hami" in pre and "blind" not in pre and "CUDA_DEVICE_MEMORY_LIMIT" in os.environ


def _limit():
    if _enforced():
        return int(os.environ["CUDA_DEVICE_MEMORY_LIMIT"].rstrip("Mm")) * MIB
    return 143771 * MIB


def _mine():
    region = os.environ.get("CUDA_DEVICE_MEMORY_SHARED_CACHE")
    return f"{region}.faketorch.{os.getpid()}" if region else None


def _others():
    region, mine, total = os.environ.get("CUDA_DEVICE_MEMORY_SHARED_CACHE"), _mine(), 0
    if not region or not _enforced():
        return 0
    for f in glob.glob(glob.escape(region) + ".faketorch.*"):
        if f != mine:
            try:
                with open(f) as fh:
                    total += int(fh.read() or 0)
            except (OSError, ValueError):
                pass
    return total


class _Allocator:
    def __init__(self):
        self.live = 0
        self.cache = []

    @property
    def reserved(self):
        return self.live + sum(len(m) for m in self.cache)

    def publish(self):
        if _mine():
            with open(_mine() + ".tmp", "w") as f:
                f.write(str(self.reserved))
            os.replace(_mine() + ".tmp", _mine())


_alloc = _Allocator()


class Tensor:
    def __init__(self, n):
        self.n = n
        self.buf = mmap.mmap(-1, max(1, n))
        _alloc.live += n
        _alloc.publish()

    def __del__(self):
        _alloc.live -= self.n
        _alloc.cache.append(self.buf)


def empty(n, dtype=None, device=None):
    region = os.environ.get("CUDA_DEVICE_MEMORY_SHARED_CACHE")
    lock = open(region + ".faketorch-lock", "a") if region else None
    try:  # processes of one region file admit one at a time, like the region's lock
        if lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
        if _others() + _alloc.reserved + n > _limit():
            raise OutOfMemoryError(f"fake: {n} bytes over the limit")
        return Tensor(n)
    finally:
        if lock:
            lock.close()


def manual_seed(seed):
    pass


class _Const:
    """A square matrix with every element equal to v (enough for the matmul check)."""

    def __init__(self, shape, v):
        self.shape, self.v = shape, v

    def __matmul__(self, other):
        return _Const((self.shape[0], other.shape[1]), self.v * other.v * self.shape[1])

    def __eq__(self, x):
        return _Const(self.shape, self.v == x)

    def all(self):
        return self

    def item(self):
        return self.v


def ones(shape, device=None, dtype=None):
    return _Const(shape, 1.0)


def full(shape, v, device=None, dtype=None):
    return _Const(shape, float(v))


class _Cuda:
    OutOfMemoryError = OutOfMemoryError

    @staticmethod
    def init():
        pass

    @staticmethod
    def is_available():
        return True

    @staticmethod
    def set_device(d):
        pass

    @staticmethod
    def get_allocator_backend():
        conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
        return "cudaMallocAsync" if "cudaMallocAsync" in conf else "native"

    @staticmethod
    def mem_get_info():
        return _limit() - _alloc.reserved, _limit()

    @staticmethod
    def synchronize():
        pass

    @staticmethod
    def empty_cache():
        _alloc.cache.clear()
        _alloc.publish()

    @staticmethod
    def memory_reserved():
        return _alloc.reserved

    @staticmethod
    def memory_allocated():
        return _alloc.live


cuda = _Cuda()
