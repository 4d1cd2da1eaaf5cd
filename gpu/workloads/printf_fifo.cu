// What the driver takes for the printf FIFO and the malloc heap (issue 31): the process's
// device memory (the driver's per-process figure, nvidia-smi) and the device's used memory
// (cudaMemGetInfo) after the context, after cudaDeviceSetLimit(N), after a launch of a
// kernel using neither, after the printf (heap: malloc) kernel is loaded without running,
// after a launch of it that takes its printf (malloc) branch never, and after two launches
// that do. Usage: [WL_PREALLOC_MIB=N] ./printf_fifo fifo|heap MiB (0: the default size, no
// set call).
// Build: nvcc -O2 -o printf_fifo printf_fifo.cu
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <unistd.h>

__global__ void plain(int *p) {
  if (p) *p = 1;
}
__global__ void says(int v) {
  if (v >= 0 && threadIdx.x == 0 && blockIdx.x == 0) printf("PRINTF v=%d\n", v);
}
__global__ void takes(int v, int *out) {
  if (v >= 0 && threadIdx.x == 0 && blockIdx.x == 0) {
    char *p = (char *)malloc(1 << 20);
    if (out) *out = p != 0;
    if (p) free(p);
  }
}

static long used_mib() {
  char cmd[160];
  snprintf(cmd, sizeof cmd,
           "nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits"
           " | awk -F', ' '$1 == %d {print $2}'",
           (int)getpid());
  FILE *f = popen(cmd, "r");
  long v = -1;
  if (f) {
    if (fscanf(f, "%ld", &v) != 1) v = -1;
    pclose(f);
  }
  return v;
}

static long dev_used_mib() {
  size_t fr = 0, tot = 0;
  if (cudaMemGetInfo(&fr, &tot) != cudaSuccess) return -1;
  return (long)((tot - fr) >> 20);
}

static void step(const char *what, cudaError_t e) {
  fflush(stdout);
  printf("STEP %s rc=%d name=%s used_mib=%ld dev_used_mib=%ld\n", what, (int)e,
         cudaGetErrorName(e), used_mib(), dev_used_mib());
  fflush(stdout);
}

int main(int argc, char **argv) {
  int heap = argc > 1 && !strcmp(argv[1], "heap");
  size_t mib = argc > 2 ? strtoull(argv[2], 0, 10) : 0;
  cudaLimit lim = heap ? cudaLimitMallocHeapSize : cudaLimitPrintfFifoSize;
  int *out = 0;
  cudaFree(0);
  step("ctx", cudaSuccess);
  cudaMalloc(&out, 4);
  step("alloc4", cudaSuccess);
  // WL_PREALLOC_MIB: that much allocated first (a container nearly full).
  const char *pre = getenv("WL_PREALLOC_MIB");
  if (pre && atoi(pre) > 0) {
    void *p = 0;
    step("prealloc", cudaMalloc(&p, (size_t)atoi(pre) << 20));
  }
  size_t got = 0;
  cudaDeviceGetLimit(&got, lim);
  printf("LIMIT before=%zu\n", got);
  if (mib) {
    cudaError_t e = cudaDeviceSetLimit(lim, mib << 20);
    cudaDeviceGetLimit(&got, lim);
    printf("LIMIT after=%zu\n", got);
    step("set", e);
  }
  plain<<<1, 1>>>(0);
  step("plain", cudaDeviceSynchronize());
  cudaFuncAttributes a;
  step("load", heap ? cudaFuncGetAttributes(&a, takes) : cudaFuncGetAttributes(&a, says));
  if (heap) takes<<<1, 1>>>(-1, out); else says<<<1, 1>>>(-1);
  step("unused", cudaDeviceSynchronize());
  if (heap) takes<<<1, 1>>>(7, out); else says<<<1, 1>>>(7);
  step("used", cudaDeviceSynchronize());
  if (heap) takes<<<1, 1>>>(8, out); else says<<<1, 1>>>(8);
  step("used2", cudaDeviceSynchronize());
  return 0;
}
