/* A stand-in for the preload's region lock, for the stopped-lock-holder cell's integration
 * tests (gpu/test_runner.py LockStopIntegration); included by cuda.h. Active only with
 * WL_STUB_LOCK=bounded or unbounded, a fake hami preload in LD_PRELOAD and
 * CUDA_DEVICE_MEMORY_SHARED_CACHE set: then cuMemAlloc and cuMemFree charge a region-shaped
 * file (magic, version 3, header size 1024, the lock word at byte 48, used at byte 584, no
 * slots) under a lock whose word holds the owner's thread id, as glibc's robust mutex does.
 * "unbounded" waits for the lock as long as it takes (today's preload); "bounded" gives up after
 * HAMI_LOCK_TIMEOUT_MS (2000): the allocation is refused with CUDA_ERROR_OUT_OF_MEMORY, and a
 * free's uncharge is kept for the next time the lock is taken (or the exit). The lock is held
 * WL_STUB_LOCK_HOLD_US (20) microseconds, so that a SIGSTOP lands inside it often.
 * Not a model of the preload. */
#ifndef WL_STUB_REGION_LOCK_H
#define WL_STUB_REGION_LOCK_H
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define STUBL_HEADER 1024
#define STUBL_OFF_LOCK 48
#define STUBL_OFF_USED 584

static unsigned char *stubl_map;
static int stubl_mode; /* 0: off, 1: bounded, 2: unbounded (set once, by stubl_setup) */
static uint64_t stubl_pending;

static double stubl_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static uint32_t *stubl_word(void) { return (uint32_t *)(stubl_map + STUBL_OFF_LOCK); }
static uint64_t *stubl_used(void) { return (uint64_t *)(stubl_map + STUBL_OFF_USED); }

static int stubl_lock(int bounded) {
  uint32_t tid = (uint32_t)syscall(SYS_gettid);
  const char *b = getenv("HAMI_LOCK_TIMEOUT_MS");
  double bound = b && *b ? atof(b) : 2000.0, t0 = stubl_ms();
  for (;;) {
    uint32_t free_word = 0;
    if (__atomic_compare_exchange_n(stubl_word(), &free_word, tid, 0, __ATOMIC_ACQUIRE,
                                    __ATOMIC_RELAXED))
      break;
    if (bounded && stubl_ms() - t0 > bound) return 0;
    usleep(50);
  }
  if (stubl_pending) {
    *stubl_used() -= stubl_pending;
    stubl_pending = 0;
  }
  return 1;
}

static void stubl_unlock(void) {
  const char *h = getenv("WL_STUB_LOCK_HOLD_US");
  double until = stubl_ms() + (h && *h ? atof(h) : 20.0) / 1000.0;
  while (stubl_ms() < until) {
  }
  __atomic_store_n(stubl_word(), 0, __ATOMIC_RELEASE);
}

static void stubl_exit(void) {
  if (stubl_pending && stubl_lock(0)) stubl_unlock();
}

static void stubl_setup(void) {
  {
    const char *m = getenv("WL_STUB_LOCK"), *pre = getenv("LD_PRELOAD");
    const char *path = getenv("CUDA_DEVICE_MEMORY_SHARED_CACHE");
    int fd;
    if (!m || !pre || !strstr(pre, "hami") || strstr(pre, "blind") || !path) return;
    fd = open(path, O_RDWR | O_CREAT, 0600);
    if (fd < 0) return;
    flock(fd, LOCK_EX);
    if (lseek(fd, 0, SEEK_END) < STUBL_HEADER) {
      unsigned char h[STUBL_HEADER];
      uint32_t v[2] = {3, STUBL_HEADER};
      uint64_t total = STUBL_HEADER;
      memset(h, 0, sizeof h);
      memcpy(h, "HAMIRSv\x01", 8);
      memcpy(h + 8, v, sizeof v);
      memcpy(h + 16, &total, sizeof total);
      if (pwrite(fd, h, sizeof h, 0) != (ssize_t)sizeof h) {
        close(fd);
        return;
      }
    }
    flock(fd, LOCK_UN);
    stubl_map = (unsigned char *)mmap(NULL, STUBL_HEADER, PROT_READ | PROT_WRITE, MAP_SHARED,
                                      fd, 0);
    close(fd);
    if (stubl_map == MAP_FAILED) return;
    stubl_mode = strcmp(m, "bounded") == 0 ? 1 : 2;
    atexit(stubl_exit);
  }
}

static int stubl_on(void) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, stubl_setup);
  return stubl_mode > 0;
}

/* cuMemAlloc under the lock: charged to the file's used, refused past the quota (total). */
static int stubl_alloc(void **out, size_t n, size_t total) {
  size_t *h;
  if (!stubl_lock(stubl_mode == 1)) return 0;
  if (*stubl_used() + n > total || !(h = (size_t *)malloc(n + 16))) {
    stubl_unlock();
    return 0;
  }
  h[0] = n;
  *stubl_used() += n;
  stubl_unlock();
  *out = h + 2;
  return 1;
}

static void stubl_free(void *p) {
  size_t *h = (size_t *)p - 2;
  size_t n = h[0];
  free(h);
  if (stubl_lock(stubl_mode == 1)) {
    *stubl_used() -= n;
    stubl_unlock();
  } else {
    stubl_pending += n;
  }
}
#endif
