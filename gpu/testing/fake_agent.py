#!/usr/bin/env python3
"""A stand-in for hami-agent, for testing run_acceptance.py without a GPU or eBPF.

It cannot see allocations; it infers them from /proc/<pid>/environ of processes whose
environment carries WL_HOLD_MB (the runner's workloads) once their virtual size has grown past
it (the stub runtime's "device" memory is malloc): observed = WL_HOLD_MB, hooked = the preload
is in LD_PRELOAD. Enough to drive every branch of the runner's agent handling.
The physical group's programs (mipmap_alloc, module_global, torch_alloc.py drop/grab) are
"observed" at their virtual size; the audit reports bypass for the unhooked ones and
over_limit for a region whose processes run a "blind" preload and together exceed its limit.

  run --metrics-addr H:P     serves /metrics (bypass findings labelled with pid)
  audit --seconds N --json   prints the assumed audit JSON after N seconds
  inspect REGION --json      prints limit/used read from the region file
"""
import http.server
import json
import os
import signal
import sys
import threading
import time

MIB = 1 << 20


def workloads():
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/environ", "rb") as f:
                env = dict(
                    kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv
                )
            with open(f"/proc/{d}/cmdline", "rb") as f:
                cmd = f.read()
        except OSError:
            continue
        args = cmd.split(b"\0")
        phys = any(x in cmd for x in (b"mipmap_alloc", b"module_global", b"limits_probe")) or (
            b"torch_alloc.py" in cmd and (b"drop" in args or b"grab" in args
                                          or b"fill" in args))
        if b"WL_HOLD_MB" not in env or (b"hold" not in args and not phys):
            continue
        # "Seeing the allocation": the stub runtime mallocs device memory, so the process's
        # virtual size passes WL_HOLD_MB only once it has allocated.
        try:
            with open(f"/proc/{d}/status") as f:
                vm = next(int(l.split()[1]) * 1024 for l in f if l.startswith("VmSize:"))
        except (OSError, StopIteration, ValueError):
            continue
        hooked = b"hami" in env.get(b"LD_PRELOAD", b"")
        if phys:
            # Python with fake torch starts at ~16 MiB of virtual size; the C programs higher.
            if vm < (48 if b"torch_alloc.py" in cmd else 200) * MIB:
                continue
            out.append({"pid": int(d), "comm": "wl", "container": "host", "hooked": hooked,
                        "observed": vm, "accounted": None, "verdict": "ok",
                        "_region": env.get(b"CUDA_DEVICE_MEMORY_SHARED_CACHE", b"").decode(),
                        "_limit": env.get(b"CUDA_DEVICE_MEMORY_LIMIT", b"0M").decode(),
                        "_blind": b"blind" in env.get(b"LD_PRELOAD", b"")})
            continue
        if vm < int(env[b"WL_HOLD_MB"]) * MIB:
            continue
        # Field names as hami-user/src/agent.rs ProcessRow serialises them.
        out.append({"pid": int(d), "comm": "wl", "container": "host", "hooked": hooked,
                    "observed": int(env[b"WL_HOLD_MB"]) * MIB,
                    "accounted": int(env[b"WL_HOLD_MB"]) * MIB if hooked else None,
                    "verdict": "ok" if hooked else "bypass"})
    return out


def compute_shares():
    """The container compute share of every compute_spin process under a (fake) hami preload
    with CUDA_DEVICE_SM_LIMIT: the limit itself (the stub runtime holds it there exactly)."""
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/environ", "rb") as f:
                env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
            with open(f"/proc/{d}/cmdline", "rb") as f:
                cmd = f.read()
        except OSError:
            continue
        if b"compute_spin" not in cmd or b"hami" not in env.get(b"LD_PRELOAD", b""):
            continue
        limit = env.get(b"CUDA_DEVICE_SM_LIMIT", b"").decode()
        region = env.get(b"CUDA_DEVICE_MEMORY_SHARED_CACHE", b"").decode()
        if limit.isdigit():
            out.append(f'hami_container_compute_share_percent{{device="0",region="{region}"}} '
                       f'{limit}')
    return out


