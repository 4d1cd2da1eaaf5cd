"""Evaluation of the physical group (issue 8): device memory that arrives by paths other than
the plain allocation calls (pool, mipmapped array, module globals, a pre-existing process).

Pure functions of the workloads' lines, nvidia-smi samples and the parsed audit, each
returning (status, reason, figures); rules in gpu/README.md "Physical group".
"""

import os

from .parse import find_tag, parse_line, smi_sum, stage, to_int, verdict_has, audit_bypass_for
from .spec import AUDIT_EXIT_FINDINGS, OOM_NAMES, POOL_DROPPED_LABEL


def is_oom_name(name):
    """Whether an error name is one of the two out-of-memory codes."""
    return str(name or "") in OOM_NAMES


def eval_pool_preload(a_lines, b_lines, samples, pids, quota_mib, grab_mib):
    """Two PyTorch cudaMallocAsync processes, one quota, under the preload.

    A allocates grab_mib and drops the tensor (its pool keeps the memory); then B asks for
    the same. Pass: A was granted, B got torch's OutOfMemoryError, nvidia-smi listed both
    processes at least once, and no nvidia-smi sample shows them together above the quota.
    The premise is checked too: when nvidia-smi listed A just after the drop, A still held at
    least grab_mib (else the pool kept nothing and B's refusal is not explained by it)."""
    a = find_tag(a_lines, "ALLOC")
    dropped = find_tag(a_lines, "DROPPED")
    b = find_tag(b_lines, "GRAB")
    listed = [s for s in samples if s.get("apps") is not None]
    both = [s for s in listed if all(p in s["apps"] for p in pids)]
    sums = [smi_sum(s["apps"], pids) for s in listed]
    after_drop = next((s["apps"].get(pids[0]) for s in listed
                       if s.get("label") == POOL_DROPPED_LABEL), None)
    figs = {
        "a_alloc": a,
        "a_reserved_after_drop": to_int(dropped.get("reserved")) if dropped else None,
        "b_grab": b,
        "smi_samples": len(listed),
        "smi_samples_with_both": len(both),
        "smi_max_sum_mib": max(sums) if sums else None,
        "smi_last_both_mib": both[-1]["apps"] if both else None,
        "smi_a_after_drop_mib": after_drop,
        "quota_mib": quota_mib,
    }
    problems = []
    for who, lines in (("A", a_lines), ("B", b_lines)):
        for t, kv in map(parse_line, lines):
            if t == "STEP_ERROR":
                problems.append(f"{who}: {kv.get('step')}: {kv.get('err')}")
    if not a:
        problems.append("A reported no allocation")
    elif a.get("ok") != "1":
        problems.append(f"A's allocation was refused ({a.get('kind')}): the row tested nothing")
    if not b:
        problems.append("B reported no allocation")
    elif b.get("ok") == "1":
        problems.append("B was granted its allocation")
    elif b.get("kind") != "OutOfMemoryError":
        problems.append(f"B refused with {b.get('kind')}, expected OutOfMemoryError")
    if not both:
        problems.append(f"nvidia-smi never listed both processes ({len(listed)} samples)")
    if after_drop is not None and after_drop < grab_mib:
        problems.append(f"A held only {after_drop} MiB after dropping its tensor (< {grab_mib} "
                        "MiB): its pool kept nothing, B's refusal is not explained by it")
    if sums and max(sums) > quota_mib:
        problems.append(f"nvidia-smi: the two processes held {max(sums)} MiB together "
                        f"> quota {quota_mib} MiB")
    return ("pass" if not problems else "fail"), "; ".join(problems), figs


def eval_mipmap_preload(lines, smi_mib, quota_mib):
    """cuMipmappedArrayCreate of 2 GiB under a 1 GiB quota, under the preload.

    Pass: refused with CUDA_ERROR_OUT_OF_MEMORY (and nvidia-smi shows the process within the
    quota), or granted and charged: the WL_PROBE_MB allocation that fitted before the array
    (PRE, the control) is refused with out-of-memory after it (NEXT)."""
    init, pre, mip, nxt = (stage(lines, t) for t in ("INIT", "PRE", "MIPMAP", "NEXT"))
    figs = {"init": init[1], "pre": pre[1], "mipmap": mip[1], "next": nxt[1],
            "smi_mib": smi_mib, "quota_mib": quota_mib}
    if init[0] != 0:
        return "fail", f"context creation failed ({init[1]})", figs
    if pre[0] != 0:
        return "fail", (f"control: the probe allocation before the array was refused "
                        f"({pre[1]}); the quota had no room, the row proves nothing"), figs
    if mip[0] is None:
        return "fail", "no MIPMAP line", figs
    if is_oom_name(mip[1]):
        figs["outcome"] = "refused"
        if smi_mib is None:
            return "fail", "refused, but nvidia-smi did not list the process", figs
        if smi_mib > quota_mib:
            return "fail", (f"refused, but nvidia-smi shows {smi_mib} MiB > quota "
                            f"{quota_mib} MiB"), figs
        return "pass", "", figs
    if mip[0] != 0:
        return "fail", f"refused with {mip[1]}, expected CUDA_ERROR_OUT_OF_MEMORY", figs
    figs["outcome"] = "granted"
    if is_oom_name(nxt[1]):
        figs["outcome"] = "charged"
        return "pass", "", figs
    return "fail", (f"granted and not charged: the next allocation got {nxt[1]} "
                    f"(nvidia-smi {smi_mib} MiB, quota {quota_mib} MiB)"), figs


