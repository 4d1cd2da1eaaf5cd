#!/bin/sh
# nvidia-smi inside a container (issues 20 and 28): container A (two processes, 256 + 512 MiB)
# and container B (one, 768 MiB) share GPU 0, each with its own region and a 4 GiB quota, all
# in the host's pid namespace (the case where the driver itself does not hide B from A).
# nvidia-smi 580 reads its process table through nvmlInternalGetExportTable (slots 213-215),
# which the preload wraps. Checked, each with a PASS/FAIL line:
#   - native nvidia-smi lists all three processes (before and after: unchanged);
#   - under A's preload, --query-compute-apps=pid,used_memory,name lists A's two only, with
#     names and A's usage (at least what each holds), and the default table likewise;
#   - under A's preload, nvidia-smi -q exits 0 and its Processes section has A's only;
#   - under B's preload, B's only;
#   - nvmlprobe --export nvsmi (the slots called directly) under A's preload: A's only.
# Usage on the GPU machine: sh gpu-bundle/gpu/nvsmi_container.sh   (last line: RESULT: ...)
set -u
here=$(cd "$(dirname "$0")" && pwd)
pre=$(dirname "$here")/libhami_preload.so
progs=$(dirname "$here")/programs
w=/tmp/nvsmi.$$
mkdir -p "$w"
fails=0
check() { # check NAME STATUS(0 = pass) [DETAIL]
  if [ "$2" -eq 0 ]; then echo "PASS $1"; else echo "FAIL $1${3:+: $3}"; fails=$((fails + 1)); fi
}
gcc -O2 -I/usr/local/cuda/include "$here/workloads/hold.c" -o "$w/hold" -lcuda || exit 1
probe=""
if [ -f "$progs/nvmlprobe.c" ] && gcc -O2 "$progs/nvmlprobe.c" -o "$w/nvmlprobe" -ldl; then
  probe="$w/nvmlprobe"
fi
nvidia-smi --query-gpu=driver_version,name --format=csv,noheader
q="--query-compute-apps=pid,used_memory,name --format=csv,noheader,nounits"
envA="LD_PRELOAD=$pre CUDA_DEVICE_MEMORY_LIMIT=4g CUDA_DEVICE_MEMORY_SHARED_CACHE=$w/a.cache"
envB="LD_PRELOAD=$pre CUDA_DEVICE_MEMORY_LIMIT=4g CUDA_DEVICE_MEMORY_SHARED_CACHE=$w/b.cache"

echo "## host: A1, A2 (container A), B1 (container B)"
env $envA "$w/hold" 256 60 > "$w/a1" & ka1=$!
env $envA "$w/hold" 512 60 > "$w/a2" & ka2=$!
env $envB "$w/hold" 768 60 > "$w/b1" & kb1=$!
i=0
while [ "$(cat "$w/a1" "$w/a2" "$w/b1" 2>/dev/null | grep -c HOLDING)" -lt 3 ] && [ $i -lt 60 ]; do
  sleep 0.5; i=$((i + 1))
done
cat "$w/a1" "$w/a2" "$w/b1"
A1=$(awk '/HOLDING/{print $2}' "$w/a1"); A2=$(awk '/HOLDING/{print $2}' "$w/a2")
B1=$(awk '/HOLDING/{print $2}' "$w/b1")
if [ -z "$A1" ] || [ -z "$A2" ] || [ -z "$B1" ]; then
  echo "FAIL holders did not start"; kill $ka1 $ka2 $kb1 2>/dev/null; echo "RESULT: FAIL"; exit 1
fi
echo "A1=$A1 A2=$A2 B1=$B1"

pids() { cut -d, -f1 "$1" | tr -d ' ' | grep -E '^[0-9]+$' | sort -n | tr '\n' ' '; }
used_of() { awk -F', *' -v p="$2" '$1 == p {print $2}' "$1"; }
want_all=$(printf '%s\n' "$A1" "$A2" "$B1" | sort -n | tr '\n' ' ')
want_a=$(printf '%s\n' "$A1" "$A2" | sort -n | tr '\n' ' ')

echo "## native nvidia-smi $q"
nvidia-smi $q > "$w/native" 2>&1; cat "$w/native"
check "native nvidia-smi lists A1, A2 and B1" "$([ "$(pids "$w/native")" = "$want_all" ]; echo $?)" "$(pids "$w/native")"

