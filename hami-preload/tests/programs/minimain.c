/* minimain: drives tests/programs/minifake.c (linked directly). Prints "OP rc=N ..." lines. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hami_cuda.h"

/* The legacy unversioned context symbols, on purpose (minifake.c exports both generations;
 * cuda.h binds these names to cuCtxCreate_v2 / cuCtxDestroy_v2). */
#undef cuCtxCreate
#undef cuCtxDestroy
CUresult cuCtxCreate(CUcontext *pctx, unsigned int flags, CUdevice dev);
CUresult cuCtxDestroy(CUcontext ctx);

static void info(const char *op) {
    size_t f = 0, t = 0;
    CUresult r = cuMemGetInfo_v2(&f, &t);
    printf("%s rc=%d free=%zu total=%zu\n", op, r, f, t);
    fflush(stdout);
}

int main(int argc, char **argv) {
    (void)argc; (void)argv;
    size_t pitch_h = 200u << 10, pitch_w = 1000; /* pitch 1024: 200 MiB */
    info("preinit");                                                  /* 0 */
    printf("init rc=%d\n", cuInit(0));                                /* 1 */
    CUcontext ctx = 0;
    printf("retain rc=%d\n", cuDevicePrimaryCtxRetain(&ctx, 0));      /* 2 */
    cuCtxSetCurrent(ctx);
    info("info");                                                     /* 3 */
    CUdeviceptr p = 0, q = 0, one = 0;
    size_t pitch = 0;
    CUresult r = cuMemAllocPitch_v2(&p, &pitch, pitch_w, pitch_h, 4);
    printf("pitch rc=%d pitch=%zu\n", r, pitch);                      /* 4 */
    info("info");                                                     /* 5 */
    CUresult (*alloc)(CUdeviceptr *, size_t) = 0;
    CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    r = cuGetProcAddress_v2("cuMemAlloc", (void **)&alloc, 12000, 0, &st);
    printf("procaddr rc=%d found=%d\n", r, alloc != 0);               /* 6 */
    size_t f = 0, t = 0;
    cuMemGetInfo_v2(&f, &t);
    printf("fill rc=%d\n", alloc(&q, f));                             /* 7: exactly the rest */
    printf("plusone rc=%d\n", alloc(&one, 1));                        /* 8 */
    printf("freeunknown rc=%d\n", cuMemFree_v2(0x1234));              /* 9 */
    printf("free rc=%d\n", cuMemFree_v2(p));                          /* 10 */
    printf("double rc=%d\n", cuMemFree_v2(p));                        /* 11 */
    info("info");                                                     /* 12 */
    printf("free rc=%d\n", cuMemFree_v2(q));                          /* 13 */
    info("info");                                                     /* 14 */
    CUcontext c1 = 0;
    printf("ctxcreate1 rc=%d\n", cuCtxCreate(&c1, 0, 0));             /* 15 */
    info("info");                                                     /* 16 */
    printf("ctxdestroy1 rc=%d\n", cuCtxDestroy(c1));                  /* 17 */
    cuCtxSetCurrent(ctx);
    info("info");                                                     /* 18 */
    printf("release rc=%d\n", cuDevicePrimaryCtxRelease_v2(0));       /* 19 */
    return 0;
}
