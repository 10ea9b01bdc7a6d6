// salus_torch: c10's CPU allocator (simulated backend) and PyTorch's pluggable CUDA allocator
// functions, both routed to one Salus runtime. See include/salus/torch.hpp.
#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>
#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <optional>
#include <string>
#include <type_traits>
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
  CaptureGuard capture_guard_before = CaptureGuard::salus_asks;  // cuda: the runtime's before
  std::uint64_t generation = 0;      // g_fork_generation when enabled (see "fork()" below)
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
std::atomic<AroundCalls> g_around_calls{AroundCalls::all};

// fork(): a child has only the forking thread, and the runtime the glue routes to is its
// parent's (its stream threads are not in the child, its simulated memory is shared with the
// parent: a block carved there would be the parent's too). So a child starts with the glue off:
// new tensors come from PyTorch's previous CPU allocator (a DataLoader worker, forked by default
// on Linux, makes its batches that way), and the parent's blocks that the child frees are left
// alone (they are the parent's; the child's mapping goes with the process). A child may enable
// the glue again with a runtime of its own. Bumped in a child; read on every allocation.
std::atomic<std::uint64_t> g_fork_generation{0};

std::atomic<std::uint64_t> g_allocations{0};
std::atomic<std::uint64_t> g_frees{0};
std::atomic<std::uint64_t> g_failed_frees{0};

thread_local std::exception_ptr t_last_error;

// Whether a runtime call may block the calling thread for long (see set_around).
enum class Blocks : bool { no, yes };

