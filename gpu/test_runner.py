"""Tests for run_acceptance.py that need no GPU: python3 -m unittest gpu/test_runner.py -v

Unit tests cover the parsing and evaluation; the integration tests run the whole runner
against stand-ins (gpu/testing/: nvcc = gcc + a stub CUDA runtime, a fake nvidia-smi and a
fake hami-agent) for the two CUDA C workloads, including a hanging workload, and for the
physical group (issue 8; with gpu/testing/fake_torch and a stub driver API).
"""

import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import run_acceptance as ra  # noqa: E402

MIB = 1 << 20
GIB = 1 << 30
QUOTA = 4 * GIB
TORCH = ra.WORKLOADS[0]
CUDA = ra.WORKLOADS[4]


class ParseLine(unittest.TestCase):
    def test_protocol_line(self):
        self.assertEqual(ra.parse_line("MEMINFO free=1 total=2\n"),
                         ("MEMINFO", {"free": "1", "total": "2"}))
        self.assertEqual(ra.parse_line("OOM_OK kind=OutOfMemoryError"),
                         ("OOM_OK", {"kind": "OutOfMemoryError"}))

    def test_noise_is_not_a_tag(self):
        self.assertEqual(ra.parse_line("/usr/lib/python3/warnings.py:1: UserWarning: x"), (None, {}))
        self.assertEqual(ra.parse_line(""), (None, {}))
        self.assertEqual(ra.parse_line("hami: warning: something"), (None, {}))

    def test_find_tag_first(self):
        lines = ["noise", "HOLDING bytes=5", "HOLDING bytes=6"]
        self.assertEqual(ra.find_tag(lines, "HOLDING"), {"bytes": "5"})
        self.assertIsNone(ra.find_tag(lines, "DONE"))


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
        a = ra.parse_audit_json(json.dumps(self.DOC))
        self.assertEqual(a["processes"][10]["observed_bytes"], GIB)
        self.assertTrue(a["processes"][10]["hooked"])
        self.assertEqual(a["findings"][0]["kind"], "bypass")
        self.assertTrue(ra.audit_bypass_for(a, 11))
        self.assertFalse(ra.audit_bypass_for(a, 10))
        self.assertFalse(ra.audit_bypass_for(a, 12))

    def test_json_lines_last_object_wins(self):
        text = "starting\n" + json.dumps({"processes": [], "findings": []}) + "\n" + json.dumps(self.DOC)
        a = ra.parse_audit_json(text)
        self.assertIn(11, a["processes"])

    def test_kind_spelling_and_data_split(self):
        doc = {"processes": [{"pid": "7", "observed": 5, "observed_by_kind": {"data": 4}}],
               "findings": [{"kind": "Leaked-Slot", "pid": None, "bytes": 1}]}
        a = ra.parse_audit_json(json.dumps(doc))
        self.assertEqual(a["processes"][7]["observed_data_bytes"], 4)
        self.assertEqual(a["findings"][0]["kind"], "leaked_slot")

    def test_agent_rs_shape(self):
        """The shape hami-user/src/agent.rs (ProcessRow) and findings.rs serialise."""
        doc = {"version": 1, "seconds": 6.0,
               "processes": [{"pid": 9, "comm": "python3", "hooked": None, "observed": GIB,
                              "accounted": None, "verdict": "bypass,drift"}],
               "findings": [{"kind": "bypass", "reason": "no_preload", "pid": 9,
                             "bytes": GIB, "standing": True}], "failed": True}
        a = ra.parse_audit_json(json.dumps(doc))
        self.assertEqual(a["processes"][9]["observed_bytes"], GIB)
        self.assertIsNone(a["processes"][9]["hooked"])
        self.assertTrue(ra.audit_bypass_for(a, 9))
        doc["findings"] = []
        self.assertTrue(ra.audit_bypass_for(ra.parse_audit_json(json.dumps(doc)), 9))
        self.assertTrue(ra.verdict_has("drift, bypass", "bypass"))
        self.assertFalse(ra.verdict_has("ok", "bypass"))
        self.assertFalse(ra.verdict_has(None, "bypass"))

    def test_audit_ready_line(self):
        self.assertTrue(ra.audit_says_ready("INFO probes Attached to /lib/libcuda.so.1\n"))
        self.assertFalse(ra.audit_says_ready("INFO loading eBPF\n"))

    def test_garbage_raises(self):
        with self.assertRaises(ValueError):
            ra.parse_audit_json("error: not root")
        with self.assertRaises(ValueError):
            ra.parse_audit_json("[1, 2]")


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
        s = ra.parse_prometheus(self.TEXT)
        self.assertIn(("hami_events_total", {}, 12345.0), s)
        self.assertEqual(s[0][1], {"kind": "bypass", "pid": "42", "container": "a,b"})

    def test_bypass_counts(self):
        s = ra.parse_prometheus(self.TEXT)
        self.assertEqual(ra.metrics_bypass_count(s), 3.0)
        self.assertEqual(ra.metrics_bypass_count(s, 42), 1.0)
        self.assertEqual(ra.metrics_bypass_count(s, 44), 0.0)
        self.assertEqual(ra.metrics_for_pid(s, 42)["hami_observed_bytes{kind=data}"], float(GIB))

    def test_agent_metric_names(self):
        """hami-user/src/metrics.rs: the counter wins over the standing gauge."""
        text = ('hami_findings{kind="bypass"} 0\n'
                'hami_findings_total{kind="bypass"} 4\n'
                'hami_findings_total{kind="drift"} 9\n'
                'hami_process_observed_bytes{container="/",hooked="false",pid="77"} 1073741824\n')
        s = ra.parse_prometheus(text)
        self.assertEqual(ra.metrics_bypass_count(s), 4.0)
        self.assertEqual(ra.metrics_observed_for_pid(s, 77), (GIB, False))
        self.assertEqual(ra.metrics_observed_for_pid(s, 78), (None, None))


