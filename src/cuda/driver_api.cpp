#include "cuda/driver_api.hpp"

#include <dlfcn.h>
#include <fmt/format.h>

#include <string>
#include <utility>

namespace salus::cuda {

namespace {

constexpr const char* kLibraryName = "libcuda.so.1";

// The entry's address. A required entry the driver cannot give is NotSupported naming it; an
// optional one is null when the driver lacks it (or lacks it at kDriverApiVersion), any other
// failure of cuGetProcAddress still an error.
void* resolve_one(GetProcAddressFn get_proc, const char* name, bool optional = false) {
  void* fn = nullptr;
  CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  const CUresult rc = get_proc(name, &fn, kDriverApiVersion, CU_GET_PROC_ADDRESS_DEFAULT, &status);
  if (rc == CUDA_SUCCESS && status == CU_GET_PROC_ADDRESS_SUCCESS && fn != nullptr) return fn;
  const bool absent = status == CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND ||
                      status == CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT;
  if (optional && absent) return nullptr;
  if (status == CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT) {
    throw NotSupported(fmt::format("the CUDA driver is too old for {} (Salus needs driver API {})",
                                   name, kDriverApiVersion));
  }
  throw NotSupported(
      fmt::format("the CUDA driver has no entry point {} (cuGetProcAddress returned {}, status {})",
                  name, static_cast<int>(rc), static_cast<int>(status)));
}

}  // namespace

DriverApi resolve_driver_api(GetProcAddressFn get_proc, std::shared_ptr<void> library) {
  DriverApi api;
  // The driver hands back untyped addresses; the member's type is the ABI of the requested
  // version, which is the contract of cuGetProcAddress.
#define SALUS_CUDA_RESOLVE_ENTRY(name) \
  api.name = reinterpret_cast<decltype(api.name)>(resolve_one(get_proc, #name));
  SALUS_CUDA_DRIVER_ENTRIES(SALUS_CUDA_RESOLVE_ENTRY)
#undef SALUS_CUDA_RESOLVE_ENTRY
#define SALUS_CUDA_RESOLVE_OPTIONAL(name) \
  api.name = reinterpret_cast<decltype(api.name)>(resolve_one(get_proc, #name, true));
  SALUS_CUDA_OPTIONAL_DRIVER_ENTRIES(SALUS_CUDA_RESOLVE_OPTIONAL)
#undef SALUS_CUDA_RESOLVE_OPTIONAL
  api.library = std::move(library);
  return api;
}

DriverApi load_driver_api() {
  // RTLD_LOCAL: libcuda's symbols stay out of the global namespace, where they could shadow or
  // be shadowed by another copy that the application (e.g. PyTorch) loads itself.
  void* raw = ::dlopen(kLibraryName, RTLD_NOW | RTLD_LOCAL);
  if (raw == nullptr) {
    const char* why = ::dlerror();
    throw NotSupported(fmt::format("cannot open the CUDA driver {}: {}", kLibraryName,
                                   why != nullptr ? why : "unknown reason"));
  }
  std::shared_ptr<void> library(raw, [](void* handle) { ::dlclose(handle); });
  // Only cuGetProcAddress comes from dlsym: it knows which versioned symbol (_v2, _ptsz...)
  // corresponds to a base name, which dlsym cannot.
  void* get_proc = ::dlsym(library.get(), "cuGetProcAddress_v2");
  if (get_proc == nullptr) {
    throw NotSupported(fmt::format(
        "the CUDA driver {} has no cuGetProcAddress_v2 (a CUDA 12 or newer driver is needed)",
        kLibraryName));
  }
  return resolve_driver_api(reinterpret_cast<GetProcAddressFn>(get_proc), std::move(library));
}

static_assert(DeviceError::kOutOfMemoryCode == CUDA_ERROR_OUT_OF_MEMORY,
              "DeviceError's out-of-memory code is the driver's");

std::string error_name(const DriverApi& api, CUresult code) {
  const char* name = nullptr;
  if (api.cuGetErrorName != nullptr && api.cuGetErrorName(code, &name) == CUDA_SUCCESS &&
      name != nullptr) {
    return name;
  }
  return fmt::format("CUDA_ERROR_{}", static_cast<int>(code));
}

DeviceError driver_error(const DriverApi& api, std::string_view call, CUresult code,
                         const std::string& detail) {
  return DeviceError(std::string(call), error_name(api, code), static_cast<int>(code), detail);
}

}  // namespace salus::cuda
