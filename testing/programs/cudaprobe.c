/*
 * cudaprobe: the workload driver of hami-rs's tests, benchmarks and demo.
 *
 * Executes driver-API operations given on the command line, in order, and prints one
 * parseable line per operation on stdout (flushed at once):
 *
 *     pid=1234 via=direct device=0
 *     op=init rc=0 name=CUDA_SUCCESS
 *     op=alloc size=1048576 idx=0 ptr=0x100000000000 rc=0 name=CUDA_SUCCESS
 *
 * The driver is reached in one of the three ways real programs use (--via):
 *   direct    linked with -lcuda, calling the exported versioned symbols (cuMemAlloc_v2 ...);
 *   dlsym     dlopen("libcuda.so.1") + dlsym of the versioned symbols;
 *   procaddr  dlopen + dlsym("cuGetProcAddress_v2") only, then EVERY function resolved through
 *             it by base name with --cuda-version (default 12000) and flags 0, like the CUDA
 *             12/13 runtime (cuCtxCreate then resolves to _v3/_v4 and is called accordingly).
 *
 * Build: gcc -O2 -o cudaprobe cudaprobe.c -L<dir of libcuda.so> -lcuda -ldl -lpthread
 * (no rpath: run with LD_LIBRARY_PATH pointing at the fake or the real driver).
 *
 * Usage: cudaprobe [--via direct|dlsym|procaddr] [--device N] [--cuda-version V] OP...
 * Run `cudaprobe --help` for the operations.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef void *CUcontext;
typedef void *CUstream;
typedef void *CUarray;
typedef void *CUmemoryPool;
typedef unsigned long long CUmemGenericAllocationHandle;
typedef struct { char bytes[16]; } CUuuid;
typedef struct { unsigned int type; int id; } CUmemLocation;
typedef struct {
  unsigned int type, requestedHandleTypes;
  CUmemLocation location;
  void *win32HandleMetaData;
  struct { unsigned char compressionType, gpuDirectRDMACapable; unsigned short usage; unsigned char reserved[4]; } allocFlags;
} CUmemAllocationProp;
typedef struct { CUmemLocation location; unsigned int flags; } CUmemAccessDesc;
typedef struct {
  unsigned int allocType, handleTypes;
  CUmemLocation location;
  void *win32SecurityAttributes;
  size_t maxSize;
  unsigned short usage;
  unsigned char reserved[54];
} CUmemPoolProps;
typedef struct { size_t Width, Height; unsigned int Format, NumChannels; } CUDA_ARRAY_DESCRIPTOR;
typedef struct { size_t Width, Height, Depth; unsigned int Format, NumChannels, Flags; } CUDA_ARRAY3D_DESCRIPTOR;

/* Prototypes of the exported symbols used in --via direct. */
CUresult cuInit(unsigned int);
CUresult cuDriverGetVersion(int *);
CUresult cuGetErrorName(CUresult, const char **);
CUresult cuGetErrorString(CUresult, const char **);
CUresult cuDeviceGet(CUdevice *, int);
CUresult cuDeviceGetCount(int *);
CUresult cuDeviceGetName(char *, int, CUdevice);
CUresult cuDeviceGetUuid_v2(CUuuid *, CUdevice);
CUresult cuDeviceTotalMem_v2(size_t *, CUdevice);
CUresult cuDevicePrimaryCtxRetain(CUcontext *, CUdevice);
CUresult cuDevicePrimaryCtxRelease_v2(CUdevice);
CUresult cuCtxCreate_v2(CUcontext *, unsigned int, CUdevice);
CUresult cuCtxDestroy_v2(CUcontext);
CUresult cuCtxSetCurrent(CUcontext);
CUresult cuCtxGetCurrent(CUcontext *);
CUresult cuCtxGetDevice(CUdevice *);
CUresult cuCtxPopCurrent_v2(CUcontext *);
CUresult cuCtxSynchronize(void);
CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);
CUresult cuMemFree_v2(CUdeviceptr);
CUresult cuMemGetInfo_v2(size_t *, size_t *);
CUresult cuMemAllocPitch_v2(CUdeviceptr *, size_t *, size_t, size_t, unsigned int);
CUresult cuMemAllocManaged(CUdeviceptr *, size_t, unsigned int);
CUresult cuMemAllocAsync(CUdeviceptr *, size_t, CUstream);
CUresult cuMemAllocAsync_ptsz(CUdeviceptr *, size_t, CUstream);
CUresult cuMemFreeAsync(CUdeviceptr, CUstream);
CUresult cuMemAllocFromPoolAsync(CUdeviceptr *, size_t, CUmemoryPool, CUstream);
CUresult cuMemPoolCreate(CUmemoryPool *, const CUmemPoolProps *);
CUresult cuStreamSynchronize(CUstream);
CUresult cuMemCreate(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long);
CUresult cuMemRelease(CUmemGenericAllocationHandle);
CUresult cuMemAddressReserve(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
CUresult cuMemAddressFree(CUdeviceptr, size_t);
CUresult cuMemMap(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
CUresult cuMemUnmap(CUdeviceptr, size_t);
CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *, void *);
CUresult cuMemSetAccess(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
CUresult cuArrayCreate_v2(CUarray *, const CUDA_ARRAY_DESCRIPTOR *);
CUresult cuArray3DCreate_v2(CUarray *, const CUDA_ARRAY3D_DESCRIPTOR *);
CUresult cuArrayDestroy(CUarray);
CUresult cuGetProcAddress_v2(const char *, void **, int, unsigned long long, int *);
/* Later additions, declared weak: a driver without them still runs every other op (the op
 * then prints error=missing-function). */
#define WEAK __attribute__((weak))
WEAK CUresult cuDeviceGetMemPool(CUmemoryPool *, CUdevice);
WEAK CUresult cuDeviceSetMemPool(CUdevice, CUmemoryPool);
WEAK CUresult cuMemPoolTrimTo(CUmemoryPool, size_t);
WEAK CUresult cuMemPoolGetAttribute(CUmemoryPool, int, void *);
WEAK CUresult cuMemPoolSetAttribute(CUmemoryPool, int, void *);
WEAK CUresult cuMemPoolDestroy(CUmemoryPool);
WEAK CUresult cuMipmappedArrayCreate(void **, const CUDA_ARRAY3D_DESCRIPTOR *, unsigned int);
WEAK CUresult cuMipmappedArrayDestroy(void *);
WEAK CUresult cuModuleLoad(void **, const char *);
WEAK CUresult cuModuleLoadData(void **, const void *);
WEAK CUresult cuModuleLoadDataEx(void **, const void *, unsigned int, int *, void **);
WEAK CUresult cuModuleLoadFatBinary(void **, const void *);
WEAK CUresult cuModuleUnload(void *);
WEAK CUresult cuModuleGetFunction(void **, void *, const char *);
WEAK CUresult cuLibraryLoadData(void **, const void *, int *, void **, unsigned int, int *, void **, unsigned int);
WEAK CUresult cuLibraryLoadFromFile(void **, const char *, int *, void **, unsigned int, int *, void **, unsigned int);
WEAK CUresult cuLibraryUnload(void *);
WEAK CUresult cuLibraryGetKernel(void **, void *, const char *);
WEAK CUresult cuKernelGetFunction(void **, void *);
WEAK CUresult cuModuleGetGlobal_v2(CUdeviceptr *, size_t *, void *, const char *);
WEAK CUresult cuLibraryGetGlobal(CUdeviceptr *, size_t *, void *, const char *);
WEAK CUresult cuLibraryGetModule(void **, void *);
WEAK CUresult cuLaunchKernel(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream, void **, void **);
typedef struct { unsigned int dims[7]; CUstream stream; void *attrs; unsigned int numAttrs; } CUlaunchConfig;
WEAK CUresult cuLaunchKernelEx(const CUlaunchConfig *, void *, void **, void **);
WEAK CUresult cuEventCreate(void **, unsigned int);
WEAK CUresult cuEventRecord(void *, CUstream);
WEAK CUresult cuEventSynchronize(void *);
WEAK CUresult cuEventDestroy_v2(void *);
WEAK CUresult cuStreamCreate(CUstream *, unsigned int);
WEAK CUresult cuStreamBeginCapture_v2(CUstream, int);
WEAK CUresult cuStreamEndCapture(CUstream, void **);
WEAK CUresult cuCtxSetLimit(int, size_t);
WEAK CUresult cuCtxGetLimit(size_t *, int);
WEAK CUresult cuFuncGetAttribute(int *, int, void *);
/* The device clock's ops (launch-ns, launch-for, ev*, graph-*). */
WEAK CUresult cuEventQuery(void *);
WEAK CUresult cuEventElapsedTime(float *, void *, void *);
WEAK CUresult cuStreamQuery(CUstream);
WEAK CUresult cuLaunchCooperativeKernel(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream, void **);
WEAK CUresult cuGraphInstantiateWithFlags(void **, void *, unsigned long long);
WEAK CUresult cuGraphLaunch(void *, CUstream);
WEAK CUresult cuGraphExecDestroy(void *);
WEAK CUresult cuGraphDestroy(void *);

/* The function table every operation goes through. */
static struct {
  CUresult (*Init)(unsigned int);
  CUresult (*DriverGetVersion)(int *);
  CUresult (*GetErrorName)(CUresult, const char **);
  CUresult (*GetErrorString)(CUresult, const char **);
  CUresult (*DeviceGet)(CUdevice *, int);
  CUresult (*DeviceGetCount)(int *);
  CUresult (*DeviceGetName)(char *, int, CUdevice);
  CUresult (*DeviceGetUuid)(CUuuid *, CUdevice);
  CUresult (*DeviceTotalMem)(size_t *, CUdevice);
  CUresult (*PrimaryCtxRetain)(CUcontext *, CUdevice);
  CUresult (*PrimaryCtxRelease)(CUdevice);
  void *CtxCreate; /* signature depends on ctx_create_variant */
  CUresult (*CtxDestroy)(CUcontext);
  CUresult (*CtxSetCurrent)(CUcontext);
  CUresult (*CtxGetCurrent)(CUcontext *);
  void *CtxGetDevice; /* (CUdevice*) or, from CUDA 13.0, (CUdevice*, CUcontext) */
  CUresult (*CtxPopCurrent)(CUcontext *);
  void *CtxSynchronize; /* () or, from CUDA 13.0, (CUcontext) */
  CUresult (*MemAlloc)(CUdeviceptr *, size_t);
  CUresult (*MemFree)(CUdeviceptr);
  CUresult (*MemGetInfo)(size_t *, size_t *);
  CUresult (*MemAllocPitch)(CUdeviceptr *, size_t *, size_t, size_t, unsigned int);
  CUresult (*MemAllocManaged)(CUdeviceptr *, size_t, unsigned int);
  CUresult (*MemAllocAsync)(CUdeviceptr *, size_t, CUstream);
  CUresult (*MemAllocAsyncPtsz)(CUdeviceptr *, size_t, CUstream);
  CUresult (*MemFreeAsync)(CUdeviceptr, CUstream);
  CUresult (*MemAllocFromPoolAsync)(CUdeviceptr *, size_t, CUmemoryPool, CUstream);
  CUresult (*MemPoolCreate)(CUmemoryPool *, const CUmemPoolProps *);
  CUresult (*StreamSynchronize)(CUstream);
  CUresult (*MemCreate)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long);
  CUresult (*MemRelease)(CUmemGenericAllocationHandle);
  CUresult (*MemAddressReserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
  CUresult (*MemAddressFree)(CUdeviceptr, size_t);
  CUresult (*MemMap)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
  CUresult (*MemUnmap)(CUdeviceptr, size_t);
  CUresult (*MemRetainAllocationHandle)(CUmemGenericAllocationHandle *, void *);
  CUresult (*MemSetAccess)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
  CUresult (*ArrayCreate)(CUarray *, const CUDA_ARRAY_DESCRIPTOR *);
  CUresult (*Array3DCreate)(CUarray *, const CUDA_ARRAY3D_DESCRIPTOR *);
  CUresult (*ArrayDestroy)(CUarray);
  CUresult (*GetProcAddress)(const char *, void **, int, unsigned long long, int *);
  /* Optional (NULL when the driver lacks them). */
  CUresult (*DeviceGetMemPool)(CUmemoryPool *, CUdevice);
  CUresult (*DeviceSetMemPool)(CUdevice, CUmemoryPool);
  CUresult (*MemPoolTrimTo)(CUmemoryPool, size_t);
  CUresult (*MemPoolGetAttribute)(CUmemoryPool, int, void *);
  CUresult (*MemPoolSetAttribute)(CUmemoryPool, int, void *);
  CUresult (*MemPoolDestroy)(CUmemoryPool);
  CUresult (*MipmappedArrayCreate)(void **, const CUDA_ARRAY3D_DESCRIPTOR *, unsigned int);
  CUresult (*MipmappedArrayDestroy)(void *);
  CUresult (*ModuleLoad)(void **, const char *);
  CUresult (*ModuleLoadData)(void **, const void *);
  CUresult (*ModuleLoadDataEx)(void **, const void *, unsigned int, int *, void **);
  CUresult (*ModuleLoadFatBinary)(void **, const void *);
  CUresult (*ModuleUnload)(void *);
  CUresult (*ModuleGetFunction)(void **, void *, const char *);
  CUresult (*LibraryLoadData)(void **, const void *, int *, void **, unsigned int, int *, void **, unsigned int);
  CUresult (*LibraryLoadFromFile)(void **, const char *, int *, void **, unsigned int, int *, void **, unsigned int);
  CUresult (*LibraryUnload)(void *);
  CUresult (*LibraryGetKernel)(void **, void *, const char *);
  CUresult (*KernelGetFunction)(void **, void *);
  CUresult (*ModuleGetGlobal)(CUdeviceptr *, size_t *, void *, const char *);
  CUresult (*LibraryGetGlobal)(CUdeviceptr *, size_t *, void *, const char *);
  CUresult (*LibraryGetModule)(void **, void *);
  CUresult (*LaunchKernel)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream, void **, void **);
  CUresult (*LaunchKernelEx)(const CUlaunchConfig *, void *, void **, void **);
  CUresult (*EventCreate)(void **, unsigned int);
  CUresult (*EventRecord)(void *, CUstream);
  CUresult (*EventSynchronize)(void *);
  CUresult (*EventDestroy)(void *);
  CUresult (*StreamCreate)(CUstream *, unsigned int);
  CUresult (*StreamBeginCapture)(CUstream, int);
  CUresult (*StreamEndCapture)(CUstream, void **);
  CUresult (*CtxSetLimit)(int, size_t);
  CUresult (*CtxGetLimit)(size_t *, int);
  CUresult (*FuncGetAttribute)(int *, int, void *);
  CUresult (*EventQuery)(void *);
  CUresult (*EventElapsedTime)(float *, void *, void *);
  CUresult (*StreamQuery)(CUstream);
  CUresult (*LaunchCooperativeKernel)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream, void **);
  CUresult (*GraphInstantiateWithFlags)(void **, void *, unsigned long long);
  CUresult (*GraphLaunch)(void *, CUstream);
  CUresult (*GraphExecDestroy)(void *);
  CUresult (*GraphDestroy)(void *);
} cu;

