/*
 * tortureload: the workload of `cargo xtask torture` (xtask/src/torture.rs).
 *
 * Linked with -lcuda (the fake driver) and run with the real preload. Every allocation it
 * makes charges an exact multiple of 2 MiB on device 0, whatever the family, so that the
 * region's per-slot data usage must equal what the process reports holding, to the byte:
 *
 *   family 0  cuMemAlloc_v2(2 MiB * k)                      / cuMemFree_v2
 *   family 1  cuMemAllocPitch_v2(4096, 512 * k, 4)          / cuMemFree_v2   (pitch 4096)
 *   family 2  cuMemAllocAsync(2 MiB * k, stream 0)          / cuMemFreeAsync
 *   family 3  cuMemCreate(2 MiB * k, pinned on device 0)    / cuMemRelease
 *   family 4  cuArrayCreate_v2(1024 x 512k, FLOAT, 1 ch)     / cuArrayDestroy
 *
 * Modes (one line per event on stdout, flushed at once; commands on stdin):
 *
 *   tortureload storm THREADS MAXHOLD SEED [PAUSE_US]
 *     Each thread loops: allocate (random family, k in 1..4) or free a random one of its
 *     allocations (at most MAXHOLD held), sleeping PAUSE_US (default 0) between calls, until
 *     "stop" arrives on stdin. TORTURE_FAMILY=N (0..4) restricts it to one family. Every 100 ms:
 *       tick win_us=W inflight_us=I ops=N refused=R errors=E
 *     (W = the longest call that finished in the last window, I = the longest call still in
 *     progress). On "stop": threads finish their call and join, then
 *       held bytes=B count=C max_us=M ops=N refused=R errors=E
 *     On "exit" (or EOF): everything is freed, "freed errors=E", exit 0.
 *
 *   tortureload race THREADS CHUNK_MIB
 *     On each "go": THREADS threads (thread t uses family t % 5) allocate CHUNK_MIB chunks
 *     until one is refused, then
 *       round bytes=B count=C max_us=M refused=R errors=E
 *     (R = threads whose last call returned CUDA_ERROR_OUT_OF_MEMORY, E = other failures).
 *     "free": everything is freed, "freed errors=E". EOF: exit 0.
 *
 *   tortureload holdlock REGION_PATH LOCK_OFFSET [HOW [CPU_MS]]
 *     Maps the region and takes its process-shared mutex (at LOCK_OFFSET) directly, prints
 *     "locked rc=RC", then, while holding it, by HOW:
 *       sigstop (default)  stops itself (SIGSTOP); continues when continued;
 *       wait               waits for a line on stdin (the caller ptrace-stops it meanwhile);
 *       spin               lowers its priority to nice 19 first, then burns CPU_MS of CPU
 *                          time (the caller runs CPU hogs: the holder is starved);
 *     then unlocks, prints "unlocked cpu_ms=C wall_ms=W" (W: how long it held the lock) and
 *     exits. Simulates a process stopped or starved inside the preload's critical section.
 *
 *   tortureload spin MS
 *     Burns CPU at nice 0 (where allowed: as root) for MS ms of wall time (a CPU hog), then
 *     exits.
 *
 * TORTURE_PAGEOUT=1 (storm): thread 0 pages the region's mapping out before each of its
 * calls (msync, madvise(MADV_PAGEOUT) on every mapping of the file named by
 * CUDA_DEVICE_MEMORY_SHARED_CACHE, then posix_fadvise(POSIX_FADV_DONTNEED) on it); ticks
 * then carry "pageouts=N pages=P evicted=E" (E: pages of the P of the mappings that were not
 * resident right after a page-out, per mincore, summed over the page-outs).
 *
 * Errors (any result other than CUDA_SUCCESS, and CUDA_ERROR_OUT_OF_MEMORY for allocations)
 * are printed as "error op=NAME rc=RC" (the first 20) and counted.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <time.h>
#include <unistd.h>

#include "hami_cuda.h"

#define MIB (1ull << 20)
#define FAMILIES 5
#define MAX_THREADS 64
#define MAX_HOLD 4096

static const char *const FAMILY_NAME[FAMILIES] = {"alloc", "pitch", "async", "create", "array"};

typedef struct { int family; unsigned long long handle; size_t bytes; } Held;

typedef struct {
  pthread_t th;
  int id;
  uint64_t rng;
  Held held[MAX_HOLD];
  int nheld;
  _Atomic uint64_t inflight_ns; /* start of the call in progress, 0 if none */
  _Atomic uint64_t win_ns;      /* longest call finished in the current window */
  uint64_t max_ns;              /* longest call overall */
  _Atomic uint64_t ops, refused, errors;
  int last_rc;
} Worker;

