// The ledger's upkeep: pages behind work, zeroing for another user, idle pages, its reports.
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <thread>

#include "daemon/page_ledger.hpp"

namespace salus::daemon {

std::vector<std::uint64_t> PageLedger::settle_fences(SessionId id, const Holder& h, int device,
                                                     std::vector<std::uint64_t> ids) {
  // A page given back behind another process's work goes on once that work has completed, not
  // behind it: a fence that never completes (a client's, crafted) would stall its next holder's
  // stream for ever. Read under the lock, waited for without it.
  std::vector<std::pair<std::uint64_t, PageBank::FencePtr>> fenced;
  {
    std::lock_guard lock(mu_);
    for (const std::uint64_t page : ids) {
      PageBank::FencePtr f = bank(device).fence_of(page);
      if (f && f->opened && f->from != id) fenced.emplace_back(page, std::move(f));
    }
  }
  if (fenced.empty()) return ids;
  const auto closing = [&] {
    std::lock_guard lock(mu_);
    return h.closing;
  };
  std::map<const PageBank::Fence*, bool> completed;  // each distinct fence, waited for once
  for (const auto& [page, f] : fenced) {
    if (completed.contains(f.get())) continue;
    const auto deadline = f->given_at + options_.fence_wait;
    auto pause = std::chrono::microseconds(20);
    bool done = false;
    while (!(done = f->opened->query()) && Clock::now() < deadline && !closing()) {
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::microseconds(1000));
    }
    completed[f.get()] = done;
    if (!done) {
      spdlog::warn(
          "session {}: pages given back by session {} behind work that has not completed "
          "in {} ms are withheld until it does (or that process exits)",
          id, f->from, options_.fence_wait.count());
    }
  }
  std::lock_guard lock(mu_);
  for (const auto& [page, f] : fenced) {
    if (completed[f.get()]) {
      bank(device).set_fence(page,
                             nullptr);  // settled: nothing left for the next holder to wait for
    } else {
      bank(device).withhold(page, id);
      std::erase(ids, page);
    }
  }
  return ids;
}

void PageLedger::release_completed_withheld() {
  std::vector<std::pair<std::uint64_t, PageBank::FencePtr>> withheld;
  std::vector<std::size_t> device_of;
  {
    std::lock_guard lock(mu_);
    for (std::size_t d = 0; d < banks_.size(); ++d) {
      for (auto& entry : banks_[d]->withheld()) {
        withheld.push_back(std::move(entry));
        device_of.push_back(d);
      }
    }
  }
  if (withheld.empty()) return;
  std::vector<bool> done(withheld.size());
  for (std::size_t i = 0; i < withheld.size(); ++i) {
    const PageBank::FencePtr& f = withheld[i].second;
    done[i] = !f || !f->opened || f->opened->query();
  }
  {
    std::lock_guard lock(mu_);
    for (std::size_t i = 0; i < withheld.size(); ++i) {
      if (done[i]) banks_[device_of[i]]->release_withheld(withheld[i].first);
    }
  }
  pages_back_.notify_all();
}

void PageLedger::scrub_for(SessionId id, uid_t uid, int device,
                           const std::vector<std::uint64_t>& ids) {
  // What to zero, and after what: read under the lock, queued without it.
  std::vector<std::uint64_t> zero;
  std::vector<Scrubber::Page> pages;
  PageBank& b = bank(device);
  {
    std::lock_guard lock(mu_);
    zero = b.of_another_user(ids, uid);
    for (const std::uint64_t page : zero) pages.push_back({b.chunk_of(page), b.fence_of(page)});
  }
  PageBank::FencePtr zeroed;
  if (!pages.empty()) {
    try {
      zeroed = scrubber_.scrub(device, pages, page_bytes_);
    } catch (...) {
      // Not one page goes out unzeroed: the grant goes back, the pages' fences as they were (a
      // zeroing queued before the failure only adds to what their next holder finds done).
      {
        std::lock_guard lock(mu_);
        if (b.all_held_by(id, ids)) b.take_back(ids, remote::GiveFence::untouched);
      }
      pages_back_.notify_all();
      throw;
    }
  }
  std::lock_guard lock(mu_);
  for (const std::uint64_t page : zero) b.set_fence(page, zeroed);
  b.set_user(ids, id, uid);
}

