/* limits_probe.cu: device memory that the driver takes for a context's limits and a kernel's
 * local memory, for the "physical2" group of the acceptance runner (issue 17; protocol:
 * wlproto.py, stage lines as module_global.cu).
 *
 * Built on the GPU machine by run_acceptance.py:
 *   nvcc -O2 -arch=sm_90 -cudart static limits_probe.cu -o limits_probe
 * Usage: ./limits_probe heap|stack|local     (one run, the steps below in order)
 *   INIT rc= name=            cudaFree(0): the context
 *   PRE rc= name=             control: cudaMalloc WL_PROBE_MB (256) fits (freed again)
 *   OUTBUF rc= name=          the kernels' output buffer (WL_LOCAL_GRID x WL_LOCAL_BLOCK ints)
 *   LIMIT_BEFORE value=       cudaDeviceGetLimit of the mode's limit (heap, stack)
 *   READY step=<mode>         waits for a stdin line
 *   SETLIMIT rc= name= value= heap: cudaDeviceSetLimit(cudaLimitMallocHeapSize, WL_HEAP_MB=2048 MiB)
 *                             stack: cudaDeviceSetLimit(cudaLimitStackSize, WL_STACK_KB=8 KiB)
 *   LIMIT_AFTER value=        cudaDeviceGetLimit again
 *   FUNCATTR local_bytes=     local: cudaFuncGetAttributes of the 24 KiB local-array kernel
 *   LAUNCH rc= name=          heap: a kernel whose 32 threads malloc 64 KiB each;
 *                             stack: a small kernel (1 x 32 threads);
 *                             local: the 24 KiB local-array kernel, WL_LOCAL_GRID (132) x
 *                             WL_LOCAL_BLOCK (256) threads; rc from cudaGetLastError
 *   SYNC rc= name=            cudaDeviceSynchronize
 *   RESULT ok=0|1             the kernel's output read back and checked
 *   AFTER rc= name= ok=0|1    the program goes on: cudaMalloc 64 MiB, memset, a small kernel on
 *                             the output buffer, read back (rc of the first call that failed)
 *   HOLDING bytes=            waits for a stdin line (the runner reads nvidia-smi here)
 *   RELEASED, DONE rc=
 * rc is the cudaError_t as a number, name its cudaGetErrorName. A failed call's error is
 * cleared (cudaGetLastError) before the next stage, so each stage reports its own.
 * The kernels go through macros so that gpu/testing/ can compile this with gcc against a stub
 * runtime (no GPU needed).
 */
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MIB ((size_t)1 << 20)
#define LOCAL_BYTES (24 * 1024)
#define LOCAL_INTS (LOCAL_BYTES / 4)
#define HEAP_THREADS 32
#define HEAP_EACH ((size_t)64 * 1024)

#ifdef __CUDACC__
/* Every thread mallocs `each` bytes from the device heap, writes both ends, frees it. */
__global__ void heap_kernel(int *out, size_t each) {
  char *p = (char *)malloc(each);
  if (p) {
    p[0] = 1;
    p[each - 1] = 2;
    out[threadIdx.x] = p[0] + p[each - 1];
    free(p);
  } else {
    out[threadIdx.x] = -1;
  }
}
/* A small kernel: adds one to the first blockDim.x ints. */
__global__ void add_one(int *out) { out[threadIdx.x] += 1; }
/* A 24 KiB local array per thread (volatile: it stays in local memory). */
__global__ void local_kernel(int *out, int n) {
  volatile int buf[LOCAL_INTS];
  int t = blockIdx.x * blockDim.x + threadIdx.x;
  for (int i = 0; i < n; i++) buf[i] = i ^ t;
  out[t] = buf[(t * 7) % n];
}
#define L_HEAP(out) heap_kernel<<<1, HEAP_THREADS>>>((out), HEAP_EACH)
#define L_SMALL(out) add_one<<<1, 32>>>((out))
#define L_LOCAL(out, grid, block) local_kernel<<<(grid), (block)>>>((out), LOCAL_INTS)
#define L_LOCAL_ATTR(attr) cudaFuncGetAttributes((attr), local_kernel)
#else
#define L_HEAP(out) wl_stub_heap_kernel((out), HEAP_THREADS, HEAP_EACH)
#define L_SMALL(out) wl_stub_add_one((out), 32)
#define L_LOCAL(out, grid, block) wl_stub_local_kernel((out), (grid), (block), LOCAL_INTS)
#define L_LOCAL_ATTR(attr) wl_stub_local_attr((attr), LOCAL_BYTES)
#endif

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static size_t env_num(const char *name, size_t dflt) {
  const char *v = getenv(name);
  if (!v || !*v) return dflt;
  return (size_t)strtoull(v, NULL, 10);
}

static int wait_line(void) {
  char buf[256];
  return fgets(buf, sizeof buf, stdin) != NULL;
}

static void report(const char *tag, cudaError_t e) {
  printf("%s rc=%d name=%s\n", tag, (int)e, cudaGetErrorName(e));
  fflush(stdout);
}

