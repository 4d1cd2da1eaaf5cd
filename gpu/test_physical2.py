"""Unit tests of the physical2 group's evaluation (gpu/acceptance/physical2.py, issue 17), with
the behaviours the H200 showed at 7df65b0 (which must fail) and the expected ones. No GPU, no
subprocess.

    python3 -m unittest gpu/test_physical2.py -v     (also run through gpu/test_runner.py)
"""

import json
import os
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from acceptance import parse, physical2, report, spec  # noqa: E402

MIB = 1 << 20
OK = "rc=0 name=cudaSuccess"
OOM = "rc=2 name=cudaErrorMemoryAllocation"
LP = spec.P2_STAGES["limits_probe"]
MG = spec.P2_STAGES["module_global"]


def limits(mode="heap", **stages):
    """limits_probe lines, every stage succeeding unless given (e.g. SETLIMIT=OOM)."""
    def st(tag):
        return f"{tag} {stages.get(tag, OK)}"
    out = ["PID pid=100", f"FRAMEWORK name=cudart mode={mode}", st("INIT"), st("PRE"),
           st("OUTBUF"), "LIMIT_BEFORE value=8388608", f"READY step={mode}"]
    if mode != "local":
        out += [st("SETLIMIT") + " value=2147483648", "LIMIT_AFTER value=2147483648"]
    else:
        out.append("FUNCATTR rc=0 local_bytes=24576")
    out += [st("LAUNCH"), st("SYNC"), f"RESULT ok={stages.get('RESULT', '1')}",
            f"AFTER {stages.get('AFTER', OK)} ok={stages.get('AFTER_OK', '1')}",
            "HOLDING bytes=135168", "RELEASED", "DONE rc=0"]
    return out


def module(**stages):
    def st(tag):
        return f"{tag} {stages.get(tag, OK)}"
    return ["PID pid=200", st("INIT"), st("PRE"), st("OUTBUF"), "READY step=launch",
            st("LAUNCH"), st("SYNC"), "RESULT ok=1", st("NEXT"), "HOLDING bytes=1"]


HEAP = spec.P2_C_ROWS["heap"]
LOCAL = spec.P2_C_ROWS["local"]
LAZY = spec.P2_C_ROWS["module-lazy"]
EAGER = spec.P2_C_ROWS["module-eager"]


def pre(lines, smi, row, stages=LP, quota=1024):
    return physical2.eval_limit_preload(lines, smi, quota, stages, row["refuse_at"],
                                        row["goes_on"])


