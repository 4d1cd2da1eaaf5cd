/*
 * cudaprobe_driver.h: the driver API as cudaprobe.c sees it, included by it once (after its
 * system headers): the types and prototypes (hami_cuda.h), the function table
 * every op goes through and its resolution (--via direct|dlsym|procaddr), the global
 * settings and the records of what the program allocated.
 */
#ifndef CUDAPROBE_DRIVER_H
#define CUDAPROBE_DRIVER_H

/* The types and prototypes: hami_cuda.h (<cuda.h> where it exists), every function under the
 * name of the symbol it is (HAMI_CUDA_ABI_NAMES: cuMemAlloc_v2 is cuMemAlloc_v2, cuMemAllocAsync
 * is cuMemAllocAsync), as --via direct links them. */
#define HAMI_CUDA_ABI_NAMES
#include "hami_cuda.h"

/* A function-pointer type, from the function's prototype. */
#define FN(sym) __typeof__(&sym)

/* Later additions, weak: a driver without them still runs every other op (the op then prints
 * error=missing-function). */
#define WEAK(sym) extern __typeof__(sym) sym __attribute__((weak));
WEAK(cuDeviceGetMemPool) WEAK(cuDeviceSetMemPool) WEAK(cuMemPoolTrimTo) WEAK(cuMemPoolGetAttribute)
WEAK(cuMemPoolSetAttribute) WEAK(cuMemPoolDestroy) WEAK(cuMipmappedArrayCreate)
WEAK(cuMipmappedArrayDestroy) WEAK(cuModuleLoad) WEAK(cuModuleLoadData) WEAK(cuModuleLoadDataEx)
WEAK(cuModuleLoadFatBinary) WEAK(cuModuleUnload) WEAK(cuModuleGetFunction) WEAK(cuLibraryLoadData)
WEAK(cuLibraryLoadFromFile) WEAK(cuLibraryUnload) WEAK(cuLibraryGetKernel)
WEAK(cuKernelGetFunction) WEAK(cuModuleGetGlobal_v2) WEAK(cuLibraryGetGlobal)
WEAK(cuLibraryGetModule) WEAK(cuLaunchKernel) WEAK(cuLaunchKernelEx) WEAK(cuEventCreate)
WEAK(cuEventRecord) WEAK(cuEventSynchronize) WEAK(cuEventDestroy_v2) WEAK(cuStreamCreate)
WEAK(cuStreamBeginCapture_v2) WEAK(cuStreamEndCapture) WEAK(cuCtxSetLimit) WEAK(cuCtxGetLimit)
WEAK(cuFuncGetAttribute) WEAK(cuEventQuery) WEAK(cuEventElapsedTime) WEAK(cuStreamQuery)
WEAK(cuLaunchCooperativeKernel) WEAK(cuGraphInstantiateWithFlags) WEAK(cuGraphLaunch)
WEAK(cuGraphExecDestroy) WEAK(cuGraphDestroy) WEAK(cuGraphCreate) WEAK(cuGraphAddMemAllocNode)
WEAK(cuGraphAddMemFreeNode) WEAK(cuGraphUpload) WEAK(cuGraphInstantiateWithParams)
WEAK(cuDeviceGetGraphMemAttribute) WEAK(cuDeviceGraphMemTrim) WEAK(cuDeviceGetDevResource)
WEAK(cuDevResourceGenerateDesc) WEAK(cuGreenCtxCreate) WEAK(cuGreenCtxDestroy)
#undef WEAK

