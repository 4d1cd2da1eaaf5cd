"""Line protocol shared by the Python workloads (torch_alloc.py, cupy_alloc.py).

The C workload (cuda_alloc.cu) speaks the same protocol; gpu/README.md documents it.

A workload is started with a list of steps as arguments and runs them in order:

  meminfo   MEMINFO free=<bytes> total=<bytes>
  compute   ALLOC_OK bytes=..; COMPUTE_OK (or COMPUTE_FAIL err=..)
  hold      READY step=hold, waits for a stdin line; ALLOC_T0 t=<unix time>;
            HOLDING bytes=<framework figure> requested=<bytes> t=<unix time>;
            waits for a stdin line; RELEASED
  enforce   BIG_OOM ok=0|1 kind=..; FILL granted=<bytes> oom=0|1 kind=..; FREED;
            RECOVERED_OK / RECOVERED_FAIL; COMPUTE_OK / COMPUTE_FAIL; OOM_OK or OOM_MISSING
  grab      READY step=grab, waits; GRAB ok=1 bytes=.. | GRAB ok=0 kind=..;
            HOLDING bytes=..; waits; RELEASED
Every step that raises prints STEP_ERROR step=<name> err=<one line>. The last line is DONE.
Sizes come from the environment: WL_HOLD_MB (1024), WL_QUOTA_MB (4096), WL_GRAB_MB (3072),
WL_CHUNK_MB (256). With WL_HOLD_ON_ERROR=1, a process whose init or a step failed prints
`HOLDING bytes=0 error=1` and waits for a stdin line before DONE, so that what it still holds
(a context) can be measured before it exits.
"""

import os
import sys
import time

MIB = 1 << 20


def emit(tag, **kv):
    """Print one protocol line and flush it."""
    parts = [tag]
    for k, v in kv.items():
        s = str(v).replace("\n", " ").replace(" ", "_")
        parts.append(f"{k}={s}")
    print(" ".join(parts), flush=True)


def wait_signal(step):
    """Announce READY and block until the runner writes a line (EOF: exit quietly)."""
    emit("READY", step=step)
    line = sys.stdin.readline()
    if not line:
        emit("EOF", step=step)
        sys.exit(3)


def env_mb(name, default):
    try:
        return int(os.environ.get(name, default)) * MIB
    except ValueError:
        return int(default) * MIB


def one_line(exc):
    return f"{type(exc).__name__}:{str(exc).splitlines()[0] if str(exc) else ''}"[:300]


class Backend:
    """What a framework must provide; see torch_alloc.py and cupy_alloc.py."""

    def meminfo(self):
        raise NotImplementedError

    def alloc(self, nbytes):
        raise NotImplementedError

    def free(self, handles):
        raise NotImplementedError

    def figure(self):
        """The framework's own count of device bytes it holds (reserved / pool total)."""
        raise NotImplementedError

    def is_oom(self, exc):
        raise NotImplementedError

    def compute(self):
        """A small computation; returns True if its result is right."""
        raise NotImplementedError


def step_meminfo(b):
    free, total = b.meminfo()
    emit("MEMINFO", free=free, total=total)


def step_compute(b):
    n = env_mb("WL_HOLD_MB", 1024)
    h = [b.alloc(n)]
    emit("ALLOC_OK", bytes=n)
    ok = b.compute()
    b.free(h)
    emit("COMPUTE_OK" if ok else "COMPUTE_FAIL", err="" if ok else "wrong_result")


def step_hold(b):
    n = env_mb("WL_HOLD_MB", 1024)
    wait_signal("hold")
    emit("ALLOC_T0", t=f"{time.time():.6f}")
    h = [b.alloc(n)]
    emit("HOLDING", bytes=b.figure(), requested=n, t=f"{time.time():.6f}")
    sys.stdin.readline()
    b.free(h)
    emit("RELEASED")


