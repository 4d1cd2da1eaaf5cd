/* Stub CUDA runtime for testing the acceptance runner WITHOUT a GPU (gpu/test_runner.py).
 * Compile: gcc -x c -I gpu/testing/stub gpu/workloads/cuda_alloc.cu -o /tmp/cuda_alloc_stub
 * "Device" memory is host memory (untouched malloc); allocations past the device size (see
 * stub_total) fail with cudaErrorMemoryAllocation like a quota would.
 * Not a model of CUDA: only what cuda_alloc.cu calls, enough to drive its protocol. */
#ifndef WL_STUB_CUDA_RUNTIME_H
#define WL_STUB_CUDA_RUNTIME_H
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef enum { cudaSuccess = 0, cudaErrorInvalidValue = 1, cudaErrorMemoryAllocation = 2 } cudaError_t;
enum cudaMemcpyKind { cudaMemcpyHostToDevice = 1, cudaMemcpyDeviceToHost = 2 };

static size_t stub_used;
static cudaError_t stub_last;

/* Device size: the quota when the (fake) preload is in LD_PRELOAD with
 * CUDA_DEVICE_MEMORY_LIMIT=<n>M, else WL_STUB_TOTAL_MB (default 143771, an H200). */
static size_t stub_total(void) {
  const char *pre = getenv("LD_PRELOAD"), *lim = getenv("CUDA_DEVICE_MEMORY_LIMIT");
  const char *v = getenv("WL_STUB_TOTAL_MB");
  if (pre && strstr(pre, "hami") && !strstr(pre, "blind") && lim) return (size_t)strtoull(lim, NULL, 10) << 20;
  return (size_t)(v ? strtoull(v, NULL, 10) : 143771) << 20;
}
static cudaError_t cudaMalloc(void **p, size_t n) {
  size_t *h;
  if (!p) return stub_last = cudaErrorInvalidValue;
  if (stub_used + n > stub_total()) return stub_last = cudaErrorMemoryAllocation;
  h = (size_t *)malloc(n + 16); /* untouched pages: cheap even for GiBs */
  if (!h) return stub_last = cudaErrorMemoryAllocation;
  h[0] = n;
  stub_used += n;
  *p = (char *)h + 16;
  return cudaSuccess;
}
static cudaError_t cudaFree(void *p) {
  if (p) {
    size_t *h = (size_t *)((char *)p - 16);
    stub_used -= h[0];
    free(h);
  }
  return cudaSuccess;
}
static cudaError_t cudaMemGetInfo(size_t *f, size_t *t) {
  if (getenv("WL_STUB_HANG")) sleep(3600); /* lets tests check the runner's timeouts */
  *t = stub_total();
  *f = *t - stub_used;
  return cudaSuccess;
}
static cudaError_t cudaMemcpy(void *d, const void *s, size_t n, enum cudaMemcpyKind k) {
  (void)k;
  memcpy(d, s, n);
  return cudaSuccess;
}
static cudaError_t cudaDeviceSynchronize(void) { return cudaSuccess; }
static cudaError_t cudaGetLastError(void) {
  cudaError_t e = stub_last;
  stub_last = cudaSuccess;
  return e;
}
static const char *cudaGetErrorString(cudaError_t e) {
  return e == cudaSuccess ? "no_error" : e == cudaErrorMemoryAllocation ? "out_of_memory" : "invalid_value";
}
static cudaError_t cudaRuntimeGetVersion(int *v) { *v = 0; return cudaSuccess; }
static cudaError_t cudaDriverGetVersion(int *v) { *v = 0; return cudaSuccess; }
static void wl_stub_saxpy(int n, float a, const float *x, float *y) {
  for (int i = 0; i < n; i++) y[i] = a * x[i] + y[i];
}
/* For gpu/workloads/module_global.cu: no device code here, the array is host bss. */
#define __device__
#define __global__
static const char *cudaGetErrorName(cudaError_t e) {
  return e == cudaSuccess ? "cudaSuccess"
         : e == cudaErrorMemoryAllocation ? "cudaErrorMemoryAllocation" : "cudaErrorInvalidValue";
}
static cudaError_t cudaMemset(void *p, int v, size_t n) {
  memset(p, v, n);
  return cudaSuccess;
}
/* The "kernel": touches the array like touch_global; the module is now "loaded", so its
 * bytes count as used device memory (a quota with no room left refuses what follows). */
static void wl_stub_touch_global(char *g, size_t n, int *out, int stride) {
  int sum = 0;
  for (size_t i = 0; i < n; i += (size_t)stride) {
    g[i] = 1;
    sum += g[i];
  }
  *out += sum;
  stub_used += n;
}
#endif
