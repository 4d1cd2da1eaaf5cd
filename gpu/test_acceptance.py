"""Unit tests of the pure package gpu/acceptance/ (no GPU, no subprocess): parsing, the region
file's bytes, the standard group's evaluation, the report, and re-evaluation of the real
H200 results committed in gpu/results/.

    python3 -m unittest gpu/test_acceptance.py -v     (also run through gpu/test_runner.py)
"""

import json
import os
import struct
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from acceptance import evaluate, parse, physical, region, report, spec  # noqa: E402

MIB = 1 << 20
GIB = 1 << 30
QUOTA = 4 * GIB
TORCH = spec.WORKLOADS[0]
CUDA = spec.WORKLOADS[4]


class ParseLine(unittest.TestCase):
    def test_protocol_line(self):
        self.assertEqual(parse.parse_line("MEMINFO free=1 total=2\n"),
                         ("MEMINFO", {"free": "1", "total": "2"}))
        self.assertEqual(parse.parse_line("OOM_OK kind=OutOfMemoryError"),
                         ("OOM_OK", {"kind": "OutOfMemoryError"}))

    def test_noise_is_not_a_tag(self):
        self.assertEqual(parse.parse_line("/usr/lib/python3/warnings.py:1: UserWarning: x"), (None, {}))
        self.assertEqual(parse.parse_line(""), (None, {}))
        self.assertEqual(parse.parse_line("hami: warning: something"), (None, {}))

    def test_find_tag_first(self):
        lines = ["noise", "HOLDING bytes=5", "HOLDING bytes=6"]
        self.assertEqual(parse.find_tag(lines, "HOLDING"), {"bytes": "5"})
        self.assertIsNone(parse.find_tag(lines, "DONE"))


class Audit(unittest.TestCase):
    DOC = {
        "processes": [
            {"pid": 10, "hooked": True, "observed_bytes": 1 * GIB, "accounted_bytes": GIB,
             "verdict": "ok"},
            {"pid": 11, "hooked": False, "observed_bytes": 2 * GIB, "accounted_bytes": 0,
             "verdict": "bypass"},
        ],
        "findings": [{"kind": "bypass", "reason": "no_preload", "pid": 11, "bytes": 2 * GIB}],
    }

    def test_assumed_format(self):
        a = parse.parse_audit_json(json.dumps(self.DOC))
        self.assertEqual(a["processes"][10]["observed_bytes"], GIB)
        self.assertTrue(a["processes"][10]["hooked"])
        self.assertEqual(a["findings"][0]["kind"], "bypass")
        self.assertTrue(parse.audit_bypass_for(a, 11))
        self.assertFalse(parse.audit_bypass_for(a, 10))
        self.assertFalse(parse.audit_bypass_for(a, 12))

    def test_json_lines_last_object_wins(self):
        text = "starting\n" + json.dumps({"processes": [], "findings": []}) + "\n" + json.dumps(self.DOC)
        a = parse.parse_audit_json(text)
        self.assertIn(11, a["processes"])

    def test_kind_spelling_and_data_split(self):
        doc = {"processes": [{"pid": "7", "observed": 5, "observed_by_kind": {"data": 4}}],
               "findings": [{"kind": "Leaked-Slot", "pid": None, "bytes": 1}]}
        a = parse.parse_audit_json(json.dumps(doc))
        self.assertEqual(a["processes"][7]["observed_data_bytes"], 4)
        self.assertEqual(a["findings"][0]["kind"], "leaked_slot")

    def test_agent_rs_shape(self):
        """The shape hami-user/src/agent.rs (ProcessRow) and findings.rs serialise."""
        doc = {"version": 1, "seconds": 6.0,
               "processes": [{"pid": 9, "comm": "python3", "hooked": None, "observed": GIB,
                              "accounted": None, "verdict": "bypass,drift"}],
               "findings": [{"kind": "bypass", "reason": "no_preload", "pid": 9,
                             "bytes": GIB, "standing": True}], "failed": True}
        a = parse.parse_audit_json(json.dumps(doc))
        self.assertEqual(a["processes"][9]["observed_bytes"], GIB)
        self.assertIsNone(a["processes"][9]["hooked"])
        self.assertTrue(parse.audit_bypass_for(a, 9))
        doc["findings"] = []
        self.assertTrue(parse.audit_bypass_for(parse.parse_audit_json(json.dumps(doc)), 9))
        self.assertTrue(parse.verdict_has("drift, bypass", "bypass"))
        self.assertFalse(parse.verdict_has("ok", "bypass"))
        self.assertFalse(parse.verdict_has(None, "bypass"))

    def test_audit_ready_line(self):
        self.assertTrue(parse.audit_says_ready("INFO probes Attached to /lib/libcuda.so.1\n"))
        self.assertFalse(parse.audit_says_ready("INFO loading eBPF\n"))

    def test_garbage_raises(self):
        with self.assertRaises(ValueError):
            parse.parse_audit_json("error: not root")
        with self.assertRaises(ValueError):
            parse.parse_audit_json("[1, 2]")


