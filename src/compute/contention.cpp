#include "salus/contention.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <numeric>

#include "salus/error.hpp"

namespace salus {
namespace {

class ProcessorSharing final : public ContentionModel {
 public:
  [[nodiscard]] std::string_view name() const override { return "processor_sharing"; }
  void rates(std::span<const double> occupancies, std::span<double> rates) const override {
    const double demand = std::accumulate(occupancies.begin(), occupancies.end(), 0.0);
    const double rate = demand <= 1.0 ? 1.0 : 1.0 / demand;
    std::fill(rates.begin(), rates.end(), rate);
  }
};

class TimeSlicing final : public ContentionModel {
 public:
  [[nodiscard]] std::string_view name() const override { return "time_slicing"; }
  void rates(std::span<const double> occupancies, std::span<double> rates) const override {
    const double rate = occupancies.empty() ? 1.0 : 1.0 / static_cast<double>(occupancies.size());
    std::fill(rates.begin(), rates.end(), rate);
  }
};

class NoContention final : public ContentionModel {
 public:
  [[nodiscard]] std::string_view name() const override { return "none"; }
  void rates(std::span<const double>, std::span<double> rates) const override {
    std::fill(rates.begin(), rates.end(), 1.0);
  }
};

}  // namespace

double device_utilization(std::span<const double> occupancies, std::span<const double> rates) {
  double busy = 0.0;
  for (std::size_t i = 0; i < occupancies.size() && i < rates.size(); ++i) {
    busy += occupancies[i] * rates[i];
  }
  return std::min(busy, 1.0);
}

std::shared_ptr<const ContentionModel> make_contention_model(std::string_view name) {
  if (name == "processor_sharing") return std::make_shared<ProcessorSharing>();
  if (name == "time_slicing") return std::make_shared<TimeSlicing>();
  if (name == "none") return std::make_shared<NoContention>();
  throw InvalidArgument(fmt::format("unknown contention model '{}' (known: {})", name,
                                    fmt::join(contention_model_names(), ", ")));
}

std::vector<std::string> contention_model_names() {
  return {"processor_sharing", "time_slicing", "none"};
}

void check_occupancy(double occupancy, std::string_view what) {
  if (!(occupancy > 0.0 && occupancy <= 1.0)) {
    throw InvalidArgument(
        fmt::format("{}: occupancy must be in (0, 1], got {}", what, occupancy));
  }
}

}  // namespace salus
