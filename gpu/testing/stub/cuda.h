/* Stub CUDA driver API for testing the acceptance runner WITHOUT a GPU (gpu/test_runner.py):
 * only what gpu/workloads/mipmap_alloc.cu and lock_stop.cu call. "Device" memory is untouched
 * host memory; an allocation past the device size fails with CUDA_ERROR_OUT_OF_MEMORY. The device size is
 * the quota when a (fake) hami preload that is not "blind" is in LD_PRELOAD with
 * CUDA_DEVICE_MEMORY_LIMIT=<n>M, else WL_STUB_TOTAL_MB (default 143771, an H200).
 * With WL_STUB_LOCK set, cuMemAlloc/cuMemFree charge a region-shaped file under a lock
 * (region_lock.h; for lock_stop.cu). Not a model of CUDA. */
#ifndef WL_STUB_CUDA_H
#define WL_STUB_CUDA_H
#include <stdlib.h>
#include <string.h>
#include "region_lock.h"

typedef enum { CUDA_SUCCESS = 0, CUDA_ERROR_INVALID_VALUE = 1, CUDA_ERROR_OUT_OF_MEMORY = 2 } CUresult;
typedef int CUdevice;
typedef struct stub_ctx *CUcontext;
typedef unsigned long long CUdeviceptr;
typedef struct stub_mip { void *p; size_t n; } *CUmipmappedArray;
typedef enum { CU_AD_FORMAT_FLOAT = 0x20 } CUarray_format;
typedef struct {
  size_t Width, Height, Depth;
  CUarray_format Format;
  unsigned int NumChannels, Flags;
} CUDA_ARRAY3D_DESCRIPTOR;

static size_t stubd_used;

static size_t stubd_total(void) {
  const char *pre = getenv("LD_PRELOAD"), *lim = getenv("CUDA_DEVICE_MEMORY_LIMIT");
  const char *v = getenv("WL_STUB_TOTAL_MB");
  if (pre && strstr(pre, "hami") && !strstr(pre, "blind") && lim)
    return (size_t)strtoull(lim, NULL, 10) << 20;
  return (size_t)(v ? strtoull(v, NULL, 10) : 143771) << 20;
}
static void *stubd_alloc(size_t n) {
  size_t *h;
  if (stubd_used + n > stubd_total()) return NULL;
  h = (size_t *)malloc(n + 16);
  if (!h) return NULL;
  h[0] = n;
  stubd_used += n;
  return h + 2;
}
static void stubd_free(void *p) {
  if (p) {
    size_t *h = (size_t *)p - 2;
    stubd_used -= h[0];
    free(h);
  }
}
static CUresult cuInit(unsigned int f) { (void)f; return CUDA_SUCCESS; }
static CUresult cuDeviceGet(CUdevice *d, int o) { *d = o; return CUDA_SUCCESS; }
static CUresult cuDevicePrimaryCtxRetain(CUcontext *c, CUdevice d) {
  (void)d;
  *c = (CUcontext)1;
  return CUDA_SUCCESS;
}
static CUresult cuDevicePrimaryCtxRelease(CUdevice d) { (void)d; return CUDA_SUCCESS; }
static CUresult cuCtxSetCurrent(CUcontext c) { (void)c; return CUDA_SUCCESS; }
static CUresult cuCtxSynchronize(void) { return CUDA_SUCCESS; }
static CUresult cuMemAlloc(CUdeviceptr *p, size_t n) {
  void *q = NULL;
  if (stubl_on()) {
    if (!stubl_alloc(&q, n, stubd_total())) return CUDA_ERROR_OUT_OF_MEMORY;
  } else if (!(q = stubd_alloc(n))) {
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  *p = (CUdeviceptr)q;
  return CUDA_SUCCESS;
}
static CUresult cuMemFree(CUdeviceptr p) {
  if (stubl_on())
    stubl_free((void *)p);
  else
    stubd_free((void *)p);
  return CUDA_SUCCESS;
}
static CUresult cuMipmappedArrayCreate(CUmipmappedArray *m, const CUDA_ARRAY3D_DESCRIPTOR *d,
                                       unsigned int levels) {
  size_t n = d->Width * d->Height * (d->Depth ? d->Depth : 1) * d->NumChannels * 4;
  void *q;
  if (levels != 1) return CUDA_ERROR_INVALID_VALUE;
  q = stubd_alloc(n);
  if (!q) return CUDA_ERROR_OUT_OF_MEMORY;
  *m = (CUmipmappedArray)malloc(sizeof **m);
  (*m)->p = q;
  (*m)->n = n;
  return CUDA_SUCCESS;
}
static CUresult cuMipmappedArrayDestroy(CUmipmappedArray m) {
  stubd_free(m->p);
  free(m);
  return CUDA_SUCCESS;
}
static CUresult cuGetErrorName(CUresult r, const char **s) {
  *s = r == CUDA_SUCCESS ? "CUDA_SUCCESS"
       : r == CUDA_ERROR_OUT_OF_MEMORY ? "CUDA_ERROR_OUT_OF_MEMORY" : "CUDA_ERROR_INVALID_VALUE";
  return CUDA_SUCCESS;
}
#endif
