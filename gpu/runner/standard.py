"""The standard group's phases (gpu/README.md "Checks"): per workload a native run, one
preloaded run (enforced, virtualised, observed) and one bypass run while the agent watches;
the two-process check; the benchmarks. A mixin of run_acceptance.Runner.

It launches processes and gathers figures; every verdict comes from acceptance.evaluate.
"""

import os
import time

from acceptance.evaluate import (cell, eval_bypass, eval_enforced, eval_native, eval_observed,
                                 eval_two_process, eval_virtualised, tolerance)
from acceptance.parse import (audit_bypass_for, audit_says_ready, find_tag, metrics_bypass_count,
                              metrics_observed_for_pid, parse_compute_apps,
                              parse_cudaprobe_bench, parse_smi_memory, to_float, to_int)
from acceptance.region import read_region_bytes
from acceptance.spec import BYPASS_LATENCY_S, MIB, WORKLOADS

from .procs import WORKLOADS_DIR, read_text, run_cmd, tail


class StandardPhases:
    """native / preloaded / bypass per workload, the two-process check, the benchmarks."""

    def native(self, wl):
        p, err = self.start(wl, ["meminfo", "compute"], self.base_env(), "native")
        if p is None:
            self.add_cell(cell(wl["name"], "native", "error", err))
            return
        p.finish(self.deadline.cap(self.args.wl_timeout))
        if p.timed_out:
            st, why, figs = "fail", f"timed out after {self.args.wl_timeout}s", {}
        else:
            st, why, figs = eval_native(wl, p.lines)
        self.add_cell(cell(wl["name"], "native", st, why, figs, p.stderr_tail()))

    def preloaded(self, wl):
        """One preloaded process: meminfo (virtualised), hold (observed), enforce (enforced)."""
        name = wl["name"]
        region = f"region-{name}"
        env = self.preload_env(region)
        p, err = self.start(wl, ["meminfo", "hold", "enforce"], env, "preload")
        if p is None:
            for ch in ("enforced", "virtualised", "observed"):
                self.add_cell(cell(name, ch, "error", err))
            return
        limit = self.deadline.cap(self.args.wl_timeout)
        observed = ("fail", "workload never reached HOLDING", {})
        tag, kv, _ = p.expect(["READY"], limit)
        if tag == "READY":
            audit = None
            if self.agent.alive():
                audit = self.agent.audit_start(self.args.audit_seconds, self.base_env())
                self.wait_audit_attached(audit)
            p.send("go")
            tag2, kv2, _ = p.expect(["HOLDING"], 60)
            if tag2 == "HOLDING":
                figure = to_int(kv2.get("bytes"))
                observed = self.observe(name, p.wpid, figure, audit)
            else:
                if audit is not None:
                    self.agent.audit_wait(audit, f"{name} observed (aborted)")
                observed = ("fail", f"no HOLDING: {kv2}", {})
            p.send("release")
        else:
            observed = ("fail", f"no READY: {kv}", {})
        p.expect(["DONE"], limit)
        p.finish(10)
        reason_suffix = " (timed out)" if p.timed_out else ""
        st, why, figs = eval_enforced(wl, p.lines, self.quota)
        self.add_cell(cell(name, "enforced", st, why + reason_suffix, figs, p.stderr_tail()))
        smi = run_cmd(["nvidia-smi", "--query-gpu=memory.total,memory.used",
                       "--format=csv,noheader,nounits"], 30, env=self.preload_env(region),
                      log=self.log, title=f"{name}: nvidia-smi under preload")
        smi_total, smi_used = parse_smi_memory(smi["stdout"])
        st, why, figs = eval_virtualised(p.lines, smi_total, self.quota)
        figs["nvidia_smi_used_mib"] = smi_used
        figs["nvidia_smi_raw"] = smi["stdout"].strip()[:200]
        if smi["rc"] != 0:
            why = (why + "; " if why else "") + f"nvidia-smi rc={smi['rc']}: {tail(smi['stderr'], 300)}"
        self.add_cell(cell(name, "virtualised", st, why, figs, p.stderr_tail()))
        st, why, figs = observed
        self.add_cell(cell(name, "observed", st, why, figs, p.stderr_tail()))

    def observe(self, name, pid, figure, audit):
        """What the agent observed for pid while it holds `figure` bytes.

        Primary source: the running agent's /metrics (`hami_process_observed_bytes{pid}`; it
        has watched the process since it started), polled up to 2 s until it is within
        tolerance. Second source, and fallback: the audit started before the allocation.
        Both are recorded."""
        m_obs, m_hooked, m_view = None, None, None
        if self.agent.alive():
            end = time.monotonic() + 2.0
            while time.monotonic() < end:
                samples = self.agent.metrics()
                if samples is not None:
                    m_obs, m_hooked = metrics_observed_for_pid(samples, pid)
                    if m_obs is not None and abs(m_obs - (figure or 0)) <= tolerance(figure or 0):
                        break
                time.sleep(0.1)
            if m_obs is not None:
                m_view = {"observed_data_bytes": m_obs, "hooked": m_hooked}
        a_view, aerr = None, None
        if audit is not None:
            parsed, aerr = self.agent.audit_wait(audit, f"{name} observed")
            if parsed is not None:
                a_view = parsed["processes"].get(pid)
                if a_view is None:
                    aerr = f"audit did not list pid {pid} (listed {sorted(parsed['processes'])})"
        elif not self.agent.alive():
            aerr = f"agent not running: {self.agent.error}"
        view, source = (m_view, "metrics") if m_view is not None else (a_view, "audit")
        if view is not None and a_view is not None and source == "metrics":
            # The audit's verdict still counts: a preloaded process must not be called bypass.
            view = dict(view, verdict=a_view.get("verdict"))
        st, why, figs = eval_observed(figure, view)
        figs["source"] = source
        figs["metrics_observed_bytes"] = m_obs
        figs["audit"] = ({k: a_view.get(k) for k in ("hooked", "observed_bytes",
                                                     "observed_data_bytes", "accounted_bytes",
                                                     "verdict")} if a_view else aerr)
        if view is None:
            why = "agent reported nothing for the pid" + (f": {aerr}" if aerr else "")
        return st, why, figs

    def wait_audit_attached(self, audit, max_wait=None):
        """Give a freshly started audit time to attach its probes before the workload allocates:
        until its stderr says it attached (or is watching), at least 0.5 s, at most
        --audit-attach-s."""
        max_wait = self.args.audit_attach_s if max_wait is None else max_wait
        t0 = time.monotonic()
        while time.monotonic() - t0 < max_wait and audit["p"].poll() is None:
            if time.monotonic() - t0 >= 0.5 and audit_says_ready(read_text(audit["err"].name)):
                break
            time.sleep(0.1)

    def bypass(self, wl):
        """No preload while the agent watches: a bypass finding within 1 s of the allocation."""
        name = wl["name"]
        if not self.agent.alive():
            self.add_cell(cell(name, "bypass", "error", f"agent not running: {self.agent.error}"))
            return
        # The bypass count before the workload starts: with NVML the agent may report the
        # unhooked process as soon as its context holds memory, before the allocation.
        base = self.agent.metrics()
        base_count = metrics_bypass_count(base) if base is not None else None
        p, err = self.start(wl, ["hold"], self.base_env(), "bypass")
        if p is None:
            self.add_cell(cell(name, "bypass", "error", err))
            return
        limit = self.deadline.cap(self.args.wl_timeout)
        figs = {}
        found_metrics_t = None
        audit_parsed, aerr = None, None
        tag, kv, _ = p.expect(["READY"], limit)
        if tag == "READY":
            audit = self.agent.audit_start(self.args.audit_seconds, self.base_env())
            self.wait_audit_attached(audit)
            p.send("go")
            tag0, kv0, _ = p.expect(["ALLOC_T0"], 60)
            t_alloc = to_float(kv0.get("t")) if tag0 else None
            # Poll the running agent's /metrics for the finding (this gives the latency).
            end = time.monotonic() + max(3.0, 2 * BYPASS_LATENCY_S)
            while time.monotonic() < end:
                m = self.agent.metrics()
                if m is not None:
                    obs, hooked = metrics_observed_for_pid(m, p.wpid)
                    if obs is not None:
                        figs["metrics_pid_observed"], figs["metrics_pid_hooked"] = obs, hooked
                    if metrics_bypass_count(m, p.wpid) > 0 or (
                        base_count is not None and metrics_bypass_count(m) > base_count
                    ):
                        found_metrics_t = time.time()
                        break
                time.sleep(0.05)
            tag2, kv2, _ = p.expect(["HOLDING"], 30)
            figs["framework_bytes"] = to_int(kv2.get("bytes")) if tag2 else None
            audit_parsed, aerr = self.agent.audit_wait(audit, f"{name} bypass")
            p.send("release")
            figs["t_alloc"] = t_alloc
            # Found before the allocation (NVML saw the context): latency 0.
            figs["metrics_latency_s"] = (
                round(max(0.0, found_metrics_t - t_alloc), 3)
                if found_metrics_t and t_alloc else None)
        else:
            aerr = f"no READY: {kv}"
        p.expect(["DONE"], 20)
        p.finish(10)
        found_audit = bool(audit_parsed and audit_bypass_for(audit_parsed, p.wpid))
        figs["audit_found"] = found_audit
        figs["metrics_found"] = found_metrics_t is not None
        if audit_parsed:
            figs["audit_findings"] = [
                {k: f[k] for k in ("kind", "pid", "bytes")} for f in audit_parsed["findings"]][:20]
        latency = figs.get("metrics_latency_s")
        st, why, f2 = eval_bypass(found_audit or found_metrics_t is not None, latency)
        figs.update(f2)
        if aerr:
            why = (why + "; " if why else "") + aerr
        self.add_cell(cell(name, "bypass", st, why, figs, p.stderr_tail()))

    def two_process(self):
        tp = {"status": "error", "reason": ""}
        self.results["two_process"] = tp
        wl = next((w for w in WORKLOADS if w["kind"] == "cuda_shared" and "cuda_shared" in self.bins),
                  None) or next((w for w in WORKLOADS if w["kind"] == "cuda_static"
                                 and "cuda_static" in self.bins), None) or WORKLOADS[3]
        tp["workload"] = wl["name"]
        region = "region-two-process"
        env = self.preload_env(region, {"WL_GRAB_MB": str(self.args.pair_grab_mb)})
        procs = []
        for i in range(2):
            p, err = self.start(wl, ["grab"], env, f"two-process #{i}")
            if p is None:
                tp["reason"] = err
                return
            procs.append(p)
        try:
            for p in procs:
                tag, kv, _ = p.expect(["READY"], self.deadline.cap(self.args.wl_timeout))
                if tag != "READY":
                    tp["reason"] = f"pid {p.wpid}: no READY ({kv})"
                    return
            for p in procs:  # as close together as we can
                p.send("go")
            grants = {}
            for p in procs:
                tag, kv, _ = p.expect(["GRAB"], 60)
                grants[p.wpid] = kv if tag == "GRAB" else {"error": kv}
            for p in procs:
                p.expect(["HOLDING"], 10)
            tp["grants"] = grants
            # While both hold: the region file, the agent's inspect, NVML per process.
            try:
                with open(self.region_path(region), "rb") as f:
                    reg = read_region_bytes(f.read())
                tp["region"] = {"limit": reg["limits"][0], "used": reg["used"][0],
                                "slots": [s for s in reg["slots"] if s["status"] != 0]}
            except (OSError, ValueError) as e:
                tp["region"] = {"error": str(e)}
            if self.agent_path:
                ins, ierr = self.agent.inspect(self.region_path(region), self.base_env())
                tp["inspect"] = {"limit": ins["limit"], "used": ins["used"],
                                 "slot_pids": [s["pid"] for s in ins["slots"]]} if ins else {"error": ierr}
            r = run_cmd(["nvidia-smi", "--query-compute-apps=pid,used_memory",
                         "--format=csv,noheader,nounits"], 30, env=self.base_env(), log=self.log,
                        title="two-process: nvidia-smi compute apps")
            apps = parse_compute_apps(r["stdout"])
            tp["nvml_mib"] = {str(p.wpid): apps.get(p.wpid) for p in procs}
            tp["nvml_all_mib"] = {str(k): v for k, v in apps.items()}
            known = [apps[p.wpid] for p in procs if p.wpid in apps]
            tp["nvml_sum_mib"] = sum(known) if known else None
            tp["limit_mib"] = self.quota_mb
        finally:
            for p in procs:
                p.send("release")
            for p in procs:
                p.expect(["DONE"], 15)
                p.finish(10)
        tp["status"], tp["reason"] = eval_two_process(tp, self.quota_mb)
        self.log.say(f"TWO-PROCESS {tp['status'].upper()} {tp['reason']}")

    def bench_pair(self, label, env):
        exe = self.bins.get("pair_bench")
        res = {}
        self.results["bench"]["pair"][label] = res
        if not exe:
            res["error"] = "pair_bench not built"
            return
        r = run_cmd([exe, str(self.args.pairs), str(MIB), "5"], self.deadline.cap(60), env=env,
                    log=self.log, title=f"bench pair [{label}]")
        kv = find_tag(r["stdout"].splitlines(), "BENCH")
        if kv:
            res.update({"median_ns": to_float(kv.get("ns_per_pair_median")),
                        "min_ns": to_float(kv.get("ns_per_pair_min")),
                        "pairs": to_int(kv.get("pairs")), "failures": to_int(kv.get("failures"))})
        else:
            res["error"] = f"rc={r['rc']} timed_out={r['timed_out']} {tail(r['stderr'], 300)}"
        probe = self.bins.get("cudaprobe")
        if probe:
            # h1's driver, reaching the driver through cuGetProcAddress like the CUDA runtime.
            r = run_cmd([probe, "--via", "procaddr", "init", "ctx", "bench-pair", "500", "1M",
                         "bench-pair", str(self.args.pairs * 5), "1M"], self.deadline.cap(60),
                        env=env, log=self.log, title=f"bench cudaprobe procaddr [{label}]")
            ns = parse_cudaprobe_bench(r["stdout"])
            res["cudaprobe_procaddr_ns"] = ns if ns is not None else f"rc={r['rc']}"

    def bench_train(self, label, env):
        res = {}
        self.results["bench"]["train"][label] = res
        env = dict(env)
        env["WL_TRAIN_STEPS"] = str(self.args.train_steps)
        r = run_cmd([self.python, os.path.join(WORKLOADS_DIR, "train_bench.py")],
                    self.deadline.cap(120), env=env, cwd=WORKLOADS_DIR, log=self.log,
                    title=f"bench train [{label}]")
        kv = find_tag(r["stdout"].splitlines(), "TRAIN")
        if kv:
            res.update({k: to_float(kv.get(k)) for k in
                        ("ms_per_step", "loss_first", "loss_last", "reserved", "steps")})
        else:
            res["error"] = f"rc={r['rc']} timed_out={r['timed_out']} {tail(r['stderr'], 300)}"