enum { CTX_V2 = 2, CTX_V3 = 3, CTX_V4 = 4 };
static int ctx_create_variant = CTX_V2;
static int ctx_v13 = 0; /* cuCtxGetDevice_v2 / cuCtxSynchronize_v2 */
static const char *via = "direct";
static int device = 0;
static int cuda_version = 12000;
static void *libcuda;

enum { K_LINEAR = 1, K_PITCH, K_MANAGED, K_ASYNC, K_POOL, K_VMM, K_ARRAY, K_CTX, K_MIPMAP, K_MODULE, K_LIBRARY, K_FUNC, K_KERNEL, K_EVENT, K_GRAPH };
static const char *kind_name[] = {"", "linear", "pitch", "managed", "async", "pool", "vmm", "array", "ctx",
                                  "mipmap", "module", "library", "function", "kernel", "event", "graph"};
typedef struct {
  int kind, live;
  int handle_refs; /* K_VMM: references to the handle this program still holds */
  CUdeviceptr ptr;
  size_t size;
  CUmemGenericAllocationHandle handle;
  void *obj; /* CUarray or CUcontext */
  void *obj2; /* K_GRAPH: the graph of the executable graph in obj */
} rec_t;
static rec_t *recs;
static size_t nrecs, caprecs;
static CUmemoryPool pool;
static CUstream stream;  /* the stream of async / freeasync / pool ops (streamnew), NULL by default */
static int capturing;    /* capture-begin .. capture-end: no synchronisation after those ops */

static void die(const char *fmt, const char *arg) {
  fprintf(stderr, "cudaprobe: ");
  fprintf(stderr, fmt, arg);
  fprintf(stderr, "\n");
  exit(2);
}

static size_t add_rec(rec_t r) {
  if (nrecs == caprecs) {
    caprecs = caprecs ? caprecs * 2 : 64;
    recs = realloc(recs, caprecs * sizeof *recs);
    if (!recs) die("%s", "out of host memory");
  }
  r.live = 1;
  recs[nrecs] = r;
  return nrecs++;
}

static const char *errname(CUresult rc) {
  const char *n = NULL;
  if (cu.GetErrorName && cu.GetErrorName(rc, &n) == 0 && n) return n;
  return "UNKNOWN";
}

/* Ends an op line: rc and its name, newline, flush. */
static void end(CUresult rc) {
  printf(" rc=%d name=%s\n", rc, errname(rc));
  fflush(stdout);
}

static unsigned long long parse_size(const char *s) {
  char *e;
  errno = 0;
  unsigned long long v = strtoull(s, &e, 0);
  if (e == s || errno) die("bad size '%s'", s);
  switch (*e) {
    case 0: break;
    case 'k': case 'K': v <<= 10; e++; break;
    case 'm': case 'M': v <<= 20; e++; break;
    case 'g': case 'G': v <<= 30; e++; break;
    case 't': case 'T': v <<= 40; e++; break;
    default: die("bad size '%s'", s);
  }
  if (*e == 'i' || *e == 'I') e++;
  if (*e == 'b' || *e == 'B') e++;
  if (*e) die("bad size '%s'", s);
  return v;
}

static void *must_dlsym(const char *name) {
  void *p = dlsym(libcuda, name);
  if (!p) die("dlsym(%s) failed", name);
  return p;
}

/* Resolves one function through cuGetProcAddress_v2 (base name, cuda_version, flags). */
static void *procaddr(const char *name, unsigned long long flags) {
  void *p = NULL;
  int status = -1;
  CUresult rc = cu.GetProcAddress(name, &p, cuda_version, flags, &status);
  if (rc != 0 || !p) {
    fprintf(stderr, "cudaprobe: cuGetProcAddress_v2(%s, %d, %llu) rc=%d status=%d\n", name, cuda_version, flags, rc, status);
    exit(2);
  }
  return p;
}

/* As procaddr, NULL instead of exiting when the driver lacks the function. */
static void *procaddr_opt(const char *name) {
  void *p = NULL;
  int status = -1;
  if (cu.GetProcAddress(name, &p, cuda_version, 0, &status) != 0) return NULL;
  return p;
}

