/* lock_stop.cu: allocation traffic through the driver API for the acceptance runner's
 * "stopped lock holder" cell (`--only lock-stop`; protocol: gpu/README.md).
 *
 * Several of these run under the preload against one region file; the runner SIGSTOPs the
 * one started with WL_ROLE=victim (while it holds the region lock, when it can catch it) and
 * the others, WL_ROLE=worker, must keep going: no call may block longer than the preload's
 * lock bound. Each call is timed.
 *
 * Built on the GPU machine by run_acceptance.py, like mipmap_alloc.cu:
 *   nvcc -O2 lock_stop.cu -o lock_stop -lcuda -Xlinker -rpath -Xlinker <libcuda dir>
 * Usage: ./lock_stop
 *   PID pid=
 *   INIT rc= name=                    cuInit + primary context
 *   READY step=lockstop               waits for a stdin line
 *   T0 t=<unix time>
 *   then loops until a stdin line arrives (checked every WL_TICK_MS, 100) or WL_RUN_MS
 *   (60000) passed: one cuMemAlloc of WL_SMALL_MB (64) and its cuMemFree; the victim adds
 *   WL_REFUSALS (1024) allocations of WL_QUOTA_MB + 1024 MiB, which the preload refuses
 *   without reaching the driver (the region lock is taken for each), and runs
 *   WL_VICTIM_THREADS (1) more threads that only make such refused allocations, so that one
 *   of its threads holds the region lock much of the time.
 *   TICK t=<unix time> calls=<n>      every WL_TICK_MS, between calls
 *   STATS role= calls= ok= oom= refused= over_quota= errors= free_errors= max_call_ms=
 *         max_call_t= slow= slow_ms= first_error= threads=
 *                                     (all threads' calls together)
 *                                     refused / over_quota: the victim's over-quota requests
 *                                     refused (OOM) / granted; oom: refusals of the WL_SMALL_MB
 *                                     allocations; errors: any other failure; max_call_t: unix
 *                                     time the slowest call began; slow: calls longer than
 *                                     WL_SLOW_MS (2500)
 *   DONE rc=0                         everything freed
 * rc values are CUresults, names their cuGetErrorName. Written in C so that gpu/testing/ can
 * compile it with gcc against a stub driver (no GPU needed).
 */
#include <cuda.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MIB ((size_t)1 << 20)

