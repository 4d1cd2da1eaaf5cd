#!/bin/sh
# The agent's cost per probed driver call (issue 21), on the GPU machine: ROUNDS alternated
# rounds of workloads/probe_cost natively and with `hami-agent run` attached (started and
# stopped every round, so both halves of a round see the same machine), then the legacy
# entry points and the release-while-mapped case (workloads/legacy_entries.c) natively and
# under the preload with a 2 GiB quota.
# Usage on the GPU machine: sh gpu-bundle/gpu/agent_cost.sh [ROUNDS]
set -u
rounds=${1:-6}
here=$(cd "$(dirname "$0")" && pwd)
bundle=$(dirname "$here")
agent=$bundle/hami-agent
pre=$bundle/libhami_preload.so
w=/tmp/agentcost.$$
mkdir -p "$w"
inc=-I/usr/local/cuda/include
gcc -O2 $inc "$here/workloads/probe_cost.c" -o "$w/probe_cost" -lcuda || exit 1
gcc -O2 $inc "$here/workloads/legacy_entries.c" -o "$w/legacy" -lcuda -ldl || exit 1
lib=$(ldconfig -p | awk '/libcuda.so.1 /{print $NF; exit}')
echo "libcuda: $lib; load: $(cat /proc/loadavg)"
# A fresh process maps libcuda and reports the privately copied (breakpointed) kB of its
# text: the kernel keeps a stopped agent's uprobes a few seconds after their last link is
# closed, and a process mapping the file meanwhile still traps (seen on the H200, 6.x).
cat > "$w/anon.py" <<'PY'
import ctypes, os, sys
ctypes.CDLL(sys.argv[1])
real = os.path.realpath(sys.argv[1])
kb = 0; inside = False
for l in open('/proc/self/smaps'):
    f = l.split()
    if '-' in f[0] and len(f) > 1 and len(f[1]) == 4:
        inside = f[1] == 'r-xp' and l.rstrip().endswith(real)
    elif inside and l.startswith('Anonymous:'):
        kb += int(f[1])
print('ANON path=%s text_anon_kb=%d' % (sys.argv[1], kb))
PY
# Polls until a fresh mapping of $1 has no breakpointed page (at most 60 s); prints how long.
wait_clean() {
  t0=$(date +%s.%N); i=0
  while [ $i -lt 600 ]; do
    python3 "$w/anon.py" "$1" | grep -q 'text_anon_kb=0$' && break
    sleep 0.1; i=$((i + 1))
  done
  echo "CLEAN path=$1 after_s=$(awk "BEGIN{print $(date +%s.%N) - $t0}") polls=$i"
}
wait_ready() {
  i=0
  while [ $i -lt 300 ]; do
    grep -q 'hami-agent: ready' "$1" && return 0
    sleep 0.1; i=$((i + 1))
  done
  return 1
}
echo "## round 0 native (before any agent)"; "$w/probe_cost" 20000 7
echo "## round 0 native (before any agent)"; "$w/probe_cost" 20000 7
r=1
while [ $r -le "$rounds" ]; do
  echo "## round $r native"; "$w/probe_cost" 20000 7
  echo "## round $r native"; "$w/probe_cost" 20000 7
  "$agent" run --metrics-addr 127.0.0.1:9477 --libcuda "$lib" > "$w/agent$r.log" 2>&1 &
  ap=$!
  if wait_ready "$w/agent$r.log"; then
    echo "## round $r agent ($(grep -c . "$w/agent$r.log") log lines)"; "$w/probe_cost" 20000 7
    echo "## round $r agent"; "$w/probe_cost" 20000 7
  else
    echo "## round $r agent NOT READY"; tail -5 "$w/agent$r.log"
  fi
  kill -INT $ap; wait $ap
  # The next native round only once the kernel has taken the breakpoints out.
  wait_clean "$lib"
  r=$((r + 1))
done
grep -i 'attach' "$w/agent1.log" | head -5
echo "## after the last agent stopped: agents left: $(pgrep -c hami-agent)"
echo "## perf/bpf-link descriptors held by any process: $(ls -l /proc/[0-9]*/fd 2>/dev/null | grep -c 'anon_inode:\[perf_event\]\|anon_inode:bpf-link')"
python3 "$w/anon.py" "$lib"
cp "$lib" "$w/libcuda.so.1" && python3 "$w/anon.py" "$w/libcuda.so.1"
sleep 10; python3 "$w/anon.py" "$lib"
echo "## an agent running, then stopped with SIGTERM"
"$agent" run --metrics-addr 127.0.0.1:9477 --libcuda "$w/libcuda.so.1" > "$w/agentc.log" 2>&1 &
ap=$!
wait_ready "$w/agentc.log" && python3 "$w/anon.py" "$w/libcuda.so.1"
kill -TERM $ap; wait $ap; echo "agent rc=$?"
python3 "$w/anon.py" "$w/libcuda.so.1"
wait_clean "$w/libcuda.so.1"
echo "## legacy entries, native"; "$w/legacy" 512 4
echo "## legacy entries, preload, 2 GiB quota"
LD_PRELOAD=$pre CUDA_DEVICE_MEMORY_LIMIT=2g CUDA_DEVICE_MEMORY_SHARED_CACHE=$w/l.cache "$w/legacy" 512 4
echo "## legacy entries, preload 2 GiB, 8 x 512 MiB"
LD_PRELOAD=$pre CUDA_DEVICE_MEMORY_LIMIT=2g CUDA_DEVICE_MEMORY_SHARED_CACHE=$w/m.cache "$w/legacy" 512 8
echo "## load at end: $(cat /proc/loadavg)"
rm -rf "$w"