/* The function table every operation goes through. */
static struct {
  FN(cuInit) Init;
  FN(cuDriverGetVersion) DriverGetVersion;
  FN(cuGetErrorName) GetErrorName;
  FN(cuGetErrorString) GetErrorString;
  FN(cuDeviceGet) DeviceGet;
  FN(cuDeviceGetCount) DeviceGetCount;
  FN(cuDeviceGetName) DeviceGetName;
  FN(cuDeviceGetUuid_v2) DeviceGetUuid;
  FN(cuDeviceTotalMem_v2) DeviceTotalMem;
  FN(cuDevicePrimaryCtxRetain) PrimaryCtxRetain;
  FN(cuDevicePrimaryCtxRelease_v2) PrimaryCtxRelease;
  void *CtxCreate; /* cuCtxCreate_v2, _v3 or _v4: ctx_create_variant */
  FN(cuCtxDestroy_v2) CtxDestroy;
  FN(cuCtxSetCurrent) CtxSetCurrent;
  FN(cuCtxGetCurrent) CtxGetCurrent;
  void *CtxGetDevice; /* cuCtxGetDevice or, from CUDA 13.0, cuCtxGetDevice_v2 */
  FN(cuCtxPopCurrent_v2) CtxPopCurrent;
  void *CtxSynchronize; /* cuCtxSynchronize or, from CUDA 13.0, cuCtxSynchronize_v2 */
  FN(cuMemAlloc_v2) MemAlloc;
  FN(cuMemFree_v2) MemFree;
  FN(cuMemGetInfo_v2) MemGetInfo;
  FN(cuMemAllocPitch_v2) MemAllocPitch;
  FN(cuMemAllocManaged) MemAllocManaged;
  FN(cuMemAllocAsync) MemAllocAsync;
  FN(cuMemAllocAsync_ptsz) MemAllocAsyncPtsz;
  FN(cuMemFreeAsync) MemFreeAsync;
  FN(cuMemAllocFromPoolAsync) MemAllocFromPoolAsync;
  FN(cuMemPoolCreate) MemPoolCreate;
  FN(cuStreamSynchronize) StreamSynchronize;
  FN(cuMemCreate) MemCreate;
  FN(cuMemRelease) MemRelease;
  FN(cuMemAddressReserve) MemAddressReserve;
  FN(cuMemAddressFree) MemAddressFree;
  FN(cuMemMap) MemMap;
  FN(cuMemUnmap) MemUnmap;
  FN(cuMemRetainAllocationHandle) MemRetainAllocationHandle;
  FN(cuMemSetAccess) MemSetAccess;
  FN(cuArrayCreate_v2) ArrayCreate;
  FN(cuArray3DCreate_v2) Array3DCreate;
  FN(cuArrayDestroy) ArrayDestroy;
  FN(cuGetProcAddress_v2) GetProcAddress;
  /* Optional (NULL when the driver lacks them). */
  FN(cuDeviceGetMemPool) DeviceGetMemPool;
  FN(cuDeviceSetMemPool) DeviceSetMemPool;
  FN(cuMemPoolTrimTo) MemPoolTrimTo;
  FN(cuMemPoolGetAttribute) MemPoolGetAttribute;
  FN(cuMemPoolSetAttribute) MemPoolSetAttribute;
  FN(cuMemPoolDestroy) MemPoolDestroy;
  FN(cuMipmappedArrayCreate) MipmappedArrayCreate;
  FN(cuMipmappedArrayDestroy) MipmappedArrayDestroy;
  FN(cuModuleLoad) ModuleLoad;
  FN(cuModuleLoadData) ModuleLoadData;
  FN(cuModuleLoadDataEx) ModuleLoadDataEx;
  FN(cuModuleLoadFatBinary) ModuleLoadFatBinary;
  FN(cuModuleUnload) ModuleUnload;
  FN(cuModuleGetFunction) ModuleGetFunction;
  FN(cuLibraryLoadData) LibraryLoadData;
  FN(cuLibraryLoadFromFile) LibraryLoadFromFile;
  FN(cuLibraryUnload) LibraryUnload;
  FN(cuLibraryGetKernel) LibraryGetKernel;
  FN(cuKernelGetFunction) KernelGetFunction;
  FN(cuModuleGetGlobal_v2) ModuleGetGlobal;
  FN(cuLibraryGetGlobal) LibraryGetGlobal;
  FN(cuLibraryGetModule) LibraryGetModule;
  FN(cuLaunchKernel) LaunchKernel;
  FN(cuLaunchKernelEx) LaunchKernelEx;
  FN(cuEventCreate) EventCreate;
  FN(cuEventRecord) EventRecord;
  FN(cuEventSynchronize) EventSynchronize;
  FN(cuEventDestroy_v2) EventDestroy;
  FN(cuStreamCreate) StreamCreate;
  FN(cuStreamBeginCapture_v2) StreamBeginCapture;
  FN(cuStreamEndCapture) StreamEndCapture;
  FN(cuCtxSetLimit) CtxSetLimit;
  FN(cuCtxGetLimit) CtxGetLimit;
  FN(cuFuncGetAttribute) FuncGetAttribute;
  FN(cuEventQuery) EventQuery;
  FN(cuEventElapsedTime) EventElapsedTime;
  FN(cuStreamQuery) StreamQuery;
  FN(cuLaunchCooperativeKernel) LaunchCooperativeKernel;
  FN(cuGraphInstantiateWithFlags) GraphInstantiateWithFlags;
  FN(cuGraphLaunch) GraphLaunch;
  FN(cuGraphExecDestroy) GraphExecDestroy;
  FN(cuGraphDestroy) GraphDestroy;
  FN(cuGraphCreate) GraphCreate;
  FN(cuGraphAddMemAllocNode) GraphAddMemAllocNode;
  FN(cuGraphAddMemFreeNode) GraphAddMemFreeNode;
  FN(cuGraphUpload) GraphUpload;
  FN(cuGraphInstantiateWithParams) GraphInstantiateWithParams;
  FN(cuDeviceGetGraphMemAttribute) DeviceGetGraphMemAttribute;
  FN(cuDeviceGraphMemTrim) DeviceGraphMemTrim;
  FN(cuDeviceGetDevResource) DeviceGetDevResource;
  FN(cuDevResourceGenerateDesc) DevResourceGenerateDesc;
  FN(cuGreenCtxCreate) GreenCtxCreate;
  FN(cuGreenCtxDestroy) GreenCtxDestroy;
} cu;

