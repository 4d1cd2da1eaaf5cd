"""Evaluation of the physical2 group (issue 17): memory the driver takes for a context's limits,
a kernel's local memory, lazily loaded module statics, and contexts that do not fit.

Pure functions of the workloads' lines, nvidia-smi figures and the parsed audit, each returning
(status, reason, figures); rules in gpu/README.md "Physical group, part 2".
"""

from .parse import find_tag, parse_line, stage, smi_sum, to_int, verdict_has
from .physical import is_oom_name, region_matches
from .spec import MIB


def first_failure(lines, stages):
    """The first of `stages` whose line reports a non-zero rc: (stage, rc, name), or None.
    Missing lines are passed over (a mode without that stage, or a program that ended)."""
    for s in stages:
        rc, name = stage(lines, s)
        if rc is not None and rc != 0:
            return s, rc, name
    return None


def stage_figures(lines, stages):
    """{stage: error name} of the stages present, plus RESULT/AFTER ok and the limit values."""
    figs = {}
    for s in stages:
        rc, name = stage(lines, s)
        if rc is not None:
            figs[s.lower()] = name
    for tag, key in (("RESULT", "ok"), ("AFTER", "ok"), ("LIMIT_BEFORE", "value"),
                     ("LIMIT_AFTER", "value"), ("FUNCATTR", "local_bytes")):
        kv = find_tag(lines, tag)
        if kv is not None and key in kv:
            figs[f"{tag.lower()}_{key}"] = to_int(kv[key])
    return figs


def goes_on_ok(lines, goes_on):
    """Whether the stage that shows the program goes on succeeded (AFTER also needs ok=1)."""
    rc, _ = stage(lines, goes_on)
    if rc != 0:
        return False
    kv = find_tag(lines, goes_on) or {}
    return kv.get("ok", "1") == "1"


def eval_limit_native(lines, smi_mib, quota_mib, stages):
    """A C row run natively: the baseline. Pass when the program ran every stage without an
    error (figures: the driver's MiB, whether that is over the row's quota)."""
    figs = stage_figures(lines, stages)
    figs.update({"smi_mib": smi_mib, "quota_mib": quota_mib,
                 "over_quota": None if smi_mib is None else smi_mib > quota_mib})
    if stage(lines, "INIT")[0] is None:
        return "fail", "no INIT line", figs
    bad = first_failure(lines, stages)
    if bad:
        return "fail", f"natively, {bad[0]} failed with {bad[2]}", figs
    if find_tag(lines, "HOLDING") is None:
        return "fail", "the program did not reach HOLDING", figs
    if smi_mib is None:
        return "fail", "nvidia-smi did not list the process", figs
    why = "" if smi_mib > quota_mib else (f"natively within the quota ({smi_mib} <= "
                                          f"{quota_mib} MiB): the row tests nothing here")
    return "pass", why, figs


def eval_limit_preload(lines, smi_mib, quota_mib, stages, refuse_at, goes_on):
    """A C row under the preload at its quota (issue 17's acceptance).

    Pass: the first stage that failed is one of `refuse_at` (the call that would take the
    memory) and it failed with an out-of-memory code; every stage before it succeeded (PRE is
    the control: the quota had room without the path); the driver's figure while the program
    holds is within the quota (a process refused at INIT has no context: nvidia-smi need not
    list it); and, unless refused at INIT, the program went on (`goes_on` succeeded)."""
    figs = stage_figures(lines, stages)
    figs.update({"smi_mib": smi_mib, "quota_mib": quota_mib})
    if stage(lines, "INIT")[0] is None:
        return "fail", "no INIT line", figs
    bad = first_failure(lines, stages)
    if bad is None:
        got = "" if smi_mib is None else f"; nvidia-smi {smi_mib} MiB, quota {quota_mib} MiB"
        figs["outcome"] = "nothing refused"
        return "fail", f"nothing was refused (expected an out-of-memory at {'/'.join(refuse_at)}){got}", figs
    where, rc, name = bad
    figs["outcome"] = f"refused at {where}"
    if where not in refuse_at:
        what = "control: " if where == "PRE" else ""
        return "fail", (f"{what}{where} failed with {name}, expected success there and an "
                        f"out-of-memory at {'/'.join(refuse_at)}"), figs
    if not is_oom_name(name):
        return "fail", (f"refused at {where} with {name}, expected cudaErrorMemoryAllocation "
                        "or CUDA_ERROR_OUT_OF_MEMORY"), figs
    if where == "INIT":
        if smi_mib is not None and smi_mib > quota_mib:
            return "fail", (f"refused at INIT, but nvidia-smi shows {smi_mib} MiB > quota "
                            f"{quota_mib} MiB"), figs
        return "pass", "", figs
    if smi_mib is None:
        return "fail", f"refused at {where}, but nvidia-smi did not list the process", figs
    if smi_mib > quota_mib:
        return "fail", (f"refused at {where}, but nvidia-smi shows {smi_mib} MiB > quota "
                        f"{quota_mib} MiB"), figs
    if not goes_on_ok(lines, goes_on):
        rc2, name2 = stage(lines, goes_on)
        return "fail", (f"refused at {where}, but the program could not go on: {goes_on} "
                        f"{name2 if rc2 is not None else 'missing'}"
                        f"{'' if rc2 != 0 else ' (wrong result)'}"), figs
    return "pass", "", figs


