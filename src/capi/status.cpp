// Statuses, the thread-local last error, version queries.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "capi/capi.hpp"

namespace salus::capi {

namespace {
thread_local std::string last_error;
}  // namespace

void set_last_error(std::string message) {
  last_error = std::move(message);
}

void clear_last_error() {
  last_error.clear();
}

salus_status status_of(Errc code) {
  switch (code) {
    case Errc::invalid_argument: return SALUS_ERROR_INVALID_ARGUMENT;
    case Errc::out_of_memory: return SALUS_ERROR_OUT_OF_MEMORY;
    case Errc::device_error: return SALUS_ERROR_DEVICE;
    case Errc::not_supported: return SALUS_ERROR_NOT_SUPPORTED;
    case Errc::unknown_job: return SALUS_ERROR_UNKNOWN_JOB;
    case Errc::cancelled: return SALUS_ERROR_CANCELLED;
  }
  return SALUS_ERROR_INTERNAL;
}

salus_status invalid(std::string message) {
  set_last_error(std::move(message));
  return SALUS_ERROR_INVALID_ARGUMENT;
}

void require(const void* ptr, const char* what) {
  if (ptr == nullptr) throw InvalidArgument(fmt::format("{} is NULL", what));
}

void require_struct_size(std::size_t given, std::size_t expected, const char* type,
                         const char* call, std::initializer_list<std::size_t> earlier) {
  if (given == expected || std::find(earlier.begin(), earlier.end(), given) != earlier.end()) {
    return;
  }
  throw InvalidArgument(fmt::format(
      "{}: struct_size of the {} is {}, this library's {} is {} bytes{} (call {}_init, or set "
      "struct_size = sizeof({}))",
      call, type, given, type, expected,
      earlier.size() == 0
          ? std::string()
          : fmt::format(" ({} in an earlier version)", fmt::join(earlier, " or ")),
      type, type));
}

}  // namespace salus::capi

extern "C" {

uint32_t salus_c_api_version(void) {
  return (uint32_t{SALUS_C_API_VERSION_MAJOR} << 16) | SALUS_C_API_VERSION_MINOR;
}

const char* salus_version_string(void) {
  return SALUS_VERSION_STRING;
}

const char* salus_last_error(void) {
  return salus::capi::last_error.c_str();
}

const char* salus_status_name(salus_status given) {
  switch (salus::capi::enum_value(given)) {
    case SALUS_OK: return "SALUS_OK";
    case SALUS_ERROR_INVALID_ARGUMENT: return "SALUS_ERROR_INVALID_ARGUMENT";
    case SALUS_ERROR_OUT_OF_MEMORY: return "SALUS_ERROR_OUT_OF_MEMORY";
    case SALUS_ERROR_DEVICE: return "SALUS_ERROR_DEVICE";
    case SALUS_ERROR_NOT_SUPPORTED: return "SALUS_ERROR_NOT_SUPPORTED";
    case SALUS_ERROR_UNKNOWN_JOB: return "SALUS_ERROR_UNKNOWN_JOB";
    case SALUS_ERROR_INTERNAL: return "SALUS_ERROR_INTERNAL";
    case SALUS_ERROR_CANCELLED: return "SALUS_ERROR_CANCELLED";
    default: break;
  }
  return "SALUS_ERROR_UNKNOWN_STATUS";
}

}  // extern "C"
