#!/usr/bin/env bash
# Compiles the C test programs that take their CUDA declarations from
# testing/programs/include/hami_cuda.h against this machine's real <cuda.h>, with
# -DHAMI_CHECK_AGAINST_CUDA_H: the header's fallback (used where there is no CUDA toolkit) is
# declared again next to cuda.h, so a prototype, typedef, enum value or struct layout that drifted
# from the real header is a compile error here. Run on the GPU machine (needs gcc and cuda.h).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cuda_inc="${CUDA_HOME:-/usr/local/cuda}/include"
[ -f "$cuda_inc/cuda.h" ] || { echo "no cuda.h under $cuda_inc (set CUDA_HOME)" >&2; exit 1; }
cc="${CC:-gcc}"
for src in \
  testing/programs/crossfree.c \
  testing/programs/scaleproc.c \
  testing/programs/tortureload.c \
  hami-preload/tests/programs/minimain.c; do
  "$cc" -fsyntax-only -Wall -Werror -DHAMI_CHECK_AGAINST_CUDA_H \
    -I"$root/testing/programs/include" -I"$cuda_inc" "$root/$src"
  echo "ok  $src"
done
