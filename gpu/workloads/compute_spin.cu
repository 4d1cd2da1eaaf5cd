/* compute_spin.cu: compute-share workload for the "compute" group of the acceptance runner
 * (issue 18; protocol: wlproto.py).
 *
 * Built on the GPU machine by run_acceptance.py:
 *   nvcc -O2 -arch=sm_90 -cudart static compute_spin.cu -o compute_spin
 * Usage: ./compute_spin spin|graph|launch|streams|latency
 *   spin    a kernel of WL_SPIN_BLOCKS_PER_SM (4) x <multiprocessor count> blocks of 128 threads
 *           that spins on %globaltimer for WL_SPIN_US (1000) us, so that every SM is busy for
 *           about 1 ms; launched back to back for WL_SECONDS (3) s, with a stream
 *           synchronisation every WL_SYNC_EVERY (4) launches (the queue stays short);
 *   graph   a CUDA graph captured (cudaStreamBeginCapture) around WL_GRAPH_KERNELS (4) spin
 *           kernels of WL_SPIN_US / WL_GRAPH_KERNELS us each, replayed with cudaGraphLaunch in
 *           the same loop;
 *   launch  an empty kernel (1 x 1), WL_ROUNDS (5) rounds of WL_LAUNCHES (20000) launches, each
 *           round timed from its first launch to the synchronisation after its last;
 *   streams WL_STREAMS (4) streams, each kernel WL_STREAM_BLOCKS_PER_SM (1) x <multiprocessor
 *           count> blocks spinning WL_SPIN_US, launched round-robin on them (natively they run
 *           side by side), all synchronised every WL_SYNC_EVERY rounds (issue 30);
 *   latency an inference-like loop: requests of one kernel (1 block per SM) spinning
 *           WL_REQ_US (200) us, each followed by a stream synchronisation, for WL_SECONDS;
 *           the host-measured latency of each request after the first WL_LAT_SKIP_S (0) s
 *           (issue 30).
 * Lines:
 *   PID pid=, FRAMEWORK name=cudart mode= sms= blocks= threads= spin_us=
 *   MEMINFO free= total=      cudaMemGetInfo (a side-by-side preload shows its limit here)
 *   INIT rc= name=            cudaFree(0), stream, (graph: capture and instantiate)
 *   WARM rc= name=            a few launches and a synchronisation (module loaded, clocks up)
 *   READY step=<mode>         waits for a stdin line (the runner starts processes together)
 *   ROUND i= us=              launch: microseconds per launch in round i
 *   RESULT rc= name= kernels= seconds= kps= t0= t1=    spin/graph: kernels (graphs) completed,
 *                             wall seconds from the first launch to the last synchronisation,
 *                             their ratio, and the wall-clock start/end (CLOCK_REALTIME)
 *   RESULT rc= name= launches= us_median= us_min=      launch
 *   SECOND i= kernels=        spin/streams/latency: kernels completed in second i of the run
 *   RESULT rc= name= kernels= seconds= kps= p50_ms= p99_ms= max_ms= t0= t1=   latency
 *   DONE rc=
 * The kernels go through macros so that gpu/testing/ can compile this with gcc against a stub
 * runtime (no GPU needed).
 */
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define THREADS 128

#ifdef __CUDACC__
/* Spins until `ns` nanoseconds of %globaltimer have passed since the thread started. */
__global__ void spin_kernel(unsigned long long ns) {
  unsigned long long t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  } while (t - t0 < ns);
}
__global__ void empty_kernel(void) {}
#define L_SPIN(blocks, ns, s) spin_kernel<<<(blocks), THREADS, 0, (s)>>>((ns))
#define L_EMPTY(s) empty_kernel<<<1, 1, 0, (s)>>>()
#else
#define L_SPIN(blocks, ns, s) wl_stub_spin((blocks), (ns), (s))
#define L_EMPTY(s) wl_stub_spin(1, 0, (s))
#endif

