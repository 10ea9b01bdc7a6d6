#include "soak/soak_context.hpp"

#include <cstdio>
#include <utility>

#include "salus/sim.hpp"
#include "soak/stamps.hpp"

namespace salus::soak {

void ErrorLog::note(const std::string& text) {
  std::lock_guard lock(mu_);
  if (messages_.size() < kMaxMessages) messages_.push_back(text);
}

std::vector<std::string> ErrorLog::messages() {
  std::lock_guard lock(mu_);
  return messages_;
}

void count_answer(SoakShared& shared, EndedBy how, const std::exception& e,
                  const std::string& where) {
  Counters& c = shared.counters;
  const std::string text = where + ": " + e.what();
  if (how == EndedBy::none) {
    shared.error(text);
    return;
  }
  const bool cancelled_answer = dynamic_cast<const JobCancelled*>(&e) != nullptr;
  const bool unknown_answer = dynamic_cast<const UnknownJob*>(&e) != nullptr;
  if (how == EndedBy::cancel) {
    if (cancelled_answer) {
      c.answers_cancelled.fetch_add(1, std::memory_order_relaxed);
    } else if (unknown_answer) {
      c.answers_unknown_job.fetch_add(1);
      shared.log.note("UnknownJob for a cancelled job that has not left: " + text);
    } else {
      c.cancel_races.fetch_add(1);
      shared.log.note("after a cancel: " + text);
    }
    return;
  }
  if (unknown_answer || dynamic_cast<const InvalidArgument*>(&e) != nullptr) {
    c.answers_after_leave.fetch_add(1, std::memory_order_relaxed);
  } else {
    c.cancel_races.fetch_add(1);
    shared.log.note("after another thread's leave: " + text);
  }
}

void enqueue_reader(SoakShared& shared, StreamHandle stream, const Block& block, double seconds,
                    const std::string& job_name, std::atomic<int>& pending) {
  DeviceBackend& backend = shared.runtime.backend();
  launch_sim_kernel(backend, stream, block.device, seconds, 0.5);
  Counters* counters = &shared.counters;
  ErrorLog* log = &shared.log;
  pending.fetch_add(1);
  counters->readers_pending.fetch_add(1);
  auto reader = [counters, log, block, job_name, &pending] {
    // A page unmapped under this reader faults here: the process dies and the test fails.
    counters->stream_reads.fetch_add(1, std::memory_order_relaxed);
    if (!stamps_intact(block.ptr, block.bytes, block.tag)) {
      counters->stream_mismatches.fetch_add(1);
      char text[200];
      std::snprintf(text, sizeof text,
                    "%s: a reader queued on a second stream found foreign bytes in block 0x%llx "
                    "(%zu bytes, device %d): it was handed on while the reader was queued",
                    job_name.c_str(), static_cast<unsigned long long>(block.ptr), block.bytes,
                    block.device);
      log->note(text);
    }
    pending.fetch_sub(1);
    counters->readers_pending.fetch_sub(1);
  };
  try {
    backend.launch_host_func(stream, std::move(reader));
  } catch (...) {
    pending.fetch_sub(1);
    counters->readers_pending.fetch_sub(1);
    throw;
  }
}

}  // namespace salus::soak
