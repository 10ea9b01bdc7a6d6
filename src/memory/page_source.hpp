// Where physical pages come from and go back to: a location's page pool (PagePool) today; a
// source of another kind (another process's or machine's memory) can be added behind the same
// door without touching the allocator. Lock story: each implementation guards itself; callers
// may hold a stream heap's lock (never the other way round).
#pragma once

#include <cstddef>
#include <vector>

#include "memory/fence.hpp"
#include "salus/device.hpp"

namespace salus::memory {

// A physical page handed from one user to the next. `fence`, when set, marks GPU work that may
// still touch the page (work of the streams it was taken from): a new user orders its work after
// it, and the page is released to the driver only once it has completed. The old user may still
// map the page at its old address until then (see PageTable::hand_off).
struct Page {
  ChunkHandle chunk{};
  FencePtr fence;
  Location where{};  // the source it comes from and goes back to
};

class PageSource {
 public:
  virtual ~PageSource() = default;

  // Appends up to `count` pages to `out`, reusing kept pages first, then making new ones while
  // under the limit. Returns how many were added. Throws DeviceError only for driver failures
  // other than running out of memory.
  virtual std::size_t acquire(std::size_t count, std::vector<Page>& out) = 0;
  // As acquire, from the kept pages only: nothing new is made.
  virtual std::size_t acquire_kept(std::size_t count, std::vector<Page>& out) = 0;
  // Pages kept for reuse right now (acquire_kept's most); a moment old.
  [[nodiscard]] virtual std::size_t kept_pages() const = 0;
  // As acquire, for another device or the host tier: stops while fewer than `reserve_bytes`
  // would stay free here. The pages count as lent until take_back.
  virtual std::size_t lend(std::size_t count, std::size_t reserve_bytes,
                           std::vector<Page>& out) = 0;
  // Keeps unmapped pages for reuse.
  virtual void put(Page page) = 0;
  virtual void put(std::vector<Page>& pages) = 0;  // empties `pages`
  // A lent page comes home.
  virtual void take_back(Page page) = 0;
  // Releases every kept page (after its fence); returns the bytes released.
  virtual std::size_t trim() = 0;

  [[nodiscard]] virtual Location where() const = 0;
  [[nodiscard]] virtual std::size_t page_bytes() const = 0;
  [[nodiscard]] virtual std::size_t limit_bytes() const = 0;
  [[nodiscard]] virtual std::size_t lent_bytes() const = 0;
};

}  // namespace salus::memory
