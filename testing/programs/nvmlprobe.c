/*
 * nvmlprobe: reads NVML the way nvidia-smi does (dlopen("libnvidia-ml.so.1")) and prints one
 * parseable line per fact:
 *
 *     init rc=0
 *     count rc=0 count=2
 *     device index=0 uuid=GPU-... name=Fake_NVIDIA_GPU rc=0
 *     memory index=0 rc=0 total=... used=... free=...
 *     memory_v2 index=0 rc=0 version=0x2000028 total=... reserved=... used=... free=...
 *     process index=0 pid=1234 used=1048576
 *     processes index=0 rc=0 count=1
 *     utilization index=0 rc=0 gpu=50 memory=0
 *     putil index=0 pid=1234 sm=50 ts=1764640000000000
 *     putils index=0 rc=0 count=1 last_seen=0
 *     putil2 index=0 pid=1234 sm=50 ts=1764640000000000      (nvmlDeviceGetProcessesUtilizationInfo)
 *     putils2 index=0 rc=0 count=1
 *     shutdown rc=0
 *
 * With --export ID (nvidia-smi's way to its process table: nvmlInternalGetExportTable; ID is
 * `nvsmi`, the table nvidia-smi asks for, or 32 hex digits, the id's raw bytes in order):
 *
 *     export rc=0 table_obj=libnvidia-ml.so.1 size=2048 again_same=1
 *     xlist index=0 slot=213 rc=0 count=2 slot_obj=libhami_preload.so
 *     xproc index=0 slot=213 pid=1234 used=1048576 gi=4294967295 ci=4294967295 name=/bin/x
 *
 * table_obj / slot_obj: the file of the object the table / the slot's function lies in
 * (dladdr; `none` for memory of no object, such as a copy on the heap); again_same: a second
 * call gave the same table. The slots 213-215 are called with --export-cap entries of 4128
 * bytes (default 250, nvidia-smi's), only when the size word holds them.
 *
 * Build: gcc -O2 -o nvmlprobe nvmlprobe.c -ldl. Usage: nvmlprobe [--index N] [--last-seen US]
 * [--export ID] [--export-cap N] (US: nvmlDeviceGetProcessUtilization's lastSeenTimeStamp,
 * default 0; the utilisation lines are printed only when the library has those functions)
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The types and prototypes: hami_nvml.h (<nvml.h> where it exists), every function under the
 * name of the symbol it is (NVML_NO_UNVERSIONED_FUNC_DEFS), as this program looks them up. */
#define NVML_NO_UNVERSIONED_FUNC_DEFS
#include "hami_nvml.h"

/* A function-pointer type, from the function's prototype. */
#define FN(sym) __typeof__(&sym)

static void *lib;

/* The export table's process-list entries (nvidia-smi 580). */
#define XENTRY 4128
#define XNAME_OFF 32
#define XNAME_LEN 4096
typedef nvmlReturn_t (*xlist_fn)(nvmlDevice_t, unsigned *, void *);

/* Basename of the object `p` lies in, or "none". */
static const char *object_of(const void *p) {
  Dl_info di;
  if (!p || !dladdr(p, &di) || !di.dli_fname) return "none";
  const char *b = strrchr(di.dli_fname, '/');
  return b ? b + 1 : di.dli_fname;
}

/* Parses `nvsmi` or 32 hex digits into id; 0 on success. */
static int parse_id(const char *s, unsigned char id[16]) {
  static const unsigned char nvsmi[16] = {0xc4, 0xfe, 0x3e, 0x6c, 0xc9, 0x8f, 0x6c, 0x4e,
                                          0xa3, 0x27, 0xee, 0x69, 0x6e, 0x12, 0xf7, 0xc4};
  if (!strcmp(s, "nvsmi")) { memcpy(id, nvsmi, 16); return 0; }
  if (strlen(s) != 32) return -1;
  for (int i = 0; i < 16; i++) {
    unsigned v;
    if (sscanf(s + 2 * i, "%2x", &v) != 1) return -1;
    id[i] = (unsigned char)v;
  }
  return 0;
}
static void *sym(const char *n) {
  void *p = dlsym(lib, n);
  if (!p) { printf("missing symbol=%s\n", n); exit(2); }
  return p;
}