class Metrics(unittest.TestCase):
    TEXT = """# HELP hami_findings_total findings
# TYPE hami_findings_total counter
hami_findings_total{kind="bypass",pid="42",container="a,b"} 1
hami_findings_total{kind="drift",pid="42"} 3
hami_findings_total{kind="bypass",pid="43"} 2
hami_observed_bytes{pid="42",kind="data"} 1.073741824e+09
hami_events_total 12345
"""

    def test_parse(self):
        s = parse.parse_prometheus(self.TEXT)
        self.assertIn(("hami_events_total", {}, 12345.0), s)
        self.assertEqual(s[0][1], {"kind": "bypass", "pid": "42", "container": "a,b"})

    def test_bypass_counts(self):
        s = parse.parse_prometheus(self.TEXT)
        self.assertEqual(parse.metrics_bypass_count(s), 3.0)
        self.assertEqual(parse.metrics_bypass_count(s, 42), 1.0)
        self.assertEqual(parse.metrics_bypass_count(s, 44), 0.0)
        self.assertEqual(parse.metrics_for_pid(s, 42)["hami_observed_bytes{kind=data}"], float(GIB))

    def test_agent_metric_names(self):
        """hami-user/src/metrics.rs: the counter wins over the standing gauge."""
        text = ('hami_findings{kind="bypass"} 0\n'
                'hami_findings_total{kind="bypass"} 4\n'
                'hami_findings_total{kind="drift"} 9\n'
                'hami_process_observed_bytes{container="/",hooked="false",pid="77"} 1073741824\n')
        s = parse.parse_prometheus(text)
        self.assertEqual(parse.metrics_bypass_count(s), 4.0)
        self.assertEqual(parse.metrics_observed_for_pid(s, 77), (GIB, False))
        self.assertEqual(parse.metrics_observed_for_pid(s, 78), (None, None))


def make_region(limit, used, slots, version=4):
    """Bytes of a region as hami-abi/src/layout.rs lays it out (version 1 to 4). slots:
    {index: (pid, context, data[, pool[, charged, reserve]])} on device 0."""
    header = region.REGION_HEADER_SIZES[version]
    slot_size = region.region_slot_size(version)
    nusage = region.REGION_MAX_DEVICES * len(region.REGION_USAGE_KINDS[version])
    total = header + region.REGION_MAX_SLOTS * slot_size
    if version >= 4:
        total += region.REGION_MAX_DEVICES * 64  # the compute records
    b = bytearray(total)
    b[0:8] = region.REGION_MAGIC
    struct.pack_into("<IIQ", b, 8, version, header, total)
    struct.pack_into("<Q", b, 136, limit)
    struct.pack_into("<Q", b, 584, used)
    for i, (pid, ctx, data, *rest) in slots.items():
        off = header + i * slot_size
        struct.pack_into("<IIQ", b, off, pid, 1, 99)
        struct.pack_into("<QQQ", b, off + 16, ctx, 0, data)
        if rest:
            struct.pack_into("<Q", b, off + 16 + 24, rest[0])
        if len(rest) == 3:
            struct.pack_into("<Q", b, off + 16 + 8 * nusage, rest[1])
            struct.pack_into("<Q", b, off + 16 + 8 * nusage + 128, rest[2])
    return bytes(b)