enum { CTX_V2 = 2, CTX_V3 = 3, CTX_V4 = 4 };
static int ctx_create_variant = CTX_V2;
static int ctx_v13 = 0; /* cuCtxGetDevice_v2 / cuCtxSynchronize_v2 */
static const char *via = "direct";
static int device = 0;
static int cuda_version = 12000;
static void *libcuda;

enum { K_LINEAR = 1, K_PITCH, K_MANAGED, K_ASYNC, K_POOL, K_VMM, K_ARRAY, K_CTX, K_MIPMAP, K_MODULE, K_LIBRARY, K_FUNC, K_KERNEL, K_EVENT, K_GRAPH, K_GREEN };
static const char *kind_name[] = {"", "linear", "pitch", "managed", "async", "pool", "vmm", "array", "ctx",
                                  "mipmap", "module", "library", "function", "kernel", "event", "graph", "green"};
typedef struct {
  int kind, live;
  int handle_refs; /* K_VMM: references to the handle this program still holds */
  CUdeviceptr ptr;
  size_t size;
  CUmemGenericAllocationHandle handle;
  void *obj; /* the handle (CUarray, CUcontext, CUmodule, CUevent, CUgraphExec, ...) */
  void *obj2; /* K_GRAPH: the graph of the executable graph in obj */
} rec_t;
static rec_t *recs;
static size_t nrecs, caprecs;
static CUmemoryPool pool;
static CUstream stream;  /* the stream of async / freeasync / pool ops (streamnew), NULL by default */
static int capturing;    /* capture-begin .. capture-end: no synchronisation after those ops */
static CUgraph gmem_graph; /* the graph gmem-* ops build (or capture-end made), until gmem-inst */

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
  CUdriverProcAddressQueryResult status = -1;
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
  CUdriverProcAddressQueryResult status = -1;
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
    cu.GraphCreate = cuGraphCreate; cu.GraphAddMemAllocNode = cuGraphAddMemAllocNode;
    cu.GraphAddMemFreeNode = cuGraphAddMemFreeNode; cu.GraphUpload = cuGraphUpload;
    cu.GraphInstantiateWithParams = cuGraphInstantiateWithParams;
    cu.DeviceGetGraphMemAttribute = cuDeviceGetGraphMemAttribute; cu.DeviceGraphMemTrim = cuDeviceGraphMemTrim;
    cu.DeviceGetDevResource = cuDeviceGetDevResource; cu.DevResourceGenerateDesc = cuDevResourceGenerateDesc;
    cu.GreenCtxCreate = cuGreenCtxCreate; cu.GreenCtxDestroy = cuGreenCtxDestroy;
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
    O(GraphCreate, cuGraphCreate); O(GraphAddMemAllocNode, cuGraphAddMemAllocNode);
    O(GraphAddMemFreeNode, cuGraphAddMemFreeNode); O(GraphUpload, cuGraphUpload);
    O(GraphInstantiateWithParams, cuGraphInstantiateWithParams);
    O(DeviceGetGraphMemAttribute, cuDeviceGetGraphMemAttribute); O(DeviceGraphMemTrim, cuDeviceGraphMemTrim);
    O(DeviceGetDevResource, cuDeviceGetDevResource); O(DevResourceGenerateDesc, cuDevResourceGenerateDesc);
    O(GreenCtxCreate, cuGreenCtxCreate); O(GreenCtxDestroy, cuGreenCtxDestroy);
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
  cu.MemAllocAsyncPtsz = procaddr("cuMemAllocAsync", CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM);
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
  Q(GraphCreate, cuGraphCreate); Q(GraphAddMemAllocNode, cuGraphAddMemAllocNode);
  Q(GraphAddMemFreeNode, cuGraphAddMemFreeNode); Q(GraphUpload, cuGraphUpload);
  Q(GraphInstantiateWithParams, cuGraphInstantiateWithParams);
  Q(DeviceGetGraphMemAttribute, cuDeviceGetGraphMemAttribute); Q(DeviceGraphMemTrim, cuDeviceGraphMemTrim);
  Q(DeviceGetDevResource, cuDeviceGetDevResource); Q(DevResourceGenerateDesc, cuDevResourceGenerateDesc);
  Q(GreenCtxCreate, cuGreenCtxCreate); Q(GreenCtxDestroy, cuGreenCtxDestroy);
#undef Q
  ctx_create_variant = cuda_version >= 12050 ? CTX_V4 : cuda_version >= 11040 ? CTX_V3 : CTX_V2;
  ctx_v13 = cuda_version >= 13000;
}

static CUresult ctx_create(CUcontext *c) {
  switch (ctx_create_variant) {
    case CTX_V4: return ((FN(cuCtxCreate_v4))cu.CtxCreate)(c, NULL, 0, device);
    case CTX_V3: return ((FN(cuCtxCreate_v3))cu.CtxCreate)(c, NULL, 0, 0, device);
    default: return ((FN(cuCtxCreate_v2))cu.CtxCreate)(c, 0, device);
  }
}

static CUresult ctx_get_device(CUdevice *d) {
  if (ctx_v13) return ((FN(cuCtxGetDevice_v2))cu.CtxGetDevice)(d, NULL);
  return ((FN(cuCtxGetDevice))cu.CtxGetDevice)(d);
}

static CUresult ctx_sync(void) {
  if (ctx_v13) return ((FN(cuCtxSynchronize_v2))cu.CtxSynchronize)(NULL);
  return ((FN(cuCtxSynchronize))cu.CtxSynchronize)();
}

#endif /* CUDAPROBE_DRIVER_H */