def make_region(limit, used, slots, version=2):
    """Bytes of a region as hami-common/src/layout.rs lays it out (version 1 or 2)."""
    slot_size = ra.region_slot_size(version)
    total = ra.REGION_HEADER_SIZE + ra.REGION_MAX_SLOTS * slot_size
    b = bytearray(total)
    b[0:8] = ra.REGION_MAGIC
    struct.pack_into("<IIQ", b, 8, version, ra.REGION_HEADER_SIZE, total)
    struct.pack_into("<Q", b, 136, limit)
    struct.pack_into("<Q", b, 584, used)
    for i, (pid, ctx, data, *rest) in slots.items():
        off = ra.REGION_HEADER_SIZE + i * slot_size
        struct.pack_into("<IIQ", b, off, pid, 1, 99)
        struct.pack_into("<QQQ", b, off + 16, ctx, 0, data)
        if rest:
            struct.pack_into("<Q", b, off + 16 + 24, rest[0])
    return bytes(b)


class Region(unittest.TestCase):
    def test_decode(self):
        r = ra.read_region_bytes(make_region(QUOTA, 3 * GIB + 600 * MIB,
                                             {0: (100, 300 * MIB, 3 * GIB), 5: (101, 300 * MIB, 0)}))
        self.assertEqual(r["limits"][0], QUOTA)
        self.assertEqual(r["used"][0], 3 * GIB + 600 * MIB)
        self.assertEqual([s["pid"] for s in r["slots"]], [100, 101])
        self.assertEqual(r["slots"][0]["usage"]["data"], 3 * GIB)
        self.assertEqual(r["slots"][1]["slot"], 5)

    def test_decode_v2_pool_and_v1(self):
        r = ra.read_region_bytes(make_region(QUOTA, 0, {2: (7, MIB, 2 * MIB, 3 * GIB)}))
        self.assertEqual(r["slots"][0]["usage"]["pool"], 3 * GIB)
        self.assertEqual(r["slots"][0]["total"], 3 * GIB + 3 * MIB)
        r = ra.read_region_bytes(make_region(QUOTA, 0, {2: (7, MIB, 2 * MIB)}, version=1))
        self.assertEqual(r["slots"][0]["usage"], {"context": MIB, "module": 0, "data": 2 * MIB})

    def test_rejects_other_layouts(self):
        good = make_region(1, 0, {})
        with self.assertRaises(ValueError):
            ra.read_region_bytes(b"XXXXXXXX" + good[8:])
        bad_version = bytearray(good)
        struct.pack_into("<I", bad_version, 8, 3)
        with self.assertRaises(ValueError):
            ra.read_region_bytes(bytes(bad_version))
        with self.assertRaises(ValueError):
            ra.read_region_bytes(good[:2000])

    def test_layout_constants_match_rust(self):
        """The offsets above are derived from layout.rs; fail loudly if its shape changes."""
        src = os.path.join(os.path.dirname(HERE), "hami-common", "src", "layout.rs")
        with open(src) as f:  # the test runs in a repository checkout, not in the bundle
            text = f.read()
        self.assertIn("pub const MAX_DEVICES: usize = 16;", text)
        self.assertIn("pub const MAX_SLOTS: usize = 1024;", text)
        self.assertIn("pub const LOCK_BYTES: usize = 64;", text)
        # Header fields after `used`: boot_id (16 bytes) + reserved u64s = 256 bytes.
        import re
        boot = 16 if "pub boot_id: [u8; 16]," in text else 0
        m = re.search(r"pub _reserved: \[u64; (\d+)\]", text)
        self.assertIsNotNone(m)
        self.assertEqual(boot + 8 * int(m.group(1)), ra.REGION_HEADER_SIZE - 712)
        v = re.search(r"pub const VERSION: u32 = (\d+);", text)
        self.assertIsNotNone(v)
        version = int(v.group(1))
        self.assertIn(version, ra.REGION_USAGE_KINDS, "the runner cannot read this layout")
        k = re.search(r"pub const USAGE_KINDS: usize = (\d+);", text)
        self.assertEqual(int(k.group(1)), len(ra.REGION_USAGE_KINDS[version]))


class Cudaprobe(unittest.TestCase):
    def test_bench_line(self):
        out = ("pid=5 via=procaddr device=0\nop=init rc=0 name=CUDA_SUCCESS\n"
               "op=bench-pair n=500 size=1048576 ns_per_pair=9000.0 failures=0 rc=0 name=CUDA_SUCCESS\n"
               "op=bench-pair n=10000 size=1048576 ns_per_pair=8123.5 failures=0 rc=0 name=CUDA_SUCCESS\n")
        self.assertEqual(ra.parse_cudaprobe_bench(out), 8123.5)
        self.assertIsNone(ra.parse_cudaprobe_bench(
            "op=bench-pair n=1 size=1 ns_per_pair=5.0 failures=1 rc=2 name=CUDA_ERROR_OUT_OF_MEMORY"))


