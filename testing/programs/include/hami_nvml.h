/*
 * hami_nvml.h: NVML as the C test programs see it, written in one place (hami_cuda.h's scheme).
 *
 * Where <nvml.h> can be found (the GPU machine, with its CUDA toolkit) it is included and is
 * the only definition. Where it cannot (the development machine; the fake libnvidia-ml stands
 * in), the fallback below declares the subset the programs use, copied from nvml.h (12.9,
 * NVML_API_VERSION 12): the same type names, enum values, struct layouts and prototypes (each
 * under the symbol it is), and, unless NVML_NO_UNVERSIONED_FUNC_DEFS is defined (nvml.h's own
 * switch), the same #defines from an unversioned name to the versioned symbol
 * (nvmlInit -> nvmlInit_v2, ...). With NVML_NO_UNVERSIONED_FUNC_DEFS the legacy unversioned
 * entry points are declared as well (nvmlDeviceGetComputeRunningProcesses: the v1 list).
 *
 *   -DHAMI_NO_SYSTEM_NVML_H    always use the fallback, even where <nvml.h> exists.
 *   -DHAMI_CHECK_AGAINST_NVML_H include <nvml.h> and check the fallback against it: every
 *                               fallback prototype and typedef is declared again (a mismatch is
 *                               a conflicting-types error), every enum value, version word and
 *                               struct layout is a static assertion. gpu/check_c_programs.sh
 *                               builds the programs so.
 */
#ifndef HAMI_NVML_H
#define HAMI_NVML_H

#include <stddef.h>

#if defined(HAMI_CHECK_AGAINST_NVML_H)
#include <nvml.h>
#define HAMI_NVML_FALLBACK_DECLS 1 /* declared again, checked against nvml.h */
#define HAMI_NVML_FALLBACK_DEFS 0  /* struct and enum bodies: nvml.h's */
#elif !defined(HAMI_NO_SYSTEM_NVML_H) && defined(__has_include)
#if __has_include(<nvml.h>)
#include <nvml.h>
#define HAMI_NVML_FALLBACK_DECLS 0
#define HAMI_NVML_FALLBACK_DEFS 0
#endif
#endif
#ifndef HAMI_NVML_FALLBACK_DECLS
#define HAMI_NVML_FALLBACK_DECLS 1
#define HAMI_NVML_FALLBACK_DEFS 1
#endif

#if HAMI_NVML_FALLBACK_DECLS

#ifndef DECLDIR
#define DECLDIR
#endif

#ifndef NVML_NO_UNVERSIONED_FUNC_DEFS
/* The unversioned names nvml.h binds to versioned symbols (its #defines). */
#define nvmlInit nvmlInit_v2
#define nvmlDeviceGetCount nvmlDeviceGetCount_v2
#define nvmlDeviceGetHandleByIndex nvmlDeviceGetHandleByIndex_v2
#define nvmlDeviceGetComputeRunningProcesses nvmlDeviceGetComputeRunningProcesses_v3
#define nvmlDeviceGetGraphicsRunningProcesses nvmlDeviceGetGraphicsRunningProcesses_v3
#define nvmlDeviceGetMPSComputeRunningProcesses nvmlDeviceGetMPSComputeRunningProcesses_v3
#endif

#define NVML_STRUCT_VERSION(data, ver) (unsigned int)(sizeof(nvml ## data ## _v ## ver ## _t) | \
                                                      (ver << 24U))

typedef struct nvmlDevice_st *nvmlDevice_t;

/* The enum values, listed once: defined by the fallback, checked against nvml.h. */
#define HAMI_NVML_RETURN(X)                                                                 \
  X(NVML_SUCCESS, 0)                                                                        \
  X(NVML_ERROR_UNINITIALIZED, 1)                                                            \
  X(NVML_ERROR_INVALID_ARGUMENT, 2)                                                         \
  X(NVML_ERROR_NOT_SUPPORTED, 3)                                                            \
  X(NVML_ERROR_NOT_FOUND, 6)                                                                \
  X(NVML_ERROR_INSUFFICIENT_SIZE, 7)                                                        \
  X(NVML_ERROR_FUNCTION_NOT_FOUND, 13)                                                      \
  X(NVML_ERROR_UNKNOWN, 999)