def rust_layout(text):
    """Byte offsets and sizes of layout.rs's `RegionHeader` and `Slot` fields, computed from the
    Rust source (repr(C), every field naturally aligned; the file asserts the sizes):
    {"RegionHeader": ({field: offset}, size), "Slot": (...), "consts": {name: value}}."""
    import re
    consts = {k: int(v) for k, v in
              re.findall(r"pub const (\w+): (?:usize|u32) = (\d+);", text)}
    prim = {"u8": 1, "u32": 4, "u64": 8, "AtomicU32": 4, "AtomicU64": 8, "AtomicI64": 8}

    def size_align(ty):
        ty = ty.strip()
        if ty in prim:
            return prim[ty], prim[ty]
        m = re.fullmatch(r"\[(.*); (\w+)\]", ty)
        if not m:
            raise AssertionError(f"layout.rs: type {ty} not understood by this test")
        n = m.group(2)
        count = int(n) if n.isdigit() else consts[n]
        size, align = size_align(m.group(1))
        return size * count, align

    out = {"consts": consts}
    for name in ("RegionHeader", "Slot"):
        body = text[text.index(f"pub struct {name} {{"):]
        body = body[:body.index("\n}") + 1]
        offsets, off = {}, 0
        for field, ty in re.findall(r"pub (\w+): (.+),\n", body):
            size, align = size_align(ty)
            off = (off + align - 1) // align * align
            offsets[field] = off
            off += size
        out[name] = (offsets, off)
    return out


