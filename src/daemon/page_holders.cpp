#include "daemon/page_holders.hpp"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <limits>

namespace salus::daemon {

PageHolders::PageHolders(std::size_t page_bytes, std::size_t process_limit_bytes,
                         std::chrono::milliseconds exit_wait)
    : page_bytes_(page_bytes), process_limit_bytes_(process_limit_bytes), exit_wait_(exit_wait) {}

PageHolders::Holder& PageHolders::add(SessionId id) {
  return holders_[id];
}

PageHolders::Holder* PageHolders::find(SessionId id) {
  const auto it = holders_.find(id);
  return it == holders_.end() ? nullptr : &it->second;
}

PageHolders::Holder& PageHolders::at(SessionId id) {
  Holder* h = find(id);
  if (h == nullptr) throw InvalidArgument(fmt::format("no session {}", id));
  return *h;
}

void PageHolders::erase(SessionId id) {
  holders_.erase(id);
}

std::size_t PageHolders::limit_bytes(const Holder& h) const {
  std::size_t limit = process_limit_bytes_;
  std::size_t jobs = 0;
  bool every_job = !h.job_limits.empty();
  for (const auto& [job, bytes] : h.job_limits) {
    every_job = every_job && bytes != 0;
    jobs = bytes > std::numeric_limits<std::size_t>::max() - jobs
               ? std::numeric_limits<std::size_t>::max()
               : jobs + bytes;
  }
  if (every_job && (limit == 0 || jobs < limit)) limit = jobs;
  return limit;
}

std::size_t PageHolders::room(const Holder& h, std::size_t held_pages) const {
  const std::size_t limit = limit_bytes(h);
  if (limit == 0) return std::numeric_limits<std::size_t>::max();
  // A job's limit counts in whole pages: a limit below a page still allows one.
  const std::size_t pages = std::max<std::size_t>(1, (limit + page_bytes_ - 1) / page_bytes_);
  return pages - std::min(pages, held_pages);
}

std::string PageHolders::limit_reason(const Holder& h, std::size_t held_pages) const {
  const std::size_t limit = limit_bytes(h);
  const bool by_jobs = limit != process_limit_bytes_;
  return fmt::format("process {} holds {} bytes, its limit is {} bytes{}", h.pid,
                     held_pages * page_bytes_, limit,
                     by_jobs ? " (the sum of its jobs' limits)" : "");
}

bool PageHolders::others_may_give_back(SessionId id, const PageBank& bank,
                                       Clock::time_point now) const {
  for (const auto& [other, o] : holders_) {
    if (other == id || bank.held_by(other) == 0) continue;
    if (!o.in_turn.empty() && o.asking == 0) return true;
    // Leaving: its pages come back at its exit (the coordinator waits for it), likely soon.
    if (o.closing && o.closed_at && now - *o.closed_at < exit_wait_) return true;
    if (o.gave_way && now - *o.gave_way < exit_wait_) return true;
  }
  return false;
}

bool PageHolders::gives_way(SessionId id, const PageBank& bank) const {
  const std::size_t mine = bank.held_by(id);
  for (const auto& [other, o] : holders_) {
    if (other == id || o.asking == 0) continue;
    const std::size_t theirs = bank.held_by(other);
    if (theirs > mine || (theirs == mine && other > id)) return false;
  }
  return true;
}

std::string PageHolders::short_reason(SessionId id, int device, const PageBank& bank,
                                      const CoordinatorOptions& options) const {
  if (!options.reclaim) {
    return fmt::format(
        "no page of device {} is free (this daemon asks no process to give pages "
        "back: --reclaim never)",
        device);
  }
  const std::size_t mine = bank.held_by(id);
  return fmt::format(
      "no page of device {} is free: this process holds {} of its {} pages and the others hold "
      "{}, which they use (none gave any back, is inside a turn or leaving for {} ms); of the "
      "processes short of pages this one holds the most, so it gives way",
      device, mine, bank.capacity_pages(), bank.granted_pages() - mine,
      options.reclaim_wait.count());
}

std::vector<std::pair<SessionId, PageHolders::Hinter>> PageHolders::others_holding(
    SessionId id, const PageBank& bank) const {
  std::vector<std::pair<SessionId, Hinter>> out;
  for (const auto& [other, o] : holders_) {
    if (other != id && bank.held_by(other) > 0) out.emplace_back(other, o.hint);
  }
  return out;
}

TraceRecorder::Counter PageHolders::counter(int device, const PageBank& bank, double at_us) const {
  TraceRecorder::Counter held{fmt::format("salusd pages gpu{}", device), device, at_us, {}};
  for (const auto& [id, h] : holders_) {
    held.values.emplace_back(fmt::format("{} {}", h.name, h.pid),
                             static_cast<double>(bank.held_by(id)));
  }
  return held;
}

void PageHolders::hint_dropped(SessionId id) {
  Holder* h = find(id);
  if (h != nullptr && h->hints_dropped++ == 0) {
    spdlog::warn(
        "session {}: '{}' pid {} reads no reclaims (stopped?); the others go on "
        "without its pages",
        id, h->name, h->pid);
  }
}

}  // namespace salus::daemon
