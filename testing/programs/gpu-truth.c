/* gpu-truth.c: records how the REAL CUDA driver and NVML behave (cuGetProcAddress mapping,
 * error codes, footprints), so that the fake driver can be checked against it.
 * Build on a GPU machine: gcc -I/usr/local/cuda/include gpu-truth.c -ldl -o gpu-truth
 * Run: ./gpu-truth table > table.txt; ./gpu-truth errors; ./gpu-truth nvml */
#define _GNU_SOURCE
#include <cuda.h>
#include <nvml.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void *lib;
#define SYM(n) ((void *)dlsym(lib, #n))
typedef CUresult (*gpa2_t)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);
typedef CUresult (*gpa1_t)(const char *, void **, int, cuuint64_t);

static const char *symname(void *p) {
  Dl_info i;
  if (!p) return "NULL";
  if (dladdr(p, &i) && i.dli_sname) {
    static char buf[256];
    snprintf(buf, sizeof buf, "%s%s", i.dli_sname, (i.dli_saddr == p) ? "" : "+off");
    return buf;
  }
  return "?";
}

static const char *names[] = {"cuInit","cuDriverGetVersion","cuDeviceGet","cuDeviceGetCount","cuDeviceGetName",
 "cuDeviceGetUuid","cuDeviceTotalMem","cuDeviceGetAttribute","cuDevicePrimaryCtxRetain","cuDevicePrimaryCtxRelease",
 "cuDevicePrimaryCtxReset","cuCtxCreate","cuCtxDestroy","cuCtxSetCurrent","cuCtxGetCurrent","cuCtxGetDevice",
 "cuCtxPushCurrent","cuCtxPopCurrent","cuCtxSynchronize","cuMemAlloc","cuMemFree","cuMemGetInfo","cuMemAllocPitch",
 "cuMemAllocManaged","cuMemAllocAsync","cuMemFreeAsync","cuMemAllocFromPoolAsync","cuMemCreate","cuMemRelease",
 "cuMemAddressReserve","cuMemAddressFree","cuMemMap","cuMemUnmap","cuMemSetAccess","cuArrayCreate","cuArray3DCreate",
 "cuArrayDestroy","cuGetProcAddress","cuGetErrorString","cuGetErrorName","cuMemGetAddressRange",
 "cuMemGetAllocationGranularity","cuMemPoolCreate","cuMemPoolDestroy","cuDeviceGetDefaultMemPool","cuStreamCreate",
 "cuStreamDestroy","cuStreamSynchronize","cuModuleLoadData","cuModuleUnload","cuMemHostAlloc","cuMemAllocHost",
 "cuMemcpyHtoD","cuLaunchKernel","cuMemAlloc_v2","cuFooBar","", NULL};
static const int vers[] = {0, 1000, 2000, 3000, 3020, 4000, 6000, 7000, 10020, 11000, 11020, 11030, 11040, 12000, 12050, 13000, 13010, 99000, -1};

