#!/bin/sh
# The preload in a container on an older glibc (issue 28): Debian 11's glibc 2.31 (its loader
# and libraries, from the bundle's oldglibc/), a CUDA program built for glibc 2.17, the real
# libcuda, the released preload through the loader's --preload (what /etc/ld.so.preload does).
# Usage on the GPU machine: sh gpu-bundle/gpu/oldglibc_check.sh
set -u
here=$(cd "$(dirname "$0")" && pwd)
old=$(dirname "$here")/oldglibc
root=$old/root; L=$root/lib/x86_64-linux-gnu
pre=$(dirname "$here")/libhami_preload.so
lc=$(ldconfig -p | awk '/libcuda.so.1 /{print $NF; exit}')
[ -n "$lc" ] || lc=/usr/local/nvidia/lib64/libcuda.so.1
lcd=$(dirname "$(readlink -f "$lc")")
fail=0
check() { if eval "$2"; then echo "PASS $1"; else echo "FAIL $1"; fail=$((fail + 1)); fi; }
run() { "$L/ld-linux-x86-64.so.2" --library-path "$L:$lcd" "$@"; }
echo "libcuda: $lc; newest glibc version it needs: $(objdump -T "$lc" 2>/dev/null | grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -1)"
echo "libhami_preload.so: newest glibc version it needs: $(objdump -T "$pre" 2>/dev/null | grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -1)"
out=$(run --preload "$pre" "$root/usr/bin/getconf" GNU_LIBC_VERSION 2>&1); echo "$out"
check "a non-CUDA program of glibc 2.31 runs with the preload" '[ "$out" = "glibc 2.31" ]'
out=$(run "$old/cudaprobe" init ctx alloc 1G 2>&1); echo "$out"
check "natively under glibc 2.31 the driver works" 'echo "$out" | grep -q "op=alloc size=1073741824 idx=0 .* rc=0"'
rm -f /tmp/oldglibc.cache
out=$(CUDA_DEVICE_MEMORY_LIMIT=2G CUDA_DEVICE_MEMORY_SHARED_CACHE=/tmp/oldglibc.cache \
    run --preload "$pre" "$old/cudaprobe" init ctx meminfo alloc 1G alloc 2G meminfo 2>&1); echo "$out"
check "under the preload the quota is the total" 'echo "$out" | grep -q "op=meminfo .*total=2147483648 rc=0"'
check "under the preload 1 GiB is granted" 'echo "$out" | grep -q "op=alloc size=1073741824 idx=0 .* rc=0"'
check "under the preload 2 GiB more are refused" 'echo "$out" | grep -q "op=alloc size=2147483648 rc=2"'
rm -f /tmp/oldglibc.cache
[ "$fail" = 0 ] && { echo "RESULT: PASS"; exit 0; }
echo "RESULT: FAIL ($fail checks)"; exit 1
