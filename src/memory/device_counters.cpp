#include "memory/device_counters.hpp"

namespace salus::memory {
namespace {
constexpr std::size_t idx(Lifetime lifetime) {
  return static_cast<std::size_t>(lifetime);
}
}  // namespace

void DeviceCounters::on_allocate(Lifetime lifetime, std::size_t bytes) {
  allocated.add(bytes);
  by_class[idx(lifetime)].add(bytes);
}

void DeviceCounters::on_free(Lifetime lifetime, std::size_t bytes) {
  allocated.sub(bytes);
  by_class[idx(lifetime)].sub(bytes);
}

void DeviceCounters::on_promote(std::size_t bytes) {
  constexpr std::size_t per = idx(Lifetime::persistent);
  constexpr std::size_t eph = idx(Lifetime::ephemeral);
  by_class[per].add(bytes);
  by_class[eph].sub(bytes);
}

}  // namespace salus::memory