def outcome_signature(lines, stages):
    """What a program saw, to compare two runs: each stage's rc, RESULT ok and AFTER ok."""
    sig = {s: stage(lines, s)[0] for s in stages}
    for tag in ("RESULT", "AFTER"):
        kv = find_tag(lines, tag)
        sig[f"{tag}.ok"] = None if kv is None else kv.get("ok")
    return sig


def eval_same_results(native_sig, preload_sig):
    """Programs within their quota see no difference: the preloaded run's signature (from
    outcome_signature or torch_signature) equals the native one."""
    figs = {"native": native_sig, "preload": preload_sig}
    if not native_sig:
        return "error", "no native run to compare with", figs
    if not preload_sig:
        return "fail", "no preloaded run", figs
    diff = sorted(k for k in set(native_sig) | set(preload_sig)
                  if native_sig.get(k) != preload_sig.get(k))
    if diff:
        return "fail", "differs from native in " + ", ".join(
            f"{k} ({native_sig.get(k)} -> {preload_sig.get(k)})" for k in diff), figs
    return "pass", "", figs


def oom_text(text):
    """Whether an exception's one line (underscores for spaces) names an out-of-memory."""
    t = str(text or "").replace("_", " ").lower()
    return ("out of memory" in t or "outofmemoryerror" in t
            or "cudaerrormemoryallocation" in t.replace(" ", "")
            or "cuda error out of memory" in t)


def torch_outcome(lines):
    """What one torch process of a ctx row did: {"granted": bytes or None, "refused": kind or
    None, "refused_at": step or None, "compute": True/False/None, "error": text or None}."""
    out = {"granted": None, "refused": None, "refused_at": None, "compute": None, "error": None}
    for line in lines:
        tag, kv = parse_line(line)
        if tag == "FILL":
            out["granted"] = to_int(kv.get("granted"))
            if kv.get("oom") == "1":
                out["refused"] = kv.get("kind")
                out["refused_at"] = "fill"
        elif tag == "GRAB":
            if kv.get("ok") == "1":
                out["granted"] = to_int(kv.get("bytes"))
            else:
                out["granted"] = 0
                out["refused"] = kv.get("kind")
                out["refused_at"] = "grab"
        elif tag == "STEP_ERROR":
            err = kv.get("err", "")
            if oom_text(err):
                out["refused"] = err
                out["refused_at"] = kv.get("step")
            else:
                out["error"] = f"{kv.get('step')}: {err}"
        elif tag == "COMPUTE_OK":
            out["compute"] = True
        elif tag == "COMPUTE_FAIL":
            out["compute"] = False
    return out


def torch_signature(lines):
    """The comparable part of torch_outcome (granted, refused or not, compute)."""
    o = torch_outcome(lines)
    return {"granted": o["granted"], "refused": o["refused"] is not None,
            "compute": o["compute"], "error": o["error"]}


def smi_max(samples, pids):
    """(max sum of pids' MiB over the samples that listed any, number of such samples)."""
    sums = [smi_sum(s["apps"], pids) for s in samples
            if s.get("apps") is not None and any(p in s["apps"] for p in pids)]
    return (max(sums) if sums else None), len(sums)


def eval_ctx_native(lines_by_proc, samples, pids, quota_mib):
    """A torch row natively: the baseline. Pass when every process got what it asked (no
    refusal, no error); figures: the most nvidia-smi showed for them together."""
    outs = {k: torch_outcome(v) for k, v in lines_by_proc.items()}
    top, n = smi_max(samples, pids)
    figs = {"procs": outs, "smi_max_sum_mib": top, "smi_samples": n, "quota_mib": quota_mib,
            "over_quota": None if top is None else top > quota_mib}
    problems = []
    for k, o in outs.items():
        if o["error"]:
            problems.append(f"{k}: {o['error']}")
        elif o["refused"]:
            problems.append(f"{k} was refused natively ({o['refused']})")
        elif not o["granted"]:
            problems.append(f"{k} reported no allocation")
    if top is None:
        problems.append("nvidia-smi never listed the processes")
    return ("pass" if not problems else "fail"), "; ".join(problems), figs


