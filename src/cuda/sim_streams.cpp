// SimStreams: the table of streams, their lookup, creation and destruction, and the shutdown.
// Events live in sim_events.cpp.
//
// The default stream of each device is an ordinary in-order stream here: the simulator does not
// model the legacy default stream's implicit synchronization with other streams.
#include "cuda/sim_streams.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "salus/error.hpp"

namespace salus::sim {

SimStreams::SimStreams(int device_count, StreamPriorityRange priorities, process::Birth birth)
    : priorities_(priorities),
      birth_(birth),
      stream_tasks_(
          std::make_unique<std::atomic<std::uint64_t>[]>(static_cast<std::size_t>(device_count))) {
  default_streams_.resize(static_cast<std::size_t>(device_count));
}

SimStreams::~SimStreams() {
  shutdown();
}

void SimStreams::check_process(const char* what) const {
  process::check_not_inherited(birth_, what);
}

std::shared_ptr<SimStream> SimStreams::stream(StreamHandle stream, int device) {
  return stream_for(stream, device);
}

std::shared_ptr<SimStream> SimStreams::stream_for(StreamHandle stream, int device) {
  check_process("this simulated GPU's stream");
  std::lock_guard lock(mutex_);
  return stream_locked(stream, device);
}

std::shared_ptr<SimStream> SimStreams::stream_locked(StreamHandle stream, int device) {
  if (stream.value == 0) {
    auto& fallback = default_streams_[static_cast<std::size_t>(device)];
    if (!fallback)
      fallback = std::make_shared<SimStream>(device, priorities_.least, 0, tasks_of(device));
    return fallback;
  }
  auto it = streams_.find(stream.value);
  if (it == streams_.end()) {
    throw InvalidArgument(
        fmt::format("unknown stream {} (never created or destroyed)", stream.value));
  }
  return it->second;
}

StreamHandle SimStreams::create_stream(int device, int priority) {
  check_process("this simulated GPU");
  // Like cuStreamCreateWithPriority, out-of-range priorities are clamped, not refused.
  const int clamped = std::clamp(priority, priorities_.greatest, priorities_.least);
  std::lock_guard lock(mutex_);
  const std::uint64_t id = next_stream_++;
  streams_.emplace(id, std::make_shared<SimStream>(device, clamped, id, tasks_of(device)));
  return StreamHandle{id};
}

void SimStreams::destroy_stream(StreamHandle stream) {
  check_process("this simulated GPU's stream");
  std::shared_ptr<SimStream> victim;
  {
    std::lock_guard lock(mutex_);
    auto it = streams_.find(stream.value);
    if (it == streams_.end()) {
      throw InvalidArgument(fmt::format("destroy_stream: unknown stream {}", stream.value));
    }
    victim = std::move(it->second);
    streams_.erase(it);
  }
  victim->close(false);
  victim->join();
}

void SimStreams::validate_stream(StreamHandle stream, int device) {
  if (stream.value == 0) return;
  int owner = -1;
  {
    std::lock_guard lock(mutex_);
    auto it = streams_.find(stream.value);
    if (it != streams_.end()) owner = it->second->device;
  }
  if (owner < 0) {
    throw InvalidArgument(
        fmt::format("stream {:#x} is no stream of the sim backend (never created, or destroyed)",
                    stream.value));
  }
  if (owner != device) {
    throw InvalidArgument(fmt::format("stream {:#x} belongs to device {}, not device {}",
                                      stream.value, owner, device));
  }
}

void SimStreams::shutdown() noexcept {
  if (process::inherited(birth_)) {
    // A forked child has none of the stream threads: joining them would wait forever, and the
    // lock may have been held by a thread of the parent. The streams are leaked; the child's
    // copies of the mappings and descriptors go as usual.
    auto* leaked = new std::vector<std::shared_ptr<SimStream>>();
    for (auto& [id, stream] : streams_) leaked->push_back(std::move(stream));
    for (auto& stream : default_streams_) leaked->push_back(std::move(stream));
    streams_.clear();
    return;
  }
  std::vector<std::shared_ptr<SimStream>> all;
  {
    std::lock_guard lock(mutex_);
    for (auto& [id, stream] : streams_) all.push_back(std::move(stream));
    for (auto& stream : default_streams_) {
      if (stream) all.push_back(std::move(stream));
    }
    streams_.clear();
    events_.clear();
  }
  // Stop every stream before joining any: a stream may be waiting on another's event.
  for (auto& stream : all) stream->close(true);
  for (auto& stream : all) stream->join();
}

}  // namespace salus::sim
