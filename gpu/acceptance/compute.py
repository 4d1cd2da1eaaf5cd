"""Evaluation of the compute group (issue 18): CUDA_DEVICE_SM_LIMIT held for the whole
container, as throughput against native throughput measured in the same run.

Pure functions of the workloads' lines and /metrics samples, each returning (status, reason,
figures); rules in gpu/README.md "Compute shares".
"""

import statistics

from .parse import find_tag, parse_line, to_float, to_int
from .spec import AGENT_SHARE_METRICS, LAUNCH_TOL_FRACTION, LAUNCH_TOL_US, SHARE_TOL_POINTS


def parse_result(lines):
    """The RESULT line of compute_spin.cu (spin/graph) or compute_train.py, as numbers:
    {"rc", "name", "count", "seconds", "rate", "t0", "t1"}; None when missing or failed
    (with "error" set in a dict instead)."""
    for line in lines:
        tag, kv = parse_line(line)
        if tag == "STEP_ERROR":
            return {"error": f"{kv.get('step')}: {kv.get('err')}"}
    kv = find_tag(lines, "RESULT")
    if kv is None:
        return None
    rc = to_int(kv.get("rc"), 0)
    count = to_int(kv.get("kernels", kv.get("steps")))
    rate = to_float(kv.get("kps", kv.get("sps")))
    out = {"rc": rc, "name": kv.get("name"), "count": count,
           "seconds": to_float(kv.get("seconds")), "rate": rate,
           "t0": to_float(kv.get("t0")), "t1": to_float(kv.get("t1"))}
    if rc != 0:
        out["error"] = f"the loop ended with {kv.get('name')}"
    elif not rate or not count:
        out["error"] = "no kernels completed"
    return out


def native_reference(results):
    """The native throughput alone from one or more parsed results (the mean of those that
    ran) and the spread between them: (rate or None, {"rates", "spread_pct"})."""
    rates = [r["rate"] for r in results if r and not r.get("error") and r.get("rate")]
    if not rates:
        return None, {"rates": []}
    mean = statistics.mean(rates)
    spread = (max(rates) - min(rates)) / mean * 100.0 if len(rates) > 1 else 0.0
    return mean, {"rates": [round(r, 3) for r in rates], "spread_pct": round(spread, 2)}


def share_pct(rate, native):
    """Throughput as a percentage of the native throughput, or None."""
    if not rate or not native:
        return None
    return rate / native * 100.0


def within(share, limit, tol=SHARE_TOL_POINTS):
    """Whether a share (percent) is within tol points of its limit."""
    return share is not None and abs(share - limit) <= tol


def eval_share(result, native, limit, tol=SHARE_TOL_POINTS):
    """One process alone at `limit` percent (100: no limit): pass when its throughput is within
    tol points of limit % of the native throughput."""
    figs = {"limit": limit, "native_rate": _r(native)}
    if native is None:
        return "error", "no native throughput to compare with", figs
    if result is None:
        return "fail", "no RESULT line", figs
    figs.update({"rate": _r(result.get("rate")), "count": result.get("count"),
                 "seconds": result.get("seconds")})
    if result.get("error"):
        return "fail", result["error"], figs
    s = share_pct(result["rate"], native)
    figs["share_pct"] = _r(s, 1)
    if not within(s, limit, tol):
        return "fail", f"share {s:.1f} %, limit {limit} % (+-{tol:g})", figs
    return "pass", "", figs


def overlap(results):
    """The fraction of the shortest run during which all runs were running (wall clock), or
    None when a start/end time is missing."""
    spans = [(r.get("t0"), r.get("t1")) for r in results if r]
    if len(spans) != len(results) or any(a is None or b is None for a, b in spans):
        return None
    start, end = max(a for a, _ in spans), min(b for _, b in spans)
    shortest = min(b - a for a, b in spans)
    if shortest <= 0:
        return None
    return max(0.0, end - start) / shortest


MIN_OVERLAP = 0.8


