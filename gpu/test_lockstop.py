"""Unit tests of the stopped-lock-holder cell's evaluation (gpu/acceptance/lockstop.py) and of
reading the region lock's owner (gpu/acceptance/region.py). No GPU, no subprocess.

The lines are what gpu/workloads/lock_stop.cu prints. WORKER_BLOCKED is what the preload of
today's main does (an unbounded pthread_mutex_lock: every other process waits for the whole
stop); it must fail.

    python3 -m unittest gpu/test_lockstop.py -v     (also run through gpu/test_runner.py)
"""

import os
import struct
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from acceptance import lockstop, region, report  # noqa: E402

T_STOP = 1000.0
T_CONT = 1003.0


def stats(role="worker", calls=40000, ok=20000, oom=0, refused=0, over_quota=0, errors=0,
          free_errors=0, max_ms=1.9, slow=0, first_error="none"):
    return (f"STATS role={role} calls={calls} ok={ok} oom={oom} refused={refused} "
            f"over_quota={over_quota} errors={errors} free_errors={free_errors} "
            f"max_call_ms={max_ms:.3f} max_call_t={T_STOP + 0.01:.6f} slow={slow} slow_ms=2500 "
            f"first_error={first_error}")


def lines(stats_line, ticks=((999.9, 100), (1000.5, 120), (1002.1, 121), (1003.2, 300)),
          done="DONE rc=0"):
    out = ["PID pid=1", "INIT rc=0 name=CUDA_SUCCESS", "READY step=lockstop", "T0 t=999.0"]
    out += [f"TICK t={t:.6f} calls={n}" for t, n in ticks]
    if stats_line:
        out.append(stats_line)
    if done:
        out.append(done)
    return out


# A worker under a bounded lock: one call waited the bound (2000 ms) and was refused.
WORKER_BOUNDED = lines(stats(oom=1, max_ms=2003.5))
# Under today's unbounded lock: the first call after the stop waited for the whole stop.
WORKER_BLOCKED = lines(stats(max_ms=3001.2, slow=1),
                       ticks=((999.9, 100), (1000.0, 101), (1003.1, 102), (1003.2, 300)))
VICTIM = lines(stats(role="victim", refused=150000, max_ms=3004.0, slow=1))


def record(workers=None, victim=None, holder="caught", used=0, **stop):
    st = {"holder": holder, "attempts": 7, "owner_tid": 1, "t_stop": T_STOP, "t_cont": T_CONT}
    st.update(stop)
    return {
        "bound_ms": 2000, "slack_ms": 500, "stop_s": 3.0,
        "victim": {"pid": 1, "lines": VICTIM if victim is None else victim, "rc": 0,
                   "timed_out": False},
        "workers": [{"pid": 10 + i, "lines": w, "rc": 0, "timed_out": False}
                    for i, w in enumerate([WORKER_BOUNDED] * 3 if workers is None else workers)],
        "stop": st,
        "region": {"used": used, "source": "file"},
    }


