#include "cuda/os_handles.hpp"

#include <fmt/format.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <system_error>

#include "salus/error.hpp"

namespace salus::sim {

void throw_errno(const char* syscall, int err, std::string_view context) {
  const char* name = ::strerrorname_np(err);
  throw DeviceError(syscall, name ? name : fmt::format("errno {}", err), err,
                    context.empty()
                        ? std::system_category().message(err)
                        : fmt::format("{}: {}", context, std::system_category().message(err)));
}

UniqueFd& UniqueFd::operator=(UniqueFd&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(other.fd_, -1);
  }
  return *this;
}

UniqueFd::~UniqueFd() {
  if (fd_ >= 0) ::close(fd_);
}

AddressRange& AddressRange::operator=(AddressRange&& other) noexcept {
  if (this != &other) {
    if (bytes_ != 0) ::munmap(reinterpret_cast<void*>(base_), bytes_);
    base_ = std::exchange(other.base_, 0);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

AddressRange::~AddressRange() {
  // munmap of a range we own only fails on invalid arguments, which the constructor rules out.
  if (bytes_ != 0) ::munmap(reinterpret_cast<void*>(base_), bytes_);
}

}  // namespace salus::sim
