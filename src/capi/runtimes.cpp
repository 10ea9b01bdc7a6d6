// Runtimes through the C ABI: options, creation, the process default.
#include <fmt/format.h>
#include <pthread.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <new>

#include "capi/capi.hpp"
#include "iteration_sched/default_runtime.hpp"
#include "salus/cuda.hpp"
#include "salus/remote.hpp"
#include "salus/sim.hpp"

using salus::capi::guarded;
using salus::capi::invalid;
using salus::capi::require;

salus_runtime::~salus_runtime() {
  std::unordered_map<std::uint32_t, std::shared_ptr<salus::Job>> left;
  {
    std::lock_guard lock(jobs_mu);
    left.swap(jobs);
  }
  // A thread may still wait in begin_iteration: cancelling wakes it; dropping the handles leaves.
  for (auto& [id, job] : left) {
    try {
      job->cancel();
    } catch (const std::exception&) {
      // Already cancelled or left.
    }
  }
}

std::shared_ptr<salus::Job> salus_runtime::job(std::uint32_t id) const {
  std::shared_lock lock(jobs_mu);
  auto it = jobs.find(id);
  if (it == jobs.end()) throw salus::UnknownJob(salus::JobId{id});
  return it->second;
}

namespace {

static_assert(SALUS_MAX_SIM_DEVICES == salus::kMaxSimDevices);

salus::SimConfig sim_config(const salus_runtime_options& o) {
  const int n = o.sim_device_count;
  if (n <= 0 || n > SALUS_MAX_SIM_DEVICES) {
    throw salus::InvalidArgument(fmt::format("sim_device_count is {}; it must be 1..{}", n,
                                             SALUS_MAX_SIM_DEVICES));
  }
  if (o.sim_device_memory_bytes == 0) throw salus::InvalidArgument("sim_device_memory_bytes is 0");
  const std::size_t bytes = o.sim_device_memory_bytes;
  const int topology = salus::capi::enum_value(o.sim_topology);
  switch (topology) {
    case SALUS_SIM_NO_LINKS: return salus::SimConfig::uniform(n, bytes);
    case SALUS_SIM_NVLINK_MESH: return salus::SimConfig::nvlink_mesh(n, bytes);
    case SALUS_SIM_TWO_ISLANDS:
      if (n % 2 != 0) {
        throw salus::InvalidArgument(
            fmt::format("SALUS_SIM_TWO_ISLANDS needs an even sim_device_count, not {}", n));
      }
      return salus::SimConfig::two_islands(n / 2, bytes);
    case SALUS_SIM_PCIE_ONLY: return salus::SimConfig::pcie_only(n, bytes);
    default: break;
  }
  throw salus::InvalidArgument(
      fmt::format("sim_topology {} is not a salus_sim_topology", topology));
}

salus::RuntimeOptions runtime_options(const salus_runtime_options& o) {
  salus::RuntimeOptions options;
  if (o.policy != nullptr) options.policy = o.policy;
  auto& limits = options.memory.device_limits;
  limits.assign(std::begin(o.device_limits), std::end(o.device_limits));
  while (!limits.empty() && limits.back() == 0) limits.pop_back();
  auto& harvest = options.memory.harvest;
  const int spill = salus::capi::enum_value(o.spill);
  switch (spill) {
    case SALUS_SPILL_NONE: harvest.spill = salus::SpillPolicy::none; break;
    case SALUS_SPILL_HOST_ONLY: harvest.spill = salus::SpillPolicy::host_only; break;
    case SALUS_SPILL_PEER_THEN_HOST: harvest.spill = salus::SpillPolicy::peer_then_host; break;
    default:
      throw salus::InvalidArgument(
          fmt::format("spill {} is not a salus_spill_policy", spill));
  }
  if (o.lend_reserve_bytes != SALUS_DEFAULT_SIZE) harvest.lend_reserve_bytes = o.lend_reserve_bytes;
  if (o.host_limit_bytes != SALUS_DEFAULT_SIZE) harvest.host_limit_bytes = o.host_limit_bytes;
  if (o.allocation_wait_ms != SALUS_DEFAULT_WAIT) {
    if (o.allocation_wait_ms < 0) {
      throw salus::InvalidArgument(fmt::format(
          "allocation_wait_ms {} is negative (0: no limit; SALUS_DEFAULT_WAIT: the default)",
          o.allocation_wait_ms));
    }
    options.allocation_wait_limit = std::chrono::milliseconds(o.allocation_wait_ms);
  }
  return options;
}

std::shared_ptr<salus::DeviceBackend> backend_for(const salus_runtime_options& o) {
  const int backend = salus::capi::enum_value(o.backend);
  switch (backend) {
    case SALUS_BACKEND_AUTO: return salus::make_default_backend(sim_config(o));
    case SALUS_BACKEND_CUDA: return salus::make_cuda_backend();
    case SALUS_BACKEND_SIM: return salus::make_sim_backend(sim_config(o));
    default: break;
  }
  throw salus::InvalidArgument(
      fmt::format("backend {} is not a salus_backend_kind", backend));
}

// 1.3's salus_runtime_options ended before allocation_wait_ms; such callers still work.
constexpr std::size_t kRuntimeOptionsSize13 = offsetof(salus_runtime_options, allocation_wait_ms);
static_assert(kRuntimeOptionsSize13 % alignof(salus_runtime_options) == 0,
              "1.3's struct had no tail padding: its sizeof is this offset");

// The options a caller passed (the defaults where its version has no field), or the defaults
// for NULL.
salus_runtime_options options_or_defaults(const salus_runtime_options* given, const char* call) {
  salus_runtime_options o;
  salus_runtime_options_init(&o);
  if (given == nullptr) return o;
  const std::size_t size = given->struct_size;
  salus::capi::require_struct_size(size, sizeof(salus_runtime_options), "salus_runtime_options",
                                   call, {kRuntimeOptionsSize13});
  std::memcpy(&o, given, size);  // a 1.3 caller's struct ends before allocation_wait_ms
  return o;
}

void forget_default_handle_in_child() noexcept;

// The C handle of the default runtime. `current` is read on every salus_malloc: no lock there.
struct DefaultHandle {
  DefaultHandle() { ::pthread_atfork(nullptr, nullptr, &forget_default_handle_in_child); }
  std::mutex mu;  // taken before the C++ default's own lock
  std::unique_ptr<salus_runtime> handle;  // guarded by mu
  std::atomic<salus_runtime*> current{nullptr};
};
DefaultHandle& default_handle() {
  static DefaultHandle d;
  return d;
}

// A forked child starts with no default handle, as the C++ default (runtime.cpp): the parent's is
// leaked (its runtime refuses every call there), and the lock is made anew (a thread of the
// parent may have held it).
void forget_default_handle_in_child() noexcept {
  DefaultHandle& d = default_handle();
  new (&d.mu) std::mutex;
  d.current.store(nullptr, std::memory_order_relaxed);
  (void)d.handle.release();
}

}  // namespace

