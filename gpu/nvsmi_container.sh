#!/bin/sh
# nvidia-smi inside a container (issue 20): container A (two processes, 256 + 512 MiB) and
# container B (one, 768 MiB) share GPU 0, each with its own region and a 4 GiB quota.
# nvidia-smi is run natively, under A's preload, and under A's preload inside a pid namespace
# whose processes are A's. Under A's preload the process list must hold A's processes only,
# with their pids as A sees them and the region's usage (256 / 512 MiB).
# Usage on the GPU machine: sh gpu-bundle/gpu/nvsmi_container.sh
set -u
here=$(cd "$(dirname "$0")" && pwd)
pre=$(dirname "$here")/libhami_preload.so
w=/tmp/nvsmi.$$
mkdir -p "$w"
gcc -O2 -I/usr/local/cuda/include "$here/workloads/hold.c" -o "$w/hold" -lcuda || exit 1
q="--query-compute-apps=pid,used_memory --format=csv,noheader,nounits"
envA="LD_PRELOAD=$pre CUDA_DEVICE_MEMORY_LIMIT=4g CUDA_DEVICE_MEMORY_SHARED_CACHE=$w/a.cache"
envB="LD_PRELOAD=$pre CUDA_DEVICE_MEMORY_LIMIT=4g CUDA_DEVICE_MEMORY_SHARED_CACHE=$w/b.cache"
echo "## host: A1, A2 (container A), B1 (container B)"
env $envA "$w/hold" 256 14 > "$w/a1" & env $envA "$w/hold" 512 14 > "$w/a2" &
env $envB "$w/hold" 768 14 > "$w/b1" &
sleep 6
cat "$w/a1" "$w/a2" "$w/b1"
echo "## native nvidia-smi"; nvidia-smi $q
echo "## nvidia-smi under A's preload"; env $envA nvidia-smi $q
echo "## nvidia-smi (table) under A's preload"; env $envA nvidia-smi | tail -8
echo "## nvidia-smi under B's preload"; env $envB nvidia-smi $q
wait
echo "## pid namespace: A1, A2 inside, B1 outside"
env $envB "$w/hold" 768 16 > "$w/b2" &
unshare --pid --fork --mount-proc sh -c "
  env $envA $w/hold 256 14 > $w/n1 & env $envA $w/hold 512 14 > $w/n2 &
  sleep 6; cat $w/n1 $w/n2
  echo '## native nvidia-smi in the namespace'; nvidia-smi $q
  echo '## nvidia-smi under A preload in the namespace'; env $envA nvidia-smi $q
  echo '## table'; env $envA nvidia-smi | tail -8
  wait"
cat "$w/b2"
wait
rm -rf "$w"
