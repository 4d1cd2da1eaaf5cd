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
/* For gpu/workloads/limits_probe.cu (issue 17): limits and local memory take "device" memory
 * (untouched host memory, so the process's virtual size shows it to the fake nvidia-smi),
 * sized as the H200's driver sizes them (132 SMs x 2048 resident threads); past the device
 * size (the quota under the fake preload) they are refused with cudaErrorMemoryAllocation. */
#include <time.h>
enum cudaLimit { cudaLimitStackSize = 0, cudaLimitPrintfFifoSize = 1, cudaLimitMallocHeapSize = 2 };
struct cudaFuncAttributes { size_t localSizeBytes; };
#define WL_STUB_RESIDENT ((size_t)132 * 2048)
static size_t stub_limits[3] = {1024, 1 << 20, 8 << 20};
static size_t stub_local_held;
static cudaError_t stub_take(size_t n) {
  if (stub_used + n > stub_total()) return stub_last = cudaErrorMemoryAllocation;
  if (!malloc(n)) return stub_last = cudaErrorMemoryAllocation; /* held until exit */
  stub_used += n;
  return cudaSuccess;
}
static cudaError_t cudaDeviceSetLimit(enum cudaLimit l, size_t v) {
  size_t need;
  if ((int)l < 0 || (int)l > 2) return stub_last = cudaErrorInvalidValue;
  need = l == cudaLimitStackSize ? v * WL_STUB_RESIDENT : v;
  if (stub_take(need) != cudaSuccess) return cudaErrorMemoryAllocation;
  stub_limits[l] = v;
  return cudaSuccess;
}
static cudaError_t cudaDeviceGetLimit(size_t *v, enum cudaLimit l) {
  if ((int)l < 0 || (int)l > 2) return stub_last = cudaErrorInvalidValue;
  *v = stub_limits[l];
  return cudaSuccess;
}
static cudaError_t wl_stub_local_attr(struct cudaFuncAttributes *a, size_t local) {
  a->localSizeBytes = local;
  return cudaSuccess;
}
static void wl_stub_heap_kernel(int *out, int threads, size_t each) {
  (void)each;
  for (int i = 0; i < threads; i++) out[i] = 3;
}
static void wl_stub_add_one(int *out, int threads) {
  for (int i = 0; i < threads; i++) out[i] += 1;
}
static void wl_stub_local_kernel(int *out, int grid, int block, int n) {
  size_t need = (size_t)n * 4 * WL_STUB_RESIDENT;
  if (need > stub_local_held) {
    if (stub_take(need - stub_local_held) != cudaSuccess) return; /* the launch fails */
    stub_local_held = need;
  }
  for (int t = 0; t < grid * block; t++) out[t] = ((t * 7) % n) ^ t;
}
/* For gpu/workloads/compute_spin.cu (issue 18): a kernel "runs" by sleeping its spin time;
 * under the fake preload with CUDA_DEVICE_SM_LIMIT=p (1..99) it takes 100/p times as long
 * (a container held at p % of the device). Graphs record the launches made while capturing. */
typedef struct wl_stub_stream { int capturing; } *cudaStream_t;
typedef struct wl_stub_graph { int n; unsigned long long ns; } *cudaGraph_t, *cudaGraphExec_t;
enum cudaStreamCaptureMode { cudaStreamCaptureModeGlobal = 0 };
enum cudaDeviceAttr { cudaDevAttrMultiProcessorCount = 16 };
static struct wl_stub_graph *stub_capture;
static cudaError_t cudaDeviceGetAttribute(int *v, enum cudaDeviceAttr a, int dev) {
  (void)dev;
  *v = a == cudaDevAttrMultiProcessorCount ? 132 : 0;
  return cudaSuccess;
}
static cudaError_t cudaStreamCreate(cudaStream_t *s) {
  *s = (cudaStream_t)calloc(1, sizeof **s);
  return cudaSuccess;
}
static cudaError_t cudaStreamDestroy(cudaStream_t s) { free(s); return cudaSuccess; }
static cudaError_t cudaStreamSynchronize(cudaStream_t s) { (void)s; return cudaSuccess; }
static cudaError_t cudaStreamBeginCapture(cudaStream_t s, enum cudaStreamCaptureMode m) {
  (void)m;
  s->capturing = 1;
  stub_capture = (struct wl_stub_graph *)calloc(1, sizeof *stub_capture);
  return cudaSuccess;
}
static cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *g) {
  s->capturing = 0;
  *g = stub_capture;
  stub_capture = NULL;
  return cudaSuccess;
}
static double stub_share(void) {
  const char *pre = getenv("LD_PRELOAD"), *sm = getenv("CUDA_DEVICE_SM_LIMIT");
  int p = sm ? atoi(sm) : 0;
  if (pre && strstr(pre, "hami") && !strstr(pre, "blind") && p > 0 && p < 100) return p / 100.0;
  return 1.0;
}
static void stub_sleep_ns(unsigned long long ns) {
  struct timespec ts;
  if (!ns) return;
  ns = (unsigned long long)(ns / stub_share());
  ts.tv_sec = (time_t)(ns / 1000000000ull);
  ts.tv_nsec = (long)(ns % 1000000000ull);
  nanosleep(&ts, NULL);
}
static void wl_stub_spin(int blocks, unsigned long long ns, cudaStream_t s) {
  (void)blocks;
  if (s && s->capturing && stub_capture) {
    stub_capture->n++;
    stub_capture->ns += ns;
    return;
  }
  stub_sleep_ns(ns);
}
static cudaError_t cudaGraphInstantiate(cudaGraphExec_t *e, cudaGraph_t g, unsigned long long f) {
  (void)f;
  *e = g;
  return cudaSuccess;
}
static cudaError_t cudaGraphLaunch(cudaGraphExec_t e, cudaStream_t s) {
  (void)s;
  stub_sleep_ns(e->ns);
  return cudaSuccess;
}
static cudaError_t cudaGraphExecDestroy(cudaGraphExec_t e) { (void)e; return cudaSuccess; }
static cudaError_t cudaGraphDestroy(cudaGraph_t g) { free(g); return cudaSuccess; }
#endif
