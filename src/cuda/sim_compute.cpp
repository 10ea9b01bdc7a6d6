// The simulated device's compute engine (see sim_compute.hpp), and the public entry points for
// simulated kernels on the sim backend.
#include "cuda/sim_compute.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "cuda/sim_backend.hpp"
#include "salus/error.hpp"

namespace salus::sim {
namespace {

using Clock = ComputeEngine::Clock;

constexpr double kMaxWaitSeconds = 3600.0;

Clock::duration to_duration(double seconds) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

double to_seconds(Clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

}  // namespace

ComputeEngine::ComputeEngine(std::shared_ptr<const ContentionModel> model)
    : model_(model ? std::move(model) : make_contention_model("processor_sharing")),
      now_(Clock::now()) {}

double ComputeEngine::run(double seconds, double occupancy, const std::stop_token& stop) {
  std::unique_lock lock(mu_);
  advance(Clock::now());
  const Clock::time_point start = now_;
  if (seconds <= 0.0) {
    ++totals_.kernels;  // an empty kernel completes at once and changes nobody's rate
    return 0.0;
  }
  const std::uint64_t id = next_id_++;
  kernels_.push_back({id, seconds, occupancy, seconds, 1.0, false, {}});
  ++active_;
  reschedule();
  while (!find(id).done) {
    const Kernel& kernel = find(id);
    // Waits of at most an hour at a time: a huge kernel's completion time would overflow the
    // clock's nanoseconds.
    const Clock::time_point deadline =
        now_ + to_duration(std::min(kernel.remaining / kernel.rate, kMaxWaitSeconds));
    const std::uint64_t seen = generation_;
    // Wakes at its own completion time, or earlier when the set changes (its rate moved), or
    // when the stream shuts down.
    changed_.wait_until(lock, stop, deadline, [&] { return generation_ != seen; });
    advance(Clock::now());
    if (stop.stop_requested()) break;
  }
  const Kernel& kernel = find(id);
  const bool done = kernel.done;
  const Clock::time_point end = done ? kernel.finished_at : now_;
  remove(id);
  if (!done) {
    // Shutdown: it leaves unfinished, and the others speed up.
    --active_;
    reschedule();
  }
  return to_seconds(end - start);
}

SimDeviceActivity ComputeEngine::activity() {
  std::lock_guard lock(mu_);
  advance(Clock::now());
  return totals_;
}

void ComputeEngine::advance(Clock::time_point now) {
  while (now > now_) {
    const double span = to_seconds(now - now_);
    // The first kernel whose work runs out within the span, at the current rates.
    Kernel* first = nullptr;
    double first_at = span;
    for (Kernel& kernel : kernels_) {
      if (kernel.done) continue;
      const double at = kernel.remaining / kernel.rate;
      if (at <= first_at) {
        first = &kernel;
        first_at = at;
      }
    }
    if (first == nullptr) {
      progress(span);
      now_ = now;
      return;
    }
    progress(first_at);
    now_ = std::min(now, now_ + to_duration(first_at));
    first->remaining = 0.0;
    first->done = true;
    first->finished_at = now_;
    totals_.work_seconds += first->seconds * first->occupancy;
    ++totals_.kernels;
    --active_;
    reschedule();  // the others' rates change from this instant on
  }
}

void ComputeEngine::progress(double dt) {
  if (active_ == 0 || dt <= 0.0) return;
  totals_.busy_seconds += dt;
  totals_.utilization_seconds += utilization_ * dt;
  for (Kernel& kernel : kernels_) {
    if (!kernel.done) kernel.remaining = std::max(0.0, kernel.remaining - kernel.rate * dt);
  }
}

void ComputeEngine::reschedule() {
  occupancies_.clear();
  for (const Kernel& kernel : kernels_) {
    if (!kernel.done) occupancies_.push_back(kernel.occupancy);
  }
  rates_.assign(occupancies_.size(), 1.0);
  if (!occupancies_.empty()) model_->rates(occupancies_, rates_);
  std::size_t i = 0;
  for (Kernel& kernel : kernels_) {
    // A model must give positive rates; a zero would stall the kernel forever.
    if (!kernel.done) kernel.rate = std::clamp(rates_[i++], 1e-9, 1.0);
  }
  utilization_ = occupancies_.empty() ? 0.0 : device_utilization(occupancies_, rates_);
  ++generation_;
  changed_.notify_all();
}

ComputeEngine::Kernel& ComputeEngine::find(std::uint64_t id) {
  // Only a kernel's own worker removes it, so the kernel a worker looks for is always there.
  return *std::find_if(kernels_.begin(), kernels_.end(),
                       [&](const Kernel& kernel) { return kernel.id == id; });
}

void ComputeEngine::remove(std::uint64_t id) {
  std::erase_if(kernels_, [&](const Kernel& kernel) { return kernel.id == id; });
}

}  // namespace salus::sim

namespace salus {
namespace {

sim::SimBackend& sim_backend_of(DeviceBackend& backend, const char* what) {
  auto* sim = dynamic_cast<sim::SimBackend*>(&backend.underlying());
  if (sim == nullptr) {
    throw InvalidArgument(
        fmt::format("{}: backend '{}' has no simulated kernels", what, backend.name()));
  }
  return *sim;
}

}  // namespace

void launch_sim_kernel(DeviceBackend& backend, StreamHandle stream, int device, double seconds,
                       double occupancy) {
  sim::SimBackend& sim = sim_backend_of(backend, "launch_sim_kernel");
  if (!std::isfinite(seconds) || seconds < 0.0) {
    throw InvalidArgument(
        fmt::format("launch_sim_kernel: seconds must be finite and not negative, got {}", seconds));
  }
  check_occupancy(occupancy, "launch_sim_kernel");
  sim.launch_kernel(stream, device, seconds, occupancy);
}

SimDeviceActivity sim_device_activity(DeviceBackend& backend, int device) {
  return sim_backend_of(backend, "sim_device_activity").activity(device);
}

}  // namespace salus
