#!/usr/bin/env python3
"""Real-GPU acceptance runner for hami-rs (issue 5). See gpu/README.md.

One command on the GPU machine:

    python3 gpu-bundle/gpu/run_acceptance.py --out $OUT

Python 3 standard library only; torch and CuPy are imported only inside the workload
subprocesses (gpu/workloads/). Every subprocess has a timeout, the whole run has a deadline,
and results are rewritten after every step, so a crash or a hang still leaves
$OUT/results.json, $OUT/results.md and $OUT/logs.txt behind.
"""

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
try:
    from acceptance.evaluate import cell, summarize
    from acceptance.lockstop import LOCK_STOP_S
    from acceptance.report import render_markdown
    from acceptance.spec import (BYPASS_LATENCY_S, CHECKS, COMPUTE_CELLS, MIB,
                                 P2_AGENT_HOLD_S, P2_ROWS, PHYS_AGENT_SETTLE_S, PHYS_ROWS,
                                 SHARE_SECONDS, TOL_FRACTION, TOL_MIN_BYTES, WORKLOADS)
    from runner.agent import Agent
    from runner.compute import ComputePhases
    from runner.lockstop import LockStopPhase
    from runner.physical import PhysicalPhases
    from runner.physical2 import Physical2Phases
    from runner.procs import (WORKLOADS_DIR, Deadline, Log, Proc, find_first, find_libcuda,
                              libcuda_candidates, run_cmd, tail)
    from runner.standard import StandardPhases
except ImportError as e:  # a bundle made without the two packages next to this file
    sys.exit(f"run_acceptance.py: cannot import its modules ({e}): gpu/acceptance/ and "
             f"gpu/runner/ must sit next to {os.path.basename(__file__)} in {HERE}")

# `--only` names that select a group or cell rather than a workload.
GROUPS = ("physical", "lock-stop", "physical2", "compute")
# Variables that must not leak from the caller into the runs (they change what is measured).
SCRUB_ENV = [
    "LD_PRELOAD",
    "CUDA_DEVICE_MEMORY_LIMIT",
    "CUDA_DEVICE_MEMORY_SHARED_CACHE",
    "PYTORCH_CUDA_ALLOC_CONF",
    "CUDA_VISIBLE_DEVICES",
    "CUDA_MODULE_LOADING",
    "CUDA_DEVICE_SM_LIMIT",
    "GPU_CORE_UTILIZATION_POLICY",
    "CUDA_DISABLE_CONTROL",
]