static void resolve(void) {
  if (!strcmp(via, "direct")) {
    cu.Init = cuInit; cu.DriverGetVersion = cuDriverGetVersion; cu.GetErrorName = cuGetErrorName;
    cu.GetErrorString = cuGetErrorString; cu.DeviceGet = cuDeviceGet; cu.DeviceGetCount = cuDeviceGetCount;
    cu.DeviceGetName = cuDeviceGetName; cu.DeviceGetUuid = cuDeviceGetUuid_v2; cu.DeviceTotalMem = cuDeviceTotalMem_v2;
    cu.PrimaryCtxRetain = cuDevicePrimaryCtxRetain; cu.PrimaryCtxRelease = cuDevicePrimaryCtxRelease_v2;
    cu.CtxCreate = (void *)cuCtxCreate_v2; cu.CtxDestroy = cuCtxDestroy_v2; cu.CtxSetCurrent = cuCtxSetCurrent;
    cu.CtxGetCurrent = cuCtxGetCurrent; cu.CtxGetDevice = (void *)cuCtxGetDevice; cu.CtxPopCurrent = cuCtxPopCurrent_v2;
    cu.CtxSynchronize = (void *)cuCtxSynchronize; cu.MemAlloc = cuMemAlloc_v2; cu.MemFree = cuMemFree_v2;
    cu.MemGetInfo = cuMemGetInfo_v2; cu.MemAllocPitch = cuMemAllocPitch_v2; cu.MemAllocManaged = cuMemAllocManaged;
    cu.MemAllocAsync = cuMemAllocAsync; cu.MemAllocAsyncPtsz = cuMemAllocAsync_ptsz; cu.MemFreeAsync = cuMemFreeAsync;
    cu.MemAllocFromPoolAsync = cuMemAllocFromPoolAsync; cu.MemPoolCreate = cuMemPoolCreate;
    cu.StreamSynchronize = cuStreamSynchronize; cu.MemCreate = cuMemCreate; cu.MemRelease = cuMemRelease;
    cu.MemAddressReserve = cuMemAddressReserve; cu.MemAddressFree = cuMemAddressFree; cu.MemMap = cuMemMap;
    cu.MemUnmap = cuMemUnmap; cu.MemRetainAllocationHandle = cuMemRetainAllocationHandle;
    cu.MemSetAccess = cuMemSetAccess; cu.ArrayCreate = cuArrayCreate_v2;
    cu.Array3DCreate = cuArray3DCreate_v2; cu.ArrayDestroy = cuArrayDestroy; cu.GetProcAddress = cuGetProcAddress_v2;
    cu.DeviceGetMemPool = cuDeviceGetMemPool; cu.DeviceSetMemPool = cuDeviceSetMemPool; cu.MemPoolTrimTo = cuMemPoolTrimTo;
    cu.MemPoolGetAttribute = cuMemPoolGetAttribute; cu.MemPoolSetAttribute = cuMemPoolSetAttribute;
    cu.MemPoolDestroy = cuMemPoolDestroy; cu.MipmappedArrayCreate = cuMipmappedArrayCreate;
    cu.MipmappedArrayDestroy = cuMipmappedArrayDestroy; cu.ModuleLoad = cuModuleLoad; cu.ModuleLoadData = cuModuleLoadData;
    cu.ModuleLoadDataEx = cuModuleLoadDataEx; cu.ModuleLoadFatBinary = cuModuleLoadFatBinary; cu.ModuleUnload = cuModuleUnload;
    cu.ModuleGetFunction = cuModuleGetFunction; cu.LibraryLoadData = cuLibraryLoadData;
    cu.LibraryLoadFromFile = cuLibraryLoadFromFile; cu.LibraryUnload = cuLibraryUnload;
    cu.LibraryGetKernel = cuLibraryGetKernel; cu.KernelGetFunction = cuKernelGetFunction; cu.LaunchKernel = cuLaunchKernel;
    cu.ModuleGetGlobal = cuModuleGetGlobal_v2; cu.LibraryGetGlobal = cuLibraryGetGlobal; cu.LibraryGetModule = cuLibraryGetModule;
    cu.LaunchKernelEx = cuLaunchKernelEx; cu.EventCreate = cuEventCreate; cu.EventRecord = cuEventRecord;
    cu.EventSynchronize = cuEventSynchronize; cu.EventDestroy = cuEventDestroy_v2; cu.StreamCreate = cuStreamCreate;
    cu.StreamBeginCapture = cuStreamBeginCapture_v2; cu.StreamEndCapture = cuStreamEndCapture;
    cu.CtxSetLimit = cuCtxSetLimit; cu.CtxGetLimit = cuCtxGetLimit; cu.FuncGetAttribute = cuFuncGetAttribute;
    cu.EventQuery = cuEventQuery; cu.EventElapsedTime = cuEventElapsedTime; cu.StreamQuery = cuStreamQuery;
    cu.LaunchCooperativeKernel = cuLaunchCooperativeKernel; cu.GraphInstantiateWithFlags = cuGraphInstantiateWithFlags;
    cu.GraphLaunch = cuGraphLaunch; cu.GraphExecDestroy = cuGraphExecDestroy; cu.GraphDestroy = cuGraphDestroy;
    libcuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    return;
  }
  libcuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
  if (!libcuda) die("dlopen(libcuda.so.1): %s", dlerror());
  if (!strcmp(via, "dlsym")) {
#define D(field, sym) cu.field = must_dlsym(#sym)
    D(Init, cuInit); D(DriverGetVersion, cuDriverGetVersion); D(GetErrorName, cuGetErrorName);
    D(GetErrorString, cuGetErrorString); D(DeviceGet, cuDeviceGet); D(DeviceGetCount, cuDeviceGetCount);
    D(DeviceGetName, cuDeviceGetName); D(DeviceGetUuid, cuDeviceGetUuid_v2); D(DeviceTotalMem, cuDeviceTotalMem_v2);
    D(PrimaryCtxRetain, cuDevicePrimaryCtxRetain); D(PrimaryCtxRelease, cuDevicePrimaryCtxRelease_v2);
    D(CtxCreate, cuCtxCreate_v2); D(CtxDestroy, cuCtxDestroy_v2); D(CtxSetCurrent, cuCtxSetCurrent);
    D(CtxGetCurrent, cuCtxGetCurrent); D(CtxGetDevice, cuCtxGetDevice); D(CtxPopCurrent, cuCtxPopCurrent_v2);
    D(CtxSynchronize, cuCtxSynchronize); D(MemAlloc, cuMemAlloc_v2); D(MemFree, cuMemFree_v2);
    D(MemGetInfo, cuMemGetInfo_v2); D(MemAllocPitch, cuMemAllocPitch_v2); D(MemAllocManaged, cuMemAllocManaged);
    D(MemAllocAsync, cuMemAllocAsync); D(MemAllocAsyncPtsz, cuMemAllocAsync_ptsz); D(MemFreeAsync, cuMemFreeAsync);
    D(MemAllocFromPoolAsync, cuMemAllocFromPoolAsync); D(MemPoolCreate, cuMemPoolCreate);
    D(StreamSynchronize, cuStreamSynchronize); D(MemCreate, cuMemCreate); D(MemRelease, cuMemRelease);
    D(MemAddressReserve, cuMemAddressReserve); D(MemAddressFree, cuMemAddressFree); D(MemMap, cuMemMap);
    D(MemUnmap, cuMemUnmap); D(MemRetainAllocationHandle, cuMemRetainAllocationHandle);
    D(MemSetAccess, cuMemSetAccess); D(ArrayCreate, cuArrayCreate_v2);
    D(Array3DCreate, cuArray3DCreate_v2); D(ArrayDestroy, cuArrayDestroy); D(GetProcAddress, cuGetProcAddress_v2);
#undef D
#define O(field, sym) cu.field = dlsym(libcuda, #sym)
    O(DeviceGetMemPool, cuDeviceGetMemPool); O(DeviceSetMemPool, cuDeviceSetMemPool); O(MemPoolTrimTo, cuMemPoolTrimTo);
    O(MemPoolGetAttribute, cuMemPoolGetAttribute); O(MemPoolSetAttribute, cuMemPoolSetAttribute);
    O(MemPoolDestroy, cuMemPoolDestroy); O(MipmappedArrayCreate, cuMipmappedArrayCreate);
    O(MipmappedArrayDestroy, cuMipmappedArrayDestroy); O(ModuleLoad, cuModuleLoad); O(ModuleLoadData, cuModuleLoadData);
    O(ModuleLoadDataEx, cuModuleLoadDataEx); O(ModuleLoadFatBinary, cuModuleLoadFatBinary); O(ModuleUnload, cuModuleUnload);
    O(ModuleGetFunction, cuModuleGetFunction); O(LibraryLoadData, cuLibraryLoadData);
    O(LibraryLoadFromFile, cuLibraryLoadFromFile); O(LibraryUnload, cuLibraryUnload);
    O(LibraryGetKernel, cuLibraryGetKernel); O(KernelGetFunction, cuKernelGetFunction); O(LaunchKernel, cuLaunchKernel);
    O(ModuleGetGlobal, cuModuleGetGlobal_v2); O(LibraryGetGlobal, cuLibraryGetGlobal); O(LibraryGetModule, cuLibraryGetModule);
    O(LaunchKernelEx, cuLaunchKernelEx); O(EventCreate, cuEventCreate); O(EventRecord, cuEventRecord);
    O(EventSynchronize, cuEventSynchronize); O(EventDestroy, cuEventDestroy_v2); O(StreamCreate, cuStreamCreate);
    O(StreamBeginCapture, cuStreamBeginCapture_v2); O(StreamEndCapture, cuStreamEndCapture);
    O(CtxSetLimit, cuCtxSetLimit); O(CtxGetLimit, cuCtxGetLimit); O(FuncGetAttribute, cuFuncGetAttribute);
    O(EventQuery, cuEventQuery); O(EventElapsedTime, cuEventElapsedTime); O(StreamQuery, cuStreamQuery);
    O(LaunchCooperativeKernel, cuLaunchCooperativeKernel); O(GraphInstantiateWithFlags, cuGraphInstantiateWithFlags);
    O(GraphLaunch, cuGraphLaunch); O(GraphExecDestroy, cuGraphExecDestroy); O(GraphDestroy, cuGraphDestroy);
#undef O
    return;
  }
  if (strcmp(via, "procaddr")) die("unknown --via '%s'", via);
  cu.GetProcAddress = must_dlsym("cuGetProcAddress_v2");
#define P(field, base) cu.field = procaddr(#base, 0)
  P(Init, cuInit); P(DriverGetVersion, cuDriverGetVersion); P(GetErrorName, cuGetErrorName);
  P(GetErrorString, cuGetErrorString); P(DeviceGet, cuDeviceGet); P(DeviceGetCount, cuDeviceGetCount);
  P(DeviceGetName, cuDeviceGetName); P(DeviceGetUuid, cuDeviceGetUuid); P(DeviceTotalMem, cuDeviceTotalMem);
  P(PrimaryCtxRetain, cuDevicePrimaryCtxRetain); P(PrimaryCtxRelease, cuDevicePrimaryCtxRelease);
  P(CtxCreate, cuCtxCreate); P(CtxDestroy, cuCtxDestroy); P(CtxSetCurrent, cuCtxSetCurrent);
  P(CtxGetCurrent, cuCtxGetCurrent); P(CtxGetDevice, cuCtxGetDevice); P(CtxPopCurrent, cuCtxPopCurrent);
  P(CtxSynchronize, cuCtxSynchronize); P(MemAlloc, cuMemAlloc); P(MemFree, cuMemFree);
  P(MemGetInfo, cuMemGetInfo); P(MemAllocPitch, cuMemAllocPitch); P(MemAllocManaged, cuMemAllocManaged);
  P(MemAllocAsync, cuMemAllocAsync); P(MemFreeAsync, cuMemFreeAsync);
  P(MemAllocFromPoolAsync, cuMemAllocFromPoolAsync); P(MemPoolCreate, cuMemPoolCreate);
  P(StreamSynchronize, cuStreamSynchronize); P(MemCreate, cuMemCreate); P(MemRelease, cuMemRelease);
  P(MemAddressReserve, cuMemAddressReserve); P(MemAddressFree, cuMemAddressFree); P(MemMap, cuMemMap);
  P(MemUnmap, cuMemUnmap); P(MemRetainAllocationHandle, cuMemRetainAllocationHandle);
  P(MemSetAccess, cuMemSetAccess); P(ArrayCreate, cuArrayCreate);
  P(Array3DCreate, cuArray3DCreate); P(ArrayDestroy, cuArrayDestroy); P(GetProcAddress, cuGetProcAddress);
#undef P
  cu.MemAllocAsyncPtsz = procaddr("cuMemAllocAsync", 2 /* CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM */);
#define Q(field, base) cu.field = procaddr_opt(#base)
  Q(DeviceGetMemPool, cuDeviceGetMemPool); Q(DeviceSetMemPool, cuDeviceSetMemPool); Q(MemPoolTrimTo, cuMemPoolTrimTo);
  Q(MemPoolGetAttribute, cuMemPoolGetAttribute); Q(MemPoolSetAttribute, cuMemPoolSetAttribute);
  Q(MemPoolDestroy, cuMemPoolDestroy); Q(MipmappedArrayCreate, cuMipmappedArrayCreate);
  Q(MipmappedArrayDestroy, cuMipmappedArrayDestroy); Q(ModuleLoad, cuModuleLoad); Q(ModuleLoadData, cuModuleLoadData);
  Q(ModuleLoadDataEx, cuModuleLoadDataEx); Q(ModuleLoadFatBinary, cuModuleLoadFatBinary); Q(ModuleUnload, cuModuleUnload);
  Q(ModuleGetFunction, cuModuleGetFunction); Q(LibraryLoadData, cuLibraryLoadData);
  Q(LibraryLoadFromFile, cuLibraryLoadFromFile); Q(LibraryUnload, cuLibraryUnload);
  Q(LibraryGetKernel, cuLibraryGetKernel); Q(KernelGetFunction, cuKernelGetFunction); Q(LaunchKernel, cuLaunchKernel);
  Q(ModuleGetGlobal, cuModuleGetGlobal); Q(LibraryGetGlobal, cuLibraryGetGlobal); Q(LibraryGetModule, cuLibraryGetModule);
  Q(LaunchKernelEx, cuLaunchKernelEx); Q(EventCreate, cuEventCreate); Q(EventRecord, cuEventRecord);
  Q(EventSynchronize, cuEventSynchronize); Q(EventDestroy, cuEventDestroy); Q(StreamCreate, cuStreamCreate);
  Q(StreamBeginCapture, cuStreamBeginCapture); Q(StreamEndCapture, cuStreamEndCapture);
  Q(CtxSetLimit, cuCtxSetLimit); Q(CtxGetLimit, cuCtxGetLimit); Q(FuncGetAttribute, cuFuncGetAttribute);
  Q(EventQuery, cuEventQuery); Q(EventElapsedTime, cuEventElapsedTime); Q(StreamQuery, cuStreamQuery);
  Q(LaunchCooperativeKernel, cuLaunchCooperativeKernel); Q(GraphInstantiateWithFlags, cuGraphInstantiateWithFlags);
  Q(GraphLaunch, cuGraphLaunch); Q(GraphExecDestroy, cuGraphExecDestroy); Q(GraphDestroy, cuGraphDestroy);
#undef Q
  ctx_create_variant = cuda_version >= 12050 ? CTX_V4 : cuda_version >= 11040 ? CTX_V3 : CTX_V2;
  ctx_v13 = cuda_version >= 13000;
}

static CUresult ctx_create(CUcontext *c) {
  switch (ctx_create_variant) {
    case CTX_V4: return ((CUresult(*)(CUcontext *, void *, unsigned, CUdevice))cu.CtxCreate)(c, NULL, 0, device);
    case CTX_V3: return ((CUresult(*)(CUcontext *, void *, int, unsigned, CUdevice))cu.CtxCreate)(c, NULL, 0, 0, device);
    default: return ((CUresult(*)(CUcontext *, unsigned, CUdevice))cu.CtxCreate)(c, 0, device);
  }
}

