"""Tests of the acceptance runner that need no GPU: python3 -m unittest gpu/test_runner.py -v

The integration tests here run the whole runner (run_acceptance.py) against stand-ins
(gpu/testing/: nvcc = gcc + a stub CUDA runtime and driver, a fake nvidia-smi and a fake
hami-agent) for the two CUDA C workloads, including a hanging workload, for the physical group
(issue 8; with gpu/testing/fake_torch) and for the stopped-lock-holder cell. The unit tests of
the pure package gpu/acceptance/ live in test_acceptance.py, test_physical.py and
test_lockstop.py; `load_tests` below runs them too (`cargo xtask test` runs this module only).
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.dont_write_bytecode = True  # no __pycache__ next to what the GPU bundle copies

from acceptance import spec  # noqa: E402

UNIT_MODULES = ("test_acceptance", "test_physical", "test_lockstop", "test_physical2",
                "test_compute")
QUOTA = 4 << 30


def load_tests(loader, tests, pattern):
    """This module's tests, then the pure package's unit tests."""
    for name in UNIT_MODULES:
        tests.addTests(loader.loadTestsFromName(name))
    return tests


FAKES = os.path.join(HERE, "testing")


class IntegrationBase(unittest.TestCase):
    """Runs the whole runner against gcc + stub cudart, fake nvidia-smi and a fake agent."""

    def run_runner(self, extra_env=None, extra_args=(), only=("nvcc-static", "nvcc-shared"),
                   preload_name="libhami_preload.so"):
        tmp = tempfile.mkdtemp(prefix="hami-acc-test-")
        self.addCleanup(shutil.rmtree, tmp, True)
        src = os.path.join(tmp, "e.c")
        with open(src, "w") as f:
            f.write("int hami_fake_preload;\n")
        preload = os.path.join(tmp, preload_name)
        subprocess.run(["gcc", "-shared", "-fPIC", src, "-o", preload], check=True)
        self.tmp = tmp
        env = dict(os.environ)
        env["PATH"] = os.path.join(FAKES, "bin") + os.pathsep + env["PATH"]
        env.update(extra_env or {})
        port = 19000 + os.getpid() % 1000
        out = os.path.join(tmp, "out")
        t0 = time.monotonic()
        r = subprocess.run(
            [sys.executable, os.path.join(HERE, "run_acceptance.py"), "--out", out,
             "--preload", preload, "--agent", os.path.join(FAKES, "fake_agent.py"),
             "--metrics-addr", f"127.0.0.1:{port}", "--audit-seconds", "1",
             "--audit-attach-s", "0.2", "--only", *only, *extra_args],
            env=env, capture_output=True, text=True, timeout=240)
        elapsed = time.monotonic() - t0
        with open(os.path.join(out, "results.json")) as f:
            res = json.load(f)
        self.assertTrue(os.path.exists(os.path.join(out, "results.md")))
        self.assertGreater(os.path.getsize(os.path.join(out, "logs.txt")), 100)
        self.assertEqual(sorted(os.listdir(out)), ["logs.txt", "results.json", "results.md"])
        return r, res, elapsed


class Integration(IntegrationBase):
    """The standard group (two CUDA C workloads) against the stand-ins."""

    def test_green_with_fakes(self):
        r, res, elapsed = self.run_runner(extra_args=["--pairs", "10"])
        self.assertEqual(r.returncode, 0, r.stderr[-2000:])
        cells = {(c["workload"], c["check"]): c for c in res["cells"]}
        for wl in ("nvcc-static", "nvcc-shared"):
            for ch in ["native"] + spec.CHECKS:
                c = cells[(wl, ch)]
                self.assertEqual(c["status"], "pass", f"{wl}/{ch}: {c['reason']}")
        self.assertEqual(cells[("nvcc-static", "virtualised")]["figures"]["meminfo_total"], QUOTA)
        self.assertLess(cells[("nvcc-shared", "bypass")]["figures"]["latency_s"], 1.0)
        # The stub has no shared accounting, so both grabs succeed: the check must say so.
        tp = res["two_process"]
        self.assertEqual(tp["status"], "fail")
        self.assertIn("expected one grant and one OOM", tp["reason"])
        self.assertIn("NVML total 6144 MiB > quota 4096 MiB", tp["reason"])
        self.assertLess(elapsed, 120)

    def test_hanging_workload_times_out_and_runner_continues(self):
        r, res, elapsed = self.run_runner(
            extra_env={"WL_STUB_HANG": "1"},
            extra_args=["--wl-timeout", "3", "--no-bench"])
        self.assertEqual(r.returncode, 0, r.stderr[-2000:])
        cells = {(c["workload"], c["check"]): c for c in res["cells"]}
        self.assertEqual(len(cells), 10)
        for wl in ("nvcc-static", "nvcc-shared"):
            self.assertEqual(cells[(wl, "native")]["status"], "fail")
            self.assertIn("timed out", cells[(wl, "native")]["reason"])
            self.assertEqual(cells[(wl, "enforced")]["status"], "fail")
            self.assertEqual(cells[(wl, "observed")]["status"], "fail")
        # Nothing left behind: every workload process was killed.
        left = subprocess.run(["pgrep", "-f", "hami-acc-.*/cuda_alloc_"], capture_output=True,
                              text=True).stdout.split()
        self.assertEqual(left, [])
        self.assertLess(elapsed, 150)


class PhysicalIntegration(IntegrationBase):
    """`--only physical` against the stand-ins: stub driver and runtime (a quota under a fake
    hami preload unless its name says "blind"), a fake torch (gpu/testing/fake_torch), fake
    nvidia-smi (virtual sizes) and the fake agent (bypass; over_limit under a blind preload)."""

    ENV = {"PYTHONPATH": os.path.join(FAKES, "fake_torch")}

    def test_all_cells_with_fakes(self):
        tmp = tempfile.mkdtemp(prefix="hami-acc-blind-")
        self.addCleanup(shutil.rmtree, tmp, True)
        src = os.path.join(tmp, "e.c")
        with open(src, "w") as f:
            f.write("int hami_fake_blind;\n")
        blind = os.path.join(tmp, "libhami_preload_blind.so")
        subprocess.run(["gcc", "-shared", "-fPIC", src, "-o", blind], check=True)
        r, res, elapsed = self.run_runner(
            extra_env=self.ENV, only=("physical",),
            extra_args=["--blind-preload", blind, "--phys-settle-s", "0.3"])
        self.assertEqual(r.returncode, 0, r.stderr[-2000:])
        self.assertEqual(res["cells"], [])  # the standard group did not run
        cells = {(c["workload"], c["check"]): c for c in res["physical"]["cells"]}
        expected = {(row, ch) for row, chs in spec.PHYS_CELLS.items() for ch in chs}
        self.assertEqual(set(cells), expected)
        for k, c in cells.items():
            self.assertEqual(c["status"], "pass", f"{k}: {c['reason']}")
        pool = cells[("pool", "preload")]["figures"]
        self.assertEqual(pool["b_grab"]["kind"], "OutOfMemoryError")
        self.assertGreaterEqual(pool["smi_samples_with_both"], 1)
        self.assertEqual(cells[("mipmap", "preload")]["figures"]["outcome"], "refused")
        self.assertEqual(cells[("pool", "agent-blind")]["figures"]["flagged_as"], ["over_limit"])
        self.assertEqual(cells[("pre-existing", "audit")]["figures"]["audit_rc"], 2)
        self.assertIn("pool-preload", res["physical"]["smi"])
        self.assertLess(elapsed, 90)

    def test_preload_blind_to_the_paths_fails_the_preload_column(self):
        """What the H200 showed at 129056f, with stand-ins: the preload under test is blind."""
        r, res, _ = self.run_runner(
            extra_env=self.ENV, only=("physical",), preload_name="libhami_preload_blind.so",
            extra_args=["--phys-rows", "pool", "mipmap", "module-lazy", "--phys-settle-s",
                        "0.3"])
        self.assertEqual(r.returncode, 0, r.stderr[-2000:])
        cells = {(c["workload"], c["check"]): c for c in res["physical"]["cells"]}
        self.assertEqual(cells[("pool", "preload")]["status"], "fail")
        self.assertIn("B was granted", cells[("pool", "preload")]["reason"])
        self.assertIn("together > quota 4096 MiB", cells[("pool", "preload")]["reason"])
        self.assertIn("not charged", cells[("mipmap", "preload")]["reason"])
        self.assertIn("not charged", cells[("module-lazy", "preload")]["reason"])
        for row in ("pool", "mipmap", "module-lazy"):
            self.assertEqual(cells[(row, "agent-none")]["status"], "pass")
            self.assertEqual(cells[(row, "agent-blind")]["status"], "skipped")
        self.assertNotIn(("pre-existing", "audit"), cells)
        with open(os.path.join(self.tmp, "out", "results.md")) as f:
            self.assertIn("FAIL (B granted", f.read())

class Physical2Integration(IntegrationBase):
    """`--only physical2` against the stand-ins: the stub runtime sizes limits and local memory
    as the H200's driver does and refuses them past the quota under the fake preload (module
    statics are still charged after loading, as the preload at 7df65b0 did), fake torch
    processes of one region file admit under one lock, the fake nvidia-smi reports virtual
    sizes (torch: reservations) and the fake agent finds nothing for hooked processes."""

    ENV = {"PYTHONPATH": os.path.join(FAKES, "fake_torch")}

    def test_all_cells_with_fakes(self):
        r, res, elapsed = self.run_runner(
            extra_env=self.ENV, only=("physical2",),
            extra_args=["--phys-settle-s", "0.3", "--p2-hold-s", "0.5"])
        self.assertEqual(r.returncode, 0, r.stderr[-2000:])
        self.assertEqual(res["cells"], [])
        cells = {(c["workload"], c["check"]): c for c in res["physical2"]["cells"]}
        self.assertEqual(set(cells), {(row, ch) for row in spec.P2_ROWS for ch in spec.P2_CHECKS}
                         | {("launch", "cost")})
        expect_fail = {("module-lazy", "preload"), ("module-eager", "preload")}
        for row in spec.P2_ROWS:  # the native runs are watched too: each is a bypass
            self.assertEqual(cells[(row, "agent-none")]["figures"]["pids"],
                             cells[(row, "native")]["figures"].get("pids")
                             or [cells[(row, "native")]["figures"]["pid"]])
        for k, c in cells.items():
            want = "fail" if k in expect_fail else "pass"
            self.assertEqual(c["status"], want, f"{k}: {c['reason']}")
        # Charged after loading is no longer enough: the next allocation was refused.
        self.assertIn("NEXT failed with cudaErrorMemoryAllocation",
                      cells[("module-lazy", "preload")]["reason"])
        self.assertEqual(cells[("heap", "preload")]["figures"]["outcome"], "refused at SETLIMIT")
        self.assertEqual(cells[("local", "preload")]["figures"]["outcome"], "refused at LAUNCH")
        self.assertGreater(cells[("local", "native")]["figures"]["smi_mib"], 6000)
        self.assertEqual(cells[("ctx-second", "preload")]["figures"]["b_refused_at"], "grab")
        self.assertLessEqual(cells[("ctx-race", "preload")]["figures"]["smi_max_sum_mib"], 3072)
        self.assertEqual(res["physical2"]["launch"]["status"], "pass")
        with open(os.path.join(self.tmp, "out", "results.md")) as f:
            text = f.read()
        self.assertIn("## Limits, local memory, module statics, contexts", text)
        left = subprocess.run(["pgrep", "-f", "hami-acc-.*/limits_probe"], capture_output=True,
                              text=True).stdout.split()
        self.assertEqual(left, [])
        self.assertLess(elapsed, 120)

    def test_preload_blind_to_the_paths_fails(self):
        """The preload under test lets everything through (the fake does not enforce it)."""
        r, res, _ = self.run_runner(extra_env=self.ENV, only=("physical2",),
                                    preload_name="libhami_preload_blind.so",
                                    extra_args=["--p2-rows", "heap", "ctx-second",
                                                "--phys-settle-s", "0.3", "--p2-hold-s",
                                                "0.5"])
        self.assertEqual(r.returncode, 0, r.stderr[-2000:])
        cells = {(c["workload"], c["check"]): c for c in res["physical2"]["cells"]}
        self.assertEqual(len(cells), 11)
        self.assertIn("nothing was refused", cells[("heap", "preload")]["reason"])
        self.assertIn("B was granted 64 MiB", cells[("ctx-second", "preload")]["reason"])
        self.assertEqual(cells[("heap", "agent")]["status"], "fail")
        self.assertIn("over_limit", cells[("heap", "agent")]["reason"])
        self.assertEqual(cells[("heap", "within")]["status"], "pass")


class ComputeIntegration(IntegrationBase):
    """`--only compute` against the stub runtime, whose kernels sleep their spin time (100/p
    times as long under the fake preload with CUDA_DEVICE_SM_LIMIT=p, per process: no shared
    budget), a fake cmake that builds a fake HAMi-core, and the fake agent's share metric."""

    def test_all_cells_with_fakes(self):
        src = tempfile.mkdtemp(prefix="hami-core-src-")
        self.addCleanup(shutil.rmtree, src, True)
        with open(os.path.join(src, "fake_vgpu.c"), "w") as f:
            f.write('#include <stdio.h>\n__attribute__((constructor)) static void init(void) '
                    '{ fprintf(stderr, "[HAMI-core Msg(fake)]: Initializing\\n"); }\n')
        r, res, elapsed = self.run_runner(
            extra_env={"PYTHONPATH": os.path.join(FAKES, "fake_torch")}, only=("compute",),
            extra_args=["--share-seconds", "0.8", "--hami-core-src", src])
        self.assertEqual(r.returncode, 0, r.stderr[-2000:])
        cg = res["compute"]
        cells = {c["workload"]: c for c in cg["cells"]}
        self.assertEqual(set(cells), set(spec.COMPUTE_CELLS))
        self.assertGreater(cg["native"]["spin"]["rate"], 100)
        for name, limit in (("alone-30", 30), ("alone-50", 50), ("alone-70", 70),
                            ("nolimit", 100), ("graph-50", 50)):
            share = cells[name]["figures"]["share_pct"]
            self.assertLess(abs(share - limit), 15, (name, share))
        self.assertEqual(len(cells["pair-30-70"]["figures"]["shares_pct"]), 2)
        # The stub holds each process at its limit separately: one container's two 50 %
        # processes take 100 % together, and the cell says so.
        self.assertEqual(cells["two-of-50"]["status"], "fail")
        self.assertIn("together", cells["two-of-50"]["reason"])
        self.assertEqual(cells["torch-50"]["status"], "error")  # fake torch has no torch.nn
        self.assertIn("native train run failed", cells["torch-50"]["reason"])
        self.assertIn(cells["launch-nolimit"]["status"], ("pass", "fail"))
        self.assertGreaterEqual(len(cells["launch-nolimit"]["figures"]["native_us"]), 10)
        a = cells["agent-share"]["figures"]
        self.assertEqual(a["metric"], spec.AGENT_SHARE_METRICS[0])
        self.assertTrue(a["agent_values"] and all(v == 50 for v in a["agent_values"]))
        for name in ("hami-30", "hami-50"):
            self.assertEqual(cells[name]["status"], "info", cells[name]["reason"])
            self.assertEqual(cells[name]["figures"]["loaded"], "log lines")
        self.assertTrue(cg["hami_core"]["lib"].endswith("libvgpu.so"))
        with open(os.path.join(self.tmp, "out", "results.md")) as f:
            self.assertIn("## Compute shares (compute group, issue 18)", f.read())
        left = subprocess.run(["pgrep", "-f", "hami-acc-.*/compute_spin"], capture_output=True,
                              text=True).stdout.split()
        self.assertEqual(left, [])
        self.assertLess(elapsed, 120)


