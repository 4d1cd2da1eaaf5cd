/*
 * cudaprobe: the workload driver of hami-rs's tests, benchmarks and demo.
 *
 * Executes driver-API operations given on the command line, in order, and prints one
 * parseable line per operation on stdout (flushed at once):
 *
 *     pid=1234 via=direct device=0
 *     op=init rc=0 name=CUDA_SUCCESS
 *     op=alloc size=1048576 idx=0 ptr=0x100000000000 rc=0 name=CUDA_SUCCESS
 *
 * The driver is reached in one of the three ways real programs use (--via):
 *   direct    linked with -lcuda, calling the exported versioned symbols (cuMemAlloc_v2 ...);
 *   dlsym     dlopen("libcuda.so.1") + dlsym of the versioned symbols;
 *   procaddr  dlopen + dlsym("cuGetProcAddress_v2") only, then EVERY function resolved through
 *             it by base name with --cuda-version (default 12000) and flags 0, like the CUDA
 *             12/13 runtime (cuCtxCreate then resolves to _v3/_v4 and is called accordingly).
 *
 * Build: gcc -O2 -o cudaprobe cudaprobe.c -L<dir of libcuda.so> -lcuda -ldl -lpthread
 * (no rpath: run with LD_LIBRARY_PATH pointing at the fake or the real driver).
 *
 * Usage: cudaprobe [--via direct|dlsym|procaddr] [--device N] [--cuda-version V] OP...
 * Run `cudaprobe --help` for the operations.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* The driver API, its resolution, the records (cudaprobe_driver.h); the ops' helpers
   (cudaprobe_ops.h). Both lie next to this file: a quoted include needs no -I. */
#include "cudaprobe_driver.h"
#include "cudaprobe_ops.h"

