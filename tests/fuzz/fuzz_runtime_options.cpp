// Fuzz target: salus_runtime_create with a salus_runtime_options struct decoded from the input
// (struct_size, every enum as any int, counts, sizes, the per-device limits, the policy string),
// then, where a runtime comes back, one job that runs an iteration with one allocation whose
// bytes must read back, and destroy. A bad option must give a clear error (a status other than
// SALUS_ERROR_INTERNAL, with a message), never a crash. The same input also drives the option
// strings parsed in C++: contention model names and policy names in the registry.
//
// The Python module's topology and spill strings are parsed in python_bindings/src/module.cpp,
// in functions local to the pybind11 module: not reachable without Python (their C ABI
// equivalents are the enums fuzzed here).
#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "fuzz_input.hpp"
#include "salus/c_api.h"
#include "salus/contention.hpp"
#include "salus/error.hpp"
#include "salus/scheduler.hpp"

namespace {

using salus::fuzz::FuzzInput;
constexpr std::size_t kMiB = std::size_t{1} << 20;

const char* const kPolicies[] = {"fair", "fifo", "srtf", "pack", "priority", "memory_aware"};

// An int that is usually small and valid, sometimes one of the edges.
int pick_int(FuzzInput& in, int low, int high) {
  static constexpr int kEdges[] = {0, -1, INT_MIN, INT_MAX, 1025, 3};
  if (in.chance(80))
    return low + static_cast<int>(in.below(static_cast<std::size_t>(high - low + 1)));
  return kEdges[in.below(6)];
}

// Stores any int in an enum field the way a C caller can. (In C++ an enum whose enumerators are
// all >= 0 cannot hold a negative value: reading one is undefined, so nothing here reads these
// fields back as enums.)
template <class Enum>
void store_int(Enum& field, int value) {
  static_assert(sizeof(Enum) == sizeof(int));
  std::memcpy(&field, &value, sizeof value);
}

std::size_t pick_bytes(FuzzInput& in) {
  static constexpr std::size_t kBytes[] = {
      0,       1, 4096, kMiB, 3 * kMiB, 16 * kMiB, 64 * kMiB, std::size_t{1} << 40, SIZE_MAX - 1,
      SIZE_MAX};
  return in.chance(50) ? (1 + in.below(64)) * kMiB : kBytes[in.below(10)];
}

// The policy string, kept alive for the call.
struct PolicyText {
  std::string text;
  const char* ptr = nullptr;
};

PolicyText pick_policy(FuzzInput& in) {
  PolicyText p;
  switch (in.below(8)) {
    case 0:
      p.ptr = nullptr;
      break;  // the default
    case 1:
      p.text = in.text(24);
      p.ptr = p.text.c_str();
      break;
    default:
      p.text = kPolicies[in.below(6)];
      p.ptr = p.text.c_str();
      break;
  }
  return p;
}

// One job, one iteration, one allocation whose bytes read back, on a runtime that was made.
void exercise(salus_runtime* runtime) {
  int devices = 0;
  FUZZ_CHECK(salus_runtime_device_count(runtime, &devices) == SALUS_OK && devices > 0,
             salus_last_error());
  salus_job_spec spec;
  salus_job_spec_init(&spec);
  spec.name = "fuzz";
  std::uint32_t job = 0;
  FUZZ_CHECK(salus_job_add(runtime, &spec, &job) == SALUS_OK, salus_last_error());
  // The only job of a fresh runtime, with no memory hints: every policy admits it at once.
  void* stream = nullptr;
  FUZZ_CHECK(salus_job_begin_iteration(runtime, job, &stream) == SALUS_OK, salus_last_error());
  void* ptr = nullptr;
  const salus_status st = salus_allocate(runtime, 4096, 0, stream, job, SALUS_LIFETIME_AUTO, &ptr);
  // Device limits of a few bytes leave no room: a clean out-of-memory is the answer then.
  FUZZ_CHECK(st == SALUS_OK || st == SALUS_ERROR_OUT_OF_MEMORY, salus_last_error());
  if (st == SALUS_OK) {
    std::memset(ptr, 0xA5, 4096);
    const auto* bytes = static_cast<const unsigned char*>(ptr);
    FUZZ_CHECK(bytes[0] == 0xA5 && bytes[4095] == 0xA5, "the block's bytes read back");
    FUZZ_CHECK(salus_deallocate(runtime, ptr, 4096, 0) == SALUS_OK, salus_last_error());
  }
  FUZZ_CHECK(salus_job_end_iteration(runtime, job) == SALUS_OK, salus_last_error());
  salus_device_stats d{};
  d.struct_size = sizeof d;
  FUZZ_CHECK(salus_get_device_stats(runtime, 0, &d) == SALUS_OK, salus_last_error());
  FUZZ_CHECK(d.allocated == 0, "nothing is left allocated");
  FUZZ_CHECK(salus_job_leave(runtime, job) == SALUS_OK, salus_last_error());
}

void runtime_options(FuzzInput& in) {
  salus_runtime_options o;
  salus_runtime_options_init(&o);
  bool valid = true;  // what the header promises is accepted
  static constexpr int kBackends[] = {
      SALUS_BACKEND_SIM, SALUS_BACKEND_SIM, SALUS_BACKEND_AUTO, SALUS_BACKEND_CUDA, 3, -1};
  const int backend = kBackends[in.below(6)];
  store_int(o.backend, backend);
  valid = valid && backend >= 0 && backend <= 2;
  o.sim_device_count = pick_int(in, 1, 4);
  valid = valid && o.sim_device_count >= 1 && o.sim_device_count <= 1024;
  o.sim_device_memory_bytes = pick_bytes(in);
  const int topology = pick_int(in, 0, 3);
  store_int(o.sim_topology, topology);
  valid = valid && topology >= 0 && topology <= 3;
  if (topology == SALUS_SIM_TWO_ISLANDS && o.sim_device_count % 2 != 0) valid = false;
  const PolicyText policy = pick_policy(in);
  o.policy = policy.ptr;
  const int limited = static_cast<int>(in.below(SALUS_MAX_DEVICE_LIMITS + 1));
  for (int d = 0; d < limited; ++d) o.device_limits[d] = in.chance(50) ? 0 : pick_bytes(in);
  const int spill = pick_int(in, 0, 2);
  store_int(o.spill, spill);
  valid = valid && spill >= 0 && spill <= 2;
  o.lend_reserve_bytes = in.chance(50) ? SALUS_DEFAULT_SIZE : pick_bytes(in);
  o.host_limit_bytes = in.chance(50) ? SALUS_DEFAULT_SIZE : pick_bytes(in);
  static constexpr std::int64_t kWaits[] = {SALUS_DEFAULT_WAIT, 0, 20, -2, INT64_MIN};
  o.allocation_wait_ms = kWaits[in.below(5)];
  bool wait_ok = o.allocation_wait_ms >= 0 || o.allocation_wait_ms == SALUS_DEFAULT_WAIT;
  if (in.chance(10)) {
    // 1.3's size is accepted, and the field past it is not read; any other size is refused.
    constexpr std::size_t kSize13 = offsetof(salus_runtime_options, allocation_wait_ms);
    switch (in.below(3)) {
      case 0: o.struct_size = kSize13; wait_ok = true; break;
      case 1: o.struct_size = kSize13 - 8; valid = false; break;
      default: o.struct_size = sizeof o + 8; valid = false; break;
    }
  }
  valid = valid && wait_ok;
  const bool pass_null = in.chance(3);
  salus_runtime* runtime = nullptr;
  const salus_status st = salus_runtime_create(pass_null ? nullptr : &o, &runtime);
  if (st != SALUS_OK) {
    FUZZ_CHECK(runtime == nullptr, "a failed create hands out no runtime");
    FUZZ_CHECK(st != SALUS_ERROR_INTERNAL, std::string("an internal error: ") + salus_last_error());
    FUZZ_CHECK(salus_last_error()[0] != '\0', "a failed create says why");
    return;
  }
  FUZZ_CHECK(valid || pass_null, "options the header calls invalid were accepted");
  exercise(runtime);
  salus_runtime_destroy(runtime);
}

// Names parsed in C++: the contention models and the policy registry.
void option_strings(FuzzInput& in) {
  const std::string name = in.text(32);
  try {
    const auto model = salus::make_contention_model(name);
    FUZZ_CHECK(model != nullptr && model->name() == name, "a model is the one named");
    const double occupancies[] = {0.5, 1.0};
    double rates[] = {0.0, 0.0};
    model->rates(occupancies, rates);
    for (double r : rates) FUZZ_CHECK(r > 0.0 && r <= 1.0, "rates in (0, 1]");
  } catch (const salus::InvalidArgument&) {
  }
  try {
    const auto policy = salus::PolicyRegistry::with_builtins().make(name);
    FUZZ_CHECK(policy != nullptr && policy->name() == name, "a policy is the one named");
  } catch (const salus::InvalidArgument&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  FuzzInput in(data, size);
  runtime_options(in);
  option_strings(in);
  return 0;
}