def eval_together(results, limits, native, mode, tol=SHARE_TOL_POINTS):
    """Processes run at the same time. `limits`: each process's limit in percent (None: a
    native neighbour, not judged). mode "each": every limited process within tol of its own
    limit (a 30 % and a 70 % container; 30 % against a native neighbour); mode "sum": the
    processes are one container and their shares' sum is within tol of limits[0] (two
    processes of one 50 % container); mode "cap": every limited process at most tol above its
    limit (the promise without an agent: never more than the share; two busy `force` containers
    take turns only with the arbiter, so below the share is not judged there). The runs must
    overlap for MIN_OVERLAP of the shortest."""
    figs = {"limits": list(limits), "native_rate": _r(native), "mode": mode}
    if native is None:
        return "error", "no native throughput to compare with", figs
    if any(r is None for r in results):
        return "fail", "a process gave no RESULT line", figs
    errs = [f"process {i}: {r['error']}" for i, r in enumerate(results) if r.get("error")]
    shares = [share_pct(r.get("rate"), native) for r in results]
    figs["rates"] = [_r(r.get("rate")) for r in results]
    figs["shares_pct"] = [_r(s, 1) for s in shares]
    ov = overlap(results)
    figs["overlap"] = _r(ov, 3)
    if errs:
        return "fail", "; ".join(errs), figs
    if ov is None or ov < MIN_OVERLAP:
        return "error", (f"the processes did not run together (overlap {figs['overlap']} of the "
                         f"shortest run, need {MIN_OVERLAP})"), figs
    if mode == "sum":
        total = sum(shares)
        figs["sum_pct"] = _r(total, 1)
        if not within(total, limits[0], tol):
            return "fail", (f"together {total:.1f} % ("
                            + " + ".join(f"{s:.1f}" for s in shares)
                            + f"), limit {limits[0]} % (+-{tol:g})"), figs
        return "pass", "", figs
    if mode == "cap":
        bad = [f"{s:.1f} % at limit {lim} %" for s, lim in zip(shares, limits)
               if lim is not None and s > lim + tol]
        if bad:
            return "fail", "share " + ", ".join(bad) + f" above the limit (+{tol:g})", figs
        return "pass", "", figs
    bad = [f"{s:.1f} % at limit {lim} %" for s, lim in zip(shares, limits)
           if lim is not None and not within(s, lim, tol)]
    if bad:
        return "fail", "share " + ", ".join(bad) + f" (+-{tol:g})", figs
    return "pass", "", figs


def parse_launch(lines):
    """compute_spin.cu launch mode: (list of us per launch of each round, error or None)."""
    rounds = []
    for line in lines:
        tag, kv = parse_line(line)
        if tag == "ROUND":
            v = to_float(kv.get("us"))
            if v is not None:
                rounds.append(v)
    kv = find_tag(lines, "RESULT")
    if kv is None:
        return rounds, "no RESULT line"
    if to_int(kv.get("rc"), 0) != 0:
        return rounds, f"launches failed with {kv.get('name')}"
    return rounds, None


def eval_launch_cost(native_rounds, preload_rounds, errors=()):
    """Empty-kernel launch, no limit: the preloaded median us per launch within
    max(LAUNCH_TOL_US, LAUNCH_TOL_FRACTION) of the native median (rounds of the alternated
    native and preloaded processes, same run)."""
    figs = {"native_us": [_r(x, 4) for x in native_rounds],
            "preload_us": [_r(x, 4) for x in preload_rounds]}
    if errors:
        return "fail", "; ".join(errors), figs
    if not native_rounds or not preload_rounds:
        return "fail", "no rounds measured", figs
    n, p = statistics.median(native_rounds), statistics.median(preload_rounds)
    allowed = max(LAUNCH_TOL_US, LAUNCH_TOL_FRACTION * n)
    figs.update({"native_median_us": _r(n, 4), "preload_median_us": _r(p, 4),
                 "added_us": _r(p - n, 4), "allowed_us": _r(allowed, 4)})
    if p - n > allowed:
        return "fail", (f"preloaded {p:.3f} us per launch vs native {n:.3f} us: "
                        f"+{p - n:.3f} us > {allowed:.3f} us"), figs
    return "pass", "", figs


def agent_share_values(samples, region=None, names=AGENT_SHARE_METRICS):
    """The agent's container compute share from parsed /metrics samples: (metric name, value)
    of the first of `names` present. Prefer the series whose labels mention the region file's
    name (its container); else the largest value of that metric. (None, None) if absent."""
    for name in names:
        series = [(labels, v) for n, labels, v in samples if n == name]
        if not series:
            continue
        if region:
            base = str(region).rsplit("/", 1)[-1]
            mine = [v for labels, v in series
                    if any(base and base in str(x) for x in labels.values())]
            if mine:
                return name, max(mine)
        return name, max(v for _, v in series)
    return None, None


