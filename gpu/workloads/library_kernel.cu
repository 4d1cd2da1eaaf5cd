/* library_kernel.cu: the cubin of library_two_contexts.c (a 1536 MiB `__device__` array and
 * the kernel that touches it). nvcc -cubin -arch=sm_90 -o lib.cubin library_kernel.cu */
#define GLOBAL_BYTES ((size_t)1536 << 20)
__device__ char wl_global[GLOBAL_BYTES];
extern "C" __global__ void touch_global(int *out) {
  int sum = 0;
  for (size_t i = (size_t)threadIdx.x * 65536; i < GLOBAL_BYTES; i += (size_t)blockDim.x * 65536) {
    wl_global[i] = 1;
    sum += wl_global[i];
  }
  atomicAdd(out, sum);
}