class Smi(unittest.TestCase):
    def test_compute_apps(self):
        self.assertEqual(ra.parse_compute_apps("100, 3584\n101, 512 MiB\nbad\n"),
                         {100: 3584, 101: 512})
        self.assertEqual(ra.parse_compute_apps("No running processes found"), {})

    def test_memory(self):
        self.assertEqual(ra.parse_smi_memory("4096, 12\n"), (4096, 12))
        self.assertEqual(ra.parse_smi_memory("4096 MiB, 12 MiB"), (4096, 12))
        self.assertEqual(ra.parse_smi_memory("NVIDIA-SMI has failed"), (None, None))


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
        st, why, figs = ra.eval_enforced(TORCH, ENFORCE_OK, QUOTA)
        self.assertEqual((st, why), ("pass", ""))
        self.assertEqual(figs["fill_granted"], 3758096384)

    def test_enforced_wrong_error_kind(self):
        lines = [l.replace("OutOfMemoryError", "RuntimeError") for l in ENFORCE_OK]
        st, why, _ = ra.eval_enforced(TORCH, lines, QUOTA)
        self.assertEqual(st, "fail")
        self.assertIn("expected OutOfMemoryError", why)

    def test_enforced_never_refused(self):
        lines = ["BIG_OOM ok=0 kind=none_granted",
                 "FILL granted=6442450944 oom=0 kind=none", "RECOVERED_OK", "COMPUTE_OK"]
        st, why, _ = ra.eval_enforced(CUDA, lines, QUOTA)
        self.assertEqual(st, "fail")
        self.assertIn("never refused", why)
        self.assertIn("not refused", why)

    def test_enforced_granted_over_quota(self):
        lines = [l.replace("3758096384", str(QUOTA + MIB)) for l in ENFORCE_OK]
        st, why, _ = ra.eval_enforced(TORCH, lines, QUOTA)
        self.assertIn("> quota", why)

    def test_enforced_no_recovery(self):
        lines = [l for l in ENFORCE_OK if not l.startswith(("RECOVERED", "COMPUTE"))]
        lines.append("COMPUTE_FAIL err=CUDA_error")
        st, why, _ = ra.eval_enforced(TORCH, lines, QUOTA)
        self.assertEqual(st, "fail")
        self.assertIn("no recovery", why)
        self.assertIn("CUDA_error", why)

    def test_virtualised(self):
        self.assertEqual(ra.eval_virtualised(ENFORCE_OK, 4096, QUOTA)[0], "pass")
        st, why, _ = ra.eval_virtualised(ENFORCE_OK, 143771, QUOTA)
        self.assertEqual(st, "fail")
        self.assertIn("nvidia-smi", why)
        st, why, _ = ra.eval_virtualised(["MEMINFO free=1 total=150109880320"], 4096, QUOTA)
        self.assertIn("framework total", why)
        self.assertEqual(ra.eval_virtualised([], None, QUOTA)[0], "fail")

    def test_observed_tolerance(self):
        view = {"observed_bytes": GIB + 64 * MIB, "hooked": True, "verdict": "ok"}
        self.assertEqual(ra.eval_observed(GIB, view)[0], "pass")  # 64 MiB = the floor
        view["observed_bytes"] = GIB + 65 * MIB
        self.assertEqual(ra.eval_observed(GIB, view)[0], "fail")
        # 5 % of 4 GiB is above the floor.
        view["observed_bytes"] = 4 * GIB + 200 * MIB
        self.assertEqual(ra.eval_observed(4 * GIB, view)[0], "pass")

    def test_observed_prefers_data_and_flags_false_bypass(self):
        view = {"observed_bytes": GIB + 500 * MIB, "observed_data_bytes": GIB, "hooked": True}
        st, _, figs = ra.eval_observed(GIB, view)
        self.assertEqual((st, figs["basis"]), ("pass", "observed_data_bytes"))
        st, why, _ = ra.eval_observed(GIB, {"observed_bytes": GIB, "hooked": False,
                                            "verdict": "bypass"})
        self.assertEqual(st, "fail")
        self.assertIn("not hooked", why)
        self.assertEqual(ra.eval_observed(GIB, None)[0], "fail")

    def test_bypass(self):
        self.assertEqual(ra.eval_bypass(True, 0.2)[0], "pass")
        self.assertEqual(ra.eval_bypass(True, 1.2)[0], "fail")
        self.assertEqual(ra.eval_bypass(True, None)[0], "fail")
        self.assertEqual(ra.eval_bypass(False, 0.1)[0], "fail")

    def test_native(self):
        self.assertEqual(ra.eval_native(TORCH, ["MEMINFO free=1 total=2", "COMPUTE_OK"])[0], "pass")
        st, why, _ = ra.eval_native(TORCH, ["STEP_ERROR step=init err=boom"])
        self.assertEqual(st, "fail")
        self.assertIn("boom", why)