std::size_t PageLedger::release_idle_pages() {
  scrubber_.recycle_completed();
  release_completed_withheld();
  if (options_.idle_release.count() == 0) return 0;
  std::vector<ChunkHandle> idle;
  {
    std::lock_guard lock(mu_);
    const auto now = PageBank::Clock::now();
    for (const auto& b : banks_) {
      std::vector<ChunkHandle> chunks = b->take_idle(now, options_.idle_release);
      idle.insert(idle.end(), chunks.begin(), chunks.end());
    }
  }
  // The driver's calls without the lock: grants and give-backs go on meanwhile.
  for (const ChunkHandle chunk : idle) {
    try {
      scrubber_.forget(chunk);  // its mapping for zeroing, if it had one
      backend_->release_chunk(chunk);
    } catch (const std::exception& e) {
      spdlog::error("releasing an idle page failed: {}", e.what());
    }
  }
  if (!idle.empty()) spdlog::debug("{} idle page(s) went back to the driver", idle.size());
  return idle.size();
}

std::string PageLedger::inconsistency() const {
  std::lock_guard lock(mu_);
  for (std::size_t d = 0; d < banks_.size(); ++d) {
    if (std::string why = banks_[d]->inconsistency(); !why.empty()) {
      return fmt::format("device {}: {}", d, why);
    }
  }
  return "";
}

DeviceUse PageLedger::device_use(int device) const {
  std::lock_guard lock(mu_);
  return banks_.at(static_cast<std::size_t>(device))->use();
}

std::string PageLedger::device_table(const std::vector<std::string>& free_now) const {
  std::lock_guard lock(mu_);
  // fenced: pages whose last holder's work may still run; behind work: pages given back
  // behind queued work (an interprocess event) since the start.
  std::string out =
      fmt::format("{:<7} {:>10} {:>14} {:>14} {:>14} {:>8} {:>12} {:>9}\n", "device", "pages",
                  "granted MiB", "peak MiB", "capacity MiB", "fenced", "behind work", "withheld");
  for (std::size_t d = 0; d < banks_.size(); ++d) {
    const PageBank& b = *banks_[d];
    out += fmt::format("{:<7} {:>10} {:>14.1f} {:>14.1f} {:>14.1f} {:>8} {:>12} {:>9}\n", d,
                       b.granted_pages(), b.granted_pages() * page_bytes_ / 1048576.0,
                       b.peak_granted_pages() * page_bytes_ / 1048576.0,
                       b.capacity_pages() * page_bytes_ / 1048576.0, b.fenced_pages(),
                       b.fenced_returns(), b.withheld_pages());
  }
  // What the driver's memory is: the daemon's capacity came from what was free at its start
  // less the reserve; pages it made and keeps; pages idle long enough went back; and what the
  // device has free now, left to every other program (and to the daemon's next pages).
  out += fmt::format("\n{:<7} {:>18} {:>12} {:>10} {:>14} {:>18}\n", "gpu", "free at start MiB",
                     "reserve MiB", "made MiB", "released idle", "left to others MiB");
  for (std::size_t d = 0; d < banks_.size(); ++d) {
    const PageBank& b = *banks_[d];
    out +=
        fmt::format("{:<7} {:>18.1f} {:>12.1f} {:>10.1f} {:>14} {:>18}\n", d,
                    devices_[d].free_at_start / 1048576.0, options_.reserve_bytes / 1048576.0,
                    b.made_pages() * page_bytes_ / 1048576.0, b.released_idle_pages(), free_now[d]);
  }
  return out;
}

std::map<SessionId, PageLedger::Holding> PageLedger::holdings() const {
  std::lock_guard lock(mu_);
  std::map<SessionId, Holding> out;
  for (const auto& [id, h] : holders_.all()) {
    out.emplace(id, Holding{held_by(id), holders_.limit_bytes(h), h.closed_at});
  }
  return out;
}

}  // namespace salus::daemon