class EvalLockStop(unittest.TestCase):
    def test_bounded_lock_passes(self):
        st, why, figs = lockstop.eval_lock_stop(record())
        self.assertEqual((st, why), ("pass", ""))
        self.assertEqual(figs["stopped_s"], 3.0)
        self.assertEqual(figs["holder"], "caught")
        self.assertEqual([w["oom"] for w in figs["workers"]], [1, 1, 1])
        self.assertEqual(figs["workers"][0]["calls_while_stopped"], 21)
        self.assertEqual(figs["victim"]["refused"], 150000)

    def test_unbounded_lock_fails(self):
        """Today's main: the workers wait for the stopped holder for the whole stop."""
        st, why, figs = lockstop.eval_lock_stop(record(workers=[WORKER_BOUNDED, WORKER_BLOCKED]))
        self.assertEqual(st, "fail")
        self.assertIn("worker 11: a call blocked 3001.2 ms > the lock bound 2000 ms (+ 500 ms)",
                      why)
        self.assertNotIn("worker 10", why)
        self.assertEqual(figs["workers"][1]["calls_while_stopped"], 0)  # blocked throughout

    def test_bound_plus_slack_is_the_limit(self):
        at = lines(stats(max_ms=2500.0))
        over = lines(stats(max_ms=2500.5))
        self.assertEqual(lockstop.eval_lock_stop(record(workers=[at]))[0], "pass")
        self.assertEqual(lockstop.eval_lock_stop(record(workers=[over]))[0], "fail")
        rec = record(workers=[at])
        rec["bound_ms"] = 1000  # HAMI_LOCK_TIMEOUT_MS=1000 given to the processes
        self.assertEqual(lockstop.eval_lock_stop(rec)[0], "fail")

    def test_other_errors_fail_oom_does_not(self):
        oom_only = lines(stats(oom=5000, ok=15000))
        self.assertEqual(lockstop.eval_lock_stop(record(workers=[oom_only]))[0], "pass")
        bad = lines(stats(errors=2, first_error="CUDA_ERROR_INVALID_CONTEXT"))
        st, why, _ = lockstop.eval_lock_stop(record(workers=[bad]))
        self.assertEqual(st, "fail")
        self.assertIn("2 calls failed with other than CUDA_ERROR_OUT_OF_MEMORY "
                      "(first: CUDA_ERROR_INVALID_CONTEXT)", why)
        bad_free = lines(stats(free_errors=1, errors=1, first_error="CUDA_ERROR_UNKNOWN"))
        self.assertEqual(lockstop.eval_lock_stop(record(workers=[bad_free]))[0], "fail")
        nothing = lines(stats(ok=0, oom=40000))
        st, why, _ = lockstop.eval_lock_stop(record(workers=[nothing]))
        self.assertIn("no allocation was granted at all", why)

    def test_workers_must_finish(self):
        hung = {"pid": 10, "lines": lines(None, done=None), "rc": None, "timed_out": True}
        rec = record()
        rec["workers"] = [hung]
        st, why, _ = lockstop.eval_lock_stop(rec)
        self.assertEqual(st, "fail")
        self.assertIn("worker 10 did not finish: timed out", why)
        no_stats = lines(None)
        st, why, _ = lockstop.eval_lock_stop(record(workers=[no_stats]))
        self.assertIn("no STATS line", why)
        crashed = record()
        crashed["workers"][0].update(rc=-11, lines=lines(stats(), done=None))
        st, why, _ = lockstop.eval_lock_stop(crashed)
        self.assertIn("no DONE line (exit status -11)", why)
        rec = record()
        rec["workers"] = []
        self.assertIn("no worker ran", lockstop.eval_lock_stop(rec)[1])

    def test_victim_must_finish_and_stay_within_quota(self):
        st, why, _ = lockstop.eval_lock_stop(record(victim=lines(None, done=None)))
        self.assertEqual(st, "fail")
        self.assertIn("the stopped process did not finish after SIGCONT", why)
        greedy = lines(stats(role="victim", over_quota=3))
        st, why, _ = lockstop.eval_lock_stop(record(victim=greedy))
        self.assertIn("granted 3 allocations over the quota", why)

    def test_region_used_must_return_to_zero(self):
        st, why, _ = lockstop.eval_lock_stop(record(used=67108864))
        self.assertEqual(st, "fail")
        self.assertIn("region used 67108864 bytes after every process exited", why)
        rec = record()
        rec["region"] = {"used": None, "error": "file: region version 3 header 968: layout changed"}
        st, why, _ = lockstop.eval_lock_stop(rec)
        self.assertEqual(st, "fail")
        self.assertIn("region used unknown (file: region version 3", why)

    def test_holder_not_caught_is_an_error(self):
        st, why, _ = lockstop.eval_lock_stop(
            record(holder="not caught", why="not holding it in 900 stops over 5.0 s"))
        self.assertEqual(st, "error")
        self.assertIn("not seen holding the region lock (not holding it in 900 stops", why)
        st, _, _ = lockstop.eval_lock_stop(
            record(holder="unknown", why="region file not readable"))
        self.assertEqual(st, "error")
        st, why, _ = lockstop.eval_lock_stop(
            record(error="could not stop the victim: [Errno 3] No such process"))
        self.assertEqual(st, "error")
        self.assertIn("premise not met: could not stop the victim", why)
        # Even with blocked workers: without a stopped holder, nothing was shown.
        self.assertEqual(lockstop.eval_lock_stop(
            record(workers=[WORKER_BLOCKED], holder="not caught"))[0], "error")

    def test_lock_bound_from_the_environment(self):
        self.assertEqual(lockstop.lock_bound_ms(None), 2000)
        self.assertEqual(lockstop.lock_bound_ms(""), 2000)
        self.assertEqual(lockstop.lock_bound_ms(" 750 "), 750)
        for bad in ("2s", "-1", "1.5", "0x10"):
            with self.assertRaises(ValueError) as e:
                lockstop.lock_bound_ms(bad)
            self.assertIn(repr(bad), str(e.exception))

    def test_calls_during(self):
        self.assertEqual(lockstop.calls_during(WORKER_BOUNDED, T_STOP, T_CONT), 21)
        # No tick inside the window: blocked the whole time if it ticked before.
        self.assertEqual(lockstop.calls_during(lines(stats(), ticks=((999.0, 5), (1004.0, 9))),
                                               T_STOP, T_CONT), 0)
        self.assertIsNone(lockstop.calls_during([], T_STOP, T_CONT))

    def test_report_section(self):
        st, why, figs = lockstop.eval_lock_stop(record(workers=[WORKER_BLOCKED]))
        c = {"workload": "lock-stop", "check": lockstop.LOCK_STOP_TITLE, "status": st,
             "reason": why, "figures": figs}
        text = report.render_markdown({"cells": [], "meta": {}, "env": {}, "lock_stop": c,
                                       "bench": {"pair": {}, "train": {}}})
        self.assertIn("## Stopped lock holder", text)
        self.assertIn("- status: FAIL worker 10: a call blocked 3001.2 ms", text)
        self.assertIn("| worker 10 | 40000 | 20000 | 0 | 0 | 3001.2 | 0 |", text)
        self.assertNotIn("| torch-default", text)  # no standard table in a lock-stop-only run