echo "## nvidia-smi $q under A's preload"
env $envA nvidia-smi $q > "$w/qa" 2> "$w/qa.err"; rc=$?; cat "$w/qa" "$w/qa.err"
check "query-compute-apps under A: exit 0" $rc
check "query-compute-apps under A: A1 and A2 only" "$([ "$(pids "$w/qa")" = "$want_a" ]; echo $?)" "got $(pids "$w/qa")"
ua1=$(used_of "$w/qa" "$A1"); ua2=$(used_of "$w/qa" "$A2")
check "query-compute-apps under A: A's usage (A1 >= 256 MiB, A2 >= 512 MiB)" \
  "$([ "${ua1:-0}" -ge 256 ] 2>/dev/null && [ "${ua2:-0}" -ge 512 ] 2>/dev/null; echo $?)" "A1=${ua1:-?} A2=${ua2:-?}"
check "query-compute-apps under A: names shown" "$(awk -F', *' -v p="$A1" '$1 == p && $3 ~ /hold/ {f=1} END {exit !f}' "$w/qa"; echo $?)"
echo "## nvidia-smi --query-gpu=memory.used,memory.total under A's preload (the memory line, for comparison)"
env $envA nvidia-smi --query-gpu=memory.used,memory.total --format=csv,noheader

echo "## nvidia-smi (default table) under A's preload"
env $envA nvidia-smi > "$w/ta" 2> "$w/ta.err"; rc=$?
sed -n '/Processes:/,$p' "$w/ta"; cat "$w/ta.err"
sed -n '/Processes:/,$p' "$w/ta" > "$w/ta.procs"
check "default table under A: exit 0" $rc
check "default table under A: A1 and A2 listed" "$(grep -qw "$A1" "$w/ta.procs" && grep -qw "$A2" "$w/ta.procs"; echo $?)"
check "default table under A: B1 not listed" "$(! grep -qw "$B1" "$w/ta.procs"; echo $?)"

echo "## nvidia-smi -q under A's preload (Processes section)"
env $envA nvidia-smi -q > "$w/qq" 2> "$w/qq.err"; rc=$?
sed -n '/^ *Processes/,$p' "$w/qq" | head -40; cat "$w/qq.err"
check "nvidia-smi -q under A: exit 0" $rc
check "nvidia-smi -q under A: has a Processes section" "$(grep -q '^ *Processes' "$w/qq"; echo $?)"
check "nvidia-smi -q under A: A1 and A2 listed" \
  "$(grep -Eq "Process ID +: $A1\$" "$w/qq" && grep -Eq "Process ID +: $A2\$" "$w/qq"; echo $?)"
check "nvidia-smi -q under A: B1 not listed" "$(! grep -Eq "Process ID +: $B1\$" "$w/qq"; echo $?)"

echo "## nvidia-smi $q under B's preload"
env $envB nvidia-smi $q > "$w/qb" 2> "$w/qb.err"; cat "$w/qb" "$w/qb.err"
check "query-compute-apps under B: B1 only" "$([ "$(pids "$w/qb")" = "$B1 " ]; echo $?)" "got $(pids "$w/qb")"

if [ -n "$probe" ]; then
  echo "## nvmlprobe --export nvsmi (slots 213-215 called directly), native"
  timeout 30 "$probe" --index 0 --export nvsmi | grep -E '^(driver|export|xlist|xproc)' | cut -c1-160
  echo "## nvmlprobe --export nvsmi under A's preload"
  timeout 30 env $envA "$probe" --index 0 --export nvsmi > "$w/pa" 2> "$w/pa.err"; rc=$?
  grep -E '^(export|xlist|xproc)' "$w/pa" | cut -c1-160; cat "$w/pa.err"
  xp=$(awk '/^xproc/ {for (i = 1; i <= NF; i++) if ($i ~ /^pid=/) print substr($i, 5)}' "$w/pa" | sort -nu | tr '\n' ' ')
  check "nvmlprobe export slots under A: exit 0, table wrapped" "$([ $rc -eq 0 ] && grep -q 'table_obj=none' "$w/pa"; echo $?)"
  check "nvmlprobe export slots under A: A1 and A2 only" "$([ "$xp" = "$want_a" ]; echo $?)" "got $xp"
fi

echo "## native nvidia-smi $q again (unchanged)"
nvidia-smi $q > "$w/native2" 2>&1; cat "$w/native2"
check "native nvidia-smi still lists A1, A2 and B1" "$([ "$(pids "$w/native2")" = "$want_all" ]; echo $?)" "$(pids "$w/native2")"

kill $ka1 $ka2 $kb1 2>/dev/null
wait
rm -rf "$w"
if [ $fails -eq 0 ]; then echo "RESULT: PASS"; else echo "RESULT: FAIL ($fails checks)"; fi
[ $fails -eq 0 ]