static CUcontext g_ctx;
static Worker g_w[MAX_THREADS];
static int g_threads;
static int g_maxhold = 8;
static size_t g_chunk = 2 * MIB;
static unsigned g_pause_us;
static int g_family = -1; /* TORTURE_FAMILY=N: storm uses only family N */
static atomic_int g_stop;
static atomic_int g_errors_printed;
static int g_pageout; /* TORTURE_PAGEOUT=1 */
static _Atomic uint64_t g_pageouts, g_pages, g_evicted;

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint64_t rnd(Worker *w) {
  w->rng ^= w->rng << 13;
  w->rng ^= w->rng >> 7;
  w->rng ^= w->rng << 17;
  return w->rng;
}

static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static pthread_mutex_t g_out = PTHREAD_MUTEX_INITIALIZER;
#include <stdarg.h>
static void say(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  pthread_mutex_lock(&g_out);
  vprintf(fmt, ap);
  putchar('\n');
  fflush(stdout);
  pthread_mutex_unlock(&g_out);
  va_end(ap);
}

static void error(Worker *w, const char *op, CUresult rc) {
  atomic_fetch_add(&w->errors, 1);
  if (atomic_fetch_add(&g_errors_printed, 1) < 20) say("error op=%s rc=%d thread=%d", op, rc, w->id);
}

static void call_begin(Worker *w) { atomic_store(&w->inflight_ns, now_ns()); }

static void call_end(Worker *w) {
  uint64_t d = now_ns() - atomic_load(&w->inflight_ns);
  atomic_store(&w->inflight_ns, 0);
  if (d > w->max_ns) w->max_ns = d;
  uint64_t cur = atomic_load(&w->win_ns);
  while (d > cur && !atomic_compare_exchange_weak(&w->win_ns, &cur, d)) {
  }
  atomic_fetch_add(&w->ops, 1);
}

/* Allocates `bytes` (a multiple of 2 MiB) with `family`; returns the driver's result. */
static CUresult do_alloc(Worker *w, int family, size_t bytes) {
  Held h = {family, 0, bytes};
  CUresult rc;
  size_t k = bytes / (2 * MIB);
  call_begin(w);
  switch (family) {
    case 0: {
      CUdeviceptr p = 0;
      rc = cuMemAlloc_v2(&p, bytes);
      h.handle = p;
      break;
    }
    case 1: {
      CUdeviceptr p = 0;
      size_t pitch = 0;
      rc = cuMemAllocPitch_v2(&p, &pitch, 4096, 512 * k, 4);
      h.handle = p;
      if (rc == 0 && pitch * 512 * k != bytes) {
        say("error op=pitch-size pitch=%zu", pitch);
        atomic_fetch_add(&w->errors, 1);
      }
      break;
    }
    case 2: {
      CUdeviceptr p = 0;
      rc = cuMemAllocAsync(&p, bytes, NULL);
      h.handle = p;
      break;
    }
    case 3: {
      CUmemAllocationProp prop;
      memset(&prop, 0, sizeof prop);
      prop.type = 1;          /* CU_MEM_ALLOCATION_TYPE_PINNED */
      prop.location.type = 1; /* CU_MEM_LOCATION_TYPE_DEVICE */
      prop.location.id = 0;
      CUmemGenericAllocationHandle hd = 0;
      rc = cuMemCreate(&hd, bytes, &prop, 0);
      h.handle = hd;
      break;
    }
    default: {
      CUDA_ARRAY_DESCRIPTOR d = {1024, 512 * k, 0x20 /* FLOAT */, 1};
      CUarray a = NULL;
      rc = cuArrayCreate_v2(&a, &d);
      h.handle = (unsigned long long)(uintptr_t)a;
      break;
    }
  }
  call_end(w);
  w->last_rc = rc;
  if (rc == 0) {
    if (w->nheld < MAX_HOLD) {
      w->held[w->nheld++] = h;
    }
  } else if (rc == CUDA_ERROR_OUT_OF_MEMORY) {
    atomic_fetch_add(&w->refused, 1);
  } else {
    error(w, FAMILY_NAME[family], rc);
  }
  return rc;
}

