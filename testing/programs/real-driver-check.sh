#!/bin/sh
# Runs cudaprobe / nvmlprobe against a REAL driver with the op lists the fake driver's tests
# use (testing/harness/tests/fakes/fake_driver.rs), so the expectations can be compared with the
# real behaviour. Usage on a GPU machine: sh testing/programs/real-driver-check.sh OUTDIR
set -u
out=${1:-/tmp/real-driver-check}
mkdir -p "$out"
here=$(dirname "$0")
stubs=/usr/local/cuda/lib64/stubs
gcc -O2 -I"$here/include" -o "$out/cudaprobe" "$here/cudaprobe.c" -L"$stubs" -lcuda -ldl -lpthread || exit 1
gcc -O2 -I"$here/include" -o "$out/nvmlprobe" "$here/nvmlprobe.c" -ldl || exit 1
export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-/usr/local/nvidia/lib64}
p="$out/cudaprobe"
{
  echo "## not-initialized"; $p alloc 1M meminfo count free-raw 0x1234 ctx version
  echo "## invalid-context"; $p init alloc 1M meminfo ctxsync ctxdevice ctxpop ctx alloc 0 alloc-null free-raw 0x1234 free-raw 0 device 7 ctx device 0 managed 1M pitch 0 4
  for via in direct dlsym procaddr; do
    echo "## three-ways $via"; $p --via $via init ctx meminfo alloc 64M meminfo async 8M pool 2M create 4M meminfo free 0 freeasync 1 freeasync 2 release 3 meminfo
  done
  echo "## procaddr-13000"; $p --via procaddr --cuda-version 13000 init ctx ctxcreate ctxdevice ctxsync ctxdestroy ctxdevice getproc cuCtxCreate getproc cuCtxGetDevice getproc cuCtxSynchronize
  echo "## getproc"; $p getproc cuMemAlloc 12000 0 getproc cuMemAllocAsync 12000 2 getproc cuMemFreeAsync 12000 2 getproc cuMemAllocFromPoolAsync 12000 2 getproc cuMemAllocAsync 12000 0 getproc cuMemAlloc_v2 12000 0 getproc cuNoSuchThing 12000 0 getproc cuMemAllocAsync 11000 0 getproc cuMemAlloc 13010 0 getproc1 cuNoSuchThing 12000 0 getproc1 cuMemAllocAsync 11000 0 getproc1 cuMemAlloc 12000 0
  echo "## contexts"; $p init ctx meminfo ctxcreate alloc 50M meminfo ctxdestroy meminfo alloc 10M ctxrelease ctxsync alloc 1M
  echo "## contexts2"; $p init ctxrelease
  echo "## footprints"; $p init ctx meminfo pitch 1000 10 meminfo array 1000 1000 meminfo array3d 256 256 256 meminfo managed 1G meminfo create 6M create 3M meminfo free all meminfo
  echo "## errname"; $p errname 2 errname 709 errname 12345
  echo "## double-free"; $p init ctx alloc 4M free last free 0 free-raw 0x7f0000001000
  echo "## bench"; $p init ctx bench-pair 20000 1M bench-pair 2000 64M
  echo "## nvml-with-process"
  sleep 8 | $p init ctx alloc 256M wait &
  sleep 3; "$out/nvmlprobe"; wait
  echo "## visible-devices"; for v in 0 "" 1,0 GPU-zzz; do echo "CVD=[$v]"; CUDA_VISIBLE_DEVICES=$v $p init count; done
} > "$out/real-driver-check.txt" 2>&1
cat "$out/real-driver-check.txt"
