/*
 * hami_cuda.h: the CUDA driver API as the C test programs see it, written in one place.
 *
 * Where <cuda.h> can be found (the GPU machine, with its CUDA toolkit) it is included and is
 * the only definition: a program that disagrees with the real header does not compile there.
 * Where it cannot (the development machine has no CUDA toolkit; the fake driver stands in for
 * libcuda), the fallback below declares the subset the programs use, copied from cuda.h
 * (12.9): the same type names and struct tags, the same enum values, the same prototypes, and
 * the same #defines from an unversioned name to the versioned symbol it binds (cuMemAlloc ->
 * cuMemAlloc_v2, ...). A program that wants one particular symbol names it (cuMemAlloc_v2), or,
 * for an unversioned legacy symbol, resolves it with dlsym and its own typedef.
 *
 *   -DHAMI_NO_SYSTEM_CUDA_H    always use the fallback, even where <cuda.h> exists.
 *   -DHAMI_CHECK_AGAINST_CUDA_H include <cuda.h> and check the fallback against it: every
 *                               fallback prototype and typedef is declared again (a mismatch is
 *                               a conflicting-types error), every enum value and struct size is
 *                               a static assertion. gpu/check_c_programs.sh builds the programs so.
 */
#ifndef HAMI_CUDA_H
#define HAMI_CUDA_H

#include <stddef.h>
#include <stdint.h>

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

/* The unversioned names the header binds to versioned symbols (cuda.h's #defines). */
#define cuDeviceTotalMem cuDeviceTotalMem_v2
#define cuCtxCreate cuCtxCreate_v2
#define cuMemGetInfo cuMemGetInfo_v2
#define cuMemAlloc cuMemAlloc_v2
#define cuMemAllocPitch cuMemAllocPitch_v2
#define cuMemFree cuMemFree_v2
#define cuArrayCreate cuArrayCreate_v2
#define cuCtxDestroy cuCtxDestroy_v2
#define cuCtxPopCurrent cuCtxPopCurrent_v2
#define cuDevicePrimaryCtxRelease cuDevicePrimaryCtxRelease_v2
#define cuDevicePrimaryCtxReset cuDevicePrimaryCtxReset_v2
#define cuGetProcAddress cuGetProcAddress_v2

typedef uint64_t cuuint64_t;
typedef unsigned long long CUdeviceptr_v2;
typedef CUdeviceptr_v2 CUdeviceptr;
typedef int CUdevice_v1;
typedef CUdevice_v1 CUdevice;
typedef struct CUctx_st *CUcontext;
typedef struct CUarray_st *CUarray;
typedef struct CUstream_st *CUstream;
typedef unsigned long long CUmemGenericAllocationHandle_v1;
typedef CUmemGenericAllocationHandle_v1 CUmemGenericAllocationHandle;

/* The enum values, listed once: defined by the fallback, checked against cuda.h. */
#define HAMI_CU_RESULT(X)                                                                   \
  X(CUDA_SUCCESS, 0)                                                                        \
  X(CUDA_ERROR_INVALID_VALUE, 1)                                                            \
  X(CUDA_ERROR_OUT_OF_MEMORY, 2)                                                            \
  X(CUDA_ERROR_NOT_INITIALIZED, 3)                                                          \
  X(CUDA_ERROR_INVALID_CONTEXT, 201)                                                        \
  X(CUDA_ERROR_NOT_FOUND, 500)                                                              \
  X(CUDA_ERROR_UNKNOWN, 999)
#define HAMI_CU_PROC_ADDRESS_RESULT(X)                                                      \
  X(CU_GET_PROC_ADDRESS_SUCCESS, 0)                                                         \
  X(CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND, 1)                                                \
  X(CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT, 2)
#define HAMI_CU_ARRAY_FORMAT(X) X(CU_AD_FORMAT_UNSIGNED_INT8, 0x01) X(CU_AD_FORMAT_FLOAT, 0x20)
#define HAMI_CU_MEM_HANDLE_TYPE(X)                                                          \
  X(CU_MEM_HANDLE_TYPE_NONE, 0x0) X(CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0x1)
#define HAMI_CU_MEM_LOCATION_TYPE(X)                                                        \
  X(CU_MEM_LOCATION_TYPE_INVALID, 0x0) X(CU_MEM_LOCATION_TYPE_DEVICE, 0x1)
#define HAMI_CU_MEM_ALLOCATION_TYPE(X)                                                      \
  X(CU_MEM_ALLOCATION_TYPE_INVALID, 0x0) X(CU_MEM_ALLOCATION_TYPE_PINNED, 0x1)
/* Struct layouts (x86_64 and aarch64 alike), checked against cuda.h. */
#define HAMI_CU_LAYOUT(X)                                                                   \
  X(sizeof(CUresult), sizeof(unsigned int))                                                 \
  X(sizeof(CUDA_ARRAY_DESCRIPTOR_v2), 24)                                                   \
  X(offsetof(CUDA_ARRAY_DESCRIPTOR_v2, NumChannels), 20)                                    \
  X(sizeof(CUmemLocation_v1), 8)                                                            \
  X(sizeof(CUmemAllocationProp_v1), 32)                                                     \
  X(offsetof(CUmemAllocationProp_v1, location), 8)                                          \
  X(offsetof(CUmemAllocationProp_v1, allocFlags), 24)

