// The fake driver's host functions and stream capture.
//
// Host functions (cuLaunchHostFunc) are items of their stream's queue, as on a GPU: one runs once
// what precedes it on its stream has finished, later work on the stream waits for it, and host
// waits (cuStreamSynchronize, cuEventSynchronize) wait for it. The driver runs them on a thread of
// its own, one at a time, so the fake does too; a driver call made from inside one is a violation
// (CUDA forbids it) and fails with CUDA_ERROR_NOT_PERMITTED.
//
// Capture models what a graph capture (cuStreamBeginCapture) forbids of code that does not own
// the capture: querying or synchronizing the capturing stream fails with
// CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, and making it wait for an event recorded outside the
// capture fails with CUDA_ERROR_STREAM_CAPTURE_ISOLATION; either invalidates the capture, and
// end_capture then says so.
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <bit>

#include "support/fake_driver_state.hpp"

namespace salus::test {

namespace {

thread_local bool t_in_host_function = false;

std::uintptr_t key(CUstream stream) {
  return std::bit_cast<std::uintptr_t>(stream);
}

}  // namespace

bool on_host_function_thread() noexcept {
  return t_in_host_function;
}

FakeDriver::State::~State() {
  {
    std::unique_lock lock(mutex_);
    // The GPU drains: every host function still queued runs, so that the closures a backend
    // handed over are not leaked.
    for (auto& [id, item] : items_) {
      if (item.kind == ItemKind::host) dispatch(id, item);
    }
    stopping_ = true;
  }
  host_cv_.notify_all();
  host_thread_.join();
  for (auto& [handle, chunk] : chunks_) forget_export(chunk);  // leaked chunks leak no descriptor
  if (export_file_ >= 0) ::close(export_file_);
}

void FakeDriver::State::dispatch(std::uint64_t id, Item& item) {
  if (item.dispatched) return;
  item.dispatched = true;
  host_queue_.push_back(id);
  host_cv_.notify_all();
}

void FakeDriver::State::host_loop() {
  std::unique_lock lock(mutex_);
  for (;;) {
    host_cv_.wait(lock, [&] { return stopping_ || !host_queue_.empty(); });
    if (host_queue_.empty()) return;  // stopping, and nothing left to run
    const std::uint64_t id = host_queue_.front();
    host_queue_.pop_front();
    const auto it = items_.find(id);
    if (it == items_.end()) continue;
    const CUhostFn fn = it->second.fn;
    void* const data = it->second.user_data;
    host_busy_ = true;
    lock.unlock();
    t_in_host_function = true;
    fn(data);
    t_in_host_function = false;
    lock.lock();
    host_busy_ = false;
    if (const auto done = items_.find(id); done != items_.end()) items_.erase(done);
    settle();
    host_cv_.notify_all();
  }
}

void FakeDriver::State::wait_finished(const std::vector<std::uint64_t>& ids) {
  if (ids.empty() || on_host_function_thread()) return;
  std::unique_lock lock(mutex_);
  host_cv_.wait(lock, [&] {
    for (const std::uint64_t id : ids) complete(id);  // what a host function held back
    return std::all_of(ids.begin(), ids.end(), [&](std::uint64_t id) { return finished(id); });
  });
}

std::vector<std::uint64_t> FakeDriver::State::stream_tails(CUstream stream) const {
  std::vector<std::uintptr_t> queues{key(stream)};
  if (stream == nullptr) {
    queues.insert(queues.end(), blocking_streams_.begin(), blocking_streams_.end());
  }
  std::vector<std::uint64_t> tails;
  for (const std::uintptr_t queue : queues) {
    if (const auto tail = tails_.find(queue); tail != tails_.end()) tails.push_back(tail->second);
  }
  return tails;
}

void FakeDriver::State::drain_host_functions() {
  if (on_host_function_thread()) return;
  std::unique_lock lock(mutex_);
  host_cv_.wait(lock, [&] { return host_queue_.empty() && !host_busy_; });
}

// --- capture ----------------------------------------------------------------------------------

bool FakeDriver::State::breaks_capture(CUstream stream) {
  const auto it = capturing_.find(key(stream));
  if (it == capturing_.end()) return false;
  it->second = false;
  violations_.push_back(
      fmt::format("{} on stream {:#x} while it captures a graph", call_, key(stream)));
  return true;
}

CUresult FakeDriver::State::stream_is_capturing(CUstream stream, CUstreamCaptureStatus* status) {
  return run("cuStreamIsCapturing", {key(stream)}, [&] {
    if (lacks_context()) return CUDA_ERROR_INVALID_CONTEXT;
    if (status == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_stream(stream)) return CUDA_ERROR_INVALID_HANDLE;
    const auto it = capturing_.find(key(stream));
    *status = it == capturing_.end() ? CU_STREAM_CAPTURE_STATUS_NONE
              : it->second           ? CU_STREAM_CAPTURE_STATUS_ACTIVE
                                     : CU_STREAM_CAPTURE_STATUS_INVALIDATED;
    return CUDA_SUCCESS;
  });
}

void FakeDriver::State::begin_capture(CUstream stream) {
  const std::scoped_lock lock(mutex_);
  if (stream == nullptr || !streams_.contains(key(stream))) {
    throw std::invalid_argument(fmt::format("begin_capture: unknown stream {:#x}", key(stream)));
  }
  capturing_[key(stream)] = true;
}

bool FakeDriver::State::end_capture(CUstream stream) {
  const std::scoped_lock lock(mutex_);
  const auto it = capturing_.find(key(stream));
  if (it == capturing_.end()) {
    throw std::invalid_argument(fmt::format("end_capture: stream {:#x} captures nothing",
                                            key(stream)));
  }
  const bool valid = it->second;
  capturing_.erase(it);
  return valid;
}

}  // namespace salus::test