class CommandLine(unittest.TestCase):
    def test_unknown_only_name_is_refused(self):
        """A misspelt --only name used to select nothing and run an empty acceptance."""
        r = subprocess.run([sys.executable, os.path.join(HERE, "run_acceptance.py"), "--out",
                            os.path.join(tempfile.gettempdir(), "hami-acc-never"), "--only",
                            "nvcc-static", "lockstop"], capture_output=True, text=True,
                           timeout=30)
        self.assertEqual(r.returncode, 2)
        self.assertIn("--only: unknown name(s) lockstop (known: torch-default", r.stderr)
        self.assertIn("physical, lock-stop, physical2, compute)", r.stderr)
        self.assertFalse(os.path.exists(os.path.join(tempfile.gettempdir(), "hami-acc-never")))


class LockStopIntegration(IntegrationBase):
    """`--only lock-stop` against the stub driver's region lock (testing/stub/region_lock.h):
    bounded, the cell passes; unbounded, as in today's preload, the other processes wait for
    the stopped holder and the cell fails."""

    ARGS = ["--lock-timeout-ms", "300", "--lock-stop-s", "1.5", "--lock-workers", "2"]

    def run_lock(self, mode):
        env = {"WL_STUB_LOCK": mode, "WL_VICTIM_THREADS": "1"}
        r, res, elapsed = self.run_runner(extra_env=env, only=("lock-stop",),
                                          extra_args=self.ARGS)
        self.assertEqual(r.returncode, 0, r.stderr[-2000:])
        self.assertEqual(res["cells"], [])  # the standard group did not run
        self.assertLess(elapsed, 40)
        left = subprocess.run(["pgrep", "-f", "hami-acc-.*/lock_stop"], capture_output=True,
                              text=True).stdout.split()
        self.assertEqual(left, [])
        c = res["lock_stop"]
        f = c["figures"]
        self.assertEqual(f["holder"], "caught", c["reason"])
        self.assertGreaterEqual(f["stopped_s"], 1.5)
        self.assertEqual((f["region_used"], f["region_source"]), (0, "file"))
        self.assertEqual(len(f["workers"]), 2)
        self.assertEqual(f["bound_ms"], 300)
        self.assertGreater(f["victim"]["refused"], 0)
        self.assertEqual(f["victim"]["threads"], 1)
        with open(os.path.join(self.tmp, "out", "results.md")) as md:
            self.assertIn("## Stopped lock holder", md.read())
        return c

    def test_bounded_lock_passes(self):
        c = self.run_lock("bounded")
        self.assertEqual(c["status"], "pass", c["reason"])
        for w in c["figures"]["workers"]:
            self.assertGreaterEqual(w["max_call_ms"], 300)  # waited for the bound, then OOM
            self.assertGreaterEqual(w["oom"], 1)
            self.assertGreaterEqual(w["calls_while_stopped"], 1)

    def test_unbounded_lock_fails(self):
        c = self.run_lock("unbounded")
        self.assertEqual(c["status"], "fail")
        self.assertIn("a call blocked", c["reason"])
        for w in c["figures"]["workers"]:
            self.assertGreater(w["max_call_ms"], 1400)  # the whole stop