class Region(unittest.TestCase):
    def test_decode(self):
        for version in (2, 3, 4):
            r = region.read_region_bytes(make_region(
                QUOTA, 3 * GIB + 600 * MIB, {0: (100, 300 * MIB, 3 * GIB),
                                             5: (101, 300 * MIB, 0)}, version=version))
            self.assertEqual(r["version"], version)
            self.assertEqual(r["limits"][0], QUOTA)
            self.assertEqual(r["used"][0], 3 * GIB + 600 * MIB)
            self.assertEqual([s["pid"] for s in r["slots"]], [100, 101])
            self.assertEqual(r["slots"][0]["usage"]["data"], 3 * GIB)
            self.assertEqual(r["slots"][1]["slot"], 5)

    def test_decode_v3_charged_and_reserve(self):
        r = region.read_region_bytes(make_region(
            QUOTA, 0, {2: (7, MIB, 2 * MIB, 3 * GIB, 3 * GIB + 67 * MIB, 64 * MIB)}))
        s = r["slots"][0]
        self.assertEqual((s["charged"], s["reserve"]), (3 * GIB + 67 * MIB, 64 * MIB))
        self.assertEqual(s["usage"]["pool"], 3 * GIB)
        self.assertEqual(s["total"], 3 * GIB + 3 * MIB)

    def test_decode_v2_pool_and_v1(self):
        r = region.read_region_bytes(make_region(QUOTA, 0, {2: (7, MIB, 2 * MIB, 3 * GIB)},
                                                 version=2))
        self.assertEqual(r["slots"][0]["usage"]["pool"], 3 * GIB)
        self.assertEqual(r["slots"][0]["total"], 3 * GIB + 3 * MIB)
        self.assertNotIn("reserve", r["slots"][0])
        r = region.read_region_bytes(make_region(QUOTA, 0, {2: (7, MIB, 2 * MIB)}, version=1))
        self.assertEqual(r["slots"][0]["usage"], {"context": MIB, "module": 0, "data": 2 * MIB})

    def test_rejects_other_layouts(self):
        good = make_region(1, 0, {})
        with self.assertRaises(ValueError):
            region.read_region_bytes(b"XXXXXXXX" + good[8:])
        for version, header in ((5, 1024), (2, 1024), (3, 968)):
            bad = bytearray(good)
            struct.pack_into("<II", bad, 8, version, header)
            with self.assertRaises(ValueError) as e:
                region.read_region_bytes(bytes(bad))
            self.assertIn(f"region version {version} header {header}: layout changed",
                          str(e.exception))
        with self.assertRaises(ValueError):
            region.read_region_bytes(good[:2000])

    def test_layout_constants_match_rust(self):
        """The offsets above are those of layout.rs for its current version; fail loudly if
        its shape changes."""
        src = os.path.join(os.path.dirname(HERE), "hami-abi", "src", "layout.rs")
        with open(src) as f:  # the test runs in a repository checkout, not in the bundle
            lay = rust_layout(f.read())
        c = lay["consts"]
        version = c["VERSION"]
        self.assertIn(version, region.REGION_USAGE_KINDS, "the runner cannot read this layout")
        self.assertEqual(c["MAX_DEVICES"], region.REGION_MAX_DEVICES)
        self.assertEqual(c["MAX_SLOTS"], region.REGION_MAX_SLOTS)
        self.assertEqual(c["USAGE_KINDS"], len(region.REGION_USAGE_KINDS[version]))
        header, header_size = lay["RegionHeader"]
        self.assertEqual(header_size, region.REGION_HEADER_SIZES[version])
        self.assertEqual(header["limits"], region._OFF_LIMITS)
        self.assertEqual(header["used"], region._OFF_USED)
        self.assertEqual(header["lock"], region.OFF_LOCK)
        slot, slot_size = lay["Slot"]
        self.assertEqual(slot_size, region.region_slot_size(version))
        self.assertEqual(slot["usage"], 16)
        if "charged" in slot:
            nusage = c["MAX_DEVICES"] * c["USAGE_KINDS"]
            self.assertEqual(slot["charged"], 16 + 8 * nusage)
            self.assertEqual(slot["reserve"], slot["charged"] + 8 * c["MAX_DEVICES"])


class Cudaprobe(unittest.TestCase):
    def test_bench_line(self):
        out = ("pid=5 via=procaddr device=0\nop=init rc=0 name=CUDA_SUCCESS\n"
               "op=bench-pair n=500 size=1048576 ns_per_pair=9000.0 failures=0 rc=0 name=CUDA_SUCCESS\n"
               "op=bench-pair n=10000 size=1048576 ns_per_pair=8123.5 failures=0 rc=0 name=CUDA_SUCCESS\n")
        self.assertEqual(parse.parse_cudaprobe_bench(out), 8123.5)
        self.assertIsNone(parse.parse_cudaprobe_bench(
            "op=bench-pair n=1 size=1 ns_per_pair=5.0 failures=1 rc=2 name=CUDA_ERROR_OUT_OF_MEMORY"))


class Smi(unittest.TestCase):
    def test_compute_apps(self):
        self.assertEqual(parse.parse_compute_apps("100, 3584\n101, 512 MiB\nbad\n"),
                         {100: 3584, 101: 512})
        self.assertEqual(parse.parse_compute_apps("No running processes found"), {})

    def test_memory(self):
        self.assertEqual(parse.parse_smi_memory("4096, 12\n"), (4096, 12))
        self.assertEqual(parse.parse_smi_memory("4096 MiB, 12 MiB"), (4096, 12))
        self.assertEqual(parse.parse_smi_memory("NVIDIA-SMI has failed"), (None, None))


