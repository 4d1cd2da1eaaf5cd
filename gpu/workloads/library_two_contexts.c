/* library_two_contexts.c: one CUDA library (a cubin whose `__device__` array is WL_GLOBAL_MB)
 * used in two contexts of one GPU (the primary and a cuCtxCreate one). CUDA loads a library
 * into each context it is used in, each copy with its own globals: the preload must charge
 * both copies. Build on the GPU machine:
 *   nvcc -cubin -arch=sm_90 -o lib.cubin library_kernel.cu
 *   gcc -O2 library_two_contexts.c -o l2c -ldl     (no CUDA header needed)
 * Usage: ./l2c lib.cubin   (libcuda.so.1 through dlopen, as frameworks do)
 * Prints one line per step: STEP name rc= [free= total=].
 */
#include <dlfcn.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

typedef int CUresult;
typedef int CUdevice;
typedef int CUjit_option;
typedef int CUlibraryOption;
typedef unsigned long long CUdeviceptr;
typedef void *CUcontext, *CUlibrary, *CUkernel, *CUfunction, *CUstream;

typedef CUresult (*f_init)(unsigned);
typedef CUresult (*f_devget)(CUdevice *, int);
typedef CUresult (*f_retain)(CUcontext *, CUdevice);
typedef CUresult (*f_setcur)(CUcontext);
typedef CUresult (*f_ctxcreate)(CUcontext *, unsigned, CUdevice);
typedef CUresult (*f_libload)(CUlibrary *, const char *, CUjit_option *, void **, unsigned,
                              CUlibraryOption *, void **, unsigned);
typedef CUresult (*f_getkernel)(CUkernel *, CUlibrary, const char *);
typedef CUresult (*f_alloc)(CUdeviceptr *, size_t);
typedef CUresult (*f_memset)(CUdeviceptr, unsigned, size_t);
typedef CUresult (*f_launch)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                             unsigned, unsigned, CUstream, void **, void **);
typedef CUresult (*f_sync)(void);
typedef CUresult (*f_info)(size_t *, size_t *);
typedef CUresult (*f_free)(CUdeviceptr);

static void *h;
static void *sym(const char *n) {
  void *p = dlsym(h, n);
  if (!p) { printf("MISSING %s\n", n); exit(2); }
  return p;
}

int main(int argc, char **argv) {
  if (argc < 2) { fprintf(stderr, "usage: %s lib.cubin\n", argv[0]); return 2; }
  h = dlopen("libcuda.so.1", RTLD_NOW);
  if (!h) { printf("dlopen: %s\n", dlerror()); return 2; }
  f_init init = (f_init)sym("cuInit");
  f_devget devget = (f_devget)sym("cuDeviceGet");
  f_retain retain = (f_retain)sym("cuDevicePrimaryCtxRetain");
  f_setcur setcur = (f_setcur)sym("cuCtxSetCurrent");
  f_ctxcreate ctxcreate = (f_ctxcreate)sym("cuCtxCreate_v2");
  f_libload libload = (f_libload)sym("cuLibraryLoadFromFile");
  f_getkernel getkernel = (f_getkernel)sym("cuLibraryGetKernel");
  f_alloc alloc = (f_alloc)sym("cuMemAlloc_v2");
  f_memset memset32 = (f_memset)dlsym(h, "cuMemsetD32_v2"); /* optional (a fake driver) */
  f_launch launch = (f_launch)sym("cuLaunchKernel");
  f_sync sync = (f_sync)sym("cuCtxSynchronize");
  f_info info = (f_info)sym("cuMemGetInfo_v2");
  f_free mfree = (f_free)sym("cuMemFree_v2");
  CUdevice d;
  CUcontext a = NULL, b = NULL;
  CUlibrary lib;
  CUkernel k;
  size_t fr = 0, to = 0;
  CUresult r = init(0);
  if (!r) r = devget(&d, 0);
  if (!r) r = retain(&a, d);
  if (!r) r = setcur(a);
  printf("STEP ctx_a rc=%d\n", r);
  r = libload(&lib, argv[1], NULL, NULL, 0, NULL, NULL, 0);
  printf("STEP libload rc=%d\n", r);
  if (r) return 1;
  r = getkernel(&k, lib, "touch_global");
  printf("STEP getkernel rc=%d\n", r);
  for (int i = 0; i < 2; i++) {
    const char *name = i ? "b" : "a";
    if (i) {
      r = ctxcreate(&b, 0, d);
      printf("STEP ctx_b rc=%d\n", r);
      if (r) return 1;
    }
    info(&fr, &to);
    printf("STEP before_launch_%s rc=0 free=%zu total=%zu\n", name, fr, to);
    CUdeviceptr out = 0;
    r = alloc(&out, 4);
    if (!r && memset32) r = memset32(out, 0, 1);
    void *args[] = {&out};
    if (!r) r = launch((CUfunction)k, 1, 1, 1, 256, 1, 1, 0, NULL, args, NULL);
    if (!r) r = sync();
    printf("STEP launch_%s rc=%d\n", name, r);
    if (out) mfree(out);
    info(&fr, &to);
    printf("STEP after_launch_%s rc=0 free=%zu total=%zu\n", name, fr, to);
  }
  const char *probe = getenv("WL_PROBE_MB");
  CUdeviceptr p = 0;
  r = alloc(&p, (size_t)(probe ? atoi(probe) : 256) << 20);
  printf("STEP next_alloc rc=%d\n", r);
  if (!r) mfree(p);
  char cmd[160];
  snprintf(cmd, sizeof cmd,
           "nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader | grep '^%d,' | sed 's/^/SMI /'",
           (int)getpid());
  if (system(cmd) != 0) printf("SMI none\n");
  return 0;
}
