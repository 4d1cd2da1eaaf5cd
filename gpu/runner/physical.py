"""The physical group's phases (issue 8, `--only physical`): device memory that arrives by
other paths, run under the preload, a blind preload and no preload, with the agent's audits.
A mixin of run_acceptance.Runner.

It launches processes and gathers figures; every verdict comes from acceptance.physical.
"""

import os
import time

from acceptance.evaluate import cell
from acceptance.parse import parse_compute_apps, smi_sum, stage
from acceptance.physical import (escape_happened, eval_agent_flag, eval_mipmap_preload,
                                 eval_module_preload, eval_pool_preload,
                                 eval_preexisting_audit)
from acceptance.spec import (PHYS_AUDIT_MAX_S, PHYS_CELLS, PHYS_POOL_GRAB_MB, PHYS_POOL_QUOTA_MB,
                             PHYS_PREEXISTING_MB, PHYS_ROWS, PHYS_SMALL_QUOTA_MB,
                             POOL_DROPPED_LABEL)

from .procs import SMI_APPS_ARGV, WORKLOADS_DIR, Proc, SmiSampler, find_libcuda, run_cmd, tail


class PhysicalPhases:
    """The physical group: pool, mipmap, module (lazy, eager) and pre-existing rows."""

    def phys_preload_for(self, mode):
        """mode "preload": the preload under test; "blind": --blind-preload; "none": none."""
        return {"preload": self.preload, "blind": self.args.blind_preload, "none": None}[mode]

    def phys_env(self, preload, region_name, quota_mb, extra=None):
        """A container's environment (limit, region file), with `preload` in LD_PRELOAD or no
        preload at all."""
        env = self.base_env()
        if preload:
            env["LD_PRELOAD"] = preload
        env["CUDA_DEVICE_MEMORY_LIMIT"] = f"{quota_mb}M"
        env["CUDA_DEVICE_MEMORY_SHARED_CACHE"] = self.region_path(region_name)
        env.setdefault("LIBCUDA_LOG_LEVEL", "3")
        env["WL_QUOTA_MB"] = str(quota_mb)
        env.update(extra or {})
        return env

    def add_phys_cell(self, c):
        self.results["physical"]["cells"].append(c)
        self.log.say(f"PHYS {c['workload']:<13} {c['check']:<12} {c['status'].upper():<7} "
                     f"{c['reason']}")
        self.save()

    def phys_proc(self, label, argv, env, budget=90.0):
        try:
            return Proc(label, argv, env, cwd=WORKLOADS_DIR, log=self.log,
                        budget=self.deadline.cap(budget)), None
        except OSError as e:
            return None, f"cannot start: {e}"

    def phys_audit_start(self):
        """An audit that watches the whole cell: started before the workload (so that it is not
        a pre-existing process), ended with SIGINT once the workload holds."""
        if not self.agent_path:
            return None, "hami-agent not found"
        h = self.agent.audit_start(PHYS_AUDIT_MAX_S, self.base_env())
        self.wait_audit_attached(h)
        if h["p"].poll() is not None:
            parsed, err = self.agent.audit_wait(h, "physical audit (ended at start)")
            return None, f"audit ended at start (rc={h['p'].returncode}): {err or parsed}"
        return h, None

    def phys_audit_end(self, h, title):
        time.sleep(self.args.phys_settle_s)
        return self.agent.audit_stop(h, title)

    def build_physical(self):
        """mipmap_alloc.cu (driver API, linked with libcuda) and module_global.cu (cudart)."""
        b = self.results["builds"]
        nvcc = self.nvcc()
        libcuda = self.results["env"].get("libcuda") or find_libcuda()
        rpath = ["-Xlinker", "-rpath", "-Xlinker", os.path.dirname(libcuda)] if libcuda else []
        cuda_root = os.path.dirname(os.path.dirname(nvcc)) if nvcc else "/usr/local/cuda"
        stubs = os.path.join(cuda_root, "lib64", "stubs")
        mip_src = os.path.join(WORKLOADS_DIR, "mipmap_alloc.cu")
        mod_src = os.path.join(WORKLOADS_DIR, "module_global.cu")
        mip_exe = os.path.join(self.work, "mipmap_alloc")
        mod_exe = os.path.join(self.work, "module_global")
        attempts = {
            "mipmap": [[mip_src, "-o", mip_exe, "-lcuda", *rpath],
                       [mip_src, "-o", mip_exe, f"-L{stubs}", "-lcuda", *rpath]]
            + ([[mip_src, "-o", mip_exe, "-Xlinker", libcuda, *rpath]] if libcuda else []),
            "module_global": [["-arch=sm_90", "-cudart", "static", mod_src, "-o", mod_exe],
                              ["-cudart", "static", mod_src, "-o", mod_exe]],
        }
        for key, variants in attempts.items():
            if not nvcc:
                b[key] = {"ok": False, "error": "nvcc not found"}
                continue
            ok, err = False, ""
            exe = variants[0][variants[0].index("-o") + 1]
            for v in variants:
                r = run_cmd([nvcc, "-O2", *v], self.deadline.cap(120), log=self.log,
                            title=f"nvcc {key} {' '.join(v)}")
                if r["rc"] == 0 and os.path.exists(exe):
                    ok = True
                    break
                err = tail(r["stderr"], 800)
            b[key] = {"ok": ok, "error": "" if ok else err}
            if ok:
                self.bins[key] = exe

    def phys_pool(self, mode):
        """Two PyTorch cudaMallocAsync processes in one 4 GiB container: A allocates 2.5 GiB
        and drops the tensor (its pool keeps it), then B asks for 2.5 GiB. nvidia-smi samples
        the two processes all along."""
        check = "preload" if mode == "preload" else f"agent-{mode}"
        region = f"phys-pool-{mode}"
        env = self.phys_env(self.phys_preload_for(mode), region, PHYS_POOL_QUOTA_MB, {
            "PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync",
            "WL_GRAB_MB": str(PHYS_POOL_GRAB_MB)})
        audit, aerr = (None, None)
        if mode != "preload":
            audit, aerr = self.phys_audit_start()
            if audit is None:
                self.add_phys_cell(cell("pool", check, "error", aerr))
                return
        script = os.path.join(WORKLOADS_DIR, "torch_alloc.py")
        procs = {}
        for role, step in (("a", "drop"), ("b", "grab")):
            p, err = self.phys_proc(f"pool {role.upper()} [{mode}]", [self.python, script, step],
                                    env)
            if p is None:
                for q in procs.values():
                    q.kill()
                if audit is not None:
                    self.agent.audit_stop(audit, "pool (aborted)")
                self.add_phys_cell(cell("pool", check, "error", f"{role.upper()}: {err}"))
                return
            procs[role] = p
        a, b = procs["a"], procs["b"]
        sampler = SmiSampler(self.base_env()).start()
        parsed, arc = None, None
        notes = []
        try:
            for role, p in procs.items():
                tag, kv, _ = p.expect(["READY"], 90)
                if tag != "READY":
                    notes.append(f"{role.upper()}: no READY ({kv})")
            if not notes:
                a.send("go")
                tag, kv, _ = a.expect(["HOLDING"], 60)
                if tag != "HOLDING":
                    notes.append(f"A: no HOLDING ({kv})")
                sampler.sample(POOL_DROPPED_LABEL)
                b.send("go")
                tag, kv, _ = b.expect(["GRAB"], 60)
                if tag != "GRAB":
                    notes.append(f"B: no GRAB ({kv})")
                b.expect(["HOLDING"], 20)
                sampler.sample("both hold")
            if audit is not None:
                parsed, aerr, arc = self.phys_audit_end(audit, f"pool [{mode}]")
                audit = None
        finally:
            sampler.stop()
            if audit is not None:
                self.agent.audit_stop(audit, f"pool [{mode}] (aborted)")
            for p in procs.values():
                p.send("release")
            for p in procs.values():
                p.expect(["DONE"], 15)
                p.finish(10)
        pids = [a.wpid, b.wpid]
        self.results["physical"]["smi"][f"pool-{mode}"] = sampler.compact(pids)
        if mode == "preload":
            st, why, figs = eval_pool_preload(a.lines, b.lines, sampler.samples, pids,
                                              PHYS_POOL_QUOTA_MB, PHYS_POOL_GRAB_MB)
        else:
            st, why, figs = eval_agent_flag(parsed, mode, pids, self.region_path(region),
                                            escape_happened("pool", {"a": a.lines, "b": b.lines}))
            figs["audit_rc"] = arc
            sums = [smi_sum(s["apps"], pids) for s in sampler.samples if s["apps"] is not None]
            figs["smi_max_sum_mib"] = max(sums) if sums else None
            if aerr:
                why = (why + "; " if why else "") + aerr
        figs["pids"] = pids
        if notes:
            why = (why + "; " if why else "") + "; ".join(notes)
        self.add_phys_cell(cell("pool", check, st, why, figs, a.stderr_tail(700)
                                + b.stderr_tail(700)))

    def phys_single(self, row, mode):
        """One C program: the 2 GiB mipmapped array or the 1.5 GiB module global, quota 1 GiB."""
        check = "preload" if mode == "preload" else f"agent-{mode}"
        key = "mipmap" if row == "mipmap" else "module_global"
        exe = self.bins.get(key)
        if not exe:
            self.add_phys_cell(cell(row, check, "error", f"{key} was not built"))
            return
        extra = {"WL_PROBE_MB": "256"}
        if row == "module-eager":
            extra["CUDA_MODULE_LOADING"] = "EAGER"
        region = f"phys-{row}-{mode}"
        env = self.phys_env(self.phys_preload_for(mode), region, PHYS_SMALL_QUOTA_MB, extra)
        audit, aerr = (None, None)
        if mode != "preload":
            audit, aerr = self.phys_audit_start()
            if audit is None:
                self.add_phys_cell(cell(row, check, "error", aerr))
                return
        p, err = self.phys_proc(f"{row} [{mode}]", [exe], env, budget=60)
        if p is None:
            if audit is not None:
                self.agent.audit_stop(audit, f"{row} (aborted)")
            self.add_phys_cell(cell(row, check, "error", err))
            return
        parsed, arc, smi_mib, notes = None, None, None, []
        try:
            tag, kv, _ = p.expect(["READY"], 45)
            if tag != "READY":
                notes.append(f"no READY ({kv})")
            else:
                p.send("go")
                tag, kv, _ = p.expect(["HOLDING"], 45)
                if tag != "HOLDING":
                    notes.append(f"no HOLDING ({kv})")
            r = run_cmd(SMI_APPS_ARGV, 15, env=self.base_env(), log=self.log,
                        title=f"{row} [{mode}]: nvidia-smi compute apps")
            smi_mib = parse_compute_apps(r["stdout"]).get(p.wpid) if r["rc"] == 0 else None
            if audit is not None:
                parsed, aerr, arc = self.phys_audit_end(audit, f"{row} [{mode}]")
                audit = None
        finally:
            if audit is not None:
                self.agent.audit_stop(audit, f"{row} [{mode}] (aborted)")
            p.send("release")
            p.expect(["DONE"], 15)
            p.finish(10)
        if mode == "preload":
            if row == "mipmap":
                st, why, figs = eval_mipmap_preload(p.lines, smi_mib, PHYS_SMALL_QUOTA_MB)
            else:
                if row == "module-eager" and not self.phys_control:
                    self.phys_control_run()
                st, why, figs = eval_module_preload(p.lines, smi_mib, PHYS_SMALL_QUOTA_MB,
                                                    row == "module-lazy", self.phys_control)
            if stage(p.lines, "PRE")[0] == 0 and row != "module-eager":
                self.phys_control = True  # 256 MiB fits after a context in 1 GiB
        else:
            st, why, figs = eval_agent_flag(parsed, mode, [p.wpid], self.region_path(region),
                                            escape_happened(row, {"main": p.lines}))
            figs["audit_rc"] = arc
            figs["smi_mib"] = smi_mib
            if aerr:
                why = (why + "; " if why else "") + aerr
        figs["pid"] = p.wpid
        if notes:
            why = (why + "; " if why else "") + "; ".join(notes)
        self.add_phys_cell(cell(row, check, st, why, figs, p.stderr_tail()))

    def phys_control_run(self):
        """The control of a "charged" outcome when no earlier cell gave one: under the preload
        and the 1 GiB quota, a fresh process (mipmap_alloc, which has no module memory) gets
        its 256 MiB PRE allocation after its context. stdin is closed, so it exits at READY."""
        exe = self.bins.get("mipmap")
        if not exe:
            return
        env = self.phys_env(self.preload, "phys-control", PHYS_SMALL_QUOTA_MB,
                            {"WL_PROBE_MB": "256"})
        r = run_cmd([exe], self.deadline.cap(30), env=env, log=self.log,
                    title="physical control: 256 MiB after a context in 1 GiB")
        self.phys_control = stage(r["stdout"].splitlines(), "PRE")[0] == 0

    def phys_preexisting(self):
        """`hami-agent audit` started while an unpreloaded PyTorch process that started
        earlier holds 1.5 GiB."""
        env = self.base_env()
        env["WL_HOLD_MB"] = str(PHYS_PREEXISTING_MB)
        p, err = self.phys_proc("pre-existing [none]",
                                [self.python, os.path.join(WORKLOADS_DIR, "torch_alloc.py"),
                                 "hold"], env)
        if p is None:
            self.add_phys_cell(cell("pre-existing", "audit", "error", err))
            return
        parsed, aerr, arc, smi_mib, notes = None, None, None, None, []
        try:
            tag, kv, _ = p.expect(["READY"], 90)
            if tag == "READY":
                p.send("go")
                tag, kv, _ = p.expect(["HOLDING"], 60)
            if tag != "HOLDING":
                notes.append(f"no HOLDING ({kv})")
            else:
                r = run_cmd(SMI_APPS_ARGV, 15, env=self.base_env(), log=self.log,
                            title="pre-existing: nvidia-smi compute apps")
                smi_mib = parse_compute_apps(r["stdout"]).get(p.wpid) if r["rc"] == 0 else None
                if not self.agent_path:
                    aerr = "hami-agent not found"
                else:
                    h = self.agent.audit_start(self.args.audit_seconds, self.base_env())
                    parsed, aerr = self.agent.audit_wait(h, "pre-existing audit")
                    arc = h["p"].returncode
        finally:
            p.send("release")
            p.expect(["DONE"], 15)
            p.finish(10)
        st, why, figs = eval_preexisting_audit(parsed, arc, p.wpid,
                                               escape_happened("pre-existing", {"main": p.lines}),
                                               smi_mib)
        for extra in ([aerr] if aerr else []) + notes:
            why = (why + "; " if why else "") + extra
        self.add_phys_cell(cell("pre-existing", "audit", st, why, figs, p.stderr_tail()))

    def physical(self):
        """The whole group; every cell bounded, the run's deadline skips what is left."""
        ph = self.results["physical"]
        rows = [r for r in PHYS_ROWS if not self.args.phys_rows or r in self.args.phys_rows]
        ph["rows"] = rows
        blind = self.args.blind_preload
        if blind and not os.path.exists(blind):
            self.note(f"--blind-preload {blind} does not exist: blind cells are errors")
        if not self.preload:
            self.note("libhami_preload.so not found: the preload column will fail")
        self.step("build physical workloads", self.build_physical)
        for row in rows:
            if row == "pool":
                self.step("physical pool [preload]", self.phys_pool, "preload")
            elif "preload" in PHYS_CELLS[row]:
                self.step(f"physical {row} [preload]", self.phys_single, row, "preload")
        if "pre-existing" in rows:
            self.step("physical pre-existing [audit]", self.phys_preexisting)
        for mode in ("blind", "none"):
            for row in rows:
                if f"agent-{mode}" not in PHYS_CELLS[row]:
                    continue
                if mode == "blind" and not blind:
                    self.add_phys_cell(cell(row, "agent-blind", "skipped",
                                            "no --blind-preload given"))
                    continue
                if mode == "blind" and not os.path.exists(blind):
                    self.add_phys_cell(cell(row, "agent-blind", "error",
                                            f"--blind-preload {blind} does not exist"))
                    continue
                if row == "pool":
                    self.step(f"physical pool [{mode}]", self.phys_pool, mode)
                else:
                    self.step(f"physical {row} [{mode}]", self.phys_single, row, mode)
        for row in rows:
            for ch in PHYS_CELLS[row]:
                if not any(c["workload"] == row and c["check"] == ch for c in ph["cells"]):
                    self.add_phys_cell(cell(row, ch, "skipped",
                                            "not reached (deadline or earlier error)"))
