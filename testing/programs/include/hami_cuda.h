/*
 * hami_cuda.h: the CUDA driver API as the C test programs see it, written in one place.
 *
 * Where <cuda.h> can be found (the GPU machine, with its CUDA toolkit) it is included and is
 * the only definition: a program that disagrees with the real header does not compile there.
 * Where it cannot (the development machine has no CUDA toolkit; the fake driver stands in for
 * libcuda), the fallback below declares the subset the programs use, copied from cuda.h
 * (12.9): the same type names and struct tags, the same enum values, the same prototypes
 * (each under the symbol it binds: cuMemAlloc_v2, not cuMemAlloc), and the same #defines from
 * an unversioned name to the versioned symbol (cuMemAlloc -> cuMemAlloc_v2, ...).
 *
 *   -DHAMI_NO_SYSTEM_CUDA_H    always use the fallback, even where <cuda.h> exists.
 *   -DHAMI_CUDA_ABI_NAMES      (#define before the #include) every function under the name of
 *                               the symbol it is, with no #define from an unversioned name to a
 *                               versioned one, and the legacy unversioned entry points
 *                               (cuCtxCreate, cuCtxDestroy: the CUDA 3.x ABI) declared as well:
 *                               cuda.h's own view when it is built into the driver
 *                               (__CUDA_API_VERSION_INTERNAL, which this defines). For programs
 *                               that call or define one particular symbol (cudaprobe, hprobe,
 *                               minifake), the same under the CUDA 12 and 13 headers.
 *   -DHAMI_CHECK_AGAINST_CUDA_H include <cuda.h> and check the fallback against it: every
 *                               fallback prototype and typedef is declared again (a mismatch is
 *                               a conflicting-types error), every enum value and struct size is
 *                               a static assertion. gpu/check_c_programs.sh builds the programs so.
 */
#ifndef HAMI_CUDA_H
#define HAMI_CUDA_H

#include <stddef.h>
#include <stdint.h>

#if defined(HAMI_CUDA_ABI_NAMES) && !defined(__CUDA_API_VERSION_INTERNAL)
#define __CUDA_API_VERSION_INTERNAL 1
#endif

#if defined(HAMI_CHECK_AGAINST_CUDA_H)
#include <cuda.h>
#define HAMI_CUDA_FALLBACK_DECLS 1 /* declared again, checked against cuda.h */
#define HAMI_CUDA_FALLBACK_DEFS 0  /* struct and enum bodies: cuda.h's */
#elif !defined(HAMI_NO_SYSTEM_CUDA_H) && defined(__has_include)
#if __has_include(<cuda.h>)
#include <cuda.h>
#define HAMI_CUDA_FALLBACK_DECLS 0
#define HAMI_CUDA_FALLBACK_DEFS 0
#endif
#endif
#ifndef HAMI_CUDA_FALLBACK_DECLS
#define HAMI_CUDA_FALLBACK_DECLS 1
#define HAMI_CUDA_FALLBACK_DEFS 1
#endif

#if HAMI_CUDA_FALLBACK_DECLS

#ifndef CUDAAPI
#define CUDAAPI
#endif

#if !defined(HAMI_CUDA_ABI_NAMES)
/* The unversioned names the header binds to versioned symbols (cuda.h's #defines). */
#define cuDeviceTotalMem cuDeviceTotalMem_v2
/* CUDA 12's binding; CUDA 13's cuda.h binds cuCtxCreate to cuCtxCreate_v4 (another signature),
 * so against a CUDA 13 header this one mapping is the header's, not checked. */
#if !defined(CUDA_VERSION) || CUDA_VERSION < 13000
#define cuCtxCreate cuCtxCreate_v2
#endif
#define cuMemGetInfo cuMemGetInfo_v2
#define cuMemAlloc cuMemAlloc_v2
#define cuMemAllocPitch cuMemAllocPitch_v2
#define cuMemFree cuMemFree_v2
#define cuArrayCreate cuArrayCreate_v2
#define cuArray3DCreate cuArray3DCreate_v2
#define cuModuleGetGlobal cuModuleGetGlobal_v2
#define cuCtxDestroy cuCtxDestroy_v2
#define cuCtxPopCurrent cuCtxPopCurrent_v2
#define cuEventDestroy cuEventDestroy_v2
#define cuDevicePrimaryCtxRelease cuDevicePrimaryCtxRelease_v2
#define cuDevicePrimaryCtxReset cuDevicePrimaryCtxReset_v2
#define cuGetProcAddress cuGetProcAddress_v2
#endif

