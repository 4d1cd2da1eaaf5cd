#!/usr/bin/env python3
"""Issue 29 on a machine with 2+ GPUs: one container (one region), several processes, each
narrowing the GPUs with CUDA_VISIBLE_DEVICES; then DDP/NCCL at a tight quota and a share.

Usage: python3 gpu-bundle/gpu/multi_gpu_container.py [--out DIR]
Needs PyTorch with CUDA (and NCCL for the DDP part). Prints CASE lines and one CHECK line per
expectation (PASS/FAIL), then SUMMARY; exit 1 if any check failed. With --out, the lines also
go to DIR/multi-gpu-container.txt.

The rule checked (docs/shared-region.md, "Which device"): CUDA_DEVICE_MEMORY_LIMIT_<i> is the
container's device i (CUDA ordinal i without CUDA_VISIBLE_DEVICES) for every process, however
it narrows or reorders its devices, by index or UUID; usage is charged to that device.
"""
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PRELOAD = os.path.join(HERE, "..", "libhami_preload.so")
AGENT = os.path.join(HERE, "..", "hami-agent")
LINES = []
FAILED = []

# Holds MiB on each of its devices (argv: one size per ordinal), reports every device's
# (free, total) and, on stdin "alloc D MIB", tries one more allocation; "quit" ends.
HOLDER = r'''
import json, sys, torch
n = torch.cuda.device_count()
held = []
for d, mib in enumerate(int(s) for s in sys.argv[1:]):
    if d < n and mib > 0:
        held.append(torch.empty(mib << 20, dtype=torch.uint8, device=f"cuda:{d}"))
def info():
    return {d: [x >> 20 for x in torch.cuda.mem_get_info(d)] for d in range(n)}
print("READY " + json.dumps({"count": n, "info": info()}), flush=True)
for line in sys.stdin:
    w = line.split()
    if not w or w[0] == "quit":
        break
    if w[0] == "alloc":
        d, mib = int(w[1]), int(w[2])
        try:
            x = torch.empty(mib << 20, dtype=torch.uint8, device=f"cuda:{d}")
            r = "ok"
            del x
        except torch.OutOfMemoryError:
            r = "oom"
        torch.cuda.empty_cache()
        print("ALLOC " + json.dumps({"dev": d, "mib": mib, "result": r, "info": info()}), flush=True)
'''

# One DDP rank per GPU (its CUDA_VISIBLE_DEVICES holds its GPU only), NCCL all-reduce with
# some compute between, for SECONDS; reports steps, wall time and its device's (free, total).
DDP = r'''
import json, os, sys, time, torch, torch.distributed as dist
secs = float(sys.argv[1])
dist.init_process_group("nccl")
rank = dist.get_rank()
torch.cuda.set_device(0)
x = torch.randn(4096, 4096, device="cuda")
buf = torch.ones(64 << 20, dtype=torch.uint8, device="cuda")
steps, t0 = 0, time.time()
while time.time() - t0 < secs:
    y = x @ x
    t = torch.full((1 << 20,), float(rank + 1), device="cuda")
    dist.all_reduce(t)
    torch.cuda.synchronize()
    steps += 1
wall = time.time() - t0
f, tot = torch.cuda.mem_get_info(0)
ok = float(t[0].item()) == float(sum(range(1, dist.get_world_size() + 1)))
print("DDP " + json.dumps({"rank": rank, "steps": steps, "wall": wall, "sum_ok": ok,
                           "free_mib": f >> 20, "total_mib": tot >> 20}), flush=True)
dist.destroy_process_group()
'''


def say(line):
    print(line, flush=True)
    LINES.append(line)


def check(name, cond, detail):
    say(f"CHECK {'PASS' if cond else 'FAIL'} {name}: {detail}")
    if not cond:
        FAILED.append(name)