static CUresult ctx_get_device(CUdevice *d) {
  if (ctx_v13) return ((CUresult(*)(CUdevice *, CUcontext))cu.CtxGetDevice)(d, NULL);
  return ((CUresult(*)(CUdevice *))cu.CtxGetDevice)(d);
}

static CUresult ctx_sync(void) {
  if (ctx_v13) return ((CUresult(*)(CUcontext))cu.CtxSynchronize)(NULL);
  return ((CUresult(*)(void))cu.CtxSynchronize)();
}

/* Picks a record: an index, "last" (last live record of one of the kinds), or an address. */
static long pick(const char *arg, unsigned kinds) {
  if (!strcmp(arg, "last")) {
    for (size_t i = nrecs; i-- > 0;)
      if (recs[i].live && (kinds & (1u << recs[i].kind))) return (long)i;
    return -1;
  }
  if (!strncmp(arg, "0x", 2)) {
    CUdeviceptr p = strtoull(arg, NULL, 16);
    for (size_t i = nrecs; i-- > 0;)
      if (recs[i].live && recs[i].ptr == p) return (long)i;
    return -1;
  }
  char *e;
  long i = strtol(arg, &e, 10);
  if (*e || i < 0 || (size_t)i >= nrecs) return -1;
  return i;
}

/* An optional IDX argument: "last" or a number; otherwise (another op follows) "last". */
static const char *opt_idx(int argc, char **argv, int *a) {
  if (*a + 1 < argc && (!strcmp(argv[*a + 1], "last") || (argv[*a + 1][0] >= '0' && argv[*a + 1][0] <= '9')))
    return argv[++*a];
  return "last";
}

static void print_alloc(const char *op, size_t size, CUresult rc, CUdeviceptr p, int kind) {
  printf("op=%s size=%zu", op, size);
  if (rc == 0) {
    size_t i = add_rec((rec_t){.kind = kind, .ptr = p, .size = size});
    printf(" idx=%zu ptr=0x%llx", i, p);
  }
  end(rc);
}

static CUresult free_rec(size_t i) {
  rec_t *r = &recs[i];
  CUresult rc;
  switch (r->kind) {
    case K_VMM:
      rc = cu.MemUnmap(r->ptr, r->size);
      while (!rc && r->handle_refs > 0) {
        rc = cu.MemRelease(r->handle);
        if (!rc) r->handle_refs--;
      }
      if (!rc) rc = cu.MemAddressFree(r->ptr, r->size);
      break;
    case K_ARRAY: rc = cu.ArrayDestroy(r->obj); break;
    case K_CTX: rc = cu.CtxDestroy(r->obj); break;
    case K_MIPMAP: rc = cu.MipmappedArrayDestroy(r->obj); break;
    case K_MODULE: rc = cu.ModuleUnload(r->obj); break;
    case K_LIBRARY: rc = cu.LibraryUnload(r->obj); break;
    case K_FUNC: case K_KERNEL: rc = 0; break;
    case K_EVENT: rc = cu.EventDestroy(r->obj); break;
    case K_GRAPH:
      rc = cu.GraphExecDestroy(r->obj);
      if (!rc) rc = cu.GraphDestroy(r->obj2);
      break;
    default: rc = cu.MemFree(r->ptr);
  }
  if (!rc) r->live = 0;
  return rc;
}

static volatile sig_atomic_t got_signal;
static void on_signal(int s) { got_signal = s; }

static double now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e9 + t.tv_nsec;
}

/* The timed kernel of the device-clock ops: on the fake driver a module "FAKECUBIN globals=0
 * ns=param" (each launch takes its first parameter, a u64, in ns); on a real driver (which
 * rejects that image with CUDA_ERROR_INVALID_IMAGE) a PTX kernel spinning on %globaltimer
 * for that many ns, on SPIN_BLOCKS blocks. */
#define SPIN_BLOCKS 132
static const char spin_ptx[] =
    ".version 7.0\n.target sm_75\n.address_size 64\n"
    ".visible .entry spin(.param .u64 ns) {\n"
    "  .reg .u64 %t0, %t1, %d, %n;\n  .reg .pred %p;\n"
    "  ld.param.u64 %n, [ns];\n  mov.u64 %t0, %globaltimer;\n"
    "LOOP:\n  mov.u64 %t1, %globaltimer;\n  sub.u64 %d, %t1, %t0;\n"
    "  setp.lt.u64 %p, %d, %n;\n  @%p bra LOOP;\n  ret;\n}\n";
static void *spin_fn;

static CUresult spin_kernel(void) {
  if (spin_fn) return 0;
  if (!cu.ModuleLoadData || !cu.ModuleGetFunction) return -1;
  void *m = NULL;
  CUresult rc = cu.ModuleLoadData(&m, "FAKECUBIN globals=0 ns=param");
  if (rc == 200 /* CUDA_ERROR_INVALID_IMAGE: a real driver */) rc = cu.ModuleLoadData(&m, spin_ptx);
  if (!rc) rc = cu.ModuleGetFunction(&spin_fn, m, "spin");
  return rc;
}

static CUresult spin_launch(unsigned long long ns, int coop) {
  void *args[] = {&ns};
  if (coop) return cu.LaunchCooperativeKernel(spin_fn, SPIN_BLOCKS, 1, 1, 32, 1, 1, 0, stream, args);
  return cu.LaunchKernel(spin_fn, SPIN_BLOCKS, 1, 1, 32, 1, 1, 0, stream, args, NULL);
}

static unsigned long long parse_ns(const char *s) {
  char *e;
  double v = strtod(s, &e);
  if (e == s || v < 0) die("bad duration '%s'", s);
  if (!strcmp(e, "s")) v *= 1e9;
  else if (!strcmp(e, "ms")) v *= 1e6;
  else if (!strcmp(e, "us")) v *= 1e3;
  else if (*e && strcmp(e, "ns")) die("bad duration '%s'", s);
  return (unsigned long long)(v + 0.5);
}

/* This thread's time spent runnable but waiting for a CPU so far, in ns: the second field of
 * /proc/thread-self/schedstat (0 if unreadable). The difference between two readings
 * bounds how much a loaded machine delayed the ops between them. */
static unsigned long long runqueue_wait_ns(void) {
  unsigned long long run = 0, wait = 0;
  FILE *f = fopen("/proc/thread-self/schedstat", "r");
  if (!f) return 0;
  if (fscanf(f, "%llu %llu", &run, &wait) != 2) wait = 0;
  fclose(f);
  return wait;
}

static void usage(void) {
  puts("usage: cudaprobe [--via direct|dlsym|procaddr] [--device N] [--cuda-version V] OP...\n"
       "ops (sizes take K/M/G/T suffixes; IDX is a record index, 'last' or 0xADDR):\n"
       "  init | ctx | ctxcreate | ctxdestroy [IDX] | ctxrelease | ctxnull | ctxpop | ctxsync\n"
       "  device N | count | name | uuid | totalmem | meminfo | version | ctxdevice\n"
       "  alloc SIZE | alloc-null | free IDX|ADDR|last|all | free-raw 0xADDR\n"
       "  pitch WIDTH HEIGHT | managed SIZE | async SIZE | async-ptsz SIZE | freeasync IDX\n"
       "  pool SIZE | create SIZE | release IDX | releasemapped IDX | retain IDX | unmap IDX | array W H | array3d W H D | arraydestroy IDX\n"
       "  fill SIZE | bench-pair N SIZE | bench-for SECONDS SIZE | getproc NAME [VERSION [FLAGS]] | getproc1 NAME [VERSION [FLAGS]]\n"
       "  errname CODE\n"
       "  poolinfo default|own | threshold default|own SIZE|max | trim default|own SIZE | pooldestroy | setpool\n"
       "  streamsync | eventsync | streamnew | capture-begin | capture-end | mipmap W H LEVELS | mipmapdestroy IDX\n"
       "  modload SIZE [local=SIZE] | modloadex SIZE | modloadfat SIZE | modloadfile SIZE | modunload IDX\n"
       "  getfunc [IDX] | launch [IDX] | launchex [IDX]\n"
       "  libload SIZE | libloadfile SIZE | libunload IDX | getkernel [IDX] | kernelfunc [IDX]\n"
       "  modloadimg[ex|fat|wrap|file|static] PATH | libloadimg[wrap|file|static] PATH   (a real image file)\n"
       "  getglobal [IDX] | libgetglobal [IDX] | libgetmodule [IDX]\n"
       "  setlimit stack|printf|heap|syncdepth|pending|N SIZE | getlimit NAME | funcattr ATTR [IDX]\n"
       "  bench-launch N [IDX] | launchcoop [IDX]\n"
       "  kernel | launch-ns NS [COUNT] | launch-cost N | coop-ns NS [COUNT] | launch-for SECONDS NS | streamquery\n"
       "  evcreate [FLAGS] | evrecord [IDX] | evquery [IDX] | evsync [IDX] | elapsed IDX IDX | evdestroy IDX\n"
       "  graph-capture NS COUNT | graph-launch N [IDX] | graphdestroy IDX | streamsync-t | ctxsync-t\n"
       "  rq (this thread's runqueue wait so far, rq_ns=) | sleep SECONDS | wait | exit CODE");
}