template <typename F>
void around(Blocks blocks, F&& f) {
  const Around a = g_around.load(std::memory_order_relaxed);
  if (a == nullptr || (blocks == Blocks::no &&
                       g_around_calls.load(std::memory_order_relaxed) != AroundCalls::all)) {
    f();
    return;
  }
  a([](void* arg) { (*static_cast<std::remove_reference_t<F>*>(arg))(); }, &f);
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
  std::optional<Owner> find(DevicePtr ptr) {
    Shard& s = shard(ptr);
    std::lock_guard lock(s.mu);
    auto it = s.map.find(ptr);
    if (it == s.map.end()) return std::nullopt;
    return it->second;
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
  // Around fork(): the table is locked whole, so that the child finds it consistent and its locks
  // free (no other thread is there to release them).
  void lock_all() {
    for (Shard& s : shards_) s.mu.lock();
  }
  void unlock_all() {
    for (Shard& s : shards_) s.mu.unlock();
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
    around(Blocks::no, [&] { state.runtime->deallocate(ptr, {bytes, device, std::nullopt}); });
    g_frees.fetch_add(1, std::memory_order_relaxed);
  } catch (const std::exception& e) {
    g_failed_frees.fetch_add(1, std::memory_order_relaxed);
    log_failed_free(ptr, e.what());
  }
  state.release();
}

// Frees a block allocated through the glue, through the runtime it came from (the glue may have
// been disabled, or enabled with another runtime, since). A block of the parent process, freed
// in a forked child, is left alone. Returns false when `ptr` is no block of the glue.
bool delete_block(void* ptr, std::optional<int> device = {},
                  std::optional<std::size_t> bytes = {}) {
  const auto addr = reinterpret_cast<DevicePtr>(ptr);
  if (const std::optional<Owner> owner = g_owners.take(addr)) {
    if (owner->state->generation == g_fork_generation.load(std::memory_order_relaxed)) {
      free_block(*owner->state, addr, device, bytes);
    }
    return true;
  }
  return ptr == nullptr;
}

void log_unknown_free(void* ptr) {
  if (ptr != nullptr) {
    g_failed_frees.fetch_add(1, std::memory_order_relaxed);
    log_failed_free(reinterpret_cast<DevicePtr>(ptr),
                    "the address was not allocated through salus_torch");
  }
}

// c10's deleters take the address alone. In a forked child, PyTorch's raw_deallocate may bring
// here a block that the previous allocator made (through our allocate(), which routes there while
// the glue is off): it goes back to that allocator.
void delete_block_at(void* ptr) {
  if (delete_block(ptr)) return;
  if (g_fork_generation.load(std::memory_order_relaxed) != 0 && g_previous_cpu != nullptr) {
    g_previous_cpu->raw_deleter()(ptr);
    return;
  }
  log_unknown_free(ptr);
}

// Allocates through the state's runtime and records the block's owner; throws salus errors
// (the state's reference is released then).
DevicePtr allocate_block(State& state, std::size_t bytes, int device, StreamHandle stream,
                         JobId job) {
  DevicePtr ptr = 0;
  try {
    // May wait for memory (another job's iteration, a spill): blocks.
    around(Blocks::yes, [&] { ptr = state.runtime->allocate(bytes, device, stream, job); });
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
      // The runtime charges the thread's current job (salus::attribution); CPU tensors go to
      // that job's device.
      const int device = std::max(state->runtime->current_job_device(), 0);
      ptr = allocate_block(*state, bytes, device, StreamHandle{}, kUnattributedJob);
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

// See "fork()" above. The glue's locks are held across fork(), so that the child finds them free
// and what they guard consistent.
void before_fork() noexcept {
  g_mu.lock();
  g_owners.lock_all();
}
void after_fork_in_parent() noexcept {
  g_owners.unlock_all();
  g_mu.unlock();
}
void after_fork_in_child() noexcept {
  g_fork_generation.fetch_add(1, std::memory_order_relaxed);
  g_owners.unlock_all();
  g_mu.unlock();
  // The glue is off: allocate() routes to the previous allocator. The parent's state, and the
  // runtime it holds, are leaked (destroying that runtime here would hang; see salus::Runtime).
  g_state.store(nullptr);
}
[[maybe_unused]] const int g_fork_handlers =
    ::pthread_atfork(&before_fork, &after_fork_in_parent, &after_fork_in_child);

void enable(std::shared_ptr<Runtime> runtime, bool cpu) {
  if (!runtime) throw InvalidArgument("salus_torch: the runtime is null");
  std::lock_guard lock(g_mu);
  if (g_state.load() != nullptr) {
    throw InvalidArgument("salus_torch is enabled already: disable() it first");
  }
  auto* state = new State;  // immortal, see State
  state->generation = g_fork_generation.load();
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
  } else {
    // Salus's CUDA allocator object refuses captures (refuse_captures, when installed).
    state->capture_guard_before = state->runtime->memory().capture_guard();
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
  } else {
    state->runtime->memory().set_capture_guard(state->capture_guard_before);
  }
  state->enabled.store(false);
  state->drop_if_unused();
}

bool enabled() {
  return g_state.load() != nullptr;
}

namespace {

// The enabled glue's runtime, held; throws InvalidArgument naming `caller` when the glue is off.
std::shared_ptr<Runtime> enabled_runtime(const char* caller) {
  std::lock_guard lock(g_mu);
  State* state = g_state.load();
  if (state == nullptr) {
    throw InvalidArgument(std::string("salus::torch::") + caller +
                          ": the glue is not enabled (enable_cpu or enable_cuda first)");
  }
  std::lock_guard state_lock(state->mu);
  return state->keeper;
}

}  // namespace

void set_thread_job(JobId job, int device) {
  const std::shared_ptr<Runtime> runtime = enabled_runtime("set_thread_job");
  runtime->set_current_job(job);
  if (job != kUnattributedJob && runtime->current_job_device() != device) {
    const int actual = runtime->current_job_device();
    runtime->set_current_job(kUnattributedJob);
    throw InvalidArgument("salus::torch::set_thread_job: job " + std::to_string(job.value) +
                          " runs on device " + std::to_string(actual) + ", not device " +
                          std::to_string(device));
  }
}

JobId thread_job() {
  std::shared_ptr<Runtime> runtime;
  {
    // Held under the lock: a disable() racing this query leaves it with nobody, never a throw.
    std::lock_guard lock(g_mu);
    State* state = g_state.load();
    if (state == nullptr) return kUnattributedJob;
    std::lock_guard state_lock(state->mu);
    runtime = state->keeper;
  }
  return runtime->current_job();
}

JobScope::JobScope(JobId job, int device)
    : runtime_(enabled_runtime("JobScope")), scope_(*runtime_, job, device) {}

JobScope::~JobScope() = default;

std::exception_ptr take_last_error() {
  return std::exchange(t_last_error, nullptr);
}

void set_around(Around a, AroundCalls calls) {
  g_around_calls.store(calls);
  g_around.store(a);
}

void refuse_captures() {
  std::lock_guard lock(g_mu);
  State* state = g_state.load();
  if (state != nullptr && !state->cpu) {
    state->runtime->memory().set_capture_guard(CaptureGuard::framework_refuses);
  }
}

std::shared_ptr<Runtime> cuda_runtime() {
  std::lock_guard lock(g_mu);
  State* state = g_state.load();
  if (state == nullptr || state->cpu) return nullptr;
  std::lock_guard state_lock(state->mu);
  return state->keeper;
}

bool record_stream(void* ptr, StreamHandle stream) {
  const auto addr = reinterpret_cast<DevicePtr>(ptr);
  const std::optional<Owner> owner = g_owners.find(addr);
  // A block of the parent process (in a forked child) is the parent's business.
  if (!owner || owner->state->generation != g_fork_generation.load(std::memory_order_relaxed)) {
    return false;
  }
  // The block is live (its tensor is being recorded), so its state's runtime is too.
  around(Blocks::no, [&] { owner->state->runtime->record_stream(addr, stream); });
  return true;
}

std::size_t trim_cuda() {
  const std::shared_ptr<Runtime> runtime = cuda_runtime();
  if (!runtime) return 0;
  std::size_t released = 0;
  around(Blocks::yes, [&] { released = runtime->memory().trim_idle(); });
  return released;
}

Counters counters() {
  return {g_allocations.load(), g_frees.load(), g_failed_frees.load()};
}

}  // namespace salus::torch

using namespace salus;
using namespace salus::torch;

extern "C" {

// PyTorch's pluggable allocator does not check for null: a kernel would write to address 0, and
// the context's sticky error would end every job of the process. Every failure throws instead
// (c10 errors cross PyTorch's C++ frames into Python as exceptions).
void* salus_torch_cuda_malloc(std::ptrdiff_t size, int device, void* stream) {
  if (size <= 0) return nullptr;  // c10 keeps empty storages without an address
  State* state = acquire_state(false);
  // PyTorch keeps the allocator it was given for the life of the process: after disable() there
  // is no other to hand the request to.
  TORCH_CHECK(state != nullptr,
              "Salus: salus.torch was disabled, but PyTorch keeps a process's "
              "CUDA allocator once it is set; this ",
              size, "-byte allocation on device ", device,
              " has nowhere to go (enable Salus again before allocating on the GPU)");
  try {
    // Charged as Runtime::allocate says for no job: the stream's job (a lane while its
    // iteration runs, or a bound stream), else the thread's current job, else nobody.
    return reinterpret_cast<void*>(
        allocate_block(*state, static_cast<std::size_t>(size), device,
                       StreamHandle{reinterpret_cast<std::uintptr_t>(stream)}, kUnattributedJob));
  } catch (...) {
    report(static_cast<std::size_t>(size));  // torch.OutOfMemoryError for Salus's OutOfMemory
  }
}

void salus_torch_cuda_free(void* ptr, std::ptrdiff_t size, int device, void* /*stream*/) {
  // Through the runtime the block came from; the size and device are checked where it is freed.
  if (!delete_block(ptr, device,
                    size > 0 ? std::optional(static_cast<std::size_t>(size)) : std::nullopt)) {
    log_unknown_free(ptr);
  }
}

}  // extern "C"