def eval_ctx_preload(row, lines_by_proc, samples, pids, quota_mib):
    """A torch row under the preload at the 3 GiB quota.

    ctx-second: A ("a") fills until refused with torch's OutOfMemoryError, then B ("b")
    initialises CUDA and asks for a little: B must be refused with an out-of-memory error
    (OutOfMemoryError, or the CUDA error "out of memory" at its context); A goes on (its
    matmul after freeing is right). ctx-race: both fill at once; each ends refused with an
    out-of-memory error (at its fill or its context), at least one got memory, and every
    process that got memory goes on. Both: no nvidia-smi sample shows the container's
    processes above the quota, and at least one sample listed them."""
    outs = {k: torch_outcome(v) for k, v in lines_by_proc.items()}
    top, n = smi_max(samples, pids)
    figs = {"procs": outs, "smi_max_sum_mib": top, "smi_samples": n, "quota_mib": quota_mib}
    problems = []
    for k, o in outs.items():
        if o["error"]:
            problems.append(f"{k.upper()}: {o['error']}")
    if row == "ctx-second":
        a, b = outs.get("a", {}), outs.get("b", {})
        if not a.get("granted"):
            problems.append("A got no memory: the row tested nothing")
        elif not a.get("refused"):
            problems.append(f"A was never refused (granted {a['granted'] // MIB} MiB)")
        elif not oom_text(a["refused"]):
            problems.append(f"A refused with {a['refused']}, expected OutOfMemoryError")
        if a.get("compute") is not True:
            problems.append(f"A could not go on (compute {a.get('compute')})")
        if b.get("granted"):
            problems.append(f"B was granted {b['granted'] // MIB} MiB")
        elif not b.get("refused"):
            problems.append("B reported neither a grant nor an out-of-memory refusal")
        figs["b_refused_at"] = b.get("refused_at")
    else:
        if not any(o.get("granted") for o in outs.values()):
            problems.append("no process got memory: the row tested nothing")
        for k, o in outs.items():
            if not o["refused"] and not o["error"]:
                problems.append(f"{k.upper()} was never refused (granted "
                                f"{(o['granted'] or 0) // MIB} MiB)")
            if o["granted"] and o["compute"] is not True:
                problems.append(f"{k.upper()} could not go on (compute {o['compute']})")
    if top is None:
        problems.append(f"nvidia-smi never listed the processes ({len(samples)} samples)")
    elif top > quota_mib:
        problems.append(f"nvidia-smi: the container's processes held {top} MiB together > "
                        f"quota {quota_mib} MiB")
    return ("pass" if not problems else "fail"), "; ".join(problems), figs


def native_escaped(rec_lines):
    """Whether a native run really held device memory (the premise of its agent-none cell):
    (True, "") or (False, why). `rec_lines`: a C program's lines, or {role: lines} of a torch
    row."""
    if isinstance(rec_lines, dict):
        got = [r for r, lines in rec_lines.items() if torch_outcome(lines)["granted"]]
        ok = bool(got) and len(got) == len(rec_lines)
        return ok, ("" if ok else f"not every process got memory (only {got or 'none'})")
    if stage(rec_lines, "INIT")[0] != 0 or find_tag(rec_lines, "HOLDING") is None:
        return False, "the program did not get its context and hold"
    return True, ""


def eval_no_finding(audit, pids, region_path):
    """The agent watched the preloaded runs: no finding (and no verdict other than ok) for
    the cell's pids or region. `audit` None (not run, unparsable) is an error."""
    figs = {"pids": list(pids), "region": region_path}
    if not pids:
        return "error", "no preloaded process ran: nothing to watch", figs
    if audit is None:
        return "error", "no audit report", figs
    hits = []
    for f in audit["findings"]:
        if f.get("pid") in pids or (f.get("pid") is None
                                    and region_matches(f.get("region"), region_path)):
            hits.append({k: f.get(k) for k in ("kind", "reason", "pid", "bytes")})
    for p in pids:
        v = (audit["processes"].get(p) or {}).get("verdict")
        for k in ("bypass", "over_limit", "drift"):
            if verdict_has(v, k):
                hits.append({"kind": k, "pid": p, "reason": "verdict"})
    figs["findings"] = hits[:20]
    figs["seen"] = [p for p in pids if p in audit["processes"]]
    if hits:
        kinds = sorted({h["kind"] for h in hits})
        return "fail", f"the agent raised {','.join(kinds)} for the preloaded run", figs
    return "pass", "", figs
