#include "remote/fence_pool.hpp"

#include <unistd.h>

#include <algorithm>
#include <thread>

#include "salus/error.hpp"

namespace salus::remote {

bool wait_for_fence(const Event& fence, std::chrono::steady_clock::time_point until) {
  // Short pauses first: the usual fence is a tail of work about to end.
  auto pause = std::chrono::microseconds(10);
  for (;;) {
    try {
      if (fence.query()) return true;
    } catch (const Error&) {
      return true;  // its process has exited, and its work with it
    }
    const auto now = std::chrono::steady_clock::now();
    if (now >= until) return false;
    std::this_thread::sleep_for(std::min<std::chrono::steady_clock::duration>(pause, until - now));
    pause = std::min(pause * 2, std::chrono::microseconds(200));
  }
}

FencePool::~FencePool() {
  for (const auto& fence : fences_) {
    if (fence->shared.fd >= 0) ::close(fence->shared.fd);
  }
}

FencePool::Fence& FencePool::acquire(int device) {
  {
    std::lock_guard lock(mu_);
    std::vector<Fence*>& idle = idle_[device];
    if (!idle.empty()) {
      Fence* fence = idle.back();
      idle.pop_back();
      return *fence;
    }
  }
  auto fence = std::make_unique<Fence>();
  fence->device = device;
  fence->event = std::make_shared<const Event>(backend_, backend_->create_shareable_event(device));
  fence->shared = backend_->export_event(fence->event->handle());
  std::lock_guard lock(mu_);
  Fence& made = *fences_.emplace_back(std::move(fence));
  by_handle_.emplace(made.shared.handle, &made);
  return made;
}

void FencePool::recycle(Fence& fence) {
  std::lock_guard lock(mu_);
  idle_[fence.device].push_back(&fence);
}

std::shared_ptr<const Event> FencePool::open(int device, const SharedEvent& shared) {
  {
    std::lock_guard lock(mu_);
    const auto own = by_handle_.find(shared.handle);
    if (own != by_handle_.end() && own->second->device == device) {
      ++own_opened_;
      return own->second->event;
    }
  }
  return std::make_shared<const Event>(backend_, backend_->import_event(device, shared));
}

std::size_t FencePool::exported() const {
  std::lock_guard lock(mu_);
  return fences_.size();
}

std::uint64_t FencePool::own_opened() const {
  std::lock_guard lock(mu_);
  return own_opened_;
}

}  // namespace salus::remote
