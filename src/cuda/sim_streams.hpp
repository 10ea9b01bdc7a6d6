// Internal: the sim backend's streams and events (SimBackend forwards to it).
//
// Owns the tables of streams (each a worker thread, sim_stream.hpp) and events (plain, timing,
// shareable and imported ones), the per-device counters of tasks handed to stream threads, and
// the shutdown that stops and joins every worker. Memory is SimMemory's: nothing here touches it,
// and SimBackend never calls one while holding the other's lock.
//
// Lock rule: `mutex_` guards the tables and the id counters. Every public method takes it at most
// once at a time (a few take it twice in a row, as the backend always did: a wait looks up the
// event, then the stream) and releases it before it touches a stream's or an event's own mutex;
// a device's default stream is started under it, on first use. Streams and events are handed out
// as shared_ptr, so destroying one while a caller or a queued task still uses it is safe.
//
// Fork: an object made before fork() is the parent's (its threads are not in the child). In a
// child, making streams or events and looking them up (so every enqueue, record, wait and query)
// throws NotSupported, and shutdown leaks the streams instead of joining them.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

#include "cuda/process_fork.hpp"
#include "cuda/sim_stream.hpp"
#include "salus/device.hpp"

namespace salus::sim {

class SimStreams {
 public:
  // `priorities`: what new streams are clamped to; default streams get the least urgent.
  SimStreams(int device_count, StreamPriorityRange priorities, process::Birth birth);
  SimStreams(const SimStreams&) = delete;
  SimStreams& operator=(const SimStreams&) = delete;
  ~SimStreams();  // shutdown()

  // Streams. Handle 0 is `device`'s default stream; `device` must be in range.
  StreamHandle create_stream(int device, int priority);
  // Runs what is queued on it, then joins its worker.
  void destroy_stream(StreamHandle stream);
  [[nodiscard]] std::shared_ptr<SimStream> stream(StreamHandle stream, int device);
  // InvalidArgument unless `stream` is 0 or a live stream of `device`.
  void validate_stream(StreamHandle stream, int device);

  // Events. `device` must be in range.
  EventHandle create_event(int device, bool timing);
  EventHandle create_shareable_event(int device);
  [[nodiscard]] SharedEvent export_event(EventHandle event);
  EventHandle import_event(int device, const SharedEvent& shared);
  void destroy_event(EventHandle event);
  // True when the record is pending (queued behind work); false when it completed at once.
  bool record_event(EventHandle event, StreamHandle stream);
  [[nodiscard]] bool query_event(EventHandle event);
  void synchronize_event(EventHandle event);
  void stream_wait_event(StreamHandle stream, EventHandle event, int device);
  [[nodiscard]] double elapsed_seconds(EventHandle start, EventHandle end);

  // Tasks handed to `device`'s stream threads so far (SimDeviceActivity::stream_tasks).
  [[nodiscard]] std::uint64_t tasks_handed(int device) const {
    return tasks_of(device).load(std::memory_order_relaxed);
  }
  // Stops every stream (event waits give up), joins them and forgets every event. Idempotent.
  void shutdown() noexcept;

 private:
  // Throws NotSupported in a forked child: the stream threads are the parent's (nothing would
  // run what is enqueued).
  void check_process(const char* what) const;
  std::shared_ptr<SimStream> stream_for(StreamHandle stream, int device);     // takes mutex_
  std::shared_ptr<SimStream> stream_locked(StreamHandle stream, int device);  // mutex_ held
  std::shared_ptr<SimEvent> event_for(EventHandle event) const;               // takes mutex_
  std::shared_ptr<SimEvent> event_locked(EventHandle event) const;            // mutex_ held
  // Both at once, under one lock (a record's hot path): `stream` of the event's device.
  std::pair<std::shared_ptr<SimEvent>, std::shared_ptr<SimStream>> event_and_stream(
      EventHandle event, StreamHandle stream);
  EventHandle add_event(std::shared_ptr<SimEvent> event);  // takes mutex_
  // The newest completed record of a timing event, or the error elapsed_seconds raises; `role`
  // ("start" or "end") names the event in messages.
  static EventCapture timing_capture(const std::shared_ptr<SimEvent>& ev, EventHandle handle,
                                     const char* role);
  [[nodiscard]] std::atomic<std::uint64_t>& tasks_of(int device) const {
    return stream_tasks_[static_cast<std::size_t>(device)];
  }

  const StreamPriorityRange priorities_;
  const process::Birth birth_;
  // Per device: tasks handed to its stream threads. Fixed size; the streams count into it.
  std::unique_ptr<std::atomic<std::uint64_t>[]> stream_tasks_;

  mutable std::mutex mutex_;
  std::unordered_map<std::uint64_t, std::shared_ptr<SimStream>> streams_;
  std::vector<std::shared_ptr<SimStream>> default_streams_;  // per device, started on first use
  std::unordered_map<std::uint64_t, std::shared_ptr<SimEvent>> events_;
  std::uint64_t next_stream_ = 1;
  std::uint64_t next_event_ = 1;
};

}  // namespace salus::sim