class Report(unittest.TestCase):
    def test_table(self):
        cells = []
        for wl in ra.WORKLOADS:
            for ch in ["native"] + ra.CHECKS:
                cells.append(ra.cell(wl["name"], ch, "pass", "", {}))
        cells[3] = ra.cell(ra.WORKLOADS[0]["name"], "observed", "fail", "a|b\nc", {})
        res = {"cells": cells, "summary": ra.summarize(cells), "meta": {}, "env": {},
               "two_process": {"status": "pass", "reason": "", "grants": {"1": {"ok": "1"}}},
               "bench": {"pair": {"native": {"median_ns": 12.5, "min_ns": 11.0}},
                         "train": {"native": {"ms_per_step": 3.2}}}}
        md = ra.render_markdown(res)
        rows = [l for l in md.splitlines() if l.startswith("| ") and not l.startswith("| workload")
                and not l.startswith("| setup")]
        self.assertEqual(len(rows), 6 + 2)
        self.assertIn("29 pass, 1 fail", md)
        self.assertIn("- torch-default / observed: fail: a/b c", md)
        self.assertIn("| native | 12.5 | 11.0 |", md)


# ---- the physical group (issue 8) ----

POOL_A = ["PID pid=100", "READY step=drop", "ALLOC ok=1 bytes=2684354560",
          "DROPPED reserved=2684354560 allocated=0", "HOLDING bytes=2684354560", "DONE rc=0"]
POOL_B_OOM = ["PID pid=101", "READY step=grab", "GRAB ok=0 kind=OutOfMemoryError",
              "HOLDING bytes=0", "DONE rc=0"]
POOL_B_GRANTED = ["PID pid=101", "GRAB ok=1 bytes=2684354560", "HOLDING bytes=2684354560"]


def smi(*apps, dropped_at=None):
    """nvidia-smi samples; the one at index dropped_at is the one taken after A's drop."""
    out = [{"t": i, "apps": a} for i, a in enumerate(apps)]
    if dropped_at is not None:
        out[dropped_at]["label"] = ra.POOL_DROPPED_LABEL
    return out


MIP_REFUSED = ["INIT rc=0 name=CUDA_SUCCESS bytes=0", "PRE rc=0 name=CUDA_SUCCESS bytes=268435456",
               "READY step=mipmap", "MIPMAP rc=2 name=CUDA_ERROR_OUT_OF_MEMORY bytes=2147483648",
               "NEXT rc=0 name=CUDA_SUCCESS bytes=268435456", "HOLDING bytes=268435456"]
MIP_GRANTED = [l.replace("MIPMAP rc=2 name=CUDA_ERROR_OUT_OF_MEMORY",
                         "MIPMAP rc=0 name=CUDA_SUCCESS") for l in MIP_REFUSED]
MIP_CHARGED = [l.replace("NEXT rc=0 name=CUDA_SUCCESS", "NEXT rc=2 name=CUDA_ERROR_OUT_OF_MEMORY")
               for l in MIP_GRANTED]

MOD_UNCHARGED = ["INIT rc=0 name=cudaSuccess", "PRE rc=0 name=cudaSuccess",
                 "OUTBUF rc=0 name=cudaSuccess", "READY step=launch", "LAUNCH rc=0 name=cudaSuccess",
                 "SYNC rc=0 name=cudaSuccess", "RESULT ok=1 sum=24576 expect=24576",
                 "NEXT rc=0 name=cudaSuccess", "HOLDING bytes=1879048192"]


def mod(**changes):
    """MOD_UNCHARGED with some stages' (rc, name) replaced."""
    out = []
    for l in MOD_UNCHARGED:
        tag = l.split()[0]
        if tag in changes:
            rc, name = changes[tag]
            l = f"{tag} rc={rc} name={name}"
        out.append(l)
    return out


OOM_RT = (2, "cudaErrorMemoryAllocation")


def audit(findings=(), procs=()):
    return ra.parse_audit_json(json.dumps({"processes": list(procs), "findings": list(findings)}))


REGION = "/tmp/hami-acc-x/phys-pool-blind.cache"


