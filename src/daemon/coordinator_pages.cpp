// The coordinator's page records, routed to its PageLedger: a take on a worker of the session
// (it may wait), a give-back with its fence checked first; and the status table.
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "daemon/coordinator.hpp"
#include "daemon/session.hpp"

namespace salus::daemon {

using remote::MessageType;

void Coordinator::on_take_pages(const std::shared_ptr<Session>& s, const remote::Record& record) {
  const auto want = remote::body_as<remote::PageCount>(record);
  if (want.device < 0 || want.device >= pages_.device_count()) {
    throw InvalidArgument(fmt::format("take_pages: device {} does not exist ({} devices)",
                                      want.device, pages_.device_count()));
  }
  if (want.count == 0 || want.count > remote::kMaxPagesPerBatch) {
    throw InvalidArgument(fmt::format("take_pages: {} pages (1 to {} a batch)", want.count,
                                      remote::kMaxPagesPerBatch));
  }
  const std::uint64_t seq = record.header.seq;
  const double asked_us = trace_->micros(std::chrono::steady_clock::now());
  // May wait for other processes to give pages back: not on the connection's reader.
  s->spawn([this, s, want, seq, asked_us] {
    try {
      const PageBank::Batch batch = pages_.take(s->id, want.device, want.count, asked_us);
      std::vector<int> fds;
      for (const auto& fd : batch.fds) fds.push_back(fd.get());
      const remote::PagesHead head{want.device, static_cast<std::uint32_t>(batch.entries.size()),
                                   static_cast<std::uint32_t>(batch.fences.size()), 0};
      s->send(remote::encode_pages(seq, head, batch.entries, batch.fences), fds);
    } catch (const std::exception& e) {
      fail(*s, seq, e);
    }
  });
}

namespace {

// What a give-back's fence is, as the bank keeps it; null when the pages are not fenced.
std::shared_ptr<PageBank::Fence> fence_of(SessionId from, remote::GiveFence mode, const remote::FenceEntry& entry,
                            std::vector<remote::UniqueFd>& fds) {
  const std::size_t carried = fds.size();
  const bool with_fd = mode == remote::GiveFence::fenced && entry.fd_index >= 0;
  if (with_fd && entry.fd_index != 0) {
    throw remote::ProtocolError(
        fmt::format("give_pages: the fence names descriptor {} of {}", entry.fd_index, carried));
  }
  if (carried != (with_fd ? 1u : 0u)) {
    throw remote::ProtocolError(fmt::format(
        "give_pages carried {} descriptors, its fence {}", carried, with_fd ? "one" : "none"));
  }
  if (mode != remote::GiveFence::fenced) return nullptr;
  auto fence = std::make_shared<PageBank::Fence>();
  fence->entry = entry;
  fence->from = from;
  if (with_fd) fence->fd = std::move(fds.front());
  return fence;
}

}  // namespace

void Coordinator::on_give_pages(Session& s, remote::Received& received) {
  const remote::Record& record = received.record;
  std::vector<std::uint64_t> ids;
  remote::FenceEntry entry;
  const auto head = remote::give_body(record, ids, entry);
  const std::shared_ptr<PageBank::Fence> fence = fence_of(s.id, head.fence, entry, received.fds);
  if (fence && head.device >= 0 && head.device < pages_.device_count()) {
    // Before the ledger: it opens the event, which the ledger asks later (settle_fences).
    fence->opened = check_fence(backend_, head.device, *fence, "give_pages");
    fence->given_at = std::chrono::steady_clock::now();
  }
  pages_.give_back(s.id, head.device, ids, head.fence, fence);
  reply(s, MessageType::done, record.header.seq, {});
}

std::string Coordinator::inconsistency() const { return pages_.inconsistency(); }

DeviceUse Coordinator::device_use(int device) const { return pages_.device_use(device); }

std::size_t Coordinator::release_idle_pages() { return pages_.release_idle_pages(); }

std::string Coordinator::status_table(std::optional<SessionId> asking) const {
  // What each device has free now, asked of the driver before any lock is taken.
  std::vector<std::string> free_now;
  for (int d = 0; d < backend_->device_count(); ++d) {
    try {
      free_now.push_back(fmt::format("{:.1f}", backend_->free_memory(d) / 1048576.0));
    } catch (const std::exception& e) {
      spdlog::warn("device {}: its free memory is unknown: {}", d, e.what());
      free_now.emplace_back("?");
    }
  }
  std::string out = fmt::format("policy {}  page {} KiB  spill {}  reclaim {}  zeroed for "
                                "another user {}\n\n",
                                runtime_->policy(), page_bytes_ / 1024,
                                options_.spill == remote::Spill::host ? "host" : "none",
                                options_.reclaim ? "ask" : "never", pages_.zeroed_pages());
  out += pages_.device_table(free_now);
  // Who holds what (the ledger's lock), then the sessions (the table's): two moments a status
  // apart, as the jobs' own state (from the runtime, after both) always was.
  return out + sessions_.status(asking, pages_.holdings(), page_bytes_);
}

}  // namespace salus::daemon
