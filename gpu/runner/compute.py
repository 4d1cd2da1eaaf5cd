"""The compute group's phases (issue 18, `--only compute`): CUDA_DEVICE_SM_LIMIT, measured as
throughput against native throughput in the same run; HAMi-core side by side when its
sources are given. A mixin of run_acceptance.Runner.

It launches processes and gathers figures; every verdict comes from acceptance.compute.
"""

import os
import shutil
import threading
import time

from acceptance.compute import (agent_share_values, eval_agent_share, eval_borrow_back,
                                eval_default_alone,
                                eval_default_together, eval_hami, eval_latency,
                                eval_launch_cost, eval_share, eval_together, hami_loaded,
                                native_reference, parse_latency, parse_launch, parse_result,
                                parse_seconds, second_shares, share_pct)
from acceptance.evaluate import cell
from acceptance.parse import find_tag, parse_prometheus, to_int
from acceptance.spec import (AGENT_SHARE_SECONDS, AGENT_SHARE_WINDOW_SECONDS, COMPUTE_CELLS,
                             COMPUTE_MEM_LIMIT_MB, SHARE_TOL_POINTS)

from .procs import WORKLOADS_DIR, find_libcuda, run_cmd, tail

HAMI_MEM_LIMIT = "16g"  # HAMi-core's spelling; its cudaMemGetInfo total then is 16 GiB
HAMI_MEM_LIMIT_BYTES = 16 << 30