static void do_free(Worker *w, int i) {
  Held h = w->held[i];
  CUresult rc;
  call_begin(w);
  switch (h.family) {
    case 0:
    case 1: rc = cuMemFree_v2(h.handle); break;
    case 2: rc = cuMemFreeAsync(h.handle, NULL); break;
    case 3: rc = cuMemRelease(h.handle); break;
    default: rc = cuArrayDestroy((CUarray)(uintptr_t)h.handle); break;
  }
  call_end(w);
  if (rc != 0) error(w, "free", rc);
  w->held[i] = w->held[--w->nheld];
}

static void free_all(Worker *w) {
  while (w->nheld > 0) do_free(w, w->nheld - 1);
}

static void held_totals(size_t *bytes, int *count) {
  *bytes = 0;
  *count = 0;
  for (int t = 0; t < g_threads; t++)
    for (int i = 0; i < g_w[t].nheld; i++) {
      *bytes += g_w[t].held[i].bytes;
      (*count)++;
    }
}

#ifndef MADV_PAGEOUT
#define MADV_PAGEOUT 21
#endif

/* Pages out every mapping of the region file (see TORTURE_PAGEOUT above). */
static void pageout_region(void) {
  /* Matched by device and inode, not by name: the process that created the region maps it
   * under the temporary name it was published from ("NAME.new.PID.N.N (deleted)"). */
  const char *path = getenv("CUDA_DEVICE_MEMORY_SHARED_CACHE");
  struct stat st;
  if (!path || stat(path, &st) != 0) return;
  FILE *f = fopen("/proc/self/maps", "re");
  if (!f) return;
  char line[4352];
  uint64_t pages = 0, evicted = 0;
  long pg = sysconf(_SC_PAGESIZE);
  while (fgets(line, sizeof line, f)) {
    unsigned long lo, hi, ino;
    unsigned maj, mnr;
    if (sscanf(line, "%lx-%lx %*s %*s %x:%x %lu", &lo, &hi, &maj, &mnr, &ino) != 5) continue;
    if (ino != (unsigned long)st.st_ino || maj != major(st.st_dev) || mnr != minor(st.st_dev))
      continue;
    size_t len = hi - lo;
    msync((void *)lo, len, MS_SYNC);
    madvise((void *)lo, len, MADV_PAGEOUT);
    size_t np = len / (size_t)pg;
    unsigned char *vec = malloc(np);
    if (vec && mincore((void *)lo, len, vec) == 0)
      for (size_t i = 0; i < np; i++) {
        pages++;
        evicted += !(vec[i] & 1);
      }
    free(vec);
  }
  fclose(f);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    close(fd);
  }
  atomic_fetch_add(&g_pageouts, 1);
  atomic_store(&g_pages, pages);
  atomic_fetch_add(&g_evicted, evicted);
}

static void *storm_thread(void *arg) {
  Worker *w = arg;
  CUresult rc = cuCtxSetCurrent(g_ctx);
  if (rc != 0) error(w, "ctxsetcurrent", rc);
  while (!atomic_load(&g_stop)) {
    if (g_pageout && w->id == 0) pageout_region();
    if (w->nheld >= g_maxhold || (w->nheld > 0 && rnd(w) % 100 < 45)) {
      do_free(w, (int)(rnd(w) % (uint64_t)w->nheld));
    } else {
      int family = g_family >= 0 ? g_family : (int)(rnd(w) % FAMILIES);
      do_alloc(w, family, (size_t)(1 + rnd(w) % 4) * 2 * MIB);
    }
    if (g_pause_us) usleep(g_pause_us);
  }
  return NULL;
}

static void *race_thread(void *arg) {
  Worker *w = arg;
  CUresult rc = cuCtxSetCurrent(g_ctx);
  if (rc != 0) error(w, "ctxsetcurrent", rc);
  while (do_alloc(w, w->id % FAMILIES, g_chunk) == 0) {
  }
  return NULL;
}

/* Reads one command line from stdin, waiting at most `ms` (-1: forever). Returns 1 with a
 * line, 0 on timeout, -1 at EOF. */
static int read_cmd(char *buf, size_t n, int ms) {
  struct pollfd p = {0, POLLIN, 0};
  int r = poll(&p, 1, ms);
  if (r == 0) return 0;
  if (r < 0) return errno == EINTR ? 0 : -1;
  if (!fgets(buf, (int)n, stdin)) return -1;
  buf[strcspn(buf, "\n")] = 0;
  return 1;
}

