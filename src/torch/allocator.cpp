// salus_torch: c10's CPU allocator (simulated backend) and PyTorch's pluggable CUDA allocator
// functions, both routed to one Salus runtime. See include/salus/torch.hpp.
#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <utility>

#include "salus/error.hpp"
#include "salus/torch.hpp"

namespace salus::torch {
namespace {

// The runtime the glue routes to. Immortal (one per enable, a few bytes): a tensor's deleter may
// run at any time, and it finds the state through a plain pointer. The runtime itself goes once
// the glue is disabled and the last of its tensors is freed.
struct State {
  std::shared_ptr<Runtime> keeper;  // guarded by mu; reset when disabled and unused
  Runtime* runtime = nullptr;       // valid while blocks > 0 or enabled
  bool cpu = false;
  bool host_compute_before = false;  // cpu: the runtime's host_compute before enable
  std::atomic<bool> enabled{true};
  std::atomic<std::int64_t> blocks{0};
  std::mutex mu;

  // A block (or an allocation that made none) is done with the state.
  void release() {
    if (blocks.fetch_sub(1) == 1 && !enabled.load()) drop_if_unused();
  }
  void drop_if_unused() {
    std::lock_guard lock(mu);
    if (!enabled.load() && blocks.load() == 0) keeper.reset();
  }
};

std::mutex g_mu;                       // enable/disable
std::atomic<State*> g_state{nullptr};  // the enabled one, or null
c10::Allocator* g_previous_cpu = nullptr;
std::atomic<Around> g_around{nullptr};

std::atomic<std::uint64_t> g_allocations{0};
std::atomic<std::uint64_t> g_frees{0};
std::atomic<std::uint64_t> g_failed_frees{0};

struct ThreadJob {
  JobId job = kUnattributedJob;
  int device = 0;
};
thread_local ThreadJob t_job;
thread_local std::exception_ptr t_last_error;

template <typename F>
void around(F&& f) {
  Around a = g_around.load(std::memory_order_relaxed);
  if (a == nullptr) {
    f();
    return;
  }
  a([](void* arg) { (*static_cast<F*>(arg))(); }, &f);
}

// Which runtime each live block came from, for both the CPU allocator and the CUDA functions.
// A deleter gets only the address (PyTorch's raw_deallocate, used by oneDNN, and the pluggable
// CUDA free), and the glue may have been disabled or re-enabled with another runtime since. No
// address is reused while a tensor holds it: jobs made for PyTorch keep their blocks after they
// leave or are cancelled (JobSpec::blocks_outlive_job), so an entry here is never stale. Sharded
// by address: allocations on different threads rarely meet on a lock.
struct Owner {
  State* state;
};

class Owners {
 public:
  void add(DevicePtr ptr, Owner owner) {
    Shard& s = shard(ptr);
    std::lock_guard lock(s.mu);
    s.map.insert_or_assign(ptr, owner);
  }
  std::optional<Owner> take(DevicePtr ptr) {
    Shard& s = shard(ptr);
    std::lock_guard lock(s.mu);
    auto it = s.map.find(ptr);
    if (it == s.map.end()) return std::nullopt;
    const Owner owner = it->second;
    s.map.erase(it);
    return owner;
  }

 private:
  static constexpr std::size_t kShards = 64;
  struct Shard {
    std::mutex mu;
    std::unordered_map<DevicePtr, Owner> map;
  };
  Shard& shard(DevicePtr ptr) { return shards_[(ptr >> 9) % kShards]; }  // blocks: 512 B aligned
  Shard shards_[kShards];
};

Owners g_owners;

// (Not spdlog: the torch wheel's headers carry an fmt of their own that clashes with the system's.)
void log_failed_free(DevicePtr ptr, const char* what) {
  std::fprintf(stderr, "[salus_torch] error: freeing %#lx failed: %s\n",
               static_cast<unsigned long>(ptr), what);
}

void free_block(State& state, DevicePtr ptr, std::optional<int> device,
                std::optional<std::size_t> bytes) {
  try {
    around([&] { state.runtime->deallocate(ptr, {bytes, device, std::nullopt}); });
    g_frees.fetch_add(1, std::memory_order_relaxed);
  } catch (const std::exception& e) {
    g_failed_frees.fetch_add(1, std::memory_order_relaxed);
    log_failed_free(ptr, e.what());
  }
  state.release();
}

// Frees a block allocated through the glue, through the runtime it came from (the glue may have
// been disabled, or enabled with another runtime, since).
void delete_block(void* ptr, std::optional<int> device = {},
                  std::optional<std::size_t> bytes = {}) {
  const auto addr = reinterpret_cast<DevicePtr>(ptr);
  if (const std::optional<Owner> owner = g_owners.take(addr)) {
    free_block(*owner->state, addr, device, bytes);
  } else if (ptr != nullptr) {
    g_failed_frees.fetch_add(1, std::memory_order_relaxed);
    log_failed_free(addr, "the address was not allocated through salus_torch");
  }
}

// c10's deleters take the address alone.
void delete_block_at(void* ptr) {
  delete_block(ptr);
}

// Allocates through the state's runtime and records the block's owner; throws salus errors
// (the state's reference is released then).
DevicePtr allocate_block(State& state, std::size_t bytes, int device, StreamHandle stream,
                         JobId job) {
  DevicePtr ptr = 0;
  try {
    around([&] { ptr = state.runtime->allocate(bytes, device, stream, job); });
  } catch (...) {
    state.release();
    throw;
  }
  g_owners.add(ptr, {&state});
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  return ptr;
}

// Takes a reference on the enabled state for one allocation; null when the glue is off.
State* acquire_state(bool cpu) {
  State* state = g_state.load();
  if (state == nullptr || state->cpu != cpu) return nullptr;
  state->blocks.fetch_add(1);
  if (!state->enabled.load()) {
    state->release();
    return nullptr;
  }
  return state;
}

[[noreturn]] void report(std::size_t bytes) {
  t_last_error = std::current_exception();
  try {
    throw;
  } catch (const OutOfMemory& e) {
    TORCH_CHECK_WITH(OutOfMemoryError, false, "Salus: ", e.what());
  } catch (const std::exception& e) {
    TORCH_CHECK(false, "Salus could not allocate ", bytes, " bytes: ", e.what());
  }
  TORCH_CHECK(false, "Salus could not allocate ", bytes, " bytes");
}

class CpuAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(std::size_t bytes) override {
    State* state = acquire_state(true);
    if (state == nullptr) return g_previous_cpu->allocate(bytes);  // disabled meanwhile
    if (bytes == 0) {
      state->release();
      return c10::DataPtr(nullptr, c10::Device(c10::DeviceType::CPU));
    }
    DevicePtr ptr = 0;
    try {
      const ThreadJob who = t_job;
      ptr = allocate_block(*state, bytes, who.device, StreamHandle{}, who.job);
    } catch (...) {
      report(bytes);
    }
    return {reinterpret_cast<void*>(ptr), reinterpret_cast<void*>(ptr), &delete_block_at,
            c10::Device(c10::DeviceType::CPU)};
  }

