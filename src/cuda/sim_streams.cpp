// SimBackend streams (one worker thread each), events and async copies.
//
// The default stream of each device is an ordinary in-order stream here: the simulator does not
// model the legacy default stream's implicit synchronization with other streams.
#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <sys/prctl.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <stop_token>
#include <thread>

#include "cuda/sim_backend.hpp"

namespace salus::sim {

struct SimBackend::Stream {
  Stream(int device_index, int priority_value)
      : device(device_index),
        priority(priority_value),
        worker([this](std::stop_token st) { run(st); }) {}

  // Throws when the stream is being destroyed: its worker may already have left.
  void push(Task task) {
    {
      std::lock_guard lock(mutex);
      if (closing) throw InvalidArgument("stream is being destroyed");
      queue.push_back(std::move(task));
      ++enqueued;
    }
    work_cv.notify_one();
  }

  [[nodiscard]] bool idle() {
    std::lock_guard lock(mutex);
    return completed >= enqueued;
  }

  void synchronize() {
    std::unique_lock lock(mutex);
    const std::uint64_t target = enqueued;
    done_cv.wait(lock, [&] { return completed >= target; });
  }

  // Runs what is queued, then joins. With `cancel_waits`, event waits give up at once (shutdown).
  void close(bool cancel_waits) {
    {
      std::lock_guard lock(mutex);
      closing = true;
    }
    work_cv.notify_all();
    if (cancel_waits) worker.request_stop();
  }

  void join() {
    if (worker.joinable()) worker.join();
  }

  const int device;
  const int priority;  // recorded only: host threads have no GPU scheduler to honour it

 private:
  void run(std::stop_token st) {
    // Throttled copies sleep out their link time; Linux's default 50 us timer slack would add to
    // every one of them (3-5% of a 2 MiB copy at the scaled link speeds the studies use).
    ::prctl(PR_SET_TIMERSLACK, 1000UL);
    std::unique_lock lock(mutex);
    for (;;) {
      // A stop request also wakes this wait, so a stopped stream drains and leaves.
      work_cv.wait(lock, st, [&] { return !queue.empty() || closing; });
      if (queue.empty()) {
        if (closing || st.stop_requested()) return;
        continue;
      }
      Task task = std::move(queue.front());
      queue.pop_front();
      lock.unlock();
      try {
        task(st);
      } catch (const std::exception& e) {
        // A GPU keeps running after a failing host callback; so does the simulated stream.
        spdlog::error("sim stream (device {}): host function threw: {}", device, e.what());
      } catch (...) {
        spdlog::error("sim stream (device {}): host function threw a non-standard exception",
                      device);
      }
      lock.lock();
      ++completed;
      done_cv.notify_all();
    }
  }

  std::mutex mutex;
  std::condition_variable_any work_cv;
  std::condition_variable done_cv;
  std::deque<Task> queue;
  std::uint64_t enqueued = 0;
  std::uint64_t completed = 0;
  bool closing = false;
  std::jthread worker;  // last: starts once the state above exists, joins before it goes
};

// Generation counters: each record bumps `recorded`; the marker's task raises `completed`.
struct SimBackend::Event {
  explicit Event(int device_index) : device(device_index) {}
  [[nodiscard]] bool done() const { return completed >= recorded; }