int main(int argc, char **argv) {
  int only = -1;
  unsigned long long last_seen = 0;
  const char *export_id = NULL;
  unsigned export_cap = 250;
  for (int a = 1; a + 1 < argc; a += 2) {
    if (!strcmp(argv[a], "--index")) only = atoi(argv[a + 1]);
    else if (!strcmp(argv[a], "--last-seen")) last_seen = strtoull(argv[a + 1], NULL, 0);
    else if (!strcmp(argv[a], "--export")) export_id = argv[a + 1];
    else if (!strcmp(argv[a], "--export-cap")) export_cap = (unsigned)strtoul(argv[a + 1], NULL, 0);
  }
  setvbuf(stdout, NULL, _IOLBF, 0);
  lib = dlopen("libnvidia-ml.so.1", RTLD_NOW);
  if (!lib) { printf("dlopen error=%s\n", dlerror()); return 2; }
  FN(nvmlInit_v2) init = sym("nvmlInit_v2");
  FN(nvmlShutdown) shutdown = sym("nvmlShutdown");
  FN(nvmlDeviceGetCount_v2) count = sym("nvmlDeviceGetCount_v2");
  FN(nvmlDeviceGetHandleByIndex_v2) handle = sym("nvmlDeviceGetHandleByIndex_v2");
  FN(nvmlDeviceGetUUID) uuid = sym("nvmlDeviceGetUUID");
  FN(nvmlDeviceGetName) name = sym("nvmlDeviceGetName");
  FN(nvmlDeviceGetMemoryInfo) mem = sym("nvmlDeviceGetMemoryInfo");
  FN(nvmlDeviceGetMemoryInfo_v2) mem2 = sym("nvmlDeviceGetMemoryInfo_v2");
  FN(nvmlDeviceGetComputeRunningProcesses_v3) procs = sym("nvmlDeviceGetComputeRunningProcesses_v3");
  FN(nvmlSystemGetDriverVersion) drv = sym("nvmlSystemGetDriverVersion");
  FN(nvmlErrorString) errstr = sym("nvmlErrorString");
  /* Optional: utilisation. */
  FN(nvmlDeviceGetUtilizationRates) rates = dlsym(lib, "nvmlDeviceGetUtilizationRates");
  FN(nvmlDeviceGetProcessUtilization) putil =
      dlsym(lib, "nvmlDeviceGetProcessUtilization");
  FN(nvmlDeviceGetProcessesUtilizationInfo) putil2 = dlsym(lib, "nvmlDeviceGetProcessesUtilizationInfo");

  nvmlReturn_t rc = init();
  printf("init rc=%d error=%s\n", rc, errstr(rc));
  if (rc) return 1;
  char buf[128] = "";
  rc = drv(buf, sizeof buf);
  printf("driver rc=%d version=%s\n", rc, buf);
  unsigned n = 0;
  rc = count(&n);
  printf("count rc=%d count=%u\n", rc, n);
  const unsigned long long *xtable = NULL;
  if (export_id) {
    unsigned char id[16];
    if (parse_id(export_id, id)) { printf("export error=bad_id\n"); return 2; }
    /* Not in nvml.h: the export table is private (its shape: nvidia-smi 580's calls). */
    nvmlReturn_t (*get_table)(const void **, const void *) = sym("nvmlInternalGetExportTable");
    const void *t = NULL, *t2 = NULL;
    rc = get_table(&t, id);
    nvmlReturn_t rc2 = get_table(&t2, id);
    printf("export rc=%d table_obj=%s size=%llu again_same=%d\n", rc, object_of(t),
           rc == 0 && t ? *(const unsigned long long *)t : 0ULL, rc2 == rc && t2 == t);
    if (rc == 0 && t && *(const unsigned long long *)t >= 8 * 216) xtable = t;
  }
  for (unsigned i = 0; i < n; i++) {
    if (only >= 0 && (unsigned)only != i) continue;
    nvmlDevice_t h;
    rc = handle(i, &h);
    if (rc) { printf("device index=%u rc=%d\n", i, rc); continue; }
    char u[96] = "", nm[96] = "";
    uuid(h, u, sizeof u);
    rc = name(h, nm, sizeof nm);
    for (char *c = nm; *c; c++) if (*c == ' ') *c = '_';
    printf("device index=%u uuid=%s name=%s rc=%d\n", i, u, nm, rc);
    nvmlMemory_t m; memset(&m, 0, sizeof m);
    rc = mem(h, &m);
    printf("memory index=%u rc=%d total=%llu used=%llu free=%llu\n", i, rc, m.total, m.used, m.free);
    nvmlMemory_v2_t m2; memset(&m2, 0, sizeof m2); m2.version = nvmlMemory_v2;
    rc = mem2(h, &m2);
    printf("memory_v2 index=%u rc=%d version=0x%x total=%llu reserved=%llu used=%llu free=%llu\n", i, rc, m2.version,
           m2.total, m2.reserved, m2.used, m2.free);
    unsigned np = 0;
    rc = procs(h, &np, NULL);
    nvmlProcessInfo_t *pi = calloc(np + 8, sizeof *pi);
    unsigned cap = np + 8;
    rc = procs(h, &cap, pi);
    for (unsigned k = 0; rc == 0 && k < cap; k++) printf("process index=%u pid=%u used=%llu\n", i, pi[k].pid, pi[k].usedGpuMemory);
    printf("processes index=%u rc=%d count=%u\n", i, rc, rc == 0 ? cap : 0);
    free(pi);
    for (int slot = 213; xtable && slot <= 215; slot++) {
      xlist_fn f = (xlist_fn)xtable[slot];
      unsigned char *buf = calloc(export_cap ? export_cap : 1, XENTRY);
      unsigned xc = export_cap;
      rc = f(h, &xc, buf);
      printf("xlist index=%u slot=%d rc=%d count=%u slot_obj=%s\n", i, slot, rc, xc, object_of((void *)f));
      for (unsigned k = 0; rc == 0 && k < xc && k < export_cap; k++) {
        unsigned char *e = buf + (size_t)k * XENTRY;
        unsigned pid, gi, ci;
        unsigned long long used;
        memcpy(&pid, e, 4); memcpy(&used, e + 8, 8); memcpy(&gi, e + 16, 4); memcpy(&ci, e + 20, 4);
        char name[XNAME_LEN + 1];
        memcpy(name, e + XNAME_OFF, XNAME_LEN);
        name[XNAME_LEN] = 0;
        for (char *c = name; *c; c++) if (*c == ' ') *c = '_';
        printf("xproc index=%u slot=%d pid=%u used=%llu gi=%u ci=%u name=%s\n", i, slot, pid, used, gi, ci,
               name[0] ? name : "-");
      }
      free(buf);
    }
    if (rates) {
      nvmlUtilization_t u; memset(&u, 0, sizeof u);
      rc = rates(h, &u);
      printf("utilization index=%u rc=%d gpu=%u memory=%u\n", i, rc, u.gpu, u.memory);
    }
    if (putil) {
      unsigned ns = 0;
      rc = putil(h, NULL, &ns, last_seen);
      unsigned cap2 = ns + 8;
      nvmlProcessUtilizationSample_t *us = calloc(cap2, sizeof *us);
      if (rc == 7 /* NVML_ERROR_INSUFFICIENT_SIZE */) rc = putil(h, us, &cap2, last_seen);
      for (unsigned k = 0; rc == 0 && k < cap2; k++)
        printf("putil index=%u pid=%u sm=%u mem=%u ts=%llu\n", i, us[k].pid, us[k].smUtil, us[k].memUtil, us[k].timeStamp);
      printf("putils index=%u rc=%d count=%u last_seen=%llu\n", i, rc, rc == 0 ? cap2 : 0, last_seen);
      free(us);
    }
    if (putil2) {
      nvmlProcessesUtilizationInfo_t info; memset(&info, 0, sizeof info);
      info.version = nvmlProcessesUtilizationInfo_v1; info.lastSeenTimeStamp = last_seen;
      rc = putil2(h, &info);
      if (rc == 7 /* NVML_ERROR_INSUFFICIENT_SIZE */) {
        info.processSamplesCount += 8;
        info.procUtilArray = calloc(info.processSamplesCount, sizeof *info.procUtilArray);
        rc = putil2(h, &info);
      }
      for (unsigned k = 0; rc == 0 && k < info.processSamplesCount; k++)
        printf("putil2 index=%u pid=%u sm=%u ts=%llu\n", i, info.procUtilArray[k].pid, info.procUtilArray[k].smUtil,
               info.procUtilArray[k].timeStamp);
      printf("putils2 index=%u rc=%d count=%u\n", i, rc, rc == 0 ? info.processSamplesCount : 0);
      free(info.procUtilArray);
    }
  }
  rc = shutdown();
  printf("shutdown rc=%d\n", rc);
  return 0;
}
