"""The human report, results.md: the standard table, the two-process check, benchmarks, the
physical group's table, the lock-stop cell, notes.

Pure: a function of the results dict that results.json holds (re-rendering a stored
results.json gives its results.md; gpu/test_acceptance.py checks that on gpu/results/).
"""

import json

from .spec import (CHECK_TITLES, CHECKS, COMPUTE_CELLS, COMPUTE_TITLES, GIB, MIB,
                   P2_CHECK_TITLES, P2_CHECKS, P2_ROW_TITLES, P2_ROWS, PHYS_CHECK_TITLES,
                   PHYS_CHECKS, PHYS_ROW_TITLES, PHYS_ROWS, WORKLOADS)


def md(text, n=300):
    """One markdown table/list-safe line."""
    s = " ".join(str(text).split()).replace("|", "/")
    return s if len(s) <= n else s[: n - 3] + "..."


def _gib(b):
    """Bytes as GiB with two decimals, "?" when unknown."""
    return "?" if b is None else f"{b / GIB:.2f} GiB"


def _mib(b):
    """Bytes as whole MiB, "?" when unknown."""
    return "?" if b is None else f"{b / MIB:.0f} MiB"


def short_figure(c):
    """A few words of evidence for a standard cell in the table."""
    f = c.get("figures", {})
    ch = c["check"]
    try:
        if ch == "native":
            return f"total {_gib(f.get('total'))}"
        if ch == "enforced":
            return f"granted {_mib(f.get('fill_granted'))}"
        if ch == "virtualised":
            return f"{_gib(f.get('meminfo_total'))}, smi {f.get('nvidia_smi_total_mib')} MiB"
        if ch == "observed":
            return f"{_mib(f.get('observed_bytes'))} vs {_mib(f.get('framework_bytes'))}"
        if ch == "bypass":
            lat = f.get("latency_s")
            return "?" if lat is None else f"{lat:.3f} s"
    except (TypeError, ValueError):
        pass
    return ""


def phys_short_figure(c):
    """A few words of evidence for a physical-group cell in the table."""
    f = c.get("figures", {}) or {}
    ch, row = c["check"], c["workload"]
    if c["status"] == "skipped":
        return ""
    if ch == "preload" and row == "pool":
        b = f.get("b_grab") or {}
        got = "granted" if b.get("ok") == "1" else b.get("kind", "?")
        return f"B {got}; smi max {f.get('smi_max_sum_mib', '?')} MiB"
    if ch == "preload":
        return f"{f.get('outcome', '?')}; smi {f.get('smi_mib', '?')} MiB"
    if ch.startswith("agent"):
        kinds = f.get("flagged_as") or sorted({x.get("kind") for x in f.get("findings", [])
                                               if x.get("kind")})
        return ",".join(kinds) if kinds else "no finding"
    if ch == "audit":
        return f"rc {f.get('audit_rc')}, verdict {f.get('verdict')}"
    return ""


def render_physical(ph):
    """The physical group's table (rows: escape paths; columns: what must catch them)."""
    out = ["", "## Device memory by other paths (physical group, issue 8)", ""]
    s = ph.get("summary", {})
    out.append(f"- blind preload: {ph.get('blind_preload') or 'none given (blind cells skipped)'}")
    out.append(f"- cells: {s.get('pass', 0)} pass, {s.get('fail', 0)} fail, "
               f"{s.get('error', 0)} error, {s.get('skipped', 0)} skipped (of {s.get('total', 0)})")
    out.append("")
    out.append("| escape path | " + " | ".join(PHYS_CHECK_TITLES[c] for c in PHYS_CHECKS) + " |")
    out.append("|---" * (len(PHYS_CHECKS) + 1) + "|")
    by = {(c["workload"], c["check"]): c for c in ph.get("cells", [])}
    for row in ph.get("rows") or PHYS_ROWS:
        cols = [f"{row}: {PHYS_ROW_TITLES[row]}"]
        for ch in PHYS_CHECKS:
            c = by.get((row, ch))
            if c is None:
                cols.append("-")
            else:
                fig = md(phys_short_figure(c), 80)
                cols.append(c["status"].upper() + (f" ({fig})" if fig else ""))
        out.append("| " + " | ".join(cols) + " |")
    bad = [c for c in ph.get("cells", []) if c["status"] != "pass"]
    if bad:
        out += ["", "Cells not green:", ""]
        for c in bad:
            out.append(f"- {c['workload']} / {c['check']}: {c['status']}: {md(c['reason'], 500)}")
    return out


