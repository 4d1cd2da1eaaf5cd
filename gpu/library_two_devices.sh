#!/bin/sh
# A library (the program's own code, a 1536 MiB `__device__` array) launched on two GPUs,
# natively and under the preload (quota 4 GiB on GPU 0, 2 GiB on GPU 1): both devices must be
# charged, so GPU 1's next 256 MiB allocation is refused (context ~518 MiB + 1536 MiB > 2 GiB).
# Usage on a 2-GPU machine: sh gpu-bundle/gpu/library_two_devices.sh [OTHER_PRELOAD ...]
# (other preloads, e.g. an earlier build, run the same case for comparison).
set -u
here=$(cd "$(dirname "$0")" && pwd)
bundle=$(dirname "$here")
bin=/tmp/library_two_devices.$$
nvcc -O2 -arch=sm_90 -cudart shared "$here/workloads/library_two_devices.cu" -o "$bin" || exit 1
echo "## native"
"$bin"
n=0
for p in "$bundle/libhami_preload.so" "$@"; do
  n=$((n + 1))
  region=/tmp/library_two_devices.$$.$n.cache
  echo "## preload $p"
  LD_PRELOAD=$p CUDA_DEVICE_MEMORY_LIMIT_0=4g CUDA_DEVICE_MEMORY_LIMIT_1=2g \
    CUDA_DEVICE_MEMORY_SHARED_CACHE=$region LIBCUDA_LOG_LEVEL=3 "$bin"
  rm -f "$region"
done
rm -f "$bin"
