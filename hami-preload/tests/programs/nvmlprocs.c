/*
 * nvmlprocs: NVML's process lists the way nvidia-smi reads them (dlopen("libnvidia-ml.so.1")
 * + dlsym), every version of the compute, graphics and MPS lists, with the `*infoCount`
 * protocol of nvml.h checked on the way. One parseable line per fact:
 *
 *     query fn=compute_v3 index=0 rc=7 count=2         (*infoCount = 0, infos = NULL)
 *     small fn=compute_v3 index=0 rc=7 count=2         (*infoCount = needed - 1)
 *     nullcount fn=compute_v3 index=0 rc=2             (infoCount = NULL)
 *     list fn=compute_v3 index=0 rc=0 count=2 guard=1  (*infoCount = needed + 4)
 *     proc fn=compute_v3 index=0 pid=7 used=268435456 gi=4294967295 ci=4294967295
 *
 * `guard=1`: every byte after the `count` entries of the array (one more entry than the
 * capacity was allocated, all bytes 0xAB) is untouched: the library wrote entries of this
 * version's size (16 bytes for the v1 names, 24 for _v2/_v3) and no more than it said.
 * `gi`/`ci` only for _v2/_v3 and the detail list. `detail_compute`, `detail_graphics`,
 * `detail_mps`: nvmlDeviceGetRunningProcessDetailList (nvmlProcessDetailList_v1, 32-byte
 * entries, `cc=` their usedGpuCcProtectedMemory) with mode 0 / 1 / 2, its
 * numProcArrayEntries / procArray taking the place of *infoCount / infos (a NULL plist for
 * the NULL infoCount). A symbol the library lacks prints `missing fn=...`.
 *
 * Build: gcc -O2 -o nvmlprocs nvmlprocs.c -ldl. Usage: nvmlprocs [--index N] [--fn NAME]
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The types and prototypes: hami_nvml.h (<nvml.h> where it exists), every function under the
 * name of the symbol it is (NVML_NO_UNVERSIONED_FUNC_DEFS: the v1 lists are the unversioned
 * names). */
#define NVML_NO_UNVERSIONED_FUNC_DEFS
#include "hami_nvml.h"

/* A function-pointer type, from the function's prototype. */
#define FN(sym) __typeof__(&sym)

/* Every list function as `probe` calls it: the entries' type is the version's (v1, v2/v3 or,
 * through detail_as_list, the detail list's), so one loop reaches all of them with an untyped
 * array. */
typedef nvmlReturn_t (*list_fn)(nvmlDevice_t, unsigned int *, void *);

/* nvmlDeviceGetRunningProcessDetailList seen as a list function of one mode: infoCount is
 * numProcArrayEntries, infos is procArray (a NULL infoCount: a NULL plist). */
static FN(nvmlDeviceGetRunningProcessDetailList) detail_fn;
static unsigned detail_mode;
static nvmlReturn_t detail_as_list(nvmlDevice_t h, unsigned *n, void *buf) {
  if (!n) return detail_fn(h, NULL);
  nvmlProcessDetailList_v1_t l = {nvmlProcessDetailList_v1, detail_mode, *n, buf};
  nvmlReturn_t rc = detail_fn(h, &l);
  *n = l.numProcArrayEntries;
  return rc;
}

static const struct { const char *sym, *name; int v1; } FNS[] = {
  {"nvmlDeviceGetComputeRunningProcesses", "compute_v1", 1},
  {"nvmlDeviceGetComputeRunningProcesses_v2", "compute_v2", 0},
  {"nvmlDeviceGetComputeRunningProcesses_v3", "compute_v3", 0},
  {"nvmlDeviceGetGraphicsRunningProcesses", "graphics_v1", 1},
  {"nvmlDeviceGetGraphicsRunningProcesses_v2", "graphics_v2", 0},
  {"nvmlDeviceGetGraphicsRunningProcesses_v3", "graphics_v3", 0},
  {"nvmlDeviceGetMPSComputeRunningProcesses", "mps_v1", 1},
  {"nvmlDeviceGetMPSComputeRunningProcesses_v2", "mps_v2", 0},
  {"nvmlDeviceGetMPSComputeRunningProcesses_v3", "mps_v3", 0},
  /* v1 = 2: nvmlDeviceGetRunningProcessDetailList, mode 0 / 1 / 2. */
  {"nvmlDeviceGetRunningProcessDetailList", "detail_compute", 2},
  {"nvmlDeviceGetRunningProcessDetailList", "detail_graphics", 2},
  {"nvmlDeviceGetRunningProcessDetailList", "detail_mps", 2},
};

