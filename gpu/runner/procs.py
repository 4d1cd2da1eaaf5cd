"""Process plumbing of the acceptance runner: the run's deadline, logs.txt, subprocesses with
timeouts (killed as a group), protocol-speaking workloads (`Proc`), the nvidia-smi sampler,
and where libcuda and the built programs are.

No evaluation here (that is the pure package acceptance/).
"""

import os
import queue
import signal
import subprocess
import threading
import time

from acceptance.parse import find_tag, parse_compute_apps, parse_line, to_int
from acceptance.spec import MIB

GPU_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKLOADS_DIR = os.path.join(GPU_DIR, "workloads")


class Deadline:
    """The whole run's time budget."""

    def __init__(self, seconds):
        self.end = time.monotonic() + seconds

    def left(self):
        return self.end - time.monotonic()

    def cap(self, t, reserve=15.0):
        """A subprocess timeout: t, but never past the deadline minus a reserve."""
        return max(1.0, min(t, self.left() - reserve))

    def expired(self, reserve=15.0):
        return self.left() < reserve


class Log:
    """The one combined log file ($OUT/logs.txt), size-capped, flushed as it goes."""

    def __init__(self, path, cap=15 * MIB):
        self.path = path
        self.cap = cap
        self.size = 0
        self.lock = threading.Lock()
        self.f = open(path, "w", encoding="utf-8", errors="replace")

    def write(self, text):
        with self.lock:
            if self.size >= self.cap:
                return
            if self.size + len(text) > self.cap:
                text = text[: self.cap - self.size] + "\n[log cap reached]\n"
            self.f.write(text)
            self.f.flush()
            self.size += len(text)

    def section(self, title, body=""):
        stamp = time.strftime("%H:%M:%S")
        self.write(f"\n===== [{stamp}] {title}\n{body}")
        if body and not body.endswith("\n"):
            self.write("\n")

    def say(self, msg):
        line = f"[{time.strftime('%H:%M:%S')}] {msg}"
        print(line, flush=True)
        self.write(line + "\n")


def _kill_group(p):
    """SIGKILL the process group p leads (every workload runs in its own session)."""
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError, OSError):
        pass


def run_cmd(argv, timeout, env=None, cwd=None, log=None, title=None, stdin_text=None):
    """Run to completion with a timeout (kills the whole process group). Never raises."""
    t0 = time.monotonic()
    res = {"argv": argv, "rc": None, "stdout": "", "stderr": "", "timed_out": False}
    try:
        p = subprocess.Popen(
            argv,
            env=env,
            cwd=cwd,
            stdin=subprocess.PIPE if stdin_text is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            errors="replace",
            start_new_session=True,
        )
    except OSError as e:
        res["stderr"] = f"cannot start: {e}"
        res["seconds"] = 0.0
        if log:
            log.section(title or " ".join(map(str, argv)), res["stderr"])
        return res
    try:
        out, err = p.communicate(input=stdin_text, timeout=timeout)
        res["rc"] = p.returncode
    except subprocess.TimeoutExpired:
        _kill_group(p)
        try:
            out, err = p.communicate(timeout=5)
        except subprocess.TimeoutExpired:
            out, err = "", ""
        res["timed_out"] = True
        res["rc"] = p.returncode
    res["stdout"], res["stderr"] = out or "", err or ""
    res["seconds"] = round(time.monotonic() - t0, 3)
    if log:
        log.section(
            (title or " ".join(map(str, argv)))
            + f"  rc={res['rc']} timed_out={res['timed_out']} {res['seconds']}s",
            f"$ {' '.join(map(str, argv))}\n--- stdout\n{_cap(res['stdout'])}\n--- stderr\n{_cap(res['stderr'])}",
        )
    return res