def _counts(s):
    """The summary line of a group."""
    extra = f", {s['info']} info" if s.get("info") else ""
    return (f"- cells: {s.get('pass', 0)} pass, {s.get('fail', 0)} fail, {s.get('error', 0)} "
            f"error, {s.get('skipped', 0)} skipped{extra} (of {s.get('total', 0)})")


def p2_short_figure(c):
    """A few words of evidence for a physical2 cell."""
    f = c.get("figures", {}) or {}
    ch = c["check"]
    if c["status"] == "skipped":
        return ""
    smi = f.get("smi_max_sum_mib", f.get("smi_mib"))
    if ch == "native":
        return f"{smi if smi is not None else '?'} MiB"
    if ch == "preload":
        out = f.get("outcome") or ("B at " + str(f.get("b_refused_at")) if f.get("b_refused_at")
                                   else "")
        return f"{out + '; ' if out else ''}smi {smi if smi is not None else '?'} MiB"
    if ch == "agent":
        kinds = sorted({x.get("kind") for x in f.get("findings", []) if x.get("kind")})
        return ",".join(kinds) if kinds else "no finding"
    if ch == "agent-none":
        return "bypass" if c["status"] == "pass" else ""
    return ""


def render_physical2(ph):
    """The physical2 group's table (issue 17) and its launch cost."""
    out = ["", "## Limits, local memory, module statics, contexts (physical2 group, issue 17)",
           ""]
    out.append(_counts(ph.get("summary", {})))
    out.append("")
    out.append("| row | " + " | ".join(P2_CHECK_TITLES[c] for c in P2_CHECKS) + " |")
    out.append("|---" * (len(P2_CHECKS) + 1) + "|")
    by = {(c["workload"], c["check"]): c for c in ph.get("cells", [])}
    for row in ph.get("rows") or P2_ROWS:
        cols = [f"{row}: {P2_ROW_TITLES.get(row, row)}"]
        for ch in P2_CHECKS:
            c = by.get((row, ch))
            if c is None:
                cols.append("-")
            else:
                fig = md(p2_short_figure(c), 80)
                cols.append(c["status"].upper() + (f" ({fig})" if fig else ""))
        out.append("| " + " | ".join(cols) + " |")
    lc = ph.get("launch")
    if lc:
        f = lc.get("figures", {}) or {}
        out += ["", f"- empty-kernel launch, native vs preloaded (16 GiB quota): "
                f"{lc['status'].upper()}, {f.get('native_median_us', '?')} vs "
                f"{f.get('preload_median_us', '?')} us per launch {md(lc.get('reason', ''), 300)}"]
    bad = [c for c in ph.get("cells", []) if c["status"] != "pass"]
    if bad:
        out += ["", "Cells not green:", ""]
        for c in bad:
            out.append(f"- {c['workload']} / {c['check']}: {c['status']}: {md(c['reason'], 500)}")
    return out