typedef uint64_t cuuint64_t;
typedef unsigned long long CUdeviceptr_v2;
typedef CUdeviceptr_v2 CUdeviceptr;
typedef int CUdevice_v1;
typedef CUdevice_v1 CUdevice;
typedef struct CUctx_st *CUcontext;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
typedef struct CUlib_st *CUlibrary;
typedef struct CUkern_st *CUkernel;
typedef struct CUarray_st *CUarray;
typedef struct CUmipmappedArray_st *CUmipmappedArray;
typedef struct CUevent_st *CUevent;
typedef struct CUstream_st *CUstream;
typedef struct CUgraph_st *CUgraph;
typedef struct CUgraphNode_st *CUgraphNode;
typedef struct CUgraphExec_st *CUgraphExec;
typedef struct CUmemPoolHandle_st *CUmemoryPool;
typedef struct CUgreenCtx_st *CUgreenCtx;
typedef struct CUdevResourceDesc_st *CUdevResourceDesc;
typedef unsigned long long CUmemGenericAllocationHandle_v1;
typedef CUmemGenericAllocationHandle_v1 CUmemGenericAllocationHandle;
/* Only pointed to by the programs (cuLaunchKernelEx's attributes, cuCtxCreate_v3/_v4's
 * parameters): declared, not defined. */
typedef struct CUlaunchAttribute_st CUlaunchAttribute;
typedef struct CUexecAffinityParam_st CUexecAffinityParam_v1;
typedef CUexecAffinityParam_v1 CUexecAffinityParam;
typedef struct CUctxCreateParams_st CUctxCreateParams;

/* The enum values, listed once: defined by the fallback, checked against cuda.h. */
#define HAMI_CU_RESULT(X)                                                                   \
  X(CUDA_SUCCESS, 0)                                                                        \
  X(CUDA_ERROR_INVALID_VALUE, 1)                                                            \
  X(CUDA_ERROR_OUT_OF_MEMORY, 2)                                                            \
  X(CUDA_ERROR_NOT_INITIALIZED, 3)                                                          \
  X(CUDA_ERROR_INVALID_DEVICE, 101)                                                         \
  X(CUDA_ERROR_INVALID_IMAGE, 200)                                                          \
  X(CUDA_ERROR_INVALID_CONTEXT, 201)                                                        \
  X(CUDA_ERROR_INVALID_HANDLE, 400)                                                         \
  X(CUDA_ERROR_NOT_FOUND, 500)                                                              \
  X(CUDA_ERROR_UNKNOWN, 999)
#define HAMI_CU_PROC_ADDRESS_RESULT(X)                                                      \
  X(CU_GET_PROC_ADDRESS_SUCCESS, 0)                                                         \
  X(CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND, 1)                                                \
  X(CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT, 2)
#define HAMI_CU_PROC_ADDRESS_FLAGS(X)                                                       \
  X(CU_GET_PROC_ADDRESS_DEFAULT, 0)                                                         \
  X(CU_GET_PROC_ADDRESS_LEGACY_STREAM, 1)                                                   \
  X(CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, 2)
#define HAMI_CU_ARRAY_FORMAT(X) X(CU_AD_FORMAT_UNSIGNED_INT8, 0x01) X(CU_AD_FORMAT_FLOAT, 0x20)
#define HAMI_CU_MEM_ATTACH(X) X(CU_MEM_ATTACH_GLOBAL, 0x1)
#define HAMI_CU_STREAM_FLAGS(X) X(CU_STREAM_DEFAULT, 0x0) X(CU_STREAM_NON_BLOCKING, 0x1)
#define HAMI_CU_MEM_HANDLE_TYPE(X)                                                          \
  X(CU_MEM_HANDLE_TYPE_NONE, 0x0) X(CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0x1)
#define HAMI_CU_MEM_LOCATION_TYPE(X)                                                        \
  X(CU_MEM_LOCATION_TYPE_INVALID, 0x0) X(CU_MEM_LOCATION_TYPE_DEVICE, 0x1)                    \
  X(CU_MEM_LOCATION_TYPE_HOST, 0x2)
