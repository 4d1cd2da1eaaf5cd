#!/usr/bin/env python3
"""Real-GPU acceptance runner for hami-rs (issue 5). See gpu/README.md.

One command on the GPU machine:

    python3 gpu-bundle/gpu/run_acceptance.py --out $OUT

Python 3 standard library only; torch and CuPy are imported only inside the workload
subprocesses (gpu/workloads/). Every subprocess has a timeout, the whole run has a deadline,
and results are rewritten after every step, so a crash or a hang still leaves
$OUT/results.json, $OUT/results.md and $OUT/logs.txt behind.
"""

import argparse
import json
import os
import queue
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
WORKLOADS_DIR = os.path.join(HERE, "workloads")
MIB = 1 << 20
GIB = 1 << 30

# Observed-bytes tolerance (documented in gpu/README.md): the agent's observed data bytes for a
# process may differ from the framework's own figure by max(64 MiB, 5 %).
TOL_MIN_BYTES = 64 * MIB
TOL_FRACTION = 0.05
# A bypass must be reported within this many seconds of the first allocation.
BYPASS_LATENCY_S = 1.0

# Workload name -> how to run it. "kind" selects the command; "env" is added to the environment.
WORKLOADS = [
    {"name": "torch-default", "kind": "torch", "env": {}, "oom": "OutOfMemoryError"},
    {
        "name": "torch-expandable",
        "kind": "torch",
        "env": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"},
        "oom": "OutOfMemoryError",
    },
    {
        "name": "torch-async",
        "kind": "torch",
        "env": {"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"},
        "oom": "OutOfMemoryError",
    },
    {"name": "cupy", "kind": "cupy", "env": {}, "oom": "OutOfMemoryError"},
    {"name": "nvcc-static", "kind": "cuda_static", "env": {}, "oom": "cudaErrorMemoryAllocation"},
    {"name": "nvcc-shared", "kind": "cuda_shared", "env": {}, "oom": "cudaErrorMemoryAllocation"},
]
CHECKS = ["enforced", "virtualised", "observed", "bypass"]
CHECK_TITLES = {
    "native": "native",
    "enforced": "enforced",
    "virtualised": "virtualised",
    "observed": "observed",
    "bypass": "bypass caught",
}

# The "physical" group (issue 8, `--only physical`): device memory that arrives by paths other
# than the plain allocation calls. Rows are escape paths, columns what must catch them.
PHYS_ROWS = ["pool", "mipmap", "module-lazy", "module-eager", "pre-existing"]
PHYS_ROW_TITLES = {
    "pool": "torch cudaMallocAsync pool, 2 processes, 4 GiB",
    "mipmap": "cuMipmappedArrayCreate 2 GiB, quota 1 GiB",
    "module-lazy": "1.5 GiB __device__ global (lazy loading), quota 1 GiB",
    "module-eager": "same, CUDA_MODULE_LOADING=EAGER",
    "pre-existing": "unpreloaded torch holding 1.5 GiB before the audit",
}
PHYS_CHECKS = ["preload", "agent-none", "agent-blind", "audit"]
PHYS_CHECK_TITLES = {
    "preload": "preload refuses or charges",
    "agent-none": "agent flags it, no preload (bypass)",
    "agent-blind": "agent flags it, blind preload (over_limit/drift)",
    "audit": "audit exits with findings (bypass)",
}
# Which cells each row has (the others are "-" in the table).
PHYS_CELLS = {
    "pool": ["preload", "agent-none", "agent-blind"],
    "mipmap": ["preload", "agent-none", "agent-blind"],
    "module-lazy": ["preload", "agent-none", "agent-blind"],
    "module-eager": ["preload"],
    "pre-existing": ["audit"],
}
PHYS_POOL_QUOTA_MB = 4096
PHYS_POOL_GRAB_MB = 2560
PHYS_SMALL_QUOTA_MB = 1024
PHYS_PREEXISTING_MB = 1536
# After the workload holds, the agent gets this long before its audit is stopped (evaluation
# every 250 ms, findings settle 300 ms, NVML is refreshed at a bounded rate).
PHYS_AGENT_SETTLE_S = 3.0
# Upper bound of a physical-group audit; it is ended with SIGINT once the workload holds.
PHYS_AUDIT_MAX_S = 90

# Variables that must not leak from the caller into the runs (they change what is measured).
SCRUB_ENV = [
    "LD_PRELOAD",
    "CUDA_DEVICE_MEMORY_LIMIT",
    "CUDA_DEVICE_MEMORY_SHARED_CACHE",
    "PYTORCH_CUDA_ALLOC_CONF",
    "CUDA_VISIBLE_DEVICES",
    "CUDA_MODULE_LOADING",
]


# --------------------------------------------------------------------------------------------
# Pure helpers (unit-tested in gpu/test_runner.py)
# --------------------------------------------------------------------------------------------


def parse_line(line):
    """`TAG k=v k=v` -> (tag, {k: v}); values stay strings. Non-protocol lines -> (None, {})."""
    parts = line.strip().split()
    if not parts or not parts[0].replace("_", "").isalnum() or not parts[0].isupper():
        return None, {}
    kv = {}
    for p in parts[1:]:
        if "=" in p:
            k, v = p.split("=", 1)
            kv[k] = v
    return parts[0], kv


def find_tag(lines, tag):
    """kv of the first protocol line with this tag, or None."""
    for line in lines:
        t, kv = parse_line(line)
        if t == tag:
            return kv
    return None


def to_int(v, default=None):
    try:
        return int(str(v).strip())
    except (TypeError, ValueError):
        try:
            return int(float(str(v).strip()))
        except (TypeError, ValueError):
            return default


def to_float(v, default=None):
    try:
        return float(str(v).strip())
    except (TypeError, ValueError):
        return default


def tolerance(figure):
    """Allowed |observed - figure| in bytes."""
    return max(TOL_MIN_BYTES, int(TOL_FRACTION * max(0, figure)))


def _first_key(d, names, default=None):
    for n in names:
        if isinstance(d, dict) and n in d and d[n] is not None:
            return d[n]
    return default


