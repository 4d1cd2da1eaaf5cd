/* probe_cost.c: the cost of the agent's uprobes per driver call, in one process.
 *
 *   gcc -O2 -I/usr/local/cuda/include probe_cost.c -o probe_cost -lcuda
 *   ./probe_cost [calls per round, default 20000] [rounds, default 7]
 *
 * Times, per call (median and minimum over rounds, after one warm-up round):
 *   pair    cuMemAlloc_v2(1 MiB) + cuMemFree_v2: two probed functions, entry and return each
 *   setcur  cuCtxSetCurrent(the current context): one probed function, entry and return,
 *           nearly free in the driver, so its extra cost is the probes' own
 *   getcur  cuCtxGetCurrent: not probed (the control: what the machine's noise alone does)
 * Prints one line per op: COST op=.. ns_median=.. ns_min=.. */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* kB of anonymous (copy-on-write) memory in libcuda's executable mapping: a page where a
 * uprobe's breakpoint was written is a private copy, so this is non-zero while probes are
 * installed in this process. */
static long text_anon_kb(void) {
  FILE *f = fopen("/proc/self/smaps", "r");
  char line[512];
  int in = 0;
  long kb = 0, v;
  if (!f) return -1;
  while (fgets(line, sizeof line, f)) {
    if (strchr(line, '-') && strstr(line, " r-xp ")) in = strstr(line, "libcuda") != NULL;
    else if (strchr(line, '-') && strstr(line, " ---p ")) in = 0;
    else if (in && sscanf(line, "Anonymous: %ld kB", &v) == 1) kb += v;
  }
  fclose(f);
  return kb;
}

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
  long n = argc > 1 ? atol(argv[1]) : 20000;
  int rounds = argc > 2 ? atoi(argv[2]) : 7;
  if (n <= 0 || rounds <= 0 || rounds > 100) return 2;
  CUdevice dev;
  CUcontext ctx, cur;
  if (cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&ctx, dev) ||
      cuCtxSetCurrent(ctx)) {
    printf("COST_ERROR init\n");
    return 1;
  }
  double per[3][100];
  long fail = 0;
  for (int r = -1; r < rounds; r++) {
    double t0 = now_ns();
    for (long i = 0; i < n / 10; i++) {
      CUdeviceptr p;
      if (cuMemAlloc_v2(&p, 1 << 20)) { fail++; continue; }
      cuMemFree_v2(p);
    }
    double t1 = now_ns();
    for (long i = 0; i < n; i++) cuCtxSetCurrent(ctx);
    double t2 = now_ns();
    for (long i = 0; i < n; i++) cuCtxGetCurrent(&cur);
    double t3 = now_ns();
    if (r >= 0) {
      per[0][r] = (t1 - t0) / (double)(n / 10);
      per[1][r] = (t2 - t1) / (double)n;
      per[2][r] = (t3 - t2) / (double)n;
    }
  }
  const char *names[3] = {"pair", "setcur", "getcur"};
  for (int k = 0; k < 3; k++) {
    qsort(per[k], (size_t)rounds, sizeof(double), cmp);
    printf("COST op=%s ns_median=%.1f ns_min=%.1f\n", names[k], per[k][rounds / 2], per[k][0]);
  }
  printf("COST failures=%ld text_anon_kb=%ld\n", fail, text_anon_kb());
  return 0;
}
