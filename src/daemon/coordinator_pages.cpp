// The coordinator's pages: grants, give-backs behind work, reclaims, zeroing for another user,
// idle pages and the status table. A session's end: coordinator_exits.cpp.
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>

#include "daemon/coordinator.hpp"
#include "daemon/session.hpp"

namespace salus::daemon {

using remote::MessageType;

namespace {
constexpr auto kReclaimRepeat = std::chrono::milliseconds(50);
// How another user's process and jobs show in the status table (Coordinator::status_table).
constexpr std::string_view kAnotherUser = "(another user)";
}  // namespace

void Coordinator::on_take_pages(const std::shared_ptr<Session>& s, const remote::Record& record) {
  const auto want = remote::body_as<remote::PageCount>(record);
  if (want.device < 0 || want.device >= static_cast<int>(banks_.size())) {
    throw InvalidArgument(fmt::format("take_pages: device {} does not exist ({} devices)",
                                      want.device, banks_.size()));
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
      std::vector<std::uint64_t> ids;
      do {  // each round that comes back empty withheld a page: it ends
        ids = grant_or_wait(*s, want.device, want.count);
        if (ids.empty()) throw Error(Errc::out_of_memory, short_reason(*s, want.device));
        ids = settle_fences(*s, want.device, ids);
      } while (ids.empty());
      scrub_for(*s, want.device, ids);
      PageBank::Batch batch;
      {
        std::lock_guard lock(mu_);
        batch = banks_[static_cast<std::size_t>(want.device)]->export_pages(ids);
        // From the ask to the grant: a span as long as the wait for others' give-backs.
        trace_pages(fmt::format("grant -> {} {}", s->name, s->peer.pid), want.device, asked_us,
                    ids.size());
      }
      std::vector<int> fds;
      for (const auto& fd : batch.fds) fds.push_back(fd.get());
      const remote::PagesHead head{want.device, static_cast<std::uint32_t>(ids.size()),
                                   static_cast<std::uint32_t>(batch.fences.size()), 0};
      s->send(remote::encode_pages(seq, head, batch.entries, batch.fences), fds);
    } catch (const std::exception& e) {
      fail(*s, seq, e);
    }
  });
}

std::vector<std::uint64_t> Coordinator::settle_fences(Session& s, int device,
                                                      std::vector<std::uint64_t> ids) {
  // A page given back behind another process's work goes on once that work has completed, not
  // behind it: a fence that never completes (a client's, crafted) would stall its next holder's
  // stream for ever. Read under the lock, waited for without it.
  std::vector<std::pair<std::uint64_t, PageBank::FencePtr>> fenced;
  PageBank& bank = *banks_[static_cast<std::size_t>(device)];
  {
    std::lock_guard lock(mu_);
    for (const std::uint64_t id : ids) {
      PageBank::FencePtr f = bank.fence_of(id);
      if (f && f->opened && f->from != s.id) fenced.emplace_back(id, std::move(f));
    }
  }
  if (fenced.empty()) return ids;
  const auto closing = [&] {
    std::lock_guard lock(mu_);
    return s.closing;
  };
  std::map<const PageBank::Fence*, bool> completed;  // each distinct fence, waited for once
  for (const auto& [id, f] : fenced) {
    if (completed.contains(f.get())) continue;
    const auto deadline = f->given_at + options_.fence_wait;
    auto pause = std::chrono::microseconds(20);
    bool done = false;
    while (!(done = f->opened->query()) && std::chrono::steady_clock::now() < deadline &&
           !closing()) {
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::microseconds(1000));
    }
    completed[f.get()] = done;
    if (!done) {
      spdlog::warn("session {}: pages given back by session {} behind work that has not completed "
                   "in {} ms are withheld until it does (or that process exits)",
                   s.id, f->from, options_.fence_wait.count());
    }
  }
  std::lock_guard lock(mu_);
  for (const auto& [id, f] : fenced) {
    if (completed[f.get()]) {
      bank.set_fence(id, nullptr);  // settled: nothing left for the next holder to wait for
    } else {
      bank.withhold(id, s.id);
      std::erase(ids, id);
    }
  }
  return ids;
}