ENFORCE_OK = [
    "MEMINFO free=4000000000 total=4294967296",
    "BIG_OOM ok=1 kind=OutOfMemoryError",
    "FILL granted=3758096384 oom=1 kind=OutOfMemoryError figure=3758096384",
    "FREED figure=0",
    "RECOVERED_OK bytes=1073741824",
    "COMPUTE_OK",
    "OOM_OK kind=OutOfMemoryError",
    "DONE rc=0",
]


class Evaluate(unittest.TestCase):
    def test_enforced_pass(self):
        st, why, figs = evaluate.eval_enforced(TORCH, ENFORCE_OK, QUOTA)
        self.assertEqual((st, why), ("pass", ""))
        self.assertEqual(figs["fill_granted"], 3758096384)

    def test_enforced_wrong_error_kind(self):
        lines = [l.replace("OutOfMemoryError", "RuntimeError") for l in ENFORCE_OK]
        st, why, _ = evaluate.eval_enforced(TORCH, lines, QUOTA)
        self.assertEqual(st, "fail")
        self.assertIn("expected OutOfMemoryError", why)

    def test_enforced_never_refused(self):
        lines = ["BIG_OOM ok=0 kind=none_granted",
                 "FILL granted=6442450944 oom=0 kind=none", "RECOVERED_OK", "COMPUTE_OK"]
        st, why, _ = evaluate.eval_enforced(CUDA, lines, QUOTA)
        self.assertEqual(st, "fail")
        self.assertIn("never refused", why)
        self.assertIn("not refused", why)

    def test_enforced_granted_over_quota(self):
        lines = [l.replace("3758096384", str(QUOTA + MIB)) for l in ENFORCE_OK]
        st, why, _ = evaluate.eval_enforced(TORCH, lines, QUOTA)
        self.assertIn("> quota", why)

    def test_enforced_no_recovery(self):
        lines = [l for l in ENFORCE_OK if not l.startswith(("RECOVERED", "COMPUTE"))]
        lines.append("COMPUTE_FAIL err=CUDA_error")
        st, why, _ = evaluate.eval_enforced(TORCH, lines, QUOTA)
        self.assertEqual(st, "fail")
        self.assertIn("no recovery", why)
        self.assertIn("CUDA_error", why)

    def test_virtualised(self):
        self.assertEqual(evaluate.eval_virtualised(ENFORCE_OK, 4096, QUOTA)[0], "pass")
        st, why, _ = evaluate.eval_virtualised(ENFORCE_OK, 143771, QUOTA)
        self.assertEqual(st, "fail")
        self.assertIn("nvidia-smi", why)
        st, why, _ = evaluate.eval_virtualised(["MEMINFO free=1 total=150109880320"], 4096, QUOTA)
        self.assertIn("framework total", why)
        self.assertEqual(evaluate.eval_virtualised([], None, QUOTA)[0], "fail")

    def test_observed_tolerance(self):
        view = {"observed_bytes": GIB + 64 * MIB, "hooked": True, "verdict": "ok"}
        self.assertEqual(evaluate.eval_observed(GIB, view)[0], "pass")  # 64 MiB = the floor
        view["observed_bytes"] = GIB + 65 * MIB
        self.assertEqual(evaluate.eval_observed(GIB, view)[0], "fail")
        # 5 % of 4 GiB is above the floor.
        view["observed_bytes"] = 4 * GIB + 200 * MIB
        self.assertEqual(evaluate.eval_observed(4 * GIB, view)[0], "pass")

    def test_observed_prefers_data_and_flags_false_bypass(self):
        view = {"observed_bytes": GIB + 500 * MIB, "observed_data_bytes": GIB, "hooked": True}
        st, _, figs = evaluate.eval_observed(GIB, view)
        self.assertEqual((st, figs["basis"]), ("pass", "observed_data_bytes"))
        st, why, _ = evaluate.eval_observed(GIB, {"observed_bytes": GIB, "hooked": False,
                                            "verdict": "bypass"})
        self.assertEqual(st, "fail")
        self.assertIn("not hooked", why)
        self.assertEqual(evaluate.eval_observed(GIB, None)[0], "fail")

    def test_bypass(self):
        self.assertEqual(evaluate.eval_bypass(True, 0.2)[0], "pass")
        self.assertEqual(evaluate.eval_bypass(True, 1.2)[0], "fail")
        self.assertEqual(evaluate.eval_bypass(True, None)[0], "fail")
        self.assertEqual(evaluate.eval_bypass(False, 0.1)[0], "fail")

    def test_native(self):
        self.assertEqual(evaluate.eval_native(TORCH, ["MEMINFO free=1 total=2", "COMPUTE_OK"])[0], "pass")
        st, why, _ = evaluate.eval_native(TORCH, ["STEP_ERROR step=init err=boom"])
        self.assertEqual(st, "fail")
        self.assertIn("boom", why)