static double now_real(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static double now_mono_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static size_t env_num(const char *name, size_t dflt) {
  const char *v = getenv(name);
  if (!v || !*v) return dflt;
  return (size_t)strtoull(v, NULL, 10);
}

static const char *ename(CUresult r) {
  const char *s = NULL;
  if (cuGetErrorName(r, &s) != CUDA_SUCCESS || !s) return "unknown";
  return s;
}

/* Whether a line is waiting on stdin (EOF counts: the runner is gone). */
static int stdin_ready(void) {
  struct pollfd p = {0, POLLIN, 0};
  return poll(&p, 1, 0) > 0;
}

struct stats {
  long calls, ok, oom, refused, over_quota, errors, free_errors, slow;
  double max_ms, max_t, slow_limit_ms;
  CUresult first_error;
};

/* Times one call: t0 the CLOCK_MONOTONIC ms before it, w0 the unix time before it. */
static void timed(struct stats *s, double t0, double w0) {
  double ms = now_mono_ms() - t0;
  s->calls++;
  if (ms > s->max_ms) {
    s->max_ms = ms;
    s->max_t = w0;
  }
  if (ms > s->slow_limit_ms) s->slow++;
}

static void note_error(struct stats *s, CUresult r) {
  s->errors++;
  if (s->first_error == CUDA_SUCCESS) s->first_error = r;
}

/* n allocations of `big` bytes, past the quota: each must be refused. */
static void refuse(struct stats *s, size_t big, size_t n) {
  for (size_t i = 0; i < n; i++) {
    CUdeviceptr q = 0;
    double t0 = now_mono_ms(), w0 = now_real();
    CUresult r = cuMemAlloc(&q, big);
    timed(s, t0, w0);
    if (r == CUDA_SUCCESS) {
      s->over_quota++; /* granted beyond the quota: counted, and given back */
      cuMemFree(q);
    } else if (r == CUDA_ERROR_OUT_OF_MEMORY) {
      s->refused++;
    } else {
      note_error(s, r);
    }
  }
}

struct refuser {
  pthread_t thread;
  CUcontext ctx;
  size_t big;
  struct stats s;
};

static int refusers_stop;

static void *refuser_main(void *arg) {
  struct refuser *t = (struct refuser *)arg;
  CUresult r = cuCtxSetCurrent(t->ctx);
  if (r != CUDA_SUCCESS) {
    note_error(&t->s, r);
    return NULL;
  }
  while (!__atomic_load_n(&refusers_stop, __ATOMIC_RELAXED)) refuse(&t->s, t->big, 64);
  return NULL;
}

/* Adds a thread's counts to the process's. */
static void merge(struct stats *into, const struct stats *s) {
  into->calls += s->calls;
  into->refused += s->refused;
  into->over_quota += s->over_quota;
  into->errors += s->errors;
  into->slow += s->slow;
  if (into->first_error == CUDA_SUCCESS) into->first_error = s->first_error;
  if (s->max_ms > into->max_ms) {
    into->max_ms = s->max_ms;
    into->max_t = s->max_t;
  }
}

int main(void) {
  const char *role_env = getenv("WL_ROLE");
  int victim = role_env && strcmp(role_env, "victim") == 0;
  size_t small = env_num("WL_SMALL_MB", 64) * MIB;
  size_t big = (env_num("WL_QUOTA_MB", 4096) + 1024) * MIB;
  size_t refusals = victim ? env_num("WL_REFUSALS", 1024) : 0;
  size_t nthreads = victim ? env_num("WL_VICTIM_THREADS", 1) : 0, started = 0;
  struct refuser *threads = NULL;
  double tick_ms = (double)env_num("WL_TICK_MS", 100);
  double run_ms = (double)env_num("WL_RUN_MS", 60000);
  struct stats s;
  CUdevice dev = 0;
  CUcontext ctx = NULL;
  CUresult r;
  char buf[256];
  double start, next_tick;

  memset(&s, 0, sizeof s);
  s.first_error = CUDA_SUCCESS;
  s.slow_limit_ms = (double)env_num("WL_SLOW_MS", 2500);
  setvbuf(stdout, NULL, _IOLBF, 0);
  printf("PID pid=%d\n", (int)getpid());
  r = cuInit(0);
  if (r == CUDA_SUCCESS) r = cuDeviceGet(&dev, 0);
  if (r == CUDA_SUCCESS) r = cuDevicePrimaryCtxRetain(&ctx, dev);
  if (r == CUDA_SUCCESS) r = cuCtxSetCurrent(ctx);
  printf("INIT rc=%d name=%s\n", (int)r, ename(r));
  if (r != CUDA_SUCCESS) {
    printf("DONE rc=2\n");
    return 2;
  }
  printf("READY step=lockstop\n");
  if (!fgets(buf, sizeof buf, stdin)) {
    printf("EOF step=lockstop\n");
    return 3;
  }
  printf("T0 t=%.6f\n", now_real());
  start = now_mono_ms();
  next_tick = start + tick_ms;
  if (nthreads) threads = (struct refuser *)calloc(nthreads, sizeof *threads);
  for (size_t i = 0; threads && i < nthreads; i++) {
    threads[i].ctx = ctx;
    threads[i].big = big;
    threads[i].s.slow_limit_ms = s.slow_limit_ms;
    if (pthread_create(&threads[i].thread, NULL, refuser_main, &threads[i]) != 0) break;
    started++;
  }
  for (;;) {
    CUdeviceptr p = 0;
    double t0 = now_mono_ms(), w0 = now_real();
    r = cuMemAlloc(&p, small);
    timed(&s, t0, w0);
    if (r == CUDA_SUCCESS) {
      s.ok++;
      t0 = now_mono_ms();
      w0 = now_real();
      r = cuMemFree(p);
      timed(&s, t0, w0);
      if (r != CUDA_SUCCESS) {
        s.free_errors++;
        note_error(&s, r);
      }
    } else if (r == CUDA_ERROR_OUT_OF_MEMORY) {
      s.oom++;
    } else {
      note_error(&s, r);
    }
    refuse(&s, big, refusals);
    t0 = now_mono_ms();
    if (t0 >= next_tick) {
      next_tick = t0 + tick_ms;
      printf("TICK t=%.6f calls=%ld\n", now_real(), s.calls);
      if (stdin_ready() || t0 - start >= run_ms) break;
    }
  }
  __atomic_store_n(&refusers_stop, 1, __ATOMIC_RELAXED);
  for (size_t i = 0; i < started; i++) {
    pthread_join(threads[i].thread, NULL);
    merge(&s, &threads[i].s);
  }
  free(threads);
  printf("STATS role=%s calls=%ld ok=%ld oom=%ld refused=%ld over_quota=%ld errors=%ld "
         "free_errors=%ld max_call_ms=%.3f max_call_t=%.6f slow=%ld slow_ms=%.0f "
         "first_error=%s threads=%zu\n",
         victim ? "victim" : "worker", s.calls, s.ok, s.oom, s.refused, s.over_quota, s.errors,
         s.free_errors,
         s.max_ms, s.max_t, s.slow, s.slow_limit_ms,
         s.first_error == CUDA_SUCCESS ? "none" : ename(s.first_error), started);
  cuDevicePrimaryCtxRelease(dev);
  printf("DONE rc=0\n");
  return 0;
}
