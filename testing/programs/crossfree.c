/*
 * crossfree: allocations freed by another thread while the process keeps allocating (the
 * bad-inputs scenario of `cargo xtask torture`, xtask/src/torture/bad_inputs.rs).
 *
 *   crossfree ROUNDS
 *
 * Thread A allocates ROUNDS times (cuMemAlloc_v2, cuMemAllocPitch_v2, cuMemCreate,
 * cuArrayCreate_v2 in turn, 2 MiB * k bytes, k in 1..3) and hands each allocation to
 * thread B through a queue; B frees it at once from its own thread (cuMemFree_v2,
 * cuMemRelease, cuArrayDestroy), except every 8th, which it keeps (64 at most). A and B run at the same
 * time. When both are done:
 *   held bytes=B count=C allocs=A frees=F refused=R errors=E info_used=U
 * (U = total - free of cuMemGetInfo_v2: what the preload says the process holds; it must be
 * B). Then, on a line on stdin (or EOF), B's kept allocations are freed (from the main
 * thread) and
 *   freed errors=E info_used=U
 * is printed; exit 0. Errors (other than CUDA_ERROR_OUT_OF_MEMORY refusals) are printed as
 * "error op=NAME rc=RC".
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hami_cuda.h"

#define MIB (1ull << 20)
#define OOM 2
#define QCAP 65536
#define KEEP_MAX 64 /* at most 64 x 6 MiB kept: A is not refused for good */

typedef struct { int family; unsigned long long handle; size_t bytes; } Alloc;

static CUcontext g_ctx;
static Alloc g_q[QCAP];
static int g_head, g_tail, g_done;
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_cv = PTHREAD_COND_INITIALIZER;
static Alloc g_kept[QCAP];
static int g_nkept;
static unsigned long long g_allocs, g_frees, g_refused, g_errors;

static void err(const char *op, CUresult rc) {
  __atomic_add_fetch(&g_errors, 1, __ATOMIC_RELAXED);
  printf("error op=%s rc=%d\n", op, rc);
  fflush(stdout);
}

static CUresult release(const Alloc *a) {
  switch (a->family) {
    case 0:
    case 1: return cuMemFree_v2((CUdeviceptr)a->handle);
    case 2: return cuMemRelease(a->handle);
    default: return cuArrayDestroy((CUarray)(uintptr_t)a->handle);
  }
}

static void *thread_a(void *arg) {
  long rounds = (long)(intptr_t)arg;
  CUresult rc = cuCtxSetCurrent(g_ctx);
  if (rc) err("ctxsetcurrent", rc);
  for (long i = 0; i < rounds; i++) {
    size_t k = 1 + (size_t)(i % 3), bytes = k * 2 * MIB;
    Alloc a = {(int)(i % 4), 0, bytes};
    switch (a.family) {
      case 0: {
        CUdeviceptr p = 0;
        rc = cuMemAlloc_v2(&p, bytes);
        a.handle = p;
        break;
      }
      case 1: {
        CUdeviceptr p = 0;
        size_t pitch = 0;
        rc = cuMemAllocPitch_v2(&p, &pitch, 4096, 512 * k, 4);
        a.handle = p;
        if (rc == 0 && pitch * 512 * k != bytes) err("pitch-size", 0);
        break;
      }
      case 2: {
        CUmemAllocationProp prop;
        memset(&prop, 0, sizeof prop);
        prop.type = 1;
        prop.location.type = 1;
        CUmemGenericAllocationHandle h = 0;
        rc = cuMemCreate(&h, bytes, &prop, 0);
        a.handle = h;
        break;
      }
      default: {
        CUDA_ARRAY_DESCRIPTOR d = {1024, 512 * k, 0x20 /* FLOAT */, 1};
        CUarray arr = 0;
        rc = cuArrayCreate_v2(&arr, &d);
        a.handle = (unsigned long long)(uintptr_t)arr;
        break;
      }
    }
    if (rc == OOM) {
      g_refused++;
      continue;
    }
    if (rc) {
      err("alloc", rc);
      continue;
    }
    g_allocs++;
    pthread_mutex_lock(&g_mu);
    while ((g_tail + 1) % QCAP == g_head) pthread_cond_wait(&g_cv, &g_mu);
    g_q[g_tail] = a;
    g_tail = (g_tail + 1) % QCAP;
    pthread_cond_broadcast(&g_cv);
    pthread_mutex_unlock(&g_mu);
  }
  pthread_mutex_lock(&g_mu);
  g_done = 1;
  pthread_cond_broadcast(&g_cv);
  pthread_mutex_unlock(&g_mu);
  return NULL;
}

static void *thread_b(void *arg) {
  (void)arg;
  CUresult rc = cuCtxSetCurrent(g_ctx);
  if (rc) err("ctxsetcurrent", rc);
  unsigned long long n = 0;
  for (;;) {
    pthread_mutex_lock(&g_mu);
    while (g_head == g_tail && !g_done) pthread_cond_wait(&g_cv, &g_mu);
    if (g_head == g_tail) {
      pthread_mutex_unlock(&g_mu);
      return NULL;
    }
    Alloc a = g_q[g_head];
    g_head = (g_head + 1) % QCAP;
    pthread_cond_broadcast(&g_cv);
    pthread_mutex_unlock(&g_mu);
    if (n++ % 8 == 7 && g_nkept < KEEP_MAX) {
      g_kept[g_nkept++] = a;
      continue;
    }
    rc = release(&a);
    if (rc) err("free", rc);
    else g_frees++;
  }
}

static size_t info_used(void) {
  size_t fr = 0, total = 0;
  CUresult rc = cuMemGetInfo_v2(&fr, &total);
  if (rc) err("meminfo", rc);
  return total - fr;
}

int main(int argc, char **argv) {
  long rounds = argc >= 2 ? atol(argv[1]) : 0;
  if (rounds < 1) {
    fprintf(stderr, "usage: crossfree ROUNDS\n");
    return 2;
  }
  CUdevice dev = 0;
  CUresult rc = cuInit(0);
  if (rc == 0) rc = cuDeviceGet(&dev, 0);
  if (rc == 0) rc = cuDevicePrimaryCtxRetain(&g_ctx, dev);
  if (rc == 0) rc = cuCtxSetCurrent(g_ctx);
  if (rc) {
    printf("error op=setup rc=%d\n", rc);
    return 1;
  }
  pthread_t a, b;
  pthread_create(&b, NULL, thread_b, NULL);
  pthread_create(&a, NULL, thread_a, (void *)(intptr_t)rounds);
  pthread_join(a, NULL);
  pthread_join(b, NULL);
  size_t bytes = 0;
  for (int i = 0; i < g_nkept; i++) bytes += g_kept[i].bytes;
  printf("held bytes=%zu count=%d allocs=%llu frees=%llu refused=%llu errors=%llu info_used=%zu\n",
         bytes, g_nkept, g_allocs, g_frees, g_refused, g_errors, info_used());
  fflush(stdout);
  char buf[64];
  (void)!fgets(buf, sizeof buf, stdin);
  unsigned long long e0 = g_errors;
  for (int i = 0; i < g_nkept; i++) {
    rc = release(&g_kept[i]);
    if (rc) err("free", rc);
  }
  printf("freed errors=%llu info_used=%zu\n", g_errors - e0, info_used());
  fflush(stdout);
  return 0;
}
