// Zeroes a page before another user gets it (issue 34, item 7): salusd shares one GPU between
// users (--group), and a page carries its last holder's bytes. The zeroing runs on the GPU, on a
// stream of the daemon's, after the work of the page's last holder (its fence); the new holder
// gets the zeroing's fence with the page, so its first work waits for it: nothing waits on the
// host. A page is mapped here at its first zeroing and stays mapped until it goes back to the
// driver (forget).
//
// Lock rule: every public method takes mu_ (its maps and counts only) and calls the backend with
// mu_ released; no public method calls another.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "daemon/page_bank.hpp"
#include "remote/fence_pool.hpp"
#include "salus/device.hpp"

namespace salus::daemon {

class Scrubber {
 public:
  explicit Scrubber(std::shared_ptr<DeviceBackend> backend);
  ~Scrubber();  // waits for its zeroings, then unmaps every page
  Scrubber(const Scrubber&) = delete;
  Scrubber& operator=(const Scrubber&) = delete;

  // A page to zero: its chunk, and the fence it came back with (null: none).
  struct Page {
    ChunkHandle chunk;
    PageBank::FencePtr after;
  };
  // Queues the zeroing of `pages` (each `bytes` on `device`), after their fences, and returns the
  // one fence their next holder waits for. Throws what the backend throws (the pages must then
  // not be handed on).
  PageBank::FencePtr scrub(int device, const std::vector<Page>& pages, std::size_t bytes);
  // `chunk` goes back to the driver: its zeroings end, and its mapping here goes.
  void forget(ChunkHandle chunk);
  // Fences whose zeroing has completed are recorded again for later ones (the server's tick).
  void recycle_completed();
  [[nodiscard]] std::uint64_t scrubbed() const;  // pages zeroed so far

 private:
  struct Mapping {
    int device = 0;
    DevicePtr va = 0;
    std::size_t bytes = 0;
  };
  // The page's mapping here, made at its first zeroing (mu_ released while it is made).
  Mapping mapping_of(int device, ChunkHandle chunk, std::size_t bytes);
  StreamHandle stream_of(int device);

  const std::shared_ptr<DeviceBackend> backend_;
  remote::FencePool fences_;  // has its own lock
  mutable std::mutex mu_;
  std::map<std::uint64_t, Mapping> mappings_;  // by chunk handle
  std::map<int, StreamHandle> streams_;        // by device
  std::vector<remote::FencePool::Fence*> in_flight_;
  std::uint64_t scrubbed_ = 0;
};

}  // namespace salus::daemon
