/* context_limits.cu: device memory that a context's limits take (issue 17, first rows), for a
 * GPU check of the preload's cuCtxSetLimit hook and its launch-time local-memory admission.
 * Not wired into run_acceptance.py yet: run it by hand, natively and under the preload, with
 * `nvidia-smi --query-compute-apps=pid,used_memory --format=csv` while it holds.
 *
 * Build on the GPU machine:
 *   nvcc -O2 -arch=sm_90 -cudart static context_limits.cu -o context_limits
 * Usage: ./context_limits heap|stack|local
 *   heap   cudaDeviceSetLimit(cudaLimitMallocHeapSize, WL_HEAP_MB (2048) MiB), then a kernel
 *          that calls malloc (the H200 took +2050 MiB at that launch)
 *   stack  cudaDeviceSetLimit(cudaLimitStackSize, 8192), then a small kernel (+1848 MiB at
 *          the set call)
 *   local  one launch of a kernel with a 24 KiB local array, 132 x 256 threads (+6072 MiB at
 *          the launch)
 * Prints, one line each (rc = cudaError_t as a number, name = cudaGetErrorName):
 *   INIT rc= name=       cudaFree(0): the context
 *   PRE rc= name=        control: cudaMalloc WL_PROBE_MB (256) fits before the step (freed)
 *   SETLIMIT rc= name=   (heap, stack) cudaDeviceSetLimit
 *   LIMIT value=         cudaDeviceGetLimit of the step's limit afterwards
 *   LAUNCH rc= name=     cudaGetLastError after the launch
 *   SYNC rc= name=       cudaDeviceSynchronize
 *   NEXT rc= name=       cudaMalloc WL_PROBE_MB after the step (kept)
 *   HOLDING              waits for a line on stdin
 *   DONE
 * Under a 1 GiB quota the preload is expected to refuse the step with out-of-memory
 * (cudaErrorMemoryAllocation: SETLIMIT for heap and stack, LAUNCH for local), NEXT to succeed,
 * and the process to stay within the quota in nvidia-smi.
 */
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MIB ((size_t)1 << 20)
#define LOCAL_BYTES (24 * 1024)

static size_t env_mb(const char *name, size_t dflt) {
  const char *v = getenv(name);
  if (!v || !*v) return dflt * MIB;
  return (size_t)strtoull(v, NULL, 10) * MIB;
}

static void report(const char *tag, cudaError_t e) {
  printf("%s rc=%d name=%s\n", tag, (int)e, cudaGetErrorName(e));
  fflush(stdout);
}

/* Calls device malloc (so the heap is used), writes and frees. */
__global__ void use_heap(int *out) {
  char *p = (char *)malloc(1024);
  if (p) {
    p[threadIdx.x % 1024] = 1;
    atomicAdd(out, (int)p[threadIdx.x % 1024]);
    free(p);
  }
}

__global__ void small_kernel(int *out) { atomicAdd(out, 1); }

/* A 24 KiB local array indexed by a run-time value: it cannot live in registers. */
__global__ void big_local(int *out, int k) {
  volatile char buf[LOCAL_BYTES];
  for (int i = 0; i < LOCAL_BYTES; i += 64) buf[i] = (char)(i + k);
  atomicAdd(out, (int)buf[(threadIdx.x * 64 + k) % LOCAL_BYTES]);
}

int main(int argc, char **argv) {
  const char *mode = argc > 1 ? argv[1] : "";
  if (strcmp(mode, "heap") && strcmp(mode, "stack") && strcmp(mode, "local")) {
    fprintf(stderr, "usage: %s heap|stack|local\n", argv[0]);
    return 2;
  }
  size_t probe = env_mb("WL_PROBE_MB", 256);
  void *p = NULL;
  int *out = NULL;
  report("INIT", cudaFree(0));
  cudaError_t e = cudaMalloc(&p, probe);
  report("PRE", e);
  if (e == cudaSuccess) cudaFree(p);
  e = cudaMalloc((void **)&out, sizeof(int));
  if (e != cudaSuccess) { report("OUTBUF", e); return 1; }
  cudaMemset(out, 0, sizeof(int));
  size_t value = 0;
  if (!strcmp(mode, "heap")) {
    report("SETLIMIT", cudaDeviceSetLimit(cudaLimitMallocHeapSize, env_mb("WL_HEAP_MB", 2048)));
    cudaDeviceGetLimit(&value, cudaLimitMallocHeapSize);
    printf("LIMIT value=%zu\n", value);
    use_heap<<<132, 256>>>(out);
  } else if (!strcmp(mode, "stack")) {
    report("SETLIMIT", cudaDeviceSetLimit(cudaLimitStackSize, 8192));
    cudaDeviceGetLimit(&value, cudaLimitStackSize);
    printf("LIMIT value=%zu\n", value);
    small_kernel<<<1, 32>>>(out);
  } else {
    big_local<<<132, 256>>>(out, argc > 2 ? atoi(argv[2]) : 1);
  }
  report("LAUNCH", cudaGetLastError());
  report("SYNC", cudaDeviceSynchronize());
  if (!strcmp(mode, "local")) {
    cudaDeviceGetLimit(&value, cudaLimitStackSize);
    printf("LIMIT value=%zu\n", value);
  }
  p = NULL;
  report("NEXT", cudaMalloc(&p, probe));
  printf("HOLDING\n");
  fflush(stdout);
  char buf[64];
  if (!fgets(buf, sizeof buf, stdin)) { /* EOF: done */ }
  printf("DONE\n");
  return 0;
}