class Runner(StandardPhases, PhysicalPhases, LockStopPhase, Physical2Phases, ComputePhases):
    """One acceptance run: environment, builds, the selected groups, results after each step."""

    def __init__(self, args):
        self.args = args
        self.out = os.path.abspath(args.out)
        os.makedirs(self.out, exist_ok=True)
        self.work = tempfile.mkdtemp(prefix="hami-acc-")
        self.log = Log(os.path.join(self.out, "logs.txt"))
        self.deadline = Deadline(args.deadline)
        self.t0 = time.monotonic()
        self.quota_mb = args.quota_mb
        self.quota = args.quota_mb * MIB
        bundle = os.path.dirname(HERE)
        self.bundle = bundle
        self.preload = args.preload or find_first([
            os.path.join(bundle, "libhami_preload.so"),
            os.path.join(bundle, "target", "release", "libhami_preload.so"),
        ])
        self.agent_path = args.agent or find_first([
            os.path.join(bundle, "hami-agent"),
            os.path.join(bundle, "target", "release", "hami-agent"),
        ])
        self.programs = find_first([os.path.join(bundle, "programs"),
                                    os.path.join(bundle, "testing", "programs")])
        self.python = args.python or sys.executable
        self.bins = {}
        self.results = {
            "meta": {
                "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                "quota_mb": self.quota_mb,
                "bundle": bundle,
                "preload": self.preload,
                "agent": self.agent_path,
                "tolerance": f"max({TOL_MIN_BYTES // MIB} MiB, {TOL_FRACTION:.0%})",
                "bypass_latency_limit_s": BYPASS_LATENCY_S,
            },
            "env": {},
            "builds": {},
            "cells": [],
            "two_process": None,
            "bench": {"pair": {}, "train": {}},
            "physical": None,
            "physical2": None,
            "compute": None,
            "notes": [],
        }
        self.phys_control = False
        self.agent = Agent(self.agent_path, args.metrics_addr, self.work, self.log)

    # ---- environments ----

    def base_env(self):
        env = {k: v for k, v in os.environ.items() if k not in SCRUB_ENV}
        env["PYTHONUNBUFFERED"] = "1"
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        # Never let a workload pick NVLink multicast (machine rule; harmless on one GPU).
        env.setdefault("NCCL_NVLS_ENABLE", "0")
        env.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
        env.setdefault("NVSHMEM_DISABLE_NVLS", "1")
        env["WL_QUOTA_MB"] = str(self.quota_mb)
        env["WL_HOLD_MB"] = str(self.args.hold_mb)
        return env

    def preload_env(self, region_name, extra=None):
        env = self.base_env()
        env["LD_PRELOAD"] = self.preload or "/nonexistent/libhami_preload.so"
        env["CUDA_DEVICE_MEMORY_LIMIT"] = f"{self.quota_mb}M"
        env["CUDA_DEVICE_MEMORY_SHARED_CACHE"] = os.path.join(self.work, region_name + ".cache")
        env.setdefault("LIBCUDA_LOG_LEVEL", "3")
        env.update(extra or {})
        return env

    def region_path(self, region_name):
        return os.path.join(self.work, region_name + ".cache")

    # ---- bookkeeping ----

    def add_cell(self, c):
        self.results["cells"].append(c)
        self.log.say(f"CELL {c['workload']:<17} {c['check']:<12} {c['status'].upper():<7} {c['reason']}")
        self.save()

    def note(self, msg):
        self.results["notes"].append(msg)
        self.log.say("NOTE " + msg)

    def save(self):
        self.results["meta"]["elapsed_s"] = round(time.monotonic() - self.t0, 1)
        self.results["summary"] = summarize(self.results["cells"])
        for group in ("physical", "physical2", "compute"):
            if self.results.get(group):
                ph = self.results[group]
                ph["summary"] = summarize(ph["cells"])
        for name, text in (("results.json", json.dumps(self.results, indent=1, default=str)),
                           ("results.md", render_markdown(self.results))):
            tmp = os.path.join(self.out, name + ".tmp")
            with open(tmp, "w", encoding="utf-8") as f:
                f.write(text)
            os.replace(tmp, os.path.join(self.out, name))

    def step(self, title, fn, *a):
        """Run one phase; an exception is logged and noted, never fatal."""
        if self.deadline.expired():
            self.note(f"skipped {title}: global deadline reached")
            return None
        self.log.say(f"--- {title} ({self.deadline.left():.0f}s left)")
        try:
            return fn(*a)
        except Exception:  # noqa: BLE001 - the runner must continue
            tb = traceback.format_exc()
            self.log.section(f"EXCEPTION in {title}", tb)
            self.note(f"{title} raised: {tb.strip().splitlines()[-1]}")
            return None
        finally:
            self.save()

    # ---- phases ----

    def record_env(self):
        env = self.results["env"]
        base = self.base_env()
        r = run_cmd(["nvidia-smi"], 30, env=base, log=self.log, title="nvidia-smi")
        env["nvidia_smi_rc"] = r["rc"]
        r = run_cmd(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,memory.used",
                     "--format=csv,noheader"], 30, env=base, log=self.log, title="nvidia-smi query")
        if r["rc"] == 0 and r["stdout"].strip():
            parts = [p.strip() for p in r["stdout"].strip().splitlines()[0].split(",")]
            if len(parts) >= 3:
                env["gpu"], env["driver"], env["gpu_memory_total"] = parts[0], parts[1], parts[2]
        r = run_cmd(["ldd", "--version"], 10, log=self.log, title="ldd --version")
        env["glibc"] = (r["stdout"].splitlines() or ["?"])[0]
        r = run_cmd(["uname", "-a"], 10, log=self.log, title="uname")
        env["kernel"] = r["stdout"].strip()
        nvcc = self.nvcc()
        if nvcc:
            r = run_cmd([nvcc, "--version"], 20, log=self.log, title="nvcc --version")
            env["nvcc"] = (r["stdout"].strip().splitlines() or ["?"])[-1]
        code = (
            "import sys\n"
            "try:\n import torch; print('torch', torch.__version__, torch.version.cuda, "
            "torch.cuda.is_available())\n"
            "except Exception as e: print('torch ERR', e)\n"
            "try:\n import cupy; print('cupy', cupy.__version__)\n"
            "except Exception as e: print('cupy ERR', e)\n"
        )
        r = run_cmd([self.python, "-c", code], self.deadline.cap(90), env=base, log=self.log,
                    title="python framework versions")
        for line in r["stdout"].splitlines():
            if line.startswith("torch "):
                env["torch"] = line[6:]
            elif line.startswith("cupy "):
                env["cupy"] = line[5:]
        env["python"] = self.python
        env["libcuda_all"] = libcuda_candidates()
        env["libcuda"] = env["libcuda_all"][0] if env["libcuda_all"] else None
        self.agent.libcuda = [] if self.args.no_libcuda_hint else env["libcuda_all"]
        env["btf"] = os.path.exists("/sys/kernel/btf/vmlinux")
        files = {}
        for p in (self.preload, self.agent_path):
            if p and os.path.exists(p):
                files[p] = os.path.getsize(p)
        env["bundle_files"] = files
        if not self.preload:
            self.note("libhami_preload.so not found: every preloaded cell will fail")
        if not self.agent_path:
            self.note("hami-agent not found: observed/bypass cells will fail")

    def nvcc(self):
        return find_first([shutil.which("nvcc"), "/usr/local/cuda/bin/nvcc"])

    def build(self):
        b = self.results["builds"]
        nvcc = self.nvcc()
        src = os.path.join(WORKLOADS_DIR, "cuda_alloc.cu")
        for link in ("static", "shared"):
            exe = os.path.join(self.work, f"cuda_alloc_{link}")
            if not nvcc:
                b[f"cuda_alloc_{link}"] = {"ok": False, "error": "nvcc not found"}
                continue
            ok = False
            for arch in (["-arch=sm_90"], []):
                r = run_cmd([nvcc, "-O2", *arch, "-cudart", link, f"-DWL_LINKAGE={link}", src,
                             "-o", exe], self.deadline.cap(120), log=self.log,
                            title=f"nvcc cuda_alloc {link} {arch}")
                if r["rc"] == 0 and os.path.exists(exe):
                    ok = True
                    break
            b[f"cuda_alloc_{link}"] = {"ok": ok, "error": "" if ok else tail(r["stderr"], 800)}
            if ok:
                self.bins[f"cuda_{link}"] = exe
        libcuda = self.results["env"].get("libcuda") or find_libcuda(self.log)
        if not libcuda:
            b["pair_bench"] = {"ok": False, "error": "libcuda.so.1 not found"}
            return
        libdir = os.path.dirname(libcuda)
        gcc = shutil.which("gcc") or shutil.which("cc")
        if not gcc:
            b["pair_bench"] = {"ok": False, "error": "no C compiler"}
            return
        link = [libcuda, f"-Wl,-rpath,{libdir}", "-ldl", "-lpthread"]
        exe = os.path.join(self.work, "pair_bench")
        r = run_cmd([gcc, "-O2", os.path.join(WORKLOADS_DIR, "pair_bench.c"), "-o", exe, *link],
                    60, log=self.log, title="gcc pair_bench")
        b["pair_bench"] = {"ok": r["rc"] == 0, "error": tail(r["stderr"], 800)}
        if r["rc"] == 0:
            self.bins["pair_bench"] = exe
        if self.programs and os.path.exists(os.path.join(self.programs, "cudaprobe.c")):
            exe = os.path.join(self.work, "cudaprobe")
            inc = [f"-I{d}" for d in ("/usr/local/cuda/include",) if os.path.isdir(d)]
            r = run_cmd([gcc, "-O2", *inc, os.path.join(self.programs, "cudaprobe.c"), "-o", exe,
                         *link], 60, log=self.log, title="gcc cudaprobe")
            b["cudaprobe"] = {"ok": r["rc"] == 0, "error": tail(r["stderr"], 800)}
            if r["rc"] == 0:
                self.bins["cudaprobe"] = exe

    def workload_argv(self, wl, steps):
        k = wl["kind"]
        if k == "torch":
            return [self.python, os.path.join(WORKLOADS_DIR, "torch_alloc.py"), *steps]
        if k == "cupy":
            return [self.python, os.path.join(WORKLOADS_DIR, "cupy_alloc.py"), *steps]
        exe = self.bins.get(k)
        return [exe, *steps] if exe else None

    def start(self, wl, steps, env, label):
        argv = self.workload_argv(wl, steps)
        if argv is None:
            return None, f"{wl['kind']} binary was not built"
        env = dict(env)
        env.update(wl["env"])
        try:
            budget = self.deadline.cap(self.args.wl_timeout)
            return Proc(f"{wl['name']} [{label}]", argv, env, cwd=WORKLOADS_DIR, log=self.log,
                        budget=budget), None
        except OSError as e:
            return None, f"cannot start: {e}"

    def run(self):
        a = self.args
        self.log.say(f"hami-rs acceptance: out={self.out} work={self.work} deadline={a.deadline}s")
        selected = [w for w in WORKLOADS if not a.only or w["name"] in a.only]
        # `--only physical` (alone) runs only the physical group; with workload names, both.
        standard = bool(selected)
        phys = bool(a.only) and "physical" in a.only
        lock = bool(a.only) and "lock-stop" in a.only
        phys2 = bool(a.only) and "physical2" in a.only
        comp = bool(a.only) and "compute" in a.only
        if phys2:
            self.results["physical2"] = {"cells": [], "smi": {}, "summary": {}, "launch": None}
        if comp:
            self.results["compute"] = {"cells": [], "native": {}, "summary": {},
                                       "hami_core": {}}
        if phys:
            self.results["physical"] = {"blind_preload": a.blind_preload, "cells": [],
                                        "smi": {}, "summary": {}}
        self.step("environment", self.record_env)
        if standard:
            self.step("build workloads", self.build)
        else:
            a.no_bench = True
        # Phase 1: nothing of ours running.
        for wl in selected:
            self.step(f"native {wl['name']}", self.native, wl)
        if not a.no_bench:
            self.step("bench pair native", self.bench_pair, "native", self.base_env())
            self.step("bench pair preload", self.bench_pair, "preload",
                      self.preload_env("region-bench-pair"))
            self.step("bench train native", self.bench_train, "native", self.base_env())
            self.step("bench train preload", self.bench_train, "preload",
                      self.preload_env("region-bench-train"))
        # Phase 2: the agent watches.
        started = standard and self.step("start agent", self.agent.start, self.base_env())
        if standard and not started:
            self.note(f"agent did not start: {self.agent.error}")
        try:
            if not a.no_bench and self.agent.alive():
                self.step("bench pair native+agent", self.bench_pair, "native+agent",
                          self.base_env())
                self.step("bench pair preload+agent", self.bench_pair, "preload+agent",
                          self.preload_env("region-bench-pair-agent"))
                self.step("bench train preload+agent", self.bench_train, "preload+agent",
                          self.preload_env("region-bench-train-agent"))
            for wl in selected:
                self.step(f"preload {wl['name']}", self.preloaded, wl)
            for wl in selected:
                self.step(f"bypass {wl['name']}", self.bypass, wl)
            if standard:
                self.step("two processes, one quota", self.two_process)
        finally:
            if self.agent.alive() or self.agent.proc is not None:
                self.agent.stop()
        # The physical group runs with no background agent: its cells start their own audits.
        if phys:
            self.step("physical group", self.physical)
        if phys2:
            self.step("physical2 group", self.physical2)
        if comp:
            self.step("compute group", self.compute)
        if lock:
            self.step("stopped lock holder", self.lock_stop)
            if not self.results.get("lock_stop"):
                self.lock_stop_record_cell("skipped", "not reached (deadline or earlier error)",
                                           {})
        for wl in selected:
            for ch in ["native"] + CHECKS:
                if not any(c["workload"] == wl["name"] and c["check"] == ch
                           for c in self.results["cells"]):
                    self.add_cell(cell(wl["name"], ch, "skipped",
                                       "not reached (deadline or earlier error)"))
        self.save()
        s = self.results["summary"]
        self.log.say(f"done in {self.results['meta']['elapsed_s']}s: {s}")
        if phys:
            self.log.say(f"physical group: {self.results['physical']['summary']}")
        if phys2:
            self.log.say(f"physical2 group: {self.results['physical2']['summary']}")
        if comp:
            self.log.say(f"compute group: {self.results['compute']['summary']}")
        if lock:
            self.log.say(f"stopped lock holder: {self.results['lock_stop']['status']}")
        print(render_markdown(self.results))
        return 0


