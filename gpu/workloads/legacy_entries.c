/* legacy_entries.c: what the driver's legacy (v1) exports and a release while mapped do to
 * device memory. Each case prints one line: CASE name=.. rc=.. held_mib=.. (device memory
 * the driver reports taken by the case, from cuMemGetInfo_v2 before/after) and what the
 * preload answered.
 *
 *   gcc -O2 -I/usr/local/cuda/include legacy_entries.c -o legacy_entries -lcuda -ldl
 *   ./legacy_entries [MiB per allocation, default 512] [count, default 4]
 *
 * Cases:
 *  v1_mem_alloc       cuMemAlloc (v1: unsigned int *dptr, unsigned int bytes), by dlsym
 *  v1_mem_alloc_pitch cuMemAllocPitch (v1)
 *  v1_array_create    cuArrayCreate (v1 descriptor of unsigned ints), by dlsym
 *  v1_array3d_create  cuArray3DCreate (v1)
 *  procaddr_v1        cuGetProcAddress("cuMemAlloc", 2000): the pointer it hands out
 *  release_mapped     cuMemCreate + cuMemMap + cuMemRelease, count times, nothing unmapped:
 *                     the memory stays held while mapped (cuMemRelease's documentation)
 *  v1_mem_get_info    cuMemGetInfo (v1) against cuMemGetInfo_v2
 *  v1_ctx_*           the v1 allocation calls again, in a context made by the v1 cuCtxCreate
 *                     (the driver refuses to mix API versions: a v1 call in a v2 context
 *                     returns CUDA_ERROR_INVALID_CONTEXT)
 *  green_ctx          count green contexts (cuGreenCtxCreate over all SMs), each made
 *                     current with one 1 MiB allocation: the memory each context takes
 */
#define _GNU_SOURCE
#include <cuda.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef CUresult (*v1_alloc_t)(unsigned int *, unsigned int);
typedef CUresult (*v1_free_t)(unsigned int);
typedef CUresult (*v1_pitch_t)(unsigned int *, unsigned int *, unsigned int, unsigned int,
                               unsigned int);
typedef struct {
  unsigned int Width, Height;
  CUarray_format Format;
  unsigned int NumChannels;
} desc_v1;
typedef struct {
  unsigned int Width, Height, Depth;
  CUarray_format Format;
  unsigned int NumChannels, Flags;
} desc3d_v1;
typedef CUresult (*v1_array_t)(CUarray *, const desc_v1 *);
typedef CUresult (*v1_array3d_t)(CUarray *, const desc3d_v1 *);
typedef CUresult (*v1_info_t)(unsigned int *, unsigned int *);

static size_t free_now(void) {
  size_t f = 0, t = 0;
  cuMemGetInfo_v2(&f, &t);
  return f;
}

static void *sym(const char *name) {
  void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (!h) h = dlopen("libcuda.so.1", RTLD_NOW);
  void *p = h ? dlsym(h, name) : NULL;
  if (!p) printf("CASE name=%s missing=1\n", name);
  return p;
}

#define HELD(f0) ((long long)((long long)(f0) - (long long)free_now()) / (1 << 20))

