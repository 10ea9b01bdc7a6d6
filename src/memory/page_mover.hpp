// Moves physical pages behind fixed virtual addresses, for one device's address ranges. Each
// destination page is mapped into a staging window, the bytes are copied there on a stream of
// the mover's own (ordered after the streams that used the pages), and as each copy lands its
// page takes the old one's place. Copies are enqueued back to back, so the link stays busy while
// earlier pages are being remapped.
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <vector>

#include "memory/arena.hpp"
#include "memory/page_pool.hpp"
#include "salus/device.hpp"

namespace salus::memory {

// Who gets access to a page mapped in one device's address ranges: the device itself and every
// peer that can reach where the page lives, read_write. A mapping grants nothing by itself, and
// peers' kernels and copies (a framework's peer-to-peer copy, NCCL) touch the blocks too, so
// every map and every remap grants them all, as PyTorch's expandable segments do.
class AccessGrants {
 public:
  // `reaches(q, p)`: device q can access memory of device p (q != p).
  AccessGrants(int device_count, int device, const std::function<bool(int, int)>& reaches);
  [[nodiscard]] std::span<const AccessGrant> of(Location where) const;

 private:
  std::vector<std::vector<AccessGrant>> on_device_;  // [p]: for a page that lives on GPU p
  std::vector<AccessGrant> on_host_;
};

struct PageMove {
  DevicePtr va = 0;
  PageSlot* slot = nullptr;  // the page table entry of `va`; updated when the page moves
  Page to;                   // the new physical page
  bool done = false;
};

class PageMover {
 public:
  PageMover(std::shared_ptr<DeviceBackend> backend, int device, std::size_t page_bytes,
            std::size_t window_pages);
  ~PageMover();
  PageMover(const PageMover&) = delete;
  PageMover& operator=(const PageMover&) = delete;

  // Moves every page in `moves` once the work `after` marks has finished. The old
  // pages are appended to `old` (unfenced: their last user, the copy, has finished). Returns
  // the wall seconds taken. On a failure, moves not marked done keep their old pages and the
  // caller still owns their `to` pages.
  double run(std::span<PageMove> moves, std::span<const std::shared_ptr<const Event>> after,
             const AccessGrants& grants, std::vector<Page>& old);

 private:
  void ensure_started();
  void move_window(std::span<PageMove> window, const AccessGrants& grants,
                   std::vector<Page>& old);
  // Copies each page of the window into a staging slot mapped to its destination; on failure
  // unmaps the slots and leaves every page where it was.
  void stage_window(std::span<PageMove> window);
  // Once each copy has landed: the destination page goes under the block's address, the old
  // one into `old`. A page whose remapping fails gets its old page back.
  void swap_window(std::span<PageMove> window, const AccessGrants& grants,
                   std::vector<Page>& old);

  std::shared_ptr<DeviceBackend> backend_;
  const int device_;
  const std::size_t page_bytes_;
  const std::size_t window_pages_;
  std::mutex mu_;  // one move at a time: the staging window and stream are shared
  std::optional<Stream> stream_;
  DevicePtr window_ = 0;
  std::vector<Event> landed_;  // one per window slot
};

}  // namespace salus::memory
