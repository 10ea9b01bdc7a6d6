// SimBackend: the work streams run that needs more than the streams (async copies and fills,
// whose ranges SimMemory checks first; simulated kernels, which run on the compute engines) and
// the devices' activity.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <stop_token>

#include "cuda/sim_backend.hpp"
#include "cuda/sim_compute.hpp"
#include "salus/error.hpp"

namespace salus::sim {

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
  // SimMemory's lock is released before the stream's table is looked up: never both at once.
  const SimMemory::CopyEnds ends = memory_.check_copy(dst, src, bytes, config_.throttle_copies);
  // A copy spanning several locations is timed by the link of its first bytes.
  const double gbps = config_.throttle_copies ? copy_bandwidth_gbps(ends.dst, ends.src) : 0.0;
  auto target = streams_.stream(stream, 0);
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
  memory_.check_fill(dst, bytes);
  auto target = streams_.stream(stream, 0);
  target->push([dst, value, bytes, on = target.get()](std::stop_token) {
    const auto start = std::chrono::steady_clock::now();
    std::memset(reinterpret_cast<void*>(dst), value, bytes);
    on->add_busy(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  });
}

void SimBackend::launch_kernel(StreamHandle stream, int device, double seconds, double occupancy) {
  check_device(device, "launch_sim_kernel");
  auto target = streams_.stream(stream, device);
  if (target->device != device) {
    throw InvalidArgument(
        fmt::format("launch_sim_kernel: stream {:#x} belongs to device {}, not {}", stream.value,
                    target->device, device));
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
  a.stream_tasks = streams_.tasks_handed(device);
  return a;
}

}  // namespace salus::sim