salus_runtime* salus::capi::wrap(std::shared_ptr<Runtime> runtime) {
  return new salus_runtime(std::move(runtime));
}

extern "C" {

void salus_runtime_options_init(salus_runtime_options* options) {
  if (options == nullptr) return;
  *options = salus_runtime_options{};
  options->struct_size = sizeof(salus_runtime_options);
  options->backend = SALUS_BACKEND_AUTO;
  options->sim_device_count = 1;
  options->sim_device_memory_bytes = std::size_t{1} << 30;
  options->sim_topology = SALUS_SIM_NO_LINKS;
  options->policy = "fair";
  options->spill = SALUS_SPILL_NONE;
  options->lend_reserve_bytes = SALUS_DEFAULT_SIZE;
  options->host_limit_bytes = SALUS_DEFAULT_SIZE;
  options->allocation_wait_ms = SALUS_DEFAULT_WAIT;
}

salus_status salus_runtime_create(const salus_runtime_options* options, salus_runtime** out) {
  return guarded([&] {
    require(out, "salus_runtime_create: out");
    *out = nullptr;
    const salus_runtime_options o = options_or_defaults(options, "salus_runtime_create");
    auto runtime = std::make_shared<salus::Runtime>(backend_for(o), runtime_options(o));
    *out = salus::capi::wrap(std::move(runtime));
  });
}

salus_status salus_runtime_create_sim(int device_count, size_t device_memory_bytes,
                                      salus_runtime** out) {
  salus_runtime_options o;
  salus_runtime_options_init(&o);
  o.backend = SALUS_BACKEND_SIM;
  o.sim_device_count = device_count;
  o.sim_device_memory_bytes = device_memory_bytes;
  return salus_runtime_create(&o, out);
}

salus_status salus_runtime_connect(const char* socket_path, salus_runtime** out) {
  return guarded([&] {
    require(out, "salus_runtime_connect: out");
    *out = nullptr;
    *out = salus::capi::wrap(salus::connect_runtime(socket_path != nullptr ? socket_path : ""));
  });
}

salus_status salus_runtime_create_cuda(salus_runtime** out) {
  salus_runtime_options o;
  salus_runtime_options_init(&o);
  o.backend = SALUS_BACKEND_CUDA;
  return salus_runtime_create(&o, out);
}

void salus_runtime_destroy(salus_runtime* runtime) {
  if (runtime == nullptr) return;
  if (runtime == default_handle().current.load(std::memory_order_acquire)) {
    salus::capi::set_last_error(
        "salus_runtime_destroy: this is the default runtime; use salus_default_runtime_shutdown");
    return;
  }
  delete runtime;
}

salus_status salus_runtime_device_count(const salus_runtime* runtime, int* out) {
  return guarded([&] {
    require(runtime, "salus_runtime_device_count: runtime");
    require(out, "salus_runtime_device_count: out");
    *out = runtime->runtime->device_count();
  });
}

const char* salus_runtime_backend_name(const salus_runtime* runtime) {
  if (runtime == nullptr) return "";
  // Backends name themselves with static strings.
  return runtime->runtime->backend().name().data();
}

salus_status salus_runtime_write_trace(const salus_runtime* runtime, const char* path) {
  return guarded([&] {
    require(runtime, "salus_runtime_write_trace: runtime");
    require(path, "salus_runtime_write_trace: path");
    runtime->runtime->write_trace(path);
  });
}

salus_status salus_default_runtime_init(const salus_runtime_options* options) {
  DefaultHandle& d = default_handle();
  std::lock_guard lock(d.mu);
  return guarded([&] {
    const salus_runtime_options o = options_or_defaults(options, "salus_default_runtime_init");
    auto runtime = salus::make_default_runtime(backend_for(o), runtime_options(o));
    d.handle.reset(salus::capi::wrap(std::move(runtime)));
    d.current.store(d.handle.get(), std::memory_order_release);
  });
}

salus_runtime* salus_default_runtime(void) {
  DefaultHandle& d = default_handle();
  if (salus_runtime* current = d.current.load(std::memory_order_acquire)) return current;
  std::lock_guard lock(d.mu);
  const salus_status status = guarded([&] {
    // The C++ side may have made the default already: the handle wraps that one.
    if (!d.handle) d.handle.reset(salus::capi::wrap(salus::default_runtime_shared()));
    d.current.store(d.handle.get(), std::memory_order_release);
  });
  return status == SALUS_OK ? d.handle.get() : nullptr;
}

void salus_default_runtime_shutdown(void) {
  DefaultHandle& d = default_handle();
  std::unique_ptr<salus_runtime> handle;
  std::shared_ptr<salus::Runtime> runtime;
  {
    std::lock_guard lock(d.mu);
    d.current.store(nullptr, std::memory_order_release);
    handle = std::move(d.handle);
    runtime = salus::take_default_runtime();
  }
  // Destroyed outside the locks (leaving jobs waits for nothing, but joins stream threads).
  handle.reset();
  runtime.reset();
}

}  // extern "C"