class PhysicalPreload(unittest.TestCase):
    def test_pool_pass(self):
        st, why, figs = ra.eval_pool_preload(
            POOL_A, POOL_B_OOM, smi({}, {100: 3240}, {100: 3240, 101: 518}, dropped_at=1),
            [100, 101], 4096, 2560)
        self.assertEqual((st, why), ("pass", ""))
        self.assertEqual(figs["smi_max_sum_mib"], 3758)
        self.assertEqual(figs["smi_a_after_drop_mib"], 3240)
        self.assertEqual(figs["a_reserved_after_drop"], 2684354560)

    def test_pool_premise_a_keeps_its_pool(self):
        # A's pool released its memory: B's refusal is then not the quota holding the pool.
        st, why, _ = ra.eval_pool_preload(
            POOL_A, POOL_B_OOM, smi({100: 520}, {100: 520, 101: 518}, dropped_at=0),
            [100, 101], 4096, 2560)
        self.assertEqual(st, "fail")
        self.assertIn("A held only 520 MiB", why)

    def test_pool_b_granted_and_over_quota(self):
        """What the H200 showed at 129056f: B granted, 3240 + 3240 MiB held."""
        st, why, figs = ra.eval_pool_preload(
            POOL_A, POOL_B_GRANTED, smi({100: 3240, 101: 518}, {100: 3240, 101: 3240}),
            [100, 101], 4096, 2560)
        self.assertEqual(st, "fail")
        self.assertIn("B was granted", why)
        self.assertIn("6480 MiB together > quota 4096 MiB", why)

    def test_pool_over_quota_in_one_sample_fails(self):
        st, why, _ = ra.eval_pool_preload(
            POOL_A, POOL_B_OOM, smi({100: 3240, 101: 900}, {100: 3240, 101: 518}), [100, 101],
            4096, 2560)
        self.assertEqual(st, "fail")
        self.assertIn("4140 MiB", why)

    def test_pool_needs_evidence(self):
        # OOM for B, but nvidia-smi never listed both processes: no pass on the error alone.
        st, why, _ = ra.eval_pool_preload(POOL_A, POOL_B_OOM, smi({100: 3240}, None), [100, 101],
                                          4096, 2560)
        self.assertEqual(st, "fail")
        self.assertIn("never listed both", why)
        st, why, _ = ra.eval_pool_preload(POOL_A, POOL_B_OOM, [], [100, 101], 4096, 2560)
        self.assertIn("0 samples", why)

    def test_pool_wrong_error_or_a_refused(self):
        b = [l.replace("OutOfMemoryError", "RuntimeError") for l in POOL_B_OOM]
        st, why, _ = ra.eval_pool_preload(POOL_A, b, smi({100: 1, 101: 1}), [100, 101], 4096,
                                          2560)
        self.assertIn("expected OutOfMemoryError", why)
        a = [l.replace("ALLOC ok=1 bytes=2684354560", "ALLOC ok=0 kind=OutOfMemoryError")
             for l in POOL_A]
        st, why, _ = ra.eval_pool_preload(a, POOL_B_OOM, smi({100: 1, 101: 1}), [100, 101], 4096,
                                          2560)
        self.assertEqual(st, "fail")
        self.assertIn("tested nothing", why)
        st, why, _ = ra.eval_pool_preload(["STEP_ERROR step=init err=ImportError:torch"], [],
                                          [], [1, 2], 4096, 2560)
        self.assertIn("A: init: ImportError:torch", why)

    def test_mipmap(self):
        self.assertEqual(ra.eval_mipmap_preload(MIP_REFUSED, 520, 1024)[:2], ("pass", ""))
        st, _, figs = ra.eval_mipmap_preload(MIP_CHARGED, 2570, 1024)
        self.assertEqual((st, figs["outcome"]), ("pass", "charged"))
        # Granted and the next 256 MiB too: the H200 at 129056f.
        st, why, _ = ra.eval_mipmap_preload(MIP_GRANTED, 2824, 1024)
        self.assertEqual(st, "fail")
        self.assertIn("not charged", why)

    def test_mipmap_refused_needs_smi_within_quota(self):
        st, why, _ = ra.eval_mipmap_preload(MIP_REFUSED, 2570, 1024)
        self.assertEqual(st, "fail")
        self.assertIn("2570 MiB > quota", why)
        st, why, _ = ra.eval_mipmap_preload(MIP_REFUSED, None, 1024)
        self.assertIn("did not list", why)

    def test_mipmap_control_and_error_kind(self):
        pre = [l.replace("PRE rc=0 name=CUDA_SUCCESS", "PRE rc=2 name=CUDA_ERROR_OUT_OF_MEMORY")
               for l in MIP_REFUSED]
        st, why, _ = ra.eval_mipmap_preload(pre, 520, 1024)
        self.assertEqual(st, "fail")
        self.assertIn("control", why)
        inv = [l.replace("MIPMAP rc=2 name=CUDA_ERROR_OUT_OF_MEMORY",
                         "MIPMAP rc=1 name=CUDA_ERROR_INVALID_VALUE") for l in MIP_REFUSED]
        st, why, _ = ra.eval_mipmap_preload(inv, 520, 1024)
        self.assertIn("expected CUDA_ERROR_OUT_OF_MEMORY", why)
        self.assertEqual(ra.eval_mipmap_preload(["INIT rc=100 name=CUDA_ERROR_NO_DEVICE"],
                                                None, 1024)[0], "fail")

    def test_module_lazy(self):
        ev = ra.eval_module_preload
        st, _, figs = ev(mod(LAUNCH=OOM_RT), 520, 1024, True, False)
        self.assertEqual((st, figs["outcome"]), ("pass", "refused at the first launch"))
        self.assertEqual(ev(mod(LAUNCH=(0, "cudaSuccess"), SYNC=OOM_RT), 520, 1024, True,
                            False)[0], "pass")
        st, _, figs = ev(mod(NEXT=OOM_RT), 2060, 1024, True, False)
        self.assertEqual((st, figs["control_ok"]), ("pass", True))
        # Loads, runs, and the next allocation is granted: the H200 at 129056f.
        st, why, _ = ev(MOD_UNCHARGED, 2310, 1024, True, True)
        self.assertEqual(st, "fail")
        self.assertIn("not charged", why)
        # Refused at launch, yet nvidia-smi shows the module held.
        st, why, _ = ev(mod(LAUNCH=OOM_RT), 2060, 1024, True, False)
        self.assertIn("> quota", why)

    def test_module_lazy_control_and_error_kind(self):
        ev = ra.eval_module_preload
        st, why, _ = ev(mod(PRE=OOM_RT, NEXT=OOM_RT), 520, 1024, True, True)
        self.assertEqual(st, "fail")
        self.assertIn("control", why)
        st, why, _ = ev(mod(LAUNCH=(98, "cudaErrorInvalidDeviceFunction")), 520, 1024, True, True)
        self.assertEqual(st, "fail")
        self.assertIn("cudaErrorInvalidDeviceFunction", why)
        self.assertEqual(ev([], None, 1024, True, True)[0], "fail")

    def test_module_eager(self):
        ev = ra.eval_module_preload
        st, _, figs = ev(mod(INIT=OOM_RT, PRE=OOM_RT), 0, 1024, False, False)
        self.assertEqual(figs["outcome"], "refused at context creation / module load")
        self.assertEqual(st, "pass")
        # The module came with the context and was charged: the first allocation is refused;
        # that proves something only with a control showing 256 MiB fits without it.
        self.assertEqual(ev(mod(PRE=OOM_RT), 2060, 1024, False, True)[0], "pass")
        st, why, _ = ev(mod(PRE=OOM_RT), 2060, 1024, False, False)
        self.assertEqual(st, "fail")
        self.assertIn("no control", why)
        self.assertEqual(ev(mod(NEXT=OOM_RT), 2060, 1024, False, True)[0], "pass")
        self.assertEqual(ev(MOD_UNCHARGED, 2310, 1024, False, True)[0], "fail")


