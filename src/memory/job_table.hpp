// Jobs as the memory manager sees them: a name, budgets and live byte counts per lifetime class.
// Records are never removed, so ids stay unique and a stale id is detectable.
#pragma once

#include <oneapi/tbb/concurrent_vector.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "memory/counter.hpp"
#include "memory/tiers.hpp"
#include "salus/memory.hpp"

namespace salus::memory {

class StreamHeap;

struct JobRecord {
  JobRecord(JobId id, std::string name, JobMemoryLimits limits);

  const JobId id;
  const std::string name;
  std::atomic<bool> alive{true};
  std::atomic<std::size_t> limit_total;
  std::atomic<std::size_t> limit_by_class[kLifetimeCount];
  Counter in_use;                     // live bytes, both classes
  Counter by_class[kLifetimeCount];   // live bytes by class
  std::atomic<std::uint64_t> promoted{0};

  // Safe points: whether its pages may move, and who is moving them. Guarded by activity_mu.
  mutable std::mutex activity_mu;
  std::condition_variable activity_cv;
  bool active = true;       // it may be enqueueing GPU work: its pages stay put
  bool activating = false;  // activate_job is waiting for moves to finish: no new ones start
  int moving = 0;           // rounds that hold its pages right now
  bool away = false;        // some of its pages moved down while it was quiescent
  // Per stream it had blocks on or works on: an event recorded when it turned quiescent.
  std::vector<QuietMark> quiet_marks;

  // Streams it enqueues work on besides those it allocates on (add_job_stream), by device. Guarded
  // by streams_mu, a leaf lock (taken under stream heap locks, never the other way round);
  // `has_streams` lets frees of jobs without any skip the lock.
  mutable std::mutex streams_mu;
  std::vector<std::pair<int, StreamHandle>> streams;
  std::atomic<bool> has_streams{false};
  // The stream heaps it has had blocks in, each once, on any device (one it no longer uses may
  // stay listed: a visit finds nothing there), so that release, promote, statistics and page
  // moves visit those and not every heap. A heap is added under its own lock when its ledger
  // makes the job's entry, before the allocation checks `alive` (see StreamHeap::allocate); the
  // readers copy the list. Guarded by heaps_mu, a leaf lock like streams_mu. Heaps live as
  // long as the manager, so the pointers stay valid.
  mutable std::mutex heaps_mu;
  std::vector<StreamHeap*> heaps;
  std::atomic<std::uint64_t> activations{0};
  std::atomic<std::uint64_t> activations_after_move{0};
  std::atomic<std::uint64_t> activations_waited{0};
  std::atomic<std::uint64_t> fetched_bytes{0};
  std::atomic<std::uint64_t> prefetched_bytes{0};

  // The running iteration's ephemeral bytes over time (memory/curves.hpp), while `sampling`:
  // each ephemeral allocation and free appends (seconds since curve_start, ephemeral bytes above
  // curve_base). The allocating thread samples under curve_mu, a leaf lock of the job's own: no
  // other job's allocations meet it.
  std::atomic<bool> sampling{false};
  mutable std::mutex curve_mu;
  std::chrono::steady_clock::time_point curve_start;  // guarded by curve_mu, as below
  std::size_t curve_base = 0;
  std::vector<std::pair<double, std::size_t>> curve;
  // Appends the level now, if sampling.
  void sample_curve();

  // The counts one charge produced: the peaks are raised to them once the bytes are placed.
  struct Charge {
    std::size_t total = 0;
    std::size_t in_class = 0;
  };

  void set_limits(const JobMemoryLimits& limits);
  // Charges `bytes` against the budgets; on refusal nothing changes and the reason is returned.
  // The peaks are not raised here: an allocation may still fail to be placed after its charge
  // (and be uncharged), and a request that failed must not show in the peaks. The caller calls
  // raise_peaks with `produced` once the block exists.
  [[nodiscard]] std::optional<std::string> try_charge(Lifetime lifetime, std::size_t bytes,
                                                      Charge& produced);
  void raise_peaks(Lifetime lifetime, const Charge& produced);
  void uncharge(Lifetime lifetime, std::size_t bytes);
  // Moves bytes between classes without a budget check: promotion cannot fail.
  void move_class(Lifetime from, Lifetime to, std::size_t bytes);
  // Lists `heap` among those it uses (once).
  void note_heap(StreamHeap* heap);
  // The heaps it has had blocks in, on `device` (-1: every device).
  [[nodiscard]] std::vector<StreamHeap*> heaps_used(int device = -1) const;
};

// Lets a job's pages move only while it is quiescent and not being activated.
class JobTable final : public JobGate {
 public:
  JobTable();
  JobId add(std::string name, JobMemoryLimits limits);
  // The live record of `job`; throws UnknownJob for ids never handed out or released.
  [[nodiscard]] JobRecord& live(JobId job) const;
  // The record whether live or released; throws UnknownJob for ids never handed out.
  [[nodiscard]] JobRecord& any(JobId job) const;
  // The record of `job` once fully registered, else nullptr.
  [[nodiscard]] JobRecord* find(JobId job) const;
  // Ids below this are fully registered.
  [[nodiscard]] std::size_t size() const { return registered_.load(std::memory_order_acquire); }

  // Appends the streams `job` works on on `device` (add_job_stream); none for unknown ids.
  void streams_of(JobId job, int device, std::vector<StreamHandle>& out) const;
  // The same for a record in hand (the free path has it: no lookup by id).
  static void streams_of(const JobRecord& record, int device, std::vector<StreamHandle>& out);
  void add_stream(JobId job, int device, StreamHandle stream);
  // `stream` of `device` is retired: no job works on it any more. Returns the jobs that did.
  std::vector<JobId> remove_stream(int device, StreamHandle stream);

  bool try_hold(JobId job) override;
  void release(JobId job) override;
  bool may_move(JobId job) override;
  std::shared_ptr<const Event> quiet_mark(JobId job, int device, StreamHandle stream) override;

 private:
  // A slot exists before its record does (the id is the slot's index), so readers see the record
  // only through `published`.
  struct Slot {
    std::atomic<JobRecord*> published{nullptr};
    std::unique_ptr<JobRecord> owner;  // written once, by the registering thread
  };
  tbb::concurrent_vector<Slot> jobs_;
  // The vector's own size counts slots still being constructed, which readers must not touch:
  // registrations are serialized and publish their slot by raising this count.
  std::mutex add_mu_;
  std::atomic<std::size_t> registered_{0};
};

}  // namespace salus::memory
