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

# Variables that must not leak from the caller into the runs (they change what is measured).
SCRUB_ENV = [
    "LD_PRELOAD",
    "CUDA_DEVICE_MEMORY_LIMIT",
    "CUDA_DEVICE_MEMORY_SHARED_CACHE",
    "PYTORCH_CUDA_ALLOC_CONF",
    "CUDA_VISIBLE_DEVICES",
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
    return any(w in t for w in ("attached", "watching", "listening"))


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


# Region layout v1 (hami-common/src/layout.rs). Read directly as a cross-check of `inspect`.
REGION_MAGIC = b"HAMIRSv\x01"
REGION_HEADER_SIZE = 968
REGION_SLOT_SIZE = 400
REGION_MAX_DEVICES = 16
REGION_MAX_SLOTS = 1024
_OFF_LIMITS = 136
_OFF_USED = 584


def read_region_bytes(data):
    """Decode a v1 region file: {"limits", "used", "slots": [{"pid", "status", "usage"}]}."""
    if len(data) < REGION_HEADER_SIZE or data[:8] != REGION_MAGIC:
        raise ValueError("not a v1 region (magic)")
    version, header_size, total_size = struct.unpack_from("<IIQ", data, 8)
    if version != 1 or header_size != REGION_HEADER_SIZE:
        raise ValueError(f"region version {version} header {header_size}: layout changed")
    if len(data) < total_size:
        raise ValueError("region truncated")
    limits = list(struct.unpack_from("<16Q", data, _OFF_LIMITS))
    used = list(struct.unpack_from("<16Q", data, _OFF_USED))
    slots = []
    nslots = min(REGION_MAX_SLOTS, (total_size - header_size) // REGION_SLOT_SIZE)
    for i in range(nslots):
        off = header_size + i * REGION_SLOT_SIZE
        pid, status, _start = struct.unpack_from("<IIQ", data, off)
        if status == 0 and pid == 0:
            continue
        usage = struct.unpack_from("<48Q", data, off + 16)
        dev0 = {"context": usage[0], "module": usage[1], "data": usage[2]}
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
    out.append(f"- cells: {s.get('pass', 0)} pass, {s.get('fail', 0)} fail, "
               f"{s.get('error', 0)} error, {s.get('skipped', 0)} skipped (of {s.get('total', 0)})")
    out.append("")
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
    tp = results.get("two_process")
    if tp:
        out += ["", "## Two preloaded processes, one quota", ""]
        out.append(f"- status: {tp.get('status', '?').upper()} {md(tp.get('reason', ''))}")
        for k in ("workload", "grants", "region", "inspect", "nvml_mib", "nvml_sum_mib", "limit_mib"):
            if k in tp:
                out.append(f"- {k}: `{md(json.dumps(tp[k]), 600)}`")
    bench = results.get("bench", {})
    if bench:
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
        argv = [self.path, "run", "--metrics-addr", self.addr, *self.libcuda_args()]
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
            "notes": [],
        }
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
            base = self.agent.metrics()
            base_count = metrics_bypass_count(base) if base is not None else None
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
            figs["metrics_latency_s"] = (
                round(found_metrics_t - t_alloc, 3) if found_metrics_t and t_alloc else None)
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
        self.step("environment", self.record_env)
        self.step("build workloads", self.build)
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
        started = self.step("start agent", self.agent.start, self.base_env())
        if not started:
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
            self.step("two processes, one quota", self.two_process)
        finally:
            if self.agent.alive() or self.agent.proc is not None:
                self.agent.stop()
        for wl in selected:
            for ch in ["native"] + CHECKS:
                if not any(c["workload"] == wl["name"] and c["check"] == ch
                           for c in self.results["cells"]):
                    self.add_cell(cell(wl["name"], ch, "skipped", "not reached (deadline or earlier error)"))
        self.save()
        s = self.results["summary"]
        self.log.say(f"done in {self.results['meta']['elapsed_s']}s: {s}")
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
    ap.add_argument("--deadline", type=float, default=450.0, help="whole-run budget in seconds")
    ap.add_argument("--wl-timeout", type=float, default=60.0, help="per-workload timeout (s)")
    ap.add_argument("--audit-seconds", type=int, default=6)
    ap.add_argument("--audit-attach-s", type=float, default=3.0,
                    help="time a fresh audit gets to attach before the workload allocates")
    ap.add_argument("--pairs", type=int, default=2000, help="pairs per bench round")
    ap.add_argument("--train-steps", type=int, default=200)
    ap.add_argument("--metrics-addr", default="127.0.0.1:9400")
    ap.add_argument("--preload", help="path of libhami_preload.so (default: in the bundle)")
    ap.add_argument("--agent", help="path of hami-agent (default: in the bundle)")
    ap.add_argument("--python", help="python for the workloads (default: this one)")
    ap.add_argument("--only", nargs="*", help="workload names to run (default: all)")
    ap.add_argument("--no-bench", action="store_true")
    ap.add_argument("--keep-work", action="store_true", help="keep the scratch folder")
    ap.add_argument("--no-libcuda-hint", action="store_true",
                    help="do not pass --libcuda PATH to the agent (rely on its discovery)")
    args = ap.parse_args(argv)
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