class Deadline(unittest.TestCase):
    def test_default_deadline(self):
        import run_acceptance
        self.assertEqual(run_acceptance.default_deadline(["physical"]), 330.0)
        self.assertEqual(run_acceptance.default_deadline(["physical", "lock-stop"]), 330.0)
        # The physical group with the issue 17/18 groups used to get 330 s too.
        self.assertEqual(run_acceptance.default_deadline(["physical", "physical2", "compute"]),
                         450.0)
        self.assertEqual(run_acceptance.default_deadline(None), 450.0)
        self.assertEqual(run_acceptance.default_deadline(["nvcc-static", "physical"]), 450.0)


class PathOptions(unittest.TestCase):
    def test_relative_library_paths_become_absolute(self):
        import argparse
        import run_acceptance
        a = argparse.Namespace(preload="b/lib.so", agent=None,
                               blind_preload="gpu-bundle/blind/libhami_preload.so",
                               python="python3")
        run_acceptance.absolute_paths(a, cwd="/work/x")
        self.assertEqual(a.blind_preload, "/work/x/gpu-bundle/blind/libhami_preload.so")
        self.assertEqual(a.preload, "/work/x/b/lib.so")
        self.assertIsNone(a.agent)
        self.assertEqual(a.python, "python3")  # a command name stays for PATH


if __name__ == "__main__":
    unittest.main()
