#!/bin/sh
# What the driver takes for the printf FIFO and the malloc heap (issue 31), natively and under
# the preload in a 1 GiB container: workloads/printf_fifo.cu per size (MiB), its STEP lines
# (the process's figure from nvidia-smi and the device's from cudaMemGetInfo after each step).
# Then the launch gate's cost (issue 30): compute_spin launch natively and preloaded at
# CUDA_DEVICE_SM_LIMIT=90 (empty kernels back to back: the gate meters every launch but never
# waits), alternated ROUNDS times; with OLD_PRELOAD set, that preload too in every round.
# Usage on the GPU machine: sh gpu-bundle/gpu/limit_footprint.sh [ROUNDS] > $OUT/f.txt 2>&1
set -u
rounds=${1:-3}
here=$(cd "$(dirname "$0")" && pwd)
bundle=$(dirname "$here")
pre=$bundle/libhami_preload.so
w=/tmp/footprint.$$
mkdir -p "$w"
nvcc -O2 -o "$w/pf" "$here/workloads/printf_fifo.cu" || exit 1
nvcc -O2 -cudart static -o "$w/spin" "$here/workloads/compute_spin.cu" || exit 1
echo "$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader); load: $(cat /proc/loadavg)"
for kind in fifo heap; do
  for n in 0 1 64 1024 4096 16384; do
    echo "=== native $kind $n MiB"
    "$w/pf" $kind $n 2>&1 | grep -v '^PRINTF'
  done
done
for kind in fifo heap; do
  for n in 1024 4096; do
    echo "=== preload 1 GiB $kind $n MiB"
    LD_PRELOAD=$pre CUDA_DEVICE_MEMORY_LIMIT=1g CUDA_DEVICE_MEMORY_SHARED_CACHE=$w/r.$kind.$n \
      "$w/pf" $kind $n 2>&1 | grep -v '^PRINTF'
  done
done
# A FIFO that does not fit: 503 MiB more in the 1 GiB container (518 + 503 = 1021 MiB held),
# then 2 GiB of FIFO (4 MiB): refused; 1 GiB (2 MiB) granted.
for n in 2048 1024; do
  echo "=== preload 1 GiB, 1021 MiB held, fifo $n MiB"
  WL_PREALLOC_MIB=503 LD_PRELOAD=$pre CUDA_DEVICE_MEMORY_LIMIT=1g \
    CUDA_DEVICE_MEMORY_SHARED_CACHE=$w/full.$n "$w/pf" fifo $n 2>&1 | grep -v '^PRINTF'
done
# compute_spin waits for `go` on stdin after READY.
launch() { printf 'go\n' | env "$@" WL_ROUNDS=5 "$w/spin" launch 2>&1 | grep -E '^RESULT'; }
i=0
while [ $i -lt "$rounds" ]; do
  echo "=== launch round $i"
  echo "native $(launch X=1)"
  echo "preload-share90 $(launch LD_PRELOAD=$pre CUDA_DEVICE_SM_LIMIT=90 CUDA_DEVICE_MEMORY_SHARED_CACHE=$w/l.$i)"
  if [ -n "${OLD_PRELOAD:-}" ]; then
    echo "old-share90 $(launch LD_PRELOAD=$OLD_PRELOAD CUDA_DEVICE_SM_LIMIT=90 CUDA_DEVICE_MEMORY_SHARED_CACHE=$w/o.$i)"
  fi
  echo "preload-nolimit $(launch LD_PRELOAD=$pre CUDA_DEVICE_MEMORY_SHARED_CACHE=$w/n.$i)"
  i=$((i + 1))
done
nvcc -O2 -o "$w/gc" "$here/workloads/gate_calls.cu" -lcuda && {
  echo "=== gate calls native"; "$w/gc"
  echo "=== gate calls preloaded, no share"; LD_PRELOAD=$pre CUDA_DEVICE_MEMORY_SHARED_CACHE=$w/gc.r "$w/gc"
}
