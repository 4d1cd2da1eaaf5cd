"""The "stopped lock holder" phase (`--only lock-stop`): WL_ROLE=worker lock_stop processes
and one victim allocate and free through the preload on one region file; the victim is
SIGSTOPped while it holds the region lock (the runner stops and resumes it until the lock's
owner, read from the region file, is one of its threads) and kept stopped for --lock-stop-s.
A mixin of run_acceptance.Runner; the verdict comes from acceptance.lockstop.
"""

import os
import random
import signal
import time

from acceptance.evaluate import cell
from acceptance.lockstop import LOCK_SLACK_MS, LOCK_STOP_TITLE, eval_lock_stop, lock_bound_ms
from acceptance.region import REGION_HEADER_READ, read_region_bytes, region_lock_owner

from .procs import WORKLOADS_DIR, Proc, find_libcuda, run_cmd, tail


def thread_ids(pid):
    """Thread ids of a live process (empty when it is gone)."""
    try:
        return {int(t) for t in os.listdir(f"/proc/{pid}/task")}
    except (OSError, ValueError):
        return set()


def thread_state(pid, tid):
    """The state letter of one thread (/proc/<pid>/task/<tid>/stat), None when it is gone."""
    try:
        with open(f"/proc/{pid}/task/{tid}/stat", encoding="ascii", errors="replace") as f:
            return f.read().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return None


def is_stopped(state):
    """T: stopped by a signal (t: by a tracer)."""
    return state in ("T", "t")


def stop_fully(pid, timeout=1.0, settle=0.2):
    """SIGSTOP pid; wait until its main thread is stopped (at most `timeout`), then up to
    `settle` more for the other threads (a thread inside the kernel driver may take longer;
    whether the lock holder is stopped is checked on its own). Raises OSError when pid is
    gone, TimeoutError when its main thread did not stop."""
    os.kill(pid, signal.SIGSTOP)
    t0 = time.monotonic()
    while not is_stopped(thread_state(pid, pid)):
        if time.monotonic() - t0 > timeout:
            raise TimeoutError(f"pid {pid} not stopped {timeout} s after SIGSTOP "
                               f"(state {thread_state(pid, pid)})")
        time.sleep(0.0002)
    t1 = time.monotonic()
    while time.monotonic() - t1 < settle:
        if all(is_stopped(thread_state(pid, t)) for t in thread_ids(pid)):
            return
        time.sleep(0.0005)