class PhysicalAgent(unittest.TestCase):
    def test_escape_happened(self):
        eh = ra.escape_happened
        self.assertTrue(eh("pool", {"a": POOL_A, "b": POOL_B_GRANTED})[0])
        ok, why = eh("pool", {"a": POOL_A, "b": POOL_B_OOM})
        self.assertFalse(ok)
        self.assertIn("B's allocation", why)
        self.assertTrue(eh("mipmap", {"main": MIP_GRANTED})[0])
        self.assertFalse(eh("mipmap", {"main": MIP_REFUSED})[0])
        self.assertTrue(eh("module-lazy", {"main": MOD_UNCHARGED})[0])
        self.assertFalse(eh("module-lazy", {"main": mod(LAUNCH=OOM_RT)})[0])
        self.assertTrue(eh("pre-existing", {"main": ["HOLDING bytes=1"]})[0])
        self.assertFalse(eh("pre-existing", {"main": []})[0])

    def test_none_needs_bypass_for_every_pid(self):
        a = audit([{"kind": "bypass", "reason": "no_preload", "pid": 100, "bytes": 1}],
                  [{"pid": 101, "verdict": "bypass"}])
        self.assertEqual(ra.eval_agent_flag(a, "none", [100, 101], REGION, (True, ""))[0], "pass")
        a = audit([{"kind": "bypass", "reason": "no_preload", "pid": 100, "bytes": 1}])
        st, why, _ = ra.eval_agent_flag(a, "none", [100, 101], REGION, (True, ""))
        self.assertEqual(st, "fail")
        self.assertIn("[101]", why)

    def test_blind_over_limit_for_the_region(self):
        ol = {"kind": "over_limit", "reason": "observed_above_limit", "pid": None,
              "region": REGION, "bytes": 2 * GIB}
        st, _, figs = ra.eval_agent_flag(audit([ol]), "blind", [100, 101], REGION, (True, ""))
        self.assertEqual((st, figs["flagged_as"]), ("pass", ["over_limit"]))
        # The region as the container names it (a different mount point, same file name).
        other_mount = dict(ol, region="/tmp/phys-pool-blind.cache")
        self.assertEqual(ra.eval_agent_flag(audit([other_mount]), "blind", [100], REGION,
                                            (True, ""))[0], "pass")
        # Another container's region does not count.
        elsewhere = dict(ol, region="/tmp/other.cache")
        st, why, _ = ra.eval_agent_flag(audit([elsewhere]), "blind", [100], REGION, (True, ""))
        self.assertEqual(st, "fail")
        self.assertIn("kinds found: over_limit", why)

    def test_blind_drift_for_a_pid(self):
        d = {"kind": "drift", "reason": "x", "pid": 100, "bytes": GIB}
        self.assertEqual(ra.eval_agent_flag(audit([d]), "blind", [100], REGION, (True, ""))[0],
                         "pass")
        self.assertEqual(ra.eval_agent_flag(audit([dict(d, pid=7)]), "blind", [100], REGION,
                                            (True, ""))[0], "fail")
        self.assertEqual(ra.eval_agent_flag(audit([], [{"pid": 100, "verdict": "drift"}]),
                                            "blind", [100], REGION, (True, ""))[0], "pass")

    def test_blind_needs_over_limit_or_drift(self):
        b = {"kind": "bypass", "reason": "observed_above_accounted", "pid": 100, "bytes": GIB}
        st, why, _ = ra.eval_agent_flag(audit([b]), "blind", [100], REGION, (True, ""))
        self.assertEqual(st, "fail")
        self.assertIn("no over_limit or drift", why)
        # Today's agent: no finding at all.
        self.assertEqual(ra.eval_agent_flag(audit(), "blind", [100], REGION, (True, ""))[0],
                         "fail")
        self.assertEqual(ra.eval_agent_flag(None, "blind", [100], REGION, (True, ""))[0], "fail")

    def test_no_escape_is_an_error_not_a_pass(self):
        ol = {"kind": "over_limit", "pid": None, "region": REGION, "bytes": 1}
        st, why, _ = ra.eval_agent_flag(audit([ol]), "blind", [100], REGION, (False, "refused"))
        self.assertEqual(st, "error")
        self.assertIn("refused", why)

    def test_preexisting_audit(self):
        byp = {"kind": "bypass", "reason": "no_preload", "pid": 100, "bytes": 1536 * MIB}
        ok = (True, "")
        self.assertEqual(ra.eval_preexisting_audit(audit([byp]), 2, 100, ok, 2054)[0], "pass")
        # Today: "ok (baseline)", exit 0.
        base = audit([], [{"pid": 100, "verdict": "ok", "baseline": "pre-existing"}])
        st, why, figs = ra.eval_preexisting_audit(base, 0, 100, ok, 2054)
        self.assertEqual(st, "fail")
        self.assertIn("no bypass finding for pid 100", why)
        self.assertIn("exited 0, expected 2", why)
        self.assertEqual(figs["baseline"], "pre-existing")
        st, why, _ = ra.eval_preexisting_audit(audit([byp]), 1, 100, ok, 2054)
        self.assertIn("exited 1", why)
        self.assertEqual(ra.eval_preexisting_audit(None, None, 100, (False, "no HOLDING"),
                                                   None)[0], "error")

    def test_audit_exit_status_matches_rust(self):
        src = os.path.join(os.path.dirname(HERE), "hami-user", "src", "report.rs")
        with open(src) as f:
            self.assertIn(f"pub const EXIT_FINDINGS: i32 = {ra.AUDIT_EXIT_FINDINGS};", f.read())

    def test_finding_region_parsed(self):
        a = audit([{"kind": "over_limit", "reason": "observed_above_limit", "pid": None,
                    "region": REGION, "device": 0, "bytes": 5}])
        self.assertEqual(a["findings"][0]["region"], REGION)
        self.assertEqual(a["findings"][0]["reason"], "observed_above_limit")

    def test_table(self):
        cells = [ra.cell("pool", "preload", "pass", "",
                         {"b_grab": {"ok": "0", "kind": "OutOfMemoryError"},
                          "smi_max_sum_mib": 3758}),
                 ra.cell("mipmap", "agent-blind", "fail", "no over_limit or drift",
                         {"findings": [{"kind": "bypass"}]})]
        ph = {"blind_preload": "/b.so", "cells": cells, "summary": ra.summarize(cells),
              "rows": ["pool", "mipmap"]}
        text = ra.render_markdown({"cells": [], "meta": {}, "env": {}, "physical": ph,
                                   "bench": {"pair": {}, "train": {}}})
        self.assertIn("PASS (B OutOfMemoryError; smi max 3758 MiB)", text)
        self.assertIn("FAIL (bypass)", text)
        self.assertIn("- mipmap / agent-blind: fail: no over_limit or drift", text)
        self.assertNotIn("| torch-default", text)  # no standard table in a physical-only run


