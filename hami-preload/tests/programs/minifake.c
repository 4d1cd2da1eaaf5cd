/* minifake: a second, deliberately different fake CUDA driver for hami-preload's regression
 * tests (tests/preload/regressions.rs). Unlike testing/fake-cuda it
 *  - is linked WITHOUT -Bsymbolic, so its internal calls to its own exported functions go
 *    through the PLT (and so into the preload's hooks): cuDevicePrimaryCtxRetain calls
 *    cuCtxCreate_v2, cuDevicePrimaryCtxRelease_v2 calls cuCtxDestroy_v2, cuMemAllocPitch_v2
 *    calls cuMemAlloc_v2; it also exports the legacy cuCtxCreate / cuCtxDestroy;
 *  - implements cuGetProcAddress_v2 with dlsym(RTLD_DEFAULT, name "_v2" or name);
 *  - exports only cuDeviceGetUuid (no _v2), has no NVML, and returns
 *    CUDA_ERROR_INVALID_HANDLE (400) for an unknown pointer.
 * One device of 1 GiB; every context takes 32 MiB. Not thread-safe (tests are single-threaded). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

/* The driver's own view of cuda.h: each definition below is checked against the prototype of
 * the symbol it defines, the legacy cuCtxCreate / cuCtxDestroy included. */
#define HAMI_CUDA_ABI_NAMES
#include "hami_cuda.h"

#define TOTAL (1ULL << 30)
#define CTX_COST (32ULL << 20)

static int inited;
static unsigned long long used;
static __thread CUcontext cur;
static int ctx_live[16];
static int primary_refs;
static CUcontext primary;
static struct { CUdeviceptr p; unsigned long long n; } allocs[256];
static CUdeviceptr next_ptr = 0x700000000000ULL;

CUresult cuInit(unsigned flags) { (void)flags; inited = 1; return 0; }
CUresult cuDeviceGetCount(int *n) { if (!inited) return 3; if (!n) return 1; *n = 1; return 0; }
CUresult cuDeviceGetUuid(CUuuid *u, CUdevice dev) {
    if (!inited) return 3;
    if (!u) return 1;
    if (dev != 0) return 101;
    memset(u, 0xab, 16);
    return 0;
}
CUresult cuCtxGetCurrent(CUcontext *p) { if (!inited) return 3; if (!p) return 1; *p = cur; return 0; }
CUresult cuCtxSetCurrent(CUcontext c) { if (!inited) return 3; cur = c; return 0; }
CUresult cuCtxGetDevice(int *d) { if (!inited) return 3; if (!cur) return 201; if (!d) return 1; *d = 0; return 0; }

static CUresult create_ctx(CUcontext *p, unsigned flags, int dev) {
    (void)flags;
    if (!inited) return 3;
    if (!p) return 1;
    if (dev != 0) return 101;
    for (int i = 0; i < 16; i++)
        if (!ctx_live[i]) {
            if (used + CTX_COST > TOTAL) return 2;
            ctx_live[i] = 1;
            used += CTX_COST;
            *p = (CUcontext)&ctx_live[i];
            cur = *p;
            return 0;
        }
    return 2;
}
CUresult cuCtxCreate_v2(CUcontext *p, unsigned flags, int dev) { return create_ctx(p, flags, dev); }
/* The legacy names: same semantics, no call through the PLT. */
CUresult cuCtxCreate(CUcontext *p, unsigned flags, int dev) { return create_ctx(p, flags, dev); }

static CUresult destroy_ctx(CUcontext c) {
    if (!inited) return 3;
    for (int i = 0; i < 16; i++)
        if (c == (CUcontext)&ctx_live[i] && ctx_live[i]) {
            ctx_live[i] = 0;
            used -= CTX_COST;
            if (cur == c) cur = 0;
            return 0;
        }
    return 201;
}
CUresult cuCtxDestroy_v2(CUcontext c) { return destroy_ctx(c); }
CUresult cuCtxDestroy(CUcontext c) { return destroy_ctx(c); }

CUresult cuDevicePrimaryCtxRetain(CUcontext *p, int dev) {
    if (!inited) return 3;
    if (!p) return 1;
    if (dev != 0) return 101;
    if (primary_refs == 0) {
        CUcontext saved = cur;
        CUresult r = cuCtxCreate_v2(&primary, 0, dev); /* through the PLT */
        cur = saved;
        if (r) return r;
    }
    primary_refs++;
    *p = primary;
    return 0;
}
CUresult cuDevicePrimaryCtxRelease_v2(int dev) {
    if (!inited) return 3;
    if (dev != 0) return 101;
    if (primary_refs == 0) return 201;
    if (--primary_refs == 0) return cuCtxDestroy_v2(primary); /* through the PLT */
    return 0;
}

CUresult cuMemAlloc_v2(CUdeviceptr *d, size_t n) {
    if (!inited) return 3;
    if (!cur) return 201;
    if (!d || n == 0) return 1;
    if (used + n > TOTAL) return 2;
    for (int i = 0; i < 256; i++)
        if (!allocs[i].p) {
            allocs[i].p = next_ptr;
            allocs[i].n = n;
            next_ptr += (n + 0xfffff) & ~0xfffffULL;
            used += n;
            *d = allocs[i].p;
            return 0;
        }
    return 2;
}
CUresult cuMemAllocPitch_v2(CUdeviceptr *d, size_t *pitch, size_t w, size_t h, unsigned e) {
    (void)e;
    if (!pitch) return 1;
    size_t p = (w + 511) / 512 * 512;
    CUresult r = cuMemAlloc_v2(d, p * h); /* through the PLT */
    if (r == 0) *pitch = p;
    return r;
}
CUresult cuMemFree_v2(CUdeviceptr p) {
    if (!inited) return 3;
    for (int i = 0; i < 256; i++)
        if (allocs[i].p && allocs[i].p == p) {
            used -= allocs[i].n;
            allocs[i].p = 0;
            return 0;
        }
    return 400;
}
CUresult cuMemGetInfo_v2(size_t *f, size_t *t) {
    if (!inited) return 3;
    if (!cur) return 201;
    if (!f || !t) return 1;
    *f = TOTAL - used;
    *t = TOTAL;
    return 0;
}
CUresult cuDeviceTotalMem_v2(size_t *b, int dev) {
    if (!inited) return 3;
    if (!b) return 1;
    if (dev != 0) return 101;
    *b = TOTAL;
    return 0;
}
CUresult cuGetProcAddress_v2(const char *s, void **pfn, int ver, cuuint64_t flags,
                             CUdriverProcAddressQueryResult *status) {
    (void)ver; (void)flags;
    if (!s || !pfn) return 1;
    char buf[256];
    snprintf(buf, sizeof buf, "%s_v2", s);
    void *f = dlsym(RTLD_DEFAULT, buf);
    if (!f) f = dlsym(RTLD_DEFAULT, s);
    *pfn = f;
    if (status) *status = f ? CU_GET_PROC_ADDRESS_SUCCESS : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    return f ? 0 : 500;
}