def compute_short_figure(c):
    """A few words of evidence for a compute cell."""
    f = c.get("figures", {}) or {}
    if c["status"] == "skipped":
        return ""
    if "p99_ratio" in f:
        a, b = f.get("alone") or {}, f.get("beside") or {}
        return (f"p99 {b.get('p99_ms')} vs {a.get('p99_ms')} ms alone ({f['p99_ratio']}x); "
                f"low per s {f.get('low_kernels_per_second')}")
    if "back_pct" in f:
        return (f"alone {f.get('lent_pct')} %, then {f.get('back_pct')} + "
                f"{f.get('newcomer_pct')} % (want {f.get('want_pct')}); "
                f"per second {f['per_second_pct']} %")
    if "per_second_pct" in f and "shares_pct" not in f:
        return (f"{f.get('share_pct')} % of native; per second {f['per_second_pct']} %")
    if "shares_pct" in f:
        s = " + ".join(str(x) for x in f["shares_pct"])
        return f"{s} %" + (f" = {f['sum_pct']} %" if "sum_pct" in f else "")
    if "share_pct" in f:
        return f"{f['share_pct']} % ({f.get('rate')} vs {f.get('native_rate')}/s)"
    if "native_median_us" in f:
        return f"{f['native_median_us']} vs {f['preload_median_us']} us"
    if "agent_share_pct" in f:
        return f"agent {f['agent_share_pct']} %, runner {f.get('runner_share_pct')} %"
    return ""


def render_compute(cg):
    """The compute group's table (issue 18)."""
    out = ["", "## Compute shares (compute group, issue 18)", ""]
    out.append(_counts(cg.get("summary", {})))
    nat = cg.get("native", {}) or {}
    spin = nat.get("spin") or {}
    out.append(f"- native alone: {spin.get('rate', '?')} kernels/s ({cg.get('seconds', '?')} s "
               f"each); drift by the end: {nat.get('drift_pct', '?')} %; tolerance "
               f"+-{cg.get('tolerance_points', '?')} points")
    hc = cg.get("hami_core") or {}
    if hc:
        out.append(f"- HAMi-core: {md(hc.get('lib') or hc.get('error') or hc.get('src'), 300)}")
    out += ["", "| cell | status | figures | reason |", "|---|---|---|---|"]
    by = {c["workload"]: c for c in cg.get("cells", [])}
    for name in cg.get("selected") or COMPUTE_CELLS:
        c = by.get(name)
        if c is None:
            continue
        out.append(f"| {name}: {COMPUTE_TITLES.get(name, name)} | {c['status'].upper()} | "
                   f"{md(compute_short_figure(c), 80)} | {md(c.get('reason', ''), 200)} |")
    return out


def render_lock_stop(c):
    """The stopped-lock-holder cell: status, reason, the stop and each process's figures."""
    f = c.get("figures", {}) or {}
    out = ["", "## Stopped lock holder", ""]
    out.append(f"- status: {c['status'].upper()} {md(c.get('reason', ''), 600)}")
    if not f:
        return out
    out.append(f"- stop: holder {f.get('holder')} (owner tid {f.get('owner_tid')}, "
               f"{f.get('attempts')} attempts), stopped {f.get('stopped_s')} s; lock bound "
               f"{f.get('bound_ms')} ms + {f.get('slack_ms')} ms")
    out.append(f"- region used after exit: {f.get('region_used')} ({f.get('region_source')})")
    out += ["", "| process | calls | granted | OOM | other errors | slowest call ms | "
            "calls while stopped |", "|---|---|---|---|---|---|---|"]
    rows = [("victim", f.get("victim") or {})] + [("worker", w) for w in f.get("workers", [])]
    for role, w in rows:
        out.append(f"| {role} {w.get('pid')} | {w.get('calls', '?')} | {w.get('ok', '?')} | "
                   f"{w.get('oom', '?')} | {w.get('errors', '?')} | {w.get('max_call_ms', '?')} "
                   f"| {w.get('calls_while_stopped', '-')} |")
    return out


