// What the driver takes for the printf FIFO (issue 31): the process's device memory (the
// driver's per-process figure, nvidia-smi) after the context, after cudaDeviceSetLimit(
// cudaLimitPrintfFifoSize, N), after a launch of a kernel without printf, and after a launch
// of one with printf; N from argv[1] in MiB (0: the default FIFO, no set call).
// Build: nvcc -O2 -o printf_fifo printf_fifo.cu; run: ./printf_fifo 1024
#include <cstdio>
#include <cstdlib>
#include <unistd.h>

__global__ void plain(int *p) {
  if (p) *p = 1;
}
__global__ void says(int v) {
  if (threadIdx.x == 0 && blockIdx.x == 0) printf("PRINTF v=%d\n", v);
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

int main(int argc, char **argv) {
  size_t mib = argc > 1 ? strtoull(argv[1], 0, 10) : 0;
  cudaFree(0);
  printf("STEP ctx used_mib=%ld\n", used_mib());
  if (mib) {
    cudaError_t e = cudaDeviceSetLimit(cudaLimitPrintfFifoSize, mib << 20);
    size_t got = 0;
    cudaDeviceGetLimit(&got, cudaLimitPrintfFifoSize);
    printf("STEP set fifo_mib=%zu rc=%d name=%s limit=%zu used_mib=%ld\n", mib, (int)e,
           cudaGetErrorName(e), got, used_mib());
  } else {
    size_t got = 0;
    cudaDeviceGetLimit(&got, cudaLimitPrintfFifoSize);
    printf("STEP default limit=%zu used_mib=%ld\n", got, used_mib());
  }
  plain<<<1, 1>>>(0);
  cudaError_t e = cudaDeviceSynchronize();
  printf("STEP plain rc=%d used_mib=%ld\n", (int)e, used_mib());
  says<<<1, 1>>>(7);
  e = cudaDeviceSynchronize();
  fflush(stdout);
  printf("STEP printf rc=%d name=%s used_mib=%ld\n", (int)e, cudaGetErrorName(e), used_mib());
  says<<<1, 1>>>(8);
  e = cudaDeviceSynchronize();
  printf("STEP printf2 rc=%d used_mib=%ld\n", (int)e, used_mib());
  return 0;
}
