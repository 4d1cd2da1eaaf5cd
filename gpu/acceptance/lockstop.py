"""Evaluation of the "stopped lock holder" cell (`--only lock-stop`): one preloaded process is
SIGSTOPped, while it holds the region lock, for a few seconds; the others keep allocating and
freeing through the preload against the same region.

Pure: a function of the record the runner fills (each process's protocol lines, exit status,
what the stop did, the region's `used` after every process exited). Rules in gpu/README.md
"Stopped lock holder".
"""

from .parse import find_tag, parse_line, to_float, to_int

# The preload's bound on waiting for the region lock (HAMI_LOCK_TIMEOUT_MS, milliseconds)
# when the environment does not set one.
LOCK_TIMEOUT_DEFAULT_MS = 2000
# A call may take this much longer than the bound (the driver call itself, scheduling) and
# still be "within the bound". A call held up by a stopped holder for the whole stop (3 s)
# is not.
LOCK_SLACK_MS = 500
# How long the victim stays stopped.
LOCK_STOP_S = 3.0
# The cell's name in results.json / results.md.
LOCK_STOP_TITLE = "stopped lock holder"


def lock_bound_ms(value):
    """The preload's lock bound from HAMI_LOCK_TIMEOUT_MS's value (None/empty: the default).
    Raises ValueError for anything but a non-negative integer, naming the value."""
    if value is None or str(value).strip() == "":
        return LOCK_TIMEOUT_DEFAULT_MS
    s = str(value).strip()
    if not s.isdigit():
        raise ValueError(f"HAMI_LOCK_TIMEOUT_MS={value!r} is not a non-negative integer")
    return int(s)


def proc_stats(lines):
    """The STATS line of a lock_stop process as numbers ({} when it never printed one)."""
    kv = find_tag(lines, "STATS")
    if kv is None:
        return {}
    out = {"role": kv.get("role"), "first_error": kv.get("first_error")}
    for k in ("calls", "ok", "oom", "refused", "over_quota", "errors", "free_errors", "slow",
              "threads"):
        out[k] = to_int(kv.get(k))
    for k in ("max_call_ms", "max_call_t", "slow_ms"):
        out[k] = to_float(kv.get(k))
    return out


def ticks(lines):
    """[(unix time, calls so far)] of the TICK lines."""
    out = []
    for line in lines:
        tag, kv = parse_line(line)
        if tag == "TICK":
            t, n = to_float(kv.get("t")), to_int(kv.get("calls"))
            if t is not None and n is not None:
                out.append((t, n))
    return out


def calls_during(lines, t_from, t_to):
    """Calls a process completed between two unix times, from its TICK lines (None when the
    ticks do not cover the window: a process blocked in a call prints none)."""
    before = [n for t, n in ticks(lines) if t <= t_from]
    inside = [n for t, n in ticks(lines) if t_from < t <= t_to]
    if not inside:
        return 0 if before else None
    return inside[-1] - (before[-1] if before else 0)


def _finished(p):
    """Why a process did not finish cleanly, or "" (DONE rc=0, STATS, exit status 0)."""
    done = find_tag(p.get("lines", []), "DONE")
    if p.get("timed_out"):
        return "timed out"
    if done is None:
        return f"no DONE line (exit status {p.get('rc')})"
    if done.get("rc") != "0" or p.get("rc") != 0:
        return f"DONE rc={done.get('rc')}, exit status {p.get('rc')}"
    if find_tag(p.get("lines", []), "STATS") is None:
        return "no STATS line"
    return ""


def eval_lock_stop(rec):
    """The stopped-lock-holder cell from the runner's record:

    rec = {"bound_ms", "slack_ms", "stop_s",
           "victim": {"pid", "lines", "rc", "timed_out"}, "workers": [same],
           "stop": {"holder": "caught" | "not caught" | "unknown", "attempts", "owner_tid",
                    "t_stop", "t_cont", "why", "error"},
           "region": {"used": bytes or None, "source", "error"}}

    error (premise not met): the victim could not be stopped, or was never seen holding the
    region lock when stopped. fail: a worker did not finish, a worker's call took longer than
    bound + slack, a call failed with anything but CUDA_ERROR_OUT_OF_MEMORY, a worker had no
    allocation granted at all, the victim did not finish after SIGCONT or was granted an
    allocation over the quota, or the region's used is not 0 once every process exited.
    Returns (status, reason, figures)."""
    bound = rec.get("bound_ms", LOCK_TIMEOUT_DEFAULT_MS)
    slack = rec.get("slack_ms", LOCK_SLACK_MS)
    stop = rec.get("stop") or {}
    region = rec.get("region") or {}
    victim = rec.get("victim") or {}
    workers = rec.get("workers") or []
    t_stop, t_cont = stop.get("t_stop"), stop.get("t_cont")
    figs = {
        "bound_ms": bound, "slack_ms": slack, "stop_s": rec.get("stop_s"),
        "holder": stop.get("holder"), "attempts": stop.get("attempts"),
        "owner_tid": stop.get("owner_tid"),
        "stopped_s": (round(t_cont - t_stop, 3) if t_stop is not None and t_cont is not None
                      else None),
        "region_used": region.get("used"), "region_source": region.get("source"),
        "victim": dict(proc_stats(victim.get("lines", [])), pid=victim.get("pid")),
        "workers": [],
    }
    for w in workers:
        st = proc_stats(w.get("lines", []))
        st["pid"] = w.get("pid")
        if t_stop is not None and t_cont is not None:
            st["calls_while_stopped"] = calls_during(w.get("lines", []), t_stop, t_cont)
        figs["workers"].append(st)
    if stop.get("error"):
        return "error", f"premise not met: {stop['error']}", figs
    if stop.get("holder") != "caught":
        why = stop.get("why") or stop.get("holder") or "no record"
        return "error", ("premise not met: the stopped process was not seen holding the region "
                         f"lock ({why}); nothing was checked against a stopped holder"), figs
    problems = []
    for w, st in zip(workers, figs["workers"]):
        pid = w.get("pid")
        why = _finished(w)
        if why:
            problems.append(f"worker {pid} did not finish: {why}")
            continue
        if st["max_call_ms"] is None or st["max_call_ms"] > bound + slack:
            problems.append(f"worker {pid}: a call blocked {st['max_call_ms']} ms > the lock "
                            f"bound {bound} ms (+ {slack} ms)")
        if st["errors"] or st["free_errors"]:
            problems.append(f"worker {pid}: {st['errors']} calls failed with other than "
                            f"CUDA_ERROR_OUT_OF_MEMORY (first: {st['first_error']})")
        if not st["ok"]:
            problems.append(f"worker {pid}: no allocation was granted at all")
    if not workers:
        problems.append("no worker ran")
    vwhy = _finished(victim)
    if vwhy:
        problems.append(f"the stopped process did not finish after SIGCONT: {vwhy}")
    elif figs["victim"].get("over_quota"):
        problems.append(f"the stopped process was granted {figs['victim']['over_quota']} "
                        "allocations over the quota")
    if region.get("used") is None:
        problems.append(f"region used unknown ({region.get('error') or 'not read'})")
    elif region["used"] != 0:
        problems.append(f"region used {region['used']} bytes after every process exited "
                        "(expected 0)")
    return ("fail" if problems else "pass"), "; ".join(problems), figs