class LockStopPhase:
    """The stopped-lock-holder cell."""

    def build_lock_stop(self):
        """lock_stop.cu (driver API, linked with libcuda), like mipmap_alloc."""
        b = self.results["builds"]
        nvcc = self.nvcc()
        if not nvcc:
            b["lock_stop"] = {"ok": False, "error": "nvcc not found"}
            return
        libcuda = self.results["env"].get("libcuda") or find_libcuda()
        rpath = ["-Xlinker", "-rpath", "-Xlinker", os.path.dirname(libcuda)] if libcuda else []
        cuda_root = os.path.dirname(os.path.dirname(nvcc))
        stubs = os.path.join(cuda_root, "lib64", "stubs")
        src = os.path.join(WORKLOADS_DIR, "lock_stop.cu")
        exe = os.path.join(self.work, "lock_stop")
        variants = [[src, "-o", exe, "-lcuda", *rpath],
                    [src, "-o", exe, f"-L{stubs}", "-lcuda", *rpath]]
        if libcuda:
            variants.append([src, "-o", exe, "-Xlinker", libcuda, *rpath])
        err = ""
        for v in variants:
            r = run_cmd([nvcc, "-O2", *v], self.deadline.cap(120), log=self.log,
                        title=f"nvcc lock_stop {' '.join(v)}")
            if r["rc"] == 0 and os.path.exists(exe):
                b["lock_stop"] = {"ok": True, "error": ""}
                self.bins["lock_stop"] = exe
                return
            err = tail(r["stderr"], 800)
        b["lock_stop"] = {"ok": False, "error": err}

    def lock_stop_record_cell(self, st, why, figs, stderr=""):
        c = cell("lock-stop", LOCK_STOP_TITLE, st, why, figs, stderr)
        self.results["lock_stop"] = c
        self.log.say(f"LOCK-STOP {st.upper()} {why}")
        self.save()

    def catch_holder(self, victim, region_path):
        """Stop the victim until it is stopped while holding the region lock, at most
        --lock-catch-s. Leaves it stopped either way; returns the stop record."""
        rec = {"holder": "not caught", "attempts": 0, "owner_tid": None}
        end = time.monotonic() + self.args.lock_catch_s
        fd = None
        try:
            fd = os.open(region_path, os.O_RDONLY)
        except OSError as e:
            rec["holder"], rec["why"] = "unknown", f"region file not readable: {e}"
        while True:
            rec["attempts"] += 1
            try:
                stop_fully(victim.pid)
            except (OSError, TimeoutError) as e:
                rec["error"] = f"could not stop the victim: {e}"
                break
            rec["t_stop"] = time.time()
            if fd is None:
                break  # stopped for the record; the holder cannot be known
            try:
                owner = region_lock_owner(os.pread(fd, REGION_HEADER_READ, 0))
            except (OSError, ValueError) as e:
                rec["holder"], rec["why"] = "unknown", f"region lock not readable: {e}"
                break
            if owner and owner in thread_ids(victim.pid) and is_stopped(
                    thread_state(victim.pid, owner)):
                rec["holder"], rec["owner_tid"] = "caught", owner
                break
            if time.monotonic() > end:
                rec["why"] = (f"not holding it in {rec['attempts']} stops over "
                              f"{self.args.lock_catch_s} s")
                break
            os.kill(victim.pid, signal.SIGCONT)
            time.sleep(random.uniform(0.0, 0.003))
        if fd is not None:
            os.close(fd)
        return rec

    def lock_region_used(self, region_path):
        """The region's used bytes (all devices) after every process exited: the file read
        directly (known layouts), else `hami-agent inspect`."""
        try:
            with open(region_path, "rb") as f:
                reg = read_region_bytes(f.read())
            return {"used": sum(reg["used"]), "source": "file",
                    "slots": [s for s in reg["slots"] if s["status"] != 0]}
        except (OSError, ValueError) as e:
            err = f"file: {e}"
        if self.agent_path:
            ins, ierr = self.agent.inspect(region_path, self.base_env())
            if ins is not None and ins.get("used") is not None:
                return {"used": ins["used"], "source": "inspect"}
            err += f"; inspect: {ierr or 'no used figure'}"
        return {"used": None, "error": err}

    def lock_stop(self):
        """The cell: workers and a victim on one region; the victim stopped while holding the
        lock; everything stopped with a stdin line; the region read once all exited."""
        a = self.args
        self.step("build lock_stop", self.build_lock_stop)
        exe = self.bins.get("lock_stop")
        if not exe:
            err = self.results["builds"].get("lock_stop", {}).get("error", "")
            self.lock_stop_record_cell("error", f"lock_stop was not built: {tail(err, 300)}", {})
            return
        try:
            bound = lock_bound_ms(a.lock_timeout_ms if a.lock_timeout_ms is not None
                                  else os.environ.get("HAMI_LOCK_TIMEOUT_MS"))
        except ValueError as e:
            self.lock_stop_record_cell("error", str(e), {})
            return
        region = "lock-stop"
        extra = {"LIBCUDA_LOG_LEVEL": "2", "WL_SMALL_MB": "64",
                 "WL_SLOW_MS": str(bound + LOCK_SLACK_MS)}
        if a.lock_timeout_ms is not None:
            extra["HAMI_LOCK_TIMEOUT_MS"] = str(a.lock_timeout_ms)
        procs = []
        rec = {"bound_ms": bound, "slack_ms": LOCK_SLACK_MS, "stop_s": a.lock_stop_s}
        victim = None
        try:
            for i in range(a.lock_workers + 1):
                role = "victim" if i == 0 else "worker"
                env = self.preload_env(region, dict(extra, WL_ROLE=role))
                p = Proc(f"lock-stop {role} #{i}", [exe], env, cwd=WORKLOADS_DIR, log=self.log,
                         budget=self.deadline.cap(60 + a.lock_catch_s + a.lock_stop_s))
                procs.append(p)
            victim = procs[0]
            for p in procs:
                tag, kv, _ = p.expect(["READY"], 45)
                if tag != "READY":
                    raise RuntimeError(f"{p.name}: no READY ({kv})")
            for p in procs:
                p.send("go")
            time.sleep(0.5)  # everyone in its loop
            stop = self.catch_holder(victim, self.region_path(region))
            rec["stop"] = stop
            if not stop.get("error"):
                time.sleep(a.lock_stop_s)
                stop["t_cont"] = time.time()
                os.kill(victim.pid, signal.SIGCONT)
                time.sleep(1.0)  # the victim runs again, the others go on
            for p in procs:
                p.send("stop")
            for p in procs:
                p.expect(["DONE"], bound / 1000.0 + 15)
        except (OSError, RuntimeError) as e:
            rec.setdefault("stop", {}).setdefault("error", str(e))
        finally:
            if victim is not None:
                try:
                    os.kill(victim.pid, signal.SIGCONT)  # never leave it stopped
                except OSError:
                    pass
            for p in procs:
                p.finish(10)
        rec["victim"] = {"pid": victim.wpid, "lines": list(victim.lines), "rc": victim.rc,
                         "timed_out": victim.timed_out} if victim else {}
        rec["workers"] = [{"pid": p.wpid, "lines": list(p.lines), "rc": p.rc,
                           "timed_out": p.timed_out} for p in procs[1:]]
        rec["region"] = self.lock_region_used(self.region_path(region))
        st, why, figs = eval_lock_stop(rec)
        figs["region_slots_left"] = rec["region"].get("slots")
        self.lock_stop_record_cell(st, why, figs,
                                   "".join(p.stderr_tail(400) for p in procs)[-1500:])