class CRows(unittest.TestCase):
    def test_heap_as_at_7df65b0_fails(self):
        """Both calls succeed and the driver holds 2708 MiB against a 1 GiB quota."""
        st, why, figs = pre(limits(), 2708, HEAP)
        self.assertEqual(st, "fail")
        self.assertIn("nothing was refused", why)
        self.assertIn("2708 MiB", why)
        self.assertEqual(figs["outcome"], "nothing refused")

    def test_heap_refused_at_the_set_call_passes(self):
        st, why, figs = pre(limits(SETLIMIT=OOM), 520, HEAP)
        self.assertEqual((st, why), ("pass", ""))
        self.assertEqual(figs["outcome"], "refused at SETLIMIT")
        self.assertEqual(figs["limit_after_value"], 2147483648)

    def test_refusal_with_the_wrong_code_fails(self):
        st, why, _ = pre(limits(SETLIMIT="rc=1 name=cudaErrorInvalidValue"), 520, HEAP)
        self.assertEqual(st, "fail")
        self.assertIn("expected cudaErrorMemoryAllocation", why)
        # What a driver-side limit (MPS) does: the set call passes, the launch fails with 701.
        st, why, _ = pre(limits(LAUNCH="rc=701 name=cudaErrorLaunchOutOfResources"), 520, HEAP)
        self.assertIn("cudaErrorLaunchOutOfResources", why)
        # The growth is admitted at the set call: a refusal only at the launch is too late.
        st, why, _ = pre(limits(LAUNCH=OOM), 520, HEAP)
        self.assertEqual(st, "fail")
        self.assertIn("LAUNCH failed with cudaErrorMemoryAllocation, expected success there and "
                      "an out-of-memory at SETLIMIT", why)

    def test_refused_but_driver_over_quota_fails(self):
        st, why, _ = pre(limits(SETLIMIT=OOM), 2708, HEAP)
        self.assertEqual(st, "fail")
        self.assertIn("2708 MiB > quota 1024 MiB", why)
        st, why, _ = pre(limits(SETLIMIT=OOM), None, HEAP)
        self.assertIn("did not list", why)

    def test_refused_and_the_program_cannot_go_on_fails(self):
        st, why, _ = pre(limits(SETLIMIT=OOM, AFTER=OOM, AFTER_OK="0"), 520, HEAP)
        self.assertEqual(st, "fail")
        self.assertIn("could not go on: AFTER cudaErrorMemoryAllocation", why)
        st, why, _ = pre(limits(SETLIMIT=OOM, AFTER_OK="0"), 520, HEAP)
        self.assertIn("wrong result", why)

    def test_control_refused_fails(self):
        st, why, _ = pre(limits(PRE=OOM, SETLIMIT=OOM), 520, HEAP)
        self.assertEqual(st, "fail")
        self.assertIn("control: PRE failed", why)

    def test_local_refused_at_launch(self):
        st, _, figs = pre(limits("local", LAUNCH=OOM, RESULT="0"), 522, LOCAL)
        self.assertEqual((st, figs["outcome"]), ("pass", "refused at LAUNCH"))
        self.assertEqual(figs["funcattr_local_bytes"], 24576)
        # Today: runs, 6730 MiB.
        self.assertEqual(pre(limits("local"), 6730, LOCAL)[0], "fail")
        # A refusal at the set call is not a place the local row can refuse (no such call).
        st, why, _ = pre(limits("heap", SETLIMIT=OOM), 520, LOCAL)
        self.assertIn("SETLIMIT failed", why)

    def test_module_rows(self):
        st, _, figs = pre(module(LAUNCH=OOM), 520, LAZY, MG)
        self.assertEqual((st, figs["outcome"]), ("pass", "refused at LAUNCH"))
        # Charged afterwards (the next allocation refused) is not enough any more: the driver
        # held 2054 MiB.
        st, why, _ = pre(module(NEXT=OOM), 2054, LAZY, MG)
        self.assertEqual(st, "fail")
        self.assertIn("NEXT failed with cudaErrorMemoryAllocation", why)
        # Eager: refused at context creation; no context, nvidia-smi need not list it.
        st, _, figs = pre(module(INIT=OOM, PRE=OOM, OUTBUF=OOM), None, EAGER, MG)
        self.assertEqual((st, figs["outcome"]), ("pass", "refused at INIT"))
        st, why, _ = pre(module(INIT=OOM), 2054, EAGER, MG)
        self.assertIn("2054 MiB > quota", why)
        # Lazy cannot refuse at INIT (the module is not loaded there).
        self.assertEqual(pre(module(INIT=OOM), None, LAZY, MG)[0], "fail")

    def test_native_baseline(self):
        st, why, figs = physical2.eval_limit_native(limits(), 2708, 1024, LP)
        self.assertEqual((st, why, figs["over_quota"]), ("pass", "", True))
        st, why, _ = physical2.eval_limit_native(limits(), 600, 1024, LP)
        self.assertEqual(st, "pass")
        self.assertIn("tests nothing", why)
        st, why, _ = physical2.eval_limit_native(limits(LAUNCH=OOM), 600, 1024, LP)
        self.assertEqual(st, "fail")
        self.assertIn("natively, LAUNCH failed", why)
        self.assertEqual(physical2.eval_limit_native([], None, 1024, LP)[0], "fail")

    def test_same_results(self):
        nat = physical2.outcome_signature(limits(), LP)
        same = physical2.outcome_signature(limits(), LP)
        self.assertEqual(physical2.eval_same_results(nat, same)[:2], ("pass", ""))
        other = physical2.outcome_signature(limits(SETLIMIT=OOM), LP)
        st, why, _ = physical2.eval_same_results(nat, other)
        self.assertEqual(st, "fail")
        self.assertIn("SETLIMIT (0 -> 2)", why)
        self.assertEqual(physical2.eval_same_results(None, same)[0], "error")
        self.assertEqual(physical2.eval_same_results(nat, None)[0], "fail")


