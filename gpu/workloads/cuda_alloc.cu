/* cuda_alloc.cu: the CUDA C workload of the acceptance runner (protocol: wlproto.py).
 *
 * Built on the GPU machine twice by run_acceptance.py:
 *   nvcc -O2 -arch=sm_90 -cudart static -DWL_LINKAGE=static cuda_alloc.cu -o cuda_alloc_static
 *   nvcc -O2 -arch=sm_90 -cudart shared -DWL_LINKAGE=shared cuda_alloc.cu -o cuda_alloc_shared
 * Usage: ./cuda_alloc_static meminfo hold enforce
 * Allocates with cudaMalloc (-> cuMemAlloc_v2); "framework figure" = the sum of its own live
 * cudaMalloc sizes. Written in the C subset of CUDA C++ so that gpu/testing/ can compile it
 * with gcc against a stub runtime (no GPU needed) to test the runner's protocol handling.
 */
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#ifndef WL_LINKAGE
#define WL_LINKAGE unknown
#endif
#define WL_STR2(x) #x
#define WL_STR(x) WL_STR2(x)

#define MIB ((size_t)1 << 20)
#define MAX_HELD 256

static void *held[MAX_HELD];
static size_t held_size[MAX_HELD];
static int nheld;
static size_t live_bytes;

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

/* Block until the runner writes a line; exit quietly on EOF. */
static void wait_line(void) {
  char buf[256];
  if (!fgets(buf, sizeof buf, stdin)) {
    printf("EOF\n");
    fflush(stdout);
    exit(3);
  }
}

static void wait_signal(const char *step) {
  printf("READY step=%s\n", step);
  fflush(stdout);
  wait_line();
}

/* cudaMalloc and remember it; returns the CUDA error. */
static cudaError_t wl_alloc(size_t n) {
  void *p = NULL;
  cudaError_t e;
  if (nheld >= MAX_HELD) return cudaErrorInvalidValue;
  e = cudaMalloc(&p, n);
  if (e == cudaSuccess) {
    held[nheld] = p;
    held_size[nheld] = n;
    nheld++;
    live_bytes += n;
  } else {
    (void)cudaGetLastError(); /* clear the (non-sticky) error */
  }
  return e;
}

static void wl_free_all(void) {
  for (int i = 0; i < nheld; i++) cudaFree(held[i]);
  nheld = 0;
  live_bytes = 0;
  cudaDeviceSynchronize();
}

static const char *err_name(cudaError_t e) {
  return e == cudaErrorMemoryAllocation ? "cudaErrorMemoryAllocation" : cudaGetErrorString(e);
}

#ifdef __CUDACC__
__global__ void saxpy(int n, float a, const float *x, float *y) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}
#endif

/* y = 2*x + y with x = 1, y = 3 on 1M floats; checks every element is 5. */
static int compute(void) {
  const int n = 1 << 20;
  float *hx = (float *)malloc(n * sizeof(float)), *hy = (float *)malloc(n * sizeof(float));
  float *dx = NULL, *dy = NULL;
  int ok = 1;
  if (!hx || !hy) return 0;
  for (int i = 0; i < n; i++) {
    hx[i] = 1.0f;
    hy[i] = 3.0f;
  }
  if (cudaMalloc((void **)&dx, n * sizeof(float)) != cudaSuccess ||
      cudaMalloc((void **)&dy, n * sizeof(float)) != cudaSuccess) {
    ok = 0;
  } else {
    cudaMemcpy(dx, hx, n * sizeof(float), cudaMemcpyHostToDevice);
    cudaMemcpy(dy, hy, n * sizeof(float), cudaMemcpyHostToDevice);
#ifdef __CUDACC__
    saxpy<<<(n + 255) / 256, 256>>>(n, 2.0f, dx, dy);
#else
    wl_stub_saxpy(n, 2.0f, dx, dy); /* provided by gpu/testing/stub_cudart.h */
#endif
    if (cudaDeviceSynchronize() != cudaSuccess) ok = 0;
    cudaMemcpy(hy, dy, n * sizeof(float), cudaMemcpyDeviceToHost);
    for (int i = 0; ok && i < n; i++)
      if (hy[i] != 5.0f) ok = 0;
  }
  if (dx) cudaFree(dx);
  if (dy) cudaFree(dy);
  free(hx);
  free(hy);
  return ok;
}

static void emit_compute(void) {
  if (compute())
    printf("COMPUTE_OK\n");
  else
    printf("COMPUTE_FAIL err=%s\n", cudaGetErrorString(cudaGetLastError()));
  fflush(stdout);
}

static int step_meminfo(void) {
  size_t f = 0, t = 0;
  cudaError_t e = cudaMemGetInfo(&f, &t);
  if (e != cudaSuccess) {
    printf("STEP_ERROR step=meminfo err=%s\n", cudaGetErrorString(e));
    return 1;
  }
  printf("MEMINFO free=%zu total=%zu\n", f, t);
  return 0;
}

