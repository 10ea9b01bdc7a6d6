// salus_torch: PyTorch's allocations through a Salus runtime (libsalus_torch, built where libtorch
// is found; the Python module salus.torch and libtorch programs both use it).
//
// Simulated backend: c10's CPU allocator is replaced, so CPU tensors live in simulated GPU memory
// and real training loops run under Salus's scheduling and accounting on any machine. The compute
// runs on the job's thread: a cancel must not free what the thread still uses (see below).
// CUDA backend: PyTorch's pluggable CUDA allocator calls salus_torch_cuda_malloc/free below;
// libsalus_torch_cuda (salus/torch_cuda.hpp) is that allocator, with record_stream, statistics
// and empty_cache answered by Salus. CUDA graphs are not supported: starting a capture (or a
// torch.cuda.MemPool) through it throws a c10::Error naming Salus, before the capture begins.
//
// Attribution: as Runtime::allocate charges an allocation that names no job: the job of the
// stream (CUDA: a lane while its iteration runs, or a bound stream), else the calling thread's
// current job (set_thread_job, JobScope, Python's `with job:`), else nobody. A job's memory is
// ephemeral inside its iteration and persistent outside. Jobs whose tensors go through here should set JobSpec::blocks_outlive_job: a
// tensor freed after its job left or was cancelled is then freed normally (its block stayed
// valid, charged to nobody), and no address is reused under a live tensor.
//
// fork(): a forked child (a DataLoader worker, say) starts with the glue off: its new tensors come
// from PyTorch's previous CPU allocator, tensors inherited from the parent stay readable, and
// freeing them in the child leaves them to the parent. enable() in the child routes it to a
// runtime of its own (one made in the child: the parent's does not work there).
#pragma once

#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>

#include "salus/job_id.hpp"
#include "salus/runtime.hpp"

#if defined(SALUS_TORCH_BUILDING)
#define SALUS_TORCH_API __attribute__((visibility("default")))
#else
#define SALUS_TORCH_API
#endif

namespace salus::torch {

// CPU tensors are allocated by `runtime` from now on (tensors made before keep their allocator).
// The runtime stays alive while tensors it allocated do. Throws InvalidArgument when enabled
// already (disable first).
SALUS_TORCH_API void enable_cpu(std::shared_ptr<Runtime> runtime);
// PyTorch's CUDA allocations (through the pluggable allocator the caller installs with the
// functions below) go to `runtime`.
SALUS_TORCH_API void enable_cuda(std::shared_ptr<Runtime> runtime);
// Back to PyTorch's own allocators for new tensors; Salus's tensors are still freed by Salus.
SALUS_TORCH_API void disable();
[[nodiscard]] SALUS_TORCH_API bool enabled();

// The calling thread works for `job` (which runs on `device`; kUnattributedJob: for nobody) in
// the enabled glue's runtime: Runtime::set_current_job, where Salus keeps the thread's job. Throws
// InvalidArgument when the glue is off or the job runs on another device (the thread then works
// for nobody), UnknownJob / JobCancelled for a job that is not present.
SALUS_TORCH_API void set_thread_job(JobId job, int device);
// The calling thread's current job in the enabled glue's runtime; kUnattributedJob when none.
[[nodiscard]] SALUS_TORCH_API JobId thread_job();

// RAII: the thread works for `job` in the enabled glue's runtime while the scope lives
// (Runtime::JobScope; its previous job comes back after). Throws InvalidArgument when the glue
// is off.
class SALUS_TORCH_API JobScope {
 public:
  JobScope(JobId job, int device);
  ~JobScope();
  JobScope(const JobScope&) = delete;
  JobScope& operator=(const JobScope&) = delete;

 private:
  std::shared_ptr<Runtime> runtime_;  // kept alive while the scope names it
  Runtime::JobScope scope_;
};

// PyTorch reports an allocator failure as its own error; the Salus error behind the last one on
// this thread (OutOfMemory with its fields, JobCancelled...) is kept here. Null when none.
[[nodiscard]] SALUS_TORCH_API std::exception_ptr take_last_error();

// Runtime calls from the allocator run as around(call, arg). The Python module releases the GIL
// there: around the calls that may block (an allocation waiting for memory, a spill, a trim), so
// that the Python threads a wait depends on (another job's loop) go on; and around every call
// when a policy written in Python may take the GIL under the scheduler's lock. Null: call directly.
using Around = void (*)(void (*call)(void*), void* arg);
enum class AroundCalls : std::uint8_t {
  blocking,  // allocations and trims
  all,       // also frees, record_stream
};
SALUS_TORCH_API void set_around(Around around, AroundCalls calls = AroundCalls::all);

// CUDA mode's other allocator calls, for PyTorch's allocator object (libsalus_torch_cuda; see
// salus/torch_cuda.hpp).
// The runtime CUDA mode routes to; null when the glue is off or in CPU mode.
[[nodiscard]] SALUS_TORCH_API std::shared_ptr<Runtime> cuda_runtime();
// The enabled CUDA glue's runtime stops asking the driver whether each allocation's stream
// captures a graph (CaptureGuard::framework_refuses), until disable(): called by
// install_cuda_allocator, whose allocator refuses captures before they begin.
SALUS_TORCH_API void refuse_captures();
// The block at `ptr` (allocated through salus_torch_cuda_malloc) is also used on `stream`.
// Returns false, doing nothing, when `ptr` is no block of the glue (another allocator's).
SALUS_TORCH_API bool record_stream(void* ptr, StreamHandle stream);
// torch.cuda.empty_cache(): unmaps every device's unused pages, and returns to the driver (or to
// salusd) those that stayed unused since the previous call (MemoryManager::trim_idle: a script
// that empties the cache every step keeps what its steps use). Returns the bytes released, 0
// when CUDA mode is off. Waits for stream work that may still touch them.
SALUS_TORCH_API std::size_t trim_cuda();

struct Counters {
  std::uint64_t allocations = 0;
  std::uint64_t frees = 0;
  std::uint64_t failed_frees = 0;  // refused for another reason (logged)
};
[[nodiscard]] SALUS_TORCH_API Counters counters();

}  // namespace salus::torch

extern "C" {
// PyTorch's pluggable CUDA allocator (torch.cuda.memory.CUDAPluggableAllocator) signatures.
SALUS_TORCH_API void* salus_torch_cuda_malloc(std::ptrdiff_t size, int device, void* stream);
SALUS_TORCH_API void salus_torch_cuda_free(void* ptr, std::ptrdiff_t size, int device,
                                           void* stream);
}
