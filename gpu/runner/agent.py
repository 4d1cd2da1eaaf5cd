"""The agent as the runner uses it: the background `hami-agent run` (its /metrics) and the
one-shot `audit --json` and `inspect --json` runs. Their output is parsed by acceptance.parse.
"""

import os
import signal
import subprocess
import tempfile
import time
import urllib.request

from acceptance.parse import parse_audit_json, parse_inspect_json, parse_prometheus

from .procs import _cap, _kill_group, run_cmd, tail


class Agent:
    """The background `hami-agent run` and the one-shot queries against it."""

    def __init__(self, path, metrics_addr, workdir, log):
        self.path = path
        self.addr = metrics_addr
        self.workdir = workdir
        self.log = log
        self.proc = None
        self.logfile = os.path.join(workdir, "agent.log")
        self.error = None
        self.libcuda = []

    def start(self, env, ready_timeout=30.0):
        if not self.path or not os.path.exists(self.path):
            self.error = f"agent binary not found ({self.path})"
            return False
        # Per-process series are opt-in (hami-user/src/metrics.rs): observe() reads them.
        argv = [self.path, "run", "--metrics-addr", self.addr, "--per-process-metrics",
                *self.libcuda_args()]
        self.log.say("starting agent: " + " ".join(argv))
        f = open(self.logfile, "w")
        try:
            self.proc = subprocess.Popen(
                argv, env=env, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        except OSError as e:
            self.error = f"cannot start agent: {e}"
            return False
        finally:
            f.close()
        end = time.monotonic() + ready_timeout
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                self.error = f"agent exited rc={self.proc.returncode}: {tail(self.read_log(), 800)}"
                return False
            if self.metrics_text(timeout=1.0) is not None:
                time.sleep(1.0)  # let the probes settle after the endpoint answers
                self.log.say("agent ready (metrics endpoint answers)")
                return True
            time.sleep(0.25)
        self.error = f"agent /metrics did not answer within {ready_timeout}s"
        return False

    def libcuda_args(self):
        """`--libcuda PATH` for every libcuda file here, so that probes are on before the first
        workload maps it (the agent dedupes by device + inode and keeps discovering)."""
        out = []
        for c in self.libcuda:
            out += ["--libcuda", c]
        return out

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def metrics_text(self, timeout=2.0):
        try:
            with urllib.request.urlopen(f"http://{self.addr}/metrics", timeout=timeout) as r:
                return r.read().decode("utf-8", "replace")
        except Exception:  # noqa: BLE001 - any failure means "not available"
            return None

    def metrics(self):
        t = self.metrics_text()
        return parse_prometheus(t) if t is not None else None

    def audit_start(self, seconds, env):
        """Start `hami-agent audit --seconds N --json` in the background; returns a handle."""
        argv = [self.path, "audit", "--seconds", str(seconds), "--json", *self.libcuda_args()]
        out = tempfile.NamedTemporaryFile("w+", dir=self.workdir, delete=False, suffix=".audit")
        err = tempfile.NamedTemporaryFile("w+", dir=self.workdir, delete=False, suffix=".err")
        p = subprocess.Popen(argv, env=env, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                             start_new_session=True)
        return {"p": p, "out": out, "err": err, "argv": argv, "seconds": seconds,
                "t0": time.monotonic()}

    def audit_wait(self, h, title):
        """Wait for an audit started by audit_start; returns (parsed or None, error or None)."""
        try:
            h["p"].wait(timeout=h["seconds"] + 20)
        except subprocess.TimeoutExpired:
            _kill_group(h["p"])
            h["p"].wait(timeout=5)
        h["out"].seek(0)
        h["err"].seek(0)
        out, err = h["out"].read(), h["err"].read()
        for f in (h["out"], h["err"]):
            f.close()
            os.unlink(f.name)
        self.log.section(f"{title}: audit rc={h['p'].returncode}",
                         f"$ {' '.join(h['argv'])}\n--- stdout\n{_cap(out)}\n--- stderr\n{_cap(err)}")
        try:
            return parse_audit_json(out), None
        except (ValueError, TypeError, AttributeError) as e:
            return None, f"audit output unparsable ({e}); rc={h['p'].returncode} stderr: {tail(err, 400)}"

    def audit_stop(self, h, title, timeout=20.0):
        """End an audit started by audit_start now (SIGINT: it reports what it saw so far and
        exits with its status). Returns (parsed or None, error or None, exit status)."""
        if h["p"].poll() is None:
            try:
                os.killpg(h["p"].pid, signal.SIGINT)
            except OSError:
                pass
        h["seconds"] = max(0.0, timeout - 20)  # audit_wait waits seconds + 20
        parsed, err = self.audit_wait(h, title)
        return parsed, err, h["p"].returncode

    def inspect(self, region, env):
        r = run_cmd([self.path, "inspect", region, "--json"], 20, env=env, log=self.log,
                    title="agent inspect")
        try:
            return parse_inspect_json(r["stdout"]), None
        except (ValueError, TypeError, AttributeError) as e:
            return None, f"inspect output unparsable ({e}): {tail(r['stderr'], 300)}"

    def stop(self):
        if self.proc is None:
            return
        for sig, wait in ((signal.SIGINT, 5), (signal.SIGTERM, 3), (signal.SIGKILL, 3)):
            if self.proc.poll() is not None:
                break
            try:
                os.killpg(self.proc.pid, sig)
            except OSError:
                pass
            try:
                self.proc.wait(timeout=wait)
            except subprocess.TimeoutExpired:
                pass
        self.log.section(f"agent log (rc={self.proc.returncode})", _cap(self.read_log(), 2_000_000))
        self.proc = None

    def read_log(self):
        try:
            with open(self.logfile, encoding="utf-8", errors="replace") as f:
                return f.read()
        except OSError:
            return ""