static int step_compute(void) {
  size_t n = env_mb("WL_HOLD_MB", 1024);
  cudaError_t e = wl_alloc(n);
  if (e != cudaSuccess) {
    printf("STEP_ERROR step=compute err=%s\n", err_name(e));
    return 1;
  }
  printf("ALLOC_OK bytes=%zu\n", n);
  fflush(stdout);
  emit_compute();
  wl_free_all();
  return 0;
}

static int step_hold(void) {
  size_t n = env_mb("WL_HOLD_MB", 1024);
  cudaError_t e;
  wait_signal("hold");
  printf("ALLOC_T0 t=%.6f\n", now());
  fflush(stdout);
  e = wl_alloc(n);
  if (e != cudaSuccess) {
    printf("STEP_ERROR step=hold err=%s\n", err_name(e));
    return 1;
  }
  printf("HOLDING bytes=%zu requested=%zu t=%.6f\n", live_bytes, n, now());
  fflush(stdout);
  wait_line();
  wl_free_all();
  printf("RELEASED\n");
  return 0;
}

static int step_grab(void) {
  size_t n = env_mb("WL_GRAB_MB", 3072);
  cudaError_t e;
  wait_signal("grab");
  e = wl_alloc(n);
  if (e == cudaSuccess)
    printf("GRAB ok=1 bytes=%zu\n", n);
  else if (e == cudaErrorMemoryAllocation)
    printf("GRAB ok=0 kind=%s\n", err_name(e));
  else {
    printf("STEP_ERROR step=grab err=%s\n", err_name(e));
    return 1;
  }
  printf("HOLDING bytes=%zu requested=%zu t=%.6f\n", live_bytes, n, now());
  fflush(stdout);
  wait_line();
  wl_free_all();
  printf("RELEASED\n");
  return 0;
}

static int step_enforce(void) {
  size_t quota = env_mb("WL_QUOTA_MB", 4096), chunk = env_mb("WL_CHUNK_MB", 256);
  size_t granted = 0, limit_chunks = (quota + 2048 * MIB) / chunk;
  int ooms = 0, rc = 0;
  cudaError_t e = wl_alloc(quota + 1024 * MIB);
  if (e == cudaSuccess) {
    printf("BIG_OOM ok=0 kind=none_granted\n");
    wl_free_all();
  } else if (e == cudaErrorMemoryAllocation) {
    printf("BIG_OOM ok=1 kind=%s\n", err_name(e));
    ooms++;
  } else {
    printf("BIG_OOM ok=0 kind=%s\n", err_name(e));
    rc = 1;
  }
  fflush(stdout);
  e = cudaSuccess;
  while ((size_t)nheld < limit_chunks && nheld < MAX_HELD) {
    e = wl_alloc(chunk);
    if (e != cudaSuccess) break;
    granted += chunk;
  }
  printf("FILL granted=%zu oom=%d kind=%s figure=%zu\n", granted, e == cudaErrorMemoryAllocation,
         e == cudaSuccess ? "none" : err_name(e), live_bytes);
  if (e == cudaErrorMemoryAllocation) ooms++;
  wl_free_all();
  printf("FREED figure=%zu\n", live_bytes);
  fflush(stdout);
  e = wl_alloc(1024 * MIB);
  if (e == cudaSuccess) {
    printf("RECOVERED_OK bytes=%zu\n", 1024 * MIB);
    wl_free_all();
  } else {
    printf("RECOVERED_FAIL err=%s\n", err_name(e));
  }
  fflush(stdout);
  emit_compute();
  if (ooms == 2)
    printf("OOM_OK kind=cudaErrorMemoryAllocation\n");
  else
    printf("OOM_MISSING kinds=%d\n", ooms);
  return rc;
}

int main(int argc, char **argv) {
  int rc = 0, rv = 0, dv = 0;
  double t0 = now();
  cudaError_t e;
  setvbuf(stdout, NULL, _IOLBF, 0);
  printf("PID pid=%d\n", (int)getpid());
  e = cudaFree(0); /* create the context */
  if (e != cudaSuccess) {
    printf("STEP_ERROR step=init err=%s\nDONE rc=2\n", cudaGetErrorString(e));
    return 2;
  }
  cudaRuntimeGetVersion(&rv);
  cudaDriverGetVersion(&dv);
  printf("FRAMEWORK name=cudart linkage=%s runtime=%d driver=%d\n", WL_STR(WL_LINKAGE), rv, dv);
  printf("INIT_OK seconds=%.2f\n", now() - t0);
  for (int i = 1; i < argc; i++) {
    int r;
    if (!strcmp(argv[i], "meminfo"))
      r = step_meminfo();
    else if (!strcmp(argv[i], "compute"))
      r = step_compute();
    else if (!strcmp(argv[i], "hold"))
      r = step_hold();
    else if (!strcmp(argv[i], "grab"))
      r = step_grab();
    else if (!strcmp(argv[i], "enforce"))
      r = step_enforce();
    else {
      printf("STEP_ERROR step=%s err=unknown_step\n", argv[i]);
      r = 2;
    }
    fflush(stdout);
    if (r) rc = r;
  }
  printf("DONE rc=%d\n", rc);
  return rc;
}