def _render_standard(results, s):
    """The 6 workloads x (native + 4 checks) table and its cells not green."""
    out = [f"- cells: {s.get('pass', 0)} pass, {s.get('fail', 0)} fail, "
           f"{s.get('error', 0)} error, {s.get('skipped', 0)} skipped (of {s.get('total', 0)})",
           ""]
    cols = ["native"] + CHECKS
    out.append("| workload | " + " | ".join(CHECK_TITLES[c] for c in cols) + " |")
    out.append("|---" * (len(cols) + 1) + "|")
    by = {(c["workload"], c["check"]): c for c in results.get("cells", [])}
    for wl in WORKLOADS:
        row = [wl["name"]]
        for ch in cols:
            c = by.get((wl["name"], ch))
            if c is None:
                row.append("-")
            else:
                fig = short_figure(c)
                row.append(c["status"].upper() + (f" ({fig})" if fig else ""))
        out.append("| " + " | ".join(row) + " |")
    bad = [c for c in results.get("cells", []) if c["status"] != "pass"]
    if bad:
        out += ["", "## Cells not green", ""]
        for c in bad:
            out.append(f"- {c['workload']} / {c['check']}: {c['status']}: {md(c['reason'])}")
    return out


def render_markdown(results):
    """The human table: 6 workloads x (native + 4 checks), two-process check, benchmarks."""
    out = ["# hami-rs acceptance on a real GPU", ""]
    meta = results.get("meta", {})
    env = results.get("env", {})
    out.append(f"- started: {meta.get('started')}, elapsed: {meta.get('elapsed_s')} s, "
               f"quota: {meta.get('quota_mb')} MiB")
    for k in ("gpu", "driver", "torch", "cupy", "glibc", "nvcc"):
        if env.get(k):
            out.append(f"- {k}: {env[k]}")
    s = results.get("summary", {})
    standard = bool(results.get("cells")) or not (results.get("physical")
                                                  or results.get("lock_stop")
                                                  or results.get("physical2")
                                                  or results.get("compute"))
    if standard:
        out += _render_standard(results, s)
    tp = results.get("two_process")
    if tp:
        out += ["", "## Two preloaded processes, one quota", ""]
        out.append(f"- status: {tp.get('status', '?').upper()} {md(tp.get('reason', ''))}")
        for k in ("workload", "grants", "region", "inspect", "nvml_mib", "nvml_sum_mib", "limit_mib"):
            if k in tp:
                out.append(f"- {k}: `{md(json.dumps(tp[k]), 600)}`")
    bench = results.get("bench", {})
    if bench and (bench.get("pair") or bench.get("train")):
        out += ["", "## Benchmarks", ""]
        pair = bench.get("pair", {})
        if pair:
            out.append("cuMemAlloc_v2 + cuMemFree_v2, 1 MiB, ns per pair (median of rounds):")
            out.append("")
            out.append("| setup | median ns | min ns | cudaprobe --via procaddr ns | note |")
            out.append("|---|---|---|---|---|")
            for k, v in pair.items():
                out.append(f"| {k} | {v.get('median_ns', '?')} | {v.get('min_ns', '?')} | "
                           f"{v.get('cudaprobe_procaddr_ns', '-')} | "
                           f"{md(v.get('error', ''), 120)} |")
        train = bench.get("train", {})
        if train:
            out.append("")
            out.append("Training step (transformer encoder, 4 layers, d=256, batch 32x128, 200 steps):")
            out.append("")
            out.append("| setup | ms/step | loss first -> last | note |")
            out.append("|---|---|---|---|")
            for k, v in train.items():
                out.append(f"| {k} | {v.get('ms_per_step', '?')} | {v.get('loss_first', '?')} -> "
                           f"{v.get('loss_last', '?')} | {md(v.get('error', ''), 120)} |")
    if results.get("physical"):
        out += render_physical(results["physical"])
    if results.get("physical2"):
        out += render_physical2(results["physical2"])
    if results.get("compute"):
        out += render_compute(results["compute"])
    if results.get("lock_stop"):
        out += render_lock_stop(results["lock_stop"])
    notes = results.get("notes", [])
    if notes:
        out += ["", "## Notes", ""] + [f"- {md(n)}" for n in notes]
    return "\n".join(out) + "\n"