def eval_agent_share(runner_share, agent_values, metric, tol=SHARE_TOL_POINTS):
    """The agent's measured share (the values read during the run's second half; their
    median) within tol points of the runner's. Skipped when /metrics has no such metric."""
    figs = {"metric": metric, "runner_share_pct": _r(runner_share, 1),
            "agent_values": [_r(v, 2) for v in agent_values]}
    if not agent_values:
        return "skipped", (f"the agent's /metrics has none of {', '.join(AGENT_SHARE_METRICS)} "
                           "(not built yet?)"), figs
    if runner_share is None:
        return "error", "no runner share to compare with", figs
    a = statistics.median(agent_values)
    figs["agent_share_pct"] = _r(a, 1)
    if abs(a - runner_share) > tol:
        return "fail", (f"agent says {a:.1f} %, the runner measured {runner_share:.1f} % "
                        f"(+-{tol:g})"), figs
    return "pass", "", figs


def hami_loaded(stderr_text, meminfo_total, limit_bytes):
    """Whether HAMi-core really loaded into a process: (bool, why). Evidence: its log lines
    ("HAMI-core" on stderr; "softmig" in its forks) or cudaMemGetInfo's total equal to its
    memory limit."""
    low = str(stderr_text or "").lower()
    logs = "hami-core" in low or "[softmig" in low
    total = meminfo_total == limit_bytes
    if logs or total:
        return True, ("log lines" if logs else "") + (" + " if logs and total else "") + (
            "cudaMemGetInfo total = limit" if total else "")
    return False, (f"no HAMi-core log line and cudaMemGetInfo total {meminfo_total} != limit "
                   f"{limit_bytes}: it did not load")


def eval_hami(result, native, limit, loaded):
    """HAMi-core side by side: a reference, not judged: status info with the share, or error
    when it did not load or run."""
    st, why, figs = eval_share(result, native, limit)
    ok, how = loaded
    figs["loaded"] = how
    if not ok:
        return "error", how, figs
    if st == "error" or (result is None or result.get("error")):
        return "error", why, figs
    verdict = "within" if st == "pass" else "outside"
    return "info", f"reference: share {figs.get('share_pct')} %, {verdict} +-5 of {limit}", figs


def _r(x, nd=3):
    return None if x is None else round(x, nd)


# ---- issue 30: default (work-conserving, with the agent's arbiter), streams, priorities ----

DEFAULT_ALONE_MIN_PCT = 95.0
DEFAULT_TOGETHER_MIN_PCT = 95.0
LATENCY_MAX_RATIO = 1.5


def parse_seconds(lines):
    """The SECOND lines of compute_spin.cu: kernels completed in each whole second, in order."""
    out = []
    for line in lines:
        tag, kv = parse_line(line)
        if tag == "SECOND":
            out.append(to_int(kv.get("kernels"), 0))
    return out


def parse_latency(lines):
    """The latency loop's RESULT: {"p50_ms", "p99_ms", "max_ms", "count"}, or None."""
    kv = find_tag(lines, "RESULT")
    if kv is None or "p99_ms" not in kv:
        return None
    return {"p50_ms": to_float(kv.get("p50_ms")), "p99_ms": to_float(kv.get("p99_ms")),
            "max_ms": to_float(kv.get("max_ms")), "count": to_int(kv.get("kernels"))}


def second_shares(seconds, native):
    """Each whole second's throughput as a percentage of the native throughput."""
    if not native:
        return []
    return [_r(k / native * 100.0, 1) for k in seconds]


def eval_default_alone(result, seconds, native, min_pct=DEFAULT_ALONE_MIN_PCT):
    """`default` alone at a share, with the agent's arbiter: the whole GPU is lent. Pass when
    the throughput from the second second on (the first holds the arbiter's first decision:
    within 1 s of starting) is at least min_pct of native, the run's whole too within 5."""
    figs = {"native_rate": _r(native), "per_second_pct": second_shares(seconds, native)}
    if native is None:
        return "error", "no native throughput to compare with", figs
    if result is None:
        return "fail", "no RESULT line", figs
    if result.get("error"):
        return "fail", result["error"], figs
    whole = share_pct(result.get("rate"), native)
    figs["share_pct"] = _r(whole, 1)
    after = seconds[1:]
    if after:
        late = sum(after) / len(after) / native * 100.0
        figs["after_first_second_pct"] = _r(late, 1)
    else:
        late = whole
    if late is None or late < min_pct:
        return "fail", (f"{late:.1f} % of native after the first second, want >= {min_pct:g} "
                        "(is the agent running? --no-arbiter?)"), figs
    return "pass", "", figs