def step_grab(b):
    n = env_mb("WL_GRAB_MB", 3072)
    wait_signal("grab")
    h = []
    try:
        h.append(b.alloc(n))
        emit("GRAB", ok=1, bytes=n)
    except Exception as e:  # noqa: BLE001 - the framework decides what it raises
        if b.is_oom(e):
            emit("GRAB", ok=0, kind=type(e).__name__)
        else:
            raise
    emit("HOLDING", bytes=b.figure(), requested=n, t=f"{time.time():.6f}")
    sys.stdin.readline()
    b.free(h)
    emit("RELEASED")


def step_enforce(b):
    quota = env_mb("WL_QUOTA_MB", 4096)
    chunk = env_mb("WL_CHUNK_MB", 256)
    oom_kinds = []
    # 1. One allocation bigger than the whole quota.
    try:
        h = b.alloc(quota + 1024 * MIB)
        emit("BIG_OOM", ok=0, kind="none_granted")
        b.free([h])
    except Exception as e:  # noqa: BLE001
        if not b.is_oom(e):
            raise
        oom_kinds.append(type(e).__name__)
        emit("BIG_OOM", ok=1, kind=type(e).__name__)
    # 2. Fill the quota in chunks until refused (bounded, in case nothing refuses).
    held = []
    granted = 0
    oom = None
    limit_chunks = (quota + 2048 * MIB) // chunk
    while len(held) < limit_chunks:
        try:
            held.append(b.alloc(chunk))
            granted += chunk
        except Exception as e:  # noqa: BLE001
            if not b.is_oom(e):
                b.free(held)
                raise
            oom = type(e).__name__
            break
    emit("FILL", granted=granted, oom=1 if oom else 0, kind=oom or "none",
         figure=b.figure())
    if oom:
        oom_kinds.append(oom)
    # 3. Free everything and continue within quota.
    b.free(held)
    held = []
    emit("FREED", figure=b.figure())
    try:
        h = b.alloc(1024 * MIB)
        emit("RECOVERED_OK", bytes=1024 * MIB)
        b.free([h])
    except Exception as e:  # noqa: BLE001
        emit("RECOVERED_FAIL", err=one_line(e))
    try:
        ok = b.compute()
        emit("COMPUTE_OK" if ok else "COMPUTE_FAIL", err="" if ok else "wrong_result")
    except Exception as e:  # noqa: BLE001
        emit("COMPUTE_FAIL", err=one_line(e))
    if len(oom_kinds) == 2:
        emit("OOM_OK", kind=oom_kinds[0])
    else:
        emit("OOM_MISSING", kinds=",".join(oom_kinds) or "none")


STEPS = {
    "meminfo": step_meminfo,
    "compute": step_compute,
    "hold": step_hold,
    "grab": step_grab,
    "enforce": step_enforce,
}


def hold_on_error():
    """WL_HOLD_ON_ERROR=1: after a failure, hold until the runner has looked (see above)."""
    if os.environ.get("WL_HOLD_ON_ERROR") == "1":
        emit("HOLDING", bytes=0, error=1, t=f"{time.time():.6f}")
        sys.stdin.readline()


def main(make_backend):
    """Run the steps named in argv with the backend `make_backend()` returns."""
    emit("PID", pid=os.getpid())
    t0 = time.time()
    try:
        b = make_backend()
    except Exception as e:  # noqa: BLE001
        emit("STEP_ERROR", step="init", err=one_line(e))
        hold_on_error()
        emit("DONE", rc=2)
        return 2
    emit("INIT_OK", seconds=f"{time.time() - t0:.2f}")
    rc = 0
    for name in sys.argv[1:]:
        fn = STEPS.get(name)
        if fn is None:
            emit("STEP_ERROR", step=name, err="unknown_step")
            rc = 2
            continue
        try:
            fn(b)
        except SystemExit:
            raise
        except Exception as e:  # noqa: BLE001
            emit("STEP_ERROR", step=name, err=one_line(e))
            rc = 1
    if rc:
        hold_on_error()
    emit("DONE", rc=rc)
    return rc