def parse_audit_json(text):
    """THE one place that knows `hami-agent audit --json` output.

    Returns {"processes": {pid: {"pid", "hooked", "observed_bytes", "observed_data_bytes",
    "accounted_bytes", "verdict", "raw"}}, "findings": [{"kind", "pid", "bytes", "raw"}]}.
    Accepts a single JSON document, or JSON lines (the last complete object wins).
    """
    doc = None
    text = text.strip()
    try:
        doc = json.loads(text)
    except ValueError:
        for line in reversed(text.splitlines()):
            line = line.strip()
            if line.startswith("{"):
                try:
                    doc = json.loads(line)
                    break
                except ValueError:
                    continue
    if not isinstance(doc, dict):
        raise ValueError("audit output is not a JSON object")
    procs = {}
    for p in doc.get("processes", []) or []:
        pid = to_int(_first_key(p, ["pid", "host_pid"]))
        if pid is None:
            continue
        observed = _first_key(p, ["observed_bytes", "observed"])
        data = _first_key(p, ["observed_data_bytes", "observed_data"])
        if data is None and isinstance(p.get("observed_by_kind"), dict):
            data = p["observed_by_kind"].get("data")
        procs[pid] = {
            "pid": pid,
            "hooked": _first_key(p, ["hooked", "preloaded"]),
            "observed_bytes": to_int(observed),
            "observed_data_bytes": to_int(data),
            "accounted_bytes": to_int(_first_key(p, ["accounted_bytes", "accounted"])),
            "verdict": _first_key(p, ["verdict", "status"]),
            "raw": p,
        }
    findings = []
    for f in doc.get("findings", []) or []:
        findings.append(
            {
                "kind": str(_first_key(f, ["kind", "type"], "")).lower().replace("-", "_"),
                "pid": to_int(_first_key(f, ["pid", "host_pid"])),
                "bytes": to_int(_first_key(f, ["bytes", "observed_bytes"])),
                "region": _first_key(f, ["region"]),
                "reason": _first_key(f, ["reason"]),
                "raw": f,
            }
        )
    return {"processes": procs, "findings": findings}


def verdict_has(verdict, kind):
    """hami-agent's verdict is `ok` or the standing finding kinds, comma-separated."""
    return kind in [v.strip().lower().replace("-", "_") for v in str(verdict or "").split(",")]


def audit_bypass_for(audit, pid):
    """True if the parsed audit has a bypass finding (or a bypass verdict) for pid."""
    for f in audit["findings"]:
        if f["kind"] == "bypass" and f["pid"] == pid:
            return True
    p = audit["processes"].get(pid)
    return bool(p and verdict_has(p.get("verdict"), "bypass"))


def parse_prometheus(text):
    """Prometheus text format -> [(name, {label: value}, float)]."""
    out = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        labels = {}
        if "{" in line:
            name, rest = line.split("{", 1)
            lab, _, val = rest.rpartition("}")
            for item in _split_labels(lab):
                if "=" in item:
                    k, v = item.split("=", 1)
                    labels[k.strip()] = v.strip().strip('"')
        else:
            name, _, val = line.partition(" ")
        parts = val.split()
        if not parts:
            continue
        v = to_float(parts[0])
        if v is None:
            continue
        out.append((name.strip(), labels, v))
    return out


def _split_labels(s):
    items, cur, quoted, esc = [], [], False, False
    for ch in s:
        if esc:
            cur.append(ch)
            esc = False
        elif ch == "\\":
            esc = True
        elif ch == '"':
            quoted = not quoted
            cur.append(ch)
        elif ch == "," and not quoted:
            items.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if cur:
        items.append("".join(cur))
    return items


def metrics_bypass_count(samples, pid=None):
    """Sum of bypass-finding samples; with pid, only samples labelled with that pid.

    hami-agent exports `hami_findings_total{kind}` (counter, raised since start) and
    `hami_findings{kind}` (standing now); the counter is used when present, since the standing
    gauge also falls when an earlier bypass process exits."""
    counters = any("finding" in n and n.endswith("_total") for n, _, _ in samples)
    total = 0.0
    for name, labels, v in samples:
        if "finding" not in name or (counters and not name.endswith("_total")):
            continue
        if labels.get("kind", "").lower() != "bypass":
            continue
        if pid is not None and to_int(labels.get("pid")) != pid:
            continue
        total += v
    return total


def audit_says_ready(stderr_text):
    """Whether a starting `audit` has logged that its probes are attached."""
    t = stderr_text.lower()
    return any(w in t for w in ("hami-agent: ready", "attached", "watching", "listening"))


def _read_text(path):
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def metrics_observed_for_pid(samples, pid):
    """(observed bytes, hooked) from `hami_process_observed_bytes{pid,hooked}`, or (None, None)."""
    for name, labels, v in samples:
        if "observed" in name and to_int(labels.get("pid")) == pid:
            h = labels.get("hooked")
            return int(v), (None if h is None else h.lower() == "true")
    return None, None


def metrics_for_pid(samples, pid):
    """Samples whose labels carry pid (any of pid/host_pid), as {name: value}."""
    out = {}
    for name, labels, v in samples:
        if to_int(labels.get("pid", labels.get("host_pid"))) == pid:
            key = name + ("{kind=%s}" % labels["kind"] if "kind" in labels else "")
            out[key] = v
    return out


# Region layout (hami-common/src/layout.rs), versions 1 and 2. Read directly as a cross-check
# of `inspect`. Version 2 added the usage kinds "pool" and "other" to every slot.
REGION_MAGIC = b"HAMIRSv\x01"
REGION_HEADER_SIZE = 968
REGION_MAX_DEVICES = 16
REGION_MAX_SLOTS = 1024
REGION_USAGE_KINDS = {1: ("context", "module", "data"),
                      2: ("context", "module", "data", "pool", "other")}
_OFF_LIMITS = 136
_OFF_USED = 584


def region_slot_size(version):
    """Bytes of one slot: pid, status, start time, then [device][kind] u64 counters."""
    return 16 + REGION_MAX_DEVICES * len(REGION_USAGE_KINDS[version]) * 8