def env_for(region, extra):
    env = dict(os.environ)
    env.pop("CUDA_VISIBLE_DEVICES", None)
    env.update({"LD_PRELOAD": PRELOAD, "CUDA_DEVICE_MEMORY_SHARED_CACHE": region,
                "LIBCUDA_LOG_LEVEL": "2", "PYTHONUNBUFFERED": "1"})
    env.update(extra)
    return env


class Holder:
    def __init__(self, title, region, extra, sizes):
        self.title = title
        self.p = subprocess.Popen([sys.executable, "-c", HOLDER] + [str(s) for s in sizes],
                                  env=env_for(region, extra), stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.ready = self._read("READY ")
        say(f"CASE {title}: env={extra} holds={sizes} -> {json.dumps(self.ready)}")

    def _read(self, prefix):
        for line in self.p.stdout:
            if line.startswith(prefix):
                return json.loads(line[len(prefix):])
        return None

    def alloc(self, dev, mib):
        self.p.stdin.write(f"alloc {dev} {mib}\n")
        self.p.stdin.flush()
        r = self._read("ALLOC ")
        say(f"CASE {self.title}: alloc {mib} MiB on its device {dev} -> {json.dumps(r)}")
        return r

    def total(self, dev):
        return (self.ready or {}).get("info", {}).get(str(dev), [None, None])[1]

    def close(self):
        try:
            self.p.stdin.write("quit\n")
            self.p.stdin.flush()
            self.p.wait(timeout=60)
        except Exception:
            self.p.kill()
        err = self.p.stderr.read().strip().splitlines()[-3:]
        if err:
            say(f"STDERR {self.title}: {err}")


def main():
    out_dir = sys.argv[sys.argv.index("--out") + 1] if "--out" in sys.argv else None
    tmp = tempfile.mkdtemp(prefix="hami-issue29-")
    q = subprocess.run(["nvidia-smi", "--query-gpu=index,uuid", "--format=csv,noheader"],
                       capture_output=True, text=True, timeout=60).stdout.strip().splitlines()
    uuids = [l.split(",")[1].strip() for l in q]
    say(f"GPUS {uuids}")
    if len(uuids) < 2:
        say("SUMMARY skipped: needs 2 GPUs")
        return 0
    region = f"{tmp}/container.cache"
    limits = {"CUDA_DEVICE_MEMORY_LIMIT_0": "3G", "CUDA_DEVICE_MEMORY_LIMIT_1": "6G"}

    # 1. A process that sees every GPU holds 1 GiB on device 0 and records both UUIDs.
    b = Holder("all GPUs", region, limits, [1024, 0])
    check("all: device 0 total is its 3 GiB", b.total(0) == 3072, f"{b.total(0)} MiB")
    check("all: device 1 total is its 6 GiB", b.total(1) == 6144, f"{b.total(1)} MiB")
    # 2. Narrowed to GPU 1 by index: its only device is the container's device 1 (6 GiB).
    a = Holder("CUDA_VISIBLE_DEVICES=1", region, dict(limits, CUDA_VISIBLE_DEVICES="1"),
               [4096])
    check("index form: total is device 1's 6 GiB (was device 0's 3 GiB)", a.total(0) == 6144,
          f"{a.total(0)} MiB")
    r = b.alloc(0, 1024)
    check("the narrowed process's 4 GiB are not on device 0: 1 GiB more fits there",
          r and r["result"] == "ok", json.dumps(r))
    r = b.alloc(1, 2048)
    check("they are on device 1: 2 GiB more do not fit there (4 GiB + contexts + 2 > 6)",
          r and r["result"] == "oom", json.dumps(r))
    # 3. The UUID form and a reordered list, in the same region.
    u = Holder("CUDA_VISIBLE_DEVICES=<uuid of GPU 1>", region,
               dict(limits, CUDA_VISIBLE_DEVICES=uuids[1]), [0])
    check("UUID form: total is device 1's 6 GiB", u.total(0) == 6144, f"{u.total(0)} MiB")
    u.close()
    rev = Holder("CUDA_VISIBLE_DEVICES=1,0", region, dict(limits, CUDA_VISIBLE_DEVICES="1,0"),
                 [0, 0])
    check("reordered: ordinal 0 is device 1 (6 GiB), ordinal 1 device 0 (3 GiB)",
          (rev.total(0), rev.total(1)) == (6144, 3072), f"{rev.total(0)}, {rev.total(1)} MiB")
    rev.close()
    # 4. nvidia-smi under the preload, narrowed: NVML lists both GPUs, each with its quota.
    p = subprocess.run(["nvidia-smi", "--query-gpu=index,memory.total,memory.used",
                        "--format=csv,noheader,nounits"],
                       env=env_for(region, dict(limits, CUDA_VISIBLE_DEVICES="1")),
                       capture_output=True, text=True, timeout=60)
    say(f"SMI CUDA_VISIBLE_DEVICES=1: {p.stdout.strip()!r}")
    totals = [int(l.split(",")[1]) for l in p.stdout.strip().splitlines()[:2]]
    check("nvidia-smi: each GPU shows its own quota", totals == [3072, 6144], f"{totals}")
    if os.path.exists(AGENT):
        i = subprocess.run([AGENT, "inspect", region], capture_output=True, text=True,
                           timeout=30)
        say("INSPECT " + " | ".join(i.stdout.strip().splitlines()[:12]))
    a.close()
    b.close()

    # 5. DDP/NCCL, one rank per GPU (index form), tight quota and a 50 % share.
    ddp_region = f"{tmp}/ddp.cache"
    procs = []
    for rank in range(2):
        extra = {"CUDA_VISIBLE_DEVICES": str(rank), "CUDA_DEVICE_MEMORY_LIMIT_0": "2G",
                 "CUDA_DEVICE_MEMORY_LIMIT_1": "3G", "CUDA_DEVICE_SM_LIMIT": "50",
                 "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29529", "RANK": str(rank),
                 "WORLD_SIZE": "2", "LOCAL_RANK": "0"}
        procs.append(subprocess.Popen([sys.executable, "-c", DDP, "20"],
                                      env=env_for(ddp_region, extra), stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    t0 = time.time()
    results = []
    for rank, p in enumerate(procs):
        try:
            o, e = p.communicate(timeout=180)
        except subprocess.TimeoutExpired:
            p.kill()
            o, e = p.communicate()
            say(f"STDERR ddp rank {rank}: timeout")
        r = next((json.loads(l[4:]) for l in o.splitlines() if l.startswith("DDP ")), None)
        say(f"CASE ddp rank {rank}: {json.dumps(r)} stderr_tail={e.strip().splitlines()[-3:]}")
        results.append(r)
    took = time.time() - t0
    check("ddp: both ranks finished, all-reduce sums right, no stall (< 120 s for 20 s of work)",
          all(r and r["sum_ok"] for r in results) and took < 120, f"{took:.1f} s")
    if all(results):
        check("ddp: rank 0 sees its GPU's 2 GiB, rank 1 its GPU's 3 GiB",
              [r["total_mib"] for r in results] == [2048, 3072],
              f"{[r['total_mib'] for r in results]}")
        check("ddp: both ranks made progress under the share",
              all(r["steps"] > 10 for r in results), f"{[r['steps'] for r in results]}")
    if os.path.exists(AGENT):
        i = subprocess.run([AGENT, "inspect", ddp_region], capture_output=True, text=True,
                           timeout=30)
        say("INSPECT ddp " + " | ".join(i.stdout.strip().splitlines()[:12]))
    say(f"SUMMARY {'FAIL ' + ', '.join(FAILED) if FAILED else 'PASS'}")
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
        with open(os.path.join(out_dir, "multi-gpu-container.txt"), "w") as f:
            f.write("\n".join(LINES) + "\n")
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main())