def eval_module_preload(lines, smi_mib, quota_mib, lazy, control_ok):
    """A program with a 1.5 GiB `__device__` array under a 1 GiB quota, under the preload.

    Pass: an out-of-memory error at context creation (eager loading), at the first launch or
    its synchronisation (lazy loading), with nvidia-smi showing the process within the quota;
    or the module loads and is charged: the next WL_PROBE_MB allocation is refused with
    out-of-memory, where that allocation is known to fit without the module (lazy: PRE in the
    same process, before the launch; eager: `control_ok`, a PRE of an earlier cell of this
    group under the same quota)."""
    st = {t: stage(lines, t) for t in ("INIT", "PRE", "OUTBUF", "LAUNCH", "SYNC", "NEXT")}
    res = find_tag(lines, "RESULT")
    figs = {k.lower(): v[1] for k, v in st.items()}
    figs.update({"result_ok": res.get("ok") == "1" if res else None, "smi_mib": smi_mib,
                 "quota_mib": quota_mib, "loading": "lazy" if lazy else "eager"})

    def refused(where):
        figs["outcome"] = f"refused at {where}"
        if smi_mib is None:
            return "fail", f"refused at {where}, but nvidia-smi did not list the process", figs
        if smi_mib > quota_mib:
            return "fail", (f"refused at {where}, but nvidia-smi shows {smi_mib} MiB > quota "
                            f"{quota_mib} MiB"), figs
        return "pass", "", figs

    def charged(where):
        figs["outcome"] = f"charged (the {where} allocation refused)"
        control = st["PRE"][0] == 0 if lazy else control_ok
        figs["control_ok"] = control
        if not control:
            return "fail", (f"the {where} allocation was refused, but no control shows it fits "
                            "without the module"), figs
        return "pass", "", figs

    init, pre, launch, sync, nxt = (st[k] for k in ("INIT", "PRE", "LAUNCH", "SYNC", "NEXT"))
    if init[0] is None:
        return "fail", "no INIT line", figs
    if is_oom_name(init[1]):
        return refused("context creation / module load")
    if init[0] != 0:
        return "fail", (f"context creation failed with {init[1]}, expected success or "
                        "out-of-memory"), figs
    if pre[0] != 0:
        if lazy or not is_oom_name(pre[1]):
            return "fail", (f"control: the probe allocation before the launch got {pre[1]}; "
                            "the quota had no room, the row proves nothing"), figs
        return charged("first")  # eager: the module came with the context and was charged
    if launch[0] is None or sync[0] is None:
        return "fail", "no LAUNCH/SYNC line", figs
    if is_oom_name(launch[1]):
        return refused("the first launch")
    if is_oom_name(sync[1]):
        return refused("the first launch (synchronisation)")
    if launch[0] != 0 or sync[0] != 0:
        return "fail", (f"launch {launch[1]}, sync {sync[1]}: expected success or an "
                        "out-of-memory error"), figs
    if is_oom_name(nxt[1]):
        return charged("next")
    return "fail", (f"module loaded and not charged: the next allocation got {nxt[1]} "
                    f"(nvidia-smi {smi_mib} MiB, quota {quota_mib} MiB)"), figs