int main(int argc, char **argv) {
  int a = 1;
  for (; a < argc && !strncmp(argv[a], "--", 2); a++) {
    if (!strcmp(argv[a], "--help")) { usage(); return 0; }
    if (a + 1 >= argc) die("missing value for %s", argv[a]);
    if (!strcmp(argv[a], "--via")) via = argv[++a];
    else if (!strcmp(argv[a], "--device")) device = atoi(argv[++a]);
    else if (!strcmp(argv[a], "--cuda-version")) cuda_version = atoi(argv[++a]);
    else die("unknown option %s", argv[a]);
  }
  setvbuf(stdout, NULL, _IOLBF, 0);
  resolve();
  printf("pid=%d via=%s device=%d\n", (int)getpid(), via, device);
  fflush(stdout);

#define NEED(n) do { if (a + (n) >= argc) die("missing argument for %s", op); } while (0)
  for (; a < argc; a++) {
    const char *op = argv[a];
    CUresult rc;
    if (!strcmp(op, "init")) {
      printf("op=init"); end(cu.Init(0));
    } else if (!strcmp(op, "version")) {
      int v = 0; rc = cu.DriverGetVersion(&v); printf("op=version version=%d", v); end(rc);
    } else if (!strcmp(op, "device")) {
      NEED(1); device = atoi(argv[++a]); printf("op=device device=%d", device); end(0);
    } else if (!strcmp(op, "count")) {
      int n = -1; rc = cu.DeviceGetCount(&n); printf("op=count count=%d", n); end(rc);
    } else if (!strcmp(op, "name")) {
      char n[256] = ""; rc = cu.DeviceGetName(n, sizeof n, device);
      for (char *c = n; *c; c++) if (*c == ' ') *c = '_';
      printf("op=name device_name=%s", n); end(rc);
    } else if (!strcmp(op, "uuid")) {
      CUuuid u; memset(&u, 0, sizeof u); rc = cu.DeviceGetUuid(&u, device);
      const unsigned char *b = (const unsigned char *)u.bytes;
      printf("op=uuid uuid=GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1], b[2],
             b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
      end(rc);
    } else if (!strcmp(op, "totalmem")) {
      size_t t = 0; rc = cu.DeviceTotalMem(&t, device); printf("op=totalmem total=%zu", t); end(rc);
    } else if (!strcmp(op, "ctx")) {
      CUdevice d = -1; CUcontext c = NULL;
      rc = cu.DeviceGet(&d, device);
      if (!rc) rc = cu.PrimaryCtxRetain(&c, d);
      if (!rc) rc = cu.CtxSetCurrent(c);
      printf("op=ctx ctx=%p", c); end(rc);
    } else if (!strcmp(op, "ctxcreate")) {
      CUcontext c = NULL; rc = ctx_create(&c);
      printf("op=ctxcreate");
      if (!rc) printf(" idx=%zu ctx=%p", add_rec((rec_t){.kind = K_CTX, .obj = c}), c);
      end(rc);
    } else if (!strcmp(op, "ctxdestroy")) {
      long i = pick((a + 1 < argc && (argv[a + 1][0] == 'l' || (argv[a + 1][0] >= '0' && argv[a + 1][0] <= '9'))) ? argv[++a] : "last", 1u << K_CTX);
      printf("op=ctxdestroy");
      if (i < 0) { printf(" error=no-such-record\n"); fflush(stdout); continue; }
      end(free_rec((size_t)i));
    } else if (!strcmp(op, "ctxrelease")) {
      printf("op=ctxrelease"); end(cu.PrimaryCtxRelease(device));
    } else if (!strcmp(op, "ctxnull")) {
      printf("op=ctxnull"); end(cu.CtxSetCurrent(NULL));
    } else if (!strcmp(op, "ctxpop")) {
      CUcontext c = NULL; rc = cu.CtxPopCurrent(&c); printf("op=ctxpop ctx=%p", c); end(rc);
    } else if (!strcmp(op, "ctxsync")) {
      printf("op=ctxsync"); end(ctx_sync());
    } else if (!strcmp(op, "ctxdevice")) {
      CUdevice d = -1; rc = ctx_get_device(&d); printf("op=ctxdevice ctx_device=%d", d); end(rc);
    } else if (!strcmp(op, "meminfo")) {
      size_t f = 0, t = 0; rc = cu.MemGetInfo(&f, &t); printf("op=meminfo free=%zu total=%zu", f, t); end(rc);
    } else if (!strcmp(op, "alloc")) {
      NEED(1); size_t s = parse_size(argv[++a]); CUdeviceptr p = 0;
      rc = cu.MemAlloc(&p, s); print_alloc("alloc", s, rc, p, K_LINEAR);
    } else if (!strcmp(op, "alloc-null")) {
      printf("op=alloc-null"); end(cu.MemAlloc(NULL, 1 << 20));
    } else if (!strcmp(op, "managed")) {
      NEED(1); size_t s = parse_size(argv[++a]); CUdeviceptr p = 0;
      rc = cu.MemAllocManaged(&p, s, 1 /* CU_MEM_ATTACH_GLOBAL */); print_alloc("managed", s, rc, p, K_MANAGED);
    } else if (!strcmp(op, "async") || !strcmp(op, "async-ptsz")) {
      NEED(1); size_t s = parse_size(argv[++a]); CUdeviceptr p = 0;
      rc = (op[5] ? cu.MemAllocAsyncPtsz : cu.MemAllocAsync)(&p, s, stream);
      if (!rc && !capturing) rc = cu.StreamSynchronize(stream);
      print_alloc(op, s, rc, p, K_ASYNC);
    } else if (!strcmp(op, "freeasync")) {
      NEED(1); long i = pick(argv[++a], 1u << K_ASYNC | 1u << K_POOL);
      printf("op=freeasync");
      if (i < 0) { printf(" error=no-such-record\n"); fflush(stdout); continue; }
      rc = cu.MemFreeAsync(recs[i].ptr, stream);
      if (!rc && !capturing) rc = cu.StreamSynchronize(stream);
      if (!rc) recs[i].live = 0;
      printf(" idx=%ld ptr=0x%llx", i, recs[i].ptr); end(rc);
    } else if (!strcmp(op, "pool")) {
      NEED(1); size_t s = parse_size(argv[++a]); CUdeviceptr p = 0; rc = 0;
      if (!pool) {
        CUmemPoolProps pp; memset(&pp, 0, sizeof pp);
        pp.allocType = 1; pp.location.type = 1; pp.location.id = device;
        rc = cu.MemPoolCreate(&pool, &pp);
      }
      if (!rc) rc = cu.MemAllocFromPoolAsync(&p, s, pool, stream);
      if (!rc && !capturing) rc = cu.StreamSynchronize(stream);
      print_alloc("pool", s, rc, p, K_POOL);
    } else if (!strcmp(op, "poolinfo") || !strcmp(op, "threshold") || !strcmp(op, "trim")) {
      NEED(1); const char *which = argv[++a];
      int info = op[0] == 'p', thr = op[1] == 'h';
      unsigned long long v = 0;
      if (!info) { NEED(1); const char *x = argv[++a]; v = !strcmp(x, "max") ? ~0ULL : parse_size(x); }
      printf("op=%s pool=%s", op, which);
      if (!cu.DeviceGetMemPool || !cu.MemPoolGetAttribute || !cu.MemPoolSetAttribute || !cu.MemPoolTrimTo) {
        printf(" error=missing-function\n"); fflush(stdout); continue;
      }
      CUmemoryPool p = NULL; rc = 0;
      if (!strcmp(which, "own")) p = pool; else rc = cu.DeviceGetMemPool(&p, device);
      if (!rc && !p) { printf(" error=no-pool\n"); fflush(stdout); continue; }
      if (!rc && thr) rc = cu.MemPoolSetAttribute(p, 4 /* RELEASE_THRESHOLD */, &v);
      if (!rc && !info && !thr) rc = cu.MemPoolTrimTo(p, (size_t)v);
      unsigned long long reserved = 0, used = 0, threshold = 0;
      if (!rc) rc = cu.MemPoolGetAttribute(p, 5 /* RESERVED_MEM_CURRENT */, &reserved);
      if (!rc) rc = cu.MemPoolGetAttribute(p, 7 /* USED_MEM_CURRENT */, &used);
      if (!rc) rc = cu.MemPoolGetAttribute(p, 4 /* RELEASE_THRESHOLD */, &threshold);
      printf(" reserved=%llu used=%llu threshold=%llu", reserved, used, threshold); end(rc);
    } else if (!strcmp(op, "pooldestroy")) {
      printf("op=pooldestroy");
      if (!cu.MemPoolDestroy || !pool) { printf(" error=no-pool\n"); fflush(stdout); continue; }
      rc = cu.MemPoolDestroy(pool); if (!rc) pool = NULL; end(rc);
    } else if (!strcmp(op, "setpool")) {
      printf("op=setpool");
      if (!cu.DeviceSetMemPool) { printf(" error=missing-function\n"); fflush(stdout); continue; }
      rc = 0;
      if (!pool) {
        CUmemPoolProps pp; memset(&pp, 0, sizeof pp);
        pp.allocType = 1; pp.location.type = 1; pp.location.id = device;
        rc = cu.MemPoolCreate(&pool, &pp);
      }
      if (!rc) rc = cu.DeviceSetMemPool(device, pool);
      end(rc);
    } else if (!strcmp(op, "streamsync")) {
      printf("op=streamsync"); end(cu.StreamSynchronize(stream));
    } else if (!strcmp(op, "streamnew")) {
      printf("op=streamnew");
      if (!cu.StreamCreate) { printf(" error=missing-function\n"); fflush(stdout); continue; }
      CUstream st = NULL; rc = cu.StreamCreate(&st, 1 /* NON_BLOCKING */);
      if (!rc) stream = st;
      printf(" stream=%p", st); end(rc);
    } else if (!strcmp(op, "capture-begin") || !strcmp(op, "capture-end")) {
      printf("op=%s", op);
      if (!cu.StreamBeginCapture || !cu.StreamEndCapture) { printf(" error=missing-function\n"); fflush(stdout); continue; }
      if (op[8] == 'b') {
        rc = cu.StreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_RELAXED);
        if (!rc) capturing = 1;
      } else {
        CUgraph graph = NULL; rc = cu.StreamEndCapture(stream, &graph);
        capturing = 0;
        if (!rc) gmem_graph = graph; /* gmem-inst instantiates it */
      }
      end(rc);
    } else if (!strcmp(op, "eventsync")) {
      printf("op=eventsync");
      if (!cu.EventCreate || !cu.EventRecord || !cu.EventSynchronize || !cu.EventDestroy) {
        printf(" error=missing-function\n"); fflush(stdout); continue;
      }
      CUevent ev = NULL; rc = cu.EventCreate(&ev, 0);
      if (!rc) rc = cu.EventRecord(ev, NULL);
      if (!rc) rc = cu.EventSynchronize(ev);
      if (ev) cu.EventDestroy(ev);
      end(rc);
    } else if (!strcmp(op, "kernel")) {
      printf("op=kernel");
      rc = spin_kernel();
      if (rc == -1) { printf(" error=missing-function\n"); fflush(stdout); continue; }
      printf(" handle=%p", spin_fn); end(rc);
    } else if (!strcmp(op, "launch-cost")) {
      /* N launches of the timed kernel taking 0 ns (the launch path alone), no sync: wall and
       * CPU ns per launch (CPU time leaves out any sleep, e.g. at a launch gate). */
      NEED(1); long n = atol(argv[++a]);
      printf("op=launch-cost n=%ld", n);
      rc = spin_kernel();
      if (rc == -1 || !cu.LaunchKernel) { printf(" error=missing-function\n"); fflush(stdout); continue; }
      struct timespec c0, c1;
      long k = 0;
      if (!rc) rc = spin_launch(0, 0); /* the first launch (lazy loading) is not counted */
      clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c0);
      double t0 = now_ns();
      for (; !rc && k < n; k++) rc = spin_launch(0, 0);
      double t1 = now_ns();
      clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c1);
      double cpu = (c1.tv_sec - c0.tv_sec) * 1e9 + (c1.tv_nsec - c0.tv_nsec);
      printf(" launched=%ld ns_per_launch=%.1f cpu_ns_per_launch=%.1f", k, k ? (t1 - t0) / k : 0.0, k ? cpu / k : 0.0);
      end(rc);
    } else if (!strcmp(op, "launch-ns") || !strcmp(op, "coop-ns")) {
      /* COUNT launches (default 1) of the timed kernel on the current stream; no sync. */
      NEED(1); unsigned long long ns = parse_ns(argv[++a]);
      long n = (a + 1 < argc && argv[a + 1][0] >= '0' && argv[a + 1][0] <= '9') ? atol(argv[++a]) : 1;
      int coop = op[0] == 'c';
      printf("op=%s ns=%llu count=%ld", op, ns, n);
      rc = spin_kernel();
      if (rc == -1 || !cu.LaunchKernel || (coop && !cu.LaunchCooperativeKernel)) {
        printf(" error=missing-function\n"); fflush(stdout); continue;
      }
      double t0 = now_ns(); long k = 0;
      for (; !rc && k < n; k++) rc = spin_launch(ns, coop);
      printf(" launched=%ld host_ns=%.0f", rc ? k - 1 : k, now_ns() - t0); end(rc);
    } else if (!strcmp(op, "launch-for")) {
      /* Launches back to back on the current stream for SECONDS of wall time, each kernel
       * between two events; then synchronises. busy_ns = the sum of the kernels' event-measured
       * times, wall_ns = from the first launch to the end of the synchronisation. */
      NEED(2); double sec = atof(argv[++a]); unsigned long long ns = parse_ns(argv[++a]);
      printf("op=launch-for seconds=%g ns=%llu", sec, ns);
      rc = spin_kernel();
      if (rc == -1 || !cu.LaunchKernel || !cu.EventCreate || !cu.EventRecord || !cu.EventElapsedTime) {
        printf(" error=missing-function\n"); fflush(stdout); continue;
      }
      enum { PAIRS = 64 };
      CUevent ev[PAIRS][2]; memset(ev, 0, sizeof ev);
      for (int k = 0; !rc && k < PAIRS; k++) {
        rc = cu.EventCreate(&ev[k][0], 0);
        if (!rc) rc = cu.EventCreate(&ev[k][1], 0);
      }
      double busy = 0, t0 = now_ns(), stop = t0 + sec * 1e9;
      unsigned long long kernels = 0;
      CUresult mrc = 0;
      while (!rc && now_ns() < stop) {
        int k = (int)(kernels % PAIRS);
        if (kernels >= PAIRS) {
          float ms = 0;
          rc = cu.EventSynchronize(ev[k][1]);
          if (!rc) mrc = cu.EventElapsedTime(&ms, ev[k][0], ev[k][1]);
          busy += ms * 1e6;
        }
        if (!rc) rc = cu.EventRecord(ev[k][0], stream);
        if (!rc) rc = spin_launch(ns, 0);
        if (!rc) rc = cu.EventRecord(ev[k][1], stream);
        if (!rc) kernels++;
      }
      if (!rc) rc = cu.StreamSynchronize(stream);
      double t1 = now_ns();
      for (unsigned long long j = kernels > PAIRS ? kernels - PAIRS : 0; !rc && j < kernels; j++) {
        float ms = 0;
        mrc = cu.EventElapsedTime(&ms, ev[j % PAIRS][0], ev[j % PAIRS][1]);
        busy += ms * 1e6;
      }
      for (int k = 0; k < PAIRS; k++) { if (ev[k][0]) cu.EventDestroy(ev[k][0]); if (ev[k][1]) cu.EventDestroy(ev[k][1]); }
      printf(" kernels=%llu busy_ns=%.0f wall_ns=%.0f nominal_ns=%llu start_ns=%.0f end_ns=%.0f elapsed_rc=%d", kernels,
             busy, t1 - t0, kernels * ns, t0, t1, mrc);
      end(rc);
    } else if (!strcmp(op, "streams-for")) {
      /* N new non-blocking streams, kernels launched round-robin on them back to back for
       * SECONDS of wall time (no events of its own); then every stream is synchronised.
       * Prints kernels=, start_ns=/end_ns= (first launch, end of the last synchronisation). */
      NEED(3); double sec = atof(argv[++a]); unsigned long long ns = parse_ns(argv[++a]);
      int n = atoi(argv[++a]);
      if (n < 1 || n > 64) die("streams-for: %s streams, not 1..64", argv[a]);
      printf("op=streams-for seconds=%g ns=%llu streams=%d", sec, ns, n);
      rc = spin_kernel();
      if (rc == -1 || !cu.LaunchKernel || !cu.StreamCreate) {
        printf(" error=missing-function\n"); fflush(stdout); continue;
      }
      CUstream sts[64]; memset(sts, 0, sizeof sts);
      for (int k = 0; !rc && k < n; k++) rc = cu.StreamCreate(&sts[k], 1 /* NON_BLOCKING */);
      CUstream saved = stream;
      double t0 = now_ns(), stop = t0 + sec * 1e9;
      unsigned long long kernels = 0;
      while (!rc && now_ns() < stop) {
        stream = sts[kernels % (unsigned)n];
        rc = spin_launch(ns, 0);
        if (!rc) kernels++;
      }
      for (int k = 0; !rc && k < n; k++) rc = cu.StreamSynchronize(sts[k]);
      stream = saved;
      double t1 = now_ns();
      printf(" kernels=%llu wall_ns=%.0f nominal_ns=%llu start_ns=%.0f end_ns=%.0f", kernels, t1 - t0,
             kernels * ns, t0, t1);
      end(rc);
    } else if (!strcmp(op, "streamquery")) {
      printf("op=streamquery");
      if (!cu.StreamQuery) { printf(" error=missing-function\n"); fflush(stdout); continue; }
      end(cu.StreamQuery(stream));
    } else if (!strcmp(op, "streamsync-t") || !strcmp(op, "ctxsync-t")) {
      double t0 = now_ns();
      rc = op[0] == 's' ? cu.StreamSynchronize(stream) : ctx_sync();
      printf("op=%s wait_ns=%.0f", op, now_ns() - t0); end(rc);
    } else if (!strcmp(op, "evcreate")) {
      unsigned fl = (a + 1 < argc && argv[a + 1][0] >= '0' && argv[a + 1][0] <= '9') ? (unsigned)strtoul(argv[++a], NULL, 0) : 0;
      printf("op=evcreate flags=%u", fl);
      if (!cu.EventCreate) { printf(" error=missing-function\n"); fflush(stdout); continue; }
      CUevent e = NULL; rc = cu.EventCreate(&e, fl);
      if (!rc) printf(" idx=%zu event=%p", add_rec((rec_t){.kind = K_EVENT, .obj = e}), e);
      end(rc);
    } else if (!strcmp(op, "evrecord") || !strcmp(op, "evquery") || !strcmp(op, "evsync") || !strcmp(op, "evdestroy")) {
      const char *t = opt_idx(argc, argv, &a);
      long i = pick(t, 1u << K_EVENT);
      printf("op=%s", op);
      if (i < 0) { printf(" error=no-such-record\n"); fflush(stdout); continue; }
      if (!cu.EventQuery) { printf(" error=missing-function\n"); fflush(stdout); continue; }
      double t0 = now_ns();
      if (op[2] == 'r') rc = cu.EventRecord(recs[i].obj, stream);
      else if (op[2] == 'q') rc = cu.EventQuery(recs[i].obj);
      else if (op[2] == 's') rc = cu.EventSynchronize(recs[i].obj);
      else rc = free_rec((size_t)i);
      printf(" idx=%ld wait_ns=%.0f", i, now_ns() - t0); end(rc);
    } else if (!strcmp(op, "elapsed")) {
      NEED(2); long i = pick(argv[++a], 1u << K_EVENT), j = pick(argv[++a], 1u << K_EVENT);
      printf("op=elapsed");
      if (i < 0 || j < 0) { printf(" error=no-such-record\n"); fflush(stdout); continue; }
      if (!cu.EventElapsedTime) { printf(" error=missing-function\n"); fflush(stdout); continue; }
      float ms = -1; rc = cu.EventElapsedTime(&ms, recs[i].obj, recs[j].obj);
      printf(" ms=%.4f ns=%.0f", ms, ms * 1e6); end(rc);
    } else if (!strcmp(op, "graph-capture")) {
      /* Captures COUNT launches of NS on the current (created) stream, instantiates the graph. */
      NEED(2); unsigned long long ns = parse_ns(argv[++a]); long n = atol(argv[++a]);
      printf("op=graph-capture ns=%llu count=%ld", ns, n);
      rc = spin_kernel();
      if (rc == -1 || !cu.StreamBeginCapture || !cu.StreamEndCapture || !cu.GraphInstantiateWithFlags || !cu.GraphLaunch) {
        printf(" error=missing-function\n"); fflush(stdout); continue;
      }
      const char *stage = "begin";
      CUgraph graph = NULL;
      CUgraphExec exec = NULL;
      if (!rc) rc = cu.StreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_RELAXED);
      if (!rc) stage = "launch";
      for (long k = 0; !rc && k < n; k++) rc = spin_launch(ns, 0);
      if (!rc || stage[0] == 'l') {
        CUresult r2 = cu.StreamEndCapture(stream, &graph);
        if (!rc) { rc = r2; stage = "end"; }
      }
      if (!rc) { stage = "instantiate"; rc = cu.GraphInstantiateWithFlags(&exec, graph, 0); }
      printf(" stage=%s", stage);
      if (!rc) printf(" idx=%zu exec=%p", add_rec((rec_t){.kind = K_GRAPH, .obj = exec, .obj2 = graph}), exec);
      end(rc);
    } else if (!strcmp(op, "graph-launch")) {
      NEED(1); long n = atol(argv[++a]);
      const char *t = opt_idx(argc, argv, &a);
      long i = pick(t, 1u << K_GRAPH);
      printf("op=graph-launch count=%ld", n);
      if (i < 0) { printf(" error=no-such-record\n"); fflush(stdout); continue; }
      rc = 0; double t0 = now_ns();
      for (long k = 0; !rc && k < n; k++) rc = cu.GraphLaunch(recs[i].obj, stream);
      printf(" idx=%ld host_ns=%.0f", i, now_ns() - t0); end(rc);
    } else if (!strcmp(op, "greenctx") || !strcmp(op, "greenctxdestroy")) {
      /* greenctx: the device's SM resource, a descriptor of it, a green context
         (CU_GREEN_CTX_DEFAULT_STREAM): idx=; greenctxdestroy IDX. */
      printf("op=%s", op);
      if (!cu.GreenCtxCreate || !cu.GreenCtxDestroy || !cu.DeviceGetDevResource || !cu.DevResourceGenerateDesc) {
        printf(" error=missing-function\n"); fflush(stdout); continue;
      }
      if (op[8]) {
        NEED(1); long i = pick(argv[++a], 1u << K_GREEN);
        if (i < 0) { printf(" error=no-such-record\n"); fflush(stdout); continue; }
        printf(" idx=%ld", i); end(free_rec((size_t)i)); continue;
      }
      CUdevResource res; memset(&res, 0, sizeof res);
      CUdevResourceDesc desc = NULL; CUgreenCtx g = NULL;
      rc = cu.DeviceGetDevResource(device, &res, CU_DEV_RESOURCE_TYPE_SM);
      if (!rc) rc = cu.DevResourceGenerateDesc(&desc, &res, 1);
      if (!rc) rc = cu.GreenCtxCreate(&g, desc, device, CU_GREEN_CTX_DEFAULT_STREAM);
      if (!rc) printf(" idx=%zu green=%p", add_rec((rec_t){.kind = K_GREEN, .obj = g}), g);
      end(rc);
    } else if (!strncmp(op, "gmem-", 5)) {
      /* Graph memory nodes: gmem-alloc SIZE (a graph being built, created at its first node;
         an allocation node of SIZE on the current device: dptr=), gmem-free (a free node of the
         last allocation), gmem-inst [FLAGS] (cuGraphInstantiateWithFlags of the graph being
         built: a K_GRAPH record), gmem-inst-upload (cuGraphInstantiateWithParams with
         CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD on the current stream), gmem-upload [IDX]
         (cuGraphUpload), gmem-memfree (cuMemFree_v2 of the last allocation's address), gmem-attr
         (used= reserved= of the current device's graph pool), gmem-trim (cuDeviceGraphMemTrim). */
      static CUdeviceptr last_dptr;
      CUgraph *bg = &gmem_graph;
#define bgraph (*bg)
      printf("op=%s", op);
      if (!cu.GraphCreate || !cu.GraphAddMemAllocNode || !cu.DeviceGetGraphMemAttribute || !cu.DeviceGraphMemTrim) {
        printf(" error=missing-function\n"); fflush(stdout); continue;
      }
      rc = 0;
      if (!strcmp(op, "gmem-alloc")) {
        NEED(1); size_t sz = parse_size(argv[++a]);
        if (!bgraph) rc = cu.GraphCreate(&bgraph, 0);
        CUDA_MEM_ALLOC_NODE_PARAMS p; memset(&p, 0, sizeof p);
        p.poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED; p.poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE; p.poolProps.location.id = device; p.bytesize = sz;
        CUgraphNode node = NULL;
        if (!rc) rc = cu.GraphAddMemAllocNode(&node, bgraph, NULL, 0, &p);
        if (!rc) { last_dptr = p.dptr; printf(" size=%zu dptr=0x%llx", sz, (unsigned long long)p.dptr); }
      } else if (!strcmp(op, "gmem-free")) {
        CUgraphNode node = NULL; rc = cu.GraphAddMemFreeNode(&node, bgraph, NULL, 0, last_dptr);
      } else if (!strcmp(op, "gmem-inst") || !strcmp(op, "gmem-inst-upload")) {
        CUgraphExec exec = NULL;
        if (op[9] == '-') {
          CUDA_GRAPH_INSTANTIATE_PARAMS ip = {CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD, stream, NULL, -1};
          rc = cu.GraphInstantiateWithParams(&exec, bgraph, &ip);
          printf(" result=%d", ip.result_out);
        } else {
          unsigned long long fl = 0;
          const char *t = opt_idx(argc, argv, &a);
          if (t) fl = strtoull(t, NULL, 0);
          rc = cu.GraphInstantiateWithFlags(&exec, bgraph, fl);
        }
        if (!rc) { printf(" idx=%zu exec=%p", add_rec((rec_t){.kind = K_GRAPH, .obj = exec, .obj2 = bgraph}), exec); bgraph = NULL; }
      } else if (!strcmp(op, "gmem-upload")) {
        const char *t = opt_idx(argc, argv, &a);
        long i = pick(t, 1u << K_GRAPH);
        if (i < 0) { printf(" error=no-such-record\n"); fflush(stdout); continue; }
        rc = cu.GraphUpload(recs[i].obj, stream);
      } else if (!strcmp(op, "gmem-memfree")) {
        rc = cu.MemFree(last_dptr);
      } else if (!strcmp(op, "gmem-attr")) {
        unsigned long long used = 0, reserved = 0;
        rc = cu.DeviceGetGraphMemAttribute(device, CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT, &used);
        if (!rc) rc = cu.DeviceGetGraphMemAttribute(device, CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT, &reserved);
        printf(" used=%llu reserved=%llu", used, reserved);
      } else if (!strcmp(op, "gmem-trim")) {
        rc = cu.DeviceGraphMemTrim(device);
      } else {
        die("unknown op '%s'", op);
      }
#undef bgraph
      end(rc);
    } else if (!strcmp(op, "graphdestroy")) {
      NEED(1); long i = pick(argv[++a], 1u << K_GRAPH);
      printf("op=graphdestroy");
      if (i < 0) { printf(" error=no-such-record\n"); fflush(stdout); continue; }
      printf(" idx=%ld", i); end(free_rec((size_t)i));
    } else if (!strcmp(op, "mipmap")) {
      NEED(3); size_t w = parse_size(argv[++a]), h = parse_size(argv[++a]); unsigned lv = (unsigned)atoi(argv[++a]);
      printf("op=mipmap width=%zu height=%zu levels=%u", w, h, lv);
      if (!cu.MipmappedArrayCreate) { printf(" error=missing-function\n"); fflush(stdout); continue; }
      CUDA_ARRAY3D_DESCRIPTOR desc = {w, h, 0, CU_AD_FORMAT_FLOAT, 2, 0};
      CUmipmappedArray m = NULL; rc = cu.MipmappedArrayCreate(&m, &desc, lv);
      if (!rc) printf(" idx=%zu mipmap=%p", add_rec((rec_t){.kind = K_MIPMAP, .obj = m}), m);
      end(rc);
    } else if (!strcmp(op, "mipmapdestroy") || !strcmp(op, "modunload") || !strcmp(op, "libunload")) {
      NEED(1);
      int k = op[0] == 'm' && op[1] == 'i' ? K_MIPMAP : op[0] == 'm' ? K_MODULE : K_LIBRARY;
      long i = pick(argv[++a], 1u << k);
      printf("op=%s", op);
      if (i < 0) { printf(" error=no-such-record\n"); fflush(stdout); continue; }
      printf(" idx=%ld", i); end(free_rec((size_t)i));
    } else if (!strncmp(op, "modloadimg", 10) || !strncmp(op, "libloadimg", 10)) {
      /* A real image (ELF cubin, fatbin, PTX) read from PATH: "...img" hands the driver its
       * bytes, "...imgwrap" a __fatBinC_Wrapper_t pointing at them, "...imgfile" the path;
       * "modloadimgex" / "modloadimgfat" the other module entry points, "...imgstatic" the
       * bytes copied into a static buffer (as the runtime's images lie in a loaded object's
       * data; one such buffer of 64 KiB, reused). Bytes kept. */
      NEED(1); const char *path = argv[++a];
      int lib = op[0] == 'l'; const char *v = op + 10;
      FILE *fp = fopen(path, "rb");
      if (!fp) die("cannot read %s", path);
      fseek(fp, 0, SEEK_END); long n = ftell(fp); fseek(fp, 0, SEEK_SET);
      char *bytes = malloc((size_t)n + 1);
      if (!bytes || fread(bytes, 1, (size_t)n, fp) != (size_t)n) die("cannot read %s", path);
      bytes[n] = 0; fclose(fp);
      static char static_image[64 << 10];
      if (!strcmp(v, "static")) {
        if ((size_t)n >= sizeof static_image) die("image too large for the static buffer: %s", path);
        memcpy(static_image, bytes, (size_t)n + 1); bytes = static_image;
      }
      struct { int magic, version; const void *data; void *filename_or_fatbins; } *w = malloc(sizeof *w);
      w->magic = 0x466243B1; w->version = 1; w->data = bytes; w->filename_or_fatbins = NULL;
      const void *image = !strcmp(v, "wrap") ? (const void *)w : (const void *)bytes;
      CUmodule mod = NULL; CUlibrary lb = NULL; rc = -1;
      if (!strcmp(v, "file") && lib && cu.LibraryLoadFromFile) rc = cu.LibraryLoadFromFile(&lb, path, NULL, NULL, 0, NULL, NULL, 0);
      else if (!strcmp(v, "file") && !lib && cu.ModuleLoad) rc = cu.ModuleLoad(&mod, path);
      else if (!strcmp(v, "file")) rc = -1;
      else if (lib && cu.LibraryLoadData) rc = cu.LibraryLoadData(&lb, image, NULL, NULL, 0, NULL, NULL, 0);
      else if (!strcmp(v, "ex") && cu.ModuleLoadDataEx) rc = cu.ModuleLoadDataEx(&mod, image, 0, NULL, NULL);
      else if (!strcmp(v, "fat") && cu.ModuleLoadFatBinary) rc = cu.ModuleLoadFatBinary(&mod, image);
      else if (!lib && cu.ModuleLoadData) rc = cu.ModuleLoadData(&mod, image);
      void *m = lib ? (void *)lb : (void *)mod;
      printf("op=%s path=%s bytes=%ld", op, path, n);
      if (rc == -1) { printf(" error=missing-function\n"); fflush(stdout); continue; }
      if (!rc) printf(" idx=%zu handle=%p", add_rec((rec_t){.kind = lib ? K_LIBRARY : K_MODULE, .obj = m}), m);
      end(rc);
    } else if (!strncmp(op, "modload", 7) || !strncmp(op, "libload", 7)) {
      /* A fake image "FAKECUBIN globals=SIZE" (the fake driver's format; a real driver
       * rejects it with CUDA_ERROR_INVALID_IMAGE). */
      NEED(1); const char *sz = argv[++a];
      /* An optional "local=SIZE" next: the kernels' local memory per thread (fake images). */
      const char *local = a + 1 < argc && !strncmp(argv[a + 1], "local=", 6) ? argv[++a] : NULL;
      char image[128];
      snprintf(image, sizeof image, "FAKECUBIN globals=%s%s%s", sz, local ? " " : "", local ? local : "");
      int lib = op[0] == 'l', file = !strcmp(op + 7, "file");
      char path[64] = "";
      if (file) {
        snprintf(path, sizeof path, "/tmp/cudaprobe-%d-%zu.cubin", (int)getpid(), nrecs);
        FILE *fp = fopen(path, "w");
        if (!fp) die("cannot write %s", path);
        fputs(image, fp); fclose(fp);
      }
      CUmodule mod = NULL; CUlibrary lb = NULL; rc = -1;
      if (lib && file && cu.LibraryLoadFromFile) rc = cu.LibraryLoadFromFile(&lb, path, NULL, NULL, 0, NULL, NULL, 0);
      else if (lib && !file && cu.LibraryLoadData) rc = cu.LibraryLoadData(&lb, image, NULL, NULL, 0, NULL, NULL, 0);
      else if (!lib && file && cu.ModuleLoad) rc = cu.ModuleLoad(&mod, path);
      else if (!strcmp(op, "modloadex") && cu.ModuleLoadDataEx) rc = cu.ModuleLoadDataEx(&mod, image, 0, NULL, NULL);
      else if (!strcmp(op, "modloadfat") && cu.ModuleLoadFatBinary) rc = cu.ModuleLoadFatBinary(&mod, image);
      else if (!strcmp(op, "modload") && cu.ModuleLoadData) rc = cu.ModuleLoadData(&mod, image);
      void *m = lib ? (void *)lb : (void *)mod;
      if (file) unlink(path);
      printf("op=%s globals=%s", op, sz);
      if (local) printf(" %s", local);
      if (rc == -1) { printf(" error=missing-function\n"); fflush(stdout); continue; }
      if (!rc) printf(" idx=%zu handle=%p", add_rec((rec_t){.kind = lib ? K_LIBRARY : K_MODULE, .obj = m}), m);
      end(rc);
    } else if (!strcmp(op, "getfunc") || !strcmp(op, "getkernel") || !strcmp(op, "kernelfunc")) {
      int from = op[0] == 'g' && op[3] == 'f' ? K_MODULE : op[0] == 'g' ? K_LIBRARY : K_KERNEL;
      const char *t = opt_idx(argc, argv, &a);
      long i = pick(t, 1u << from);
      printf("op=%s", op);
      if (i < 0) { printf(" error=no-such-record\n"); fflush(stdout); continue; }
      CUfunction fn = NULL; CUkernel kern = NULL; rc = -1;
      if (from == K_MODULE && cu.ModuleGetFunction) rc = cu.ModuleGetFunction(&fn, recs[i].obj, "kernel");
      if (from == K_LIBRARY && cu.LibraryGetKernel) rc = cu.LibraryGetKernel(&kern, recs[i].obj, "kernel");
      if (from == K_KERNEL && cu.KernelGetFunction) rc = cu.KernelGetFunction(&fn, recs[i].obj);
      void *f = from == K_LIBRARY ? (void *)kern : (void *)fn;
      if (rc == -1) { printf(" error=missing-function\n"); fflush(stdout); continue; }
      if (!rc) printf(" idx=%zu handle=%p", add_rec((rec_t){.kind = from == K_LIBRARY ? K_KERNEL : K_FUNC, .obj = f}), f);
      end(rc);
    } else if (!strcmp(op, "getglobal") || !strcmp(op, "libgetglobal") || !strcmp(op, "libgetmodule")) {
      /* cuModuleGetGlobal_v2 / cuLibraryGetGlobal of "g", cuLibraryGetModule (adds a module). */
      int lib = op[0] == 'l';
      const char *t = opt_idx(argc, argv, &a);
      long i = pick(t, 1u << (lib ? K_LIBRARY : K_MODULE));
      printf("op=%s", op);
      if (i < 0) { printf(" error=no-such-record\n"); fflush(stdout); continue; }
      CUdeviceptr p = 0; size_t n = 0; CUmodule m = NULL; rc = -1;
      if (!lib && cu.ModuleGetGlobal) rc = cu.ModuleGetGlobal(&p, &n, recs[i].obj, "g");
      else if (!strcmp(op, "libgetglobal") && cu.LibraryGetGlobal) rc = cu.LibraryGetGlobal(&p, &n, recs[i].obj, "g");
      else if (!strcmp(op, "libgetmodule") && cu.LibraryGetModule) rc = cu.LibraryGetModule(&m, recs[i].obj);
      if (rc == -1) { printf(" error=missing-function\n"); fflush(stdout); continue; }
      if (!rc && p) printf(" ptr=0x%llx bytes=%zu", p, n);
      if (!rc && m) printf(" idx=%zu handle=%p", add_rec((rec_t){.kind = K_MODULE, .obj = m}), m);
      end(rc);
    } else if (!strcmp(op, "launch") || !strcmp(op, "launchex")) {
      /* Launches a function (getfunc/kernelfunc) or a kernel handle (getkernel) on the NULL stream. */
      const char *t = opt_idx(argc, argv, &a);
      long i = pick(t, 1u << K_FUNC | 1u << K_KERNEL);
      printf("op=%s", op);
      if (i < 0) { printf(" error=no-such-record\n"); fflush(stdout); continue; }
      rc = -1;
      if (op[6] && cu.LaunchKernelEx) {
        CUlaunchConfig c; memset(&c, 0, sizeof c);
        c.gridDimX = c.gridDimY = c.gridDimZ = c.blockDimX = c.blockDimY = c.blockDimZ = 1;
        rc = cu.LaunchKernelEx(&c, recs[i].obj, NULL, NULL);
      } else if (!op[6] && cu.LaunchKernel) {
        rc = cu.LaunchKernel(recs[i].obj, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL);
      }
      if (rc == -1) { printf(" error=missing-function\n"); fflush(stdout); continue; }
      printf(" idx=%ld", i); end(rc);
    } else if (!strcmp(op, "setlimit") || !strcmp(op, "getlimit")) {
      /* cuCtxSetLimit / cuCtxGetLimit of the current context; getlimit prints value=, setlimit
       * prints the value read back after a successful set (or the old one). */
      NEED(op[0] == 's' ? 2 : 1); const char *n = argv[++a];
      int lim = !strcmp(n, "stack") ? 0 : !strcmp(n, "printf") ? 1 : !strcmp(n, "heap") ? 2
              : !strcmp(n, "syncdepth") ? 3 : !strcmp(n, "pending") ? 4 : atoi(n);
      size_t v = op[0] == 's' ? (size_t)parse_size(argv[++a]) : 0, now = 0;
      printf("op=%s limit=%s", op, n);
      if (!cu.CtxSetLimit || !cu.CtxGetLimit) { printf(" error=missing-function\n"); fflush(stdout); continue; }
      rc = op[0] == 's' ? cu.CtxSetLimit(lim, v) : cu.CtxGetLimit(&now, lim);
      if (op[0] == 's') { cu.CtxGetLimit(&now, lim); printf(" set=%zu", v); }
      printf(" value=%zu", now); end(rc);
    } else if (!strcmp(op, "funcattr")) {
      /* cuFuncGetAttribute(ATTR) of a function (getfunc/kernelfunc); 3 = LOCAL_SIZE_BYTES. */
      NEED(1); int attr = atoi(argv[++a]);
      const char *t = opt_idx(argc, argv, &a);
      long i = pick(t, 1u << K_FUNC | 1u << K_KERNEL);
      printf("op=funcattr attr=%d", attr);
      if (i < 0) { printf(" error=no-such-record\n"); fflush(stdout); continue; }
      if (!cu.FuncGetAttribute) { printf(" error=missing-function\n"); fflush(stdout); continue; }
      int v = -1; rc = cu.FuncGetAttribute(&v, attr, recs[i].obj);
      printf(" idx=%ld value=%d", i, v); end(rc);
    } else if (!strcmp(op, "launchcoop")) {
      /* cuLaunchCooperativeKernel of a function (getfunc/kernelfunc), 1 x 1, NULL stream. */
      const char *t = opt_idx(argc, argv, &a);
      long i = pick(t, 1u << K_FUNC | 1u << K_KERNEL);
      printf("op=launchcoop");
      if (i < 0) { printf(" error=no-such-record\n"); fflush(stdout); continue; }
      if (!cu.LaunchCooperativeKernel) { printf(" error=missing-function\n"); fflush(stdout); continue; }
      rc = cu.LaunchCooperativeKernel(recs[i].obj, 1, 1, 1, 1, 1, 1, 0, NULL, NULL);
      printf(" idx=%ld", i); end(rc);
    } else if (!strcmp(op, "bench-launch")) {
      /* N launches of a function or kernel (1 block of 1 thread, NULL stream): ns per launch. */
      NEED(1); long n = atol(argv[++a]); long fails = 0; CUresult last = 0;
      const char *t = opt_idx(argc, argv, &a);
      long i = pick(t, 1u << K_FUNC | 1u << K_KERNEL);
      printf("op=bench-launch n=%ld", n);
      if (i < 0) { printf(" error=no-such-record\n"); fflush(stdout); continue; }
      if (!cu.LaunchKernel) { printf(" error=missing-function\n"); fflush(stdout); continue; }
      double t0 = now_ns();
      for (long k = 0; k < n; k++) {
        CUresult r = cu.LaunchKernel(recs[i].obj, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL);
        if (r) { fails++; last = r; }
      }
      double dt = now_ns() - t0;
      printf(" ns_per_launch=%.1f failures=%ld", n ? dt / n : 0.0, fails); end(last);
    } else if (!strcmp(op, "pitch")) {
      NEED(2); size_t w = parse_size(argv[++a]), h = parse_size(argv[++a]), pitch = 0; CUdeviceptr p = 0;
      rc = cu.MemAllocPitch(&p, &pitch, w, h, 4);
      printf("op=pitch width=%zu height=%zu pitch=%zu size=%zu", w, h, pitch, pitch * h);
      if (!rc) printf(" idx=%zu ptr=0x%llx", add_rec((rec_t){.kind = K_PITCH, .ptr = p, .size = pitch * h}), p);
      end(rc);
    } else if (!strcmp(op, "create")) {
      NEED(1); size_t s = parse_size(argv[++a]);
      CUmemAllocationProp prop; memset(&prop, 0, sizeof prop);
      prop.type = 1; prop.location.type = 1; prop.location.id = device;
      CUmemGenericAllocationHandle h = 0; CUdeviceptr va = 0; const char *stage = "create";
      rc = cu.MemCreate(&h, s, &prop, 0);
      if (!rc) { stage = "reserve"; rc = cu.MemAddressReserve(&va, s, 0, 0, 0); }
      if (!rc) { stage = "map"; rc = cu.MemMap(va, s, 0, h, 0); }
      if (!rc) {
        CUmemAccessDesc d; d.location = prop.location; d.flags = 3; /* PROT_READWRITE */
        stage = "setaccess"; rc = cu.MemSetAccess(va, s, &d, 1);
      }
      printf("op=create size=%zu stage=%s", s, stage);
      if (!rc) printf(" idx=%zu handle=0x%llx ptr=0x%llx", add_rec((rec_t){.kind = K_VMM, .ptr = va, .size = s, .handle = h, .handle_refs = 1}), h, va);
      end(rc);
    } else if (!strcmp(op, "releasemapped")) {
      /* cuMemRelease of a record's handle, leaving it mapped (the memory stays held). */
      NEED(1); long i = pick(argv[++a], 1u << K_VMM);
      printf("op=releasemapped");
      if (i < 0) { printf(" error=no-such-record\n"); fflush(stdout); continue; }
      rc = cu.MemRelease(recs[i].handle);
      if (!rc && recs[i].handle_refs > 0) recs[i].handle_refs--;
      printf(" idx=%ld refs=%d", i, recs[i].handle_refs); end(rc);
    } else if (!strcmp(op, "retain")) {
      /* cuMemRetainAllocationHandle of a record's mapped address: one more reference. */
      NEED(1); long i = pick(argv[++a], 1u << K_VMM);
      printf("op=retain");
      if (i < 0) { printf(" error=no-such-record\n"); fflush(stdout); continue; }
      CUmemGenericAllocationHandle h = 0;
      rc = cu.MemRetainAllocationHandle
               ? cu.MemRetainAllocationHandle(&h, (void *)(uintptr_t)recs[i].ptr) : 500;
      if (!rc) recs[i].handle_refs++;
      printf(" idx=%ld handle=0x%llx same=%d refs=%d", i, h, h == recs[i].handle, recs[i].handle_refs);
      end(rc);
    } else if (!strcmp(op, "unmap")) {
      /* cuMemUnmap + cuMemAddressFree of a record; the handle's remaining references are kept. */
      NEED(1); long i = pick(argv[++a], 1u << K_VMM);
      printf("op=unmap");
      if (i < 0) { printf(" error=no-such-record\n"); fflush(stdout); continue; }
      rc = cu.MemUnmap(recs[i].ptr, recs[i].size);
      if (!rc) rc = cu.MemAddressFree(recs[i].ptr, recs[i].size);
      if (!rc && recs[i].handle_refs == 0) recs[i].live = 0;
      printf(" idx=%ld refs=%d", i, recs[i].handle_refs); end(rc);
    } else if (!strcmp(op, "release")) {
      NEED(1); long i = pick(argv[++a], 1u << K_VMM);
      printf("op=release");
      if (i < 0) { printf(" error=no-such-record\n"); fflush(stdout); continue; }
      printf(" idx=%ld", i); end(free_rec((size_t)i));
    } else if (!strcmp(op, "array") || !strcmp(op, "array3d")) {
      int three = op[5] == '3';
      NEED(three ? 3 : 2);
      size_t w = parse_size(argv[++a]), h = parse_size(argv[++a]), d = three ? parse_size(argv[++a]) : 0;
      CUarray arr = NULL;
      if (three) {
        CUDA_ARRAY3D_DESCRIPTOR desc = {w, h, d, CU_AD_FORMAT_FLOAT, 1, 0};
        rc = cu.Array3DCreate(&arr, &desc);
      } else {
        CUDA_ARRAY_DESCRIPTOR desc = {w, h, CU_AD_FORMAT_FLOAT, 1};
        rc = cu.ArrayCreate(&arr, &desc);
      }
      size_t bytes = w * (h ? h : 1) * (d ? d : 1) * 4;
      printf("op=%s width=%zu height=%zu depth=%zu bytes=%zu", op, w, h, d, bytes);
      if (!rc) printf(" idx=%zu array=%p", add_rec((rec_t){.kind = K_ARRAY, .obj = arr, .size = bytes}), arr);
      end(rc);
    } else if (!strcmp(op, "arraydestroy")) {
      NEED(1); long i = pick(argv[++a], 1u << K_ARRAY);
      printf("op=arraydestroy");
      if (i < 0) { printf(" error=no-such-record\n"); fflush(stdout); continue; }
      printf(" idx=%ld", i); end(free_rec((size_t)i));
    } else if (!strcmp(op, "free")) {
      NEED(1); const char *t = argv[++a];
      if (!strcmp(t, "all")) {
        size_t n = 0; CUresult first = 0;
        for (size_t i = 0; i < nrecs; i++) {
          if (!recs[i].live || recs[i].kind == K_CTX) continue;
          CUresult r = free_rec(i);
          if (r && !first) first = r;
          n++;
        }
        printf("op=free target=all count=%zu", n); end(first);
        continue;
      }
      long i = pick(t, 1u << K_LINEAR | 1u << K_PITCH | 1u << K_MANAGED | 1u << K_ASYNC | 1u << K_POOL);
      printf("op=free target=%s", t);
      if (i < 0) { printf(" error=no-such-record\n"); fflush(stdout); continue; }
      printf(" idx=%ld ptr=0x%llx kind=%s", i, recs[i].ptr, kind_name[recs[i].kind]);
      end(free_rec((size_t)i));
    } else if (!strcmp(op, "free-raw")) {
      NEED(1); CUdeviceptr p = strtoull(argv[++a], NULL, 0);
      rc = cu.MemFree(p);
      if (!rc) for (size_t i = 0; i < nrecs; i++) if (recs[i].live && recs[i].ptr == p && recs[i].kind != K_VMM) recs[i].live = 0;
      printf("op=free-raw ptr=0x%llx", p); end(rc);
    } else if (!strcmp(op, "fill")) {
      NEED(1); size_t s = parse_size(argv[++a]); size_t n = 0; CUdeviceptr p;
      while ((rc = cu.MemAlloc(&p, s)) == 0 && n < 10000000) { add_rec((rec_t){.kind = K_LINEAR, .ptr = p, .size = s}); n++; }
      printf("op=fill size=%zu count=%zu total=%zu", s, n, n * s); end(rc);
    } else if (!strcmp(op, "bench-pair")) {
      NEED(2); long n = atol(argv[++a]); size_t s = parse_size(argv[++a]); long fails = 0; CUresult last = 0;
      double t0 = now_ns();
      for (long i = 0; i < n; i++) {
        CUdeviceptr p;
        CUresult r = cu.MemAlloc(&p, s);
        if (r) { fails++; last = r; continue; }
        r = cu.MemFree(p);
        if (r) { fails++; last = r; }
      }
      double dt = now_ns() - t0;
      printf("op=bench-pair n=%ld size=%zu ns_per_pair=%.1f failures=%ld", n, s, n ? dt / n : 0.0, fails); end(last);
    } else if (!strcmp(op, "bench-for")) {
      /* Barrier, then alloc+free pairs until a deadline. Prints "state=ready" and blocks
       * reading a 24-byte record from stdin: the absolute CLOCK_MONOTONIC deadline in ns, as
       * text (a parent writes one record per process into one pipe that is every process's
       * stdin, in one write: all are released together and stop together). On EOF instead
       * (stdin closed or /dev/null) the deadline is SECONDS from now. Reports pairs, its
       * window on CLOCK_MONOTONIC and the process's CPU time (user+sys) over the loop. */
      NEED(2); double sec = atof(argv[++a]); size_t s = parse_size(argv[++a]); long fails = 0; CUresult last = 0;
      printf("op=bench-for state=ready\n"); fflush(stdout);
      char b[25]; size_t got = 0;
      /* poll first: its waiters are all woken by the one write (a blocking pipe read wakes
       * one reader at a time, each after the previous one ran: a chain of scheduling delays). */
      struct pollfd pf = {0, POLLIN, 0};
      while (poll(&pf, 1, -1) < 0 && errno == EINTR) {}
      while (got < 24) {
        ssize_t r = read(0, b + got, 24 - got);
        if (r == 0 || (r < 0 && errno != EINTR)) break;
        if (r > 0) got += (size_t)r;
      }
      b[got] = 0;
      double t0 = now_ns(), stop = got == 24 ? atof(b) : t0 + sec * 1e9, t1 = t0;
      struct timespec c0, c1;
      clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c0);
      unsigned long long pairs = 0;
      do {
        for (int j = 0; j < 64; j++) {
          CUdeviceptr p;
          CUresult r = cu.MemAlloc(&p, s);
          if (r) { fails++; last = r; continue; }
          r = cu.MemFree(p);
          if (r) { fails++; last = r; }
        }
        pairs += 64;
        t1 = now_ns();
      } while (t1 < stop);
      clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c1);
      double cpu = (c1.tv_sec - c0.tv_sec) * 1e9 + (c1.tv_nsec - c0.tv_nsec);
      printf("op=bench-for size=%zu pairs=%llu start_ns=%.0f end_ns=%.0f cpu_ns=%.0f failures=%ld", s, pairs, t0, t1,
             cpu, fails);
      end(last);
    } else if (!strcmp(op, "getproc")) {
      NEED(1); const char *name = argv[++a];
      int ver = (a + 1 < argc && argv[a + 1][0] >= '0' && argv[a + 1][0] <= '9') ? atoi(argv[++a]) : cuda_version;
      unsigned long long fl = (a + 1 < argc && argv[a + 1][0] >= '0' && argv[a + 1][0] <= '9') ? strtoull(argv[++a], NULL, 0) : 0;
      void *p = NULL; CUdriverProcAddressQueryResult st = -1;
      rc = cu.GetProcAddress(name, &p, ver, fl, &st);
      Dl_info info; memset(&info, 0, sizeof info);
      const char *sym = "NULL", *lib = "NULL";
      if (p && dladdr(p, &info)) { sym = info.dli_sname && info.dli_saddr == p ? info.dli_sname : "?"; lib = info.dli_fname ? info.dli_fname : "?"; }
      printf("op=getproc symbol=%s version=%d flags=%llu status=%d ptr=%p sym=%s lib=%s", name, ver, fl, st, p, sym, lib);
      end(rc);
    } else if (!strcmp(op, "getproc1")) {
      /* The 4-argument cuGetProcAddress (CUDA 11.3 ABI), always through dlsym. */
      NEED(1); const char *name = argv[++a];
      int ver = (a + 1 < argc && argv[a + 1][0] >= '0' && argv[a + 1][0] <= '9') ? atoi(argv[++a]) : cuda_version;
      unsigned long long fl = (a + 1 < argc && argv[a + 1][0] >= '0' && argv[a + 1][0] <= '9') ? strtoull(argv[++a], NULL, 0) : 0;
      if (!libcuda) libcuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
      CUresult (*g1)(const char *, void **, int, unsigned long long) = libcuda ? dlsym(libcuda, "cuGetProcAddress") : NULL;
      void *p = (void *)1;
      rc = g1 ? g1(name, &p, ver, fl) : -1;
      Dl_info info; memset(&info, 0, sizeof info);
      const char *symn = p == (void *)1 ? "UNTOUCHED" : "NULL";
      if (p && p != (void *)1 && dladdr(p, &info)) symn = info.dli_sname && info.dli_saddr == p ? info.dli_sname : "?";
      printf("op=getproc1 symbol=%s version=%d flags=%llu sym=%s", name, ver, fl, symn);
      end(rc);
    } else if (!strcmp(op, "errname")) {
      NEED(1); CUresult code = atoi(argv[++a]); const char *n = NULL, *s = NULL;
      rc = cu.GetErrorName(code, &n); CUresult rc2 = cu.GetErrorString(code, &s);
      printf("op=errname code=%d error_name=%s string_rc=%d", code, n ? n : "NULL", rc2);
      end(rc);
    } else if (!strcmp(op, "rq")) {
      printf("op=rq rq_ns=%llu", runqueue_wait_ns()); end(0);
    } else if (!strcmp(op, "sleep")) {
      NEED(1); double sec = atof(argv[++a]);
      struct timespec ts = {(time_t)sec, (long)((sec - (time_t)sec) * 1e9)};
      while (nanosleep(&ts, &ts) && errno == EINTR) {}
      printf("op=sleep seconds=%g", sec); end(0);
    } else if (!strcmp(op, "wait")) {
      struct sigaction sa; memset(&sa, 0, sizeof sa); sa.sa_handler = on_signal;
      sigaction(SIGUSR1, &sa, NULL); sigaction(SIGTERM, &sa, NULL); sigaction(SIGINT, &sa, NULL);
      printf("op=wait state=waiting\n"); fflush(stdout);
      char line[256];
      while (!got_signal && !fgets(line, sizeof line, stdin) && errno == EINTR && !got_signal) errno = 0;
      printf("op=wait state=resumed signal=%d", (int)got_signal); end(0);
    } else if (!strcmp(op, "exit")) {
      NEED(1); int code = atoi(argv[++a]); printf("op=exit code=%d\n", code); fflush(stdout); _exit(code);
    } else {
      die("unknown op '%s' (see --help)", op);
    }
  }
  return 0;
}
