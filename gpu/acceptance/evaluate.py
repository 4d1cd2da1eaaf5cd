"""Evaluation of the standard group's cells (native, enforced, virtualised, observed,
bypass caught) and of the two-process check, from what the workloads printed and what the
agent, nvidia-smi and the region reported.

Pure functions: every rule of gpu/README.md "Checks" is here, each returning
(status, reason, figures); the runner only gathers the inputs.
"""

from .parse import find_tag, parse_line, to_int, verdict_has
from .spec import BYPASS_LATENCY_S, MIB, TOL_FRACTION, TOL_MIN_BYTES


def cell(workload, check, status, reason="", figures=None, stderr_tail=""):
    """One result cell as results.json stores it; status is pass, fail, error or skipped."""
    return {
        "workload": workload,
        "check": check,
        "status": status,
        "reason": reason,
        "figures": figures or {},
        "stderr_tail": stderr_tail,
    }


def tolerance(figure):
    """Allowed |observed - figure| in bytes."""
    return max(TOL_MIN_BYTES, int(TOL_FRACTION * max(0, figure)))


def eval_native(wl, lines):
    mi = find_tag(lines, "MEMINFO")
    figs = {"total": to_int(mi.get("total")) if mi else None}
    errs = [kv for t, kv in map(parse_line, lines) if t == "STEP_ERROR"]
    if find_tag(lines, "COMPUTE_OK") is not None and mi:
        return "pass", "", figs
    why = "no COMPUTE_OK" if mi else "no MEMINFO"
    if errs:
        why += "; " + "; ".join(f"{e.get('step')}: {e.get('err')}" for e in errs)
    return "fail", why, figs


def eval_enforced(wl, lines, quota_bytes):
    big = find_tag(lines, "BIG_OOM")
    fill = find_tag(lines, "FILL")
    figs = {
        "big_oom": big,
        "fill_granted": to_int(fill.get("granted")) if fill else None,
        "fill_oom_kind": fill.get("kind") if fill else None,
        "recovered": find_tag(lines, "RECOVERED_OK") is not None,
        "compute": find_tag(lines, "COMPUTE_OK") is not None,
    }
    problems = []
    if not big or big.get("ok") != "1":
        problems.append(f"allocation of quota+1GiB not refused ({big})")
    elif big.get("kind") != wl["oom"]:
        problems.append(f"refused with {big.get('kind')}, expected {wl['oom']}")
    if not fill:
        problems.append("no FILL line")
    else:
        if fill.get("oom") != "1":
            problems.append(f"chunked fill never refused (granted {fill.get('granted')})")
        elif fill.get("kind") != wl["oom"]:
            problems.append(f"fill refused with {fill.get('kind')}, expected {wl['oom']}")
        g = to_int(fill.get("granted"), 0)
        if g > quota_bytes:
            problems.append(f"granted {g} > quota {quota_bytes}")
    if not figs["recovered"]:
        rf = find_tag(lines, "RECOVERED_FAIL")
        problems.append(f"no recovery after free ({rf.get('err') if rf else 'no line'})")
    if not figs["compute"]:
        cf = find_tag(lines, "COMPUTE_FAIL")
        problems.append(f"compute after OOM failed ({cf.get('err') if cf else 'no line'})")
    for t, kv in map(parse_line, lines):
        if t == "STEP_ERROR" and kv.get("step") in ("enforce", "init"):
            problems.append(f"{kv.get('step')}: {kv.get('err')}")
    return ("pass" if not problems else "fail"), "; ".join(problems), figs