static void table(void) {
  gpa2_t g2 = (gpa2_t)SYM(cuGetProcAddress_v2);
  gpa1_t g1 = (gpa1_t)SYM(cuGetProcAddress);
  printf("dlsym cuGetProcAddress=%s cuGetProcAddress_v2=%s\n", symname((void*)g1), symname((void*)g2));
  { void *p = (void *)0x1; CUdriverProcAddressQueryResult st = 77;
    CUresult rc = g2("cuMemAlloc", &p, 12000, 0, &st); printf("before-init gpa cuMemAlloc rc=%d status=%d sym=%s\n", rc, (int)st, symname(p));
    p = (void *)0x1; rc = g2("cuInit", &p, 12000, 0, &st); printf("before-init gpa cuInit rc=%d status=%d sym=%s\n", rc, (int)st, symname(p)); }
  for (int phase = 1; phase < 2; phase++) {
    printf("cuInit=%d\n", (int)((CUresult(*)(unsigned))SYM(cuInit))(0));
    for (int n = 0; names[n]; n++)
      for (int v = 0; vers[v] >= 0; v++)
        for (int f = 0; f < 4; f++) {
          void *p = (void *)0x1;
          CUdriverProcAddressQueryResult st = 77;
          CUresult rc = g2(names[n], &p, vers[v], f, &st);
          void *p1 = (void *)0x1;
          CUresult rc1 = g1(names[n], &p1, vers[v], f);
          printf("gpa name=%s ver=%d flags=%d rc=%d status=%d sym=%s v1rc=%d v1sym=%s%s\n", names[n], vers[v], f, rc,
                 (int)st, p == (void *)0x1 ? "UNTOUCHED" : symname(p), rc1, p1 == (void *)0x1 ? "UNTOUCHED" : symname(p1),
                 (p && p != (void*)1 && p == dlsym(lib, symname(p))) ? "" : "");
        }
    /* NOTE: a NULL symbol crashes the real driver (segfault), so it is not probed. */
    void *p = (void*)1; CUresult rc = g2("cuMemAlloc", &p, 12000, 0, NULL); printf("gpa nullstatus rc=%d sym=%s\n", rc, symname(p));
    p = (void*)1; rc = g2("cuFooBar", &p, 12000, 0, NULL); printf("gpa nullstatus unknown rc=%d sym=%s\n", rc, p == (void*)1 ? "UNTOUCHED" : symname(p));
    fflush(stdout); rc = g2("cuMemAlloc", NULL, 12000, 0, NULL); printf("gpa nullpfn rc=%d\n", rc);
  }
}

#include <setjmp.h>
#include <signal.h>
static sigjmp_buf jb;
static void onsegv(int sig) { siglongjmp(jb, sig); }
/* R(expr): run one driver call; a crash inside the real driver is caught and reported. */
#define R(expr) do { if (sigsetjmp(jb, 1)) { printf("%-70s CRASHED\n", #expr); break; } CUresult _r = (expr); const char *_n = "?"; cuGetErrorName(_r, &_n); printf("%-70s rc=%d %s\n", #expr, (int)_r, _n); } while (0)
static void meminfo(const char *tag) { size_t f = 0, t = 0; CUresult r = cuMemGetInfo(&f, &t); printf("meminfo %s rc=%d free=%zu total=%zu\n", tag, r, f, t); }

