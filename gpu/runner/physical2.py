"""The physical2 group's phases (issue 17, `--only physical2`): memory the driver takes for a
context's limits, a kernel's local memory, lazily loaded module statics and contexts that do
not fit, run natively, under the preload at the row's quota (with an agent audit alongside)
and under the preload at a large quota. A mixin of run_acceptance.Runner.

It launches processes and gathers figures; every verdict comes from acceptance.physical2 (and
acceptance.compute for the launch cost).
"""

import os
import time

from acceptance.evaluate import cell
from acceptance.parse import parse_compute_apps
from acceptance.physical import eval_agent_flag
from acceptance.physical2 import (eval_ctx_native, eval_ctx_preload, eval_limit_native,
                                  eval_limit_preload, eval_no_finding, eval_same_results,
                                  native_escaped, outcome_signature, torch_signature)
from acceptance.spec import (P2_AUDIT_MAX_S, P2_C_ROWS, P2_CHECKS, P2_CHUNK_MB,
                             P2_CTX_QUOTA_MB, P2_FILL_NATIVE_MB, P2_QUOTA_MB, P2_ROWS,
                             P2_SECOND_GRAB_MB, P2_STAGES, P2_WITHIN_QUOTA_MB)

from .procs import SMI_APPS_ARGV, WORKLOADS_DIR, SmiSampler, run_cmd, tail


