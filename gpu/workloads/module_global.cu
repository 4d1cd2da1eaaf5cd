/* module_global.cu: device memory that arrives with a module, for the "physical" group of the
 * acceptance runner (issue 8; protocol: wlproto.py).
 *
 * A `__device__` array of WL_GLOBAL_MB (1536) MiB lives in this program's module. With CUDA's
 * default lazy loading the module (and the array) is loaded at the first launch of one of its
 * kernels; with CUDA_MODULE_LOADING=EAGER when the context is created (gpu-facts.md).
 * Built on the GPU machine by run_acceptance.py:
 *   nvcc -O2 -arch=sm_90 -cudart static module_global.cu -o module_global
 * Usage: ./module_global            (one run, the steps below in order)
 *   INIT rc= name=       cudaFree(0): the context (and, eager, the module)
 *   PRE rc= name=        control: cudaMalloc WL_PROBE_MB (256) fits before the launch (freed)
 *   READY step=launch    waits for a stdin line
 *   LAUNCH rc= name=     first launch of a kernel that writes the array (lazy: module load)
 *   SYNC rc= name=       cudaDeviceSynchronize
 *   RESULT ok=0|1        the kernel's write to the array was read back
 *   NEXT rc= name=       cudaMalloc WL_PROBE_MB while the module is loaded
 *   HOLDING bytes=       waits for a stdin line
 *   RELEASED, DONE rc=
 * rc is the cudaError_t as a number, name its cudaGetErrorName.
 * The launch goes through a macro so that gpu/testing/ can compile this with gcc against a
 * stub runtime (no GPU needed).
 */
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#ifndef WL_GLOBAL_MB
#define WL_GLOBAL_MB 1536
#endif
#define MIB ((size_t)1 << 20)
#define GLOBAL_BYTES ((size_t)WL_GLOBAL_MB * MIB)

__device__ char wl_global[GLOBAL_BYTES];

#ifdef __CUDACC__
/* Writes one byte every 64 KiB of the array and sums them back, so the array cannot be
 * optimised away and its pages are touched. */
__global__ void touch_global(int *out, int stride) {
  size_t i = (size_t)threadIdx.x * (size_t)stride;
  int sum = 0;
  for (; i < GLOBAL_BYTES; i += (size_t)blockDim.x * (size_t)stride) {
    wl_global[i] = 1;
    sum += wl_global[i];
  }
  atomicAdd(out, sum);
}
#define WL_LAUNCH_TOUCH(out, stride) touch_global<<<1, 256>>>((out), (stride))
#else
#define WL_LAUNCH_TOUCH(out, stride) wl_stub_touch_global(wl_global, GLOBAL_BYTES, (out), (stride))
#endif

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static size_t env_mb(const char *name, size_t dflt) {
  const char *v = getenv(name);
  if (!v || !*v) return dflt * MIB;
  return (size_t)strtoull(v, NULL, 10) * MIB;
}

static int wait_line(void) {
  char buf[256];
  return fgets(buf, sizeof buf, stdin) != NULL;
}

static void report(const char *tag, cudaError_t e) {
  printf("%s rc=%d name=%s\n", tag, (int)e, cudaGetErrorName(e));
  fflush(stdout);
}

int main(void) {
  size_t probe = env_mb("WL_PROBE_MB", 256);
  const int stride = 64 * 1024;
  int *out = NULL, host = 0, expect = 0;
  void *p = NULL, *next = NULL;
  cudaError_t e, launch;
  const char *loading = getenv("CUDA_MODULE_LOADING");

  setvbuf(stdout, NULL, _IOLBF, 0);
  printf("PID pid=%d\n", (int)getpid());
  printf("FRAMEWORK name=cudart global_mb=%d loading=%s\n", WL_GLOBAL_MB,
         loading && *loading ? loading : "default");
  e = cudaFree(0);
  report("INIT", e);
  e = cudaMalloc(&p, probe);
  report("PRE", e);
  if (e == cudaSuccess) cudaFree(p);
  else (void)cudaGetLastError();
  e = cudaMalloc((void **)&out, sizeof(int));
  if (e == cudaSuccess) e = cudaMemset(out, 0, sizeof(int));
  report("OUTBUF", e);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    out = NULL;
  }

  printf("READY step=launch\n");
  fflush(stdout);
  if (!wait_line()) {
    printf("EOF step=launch\n");
    return 3;
  }
  printf("ALLOC_T0 t=%.6f\n", now());
  fflush(stdout);
  if (out) {
    WL_LAUNCH_TOUCH(out, stride);
    launch = cudaGetLastError();
  } else {
    launch = cudaErrorInvalidValue; /* no output buffer: the launch was not attempted */
  }
  report("LAUNCH", launch);
  e = cudaDeviceSynchronize();
  report("SYNC", e);
  if (launch == cudaSuccess && e == cudaSuccess &&
      cudaMemcpy(&host, out, sizeof(int), cudaMemcpyDeviceToHost) == cudaSuccess) {
    expect = (int)((GLOBAL_BYTES + stride - 1) / stride);
    printf("RESULT ok=%d sum=%d expect=%d\n", host == expect, host, expect);
  } else {
    printf("RESULT ok=0 sum=-1 expect=-1\n");
  }
  (void)cudaGetLastError();
  e = cudaMalloc(&next, probe);
  report("NEXT", e);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    next = NULL;
  }
  printf("HOLDING bytes=%zu t=%.6f\n", (launch == cudaSuccess ? GLOBAL_BYTES : 0) +
                                          (next ? probe : 0), now());
  fflush(stdout);
  wait_line();
  if (next) cudaFree(next);
  if (out) cudaFree(out);
  printf("RELEASED\nDONE rc=0\n");
  return 0;
}
