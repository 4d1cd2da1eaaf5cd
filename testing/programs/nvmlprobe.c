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
 * Build: gcc -O2 -o nvmlprobe nvmlprobe.c -ldl. Usage: nvmlprobe [--index N] [--last-seen US]
 * (US: nvmlDeviceGetProcessUtilization's lastSeenTimeStamp, default 0; the utilisation lines
 * are printed only when the library has those functions)
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int nvmlReturn_t;
typedef void *nvmlDevice_t;
typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct { unsigned int version; unsigned long long total, reserved, free, used; } nvmlMemory_v2_t;
typedef struct { unsigned int pid; unsigned long long usedGpuMemory; unsigned int gpuInstanceId, computeInstanceId; } nvmlProcessInfo_t;
typedef struct { unsigned int pid; unsigned long long timeStamp; unsigned int smUtil, memUtil, encUtil, decUtil; } nvmlProcessUtilizationSample_t;
typedef struct { unsigned int gpu, memory; } nvmlUtilization_t;
typedef struct { unsigned long long timeStamp; unsigned int pid, smUtil, memUtil, encUtil, decUtil, jpgUtil, ofaUtil; } nvmlProcessUtilizationInfo_v1_t;
typedef struct { unsigned int version, processSamplesCount; unsigned long long lastSeenTimeStamp; nvmlProcessUtilizationInfo_v1_t *procUtilArray; } nvmlProcessesUtilizationInfo_t;
#define NVML_PROCESSES_UTILIZATION_INFO_V1 ((unsigned int)(sizeof(nvmlProcessesUtilizationInfo_t) | (1 << 24)))
#define NVML_MEMORY_V2 ((unsigned int)(sizeof(nvmlMemory_v2_t) | (2 << 24)))

static void *lib;
static void *sym(const char *n) {
  void *p = dlsym(lib, n);
  if (!p) { printf("missing symbol=%s\n", n); exit(2); }
  return p;
}

int main(int argc, char **argv) {
  int only = -1;
  unsigned long long last_seen = 0;
  for (int a = 1; a + 1 < argc; a += 2) {
    if (!strcmp(argv[a], "--index")) only = atoi(argv[a + 1]);
    else if (!strcmp(argv[a], "--last-seen")) last_seen = strtoull(argv[a + 1], NULL, 0);
  }
  setvbuf(stdout, NULL, _IOLBF, 0);
  lib = dlopen("libnvidia-ml.so.1", RTLD_NOW);
  if (!lib) { printf("dlopen error=%s\n", dlerror()); return 2; }
  nvmlReturn_t (*init)(void) = sym("nvmlInit_v2");
  nvmlReturn_t (*shutdown)(void) = sym("nvmlShutdown");
  nvmlReturn_t (*count)(unsigned *) = sym("nvmlDeviceGetCount_v2");
  nvmlReturn_t (*handle)(unsigned, nvmlDevice_t *) = sym("nvmlDeviceGetHandleByIndex_v2");
  nvmlReturn_t (*uuid)(nvmlDevice_t, char *, unsigned) = sym("nvmlDeviceGetUUID");
  nvmlReturn_t (*name)(nvmlDevice_t, char *, unsigned) = sym("nvmlDeviceGetName");
  nvmlReturn_t (*mem)(nvmlDevice_t, nvmlMemory_t *) = sym("nvmlDeviceGetMemoryInfo");
  nvmlReturn_t (*mem2)(nvmlDevice_t, nvmlMemory_v2_t *) = sym("nvmlDeviceGetMemoryInfo_v2");
  nvmlReturn_t (*procs)(nvmlDevice_t, unsigned *, nvmlProcessInfo_t *) = sym("nvmlDeviceGetComputeRunningProcesses_v3");
  nvmlReturn_t (*drv)(char *, unsigned) = sym("nvmlSystemGetDriverVersion");
  const char *(*errstr)(nvmlReturn_t) = sym("nvmlErrorString");
  /* Optional: utilisation. */
  nvmlReturn_t (*rates)(nvmlDevice_t, nvmlUtilization_t *) = dlsym(lib, "nvmlDeviceGetUtilizationRates");
  nvmlReturn_t (*putil)(nvmlDevice_t, nvmlProcessUtilizationSample_t *, unsigned *, unsigned long long) =
      dlsym(lib, "nvmlDeviceGetProcessUtilization");
  nvmlReturn_t (*putil2)(nvmlDevice_t, nvmlProcessesUtilizationInfo_t *) = dlsym(lib, "nvmlDeviceGetProcessesUtilizationInfo");

  nvmlReturn_t rc = init();
  printf("init rc=%d error=%s\n", rc, errstr(rc));
  if (rc) return 1;
  char buf[128] = "";
  rc = drv(buf, sizeof buf);
  printf("driver rc=%d version=%s\n", rc, buf);
  unsigned n = 0;
  rc = count(&n);
  printf("count rc=%d count=%u\n", rc, n);
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
    nvmlMemory_v2_t m2; memset(&m2, 0, sizeof m2); m2.version = NVML_MEMORY_V2;
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
      info.version = NVML_PROCESSES_UTILIZATION_INFO_V1; info.lastSeenTimeStamp = last_seen;
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
