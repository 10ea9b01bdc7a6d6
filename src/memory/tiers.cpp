#include "waits/blocking.hpp"
#include "memory/tiers.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <tuple>

#include "log/log.hpp"

namespace salus::memory {

namespace {
int link_class(LinkKind kind) {
  switch (kind) {
    case LinkKind::self:
    case LinkKind::nvlink:
      return 0;
    case LinkKind::pcie:
      return 1;
    case LinkKind::none:
      break;
  }
  return 2;
}
}  // namespace

std::vector<std::vector<Lender>> rank_lenders(const DeviceBackend& backend) {
  const int count = backend.device_count();
  std::vector<std::vector<Lender>> ranked(static_cast<std::size_t>(count));
  for (int d = 0; d < count; ++d) {
    auto& mine = ranked[static_cast<std::size_t>(d)];
    for (int peer = 0; peer < count; ++peer) {
      if (peer == d) continue;
      const PeerLink link = backend.peer_link(d, peer);
      if (link.can_access) mine.push_back({peer, link});
    }
    std::stable_sort(mine.begin(), mine.end(), [](const Lender& a, const Lender& b) {
      return std::tuple(link_class(a.link.kind), a.link.performance_rank, -a.link.bandwidth_gbps) <
             std::tuple(link_class(b.link.kind), b.link.performance_rank, -b.link.bandwidth_gbps);
    });
  }
  return ranked;
}

Tiers::Tiers(DeviceBackend& backend, HarvestOptions options)
    : backend_(backend), options_(options), lenders_(rank_lenders(backend)) {
  if (options_.move_batch_pages == 0) {
    throw InvalidArgument("HarvestOptions::move_batch_pages must be at least 1");
  }
  try {
    host_.emplace(backend, Location::host(), backend.granularity(Location::host()),
                  options.host_limit_bytes);
  } catch (const NotSupported&) {
    // A CUDA driver without host VMM chunks: peers are the only tier below a device.
    if (options_.spill == SpillPolicy::host_only) throw;
  }
}

void Tiers::add_device(PageSource& pool) {
  device_pools_.push_back(&pool);
}

bool Tiers::fits(int device, const PageSource& pool) const {
  // Pages are mapped into the device's ranges one granule at a time.
  return pool.page_bytes() == device_pools_.at(static_cast<std::size_t>(device))->page_bytes();
}

const std::vector<Lender>& Tiers::lenders(int device) const {
  return lenders_.at(static_cast<std::size_t>(device));
}

PageSource& Tiers::pool(Location where) {
  if (where.is_host()) {
    if (!host_) throw NotSupported("host memory chunks: the backend does not offer them here");
    return *host_;
  }
  if (where.index < 0 || where.index >= static_cast<int>(device_pools_.size())) {
    throw InvalidArgument(fmt::format("{} does not exist (the backend has {} devices)",
                                      to_string(where), device_pools_.size()));
  }
  return *device_pools_[static_cast<std::size_t>(where.index)];
}

std::size_t Tiers::reserve_bytes(int device) const {
  if (options_.lend_reserve_bytes) return *options_.lend_reserve_bytes;
  return device_pools_.at(static_cast<std::size_t>(device))->limit_bytes() / 8;
}

std::size_t Tiers::borrow(int device, std::size_t count, std::vector<Page>& out) {
  std::size_t got = 0;
  if (options_.spill == SpillPolicy::peer_then_host) {
    for (const Lender& lender : lenders(device)) {
      if (got == count) break;
      PageSource& peer = pool(Location::gpu(lender.device));
      if (fits(device, peer)) got += peer.lend(count - got, reserve_bytes(lender.device), out);
    }
  }
  if (options_.spill != SpillPolicy::none && got < count && host_ && fits(device, *host_)) {
    got += host_->lend(count - got, 0, out);
  }
  return got;
}

std::size_t Tiers::borrow_from(int device, Location where, std::size_t count,
                               std::vector<Page>& out) {
  if (where == Location::gpu(device)) return pool(where).acquire(count, out);
  return pool(where).lend(count, 0, out);
}

void Tiers::give_back(int device, Page page) {
  if (page.where == Location::gpu(device)) {
    pool(page.where).put(std::move(page));
  } else {
    pool(page.where).take_back(std::move(page));
  }
}

void Tiers::give_back(int device, std::vector<Page>& pages) {
  for (Page& page : pages) give_back(device, std::move(page));
  pages.clear();
}

void Tiers::set_observer(std::function<void(const MoveRecord&)> observer) {
  auto shared =
      observer ? std::make_shared<const std::function<void(const MoveRecord&)>>(std::move(observer))
               : nullptr;
  std::lock_guard lock(observer_mu_);
  observer_ = std::move(shared);
}

void Tiers::report(const MoveRecord& record) {
  std::shared_ptr<const std::function<void(const MoveRecord&)>> observer;
  {
    std::lock_guard lock(observer_mu_);
    observer = observer_;
  }
  if (!observer) return;
  try {
    (*observer)(record);
  } catch (const std::exception& e) {
    log::error("move observer threw: {}", e.what());
  }
}

void Tiers::notify_safe_point() {
  {
    std::lock_guard lock(safe_mu_);
    ++safe_points_;
  }
  safe_cv_.notify_all();
}

std::uint64_t Tiers::safe_points() const {
  std::lock_guard lock(safe_mu_);
  return safe_points_;
}

bool Tiers::wait_safe_point(std::chrono::steady_clock::time_point deadline, std::uint64_t seen) {
  std::unique_lock lock(safe_mu_);
  if (safe_points_ == seen) waits::before_blocking();
  return safe_cv_.wait_until(lock, deadline, [&] { return safe_points_ != seen; });
}

}  // namespace salus::memory