#define HAMI_CU_MEM_ALLOCATION_TYPE(X)                                                      \
  X(CU_MEM_ALLOCATION_TYPE_INVALID, 0x0) X(CU_MEM_ALLOCATION_TYPE_PINNED, 0x1)
#define HAMI_CU_MEM_ACCESS_FLAGS(X)                                                         \
  X(CU_MEM_ACCESS_FLAGS_PROT_NONE, 0x0) X(CU_MEM_ACCESS_FLAGS_PROT_READWRITE, 0x3)
#define HAMI_CU_MEMPOOL_ATTR(X)                                                             \
  X(CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, 4)                                                   \
  X(CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, 5)                                                \
  X(CU_MEMPOOL_ATTR_USED_MEM_CURRENT, 7)
#define HAMI_CU_GRAPH_MEM_ATTR(X)                                                           \
  X(CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT, 0) X(CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT, 2)
#define HAMI_CU_GRAPH_INSTANTIATE_FLAGS(X) X(CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD, 2)
#define HAMI_CU_GRAPH_INSTANTIATE_RESULT(X)                                                 \
  X(CUDA_GRAPH_INSTANTIATE_SUCCESS, 0) X(CUDA_GRAPH_INSTANTIATE_ERROR, 1)
#define HAMI_CU_STREAM_CAPTURE_MODE(X)                                                      \
  X(CU_STREAM_CAPTURE_MODE_GLOBAL, 0) X(CU_STREAM_CAPTURE_MODE_RELAXED, 2)
#define HAMI_CU_LIMIT(X)                                                                    \
  X(CU_LIMIT_STACK_SIZE, 0x00)                                                              \
  X(CU_LIMIT_PRINTF_FIFO_SIZE, 0x01)                                                        \
  X(CU_LIMIT_MALLOC_HEAP_SIZE, 0x02)                                                        \
  X(CU_LIMIT_DEV_RUNTIME_SYNC_DEPTH, 0x03)                                                  \
  X(CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT, 0x04)
#define HAMI_CU_FUNCTION_ATTRIBUTE(X) X(CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, 0)
#define HAMI_CU_JIT_OPTION(X) X(CU_JIT_MAX_REGISTERS, 0)
#define HAMI_CU_LIBRARY_OPTION(X) X(CU_LIBRARY_HOST_UNIVERSAL_FUNCTION_AND_DATA_TABLE, 0)
#define HAMI_CU_DEV_RESOURCE_TYPE(X)                                                        \
  X(CU_DEV_RESOURCE_TYPE_INVALID, 0) X(CU_DEV_RESOURCE_TYPE_SM, 1)
#define HAMI_CU_GREEN_CTX_FLAGS(X) X(CU_GREEN_CTX_DEFAULT_STREAM, 0x1)
/* Struct layouts (x86_64 and aarch64 alike), checked against cuda.h. */
#define HAMI_CU_LAYOUT(X)                                                                   \
  X(sizeof(CUresult), sizeof(unsigned int))                                                 \
  X(sizeof(CUuuid), 16)                                                                     \
  X(sizeof(CUDA_ARRAY_DESCRIPTOR_v2), 24)                                                   \
  X(offsetof(CUDA_ARRAY_DESCRIPTOR_v2, NumChannels), 20)                                    \
  X(sizeof(CUDA_ARRAY3D_DESCRIPTOR_v2), 40)                                                 \
  X(offsetof(CUDA_ARRAY3D_DESCRIPTOR_v2, Flags), 32)                                        \
  X(sizeof(CUmemLocation_v1), 8)                                                            \
  X(sizeof(CUmemAllocationProp_v1), 32)                                                     \
  X(offsetof(CUmemAllocationProp_v1, location), 8)                                          \
  X(offsetof(CUmemAllocationProp_v1, allocFlags), 24)                                       \
  X(sizeof(CUmemAccessDesc_v1), 12)                                                         \
  X(sizeof(CUmemPoolProps_v1), 88)                                                          \
  X(offsetof(CUmemPoolProps_v1, maxSize), 24)                                               \
  X(offsetof(CUmemPoolProps_v1, usage), 32)                                                 \
  X(sizeof(CUDA_MEM_ALLOC_NODE_PARAMS_v1), 120)                                             \
  X(offsetof(CUDA_MEM_ALLOC_NODE_PARAMS_v1, dptr), 112)                                     \
  X(sizeof(CUDA_GRAPH_INSTANTIATE_PARAMS), 32)                                              \
  X(offsetof(CUDA_GRAPH_INSTANTIATE_PARAMS, result_out), 24)                                \
  X(sizeof(CUlaunchConfig), 56)                                                             \
  X(offsetof(CUlaunchConfig, hStream), 32)                                                  \
  X(offsetof(CUlaunchConfig, numAttrs), 48)                                                 \
  X(sizeof(CUdevResource), 144)                                                             \
  X(offsetof(CUdevResource, sm), 96)

