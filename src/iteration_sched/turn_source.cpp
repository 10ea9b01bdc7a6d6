#include "iteration_sched/turn_source.hpp"

#include "iteration_sched/local_turns.hpp"
#include "log/log.hpp"

namespace salus {

// --- GatedTurns: salusd's turn, then the scheduler's ---------------------------------------------

std::shared_ptr<JobRecordState> GatedTurns::add(JobSpec spec) {
  std::shared_ptr<JobRecordState> job = local_.add(std::move(spec));
  try {
    remote_->add(job->id, job->spec);
  } catch (...) {
    local_.finish(*job, false);  // refused there: not a job here either
    throw;
  }
  return job;
}

bool GatedTurns::take_remote(JobRecordState& job, std::optional<Deadline> deadline) {
  local_.before_gate_wait(job);
  const auto asked = std::chrono::steady_clock::now();
  try {
    const bool granted = remote_->acquire(job.id, deadline);
    // The daemon's turn is most of a connected job's wait: its statistics count it.
    local_.count_gate_wait(job, std::chrono::steady_clock::now() - asked);
    return granted;
  } catch (const Error& e) {
    if (e.code() == Errc::cancelled) throw JobCancelled(job.spec.name);
    throw;
  }
}

void GatedTurns::order_or_give_back(JobRecordState& job, StreamHandle stream) {
  try {
    remote_->order_after(job.id, stream);
  } catch (...) {
    // The iteration never happened as far as the caller knows, so it ends here; its own failure
    // would hide the one being reported.
    try {
      local_.end(job);
    } catch (const std::exception& e) {
      log::warn("job '{}': ending an iteration that could not begin failed: {}", job.spec.name,
                e.what());
    }
    remote_->release(job.id, nullptr, nullptr);
    throw;
  }
}

StreamHandle GatedTurns::begin(JobRecordState& job) {
  take_remote(job, std::nullopt);
  StreamHandle stream;
  try {
    stream = local_.begin(job);
  } catch (...) {
    remote_->release(job.id, nullptr, nullptr);
    throw;
  }
  order_or_give_back(job, stream);
  return stream;
}

std::optional<StreamHandle> GatedTurns::begin_until(JobRecordState& job, Deadline deadline) {
  if (!take_remote(job, deadline)) return std::nullopt;
  std::optional<StreamHandle> stream;
  try {
    // The daemon's turn is held until end or withdraw, so a local wait that runs out keeps it:
    // the next try finds it taken and waits here only.
    stream = local_.begin_until(job, deadline);
  } catch (...) {
    remote_->release(job.id, nullptr, nullptr);
    throw;
  }
  if (stream) order_or_give_back(job, *stream);
  return stream;
}

void GatedTurns::withdraw(JobRecordState& job) {
  local_.withdraw(job);
  remote_->withdraw(job.id);
}

void GatedTurns::end(JobRecordState& job, const std::function<void()>& between) {
  if (between) {
    throw InvalidArgument("RuntimeAccess::end_iteration: a connected runtime's job ends with "
                          "Job::end_iteration (its turn goes back to salusd)");
  }
  // The turn goes back once the profile is whole (it goes with the turn, for the keeper's plans)
  // and before the rest of the iteration's bookkeeping: the next process's wait is the switch's.
  local_.end(job, [&] {
    const std::optional<MeasuredMemory> measured = profiles_.known_memory(job);
    const std::optional<GpuTime> gpu = local_.take_gpu_time(job);
    remote_->release(job.id, measured ? &*measured : nullptr, gpu ? &*gpu : nullptr);
  });
}

void GatedTurns::finish(JobRecordState& job, bool cancelled) {
  // The local cancel first: a thread waiting for the daemon's turn then finds the job cancelled
  // here too, whichever answer it gets. The daemon forgets the job even when that throws.
  try {
    local_.finish(job, cancelled);
  } catch (...) {
    remote_->finish(job.id, cancelled);
    throw;
  }
  remote_->finish(job.id, cancelled);
}

}  // namespace salus
