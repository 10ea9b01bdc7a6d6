// The built-in policies and the registry. Each policy is a key (who goes first among the waiting
// jobs of a lane) plus a lane plan; only "memory_aware" overrides the start-offset question, which
// the decision core asks the policy under LanePlan::memory_aware (DecisionCore::State::
// decide_memory_aware), so a custom policy can answer it differently.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "iteration_sched/memory_offset.hpp"
#include "salus/error.hpp"
#include "salus/scheduler.hpp"

namespace salus {

const char* to_string(JobKind kind) noexcept {
  switch (kind) {
    case JobKind::training:
      return "training";
    case JobKind::inference:
      return "inference";
  }
  return "unknown";
}

std::size_t MemoryCurve::at(double t) const {
  if (!known() || !(t >= 0.0) || t >= duration_seconds) return 0;
  const auto samples = static_cast<double>(bytes.size());
  const auto index = static_cast<std::size_t>(t / duration_seconds * samples);
  return bytes[std::min(index, bytes.size() - 1)];
}

std::size_t MemoryCurve::peak() const {
  return bytes.empty() ? 0 : *std::max_element(bytes.begin(), bytes.end());
}

double JobView::remaining_seconds() const {
  if (expected_iterations == 0 || !(iteration_seconds > 0.0)) {
    return std::numeric_limits<double>::infinity();
  }
  const std::uint64_t left =
      expected_iterations > iterations_done ? expected_iterations - iterations_done : 0;
  return static_cast<double>(left) * iteration_seconds;
}

std::optional<double> Policy::start_delay(const DeviceView& device,
                                          const JobView& candidate) const {
  // Without a memory plan, overlap only when every peak (and everything held) fits at once.
  std::size_t total = device.persistent_bytes + sched::ephemeral_peak(candidate);
  for (const RunningIteration& r : device.running) {
    if (r.job != nullptr) total += sched::ephemeral_peak(*r.job);
  }
  for (const HeldFrom& h : device.held) total += h.bytes;
  if (total <= device.budget_bytes) return 0.0;
  return std::nullopt;
}

namespace {

SortKey by_arrival(const JobView& job) {
  return {static_cast<double>(job.arrival), 0.0};
}

// Every key is equal: the jobs of a lane take turns, least recently served first (the core's
// tie-break), and no member of a lane of three waits while the other two alternate.
SortKey in_turn(const JobView&) {
  return {};
}

class FifoPolicy final : public Policy {
 public:
  std::string_view name() const override { return "fifo"; }
  SortKey key(const JobView& job) const override { return by_arrival(job); }
  bool runs_to_completion() const override { return true; }
};

class SrtfPolicy final : public Policy {
 public:
  std::string_view name() const override { return "srtf"; }
  // Unknown lengths are +inf: such jobs take turns (the core's tie-break).
  SortKey key(const JobView& job) const override { return {job.remaining_seconds(), 0.0}; }
};

class FairPolicy final : public Policy {
 public:
  std::string_view name() const override { return "fair"; }
  SortKey key(const JobView& job) const override { return {job.attained_seconds, 0.0}; }
};

class PriorityPolicy final : public Policy {
 public:
  std::string_view name() const override { return "priority"; }
  // Latency-critical first, then larger priority; among equals the least attained GPU time, so
  // equal training jobs share instead of the first arrival starving the rest.
  SortKey key(const JobView& job) const override {
    constexpr double kClassStride = 0x1p40;  // above any int priority, exact in a double
    return {(job.latency_critical() ? 0.0 : kClassStride) - static_cast<double>(job.priority),
            job.attained_seconds};
  }
};

class PackPolicy final : public Policy {
 public:
  std::string_view name() const override { return "pack"; }
  SortKey key(const JobView& job) const override { return in_turn(job); }
  LanePlan lanes() const override { return LanePlan::packed; }
};

// The lane rule ("pack") as a backbone, plus Zico-style (ATC'21) extras: a job waiting for its
// lane's turn also starts whenever its predicted memory curve fits, at once, in what the lanes'
// reservations and the other extras leave free (DecisionCore::State::decide_memory_aware). The
// key is pack's, so that the backbone's turns are exactly the lane rule's.
class MemoryAwarePolicy final : public Policy {
 public:
  std::string_view name() const override { return "memory_aware"; }
  SortKey key(const JobView& job) const override { return in_turn(job); }
  LanePlan lanes() const override { return LanePlan::memory_aware; }
  std::optional<double> start_delay(const DeviceView& device,
                                    const JobView& candidate) const override {
    return sched::least_start_offset(device, candidate);
  }
};

template <typename P>
PolicyFactory factory_of() {
  return [] { return std::make_unique<P>(); };
}

}  // namespace

PolicyRegistry::PolicyRegistry() = default;

PolicyRegistry PolicyRegistry::with_builtins() {
  PolicyRegistry registry;
  registry.add("fifo", factory_of<FifoPolicy>());
  registry.add("srtf", factory_of<SrtfPolicy>());
  registry.add("fair", factory_of<FairPolicy>());
  registry.add("pack", factory_of<PackPolicy>());
  registry.add("priority", factory_of<PriorityPolicy>());
  registry.add("memory_aware", factory_of<MemoryAwarePolicy>());
  return registry;
}

void PolicyRegistry::add(std::string name, PolicyFactory factory) {
  if (name.empty()) throw InvalidArgument("policy registry: a policy needs a name");
  if (!factory) throw InvalidArgument(fmt::format("policy registry: '{}' has no factory", name));
  const bool taken = std::any_of(entries_.begin(), entries_.end(),
                                 [&](const auto& entry) { return entry.first == name; });
  if (taken)
    throw InvalidArgument(fmt::format("policy registry: '{}' is already registered", name));
  entries_.emplace_back(std::move(name), std::move(factory));
}

std::unique_ptr<Policy> PolicyRegistry::make(std::string_view name) const {
  for (const auto& [known, factory] : entries_) {
    if (known == name) {
      auto policy = factory();
      if (!policy)
        throw InvalidArgument(fmt::format("policy '{}': the factory made nothing", name));
      return policy;
    }
  }
  throw InvalidArgument(fmt::format(
      "unknown policy '{}'; known policies: {}", name,
      entries_.empty() ? std::string("(none)") : fmt::format("{}", fmt::join(names(), ", "))));
}

std::vector<std::string> PolicyRegistry::names() const {
  std::vector<std::string> out;
  out.reserve(entries_.size());
  for (const auto& entry : entries_) out.push_back(entry.first);
  return out;
}

}  // namespace salus
