#include "iteration_sched/attribution.hpp"

#include "iteration_sched/device_scheduler.hpp"

namespace salus::attribution {

namespace {

// The two halves of the calling thread's attribution; see attribution.hpp.
struct ThreadAttribution {
  ThreadJob chosen;
  JobRecordState* iteration = nullptr;
};
thread_local ThreadAttribution t_attribution;

}  // namespace

ThreadJob chosen() {
  return t_attribution.chosen;
}

void choose(const ThreadJob& job) {
  t_attribution.chosen = job;
}

JobRecordState* iteration_job() {
  return t_attribution.iteration;
}

void enter_iteration(JobRecordState& job) {
  t_attribution.iteration = &job;
}

void leave_iteration(const JobRecordState& job) {
  if (t_attribution.iteration == &job) t_attribution.iteration = nullptr;
}

std::shared_ptr<JobRecordState> owner_of(DeviceScheduler& scheduler, std::uint64_t runtime,
                                         StreamHandle stream, const JobLookup& lookup) {
  if (auto bound = scheduler.job_on(stream)) return bound;
  const int device = scheduler.device();
  if (const ThreadJob& choice = t_attribution.chosen;
      choice.runtime == runtime && choice.job != kUnattributedJob) {
    return lookup(choice.job, device);
  }
  // The job inside an iteration here, when it is this runtime's on `device`: the record is
  // compared with the scheduler's, as a job of another runtime may have the same id.
  if (JobRecordState* inside = t_attribution.iteration; inside && inside->spec.device == device) {
    if (auto found = scheduler.queue().job_by_id(inside->id); found.get() == inside) return found;
  }
  return nullptr;
}

}  // namespace salus::attribution