#if HAMI_CUDA_FALLBACK_DEFS
#define HAMI_ENUMERATOR(name, value) name = value,
typedef enum cudaError_enum { HAMI_CU_RESULT(HAMI_ENUMERATOR) } CUresult;
typedef enum CUdriverProcAddressQueryResult_enum {
  HAMI_CU_PROC_ADDRESS_RESULT(HAMI_ENUMERATOR)
} CUdriverProcAddressQueryResult;
typedef enum CUdriverProcAddress_flags_enum {
  HAMI_CU_PROC_ADDRESS_FLAGS(HAMI_ENUMERATOR)
} CUdriverProcAddress_flags;
typedef enum CUarray_format_enum { HAMI_CU_ARRAY_FORMAT(HAMI_ENUMERATOR) } CUarray_format;
typedef enum CUmemAttach_flags_enum { HAMI_CU_MEM_ATTACH(HAMI_ENUMERATOR) } CUmemAttach_flags;
typedef enum CUstream_flags_enum { HAMI_CU_STREAM_FLAGS(HAMI_ENUMERATOR) } CUstream_flags;
typedef enum CUmemAllocationHandleType_enum {
  HAMI_CU_MEM_HANDLE_TYPE(HAMI_ENUMERATOR)
} CUmemAllocationHandleType;
typedef enum CUmemLocationType_enum { HAMI_CU_MEM_LOCATION_TYPE(HAMI_ENUMERATOR) } CUmemLocationType;
typedef enum CUmemAllocationType_enum {
  HAMI_CU_MEM_ALLOCATION_TYPE(HAMI_ENUMERATOR)
} CUmemAllocationType;
typedef enum CUmemAccess_flags_enum { HAMI_CU_MEM_ACCESS_FLAGS(HAMI_ENUMERATOR) } CUmemAccess_flags;
typedef enum CUmemPool_attribute_enum { HAMI_CU_MEMPOOL_ATTR(HAMI_ENUMERATOR) } CUmemPool_attribute;
typedef enum CUgraphMem_attribute_enum {
  HAMI_CU_GRAPH_MEM_ATTR(HAMI_ENUMERATOR)
} CUgraphMem_attribute;
typedef enum CUgraphInstantiate_flags_enum {
  HAMI_CU_GRAPH_INSTANTIATE_FLAGS(HAMI_ENUMERATOR)
} CUgraphInstantiate_flags;
typedef enum CUgraphInstantiateResult_enum {
  HAMI_CU_GRAPH_INSTANTIATE_RESULT(HAMI_ENUMERATOR)
} CUgraphInstantiateResult;
typedef enum CUstreamCaptureMode_enum {
  HAMI_CU_STREAM_CAPTURE_MODE(HAMI_ENUMERATOR)
} CUstreamCaptureMode;
typedef enum CUlimit_enum { HAMI_CU_LIMIT(HAMI_ENUMERATOR) } CUlimit;
typedef enum CUfunction_attribute_enum {
  HAMI_CU_FUNCTION_ATTRIBUTE(HAMI_ENUMERATOR)
} CUfunction_attribute;
typedef enum CUjit_option_enum { HAMI_CU_JIT_OPTION(HAMI_ENUMERATOR) } CUjit_option;
typedef enum CUlibraryOption_enum { HAMI_CU_LIBRARY_OPTION(HAMI_ENUMERATOR) } CUlibraryOption;
typedef enum { HAMI_CU_DEV_RESOURCE_TYPE(HAMI_ENUMERATOR) } CUdevResourceType;
typedef enum { HAMI_CU_GREEN_CTX_FLAGS(HAMI_ENUMERATOR) } CUgreenCtxCreate_flags;
#undef HAMI_ENUMERATOR