/* Struct layouts and version words (x86_64 and aarch64 alike), checked against nvml.h. */
#define HAMI_NVML_LAYOUT(X)                                                                 \
  X(sizeof(nvmlReturn_t), sizeof(unsigned int))                                             \
  X(sizeof(nvmlUtilization_t), 8)                                                           \
  X(sizeof(nvmlMemory_t), 24)                                                               \
  X(offsetof(nvmlMemory_t, used), 16)                                                       \
  X(sizeof(nvmlMemory_v2_t), 40)                                                            \
  X(offsetof(nvmlMemory_v2_t, reserved), 16)                                                \
  X(nvmlMemory_v2, 0x2000028u)                                                              \
  X(sizeof(nvmlProcessInfo_v1_t), 16)                                                       \
  X(sizeof(nvmlProcessInfo_v2_t), 24)                                                       \
  X(offsetof(nvmlProcessInfo_v2_t, computeInstanceId), 20)                                  \
  X(sizeof(nvmlProcessDetail_v1_t), 32)                                                     \
  X(offsetof(nvmlProcessDetail_v1_t, usedGpuCcProtectedMemory), 24)                         \
  X(sizeof(nvmlProcessDetailList_v1_t), 24)                                                 \
  X(offsetof(nvmlProcessDetailList_v1_t, procArray), 16)                                    \
  X(nvmlProcessDetailList_v1, 0x1000018u)                                                   \
  X(sizeof(nvmlProcessUtilizationSample_t), 32)                                             \
  X(offsetof(nvmlProcessUtilizationSample_t, smUtil), 16)                                   \
  X(sizeof(nvmlProcessUtilizationInfo_v1_t), 40)                                            \
  X(offsetof(nvmlProcessUtilizationInfo_v1_t, pid), 8)                                      \
  X(sizeof(nvmlProcessesUtilizationInfo_v1_t), 24)                                          \
  X(offsetof(nvmlProcessesUtilizationInfo_v1_t, procUtilArray), 16)                         \
  X(nvmlProcessesUtilizationInfo_v1, 0x1000018u)

#if HAMI_NVML_FALLBACK_DEFS
#define HAMI_ENUMERATOR(name, value) name = value,
typedef enum nvmlReturn_enum { HAMI_NVML_RETURN(HAMI_ENUMERATOR) } nvmlReturn_t;
#undef HAMI_ENUMERATOR

typedef struct nvmlUtilization_st {
  unsigned int gpu;
  unsigned int memory;
} nvmlUtilization_t;

typedef struct nvmlMemory_st {
  unsigned long long total;
  unsigned long long free;
  unsigned long long used;
} nvmlMemory_t;

typedef struct nvmlMemory_v2_st {
  unsigned int version;
  unsigned long long total;
  unsigned long long reserved;
  unsigned long long free;
  unsigned long long used;
} nvmlMemory_v2_t;

typedef struct nvmlProcessInfo_v1_st {
  unsigned int pid;
  unsigned long long usedGpuMemory;
} nvmlProcessInfo_v1_t;

typedef struct nvmlProcessInfo_v2_st {
  unsigned int pid;
  unsigned long long usedGpuMemory;
  unsigned int gpuInstanceId;
  unsigned int computeInstanceId;
} nvmlProcessInfo_v2_t, nvmlProcessInfo_t;

typedef struct {
  unsigned int pid;
  unsigned long long usedGpuMemory;
  unsigned int gpuInstanceId;
  unsigned int computeInstanceId;
  unsigned long long usedGpuCcProtectedMemory;
} nvmlProcessDetail_v1_t;

typedef struct {
  unsigned int version;
  unsigned int mode;
  unsigned int numProcArrayEntries;
  nvmlProcessDetail_v1_t *procArray;
} nvmlProcessDetailList_v1_t;
typedef nvmlProcessDetailList_v1_t nvmlProcessDetailList_t;

typedef struct nvmlProcessUtilizationSample_st {
  unsigned int pid;
  unsigned long long timeStamp;
  unsigned int smUtil;
  unsigned int memUtil;
  unsigned int encUtil;
  unsigned int decUtil;
} nvmlProcessUtilizationSample_t;

typedef struct {
  unsigned long long timeStamp;
  unsigned int pid;
  unsigned int smUtil;
  unsigned int memUtil;
  unsigned int encUtil;
  unsigned int decUtil;
  unsigned int jpgUtil;
  unsigned int ofaUtil;
} nvmlProcessUtilizationInfo_v1_t;

