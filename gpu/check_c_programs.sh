#!/usr/bin/env bash
# Compiles the C test programs that take their CUDA / NVML declarations from
# testing/programs/include/hami_cuda.h and hami_nvml.h against this machine's real <cuda.h> and
# <nvml.h>, with -DHAMI_CHECK_AGAINST_CUDA_H / -DHAMI_CHECK_AGAINST_NVML_H: the headers'
# fallbacks (used where there is no CUDA toolkit) are declared again next to the real headers,
# so a prototype, typedef, enum value or struct layout that drifted from them is a compile
# error here. Run on the GPU machine (needs gcc, cuda.h and nvml.h; CUDA_HOME, or
# CUDA_INCLUDE / NVML_INCLUDE for headers elsewhere, e.g. unpacked from the
# nvidia-cuda-runtime-cu12 and nvidia-nvml-dev-cu12 wheels).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cuda_inc="${CUDA_INCLUDE:-${CUDA_HOME:-/usr/local/cuda}/include}"
nvml_inc="${NVML_INCLUDE:-$cuda_inc}"
[ -f "$cuda_inc/cuda.h" ] || { echo "no cuda.h under $cuda_inc (set CUDA_HOME or CUDA_INCLUDE)" >&2; exit 1; }
[ -f "$nvml_inc/nvml.h" ] || { echo "no nvml.h under $nvml_inc (set NVML_INCLUDE)" >&2; exit 1; }
cc="${CC:-gcc}"
inc=(-I"$root/testing/programs/include" -I"$cuda_inc" -I"$nvml_inc")
# hprobe.c includes hprobe_fns.h, which the preload's tests generate: an empty stand-in lets it
# be checked here (its tables are untyped; only its CUDA declarations are checked).
stub="$(mktemp -d)"
trap 'rm -rf "$stub"' EXIT
cat > "$stub/hprobe_fns.h" <<'H'
enum { HP_SHAPE_NONE, HP_SHAPE_OUT_SIZE, HP_SHAPE_PITCH, HP_SHAPE_MEM_CREATE, HP_SHAPE_ARRAY2D,
       HP_SHAPE_ARRAY3D, HP_SHAPE_MIPMAPPED, HP_SHAPE_VALUE, HP_SHAPE_CTX_OUT };
enum hp_memory { HP_MEM_NONE, HP_MEM_ALLOCATES, HP_MEM_RELEASES };
enum hp_space { HP_SPACE_NONE = -1, HP_SPACE_POINTER, HP_SPACE_HANDLE, HP_SPACE_ARRAY, HP_SPACE_MIPMAP, HP_NSPACES };
enum { F_cuMemAlloc_v2, F_cuMemAllocPitch_v2, F_cuMemAllocManaged, F_cuMemAllocAsync,
       F_cuMemAllocAsync_ptsz, F_cuMemAllocFromPoolAsync, F_cuMemAllocFromPoolAsync_ptsz,
       F_cuDeviceGetDefaultMemPool, F_cuMemCreate, F_cuArrayCreate_v2, F_cuArray3DCreate_v2,
       F_cuMemFree_v2, F_cuMemFreeAsync, F_cuMemRelease, F_cuArrayDestroy, F_cuMemGetInfo_v2,
       F_cuDeviceTotalMem_v2, NFN };
struct hp_fn { const char *name, *pa_name; unsigned long long pa_flags; int shape, memory, space; };
static const struct hp_fn hp_fns[NFN];
static void (*const hp_direct[NFN])(void);
H
check() { # check SRC FLAG...
  local src="$1"
  shift
  "$cc" -fsyntax-only -Wall -Werror "$@" "${inc[@]}" -I"$stub" "$root/$src"
  echo "ok  $src ($*)"
}
for src in \
  testing/programs/crossfree.c \
  testing/programs/scaleproc.c \
  testing/programs/tortureload.c \
  testing/programs/cudaprobe.c \
  hami-preload/tests/programs/minimain.c \
  hami-preload/tests/programs/minifake.c \
  hami-preload/tests/programs/hprobe.c; do
  check "$src" -DHAMI_CHECK_AGAINST_CUDA_H
done
for src in \
  testing/programs/nvmlprobe.c \
  hami-preload/tests/programs/nvmlprocs.c; do
  check "$src" -DHAMI_CHECK_AGAINST_NVML_H
done
# The headers alone, in each of their modes (the programs above use one each).
for flags in "-DHAMI_CHECK_AGAINST_CUDA_H" "-DHAMI_CHECK_AGAINST_CUDA_H -DHAMI_CUDA_ABI_NAMES"; do
  echo '#include "hami_cuda.h"' | "$cc" -fsyntax-only -Wall -Werror $flags "${inc[@]}" -x c -
  echo "ok  hami_cuda.h ($flags)"
done
for flags in "-DHAMI_CHECK_AGAINST_NVML_H" "-DHAMI_CHECK_AGAINST_NVML_H -DNVML_NO_UNVERSIONED_FUNC_DEFS"; do
  echo '#include "hami_nvml.h"' | "$cc" -fsyntax-only -Wall -Werror $flags "${inc[@]}" -x c -
  echo "ok  hami_nvml.h ($flags)"
done
