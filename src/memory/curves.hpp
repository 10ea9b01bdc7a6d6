// Memory curves: the ephemeral bytes of a job's running iteration over time, as its allocations
// and frees move them. The job's record (memory::JobRecord) is the one count of its bytes, so the
// curve is sampled there, on the allocating thread, under a lock of the job's own: the scheduler
// only starts and collects it (at take_turn and end_iteration) and sits on no allocation's path.
//
// Internal, as memory/safe_points.hpp: an interface of the memory manager that its Impl
// implements; memory_curves(MemoryManager&) hands it out (a friend of MemoryManager).
#pragma once

#include <cstddef>
#include <utility>
#include <vector>

#include "salus/memory.hpp"

namespace salus {

namespace memory {

// (seconds since the iteration began, ephemeral bytes above what the job had then)
using CurveSamples = std::vector<std::pair<double, std::size_t>>;

class Curves {
 public:
  // The job's iteration begins: its curve starts empty, at the job's ephemeral bytes now.
  // Throws UnknownJob for an unknown or released job.
  virtual void begin_curve(JobId job) = 0;
  // The iteration ends: sampling stops and the samples so far are handed over (none for an
  // unknown or released job: a job cancelled meanwhile has no curve worth keeping).
  virtual CurveSamples end_curve(JobId job) = 0;

 protected:
  Curves() = default;
  ~Curves() = default;  // not owned through this interface
  Curves(const Curves&) = default;
  Curves& operator=(const Curves&) = default;
};

}  // namespace memory

// The memory manager's curves (its Impl). Declared a friend in include/salus/memory.hpp.
memory::Curves& memory_curves(MemoryManager& memory) noexcept;

namespace memory {

inline void begin_curve(MemoryManager& memory, JobId job) {
  memory_curves(memory).begin_curve(job);
}
inline CurveSamples end_curve(MemoryManager& memory, JobId job) {
  return memory_curves(memory).end_curve(job);
}

}  // namespace memory

}  // namespace salus