typedef struct CUuuid_st {
  char bytes[16];
} CUuuid;

typedef struct CUDA_ARRAY_DESCRIPTOR_st {
  size_t Width;
  size_t Height;
  CUarray_format Format;
  unsigned int NumChannels;
} CUDA_ARRAY_DESCRIPTOR_v2;

typedef struct CUDA_ARRAY3D_DESCRIPTOR_st {
  size_t Width;
  size_t Height;
  size_t Depth;
  CUarray_format Format;
  unsigned int NumChannels;
  unsigned int Flags;
} CUDA_ARRAY3D_DESCRIPTOR_v2;

typedef struct CUmemLocation_st {
  CUmemLocationType type;
  int id;
} CUmemLocation_v1;

typedef struct CUmemAllocationProp_st {
  CUmemAllocationType type;
  CUmemAllocationHandleType requestedHandleTypes;
  CUmemLocation_v1 location;
  void *win32HandleMetaData;
  struct {
    unsigned char compressionType;
    unsigned char gpuDirectRDMACapable;
    unsigned short usage;
    unsigned char reserved[4];
  } allocFlags;
} CUmemAllocationProp_v1;

typedef struct CUmemAccessDesc_st {
  CUmemLocation_v1 location;
  CUmemAccess_flags flags;
} CUmemAccessDesc_v1;

typedef struct CUmemPoolProps_st {
  CUmemAllocationType allocType;
  CUmemAllocationHandleType handleTypes;
  CUmemLocation_v1 location;
  void *win32SecurityAttributes;
  size_t maxSize;
  unsigned short usage;
  unsigned char reserved[54];
} CUmemPoolProps_v1;

typedef struct CUDA_MEM_ALLOC_NODE_PARAMS_v1_st {
  CUmemPoolProps_v1 poolProps;
  const CUmemAccessDesc_v1 *accessDescs;
  size_t accessDescCount;
  size_t bytesize;
  CUdeviceptr dptr;
} CUDA_MEM_ALLOC_NODE_PARAMS_v1;

typedef struct CUDA_GRAPH_INSTANTIATE_PARAMS_st {
  cuuint64_t flags;
  CUstream hUploadStream;
  CUgraphNode hErrNode_out;
  CUgraphInstantiateResult result_out;
} CUDA_GRAPH_INSTANTIATE_PARAMS;

typedef struct CUlaunchConfig_st {
  unsigned int gridDimX;
  unsigned int gridDimY;
  unsigned int gridDimZ;
  unsigned int blockDimX;
  unsigned int blockDimY;
  unsigned int blockDimZ;
  unsigned int sharedMemBytes;
  CUstream hStream;
  CUlaunchAttribute *attrs;
  unsigned int numAttrs;
} CUlaunchConfig;

typedef struct CUdevSmResource_st {
  unsigned int smCount;
} CUdevSmResource;

typedef struct CUdevResource_st {
  CUdevResourceType type;
  unsigned char _internal_padding[92];
  union {
    CUdevSmResource sm;
    unsigned char _oversize[48];
  };
} CUdevResource_v1;
typedef CUdevResource_v1 CUdevResource;
#endif

typedef CUDA_ARRAY_DESCRIPTOR_v2 CUDA_ARRAY_DESCRIPTOR;
typedef CUDA_ARRAY3D_DESCRIPTOR_v2 CUDA_ARRAY3D_DESCRIPTOR;
typedef CUmemLocation_v1 CUmemLocation;
typedef CUmemAllocationProp_v1 CUmemAllocationProp;
typedef CUmemAccessDesc_v1 CUmemAccessDesc;
typedef CUmemPoolProps_v1 CUmemPoolProps;
typedef CUDA_MEM_ALLOC_NODE_PARAMS_v1 CUDA_MEM_ALLOC_NODE_PARAMS;