def read_region_bytes(data):
    """Decode a v1/v2 region file: {"limits", "used", "slots": [{"pid", "status", "usage"}]}."""
    if len(data) < REGION_HEADER_SIZE or data[:8] != REGION_MAGIC:
        raise ValueError("not a region (magic)")
    version, header_size, total_size = struct.unpack_from("<IIQ", data, 8)
    if version not in REGION_USAGE_KINDS or header_size != REGION_HEADER_SIZE:
        raise ValueError(f"region version {version} header {header_size}: layout changed")
    if len(data) < total_size:
        raise ValueError("region truncated")
    kinds = REGION_USAGE_KINDS[version]
    slot_size = region_slot_size(version)
    limits = list(struct.unpack_from("<16Q", data, _OFF_LIMITS))
    used = list(struct.unpack_from("<16Q", data, _OFF_USED))
    slots = []
    nslots = min(REGION_MAX_SLOTS, (total_size - header_size) // slot_size)
    for i in range(nslots):
        off = header_size + i * slot_size
        pid, status, _start = struct.unpack_from("<IIQ", data, off)
        if status == 0 and pid == 0:
            continue
        usage = struct.unpack_from(f"<{REGION_MAX_DEVICES * len(kinds)}Q", data, off + 16)
        dev0 = dict(zip(kinds, usage[:len(kinds)]))
        slots.append({"slot": i, "pid": pid, "status": status, "usage": dev0,
                      "total": sum(usage)})
    return {"limits": limits, "used": used, "slots": slots}


def parse_inspect_json(text):
    """THE one place that knows `hami-agent inspect --json`: -> {"limit", "used", "slots"}."""
    doc = json.loads(text)
    devs = _first_key(doc, ["devices", "device"], []) or []
    limit = used = None
    if devs and isinstance(devs, list):
        d0 = devs[0]
        limit = to_int(_first_key(d0, ["limit", "limit_bytes"]))
        used = to_int(_first_key(d0, ["used", "used_bytes", "admitted", "admitted_bytes"]))
    else:
        limit = to_int(_first_key(doc, ["limit", "limit_bytes"]))
        used = to_int(_first_key(doc, ["used", "used_bytes"]))
    slots = []
    for s in _first_key(doc, ["slots", "processes"], []) or []:
        slots.append({"pid": to_int(s.get("pid")), "raw": s})
    return {"limit": limit, "used": used, "slots": slots}


def parse_cudaprobe_bench(text):
    """ns per pair of the last `op=bench-pair` line of cudaprobe's output, or None."""
    ns = None
    for line in text.splitlines():
        if line.startswith("op=bench-pair"):
            kv = dict(p.split("=", 1) for p in line.split() if "=" in p)
            if kv.get("rc", "0") == "0" and to_int(kv.get("failures"), 1) == 0:
                ns = to_float(kv.get("ns_per_pair"))
    return ns


def parse_compute_apps(text):
    """`nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits`."""
    out = {}
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 2:
            continue
        pid = to_int(parts[0])
        mib = to_int(parts[1].replace("MiB", "").strip())
        if pid is not None and mib is not None:
            out[pid] = out.get(pid, 0) + mib
    return out


def parse_smi_memory(text):
    """`nvidia-smi --query-gpu=memory.total,memory.used --format=csv,noheader,nounits`
    -> (total_mib, used_mib) of the first GPU, or (None, None)."""
    for line in text.splitlines():
        parts = [p.strip().replace("MiB", "").strip() for p in line.split(",")]
        if len(parts) >= 2 and to_int(parts[0]) is not None:
            return to_int(parts[0]), to_int(parts[1])
    return None, None


# ---- evaluation of one workload's lines ----


def cell(workload, check, status, reason="", figures=None, stderr_tail=""):
    return {
        "workload": workload,
        "check": check,
        "status": status,
        "reason": reason,
        "figures": figures or {},
        "stderr_tail": stderr_tail,
    }


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


# ---- evaluation of the "physical" group (issue 8): device memory that arrives by other paths ----

# The two out-of-memory codes: the driver API's and the runtime's (both 2).
OOM_NAMES = ("CUDA_ERROR_OUT_OF_MEMORY", "cudaErrorMemoryAllocation")
# `hami-agent audit`'s exit status when it raised a bypass or over-limit finding
# (hami-user/src/report.rs EXIT_FINDINGS; gpu/test_runner.py checks it still is).
AUDIT_EXIT_FINDINGS = 2


def is_oom_name(name):
    return str(name or "") in OOM_NAMES


def stage(lines, tag):
    """A `TAG rc=<n> name=<error name>` line of the C escape programs -> (rc, name), or
    (None, None) when the line is missing."""
    kv = find_tag(lines, tag)
    if kv is None:
        return None, None
    return to_int(kv.get("rc")), kv.get("name")


def smi_sum(sample, pids):
    """Sum of used MiB of pids in one parsed `--query-compute-apps` sample (missing pids: 0)."""
    return sum(sample.get(p, 0) for p in pids)


POOL_DROPPED_LABEL = "A dropped its tensor"


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


# ---- report ----


def md(text, n=300):
    """One markdown table/list-safe line."""
    s = " ".join(str(text).split()).replace("|", "/")
    return s if len(s) <= n else s[: n - 3] + "..."


def _gib(b):
    return "?" if b is None else f"{b / GIB:.2f} GiB"


def _mib(b):
    return "?" if b is None else f"{b / MIB:.0f} MiB"


def short_figure(c):
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
    standard = bool(results.get("cells")) or not results.get("physical")
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
    notes = results.get("notes", [])
    if notes:
        out += ["", "## Notes", ""] + [f"- {md(n)}" for n in notes]
    return "\n".join(out) + "\n"


def summarize(cells):
    s = {"total": len(cells), "pass": 0, "fail": 0, "error": 0, "skipped": 0}
    for c in cells:
        s[c["status"]] = s.get(c["status"], 0) + 1
    return s


# --------------------------------------------------------------------------------------------
# Process plumbing
# --------------------------------------------------------------------------------------------


class Deadline:
    """The whole run's time budget."""

    def __init__(self, seconds):
        self.end = time.monotonic() + seconds

    def left(self):
        return self.end - time.monotonic()

    def cap(self, t, reserve=15.0):
        """A subprocess timeout: t, but never past the deadline minus a reserve."""
        return max(1.0, min(t, self.left() - reserve))

    def expired(self, reserve=15.0):
        return self.left() < reserve


class Log:
    """The one combined log file ($OUT/logs.txt), size-capped, flushed as it goes."""

    def __init__(self, path, cap=15 * MIB):
        self.path = path
        self.cap = cap
        self.size = 0
        self.lock = threading.Lock()
        self.f = open(path, "w", encoding="utf-8", errors="replace")

    def write(self, text):
        with self.lock:
            if self.size >= self.cap:
                return
            if self.size + len(text) > self.cap:
                text = text[: self.cap - self.size] + "\n[log cap reached]\n"
            self.f.write(text)
            self.f.flush()
            self.size += len(text)

    def section(self, title, body=""):
        stamp = time.strftime("%H:%M:%S")
        self.write(f"\n===== [{stamp}] {title}\n{body}")
        if body and not body.endswith("\n"):
            self.write("\n")

    def say(self, msg):
        line = f"[{time.strftime('%H:%M:%S')}] {msg}"
        print(line, flush=True)
        self.write(line + "\n")


def _kill_group(p):
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError, OSError):
        pass