FAKES = os.path.join(HERE, "testing")


class IntegrationBase(unittest.TestCase):
    """Runs the whole runner against gcc + stub cudart, fake nvidia-smi and a fake agent."""

    def run_runner(self, extra_env=None, extra_args=(), only=("nvcc-static", "nvcc-shared"),
                   preload_name="libhami_preload.so"):
        tmp = tempfile.mkdtemp(prefix="hami-acc-test-")
        self.addCleanup(shutil.rmtree, tmp, True)
        src = os.path.join(tmp, "e.c")
        with open(src, "w") as f:
            f.write("int hami_fake_preload;\n")
        preload = os.path.join(tmp, preload_name)
        subprocess.run(["gcc", "-shared", "-fPIC", src, "-o", preload], check=True)
        self.tmp = tmp
        env = dict(os.environ)
        env["PATH"] = os.path.join(FAKES, "bin") + os.pathsep + env["PATH"]
        env.update(extra_env or {})
        port = 19000 + os.getpid() % 1000
        out = os.path.join(tmp, "out")
        t0 = time.monotonic()
        r = subprocess.run(
            [sys.executable, os.path.join(HERE, "run_acceptance.py"), "--out", out,
             "--preload", preload, "--agent", os.path.join(FAKES, "fake_agent.py"),
             "--metrics-addr", f"127.0.0.1:{port}", "--audit-seconds", "1",
             "--audit-attach-s", "0.2", "--only", *only, *extra_args],
            env=env, capture_output=True, text=True, timeout=240)
        elapsed = time.monotonic() - t0
        with open(os.path.join(out, "results.json")) as f:
            res = json.load(f)
        self.assertTrue(os.path.exists(os.path.join(out, "results.md")))
        self.assertGreater(os.path.getsize(os.path.join(out, "logs.txt")), 100)
        self.assertEqual(sorted(os.listdir(out)), ["logs.txt", "results.json", "results.md"])
        return r, res, elapsed


