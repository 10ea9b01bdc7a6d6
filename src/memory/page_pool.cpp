#include "memory/page_pool.hpp"

#include <algorithm>
#include <iterator>

#include <fmt/format.h>

#include <utility>

#include "log/log.hpp"

namespace salus::memory {

namespace {
thread_local std::string t_driver_refusal;
}  // namespace

std::string take_driver_refusal() {
  return std::exchange(t_driver_refusal, std::string());
}

PagePool::PagePool(DeviceBackend& backend, Location where, std::size_t page_bytes,
                   std::size_t limit_bytes)
    : backend_(backend), where_(where), page_bytes_(page_bytes), limit_bytes_(limit_bytes) {}

PagePool::~PagePool() {
  trim();
}

std::size_t PagePool::acquire(std::size_t count, std::vector<Page>& out) {
  std::lock_guard lock(mu_);
  return take_locked(count, 0, out);
}

std::size_t PagePool::acquire_kept(std::size_t count, std::vector<Page>& out) {
  std::lock_guard lock(mu_);
  return take_locked(count, 0, out, false);
}

std::size_t PagePool::lend(std::size_t count, std::size_t reserve_bytes, std::vector<Page>& out) {
  std::lock_guard lock(mu_);
  const std::size_t added =
      take_locked(count, (reserve_bytes + page_bytes_ - 1) / page_bytes_, out);
  lent_.fetch_add(added, std::memory_order_relaxed);
  return added;
}

std::size_t PagePool::free_bytes() const {
  std::lock_guard lock(mu_);
  const std::size_t held = held_.value();
  return (limit_bytes_ > held ? limit_bytes_ - held : 0) + kept_.size() * page_bytes_;
}

std::size_t PagePool::take_locked(std::size_t count, std::size_t keep_free_pages,
                                  std::vector<Page>& out, bool create) {
  auto free_pages = [&] {
    const std::size_t held = held_.value();
    return (limit_bytes_ > held ? (limit_bytes_ - held) / page_bytes_ : 0) + kept_.size();
  };
  std::size_t added = 0;
  while (added < count && !kept_.empty() && free_pages() > keep_free_pages) {
    out.push_back(std::move(kept_.back()));
    kept_.pop_back();
    idle_ = std::min(idle_, kept_.size());
    kept_count_.store(kept_.size(), std::memory_order_relaxed);
    ++added;
  }
  while (create && added < count &&
         held_.value() + page_bytes_ <= limit_bytes_ &&
         free_pages() > keep_free_pages) {
    ChunkHandle chunk;
    try {
      chunk = backend_.create_chunk(where_, page_bytes_);
    } catch (const DeviceError& e) {
      // The device may hold less than its nominal size (other processes, fragmentation in the
      // driver): treat its refusal as the real limit and let the caller reclaim or fail cleanly.
      if (e.is_out_of_memory()) {
        // With the refusal's own detail where it has one (salusd says why it had no page).
        const std::string what = e.what();
        const std::size_t head =
            fmt::format("{} failed: {} ({})", e.call(), e.status(), e.status_code()).size();
        t_driver_refusal = fmt::format("the driver refused {} at {}: {}{}", e.call(),
                                       to_string(where_), e.status(),
                                       what.size() > head ? what.substr(head) : "");
        break;
      }
      throw;
    }
    // A page another process gave back behind its work: ours waits for that work on the GPU.
    FencePtr fence;
    if (auto arrival = backend_.take_arrival(chunk)) {
      fence = std::make_shared<const Fence>(std::vector<std::shared_ptr<const Event>>{arrival});
    }
    out.push_back({chunk, std::move(fence), where_});
    ++added;
    held_.add(page_bytes_);
    creates_.fetch_add(1, std::memory_order_relaxed);
  }
  return added;
}

void PagePool::put(Page page) {
  std::lock_guard lock(mu_);
  kept_.push_back(std::move(page));
  kept_count_.store(kept_.size(), std::memory_order_relaxed);
}

void PagePool::take_back(Page page) {
  lent_.fetch_sub(1, std::memory_order_relaxed);
  put(std::move(page));
}

void PagePool::put(std::vector<Page>& pages) {
  std::lock_guard lock(mu_);
  for (Page& page : pages) kept_.push_back(std::move(page));
  kept_count_.store(kept_.size(), std::memory_order_relaxed);
  pages.clear();
}

std::size_t PagePool::trim() {
  std::vector<Page> pages;
  {
    std::lock_guard lock(mu_);
    pages.swap(kept_);
    idle_ = 0;
    kept_count_.store(0, std::memory_order_relaxed);
  }
  return release(pages);
}

std::size_t PagePool::trim_idle() {
  std::vector<Page> pages;
  {
    std::lock_guard lock(mu_);
    const auto idle_end = kept_.begin() + static_cast<std::ptrdiff_t>(idle_);
    pages.assign(std::make_move_iterator(kept_.begin()), std::make_move_iterator(idle_end));
    kept_.erase(kept_.begin(), idle_end);
    idle_ = kept_.size();  // idle at the next call unless taken meanwhile
    kept_count_.store(kept_.size(), std::memory_order_relaxed);
  }
  return release(pages);
}

std::size_t PagePool::release(const std::vector<Page>& pages) {
  // Pages whose work has finished are released now; the others together, after their work
  // (a backend of our own waits for it; a process connected to salusd hands them back at once
  // behind an interprocess event).
  std::size_t released = 0;
  std::vector<ChunkHandle> fenced;
  std::vector<std::shared_ptr<const Event>> work;
  for (const Page& page : pages) {
    if (!settled(page.fence)) {
      fenced.push_back(page.chunk);
      for (const auto& event : page.fence->events()) {
        if (std::find(work.begin(), work.end(), event) == work.end()) work.push_back(event);
      }
      continue;
    }
    try {
      backend_.release_chunk(page.chunk);
      released += page_bytes_;
    } catch (const Error& e) {
      log::error("releasing a page at {} failed: {}", to_string(where_), e.what());
    }
  }
  if (!fenced.empty()) {
    try {
      backend_.release_chunks_after(fenced, work);
      released += fenced.size() * page_bytes_;
    } catch (const Error& e) {
      log::error("releasing {} pages at {} after their work failed: {}", fenced.size(),
                 to_string(where_), e.what());
    }
  }
  held_.sub(released);
  releases_.fetch_add(released / page_bytes_, std::memory_order_relaxed);
  return released;
}

}  // namespace salus::memory