def run_cmd(argv, timeout, env=None, cwd=None, log=None, title=None, stdin_text=None):
    """Run to completion with a timeout (kills the whole process group). Never raises."""
    t0 = time.monotonic()
    res = {"argv": argv, "rc": None, "stdout": "", "stderr": "", "timed_out": False}
    try:
        p = subprocess.Popen(
            argv,
            env=env,
            cwd=cwd,
            stdin=subprocess.PIPE if stdin_text is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            errors="replace",
            start_new_session=True,
        )
    except OSError as e:
        res["stderr"] = f"cannot start: {e}"
        res["seconds"] = 0.0
        if log:
            log.section(title or " ".join(map(str, argv)), res["stderr"])
        return res
    try:
        out, err = p.communicate(input=stdin_text, timeout=timeout)
        res["rc"] = p.returncode
    except subprocess.TimeoutExpired:
        _kill_group(p)
        try:
            out, err = p.communicate(timeout=5)
        except subprocess.TimeoutExpired:
            out, err = "", ""
        res["timed_out"] = True
        res["rc"] = p.returncode
    res["stdout"], res["stderr"] = out or "", err or ""
    res["seconds"] = round(time.monotonic() - t0, 3)
    if log:
        log.section(
            (title or " ".join(map(str, argv)))
            + f"  rc={res['rc']} timed_out={res['timed_out']} {res['seconds']}s",
            f"$ {' '.join(map(str, argv))}\n--- stdout\n{_cap(res['stdout'])}\n--- stderr\n{_cap(res['stderr'])}",
        )
    return res