def escape_happened(row, lines_by_role):
    """Whether the workload really took the escape path (the premise of an agent cell):
    (True, "") or (False, why). lines_by_role: {"a": lines, "b": lines} for the pool row,
    {"main": lines} otherwise."""
    if row == "pool":
        a = find_tag(lines_by_role.get("a", []), "ALLOC")
        b = find_tag(lines_by_role.get("b", []), "GRAB")
        if not a or a.get("ok") != "1":
            return False, f"A's allocation was not granted ({a})"
        if not b or b.get("ok") != "1":
            return False, f"B's allocation was not granted ({b})"
        return True, ""
    lines = lines_by_role.get("main", [])
    if row == "mipmap":
        rc, name = stage(lines, "MIPMAP")
        return (rc == 0), ("" if rc == 0 else f"the mipmapped array was not created ({name})")
    if row.startswith("module"):
        (lrc, lname), (src, sname) = stage(lines, "LAUNCH"), stage(lines, "SYNC")
        ok = lrc == 0 and src == 0
        return ok, ("" if ok else f"the kernel did not run (launch {lname}, sync {sname})")
    if row == "pre-existing":
        kv = find_tag(lines, "HOLDING")
        return kv is not None, ("" if kv else "the process never held its memory")
    return False, f"unknown row {row}"


def region_matches(finding_region, region_path):
    """Whether a finding's region names the cell's region file (same path or file name)."""
    if not finding_region or not region_path:
        return False
    return (finding_region == region_path
            or os.path.basename(str(finding_region)) == os.path.basename(region_path))


def eval_agent_flag(audit, mode, pids, region_path, escaped):
    """The agent watched an escape path run with no preload (mode "none") or a preload that is
    blind to it (mode "blind").

    Pass, mode none: a bypass finding (or verdict) for every one of `pids`.
    Pass, mode blind: an over_limit finding for the cell's region (or one of its pids), or a
    drift finding for one of its pids. `escaped` = (bool, why) from escape_happened: when the
    escape did not happen there was nothing to flag, and the cell is an error, not a pass."""
    figs = {"mode": mode, "pids": list(pids), "region": region_path}
    if audit is not None:
        figs["findings"] = [{k: f.get(k) for k in ("kind", "reason", "pid", "region", "bytes")}
                            for f in audit["findings"]][:20]
        figs["verdicts"] = {str(p): (audit["processes"].get(p) or {}).get("verdict")
                            for p in pids}
    ok, why = escaped
    if not ok:
        return "error", f"the escape did not happen, nothing to flag: {why}", figs
    if audit is None:
        return "fail", "no audit report", figs
    if mode == "none":
        missing = [p for p in pids if not audit_bypass_for(audit, p)]
        if missing:
            kinds = sorted({f["kind"] for f in audit["findings"]}) or ["none"]
            return "fail", (f"no bypass finding for pid(s) {missing} (kinds found: "
                            f"{','.join(kinds)})"), figs
        return "pass", "", figs
    hits = []
    for f in audit["findings"]:
        if f["kind"] == "over_limit" and (region_matches(f.get("region"), region_path)
                                          or f["pid"] in pids):
            hits.append("over_limit")
        elif f["kind"] == "drift" and f["pid"] in pids:
            hits.append("drift")
    for p in pids:
        v = (audit["processes"].get(p) or {}).get("verdict")
        for k in ("over_limit", "drift"):
            if verdict_has(v, k):
                hits.append(k)
    figs["flagged_as"] = sorted(set(hits))
    if not hits:
        kinds = sorted({f["kind"] for f in audit["findings"]}) or ["none"]
        return "fail", (f"no over_limit or drift finding for the cell (kinds found: "
                        f"{','.join(kinds)})"), figs
    return "pass", "", figs


def eval_preexisting_audit(audit, rc, pid, escaped, smi_mib):
    """`hami-agent audit` started while an unpreloaded process that started earlier holds
    device memory. Pass: a bypass finding (or verdict) for that pid and the findings exit
    status (AUDIT_EXIT_FINDINGS)."""
    figs = {"audit_rc": rc, "pid": pid, "smi_mib": smi_mib}
    if audit is not None:
        figs["findings"] = [{k: f.get(k) for k in ("kind", "reason", "pid", "bytes")}
                            for f in audit["findings"]][:20]
        p = audit["processes"].get(pid) or {}
        figs["verdict"] = p.get("verdict")
        figs["baseline"] = (p.get("raw") or {}).get("baseline")
    ok, why = escaped
    if not ok:
        return "error", f"premise not met: {why}", figs
    problems = []
    if audit is None:
        problems.append("no audit report")
    elif not audit_bypass_for(audit, pid):
        problems.append(f"no bypass finding for pid {pid} (verdict {figs.get('verdict')})")
    if rc != AUDIT_EXIT_FINDINGS:
        problems.append(f"audit exited {rc}, expected {AUDIT_EXIT_FINDINGS}")
    return ("pass" if not problems else "fail"), "; ".join(problems), figs