class Report(unittest.TestCase):
    def test_table(self):
        cells = []
        for wl in spec.WORKLOADS:
            for ch in ["native"] + spec.CHECKS:
                cells.append(evaluate.cell(wl["name"], ch, "pass", "", {}))
        cells[3] = evaluate.cell(spec.WORKLOADS[0]["name"], "observed", "fail", "a|b\nc", {})
        res = {"cells": cells, "summary": evaluate.summarize(cells), "meta": {}, "env": {},
               "two_process": {"status": "pass", "reason": "", "grants": {"1": {"ok": "1"}}},
               "bench": {"pair": {"native": {"median_ns": 12.5, "min_ns": 11.0}},
                         "train": {"native": {"ms_per_step": 3.2}}}}
        md = report.render_markdown(res)
        rows = [l for l in md.splitlines() if l.startswith("| ") and not l.startswith("| workload")
                and not l.startswith("| setup")]
        self.assertEqual(len(rows), 6 + 2)
        self.assertIn("29 pass, 1 fail", md)
        self.assertIn("- torch-default / observed: fail: a/b c", md)
        self.assertIn("| native | 12.5 | 11.0 |", md)

class TwoProcess(unittest.TestCase):
    GOOD = {"grants": {"1": {"ok": "1", "bytes": "2684354560"},
                       "2": {"ok": "0", "kind": "cudaErrorMemoryAllocation"}},
            "region": {"limit": QUOTA, "used": 3770679296}, "inspect": {"used": 3770679296},
            "nvml_sum_mib": 3596}

    def test_pass(self):
        self.assertEqual(evaluate.eval_two_process(self.GOOD, 4096), ("pass", ""))

    def test_fail_cases(self):
        both = dict(self.GOOD, grants={"1": {"ok": "1"}, "2": {"ok": "1"}}, nvml_sum_mib=6144)
        st, why = evaluate.eval_two_process(both, 4096)
        self.assertEqual(st, "fail")
        self.assertIn("expected one grant and one OOM, got ok=['1', '1']", why)
        self.assertIn("NVML total 6144 MiB > quota 4096 MiB", why)
        over = dict(self.GOOD, region={"used": QUOTA + 1}, inspect={"error": "exit 1"})
        st, why = evaluate.eval_two_process(over, 4096)
        self.assertIn(f"region used {QUOTA + 1} > limit {QUOTA}", why)
        self.assertIn("inspect: exit 1", why)
        st, why = evaluate.eval_two_process(dict(self.GOOD, region={"error": "v3"},
                                                 nvml_sum_mib=None), 4096)
        self.assertIn("region unreadable: v3", why)
        self.assertIn("NVML listed neither process", why)


# ---- the real H200 results in gpu/results/ as fixtures ----

RESULTS = os.path.join(HERE, "results")
RUNS = ["h200-run1", "h200-run2", "h200-run3", "h200-run4", "h200-physical-run1",
        "h200-physical-run2"]