void Coordinator::release_completed_withheld() {
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

void Coordinator::scrub_for(Session& s, int device, const std::vector<std::uint64_t>& ids) {
  // What to zero, and after what: read under the lock, queued without it.
  std::vector<std::uint64_t> zero;
  std::vector<Scrubber::Page> pages;
  PageBank& bank = *banks_[static_cast<std::size_t>(device)];
  {
    std::lock_guard lock(mu_);
    zero = bank.of_another_user(ids, s.peer.uid);
    for (const std::uint64_t id : zero) pages.push_back({bank.chunk_of(id), bank.fence_of(id)});
  }
  PageBank::FencePtr zeroed;
  if (!pages.empty()) {
    try {
      zeroed = scrubber_.scrub(device, pages, page_bytes_);
    } catch (...) {
      // Not one page goes out unzeroed: the grant goes back, the pages' fences as they were (a
      // zeroing queued before the failure only adds to what their next holder finds done).
      std::lock_guard lock(mu_);
      if (bank.all_held_by(s.id, ids)) bank.take_back(ids, remote::GiveFence::untouched);
      pages_back_.notify_all();
      throw;
    }
  }
  std::lock_guard lock(mu_);
  for (const std::uint64_t id : zero) bank.set_fence(id, zeroed);
  bank.set_user(ids, s.id, s.peer.uid);
}

std::size_t Coordinator::held_bytes(const Session& s) const {
  std::size_t held = 0;
  for (const auto& b : banks_) held += b->held_by(s.id) * page_bytes_;
  return held;
}

std::size_t Coordinator::limit_bytes(const Session& s) const {
  std::size_t limit = options_.process_limit_bytes;
  std::size_t jobs = 0;
  bool every_job = !s.job_limits.empty();
  for (const auto& [job, bytes] : s.job_limits) {
    every_job = every_job && bytes != 0;
    jobs = bytes > std::numeric_limits<std::size_t>::max() - jobs
               ? std::numeric_limits<std::size_t>::max()
               : jobs + bytes;
  }
  if (every_job && (limit == 0 || jobs < limit)) limit = jobs;
  return limit;
}

std::size_t Coordinator::room_of(const Session& s) const {
  const std::size_t limit = limit_bytes(s);
  if (limit == 0) return std::numeric_limits<std::size_t>::max();
  // A job's limit counts in whole pages: a limit below a page still allows one.
  const std::size_t pages = std::max<std::size_t>(1, (limit + page_bytes_ - 1) / page_bytes_);
  const std::size_t held = held_bytes(s) / page_bytes_;
  return pages - std::min(pages, held);
}

std::string Coordinator::limit_reason(const Session& s) const {
  const std::size_t limit = limit_bytes(s);
  const bool by_jobs = limit != options_.process_limit_bytes;
  return fmt::format("process {} holds {} bytes, its limit is {} bytes{}", s.peer.pid,
                     held_bytes(s), limit, by_jobs ? " (the sum of its jobs' limits)" : "");
}

std::vector<std::uint64_t> Coordinator::grant_or_wait(Session& s, int device, std::size_t count) {
  std::unique_lock lock(mu_);
  PageBank& bank = *banks_[static_cast<std::size_t>(device)];
  count = std::min(count, room_of(s));
  if (count == 0) throw Error(Errc::out_of_memory, limit_reason(s));
  // Without reclaims nothing would bring back the spares of a batch: one page an ask, so that a
  // process holds only pages it has used, as processes without Salus hold what they allocated.
  if (!options_.reclaim) return bank.grant(s.id, 1);
  std::vector<std::uint64_t> ids = bank.grant(s.id, count);
  if (!ids.empty()) {
    s.gave_way.reset();
    return ids;
  }
  // Short. The wait lasts while another process may still give pages back (its turn's end, its
  // exit), and reclaim_wait after the last moment one could; then, if every process short here
  // is stuck on the others, the one holding the most gives way (fails), so that a job that
  // cannot fit fails alone and the others wait for its pages, not for a clock.
  ++s.asking;
  const auto start = std::chrono::steady_clock::now();
  auto deadline = start + options_.reclaim_wait;
  for (;;) {
    auto now = std::chrono::steady_clock::now();
    if (s.closing || now - start >= options_.short_wait_limit) break;
    if (others_may_give_back(s, device, now)) deadline = now + options_.reclaim_wait;
    if (now >= deadline) {
      if (gives_way(s, device)) {
        s.gave_way = now;
        break;
      }
      deadline = now + options_.reclaim_wait;  // another gives way first; its pages come back
    }
    // The others are asked again every so often: a process whose jobs were all busy when first
    // asked may have one waiting for its turn now (whose pages may then move to its host memory).
    lock.unlock();
    ask_others_to_give_back(s.id, device, count);
    lock.lock();
    now = std::chrono::steady_clock::now();
    const bool granted = pages_back_.wait_until(lock, std::min(deadline, now + kReclaimRepeat), [&] {
      if (s.closing) return true;
      ids = bank.grant(s.id, count);
      return !ids.empty();
    });
    if (granted) break;
  }
  --s.asking;
  if (!ids.empty()) s.gave_way.reset();
  lock.unlock();
  pages_back_.notify_all();  // the others' reading of who is short changed
  return ids;
}

std::string Coordinator::short_reason(const Session& s, int device) const {
  if (!options_.reclaim) {
    return fmt::format("no page of device {} is free (this daemon asks no process to give pages "
                       "back: --reclaim never)", device);
  }
  std::lock_guard lock(mu_);
  const PageBank& bank = *banks_[static_cast<std::size_t>(device)];
  const std::size_t mine = bank.held_by(s.id);
  return fmt::format(
      "no page of device {} is free: this process holds {} of its {} pages and the others hold "
      "{}, which they use (none gave any back, is inside a turn or leaving for {} ms); of the "
      "processes short of pages this one holds the most, so it gives way",
      device, mine, bank.capacity_pages(), bank.granted_pages() - mine,
      options_.reclaim_wait.count());
}

bool Coordinator::others_may_give_back(const Session& s, int device,
                                       std::chrono::steady_clock::time_point now) const {
  const PageBank& bank = *banks_[static_cast<std::size_t>(device)];
  for (const auto& [id, o] : sessions_) {
    if (id == s.id || bank.held_by(id) == 0) continue;
    if (!o->in_turn.empty() && o->asking == 0) return true;
    // Leaving: its pages come back at its exit (wait_for_exit), likely soon.
    if (o->closing && o->closed_at && now - *o->closed_at < options_.exit_wait) return true;
    if (o->gave_way && now - *o->gave_way < options_.exit_wait) return true;
  }
  return false;
}

bool Coordinator::gives_way(const Session& s, int device) const {
  const PageBank& bank = *banks_[static_cast<std::size_t>(device)];
  const std::size_t mine = bank.held_by(s.id);
  for (const auto& [id, o] : sessions_) {
    if (id == s.id || o->asking == 0) continue;
    const std::size_t theirs = bank.held_by(id);
    if (theirs > mine || (theirs == mine && id > s.id)) return false;
  }
  return true;
}

void Coordinator::ask_others_to_give_back(SessionId asking, int device, std::size_t pages) {
  std::vector<std::shared_ptr<Session>> holders;
  {
    std::lock_guard lock(mu_);
    for (const auto& [id, s] : sessions_) {
      if (id != asking && banks_[static_cast<std::size_t>(device)]->held_by(id) > 0) {
        holders.push_back(s);
      }
    }
  }
  const remote::PageCount want{device, static_cast<std::uint32_t>(pages)};
  const auto record = remote::encode(MessageType::reclaim, 0, want);
  // Never a blocking send: a process that reads nothing (stopped, stuck) would hold this asker,
  // and every later one, on its full queue. Its unread reclaims say the same as this one.
  for (const auto& s : holders) {
    bool sent = false;
    try {
      sent = s->hint(record);
    } catch (const std::exception&) {
      continue;  // gone: its pages come back when its session closes
    }
    if (sent) continue;
    std::lock_guard lock(mu_);
    if (s->hints_dropped++ == 0) {
      spdlog::warn("session {}: '{}' pid {} reads no reclaims (stopped?); the others go on "
                   "without its pages", s->id, s->name, s->peer.pid);
    }
  }
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
  if (fence && head.device >= 0 && head.device < static_cast<int>(banks_.size())) {
    // Before the lock: it opens the event, which the daemon asks later (settle_fences).
    fence->opened = check_fence(head.device, *fence, "give_pages");
    fence->given_at = std::chrono::steady_clock::now();
  }
  {
    std::lock_guard lock(mu_);
    if (head.device < 0 || head.device >= static_cast<int>(banks_.size())) {
      throw InvalidArgument(fmt::format("give_pages: device {} does not exist", head.device));
    }
    PageBank& bank = *banks_[static_cast<std::size_t>(head.device)];
    // All or nothing: one page that is not the sender's refuses the whole batch.
    if (!bank.all_held_by(s.id, ids)) {
      throw InvalidArgument(fmt::format(
          "give_pages: a page of the batch is not held by this process (or is named twice)"));
    }
    bank.take_back(ids, head.fence, fence);
    trace_pages(fmt::format("give back <- {} {}{}", s.name, s.peer.pid,
                            head.fence == remote::GiveFence::fenced ? " (behind work)" : ""),
                head.device, trace_->micros(std::chrono::steady_clock::now()), ids.size());
  }
  pages_back_.notify_all();
  reply(s, MessageType::done, record.header.seq, {});
}

void Coordinator::trace_pages(const std::string& what, int device, double begin_us,
                              std::size_t pages) {
  const double now_us = trace_->micros(std::chrono::steady_clock::now());
  trace_->move({what, device, begin_us, now_us, pages, pages * page_bytes_});
  TraceRecorder::Counter held{fmt::format("salusd pages gpu{}", device), device, now_us, {}};
  const PageBank& bank = *banks_[static_cast<std::size_t>(device)];
  for (const auto& [id, session] : sessions_) {
    held.values.emplace_back(fmt::format("{} {}", session->name, session->peer.pid),
                             static_cast<double>(bank.held_by(id)));
  }
  trace_->counter(std::move(held));
}

std::shared_ptr<const Event> Coordinator::check_fence(int device, const PageBank::Fence& fence,
                                                      std::string_view what) const {
  // The pages' next holder imports the fence and waits for it. What it cannot import would fail
  // that process, not this one's sender; a file its sender could still shrink would crash it
  // (SIGBUS). So a fence goes on only once it opened here.
  SharedEvent shared;
  shared.fd = fence.fd.get();
  shared.handle = fence.entry.handle;
  EventHandle opened;
  try {
    opened = backend_->import_event(device, shared);
  } catch (const Error& e) {
    throw InvalidArgument(fmt::format(
        "{}: its fence is no event of device {} that another process could wait for, so it is "
        "refused{}: {}",
        what, device, what == "give_pages" ? " and the pages stay this process's" : "",
        e.what()));
  }
  return std::make_shared<const Event>(backend_, opened);
}

std::string Coordinator::inconsistency() const {
  std::lock_guard lock(mu_);
  for (std::size_t d = 0; d < banks_.size(); ++d) {
    if (std::string why = banks_[d]->inconsistency(); !why.empty()) {
      return fmt::format("device {}: {}", d, why);
    }
  }
  return "";
}

DeviceUse Coordinator::device_use(int device) const {
  std::lock_guard lock(mu_);
  const PageBank& bank = *banks_.at(static_cast<std::size_t>(device));
  return {bank.granted_pages() * page_bytes_, bank.peak_granted_pages() * page_bytes_,
          bank.capacity_pages() * page_bytes_, bank.made_pages() * page_bytes_,
          bank.released_idle_pages() * page_bytes_, bank.withheld_pages() * page_bytes_};
}

std::size_t Coordinator::release_idle_pages() {
  scrubber_.recycle_completed();
  release_completed_withheld();
  if (options_.idle_release.count() == 0) return 0;
  std::vector<ChunkHandle> idle;
  {
    std::lock_guard lock(mu_);
    const auto now = PageBank::Clock::now();
    for (const auto& bank : banks_) {
      std::vector<ChunkHandle> chunks = bank->take_idle(now, options_.idle_release);
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

std::string Coordinator::status_table(std::optional<SessionId> asking) const {
  // Who holds what, under the lock; the jobs' own state from the runtime, after it.
  struct Listed {
    std::string process;
    std::shared_ptr<Job> job;
    bool other = false;  // another user's: its names are not shown
  };
  std::vector<Listed> jobs;
  // What each device has free now, asked of the driver before the lock is taken.
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
                                options_.reclaim ? "ask" : "never", scrubber_.scrubbed());
  {
    std::lock_guard lock(mu_);
    // fenced: pages whose last holder's work may still run; behind work: pages given back
    // behind queued work (an interprocess event) since the start.
    out += fmt::format("{:<7} {:>10} {:>14} {:>14} {:>14} {:>8} {:>12} {:>9}\n", "device",
                       "pages", "granted MiB", "peak MiB", "capacity MiB", "fenced",
                       "behind work", "withheld");
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
      out += fmt::format("{:<7} {:>18.1f} {:>12.1f} {:>10.1f} {:>14} {:>18}\n", d,
                         free_at_start_[d] / 1048576.0, options_.reserve_bytes / 1048576.0,
                         b.made_pages() * page_bytes_ / 1048576.0, b.released_idle_pages(),
                         free_now[d]);
    }
    out += fmt::format("\n{:<8} {:>8} {:<20} {:>5} {:>12} {:>12}\n", "session", "pid",
                       "process", "jobs", "held MiB", "limit MiB");
    // With --group, users share the daemon: a user sees what others hold, not who they are or
    // what they run (their pids and the names of their processes and jobs). Root sees all.
    std::optional<uid_t> viewer;
    if (asking) {
      if (const auto it = sessions_.find(*asking); it != sessions_.end()) {
        viewer = it->second->peer.uid;
      }
    }
    const auto hidden = [&](const Session& s) {
      return viewer && *viewer != 0 && s.peer.uid != *viewer;
    };
    for (const auto& [id, s] : sessions_) {
      std::size_t held = 0;
      for (const auto& b : banks_) held += b->held_by(id);
      if (id == asking && s->jobs.empty() && held == 0) continue;
      const bool other = hidden(*s);
      out += fmt::format("{:<8} {:>8} {:<20} {:>5} {:>12.1f} {:>12}\n", id,
                         other ? std::string("-") : std::to_string(s->peer.pid),
                         other ? std::string(kAnotherUser) : s->name.substr(0, 20),
                         s->jobs.size(), held * page_bytes_ / 1048576.0,
                         limit_bytes(*s) == 0
                             ? std::string("-")
                             : fmt::format("{:.1f}", limit_bytes(*s) / 1048576.0));
      for (const auto& [job_id, job] : s->jobs) {
        jobs.push_back({other ? std::string(kAnotherUser) : s->name, job, other});
      }
    }
    for (const auto& [id, s] : sessions_) {
      std::size_t held = 0;
      for (const auto& b : banks_) held += b->held_by(id);
      if (!s->closed_at || held == 0) continue;
      out += fmt::format("session {} (pid {}) hung up {:.1f} s ago: its {} pages wait until no "
                         "process can reach them\n", id, hidden(*s) ? std::string("-") : std::to_string(s->peer.pid),
                         std::chrono::duration<double>(std::chrono::steady_clock::now() -
                                                       *s->closed_at).count(), held);
    }
  }
  out += fmt::format("\n{:<20} {:<20} {:<9} {:>6} {:>10} {:>10}\n", "job", "process", "state",
                     "turns", "held s", "waited s");
  for (const auto& [process, job, other] : jobs) {
    try {
      const JobStats st = job->stats();
      out += fmt::format("{:<20} {:<20} {:<9} {:>6} {:>10.2f} {:>10.2f}\n",
                         other ? std::string(kAnotherUser) : st.name.substr(0, 20),
                         process.substr(0, 20), to_string(st.state), st.iterations,
                         st.attained_seconds, st.waiting_seconds);
    } catch (const Error&) {
      // Gone since the list was made.
    }
  }
  return out;
}

}  // namespace salus::daemon