def eval_default_together(results, shares, native, tol=SHARE_TOL_POINTS,
                          min_sum=DEFAULT_TOGETHER_MIN_PCT):
    """`default`, containers at `shares` % all busy, with the agent's arbiter: each gets its
    share plus the idle time in proportion (30 and 50: 37.5 and 62.5) within tol, together
    at least min_sum of native."""
    total = float(sum(shares))
    want = [s * 100.0 / total if total < 100 else float(s) for s in shares]
    st, why, figs = eval_together(results, [_r(w, 1) for w in want], native, "each", tol)
    figs["shares_set"] = list(shares)
    if st != "pass":
        return st, why, figs
    got = sum(figs["shares_pct"])
    figs["sum_pct"] = _r(got, 1)
    if got < min_sum:
        return "fail", f"together {got:.1f} % of native, want >= {min_sum:g}", figs
    return "pass", "", figs


def eval_borrow_back(lender_seconds, borrower_seconds, native, delay_s, shares,
                     tol=SHARE_TOL_POINTS, lent_min_pct=90.0):
    """`default`: a container at shares[0] % alone (lent the GPU), then one at shares[1] %
    starting delay_s later, agent running. Pass when the first one is lent the GPU in its
    last whole second alone (at least lent_min_pct of native), and within 1 s of the
    newcomer's start each is within tol of its part while both are busy (30 and 50: 37.5 and
    62.5): the borrower's second [delay_s + 1, delay_s + 2) and the newcomer's [1, 2).
    Shares over 1 s windows, printed."""
    total = float(sum(shares))
    want = [s * 100.0 / total if total < 100 else float(s) for s in shares]
    a = second_shares(lender_seconds, native)
    b = second_shares(borrower_seconds, native)
    figs = {"native_rate": _r(native), "per_second_pct": [a, b], "delay_s": delay_s,
            "want_pct": [_r(w, 1) for w in want]}
    if native is None:
        return "error", "no native throughput to compare with", figs
    d = int(delay_s)
    if len(a) < d + 2 or len(b) < 2 or d < 1:
        return "fail", (f"too few whole seconds: {len(a)} and {len(b)} (need {d + 2} and 2)"), figs
    alone, back, newcomer = a[d - 1], a[d + 1], b[1]
    figs.update({"lent_pct": alone, "back_pct": back, "newcomer_pct": newcomer})
    bad = []
    if alone < lent_min_pct:
        bad.append(f"alone {alone:.1f} % of native, want >= {lent_min_pct:g} (lent)")
    if not within(back, want[0], tol):
        bad.append(f"the borrower at {back:.1f} % 1-2 s after the newcomer started, "
                   f"want {want[0]:.1f} (+-{tol:g})")
    if not within(newcomer, want[1], tol):
        bad.append(f"the newcomer at {newcomer:.1f} % in its second second, "
                   f"want {want[1]:.1f} (+-{tol:g})")
    return ("fail", "; ".join(bad), figs) if bad else ("pass", "", figs)


def eval_latency(alone, beside, low_result, max_ratio=LATENCY_MAX_RATIO):
    """The priority case: the high-priority request loop's p99 beside a busy low-priority
    container, against the loop alone (same run): pass when within max_ratio. The low
    container's throughput is shown (it is held while the loop runs)."""
    figs = {"alone": alone, "beside": beside,
            "low_rate": _r((low_result or {}).get("rate"))}
    if not alone or not alone.get("p99_ms"):
        return "error", "no latency figures for the loop alone", figs
    if not beside or not beside.get("p99_ms"):
        return "fail", "no latency figures beside the low-priority container", figs
    ratio = beside["p99_ms"] / alone["p99_ms"]
    figs["p99_ratio"] = _r(ratio, 2)
    if ratio > max_ratio:
        return "fail", (f"p99 {beside['p99_ms']:.3f} ms beside, {alone['p99_ms']:.3f} ms alone "
                        f"({ratio:.2f}x, want <= {max_ratio:g}x)"), figs
    return "pass", "", figs
