// Physical pages of one location. Pages are chunks of exactly one granule, created on demand up
// to a byte limit and kept for reuse once unmapped; trim() gives the kept ones back. Lock story:
// guarded by its own mutex (the kept pages); counters are atomics. Final: a stream heap asks its
// device's pool on the allocation path through this type, with no virtual call.
#pragma once

#include <atomic>
#include <cstddef>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "memory/counter.hpp"
#include "memory/fence.hpp"
#include "memory/page_source.hpp"
#include "salus/device.hpp"

namespace salus::memory {

class PagePool final : public PageSource {
 public:
  PagePool(DeviceBackend& backend, Location where, std::size_t page_bytes, std::size_t limit_bytes);
  ~PagePool();
  PagePool(const PagePool&) = delete;
  PagePool& operator=(const PagePool&) = delete;

  // Appends up to `count` pages to `out`, reusing kept pages first, then creating chunks while
  // under the limit. Returns how many were added. Throws DeviceError only for driver failures
  // other than running out of memory.
  std::size_t acquire(std::size_t count, std::vector<Page>& out) override;
  // As acquire, from the kept pages only: no chunk is created.
  std::size_t acquire_kept(std::size_t count, std::vector<Page>& out) override;
  // Pages kept for reuse right now (acquire_kept's most); lock-free, so a moment old.
  [[nodiscard]] std::size_t kept_pages() const override {
    return kept_count_.load(std::memory_order_relaxed);
  }
  // As acquire, for another device or the host tier: stops while fewer than `reserve_bytes`
  // would stay free here. The pages count as lent until take_back.
  std::size_t lend(std::size_t count, std::size_t reserve_bytes, std::vector<Page>& out) override;
  // Keeps unmapped pages for reuse.
  void put(Page page) override;
  void put(std::vector<Page>& pages) override;  // empties `pages`
  // A lent page comes home.
  void take_back(Page page) override;
  // Releases every kept page to the device (after its fence); returns the bytes released.
  std::size_t trim() override;
  // As trim, for the pages kept since the previous trim_idle and not taken since; those kept
  // after it wait for the next call. A hysteresis for callers that trim often
  // (torch.cuda.empty_cache every step): a page a step uses is never given up.
  std::size_t trim_idle();

  [[nodiscard]] Location where() const override { return where_; }
  [[nodiscard]] std::size_t page_bytes() const override { return page_bytes_; }
  [[nodiscard]] std::size_t limit_bytes() const override { return limit_bytes_; }
  [[nodiscard]] std::size_t held_bytes() const { return held_.value(); }
  [[nodiscard]] std::size_t peak_held_bytes() const {
    return held_.peak();
  }
  [[nodiscard]] std::uint64_t creates() const { return creates_.load(std::memory_order_relaxed); }
  [[nodiscard]] std::uint64_t releases() const { return releases_.load(std::memory_order_relaxed); }
  [[nodiscard]] std::size_t lent_bytes() const override {
    return lent_.load(std::memory_order_relaxed) * page_bytes_;
  }
  // Pages nobody uses: kept ones plus what may still be created.
  [[nodiscard]] std::size_t free_bytes() const;
  void reset_peak() { held_.reset_peak(); }

 private:
  std::size_t take_locked(std::size_t count, std::size_t keep_free_pages, std::vector<Page>& out,
                          bool create = true);
  std::size_t release(const std::vector<Page>& pages);  // without mu_ held; returns the bytes

  DeviceBackend& backend_;
  const Location where_;
  const std::size_t page_bytes_;
  const std::size_t limit_bytes_;
  mutable std::mutex mu_;
  std::vector<Page> kept_;                  // guarded by mu_; taken from the back
  std::size_t idle_ = 0;  // guarded by mu_: kept_'s first pages, kept since the last trim_idle
  std::atomic<std::size_t> kept_count_{0};  // kept_.size(), written under mu_
  Counter held_;  // bytes of the chunks it created and has not released
  std::atomic<std::uint64_t> creates_{0};
  std::atomic<std::uint64_t> releases_{0};
  std::atomic<std::size_t> lent_{0};  // pages
};

// The driver's last refusal of a chunk (a cuMemCreate that failed for want of memory) on the
// calling thread, as words, and forgets it; "" when there was none since the last call. An
// allocation that ends in OutOfMemory names it, so that a failure the driver reported is told
// from a budget that said no.
[[nodiscard]] std::string take_driver_refusal();

}  // namespace salus::memory
