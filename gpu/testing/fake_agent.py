#!/usr/bin/env python3
"""A stand-in for hami-agent, for testing run_acceptance.py without a GPU or eBPF.

It cannot see allocations; it infers them from /proc/<pid>/environ of processes whose
environment carries WL_HOLD_MB (the runner's workloads): observed = WL_HOLD_MB, hooked = the
preload is in LD_PRELOAD. Enough to drive every branch of the runner's agent handling.
  run --metrics-addr H:P     serves /metrics (bypass findings labelled with pid)
  audit --seconds N --json   prints the assumed audit JSON after N seconds
  inspect REGION --json      prints limit/used read from the region file
"""
import http.server
import json
import os
import sys
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
        if b"WL_HOLD_MB" not in env or b"hold" not in cmd.split(b"\0"):
            continue
        hooked = b"hami" in env.get(b"LD_PRELOAD", b"")
        out.append({"pid": int(d), "hooked": hooked,
                    "observed_bytes": int(env[b"WL_HOLD_MB"]) * MIB,
                    "accounted_bytes": int(env[b"WL_HOLD_MB"]) * MIB if hooked else 0,
                    "verdict": "ok" if hooked else "bypass"})
    return out


def main():
    a = sys.argv[1:]
    if a[:1] == ["run"]:
        host, port = a[a.index("--metrics-addr") + 1].rsplit(":", 1)

        class H(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                lines = ["# TYPE hami_findings_total counter"]
                for p in workloads():
                    if not p["hooked"]:
                        lines.append(f'hami_findings_total{{kind="bypass",pid="{p["pid"]}"}} 1')
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
        seen = {}
        end = time.time() + secs
        while time.time() < end:
            for p in workloads():
                seen[p["pid"]] = p
            time.sleep(0.1)
        procs = list(seen.values())
        findings = [{"kind": "bypass", "pid": p["pid"], "bytes": p["observed_bytes"]}
                    for p in procs if not p["hooked"]]
        print(json.dumps({"processes": procs, "findings": findings}))
        return 1 if findings else 0
    elif a[:1] == ["inspect"]:
        import struct
        data = open(a[1], "rb").read()
        limit = struct.unpack_from("<Q", data, 136)[0]
        used = struct.unpack_from("<Q", data, 584)[0]
        print(json.dumps({"devices": [{"index": 0, "limit": limit, "used": used}], "slots": []}))
    else:
        print("usage: fake_agent run|audit|inspect", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