#define HAMI_SAME(a, b) _Static_assert((a) == (b), #a " == " #b);
HAMI_CU_RESULT(HAMI_SAME)
HAMI_CU_PROC_ADDRESS_RESULT(HAMI_SAME)
HAMI_CU_PROC_ADDRESS_FLAGS(HAMI_SAME)
HAMI_CU_ARRAY_FORMAT(HAMI_SAME)
HAMI_CU_MEM_ATTACH(HAMI_SAME)
HAMI_CU_STREAM_FLAGS(HAMI_SAME)
HAMI_CU_MEM_HANDLE_TYPE(HAMI_SAME)
HAMI_CU_MEM_LOCATION_TYPE(HAMI_SAME)
HAMI_CU_MEM_ALLOCATION_TYPE(HAMI_SAME)
HAMI_CU_MEM_ACCESS_FLAGS(HAMI_SAME)
HAMI_CU_MEMPOOL_ATTR(HAMI_SAME)
HAMI_CU_GRAPH_MEM_ATTR(HAMI_SAME)
HAMI_CU_GRAPH_INSTANTIATE_FLAGS(HAMI_SAME)
HAMI_CU_GRAPH_INSTANTIATE_RESULT(HAMI_SAME)
HAMI_CU_STREAM_CAPTURE_MODE(HAMI_SAME)
HAMI_CU_LIMIT(HAMI_SAME)
HAMI_CU_FUNCTION_ATTRIBUTE(HAMI_SAME)
HAMI_CU_JIT_OPTION(HAMI_SAME)
HAMI_CU_LIBRARY_OPTION(HAMI_SAME)
HAMI_CU_DEV_RESOURCE_TYPE(HAMI_SAME)
HAMI_CU_GREEN_CTX_FLAGS(HAMI_SAME)
HAMI_CU_LAYOUT(HAMI_SAME)
#undef HAMI_SAME