static void errors(void) {
  struct sigaction sa; memset(&sa, 0, sizeof sa); sa.sa_handler = onsegv; sa.sa_flags = SA_NODEFER; sigaction(SIGSEGV, &sa, NULL); sigaction(SIGBUS, &sa, NULL);
  CUdeviceptr d = 0, d2 = 0; size_t pitch = 0; int n = -5, ver = 0; CUdevice dev = -7; CUcontext c = 0, c2 = 0, cur = 0;
  char name[256];
  R(cuDriverGetVersion(&ver)); printf("ver=%d\n", ver);
  R(cuDriverGetVersion(NULL));
  R(cuDeviceGetCount(&n));
  R(cuMemAlloc(&d, 1 << 20));
  R(cuMemFree(0x1234));
  R(cuCtxGetCurrent(&cur));
  R(cuDeviceGet(&dev, 0));
  { const char *s = 0; R(cuGetErrorString(CUDA_ERROR_OUT_OF_MEMORY, &s)); printf("str=%s\n", s ? s : "NULL"); }
  { const char *s = (const char*)1; R(cuGetErrorString(12345, &s)); printf("str=%p\n", (void*)s); }
  { const char *s = (const char*)1; R(cuGetErrorName(12345, &s)); printf("name=%p\n", (void*)s); }
  /* cuGetErrorName(x, NULL) crashes the real driver: not probed. */
  R(cuInit(1));
  R(cuInit(0));
  R(cuInit(0));
  R(cuDeviceGetCount(&n)); printf("count=%d\n", n);
  R(cuDeviceGetCount(NULL));
  R(cuDeviceGet(NULL, 0));
  R(cuDeviceGet(&dev, -1));
  R(cuDeviceGet(&dev, 100));
  R(cuDeviceGet(&dev, 0)); printf("dev=%d\n", dev);
  R(cuDeviceGetName(name, sizeof name, 0)); printf("name=%s\n", name);
  R(cuDeviceGetName(NULL, 10, 0));
  R(cuDeviceGetName(name, 0, 0));
  R(cuDeviceGetName(name, 4, 0)); printf("short name=[%s]\n", name);
  R(cuDeviceGetName(name, 10, 55));
  { CUuuid u; R(cuDeviceGetUuid(&u, 0)); R(cuDeviceGetUuid_v2(&u, 0)); printf("uuid="); for (int i = 0; i < 16; i++) printf("%02x", (unsigned char)u.bytes[i]); printf("\n"); R(cuDeviceGetUuid(NULL, 0)); R(cuDeviceGetUuid(&u, 9)); }
  { size_t t = 0; R(cuDeviceTotalMem(&t, 0)); printf("totalmem=%zu\n", t); R(cuDeviceTotalMem(NULL, 0)); R(cuDeviceTotalMem(&t, 9)); }
  { int a = 0; R(cuDeviceGetAttribute(&a, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, 0)); printf("ccmajor=%d\n", a);
    R(cuDeviceGetAttribute(&a, CU_DEVICE_ATTRIBUTE_PCI_BUS_ID, 0)); printf("pcibus=%d\n", a);
    R(cuDeviceGetAttribute(&a, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, 0)); printf("sms=%d\n", a);
    R(cuDeviceGetAttribute(&a, CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED, 0)); printf("pools=%d\n", a);
    R(cuDeviceGetAttribute(&a, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, 0)); printf("vmm=%d\n", a);
    R(cuDeviceGetAttribute(&a, (CUdevice_attribute)99999, 0)); R(cuDeviceGetAttribute(NULL, 1, 0)); R(cuDeviceGetAttribute(&a, 1, 9)); }
  printf("--- no context\n");
  R(cuCtxGetCurrent(&cur)); printf("cur=%p\n", (void*)cur);
  R(cuCtxGetCurrent(NULL));
  R(cuCtxGetDevice(&dev));
  R(cuMemAlloc(&d, 1 << 20));
  R(cuMemFree(0x1234));
  meminfo("noctx");
  R(cuCtxSynchronize());
  R(cuCtxPopCurrent(&c2));
  R(cuDevicePrimaryCtxRelease(0));
  R(cuCtxSetCurrent(NULL));
  R(cuCtxSetCurrent((CUcontext)0x1234));
  printf("--- primary\n");
  R(cuDevicePrimaryCtxRetain(NULL, 0));
  R(cuDevicePrimaryCtxRetain(&c, 9));
  R(cuDevicePrimaryCtxRetain(&c, 0)); printf("pctx=%p\n", (void*)c);
  R(cuCtxGetCurrent(&cur)); printf("cur after retain=%p\n", (void*)cur);
  meminfo("retained-not-current");
  R(cuCtxSetCurrent(c));
  meminfo("primary");
  R(cuCtxGetDevice(&dev)); printf("ctxdev=%d\n", dev);
  R(cuCtxGetDevice(NULL));
  R(cuMemAlloc(NULL, 1 << 20));
  R(cuMemAlloc(&d, 0)); printf("d=%llx\n", (unsigned long long)d);
  size_t f0, t0, f1, t1; cuMemGetInfo(&f0, &t0);
  R(cuMemAlloc(&d, 1)); cuMemGetInfo(&f1, &t1); printf("1 byte: ptr=%llx delta=%zd\n", (unsigned long long)d, (ssize_t)(f0 - f1));
  R(cuMemAlloc(&d2, 1)); printf("1 byte again: ptr=%llx\n", (unsigned long long)d2);
  { CUdeviceptr b = 0; size_t s = 0; R(cuMemGetAddressRange(&b, &s, d + 0)); printf("range base=%llx size=%zu\n", (unsigned long long)b, s);
    R(cuMemGetAddressRange(&b, &s, 0x10)); }
  R(cuMemFree(d)); R(cuMemFree(d)); R(cuMemFree(0)); R(cuMemFree(d2)); R(cuMemFree(0x1234));
  cuMemGetInfo(&f0, &t0);
  R(cuMemAlloc(&d, 3 << 20)); cuMemGetInfo(&f1, &t1); printf("3MiB: ptr=%llx delta=%zd\n", (unsigned long long)d, (ssize_t)(f0 - f1)); R(cuMemFree(d));
  cuMemGetInfo(&f0, &t0);
  R(cuMemAlloc(&d, 100 << 20)); cuMemGetInfo(&f1, &t1); printf("100MiB: ptr=%llx delta=%zd\n", (unsigned long long)d, (ssize_t)(f0 - f1)); R(cuMemFree(d));
  R(cuMemAlloc(&d, (size_t)1 << 50)); printf("huge d=%llx\n", (unsigned long long)d);
  R(cuMemAlloc(&d, (size_t)-1));
  cuMemGetInfo(&f0, &t0);
  R(cuMemAllocPitch(&d, &pitch, 1000, 10, 4)); cuMemGetInfo(&f1, &t1); printf("pitch=%zu delta=%zd\n", pitch, (ssize_t)(f0-f1)); R(cuMemFree(d));
  R(cuMemAllocPitch(&d, &pitch, 1, 1, 4)); printf("pitch(1)=%zu\n", pitch); R(cuMemFree(d));
  R(cuMemAllocPitch(&d, &pitch, 513, 3, 8)); printf("pitch(513)=%zu\n", pitch); R(cuMemFree(d));
  R(cuMemAllocPitch(&d, &pitch, 1000, 10, 3));
  R(cuMemAllocPitch(&d, &pitch, 0, 10, 4));
  R(cuMemAllocPitch(&d, &pitch, 10, 0, 4));
  R(cuMemAllocPitch(NULL, &pitch, 10, 10, 4));
  R(cuMemAllocPitch(&d, NULL, 10, 10, 4));
  cuMemGetInfo(&f0, &t0);
  R(cuMemAllocManaged(&d, 1 << 20, CU_MEM_ATTACH_GLOBAL)); cuMemGetInfo(&f1, &t1); printf("managed delta=%zd ptr=%llx\n", (ssize_t)(f0-f1), (unsigned long long)d); R(cuMemFree(d));
  R(cuMemAllocManaged(&d, 0, CU_MEM_ATTACH_GLOBAL));
  R(cuMemAllocManaged(&d, 1 << 20, 0));
  R(cuMemAllocManaged(NULL, 1 << 20, CU_MEM_ATTACH_GLOBAL));
  cuMemGetInfo(&f0, &t0);
  R(cuMemAllocAsync(&d, 1 << 20, 0)); R(cuStreamSynchronize(0)); cuMemGetInfo(&f1, &t1); printf("async delta=%zd ptr=%llx\n", (ssize_t)(f0-f1), (unsigned long long)d);
  R(cuMemFreeAsync(d, 0)); R(cuStreamSynchronize(0)); R(cuMemFreeAsync(d, 0)); R(cuStreamSynchronize(0));
  cuMemGetInfo(&f1, &t1); printf("after freeasync delta=%zd\n", (ssize_t)(f0-f1));
  R(cuMemAllocAsync(&d, 0, 0)); R(cuMemAllocAsync(NULL, 16, 0)); R(cuMemFreeAsync(0x1234, 0)); R(cuStreamSynchronize(0));
  R(cuMemAllocAsync(&d, 1<<20, (CUstream)0x1234));
  R(cuMemFree(0x1234));
  { CUdeviceptr a = 0; R(cuMemAllocAsync(&a, 1 << 20, 0)); R(cuStreamSynchronize(0)); R(cuMemFree(a)); }
  { CUmemoryPool pool = 0, dp = 0; R(cuDeviceGetDefaultMemPool(&dp, 0)); printf("defpool=%p\n", (void*)dp);
    CUmemPoolProps pp; memset(&pp, 0, sizeof pp); pp.allocType = CU_MEM_ALLOCATION_TYPE_PINNED; pp.location.type = CU_MEM_LOCATION_TYPE_DEVICE; pp.location.id = 0;
    R(cuMemPoolCreate(&pool, &pp)); CUdeviceptr a = 0;
    R(cuMemAllocFromPoolAsync(&a, 1 << 20, pool, 0)); R(cuStreamSynchronize(0)); R(cuMemFreeAsync(a, 0)); R(cuStreamSynchronize(0));
    R(cuMemAllocFromPoolAsync(&a, 1 << 20, (CUmemoryPool)0x1234, 0)); R(cuMemPoolDestroy(pool)); R(cuMemPoolDestroy(pool)); }
  printf("--- vmm\n");
  { CUmemAllocationProp prop; memset(&prop, 0, sizeof prop); prop.type = CU_MEM_ALLOCATION_TYPE_PINNED; prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE; prop.location.id = 0;
    size_t g = 0; R(cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM)); printf("gran min=%zu\n", g);
    R(cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED)); printf("gran rec=%zu\n", g);
    CUmemGenericAllocationHandle h = 0, h2 = 0;
    R(cuMemCreate(&h, 1 << 20, &prop, 0));
    R(cuMemCreate(&h, 0, &prop, 0));
    R(cuMemCreate(NULL, 2 << 20, &prop, 0));
    R(cuMemCreate(&h, 2 << 20, NULL, 0));
    cuMemGetInfo(&f0, &t0);
    R(cuMemCreate(&h, 2 << 20, &prop, 0)); cuMemGetInfo(&f1, &t1); printf("create handle=%llx delta=%zd\n", (unsigned long long)h, (ssize_t)(f0-f1));
    CUdeviceptr va = 0; R(cuMemAddressReserve(&va, 2 << 20, 0, 0, 0)); printf("va=%llx\n", (unsigned long long)va);
    R(cuMemAddressReserve(&d, 1 << 20, 0, 0, 0));
    R(cuMemMap(va, 2 << 20, 0, h, 0));
    R(cuMemMap(va, 2 << 20, 0, h, 0));
    CUmemAccessDesc ad; ad.location = prop.location; ad.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    R(cuMemSetAccess(va, 2 << 20, &ad, 1));
    R(cuMemRelease(h)); cuMemGetInfo(&f1, &t1); printf("released-but-mapped delta=%zd\n", (ssize_t)(f0-f1));
    R(cuMemUnmap(va, 2 << 20)); cuMemGetInfo(&f1, &t1); printf("unmapped delta=%zd\n", (ssize_t)(f0-f1));
    R(cuMemUnmap(va, 2 << 20));
    R(cuMemRelease(h));
    R(cuMemRelease(0x1234));
    R(cuMemAddressFree(va, 2 << 20)); R(cuMemAddressFree(va, 2 << 20));
    R(cuMemCreate(&h2, (size_t)1 << 50, &prop, 0)); }
  printf("--- arrays\n");
  { CUDA_ARRAY_DESCRIPTOR ad; ad.Width = 1000; ad.Height = 1000; ad.Format = CU_AD_FORMAT_FLOAT; ad.NumChannels = 1; CUarray a = 0, b = 0;
    cuMemGetInfo(&f0, &t0); R(cuArrayCreate(&a, &ad)); cuMemGetInfo(&f1, &t1); printf("array 1000x1000xf32 delta=%zd\n", (ssize_t)(f0-f1));
    ad.Width = 4096; ad.Height = 4096; ad.NumChannels = 4;
    cuMemGetInfo(&f0, &t0); R(cuArrayCreate(&b, &ad)); cuMemGetInfo(&f1, &t1); printf("array 4096x4096xf32x4 delta=%zd\n", (ssize_t)(f0-f1));
    R(cuArrayDestroy(b)); R(cuArrayDestroy(a)); R(cuArrayDestroy(a)); R(cuArrayDestroy((CUarray)0x1234));
    ad.Width = 0; R(cuArrayCreate(&a, &ad)); ad.Width = 16; ad.Height = 0; R(cuArrayCreate(&a, &ad)); printf("h0 ok? a=%p\n", (void*)a);
    R(cuArrayCreate(NULL, &ad)); R(cuArrayCreate(&a, NULL));
    CUDA_ARRAY3D_DESCRIPTOR d3; memset(&d3, 0, sizeof d3); d3.Width = 256; d3.Height = 256; d3.Depth = 256; d3.Format = CU_AD_FORMAT_FLOAT; d3.NumChannels = 1;
    cuMemGetInfo(&f0, &t0); R(cuArray3DCreate(&a, &d3)); cuMemGetInfo(&f1, &t1); printf("array3d 256^3 f32 delta=%zd\n", (ssize_t)(f0-f1)); R(cuArrayDestroy(a));
    d3.Width = 1; d3.Height = 1; d3.Depth = 1; cuMemGetInfo(&f0, &t0); R(cuArray3DCreate(&a, &d3)); cuMemGetInfo(&f1, &t1); printf("array3d 1 delta=%zd\n", (ssize_t)(f0-f1)); R(cuArrayDestroy(a));
    d3.Width = 0; R(cuArray3DCreate(&a, &d3)); }
  printf("--- contexts\n");
  cuMemGetInfo(&f0, &t0);
  typedef CUresult (*cc2_t)(CUcontext *, unsigned, CUdevice);
  typedef CUresult (*cc3_t)(CUcontext *, void *, int, unsigned, CUdevice);
  cc2_t cc2 = (cc2_t)SYM(cuCtxCreate_v2); cc3_t cc3 = (cc3_t)SYM(cuCtxCreate_v3);
  R(cc2(&c2, 0, 0)); cuMemGetInfo(&f1, &t1); printf("ctxcreate delta=%zd\n", (ssize_t)(f0-f1));
  R(cuCtxGetCurrent(&cur)); printf("cur==c2 %d\n", cur == c2);
  R(cuCtxPopCurrent(&cur)); printf("popped==c2 %d\n", cur == c2);
  R(cuCtxGetCurrent(&cur)); printf("cur after pop==c %d (%p)\n", cur == c, (void*)cur);
  R(cuCtxPushCurrent(c2)); R(cuCtxDestroy(c2)); R(cuCtxGetCurrent(&cur)); printf("cur after destroy=%p\n", (void*)cur);
  R(cuCtxDestroy(c2));
  R(cc2(NULL, 0, 0)); R(cc2(&c2, 0, 9));
  { CUcontext c4 = 0; R(cuCtxCreate_v4(&c4, NULL, 0, 0)); R(cuCtxDestroy(c4)); }
  { CUcontext c3 = 0; R(cc3(&c3, NULL, 0, 0, 0)); if (c3) R(cuCtxDestroy(c3)); }
  R(cuCtxDestroy(c));
  R(cuCtxSetCurrent(c));
  R(cuDevicePrimaryCtxRelease(0));
  R(cuDevicePrimaryCtxRelease(0));
  R(cuDevicePrimaryCtxRelease(9));
  R(cuCtxGetCurrent(&cur)); printf("cur after primary release=%p\n", (void*)cur);
  R(cuMemAlloc(&d, 1 << 20));
  meminfo("after release");
  R(cuDevicePrimaryCtxReset(0));
  R(cuCtxSetCurrent(NULL));
  R(cuMemAlloc(&d, 1 << 20));
  meminfo("after setcurrent null");
  printf("--- fill\n");
  R(cuDevicePrimaryCtxRetain(&c, 0)); R(cuCtxSetCurrent(c));
  { size_t tot = 0; int k = 0; CUresult r; while ((r = cuMemAlloc(&d, (size_t)8 << 30)) == CUDA_SUCCESS) { tot += (size_t)8 << 30; k++; }
    printf("fill 8G chunks=%d total=%zu rc=%d\n", k, tot, r); meminfo("full");
    while ((r = cuMemAlloc(&d, (size_t)64 << 20)) == CUDA_SUCCESS) { tot += 64 << 20; k++; }
    printf("fill +64M total=%zu rc=%d\n", tot, r); meminfo("full2"); }
}

