// Attribution: whose memory an allocation that names no job is. This module is the one home of
// "the calling thread's current job": Runtime::set_current_job and Runtime::JobScope set it (the
// C ABI, salus::torch's JobScope and Python's `with job:` go through those), the scheduler marks
// the job whose iteration runs on the thread, and owner_of() reads both, with the stream
// bindings, in one fixed order. Everything here is per thread; nothing is shared, so nothing
// locks.
#pragma once

#include <functional>
#include <memory>

#include "salus/runtime.hpp"

namespace salus {

struct JobRecordState;
class DeviceScheduler;

namespace attribution {

// The job the calling thread chose (Runtime::set_current_job, JobScope): for which runtime
// (ThreadJob::runtime is that runtime's serial, so a runtime at a reused address never sees
// another's choice), which job, on which device.
[[nodiscard]] ThreadJob chosen();
void choose(const ThreadJob& job);

// The job whose iteration runs on the calling thread (begin_iteration to end_iteration).
[[nodiscard]] JobRecordState* iteration_job();
void enter_iteration(JobRecordState& job);
// Forgets `job` if it is the calling thread's iteration job (its iteration ended, or it left).
void leave_iteration(const JobRecordState& job);

// Finds a present job of the runtime by id on a device; throws as Runtime's lookups do (a job
// that left, was cancelled, or runs on another device).
using JobLookup = std::function<std::shared_ptr<JobRecordState>(JobId, int device)>;

// The owner of an allocation that names no job, on `scheduler`'s device, in the runtime whose
// serial is `runtime`: the job `stream` is bound to (a lane while its iteration runs, or
// bind_stream); else the thread's chosen job in that runtime; else the job inside an iteration
// on this thread when it runs on that device; else nobody (null).
[[nodiscard]] std::shared_ptr<JobRecordState> owner_of(DeviceScheduler& scheduler,
                                                       std::uint64_t runtime,
                                                       StreamHandle stream,
                                                       const JobLookup& lookup);

}  // namespace attribution
}  // namespace salus