static int setup(void) {
  CUdevice dev = 0;
  CUresult rc = cuInit(0);
  if (rc == 0) rc = cuDeviceGet(&dev, 0);
  if (rc == 0) rc = cuDevicePrimaryCtxRetain(&g_ctx, dev);
  if (rc == 0) rc = cuCtxSetCurrent(g_ctx);
  if (rc != 0) {
    say("error op=setup rc=%d", rc);
    return 1;
  }
  say("ready pid=%d", (int)getpid());
  return 0;
}

static uint64_t max_of(uint64_t a, uint64_t b) { return a > b ? a : b; }

static void sums(uint64_t *ops, uint64_t *refused, uint64_t *errors, uint64_t *max_ns) {
  *ops = *refused = *errors = *max_ns = 0;
  for (int t = 0; t < g_threads; t++) {
    *ops += atomic_load(&g_w[t].ops);
    *refused += atomic_load(&g_w[t].refused);
    *errors += atomic_load(&g_w[t].errors);
    *max_ns = max_of(*max_ns, g_w[t].max_ns);
  }
}

static int finish(void) {
  char buf[64];
  while (read_cmd(buf, sizeof buf, -1) == 1 && strcmp(buf, "exit") != 0) {
  }
  uint64_t e0 = 0, e1 = 0, x;
  sums(&x, &x, &e0, &x);
  for (int t = 0; t < g_threads; t++) free_all(&g_w[t]);
  sums(&x, &x, &e1, &x);
  say("freed errors=%llu", (unsigned long long)(e1 - e0));
  return 0;
}

static int storm(int seed) {
  if (setup()) return 1;
  for (int t = 0; t < g_threads; t++) {
    g_w[t].id = t;
    g_w[t].rng = 0x9E3779B97F4A7C15ull ^ ((uint64_t)getpid() << 20) ^ ((uint64_t)seed << 8) ^ (uint64_t)t;
    if (pthread_create(&g_w[t].th, NULL, storm_thread, &g_w[t]) != 0) {
      say("error op=pthread_create rc=0");
      return 1;
    }
  }
  char buf[64];
  for (;;) {
    int r = read_cmd(buf, sizeof buf, 100);
    if (r < 0 || (r == 1 && !strcmp(buf, "stop"))) break;
    uint64_t win = 0, inflight = 0, now = now_ns(), ops, refused, errors, mx;
    for (int t = 0; t < g_threads; t++) {
      win = max_of(win, atomic_exchange(&g_w[t].win_ns, 0));
      uint64_t s = atomic_load(&g_w[t].inflight_ns);
      if (s != 0 && now > s) inflight = max_of(inflight, now - s);
    }
    sums(&ops, &refused, &errors, &mx);
    say("tick win_us=%llu inflight_us=%llu ops=%llu refused=%llu errors=%llu pageouts=%llu "
        "pages=%llu evicted=%llu",
        (unsigned long long)(win / 1000), (unsigned long long)(inflight / 1000),
        (unsigned long long)ops, (unsigned long long)refused, (unsigned long long)errors,
        (unsigned long long)atomic_load(&g_pageouts), (unsigned long long)atomic_load(&g_pages),
        (unsigned long long)atomic_load(&g_evicted));
  }
  atomic_store(&g_stop, 1);
  for (int t = 0; t < g_threads; t++) pthread_join(g_w[t].th, NULL);
  size_t bytes;
  int count;
  held_totals(&bytes, &count);
  uint64_t ops, refused, errors, mx;
  sums(&ops, &refused, &errors, &mx);
  say("held bytes=%zu count=%d max_us=%llu ops=%llu refused=%llu errors=%llu", bytes, count,
      (unsigned long long)(mx / 1000), (unsigned long long)ops, (unsigned long long)refused,
      (unsigned long long)errors);
  return finish();
}

static int race(void) {
  if (setup()) return 1;
  char buf[64];
  int r;
  while ((r = read_cmd(buf, sizeof buf, -1)) >= 0) {
    if (r == 0) continue;
    if (!strcmp(buf, "go")) {
      uint64_t e0, x;
      sums(&x, &x, &e0, &x);
      for (int t = 0; t < g_threads; t++) {
        g_w[t].id = t;
        g_w[t].max_ns = 0;
        g_w[t].last_rc = 0;
        if (pthread_create(&g_w[t].th, NULL, race_thread, &g_w[t]) != 0) {
          say("error op=pthread_create rc=0");
          return 1;
        }
      }
      for (int t = 0; t < g_threads; t++) pthread_join(g_w[t].th, NULL);
      size_t bytes;
      int count, refused = 0;
      held_totals(&bytes, &count);
      for (int t = 0; t < g_threads; t++) refused += g_w[t].last_rc == CUDA_ERROR_OUT_OF_MEMORY;
      uint64_t ops, rf, errors, mx;
      sums(&ops, &rf, &errors, &mx);
      say("round bytes=%zu count=%d max_us=%llu refused=%d errors=%llu", bytes, count,
          (unsigned long long)(mx / 1000), refused, (unsigned long long)(errors - e0));
    } else if (!strcmp(buf, "free")) {
      uint64_t e0, e1, x;
      sums(&x, &x, &e0, &x);
      for (int t = 0; t < g_threads; t++) free_all(&g_w[t]);
      sums(&x, &x, &e1, &x);
      say("freed errors=%llu", (unsigned long long)(e1 - e0));
    }
  }
  return 0;
}

