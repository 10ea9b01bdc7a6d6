// The CUDA driver entry points the backend uses, as a table of function pointers. libsalus never
// links libcuda: load_driver_api() opens it at run time, and tests fill the table with a fake
// (tests/support/fake_driver.hpp), so the backend's logic runs on machines without a GPU.
#pragma once

#include <cuda.h>

#include <array>
#include <memory>
#include <string>
#include <string_view>

#include "salus/error.hpp"

// X-macro over every entry point in the table, by its *base* name. Passing the name through a
// macro keeps two spellings apart: `#name` is the base name ("cuDeviceTotalMem") that
// cuGetProcAddress wants, while a plain `name` goes through cuda.h's versioning macros
// (cuDeviceTotalMem -> cuDeviceTotalMem_v2), so each member gets the signature of the version the
// header declares. Members are therefore spelled api.cuStreamDestroy in code, but the compiler
// sees api.cuStreamDestroy_v2 everywhere, consistently.
#define SALUS_CUDA_DRIVER_ENTRIES(X) \
  X(cuGetErrorName)                  \
  X(cuInit)                          \
  X(cuDeviceGetCount)                \
  X(cuDeviceGet)                     \
  X(cuDeviceGetName)                 \
  X(cuDeviceGetUuid)                 \
  X(cuDeviceTotalMem)                \
  X(cuMemGetInfo)                    \
  X(cuDeviceGetP2PAttribute)         \
  X(cuDevicePrimaryCtxRetain)        \
  X(cuDevicePrimaryCtxRelease)       \
  X(cuCtxGetCurrent)                 \
  X(cuCtxSetCurrent)                 \
  X(cuCtxGetStreamPriorityRange)     \
  X(cuMemGetAllocationGranularity)   \
  X(cuMemCreate)                     \
  X(cuMemRelease)                    \
  X(cuMemAddressReserve)             \
  X(cuMemAddressFree)                \
  X(cuMemMap)                        \
  X(cuMemUnmap)                      \
  X(cuMemSetAccess)                  \
  X(cuStreamCreateWithPriority)      \
  X(cuStreamDestroy)                 \
  X(cuStreamSynchronize)             \
  X(cuStreamQuery)                   \
  X(cuStreamGetCtx)                  \
  X(cuStreamWaitEvent)               \
  X(cuEventCreate)                   \
  X(cuEventDestroy)                  \
  X(cuEventRecord)                   \
  X(cuEventQuery)                    \
  X(cuEventSynchronize)              \
  X(cuEventElapsedTime)              \
  X(cuLaunchHostFunc)                \
  X(cuMemcpyAsync)                   \
  X(cuMemsetD8Async)                 \
  X(cuStreamIsCapturing)             \
  X(cuDeviceGetAttribute)           \
  X(cuDriverGetVersion)

// Entry points the backend can do without: resolved like the others, but a driver that lacks one
// leaves its member null instead of failing the load, and only what needs it throws NotSupported
// (sharing chunks and events between processes).
#define SALUS_CUDA_OPTIONAL_DRIVER_ENTRIES(X) \
  X(cuMemExportToShareableHandle)             \
  X(cuMemImportFromShareableHandle)           \
  X(cuIpcGetEventHandle)                      \
  X(cuIpcOpenEventHandle)

namespace salus::cuda {

// The driver API version every entry is resolved at. cuGetProcAddress maps a base name and a
// version to the symbol with the ABI of that version (e.g. cuStreamDestroy -> _v2), so an
// older or newer driver hands back functions whose signatures match the ones declared here.
inline constexpr int kDriverApiVersion = 12000;

struct DriverApi {
#define SALUS_CUDA_DECLARE_ENTRY(name) decltype(&::name) name = nullptr;
  SALUS_CUDA_DRIVER_ENTRIES(SALUS_CUDA_DECLARE_ENTRY)
  SALUS_CUDA_OPTIONAL_DRIVER_ENTRIES(SALUS_CUDA_DECLARE_ENTRY)
#undef SALUS_CUDA_DECLARE_ENTRY

  // Keeps libcuda loaded for as long as any copy of the table lives; empty for a fake.
  std::shared_ptr<void> library;
};

// Every entry, required ones first, in the order resolve_driver_api asks for them.
#define SALUS_CUDA_ENTRY_NAME(name) #name,
// clang-format off
inline constexpr std::array kDriverEntryNames = {
    SALUS_CUDA_DRIVER_ENTRIES(SALUS_CUDA_ENTRY_NAME)
    SALUS_CUDA_OPTIONAL_DRIVER_ENTRIES(SALUS_CUDA_ENTRY_NAME)};
// clang-format on
inline constexpr std::array kOptionalDriverEntryNames = {
    SALUS_CUDA_OPTIONAL_DRIVER_ENTRIES(SALUS_CUDA_ENTRY_NAME)};
#undef SALUS_CUDA_ENTRY_NAME

// cuGetProcAddress as declared by CUDA 12+ headers (the _v2 ABI with a query-result out-param).
using GetProcAddressFn = CUresult (*)(const char* symbol, void** pfn, int cuda_version,
                                      cuuint64_t flags, CUdriverProcAddressQueryResult* status);

// Opens libcuda.so.1 and resolves every entry. Throws NotSupported naming the library or the
// first required symbol that cannot be had (no driver, or a driver older than kDriverApiVersion);
// an optional one that cannot be had stays null.
[[nodiscard]] DriverApi load_driver_api();

// Resolves every entry through `get_proc` (the loader's second half, separate so that tests can
// check which names and versions are asked for). `library` is stored in the table.
[[nodiscard]] DriverApi resolve_driver_api(GetProcAddressFn get_proc,
                                           std::shared_ptr<void> library);

// The driver's name for `code` ("CUDA_ERROR_OUT_OF_MEMORY"), or "CUDA_ERROR_<code>" when the
// table has no cuGetErrorName or the driver does not know the code.
[[nodiscard]] std::string error_name(const DriverApi& api, CUresult code);

// The exception for a failed driver call: call() is the entry point, status() the error name.
[[nodiscard]] DeviceError driver_error(const DriverApi& api, std::string_view call, CUresult code,
                                       const std::string& detail = {});

inline void check(const DriverApi& api, std::string_view call, CUresult code) {
  if (code != CUDA_SUCCESS) throw driver_error(api, call, code);
}

}  // namespace salus::cuda

// Calls a driver entry through `api` and throws driver_error naming it on failure. A macro only so
// that the reported name is the base name of the very member that was called.
#define SALUS_CU(api, fn, ...) ::salus::cuda::check((api), #fn, (api).fn(__VA_ARGS__))
