#!/usr/bin/env python3
"""Multi-GPU check of the preload on a machine with 2+ GPUs (one command, prints RESULT lines).

Per-device limits (CUDA_DEVICE_MEMORY_LIMIT_<i>), CUDA_VISIBLE_DEVICES in index and UUID form,
and nvidia-smi's view under the preload. Usage: python3 gpu-bundle/gpu/multi_gpu_check.py
"""
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
PRELOAD = os.path.join(HERE, "..", "libhami_preload.so")
MiB = 1 << 20

PROBE = r'''
import json, sys, torch
out = {"count": torch.cuda.device_count(), "info": {}, "alloc": {}}
sizes = [int(s) for s in sys.argv[1:]]
for d in range(out["count"]):
    f, t = torch.cuda.mem_get_info(d)
    out["info"][d] = {"free_mib": f >> 20, "total_mib": t >> 20}
for d, mib in enumerate(sizes[: out["count"]]):
    try:
        x = torch.empty(mib << 20, dtype=torch.uint8, device=f"cuda:{d}")
        out["alloc"][d] = "ok"
        del x
    except torch.OutOfMemoryError:
        out["alloc"][d] = "oom"
    torch.cuda.empty_cache()
print("RESULT " + json.dumps(out), flush=True)
'''


def run(title, env_extra, args, region):
    env = dict(os.environ)
    env.update({"LD_PRELOAD": PRELOAD, "CUDA_DEVICE_MEMORY_SHARED_CACHE": region,
                "LIBCUDA_LOG_LEVEL": "2", "PYTHONUNBUFFERED": "1"})
    env.update(env_extra)
    try:
        p = subprocess.run([sys.executable, "-c", PROBE] + [str(a) for a in args], env=env,
                           capture_output=True, text=True, timeout=90)
        res = next((json.loads(l[7:]) for l in p.stdout.splitlines() if l.startswith("RESULT ")), None)
        err = p.stderr.strip().splitlines()[-3:]
    except subprocess.TimeoutExpired:
        res, err = None, ["timeout"]
    print(f"CASE {title}: env={env_extra} args={args} -> {json.dumps(res)} stderr_tail={err}",
          flush=True)
    return res


def smi(title, env_extra, region):
    env = dict(os.environ)
    env.update({"LD_PRELOAD": PRELOAD, "CUDA_DEVICE_MEMORY_SHARED_CACHE": region})
    env.update(env_extra)
    p = subprocess.run(["nvidia-smi", "--query-gpu=index,uuid,memory.total,memory.used",
                        "--format=csv,noheader"], env=env, capture_output=True, text=True,
                       timeout=60)
    print(f"SMI {title}: env={env_extra} -> {p.stdout.strip()!r} {p.stderr.strip()[-300:]!r}",
          flush=True)


def main():
    tmp = tempfile.mkdtemp(prefix="hami-multi-")
    q = subprocess.run(["nvidia-smi", "--query-gpu=index,uuid", "--format=csv,noheader"],
                       capture_output=True, text=True, timeout=60).stdout.strip().splitlines()
    uuids = [l.split(",")[1].strip() for l in q]
    print(f"GPUS {uuids}", flush=True)
    if len(uuids) < 2:
        print("RESULT need 2 GPUs", flush=True)
        return
    smi("fresh region, limits 2G/3G", {"CUDA_DEVICE_MEMORY_LIMIT_0": "2G",
                                       "CUDA_DEVICE_MEMORY_LIMIT_1": "3G"}, f"{tmp}/a.cache")
    r = run("per-device limits", {"CUDA_DEVICE_MEMORY_LIMIT_0": "2G",
                                   "CUDA_DEVICE_MEMORY_LIMIT_1": "3G"}, [2500, 2400],
            f"{tmp}/a.cache")
    smi("same region after a CUDA process", {}, f"{tmp}/a.cache")
    run("visible=1 index form", {"CUDA_VISIBLE_DEVICES": "1",
                                  "CUDA_DEVICE_MEMORY_LIMIT_0": "1G"}, [1200], f"{tmp}/b.cache")
    run("visible=uuid of 1", {"CUDA_VISIBLE_DEVICES": uuids[1],
                               "CUDA_DEVICE_MEMORY_LIMIT": "1500M"}, [800], f"{tmp}/c.cache")
    run("visible=1,0 reversed", {"CUDA_VISIBLE_DEVICES": "1,0",
                                  "CUDA_DEVICE_MEMORY_LIMIT_0": "1G",
                                  "CUDA_DEVICE_MEMORY_LIMIT_1": "2G"}, [1200, 1200],
            f"{tmp}/d.cache")
    subprocess.run([os.path.join(HERE, "..", "hami-agent"), "inspect", f"{tmp}/d.cache"],
                   timeout=30)


if __name__ == "__main__":
    main()