static uint64_t cpu_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int holdlock(const char *path, long off, const char *how, long cpu_ms) {
  int fd = open(path, O_RDWR | O_CLOEXEC);
  if (fd < 0) {
    say("error op=open rc=%d", errno);
    return 1;
  }
  void *m = mmap(NULL, (size_t)off + 64, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (m == MAP_FAILED) {
    say("error op=mmap rc=%d", errno);
    return 1;
  }
  pthread_mutex_t *mu = (pthread_mutex_t *)((char *)m + off);
  if (!strcmp(how, "spin") && setpriority(PRIO_PROCESS, 0, 19) != 0) {
    say("error op=setpriority rc=%d", errno);
    return 1;
  }
  int rc = pthread_mutex_lock(mu);
  if (rc == EOWNERDEAD) pthread_mutex_consistent(mu);
  uint64_t t0 = now_ns(), c0 = cpu_ns();
  say("locked rc=%d", rc);
  if (!strcmp(how, "wait")) {
    char buf[64];
    while (read_cmd(buf, sizeof buf, -1) == 0) {
    }
  } else if (!strcmp(how, "spin")) {
    volatile uint64_t x = 0;
    while (cpu_ns() - c0 < (uint64_t)cpu_ms * 1000000ull) x++;
  } else {
    raise(SIGSTOP);
  }
  uint64_t held = now_ns() - t0, cpu = cpu_ns() - c0;
  pthread_mutex_unlock(mu);
  say("unlocked cpu_ms=%llu wall_ms=%llu", (unsigned long long)(cpu / 1000000),
      (unsigned long long)(held / 1000000));
  return 0;
}

static int spin(long ms) {
  uint64_t end = now_ns() + (uint64_t)ms * 1000000ull;
  volatile uint64_t x = 0;
  while (now_ns() < end) x++;
  return 0;
}

static int spin_nice0(long ms) {
  /* A hog at nice 0 even when started from a niced parent (allowed as root; else as is). */
  (void)setpriority(PRIO_PROCESS, 0, 0);
  return spin(ms);
}

int main(int argc, char **argv) {
  if (argc >= 5 && !strcmp(argv[1], "storm")) {
    g_threads = atoi(argv[2]);
    g_maxhold = atoi(argv[3]);
    if (g_threads < 1 || g_threads > MAX_THREADS || g_maxhold < 1 || g_maxhold > MAX_HOLD) return 2;
    if (argc >= 6) g_pause_us = (unsigned)atoi(argv[5]);
    if (getenv("TORTURE_FAMILY")) g_family = atoi(getenv("TORTURE_FAMILY")) % FAMILIES;
    g_pageout = getenv("TORTURE_PAGEOUT") && !strcmp(getenv("TORTURE_PAGEOUT"), "1");
    return storm(atoi(argv[4]));
  }
  if (argc >= 4 && !strcmp(argv[1], "race")) {
    g_threads = atoi(argv[2]);
    g_chunk = (size_t)atoi(argv[3]) * MIB;
    if (g_threads < 1 || g_threads > MAX_THREADS || g_chunk == 0 || g_chunk % (2 * MIB)) return 2;
    return race();
  }
  if (argc >= 4 && !strcmp(argv[1], "holdlock"))
    return holdlock(argv[2], atol(argv[3]), argc >= 5 ? argv[4] : "sigstop",
                    argc >= 6 ? atol(argv[5]) : 0);
  if (argc >= 3 && !strcmp(argv[1], "spin")) return spin_nice0(atol(argv[2]));
  fprintf(stderr,
          "usage: tortureload storm THREADS MAXHOLD SEED [PAUSE_US] | race THREADS CHUNK_MIB | "
          "holdlock REGION LOCK_OFFSET [sigstop|wait|spin CPU_MS] | spin MS\n");
  return 2;
}