/* The program goes on with what it has: 64 MiB more, and a small kernel on `out`. */
static void after(int *out) {
  void *q = NULL;
  int host[32], ok = 1;
  cudaError_t e = cudaMalloc(&q, 64 * MIB);
  if (e == cudaSuccess) e = cudaMemset(q, 0, 64 * MIB);
  if (e == cudaSuccess && out) e = cudaMemset(out, 0, sizeof host);
  if (e == cudaSuccess && out) {
    L_SMALL(out);
    e = cudaGetLastError();
  }
  if (e == cudaSuccess) e = cudaDeviceSynchronize();
  if (e == cudaSuccess && out) e = cudaMemcpy(host, out, sizeof host, cudaMemcpyDeviceToHost);
  if (e == cudaSuccess && out) {
    for (int i = 0; i < 32; i++) ok &= host[i] == 1;
  } else {
    ok = 0;
  }
  if (e != cudaSuccess) (void)cudaGetLastError();
  if (q) cudaFree(q);
  printf("AFTER rc=%d name=%s ok=%d\n", (int)e, cudaGetErrorName(e), ok);
  fflush(stdout);
}

int main(int argc, char **argv) {
  const char *mode = argc > 1 ? argv[1] : "";
  size_t probe = env_num("WL_PROBE_MB", 256) * MIB;
  size_t heap = env_num("WL_HEAP_MB", 2048) * MIB;
  size_t stack = env_num("WL_STACK_KB", 8) * 1024;
  int grid = (int)env_num("WL_LOCAL_GRID", 132), block = (int)env_num("WL_LOCAL_BLOCK", 256);
  size_t n_out = (size_t)grid * (size_t)block;
  enum cudaLimit limit = cudaLimitMallocHeapSize;
  size_t value = 0, got = 0;
  int *out = NULL, *host = NULL, ok = 0;
  void *p = NULL;
  cudaError_t e, launch;

  setvbuf(stdout, NULL, _IOLBF, 0);
  printf("PID pid=%d\n", (int)getpid());
  if (strcmp(mode, "heap") && strcmp(mode, "stack") && strcmp(mode, "local")) {
    printf("STEP_ERROR step=args err=usage:_limits_probe_heap|stack|local\nDONE rc=2\n");
    return 2;
  }
  if (!strcmp(mode, "heap")) value = heap;
  if (!strcmp(mode, "stack")) {
    limit = cudaLimitStackSize;
    value = stack;
  }
  if (n_out < 32) n_out = 32;
  printf("FRAMEWORK name=cudart mode=%s value=%zu grid=%d block=%d\n", mode, value, grid, block);
  e = cudaFree(0);
  report("INIT", e);
  if (e != cudaSuccess) {
    printf("DONE rc=2\n");
    return 2;
  }
  e = cudaMalloc(&p, probe);
  report("PRE", e);
  if (e == cudaSuccess) cudaFree(p);
  else (void)cudaGetLastError();
  e = cudaMalloc((void **)&out, n_out * sizeof(int));
  if (e == cudaSuccess) e = cudaMemset(out, 0, n_out * sizeof(int));
  report("OUTBUF", e);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    out = NULL;
  }
  if (strcmp(mode, "local")) {
    got = 0;
    cudaDeviceGetLimit(&got, limit);
    printf("LIMIT_BEFORE value=%zu\n", got);
  }

  printf("READY step=%s\n", mode);
  fflush(stdout);
  if (!wait_line()) {
    printf("EOF step=%s\n", mode);
    return 3;
  }
  printf("ALLOC_T0 t=%.6f\n", now());
  if (strcmp(mode, "local")) {
    e = cudaDeviceSetLimit(limit, value);
    got = 0;
    printf("SETLIMIT rc=%d name=%s value=%zu\n", (int)e, cudaGetErrorName(e), value);
    (void)cudaGetLastError();
    cudaDeviceGetLimit(&got, limit);
    (void)cudaGetLastError();
    printf("LIMIT_AFTER value=%zu\n", got);
  } else {
    struct cudaFuncAttributes attr;
    memset(&attr, 0, sizeof attr);
    e = L_LOCAL_ATTR(&attr);
    (void)cudaGetLastError();
    printf("FUNCATTR rc=%d local_bytes=%zu\n", (int)e, (size_t)attr.localSizeBytes);
  }
  fflush(stdout);
  if (out) {
    if (!strcmp(mode, "heap")) L_HEAP(out);
    else if (!strcmp(mode, "stack")) L_SMALL(out);
    else L_LOCAL(out, grid, block);
    launch = cudaGetLastError();
  } else {
    launch = cudaErrorInvalidValue; /* no output buffer: the launch was not attempted */
  }
  report("LAUNCH", launch);
  e = cudaDeviceSynchronize();
  report("SYNC", e);
  if (e != cudaSuccess) (void)cudaGetLastError();
  host = (int *)calloc(n_out, sizeof(int));
  if (launch == cudaSuccess && e == cudaSuccess && host &&
      cudaMemcpy(host, out, n_out * sizeof(int), cudaMemcpyDeviceToHost) == cudaSuccess) {
    ok = 1;
    if (!strcmp(mode, "heap")) {
      for (int i = 0; i < HEAP_THREADS; i++) ok &= host[i] == 3;
    } else if (!strcmp(mode, "stack")) {
      for (int i = 0; i < 32; i++) ok &= host[i] == 1;
    } else {
      for (size_t t = 0; t < (size_t)grid * (size_t)block; t++)
        ok &= host[t] == (int)((((int)t * 7) % LOCAL_INTS) ^ (int)t);
    }
  }
  (void)cudaGetLastError();
  printf("RESULT ok=%d\n", ok);
  fflush(stdout);
  after(out);
  printf("HOLDING bytes=%zu t=%.6f\n", n_out * sizeof(int), now());
  fflush(stdout);
  wait_line();
  free(host);
  if (out) cudaFree(out);
  printf("RELEASED\nDONE rc=0\n");
  return 0;
}