A_FILLED = ["PID pid=300", "READY step=fill", "FILL granted=2281701376 oom=1 kind=OutOfMemoryError",
            "HOLDING bytes=2281701376", "COMPUTE_OK err=", "RELEASED", "DONE rc=0"]
B_CTX_REFUSED = ["PID pid=301", "STEP_ERROR step=init err=AcceleratorError:CUDA_error:_out_of_memory",
                 "HOLDING bytes=0 error=1", "DONE rc=2"]
B_GRAB_OOM = ["PID pid=301", "READY step=grab", "GRAB ok=0 kind=OutOfMemoryError",
              "HOLDING bytes=0"]
B_GRANTED_CTX = ["PID pid=301", "READY step=grab", "GRAB ok=1 bytes=67108864"]


def samples(*apps):
    return [{"t": i, "apps": a} for i, a in enumerate(apps)]


class TorchRows(unittest.TestCase):
    def test_outcome_parsing(self):
        o = physical2.torch_outcome(B_CTX_REFUSED)
        self.assertEqual((o["refused_at"], o["granted"], o["error"]), ("init", None, None))
        o = physical2.torch_outcome(A_FILLED)
        self.assertEqual((o["granted"], o["refused"], o["compute"]),
                         (2281701376, "OutOfMemoryError", True))
        o = physical2.torch_outcome(["STEP_ERROR step=fill err=RuntimeError:CUDA_error:_an_illegal_memory_access"])
        self.assertEqual(o["refused"], None)
        self.assertIn("illegal", o["error"])

    def test_second_context_refused_passes(self):
        for b in (B_CTX_REFUSED, B_GRAB_OOM):
            st, why, figs = physical2.eval_ctx_preload(
                "ctx-second", {"a": A_FILLED, "b": b}, samples({300: 2800}, {300: 2800, 301: 0}),
                [300, 301], 3072)
            self.assertEqual((st, why), ("pass", ""), b)
            self.assertEqual(figs["smi_max_sum_mib"], 2800)

    def test_second_context_as_at_7df65b0_fails(self):
        """The second's first allocation is refused but its context stays: 3560 MiB."""
        st, why, _ = physical2.eval_ctx_preload(
            "ctx-second", {"a": A_FILLED, "b": B_GRAB_OOM},
            samples({300: 3042}, {300: 3042, 301: 518}), [300, 301], 3072)
        self.assertEqual(st, "fail")
        self.assertIn("3560 MiB together > quota 3072 MiB", why)
        st, why, _ = physical2.eval_ctx_preload(
            "ctx-second", {"a": A_FILLED, "b": B_GRANTED_CTX}, samples({300: 2800}), [300, 301],
            3072)
        self.assertIn("B was granted 64 MiB", why)

    def test_second_needs_a_filled_and_going_on(self):
        a = [l for l in A_FILLED if not l.startswith("COMPUTE")]
        st, why, _ = physical2.eval_ctx_preload("ctx-second", {"a": a, "b": B_CTX_REFUSED},
                                                samples({300: 2800}), [300, 301], 3072)
        self.assertIn("A could not go on", why)
        a = [l.replace("oom=1 kind=OutOfMemoryError", "oom=0 kind=none") for l in A_FILLED]
        st, why, _ = physical2.eval_ctx_preload("ctx-second", {"a": a, "b": B_CTX_REFUSED},
                                                samples({300: 2800}), [300, 301], 3072)
        self.assertIn("A was never refused (granted 2176 MiB)", why)
        st, why, _ = physical2.eval_ctx_preload("ctx-second", {"a": A_FILLED, "b": B_CTX_REFUSED},
                                                [], [300, 301], 3072)
        self.assertIn("never listed", why)

    def test_race(self):
        b_filled = [l.replace("pid=300", "pid=301").replace("2281701376", "0") for l in A_FILLED]
        ok = physical2.eval_ctx_preload("ctx-race", {"a": A_FILLED, "b": B_CTX_REFUSED},
                                        samples({300: 2800}), [300, 301], 3072)
        self.assertEqual(ok[:2], ("pass", ""))
        ok = physical2.eval_ctx_preload("ctx-race", {"a": A_FILLED, "b": b_filled},
                                        samples({300: 2800, 301: 260}), [300, 301], 3072)
        self.assertEqual(ok[:2], ("pass", ""))
        # At 7df65b0: 2496 MiB and 0 MiB granted, the driver 3532 MiB.
        st, why, _ = physical2.eval_ctx_preload("ctx-race", {"a": A_FILLED, "b": b_filled},
                                                samples({300: 3014, 301: 518}), [300, 301], 3072)
        self.assertEqual(st, "fail")
        self.assertIn("3532 MiB together", why)
        never = [l.replace("oom=1 kind=OutOfMemoryError", "oom=0 kind=none") for l in A_FILLED]
        st, why, _ = physical2.eval_ctx_preload("ctx-race", {"a": never, "b": B_CTX_REFUSED},
                                                samples({300: 2800}), [300, 301], 3072)
        self.assertIn("A was never refused", why)

    def test_native_and_within(self):
        a = ["FILL granted=2684354560 oom=0 kind=none", "COMPUTE_OK err="]
        b = ["GRAB ok=1 bytes=67108864", "HOLDING bytes=67108864"]
        st, _, figs = physical2.eval_ctx_native({"a": a, "b": b},
                                                samples({300: 3080, 301: 584}), [300, 301], 3072)
        self.assertEqual((st, figs["smi_max_sum_mib"], figs["over_quota"]), ("pass", 3664, True))
        st, why, _ = physical2.eval_ctx_native({"a": a, "b": B_GRAB_OOM}, samples({300: 1}),
                                               [300, 301], 3072)
        self.assertIn("b was refused natively", why)
        sig = {k: physical2.torch_signature(v) for k, v in {"a": a, "b": b}.items()}
        self.assertEqual(physical2.eval_same_results(sig, dict(sig))[0], "pass")
        other = {"a": sig["a"], "b": physical2.torch_signature(B_GRAB_OOM)}
        self.assertEqual(physical2.eval_same_results(sig, other)[0], "fail")

    def test_oom_text(self):
        self.assertTrue(physical2.oom_text("AcceleratorError:CUDA_error:_out_of_memory"))
        self.assertTrue(physical2.oom_text("OutOfMemoryError"))
        self.assertTrue(physical2.oom_text("RuntimeError:cudaErrorMemoryAllocation"))
        self.assertFalse(physical2.oom_text("RuntimeError:CUDA_error:_invalid_argument"))