class Physical2Phases:
    """The physical2 group: heap, stack, local, module-lazy, module-eager, ctx-second, ctx-race
    rows x native, preload, agent, within columns, and the launch cost."""

    # ---- shared with the compute group ----

    def build_cudart(self, key, src_name):
        """nvcc -O2 [-arch=sm_90] -cudart static workloads/<src_name> -> self.bins[key]."""
        if key in self.bins:
            return True
        b = self.results["builds"]
        nvcc = self.nvcc()
        if not nvcc:
            b[key] = {"ok": False, "error": "nvcc not found"}
            return False
        src = os.path.join(WORKLOADS_DIR, src_name)
        exe = os.path.join(self.work, key)
        err = ""
        for arch in (["-arch=sm_90"], []):
            r = run_cmd([nvcc, "-O2", *arch, "-cudart", "static", src, "-o", exe],
                        self.deadline.cap(120), log=self.log, title=f"nvcc {key} {arch}")
            if r["rc"] == 0 and os.path.exists(exe):
                b[key] = {"ok": True, "error": ""}
                self.bins[key] = exe
                return True
            err = tail(r["stderr"], 800)
        b[key] = {"ok": False, "error": err}
        return False

    def not_built(self, key):
        """Why a workload is missing: its build error's last words."""
        err = (self.results["builds"].get(key) or {}).get("error") or "not attempted"
        return f"{key} was not built: {' '.join(err.split()[-40:])}"

    def smi_apps(self, title):
        """One unpreloaded `nvidia-smi --query-compute-apps` reading: {pid: MiB} or None."""
        r = run_cmd(SMI_APPS_ARGV, 15, env=self.base_env(), log=self.log, title=title)
        return parse_compute_apps(r["stdout"]) if r["rc"] == 0 else None

    # ---- bookkeeping ----

    def add_p2_cell(self, c):
        self.results["physical2"]["cells"].append(c)
        self.log.say(f"PHYS2 {c['workload']:<13} {c['check']:<8} {c['status'].upper():<7} "
                     f"{c['reason']}")
        self.save()

    def p2_env(self, mode, row, extra):
        """mode native: no preload, no limit; preload: the row's quota; within: 16 GiB."""
        if mode == "native":
            env = self.base_env()
            env.update(extra)
            return env
        quota = P2_WITHIN_QUOTA_MB if mode == "within" else (
            P2_CTX_QUOTA_MB if row.startswith("ctx") else P2_QUOTA_MB)
        return self.phys_env(self.preload, f"p2-{row}-{mode}", quota, extra)

    def p2_hold(self, mode):
        """Native and preloaded runs hold a while under the audit's eyes (P2_AGENT_HOLD_S)."""
        if mode in ("native", "preload") and self.p2_audit_on:
            time.sleep(min(self.args.p2_hold_s, max(0.0, self.deadline.left() - 30)))

    # ---- the C rows ----

    def p2_c_row(self, row, mode):
        """One C program (limits_probe heap/stack/local, module_global lazy/eager): run to
        HOLDING, read nvidia-smi, release. Returns the record the cells are evaluated from."""
        spec = P2_C_ROWS[row]
        rec = {"row": row, "mode": mode, "lines": [], "smi_mib": None, "smi_hold_mib": None,
               "pid": None, "notes": [], "stderr": "", "region": None}
        exe = self.bins.get(spec["prog"])
        if not exe:
            rec["notes"].append(self.not_built(spec["prog"]))
            return rec
        env = self.p2_env(mode, row, dict(spec["env"], WL_PROBE_MB="256"))
        if mode != "native":
            rec["region"] = env["CUDA_DEVICE_MEMORY_SHARED_CACHE"]
        p, err = self.phys_proc(f"p2 {row} [{mode}]", [exe, *spec["args"]], env, budget=60)
        if p is None:
            rec["notes"].append(err)
            return rec
        # nvidia-smi all along (every ~0.25 s) as well as once while it holds: the most the
        # driver held for the process is what is judged.
        sampler = SmiSampler(self.base_env()).start()
        try:
            tag, kv, _ = p.expect(["READY"], 45)
            if tag == "READY":
                p.send("go")
                tag, kv, _ = p.expect(["HOLDING"], 45)
                if tag != "HOLDING":
                    rec["notes"].append(f"no HOLDING ({kv})")
            else:
                rec["notes"].append(f"no READY ({kv})")
            apps = self.smi_apps(f"p2 {row} [{mode}]: nvidia-smi compute apps")
            rec["smi_hold_mib"] = apps.get(p.wpid) if apps is not None else None
            self.p2_hold(mode)
        finally:
            sampler.stop()
            p.send("release")
            p.expect(["DONE"], 15)
            p.finish(10)
        seen = [s["apps"][p.wpid] for s in sampler.samples
                if s.get("apps") is not None and p.wpid in s["apps"]]
        if rec["smi_hold_mib"] is not None:
            seen.append(rec["smi_hold_mib"])
        rec["smi_mib"] = max(seen) if seen else None
        rec["smi_samples"] = len(sampler.samples)
        rec.update({"lines": list(p.lines), "pid": p.wpid, "stderr": p.stderr_tail()})
        return rec

    def p2_eval_c(self, row, mode, rec):
        spec = P2_C_ROWS[row]
        stages = P2_STAGES[spec["prog"]]
        lines = rec["lines"]
        if mode == "native":
            st, why, figs = eval_limit_native(lines, rec["smi_mib"], P2_QUOTA_MB, stages)
        elif mode == "preload":
            st, why, figs = eval_limit_preload(lines, rec["smi_mib"], P2_QUOTA_MB, stages,
                                               spec["refuse_at"], spec["goes_on"])
        else:
            nat = self.p2_records.get((row, "native"))
            st, why, figs = eval_same_results(
                outcome_signature(nat["lines"], stages) if nat and nat["lines"] else None,
                outcome_signature(lines, stages) if lines else None)
            figs["smi_mib"] = rec["smi_mib"]
        figs["pid"] = rec["pid"]
        figs["smi_hold_mib"] = rec.get("smi_hold_mib")
        figs["smi_samples"] = rec.get("smi_samples")
        if not lines:
            st = "error"
        return st, why, figs

    # ---- the torch rows ----

    def p2_ctx_row(self, row, mode):
        """Two PyTorch processes of one container (3 GiB preloaded; 16 GiB within; no limit
        natively). ctx-second: A fills, holds; then B starts, initialises CUDA and asks for
        64 MiB. ctx-race: A and B fill at the same moment. nvidia-smi samples all along."""
        rec = {"row": row, "mode": mode, "lines": {}, "pids": [], "notes": [], "stderr": "",
               "samples": [], "region": None}
        quota = P2_CTX_QUOTA_MB
        cap = P2_FILL_NATIVE_MB[row] if mode != "preload" else quota + 2048
        env = self.p2_env(mode, row, {"WL_FILL_MAX_MB": str(cap), "WL_CHUNK_MB": str(P2_CHUNK_MB),
                                      "WL_GRAB_MB": str(P2_SECOND_GRAB_MB),
                                      "WL_HOLD_ON_ERROR": "1"})
        if mode != "native":
            rec["region"] = env["CUDA_DEVICE_MEMORY_SHARED_CACHE"]
        script = os.path.join(WORKLOADS_DIR, "torch_alloc.py")
        steps = {"a": "fill", "b": "grab" if row == "ctx-second" else "fill"}
        procs = {}
        sampler = SmiSampler(self.base_env()).start()

        def start(role):
            p, err = self.phys_proc(f"p2 {row} {role.upper()} [{mode}]",
                                    [self.python, script, steps[role]], env, budget=120)
            if p is None:
                rec["notes"].append(f"{role.upper()}: {err}")
            else:
                procs[role] = p
            return p

        try:
            if row == "ctx-second":
                a = start("a")
                if a is not None:
                    # HOLDING before READY: its init failed (WL_HOLD_ON_ERROR), evaluated.
                    tag, kv, _ = a.expect(["READY", "HOLDING", "DONE"], 90)
                    if tag == "READY":
                        a.send("go")
                        tag, kv, _ = a.expect(["HOLDING", "DONE"], 60)
                    if tag != "HOLDING":
                        rec["notes"].append(f"A: no HOLDING ({kv})")
                    sampler.sample("A holds")
                    b = start("b")
                    if b is not None:
                        tag, kv, _ = b.expect(["READY", "HOLDING", "DONE"], 90)
                        if tag == "READY":
                            b.send("go")
                            tag, kv, _ = b.expect(["HOLDING", "DONE"], 60)
                        time.sleep(0.5)
                        sampler.sample("B tried")
                        self.p2_hold(mode)
            else:
                for role in ("a", "b"):
                    start(role)
                ready = []
                for role, p in procs.items():
                    tag, kv, _ = p.expect(["READY", "HOLDING", "DONE"], 90)
                    if tag == "READY":
                        ready.append(p)
                    elif tag != "HOLDING":  # HOLDING here: its init failed (evaluated)
                        rec["notes"].append(f"{role.upper()}: no READY ({kv})")
                for p in ready:
                    p.send("go")
                for p in ready:
                    p.expect(["HOLDING", "DONE"], 60)
                time.sleep(0.5)
                sampler.sample("both hold")
                self.p2_hold(mode)
        finally:
            sampler.stop()
            for p in procs.values():
                p.send("release")
            for p in procs.values():
                p.expect(["DONE"], 30)
                p.finish(10)
        rec["lines"] = {role: list(p.lines) for role, p in procs.items()}
        rec["pids"] = [p.wpid for p in procs.values()]
        rec["samples"] = sampler.samples
        rec["stderr"] = "".join(p.stderr_tail(600) for p in procs.values())
        self.results["physical2"]["smi"][f"{row}-{mode}"] = sampler.compact(rec["pids"])
        return rec

    def p2_eval_ctx(self, row, mode, rec):
        lines, samples, pids = rec["lines"], rec["samples"], rec["pids"]
        if mode == "native":
            st, why, figs = eval_ctx_native(lines, samples, pids, P2_CTX_QUOTA_MB)
        elif mode == "preload":
            st, why, figs = eval_ctx_preload(row, lines, samples, pids, P2_CTX_QUOTA_MB)
        else:
            nat = self.p2_records.get((row, "native"))
            nsig = ({k: torch_signature(v) for k, v in nat["lines"].items()}
                    if nat and nat["lines"] else None)
            psig = {k: torch_signature(v) for k, v in lines.items()} if lines else None
            st, why, figs = eval_same_results(nsig, psig)
        figs["pids"] = pids
        if not lines:
            st = "error"
        return st, why, figs

    # ---- the group ----

    def p2_cell(self, row, mode):
        """Run one row in one mode and record its cell."""
        if row.startswith("ctx"):
            rec = self.p2_ctx_row(row, mode)
            st, why, figs = self.p2_eval_ctx(row, mode, rec)
        else:
            rec = self.p2_c_row(row, mode)
            st, why, figs = self.p2_eval_c(row, mode, rec)
        if mode == "within" and self.p2_status.get((row, "native")) != "pass" and st != "error":
            st, why = "error", (f"the native run was {self.p2_status.get((row, 'native'))}: "
                                "nothing to compare with")
        self.p2_records[(row, mode)] = rec
        self.p2_status[(row, mode)] = st
        if rec["notes"]:
            why = (why + "; " if why else "") + "; ".join(rec["notes"])
        self.add_p2_cell(cell(row, mode, st, why, figs, rec.get("stderr", "")))

    def p2_agent_cells(self, audit, aerr, rows):
        """The agent columns: a bypass finding for every native run's pids (agent-none), no
        finding for any preloaded run (agent)."""
        for row in rows:
            for mode, check in (("native", "agent-none"), ("preload", "agent")):
                rec = self.p2_records.get((row, mode))
                if rec is None:
                    continue
                pids = rec["pids"] if "pids" in rec else (
                    [rec["pid"]] if rec.get("pid") else [])
                if mode == "native":
                    st, why, figs = eval_agent_flag(audit, "none", pids, None,
                                                    native_escaped(rec["lines"]))
                    figs["findings"] = [f for f in figs.get("findings", [])
                                        if f.get("pid") in pids]
                else:
                    st, why, figs = eval_no_finding(audit, pids, rec.get("region"))
                if aerr:
                    why = (why + "; " if why else "") + aerr
                self.add_p2_cell(cell(row, check, st, why, figs))

    def physical2(self):
        """The whole group; every cell bounded, the run's deadline skips what is left."""
        ph = self.results["physical2"]
        rows = [r for r in P2_ROWS if not self.args.p2_rows or r in self.args.p2_rows]
        ph["rows"] = rows
        self.p2_records = {}
        self.p2_status = {}
        self.p2_audit_on = False
        if not self.preload:
            self.note("libhami_preload.so not found: the physical2 preload cells will fail")
        self.step("build physical2 workloads", self.p2_build, rows)
        # 1. The launch cost, nothing else running.
        self.step("physical2 launch cost", self.p2_launch_cost)
        # 2. One audit watches every run that follows: native (it must flag them as bypass),
        # preloaded at the row's quota (no finding), preloaded at 16 GiB (not judged).
        audit, aerr = None, None
        if self.agent_path:
            audit = self.step("physical2 audit start", self.p2_audit_start)
            if audit is None:
                aerr = "the audit did not start"
        else:
            aerr = "hami-agent not found"
        parsed = None
        self.p2_audit_on = audit is not None
        try:
            for row in rows:
                self.step(f"physical2 {row} [native]", self.p2_cell, row, "native")
            for row in rows:
                self.step(f"physical2 {row} [preload]", self.p2_cell, row, "preload")
            for row in rows:
                self.step(f"physical2 {row} [within]", self.p2_cell, row, "within")
        finally:
            if audit is not None:
                time.sleep(min(self.args.phys_settle_s, max(0.0, self.deadline.left() - 20)))
                parsed, err, arc = self.agent.audit_stop(audit, "physical2 audit")
                ph["audit_rc"] = arc
                aerr = err
        self.step("physical2 agent column", self.p2_agent_cells, parsed, aerr, rows)
        for row, checks in [(r, P2_CHECKS) for r in rows] + [("launch", ["cost"])]:
            for ch in checks:
                if not any(c["workload"] == row and c["check"] == ch for c in ph["cells"]):
                    self.add_p2_cell(cell(row, ch, "skipped",
                                          "not reached (deadline or earlier error)"))

    def p2_build(self, rows):
        progs = {P2_C_ROWS[r]["prog"] for r in rows if r in P2_C_ROWS}
        for prog in sorted(progs):
            self.build_cudart(prog, prog + ".cu")
        self.build_cudart("compute_spin", "compute_spin.cu")

    def p2_audit_start(self):
        h = self.agent.audit_start(P2_AUDIT_MAX_S, self.base_env())
        self.wait_audit_attached(h)
        if h["p"].poll() is not None:
            parsed, err = self.agent.audit_wait(h, "physical2 audit (ended at start)")
            self.note(f"physical2 audit ended at start (rc={h['p'].returncode}): {err}")
            return None
        return h

    def p2_launch_cost(self):
        """Empty-kernel launch cost, native against the preload at the 16 GiB quota."""
        env = self.phys_env(self.preload, "p2-launch", P2_WITHIN_QUOTA_MB)
        st, why, figs = self.launch_cost(env, "p2")
        c = cell("launch", "cost", st, why, figs)
        self.results["physical2"]["launch"] = c  # the same record as in cells
        self.add_p2_cell(c)
