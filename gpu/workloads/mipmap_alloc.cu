/* mipmap_alloc.cu: device memory through cuMipmappedArrayCreate (driver API), for the
 * "physical" group of the acceptance runner (issue 8; protocol: wlproto.py).
 *
 * Built on the GPU machine by run_acceptance.py:
 *   nvcc -O2 mipmap_alloc.cu -o mipmap_alloc -lcuda -Xlinker -rpath -Xlinker <libcuda dir>
 * Usage: ./mipmap_alloc            (one run, the steps below in order)
 *   INIT rc= name=                  cuInit + primary context
 *   PRE rc= name= bytes=            control: WL_PROBE_MB (256) fits before the array (freed)
 *   READY step=mipmap               waits for a stdin line
 *   MIPMAP rc= name= bytes=         cuMipmappedArrayCreate WL_MIP_W x WL_MIP_H (16384 x 16384),
 *                                   CU_AD_FORMAT_FLOAT x 2 channels, 1 level: 2 GiB
 *   NEXT rc= name= bytes=           WL_PROBE_MB again, while the array is held
 *   HOLDING bytes=                  waits for a stdin line, then frees everything
 *   RELEASED, DONE rc=
 * Every rc is the CUresult as a number, name its cuGetErrorName. On the H200 (gpu-facts.md)
 * the array takes 2048 MiB. Written in C so that gpu/testing/ can compile it with gcc against a
 * stub driver (no GPU needed).
 */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MIB ((size_t)1 << 20)

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static size_t env_num(const char *name, size_t dflt) {
  const char *v = getenv(name);
  if (!v || !*v) return dflt;
  return (size_t)strtoull(v, NULL, 10);
}

static int wait_line(void) {
  char buf[256];
  return fgets(buf, sizeof buf, stdin) != NULL;
}

static const char *ename(CUresult r) {
  const char *s = NULL;
  if (cuGetErrorName(r, &s) != CUDA_SUCCESS || !s) return "unknown";
  return s;
}

static void report(const char *tag, CUresult r, size_t bytes) {
  printf("%s rc=%d name=%s bytes=%zu\n", tag, (int)r, ename(r), bytes);
  fflush(stdout);
}

int main(void) {
  size_t probe = env_num("WL_PROBE_MB", 256) * MIB;
  size_t w = env_num("WL_MIP_W", 16384), h = env_num("WL_MIP_H", 16384);
  size_t array_bytes = w * h * 2 * sizeof(float);
  CUdevice dev = 0;
  CUcontext ctx = NULL;
  CUdeviceptr p = 0, next = 0;
  CUmipmappedArray mip = NULL;
  CUDA_ARRAY3D_DESCRIPTOR d;
  CUresult r;

  setvbuf(stdout, NULL, _IOLBF, 0);
  printf("PID pid=%d\n", (int)getpid());
  r = cuInit(0);
  if (r == CUDA_SUCCESS) r = cuDeviceGet(&dev, 0);
  if (r == CUDA_SUCCESS) r = cuDevicePrimaryCtxRetain(&ctx, dev);
  if (r == CUDA_SUCCESS) r = cuCtxSetCurrent(ctx);
  report("INIT", r, 0);
  if (r != CUDA_SUCCESS) {
    printf("DONE rc=2\n");
    return 2;
  }
  r = cuMemAlloc(&p, probe);
  report("PRE", r, probe);
  if (r == CUDA_SUCCESS) cuMemFree(p);

  printf("READY step=mipmap\n");
  fflush(stdout);
  if (!wait_line()) {
    printf("EOF step=mipmap\n");
    return 3;
  }
  printf("ALLOC_T0 t=%.6f\n", now());
  memset(&d, 0, sizeof d);
  d.Width = w;
  d.Height = h;
  d.Depth = 0; /* a 2D mipmapped array */
  d.Format = CU_AD_FORMAT_FLOAT;
  d.NumChannels = 2;
  d.Flags = 0;
  r = cuMipmappedArrayCreate(&mip, &d, 1);
  report("MIPMAP", r, array_bytes);
  if (r != CUDA_SUCCESS) mip = NULL;
  r = cuMemAlloc(&next, probe);
  report("NEXT", r, probe);
  if (r != CUDA_SUCCESS) next = 0;
  cuCtxSynchronize();
  printf("HOLDING bytes=%zu t=%.6f\n", (mip ? array_bytes : 0) + (next ? probe : 0), now());
  fflush(stdout);
  wait_line();
  if (next) cuMemFree(next);
  if (mip) cuMipmappedArrayDestroy(mip);
  printf("RELEASED\n");
  cuDevicePrimaryCtxRelease(dev);
  printf("DONE rc=0\n");
  return 0;
}