/* Prototypes, as cuda.h writes them, each under the symbol it binds. */
CUresult CUDAAPI cuGetErrorString(CUresult error, const char **pStr);
CUresult CUDAAPI cuGetErrorName(CUresult error, const char **pStr);
CUresult CUDAAPI cuInit(unsigned int Flags);
CUresult CUDAAPI cuDriverGetVersion(int *driverVersion);
CUresult CUDAAPI cuDeviceGet(CUdevice *device, int ordinal);
CUresult CUDAAPI cuDeviceGetCount(int *count);
CUresult CUDAAPI cuDeviceGetName(char *name, int len, CUdevice dev);
CUresult CUDAAPI cuDeviceGetUuid(CUuuid *uuid, CUdevice dev);
CUresult CUDAAPI cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice dev);
CUresult CUDAAPI cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev);
CUresult CUDAAPI cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev);
CUresult CUDAAPI cuDevicePrimaryCtxRelease_v2(CUdevice dev);
CUresult CUDAAPI cuDevicePrimaryCtxReset_v2(CUdevice dev);
CUresult CUDAAPI cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev);
CUresult CUDAAPI cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *paramsArray, int numParams, unsigned int flags, CUdevice dev);
CUresult CUDAAPI cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *ctxCreateParams, unsigned int flags, CUdevice dev);
CUresult CUDAAPI cuCtxDestroy_v2(CUcontext ctx);
CUresult CUDAAPI cuCtxPopCurrent_v2(CUcontext *pctx);
CUresult CUDAAPI cuCtxSetCurrent(CUcontext ctx);
CUresult CUDAAPI cuCtxGetCurrent(CUcontext *pctx);
CUresult CUDAAPI cuCtxGetDevice(CUdevice *device);
CUresult CUDAAPI cuCtxSynchronize(void);
CUresult CUDAAPI cuCtxSetLimit(CUlimit limit, size_t value);
CUresult CUDAAPI cuCtxGetLimit(size_t *pvalue, CUlimit limit);
CUresult CUDAAPI cuModuleLoad(CUmodule *module, const char *fname);
CUresult CUDAAPI cuModuleLoadData(CUmodule *module, const void *image);
CUresult CUDAAPI cuModuleLoadDataEx(CUmodule *module, const void *image, unsigned int numOptions, CUjit_option *options, void **optionValues);
CUresult CUDAAPI cuModuleLoadFatBinary(CUmodule *module, const void *fatCubin);
CUresult CUDAAPI cuModuleUnload(CUmodule hmod);
CUresult CUDAAPI cuModuleGetFunction(CUfunction *hfunc, CUmodule hmod, const char *name);
CUresult CUDAAPI cuModuleGetGlobal_v2(CUdeviceptr *dptr, size_t *bytes, CUmodule hmod, const char *name);
CUresult CUDAAPI cuLibraryLoadData(CUlibrary *library, const void *code, CUjit_option *jitOptions, void **jitOptionsValues, unsigned int numJitOptions, CUlibraryOption *libraryOptions, void** libraryOptionValues, unsigned int numLibraryOptions);
CUresult CUDAAPI cuLibraryLoadFromFile(CUlibrary *library, const char *fileName, CUjit_option *jitOptions, void **jitOptionsValues, unsigned int numJitOptions, CUlibraryOption *libraryOptions, void **libraryOptionValues, unsigned int numLibraryOptions);
CUresult CUDAAPI cuLibraryUnload(CUlibrary library);
CUresult CUDAAPI cuLibraryGetKernel(CUkernel *pKernel, CUlibrary library, const char *name);
CUresult CUDAAPI cuLibraryGetModule(CUmodule *pMod, CUlibrary library);
CUresult CUDAAPI cuKernelGetFunction(CUfunction *pFunc, CUkernel kernel);
CUresult CUDAAPI cuLibraryGetGlobal(CUdeviceptr *dptr, size_t *bytes, CUlibrary library, const char *name);
CUresult CUDAAPI cuMemGetInfo_v2(size_t *free, size_t *total);
CUresult CUDAAPI cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize);
CUresult CUDAAPI cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pPitch, size_t WidthInBytes, size_t Height, unsigned int ElementSizeBytes);
CUresult CUDAAPI cuMemFree_v2(CUdeviceptr dptr);
CUresult CUDAAPI cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags);
CUresult CUDAAPI cuArrayCreate_v2(CUarray *pHandle, const CUDA_ARRAY_DESCRIPTOR *pAllocateArray);
CUresult CUDAAPI cuArrayDestroy(CUarray hArray);
CUresult CUDAAPI cuArray3DCreate_v2(CUarray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *pAllocateArray);
CUresult CUDAAPI cuMipmappedArrayCreate(CUmipmappedArray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *pMipmappedArrayDesc, unsigned int numMipmapLevels);
CUresult CUDAAPI cuMipmappedArrayDestroy(CUmipmappedArray hMipmappedArray);
CUresult CUDAAPI cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr, unsigned long long flags);
CUresult CUDAAPI cuMemAddressFree(CUdeviceptr ptr, size_t size);
CUresult CUDAAPI cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop, unsigned long long flags);
CUresult CUDAAPI cuMemRelease(CUmemGenericAllocationHandle handle);
CUresult CUDAAPI cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle, unsigned long long flags);
CUresult CUDAAPI cuMemUnmap(CUdeviceptr ptr, size_t size);
CUresult CUDAAPI cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count);
CUresult CUDAAPI cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle, void *addr);
CUresult CUDAAPI cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream);
CUresult CUDAAPI cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream);
CUresult CUDAAPI cuMemPoolTrimTo(CUmemoryPool pool, size_t minBytesToKeep);
CUresult CUDAAPI cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value);
CUresult CUDAAPI cuMemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value);
CUresult CUDAAPI cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *poolProps);
CUresult CUDAAPI cuMemPoolDestroy(CUmemoryPool pool);
CUresult CUDAAPI cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream hStream);
CUresult CUDAAPI cuDeviceGetDefaultMemPool(CUmemoryPool *pool_out, CUdevice dev);
CUresult CUDAAPI cuDeviceGetMemPool(CUmemoryPool *pool, CUdevice dev);
CUresult CUDAAPI cuDeviceSetMemPool(CUdevice dev, CUmemoryPool pool);
CUresult CUDAAPI cuStreamCreate(CUstream *phStream, unsigned int Flags);
CUresult CUDAAPI cuStreamBeginCapture_v2(CUstream hStream, CUstreamCaptureMode mode);
CUresult CUDAAPI cuStreamEndCapture(CUstream hStream, CUgraph *phGraph);
CUresult CUDAAPI cuStreamQuery(CUstream hStream);
CUresult CUDAAPI cuStreamSynchronize(CUstream hStream);
CUresult CUDAAPI cuEventCreate(CUevent *phEvent, unsigned int Flags);
CUresult CUDAAPI cuEventRecord(CUevent hEvent, CUstream hStream);
CUresult CUDAAPI cuEventQuery(CUevent hEvent);
CUresult CUDAAPI cuEventSynchronize(CUevent hEvent);
CUresult CUDAAPI cuEventDestroy_v2(CUevent hEvent);
CUresult CUDAAPI cuEventElapsedTime(float *pMilliseconds, CUevent hStart, CUevent hEnd);
CUresult CUDAAPI cuFuncGetAttribute(int *pi, CUfunction_attribute attrib, CUfunction hfunc);
CUresult CUDAAPI cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **kernelParams, void **extra);
CUresult CUDAAPI cuLaunchKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream, void **kernelParams, void **extra);
CUresult CUDAAPI cuLaunchCooperativeKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream, void **kernelParams);
CUresult CUDAAPI cuGraphCreate(CUgraph *phGraph, unsigned int flags);
CUresult CUDAAPI cuGraphAddMemAllocNode(CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies, size_t numDependencies, CUDA_MEM_ALLOC_NODE_PARAMS *nodeParams);
CUresult CUDAAPI cuGraphAddMemFreeNode(CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies, size_t numDependencies, CUdeviceptr dptr);
CUresult CUDAAPI cuDeviceGraphMemTrim(CUdevice device);
CUresult CUDAAPI cuDeviceGetGraphMemAttribute(CUdevice device, CUgraphMem_attribute attr, void* value);
CUresult CUDAAPI cuGraphInstantiateWithFlags(CUgraphExec *phGraphExec, CUgraph hGraph, unsigned long long flags);
CUresult CUDAAPI cuGraphInstantiateWithParams(CUgraphExec *phGraphExec, CUgraph hGraph, CUDA_GRAPH_INSTANTIATE_PARAMS *instantiateParams);
CUresult CUDAAPI cuGraphUpload(CUgraphExec hGraphExec, CUstream hStream);
CUresult CUDAAPI cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream);
CUresult CUDAAPI cuGraphExecDestroy(CUgraphExec hGraphExec);
CUresult CUDAAPI cuGraphDestroy(CUgraph hGraph);
CUresult CUDAAPI cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags, CUdriverProcAddressQueryResult *symbolStatus);
CUresult CUDAAPI cuGreenCtxCreate(CUgreenCtx* phCtx, CUdevResourceDesc desc, CUdevice dev, unsigned int flags);
CUresult CUDAAPI cuGreenCtxDestroy(CUgreenCtx hCtx);
CUresult CUDAAPI cuDeviceGetDevResource(CUdevice device, CUdevResource* resource, CUdevResourceType type);
CUresult CUDAAPI cuDevResourceGenerateDesc(CUdevResourceDesc *phDesc, CUdevResource *resources, unsigned int nbResources);

