/* library_two_devices.cu: one program's kernel (and its 1536 MiB `__device__` array) used on
 * two GPUs. The CUDA runtime loads the program's code as a context-independent library; the
 * driver loads it into each device's context at its first launch there, each copy with its
 * own array. Under the preload both devices' quotas must be charged.
 *   nvcc -O2 -arch=sm_90 -cudart shared library_two_devices.cu -o library_two_devices
 * Output, per device d (0, then 1):
 *   DEV d INIT rc= | DEV d BEFORE free= total= | DEV d LAUNCH rc= ok= | DEV d AFTER free= total=
 *   DEV d NEXT rc=   (cudaMalloc of WL_PROBE_MB, 256, while the array is resident; freed)
 * then `SMI <nvidia-smi compute-apps line>` for this process, and DONE.
 */
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#define MIB ((size_t)1 << 20)
#define GLOBAL_BYTES ((size_t)1536 * MIB)

__device__ char wl_global[GLOBAL_BYTES];

__global__ void touch_global(int *out) {
  int sum = 0;
  for (size_t i = (size_t)threadIdx.x * 65536; i < GLOBAL_BYTES; i += (size_t)blockDim.x * 65536) {
    wl_global[i] = 1;
    sum += wl_global[i];
  }
  atomicAdd(out, sum);
}

int main(void) {
  const char *pv = getenv("WL_PROBE_MB");
  size_t probe = (size_t)(pv && *pv ? strtoull(pv, NULL, 10) : 256) * MIB;
  for (int d = 0; d < 2; d++) {
    cudaError_t e = cudaSetDevice(d);
    if (!e) e = cudaFree(0);
    printf("DEV %d INIT rc=%d\n", d, (int)e);
    size_t f = 0, t = 0;
    cudaMemGetInfo(&f, &t);
    printf("DEV %d BEFORE free=%zu total=%zu\n", d, f, t);
    int *out = NULL, host = 0;
    e = cudaMalloc(&out, sizeof(int));
    if (!e) e = cudaMemset(out, 0, sizeof(int));
    if (!e) { touch_global<<<1, 256>>>(out); e = cudaGetLastError(); }
    if (!e) e = cudaDeviceSynchronize();
    if (!e) e = cudaMemcpy(&host, out, sizeof host, cudaMemcpyDeviceToHost);
    printf("DEV %d LAUNCH rc=%d ok=%d\n", d, (int)e, host > 0);
    cudaMemGetInfo(&f, &t);
    printf("DEV %d AFTER free=%zu total=%zu\n", d, f, t);
    void *p = NULL;
    e = cudaMalloc(&p, probe);
    printf("DEV %d NEXT rc=%d\n", d, (int)e);
    if (!e) cudaFree(p);
    cudaGetLastError();
  }
  fflush(stdout);
  char cmd[160];
  snprintf(cmd, sizeof cmd,
           "nvidia-smi --query-compute-apps=pid,gpu_bus_id,used_memory --format=csv,noheader | grep '^%d,' | sed 's/^/SMI /'",
           (int)getpid());
  if (system(cmd) != 0) printf("SMI none\n");
  printf("DONE\n");
  return 0;
}
