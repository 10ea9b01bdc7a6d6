// SimPool: a location's memfd, carved into extents.
#include "cuda/sim_pool.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <iterator>
#include <string>

#include "salus/error.hpp"

namespace salus::sim {
namespace {

UniqueFd make_memfd(const std::string& name, std::size_t bytes) {
  UniqueFd fd{::memfd_create(name.c_str(), MFD_CLOEXEC)};
  if (fd.get() < 0) throw_errno("memfd_create", errno, name);
  // ftruncate leaves the file sparse: untouched simulated memory costs no host memory.
  if (::ftruncate(fd.get(), static_cast<off_t>(bytes)) != 0) throw_errno("ftruncate", errno, name);
  return fd;
}

}  // namespace

SimPool::SimPool(Location where, std::size_t capacity, std::size_t granularity)
    : where_(where),
      fd_(make_memfd(fmt::format("salus-sim-{}", to_string(where)), capacity)),
      capacity_(capacity),
      granularity_(granularity) {
  free_extents_.emplace(0, capacity);
}

std::size_t SimPool::allocate(std::size_t bytes) {
  auto fit = std::find_if(free_extents_.begin(), free_extents_.end(),
                          [bytes](const auto& extent) { return extent.second >= bytes; });
  if (fit == free_extents_.end()) {
    throw DeviceError::out_of_memory("cuMemCreate",
                                     fmt::format("{}: {} bytes requested, {} of {} bytes in use",
                                                 to_string(where_), bytes, used_, capacity_));
  }
  const auto [offset, length] = *fit;
  free_extents_.erase(fit);
  if (length > bytes) free_extents_.emplace(offset + bytes, length - bytes);
  used_ += bytes;
  return offset;
}

void SimPool::release(std::size_t offset, std::size_t bytes) {
  // Punching the hole hands the pages back to the OS, as freeing device memory would.
  const int failed = ::fallocate(fd_.get(), FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                                 static_cast<off_t>(offset), static_cast<off_t>(bytes));
  const int err = failed ? errno : 0;
  used_ -= bytes;
  auto [pos, inserted] = free_extents_.emplace(offset, bytes);
  if (auto next = std::next(pos);
      next != free_extents_.end() && pos->first + pos->second == next->first) {
    pos->second += next->second;
    free_extents_.erase(next);
  }
  if (pos != free_extents_.begin()) {
    if (auto prev = std::prev(pos); prev->first + prev->second == pos->first) {
      prev->second += pos->second;
      free_extents_.erase(pos);
    }
  }
  // The bookkeeping is already consistent; only the memory's return to the OS failed.
  if (err != 0) throw_errno("fallocate", err, "cuMemRelease");
}

}  // namespace salus::sim
