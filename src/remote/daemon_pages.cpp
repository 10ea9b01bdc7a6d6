#include "remote/daemon_pages.hpp"

#include <fmt/format.h>
#include <sys/resource.h>

#include <cerrno>

#include <algorithm>
#include <exception>
#include <iterator>

#include "log/log.hpp"

namespace salus::remote {
namespace {

// Pages asked for at once: enough that an iteration's growth makes few round trips, few enough
// that a process does not sit on memory another one waits for (spares go back on reclaim).
constexpr std::uint32_t kFetchBatch = 16;
// Released pages gathered before they go back unasked.
constexpr std::size_t kReturnBatch = 64;

}  // namespace

DaemonPages::DaemonPages(std::shared_ptr<DeviceBackend> local, std::shared_ptr<DaemonLink> link,
                         std::size_t page_bytes)
    : local_(std::move(local)),
      link_(std::move(link)),
      page_bytes_(page_bytes),
      fences_(local_),
      devices_(static_cast<std::size_t>(local_->device_count())),
      fence_streams_(devices_.size(), StreamHandle{}),
      fetching_(devices_.size(), false) {}

DaemonPages::~DaemonPages() {
  // Whatever is still held goes back without waiting: the daemon takes back every page of a
  // process that disconnects anyway.
  for (int d = 0; d < static_cast<int>(devices_.size()); ++d) {
    Returns back;
    {
      std::lock_guard lock(mu_);
      back = collect_returns(devices_[static_cast<std::size_t>(d)]);
    }
    send_returns(d, back, false);
  }
  // Pages given back behind work: our mappings of them must outlive that work. No other thread
  // is here any more.
  arrivals_.clear();
  for (Deferred& d : deferred_) {
    try {
      d.fence->event->synchronize();
    } catch (const Error& e) {
      log::warn("a page given back to salusd: waiting for its work failed: {}", e.what());
    }
    for (const ChunkHandle chunk : d.chunks) {
      try {
        local_->release_chunk(chunk);
      } catch (const Error& e) {
        log::warn("releasing a page given back to salusd failed: {}", e.what());
      }
    }
  }
  deferred_.clear();
  for (StreamHandle& stream : fence_streams_) {
    if (stream.value == 0) continue;
    try {
      local_->destroy_stream(stream);
    } catch (const Error&) {
      // The backend is going too.
    }
  }
}

ChunkHandle DaemonPages::take(int device) {
  reap();
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

void DaemonPages::fetch(int device, DevicePages& pages, std::unique_lock<std::mutex>& lock) {
  fetching_[static_cast<std::size_t>(device)] = true;
  // Pages released here and not yet given back go first, in the same order on the connection
  // (the daemon takes a give_pages as it reads it): else a process out of spares is refused pages
  // while it sits on some it no longer uses.
  std::vector<std::uint64_t> released;
  released.swap(pages.returning);
  pages.held -= released.size();
  lock.unlock();
  Batch got;
  std::string refusal;
  std::exception_ptr gone;
  try {
    got = take_batch(device, released);
  } catch (const Error& e) {
    refusal = e.what();
    gone = !link_->alive() ? std::current_exception() : nullptr;
  }
  lock.lock();
  fetching_[static_cast<std::size_t>(device)] = false;
  fetched_.notify_all();
  if (gone) std::rethrow_exception(gone);  // not an out-of-memory: the daemon is gone
  for (std::size_t i = 0; i < got.pages.size(); ++i) {
    const auto& [chunk, id] = got.pages[i];
    pages.spare.push_back(chunk);
    page_of_chunk_.emplace(chunk.value, HeldPage{id, device});
    if (got.fences[i]) arrivals_.emplace(chunk.value, got.fences[i]);
  }
  pages.held += got.pages.size();
  if (!got.pages.empty()) return;
  throw DeviceError::out_of_memory(
      "cuMemCreate", fmt::format("salusd has no page for device {}: {}", device,
                                 refusal.empty() ? "every page is in use" : refusal));
}

DaemonPages::Batch DaemonPages::take_batch(int device,
                                           const std::vector<std::uint64_t>& released) {
  send_returns(device, released, GiveFence::settled, false);
  Received reply = link_->call(MessageType::take_pages, PageCount{device, kFetchBatch});
  std::vector<PageEntry> entries;
  std::vector<FenceEntry> fence_entries;
  (void)pages_body(reply.record, entries, fence_entries);
  if (reply.fds_cut) refuse_cut_batch(device, entries);
  const auto fences = import_fences(device, fence_entries, reply.fds);
  Batch got;
  try {
    for (const PageEntry& e : entries) {
      if (e.fd_index >= reply.fds.size()) {
        throw ProtocolError(fmt::format("page {} names descriptor {} of {}", e.id, e.fd_index,
                                        reply.fds.size()));
      }
      const SharedChunk shared{reply.fds[e.fd_index].get(), e.offset, page_bytes_};
      got.pages.emplace_back(local_->import_chunk(Location::gpu(device), shared), e.id);
      got.fences.push_back(e.fence != 0 ? fences[e.fence - 1] : nullptr);
    }
  } catch (const Error&) {
    // The pages this process could not take are the daemon's again at once, their fences
    // still holding.
    std::vector<std::uint64_t> back;
    for (std::size_t i = got.pages.size(); i < entries.size(); ++i) back.push_back(entries[i].id);
    send_returns(device, back, GiveFence::untouched, false);
    if (got.pages.empty()) throw;
  }
  return got;
}

void DaemonPages::refuse_cut_batch(int device, const std::vector<PageEntry>& entries) {
  // The pages are the daemon's again at once; the link stays (nothing else was lost).
  std::vector<std::uint64_t> back;
  for (const PageEntry& e : entries) back.push_back(e.id);
  send_returns(device, back, GiveFence::untouched, false);
  rlimit files{};
  (void)::getrlimit(RLIMIT_NOFILE, &files);
  throw DeviceError("recvmsg", "EMFILE", EMFILE,
                    fmt::format("this process has no room for the descriptors of {} pages salusd "
                                "sent (RLIMIT_NOFILE {}): raise its limit (ulimit -n), or close "
                                "files",
                                entries.size(), files.rlim_cur));
}

std::vector<std::shared_ptr<const Event>> DaemonPages::import_fences(
    int device, const std::vector<FenceEntry>& fences, const std::vector<UniqueFd>& fds) {
  std::vector<std::shared_ptr<const Event>> out;
  out.reserve(fences.size());
  for (const FenceEntry& f : fences) {
    if (f.fd_index >= static_cast<std::int32_t>(fds.size())) {
      throw ProtocolError(fmt::format("a fence names descriptor {} of {}", f.fd_index, fds.size()));
    }
    SharedEvent shared;
    shared.handle = f.handle;
    shared.fd = f.fd_index >= 0 ? fds[static_cast<std::size_t>(f.fd_index)].get() : -1;
    try {
      // Our own fence comes back as our own event (CUDA opens none in its exporter).
      out.push_back(fences_.open(device, shared));
    } catch (const Error& e) {
      // Its process has exited (CUDA opens no event of a process that is gone), and its work
      // ended with it; or it was never an event, which only a process of this user can send.
      // (A live exporter never destroys what it exported: see FencePool.)
      log::debug("a page's fence could not be opened, taken as passed: {}", e.what());
      {
        std::lock_guard lock(mu_);
        ++unopened_fences_;
      }
      out.push_back(nullptr);
    }
  }
  return out;
}

bool DaemonPages::release(ChunkHandle chunk) { return release_page(chunk); }

bool DaemonPages::release_page(ChunkHandle chunk) {
  reap();
  HeldPage page;
  bool untouched = false;
  {
    std::lock_guard lock(mu_);
    auto it = page_of_chunk_.find(chunk.value);
    if (it == page_of_chunk_.end()) return false;  // a host-tier chunk of the process's own
    page = it->second;
    page_of_chunk_.erase(it);
    // Its arrival was never taken: whoever used it did not wait for that work, so the fence it
    // came with must go on holding for the next process.
    untouched = arrivals_.erase(chunk.value) > 0;
  }
  // Our reference goes first; the page is the daemon's again only after it (with the next batch
  // back, or at once when untouched).
  local_->release_chunk(chunk);
  std::vector<std::uint64_t> ids;
  {
    std::lock_guard lock(mu_);
    DevicePages& pages = devices_[static_cast<std::size_t>(page.device)];
    if (untouched) {
      ids.push_back(page.id);
      pages.held -= 1;
    } else {
      pages.returning.push_back(page.id);
      if (pages.returning.size() >= kReturnBatch) {
        ids.swap(pages.returning);
        pages.held -= ids.size();
      }
    }
  }
  send_returns(page.device, ids, untouched ? GiveFence::untouched : GiveFence::settled, false);
  return true;
}

std::shared_ptr<const Event> DaemonPages::take_arrival(ChunkHandle chunk) {
  std::lock_guard lock(mu_);
  const auto it = arrivals_.find(chunk.value);
  if (it == arrivals_.end()) return nullptr;
  auto fence = std::move(it->second);
  arrivals_.erase(it);
  return fence;
}

void DaemonPages::release_after(std::span<const ChunkHandle> chunks,
                                std::span<const std::shared_ptr<const Event>> work) {
  reap();
  std::vector<std::shared_ptr<const Event>> pending;
  for (const auto& event : work) {
    if (!event->query()) pending.push_back(event);
  }
  std::vector<ChunkHandle> left;  // released after the pending work, on the host
  if (pending.empty()) {
    left.assign(chunks.begin(), chunks.end());
  } else {
    left = give_back_fenced(chunks, pending);
  }
  if (left.empty()) return;
  for (const auto& event : pending) event->synchronize();
  for (const ChunkHandle chunk : left) {
    if (!release_page(chunk)) local_->release_chunk(chunk);
  }
}

std::vector<ChunkHandle> DaemonPages::give_back_fenced(
    std::span<const ChunkHandle> chunks, std::span<const std::shared_ptr<const Event>> pending) {
  // By device, the daemon's pages among the chunks; the rest (host-tier chunks of our own) are
  // the caller's to release.
  std::vector<std::vector<ChunkHandle>> remote_chunks(devices_.size());
  std::vector<std::vector<std::uint64_t>> remote_ids(devices_.size());
  std::vector<ChunkHandle> left;
  {
    std::lock_guard lock(mu_);
    for (const ChunkHandle chunk : chunks) {
      const auto it = page_of_chunk_.find(chunk.value);
      if (it == page_of_chunk_.end()) {
        left.push_back(chunk);
        continue;
      }
      const auto d = static_cast<std::size_t>(it->second.device);
      remote_chunks[d].push_back(chunk);
      remote_ids[d].push_back(it->second.id);
    }
  }
  for (std::size_t d = 0; d < devices_.size(); ++d) {
    if (remote_ids[d].empty()) continue;
    if (!give_back_fenced(static_cast<int>(d), remote_chunks[d], remote_ids[d], pending)) {
      left.insert(left.end(), remote_chunks[d].begin(), remote_chunks[d].end());
    }
  }
  return left;
}

StreamHandle DaemonPages::fence_stream(int device) {
  const auto d = static_cast<std::size_t>(device);
  {
    std::lock_guard lock(mu_);
    if (fence_streams_[d].value != 0) return fence_streams_[d];
  }
  const StreamHandle made = local_->create_stream(device, 0);
  StreamHandle winner;
  {
    std::lock_guard lock(mu_);
    if (fence_streams_[d].value == 0) fence_streams_[d] = made;
    winner = fence_streams_[d];
  }
  // Another thread made the device's first: every fence of a device goes on one stream (see
  // FencePool), so this one goes.
  if (winner != made) local_->destroy_stream(made);
  return winner;
}

void DaemonPages::reap() {
  // The queries are driver calls: made without mu_, on the entries taken out meanwhile.
  std::vector<Deferred> checking;
  {
    std::lock_guard lock(mu_);
    if (deferred_.empty()) return;
    checking.swap(deferred_);
  }
  std::vector<Deferred> pending;
  std::vector<ChunkHandle> done;
  for (Deferred& d : checking) {
    bool passed = false;
    try {
      passed = d.fence->event->query();
    } catch (...) {
      pending.push_back(std::move(d));  // kept, asked again later
      continue;
    }
    if (!passed) {
      pending.push_back(std::move(d));
      continue;
    }
    done.insert(done.end(), d.chunks.begin(), d.chunks.end());
    fences_.recycle(*d.fence);
  }
  if (!pending.empty()) {
    std::lock_guard lock(mu_);
    deferred_.insert(deferred_.end(), std::make_move_iterator(pending.begin()),
                     std::make_move_iterator(pending.end()));
  }
  for (const ChunkHandle chunk : done) local_->release_chunk(chunk);
}

bool DaemonPages::give_back_fenced(int device, std::vector<ChunkHandle> chunks,
                                   const std::vector<std::uint64_t>& ids,
                                   std::span<const std::shared_ptr<const Event>> work) {
  // One interprocess event after all of the work, recorded on a stream of our own that waits
  // for it; the driver calls are made without mu_, which take on other threads needs.
  FencePool::Fence* fence = nullptr;
  try {
    fence = &fences_.acquire(device);
  } catch (const NotSupported&) {
    return false;
  }
  const StreamHandle stream = fence_stream(device);
  try {
    for (const auto& event : work) local_->stream_wait_event(stream, event->handle(), device);
    local_->record_event(fence->event->handle(), stream);
  } catch (...) {
    // Not recorded (or recorded behind a partial wait): it goes back only once known complete.
    fence->event->synchronize();
    fences_.recycle(*fence);
    throw;
  }
  {
    std::lock_guard lock(mu_);
    for (std::size_t i = 0; i < chunks.size(); ++i) {
      page_of_chunk_.erase(chunks[i].value);
      arrivals_.erase(chunks[i].value);  // ordered after by the wait above, if it was used
    }
    devices_[static_cast<std::size_t>(device)].held -= ids.size();
    deferred_.push_back({std::move(chunks), fence});
  }
  FenceEntry entry;
  entry.handle = fence->shared.handle;
  entry.fd_index = fence->shared.fd >= 0 ? 0 : -1;
  std::vector<int> fds;
  if (fence->shared.fd >= 0) fds.push_back(fence->shared.fd);  // sent as a duplicate
  for (std::size_t at = 0; at < ids.size(); at += kMaxPagesPerBatch) {
    const std::size_t n = std::min<std::size_t>(kMaxPagesPerBatch, ids.size() - at);
    const GiveHead head{device, static_cast<std::uint32_t>(n), GiveFence::fenced, 0};
    link_->post(MessageType::give_pages,
                give_pages_body(head, std::span(ids).subspan(at, n), &entry), fds);
  }
  return true;
}

DaemonPages::Returns DaemonPages::collect_returns(DevicePages& pages) {
  Returns back;
  back.settled.swap(pages.returning);
  for (const ChunkHandle chunk : pages.spare) {
    auto it = page_of_chunk_.find(chunk.value);
    back.untouched.push_back(it->second.id);
    page_of_chunk_.erase(it);
    arrivals_.erase(chunk.value);
  }
  back.chunks.swap(pages.spare);
  const std::size_t n = back.settled.size() + back.untouched.size();
  pages.held -= std::min(pages.held, n);
  return back;
}

void DaemonPages::send_returns(int device, const Returns& back, bool wait) {
  // Our references go first (as in release): the spare pages were never handed out.
  for (const ChunkHandle chunk : back.chunks) local_->release_chunk(chunk);
  send_returns(device, back.settled, GiveFence::settled, wait);
  send_returns(device, back.untouched, GiveFence::untouched, wait);
}

void DaemonPages::send_returns(int device, const std::vector<std::uint64_t>& ids, GiveFence mode,
                               bool wait) {
  for (std::size_t at = 0; at < ids.size(); at += kMaxPagesPerBatch) {
    const std::size_t n = std::min<std::size_t>(kMaxPagesPerBatch, ids.size() - at);
    const GiveHead head{device, static_cast<std::uint32_t>(n), mode, 0};
    const std::vector<std::byte> body =
        give_pages_body(head, std::span(ids).subspan(at, n), nullptr);
    if (wait) {
      (void)link_->call(MessageType::give_pages, body);
    } else {
      link_->post(MessageType::give_pages, body);
    }
  }
}

std::size_t DaemonPages::give_back(int device) {
  reap();
  Returns back;
  {
    std::lock_guard lock(mu_);
    back = collect_returns(devices_[static_cast<std::size_t>(device)]);
  }
  send_returns(device, back, true);
  return back.settled.size() + back.untouched.size();
}

std::uint64_t DaemonPages::unopened_fences() const {
  std::lock_guard lock(mu_);
  return unopened_fences_;
}

std::size_t DaemonPages::held(int device) const {
  std::lock_guard lock(mu_);
  return devices_.at(static_cast<std::size_t>(device)).held;
}

std::size_t DaemonPages::in_use(int device) const {
  std::lock_guard lock(mu_);
  const DevicePages& pages = devices_.at(static_cast<std::size_t>(device));
  return pages.held - pages.spare.size() - pages.returning.size();
}

}  // namespace salus::remote