  const int device;
  std::mutex mutex;
  std::condition_variable_any cv;
  std::uint64_t recorded = 0;
  std::uint64_t completed = 0;
};

std::shared_ptr<SimBackend::Stream> SimBackend::stream_for(StreamHandle stream, int device) {
  std::lock_guard lock(stream_mutex_);
  if (stream.value == 0) {
    check_device(device, "default stream");
    auto& fallback = default_streams_[static_cast<std::size_t>(device)];
    if (!fallback) fallback = std::make_shared<Stream>(device, config_.priorities.least);
    return fallback;
  }
  auto it = streams_.find(stream.value);
  if (it == streams_.end()) {
    throw InvalidArgument(
        fmt::format("unknown stream {} (never created or destroyed)", stream.value));
  }
  return it->second;
}

std::shared_ptr<SimBackend::Event> SimBackend::event_for(EventHandle event) const {
  std::lock_guard lock(stream_mutex_);
  auto it = events_.find(event.value);
  if (it == events_.end()) {
    throw InvalidArgument(
        fmt::format("unknown event {} (never created or destroyed)", event.value));
  }
  return it->second;
}

StreamHandle SimBackend::create_stream(int device, int priority) {
  check_device(device, "create_stream");
  // Like cuStreamCreateWithPriority, out-of-range priorities are clamped, not refused.
  const int clamped = std::clamp(priority, config_.priorities.greatest, config_.priorities.least);
  std::lock_guard lock(stream_mutex_);
  const std::uint64_t id = next_stream_++;
  streams_.emplace(id, std::make_shared<Stream>(device, clamped));
  return StreamHandle{id};
}

void SimBackend::destroy_stream(StreamHandle stream) {
  if (stream.value == 0)
    throw InvalidArgument("destroy_stream: the default stream cannot be destroyed");
  std::shared_ptr<Stream> victim;
  {
    std::lock_guard lock(stream_mutex_);
    auto it = streams_.find(stream.value);
    if (it == streams_.end()) {
      throw InvalidArgument(fmt::format("destroy_stream: unknown stream {}", stream.value));
    }
    victim = std::move(it->second);
    streams_.erase(it);
  }
  victim->close(false);
  victim->join();
}

void SimBackend::synchronize_stream(StreamHandle stream) {
  stream_for(stream, 0)->synchronize();
}

void SimBackend::validate_stream(StreamHandle stream, int device) {
  check_device(device, "validate_stream");
  if (stream.value == 0) return;
  int owner = -1;
  {
    std::lock_guard lock(stream_mutex_);
    auto it = streams_.find(stream.value);
    if (it != streams_.end()) owner = it->second->device;
  }
  if (owner < 0) {
    throw InvalidArgument(fmt::format(
        "stream {:#x} is no stream of the sim backend (never created, or destroyed)", stream.value));
  }
  if (owner != device) {
    throw InvalidArgument(
        fmt::format("stream {:#x} belongs to device {}, not device {}", stream.value, owner, device));
  }
}

bool SimBackend::query_stream(StreamHandle stream, int device) {
  return stream_for(stream, device)->idle();
}

EventHandle SimBackend::create_event(int device) {
  check_device(device, "create_event");
  std::lock_guard lock(stream_mutex_);
  const std::uint64_t id = next_event_++;
  events_.emplace(id, std::make_shared<Event>(device));
  return EventHandle{id};
}

void SimBackend::destroy_event(EventHandle event) {
  // Pending records and waits hold their own reference, so they still complete.
  std::lock_guard lock(stream_mutex_);
  if (events_.erase(event.value) == 0) {
    throw InvalidArgument(fmt::format("destroy_event: unknown event {}", event.value));
  }
}

void SimBackend::record_event(EventHandle event, StreamHandle stream) {
  auto ev = event_for(event);
  auto target = stream_for(stream, ev->device);
  // Holding the event lock across push keeps generations in record order and lets a refused
  // push leave the event untouched.
  std::lock_guard lock(ev->mutex);
  const std::uint64_t generation = ev->recorded + 1;
  target->push([ev, generation](std::stop_token) {
    {
      std::lock_guard done(ev->mutex);
      ev->completed = std::max(ev->completed, generation);
    }
    ev->cv.notify_all();
  });
  ev->recorded = generation;
}

bool SimBackend::query_event(EventHandle event) {
  auto ev = event_for(event);
  std::lock_guard lock(ev->mutex);
  return ev->done();
}

void SimBackend::synchronize_event(EventHandle event) {
  auto ev = event_for(event);
  std::unique_lock lock(ev->mutex);
  const std::uint64_t target = ev->recorded;
  ev->cv.wait(lock, [&] { return ev->completed >= target; });
}

void SimBackend::stream_wait_event(StreamHandle stream, EventHandle event, int device) {
  auto ev = event_for(event);
  auto waiter = stream_for(stream, device);
  std::lock_guard lock(ev->mutex);
  // The wait is for the record captured now; later records must not move it (as in CUDA).
  const std::uint64_t target = ev->recorded;
  if (ev->completed >= target) return;
  waiter->push([ev, target](std::stop_token st) {
    std::unique_lock wait_lock(ev->mutex);
    // Shutdown (a stop request) releases the wait even if the event never completes.
    ev->cv.wait(wait_lock, st, [&] { return ev->completed >= target; });
  });
}

void SimBackend::launch_host_func(StreamHandle stream, std::function<void()> fn) {
  if (!fn) throw InvalidArgument("launch_host_func: empty function");
  stream_for(stream, 0)->push([fn = std::move(fn)](std::stop_token) { fn(); });
}

double SimBackend::copy_bandwidth_gbps(std::optional<Location> dst,
                                       std::optional<Location> src) const {
  auto device_of = [](std::optional<Location> where) -> std::optional<int> {
    if (!where || where->is_host()) return std::nullopt;
    return where->index;
  };
  const auto d = device_of(dst);
  const auto s = device_of(src);
  if (!d && !s) return 0.0;  // host to host: memcpy speed
  if (d && s) {
    if (*d == *s) return config_.local_bandwidth_gbps;
    const auto& link = links_[static_cast<std::size_t>(*s)][static_cast<std::size_t>(*d)];
    if (link) return link->bandwidth_gbps;
  }
  return config_.host_link_bandwidth_gbps;
}

void SimBackend::copy_async(DevicePtr dst, DevicePtr src, std::size_t bytes, StreamHandle stream) {
  double gbps = 0.0;
  {
    std::lock_guard lock(mem_mutex_);
    const bool src_ok = range_usable(src, bytes, false);
    if (!src_ok || !range_usable(dst, bytes, true)) {
      throw DeviceError(
          "cuMemcpyAsync", "CUDA_ERROR_INVALID_VALUE", kCudaErrorInvalidValue,
          fmt::format("{} [{:#x}, +{}) is not {} memory", src_ok ? "destination" : "source",
                      src_ok ? dst : src, bytes, src_ok ? "writable" : "readable"));
    }
    // A copy spanning several locations is timed by the link of its first bytes.
    if (config_.throttle_copies)
      gbps = copy_bandwidth_gbps(physical_location(dst), physical_location(src));
  }
  auto target = stream_for(stream, 0);
  if (bytes == 0) return;
  target->push([dst, src, bytes, gbps](std::stop_token st) {
    const auto start = std::chrono::steady_clock::now();
    std::memmove(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), bytes);
    if (gbps <= 0.0) return;
    const auto deadline =
        start + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                    std::chrono::duration<double>(static_cast<double>(bytes) / (gbps * 1e9)));
    // Sleep out the link time, but let shutdown cut it short.
    std::mutex m;
    std::condition_variable_any cv;
    std::unique_lock lock(m);
    cv.wait_until(lock, st, deadline, [] { return false; });
  });
}

void SimBackend::shutdown_streams() noexcept {
  std::vector<std::shared_ptr<Stream>> all;
  {
    std::lock_guard lock(stream_mutex_);
    for (auto& [id, stream] : streams_) all.push_back(std::move(stream));
    for (auto& stream : default_streams_) {
      if (stream) all.push_back(std::move(stream));
    }
    streams_.clear();
    events_.clear();
  }
  // Stop every stream before joining any: a stream may be waiting on another's event.
  for (auto& stream : all) stream->close(true);
  for (auto& stream : all) stream->join();
}

}  // namespace salus::sim