def eval_virtualised(lines, smi_total_mib, quota_bytes):
    mi = find_tag(lines, "MEMINFO")
    total = to_int(mi.get("total")) if mi else None
    free = to_int(mi.get("free")) if mi else None
    figs = {"meminfo_total": total, "meminfo_free": free, "nvidia_smi_total_mib": smi_total_mib}
    problems = []
    if total != quota_bytes:
        problems.append(f"framework total {total} != quota {quota_bytes}")
    if free is not None and total is not None and free > total:
        problems.append(f"free {free} > total {total}")
    if smi_total_mib != quota_bytes // MIB:
        problems.append(f"nvidia-smi total {smi_total_mib} MiB != {quota_bytes // MIB} MiB")
    return ("pass" if not problems else "fail"), "; ".join(problems), figs


def eval_observed(figure, proc_view):
    """figure: framework bytes; proc_view: parsed audit process entry (or None)."""
    figs = {"framework_bytes": figure}
    if proc_view is None:
        return "fail", "agent did not report the process", figs
    obs = proc_view.get("observed_data_bytes")
    basis = "observed_data_bytes"
    if obs is None:
        obs = proc_view.get("observed_bytes")
        basis = "observed_bytes"
    figs.update(
        {
            "observed_bytes": obs,
            "basis": basis,
            "accounted_bytes": proc_view.get("accounted_bytes"),
            "hooked": proc_view.get("hooked"),
            "verdict": proc_view.get("verdict"),
            "tolerance": tolerance(figure or 0),
        }
    )
    if obs is None or figure is None:
        return "fail", "no observed figure", figs
    diff = obs - figure
    figs["diff_bytes"] = diff
    problems = []
    if abs(diff) > tolerance(figure):
        problems.append(f"observed {obs} vs framework {figure}: |diff| {abs(diff)} > {tolerance(figure)}")
    if proc_view.get("hooked") is False:
        problems.append("agent says the preloaded process is not hooked")
    if verdict_has(proc_view.get("verdict"), "bypass"):
        problems.append("agent reports the preloaded process as bypass")
    return ("pass" if not problems else "fail"), "; ".join(problems), figs


def eval_bypass(found, latency_s):
    figs = {"latency_s": latency_s}
    if not found:
        return "fail", "no bypass finding for the pid", figs
    if latency_s is None:
        return "fail", "bypass reported but latency not measured", figs
    if latency_s > BYPASS_LATENCY_S:
        return "fail", f"bypass reported after {latency_s:.3f} s > {BYPASS_LATENCY_S} s", figs
    return "pass", "", figs


def summarize(cells):
    """Counts of cells per status, and the total."""
    s = {"total": len(cells), "pass": 0, "fail": 0, "error": 0, "skipped": 0}
    for c in cells:
        s[c["status"]] = s.get(c["status"], 0) + 1
    return s


def eval_two_process(tp, quota_mb):
    """Two preloaded processes, one quota: (status, reason) from the record the runner filled
    while both held (`grants` per pid, `region` read directly, `inspect`, `nvml_sum_mib`).

    Pass: exactly one grant and one out-of-memory; the region's and inspect's used <= the
    limit; NVML lists the processes at <= the quota together."""
    quota = quota_mb * MIB
    ok = [kv.get("ok") for kv in (tp.get("grants") or {}).values()]
    problems = []
    if sorted(ok) != ["0", "1"]:
        problems.append(f"expected one grant and one OOM, got ok={ok}")
    reg = tp.get("region", {})
    if "error" in reg:
        problems.append(f"region unreadable: {reg['error']}")
    elif reg.get("used", 0) > quota:
        problems.append(f"region used {reg['used']} > limit {quota}")
    ins = tp.get("inspect")
    if ins and "error" not in ins and ins.get("used") is not None and ins["used"] > quota:
        problems.append(f"inspect used {ins['used']} > limit")
    if ins and "error" in ins:
        problems.append(f"inspect: {ins['error']}")
    if tp.get("nvml_sum_mib") is None:
        problems.append("NVML listed neither process")
    elif tp["nvml_sum_mib"] > quota_mb:
        problems.append(f"NVML total {tp['nvml_sum_mib']} MiB > quota {quota_mb} MiB")
    return ("fail" if problems else "pass"), "; ".join(problems)
