#include "remote/remote_backend.hpp"

#include <fmt/format.h>

#include <algorithm>

namespace salus::remote {
namespace {

// What the wrapped backend's do_address_granularity says (not public): its smallest page.
std::size_t smallest_granularity(DeviceBackend& backend) {
  std::size_t smallest = backend.granularity(Location::gpu(0));
  for (int d = 1; d < backend.device_count(); ++d) {
    smallest = std::min(smallest, backend.granularity(Location::gpu(d)));
  }
  try {
    smallest = std::min(smallest, backend.granularity(Location::host()));
  } catch (const NotSupported&) {
    // No host chunks on this backend.
  }
  return smallest;
}

}  // namespace

RemoteBackend::RemoteBackend(std::shared_ptr<DeviceBackend> local,
                             std::shared_ptr<DaemonLink> link)
    : local_(std::move(local)),
      link_(std::move(link)),
      address_granularity_(smallest_granularity(*local_)),
      page_bytes_(link_->welcome().page_bytes),
      pages_(local_, link_, page_bytes_) {
  if (page_bytes_ != local_->granularity(Location::gpu(0))) {
    throw InvalidArgument(fmt::format(
        "salusd pages are {} bytes, this process's device granularity is {}: they must agree",
        page_bytes_, local_->granularity(Location::gpu(0))));
  }
}

RemoteBackend::~RemoteBackend() = default;

ChunkHandle RemoteBackend::do_create_chunk(Location where, std::size_t bytes) {
  if (where.is_host()) return local_->create_chunk(where, bytes);  // the host tier is our own
  if (bytes != page_bytes_) {
    throw NotSupported(fmt::format(
        "create_chunk: a process connected to salusd takes GPU memory in pages of {} bytes, not "
        "{}",
        page_bytes_, bytes));
  }
  return pages_.take(where.index);
}

void RemoteBackend::do_release_chunk(ChunkHandle chunk) {
  // Not the daemon's: a host-tier chunk of our own (or a bad handle, the local backend's to
  // refuse).
  if (!pages_.release(chunk)) local_->release_chunk(chunk);
}

std::shared_ptr<const Event> RemoteBackend::do_take_arrival(ChunkHandle chunk) {
  return pages_.take_arrival(chunk);
}

void RemoteBackend::do_release_chunks_after(std::span<const ChunkHandle> chunks,
                                           std::span<const std::shared_ptr<const Event>> work) {
  pages_.release_after(chunks, work);
}

std::size_t RemoteBackend::give_back(int device) {
  if (device < 0 || device >= local_->device_count()) {
    throw InvalidArgument(
        fmt::format("give_back: device {} of {}", device, local_->device_count()));
  }
  return pages_.give_back(device);
}

}  // namespace salus::remote
