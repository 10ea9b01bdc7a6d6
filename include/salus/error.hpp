// Typed errors. Salus never aborts on bad input or a failing driver: every failure is one of
// these exceptions (or, through the C ABI, an error code plus a message).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "salus/export.hpp"
#include "salus/job_id.hpp"

namespace salus {

enum class Errc : std::uint8_t {
  invalid_argument,  // a malformed request: size 0, unknown device, unknown pointer, double free...
  out_of_memory,     // a well-formed request that a budget or the device cannot meet right now
  device_error,      // a device-layer (driver or simulator) call failed
  not_supported,     // a feature this build or backend does not provide
  unknown_job,       // a job id that was never registered or has been released
  cancelled,         // the job was cancelled while the call waited or before it was made
};

[[nodiscard]] SALUS_API const char* to_string(Errc code) noexcept;

class SALUS_API Error : public std::runtime_error {
 public:
  Error(Errc code, const std::string& message);
  [[nodiscard]] Errc code() const noexcept { return code_; }

 private:
  Errc code_;
};

class SALUS_API InvalidArgument : public Error {
 public:
  explicit InvalidArgument(const std::string& message);
};

class SALUS_API NotSupported : public Error {
 public:
  explicit NotSupported(const std::string& message);
};

class SALUS_API UnknownJob : public Error {
 public:
  explicit UnknownJob(JobId job);
  [[nodiscard]] JobId job() const noexcept { return job_; }

 private:
  JobId job_;
};

// A device-layer call failed. `call()` names the driver entry point (e.g. "cuMemMap"), `status()`
// the driver's error name (e.g. "CUDA_ERROR_OUT_OF_MEMORY").
class SALUS_API DeviceError : public Error {
 public:
  DeviceError(std::string call, std::string status, int status_code, const std::string& detail = {});
  [[nodiscard]] const std::string& call() const noexcept { return call_; }
  [[nodiscard]] const std::string& status() const noexcept { return status_; }
  [[nodiscard]] int status_code() const noexcept { return status_code_; }

  // CUDA_ERROR_OUT_OF_MEMORY's value in the driver API. Every backend reports a device with no
  // memory left for a call by it (the simulator and salusd's pages too), so that a caller tells
  // an out-of-memory by its code, not by its name.
  static constexpr int kOutOfMemoryCode = 2;
  // What a backend raises when `call` finds no device memory left; `detail` says why.
  [[nodiscard]] static DeviceError out_of_memory(std::string call, const std::string& detail = {});
  [[nodiscard]] bool is_out_of_memory() const noexcept {
    return status_code_ == kOutOfMemoryCode;
  }

 private:
  std::string call_;
  std::string status_;
  int status_code_;
};

// What was asked for and what stood in the way; the message repeats it in words.
struct OutOfMemoryInfo {
  JobId job;
  std::string job_name;
  int device = 0;
  std::size_t requested_bytes = 0;
  std::size_t job_in_use_bytes = 0;     // everything the job holds, all devices and classes
  std::size_t job_limit_bytes = 0;      // the limit that was hit when it is a job budget, else 0
  std::size_t device_in_use_bytes = 0;  // live bytes on the device
  std::size_t device_limit_bytes = 0;   // physical bytes Salus may hold on the device
  std::string reason;                   // which budget said no
  // How long the allocation waited for the device's other iterations to end before it failed:
  // 0 when it failed at once; RuntimeOptions::allocation_wait_limit when that limit ended it.
  std::chrono::milliseconds waited{0};
};

class SALUS_API OutOfMemory : public Error {
 public:
  explicit OutOfMemory(OutOfMemoryInfo info);
  [[nodiscard]] const OutOfMemoryInfo& info() const noexcept { return info_; }

 private:
  OutOfMemoryInfo info_;
};

}  // namespace salus
