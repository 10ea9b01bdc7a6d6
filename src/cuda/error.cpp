#include "salus/error.hpp"

#include <fmt/format.h>

namespace salus {

const char* to_string(Errc code) noexcept {
  switch (code) {
    case Errc::invalid_argument: return "invalid argument";
    case Errc::out_of_memory: return "out of memory";
    case Errc::device_error: return "device error";
    case Errc::not_supported: return "not supported";
    case Errc::unknown_job: return "unknown job";
    case Errc::cancelled: return "cancelled";
  }
  return "unknown error";
}

Error::Error(Errc code, const std::string& message) : std::runtime_error(message), code_(code) {}

InvalidArgument::InvalidArgument(const std::string& message)
    : Error(Errc::invalid_argument, message) {}

NotSupported::NotSupported(const std::string& message)
    : Error(Errc::not_supported, fmt::format("not supported: {}", message)) {}

UnknownJob::UnknownJob(JobId job)
    : Error(Errc::unknown_job,
            fmt::format("unknown job {}: never registered or already released", job.value)),
      job_(job) {}

DeviceError::DeviceError(std::string call, std::string status, int status_code,
                         const std::string& detail)
    : Error(Errc::device_error,
            fmt::format("{} failed: {} ({}){}{}", call, status, status_code,
                        detail.empty() ? "" : ": ", detail)),
      call_(std::move(call)),
      status_(std::move(status)),
      status_code_(status_code) {}

DeviceError DeviceError::out_of_memory(std::string call, const std::string& detail) {
  return {std::move(call), "CUDA_ERROR_OUT_OF_MEMORY", kOutOfMemoryCode, detail};
}

namespace {
std::string describe(const OutOfMemoryInfo& i) {
  return fmt::format(
      "out of memory: job {} ('{}') asked for {} bytes on device {}: {}; job holds {} bytes{}, "
      "device has {} bytes live of {} bytes it may hold{}",
      i.job.value, i.job_name, i.requested_bytes, i.device, i.reason, i.job_in_use_bytes,
      i.job_limit_bytes ? fmt::format(" (limit {})", i.job_limit_bytes) : std::string{},
      i.device_in_use_bytes, i.device_limit_bytes,
      i.waited.count() > 0
          ? fmt::format("; it waited {} ms for other iterations to end first", i.waited.count())
          : std::string{});
}
}  // namespace

OutOfMemory::OutOfMemory(OutOfMemoryInfo info)
    : Error(Errc::out_of_memory, describe(info)), info_(std::move(info)) {}

}  // namespace salus