typedef struct {
  unsigned int version;
  unsigned int processSamplesCount;
  unsigned long long lastSeenTimeStamp;
  nvmlProcessUtilizationInfo_v1_t *procUtilArray;
} nvmlProcessesUtilizationInfo_v1_t;
typedef nvmlProcessesUtilizationInfo_v1_t nvmlProcessesUtilizationInfo_t;

#define nvmlMemory_v2 NVML_STRUCT_VERSION(Memory, 2)
#define nvmlProcessDetailList_v1 NVML_STRUCT_VERSION(ProcessDetailList, 1)
#define nvmlProcessesUtilizationInfo_v1 NVML_STRUCT_VERSION(ProcessesUtilizationInfo, 1)
#endif

#define HAMI_SAME(a, b) _Static_assert((a) == (b), #a " == " #b);
HAMI_NVML_RETURN(HAMI_SAME)
HAMI_NVML_LAYOUT(HAMI_SAME)
#undef HAMI_SAME

/* Prototypes, as nvml.h writes them, each under the symbol it is. */
nvmlReturn_t DECLDIR nvmlInit_v2(void);
nvmlReturn_t DECLDIR nvmlShutdown(void);
const DECLDIR char* nvmlErrorString(nvmlReturn_t result);
nvmlReturn_t DECLDIR nvmlSystemGetDriverVersion(char *version, unsigned int length);
nvmlReturn_t DECLDIR nvmlDeviceGetCount_v2(unsigned int *deviceCount);
nvmlReturn_t DECLDIR nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device);
nvmlReturn_t DECLDIR nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length);
nvmlReturn_t DECLDIR nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length);
nvmlReturn_t DECLDIR nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory);
nvmlReturn_t DECLDIR nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory);
nvmlReturn_t DECLDIR nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *utilization);
nvmlReturn_t DECLDIR nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount, nvmlProcessInfo_t *infos);
nvmlReturn_t DECLDIR nvmlDeviceGetGraphicsRunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount, nvmlProcessInfo_t *infos);
nvmlReturn_t DECLDIR nvmlDeviceGetMPSComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount, nvmlProcessInfo_t *infos);
nvmlReturn_t DECLDIR nvmlDeviceGetRunningProcessDetailList(nvmlDevice_t device, nvmlProcessDetailList_t *plist);
nvmlReturn_t DECLDIR nvmlDeviceGetProcessUtilization(nvmlDevice_t device, nvmlProcessUtilizationSample_t *utilization,
                                              unsigned int *processSamplesCount, unsigned long long lastSeenTimeStamp);
nvmlReturn_t DECLDIR nvmlDeviceGetProcessesUtilizationInfo(nvmlDevice_t device, nvmlProcessesUtilizationInfo_t *procesesUtilInfo);

#ifdef NVML_NO_UNVERSIONED_FUNC_DEFS
/* The legacy entry points (nvml.h declares them under this switch). */
nvmlReturn_t DECLDIR nvmlInit(void);
nvmlReturn_t DECLDIR nvmlDeviceGetCount(unsigned int *deviceCount);
nvmlReturn_t DECLDIR nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device);
nvmlReturn_t DECLDIR nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t device, unsigned int *infoCount, nvmlProcessInfo_v1_t *infos);
nvmlReturn_t DECLDIR nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t device, unsigned int *infoCount, nvmlProcessInfo_v2_t *infos);
nvmlReturn_t DECLDIR nvmlDeviceGetGraphicsRunningProcesses(nvmlDevice_t device, unsigned int *infoCount, nvmlProcessInfo_v1_t *infos);
nvmlReturn_t DECLDIR nvmlDeviceGetGraphicsRunningProcesses_v2(nvmlDevice_t device, unsigned int *infoCount, nvmlProcessInfo_v2_t *infos);
nvmlReturn_t DECLDIR nvmlDeviceGetMPSComputeRunningProcesses(nvmlDevice_t device, unsigned int *infoCount, nvmlProcessInfo_v1_t *infos);
nvmlReturn_t DECLDIR nvmlDeviceGetMPSComputeRunningProcesses_v2(nvmlDevice_t device, unsigned int *infoCount, nvmlProcessInfo_v2_t *infos);
#endif

#endif /* HAMI_NVML_FALLBACK_DECLS */

#endif /* HAMI_NVML_H */