def audit(findings=(), procs=()):
    return parse.parse_audit_json(json.dumps({"processes": list(procs),
                                              "findings": list(findings)}))


REGION = "/tmp/hami-acc-x/p2-heap-preload.cache"


class Agent(unittest.TestCase):
    def test_no_finding(self):
        a = audit([], [{"pid": 100, "verdict": "ok", "hooked": True}])
        st, why, figs = physical2.eval_no_finding(a, [100], REGION)
        self.assertEqual((st, why, figs["seen"]), ("pass", "", [100]))
        # Another cell's finding does not count.
        a = audit([{"kind": "over_limit", "pid": None, "region": "/tmp/other.cache"},
                   {"kind": "bypass", "pid": 7}])
        self.assertEqual(physical2.eval_no_finding(a, [100], REGION)[0], "pass")

    def test_finding_for_the_cell_fails(self):
        a = audit([{"kind": "over_limit", "reason": "observed_above_limit", "pid": None,
                    "region": REGION, "bytes": 1684 * MIB}])
        st, why, _ = physical2.eval_no_finding(a, [100], REGION)
        self.assertEqual(st, "fail")
        self.assertIn("over_limit", why)
        a = audit([], [{"pid": 100, "verdict": "drift"}])
        self.assertIn("drift", physical2.eval_no_finding(a, [100], REGION)[1])
        self.assertEqual(physical2.eval_no_finding(None, [100], REGION)[0], "error")
        st, why, _ = physical2.eval_no_finding(audit(), [], REGION)
        self.assertEqual(st, "error")
        self.assertIn("no preloaded process ran", why)