  // The address alone frees the block (PyTorch's raw_allocate/raw_deallocate, used by oneDNN).
  c10::DeleterFnPtr raw_deleter() const override { return &delete_block_at; }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    std::memcpy(dest, src, count);
  }
};

CpuAllocator g_cpu_allocator;

void enable(std::shared_ptr<Runtime> runtime, bool cpu) {
  if (!runtime) throw InvalidArgument("salus_torch: the runtime is null");
  std::lock_guard lock(g_mu);
  if (g_state.load() != nullptr) {
    throw InvalidArgument("salus_torch is enabled already: disable() it first");
  }
  auto* state = new State;  // immortal, see State
  state->runtime = runtime.get();
  state->keeper = std::move(runtime);
  state->cpu = cpu;
  if (cpu) {
    // PyTorch computes on the CPU threads of the jobs: their host time is their device time,
    // and the host touches a tensor's memory as soon as it has it.
    state->host_compute_before = state->runtime->host_compute();
    state->runtime->set_host_compute(true);
    if (g_previous_cpu == nullptr) g_previous_cpu = c10::GetCPUAllocator();
    // A higher priority than the default's (0): c10 keeps the highest.
    c10::SetCPUAllocator(&g_cpu_allocator, /*priority=*/100);
  }
  g_state.store(state);
}

}  // namespace

void enable_cpu(std::shared_ptr<Runtime> runtime) {
  enable(std::move(runtime), true);
}

void enable_cuda(std::shared_ptr<Runtime> runtime) {
  enable(std::move(runtime), false);
}

void disable() {
  std::lock_guard lock(g_mu);
  State* state = g_state.exchange(nullptr);
  if (state == nullptr) return;
  if (state->cpu) {
    c10::SetCPUAllocator(g_previous_cpu, /*priority=*/100);
    state->runtime->set_host_compute(state->host_compute_before);
  }
  state->enabled.store(false);
  state->drop_if_unused();
}

bool enabled() {
  return g_state.load() != nullptr;
}

void set_thread_job(JobId job, int device) {
  t_job = {job, device};
}

JobId thread_job() {
  return t_job.job;
}

JobScope::JobScope(JobId job, int device)
    : previous_job_(t_job.job), previous_device_(t_job.device) {
  t_job = {job, device};
}

JobScope::~JobScope() {
  t_job = {previous_job_, previous_device_};
}

std::exception_ptr take_last_error() {
  return std::exchange(t_last_error, nullptr);
}

void set_around(Around a) {
  g_around.store(a);
}

Counters counters() {
  return {g_allocations.load(), g_frees.load(), g_failed_frees.load()};
}

}  // namespace salus::torch

using namespace salus;
using namespace salus::torch;

extern "C" {

void* salus_torch_cuda_malloc(std::ptrdiff_t size, int device, void* stream) {
  State* state = acquire_state(false);
  if (state == nullptr) return nullptr;
  if (size <= 0) {
    state->release();
    return nullptr;
  }
  try {
    // The thread's job when it has one; else the job whose stream this is (a lane while its
    // iteration runs, or a bound stream), else unattributed.
    const ThreadJob who = t_job;
    return reinterpret_cast<void*>(
        allocate_block(*state, static_cast<std::size_t>(size), device,
                       StreamHandle{reinterpret_cast<std::uintptr_t>(stream)},
                       who.device == device ? who.job : kUnattributedJob));
  } catch (...) {
    t_last_error = std::current_exception();
    return nullptr;  // PyTorch raises torch.OutOfMemoryError
  }
}

void salus_torch_cuda_free(void* ptr, std::ptrdiff_t size, int device, void* /*stream*/) {
  // Through the runtime the block came from; the size and device are checked where it is freed.
  delete_block(ptr, device,
               size > 0 ? std::optional(static_cast<std::size_t>(size)) : std::nullopt);
}

}  // extern "C"
