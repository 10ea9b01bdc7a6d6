// SimStream: one worker thread running a simulated stream's tasks in order.
#include "cuda/sim_stream.hpp"

#include <sys/prctl.h>

#include <chrono>
#include <mutex>
#include <stop_token>

#include "cuda/process_fork.hpp"
#include "log/log.hpp"
#include "salus/error.hpp"

namespace salus::sim {

SimStream::SimStream(int device_index, int priority_value, std::uint64_t id_value,
                     std::atomic<std::uint64_t>& tasks)
    : device(device_index),
      priority(priority_value),
      id(id_value),
      tasks_handed(tasks),
      worker(process::running_thread([this](std::stop_token st) { run(st); })) {}

void SimStream::push(SimTask task) {
  {
    std::lock_guard lock(mutex);
    if (closing) throw InvalidArgument("stream is being destroyed");
    queue.push_back(std::move(task));
    ++enqueued;
    pending.fetch_add(1, std::memory_order_relaxed);
  }
  tasks_handed.fetch_add(1, std::memory_order_relaxed);
  work_cv.notify_one();
}

bool SimStream::idle() {
  std::lock_guard lock(mutex);
  return completed >= enqueued;
}

std::optional<EventCapture> SimStream::capture_if_idle() {
  std::lock_guard lock(mutex);
  if (completed < enqueued) return std::nullopt;
  // The worker wrote `busy` before it counted its last task complete under this lock.
  return EventCapture{device, id, busy, std::chrono::steady_clock::now()};
}

void SimStream::synchronize() {
  std::unique_lock lock(mutex);
  const std::uint64_t target = enqueued;
  done_cv.wait(lock, [&] { return completed >= target; });
}

void SimStream::close(bool cancel_waits) {
  {
    std::lock_guard lock(mutex);
    closing = true;
  }
  work_cv.notify_all();
  if (cancel_waits) worker.request_stop();
}

void SimStream::join() {
  if (worker.joinable()) worker.join();
}

void SimStream::run(const std::stop_token& st) {
  // Throttled copies sleep out their link time; Linux's default 50 us timer slack would add to
  // every one of them (3-5% of a 2 MiB copy at the scaled link speeds the studies use).
  ::prctl(PR_SET_TIMERSLACK, 1000UL);
  std::unique_lock lock(mutex);
  for (;;) {
    // A stop request also wakes this wait, so a stopped stream drains and leaves.
    work_cv.wait(lock, st, [&] { return !queue.empty() || closing; });
    if (queue.empty()) {
      if (closing || st.stop_requested()) return;
      continue;
    }
    SimTask task = std::move(queue.front());
    queue.pop_front();
    lock.unlock();
    try {
      task(st);
    } catch (const std::exception& e) {
      // A GPU keeps running after a failing host callback; so does the simulated stream.
      log::error("sim stream (device {}): host function threw: {}", device, e.what());
    } catch (...) {
      log::error("sim stream (device {}): host function threw a non-standard exception", device);
    }
    lock.lock();
    ++completed;
    pending.fetch_sub(1, std::memory_order_release);
    done_cv.notify_all();
  }
}

}  // namespace salus::sim
