"""Unit tests of the physical group's evaluation (gpu/acceptance/physical.py, issue 8), with
the outputs of the failing H200 run at 129056f (which must fail) and of the expected
behaviours. No GPU, no subprocess.

    python3 -m unittest gpu/test_physical.py -v     (also run through gpu/test_runner.py)
"""

import json
import os
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from acceptance import evaluate, parse, physical, report, spec  # noqa: E402

MIB = 1 << 20
GIB = 1 << 30


POOL_A = ["PID pid=100", "READY step=drop", "ALLOC ok=1 bytes=2684354560",
          "DROPPED reserved=2684354560 allocated=0", "HOLDING bytes=2684354560", "DONE rc=0"]
POOL_B_OOM = ["PID pid=101", "READY step=grab", "GRAB ok=0 kind=OutOfMemoryError",
              "HOLDING bytes=0", "DONE rc=0"]
POOL_B_GRANTED = ["PID pid=101", "GRAB ok=1 bytes=2684354560", "HOLDING bytes=2684354560"]


def smi(*apps, dropped_at=None):
    """nvidia-smi samples; the one at index dropped_at is the one taken after A's drop."""
    out = [{"t": i, "apps": a} for i, a in enumerate(apps)]
    if dropped_at is not None:
        out[dropped_at]["label"] = spec.POOL_DROPPED_LABEL
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
    return parse.parse_audit_json(json.dumps({"processes": list(procs), "findings": list(findings)}))


REGION = "/tmp/hami-acc-x/phys-pool-blind.cache"


