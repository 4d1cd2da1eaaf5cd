#!/bin/sh
# One CUDA library (1536 MiB `__device__` array) used in two contexts of one GPU, natively and
# under each given preload (quota 4 GiB): both copies must be charged, so that the next 256 MiB
# allocation fits natively but the quota sees 2 x 1536 MiB + two contexts.
# Usage on the GPU machine: sh gpu-bundle/gpu/library_two_contexts.sh [OTHER_PRELOAD ...]
set -u
here=$(cd "$(dirname "$0")" && pwd)
bundle=$(dirname "$here")
w=/tmp/library_two_contexts.$$
mkdir -p "$w"
nvcc -cubin -arch=sm_90 -o "$w/lib.cubin" "$here/workloads/library_kernel.cu" || exit 1
gcc -O2 "$here/workloads/library_two_contexts.c" -o "$w/l2c" -ldl || exit 1
echo "## native"
"$w/l2c" "$w/lib.cubin"
n=0
for p in "$bundle/libhami_preload.so" "$@"; do
  n=$((n + 1))
  echo "## preload $p"
  LD_PRELOAD=$p CUDA_DEVICE_MEMORY_LIMIT=4g CUDA_DEVICE_MEMORY_SHARED_CACHE=$w/r$n.cache \
    LIBCUDA_LOG_LEVEL=3 "$w/l2c" "$w/lib.cubin"
done
rm -rf "$w"