def load_run(name):
    with open(os.path.join(RESULTS, name + ".json")) as f:
        return json.load(f)


def stage_line(tag, name):
    """A C program's `TAG rc= name=` line from the name results.json keeps (0 for success)."""
    if name is None:
        return None
    rc = 0 if name in ("CUDA_SUCCESS", "cudaSuccess") else (2 if name in spec.OOM_NAMES else 1)
    return f"{tag} rc={rc} name={name}"


def kv_line(tag, kv):
    return None if kv is None else tag + "".join(f" {k}={v}" for k, v in kv.items())


def audit_of(f, pids):
    """The parsed audit a physical agent cell saw, rebuilt from its figures (None: none)."""
    if "findings" not in f:
        return None
    verdicts = f.get("verdicts") or {str(p): f.get("verdict") for p in pids}
    procs = [{"pid": int(p), "verdict": v} for p, v in verdicts.items()]
    return parse.parse_audit_json(json.dumps({"processes": procs, "findings": f["findings"]}))


def reevaluate(c, res):
    """(status, reason) of a stored cell, evaluated again from the figures it stored; None
    when the figures do not carry the evaluation's inputs (native: only the total is kept)."""
    f, ch, row = c["figures"], c["check"], c["workload"]
    quota = res["meta"]["quota_mb"] * MIB
    wl = next((w for w in spec.WORKLOADS if w["name"] == row), None)
    if wl is not None:
        if ch == "enforced":
            kind = f.get("fill_oom_kind")
            oom = "1" if kind not in (None, "none") else "0"
            lines = [kv_line("BIG_OOM", f.get("big_oom")),
                     f"FILL granted={f['fill_granted']} oom={oom} kind={kind}"
                     if f.get("fill_granted") is not None else None,
                     "RECOVERED_OK" if f.get("recovered") else None,
                     "COMPUTE_OK" if f.get("compute") else None]
            return evaluate.eval_enforced(wl, [x for x in lines if x], quota)[:2]
        if ch == "virtualised":
            lines = [f"MEMINFO free={f['meminfo_free']} total={f['meminfo_total']}"]
            return evaluate.eval_virtualised(lines, f.get("nvidia_smi_total_mib"), quota)[:2]
        if ch == "observed":
            view = None
            if f.get("basis"):
                view = {f["basis"]: f.get("observed_bytes"), "hooked": f.get("hooked"),
                        "verdict": f.get("verdict"), "accounted_bytes": f.get("accounted_bytes")}
            return evaluate.eval_observed(f.get("framework_bytes"), view)[:2]
        if ch == "bypass":
            found = bool(f.get("audit_found") or f.get("metrics_found"))
            return evaluate.eval_bypass(found, f.get("latency_s"))[:2]
        return None
    if ch == "preload" and row in ("mipmap", "module-lazy", "module-eager"):
        tags = (["INIT", "PRE", "MIPMAP", "NEXT"] if row == "mipmap"
                else ["INIT", "PRE", "OUTBUF", "LAUNCH", "SYNC", "NEXT"])
        lines = [stage_line(t, f.get(t.lower())) for t in tags]
        if f.get("result_ok") is not None:
            lines.append(f"RESULT ok={int(f['result_ok'])}")
        lines = [x for x in lines if x]
        if row == "mipmap":
            return physical.eval_mipmap_preload(lines, f["smi_mib"], f["quota_mib"])[:2]
        return physical.eval_module_preload(lines, f["smi_mib"], f["quota_mib"],
                                            row == "module-lazy",
                                            bool(f.get("control_ok")))[:2]
    if ch == "preload" and row == "pool":
        pids = f["pids"]
        a = [kv_line("ALLOC", f.get("a_alloc")),
             f"DROPPED reserved={f['a_reserved_after_drop']}"
             if f.get("a_reserved_after_drop") is not None else None]
        b = [kv_line("GRAB", f.get("b_grab"))]
        samples = []
        for smp in res["physical"]["smi"]["pool-preload"]:
            apps = None
            if "mib" in smp:
                apps = {int(p): v for p, v in smp["mib"].items() if v is not None}
            samples.append(dict({"apps": apps}, **({"label": smp["label"]}
                                                   if "label" in smp else {})))
        return physical.eval_pool_preload([x for x in a if x], [x for x in b if x], samples,
                                          pids, f["quota_mib"], 2560)[:2]
    if ch.startswith("agent-"):
        pids = f["pids"]
        return physical.eval_agent_flag(audit_of(f, pids), f["mode"], pids, f["region"],
                                        (True, ""))[:2]
    if ch == "audit":
        return physical.eval_preexisting_audit(audit_of(f, [f["pid"]]), f["audit_rc"],
                                               f["pid"], (True, ""), f.get("smi_mib"))[:2]
    return None


