// SimBackend streams (one worker thread each), host functions, simulated kernels and async
// copies. Events live in sim_events.cpp.
//
// The default stream of each device is an ordinary in-order stream here: the simulator does not
// model the legacy default stream's implicit synchronization with other streams.
#include <fmt/format.h>
#include <sys/prctl.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <stop_token>

#include "cuda/process_fork.hpp"
#include "cuda/sim_compute.hpp"
#include "cuda/sim_stream.hpp"
#include "log/log.hpp"

namespace salus::sim {

SimBackend::Stream::Stream(int device_index, int priority_value, std::uint64_t id_value,
                           std::atomic<std::uint64_t>& tasks)
    : device(device_index),
      priority(priority_value),
      id(id_value),
      tasks_handed(tasks),
      worker(process::running_thread([this](std::stop_token st) { run(st); })) {}

void SimBackend::Stream::push(Task task) {
  {
    std::lock_guard lock(mutex);
    if (closing) throw InvalidArgument("stream is being destroyed");
    queue.push_back(std::move(task));
    ++enqueued;
    pending.fetch_add(1, std::memory_order_relaxed);
  }
  tasks_handed.fetch_add(1, std::memory_order_relaxed);
  work_cv.notify_one();
}

bool SimBackend::Stream::idle() {
  std::lock_guard lock(mutex);
  return completed >= enqueued;
}

std::optional<SimBackend::EventCapture> SimBackend::Stream::capture_if_idle() {
  std::lock_guard lock(mutex);
  if (completed < enqueued) return std::nullopt;
  // The worker wrote `busy` before it counted its last task complete under this lock.
  return EventCapture{device, id, busy, std::chrono::steady_clock::now()};
}

void SimBackend::Stream::synchronize() {
  std::unique_lock lock(mutex);
  const std::uint64_t target = enqueued;
  done_cv.wait(lock, [&] { return completed >= target; });
}

void SimBackend::Stream::close(bool cancel_waits) {
  {
    std::lock_guard lock(mutex);
    closing = true;
  }
  work_cv.notify_all();
  if (cancel_waits) worker.request_stop();
}

void SimBackend::Stream::join() {
  if (worker.joinable()) worker.join();
}

void SimBackend::Stream::run(const std::stop_token& st) {
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
      log::error("sim stream (device {}): host function threw: {}", device, e.what());
    } catch (...) {
      log::error("sim stream (device {}): host function threw a non-standard exception", device);
    }
    lock.lock();
    ++completed;
    pending.fetch_sub(1, std::memory_order_release);
    done_cv.notify_all();
  }
}

std::shared_ptr<SimBackend::Stream> SimBackend::stream_for(StreamHandle stream, int device) {
  check_process("this simulated GPU's stream");
  std::lock_guard lock(stream_mutex_);
  return stream_locked(stream, device);
}

std::shared_ptr<SimBackend::Stream> SimBackend::stream_locked(StreamHandle stream, int device) {
  if (stream.value == 0) {
    auto& fallback = default_streams_[static_cast<std::size_t>(device)];
    if (!fallback) fallback = std::make_shared<Stream>(device, config_.priorities.least, 0, tasks_of(device));
    return fallback;
  }
  auto it = streams_.find(stream.value);
  if (it == streams_.end()) {
    throw InvalidArgument(
        fmt::format("unknown stream {} (never created or destroyed)", stream.value));
  }
  return it->second;
}

StreamHandle SimBackend::do_create_stream(int device, int priority) {
  check_process("this simulated GPU");
  // Like cuStreamCreateWithPriority, out-of-range priorities are clamped, not refused.
  const int clamped = std::clamp(priority, config_.priorities.greatest, config_.priorities.least);
  std::lock_guard lock(stream_mutex_);
  const std::uint64_t id = next_stream_++;
  streams_.emplace(id, std::make_shared<Stream>(device, clamped, id, tasks_of(device)));
  return StreamHandle{id};
}

void SimBackend::do_destroy_stream(StreamHandle stream) {
  check_process("this simulated GPU's stream");
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

void SimBackend::do_synchronize_stream(StreamHandle stream) {
  stream_for(stream, 0)->synchronize();
}

void SimBackend::do_validate_stream(StreamHandle stream, int device) {
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

bool SimBackend::do_query_stream(StreamHandle stream, int device) {
  return stream_for(stream, device)->idle();
}

bool SimBackend::do_stream_known_idle(StreamHandle stream, int device) {
  return stream_for(stream, device)->idle_now();
}

void SimBackend::do_launch_host_func(StreamHandle stream, std::function<void()> fn) {
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

void SimBackend::do_copy_async(DevicePtr dst, DevicePtr src, std::size_t bytes,
                               StreamHandle stream) {
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
  // The task runs on `on`'s worker, which outlives it: a raw pointer keeps the queue from owning
  // its own stream.
  target->push([dst, src, bytes, gbps, on = target.get()](std::stop_token st) {
    const auto start = std::chrono::steady_clock::now();
    std::memmove(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), bytes);
    const double memmove_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const double link_seconds = gbps > 0.0 ? static_cast<double>(bytes) / (gbps * 1e9) : 0.0;
    // The stream was busy for the copy's own time: the link's when throttled. A late wakeup
    // from the sleep below is the host's noise, not the copy's.
    on->add_busy(std::max(memmove_seconds, link_seconds));
    if (link_seconds <= memmove_seconds) return;
    const auto deadline = start + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                      std::chrono::duration<double>(link_seconds));
    // Sleep out the link time, but let shutdown cut it short.
    std::mutex m;
    std::condition_variable_any cv;
    std::unique_lock lock(m);
    cv.wait_until(lock, st, deadline, [] { return false; });
  });
}

void SimBackend::do_fill_async(DevicePtr dst, std::uint8_t value, std::size_t bytes,
                               StreamHandle stream) {
  {
    std::lock_guard lock(mem_mutex_);
    if (!range_usable(dst, bytes, true)) {
      throw DeviceError("cuMemsetD8Async", "CUDA_ERROR_INVALID_VALUE", kCudaErrorInvalidValue,
                        fmt::format("[{:#x}, +{}) is not writable memory", dst, bytes));
    }
  }
  auto target = stream_for(stream, 0);
  target->push([dst, value, bytes, on = target.get()](std::stop_token) {
    const auto start = std::chrono::steady_clock::now();
    std::memset(reinterpret_cast<void*>(dst), value, bytes);
    on->add_busy(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  });
}

void SimBackend::launch_kernel(StreamHandle stream, int device, double seconds, double occupancy) {
  check_device(device, "launch_sim_kernel");
  auto target = stream_for(stream, device);
  if (target->device != device) {
    throw InvalidArgument(fmt::format("launch_sim_kernel: stream {:#x} belongs to device {}, not {}",
                                      stream.value, target->device, device));
  }
  ComputeEngine* engine = engines_[static_cast<std::size_t>(device)].get();
  // Engines live as long as the backend, whose destructor joins every worker first.
  target->push([engine, seconds, occupancy, on = target.get()](std::stop_token st) {
    on->add_busy(engine->run(seconds, occupancy, st));
  });
}

SimDeviceActivity SimBackend::activity(int device) {
  check_device(device, "sim_device_activity");
  SimDeviceActivity a = engines_[static_cast<std::size_t>(device)]->activity();
  a.stream_tasks = tasks_of(device).load(std::memory_order_relaxed);
  return a;
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
