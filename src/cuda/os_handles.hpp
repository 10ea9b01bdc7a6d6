// Small owners of operating-system handles (a file descriptor, a range of the address space) and
// failed system calls as errors: what the simulated backend, the daemon and its clients share,
// without the simulator itself.
#pragma once

#include <cstddef>
#include <string_view>
#include <utility>

#include "salus/device.hpp"

namespace salus::sim {

// A failed syscall as a DeviceError: call = the syscall, status = errno's name, detail = its text.
[[noreturn]] void throw_errno(const char* syscall, int err, std::string_view context = {});

// Owns a file descriptor.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) noexcept : fd_(fd) {}
  UniqueFd(UniqueFd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept;
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd();
  [[nodiscard]] int get() const noexcept { return fd_; }

 private:
  int fd_ = -1;
};

// Owns a range of the process address space (whatever is mapped there): munmap on destruction.
class AddressRange {
 public:
  AddressRange() = default;
  AddressRange(DevicePtr base, std::size_t bytes) noexcept : base_(base), bytes_(bytes) {}
  AddressRange(AddressRange&& other) noexcept
      : base_(std::exchange(other.base_, 0)), bytes_(std::exchange(other.bytes_, 0)) {}
  AddressRange& operator=(AddressRange&& other) noexcept;
  AddressRange(const AddressRange&) = delete;
  AddressRange& operator=(const AddressRange&) = delete;
  ~AddressRange();
  [[nodiscard]] DevicePtr base() const noexcept { return base_; }
  [[nodiscard]] std::size_t bytes() const noexcept { return bytes_; }
  [[nodiscard]] DevicePtr end() const noexcept { return base_ + bytes_; }

 private:
  DevicePtr base_ = 0;
  std::size_t bytes_ = 0;
};

}  // namespace salus::sim
