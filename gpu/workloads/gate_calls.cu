// The driver calls the launch gate makes around a submission, timed one by one on the GPU
// (issue 30: the gate's cost per launch): ns per call, median of 7 rounds of N calls, for
//   launch     an empty kernel, back to back (the control: what the gate adds to)
//   record     cuEventRecord on a stream with nothing queued
//   record_q   cuEventRecord behind queued work (a 1 ms kernel running)
//   query      cuEventQuery of a completed event
//   query_p    cuEventQuery of an event not reached yet
//   elapsed    cuEventElapsedTime of two completed events
//   capturing  cuStreamIsCapturing
//   getctx     cuCtxGetCurrent (nearly free: the machine's noise)
// Build: nvcc -O2 -o gate_calls gate_calls.cu -lcuda; run: ./gate_calls [N]
#include <cuda.h>
#include <cuda_runtime.h>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <ctime>

__global__ void empty() {}
__global__ void spin(unsigned long long ns) {
  unsigned long long t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  } while (t - t0 < ns);
}

static double now() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e9 + ts.tv_nsec;
}

template <class F> static void timeit(const char *op, int n, F f) {
  double r[7];
  for (int k = 0; k < 8; k++) {
    double t0 = now();
    for (int i = 0; i < n; i++) f(i);
    double d = (now() - t0) / n;
    if (k) r[k - 1] = d;
  }
  std::sort(r, r + 7);
  printf("COST op=%s ns_median=%.0f ns_min=%.0f\n", op, r[3], r[0]);
  fflush(stdout);
}

int main(int argc, char **argv) {
  int n = argc > 1 ? atoi(argv[1]) : 20000;
  cudaFree(0);
  cudaStream_t s;
  cudaStreamCreate(&s);
  CUstream cs = (CUstream)s;
  const int E = 64;
  CUevent ev[E];
  for (int i = 0; i < E; i++) cuEventCreate(&ev[i], CU_EVENT_DEFAULT);
  timeit("launch", n, [&](int) { empty<<<1, 1, 0, s>>>(); });
  cudaStreamSynchronize(s);
  timeit("record", n, [&](int i) {
    cuEventRecord(ev[i % E], cs);
    if (i % E == E - 1) cuStreamSynchronize(cs);
  });
  cudaStreamSynchronize(s);
  // Behind a kernel that runs longer than the loop (7 rounds x N records).
  spin<<<1, 1, 0, s>>>((unsigned long long)n * 8 * 3000ull);
  timeit("record_q", n, [&](int i) { cuEventRecord(ev[i % E], cs); });
  cudaStreamSynchronize(s);
  for (int i = 0; i < E; i++) cuEventRecord(ev[i], cs);
  cudaStreamSynchronize(s);
  timeit("query", n, [&](int i) { cuEventQuery(ev[i % E]); });
  float ms;
  timeit("elapsed", n, [&](int i) { cuEventElapsedTime(&ms, ev[i % E], ev[(i + 1) % E]); });
  spin<<<1, 1, 0, s>>>((unsigned long long)n * 8 * 1000ull);
  cuEventRecord(ev[0], cs);
  timeit("query_p", n, [&](int) { cuEventQuery(ev[0]); });
  cudaStreamSynchronize(s);
  CUstreamCaptureStatus st;
  timeit("capturing", n, [&](int) { cuStreamIsCapturing(cs, &st); });
  CUcontext c;
  timeit("getctx", n, [&](int) { cuCtxGetCurrent(&c); });
  return 0;
}
