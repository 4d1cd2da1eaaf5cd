"""Parsing of what the run reads: workload protocol lines, `hami-agent audit --json` and
`inspect --json`, Prometheus text, nvidia-smi CSV, cudaprobe's bench lines.

Pure functions of text (no I/O). All knowledge of the agent's output formats is here
(matched to hami-user/src/{main,report,agent,metrics}.rs); the region file's bytes are read by
acceptance.region.
"""

import json


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