def main():
    a = sys.argv[1:]
    if a[:1] == ["run"]:
        host, port = a[a.index("--metrics-addr") + 1].rsplit(":", 1)
        raised = set()

        class H(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                # Names as hami-user/src/metrics.rs registers them.
                procs = workloads()
                for p in procs:
                    if not p["hooked"]:
                        raised.add(p["pid"])
                standing = sum(1 for p in procs if not p["hooked"])
                lines = ["# TYPE hami_findings_total counter",
                         f'hami_findings_total{{kind="bypass"}} {len(raised)}',
                         f'hami_findings{{kind="bypass"}} {standing}']
                lines += compute_shares()
                for p in procs:
                    lines.append(f'hami_process_observed_bytes{{container="host",hooked='
                                 f'"{str(p["hooked"]).lower()}",pid="{p["pid"]}"}} {p["observed"]}')
                body = ("\n".join(lines) + "\n").encode()
                self.send_response(200)
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        print("fake agent listening", flush=True)
        http.server.ThreadingHTTPServer((host, int(port)), H).serve_forever()
    elif a[:1] == ["audit"]:
        secs = float(a[a.index("--seconds") + 1])
        # SIGINT ends the audit early, as hami-agent's handler does, even where it was
        # inherited ignored (a shell without job control starts background jobs that way).
        signal.signal(signal.SIGINT, signal.default_int_handler)
        print("fake audit: probes attached", file=sys.stderr, flush=True)
        seen = {}
        lock = threading.Lock()
        end = time.time() + secs

        def watch():
            # A scan of /proc can be slow or block on one process (reading its environ
            # waits for its memory map): it runs beside the deadline, never in its way.
            while True:
                found = workloads()
                with lock:
                    for p in found:
                        seen[p["pid"]] = p
                time.sleep(0.1)

        threading.Thread(target=watch, daemon=True).start()
        try:  # SIGINT ends the watch early, like hami-agent's Ctrl-C
            while time.time() < end:
                time.sleep(0.05)
        except KeyboardInterrupt:
            pass
        with lock:
            procs = [dict(p) for p in seen.values()]
        findings = [{"kind": "bypass", "reason": "no_preload", "pid": p["pid"],
                     "bytes": p["observed"], "standing": True}
                    for p in procs if not p["hooked"]]
        regions = {}
        for p in procs:
            if p.get("_blind") and p.get("_region"):
                regions.setdefault((p["_region"], p["_limit"]), []).append(p)
        for (region, limit), ps in regions.items():
            lim = int(limit.rstrip("Mm") or 0) * MIB
            total = sum(p["observed"] for p in ps)
            if total > lim:
                findings.append({"kind": "over_limit", "reason": "observed_above_limit",
                                 "pid": None, "region": region, "bytes": total - lim,
                                 "standing": True})
                for p in ps:
                    p["verdict"] = "over_limit"
        for p in procs:
            for k in ("_region", "_limit", "_blind"):
                p.pop(k, None)
        print(json.dumps({"version": 1, "seconds": secs, "processes": procs, "regions": [],
                          "findings": findings, "reclaimed": [], "failed": bool(findings)}),
              flush=True)
        sys.stderr.flush()
        # Not a return: the watching thread may be inside a blocked /proc read.
        os._exit(2 if findings else 0)  # hami-user/src/report.rs EXIT_FINDINGS
    elif a[:1] == ["inspect"]:
        import struct
        data = open(a[1], "rb").read()
        limit = struct.unpack_from("<Q", data, 136)[0]
        used = struct.unpack_from("<Q", data, 584)[0]
        print(json.dumps({"version": 1, "devices": [{"index": 0, "limit": limit, "used": used,
                                                     "accounted": used}], "slots": []}))
    else:
        print("usage: fake_agent run|audit|inspect", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