def header(version=2, owner_word=0):
    size = region.REGION_HEADER_SIZES.get(version, 1024)
    b = bytearray(size)
    b[0:8] = region.REGION_MAGIC
    struct.pack_into("<IIQ", b, 8, version, size, 1 << 20)
    struct.pack_into("<I", b, region.OFF_LOCK, owner_word)
    return bytes(b)


class RegionLockOwner(unittest.TestCase):
    def test_owner_tid_without_the_futex_bits(self):
        self.assertEqual(region.region_lock_owner(header(owner_word=0)), 0)
        self.assertEqual(region.region_lock_owner(header(owner_word=4242)), 4242)
        # FUTEX_WAITERS (others sleep on it) and FUTEX_OWNER_DIED are not part of the tid.
        self.assertEqual(region.region_lock_owner(header(owner_word=0x80000000 | 4242)), 4242)
        self.assertEqual(region.region_lock_owner(header(owner_word=0x40000000 | 7)), 7)

    def test_unknown_layouts_are_refused(self):
        with self.assertRaises(ValueError):
            region.region_lock_owner(b"XXXXXXXX" + header()[8:])
        with self.assertRaises(ValueError):
            region.region_lock_owner(header(version=99))
        with self.assertRaises(ValueError):
            region.region_lock_owner(header()[:100])
        for version in (1, 2, 3):
            self.assertEqual(region.region_lock_owner(header(version, 0x80000000 | 99)), 99)

    def test_lock_offset_matches_rust(self):
        """The fields before `lock` in layout.rs RegionHeader add up to OFF_LOCK bytes."""
        import re
        src = os.path.join(os.path.dirname(HERE), "hami-abi", "src", "layout.rs")
        with open(src) as f:
            text = f.read()
        body = text[text.index("pub struct RegionHeader"):]
        body = body[:body.index("pub lock: [u8; LOCK_BYTES]")]
        sizes = {"u8; 8]": 8, "u32": 4, "u64": 8, "AtomicU32": 4, "AtomicU64": 8}
        total = 0
        for ty in re.findall(r"pub \w+: \[?([\w; 8\]]+?),\n", body):
            self.assertIn(ty, sizes, f"unexpected field type {ty} before the lock")
            total += sizes[ty]
        self.assertEqual(total, region.OFF_LOCK)
        self.assertIn("robust `pthread_mutex_t`", text)


if __name__ == "__main__":
    unittest.main()