int main(int argc, char **argv) {
  int a = 1;
  for (; a < argc && !strncmp(argv[a], "--", 2); a++) {
    if (!strcmp(argv[a], "--help")) { usage(); return 0; }
    if (a + 1 >= argc) die("missing value for %s", argv[a]);
    if (!strcmp(argv[a], "--via")) via = argv[++a];
    else if (!strcmp(argv[a], "--device")) device = atoi(argv[++a]);
    else if (!strcmp(argv[a], "--cuda-version")) cuda_version = atoi(argv[++a]);
    else die("unknown option %s", argv[a]);
  }
  setvbuf(stdout, NULL, _IOLBF, 0);
  resolve();
  printf("pid=%d via=%s device=%d\n", (int)getpid(), via, device);
  fflush(stdout);

#define NEED(n) do { if (a + (n) >= argc) die("missing argument for %s", op); } while (0)
  for (; a < argc; a++) {
    const char *op = argv[a];
    CUresult rc;
    if (!strcmp(op, "init")) {
      printf("op=init"); end(cu.Init(0));
    } else if (!strcmp(op, "version")) {
      int v = 0; rc = cu.DriverGetVersion(&v); printf("op=version version=%d", v); end(rc);
    } else if (!strcmp(op, "device")) {
      NEED(1); device = atoi(argv[++a]); printf("op=device device=%d", device); end(0);
    } else if (!strcmp(op, "count")) {
      int n = -1; rc = cu.DeviceGetCount(&n); printf("op=count count=%d", n); end(rc);
    } else if (!strcmp(op, "name")) {
      char n[256] = ""; rc = cu.DeviceGetName(n, sizeof n, device);
      for (char *c = n; *c; c++) if (*c == ' ') *c = '_';
      printf("op=name device_name=%s", n); end(rc);
    } else if (!strcmp(op, "uuid")) {
      CUuuid u; memset(&u, 0, sizeof u); rc = cu.DeviceGetUuid(&u, device);
      const unsigned char *b = (const unsigned char *)u.bytes;
      printf("op=uuid uuid=GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1], b[2],
             b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
      end(rc);
    } else if (!strcmp(op, "totalmem")) {
      size_t t = 0; rc = cu.DeviceTotalMem(&t, device); printf("op=totalmem total=%zu", t); end(rc);
    } else if (!strcmp(op, "ctx")) {
      CUdevice d = -1; CUcontext c = NULL;
      rc = cu.DeviceGet(&d, device);
      if (!rc) rc = cu.PrimaryCtxRetain(&c, d);
      if (!rc) rc = cu.CtxSetCurrent(c);
      printf("op=ctx ctx=%p", c); end(rc);
    } else if (!strcmp(op, "ctxcreate")) {
      CUcontext c = NULL; rc = ctx_create(&c);
      printf("op=ctxcreate");
      if (!rc) printf(" idx=%zu ctx=%p", add_rec((rec_t){.kind = K_CTX, .obj = c}), c);
      end(rc);
    } else if (!strcmp(op, "ctxdestroy")) {
      long i = pick((a + 1 < argc && (argv[a + 1][0] == 'l' || (argv[a + 1][0] >= '0' && argv[a + 1][0] <= '9'))) ? argv[++a] : "last", 1u << K_CTX);
      printf("op=ctxdestroy");
      if (i < 0) { printf(" error=no-such-record\n"); fflush(stdout); continue; }
      end(free_rec((size_t)i));
    } else if (!strcmp(op, "ctxrelease")) {
      printf("op=ctxrelease"); end(cu.PrimaryCtxRelease(device));
    } else if (!strcmp(op, "ctxnull")) {
      printf("op=ctxnull"); end(cu.CtxSetCurrent(NULL));
    } else if (!strcmp(op, "ctxpop")) {
      CUcontext c = NULL; rc = cu.CtxPopCurrent(&c); printf("op=ctxpop ctx=%p", c); end(rc);
    } else if (!strcmp(op, "ctxsync")) {
      printf("op=ctxsync"); end(ctx_sync());
    } else if (!strcmp(op, "ctxdevice")) {
      CUdevice d = -1; rc = ctx_get_device(&d); printf("op=ctxdevice ctx_device=%d", d); end(rc);
    } else if (!strcmp(op, "meminfo")) {
      size_t f = 0, t = 0; rc = cu.MemGetInfo(&f, &t); printf("op=meminfo free=%zu total=%zu", f, t); end(rc);
    } else if (!strcmp(op, "alloc")) {
      NEED(1); size_t s = parse_size(argv[++a]); CUdeviceptr p = 0;
      rc = cu.MemAlloc(&p, s); print_alloc("alloc", s, rc, p, K_LINEAR);
    } else if (!strcmp(op, "alloc-null")) {
      printf("op=alloc-null"); end(cu.MemAlloc(NULL, 1 << 20));
    } else if (!strcmp(op, "managed")) {
      NEED(1); size_t s = parse_size(argv[++a]); CUdeviceptr p = 0;
      rc = cu.MemAllocManaged(&p, s, 1 /* CU_MEM_ATTACH_GLOBAL */); print_alloc("managed", s, rc, p, K_MANAGED);
    } else if (!strcmp(op, "async") || !strcmp(op, "async-ptsz")) {
      NEED(1); size_t s = parse_size(argv[++a]); CUdeviceptr p = 0;
      rc = (op[5] ? cu.MemAllocAsyncPtsz : cu.MemAllocAsync)(&p, s, stream);
      if (!rc && !capturing) rc = cu.StreamSynchronize(stream);
      print_alloc(op, s, rc, p, K_ASYNC);
    } else if (!strcmp(op, "freeasync")) {
      NEED(1); long i = pick(argv[++a], 1u << K_ASYNC | 1u << K_POOL);
      printf("op=freeasync");
      if (i < 0) { printf(" error=no-such-record\n"); fflush(stdout); continue; }
      rc = cu.MemFreeAsync(recs[i].ptr, stream);
      if (!rc && !capturing) rc = cu.StreamSynchronize(stream);
      if (!rc) recs[i].live = 0;
      printf(" idx=%ld ptr=0x%llx", i, recs[i].ptr); end(rc);
    } else if (!strcmp(op, "pool")) {
      NEED(1); size_t s = parse_size(argv[++a]); CUdeviceptr p = 0; rc = 0;
      if (!pool) {
        CUmemPoolProps pp; memset(&pp, 0, sizeof pp);
        pp.allocType = 1; pp.location.type = 1; pp.location.id = device;
        rc = cu.MemPoolCreate(&pool, &pp);
      }
      if (!rc) rc = cu.MemAllocFromPoolAsync(&p, s, pool, stream);
      if (!rc && !capturing) rc = cu.StreamSynchronize(stream);
      print_alloc("pool", s, rc, p, K_POOL);
    } else if (!strcmp(op, "poolinfo") || !strcmp(op, "threshold") || !strcmp(op, "trim")) {
      NEED(1); const char *which = argv[++a];
      int info = op[0] == 'p', thr = op[1] == 'h';
      unsigned long long v = 0;
      if (!info) { NEED(1); const char *x = argv[++a]; v = !strcmp(x, "max") ? ~0ULL : parse_size(x); }
      printf("op=%s pool=%s", op, which);
      if (!cu.DeviceGetMemPool || !cu.MemPoolGetAttribute || !cu.MemPoolSetAttribute || !cu.MemPoolTrimTo) {
        printf(" error=missing-function\n"); fflush(stdout); continue;
      }
      CUmemoryPool p = NULL; rc = 0;
      if (!strcmp(which, "own")) p = pool; else rc = cu.DeviceGetMemPool(&p, device);
      if (!rc && !p) { printf(" error=no-pool\n"); fflush(stdout); continue; }
      if (!rc && thr) rc = cu.MemPoolSetAttribute(p, 4 /* RELEASE_THRESHOLD */, &v);
      if (!rc && !info && !thr) rc = cu.MemPoolTrimTo(p, (size_t)v);
      unsigned long long reserved = 0, used = 0, threshold = 0;
      if (!rc) rc = cu.MemPoolGetAttribute(p, 5 /* RESERVED_MEM_CURRENT */, &reserved);
      if (!rc) rc = cu.MemPoolGetAttribute(p, 7 /* USED_MEM_CURRENT */, &used);
      if (!rc) rc = cu.MemPoolGetAttribute(p, 4 /* RELEASE_THRESHOLD */, &threshold);
      printf(" reserved=%llu used=%llu threshold=%llu", reserved, used, threshold); end(rc);
    } else if (!strcmp(op, "pooldestroy")) {
      printf("op=pooldestroy");
      if (!cu.MemPoolDestroy || !pool) { printf(" error=no-pool\n"); fflush(stdout); continue; }
      rc = cu.MemPoolDestroy(pool); if (!rc) pool = NULL; end(rc);
    } else if (!strcmp(op, "setpool")) {
      printf("op=setpool");
      if (!cu.DeviceSetMemPool) { printf(" error=missing-function\n"); fflush(stdout); continue; }
      rc = 0;
      if (!pool) {
        CUmemPoolProps pp; memset(&pp, 0, sizeof pp);
        pp.allocType = 1; pp.location.type = 1; pp.location.id = device;
        rc = cu.MemPoolCreate(&pool, &pp);
      }
      if (!rc) rc = cu.DeviceSetMemPool(device, pool);
      end(rc);
    } else if (!strcmp(op, "streamsync")) {
      printf("op=streamsync"); end(cu.StreamSynchronize(stream));
    } else if (!strcmp(op, "streamnew")) {
      printf("op=streamnew");
      if (!cu.StreamCreate) { printf(" error=missing-function\n"); fflush(stdout); continue; }
      CUstream st = NULL; rc = cu.StreamCreate(&st, 1 /* NON_BLOCKING */);
      if (!rc) stream = st;
      printf(" stream=%p", st); end(rc);
    } else if (!strcmp(op, "capture-begin") || !strcmp(op, "capture-end")) {
      printf("op=%s", op);
      if (!cu.StreamBeginCapture || !cu.StreamEndCapture) { printf(" error=missing-function\n"); fflush(stdout); continue; }
      if (op[8] == 'b') {
        rc = cu.StreamBeginCapture(stream, 2 /* CU_STREAM_CAPTURE_MODE_RELAXED */);
        if (!rc) capturing = 1;
      } else {
        void *graph = NULL; rc = cu.StreamEndCapture(stream, &graph);
        capturing = 0;
      }
      end(rc);
    } else if (!strcmp(op, "eventsync")) {
      printf("op=eventsync");
      if (!cu.EventCreate || !cu.EventRecord || !cu.EventSynchronize || !cu.EventDestroy) {
        printf(" error=missing-function\n"); fflush(stdout); continue;
      }
      void *ev = NULL; rc = cu.EventCreate(&ev, 0);
      if (!rc) rc = cu.EventRecord(ev, NULL);
      if (!rc) rc = cu.EventSynchronize(ev);
      if (ev) cu.EventDestroy(ev);
      end(rc);
    } else if (!strcmp(op, "kernel")) {
      printf("op=kernel");
      rc = spin_kernel();
      if (rc == -1) { printf(" error=missing-function\n"); fflush(stdout); continue; }
      printf(" handle=%p", spin_fn); end(rc);
    } else if (!strcmp(op, "launch-cost")) {
      /* N launches of the timed kernel taking 0 ns (the launch path alone), no sync: wall and
       * CPU ns per launch (CPU time leaves out any sleep, e.g. at a launch gate). */
      NEED(1); long n = atol(argv[++a]);
      printf("op=launch-cost n=%ld", n);
      rc = spin_kernel();
      if (rc == -1 || !cu.LaunchKernel) { printf(" error=missing-function\n"); fflush(stdout); continue; }
      struct timespec c0, c1;
      long k = 0;
      if (!rc) rc = spin_launch(0, 0); /* the first launch (lazy loading) is not counted */
      clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c0);
      double t0 = now_ns();
      for (; !rc && k < n; k++) rc = spin_launch(0, 0);
      double t1 = now_ns();
      clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c1);
      double cpu = (c1.tv_sec - c0.tv_sec) * 1e9 + (c1.tv_nsec - c0.tv_nsec);
      printf(" launched=%ld ns_per_launch=%.1f cpu_ns_per_launch=%.1f", k, k ? (t1 - t0) / k : 0.0, k ? cpu / k : 0.0);
      end(rc);
    } else if (!strcmp(op, "launch-ns") || !strcmp(op, "coop-ns")) {
      /* COUNT launches (default 1) of the timed kernel on the current stream; no sync. */
      NEED(1); unsigned long long ns = parse_ns(argv[++a]);
      long n = (a + 1 < argc && argv[a + 1][0] >= '0' && argv[a + 1][0] <= '9') ? atol(argv[++a]) : 1;
      int coop = op[0] == 'c';
      printf("op=%s ns=%llu count=%ld", op, ns, n);
      rc = spin_kernel();
      if (rc == -1 || !cu.LaunchKernel || (coop && !cu.LaunchCooperativeKernel)) {
        printf(" error=missing-function\n"); fflush(stdout); continue;
      }
      double t0 = now_ns(); long k = 0;
      for (; !rc && k < n; k++) rc = spin_launch(ns, coop);
      printf(" launched=%ld host_ns=%.0f", rc ? k - 1 : k, now_ns() - t0); end(rc);
    } else if (!strcmp(op, "launch-for")) {
      /* Launches back to back on the current stream for SECONDS of wall time, each kernel
       * between two events; then synchronises. busy_ns = the sum of the kernels' event-measured
       * times, wall_ns = from the first launch to the end of the synchronisation. */
      NEED(2); double sec = atof(argv[++a]); unsigned long long ns = parse_ns(argv[++a]);
      printf("op=launch-for seconds=%g ns=%llu", sec, ns);
      rc = spin_kernel();
      if (rc == -1 || !cu.LaunchKernel || !cu.EventCreate || !cu.EventRecord || !cu.EventElapsedTime) {
        printf(" error=missing-function\n"); fflush(stdout); continue;
      }
      enum { PAIRS = 64 };
      void *ev[PAIRS][2]; memset(ev, 0, sizeof ev);
      for (int k = 0; !rc && k < PAIRS; k++) {
        rc = cu.EventCreate(&ev[k][0], 0);
        if (!rc) rc = cu.EventCreate(&ev[k][1], 0);
      }
      double busy = 0, t0 = now_ns(), stop = t0 + sec * 1e9;
      unsigned long long kernels = 0;
      CUresult mrc = 0;
      while (!rc && now_ns() < stop) {
        int k = (int)(kernels % PAIRS);
        if (kernels >= PAIRS) {
          float ms = 0;
          rc = cu.EventSynchronize(ev[k][1]);
          if (!rc) mrc = cu.EventElapsedTime(&ms, ev[k][0], ev[k][1]);
          busy += ms * 1e6;
        }
        if (!rc) rc = cu.EventRecord(ev[k][0], stream);
        if (!rc) rc = spin_launch(ns, 0);
        if (!rc) rc = cu.EventRecord(ev[k][1], stream);
        if (!rc) kernels++;
      }
      if (!rc) rc = cu.StreamSynchronize(stream);
      double t1 = now_ns();
      for (unsigned long long j = kernels > PAIRS ? kernels - PAIRS : 0; !rc && j < kernels; j++) {
        float ms = 0;
        mrc = cu.EventElapsedTime(&ms, ev[j % PAIRS][0], ev[j % PAIRS][1]);
        busy += ms * 1e6;
      }
      for (int k = 0; k < PAIRS; k++) { if (ev[k][0]) cu.EventDestroy(ev[k][0]); if (ev[k][1]) cu.EventDestroy(ev[k][1]); }
      printf(" kernels=%llu busy_ns=%.0f wall_ns=%.0f nominal_ns=%llu start_ns=%.0f end_ns=%.0f elapsed_rc=%d", kernels,
             busy, t1 - t0, kernels * ns, t0, t1, mrc);
      end(rc);
    } else if (!strcmp(op, "streamquery")) {
      printf("op=streamquery");
      if (!cu.StreamQuery) { printf(" error=missing-function\n"); fflush(stdout); continue; }
      end(cu.StreamQuery(stream));
    } else if (!strcmp(op, "streamsync-t") || !strcmp(op, "ctxsync-t")) {
      double t0 = now_ns();
      rc = op[0] == 's' ? cu.StreamSynchronize(stream) : ctx_sync();
      printf("op=%s wait_ns=%.0f", op, now_ns() - t0); end(rc);
    } else if (!strcmp(op, "evcreate")) {
      unsigned fl = (a + 1 < argc && argv[a + 1][0] >= '0' && argv[a + 1][0] <= '9') ? (unsigned)strtoul(argv[++a], NULL, 0) : 0;
      printf("op=evcreate flags=%u", fl);
      if (!cu.EventCreate) { printf(" error=missing-function\n"); fflush(stdout); continue; }
      void *e = NULL; rc = cu.EventCreate(&e, fl);
      if (!rc) printf(" idx=%zu event=%p", add_rec((rec_t){.kind = K_EVENT, .obj = e}), e);
      end(rc);
    } else if (!strcmp(op, "evrecord") || !strcmp(op, "evquery") || !strcmp(op, "evsync") || !strcmp(op, "evdestroy")) {
      const char *t = opt_idx(argc, argv, &a);
      long i = pick(t, 1u << K_EVENT);
      printf("op=%s", op);
      if (i < 0) { printf(" error=no-such-record\n"); fflush(stdout); continue; }
      if (!cu.EventQuery) { printf(" error=missing-function\n"); fflush(stdout); continue; }
      double t0 = now_ns();
      if (op[2] == 'r') rc = cu.EventRecord(recs[i].obj, stream);
      else if (op[2] == 'q') rc = cu.EventQuery(recs[i].obj);
      else if (op[2] == 's') rc = cu.EventSynchronize(recs[i].obj);
      else rc = free_rec((size_t)i);
      printf(" idx=%ld wait_ns=%.0f", i, now_ns() - t0); end(rc);
    } else if (!strcmp(op, "elapsed")) {
      NEED(2); long i = pick(argv[++a], 1u << K_EVENT), j = pick(argv[++a], 1u << K_EVENT);
      printf("op=elapsed");
      if (i < 0 || j < 0) { printf(" error=no-such-record\n"); fflush(stdout); continue; }
      if (!cu.EventElapsedTime) { printf(" error=missing-function\n"); fflush(stdout); continue; }
      float ms = -1; rc = cu.EventElapsedTime(&ms, recs[i].obj, recs[j].obj);
      printf(" ms=%.4f ns=%.0f", ms, ms * 1e6); end(rc);
    } else if (!strcmp(op, "graph-capture")) {
      /* Captures COUNT launches of NS on the current (created) stream, instantiates the graph. */
      NEED(2); unsigned long long ns = parse_ns(argv[++a]); long n = atol(argv[++a]);
      printf("op=graph-capture ns=%llu count=%ld", ns, n);
      rc = spin_kernel();
      if (rc == -1 || !cu.StreamBeginCapture || !cu.StreamEndCapture || !cu.GraphInstantiateWithFlags || !cu.GraphLaunch) {
        printf(" error=missing-function\n"); fflush(stdout); continue;
      }
      const char *stage = "begin";
      void *graph = NULL, *exec = NULL;
      if (!rc) rc = cu.StreamBeginCapture(stream, 2 /* CU_STREAM_CAPTURE_MODE_RELAXED */);
      if (!rc) stage = "launch";
      for (long k = 0; !rc && k < n; k++) rc = spin_launch(ns, 0);
      if (!rc || stage[0] == 'l') {
        CUresult r2 = cu.StreamEndCapture(stream, &graph);
        if (!rc) { rc = r2; stage = "end"; }
      }
      if (!rc) { stage = "instantiate"; rc = cu.GraphInstantiateWithFlags(&exec, graph, 0); }
      printf(" stage=%s", stage);
      if (!rc) printf(" idx=%zu exec=%p", add_rec((rec_t){.kind = K_GRAPH, .obj = exec, .obj2 = graph}), exec);
      end(rc);
    } else if (!strcmp(op, "graph-launch")) {
      NEED(1); long n = atol(argv[++a]);
      const char *t = opt_idx(argc, argv, &a);
      long i = pick(t, 1u << K_GRAPH);
      printf("op=graph-launch count=%ld", n);
      if (i < 0) { printf(" error=no-such-record\n"); fflush(stdout); continue; }
      rc = 0; double t0 = now_ns();
      for (long k = 0; !rc && k < n; k++) rc = cu.GraphLaunch(recs[i].obj, stream);
      printf(" idx=%ld host_ns=%.0f", i, now_ns() - t0); end(rc);
    } else if (!strcmp(op, "graphdestroy")) {
      NEED(1); long i = pick(argv[++a], 1u << K_GRAPH);
      printf("op=graphdestroy");
      if (i < 0) { printf(" error=no-such-record\n"); fflush(stdout); continue; }
      printf(" idx=%ld", i); end(free_rec((size_t)i));
    } else if (!strcmp(op, "mipmap")) {
      NEED(3); size_t w = parse_size(argv[++a]), h = parse_size(argv[++a]); unsigned lv = (unsigned)atoi(argv[++a]);
      printf("op=mipmap width=%zu height=%zu levels=%u", w, h, lv);
      if (!cu.MipmappedArrayCreate) { printf(" error=missing-function\n"); fflush(stdout); continue; }
      CUDA_ARRAY3D_DESCRIPTOR desc = {w, h, 0, 0x20 /* FLOAT */, 2, 0};
      void *m = NULL; rc = cu.MipmappedArrayCreate(&m, &desc, lv);
      if (!rc) printf(" idx=%zu mipmap=%p", add_rec((rec_t){.kind = K_MIPMAP, .obj = m}), m);
      end(rc);
    } else if (!strcmp(op, "mipmapdestroy") || !strcmp(op, "modunload") || !strcmp(op, "libunload")) {
      NEED(1);
      int k = op[0] == 'm' && op[1] == 'i' ? K_MIPMAP : op[0] == 'm' ? K_MODULE : K_LIBRARY;
      long i = pick(argv[++a], 1u << k);
      printf("op=%s", op);
      if (i < 0) { printf(" error=no-such-record\n"); fflush(stdout); continue; }
      printf(" idx=%ld", i); end(free_rec((size_t)i));
    } else if (!strncmp(op, "modloadimg", 10) || !strncmp(op, "libloadimg", 10)) {
      /* A real image (ELF cubin, fatbin, PTX) read from PATH: "...img" hands the driver its
       * bytes, "...imgwrap" a __fatBinC_Wrapper_t pointing at them, "...imgfile" the path;
       * "modloadimgex" / "modloadimgfat" the other module entry points, "...imgstatic" the
       * bytes copied into a static buffer (as the runtime's images lie in a loaded object's
       * data; one such buffer of 64 KiB, reused). Bytes kept. */
      NEED(1); const char *path = argv[++a];
      int lib = op[0] == 'l'; const char *v = op + 10;
      FILE *fp = fopen(path, "rb");
      if (!fp) die("cannot read %s", path);
      fseek(fp, 0, SEEK_END); long n = ftell(fp); fseek(fp, 0, SEEK_SET);
      char *bytes = malloc((size_t)n + 1);
      if (!bytes || fread(bytes, 1, (size_t)n, fp) != (size_t)n) die("cannot read %s", path);
      bytes[n] = 0; fclose(fp);
      static char static_image[64 << 10];
      if (!strcmp(v, "static")) {
        if ((size_t)n >= sizeof static_image) die("image too large for the static buffer: %s", path);
        memcpy(static_image, bytes, (size_t)n + 1); bytes = static_image;
      }
      struct { int magic, version; const void *data; void *filename_or_fatbins; } *w = malloc(sizeof *w);
      w->magic = 0x466243B1; w->version = 1; w->data = bytes; w->filename_or_fatbins = NULL;
      const void *image = !strcmp(v, "wrap") ? (const void *)w : (const void *)bytes;
      void *m = NULL; rc = -1;
      if (!strcmp(v, "file") && lib && cu.LibraryLoadFromFile) rc = cu.LibraryLoadFromFile(&m, path, NULL, NULL, 0, NULL, NULL, 0);
      else if (!strcmp(v, "file") && !lib && cu.ModuleLoad) rc = cu.ModuleLoad(&m, path);
      else if (!strcmp(v, "file")) rc = -1;
      else if (lib && cu.LibraryLoadData) rc = cu.LibraryLoadData(&m, image, NULL, NULL, 0, NULL, NULL, 0);
      else if (!strcmp(v, "ex") && cu.ModuleLoadDataEx) rc = cu.ModuleLoadDataEx(&m, image, 0, NULL, NULL);
      else if (!strcmp(v, "fat") && cu.ModuleLoadFatBinary) rc = cu.ModuleLoadFatBinary(&m, image);
      else if (!lib && cu.ModuleLoadData) rc = cu.ModuleLoadData(&m, image);
      printf("op=%s path=%s bytes=%ld", op, path, n);
      if (rc == -1) { printf(" error=missing-function\n"); fflush(stdout); continue; }
      if (!rc) printf(" idx=%zu handle=%p", add_rec((rec_t){.kind = lib ? K_LIBRARY : K_MODULE, .obj = m}), m);
      end(rc);
    } else if (!strncmp(op, "modload", 7) || !strncmp(op, "libload", 7)) {
      /* A fake image "FAKECUBIN globals=SIZE" (the fake driver's format; a real driver
       * rejects it with CUDA_ERROR_INVALID_IMAGE). */
      NEED(1); const char *sz = argv[++a];
      /* An optional "local=SIZE" next: the kernels' local memory per thread (fake images). */
      const char *local = a + 1 < argc && !strncmp(argv[a + 1], "local=", 6) ? argv[++a] : NULL;
      char image[128];
      snprintf(image, sizeof image, "FAKECUBIN globals=%s%s%s", sz, local ? " " : "", local ? local : "");
      int lib = op[0] == 'l', file = !strcmp(op + 7, "file");
      char path[64] = "";
      if (file) {
        snprintf(path, sizeof path, "/tmp/cudaprobe-%d-%zu.cubin", (int)getpid(), nrecs);
        FILE *fp = fopen(path, "w");
        if (!fp) die("cannot write %s", path);
        fputs(image, fp); fclose(fp);
      }
      void *m = NULL; rc = -1;
      if (lib && file && cu.LibraryLoadFromFile) rc = cu.LibraryLoadFromFile(&m, path, NULL, NULL, 0, NULL, NULL, 0);
      else if (lib && !file && cu.LibraryLoadData) rc = cu.LibraryLoadData(&m, image, NULL, NULL, 0, NULL, NULL, 0);
      else if (!lib && file && cu.ModuleLoad) rc = cu.ModuleLoad(&m, path);
      else if (!strcmp(op, "modloadex") && cu.ModuleLoadDataEx) rc = cu.ModuleLoadDataEx(&m, image, 0, NULL, NULL);
      else if (!strcmp(op, "modloadfat") && cu.ModuleLoadFatBinary) rc = cu.ModuleLoadFatBinary(&m, image);
      else if (!strcmp(op, "modload") && cu.ModuleLoadData) rc = cu.ModuleLoadData(&m, image);
      if (file) unlink(path);
      printf("op=%s globals=%s", op, sz);
      if (local) printf(" %s", local);
      if (rc == -1) { printf(" error=missing-function\n"); fflush(stdout); continue; }
      if (!rc) printf(" idx=%zu handle=%p", add_rec((rec_t){.kind = lib ? K_LIBRARY : K_MODULE, .obj = m}), m);
      end(rc);
    } else if (!strcmp(op, "getfunc") || !strcmp(op, "getkernel") || !strcmp(op, "kernelfunc")) {
      int from = op[0] == 'g' && op[3] == 'f' ? K_MODULE : op[0] == 'g' ? K_LIBRARY : K_KERNEL;
      const char *t = opt_idx(argc, argv, &a);
      long i = pick(t, 1u << from);
      printf("op=%s", op);
      if (i < 0) { printf(" error=no-such-record\n"); fflush(stdout); continue; }
      void *f = NULL; rc = -1;
      if (from == K_MODULE && cu.ModuleGetFunction) rc = cu.ModuleGetFunction(&f, recs[i].obj, "kernel");
      if (from == K_LIBRARY && cu.LibraryGetKernel) rc = cu.LibraryGetKernel(&f, recs[i].obj, "kernel");
      if (from == K_KERNEL && cu.KernelGetFunction) rc = cu.KernelGetFunction(&f, recs[i].obj);
      if (rc == -1) { printf(" error=missing-function\n"); fflush(stdout); continue; }
      if (!rc) printf(" idx=%zu handle=%p", add_rec((rec_t){.kind = from == K_LIBRARY ? K_KERNEL : K_FUNC, .obj = f}), f);
      end(rc);
    } else if (!strcmp(op, "getglobal") || !strcmp(op, "libgetglobal") || !strcmp(op, "libgetmodule")) {
      /* cuModuleGetGlobal_v2 / cuLibraryGetGlobal of "g", cuLibraryGetModule (adds a module). */
      int lib = op[0] == 'l';
      const char *t = opt_idx(argc, argv, &a);
      long i = pick(t, 1u << (lib ? K_LIBRARY : K_MODULE));
      printf("op=%s", op);
      if (i < 0) { printf(" error=no-such-record\n"); fflush(stdout); continue; }
      CUdeviceptr p = 0; size_t n = 0; void *m = NULL; rc = -1;
      if (!lib && cu.ModuleGetGlobal) rc = cu.ModuleGetGlobal(&p, &n, recs[i].obj, "g");
      else if (!strcmp(op, "libgetglobal") && cu.LibraryGetGlobal) rc = cu.LibraryGetGlobal(&p, &n, recs[i].obj, "g");
      else if (!strcmp(op, "libgetmodule") && cu.LibraryGetModule) rc = cu.LibraryGetModule(&m, recs[i].obj);
      if (rc == -1) { printf(" error=missing-function\n"); fflush(stdout); continue; }
      if (!rc && p) printf(" ptr=0x%llx bytes=%zu", p, n);
      if (!rc && m) printf(" idx=%zu handle=%p", add_rec((rec_t){.kind = K_MODULE, .obj = m}), m);
      end(rc);
    } else if (!strcmp(op, "launch") || !strcmp(op, "launchex")) {
      /* Launches a function (getfunc/kernelfunc) or a kernel handle (getkernel) on the NULL stream. */
      const char *t = opt_idx(argc, argv, &a);
      long i = pick(t, 1u << K_FUNC | 1u << K_KERNEL);
      printf("op=%s", op);
      if (i < 0) { printf(" error=no-such-record\n"); fflush(stdout); continue; }
      rc = -1;
      if (op[6] && cu.LaunchKernelEx) {
        CUlaunchConfig c; memset(&c, 0, sizeof c);
        for (int d = 0; d < 6; d++) c.dims[d] = 1;
        rc = cu.LaunchKernelEx(&c, recs[i].obj, NULL, NULL);
      } else if (!op[6] && cu.LaunchKernel) {
        rc = cu.LaunchKernel(recs[i].obj, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL);
      }
      if (rc == -1) { printf(" error=missing-function\n"); fflush(stdout); continue; }
      printf(" idx=%ld", i); end(rc);
    } else if (!strcmp(op, "setlimit") || !strcmp(op, "getlimit")) {
      /* cuCtxSetLimit / cuCtxGetLimit of the current context; getlimit prints value=, setlimit
       * prints the value read back after a successful set (or the old one). */
      NEED(op[0] == 's' ? 2 : 1); const char *n = argv[++a];
      int lim = !strcmp(n, "stack") ? 0 : !strcmp(n, "printf") ? 1 : !strcmp(n, "heap") ? 2
              : !strcmp(n, "syncdepth") ? 3 : !strcmp(n, "pending") ? 4 : atoi(n);
      size_t v = op[0] == 's' ? (size_t)parse_size(argv[++a]) : 0, now = 0;
      printf("op=%s limit=%s", op, n);
      if (!cu.CtxSetLimit || !cu.CtxGetLimit) { printf(" error=missing-function\n"); fflush(stdout); continue; }
      rc = op[0] == 's' ? cu.CtxSetLimit(lim, v) : cu.CtxGetLimit(&now, lim);
      if (op[0] == 's') { cu.CtxGetLimit(&now, lim); printf(" set=%zu", v); }
      printf(" value=%zu", now); end(rc);
    } else if (!strcmp(op, "funcattr")) {
      /* cuFuncGetAttribute(ATTR) of a function (getfunc/kernelfunc); 3 = LOCAL_SIZE_BYTES. */
      NEED(1); int attr = atoi(argv[++a]);
      const char *t = opt_idx(argc, argv, &a);
      long i = pick(t, 1u << K_FUNC | 1u << K_KERNEL);
      printf("op=funcattr attr=%d", attr);
      if (i < 0) { printf(" error=no-such-record\n"); fflush(stdout); continue; }
      if (!cu.FuncGetAttribute) { printf(" error=missing-function\n"); fflush(stdout); continue; }
      int v = -1; rc = cu.FuncGetAttribute(&v, attr, recs[i].obj);
      printf(" idx=%ld value=%d", i, v); end(rc);
    } else if (!strcmp(op, "launchcoop")) {
      /* cuLaunchCooperativeKernel of a function (getfunc/kernelfunc), 1 x 1, NULL stream. */
      const char *t = opt_idx(argc, argv, &a);
      long i = pick(t, 1u << K_FUNC | 1u << K_KERNEL);
      printf("op=launchcoop");
      if (i < 0) { printf(" error=no-such-record\n"); fflush(stdout); continue; }
      if (!cu.LaunchCooperativeKernel) { printf(" error=missing-function\n"); fflush(stdout); continue; }
      rc = cu.LaunchCooperativeKernel(recs[i].obj, 1, 1, 1, 1, 1, 1, 0, NULL, NULL);
      printf(" idx=%ld", i); end(rc);
    } else if (!strcmp(op, "bench-launch")) {
      /* N launches of a function or kernel (1 block of 1 thread, NULL stream): ns per launch. */
      NEED(1); long n = atol(argv[++a]); long fails = 0; CUresult last = 0;
      const char *t = opt_idx(argc, argv, &a);
      long i = pick(t, 1u << K_FUNC | 1u << K_KERNEL);
      printf("op=bench-launch n=%ld", n);
      if (i < 0) { printf(" error=no-such-record\n"); fflush(stdout); continue; }
      if (!cu.LaunchKernel) { printf(" error=missing-function\n"); fflush(stdout); continue; }
      double t0 = now_ns();
      for (long k = 0; k < n; k++) {
        CUresult r = cu.LaunchKernel(recs[i].obj, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL);
        if (r) { fails++; last = r; }
      }
      double dt = now_ns() - t0;
      printf(" ns_per_launch=%.1f failures=%ld", n ? dt / n : 0.0, fails); end(last);
    } else if (!strcmp(op, "pitch")) {
      NEED(2); size_t w = parse_size(argv[++a]), h = parse_size(argv[++a]), pitch = 0; CUdeviceptr p = 0;
      rc = cu.MemAllocPitch(&p, &pitch, w, h, 4);
      printf("op=pitch width=%zu height=%zu pitch=%zu size=%zu", w, h, pitch, pitch * h);
      if (!rc) printf(" idx=%zu ptr=0x%llx", add_rec((rec_t){.kind = K_PITCH, .ptr = p, .size = pitch * h}), p);
      end(rc);
    } else if (!strcmp(op, "create")) {
      NEED(1); size_t s = parse_size(argv[++a]);
      CUmemAllocationProp prop; memset(&prop, 0, sizeof prop);
      prop.type = 1; prop.location.type = 1; prop.location.id = device;
      CUmemGenericAllocationHandle h = 0; CUdeviceptr va = 0; const char *stage = "create";
      rc = cu.MemCreate(&h, s, &prop, 0);
      if (!rc) { stage = "reserve"; rc = cu.MemAddressReserve(&va, s, 0, 0, 0); }
      if (!rc) { stage = "map"; rc = cu.MemMap(va, s, 0, h, 0); }
      if (!rc) {
        CUmemAccessDesc d; d.location = prop.location; d.flags = 3; /* PROT_READWRITE */
        stage = "setaccess"; rc = cu.MemSetAccess(va, s, &d, 1);
      }
      printf("op=create size=%zu stage=%s", s, stage);
      if (!rc) printf(" idx=%zu handle=0x%llx ptr=0x%llx", add_rec((rec_t){.kind = K_VMM, .ptr = va, .size = s, .handle = h, .handle_refs = 1}), h, va);
      end(rc);
    } else if (!strcmp(op, "releasemapped")) {
      /* cuMemRelease of a record's handle, leaving it mapped (the memory stays held). */
      NEED(1); long i = pick(argv[++a], 1u << K_VMM);
      printf("op=releasemapped");
      if (i < 0) { printf(" error=no-such-record\n"); fflush(stdout); continue; }
      rc = cu.MemRelease(recs[i].handle);
      if (!rc && recs[i].handle_refs > 0) recs[i].handle_refs--;
      printf(" idx=%ld refs=%d", i, recs[i].handle_refs); end(rc);
    } else if (!strcmp(op, "retain")) {
      /* cuMemRetainAllocationHandle of a record's mapped address: one more reference. */
      NEED(1); long i = pick(argv[++a], 1u << K_VMM);
      printf("op=retain");
      if (i < 0) { printf(" error=no-such-record\n"); fflush(stdout); continue; }
      CUmemGenericAllocationHandle h = 0;
      rc = cu.MemRetainAllocationHandle
               ? cu.MemRetainAllocationHandle(&h, (void *)(uintptr_t)recs[i].ptr) : 500;
      if (!rc) recs[i].handle_refs++;
      printf(" idx=%ld handle=0x%llx same=%d refs=%d", i, h, h == recs[i].handle, recs[i].handle_refs);
      end(rc);
    } else if (!strcmp(op, "unmap")) {
      /* cuMemUnmap + cuMemAddressFree of a record; the handle's remaining references are kept. */
      NEED(1); long i = pick(argv[++a], 1u << K_VMM);
      printf("op=unmap");
      if (i < 0) { printf(" error=no-such-record\n"); fflush(stdout); continue; }
      rc = cu.MemUnmap(recs[i].ptr, recs[i].size);
      if (!rc) rc = cu.MemAddressFree(recs[i].ptr, recs[i].size);
      if (!rc && recs[i].handle_refs == 0) recs[i].live = 0;
      printf(" idx=%ld refs=%d", i, recs[i].handle_refs); end(rc);
    } else if (!strcmp(op, "release")) {
      NEED(1); long i = pick(argv[++a], 1u << K_VMM);
      printf("op=release");
      if (i < 0) { printf(" error=no-such-record\n"); fflush(stdout); continue; }
      printf(" idx=%ld", i); end(free_rec((size_t)i));
    } else if (!strcmp(op, "array") || !strcmp(op, "array3d")) {
      int three = op[5] == '3';
      NEED(three ? 3 : 2);
      size_t w = parse_size(argv[++a]), h = parse_size(argv[++a]), d = three ? parse_size(argv[++a]) : 0;
      CUarray arr = NULL;
      if (three) {
        CUDA_ARRAY3D_DESCRIPTOR desc = {w, h, d, 0x20 /* FLOAT */, 1, 0};
        rc = cu.Array3DCreate(&arr, &desc);
      } else {
        CUDA_ARRAY_DESCRIPTOR desc = {w, h, 0x20 /* FLOAT */, 1};
        rc = cu.ArrayCreate(&arr, &desc);
      }
      size_t bytes = w * (h ? h : 1) * (d ? d : 1) * 4;
      printf("op=%s width=%zu height=%zu depth=%zu bytes=%zu", op, w, h, d, bytes);
      if (!rc) printf(" idx=%zu array=%p", add_rec((rec_t){.kind = K_ARRAY, .obj = arr, .size = bytes}), arr);
      end(rc);
    } else if (!strcmp(op, "arraydestroy")) {
      NEED(1); long i = pick(argv[++a], 1u << K_ARRAY);
      printf("op=arraydestroy");
      if (i < 0) { printf(" error=no-such-record\n"); fflush(stdout); continue; }
      printf(" idx=%ld", i); end(free_rec((size_t)i));
    } else if (!strcmp(op, "free")) {
      NEED(1); const char *t = argv[++a];
      if (!strcmp(t, "all")) {
        size_t n = 0; CUresult first = 0;
        for (size_t i = 0; i < nrecs; i++) {
          if (!recs[i].live || recs[i].kind == K_CTX) continue;
          CUresult r = free_rec(i);
          if (r && !first) first = r;
          n++;
        }
        printf("op=free target=all count=%zu", n); end(first);
        continue;
      }
      long i = pick(t, 1u << K_LINEAR | 1u << K_PITCH | 1u << K_MANAGED | 1u << K_ASYNC | 1u << K_POOL);
      printf("op=free target=%s", t);
      if (i < 0) { printf(" error=no-such-record\n"); fflush(stdout); continue; }
      printf(" idx=%ld ptr=0x%llx kind=%s", i, recs[i].ptr, kind_name[recs[i].kind]);
      end(free_rec((size_t)i));
    } else if (!strcmp(op, "free-raw")) {
      NEED(1); CUdeviceptr p = strtoull(argv[++a], NULL, 0);
      rc = cu.MemFree(p);
      if (!rc) for (size_t i = 0; i < nrecs; i++) if (recs[i].live && recs[i].ptr == p && recs[i].kind != K_VMM) recs[i].live = 0;
      printf("op=free-raw ptr=0x%llx", p); end(rc);
    } else if (!strcmp(op, "fill")) {
      NEED(1); size_t s = parse_size(argv[++a]); size_t n = 0; CUdeviceptr p;
      while ((rc = cu.MemAlloc(&p, s)) == 0 && n < 10000000) { add_rec((rec_t){.kind = K_LINEAR, .ptr = p, .size = s}); n++; }
      printf("op=fill size=%zu count=%zu total=%zu", s, n, n * s); end(rc);
    } else if (!strcmp(op, "bench-pair")) {
      NEED(2); long n = atol(argv[++a]); size_t s = parse_size(argv[++a]); long fails = 0; CUresult last = 0;
      double t0 = now_ns();
      for (long i = 0; i < n; i++) {
        CUdeviceptr p;
        CUresult r = cu.MemAlloc(&p, s);
        if (r) { fails++; last = r; continue; }
        r = cu.MemFree(p);
        if (r) { fails++; last = r; }
      }
      double dt = now_ns() - t0;
      printf("op=bench-pair n=%ld size=%zu ns_per_pair=%.1f failures=%ld", n, s, n ? dt / n : 0.0, fails); end(last);
    } else if (!strcmp(op, "bench-for")) {
      /* Barrier, then alloc+free pairs until a deadline. Prints "state=ready" and blocks
       * reading a 24-byte record from stdin: the absolute CLOCK_MONOTONIC deadline in ns, as
       * text (a parent writes one record per process into one pipe that is every process's
       * stdin, in one write: all are released together and stop together). On EOF instead
       * (stdin closed or /dev/null) the deadline is SECONDS from now. Reports pairs, its
       * window on CLOCK_MONOTONIC and the process's CPU time (user+sys) over the loop. */
      NEED(2); double sec = atof(argv[++a]); size_t s = parse_size(argv[++a]); long fails = 0; CUresult last = 0;
      printf("op=bench-for state=ready\n"); fflush(stdout);
      char b[25]; size_t got = 0;
      /* poll first: its waiters are all woken by the one write (a blocking pipe read wakes
       * one reader at a time, each after the previous one ran: a chain of scheduling delays). */
      struct pollfd pf = {0, POLLIN, 0};
      while (poll(&pf, 1, -1) < 0 && errno == EINTR) {}
      while (got < 24) {
        ssize_t r = read(0, b + got, 24 - got);
        if (r == 0 || (r < 0 && errno != EINTR)) break;
        if (r > 0) got += (size_t)r;
      }
      b[got] = 0;
      double t0 = now_ns(), stop = got == 24 ? atof(b) : t0 + sec * 1e9, t1 = t0;
      struct timespec c0, c1;
      clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c0);
      unsigned long long pairs = 0;
      do {
        for (int j = 0; j < 64; j++) {
          CUdeviceptr p;
          CUresult r = cu.MemAlloc(&p, s);
          if (r) { fails++; last = r; continue; }
          r = cu.MemFree(p);
          if (r) { fails++; last = r; }
        }
        pairs += 64;
        t1 = now_ns();
      } while (t1 < stop);
      clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c1);
      double cpu = (c1.tv_sec - c0.tv_sec) * 1e9 + (c1.tv_nsec - c0.tv_nsec);
      printf("op=bench-for size=%zu pairs=%llu start_ns=%.0f end_ns=%.0f cpu_ns=%.0f failures=%ld", s, pairs, t0, t1,
             cpu, fails);
      end(last);
    } else if (!strcmp(op, "getproc")) {
      NEED(1); const char *name = argv[++a];
      int ver = (a + 1 < argc && argv[a + 1][0] >= '0' && argv[a + 1][0] <= '9') ? atoi(argv[++a]) : cuda_version;
      unsigned long long fl = (a + 1 < argc && argv[a + 1][0] >= '0' && argv[a + 1][0] <= '9') ? strtoull(argv[++a], NULL, 0) : 0;
      void *p = NULL; int st = -1;
      rc = cu.GetProcAddress(name, &p, ver, fl, &st);
      Dl_info info; memset(&info, 0, sizeof info);
      const char *sym = "NULL", *lib = "NULL";
      if (p && dladdr(p, &info)) { sym = info.dli_sname && info.dli_saddr == p ? info.dli_sname : "?"; lib = info.dli_fname ? info.dli_fname : "?"; }
      printf("op=getproc symbol=%s version=%d flags=%llu status=%d ptr=%p sym=%s lib=%s", name, ver, fl, st, p, sym, lib);
      end(rc);
    } else if (!strcmp(op, "getproc1")) {
      /* The 4-argument cuGetProcAddress (CUDA 11.3 ABI), always through dlsym. */
      NEED(1); const char *name = argv[++a];
      int ver = (a + 1 < argc && argv[a + 1][0] >= '0' && argv[a + 1][0] <= '9') ? atoi(argv[++a]) : cuda_version;
      unsigned long long fl = (a + 1 < argc && argv[a + 1][0] >= '0' && argv[a + 1][0] <= '9') ? strtoull(argv[++a], NULL, 0) : 0;
      if (!libcuda) libcuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
      CUresult (*g1)(const char *, void **, int, unsigned long long) = libcuda ? dlsym(libcuda, "cuGetProcAddress") : NULL;
      void *p = (void *)1;
      rc = g1 ? g1(name, &p, ver, fl) : -1;
      Dl_info info; memset(&info, 0, sizeof info);
      const char *symn = p == (void *)1 ? "UNTOUCHED" : "NULL";
      if (p && p != (void *)1 && dladdr(p, &info)) symn = info.dli_sname && info.dli_saddr == p ? info.dli_sname : "?";
      printf("op=getproc1 symbol=%s version=%d flags=%llu sym=%s", name, ver, fl, symn);
      end(rc);
    } else if (!strcmp(op, "errname")) {
      NEED(1); CUresult code = atoi(argv[++a]); const char *n = NULL, *s = NULL;
      rc = cu.GetErrorName(code, &n); CUresult rc2 = cu.GetErrorString(code, &s);
      printf("op=errname code=%d error_name=%s string_rc=%d", code, n ? n : "NULL", rc2);
      end(rc);
    } else if (!strcmp(op, "rq")) {
      printf("op=rq rq_ns=%llu", runqueue_wait_ns()); end(0);
    } else if (!strcmp(op, "sleep")) {
      NEED(1); double sec = atof(argv[++a]);
      struct timespec ts = {(time_t)sec, (long)((sec - (time_t)sec) * 1e9)};
      while (nanosleep(&ts, &ts) && errno == EINTR) {}
      printf("op=sleep seconds=%g", sec); end(0);
    } else if (!strcmp(op, "wait")) {
      struct sigaction sa; memset(&sa, 0, sizeof sa); sa.sa_handler = on_signal;
      sigaction(SIGUSR1, &sa, NULL); sigaction(SIGTERM, &sa, NULL); sigaction(SIGINT, &sa, NULL);
      printf("op=wait state=waiting\n"); fflush(stdout);
      char line[256];
      while (!got_signal && !fgets(line, sizeof line, stdin) && errno == EINTR && !got_signal) errno = 0;
      printf("op=wait state=resumed signal=%d", (int)got_signal); end(0);
    } else if (!strcmp(op, "exit")) {
      NEED(1); int code = atoi(argv[++a]); printf("op=exit code=%d\n", code); fflush(stdout); _exit(code);
    } else {
      die("unknown op '%s' (see --help)", op);
    }
  }
  return 0;
}