class Integration(IntegrationBase):
    """The standard group (two CUDA C workloads) against the stand-ins."""

    def test_green_with_fakes(self):
        r, res, elapsed = self.run_runner(extra_args=["--pairs", "10"])
        self.assertEqual(r.returncode, 0, r.stderr[-2000:])
        cells = {(c["workload"], c["check"]): c for c in res["cells"]}
        for wl in ("nvcc-static", "nvcc-shared"):
            for ch in ["native"] + ra.CHECKS:
                c = cells[(wl, ch)]
                self.assertEqual(c["status"], "pass", f"{wl}/{ch}: {c['reason']}")
        self.assertEqual(cells[("nvcc-static", "virtualised")]["figures"]["meminfo_total"], QUOTA)
        self.assertLess(cells[("nvcc-shared", "bypass")]["figures"]["latency_s"], 1.0)
        # The stub has no shared accounting, so both grabs succeed: the check must say so.
        tp = res["two_process"]
        self.assertEqual(tp["status"], "fail")
        self.assertIn("expected one grant and one OOM", tp["reason"])
        self.assertIn("NVML total 6144 MiB > quota 4096 MiB", tp["reason"])
        self.assertLess(elapsed, 120)

    def test_hanging_workload_times_out_and_runner_continues(self):
        r, res, elapsed = self.run_runner(
            extra_env={"WL_STUB_HANG": "1"},
            extra_args=["--wl-timeout", "3", "--no-bench"])
        self.assertEqual(r.returncode, 0, r.stderr[-2000:])
        cells = {(c["workload"], c["check"]): c for c in res["cells"]}
        self.assertEqual(len(cells), 10)
        for wl in ("nvcc-static", "nvcc-shared"):
            self.assertEqual(cells[(wl, "native")]["status"], "fail")
            self.assertIn("timed out", cells[(wl, "native")]["reason"])
            self.assertEqual(cells[(wl, "enforced")]["status"], "fail")
            self.assertEqual(cells[(wl, "observed")]["status"], "fail")
        # Nothing left behind: every workload process was killed.
        left = subprocess.run(["pgrep", "-f", "hami-acc-.*/cuda_alloc_"], capture_output=True,
                              text=True).stdout.split()
        self.assertEqual(left, [])
        self.assertLess(elapsed, 150)


class PhysicalIntegration(IntegrationBase):
    """`--only physical` against the stand-ins: stub driver and runtime (a quota under a fake
    hami preload unless its name says "blind"), a fake torch (gpu/testing/fake_torch), fake
    nvidia-smi (virtual sizes) and the fake agent (bypass; over_limit under a blind preload)."""

    ENV = {"PYTHONPATH": os.path.join(FAKES, "fake_torch")}

    def test_all_cells_with_fakes(self):
        tmp = tempfile.mkdtemp(prefix="hami-acc-blind-")
        self.addCleanup(shutil.rmtree, tmp, True)
        src = os.path.join(tmp, "e.c")
        with open(src, "w") as f:
            f.write("int hami_fake_blind;\n")
        blind = os.path.join(tmp, "libhami_preload_blind.so")
        subprocess.run(["gcc", "-shared", "-fPIC", src, "-o", blind], check=True)
        r, res, elapsed = self.run_runner(
            extra_env=self.ENV, only=("physical",),
            extra_args=["--blind-preload", blind, "--phys-settle-s", "0.3"])
        self.assertEqual(r.returncode, 0, r.stderr[-2000:])
        self.assertEqual(res["cells"], [])  # the standard group did not run
        cells = {(c["workload"], c["check"]): c for c in res["physical"]["cells"]}
        expected = {(row, ch) for row, chs in ra.PHYS_CELLS.items() for ch in chs}
        self.assertEqual(set(cells), expected)
        for k, c in cells.items():
            self.assertEqual(c["status"], "pass", f"{k}: {c['reason']}")
        pool = cells[("pool", "preload")]["figures"]
        self.assertEqual(pool["b_grab"]["kind"], "OutOfMemoryError")
        self.assertGreaterEqual(pool["smi_samples_with_both"], 1)
        self.assertEqual(cells[("mipmap", "preload")]["figures"]["outcome"], "refused")
        self.assertEqual(cells[("pool", "agent-blind")]["figures"]["flagged_as"], ["over_limit"])
        self.assertEqual(cells[("pre-existing", "audit")]["figures"]["audit_rc"], 2)
        self.assertIn("pool-preload", res["physical"]["smi"])
        self.assertLess(elapsed, 90)

    def test_preload_blind_to_the_paths_fails_the_preload_column(self):
        """What the H200 showed at 129056f, with stand-ins: the preload under test is blind."""
        r, res, _ = self.run_runner(
            extra_env=self.ENV, only=("physical",), preload_name="libhami_preload_blind.so",
            extra_args=["--phys-rows", "pool", "mipmap", "module-lazy", "--phys-settle-s",
                        "0.3"])
        self.assertEqual(r.returncode, 0, r.stderr[-2000:])
        cells = {(c["workload"], c["check"]): c for c in res["physical"]["cells"]}
        self.assertEqual(cells[("pool", "preload")]["status"], "fail")
        self.assertIn("B was granted", cells[("pool", "preload")]["reason"])
        self.assertIn("together > quota 4096 MiB", cells[("pool", "preload")]["reason"])
        self.assertIn("not charged", cells[("mipmap", "preload")]["reason"])
        self.assertIn("not charged", cells[("module-lazy", "preload")]["reason"])
        for row in ("pool", "mipmap", "module-lazy"):
            self.assertEqual(cells[(row, "agent-none")]["status"], "pass")
            self.assertEqual(cells[(row, "agent-blind")]["status"], "skipped")
        self.assertNotIn(("pre-existing", "audit"), cells)
        with open(os.path.join(self.tmp, "out", "results.md")) as f:
            self.assertIn("FAIL (B granted", f.read())


if __name__ == "__main__":
    unittest.main()
