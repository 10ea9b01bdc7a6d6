// Internal: the sim backend's stream and event objects (SimStreams keeps the tables of them).
//
// SimStream (sim_stream.cpp) is one worker thread running a queue in order; SimEvent is an
// event's generation counters; SharedEventMemory (sim_shared_events.cpp) is a shareable event's
// counters in shared memory. Each guards its own state with its own mutex. Lock order, where two
// are held at once: an event's mutex, then a stream's (a record or a wait pushes its task while
// holding the event's). A stream's worker runs its tasks without its own lock.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <stop_token>
#include <thread>
#include <utility>
#include <vector>

#include "salus/device.hpp"

namespace salus::sim {

// What a stream runs: a stop request means shutdown (waits give up, sleeps end early).
using SimTask = std::function<void(std::stop_token)>;

// Where and when a stream reached an event's record.
struct EventCapture {
  int device = 0;
  std::uint64_t stream = 0;   // SimStream::id
  double busy_seconds = 0.0;  // the stream's busy clock then
  std::chrono::steady_clock::time_point at{};
};

// One worker thread running the stream's tasks in order.
class SimStream {
 public:
  // `id` is the stream's handle value (0 for a device's default stream); ids are never reused.
  // `tasks` counts what push hands to the worker (the device's SimDeviceActivity::stream_tasks).
  SimStream(int device_index, int priority_value, std::uint64_t id_value,
            std::atomic<std::uint64_t>& tasks);

  // Throws when the stream is being destroyed: its worker may already have left.
  void push(SimTask task);
  [[nodiscard]] bool idle();
  // As idle(), without the stream's lock (one atomic read): what fences ask on a free.
  [[nodiscard]] bool idle_now() const { return pending.load(std::memory_order_acquire) == 0; }
  // Where and when the stream is now, if it is idle (everything enqueued has run): an event
  // recorded now completes at once there, with no task for the worker.
  [[nodiscard]] std::optional<EventCapture> capture_if_idle();
  void synchronize();
  // Runs what is queued, then joins. With `cancel_waits`, event waits give up at once (shutdown).
  void close(bool cancel_waits);
  void join();

  // The stream's busy clock: seconds it has spent running kernels and copies (not host functions,
  // not waits for other streams). Only tasks touch it, and they all run on the worker thread, so
  // it needs no lock: read it from a task of this stream (or under the stream's lock once it is
  // idle, as capture_if_idle does).
  [[nodiscard]] double busy_seconds() const noexcept { return busy; }
  void add_busy(double seconds) noexcept { busy += seconds; }

  const int device;
  const int priority;  // recorded only: host threads have no GPU scheduler to honour it
  const std::uint64_t id;

 private:
  void run(const std::stop_token& st);

  std::mutex mutex;
  std::condition_variable_any work_cv;
  std::condition_variable done_cv;
  std::deque<SimTask> queue;
  std::uint64_t enqueued = 0;
  std::uint64_t completed = 0;
  std::atomic<std::uint64_t> pending{0};  // enqueued - completed, readable without the lock
  bool closing = false;
  double busy = 0.0;    // written by the worker only (see busy_seconds)
  std::atomic<std::uint64_t>& tasks_handed;
  std::jthread worker;  // last: starts once the state above exists, joins before it goes
};

// A shareable event's state, in shared memory (sim_shared_events.cpp): the generation counters
// as another process sees them, and who records them.
class SharedEventMemory {
 public:
  // A fresh page, sealed at its size, naming this process (create_shareable_event).
  static std::shared_ptr<SharedEventMemory> create();
  // Maps what another process exported; InvalidArgument when `shared` is no such page, or one
  // its sender could still shrink (import_event).
  static std::shared_ptr<SharedEventMemory> open(const SharedEvent& shared);

  SharedEventMemory(int fd, void* mapping);
  ~SharedEventMemory();
  SharedEventMemory(const SharedEventMemory&) = delete;
  SharedEventMemory& operator=(const SharedEventMemory&) = delete;
  // What export_event hands out: a duplicate of the descriptor, and handle bytes naming it.
  [[nodiscard]] SharedEvent exported() const;
  void publish_recorded(std::uint64_t generation);
  void publish_completed(std::uint64_t generation);
  [[nodiscard]] std::uint64_t recorded() const;
  // Reached `generation`, or the exporting process has exited (its work is gone with it).
  [[nodiscard]] bool reached(std::uint64_t generation) const;
  // Polls until reached(generation) or a stop request.
  void wait(std::uint64_t generation, const std::stop_token& st) const;

  struct State;  // sim_shared_events.cpp
  const int fd;  // owned: exported() duplicates it

 private:
  State* const state;
};

// Generations: each record bumps `recorded` and stays `pending` until its marker's task runs (at
// once on an idle stream). As with CUDA, a wait or a query is for one record: a wait made for
// generation g ends when g has run, whatever later records do (an event recorded again on an
// idle stream completes at once, while the older record on a busy stream has not: a pooled
// event re-recorded must not release the waits of its last use). A shareable event also
// publishes both counts to its shared memory; an imported one has only that memory (another
// process records it), which every query and wait reads.
struct SimEvent {
  SimEvent(int device_index, bool timing_event) : device(device_index), timing(timing_event) {}
  [[nodiscard]] bool done() const {
    return imported ? shared->reached(shared->recorded()) : reached(recorded);
  }
  // Record `generation` (at most `recorded`) has run. With the lock held.
  [[nodiscard]] bool reached(std::uint64_t generation) const {
    return std::find(pending.begin(), pending.end(), generation) == pending.end();
  }

  const int device;
  const bool timing;  // made by create_timing_event: elapsed_seconds may read it
  std::shared_ptr<SharedEventMemory> shared;  // set once, before the event is listed
  bool imported = false;                      // set once, before the event is listed
  std::mutex mutex;   // guards everything below
  std::condition_variable_any cv;
  std::uint64_t recorded = 0;
  std::vector<std::uint64_t> pending;  // records whose marker has not run (a few at most)
  std::uint64_t captured = 0;          // the generation of `last`
  std::optional<EventCapture> last;    // of the newest completed record
};

}  // namespace salus::sim