class StoredResults(unittest.TestCase):
    """The committed results of the real H200 runs: the pure code re-renders and re-evaluates
    them to what the runner wrote on the GPU machine."""

    def test_rerender_gives_the_stored_markdown(self):
        for name in RUNS:
            with self.subTest(run=name):
                with open(os.path.join(RESULTS, name + ".md")) as f:
                    stored = f.read()
                if name == "h200-run4":
                    # Written before the benchmark section was left out when empty (--no-bench).
                    self.assertIn("\n\n## Benchmarks\n\n", stored)
                    stored = stored.replace("\n\n## Benchmarks\n\n", "\n", 1)
                self.assertEqual(report.render_markdown(load_run(name)), stored)

    def test_reevaluation_gives_the_stored_verdicts(self):
        checked = 0
        for name in RUNS:
            res = load_run(name)
            cells = res["cells"] + ((res.get("physical") or {}).get("cells") or [])
            for c in cells:
                got = reevaluate(c, res)
                if got is None:
                    continue
                checked += 1
                with self.subTest(run=name, cell=(c["workload"], c["check"])):
                    self.assertEqual(got[0], c["status"], got[1])
                    # The runner may append what it saw around the rule (audit errors, notes).
                    self.assertTrue(c["reason"].startswith(got[1]), (got[1], c["reason"]))
        # Every cell of the six runs but the native ones (which keep only the total): 24 in
        # each standard run, 16 + 11 and 24 + 11 in the two physical runs.
        self.assertEqual(checked, 4 * 24 + (16 + 11) + (24 + 11))

    def test_stored_failures_stay_failures(self):
        """The stored runs' red cells, evaluated again: the same rule catches them."""
        res = load_run("h200-physical-run1")
        c = next(c for c in res["cells"] if (c["workload"], c["check"]) == ("torch-async",
                                                                           "observed"))
        self.assertEqual(reevaluate(c, res),
                         ("fail", "agent reports the preloaded process as bypass"))
        res = load_run("h200-physical-run2")
        c = next(c for c in res["cells"] if (c["workload"], c["check"]) == ("cupy", "bypass"))
        self.assertEqual(reevaluate(c, res), ("fail", "bypass reported but latency not measured"))

    def test_two_process_records(self):
        for name in RUNS:
            tp = load_run(name).get("two_process")
            if not tp or "grants" not in tp:
                continue
            with self.subTest(run=name):
                st, why = evaluate.eval_two_process(tp, tp["limit_mib"])
                self.assertEqual((st, why), (tp["status"], tp["reason"]))

    def test_summaries(self):
        for name in RUNS:
            res = load_run(name)
            with self.subTest(run=name):
                self.assertEqual(evaluate.summarize(res["cells"]), res["summary"])
                if res.get("physical"):
                    self.assertEqual(evaluate.summarize(res["physical"]["cells"]),
                                     res["physical"]["summary"])


if __name__ == "__main__":
    unittest.main()
