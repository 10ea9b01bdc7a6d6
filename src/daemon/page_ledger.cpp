// The ledger's processes, grants and give-backs (its upkeep: page_ledger_upkeep.cpp).
#include "daemon/page_ledger.hpp"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <limits>

namespace salus::daemon {

PageLedger::PageLedger(std::shared_ptr<DeviceBackend> backend, std::shared_ptr<TraceRecorder> trace,
                       std::size_t page_bytes, const std::vector<Device>& devices,
                       const CoordinatorOptions& options)
    : backend_(std::move(backend)),
      trace_(std::move(trace)),
      page_bytes_(page_bytes),
      options_(options),
      devices_(devices),
      scrubber_(backend_),
      holders_(page_bytes_, options_.process_limit_bytes, options_.exit_wait) {
  for (std::size_t d = 0; d < devices_.size(); ++d) {
    banks_.push_back(std::make_unique<PageBank>(*backend_, static_cast<int>(d), page_bytes_,
                                                devices_[d].capacity_bytes));
  }
}

std::size_t PageLedger::held_by(SessionId id) const {
  std::size_t held = 0;
  for (const auto& b : banks_) held += b->held_by(id);
  return held;
}

void PageLedger::open(SessionId id, pid_t pid, uid_t uid, Hinter hint) {
  std::lock_guard lock(mu_);
  Holder& h = holders_.add(id);
  h.pid = pid;
  h.uid = uid;
  h.hint = std::move(hint);
}

template <class F>
void PageLedger::change(SessionId id, F&& change) {
  std::lock_guard lock(mu_);
  if (Holder* h = holders_.find(id)) change(*h);
}

void PageLedger::name(SessionId id, std::string name) {
  change(id, [&](Holder& h) { h.name = std::move(name); });
}

void PageLedger::job_added(SessionId id, std::uint64_t job, std::size_t limit) {
  change(id, [&](Holder& h) { h.job_limits.emplace(job, limit); });
}

void PageLedger::job_left(SessionId id, std::uint64_t job, const void* key) {
  change(id, [&](Holder& h) {
    h.in_turn.erase(key);
    h.job_limits.erase(job);
  });
}

void PageLedger::turn_began(SessionId id, const void* key) {
  change(id, [&](Holder& h) { h.in_turn.insert(key); });
}

void PageLedger::turn_ended(SessionId id, const void* key) {
  change(id, [&](Holder& h) { h.in_turn.erase(key); });
}

void PageLedger::hung_up(SessionId id) {
  {
    std::lock_guard lock(mu_);
    Holder* h = holders_.find(id);
    if (h == nullptr) return;
    h->closing = true;
    h->closed_at = Clock::now();
  }
  pages_back_.notify_all();
}

std::size_t PageLedger::held_pages(SessionId id) const {
  std::lock_guard lock(mu_);
  return held_by(id);
}

std::vector<ChunkHandle> PageLedger::chunks_held_by(SessionId id) const {
  std::lock_guard lock(mu_);
  std::vector<ChunkHandle> chunks;
  for (const auto& b : banks_) {
    const std::vector<ChunkHandle> held = b->chunks_held_by(id);
    chunks.insert(chunks.end(), held.begin(), held.end());
  }
  return chunks;
}

std::size_t PageLedger::take_back_all(SessionId id) {
  std::size_t all = 0;
  {
    std::lock_guard lock(mu_);
    const Holder* h = holders_.find(id);
    const std::string who = h == nullptr ? std::string() : fmt::format("{} {}", h->name, h->pid);
    for (std::size_t d = 0; d < banks_.size(); ++d) {
      const std::size_t taken = banks_[d]->take_back_all(id);
      // Its exit (waited for before) ended the work its fences stand for.
      banks_[d]->forget_fences_of(id);
      all += taken;
      if (taken > 0) {
        trace_pages(fmt::format("taken back <- {} (gone)", who), static_cast<int>(d),
                    trace_->micros(Clock::now()), taken);
      }
    }
    holders_.erase(id);
  }
  pages_back_.notify_all();
  return all;
}

PageBank::Batch PageLedger::take(SessionId id, int device, std::size_t count, double asked_us) {
  Holder* h = nullptr;  // found at the first grant
  std::vector<std::uint64_t> ids;
  do {  // each round that comes back empty withheld a page: it ends
    ids = grant_or_wait(id, h, device, count);
    if (ids.empty()) throw Error(Errc::out_of_memory, short_reason(id, device));
    ids = settle_fences(id, *h, device, ids);
  } while (ids.empty());
  scrub_for(id, h->uid, device, ids);
  std::lock_guard lock(mu_);
  PageBank::Batch batch = bank(device).export_pages(ids);
  // From the ask to the grant: a span as long as the wait for others' give-backs.
  trace_pages(fmt::format("grant -> {} {}", h->name, h->pid), device, asked_us, ids.size());
  return batch;
}

std::vector<std::uint64_t> PageLedger::grant_or_wait(SessionId id, Holder*& record, int device,
                                                     std::size_t count) {
  std::unique_lock lock(mu_);
  // It stays put: a record goes only once its asks are over (take_back_all).
  if (record == nullptr) record = &holders_.at(id);
  Holder& h = *record;
  count = std::min(count, holders_.room(h, held_by(id)));
  if (count == 0) throw Error(Errc::out_of_memory, holders_.limit_reason(h, held_by(id)));
  // Without reclaims nothing would bring back the spares of a batch: one page an ask, so that a
  // process holds only pages it has used, as processes without Salus hold what they allocated.
  if (!options_.reclaim) return bank(device).grant(id, 1);
  std::vector<std::uint64_t> ids = bank(device).grant(id, count);
  if (!ids.empty()) {
    h.gave_way.reset();
    return ids;
  }
  ++h.asking;
  ids = wait_for_pages(lock, id, h, device, count);
  --h.asking;
  if (!ids.empty()) h.gave_way.reset();
  lock.unlock();
  pages_back_.notify_all();  // the others' reading of who is short changed
  return ids;
}

std::vector<std::uint64_t> PageLedger::wait_for_pages(std::unique_lock<std::mutex>& lock,
                                                      SessionId id, Holder& h, int device,
                                                      std::size_t count) {
  // Short. The wait lasts while another process may still give pages back (its turn's end, its
  // exit), and reclaim_wait after the last moment one could; then, if every process short here
  // is stuck on the others, the one holding the most gives way (fails), so that a job that
  // cannot fit fails alone and the others wait for its pages, not for a clock.
  constexpr auto kReclaimRepeat = std::chrono::milliseconds(50);  // how often the others are asked
  std::vector<std::uint64_t> ids;
  const auto start = Clock::now();
  auto deadline = start + options_.reclaim_wait;
  for (;;) {
    auto now = Clock::now();
    if (h.closing || now - start >= options_.short_wait_limit) break;
    if (holders_.others_may_give_back(id, bank(device), now))
      deadline = now + options_.reclaim_wait;
    if (now >= deadline) {
      if (holders_.gives_way(id, bank(device))) {
        h.gave_way = now;
        break;
      }
      deadline = now + options_.reclaim_wait;  // another gives way first; its pages come back
    }
    // The others are asked again every so often: a process whose jobs were all busy when first
    // asked may have one waiting for its turn now (whose pages may then move to its host memory).
    lock.unlock();
    ask_others_to_give_back(id, device, count);
    lock.lock();
    now = Clock::now();
    const bool granted =
        pages_back_.wait_until(lock, std::min(deadline, now + kReclaimRepeat), [&] {
          if (h.closing) return true;
          ids = bank(device).grant(id, count);
          return !ids.empty();
        });
    if (granted) break;
  }
  return ids;
}

std::string PageLedger::short_reason(SessionId id, int device) const {
  std::lock_guard lock(mu_);
  return holders_.short_reason(id, device, *banks_[static_cast<std::size_t>(device)], options_);
}

void PageLedger::ask_others_to_give_back(SessionId asking, int device, std::size_t pages) {
  std::vector<std::pair<SessionId, Hinter>> holders;
  {
    std::lock_guard lock(mu_);
    holders = holders_.others_holding(asking, bank(device));
  }
  const remote::PageCount want{device, static_cast<std::uint32_t>(pages)};
  const auto record = remote::encode(remote::MessageType::reclaim, 0, want);
  // Never a blocking send: a process that reads nothing (stopped, stuck) would hold this asker,
  // and every later one, on its full queue. Its unread reclaims say the same as this one.
  for (const auto& [id, hint] : holders) {
    bool sent = false;
    try {
      sent = hint(record);
    } catch (const std::exception&) {
      continue;  // gone: its pages come back when its session closes
    }
    if (sent) continue;
    std::lock_guard lock(mu_);
    holders_.hint_dropped(id);
  }
}

void PageLedger::give_back(SessionId id, int device, const std::vector<std::uint64_t>& ids,
                           remote::GiveFence mode, std::shared_ptr<const PageBank::Fence> fence) {
  {
    std::lock_guard lock(mu_);
    if (device < 0 || device >= static_cast<int>(banks_.size())) {
      throw InvalidArgument(fmt::format("give_pages: device {} does not exist", device));
    }
    // All or nothing: one page that is not the sender's refuses the whole batch.
    if (!bank(device).all_held_by(id, ids)) {
      throw InvalidArgument(fmt::format(
          "give_pages: a page of the batch is not held by this process (or is named twice)"));
    }
    const Holder& h = holders_.at(id);
    bank(device).take_back(ids, mode, std::move(fence));
    trace_pages(fmt::format("give back <- {} {}{}", h.name, h.pid,
                            mode == remote::GiveFence::fenced ? " (behind work)" : ""),
                device, trace_->micros(Clock::now()), ids.size());
  }
  pages_back_.notify_all();
}

void PageLedger::trace_pages(const std::string& what, int device, double begin_us,
                             std::size_t pages) {
  const double now_us = trace_->micros(Clock::now());
  trace_->move({what, device, begin_us, now_us, pages, pages * page_bytes_});
  trace_->counter(holders_.counter(device, bank(device), now_us));
}

}  // namespace salus::daemon