int main(int argc, char **argv) {
  unsigned int mib = argc > 1 ? (unsigned)atoi(argv[1]) : 512;
  int count = argc > 2 ? atoi(argv[2]) : 4;
  if (count < 1 || count > 64) count = 4;
  CUdevice dev;
  CUcontext ctx;
  CUresult r;
  if ((r = cuInit(0)) || (r = cuDeviceGet(&dev, 0)) || (r = cuDevicePrimaryCtxRetain(&ctx, dev)) ||
      (r = cuCtxSetCurrent(ctx))) {
    printf("INIT_ERROR rc=%d\n", r);
    return 1;
  }
  size_t f0;

  v1_alloc_t alloc1 = (v1_alloc_t)sym("cuMemAlloc");
  v1_free_t free1 = (v1_free_t)sym("cuMemFree");
  if (alloc1 && free1) {
    unsigned int p[64] = {0};
    int ok = 0, first_rc = -1;
    f0 = free_now();
    for (int i = 0; i < count; i++) {
      r = alloc1(&p[i], mib << 20);
      if (first_rc < 0 || r) first_rc = r;
      if (!r) ok++;
    }
    printf("CASE name=v1_mem_alloc rc=%d ok=%d/%d held_mib=%lld first_ptr=0x%x\n", first_rc, ok,
           count, HELD(f0), p[0]);
    for (int i = 0; i < count; i++)
      if (p[i]) free1(p[i]);
    printf("CASE name=v1_mem_free after_free_held_mib=%lld\n", HELD(f0));
  }

  v1_pitch_t pitch1 = (v1_pitch_t)sym("cuMemAllocPitch");
  if (pitch1 && free1) {
    unsigned int p = 0, pitch = 0;
    f0 = free_now();
    r = pitch1(&p, &pitch, 1 << 16, (mib << 20) >> 16, 4);
    printf("CASE name=v1_mem_alloc_pitch rc=%d held_mib=%lld ptr=0x%x pitch=%u\n", r, HELD(f0), p,
           pitch);
    if (!r) free1(p);
  }

  v1_array_t arr1 = (v1_array_t)sym("cuArrayCreate");
  if (arr1) {
    CUarray a[64] = {0};
    int ok = 0, rc = 0;
    desc_v1 d = {8192, (mib << 20) / (8192 * 16), CU_AD_FORMAT_FLOAT, 4};
    f0 = free_now();
    for (int i = 0; i < count; i++) {
      r = arr1(&a[i], &d);
      if (r) rc = r; else ok++;
    }
    printf("CASE name=v1_array_create rc=%d ok=%d/%d held_mib=%lld\n", rc, ok, count, HELD(f0));
    for (int i = 0; i < count; i++)
      if (a[i]) cuArrayDestroy(a[i]);
  }

  v1_array3d_t arr3 = (v1_array3d_t)sym("cuArray3DCreate");
  if (arr3) {
    CUarray a = 0;
    desc3d_v1 d = {1024, 1024, (mib << 20) / (1024 * 1024 * 16), CU_AD_FORMAT_FLOAT, 4, 0};
    f0 = free_now();
    r = arr3(&a, &d);
    printf("CASE name=v1_array3d_create rc=%d held_mib=%lld\n", r, HELD(f0));
    if (a) cuArrayDestroy(a);
  }

  {
    void *pfn = NULL;
    CUdriverProcAddressQueryResult st = 0;
    r = cuGetProcAddress_v2("cuMemAlloc", &pfn, 2000, 0, &st);
    Dl_info di;
    memset(&di, 0, sizeof di);
    if (pfn) dladdr(pfn, &di);
    printf("CASE name=procaddr_v1 rc=%d status=%d sym=%s lib=%s same_as_dlsym_v1=%d\n", r, (int)st,
           di.dli_sname ? di.dli_sname : "NULL", di.dli_fname ? di.dli_fname : "NULL",
           pfn == (void *)alloc1);
  }

  {
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = dev;
    size_t gran = 0;
    cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
    size_t size = (size_t)mib << 20;
    if (gran) size = (size + gran - 1) / gran * gran;
    CUdeviceptr va[64] = {0};
    int created = 0, mapped = 0, released = 0, rc = 0;
    f0 = free_now();
    for (int i = 0; i < count; i++) {
      CUmemGenericAllocationHandle h;
      if ((r = cuMemCreate(&h, size, &prop, 0))) { rc = r; break; }
      created++;
      if ((r = cuMemAddressReserve(&va[i], size, 0, 0, 0))) { rc = r; break; }
      if ((r = cuMemMap(va[i], size, 0, h, 0))) { rc = r; break; }
      mapped++;
      if ((r = cuMemRelease(h))) { rc = r; break; }
      released++;
    }
    printf("CASE name=release_mapped rc=%d created=%d mapped=%d released=%d held_mib=%lld\n", rc,
           created, mapped, released, HELD(f0));
    /* A plain allocation after the loop: refused if the quota knows what is held. */
    CUdeviceptr p = 0;
    r = cuMemAlloc_v2(&p, size);
    printf("CASE name=alloc_after_release_mapped rc=%d held_mib=%lld\n", r, HELD(f0));
    if (!r) cuMemFree_v2(p);
    for (int i = 0; i < count; i++)
      if (va[i]) {
        cuMemUnmap(va[i], size);
        cuMemAddressFree(va[i], size);
      }
    printf("CASE name=release_mapped_unmapped held_mib=%lld\n", HELD(f0));
  }

  {
    typedef CUresult (*v1_ctx_t)(CUcontext *, unsigned int, CUdevice);
    v1_ctx_t ctx1 = (v1_ctx_t)sym("cuCtxCreate");
    CUcontext c1 = 0;
    r = ctx1 ? ctx1(&c1, 0, dev) : 500;
    printf("CASE name=v1_ctx_create rc=%d\n", r);
    if (!r) {
      unsigned int p[64] = {0};
      int ok = 0, rc = 0;
      f0 = free_now();
      for (int i = 0; i < count && alloc1; i++) {
        r = alloc1(&p[i], mib << 20);
        if (r) rc = r; else ok++;
      }
      printf("CASE name=v1_ctx_mem_alloc rc=%d ok=%d/%d held_mib=%lld first_ptr=0x%x\n", rc, ok, count,
             HELD(f0), p[0]);
      unsigned int f1 = 0, t1 = 0;
      v1_info_t info = (v1_info_t)sym("cuMemGetInfo");
      r = info ? info(&f1, &t1) : 500;
      printf("CASE name=v1_ctx_mem_get_info rc=%d free1_mib=%u total1_mib=%u\n", r, f1 >> 20, t1 >> 20);
      CUarray a = 0;
      desc_v1 d = {8192, (mib << 20) / (8192 * 16), CU_AD_FORMAT_FLOAT, 4};
      f0 = free_now();
      r = arr1 ? arr1(&a, &d) : 500;
      printf("CASE name=v1_ctx_array_create rc=%d held_mib=%lld\n", r, HELD(f0));
      if (a) cuArrayDestroy(a);
      for (int i = 0; i < count; i++)
        if (p[i] && free1) free1(p[i]);
      cuCtxDestroy(c1);
      cuCtxSetCurrent(ctx);
    }
  }

  v1_info_t info1 = (v1_info_t)sym("cuMemGetInfo");
  if (info1) {
    unsigned int f1 = 0, t1 = 0;
    size_t f2 = 0, t2 = 0;
    r = info1(&f1, &t1);
    cuMemGetInfo_v2(&f2, &t2);
    printf("CASE name=v1_mem_get_info rc=%d free1_mib=%u total1_mib=%u free2_mib=%zu total2_mib=%zu\n",
           r, f1 >> 20, t1 >> 20, f2 >> 20, t2 >> 20);
  }
  {
    CUdevResource sm;
    CUdevResourceDesc desc;
    CUgreenCtx g[64] = {0};
    int ok = 0, rc = 0;
    memset(&sm, 0, sizeof sm);
    f0 = free_now();
    if ((r = cuDeviceGetDevResource(dev, &sm, CU_DEV_RESOURCE_TYPE_SM)) ||
        (r = cuDevResourceGenerateDesc(&desc, &sm, 1))) {
      printf("CASE name=green_ctx setup_rc=%d\n", r);
    } else {
      for (int i = 0; i < count; i++) {
        CUcontext c = 0;
        CUdeviceptr p = 0;
        if ((r = cuGreenCtxCreate(&g[i], desc, dev, CU_GREEN_CTX_DEFAULT_STREAM))) { rc = r; break; }
        if ((r = cuCtxFromGreenCtx(&c, g[i])) || (r = cuCtxSetCurrent(c))) { rc = r; break; }
        if ((r = cuMemAlloc_v2(&p, 1 << 20))) { rc = r; break; }
        cuMemFree_v2(p);
        ok++;
      }
      cuCtxSetCurrent(ctx);
      printf("CASE name=green_ctx rc=%d ok=%d/%d held_mib=%lld sms=%u\n", rc, ok, count, HELD(f0),
             sm.sm.smCount);
      for (int i = 0; i < count; i++)
        if (g[i]) cuGreenCtxDestroy(g[i]);
      printf("CASE name=green_ctx_destroyed held_mib=%lld\n", HELD(f0));
    }
  }
  return 0;
}