class PhysicalPreload(unittest.TestCase):
    def test_pool_pass(self):
        st, why, figs = physical.eval_pool_preload(
            POOL_A, POOL_B_OOM, smi({}, {100: 3240}, {100: 3240, 101: 518}, dropped_at=1),
            [100, 101], 4096, 2560)
        self.assertEqual((st, why), ("pass", ""))
        self.assertEqual(figs["smi_max_sum_mib"], 3758)
        self.assertEqual(figs["smi_a_after_drop_mib"], 3240)
        self.assertEqual(figs["a_reserved_after_drop"], 2684354560)

    def test_pool_premise_a_keeps_its_pool(self):
        # A's pool released its memory: B's refusal is then not the quota holding the pool.
        st, why, _ = physical.eval_pool_preload(
            POOL_A, POOL_B_OOM, smi({100: 520}, {100: 520, 101: 518}, dropped_at=0),
            [100, 101], 4096, 2560)
        self.assertEqual(st, "fail")
        self.assertIn("A held only 520 MiB", why)

    def test_pool_b_granted_and_over_quota(self):
        """What the H200 showed at 129056f: B granted, 3240 + 3240 MiB held."""
        st, why, figs = physical.eval_pool_preload(
            POOL_A, POOL_B_GRANTED, smi({100: 3240, 101: 518}, {100: 3240, 101: 3240}),
            [100, 101], 4096, 2560)
        self.assertEqual(st, "fail")
        self.assertIn("B was granted", why)
        self.assertIn("6480 MiB together > quota 4096 MiB", why)

    def test_pool_over_quota_in_one_sample_fails(self):
        st, why, _ = physical.eval_pool_preload(
            POOL_A, POOL_B_OOM, smi({100: 3240, 101: 900}, {100: 3240, 101: 518}), [100, 101],
            4096, 2560)
        self.assertEqual(st, "fail")
        self.assertIn("4140 MiB", why)

    def test_pool_needs_evidence(self):
        # OOM for B, but nvidia-smi never listed both processes: no pass on the error alone.
        st, why, _ = physical.eval_pool_preload(POOL_A, POOL_B_OOM, smi({100: 3240}, None), [100, 101],
                                          4096, 2560)
        self.assertEqual(st, "fail")
        self.assertIn("never listed both", why)
        st, why, _ = physical.eval_pool_preload(POOL_A, POOL_B_OOM, [], [100, 101], 4096, 2560)
        self.assertIn("0 samples", why)

    def test_pool_wrong_error_or_a_refused(self):
        b = [l.replace("OutOfMemoryError", "RuntimeError") for l in POOL_B_OOM]
        st, why, _ = physical.eval_pool_preload(POOL_A, b, smi({100: 1, 101: 1}), [100, 101], 4096,
                                          2560)
        self.assertIn("expected OutOfMemoryError", why)
        a = [l.replace("ALLOC ok=1 bytes=2684354560", "ALLOC ok=0 kind=OutOfMemoryError")
             for l in POOL_A]
        st, why, _ = physical.eval_pool_preload(a, POOL_B_OOM, smi({100: 1, 101: 1}), [100, 101], 4096,
                                          2560)
        self.assertEqual(st, "fail")
        self.assertIn("tested nothing", why)
        st, why, _ = physical.eval_pool_preload(["STEP_ERROR step=init err=ImportError:torch"], [],
                                          [], [1, 2], 4096, 2560)
        self.assertIn("A: init: ImportError:torch", why)

    def test_mipmap(self):
        self.assertEqual(physical.eval_mipmap_preload(MIP_REFUSED, 520, 1024)[:2], ("pass", ""))
        st, _, figs = physical.eval_mipmap_preload(MIP_CHARGED, 2570, 1024)
        self.assertEqual((st, figs["outcome"]), ("pass", "charged"))
        # Granted and the next 256 MiB too: the H200 at 129056f.
        st, why, _ = physical.eval_mipmap_preload(MIP_GRANTED, 2824, 1024)
        self.assertEqual(st, "fail")
        self.assertIn("not charged", why)

    def test_mipmap_refused_needs_smi_within_quota(self):
        st, why, _ = physical.eval_mipmap_preload(MIP_REFUSED, 2570, 1024)
        self.assertEqual(st, "fail")
        self.assertIn("2570 MiB > quota", why)
        st, why, _ = physical.eval_mipmap_preload(MIP_REFUSED, None, 1024)
        self.assertIn("did not list", why)

    def test_mipmap_control_and_error_kind(self):
        pre = [l.replace("PRE rc=0 name=CUDA_SUCCESS", "PRE rc=2 name=CUDA_ERROR_OUT_OF_MEMORY")
               for l in MIP_REFUSED]
        st, why, _ = physical.eval_mipmap_preload(pre, 520, 1024)
        self.assertEqual(st, "fail")
        self.assertIn("control", why)
        inv = [l.replace("MIPMAP rc=2 name=CUDA_ERROR_OUT_OF_MEMORY",
                         "MIPMAP rc=1 name=CUDA_ERROR_INVALID_VALUE") for l in MIP_REFUSED]
        st, why, _ = physical.eval_mipmap_preload(inv, 520, 1024)
        self.assertIn("expected CUDA_ERROR_OUT_OF_MEMORY", why)
        self.assertEqual(physical.eval_mipmap_preload(["INIT rc=100 name=CUDA_ERROR_NO_DEVICE"],
                                                None, 1024)[0], "fail")

    def test_module_lazy(self):
        ev = physical.eval_module_preload
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
        ev = physical.eval_module_preload
        st, why, _ = ev(mod(PRE=OOM_RT, NEXT=OOM_RT), 520, 1024, True, True)
        self.assertEqual(st, "fail")
        self.assertIn("control", why)
        st, why, _ = ev(mod(LAUNCH=(98, "cudaErrorInvalidDeviceFunction")), 520, 1024, True, True)
        self.assertEqual(st, "fail")
        self.assertIn("cudaErrorInvalidDeviceFunction", why)
        self.assertEqual(ev([], None, 1024, True, True)[0], "fail")

    def test_module_eager(self):
        ev = physical.eval_module_preload
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
        eh = physical.escape_happened
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
        self.assertEqual(physical.eval_agent_flag(a, "none", [100, 101], REGION, (True, ""))[0], "pass")
        a = audit([{"kind": "bypass", "reason": "no_preload", "pid": 100, "bytes": 1}])
        st, why, _ = physical.eval_agent_flag(a, "none", [100, 101], REGION, (True, ""))
        self.assertEqual(st, "fail")
        self.assertIn("[101]", why)

    def test_blind_over_limit_for_the_region(self):
        ol = {"kind": "over_limit", "reason": "observed_above_limit", "pid": None,
              "region": REGION, "bytes": 2 * GIB}
        st, _, figs = physical.eval_agent_flag(audit([ol]), "blind", [100, 101], REGION, (True, ""))
        self.assertEqual((st, figs["flagged_as"]), ("pass", ["over_limit"]))
        # The region as the container names it (a different mount point, same file name).
        other_mount = dict(ol, region="/tmp/phys-pool-blind.cache")
        self.assertEqual(physical.eval_agent_flag(audit([other_mount]), "blind", [100], REGION,
                                            (True, ""))[0], "pass")
        # Another container's region does not count.
        elsewhere = dict(ol, region="/tmp/other.cache")
        st, why, _ = physical.eval_agent_flag(audit([elsewhere]), "blind", [100], REGION, (True, ""))
        self.assertEqual(st, "fail")
        self.assertIn("kinds found: over_limit", why)

    def test_blind_drift_for_a_pid(self):
        d = {"kind": "drift", "reason": "x", "pid": 100, "bytes": GIB}
        self.assertEqual(physical.eval_agent_flag(audit([d]), "blind", [100], REGION, (True, ""))[0],
                         "pass")
        self.assertEqual(physical.eval_agent_flag(audit([dict(d, pid=7)]), "blind", [100], REGION,
                                            (True, ""))[0], "fail")
        self.assertEqual(physical.eval_agent_flag(audit([], [{"pid": 100, "verdict": "drift"}]),
                                            "blind", [100], REGION, (True, ""))[0], "pass")

    def test_blind_needs_over_limit_or_drift(self):
        b = {"kind": "bypass", "reason": "observed_above_accounted", "pid": 100, "bytes": GIB}
        st, why, _ = physical.eval_agent_flag(audit([b]), "blind", [100], REGION, (True, ""))
        self.assertEqual(st, "fail")
        self.assertIn("no over_limit or drift", why)
        # Today's agent: no finding at all.
        self.assertEqual(physical.eval_agent_flag(audit(), "blind", [100], REGION, (True, ""))[0],
                         "fail")
        self.assertEqual(physical.eval_agent_flag(None, "blind", [100], REGION, (True, ""))[0], "fail")

    def test_no_escape_is_an_error_not_a_pass(self):
        ol = {"kind": "over_limit", "pid": None, "region": REGION, "bytes": 1}
        st, why, _ = physical.eval_agent_flag(audit([ol]), "blind", [100], REGION, (False, "refused"))
        self.assertEqual(st, "error")
        self.assertIn("refused", why)

    def test_preexisting_audit(self):
        byp = {"kind": "bypass", "reason": "no_preload", "pid": 100, "bytes": 1536 * MIB}
        ok = (True, "")
        self.assertEqual(physical.eval_preexisting_audit(audit([byp]), 2, 100, ok, 2054)[0], "pass")
        # Today: "ok (baseline)", exit 0.
        base = audit([], [{"pid": 100, "verdict": "ok", "baseline": "pre-existing"}])
        st, why, figs = physical.eval_preexisting_audit(base, 0, 100, ok, 2054)
        self.assertEqual(st, "fail")
        self.assertIn("no bypass finding for pid 100", why)
        self.assertIn("exited 0, expected 2", why)
        self.assertEqual(figs["baseline"], "pre-existing")
        st, why, _ = physical.eval_preexisting_audit(audit([byp]), 1, 100, ok, 2054)
        self.assertIn("exited 1", why)
        self.assertEqual(physical.eval_preexisting_audit(None, None, 100, (False, "no HOLDING"),
                                                   None)[0], "error")

    def test_audit_exit_status_matches_rust(self):
        src = os.path.join(os.path.dirname(HERE), "hami-user", "src", "report.rs")
        with open(src) as f:
            self.assertIn(f"pub const EXIT_FINDINGS: i32 = {spec.AUDIT_EXIT_FINDINGS};", f.read())

    def test_finding_region_parsed(self):
        a = audit([{"kind": "over_limit", "reason": "observed_above_limit", "pid": None,
                    "region": REGION, "device": 0, "bytes": 5}])
        self.assertEqual(a["findings"][0]["region"], REGION)
        self.assertEqual(a["findings"][0]["reason"], "observed_above_limit")

    def test_table(self):
        cells = [evaluate.cell("pool", "preload", "pass", "",
                         {"b_grab": {"ok": "0", "kind": "OutOfMemoryError"},
                          "smi_max_sum_mib": 3758}),
                 evaluate.cell("mipmap", "agent-blind", "fail", "no over_limit or drift",
                         {"findings": [{"kind": "bypass"}]})]
        ph = {"blind_preload": "/b.so", "cells": cells, "summary": evaluate.summarize(cells),
              "rows": ["pool", "mipmap"]}
        text = report.render_markdown({"cells": [], "meta": {}, "env": {}, "physical": ph,
                                   "bench": {"pair": {}, "train": {}}})
        self.assertIn("PASS (B OutOfMemoryError; smi max 3758 MiB)", text)
        self.assertIn("FAIL (bypass)", text)
        self.assertIn("- mipmap / agent-blind: fail: no over_limit or drift", text)
        self.assertNotIn("| torch-default", text)  # no standard table in a physical-only run


if __name__ == "__main__":
    unittest.main()
