#include "remote/remote_backend.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <exception>

namespace salus::remote {
namespace {

// Pages asked for at once: enough that an iteration's growth makes few round trips, few enough
// that a process does not sit on memory another one waits for (spares go back on reclaim).
constexpr std::uint32_t kFetchBatch = 16;
// Released pages gathered before they go back unasked.
constexpr std::size_t kReturnBatch = 64;

constexpr int kCudaErrorOutOfMemory = 2;

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
      devices_(static_cast<std::size_t>(local_->device_count())),
      fetching_(devices_.size(), false) {
  if (page_bytes_ != local_->granularity(Location::gpu(0))) {
    throw InvalidArgument(fmt::format(
        "salusd pages are {} bytes, this process's device granularity is {}: they must agree",
        page_bytes_, local_->granularity(Location::gpu(0))));
  }
}

RemoteBackend::~RemoteBackend() {
  // Whatever is still held goes back without waiting: the daemon takes back every page of a
  // process that disconnects anyway.
  for (int d = 0; d < static_cast<int>(devices_.size()); ++d) {
    std::vector<std::uint64_t> ids;
    {
      std::lock_guard lock(mu_);
      ids = collect_returns(devices_[static_cast<std::size_t>(d)]);
    }
    send_returns(d, ids, false);
  }
}

ChunkHandle RemoteBackend::do_create_chunk(Location where, std::size_t bytes) {
  if (where.is_host()) return local_->create_chunk(where, bytes);  // the host tier is our own
  if (bytes != page_bytes_) {
    throw NotSupported(fmt::format(
        "create_chunk: a process connected to salusd takes GPU memory in pages of {} bytes, not "
        "{}",
        page_bytes_, bytes));
  }
  return take_page(where.index);
}

ChunkHandle RemoteBackend::take_page(int device) {
  std::unique_lock lock(mu_);
  DevicePages& pages = devices_[static_cast<std::size_t>(device)];
  while (pages.spare.empty()) {
    if (fetching_[static_cast<std::size_t>(device)]) {
      fetched_.wait(lock);  // another thread's batch may serve this one too
      continue;
    }
    fetch(device, pages, lock);
  }
  const ChunkHandle chunk = pages.spare.back();
  pages.spare.pop_back();
  return chunk;
}

// Asks the daemon for a batch and imports it; with `lock` released for the round trip. Throws the
// driver's out-of-memory error when the daemon has nothing to give, as cuMemCreate would.
void RemoteBackend::fetch(int device, DevicePages& pages, std::unique_lock<std::mutex>& lock) {
  fetching_[static_cast<std::size_t>(device)] = true;
  lock.unlock();
  std::vector<std::pair<ChunkHandle, std::uint64_t>> got;
  std::string refusal;
  std::exception_ptr gone;
  try {
    Received reply = link_->call(MessageType::take_pages, PageCount{device, kFetchBatch});
    std::vector<PageEntry> entries;
    (void)list_body<PageCount, PageEntry>(reply.record, entries);
    std::size_t imported = 0;
    try {
      for (const PageEntry& e : entries) {
        if (e.fd_index >= reply.fds.size()) {
          throw ProtocolError(fmt::format("page {} names descriptor {} of {}", e.id, e.fd_index,
                                          reply.fds.size()));
        }
        const SharedChunk shared{reply.fds[e.fd_index].get(), e.offset, page_bytes_};
        got.emplace_back(local_->import_chunk(Location::gpu(device), shared), e.id);
        ++imported;
      }
    } catch (const Error&) {
      // The pages this process could not take are the daemon's again at once.
      std::vector<std::uint64_t> back;
      for (std::size_t i = imported; i < entries.size(); ++i) back.push_back(entries[i].id);
      send_returns(device, back, false);
      if (got.empty()) throw;
    }
  } catch (const Error& e) {
    refusal = e.what();
    gone = !link_->alive() ? std::current_exception() : nullptr;
  }
  lock.lock();
  fetching_[static_cast<std::size_t>(device)] = false;
  fetched_.notify_all();
  if (gone) std::rethrow_exception(gone);  // not an out-of-memory: the daemon is gone
  for (const auto& [chunk, id] : got) {
    pages.spare.push_back(chunk);
    page_of_chunk_.emplace(chunk.value, HeldPage{id, device});
  }
  pages.held += got.size();
  if (!got.empty()) return;
  throw DeviceError("cuMemCreate", "CUDA_ERROR_OUT_OF_MEMORY", kCudaErrorOutOfMemory,
                    fmt::format("salusd has no page for device {}: {}", device,
                                refusal.empty() ? "every page is in use" : refusal));
}

void RemoteBackend::do_release_chunk(ChunkHandle chunk) {
  std::vector<std::uint64_t> ids;
  int device = -1;
  {
    std::lock_guard lock(mu_);
    auto it = page_of_chunk_.find(chunk.value);
    if (it == page_of_chunk_.end()) {
      // Not the daemon's: a host-tier chunk of our own (or a bad handle, the local backend's to
      // refuse).
      local_->release_chunk(chunk);
      return;
    }
    // Our reference goes first; the page is the daemon's again only with the next batch back.
    local_->release_chunk(chunk);
    const std::uint64_t id = it->second.id;
    device = it->second.device;
    page_of_chunk_.erase(it);
    DevicePages& pages = devices_[static_cast<std::size_t>(device)];
    pages.returning.push_back(id);
    if (pages.returning.size() >= kReturnBatch) {
      ids.swap(pages.returning);
      pages.held -= ids.size();
    }
  }
  send_returns(device, ids, false);
}

std::vector<std::uint64_t> RemoteBackend::collect_returns(DevicePages& pages) {
  std::vector<std::uint64_t> ids;
  ids.swap(pages.returning);
  for (const ChunkHandle chunk : pages.spare) {
    auto it = page_of_chunk_.find(chunk.value);
    ids.push_back(it->second.id);
    page_of_chunk_.erase(it);
    local_->release_chunk(chunk);
  }
  pages.spare.clear();
  pages.held -= std::min(pages.held, ids.size());
  return ids;
}

void RemoteBackend::send_returns(int device, const std::vector<std::uint64_t>& ids, bool wait) {
  for (std::size_t at = 0; at < ids.size(); at += kMaxPagesPerBatch) {
    const std::size_t n = std::min<std::size_t>(kMaxPagesPerBatch, ids.size() - at);
    const std::vector<std::byte> body = pack_list(PageCount{device, static_cast<std::uint32_t>(n)},
                                                  std::span(ids).subspan(at, n));
    if (wait) {
      (void)link_->call(MessageType::give_pages, body);
    } else {
      link_->post(MessageType::give_pages, body);
    }
  }
}

std::size_t RemoteBackend::give_back(int device) {
  if (device < 0 || device >= static_cast<int>(devices_.size())) {
    throw InvalidArgument(fmt::format("give_back: device {} of {}", device, devices_.size()));
  }
  std::vector<std::uint64_t> ids;
  {
    std::lock_guard lock(mu_);
    ids = collect_returns(devices_[static_cast<std::size_t>(device)]);
  }
  send_returns(device, ids, true);
  return ids.size();
}

std::size_t RemoteBackend::held_pages(int device) const {
  std::lock_guard lock(mu_);
  return devices_.at(static_cast<std::size_t>(device)).held;
}

}  // namespace salus::remote