typedef nvmlReturn_t (*nv0)(void);
static void nvml(void) {
  void *nl = dlopen("libnvidia-ml.so.1", RTLD_NOW);
  if (!nl) { printf("no nvml\n"); return; }
#define NS(n) ((void *)dlsym(nl, #n))
  unsigned cnt = 0; nvmlDevice_t h;
  printf("before init count rc=%d\n", ((nvmlReturn_t(*)(unsigned*))NS(nvmlDeviceGetCount_v2))(&cnt));
  printf("before init handle rc=%d\n", ((nvmlReturn_t(*)(unsigned, nvmlDevice_t*))NS(nvmlDeviceGetHandleByIndex_v2))(0, &h));
  printf("shutdown before init rc=%d\n", ((nv0)NS(nvmlShutdown))());
  printf("init rc=%d\n", ((nv0)NS(nvmlInit_v2))());
  { nvmlReturn_t r = ((nvmlReturn_t(*)(unsigned*))NS(nvmlDeviceGetCount_v2))(&cnt); printf("count rc=%d count=%u\n", r, cnt); }
  printf("count null rc=%d\n", ((nvmlReturn_t(*)(unsigned*))NS(nvmlDeviceGetCount_v2))(NULL));
  printf("handle 9 rc=%d\n", ((nvmlReturn_t(*)(unsigned, nvmlDevice_t*))NS(nvmlDeviceGetHandleByIndex_v2))(9, &h));
  printf("handle null rc=%d\n", ((nvmlReturn_t(*)(unsigned, nvmlDevice_t*))NS(nvmlDeviceGetHandleByIndex_v2))(0, NULL));
  printf("handle rc=%d\n", ((nvmlReturn_t(*)(unsigned, nvmlDevice_t*))NS(nvmlDeviceGetHandleByIndex_v2))(0, &h));
  char buf[128]; printf("uuid rc=%d ", ((nvmlReturn_t(*)(nvmlDevice_t, char*, unsigned))NS(nvmlDeviceGetUUID))(h, buf, sizeof buf)); printf("%s\n", buf);
  printf("uuid small rc=%d\n", ((nvmlReturn_t(*)(nvmlDevice_t, char*, unsigned))NS(nvmlDeviceGetUUID))(h, buf, 5));
  printf("name rc=%d ", ((nvmlReturn_t(*)(nvmlDevice_t, char*, unsigned))NS(nvmlDeviceGetName))(h, buf, sizeof buf)); printf("%s\n", buf);
  printf("name small rc=%d\n", ((nvmlReturn_t(*)(nvmlDevice_t, char*, unsigned))NS(nvmlDeviceGetName))(h, buf, 5));
  { unsigned idx = 99; nvmlReturn_t r = ((nvmlReturn_t(*)(nvmlDevice_t, unsigned*))NS(nvmlDeviceGetIndex))(h, &idx); printf("index rc=%d idx=%u\n", r, idx); }
  printf("driver rc=%d ", ((nvmlReturn_t(*)(char*, unsigned))NS(nvmlSystemGetDriverVersion))(buf, sizeof buf)); printf("%s\n", buf);
  nvmlMemory_t m; { nvmlReturn_t r = ((nvmlReturn_t(*)(nvmlDevice_t, nvmlMemory_t*))NS(nvmlDeviceGetMemoryInfo))(h, &m); printf("mem rc=%d total=%llu used=%llu free=%llu\n", r, m.total, m.used, m.free); }
  printf("mem null rc=%d\n", ((nvmlReturn_t(*)(nvmlDevice_t, nvmlMemory_t*))NS(nvmlDeviceGetMemoryInfo))(h, NULL));
  nvmlMemory_v2_t m2; memset(&m2, 0, sizeof m2); m2.version = nvmlMemory_v2; printf("nvmlMemory_v2=0x%x sizeof=%zu\n", (unsigned)nvmlMemory_v2, sizeof m2);
  { nvmlReturn_t r = ((nvmlReturn_t(*)(nvmlDevice_t, nvmlMemory_v2_t*))NS(nvmlDeviceGetMemoryInfo_v2))(h, &m2); printf("mem2 rc=%d total=%llu reserved=%llu used=%llu free=%llu\n", r, m2.total, m2.reserved, m2.used, m2.free); }
  m2.version = 0; printf("mem2 badversion rc=%d\n", ((nvmlReturn_t(*)(nvmlDevice_t, nvmlMemory_v2_t*))NS(nvmlDeviceGetMemoryInfo_v2))(h, &m2));
  printf("sizeof nvmlProcessInfo_t=%zu\n", sizeof(nvmlProcessInfo_t));
  /* a process of our own with a context */
  cuInit(0); CUcontext c; cuDevicePrimaryCtxRetain(&c, 0); cuCtxSetCurrent(c);
  { unsigned n = 64; nvmlProcessInfo_t pi[64]; nvmlReturn_t r = nvmlDeviceGetComputeRunningProcesses(h, &n, pi); printf("ctx only rc=%d n=%u\n", r, n);
    for (unsigned i = 0; i < n; i++) printf("  pid=%u used=%llu\n", pi[i].pid, pi[i].usedGpuMemory);
    nvmlMemory_t mm; nvmlDeviceGetMemoryInfo(h, &mm); printf("mem ctx only used=%llu\n", mm.used); }
  CUdeviceptr d; cuMemAlloc(&d, 1 << 30);
  const char *fns[] = {"nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetComputeRunningProcesses_v2", "nvmlDeviceGetComputeRunningProcesses_v3", NULL};
  for (int k = 0; fns[k]; k++) {
    typedef nvmlReturn_t (*gp)(nvmlDevice_t, unsigned *, void *);
    gp f = (gp)dlsym(nl, fns[k]);
    if (!f) { printf("%s missing\n", fns[k]); continue; }
    unsigned n = 0; nvmlReturn_t r = f(h, &n, NULL); printf("%s count0 rc=%d n=%u\n", fns[k], r, n);
    printf("%s nullcount rc=%d\n", fns[k], f(h, NULL, NULL));
    unsigned char raw[64 * 40]; memset(raw, 0xab, sizeof raw); n = 64; r = f(h, &n, raw); printf("%s rc=%d n=%u mypid=%d\n", fns[k], r, n, getpid());
    for (unsigned i = 0; i < n && i < 4; i++) { unsigned char *e = raw + i * (k == 0 ? 16 : 24); printf("  raw:"); for (int b = 0; b < (k == 0 ? 16 : 24); b++) printf("%02x", e[b]); printf("\n"); }
  }
  { unsigned n = 64; nvmlProcessInfo_t pi[64]; nvmlReturn_t r = nvmlDeviceGetComputeRunningProcesses(h, &n, pi); printf("header-default rc=%d n=%u\n", r, n);
    for (unsigned i = 0; i < n; i++) printf("  pid=%u used=%llu gi=%u ci=%u\n", pi[i].pid, pi[i].usedGpuMemory, pi[i].gpuInstanceId, pi[i].computeInstanceId); }
  { nvmlMemory_t mm; nvmlDeviceGetMemoryInfo(h, &mm); printf("mem after 1G alloc total=%llu used=%llu free=%llu\n", mm.total, mm.used, mm.free);
    size_t f, t; cuMemGetInfo(&f, &t); printf("cuMemGetInfo free=%zu total=%zu\n", f, t); }
  printf("error strings: ");
  for (int e = 0; e < 1000; e++) { const char *s = ((const char*(*)(nvmlReturn_t))NS(nvmlErrorString))(e); if (s && strncmp(s, "Unknown", 7)) printf("\n  %d=%s", e, s); }
  printf("\nshutdown rc=%d\n", ((nv0)NS(nvmlShutdown))());
  printf("shutdown2 rc=%d\n", ((nv0)NS(nvmlShutdown))());
}

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
  if (!lib) { fprintf(stderr, "dlopen: %s\n", dlerror()); return 1; }
  if (argc > 1 && !strcmp(argv[1], "table")) table();
  else if (argc > 1 && !strcmp(argv[1], "errors")) errors();
  else if (argc > 1 && !strcmp(argv[1], "nvml")) nvml();
  else if (argc > 1 && !strcmp(argv[1], "errstr")) {
    cuInit(0);
    for (int e = 0; e < 1000; e++) { const char *n = 0, *s = 0; if (cuGetErrorName(e, &n) == 0) { cuGetErrorString(e, &s); printf("%d %s | %s\n", e, n, s); } }
  }
  return 0;
}
