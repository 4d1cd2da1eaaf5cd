/* pair_bench.c: latency of one cuMemAlloc_v2 + cuMemFree_v2 pair through the driver API.
 *
 * Declares the few driver entry points itself (no cuda.h needed), so it builds against the
 * real libcuda on the GPU machine and against the fake driver anywhere:
 *   gcc -O2 pair_bench.c -o pair_bench -L<dir of libcuda.so.1> -l:libcuda.so.1 -ldl -lpthread
 * Usage: ./pair_bench PAIRS SIZE_BYTES [ROUNDS]
 * Prints: BENCH pairs=.. size=.. rounds=.. ns_per_pair_median=.. ns_per_pair_min=.. failures=..
 * (each round times PAIRS pairs; median and min are over rounds, after one warm-up round). */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

typedef int CUresult;
typedef int CUdevice;
typedef struct CUctx_st *CUcontext;
typedef unsigned long long CUdeviceptr;

extern CUresult cuInit(unsigned int flags);
extern CUresult cuDeviceGet(CUdevice *dev, int ordinal);
extern CUresult cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice dev);
extern CUresult cuCtxSetCurrent(CUcontext ctx);
extern CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n);
extern CUresult cuMemFree_v2(CUdeviceptr p);

static double now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
  long pairs = argc > 1 ? atol(argv[1]) : 10000;
  size_t size = argc > 2 ? (size_t)atoll(argv[2]) : (size_t)1 << 20;
  int rounds = argc > 3 ? atoi(argv[3]) : 5;
  CUdevice dev;
  CUcontext ctx;
  CUresult r;
  double *per;
  long failures = 0;
  if (pairs <= 0 || rounds <= 0 || rounds > 1000) {
    fprintf(stderr, "usage: pair_bench PAIRS SIZE [ROUNDS]\n");
    return 2;
  }
  if ((r = cuInit(0)) || (r = cuDeviceGet(&dev, 0)) || (r = cuDevicePrimaryCtxRetain(&ctx, dev)) ||
      (r = cuCtxSetCurrent(ctx))) {
    printf("BENCH_ERROR init rc=%d\n", r);
    return 1;
  }
  per = (double *)calloc((size_t)rounds, sizeof(double));
  for (int round = -1; round < rounds; round++) {
    double t0 = now_ns();
    for (long i = 0; i < pairs; i++) {
      CUdeviceptr p = 0;
      if (cuMemAlloc_v2(&p, size) != 0) {
        failures++;
        continue;
      }
      if (cuMemFree_v2(p) != 0) failures++;
    }
    if (round >= 0) per[round] = (now_ns() - t0) / (double)pairs;
  }
  qsort(per, (size_t)rounds, sizeof(double), cmp);
  printf("BENCH pairs=%ld size=%zu rounds=%d ns_per_pair_median=%.1f ns_per_pair_min=%.1f failures=%ld\n",
         pairs, size, rounds, per[rounds / 2], per[0], failures);
  free(per);
  return failures ? 1 : 0;
}