static double mono(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static double wall(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static double env_f(const char *name, double dflt) {
  const char *v = getenv(name);
  if (!v || !*v) return dflt;
  return strtod(v, NULL);
}

static int wait_line(void) {
  char buf[256];
  return fgets(buf, sizeof buf, stdin) != NULL;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
  const char *mode = argc > 1 ? argv[1] : "";
  double seconds = env_f("WL_SECONDS", 3.0);
  unsigned long long spin_ns = (unsigned long long)(env_f("WL_SPIN_US", 1000.0) * 1000.0);
  int per_sm = (int)env_f("WL_SPIN_BLOCKS_PER_SM", 4);
  int sync_every = (int)env_f("WL_SYNC_EVERY", 4);
  int graph_kernels = (int)env_f("WL_GRAPH_KERNELS", 4);
  int rounds = (int)env_f("WL_ROUNDS", 5);
  long launches = (long)env_f("WL_LAUNCHES", 20000);
  int sms = 0, blocks;
  size_t free_b = 0, total_b = 0;
  cudaStream_t s = NULL;
  cudaGraph_t graph = NULL;
  cudaGraphExec_t exec = NULL;
  cudaError_t e;
  int graph_mode = !strcmp(mode, "graph");
  int streams_mode = !strcmp(mode, "streams"), latency_mode = !strcmp(mode, "latency");
  int nstreams = (int)env_f("WL_STREAMS", 4);
  int stream_per_sm = (int)env_f("WL_STREAM_BLOCKS_PER_SM", 1);
  unsigned long long req_ns = (unsigned long long)(env_f("WL_REQ_US", 200.0) * 1000.0);
  cudaStream_t ss[16];

  setvbuf(stdout, NULL, _IOLBF, 0);
  printf("PID pid=%d\n", (int)getpid());
  if (strcmp(mode, "spin") && strcmp(mode, "graph") && strcmp(mode, "launch") && !streams_mode &&
      !latency_mode) {
    printf("STEP_ERROR step=args err=usage:_compute_spin_spin|graph|launch|streams|latency\nDONE rc=2\n");
    return 2;
  }
  if (nstreams < 1) nstreams = 1;
  if (nstreams > 16) nstreams = 16;
  memset(ss, 0, sizeof ss);
  if (sync_every < 1) sync_every = 1;
  if (graph_kernels < 1) graph_kernels = 1;
  if (rounds < 1) rounds = 1;
  if (rounds > 64) rounds = 64;
  e = cudaFree(0);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  if (e == cudaSuccess) e = cudaMemGetInfo(&free_b, &total_b);
  printf("MEMINFO free=%zu total=%zu\n", free_b, total_b);
  blocks = (sms > 0 ? sms : 132) * (per_sm > 0 ? per_sm : 1);
  printf("FRAMEWORK name=cudart mode=%s sms=%d blocks=%d threads=%d spin_us=%.1f\n", mode, sms,
         blocks, THREADS, spin_ns / 1000.0);
  if (e == cudaSuccess) e = cudaStreamCreate(&s);
  for (int k = 0; e == cudaSuccess && streams_mode && k < nstreams; k++) e = cudaStreamCreate(&ss[k]);
  if (e == cudaSuccess && graph_mode) {
    e = cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
    for (int i = 0; e == cudaSuccess && i < graph_kernels; i++) {
      L_SPIN(blocks, spin_ns / graph_kernels, s);
      e = cudaGetLastError();
    }
    if (e == cudaSuccess) e = cudaStreamEndCapture(s, &graph);
    if (e == cudaSuccess) e = cudaGraphInstantiate(&exec, graph, 0);
  }
  printf("INIT rc=%d name=%s\n", (int)e, cudaGetErrorName(e));
  if (e != cudaSuccess) {
    printf("DONE rc=2\n");
    return 2;
  }
  for (int i = 0; e == cudaSuccess && i < 3; i++) {
    if (graph_mode) e = cudaGraphLaunch(exec, s);
    else if (!strcmp(mode, "spin") || streams_mode || latency_mode) L_SPIN(blocks, spin_ns, s);
    else L_EMPTY(s);
    if (e == cudaSuccess) e = cudaGetLastError();
  }
  if (e == cudaSuccess) e = cudaStreamSynchronize(s);
  printf("WARM rc=%d name=%s\n", (int)e, cudaGetErrorName(e));
  printf("READY step=%s\n", mode);
  fflush(stdout);
  if (!wait_line()) {
    printf("EOF step=%s\n", mode);
    return 3;
  }
  if (!strcmp(mode, "launch")) {
    double us[64], best;
    for (int r = 0; r < rounds; r++) {
      double t0 = mono();
      for (long i = 0; i < launches; i++) L_EMPTY(s);
      e = cudaGetLastError();
      if (e == cudaSuccess) e = cudaStreamSynchronize(s);
      us[r] = (mono() - t0) * 1e6 / (double)(launches > 0 ? launches : 1);
      printf("ROUND i=%d us=%.4f\n", r, us[r]);
      if (e != cudaSuccess) {
        rounds = r + 1;
        break;
      }
    }
    qsort(us, rounds, sizeof us[0], cmp_double);
    best = us[0];
    printf("RESULT rc=%d name=%s launches=%ld us_median=%.4f us_min=%.4f\n", (int)e,
           cudaGetErrorName(e), launches, us[rounds / 2], best);
  } else if (latency_mode) {
    /* Requests of one kernel each, each followed by a synchronisation; latencies kept. */
    long n = 0, cap = 2000000, sec = 0, sec_n = 0;
    int rblocks = sms > 0 ? sms : 132;
    double *lat = (double *)malloc(sizeof(double) * cap);
    double t0 = mono(), w0 = wall(), end = t0 + seconds, t1, w1, mark = t0 + 1.0;
    double skip = t0 + env_f("WL_LAT_SKIP_S", 0.0);
    long kept = 0;
    e = lat ? cudaSuccess : cudaErrorMemoryAllocation;
    while (e == cudaSuccess && mono() < end) {
      double a = mono();
      L_SPIN(rblocks, req_ns, s);
      e = cudaGetLastError();
      if (e == cudaSuccess) e = cudaStreamSynchronize(s);
      double b = mono();
      if (e == cudaSuccess && a >= skip && kept < cap) lat[kept++] = (b - a) * 1e3;
      if (e == cudaSuccess) n++, sec_n++;
      if (b >= mark) {
        printf("SECOND i=%ld kernels=%ld\n", sec++, sec_n);
        sec_n = 0;
        mark += 1.0;
      }
    }
    t1 = mono();
    w1 = wall();
    long m = kept;
    double p50 = 0, p99 = 0, mx = 0;
    if (m > 0) {
      qsort(lat, m, sizeof lat[0], cmp_double);
      p50 = lat[m / 2];
      p99 = lat[(long)((m - 1) * 0.99)];
      mx = lat[m - 1];
    }
    printf("RESULT rc=%d name=%s kernels=%ld seconds=%.4f kps=%.3f p50_ms=%.4f p99_ms=%.4f "
           "max_ms=%.4f t0=%.6f t1=%.6f\n", (int)e, cudaGetErrorName(e), n, t1 - t0,
           (t1 > t0 ? n / (t1 - t0) : 0.0), p50, p99, mx, w0, w1);
    free(lat);
  } else {
    long n = 0, done = 0, sec = 0, sec_n = 0;
    int sblocks = (sms > 0 ? sms : 132) * (stream_per_sm > 0 ? stream_per_sm : 1);
    double t0 = mono(), w0 = wall(), end = t0 + seconds, t1, w1, mark = t0 + 1.0;
    e = cudaSuccess;
    while (e == cudaSuccess && mono() < end) {
      if (graph_mode) e = cudaGraphLaunch(exec, s);
      else if (streams_mode) {
        L_SPIN(sblocks, spin_ns, ss[n % nstreams]);
        e = cudaGetLastError();
      } else {
        L_SPIN(blocks, spin_ns, s);
        e = cudaGetLastError();
      }
      if (e == cudaSuccess) n++;
      long every = streams_mode ? (long)sync_every * nstreams : sync_every;
      if (e == cudaSuccess && n % every == 0) {
        if (streams_mode)
          for (int k = 0; e == cudaSuccess && k < nstreams; k++) e = cudaStreamSynchronize(ss[k]);
        else
          e = cudaStreamSynchronize(s);
        sec_n += n - done;
        done = n;
        if (mono() >= mark) {
          printf("SECOND i=%ld kernels=%ld\n", sec++, sec_n);
          sec_n = 0;
          mark += 1.0;
        }
      }
    }
    if (e == cudaSuccess) e = cudaStreamSynchronize(s);
    for (int k = 0; e == cudaSuccess && streams_mode && k < nstreams; k++)
      e = cudaStreamSynchronize(ss[k]);
    t1 = mono();
    w1 = wall();
    printf("RESULT rc=%d name=%s kernels=%ld seconds=%.4f kps=%.3f t0=%.6f t1=%.6f\n", (int)e,
           cudaGetErrorName(e), n, t1 - t0, (t1 > t0 ? n / (t1 - t0) : 0.0), w0, w1);
  }
  fflush(stdout);
  if (exec) cudaGraphExecDestroy(exec);
  if (graph) cudaGraphDestroy(graph);
  if (s) cudaStreamDestroy(s);
  for (int k = 0; k < 16; k++)
    if (ss[k]) cudaStreamDestroy(ss[k]);
  printf("DONE rc=%d\n", e == cudaSuccess ? 0 : 1);
  return e == cudaSuccess ? 0 : 1;
}