#if defined(HAMI_CUDA_ABI_NAMES)
/* The legacy unversioned entry points (cuda.h declares them for the driver's own build). */
CUresult CUDAAPI cuCtxCreate(CUcontext *pctx, unsigned int flags, CUdevice dev);
CUresult CUDAAPI cuCtxDestroy(CUcontext ctx);
CUresult CUDAAPI cuDevicePrimaryCtxRelease(CUdevice dev);
#endif

#endif /* HAMI_CUDA_FALLBACK_DECLS */

/*
 * Symbols the driver exports that cuda.h (12.9, outside the driver's own build) declares only
 * under another name or not at all: the per-thread-default-stream entry points (with
 * CUDA_API_PER_THREAD_DEFAULT_STREAM cuda.h binds cuMemAllocAsync to cuMemAllocAsync_ptsz) and
 * CUDA 13.0's context-taking variants. Declared here with cuda.h's types (as CUDA 13.0's
 * cuda.h writes them, so that the two declarations agree where it has them).
 */
CUresult CUDAAPI cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream hStream);
CUresult CUDAAPI cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream hStream);
CUresult CUDAAPI cuCtxGetDevice_v2(CUdevice *device, CUcontext ctx);
CUresult CUDAAPI cuCtxSynchronize_v2(CUcontext ctx);

#endif /* HAMI_CUDA_H */