def _cap(s, n=200_000):
    """s, cut in the middle to n characters (for logs.txt)."""
    return s if len(s) <= n else s[:n // 2] + "\n[...]\n" + s[-n // 2:]


def tail(s, n=1500):
    """The last n characters of s ("" for None)."""
    return s[-n:] if s else ""


class Proc:
    """A protocol-speaking workload: line-by-line stdout, commands on stdin."""

    def __init__(self, name, argv, env, cwd=None, log=None, budget=120.0):
        self.name = name
        self.end = time.monotonic() + budget  # no wait on this process goes past this
        self.argv = argv
        self.log = log
        self.lines = []
        self.err = []
        self.q = queue.Queue()
        self.t_start = time.time()
        self.p = subprocess.Popen(
            argv,
            env=env,
            cwd=cwd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            errors="replace",
            bufsize=1,
            start_new_session=True,
        )
        self.pid = self.p.pid
        self.timed_out = False
        threading.Thread(target=self._read_out, daemon=True).start()
        threading.Thread(target=self._read_err, daemon=True).start()
        self.rc = None

    def _read_out(self):
        for line in self.p.stdout:
            line = line.rstrip("\n")
            self.lines.append(line)
            self.q.put((time.time(), line))
        self.q.put((time.time(), None))

    def _read_err(self):
        for line in self.p.stderr:
            self.err.append(line)

    def expect(self, tags, timeout):
        """Wait for the next line whose tag is in tags. Returns (tag, kv, t) or (None, reason, t)."""
        end = min(time.monotonic() + timeout, self.end)
        while True:
            left = end - time.monotonic()
            if left <= 0:
                self.timed_out = True
                return None, "timeout waiting for " + "/".join(tags), time.time()
            try:
                t, line = self.q.get(timeout=left)
            except queue.Empty:
                continue
            if line is None:
                self.q.put((t, None))  # keep EOF visible for later calls
                return None, "process ended before " + "/".join(tags), t
            tag, kv = parse_line(line)
            if tag in tags:
                return tag, kv, t

    def send(self, text="go"):
        try:
            self.p.stdin.write(text + "\n")
            self.p.stdin.flush()
            return True
        except (BrokenPipeError, OSError, ValueError):
            return False

    def finish(self, timeout):
        """Close stdin, wait for exit (kill the group on timeout), log everything."""
        try:
            self.p.stdin.close()
        except (BrokenPipeError, OSError):
            pass
        try:
            self.rc = self.p.wait(timeout=max(1.0, min(timeout, self.end - time.monotonic())))
        except subprocess.TimeoutExpired:
            self.timed_out = True
            _kill_group(self.p)
            try:
                self.rc = self.p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.rc = None
        time.sleep(0.05)  # let the reader threads drain
        if self.log:
            self.log.section(
                f"{self.name}: pid={self.pid} rc={self.rc} timed_out={self.timed_out} "
                f"{time.time() - self.t_start:.1f}s",
                f"$ {' '.join(map(str, self.argv))}\n--- stdout\n" + "\n".join(self.lines)
                + "\n--- stderr\n" + _cap("".join(self.err)),
            )
        return self.rc

    def stderr_tail(self, n=1500):
        return tail("".join(self.err), n)

    @property
    def wpid(self):
        """The workload's own pid (its PID line), else the pid we started."""
        kv = find_tag(list(self.lines), "PID")
        return to_int(kv.get("pid"), self.pid) if kv else self.pid

    def kill(self):
        _kill_group(self.p)


SMI_APPS_ARGV = ["nvidia-smi", "--query-compute-apps=pid,used_memory",
                 "--format=csv,noheader,nounits"]


class SmiSampler:
    """`nvidia-smi --query-compute-apps` (unpreloaded: the driver's own per-process figures)
    sampled in a background thread, plus labelled samples taken on demand."""

    def __init__(self, env, period=0.25):
        self.env = env
        self.period = period
        self.samples = []
        self.t0 = time.monotonic()
        self.stop_ev = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def start(self):
        self.thread.start()
        return self

    def _loop(self):
        while not self.stop_ev.is_set():
            self.sample()
            self.stop_ev.wait(self.period)

    def sample(self, label=None):
        """One sample: {"t", "apps": {pid: MiB} or None, "label"?, "error"?}."""
        r = run_cmd(SMI_APPS_ARGV, 15, env=self.env)
        s = {"t": round(time.monotonic() - self.t0, 2),
             "apps": parse_compute_apps(r["stdout"]) if r["rc"] == 0 else None}
        if label:
            s["label"] = label
        if r["rc"] != 0:
            s["error"] = f"rc={r['rc']} timed_out={r['timed_out']} {tail(r['stderr'], 200)}"
        self.samples.append(s)
        return s

    def stop(self):
        self.stop_ev.set()
        self.thread.join(timeout=20)

    def compact(self, pids):
        """The samples restricted to pids (for results.json)."""
        out = []
        for s in self.samples:
            c = {k: v for k, v in s.items() if k != "apps"}
            if s["apps"] is not None:
                c["mib"] = {str(p): s["apps"].get(p) for p in pids}
            out.append(c)
        return out


# --------------------------------------------------------------------------------------------
# The agent
# --------------------------------------------------------------------------------------------


def read_text(path):
    """The file's text, "" when it cannot be read."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def find_first(paths):
    """The first of paths that exists, or None."""
    for p in paths:
        if p and os.path.exists(p):
            return p
    return None


def libcuda_candidates():
    """Every existing real libcuda.so.1 we know of (ldconfig -p first, then the known places)."""
    r = run_cmd(["ldconfig", "-p"], 10)
    cands = []
    for line in r["stdout"].splitlines():
        if "libcuda.so.1" in line and "=>" in line and "x86-64" in line:
            cands.append(line.split("=>", 1)[1].strip())
    cands += [
        "/usr/local/nvidia/lib64/libcuda.so.1",
        "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
        "/lib/libcuda.so.1",
        "/usr/lib64/libcuda.so.1",
        "/usr/local/cuda/lib64/stubs/libcuda.so",
    ]
    out = []
    for c in cands:  # never the toolkit's stub: it is not the driver
        if os.path.exists(c) and "stubs" not in c and c not in out:
            out.append(c)
    return out


def find_libcuda(log=None):
    """Path of the real libcuda.so.1 to link against, or None."""
    c = libcuda_candidates()
    return c[0] if c else None