static void probe(list_fn f, const char *name, int v1, unsigned idx, nvmlDevice_t h) {
  size_t esz = v1 == 2 ? sizeof(nvmlProcessDetail_v1_t) : v1 ? sizeof(nvmlProcessInfo_v1_t) : sizeof(nvmlProcessInfo_v2_t);
  unsigned n = 0;
  nvmlReturn_t rc = f(h, &n, NULL);
  printf("query fn=%s index=%u rc=%d count=%u\n", name, idx, rc, n);
  unsigned needed = n;
  if (needed > 0) {
    unsigned cap = needed - 1;
    unsigned char *small = malloc((needed + 1) * esz);
    memset(small, 0xAB, (needed + 1) * esz);
    rc = f(h, &cap, small);
    printf("small fn=%s index=%u rc=%d count=%u\n", name, idx, rc, cap);
    free(small);
  }
  rc = f(h, NULL, NULL);
  printf("nullcount fn=%s index=%u rc=%d\n", name, idx, rc);
  unsigned cap = needed + 4;
  size_t bytes = (size_t)(cap + 1) * esz;
  unsigned char *buf = malloc(bytes);
  memset(buf, 0xAB, bytes);
  rc = f(h, &cap, buf);
  unsigned count = rc == 0 ? cap : 0;
  int guard = 1;
  for (size_t b = (size_t)count * esz; b < bytes; b++) if (buf[b] != 0xAB) guard = 0;
  printf("list fn=%s index=%u rc=%d count=%u guard=%d\n", name, idx, rc, count, guard);
  for (unsigned k = 0; k < count; k++) {
    if (v1 == 2) {
      nvmlProcessDetail_v1_t *e = (nvmlProcessDetail_v1_t *)buf + k;
      printf("proc fn=%s index=%u pid=%u used=%llu gi=%u ci=%u cc=%llu\n", name, idx, e->pid, e->usedGpuMemory,
             e->gpuInstanceId, e->computeInstanceId, e->usedGpuCcProtectedMemory);
    } else if (v1) {
      nvmlProcessInfo_v1_t *e = (nvmlProcessInfo_v1_t *)buf + k;
      printf("proc fn=%s index=%u pid=%u used=%llu\n", name, idx, e->pid, e->usedGpuMemory);
    } else {
      nvmlProcessInfo_v2_t *e = (nvmlProcessInfo_v2_t *)buf + k;
      printf("proc fn=%s index=%u pid=%u used=%llu gi=%u ci=%u\n", name, idx, e->pid, e->usedGpuMemory,
             e->gpuInstanceId, e->computeInstanceId);
    }
  }
  free(buf);
}

int main(int argc, char **argv) {
  int only = -1;
  const char *only_fn = NULL;
  for (int a = 1; a + 1 < argc; a += 2) {
    if (!strcmp(argv[a], "--index")) only = atoi(argv[a + 1]);
    else if (!strcmp(argv[a], "--fn")) only_fn = argv[a + 1];
  }
  setvbuf(stdout, NULL, _IOLBF, 0);
  void *lib = dlopen("libnvidia-ml.so.1", RTLD_NOW);
  if (!lib) { printf("dlopen error=%s\n", dlerror()); return 2; }
  FN(nvmlInit_v2) init = dlsym(lib, "nvmlInit_v2");
  FN(nvmlDeviceGetCount_v2) count = dlsym(lib, "nvmlDeviceGetCount_v2");
  FN(nvmlDeviceGetHandleByIndex_v2) handle = dlsym(lib, "nvmlDeviceGetHandleByIndex_v2");
  if (!init || !count || !handle) { printf("missing fn=init\n"); return 2; }
  nvmlReturn_t rc = init();
  printf("init rc=%d\n", rc);
  if (rc) return 1;
  unsigned n = 0;
  rc = count(&n);
  printf("count rc=%d count=%u\n", rc, n);
  for (unsigned i = 0; i < n; i++) {
    if (only >= 0 && (unsigned)only != i) continue;
    nvmlDevice_t h;
    if (handle(i, &h)) { printf("device index=%u rc=1\n", i); continue; }
    for (size_t k = 0; k < sizeof FNS / sizeof FNS[0]; k++) {
      if (only_fn && strcmp(only_fn, FNS[k].name)) continue;
      list_fn f = (list_fn)dlsym(lib, FNS[k].sym);
      if (!f) { printf("missing fn=%s\n", FNS[k].name); continue; }
      if (FNS[k].v1 == 2) {
        detail_fn = (FN(nvmlDeviceGetRunningProcessDetailList))(void *)f;
        detail_mode = (unsigned)(k - 9);
        f = detail_as_list;
      }
      probe(f, FNS[k].name, FNS[k].v1, i, h);
    }
  }
  return 0;
}