class Spec(unittest.TestCase):
    def test_rows_name_stages_their_program_prints(self):
        """Each C row's refusal and going-on stages are lines its program prints (a typo here
        would make a row unpassable)."""
        for row, r in spec.P2_C_ROWS.items():
            stages = spec.P2_STAGES[r["prog"]]
            for st in r["refuse_at"] + [r["goes_on"]]:
                self.assertIn(st, stages, (row, st))
            with open(os.path.join(HERE, "workloads", r["prog"] + ".cu")) as f:
                src = f.read()
            for st in stages:
                self.assertTrue(f'report("{st}"' in src or f'"{st} rc=' in src, (r["prog"], st))
        self.assertEqual(set(spec.P2_C_ROWS) | {"ctx-second", "ctx-race"}, set(spec.P2_ROWS))


class NativePremise(unittest.TestCase):
    def test_native_escaped(self):
        self.assertEqual(physical2.native_escaped(limits()), (True, ""))
        self.assertFalse(physical2.native_escaped(limits(INIT=OOM))[0])
        self.assertFalse(physical2.native_escaped(limits()[:5])[0])  # never held
        a = ["FILL granted=2684354560 oom=0 kind=none"]
        self.assertTrue(physical2.native_escaped({"a": a, "b": B_GRANTED_CTX})[0])
        ok, why = physical2.native_escaped({"a": a, "b": B_GRAB_OOM})
        self.assertFalse(ok)
        self.assertIn("only ['a']", why)


class Table(unittest.TestCase):
    def test_render(self):
        cells = [
            {"workload": "heap", "check": "native", "status": "pass", "reason": "",
             "figures": {"smi_mib": 2708}},
            {"workload": "heap", "check": "preload", "status": "fail",
             "reason": "nothing was refused", "figures": {"smi_mib": 2708,
                                                          "outcome": "nothing refused"}},
            {"workload": "heap", "check": "agent", "status": "pass", "reason": "",
             "figures": {"findings": []}},
            {"workload": "heap", "check": "agent-none", "status": "pass", "reason": "",
             "figures": {}},
        ]
        res = {"physical2": {"cells": cells, "rows": ["heap"], "summary": {"total": 3, "pass": 2,
                                                                           "fail": 1},
                             "launch": {"status": "pass", "reason": "",
                                        "figures": {"native_median_us": 3.9,
                                                    "preload_median_us": 4.0}}}}
        text = report.render_markdown(res)
        self.assertIn("## Limits, local memory, module statics, contexts", text)
        self.assertIn("| heap: cudaDeviceSetLimit(MallocHeapSize, 2 GiB)", text)
        self.assertIn("PASS (2708 MiB) | PASS (bypass) | FAIL (nothing refused; smi 2708 MiB) | "
                      "PASS (no finding) | - |", text)
        self.assertIn("3.9 vs 4.0 us per launch", text)
        self.assertNotIn("| workload |", text)  # the standard table is left out


if __name__ == "__main__":
    unittest.main()