def absolute_paths(args, cwd=None):
    """Makes the path options absolute: workloads run in scratch folders, where a relative
    library path would not load (LD_PRELOAD of a relative path is resolved against each
    process's own folder). A bare command name (`python3`) is left to PATH."""
    cwd = cwd or os.getcwd()
    for attr in ("preload", "agent", "blind_preload", "python", "hami_core_src", "hami_core_lib"):
        v = getattr(args, attr, None)
        if v and os.sep in v and not os.path.isabs(v):
            setattr(args, attr, os.path.normpath(os.path.join(cwd, v)))
    return args


def default_deadline(only):
    """The whole run's budget when --deadline is not given: 330 s for the physical group alone
    (or with the short lock-stop cell), else 450 s."""
    phys_only = bool(only) and set(only) <= {"physical", "lock-stop"}
    return 330.0 if phys_only and "physical" in only else 450.0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="output folder (results.json, results.md, logs.txt)")
    ap.add_argument("--quota-mb", type=int, default=4096)
    ap.add_argument("--hold-mb", type=int, default=1024)
    ap.add_argument("--grab-mb", type=int, default=3072)
    # Two processes, one quota: each asks for this much. With the quota's 4096 MiB and each
    # context charged (~520 MiB on an H200), one 2560 MiB grant fits and a second cannot.
    ap.add_argument("--pair-grab-mb", type=int, default=2560)
    ap.add_argument("--deadline", type=float, default=None,
                    help="whole-run budget in seconds (450; 330 with --only physical alone)")
    ap.add_argument("--wl-timeout", type=float, default=60.0, help="per-workload timeout (s)")
    ap.add_argument("--audit-seconds", type=int, default=6)
    ap.add_argument("--audit-attach-s", type=float, default=20.0,
                    help="longest time a fresh audit gets to attach before the workload "
                         "allocates (the wait ends as soon as it logs that it is ready)")
    ap.add_argument("--pairs", type=int, default=2000, help="pairs per bench round")
    ap.add_argument("--train-steps", type=int, default=200)
    ap.add_argument("--metrics-addr", default="127.0.0.1:9400")
    ap.add_argument("--preload", help="path of libhami_preload.so (default: in the bundle)")
    ap.add_argument("--agent", help="path of hami-agent (default: in the bundle)")
    ap.add_argument("--python", help="python for the workloads (default: this one)")
    ap.add_argument("--only", nargs="*",
                    help="workload names to run (default: all); `physical` adds the physical "
                         "group (issue 8), `lock-stop` the stopped-lock-holder cell, "
                         "`physical2` the limits/local/module/context group (issue 17), "
                         "`compute` the compute-share group (issue 18); alone they run only "
                         "those")
    ap.add_argument("--phys-rows", nargs="*", choices=PHYS_ROWS,
                    help="rows of the physical group to run (default: all)")
    ap.add_argument("--phys-settle-s", type=float, default=PHYS_AGENT_SETTLE_S,
                    help="physical group: seconds the agent gets once the workload holds")
    ap.add_argument("--blind-preload",
                    help="an older libhami_preload.so, blind to the physical escape paths: the "
                         "agent must flag them under it (over_limit or drift)")
    ap.add_argument("--lock-workers", type=int, default=3,
                    help="lock-stop: processes that keep allocating while one is stopped")
    ap.add_argument("--lock-stop-s", type=float, default=LOCK_STOP_S,
                    help="lock-stop: seconds the lock holder stays stopped")
    ap.add_argument("--lock-catch-s", type=float, default=5.0,
                    help="lock-stop: longest time spent stopping and resuming the victim until "
                         "it is stopped while holding the region lock")
    ap.add_argument("--lock-timeout-ms", type=int, default=None,
                    help="lock-stop: HAMI_LOCK_TIMEOUT_MS given to the processes (default: "
                         "as in this environment; unset there, the preload's default bound, "
                         "2000 ms, is checked)")
    ap.add_argument("--p2-rows", nargs="*", choices=P2_ROWS,
                    help="rows of the physical2 group (issue 17) to run (default: all)")
    ap.add_argument("--p2-hold-s", type=float, default=P2_AGENT_HOLD_S,
                    help="physical2: seconds a preloaded run holds under the audit")
    ap.add_argument("--compute-cells", nargs="*", choices=COMPUTE_CELLS,
                    help="cells of the compute group (issue 18) to run (default: all)")
    ap.add_argument("--share-seconds", type=float, default=SHARE_SECONDS,
                    help="compute: seconds of each throughput measurement")
    ap.add_argument("--hami-core-src",
                    help="compute: HAMi-core's source folder; it is built there with CMake "
                         "(Debug) and its 30 %% and 50 %% alone cells run side by side")
    ap.add_argument("--hami-core-lib",
                    help="compute: an already built HAMi-core libvgpu.so (instead of "
                         "--hami-core-src)")
    ap.add_argument("--no-bench", action="store_true")
    ap.add_argument("--keep-work", action="store_true", help="keep the scratch folder")
    ap.add_argument("--no-libcuda-hint", action="store_true",
                    help="do not pass --libcuda PATH to the agent (rely on its discovery)")
    args = ap.parse_args(argv)
    absolute_paths(args)
    known = [w["name"] for w in WORKLOADS] + list(GROUPS)
    unknown = [n for n in args.only or [] if n not in known]
    if unknown:
        ap.error(f"--only: unknown name(s) {', '.join(unknown)} (known: {', '.join(known)})")
    if args.deadline is None:
        args.deadline = default_deadline(args.only)
    runner = Runner(args)
    try:
        return runner.run()
    except Exception:  # noqa: BLE001 - leave whatever we have behind
        runner.log.section("FATAL", traceback.format_exc())
        runner.note("runner crashed: " + traceback.format_exc().strip().splitlines()[-1])
        runner.save()
        return 1
    finally:
        if runner.agent.proc is not None:
            runner.agent.stop()
        if not args.keep_work:
            shutil.rmtree(runner.work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
