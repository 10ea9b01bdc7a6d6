#include "daemon/scrubber.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <cerrno>

namespace salus::daemon {

Scrubber::Scrubber(std::shared_ptr<DeviceBackend> backend)
    : backend_(std::move(backend)), fences_(backend_) {}

Scrubber::~Scrubber() {
  try {
    for (const auto& [device, stream] : streams_) backend_->synchronize_stream(stream);
    for (const auto& [chunk, m] : mappings_) {
      backend_->unmap(m.va, m.bytes);
      backend_->free_address(m.va, m.bytes);
    }
    for (const auto& [device, stream] : streams_) backend_->destroy_stream(stream);
  } catch (const std::exception& e) {
    spdlog::error("salusd's page zeroing did not end cleanly: {}", e.what());
  }
}

StreamHandle Scrubber::stream_of(int device) {
  {
    std::lock_guard lock(mu_);
    if (const auto it = streams_.find(device); it != streams_.end()) return it->second;
  }
  const StreamHandle made = backend_->create_stream(device, 0);
  StreamHandle kept{};
  {
    std::lock_guard lock(mu_);
    kept = streams_.emplace(device, made).first->second;
  }
  if (kept != made) backend_->destroy_stream(made);  // another thread's came first
  return kept;
}

Scrubber::Mapping Scrubber::mapping_of(int device, ChunkHandle chunk, std::size_t bytes) {
  {
    std::lock_guard lock(mu_);
    if (const auto it = mappings_.find(chunk.value); it != mappings_.end()) return it->second;
  }
  // One thread at a time zeroes a given page (its grant's), so nobody maps it meanwhile.
  const DevicePtr va = backend_->reserve_address(bytes, 0);
  try {
    backend_->map(va, bytes, chunk, 0);
    const std::array<AccessGrant, 1> grant{{{device, Access::read_write}}};
    backend_->set_access(va, bytes, grant);
  } catch (...) {
    try {
      backend_->unmap(va, bytes);
    } catch (const std::exception&) {
      // never mapped
    }
    backend_->free_address(va, bytes);
    throw;
  }
  const Mapping m{device, va, bytes};
  std::lock_guard lock(mu_);
  mappings_.emplace(chunk.value, m);
  return m;
}

PageBank::FencePtr Scrubber::scrub(int device, const std::vector<Page>& pages,
                                   std::size_t bytes) {
  const StreamHandle stream = stream_of(device);
  std::vector<const PageBank::Fence*> waited;  // distinct: pages given back together share one
  for (const Page& page : pages) {
    const PageBank::Fence* after = page.after.get();
    if (after == nullptr || std::find(waited.begin(), waited.end(), after) != waited.end()) {
      continue;
    }
    waited.push_back(after);
    // The last holder's work on the page first (the fence opened when it came back: check_fence).
    // It may be a zeroing's fence of ours (CUDA opens no event in the process that exported it).
    SharedEvent shared;
    shared.fd = after->fd.get();
    shared.handle = after->entry.handle;
    const std::shared_ptr<const Event> last_work = fences_.open(device, shared);
    backend_->stream_wait_event(stream, last_work->handle(), device);
  }
  for (const Page& page : pages) {
    backend_->fill_async(mapping_of(device, page.chunk, bytes).va, 0, bytes, stream);
  }
  remote::FencePool::Fence& done = fences_.acquire(device);
  done.event->record(stream);
  auto fence = std::make_shared<PageBank::Fence>();
  fence->entry.handle = done.shared.handle;
  if (done.shared.fd >= 0) {
    fence->fd = remote::UniqueFd(::fcntl(done.shared.fd, F_DUPFD_CLOEXEC, 0));
    if (fence->fd.get() < 0) {
      throw DeviceError("fcntl", "SALUSD_FDS", errno,
                        fmt::format("salusd could not duplicate a fence's descriptor: errno {}",
                                    errno));
    }
  }
  std::lock_guard lock(mu_);
  in_flight_.push_back(&done);
  scrubbed_ += pages.size();
  return fence;
}

void Scrubber::forget(ChunkHandle chunk) {
  Mapping m;
  StreamHandle stream{};
  {
    std::lock_guard lock(mu_);
    const auto it = mappings_.find(chunk.value);
    if (it == mappings_.end()) return;
    m = it->second;
    mappings_.erase(it);
    stream = streams_.at(m.device);
  }
  backend_->synchronize_stream(stream);  // no zeroing of it may still be queued
  backend_->unmap(m.va, m.bytes);
  backend_->free_address(m.va, m.bytes);
}

void Scrubber::recycle_completed() {
  std::vector<remote::FencePool::Fence*> flying;
  {
    std::lock_guard lock(mu_);
    flying.swap(in_flight_);
  }
  std::vector<remote::FencePool::Fence*> still;
  for (remote::FencePool::Fence* f : flying) {
    if (f->event->query()) {
      fences_.recycle(*f);
    } else {
      still.push_back(f);
    }
  }
  std::lock_guard lock(mu_);
  in_flight_.insert(in_flight_.end(), still.begin(), still.end());
}

std::uint64_t Scrubber::scrubbed() const {
  std::lock_guard lock(mu_);
  return scrubbed_;
}

}  // namespace salus::daemon