#if HAMI_CUDA_FALLBACK_DEFS
#define HAMI_ENUMERATOR(name, value) name = value,
typedef enum cudaError_enum { HAMI_CU_RESULT(HAMI_ENUMERATOR) } CUresult;
typedef enum CUdriverProcAddressQueryResult_enum {
  HAMI_CU_PROC_ADDRESS_RESULT(HAMI_ENUMERATOR)
} CUdriverProcAddressQueryResult;
typedef enum CUarray_format_enum { HAMI_CU_ARRAY_FORMAT(HAMI_ENUMERATOR) } CUarray_format;
typedef enum CUmemAllocationHandleType_enum {
  HAMI_CU_MEM_HANDLE_TYPE(HAMI_ENUMERATOR)
} CUmemAllocationHandleType;
typedef enum CUmemLocationType_enum { HAMI_CU_MEM_LOCATION_TYPE(HAMI_ENUMERATOR) } CUmemLocationType;
typedef enum CUmemAllocationType_enum {
  HAMI_CU_MEM_ALLOCATION_TYPE(HAMI_ENUMERATOR)
} CUmemAllocationType;
#undef HAMI_ENUMERATOR

typedef struct CUDA_ARRAY_DESCRIPTOR_st {
  size_t Width;
  size_t Height;
  CUarray_format Format;
  unsigned int NumChannels;
} CUDA_ARRAY_DESCRIPTOR_v2;

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
#endif

#define HAMI_SAME(a, b) _Static_assert((a) == (b), #a " == " #b);
HAMI_CU_RESULT(HAMI_SAME)
HAMI_CU_PROC_ADDRESS_RESULT(HAMI_SAME)
HAMI_CU_ARRAY_FORMAT(HAMI_SAME)
HAMI_CU_MEM_HANDLE_TYPE(HAMI_SAME)
HAMI_CU_MEM_LOCATION_TYPE(HAMI_SAME)
HAMI_CU_MEM_ALLOCATION_TYPE(HAMI_SAME)
HAMI_CU_LAYOUT(HAMI_SAME)
#undef HAMI_SAME

typedef CUDA_ARRAY_DESCRIPTOR_v2 CUDA_ARRAY_DESCRIPTOR;
typedef CUmemLocation_v1 CUmemLocation;
typedef CUmemAllocationProp_v1 CUmemAllocationProp;

/* Prototypes, as cuda.h writes them (through the #defines above where it has one). */
CUresult CUDAAPI cuInit(unsigned int Flags);
CUresult CUDAAPI cuDriverGetVersion(int *driverVersion);
CUresult CUDAAPI cuDeviceGet(CUdevice *device, int ordinal);
CUresult CUDAAPI cuDeviceGetCount(int *count);
CUresult CUDAAPI cuDeviceTotalMem(size_t *bytes, CUdevice dev);
CUresult CUDAAPI cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev);
CUresult CUDAAPI cuDevicePrimaryCtxRelease(CUdevice dev);
CUresult CUDAAPI cuDevicePrimaryCtxReset(CUdevice dev);
CUresult CUDAAPI cuCtxCreate(CUcontext *pctx, unsigned int flags, CUdevice dev);
CUresult CUDAAPI cuCtxDestroy(CUcontext ctx);
CUresult CUDAAPI cuCtxPopCurrent(CUcontext *pctx);
CUresult CUDAAPI cuCtxSetCurrent(CUcontext ctx);
CUresult CUDAAPI cuCtxGetCurrent(CUcontext *pctx);
CUresult CUDAAPI cuCtxGetDevice(CUdevice *device);
CUresult CUDAAPI cuMemGetInfo(size_t *free, size_t *total);
CUresult CUDAAPI cuMemAlloc(CUdeviceptr *dptr, size_t bytesize);
CUresult CUDAAPI cuMemAllocPitch(CUdeviceptr *dptr, size_t *pPitch, size_t WidthInBytes, size_t Height, unsigned int ElementSizeBytes);
CUresult CUDAAPI cuMemFree(CUdeviceptr dptr);
CUresult CUDAAPI cuArrayCreate(CUarray *pHandle, const CUDA_ARRAY_DESCRIPTOR *pAllocateArray);
CUresult CUDAAPI cuArrayDestroy(CUarray hArray);
CUresult CUDAAPI cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop, unsigned long long flags);
CUresult CUDAAPI cuMemRelease(CUmemGenericAllocationHandle handle);
CUresult CUDAAPI cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream);
CUresult CUDAAPI cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream);
CUresult CUDAAPI cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags, CUdriverProcAddressQueryResult *symbolStatus);

#endif /* HAMI_CUDA_FALLBACK_DECLS */

/*
 * Symbols the driver exports that cuda.h declares only under another name (with
 * CUDA_API_PER_THREAD_DEFAULT_STREAM it binds cuMemAllocAsync to cuMemAllocAsync_ptsz): the
 * programs that call the per-thread-default-stream entry points by name declare them here,
 * with cuda.h's types.
 */
CUresult CUDAAPI cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream hStream);

#endif /* HAMI_CUDA_H */