def _cap(s, n=200_000):
    return s if len(s) <= n else s[:n // 2] + "\n[...]\n" + s[-n // 2:]


def tail(s, n=1500):
    return s[-n:] if s else ""


class Proc:
    """A protocol-speaking workload: line-by-line stdout, commands on stdin."""

    def __init__(self, name, argv, env, cwd=None, log=None, budget=120.0):
        self.name = name
        self.end = time.monotonic() + budget  # no wait on this process goes past this
        self.argv = argv
        self.log = log
        self.lines = []
        self.err = []
        self.q = queue.Queue()
        self.t_start = time.time()
        self.p = subprocess.Popen(
            argv,
            env=env,
            cwd=cwd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            errors="replace",
            bufsize=1,
            start_new_session=True,
        )
        self.pid = self.p.pid
        self.timed_out = False
        threading.Thread(target=self._read_out, daemon=True).start()
        threading.Thread(target=self._read_err, daemon=True).start()
        self.rc = None

    def _read_out(self):
        for line in self.p.stdout:
            line = line.rstrip("\n")
            self.lines.append(line)
            self.q.put((time.time(), line))
        self.q.put((time.time(), None))

    def _read_err(self):
        for line in self.p.stderr:
            self.err.append(line)

    def expect(self, tags, timeout):
        """Wait for the next line whose tag is in tags. Returns (tag, kv, t) or (None, reason, t)."""
        end = min(time.monotonic() + timeout, self.end)
        while True:
            left = end - time.monotonic()
            if left <= 0:
                self.timed_out = True
                return None, "timeout waiting for " + "/".join(tags), time.time()
            try:
                t, line = self.q.get(timeout=left)
            except queue.Empty:
                continue
            if line is None:
                self.q.put((t, None))  # keep EOF visible for later calls
                return None, "process ended before " + "/".join(tags), t
            tag, kv = parse_line(line)
            if tag in tags:
                return tag, kv, t

    def send(self, text="go"):
        try:
            self.p.stdin.write(text + "\n")
            self.p.stdin.flush()
            return True
        except (BrokenPipeError, OSError, ValueError):
            return False

    def finish(self, timeout):
        """Close stdin, wait for exit (kill the group on timeout), log everything."""
        try:
            self.p.stdin.close()
        except (BrokenPipeError, OSError):
            pass
        try:
            self.rc = self.p.wait(timeout=max(1.0, min(timeout, self.end - time.monotonic())))
        except subprocess.TimeoutExpired:
            self.timed_out = True
            _kill_group(self.p)
            try:
                self.rc = self.p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.rc = None
        time.sleep(0.05)  # let the reader threads drain
        if self.log:
            self.log.section(
                f"{self.name}: pid={self.pid} rc={self.rc} timed_out={self.timed_out} "
                f"{time.time() - self.t_start:.1f}s",
                f"$ {' '.join(map(str, self.argv))}\n--- stdout\n" + "\n".join(self.lines)
                + "\n--- stderr\n" + _cap("".join(self.err)),
            )
        return self.rc

    def stderr_tail(self, n=1500):
        return tail("".join(self.err), n)

    @property
    def wpid(self):
        """The workload's own pid (its PID line), else the pid we started."""
        kv = find_tag(list(self.lines), "PID")
        return to_int(kv.get("pid"), self.pid) if kv else self.pid

    def kill(self):
        _kill_group(self.p)


SMI_APPS_ARGV = ["nvidia-smi", "--query-compute-apps=pid,used_memory",
                 "--format=csv,noheader,nounits"]


class SmiSampler:
    """`nvidia-smi --query-compute-apps` (unpreloaded: the driver's own per-process figures)
    sampled in a background thread, plus labelled samples taken on demand."""

    def __init__(self, env, period=0.25):
        self.env = env
        self.period = period
        self.samples = []
        self.t0 = time.monotonic()
        self.stop_ev = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def start(self):
        self.thread.start()
        return self

    def _loop(self):
        while not self.stop_ev.is_set():
            self.sample()
            self.stop_ev.wait(self.period)

    def sample(self, label=None):
        """One sample: {"t", "apps": {pid: MiB} or None, "label"?, "error"?}."""
        r = run_cmd(SMI_APPS_ARGV, 15, env=self.env)
        s = {"t": round(time.monotonic() - self.t0, 2),
             "apps": parse_compute_apps(r["stdout"]) if r["rc"] == 0 else None}
        if label:
            s["label"] = label
        if r["rc"] != 0:
            s["error"] = f"rc={r['rc']} timed_out={r['timed_out']} {tail(r['stderr'], 200)}"
        self.samples.append(s)
        return s

    def stop(self):
        self.stop_ev.set()
        self.thread.join(timeout=20)

    def compact(self, pids):
        """The samples restricted to pids (for results.json)."""
        out = []
        for s in self.samples:
            c = {k: v for k, v in s.items() if k != "apps"}
            if s["apps"] is not None:
                c["mib"] = {str(p): s["apps"].get(p) for p in pids}
            out.append(c)
        return out


# --------------------------------------------------------------------------------------------
# The agent
# --------------------------------------------------------------------------------------------


class Agent:
    """The background `hami-agent run` and the one-shot queries against it."""

    def __init__(self, path, metrics_addr, workdir, log):
        self.path = path
        self.addr = metrics_addr
        self.workdir = workdir
        self.log = log
        self.proc = None
        self.logfile = os.path.join(workdir, "agent.log")
        self.error = None
        self.libcuda = []

    def start(self, env, ready_timeout=30.0):
        if not self.path or not os.path.exists(self.path):
            self.error = f"agent binary not found ({self.path})"
            return False
        # Per-process series are opt-in (hami-user/src/metrics.rs): observe() reads them.
        argv = [self.path, "run", "--metrics-addr", self.addr, "--per-process-metrics",
                *self.libcuda_args()]
        self.log.say("starting agent: " + " ".join(argv))
        f = open(self.logfile, "w")
        try:
            self.proc = subprocess.Popen(
                argv, env=env, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        except OSError as e:
            self.error = f"cannot start agent: {e}"
            return False
        finally:
            f.close()
        end = time.monotonic() + ready_timeout
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                self.error = f"agent exited rc={self.proc.returncode}: {tail(self.read_log(), 800)}"
                return False
            if self.metrics_text(timeout=1.0) is not None:
                time.sleep(1.0)  # let the probes settle after the endpoint answers
                self.log.say("agent ready (metrics endpoint answers)")
                return True
            time.sleep(0.25)
        self.error = f"agent /metrics did not answer within {ready_timeout}s"
        return False

    def libcuda_args(self):
        """`--libcuda PATH` for every libcuda file here, so that probes are on before the first
        workload maps it (the agent dedupes by device + inode and keeps discovering)."""
        out = []
        for c in self.libcuda:
            out += ["--libcuda", c]
        return out

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def metrics_text(self, timeout=2.0):
        try:
            with urllib.request.urlopen(f"http://{self.addr}/metrics", timeout=timeout) as r:
                return r.read().decode("utf-8", "replace")
        except Exception:  # noqa: BLE001 - any failure means "not available"
            return None

    def metrics(self):
        t = self.metrics_text()
        return parse_prometheus(t) if t is not None else None

    def audit_start(self, seconds, env):
        """Start `hami-agent audit --seconds N --json` in the background; returns a handle."""
        argv = [self.path, "audit", "--seconds", str(seconds), "--json", *self.libcuda_args()]
        out = tempfile.NamedTemporaryFile("w+", dir=self.workdir, delete=False, suffix=".audit")
        err = tempfile.NamedTemporaryFile("w+", dir=self.workdir, delete=False, suffix=".err")
        p = subprocess.Popen(argv, env=env, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                             start_new_session=True)
        return {"p": p, "out": out, "err": err, "argv": argv, "seconds": seconds,
                "t0": time.monotonic()}

    def audit_wait(self, h, title):
        """Wait for an audit started by audit_start; returns (parsed or None, error or None)."""
        try:
            h["p"].wait(timeout=h["seconds"] + 20)
        except subprocess.TimeoutExpired:
            _kill_group(h["p"])
            h["p"].wait(timeout=5)
        h["out"].seek(0)
        h["err"].seek(0)
        out, err = h["out"].read(), h["err"].read()
        for f in (h["out"], h["err"]):
            f.close()
            os.unlink(f.name)
        self.log.section(f"{title}: audit rc={h['p'].returncode}",
                         f"$ {' '.join(h['argv'])}\n--- stdout\n{_cap(out)}\n--- stderr\n{_cap(err)}")
        try:
            return parse_audit_json(out), None
        except (ValueError, TypeError, AttributeError) as e:
            return None, f"audit output unparsable ({e}); rc={h['p'].returncode} stderr: {tail(err, 400)}"

    def audit_stop(self, h, title, timeout=20.0):
        """End an audit started by audit_start now (SIGINT: it reports what it saw so far and
        exits with its status). Returns (parsed or None, error or None, exit status)."""
        if h["p"].poll() is None:
            try:
                os.killpg(h["p"].pid, signal.SIGINT)
            except OSError:
                pass
        h["seconds"] = max(0.0, timeout - 20)  # audit_wait waits seconds + 20
        parsed, err = self.audit_wait(h, title)
        return parsed, err, h["p"].returncode

    def inspect(self, region, env):
        r = run_cmd([self.path, "inspect", region, "--json"], 20, env=env, log=self.log,
                    title="agent inspect")
        try:
            return parse_inspect_json(r["stdout"]), None
        except (ValueError, TypeError, AttributeError) as e:
            return None, f"inspect output unparsable ({e}): {tail(r['stderr'], 300)}"

    def stop(self):
        if self.proc is None:
            return
        for sig, wait in ((signal.SIGINT, 5), (signal.SIGTERM, 3), (signal.SIGKILL, 3)):
            if self.proc.poll() is not None:
                break
            try:
                os.killpg(self.proc.pid, sig)
            except OSError:
                pass
            try:
                self.proc.wait(timeout=wait)
            except subprocess.TimeoutExpired:
                pass
        self.log.section(f"agent log (rc={self.proc.returncode})", _cap(self.read_log(), 2_000_000))
        self.proc = None

    def read_log(self):
        try:
            with open(self.logfile, encoding="utf-8", errors="replace") as f:
                return f.read()
        except OSError:
            return ""


# --------------------------------------------------------------------------------------------
# The run
# --------------------------------------------------------------------------------------------


def find_first(paths):
    for p in paths:
        if p and os.path.exists(p):
            return p
    return None


def libcuda_candidates():
    """Every existing real libcuda.so.1 we know of (ldconfig -p first, then the known places)."""
    r = run_cmd(["ldconfig", "-p"], 10)
    cands = []
    for line in r["stdout"].splitlines():
        if "libcuda.so.1" in line and "=>" in line and "x86-64" in line:
            cands.append(line.split("=>", 1)[1].strip())
    cands += [
        "/usr/local/nvidia/lib64/libcuda.so.1",
        "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
        "/lib/libcuda.so.1",
        "/usr/lib64/libcuda.so.1",
        "/usr/local/cuda/lib64/stubs/libcuda.so",
    ]
    out = []
    for c in cands:  # never the toolkit's stub: it is not the driver
        if os.path.exists(c) and "stubs" not in c and c not in out:
            out.append(c)
    return out


def find_libcuda(log=None):
    """Path of the real libcuda.so.1 to link against, or None."""
    c = libcuda_candidates()
    return c[0] if c else None


class Runner:
    def __init__(self, args):
        self.args = args
        self.out = os.path.abspath(args.out)
        os.makedirs(self.out, exist_ok=True)
        self.work = tempfile.mkdtemp(prefix="hami-acc-")
        self.log = Log(os.path.join(self.out, "logs.txt"))
        self.deadline = Deadline(args.deadline)
        self.t0 = time.monotonic()
        self.quota_mb = args.quota_mb
        self.quota = args.quota_mb * MIB
        bundle = os.path.dirname(HERE)
        self.bundle = bundle
        self.preload = args.preload or find_first([
            os.path.join(bundle, "libhami_preload.so"),
            os.path.join(bundle, "target", "release", "libhami_preload.so"),
        ])
        self.agent_path = args.agent or find_first([
            os.path.join(bundle, "hami-agent"),
            os.path.join(bundle, "target", "release", "hami-agent"),
        ])
        self.programs = find_first([os.path.join(bundle, "programs"),
                                    os.path.join(bundle, "testing", "programs")])
        self.python = args.python or sys.executable
        self.bins = {}
        self.results = {
            "meta": {
                "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                "quota_mb": self.quota_mb,
                "bundle": bundle,
                "preload": self.preload,
                "agent": self.agent_path,
                "tolerance": f"max({TOL_MIN_BYTES // MIB} MiB, {TOL_FRACTION:.0%})",
                "bypass_latency_limit_s": BYPASS_LATENCY_S,
            },
            "env": {},
            "builds": {},
            "cells": [],
            "two_process": None,
            "bench": {"pair": {}, "train": {}},
            "physical": None,
            "notes": [],
        }
        self.phys_control = False
        self.agent = Agent(self.agent_path, args.metrics_addr, self.work, self.log)

    # ---- environments ----

    def base_env(self):
        env = {k: v for k, v in os.environ.items() if k not in SCRUB_ENV}
        env["PYTHONUNBUFFERED"] = "1"
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        # Never let a workload pick NVLink multicast (machine rule; harmless on one GPU).
        env.setdefault("NCCL_NVLS_ENABLE", "0")
        env.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
        env.setdefault("NVSHMEM_DISABLE_NVLS", "1")
        env["WL_QUOTA_MB"] = str(self.quota_mb)
        env["WL_HOLD_MB"] = str(self.args.hold_mb)
        return env

    def preload_env(self, region_name, extra=None):
        env = self.base_env()
        env["LD_PRELOAD"] = self.preload or "/nonexistent/libhami_preload.so"
        env["CUDA_DEVICE_MEMORY_LIMIT"] = f"{self.quota_mb}M"
        env["CUDA_DEVICE_MEMORY_SHARED_CACHE"] = os.path.join(self.work, region_name + ".cache")
        env.setdefault("LIBCUDA_LOG_LEVEL", "2")
        env.update(extra or {})
        return env

    def region_path(self, region_name):
        return os.path.join(self.work, region_name + ".cache")

    # ---- bookkeeping ----

    def add_cell(self, c):
        self.results["cells"].append(c)
        self.log.say(f"CELL {c['workload']:<17} {c['check']:<12} {c['status'].upper():<7} {c['reason']}")
        self.save()

    def note(self, msg):
        self.results["notes"].append(msg)
        self.log.say("NOTE " + msg)

    def save(self):
        self.results["meta"]["elapsed_s"] = round(time.monotonic() - self.t0, 1)
        self.results["summary"] = summarize(self.results["cells"])
        if self.results.get("physical"):
            ph = self.results["physical"]
            ph["summary"] = summarize(ph["cells"])
        for name, text in (("results.json", json.dumps(self.results, indent=1, default=str)),
                           ("results.md", render_markdown(self.results))):
            tmp = os.path.join(self.out, name + ".tmp")
            with open(tmp, "w", encoding="utf-8") as f:
                f.write(text)
            os.replace(tmp, os.path.join(self.out, name))

    def step(self, title, fn, *a):
        """Run one phase; an exception is logged and noted, never fatal."""
        if self.deadline.expired():
            self.note(f"skipped {title}: global deadline reached")
            return None
        self.log.say(f"--- {title} ({self.deadline.left():.0f}s left)")
        try:
            return fn(*a)
        except Exception:  # noqa: BLE001 - the runner must continue
            tb = traceback.format_exc()
            self.log.section(f"EXCEPTION in {title}", tb)
            self.note(f"{title} raised: {tb.strip().splitlines()[-1]}")
            return None
        finally:
            self.save()

    # ---- phases ----

    def record_env(self):
        env = self.results["env"]
        base = self.base_env()
        r = run_cmd(["nvidia-smi"], 30, env=base, log=self.log, title="nvidia-smi")
        env["nvidia_smi_rc"] = r["rc"]
        r = run_cmd(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,memory.used",
                     "--format=csv,noheader"], 30, env=base, log=self.log, title="nvidia-smi query")
        if r["rc"] == 0 and r["stdout"].strip():
            parts = [p.strip() for p in r["stdout"].strip().splitlines()[0].split(",")]
            if len(parts) >= 3:
                env["gpu"], env["driver"], env["gpu_memory_total"] = parts[0], parts[1], parts[2]
        r = run_cmd(["ldd", "--version"], 10, log=self.log, title="ldd --version")
        env["glibc"] = (r["stdout"].splitlines() or ["?"])[0]
        r = run_cmd(["uname", "-a"], 10, log=self.log, title="uname")
        env["kernel"] = r["stdout"].strip()
        nvcc = self.nvcc()
        if nvcc:
            r = run_cmd([nvcc, "--version"], 20, log=self.log, title="nvcc --version")
            env["nvcc"] = (r["stdout"].strip().splitlines() or ["?"])[-1]
        code = (
            "import sys\n"
            "try:\n import torch; print('torch', torch.__version__, torch.version.cuda, "
            "torch.cuda.is_available())\n"
            "except Exception as e: print('torch ERR', e)\n"
            "try:\n import cupy; print('cupy', cupy.__version__)\n"
            "except Exception as e: print('cupy ERR', e)\n"
        )
        r = run_cmd([self.python, "-c", code], self.deadline.cap(90), env=base, log=self.log,
                    title="python framework versions")
        for line in r["stdout"].splitlines():
            if line.startswith("torch "):
                env["torch"] = line[6:]
            elif line.startswith("cupy "):
                env["cupy"] = line[5:]
        env["python"] = self.python
        env["libcuda_all"] = libcuda_candidates()
        env["libcuda"] = env["libcuda_all"][0] if env["libcuda_all"] else None
        self.agent.libcuda = [] if self.args.no_libcuda_hint else env["libcuda_all"]
        env["btf"] = os.path.exists("/sys/kernel/btf/vmlinux")
        files = {}
        for p in (self.preload, self.agent_path):
            if p and os.path.exists(p):
                files[p] = os.path.getsize(p)
        env["bundle_files"] = files
        if not self.preload:
            self.note("libhami_preload.so not found: every preloaded cell will fail")
        if not self.agent_path:
            self.note("hami-agent not found: observed/bypass cells will fail")

    def nvcc(self):
        return find_first([shutil.which("nvcc"), "/usr/local/cuda/bin/nvcc"])

    def build(self):
        b = self.results["builds"]
        nvcc = self.nvcc()
        src = os.path.join(WORKLOADS_DIR, "cuda_alloc.cu")
        for link in ("static", "shared"):
            exe = os.path.join(self.work, f"cuda_alloc_{link}")
            if not nvcc:
                b[f"cuda_alloc_{link}"] = {"ok": False, "error": "nvcc not found"}
                continue
            ok = False
            for arch in (["-arch=sm_90"], []):
                r = run_cmd([nvcc, "-O2", *arch, "-cudart", link, f"-DWL_LINKAGE={link}", src,
                             "-o", exe], self.deadline.cap(120), log=self.log,
                            title=f"nvcc cuda_alloc {link} {arch}")
                if r["rc"] == 0 and os.path.exists(exe):
                    ok = True
                    break
            b[f"cuda_alloc_{link}"] = {"ok": ok, "error": "" if ok else tail(r["stderr"], 800)}
            if ok:
                self.bins[f"cuda_{link}"] = exe
        libcuda = self.results["env"].get("libcuda") or find_libcuda(self.log)
        if not libcuda:
            b["pair_bench"] = {"ok": False, "error": "libcuda.so.1 not found"}
            return
        libdir = os.path.dirname(libcuda)
        gcc = shutil.which("gcc") or shutil.which("cc")
        if not gcc:
            b["pair_bench"] = {"ok": False, "error": "no C compiler"}
            return
        link = [libcuda, f"-Wl,-rpath,{libdir}", "-ldl", "-lpthread"]
        exe = os.path.join(self.work, "pair_bench")
        r = run_cmd([gcc, "-O2", os.path.join(WORKLOADS_DIR, "pair_bench.c"), "-o", exe, *link],
                    60, log=self.log, title="gcc pair_bench")
        b["pair_bench"] = {"ok": r["rc"] == 0, "error": tail(r["stderr"], 800)}
        if r["rc"] == 0:
            self.bins["pair_bench"] = exe
        if self.programs and os.path.exists(os.path.join(self.programs, "cudaprobe.c")):
            exe = os.path.join(self.work, "cudaprobe")
            inc = [f"-I{d}" for d in ("/usr/local/cuda/include",) if os.path.isdir(d)]
            r = run_cmd([gcc, "-O2", *inc, os.path.join(self.programs, "cudaprobe.c"), "-o", exe,
                         *link], 60, log=self.log, title="gcc cudaprobe")
            b["cudaprobe"] = {"ok": r["rc"] == 0, "error": tail(r["stderr"], 800)}
            if r["rc"] == 0:
                self.bins["cudaprobe"] = exe

    def workload_argv(self, wl, steps):
        k = wl["kind"]
        if k == "torch":
            return [self.python, os.path.join(WORKLOADS_DIR, "torch_alloc.py"), *steps]
        if k == "cupy":
            return [self.python, os.path.join(WORKLOADS_DIR, "cupy_alloc.py"), *steps]
        exe = self.bins.get(k)
        return [exe, *steps] if exe else None

    def start(self, wl, steps, env, label):
        argv = self.workload_argv(wl, steps)
        if argv is None:
            return None, f"{wl['kind']} binary was not built"
        env = dict(env)
        env.update(wl["env"])
        try:
            budget = self.deadline.cap(self.args.wl_timeout)
            return Proc(f"{wl['name']} [{label}]", argv, env, cwd=WORKLOADS_DIR, log=self.log,
                        budget=budget), None
        except OSError as e:
            return None, f"cannot start: {e}"

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
            if time.monotonic() - t0 >= 0.5 and audit_says_ready(_read_text(audit["err"].name)):
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
        ok = [kv.get("ok") for kv in tp["grants"].values()]
        problems = []
        if sorted(ok) != ["0", "1"]:
            problems.append(f"expected one grant and one OOM, got ok={ok}")
        reg = tp.get("region", {})
        if "error" in reg:
            problems.append(f"region unreadable: {reg['error']}")
        elif reg.get("used", 0) > self.quota:
            problems.append(f"region used {reg['used']} > limit {self.quota}")
        ins = tp.get("inspect")
        if ins and "error" not in ins and ins.get("used") is not None and ins["used"] > self.quota:
            problems.append(f"inspect used {ins['used']} > limit")
        if ins and "error" in ins:
            problems.append(f"inspect: {ins['error']}")
        if tp["nvml_sum_mib"] is None:
            problems.append("NVML listed neither process")
        elif tp["nvml_sum_mib"] > self.quota_mb:
            problems.append(f"NVML total {tp['nvml_sum_mib']} MiB > quota {self.quota_mb} MiB")
        tp["status"] = "fail" if problems else "pass"
        tp["reason"] = "; ".join(problems)
        self.log.say(f"TWO-PROCESS {tp['status'].upper()} {tp['reason']}")

    # ---- the physical group (issue 8): device memory that arrives by other paths ----

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
        env.setdefault("LIBCUDA_LOG_LEVEL", "2")
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

    def run(self):
        a = self.args
        self.log.say(f"hami-rs acceptance: out={self.out} work={self.work} deadline={a.deadline}s")
        selected = [w for w in WORKLOADS if not a.only or w["name"] in a.only]
        # `--only physical` (alone) runs only the physical group; with workload names, both.
        standard = bool(selected)
        phys = bool(a.only) and "physical" in a.only
        if phys:
            self.results["physical"] = {"blind_preload": a.blind_preload, "cells": [],
                                        "smi": {}, "summary": {}}
        self.step("environment", self.record_env)
        if standard:
            self.step("build workloads", self.build)
        else:
            a.no_bench = True
        # Phase 1: nothing of ours running.
        for wl in selected:
            self.step(f"native {wl['name']}", self.native, wl)
        if not a.no_bench:
            self.step("bench pair native", self.bench_pair, "native", self.base_env())
            self.step("bench pair preload", self.bench_pair, "preload",
                      self.preload_env("region-bench-pair"))
            self.step("bench train native", self.bench_train, "native", self.base_env())
            self.step("bench train preload", self.bench_train, "preload",
                      self.preload_env("region-bench-train"))
        # Phase 2: the agent watches.
        started = standard and self.step("start agent", self.agent.start, self.base_env())
        if standard and not started:
            self.note(f"agent did not start: {self.agent.error}")
        try:
            if not a.no_bench and self.agent.alive():
                self.step("bench pair native+agent", self.bench_pair, "native+agent",
                          self.base_env())
                self.step("bench pair preload+agent", self.bench_pair, "preload+agent",
                          self.preload_env("region-bench-pair-agent"))
                self.step("bench train preload+agent", self.bench_train, "preload+agent",
                          self.preload_env("region-bench-train-agent"))
            for wl in selected:
                self.step(f"preload {wl['name']}", self.preloaded, wl)
            for wl in selected:
                self.step(f"bypass {wl['name']}", self.bypass, wl)
            if standard:
                self.step("two processes, one quota", self.two_process)
        finally:
            if self.agent.alive() or self.agent.proc is not None:
                self.agent.stop()
        # The physical group runs with no background agent: its cells start their own audits.
        if phys:
            self.step("physical group", self.physical)
        for wl in selected:
            for ch in ["native"] + CHECKS:
                if not any(c["workload"] == wl["name"] and c["check"] == ch
                           for c in self.results["cells"]):
                    self.add_cell(cell(wl["name"], ch, "skipped", "not reached (deadline or earlier error)"))
        self.save()
        s = self.results["summary"]
        self.log.say(f"done in {self.results['meta']['elapsed_s']}s: {s}")
        if phys:
            self.log.say(f"physical group: {self.results['physical']['summary']}")
        print(render_markdown(self.results))
        return 0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="output folder (results.json, results.md, logs.txt)")
    ap.add_argument("--quota-mb", type=int, default=4096)
    ap.add_argument("--hold-mb", type=int, default=1024)
    ap.add_argument("--grab-mb", type=int, default=3072)
    # Two processes, one quota: each asks for this much. With the quota's 4096 MiB and each
    # context charged (~520 MiB on an H200), one 2560 MiB grant fits and a second cannot.
    ap.add_argument("--pair-grab-mb", type=int, default=2560)
    ap.add_argument("--deadline", type=float, default=None,
                    help="whole-run budget in seconds (450; 330 with --only physical alone)")
    ap.add_argument("--wl-timeout", type=float, default=60.0, help="per-workload timeout (s)")
    ap.add_argument("--audit-seconds", type=int, default=6)
    ap.add_argument("--audit-attach-s", type=float, default=20.0,
                    help="longest time a fresh audit gets to attach before the workload "
                         "allocates (the wait ends as soon as it logs that it is ready)")
    ap.add_argument("--pairs", type=int, default=2000, help="pairs per bench round")
    ap.add_argument("--train-steps", type=int, default=200)
    ap.add_argument("--metrics-addr", default="127.0.0.1:9400")
    ap.add_argument("--preload", help="path of libhami_preload.so (default: in the bundle)")
    ap.add_argument("--agent", help="path of hami-agent (default: in the bundle)")
    ap.add_argument("--python", help="python for the workloads (default: this one)")
    ap.add_argument("--only", nargs="*",
                    help="workload names to run (default: all); `physical` adds the physical "
                         "group (issue 8), alone it runs only that group")
    ap.add_argument("--phys-rows", nargs="*", choices=PHYS_ROWS,
                    help="rows of the physical group to run (default: all)")
    ap.add_argument("--phys-settle-s", type=float, default=PHYS_AGENT_SETTLE_S,
                    help="physical group: seconds the agent gets once the workload holds")
    ap.add_argument("--blind-preload",
                    help="an older libhami_preload.so, blind to the physical escape paths: the "
                         "agent must flag them under it (over_limit or drift)")
    ap.add_argument("--no-bench", action="store_true")
    ap.add_argument("--keep-work", action="store_true", help="keep the scratch folder")
    ap.add_argument("--no-libcuda-hint", action="store_true",
                    help="do not pass --libcuda PATH to the agent (rely on its discovery)")
    args = ap.parse_args(argv)
    if args.deadline is None:
        phys_only = bool(args.only) and not any(w["name"] in args.only for w in WORKLOADS)
        args.deadline = 330.0 if phys_only and "physical" in args.only else 450.0
    runner = Runner(args)
    try:
        return runner.run()
    except Exception:  # noqa: BLE001 - leave whatever we have behind
        runner.log.section("FATAL", traceback.format_exc())
        runner.note("runner crashed: " + traceback.format_exc().strip().splitlines()[-1])
        runner.save()
        return 1
    finally:
        if runner.agent.proc is not None:
            runner.agent.stop()
        if not args.keep_work:
            shutil.rmtree(runner.work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
