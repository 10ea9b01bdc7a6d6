// The GPU pages a process connected to salusd holds: taken from the daemon in batches, imported
// into this process's own backend as chunks, and given back in batches, settled or behind an
// interprocess event after the work still queued on them. RemoteBackend routes its chunk calls for
// GPU memory here and everything else to the local backend.
//
// Between processes, memory stays safe in stream order (DESIGN invariant 8): a page given back
// behind work still queued here goes back at once with an interprocess event recorded after that
// work (release_after); this process keeps its own reference to the page until the event has
// completed, and the next process's streams wait for the event before the page's first use
// (take_arrival hands it to the memory manager with the page).
//
// Lock rule: mu_ guards every field below it. Every public method takes it itself, no public method
// calls another while holding it, and it is never held across a call to the daemon or the local
// backend (a driver call): those run on what was taken out under the lock.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "remote/daemon_link.hpp"
#include "remote/fence_pool.hpp"
#include "salus/device.hpp"

namespace salus::remote {

class DaemonPages {
 public:
  // `page_bytes`: the daemon's page (the local backend's device granularity).
  DaemonPages(std::shared_ptr<DeviceBackend> local, std::shared_ptr<DaemonLink> link,
              std::size_t page_bytes);
  // Whatever is still held goes back without waiting; pages given back behind work are let go
  // once that work is done.
  ~DaemonPages();
  DaemonPages(const DaemonPages&) = delete;
  DaemonPages& operator=(const DaemonPages&) = delete;

  // A page of `device` as a chunk of the local backend: a spare one, else a new batch from the
  // daemon. Throws DeviceError out of memory when the daemon has none to give.
  ChunkHandle take(int device);
  // Releases `chunk` if it is one of the daemon's pages (it goes back with the next batch, or at
  // once if its arrival was never taken); false when it is not one (the caller's to release).
  bool release(ChunkHandle chunk);
  // The fence a page arrived with (another process's work it may still be under), once.
  std::shared_ptr<const Event> take_arrival(ChunkHandle chunk);
  // Releases `chunks` after `work`: the daemon's pages go back at once, each device's behind one
  // interprocess event after the work still pending; the rest (the process's own host-tier
  // chunks, or every chunk on a driver with no interprocess events) after the work, on the host.
  void release_after(std::span<const ChunkHandle> chunks,
                     std::span<const std::shared_ptr<const Event>> work);
  // Gives the daemon every page of `device` this process holds but does not use (spare and
  // released ones), waiting for its answer. Returns the pages given.
  std::size_t give_back(int device);

  // Pages held from the daemon, on `device`: handed out plus waiting to be.
  [[nodiscard]] std::size_t held(int device) const;
  // Of those, the pages handed out as chunks and not released: what the memory manager holds.
  [[nodiscard]] std::size_t in_use(int device) const;
  [[nodiscard]] const FencePool& fences() const { return fences_; }
  [[nodiscard]] FencePool& fences() { return fences_; }
  // Fences of granted pages that could not be opened (taken as passed: see import_fences).
  [[nodiscard]] std::uint64_t unopened_fences() const;

 private:
  struct DevicePages {
    std::vector<ChunkHandle> spare;        // fetched, not handed out yet
    std::vector<std::uint64_t> returning;  // released with no work pending, not given back yet
    std::size_t held = 0;                  // handed out, spare, or returning
  };
  // Pages to give back: released ones (nothing pending) and spare ones (never used here: the
  // fence they came with, if any, still holds), with the local references to let go.
  struct Returns {
    std::vector<std::uint64_t> settled;
    std::vector<std::uint64_t> untouched;
    std::vector<ChunkHandle> chunks;
  };
  // Pages given back behind work: this process's references, kept until `fence` completes.
  struct Deferred {
    std::vector<ChunkHandle> chunks;
    FencePool::Fence* fence = nullptr;  // recycled once complete
  };
  // A batch of the daemon's pages imported here, each with its fence (null: none), in order.
  struct Batch {
    std::vector<std::pair<ChunkHandle, std::uint64_t>> pages;  // chunk here, page id there
    std::vector<std::shared_ptr<const Event>> fences;
  };
  struct HeldPage {
    std::uint64_t id = 0;  // the daemon's
    int device = 0;
  };

  void fetch(int device, DevicePages& pages, std::unique_lock<std::mutex>& lock);
  bool release_page(ChunkHandle chunk);  // release, for release_after too
  // The round trip of fetch, without mu_: gives `released` back, then takes and imports a batch.
  // Pages it could not import go back; throws when it imported none.
  Batch take_batch(int device, const std::vector<std::uint64_t>& released);
  // A batch whose descriptors did not fit in this process (fds_cut): its pages go back, and it
  // throws DeviceError EMFILE naming the descriptor limit.
  [[noreturn]] void refuse_cut_batch(int device, const std::vector<PageEntry>& entries);
  // The fences of a Pages reply as events of this process (null for one that could not be
  // opened: its process has exited, and its work with it).
  std::vector<std::shared_ptr<const Event>> import_fences(int device,
                                                          const std::vector<FenceEntry>& fences,
                                                          const std::vector<UniqueFd>& fds);
  Returns collect_returns(DevicePages& pages);  // with mu_ held; releases nothing itself
  void send_returns(int device, const Returns& back, bool wait);  // and lets go of its chunks
  void send_returns(int device, const std::vector<std::uint64_t>& ids, GiveFence mode, bool wait);
  // The daemon's pages among `chunks` go back behind `pending` (release_after); returns those
  // that did not: the chunks that are not its pages, and its pages where the driver has no
  // interprocess events.
  std::vector<ChunkHandle> give_back_fenced(std::span<const ChunkHandle> chunks,
                                            std::span<const std::shared_ptr<const Event>> pending);
  // Gives `ids` (pages of `device`) back behind `work`; false when this driver has no
  // interprocess events (the caller then waits on the host).
  bool give_back_fenced(int device, std::vector<ChunkHandle> chunks,
                        const std::vector<std::uint64_t>& ids,
                        std::span<const std::shared_ptr<const Event>> work);
  StreamHandle fence_stream(int device);
  void reap();  // releases the deferred references whose fence has completed

  const std::shared_ptr<DeviceBackend> local_;
  const std::shared_ptr<DaemonLink> link_;
  const std::size_t page_bytes_;
  FencePool fences_;  // has its own lock

  mutable std::mutex mu_;
  std::vector<DevicePages> devices_;
  std::unordered_map<std::uint64_t, HeldPage> page_of_chunk_;  // by local chunk handle
  // Work of another process that fetched pages may still be under, until take_arrival.
  std::unordered_map<std::uint64_t, std::shared_ptr<const Event>> arrivals_;
  std::vector<Deferred> deferred_;
  std::vector<StreamHandle> fence_streams_;  // per device, made on first use (0: none yet)
  std::vector<bool> fetching_;  // a fetch for the device is under way (others wait for it)
  std::uint64_t unopened_fences_ = 0;
  std::condition_variable fetched_;
};

}  // namespace salus::remote
