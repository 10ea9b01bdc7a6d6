#include "memory/page_pool.hpp"

#include <spdlog/spdlog.h>

#include "memory/job_table.hpp"

namespace salus::memory {

PagePool::PagePool(DeviceBackend& backend, Location where, std::size_t page_bytes,
                   std::size_t limit_bytes)
    : backend_(backend), where_(where), page_bytes_(page_bytes), limit_bytes_(limit_bytes) {}

PagePool::~PagePool() { trim(); }

std::size_t PagePool::acquire(std::size_t count, std::vector<Page>& out) {
  std::lock_guard lock(mu_);
  std::size_t added = 0;
  while (added < count && !kept_.empty()) {
    out.push_back(std::move(kept_.back()));
    kept_.pop_back();
    ++added;
  }
  while (added < count && held_.load(std::memory_order_relaxed) + page_bytes_ <= limit_bytes_) {
    ChunkHandle chunk;
    try {
      chunk = backend_.create_chunk(where_, page_bytes_);
    } catch (const DeviceError& e) {
      // The device may hold less than its nominal size (other processes, fragmentation in the
      // driver): treat its refusal as the real limit and let the caller reclaim or fail cleanly.
      if (e.status() == "CUDA_ERROR_OUT_OF_MEMORY") break;
      throw;
    }
    out.push_back({chunk, nullptr});
    ++added;
    held_.fetch_add(page_bytes_, std::memory_order_relaxed);
    creates_.fetch_add(1, std::memory_order_relaxed);
    raise_peak(peak_held_, held_.load(std::memory_order_relaxed));
  }
  return added;
}

void PagePool::put(Page page) {
  std::lock_guard lock(mu_);
  kept_.push_back(std::move(page));
}

void PagePool::put(std::vector<Page>& pages) {
  std::lock_guard lock(mu_);
  for (Page& page : pages) kept_.push_back(std::move(page));
  pages.clear();
}

std::size_t PagePool::trim() {
  std::vector<Page> pages;
  {
    std::lock_guard lock(mu_);
    pages.swap(kept_);
  }
  std::size_t released = 0;
  for (const Page& page : pages) {
    try {
      if (page.fence) page.fence->synchronize();
      backend_.release_chunk(page.chunk);
      released += page_bytes_;
    } catch (const Error& e) {
      spdlog::error("salus: releasing a page at {} failed: {}", to_string(where_), e.what());
    }
  }
  held_.fetch_sub(released, std::memory_order_relaxed);
  releases_.fetch_add(released / page_bytes_, std::memory_order_relaxed);
  return released;
}

}  // namespace salus::memory
