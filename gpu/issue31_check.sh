#!/bin/sh
# Issue 31 on the GPU machine: graph memory nodes and green contexts, natively and under the
# preload, and the driver's real footprint of context limits (the printf FIFO, the heap) for
# the limit sizing still to do. Every case runs programs/cudaprobe (built here against the
# real libcuda) and reads the driver's per-process figure from nvidia-smi while the probe
# waits, and the region with `hami-agent inspect`.
# Usage on the GPU machine: sh gpu-bundle/gpu/issue31_check.sh > $OUT/issue31.txt 2>&1
set -u
here=$(cd "$(dirname "$0")" && pwd)
bundle=$(dirname "$here")
pre=$bundle/libhami_preload.so
agent=$bundle/hami-agent
w=/tmp/issue31.$$
mkdir -p "$w"
lib=$(ldconfig -p | awk '/libcuda.so.1 /{print $NF; exit}')
gcc -O2 -I"$bundle/programs" "$bundle/programs/cudaprobe.c" -o "$w/cudaprobe" -ldl "$lib" \
  -Wl,-rpath,"$(dirname "$lib")" || exit 1
echo "libcuda: $lib; $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader)"

# run NAME ENV... -- OPS...: the probe's output, then at its (one) `wait` the driver's
# figure for it (nvidia-smi used_memory, MiB) and, under the preload, the region.
run() {
  name=$1; shift
  envs=""
  while [ "$1" != "--" ]; do envs="$envs $1"; shift; done
  shift
  mkfifo "$w/in.$name"
  # shellcheck disable=SC2086
  env $envs "$w/cudaprobe" "$@" wait < "$w/in.$name" > "$w/out.$name" 2>&1 &
  pid=$!
  exec 3> "$w/in.$name"
  i=0
  while ! grep -q 'op=wait' "$w/out.$name" && [ $i -lt 300 ]; do sleep 0.1; i=$((i + 1)); done
  used=$(nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits \
    | awk -F', ' -v p="$pid" '$1 == p {print $2}')
  echo "=== $name: driver holds ${used:-?} MiB for pid $pid"
  cat "$w/out.$name"
  case "$envs" in *LD_PRELOAD*) "$agent" inspect "$w/region.$name" 2>&1 | head -40 ;; esac
  echo >&3; exec 3>&-
  wait $pid
  echo "exit=$?"
}

pl() { echo "LD_PRELOAD=$pre CUDA_DEVICE_MEMORY_SHARED_CACHE=$w/region.$1 CUDA_DEVICE_MEMORY_LIMIT=$2"; }

# 1. Graph memory node of 1.5 GiB, not freed in the graph. Natively: every rc 0, ~2056 MiB on
#    the H100. Under a 1 GiB quota: graph-launch rc=2 (CUDA_ERROR_OUT_OF_MEMORY), gmem-attr
#    reserved=0, the driver within 1024 MiB, and the program goes on (alloc 200M rc=0).
run graph_native -- init ctx streamnew gmem-alloc 1536M gmem-inst graph-launch 1 streamsync gmem-attr
# shellcheck disable=SC2046
run graph_1g $(pl graph_1g 1G) -- init ctx streamnew gmem-alloc 1536M gmem-inst graph-launch 1 \
  streamsync gmem-attr alloc 200M
# Upload path, same expectation (gmem-upload rc=2, gmem-inst-upload rc=2 result=1).
# shellcheck disable=SC2086
run graph_upload_1g $(pl graph_upload_1g 1G) -- init ctx streamnew gmem-alloc 1536M gmem-inst \
  gmem-upload gmem-alloc 1536M gmem-inst-upload gmem-attr
# 2. Graph memory that fits (4 GiB quota): launch rc=0; the region's `pool` for the process
#    equals gmem-attr's reserved (1.5 GiB and the driver's rounding); after gmem-memfree and
#    gmem-trim the last gmem-attr shows reserved=0 and the region's pool is 0 (inspect is
#    taken at the wait, i.e. after the trim).
# shellcheck disable=SC2086
run graph_4g $(pl graph_4g 4G) -- init ctx streamnew gmem-alloc 1536M gmem-inst graph-launch 1 \
  streamsync gmem-attr alloc 2G gmem-memfree gmem-attr gmem-trim gmem-attr
# Captured cudaMallocAsync is charged as data at capture: check that the region's data +
# pool is not twice what the driver holds.
# shellcheck disable=SC2086
run graph_capture_4g $(pl graph_capture_4g 4G) -- init ctx streamnew capture-begin async 1G \
  capture-end gmem-inst graph-launch 1 streamsync gmem-attr meminfo

# 3. Eight green contexts: natively ~8 x 5 MiB more than `ctx` alone; under a 4 GiB quota the
#    region's `context` for the process is the context plus ~8 x 5 MiB (all rc 0). In a 1 GiB
#    container filled to the last few MiB, greenctx is refused (rc=2) and the driver stays
#    within 1024 MiB.
run green_native -- init ctx greenctx greenctx greenctx greenctx greenctx greenctx greenctx greenctx
# shellcheck disable=SC2086
run green_4g $(pl green_4g 4G) -- init ctx greenctx greenctx greenctx greenctx greenctx greenctx \
  greenctx greenctx
# shellcheck disable=SC2086
run green_full $(pl green_full 1G) -- init ctx meminfo fill 1M greenctx meminfo

# 4. Measurements for the limit sizing (not changed yet): what the driver holds after each
#    raise, natively. Compare each case's figure with `ctx_only`.
run ctx_only -- init ctx
run fifo_1g_native -- init ctx setlimit printf 1G getlimit printf
run fifo_1g_launch_native -- init ctx setlimit printf 1G kernel launch-ns 1us streamsync
run heap_1g_native -- init ctx setlimit heap 1G getlimit heap kernel launch-ns 1us streamsync
# The issue's acceptance under the preload today (refused: the request is charged): rc=2.
# shellcheck disable=SC2086
run fifo_1g $(pl fifo_1g 1G) -- init ctx setlimit printf 1G getlimit printf
rm -rf "$w"