class ComputePhases:
    """The compute group: shares alone, together, with a neighbour, within one container,
    torch, graphs, launch cost, the agent's share, HAMi-core."""

    def add_compute_cell(self, c):
        self.results["compute"]["cells"].append(c)
        self.log.say(f"COMPUTE {c['workload']:<15} {c['status'].upper():<7} {c['reason']}")
        self.save()

    def sm_env(self, region, limit, extra=None):
        """A container at `limit` percent (None: no CUDA_DEVICE_SM_LIMIT) under the preload,
        policy `force` unless `extra` names another (issue 30: `default` lends idle time when
        the agent's arbiter runs)."""
        ex = {"WL_SECONDS": str(self.args.share_seconds),
              "GPU_CORE_UTILIZATION_POLICY": "force"}
        if limit is not None:
            ex["CUDA_DEVICE_SM_LIMIT"] = str(limit)
        ex.update(extra or {})
        return self.phys_env(self.preload, region, COMPUTE_MEM_LIMIT_MB, ex)

    def native_env(self, extra=None):
        env = self.base_env()
        env["WL_SECONDS"] = str(self.args.share_seconds)
        env.update(extra or {})
        return env

    def spin_argv(self, mode):
        if mode == "train":
            return [self.python, os.path.join(WORKLOADS_DIR, "compute_train.py")]
        exe = self.bins.get("compute_spin")
        return [exe, mode] if exe else None

    def run_together(self, specs, seconds, delays=None):
        """Start every (label, mode, env) process, wait until all are READY, tell them to go
        at the same moment (or each `delays[i]` seconds after the first), gather their
        lines. Returns [(parsed RESULT or None, proc or None, note)]."""
        procs = []
        for label, mode, env in specs:
            argv = self.spin_argv(mode)
            if argv is None:
                procs.append((None, self.not_built("compute_spin")))
                continue
            p, err = self.phys_proc(label, argv, env, budget=seconds + 120)
            procs.append((p, err))
        ready = []
        for p, _ in procs:
            if p is None:
                continue
            tag, kv, _ = p.expect(["READY", "DONE"], 90)
            if tag == "READY":
                ready.append(p)
        t0 = time.monotonic()
        for i, (p, _) in enumerate(procs):
            if p not in ready:
                continue
            if delays:
                time.sleep(max(0.0, t0 + delays[i] - time.monotonic()))
            p.send("go")
        out = []
        for p, err in procs:
            if p is None:
                out.append((None, None, err))
                continue
            note = ""
            if p in ready:
                tag, kv, _ = p.expect(["RESULT", "DONE"], seconds + 60)
                if tag != "RESULT":
                    note = f"no RESULT ({kv})"
            else:
                note = "never READY"
            p.expect(["DONE"], 10)
            p.finish(10)
            res = parse_result(p.lines)
            if res is None and note:
                res = {"error": note + ("; " + tail(p.stderr_tail(), 300) if p.err else "")}
            out.append((res, p, note))
        return out

    def share_cell(self, name, specs, judge, seconds=None):
        """Run specs together and record cell `name`, judged by judge(results) ->
        (status, reason, figures)."""
        seconds = seconds or self.args.share_seconds
        got = self.run_together(specs, seconds)
        results = [r for r, _, _ in got]
        st, why, figs = judge(results)
        figs["pids"] = [p.wpid for _, p, _ in got if p is not None]
        notes = [n for _, _, n in got if n]
        if notes:
            why = (why + "; " if why else "") + "; ".join(notes)
        err = "".join(p.stderr_tail(500) for _, p, _ in got if p is not None)
        self.add_compute_cell(cell(name, "share", st, why, figs, err))
        return got

    def native_rate(self, mode, label):
        """The native throughput alone for mode (spin, graph, train): parsed RESULT."""
        env = self.native_env()
        got = self.run_together([(f"compute native {label}", mode, env)], self.args.share_seconds)
        res = got[0][0]
        self.results["compute"]["native"][label] = res
        self.save()
        return res

    # ---- launch cost (also used by physical2) ----

    def launch_cost(self, pre_env, label):
        """Empty kernel, no limit: native and preloaded processes alternated (native,
        preload, native, preload), WL_ROUNDS rounds each; evaluated by eval_launch_cost."""
        exe = self.bins.get("compute_spin")
        if not exe:
            return "error", self.not_built("compute_spin"), {}
        rounds = {"native": [], "preload": []}
        errors = []
        for i in range(2):
            for side, env in (("native", self.base_env()), ("preload", dict(pre_env))):
                p, err = self.phys_proc(f"{label} launch {side} {i}", [exe, "launch"], env,
                                        budget=60)
                if p is None:
                    errors.append(f"{side}: {err}")
                    continue
                tag, kv, _ = p.expect(["READY", "DONE"], 45)
                if tag == "READY":
                    p.send("go")
                    p.expect(["RESULT"], 45)
                p.expect(["DONE"], 10)
                p.finish(10)
                r, e = parse_launch(p.lines)
                rounds[side] += r
                if e:
                    errors.append(f"{side} process {i}: {e}")
        return eval_launch_cost(rounds["native"], rounds["preload"], errors)

    # ---- the agent's share ----

    def agent_share_cell(self, native):
        """The 50 % cell again while `hami-agent run` watches; its container share read from
        /metrics once the agent's share window lies wholly inside the run."""
        name = "agent-share"
        secs = max(AGENT_SHARE_SECONDS, self.args.share_seconds)
        started = self.agent.start(self.base_env())
        if not started:
            self.add_compute_cell(cell(name, "agent", "skipped",
                                       f"agent did not start: {self.agent.error}"))
            return
        region = self.region_path("cmp-agent-50")
        polls, stop = [], threading.Event()

        def poll():
            while not stop.is_set():
                t = self.agent.metrics_text(timeout=1.0)
                if t is not None:
                    polls.append((time.monotonic(), parse_prometheus(t)))
                stop.wait(0.5)

        th = threading.Thread(target=poll, daemon=True)
        try:
            th.start()
            t_go = time.monotonic()
            got = self.run_together([("compute agent-share 50", "spin",
                                      self.sm_env("cmp-agent-50", 50,
                                                  {"WL_SECONDS": str(secs)}))], secs)
        finally:
            stop.set()
            th.join(timeout=5)
            self.agent.stop()
        res = got[0][0]
        runner = share_pct(res.get("rate"), native) if res and not res.get("error") else None
        metric, values = None, []
        # Polls whose agent window lies wholly inside the run (or its second half, if shorter).
        t_start = t_go + max(secs / 2.0, min(AGENT_SHARE_WINDOW_SECONDS + 0.5, secs - 1.5))
        for t, samples in polls:
            m, v = agent_share_values(samples, region)
            if m:
                metric = m
                if t >= t_start and v is not None:
                    values.append(v)
        st, why, figs = eval_agent_share(runner, values, metric)
        names = sorted({n for _, s in polls[-1:] for n, _, _ in s if "compute" in n or
                        "share" in n or "sm_" in n})
        figs["compute_metric_names_seen"] = names[:20]
        figs["polls"] = len(polls)
        self.add_compute_cell(cell(name, "agent", st, why, figs))

    # ---- issue 30: default with the agent's arbiter, priorities ----

    def with_agent(self, names, fn):
        """Runs fn() while `hami-agent run` (the GPU's arbiter) watches; the cells `names`
        are skipped when there is no agent or it does not start."""
        if not self.agent_path:
            for c in names:
                self.add_compute_cell(cell(c, "arbiter", "skipped", "hami-agent not found"))
            return
        if not self.agent.start(self.base_env()):
            for c in names:
                self.add_compute_cell(cell(c, "arbiter", "skipped",
                                           f"agent did not start: {self.agent.error}"))
            return
        try:
            # The agent decides at its ticks (250 ms): let it find nothing first.
            time.sleep(0.5)
            fn()
        finally:
            self.agent.stop()

    def default_cells(self, sel, n):
        """default-alone-30, default-30-50 and priority-latency under one agent."""
        dflt = {"GPU_CORE_UTILIZATION_POLICY": "default"}
        secs = max(3.0, self.args.share_seconds)

        def run():
            if "default-alone-30" in sel:
                got = self.run_together([("compute default alone 30", "spin",
                                          self.sm_env("cmp-dflt-alone-30", 30,
                                                      dict(dflt, WL_SECONDS=str(secs))))],
                                        secs)
                res, p, _ = got[0]
                st, why, figs = eval_default_alone(res, parse_seconds(p.lines) if p else [], n)
                self.add_compute_cell(cell("default-alone-30", "arbiter", st, why, figs))
            if "default-30-50" in sel:
                got = self.run_together(
                    [("compute default 30", "spin",
                      self.sm_env("cmp-dflt-30", 30, dict(dflt, WL_SECONDS=str(secs)))),
                     ("compute default 50", "spin",
                      self.sm_env("cmp-dflt-50", 50, dict(dflt, WL_SECONDS=str(secs))))], secs)
                st, why, figs = eval_default_together([r for r, _, _ in got], [30, 50], n)
                figs["per_second_pct"] = [second_shares(parse_seconds(p.lines), n)
                                          for _, p, _ in got if p]
                self.add_compute_cell(cell("default-30-50", "arbiter", st, why, figs))
            # Issue 30's turns: the force pairs again, with the arbiter giving each busy
            # container its window of every 40 ms (without it, pair-30-70 and pair-50-50).
            for name, lims in (("arb-pair-30-70", (30, 70)), ("arb-pair-50-50", (50, 50))):
                if name not in sel:
                    continue
                got = self.run_together(
                    [(f"compute {name} {chr(97 + i)}", "spin",
                      self.sm_env(f"cmp-{name}-{chr(97 + i)}", lim, {"WL_SECONDS": str(secs)}))
                     for i, lim in enumerate(lims)], secs)
                st, why, figs = eval_together([r for r, _, _ in got], list(lims), n, "each")
                figs["per_second_pct"] = [second_shares(parse_seconds(p.lines), n)
                                          for _, p, _ in got if p]
                self.add_compute_cell(cell(name, "arbiter", st, why, figs))
            if "default-borrow-back" in sel:
                # The 30 % one alone for 2 s (lent the GPU), then a 50 % one: both within
                # 1 s at 37.5 / 62.5.
                delay = 2
                got = self.run_together(
                    [("compute borrow 30", "spin",
                      self.sm_env("cmp-borrow-30", 30, dict(dflt, WL_SECONDS=str(delay + 3)))),
                     ("compute newcomer 50", "spin",
                      self.sm_env("cmp-borrow-50", 50, dict(dflt, WL_SECONDS="3")))],
                    delay + 3, delays=[0, delay])
                secs_of = [parse_seconds(p.lines) if p else [] for _, p, _ in got]
                st, why, figs = eval_borrow_back(secs_of[0], secs_of[1], n, delay, [30, 50])
                self.add_compute_cell(cell("default-borrow-back", "arbiter", st, why, figs))
            if "priority-latency" in sel:
                self.priority_cell(dflt, secs)

        names = [c for c in ("default-alone-30", "default-30-50", "arb-pair-30-70",
                             "arb-pair-50-50", "default-borrow-back", "priority-latency")
                 if c in sel]
        if names:
            self.with_agent(names, run)

    def priority_cell(self, dflt, secs):
        """The loop alone (native), then at priority 0 (default, 30 %) beside a busy
        priority-1 training container (default, 50 %) that runs 2 s longer: p99 against
        alone; the low container's per-second throughput shows it held, then resumed."""
        lat = {"WL_SECONDS": str(secs), "WL_LAT_SKIP_S": "1"}
        alone = self.run_together([("compute latency alone", "latency",
                                    self.native_env(lat))], secs)
        a = parse_latency(alone[0][1].lines) if alone[0][1] else None
        got = self.run_together(
            [("compute latency high", "latency",
              self.sm_env("cmp-prio-high", 30, dict(dflt, CUDA_TASK_PRIORITY="0", **lat))),
             ("compute latency low", "spin",
              self.sm_env("cmp-prio-low", 50, dict(dflt, CUDA_TASK_PRIORITY="1",
                                                   WL_SECONDS=str(secs + 2))))], secs + 2)
        (hr, hp, _), (lr, lp, _) = got
        b = parse_latency(hp.lines) if hp else None
        st, why, figs = eval_latency(a, b, lr)
        figs["low_kernels_per_second"] = parse_seconds(lp.lines) if lp else []
        self.add_compute_cell(cell("priority-latency", "arbiter", st, why, figs))

    # ---- HAMi-core ----

    def hami_build(self):
        """Build HAMi-core from --hami-core-src with CMake (Debug: gpu-facts.md says its Debug
        build enforced its limits); returns the path of libvgpu.so or None (reason noted)."""
        rec = self.results["compute"]["hami_core"]
        if self.args.hami_core_lib:
            rec["lib"] = self.args.hami_core_lib
            return self.args.hami_core_lib if os.path.exists(self.args.hami_core_lib) else None
        src = self.args.hami_core_src
        rec["src"] = src
        if not src or not os.path.isdir(src):
            rec["error"] = f"--hami-core-src {src} is not a folder"
            return None
        cmake = shutil.which("cmake")
        if not cmake:
            rec["error"] = "cmake not found"
            return None
        build = os.path.join(self.work, "hami-core-build")
        nvcc = self.nvcc()
        cuda_root = os.path.dirname(os.path.dirname(nvcc)) if nvcc else "/usr/local/cuda"
        env = self.base_env()
        env["CUDA_HOME"] = cuda_root
        libcuda = self.results["env"].get("libcuda") or find_libcuda()
        libdirs = [os.path.join(cuda_root, "lib64", "stubs"), os.path.join(cuda_root, "lib64")]
        if libcuda:
            libdirs.insert(0, os.path.dirname(libcuda))
        env["LIBRARY_PATH"] = os.pathsep.join(libdirs + [env.get("LIBRARY_PATH", "")]).rstrip(
            os.pathsep)
        if nvcc:
            env["CUDACXX"] = nvcc
            env["PATH"] = os.path.dirname(nvcc) + os.pathsep + env.get("PATH", "")
        r = run_cmd([cmake, "-S", src, "-B", build, "-DCMAKE_BUILD_TYPE=Debug",
                     "-DCMAKE_POLICY_VERSION_MINIMUM=3.5", f"-DCUDA_TOOLKIT_ROOT_DIR={cuda_root}"],
                    self.deadline.cap(120), env=env,
                    log=self.log, title="HAMi-core cmake configure")
        if r["rc"] != 0:
            rec["error"] = "cmake configure failed: " + tail(r["stderr"] or r["stdout"], 600)
            return None
        jobs = str(max(2, os.cpu_count() or 2))
        r = run_cmd([cmake, "--build", build, "--target", "vgpu", "-j", jobs],
                    self.deadline.cap(240), env=env, log=self.log, title="HAMi-core build")
        lib = None
        for dirpath, _, files in os.walk(build):
            if "libvgpu.so" in files:
                lib = os.path.join(dirpath, "libvgpu.so")
                break
        rec["build_rc"] = r["rc"]
        if not lib:
            rec["error"] = "no libvgpu.so built: " + tail(r["stderr"] or r["stdout"], 600)
            return None
        rec["lib"] = lib
        return lib

    def hami_cell(self, lib, limit, native):
        name = f"hami-{limit}"
        env = self.base_env()
        env.update({"LD_PRELOAD": lib, "CUDA_DEVICE_SM_LIMIT": str(limit),
                    "CUDA_DEVICE_MEMORY_LIMIT": HAMI_MEM_LIMIT,
                    "CUDA_DEVICE_MEMORY_SHARED_CACHE": self.region_path(f"hami-{limit}"),
                    "LIBCUDA_LOG_LEVEL": "2", "WL_SECONDS": str(self.args.share_seconds)})
        got = self.run_together([(f"compute {name}", "spin", env)], self.args.share_seconds)
        res, p, note = got[0]
        lines = p.lines if p is not None else []
        mi = find_tag(lines, "MEMINFO") or {}
        loaded = hami_loaded("".join(p.err) if p is not None else "", to_int(mi.get("total")),
                             HAMI_MEM_LIMIT_BYTES)
        st, why, figs = eval_hami(res, native, limit, loaded)
        figs["meminfo_total"] = to_int(mi.get("total"))
        if note:
            why = (why + "; " if why else "") + note
        self.add_compute_cell(cell(name, "reference", st, why, figs,
                                   p.stderr_tail(800) if p is not None else ""))

    # ---- the group ----

    def compute(self):
        """The whole group; every cell bounded, the run's deadline skips what is left."""
        cg = self.results["compute"]
        sel = [c for c in COMPUTE_CELLS if not self.args.compute_cells
               or c in self.args.compute_cells]
        cg["selected"] = sel
        cg["seconds"] = self.args.share_seconds
        cg["tolerance_points"] = SHARE_TOL_POINTS
        if not self.preload:
            self.note("libhami_preload.so not found: the compute cells will fail")
        self.step("build compute workloads", self.build_cudart, "compute_spin",
                  "compute_spin.cu")
        ref = {}

        def native_spin():
            r = self.native_rate("spin", "spin")
            ref["spin"], info = native_reference([r])
            cg["native"]["spin_info"] = info

        self.step("compute native spin", native_spin)
        n = ref.get("spin")

        def alone(name, region, limit):
            lim = 100 if limit is None else limit
            self.share_cell(name, [(f"compute {name}", "spin", self.sm_env(region, limit))],
                            lambda rs: eval_share(rs[0], n, lim))

        plan = []
        if "nolimit" in sel:
            plan.append(("nolimit", alone, ("nolimit", "cmp-nolimit", None)))
        for lim in (30, 50, 70):
            if f"alone-{lim}" in sel:
                plan.append((f"alone-{lim}", alone, (f"alone-{lim}", f"cmp-alone-{lim}", lim)))
        if "pair-30-70" in sel:
            plan.append(("pair-30-70", self.share_cell, (
                "pair-30-70",
                [("compute pair 30", "spin", self.sm_env("cmp-pair-30", 30)),
                 ("compute pair 70", "spin", self.sm_env("cmp-pair-70", 70))],
                lambda rs: eval_together(rs, [30, 70], n, "each"))))
        if "neighbour-30" in sel:
            plan.append(("neighbour-30", self.share_cell, (
                "neighbour-30",
                [("compute neighbour 30", "spin", self.sm_env("cmp-neigh-30", 30)),
                 ("compute neighbour native", "spin", self.native_env())],
                lambda rs: eval_together(rs, [30, None], n, "each"))))
        if "pair-50-50" in sel:
            plan.append(("pair-50-50", self.share_cell, (
                "pair-50-50",
                [("compute pair 50 a", "spin", self.sm_env("cmp-pair-50a", 50)),
                 ("compute pair 50 b", "spin", self.sm_env("cmp-pair-50b", 50))],
                lambda rs: eval_together(rs, [50, 50], n, "cap"))))
        if "two-of-50" in sel:
            plan.append(("two-of-50", self.share_cell, (
                "two-of-50",
                [("compute two-of-50 a", "spin", self.sm_env("cmp-two-50", 50)),
                 ("compute two-of-50 b", "spin", self.sm_env("cmp-two-50", 50))],
                lambda rs: eval_together(rs, [50, 50], n, "sum"))))
        for name, fn, a in plan:
            self.step(f"compute {name}", fn, *a)
        for name, mode in (("graph-50", "graph"), ("torch-50", "train")):
            if name not in sel:
                continue

            def run(name=name, mode=mode):
                nat = self.native_rate(mode, mode)
                nr, _ = native_reference([nat])
                if nr is None:
                    why = (nat or {}).get("error") or "no native RESULT"
                    self.add_compute_cell(cell(name, "share", "error",
                                               f"native {mode} run failed: {why}"))
                    return
                self.share_cell(name, [(f"compute {name}", mode,
                                        self.sm_env(f"cmp-{name}", 50))],
                                lambda rs: eval_share(rs[0], nr, 50))

            self.step(f"compute {name}", run)
        streams = [c for c in ("streams4-30", "streams4-50") if c in sel]
        if streams:
            def run_streams():
                nat = self.native_rate("streams", "streams4")
                ns, _ = native_reference([nat])
                for c in streams:
                    lim = int(c.split("-")[1])
                    if ns is None:
                        why = (nat or {}).get("error") or "no native RESULT"
                        self.add_compute_cell(cell(c, "share", "error",
                                                   f"native 4-stream run failed: {why}"))
                        continue
                    self.share_cell(c, [(f"compute {c}", "streams",
                                         self.sm_env(f"cmp-{c}", lim))],
                                    lambda rs, lim=lim: eval_share(rs[0], ns, lim))
            self.step("compute streams", run_streams)
        self.step("compute default and priorities", self.default_cells, sel, n)
        if "launch-nolimit" in sel:
            def launch():
                st, why, figs = self.launch_cost(self.sm_env("cmp-launch", None), "compute")
                self.add_compute_cell(cell("launch-nolimit", "launch", st, why, figs))
            self.step("compute launch cost", launch)
        if "agent-share" in sel:
            if n is None:
                self.add_compute_cell(cell("agent-share", "agent", "error",
                                           "no native throughput"))
            elif not self.agent_path:
                self.add_compute_cell(cell("agent-share", "agent", "skipped",
                                           "hami-agent not found"))
            else:
                self.step("compute agent share", self.agent_share_cell, n)
        hami = [c for c in ("hami-30", "hami-50") if c in sel]
        if hami:
            if not (self.args.hami_core_src or self.args.hami_core_lib):
                for c in hami:
                    self.add_compute_cell(cell(c, "reference", "skipped",
                                               "no --hami-core-src given"))
            else:
                lib = self.step("HAMi-core build", self.hami_build)
                for c in hami:
                    if not lib:
                        err = self.results["compute"]["hami_core"].get("error", "build failed")
                        self.add_compute_cell(cell(c, "reference", "error", err))
                    else:
                        self.step(f"compute {c}", self.hami_cell, lib, int(c.split("-")[1]), n)
        # The native reference again: how far the device drifted during the group.
        def native_again():
            r = self.native_rate("spin", "spin_end")
            rate, info = native_reference([r])
            cg["native"]["end_info"] = info
            if rate and n:
                drift = (rate - n) / n * 100.0
                cg["native"]["drift_pct"] = round(drift, 2)
                if abs(drift) > SHARE_TOL_POINTS / 2:
                    self.note(f"compute: native throughput drifted {drift:+.1f} % during the "
                              "group (shares are against the first native run)")
        if n is not None:
            self.step("compute native spin (end)", native_again)
        for c in sel:
            if not any(x["workload"] == c for x in cg["cells"]):
                self.add_compute_cell(cell(c, "-", "skipped",
                                           "not reached (deadline or earlier error)"))
