// How concurrent work on one device shares its compute.
//
// A GPU runs kernels of several streams at once only as far as its SMs allow: a small-batch job
// keeps a fraction of the device busy (its occupancy), so two of them may run side by side at full
// speed, while two large ones slow each other down. A contention model says, for the work running
// at one instant on one device, how fast each piece progresses. Both engines that model a device
// use it: the discrete-event simulator (per running iteration) and the simulated backend's streams
// (per kernel), so a study and a run of the real mechanism on simulated GPUs agree.
//
// Rates are in work-seconds per second: a piece of work that takes `w` seconds alone takes
// `w / rate` seconds while the rate holds. Models must be pure functions of the occupancies
// (no clock, no state), so they are safe to share between threads.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "salus/export.hpp"

namespace salus {

class SALUS_API ContentionModel {
 public:
  virtual ~ContentionModel() = default;
  [[nodiscard]] virtual std::string_view name() const = 0;
  // rates[i] in (0, 1] for the i-th piece of work running now, which keeps `occupancies[i]` (in
  // (0, 1]) of the device busy when it runs alone. The spans have the same size (not empty).
  virtual void rates(std::span<const double> occupancies, std::span<double> rates) const = 0;
};

// The share of the device kept busy: sum of occupancy * rate, at most 1.
[[nodiscard]] SALUS_API double device_utilization(std::span<const double> occupancies,
                                                  std::span<const double> rates);

// Built-in models, by name:
//  - "processor_sharing" (the default): while the occupancies sum to at most 1 every piece runs
//    at full speed; beyond that the device is saturated and all slow down alike, each at
//    1 / sum(occupancies). Work is conserved: a saturated device delivers one device-second of
//    occupancy-weighted work per second.
//  - "time_slicing": the device runs one piece at a time in turn (contexts without MPS): each of
//    n pieces progresses at 1/n whatever its occupancy.
//  - "none": every piece runs at full speed however many share the device (the optimistic model
//    the simulations used before contention was modelled; kept to compare against).
// Throws InvalidArgument naming the known models for any other name.
[[nodiscard]] SALUS_API std::shared_ptr<const ContentionModel> make_contention_model(
    std::string_view name);
[[nodiscard]] SALUS_API std::vector<std::string> contention_model_names();

// Throws InvalidArgument (naming `what`) unless 0 < occupancy <= 1.
SALUS_API void check_occupancy(double occupancy, std::string_view what);

}  // namespace salus
