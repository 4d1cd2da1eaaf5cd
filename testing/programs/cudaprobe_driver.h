/*
 * cudaprobe_driver.h: the driver API as cudaprobe.c sees it, included by it once (after its
 * system headers): the types and prototypes it needs (no CUDA headers), the function table
 * every op goes through and its resolution (--via direct|dlsym|procaddr), the global
 * settings and the records of what the program allocated.
 */
#ifndef CUDAPROBE_DRIVER_H
#define CUDAPROBE_DRIVER_H

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
/* Graph memory nodes (gmem-* ops). */
typedef struct {
  unsigned int allocType, handleTypes; struct { unsigned int type; int id; } location;
  void *win32; size_t maxSize; unsigned short usage; unsigned char reserved[54];
} CUmemPoolPropsFull;
typedef struct { CUmemPoolPropsFull poolProps; const void *accessDescs; size_t accessDescCount; size_t bytesize; CUdeviceptr dptr; } CUDA_MEM_ALLOC_NODE_PARAMS;
typedef struct { unsigned long long flags; CUstream hUploadStream; void *hErrNode_out; int result_out; } CUDA_GRAPH_INSTANTIATE_PARAMS;
WEAK CUresult cuGraphCreate(void **, unsigned int);
WEAK CUresult cuGraphAddMemAllocNode(void **, void *, void *const *, size_t, CUDA_MEM_ALLOC_NODE_PARAMS *);
WEAK CUresult cuGraphAddMemFreeNode(void **, void *, void *const *, size_t, CUdeviceptr);
WEAK CUresult cuGraphUpload(void *, CUstream);
WEAK CUresult cuGraphInstantiateWithParams(void **, void *, CUDA_GRAPH_INSTANTIATE_PARAMS *);
WEAK CUresult cuDeviceGetGraphMemAttribute(CUdevice, int, void *);
WEAK CUresult cuDeviceGraphMemTrim(CUdevice);
/* Green contexts (greenctx ops); CUdevResource is handled as opaque bytes. */
WEAK CUresult cuDeviceGetDevResource(CUdevice, void *, int);
WEAK CUresult cuDevResourceGenerateDesc(void **, void *, unsigned int);
WEAK CUresult cuGreenCtxCreate(void **, void *, CUdevice, unsigned int);
WEAK CUresult cuGreenCtxDestroy(void *);

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
  CUresult (*GraphCreate)(void **, unsigned int);
  CUresult (*GraphAddMemAllocNode)(void **, void *, void *const *, size_t, CUDA_MEM_ALLOC_NODE_PARAMS *);
  CUresult (*GraphAddMemFreeNode)(void **, void *, void *const *, size_t, CUdeviceptr);
  CUresult (*GraphUpload)(void *, CUstream);
  CUresult (*GraphInstantiateWithParams)(void **, void *, CUDA_GRAPH_INSTANTIATE_PARAMS *);
  CUresult (*DeviceGetGraphMemAttribute)(CUdevice, int, void *);
  CUresult (*DeviceGraphMemTrim)(CUdevice);
  CUresult (*DeviceGetDevResource)(CUdevice, void *, int);
  CUresult (*DevResourceGenerateDesc)(void **, void *, unsigned int);
  CUresult (*GreenCtxCreate)(void **, void *, CUdevice, unsigned int);
  CUresult (*GreenCtxDestroy)(void *);
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
  void *obj; /* CUarray or CUcontext */
  void *obj2; /* K_GRAPH: the graph of the executable graph in obj */
} rec_t;
static rec_t *recs;
static size_t nrecs, caprecs;
static CUmemoryPool pool;
static CUstream stream;  /* the stream of async / freeasync / pool ops (streamnew), NULL by default */
static int capturing;    /* capture-begin .. capture-end: no synchronisation after those ops */
static void *gmem_graph; /* the graph gmem-* ops build (or capture-end made), until gmem-inst */

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

#endif /* CUDAPROBE_DRIVER_H */
